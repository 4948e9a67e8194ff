"""The engine settings `specmoe plan` prints, checked against each engine's own option tables.

The tables are extracted from the engines' release sources by scripts/extract_engine_options.py
into tests/fixtures/engine_options/ (each file names the files it was read from):

- vLLM 0.33.0: SpeculativeConfig's fields and method literals (vllm/config/speculative.py; its
  config classes forbid unknown keys), MoEBackend (vllm/config/kernel.py), the hand-registered
  CLI flags (vllm/engine/arg_utils.py), and vLLM's own schedule validation, a verbatim copy of
  vllm/v1/spec_decode/dynamic/utils.py, run here.
- SGLang 0.5.23: every option add_cli_args_from_dataclass derives from
  sglang/srt/arg_groups/fields/*.py, rebuilt here as an argparse parser with its naming rules.
- llama.cpp (llama-cpp-python 0.3.36): every add_opt(common_arg(...)) of common/arg.cpp with its
  examples (llama-server parses LLAMA_EXAMPLE_SERVER and COMMON options) and removed flags
  (arg_removed aborts start-up), and the speculative type names of common/speculative.cpp.

Rules the engines check beyond their option tables are transcribed with the function they come
from; every validator is shown to reject the settings specmoe printed before (a method-less
vLLM config, llama.cpp's removed --draft-max).
"""

from __future__ import annotations

import argparse
import json
import shlex
from fractions import Fraction as F
from pathlib import Path

import numpy as np
import pytest
from test_plan import NMAX, inputs, plan_argv, stats_available, sticky_union, toy_profile, toy_spec  # noqa: F401

from specmoe.cli import main
from specmoe.cost import theory
from specmoe.cost.engine_kernels import compute_capability_of, engine_kernel, engine_rules
from specmoe.cost.engine_settings import DRAFTERS, EngineRequest, engine_settings
from specmoe.cost.plan import build_plan
from specmoe.errors import InputError

FIX = Path(__file__).resolve().parent / "fixtures" / "engine_options"
VLLM = json.loads((FIX / "vllm-0.33.0.json").read_text())
SGLANG = json.loads((FIX / "sglang-0.5.23.json").read_text())
LLAMA = json.loads((FIX / "llama.cpp-0.3.36.json").read_text())


class Rejected(Exception):
    """The engine would refuse to start with these settings."""


# ------------------------------------------------------------------------------------------
# vLLM


def _vllm_dynamic_utils() -> dict:
    """vLLM's own vllm/v1/spec_decode/dynamic/utils.py (verbatim copy), executed."""
    ns: dict = {}
    exec(compile((FIX / "vllm-0.33.0-dynamic-sd-utils.py.txt").read_text(), "vllm-dyn", "exec"), ns)
    return ns


def vllm_check(argv: list[str]) -> dict | None:
    """`vllm serve MODEL [flags]` as vLLM 0.33.0 reads it; the speculative config or None."""
    if argv[:2] != ["vllm", "serve"] or len(argv) < 3 or argv[2].startswith("-"):
        raise Rejected("not `vllm serve MODEL`")
    cfg, i = None, 3
    while i < len(argv):
        flag = argv[i]
        if flag not in VLLM["cli_flags"]:
            raise Rejected(f"unrecognized argument {flag}")
        value = argv[i + 1]
        if flag == "--speculative-config":
            cfg = json.loads(value)  # arg_utils: optional_type(json.loads)
        if flag == "--moe-backend" and value not in VLLM["moe_backends"]:
            raise Rejected(f"--moe-backend {value}")
        i += 2
    if cfg is None:
        return None
    extra = set(cfg) - set(VLLM["speculative_config_fields"])
    if extra:  # @config: ConfigDict(extra="forbid")
        raise Rejected(f"unknown SpeculativeConfig fields {sorted(extra)}")
    method = cfg.get("method")
    if method is not None and method not in VLLM["speculative_methods"]:
        raise Rejected(f"method {method!r}")
    k = cfg.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k <= 0:  # Field(gt=0), _verify_args
        raise Rejected(f"num_speculative_tokens {k!r}")
    # SpeculativeConfig.__post_init__: without method and model vLLM assumes draft_model, and a
    # model-based method without a model raises "num_speculative_tokens was provided but
    # without speculative model"
    if method is None:
        method = "ngram" if cfg.get("model") in ("ngram", "[ngram]") else "draft_model"
    if cfg.get("model") is None and method not in ("ngram", "ngram_gpu", "suffix", "mtp"):
        raise Rejected("num_speculative_tokens was provided but without speculative model.")
    if method == "ngram":
        lo = cfg.get("prompt_lookup_min") or cfg.get("prompt_lookup_max") or 5
        hi = cfg.get("prompt_lookup_max") or cfg.get("prompt_lookup_min") or 5
        if lo > hi:
            raise Rejected("prompt_lookup_min must be <= prompt_lookup_max")
    sched = cfg.get("num_speculative_tokens_per_batch_size")
    if sched is not None:
        dyn = _vllm_dynamic_utils()
        try:
            dyn["validate_and_normalize_dynamic_sd_schedule"](sched)
            dense = dyn["build_dynamic_sd_schedule_lookup"](sched, 256, k)
        except ValueError as exc:
            raise Rejected(str(exc)) from None
        cfg["_k_at_batch_1"] = dense[1]
    return cfg


def test_vllm_validator_rejects_what_specmoe_printed_before():
    with pytest.raises(Rejected, match="without speculative model"):
        vllm_check(["vllm", "serve", "m", "--speculative-config", '{"num_speculative_tokens": 4}'])
    with pytest.raises(Rejected, match="unknown SpeculativeConfig"):
        vllm_check(["vllm", "serve", "m", "--speculative-config", '{"method": "ngram", "k": 4}'])
    with pytest.raises(Rejected, match="first batch-size range must start at 1"):
        bad = {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "num_speculative_tokens_per_batch_size": [[2, 4, 3]],
        }
        vllm_check(["vllm", "serve", "m", "--speculative-config", json.dumps(bad)])
    with pytest.raises(Rejected, match="unrecognized"):
        vllm_check(["vllm", "serve", "m", "--draft-max", "4"])


# ------------------------------------------------------------------------------------------
# SGLang


def _sglang_parser() -> argparse.ArgumentParser:
    """The parser ServerArgs.add_cli_args builds, from the extracted field table (the rules of
    add_cli_args_from_dataclass: store_true for bool, choices for Literal, nargs + for lists)."""
    p = argparse.ArgumentParser(prog="sglang.launch_server", add_help=False, allow_abbrev=True)
    types = {"int": int, "float": float, "str": str}
    for o in SGLANG["options"]:
        kw: dict = {"dest": o["field"]}
        if o["kind"] == "store_true":
            kw["action"] = "store_true"
        elif o["kind"] == "action":
            kw["action"] = (
                argparse.BooleanOptionalAction if "BooleanOptional" in o["action"] else "store_true"
            )
        elif o["kind"] == "list":
            kw["nargs"] = "+"
        else:
            kw["type"] = types.get(o.get("value_type", "str"), str)
            if isinstance(o.get("choices"), list):
                kw["choices"] = o["choices"]
        p.add_argument(*o["names"], **kw)
    for flag in SGLANG["manual_flags"]:
        if flag not in p._option_string_actions:
            p.add_argument(flag)
    return p


def sglang_check(argv: list[str], files: dict | None = None) -> argparse.Namespace:
    """`python -m sglang.launch_server [flags]` as SGLang 0.5.23 parses and checks it."""
    if argv[:3] != ["python", "-m", "sglang.launch_server"]:
        raise Rejected("not sglang.launch_server")
    try:
        ns, rest = _sglang_parser().parse_known_args(argv[3:])
    except SystemExit:
        raise Rejected(f"argparse refused {argv[3:]}") from None
    if rest:
        raise Rejected(f"unrecognized arguments {rest}")
    if ns.model_path is None:
        raise Rejected("--model-path is required")
    algo = ns.speculative_algorithm
    if algo is None:
        if ns.speculative_num_steps or ns.speculative_num_draft_tokens:
            raise Rejected("speculative options without --speculative-algorithm do nothing")
        return ns
    algo = algo.upper()  # handle_speculative_decoding
    if algo not in SGLANG["speculative_algorithms"]:  # SpeculativeAlgorithm.from_string
        raise Rejected(f"unknown algorithm {algo}")
    if algo == "NGRAM":
        if (ns.device or "cuda") not in ("cuda", "cpu", "xpu"):  # _handle_ngram
            raise Rejected("Ngram speculative decoding only supports CUDA, CPU, or XPU devices.")
        if ns.speculative_num_draft_tokens is None:
            raise Rejected("NGRAM would verify its default of 12 tokens, not the planned pass")
    else:
        if ns.speculative_draft_model_path is None:  # STANDALONE and EAGLE load a draft
            raise Rejected(f"{algo} needs --speculative-draft-model-path")
        if ns.speculative_eagle_topk == 1 and (  # _handle_eagle_family adjusts silently
            ns.speculative_num_draft_tokens != ns.speculative_num_steps + 1
        ):
            raise Rejected("num_draft_tokens is reset to num_steps + 1 when topk == 1")
    if ns.speculative_adaptive:
        # adaptive_unsupported_reason: EAGLE/EAGLE3 with top-k 1 only (else silently off)
        if algo not in ("EAGLE", "EAGLE3") or ns.speculative_eagle_topk not in (None, 1):
            raise Rejected("speculative_adaptive would be disabled")
        cfg = (files or {})[ns.speculative_adaptive_config]
        # _load_adaptive_config: integer-string batch-size keys, candidate_steps non-empty
        # lists of non-negative ints
        keys = [key for key in cfg if key.isdigit()]
        if not keys:
            raise Rejected("adaptive config without an integer-string batch-size key")
        steps: set = set()
        for key in keys:
            s = cfg[key].get("candidate_steps")
            if not (isinstance(s, list) and s and all(isinstance(x, int) and x >= 0 for x in s)):
                raise Rejected(f"BS {key}: candidate_steps must be a list of non-negative ints")
            steps |= set(s)
        if ns.speculative_num_steps not in steps:  # _init_adaptive_speculative_params
            raise Rejected("--speculative-num-steps is not in the adaptive candidate_steps")
    return ns


def test_sglang_validator_rejects_what_specmoe_printed_before():
    old = "--speculative-num-steps 4 --speculative-eagle-topk 1 --speculative-num-draft-tokens 5"
    with pytest.raises(Rejected, match="without --speculative-algorithm"):
        sglang_check(["python", "-m", "sglang.launch_server", "--model-path", "m", *old.split()])
    with pytest.raises(Rejected, match="unrecognized"):
        sglang_check(
            ["python", "-m", "sglang.launch_server", "--model-path", "m", "--draft-max", "4"]
        )
    with pytest.raises(Rejected, match="draft-model-path"):
        sglang_check(
            [
                "python",
                "-m",
                "sglang.launch_server",
                "--model-path",
                "m",
                "--speculative-algorithm",
                "EAGLE",
                *old.split(),
            ]
        )


# ------------------------------------------------------------------------------------------
# llama.cpp


def _llama_server_options() -> dict[str, dict]:
    """The options llama-server accepts: common_params_parser_init keeps an option when it is
    in LLAMA_EXAMPLE_SERVER or LLAMA_EXAMPLE_COMMON and not excluded from SERVER."""
    out = {}
    for o in LLAMA["options"]:
        ex = set(o["examples"])
        if (
            {"LLAMA_EXAMPLE_SERVER", "LLAMA_EXAMPLE_COMMON"} & ex
        ) and "LLAMA_EXAMPLE_SERVER" not in o["excludes"]:
            for name in o["names"]:
                out.setdefault(name, {**o, "values": o["values"]})
            for name in o["negations"]:
                out.setdefault(name, {**o, "values": 0})
    return out


def llama_check(argv: list[str]) -> dict[str, str]:
    """`llama-server [flags]` as common_params_parse (common/arg.cpp) reads it: an unknown
    option or a removed one aborts start-up; the values the option handlers check."""
    if argv[:1] != ["llama-server"]:
        raise Rejected("not llama-server")
    opts, seen, i = _llama_server_options(), {}, 1
    while i < len(argv):
        flag = argv[i]
        if flag not in opts:
            raise Rejected(f"error: invalid argument: {flag}")
        o = opts[flag]
        if o["removed"]:
            raise Rejected("the argument has been removed")
        vals = argv[i + 1 : i + 1 + o["values"]]
        if len(vals) != o["values"]:
            raise Rejected(f"{flag} expects a value")
        seen[o["names"][0]] = vals[0] if vals else ""
        i += 1 + o["values"]
    spec = seen.get("--spec-type")
    if spec is not None:
        for t in spec.split(","):  # common_speculative_types_from_names
            if t not in LLAMA["speculative_types"]:
                raise Rejected(f"unknown speculative type {t}")
    for name in ("--spec-draft-n-max", "--spec-ngram-mod-n-max", "--spec-ngram-mod-n-min"):
        if name in seen:
            v = int(seen[name])
            hi = 1024 if "ngram-mod" in name else 1 << 30
            if not 0 <= v <= hi:
                raise Rejected(f"{name}: invalid value")
    if "--spec-draft-p-min" in seen:
        float(seen["--spec-draft-p-min"])  # std::stof
    if spec in ("draft-simple", "draft-eagle3") and "--spec-draft-model" not in seen:
        raise Rejected(f"{spec} requires a draft context")  # common/speculative.cpp
    if "--spec-draft-model" in seen and spec in (None, "none"):
        raise Rejected("a draft model with --spec-type none does not speculate")
    if "-m" not in seen:
        raise Rejected("no model")
    return seen


def test_llama_validator_rejects_what_specmoe_printed_before():
    with pytest.raises(Rejected, match="removed"):
        llama_check(["llama-server", "-m", "a.gguf", "--draft-max", "4", "--draft-min", "4"])
    with pytest.raises(Rejected, match="does not speculate"):
        llama_check(["llama-server", "-m", "a.gguf", "-md", "d.gguf", "--spec-draft-n-max", "4"])
    with pytest.raises(Rejected, match="invalid argument"):
        llama_check(["llama-server", "-m", "a.gguf", "--spec-draft-max", "4"])
    assert llama_check(["llama-server", "-m", "a.gguf"]) == {"-m": "a.gguf"}


# ------------------------------------------------------------------------------------------
# the printed settings against the validators

STAIRS = [
    (
        [{"k": 0}, {"k": 1}, {"k": 2}, {"k": 4}, {"k": 8}],
        [0.27, 0.51, 0.62, 0.62, 0.76, 0.76, 0.82, 0.82],
    ),
    ([{"k": 0}, {"k": 2}, {"k": 3}], [0.6, 0.6, 0.9]),
]


def _check(engine: str, s: dict, device: str) -> None:
    for which in ("command", "dynamic"):
        argv = s.get("command") if which == "command" else (s.get("dynamic") or {}).get("command")
        if argv is None:
            continue
        assert shlex.split(s["shell"] if which == "command" else s["dynamic"]["shell"]) == argv
        assert "--draft-max" not in argv and "--draft-min" not in argv
        if engine == "vllm":
            cfg = vllm_check(argv)
            if s["draft_length"] == 0:
                assert cfg is None
            else:
                assert cfg["num_speculative_tokens"] == s["draft_length"]
                if which == "dynamic":
                    assert cfg["_k_at_batch_1"] == s["draft_length"]
        elif engine == "sglang":
            files = {s["dynamic"]["file"]: s["dynamic"]["config"]} if which == "dynamic" else {}
            ns = sglang_check(argv, files)
            k = s["draft_length"]
            if k:
                assert ns.speculative_num_draft_tokens == k + 1  # the planned pass of k + 1
            assert (ns.device == "cpu") == (device == "cpu")
        else:
            seen = llama_check(argv)
            k = s["draft_length"]
            if k and which == "command":
                key = "--spec-ngram-mod-n-max" if s["drafter"] == "ngram" else "--spec-draft-n-max"
                assert int(seen[key]) == k
            if "--spec-ngram-mod-n-min" in seen:
                assert int(seen["--spec-ngram-mod-n-min"]) <= int(seen["--spec-ngram-mod-n-max"])


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp"])
@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_printed_settings_pass_the_engines_checks(engine, drafter, device):
    draft = None if drafter == "ngram" else ("d.gguf" if engine == "llama.cpp" else "org/draft")
    target = "t.gguf" if engine == "llama.cpp" else "org/target"
    for stair, points in STAIRS:
        levels = sorted({lv["k"] for lv in stair})
        for k in levels:
            s = engine_settings(
                engine, k=k, drafter=drafter, target_model=target, draft_model=draft,
                device=device, staircase=stair, step_points=points, force_triton=device == "cuda",
            )  # fmt: skip
            if engine == "llama.cpp" and drafter == "eagle" and k:
                assert s["command"] is None and "draft-eagle3" in s["notes"][0]
                continue
            _check(engine, s, device)
            dyn = s.get("dynamic") or {}
            if k and engine == "sglang" and drafter.startswith("eagle"):
                assert dyn["available"] and dyn["config"] == {"1": {"candidate_steps": levels}}
            if k and engine == "llama.cpp" and drafter in ("draft-model", "eagle3"):
                v = dyn["value"]
                assert (v["n_max"], v["n_min"]) == (max(levels), min(x for x in levels if x))
                assert v["p_min"] == pytest.approx(points[0], abs=1e-4)
            if k and not dyn.get("available"):
                assert dyn["note"]  # says plainly that there is no such knob


def test_missing_draft_model_is_an_error_naming_it():
    for drafter in ("draft-model", "eagle", "eagle3"):
        with pytest.raises(InputError) as exc:
            engine_settings("vllm", k=3, drafter=drafter, target_model="m")
        assert exc.value.argument == "draft_model"
        with pytest.raises(InputError):
            EngineRequest(drafter=drafter)


# ------------------------------------------------------------------------------------------
# the kernel rules


def test_kernel_rules_follow_the_engines_sources():
    """vLLM: per slot while n * top_k * 4 <= num_experts (fused_moe.py); llama.cpp CUDA: MMVQ
    up to 8 tokens on Ada/Hopper/Blackwell and Volta, by type on Turing/Ampere and Pascal."""
    for N, m in ((64, 8), (256, 8), (128, 8), (8, 2), (32, 4)):
        ek = engine_kernel("vllm", "cuda", 12, num_experts=N, top_k=m)
        want = ["per_slot" if n * m * 4 <= N else "dedup" for n in range(1, 13)]  # brute force
        assert list(ek.kernel) == want
        assert "fused_moe.py" in ek.sources[0]["file"]
        for e in ("vllm", "sglang", "llama.cpp"):
            assert set(engine_kernel(e, "cpu", 12, num_experts=N, top_k=m).kernel) == {"dedup"}
        assert set(engine_kernel("sglang", "cuda", 12, num_experts=N, top_k=m).kernel) == {"dedup"}
    cases = [(900, "Q4_K", 8), (890, "Q2_K", 8), (700, "Q3_K", 8), (1200, "IQ3_S", 8),
             (800, "Q3_K", 5), (860, "IQ3_S", 6), (750, "Q4_K", 8), (610, "Q6_K", 4), (600, "Q4_0", 6)]  # fmt: skip
    for cc, wt, limit in cases:  # get_mmvq_mmid_max_batch of ggml-cuda/mmvq.cu
        ek = engine_kernel(
            "llama.cpp", "cuda", 12, num_experts=64, top_k=8, compute_capability=cc, weight_type=wt
        )
        assert ek.kernel.count("per_slot") == limit and ek.kernel[limit:] == ("dedup",) * (
            12 - limit
        )
    assert (
        engine_kernel(
            "llama.cpp",
            "cuda",
            4,
            num_experts=64,
            top_k=8,
            compute_capability=None,
            weight_type="Q4_K",
        ).kernel
        is None
    )
    bf16 = engine_kernel(
        "llama.cpp", "cuda", 4, num_experts=64, top_k=8, compute_capability=900, weight_type="BF16"
    )
    assert bf16.kernel is None and "not tabled" in bf16.note
    assert engine_kernel("vllm", "mps", 4, num_experts=64, top_k=8).kernel is None
    assert (
        compute_capability_of("NVIDIA H200") == 900 and compute_capability_of("NVIDIA L40S") == 890
    )
    assert (
        compute_capability_of("NVIDIA GH200 480GB") == 900
        and compute_capability_of("AMD EPYC") is None
    )
    for e in engine_rules()["engines"].values():
        for d in e["devices"].values():
            assert d["sources"] and all(s["file"] and s["text"] for s in d["sources"])


def _cuda_profile(spec):
    import dataclasses

    return dataclasses.replace(toy_profile(spec), device="cuda", device_name="NVIDIA H200")


def test_plan_predicts_for_each_engines_kernel():
    """Under an engine's kernel the verify time at n is the per-slot or the dedup one, as its
    rule says at that n; the engine's k* and settings follow its own step times."""
    spec = toy_spec(num_experts=64, top_k=2)
    from test_plan import L, M  # noqa: F401

    union = np.tile(2 * np.arange(1, NMAX + 1, dtype=float), (3, 1))
    plan = build_plan(
        spec,
        union,
        _cuda_profile(spec),
        k_max=NMAX - 1,
        acceptance=[F(1, 2), F(9, 10)],
        expected_acceptance=F(7, 10),
    )
    d = plan.to_dict()
    ek = d["engine_kernels"]
    assert ek["vllm"]["kernel"] == [
        "per_slot" if n * 2 * 4 <= 64 else "dedup" for n in range(1, NMAX + 1)
    ]
    assert ek["llama.cpp"]["kernel"] == ["per_slot"] * NMAX  # MMVQ up to 8 on Hopper
    assert ek["sglang"]["kernel"] == ["dedup"] * NMAX
    for e in ("vllm", "sglang", "llama.cpp"):
        want = [
            d["verify_ms"]["per_slot" if x == "per_slot" else "dedup"][i]
            for i, x in enumerate(ek[e]["kernel"])
        ]
        assert ek[e]["verify_ms"] == pytest.approx(want, rel=1e-15)
        V = ek[e]["step_ms"]
        assert ek[e]["step_points"] == theory.step_points(V)
        k = theory.best_draft_length(V, F(7, 10))
        assert d["engine"][e]["draft_length"] == k == d["engine"]["settings"][e]["draft_length"]
    assert ek["llama.cpp"]["verify_ms"] == d["verify_ms"]["per_slot"]
    assert ek["sglang"]["verify_ms"] == d["verify_ms"]["dedup"]
    assert "--moe-backend triton" in d["engine"]["settings"]["vllm"]["shell"]
    assert "kernel switch" in d["engine"]["best"]["kernel"]


@stats_available
@pytest.mark.parametrize(
    "extra",
    [
        [],
        [
            "--engine",
            "llama.cpp",
            "--drafter",
            "eagle3",
            "--draft-model",
            "head.gguf",
            "--target-model",
            "t.gguf",
        ],
        ["--engine", "sglang,vllm", "--drafter", "eagle", "--draft-model", "org/eagle-head"],
        ["--drafter", "draft-model", "--draft-model", "org/draft"],
    ],
)
def test_cli_prints_settings_that_pass_the_checks(inputs, capsys, extra):  # noqa: F811
    out = inputs["tmp"] / "out"
    args = [
        *plan_argv(inputs),
        "--k-max",
        "4",
    ]
    assert main([*args, *extra, "--json", "--out", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    st = d["engine"]["settings"]
    names = [x for x in ("vllm", "sglang", "llama.cpp") if x in st]
    assert names == (
        ["vllm", "sglang", "llama.cpp"]
        if "--engine" not in extra
        else [x for x in ("vllm", "sglang", "llama.cpp") if x in " ".join(extra)]
    )
    for e in names:
        if st[e]["command"] is not None:
            _check(e, st[e], "cpu")
    if "sglang" in names and st["sglang"].get("dynamic", {}).get("available"):
        assert (
            json.loads((out / "sglang_adaptive.json").read_text())
            == st["sglang"]["dynamic"]["config"]
        )
    assert main([*args, *extra]) == 0
    text = capsys.readouterr().out
    assert "--draft-max" not in text and "kernel switch the engine would need" in text
    for e in names:
        if st[e]["shell"]:
            assert st[e]["shell"] in text


def test_committed_plans_print_no_removed_flag():
    root = Path(__file__).resolve().parents[1]
    for folder in ("results/cpu/plan", "results/cpu/plan-olmoe-dummy-4L"):
        d = json.loads((root / folder / "plan.json").read_text())
        for e in ("vllm", "sglang", "llama.cpp"):
            _check(e, d["engine"]["settings"][e], "cpu")
        assert "--draft-max" not in (root / folder / "summary.txt").read_text()


def test_an_older_plan_json_still_summarises():
    """A plan.json written before the engines' own settings (old keys) reads and prints, and
    says its settings are refused by today's engines rather than printing them."""
    from specmoe.commands.plan import summary

    root = Path(__file__).resolve().parents[1]
    d = json.loads((root / "results/cpu/plan/plan.json").read_text())
    d.pop("engine_kernels")
    d["engine"] = {
        "expected_acceptance": 0.7,
        **{p: {"draft_length": 4, "speedup": 1.5} for p in ("per_slot", "dedup", "best")},
        "settings": {
            "vllm": {"speculative_config": {"num_speculative_tokens": 4}},
            "llama.cpp": {"--draft-max": 4, "--draft-min": 4},
            "dedup_from_pass_size": 2,
        },
    }
    text = summary(d)
    assert "older specmoe plan" in text and "--draft-max 4" not in text


# ------------------------------------------------------------------------------------------
# the real llama-server (after `make llama-cpp`)


def _llama_built() -> bool:
    from specmoe.engines import llamacpp

    return llamacpp.is_built()


@pytest.mark.slow
@pytest.mark.skipif(not _llama_built(), reason="llama.cpp not built (make llama-cpp)")
def test_llama_server_starts_with_the_printed_flags(inputs, tmp_path, capsys):  # noqa: F811
    """llama-server (llama-cpp-python 0.3.36's llama.cpp, built by `make llama-cpp`) starts
    with every command specmoe plan prints for it, on the bundled model and draft as GGUF,
    and serves a completion; the flags specmoe printed before abort its start-up."""
    import socket
    import subprocess
    import time
    import urllib.request

    from specmoe.data import corpus
    from specmoe.engines import llamacpp

    target = llamacpp.export_gguf(corpus.bundled_model_dir(), tmp_path / "t.gguf", outtype="f32")
    draft = llamacpp.export_gguf(corpus.bundled_draft_dir(), tmp_path / "d.gguf", outtype="f32")
    server = str(llamacpp.tool("llama-server"))

    def start(argv: list[str]) -> tuple[int, str]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        log = open(tmp_path / f"server-{port}.log", "w+")
        extra = ["--host", "127.0.0.1", "--port", str(port), "-c", "512", "-t", "1", "-np", "1"]
        proc = subprocess.Popen([server, *argv[1:], *extra], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 120
            while time.time() < deadline and proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        if r.status == 200:
                            req = urllib.request.Request(
                                f"http://127.0.0.1:{port}/completion",
                                data=json.dumps({"prompt": "The", "n_predict": 8}).encode(),
                                headers={"Content-Type": "application/json"},
                            )
                            with urllib.request.urlopen(req, timeout=60) as c:
                                body = json.loads(c.read())
                            return 0, json.dumps(body.get("timings", {}))
                except OSError:
                    time.sleep(0.5)
            log.seek(0)
            return proc.poll() if proc.poll() is not None else -1, log.read()[-2000:]
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
            log.close()

    args = [
        *plan_argv(inputs),
    ]
    args += ["--k-max", "4", "--engine", "llama.cpp", "--target-model", str(target)]
    started = 0
    for drafter in ("ngram", "draft-model"):
        extra = [] if drafter == "ngram" else ["--draft-model", str(draft)]
        assert main([*args, "--drafter", drafter, *extra, "--json"]) == 0
        s = json.loads(capsys.readouterr().out)["engine"]["settings"]["llama.cpp"]
        commands = [s["command"], (s.get("dynamic") or {}).get("command")]
        for argv in filter(None, commands):
            rc, out = start(argv)
            assert rc == 0, (argv, out)
            timings = json.loads(out)
            if drafter == "draft-model":  # it speculated: llama.cpp's timings count drafts
                assert timings.get("draft_n", 0) > 0, timings
            started += 1
    assert started >= 3
    rc, out = start([server, "-m", str(target), "-md", str(draft), "--draft-max", "4"])
    assert rc != 0 and "has been removed" in out
