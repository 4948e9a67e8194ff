"""llama.cpp itself on the bundled models: the GGUF export, its tokens, its greedy output and
its speculative runs against specmoe's transformers engine.

Skipped when llama.cpp is not built (``make llama-cpp``); CI builds it and sets
SPECMOE_REQUIRE_LLAMACPP=1, and then a missing build fails these tests instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from specmoe.engines import llamacpp

REQUIRED = bool(os.environ.get("SPECMOE_REQUIRE_LLAMACPP"))
pytestmark = pytest.mark.skipif(
    not llamacpp.is_built() and not REQUIRED,
    reason=f"llama.cpp {llamacpp.VERSION} is not built (make llama-cpp)",
)

STDLIB_FILE = "textwrap.py"  # a stdlib source file, tokenized whole
N_GREEDY = 32


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    """The bundled target as bf16 and f32 GGUF and the bundled draft as bf16, exported by
    ``specmoe export``."""
    from specmoe.cli import main

    folder = tmp_path_factory.mktemp("gguf")
    out = {}
    for name, model, outtype in [
        ("bf16", "bundled", "bf16"),
        ("f32", "bundled", "f32"),
        ("draft", "bundled-draft", "bf16"),
    ]:
        path = folder / f"{name}.gguf"
        argv = ["export", "--format", "gguf", "--model", model, "--out", str(path)]
        assert main([*argv, "--outtype", outtype]) == 0
        out[name] = path
    return out


@pytest.fixture(scope="module")
def target():
    from specmoe.engine.models import load_model, load_tokenizer

    return load_model("bundled"), load_tokenizer("bundled")  # float32 on the CPU


def _stdlib_text(chars: int | None = None) -> str:
    from specmoe.data.corpus import stdlib_root

    text = (stdlib_root() / STDLIB_FILE).read_text(encoding="utf-8")
    return text if chars is None else text[:chars]


def _gguf_fields(path) -> dict:
    """Metadata read back by llama.cpp's own gguf-py (the vendored copy), in a subprocess."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]);"
        "from gguf import GGUFReader; r = GGUFReader(sys.argv[2]);"
        "f = {k: r.fields[k].contents() for k in ('general.architecture', 'tokenizer.ggml.pre',"
        " 'olmoe.block_count', 'olmoe.expert_count', 'olmoe.expert_used_count')};"
        "f['tensors'] = {t.name: [int(x) for x in t.shape] for t in r.tensors};"
        "f['types'] = sorted({t.tensor_type.name for t in r.tensors}); print(json.dumps(f))"
    )
    src = str(llamacpp.cache_root() / "src" / "gguf-py")
    proc = subprocess.run(
        [sys.executable, "-c", code, src, str(path)], capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout)


@pytest.mark.parametrize("name", ["bf16", "f32"])
def test_export_loads_with_the_models_shapes(gguf, name):
    cfg = json.loads((llamacpp_model_dir() / "config.json").read_text())
    f = _gguf_fields(gguf[name])
    assert f["general.architecture"] == "olmoe"
    assert f["tokenizer.ggml.pre"] == "gpt-2"  # the bundled tokenizer's pre-tokenizer
    assert f["olmoe.block_count"] == cfg["num_hidden_layers"]
    assert f["olmoe.expert_count"] == cfg["num_experts"]
    assert f["olmoe.expert_used_count"] == cfg["num_experts_per_tok"]
    # the stacked experts: [hidden, intermediate, experts] in ggml's order
    up = f["tensors"]["blk.0.ffn_up_exps.weight"]
    assert up == [cfg["hidden_size"], cfg["intermediate_size"], cfg["num_experts"]]
    assert ("BF16" in f["types"]) == (name == "bf16")
    # and llama.cpp loads it: llama-bench runs one pass on it
    (t,) = llamacpp.bench_verify(gguf[name], n_values=(1,), depth=0, repeats=1)
    assert t.n_prompt == 1 and t.median_ms > 0


def llamacpp_model_dir():
    from specmoe.engine.models import resolve_model_dir

    return resolve_model_dir("bundled")


def test_tokens_equal_the_bundled_tokenizers_on_a_stdlib_file(gguf, target):
    _, tok = target
    text = _stdlib_text()
    ids = llamacpp.tokenize(gguf["bf16"], text)
    ref = tok.encode(text, add_special_tokens=False)
    assert len(ref) > 5000
    assert ids == ref


@pytest.mark.parametrize("name", ["bf16", "f32"])
def test_greedy_output_equals_transformers(gguf, target, name):
    from specmoe.engine.speculative import Engine

    model, tok = target
    prompt = _stdlib_text(600)
    ids = tok.encode(prompt, add_special_tokens=False)
    with Engine(model) as eng:
        ref = eng.greedy(ids, N_GREEDY)
    assert 0 not in ref  # no end-of-text inside the 32 tokens: llama-simple prints all 32
    text = llamacpp.greedy_text(gguf[name], prompt, n_tokens=N_GREEDY)
    assert text == tok.decode(ids + ref)


def test_bench_verify_times_every_pass_size(gguf):
    times = llamacpp.bench_verify(gguf["bf16"], n_values=tuple(range(1, 10)), depth=64, repeats=2)
    assert [t.n_prompt for t in times] == list(range(1, 10))
    assert all(t.depth == 64 and t.n_gen == 0 and t.threads == 1 for t in times)
    assert all(len(t.samples_ms) == 2 and min(t.samples_ms) > 0 for t in times)
    assert not any(t.flash_attn for t in times)


def test_speculative_run_writes_a_valid_round_log(gguf, target, tmp_path):
    from specmoe.engine.speculative import Engine
    from specmoe.formats.roundlog import leading_match, read_round_log

    model, tok = target
    prompt = _stdlib_text(400)
    k = 3
    run = llamacpp.run_speculative(gguf["f32"], gguf["draft"], prompt, k=k, n_predict=40)
    prompt_ids = llamacpp.tokenize(gguf["f32"], prompt)
    assert len(prompt_ids) == run.n_input
    assert prompt_ids == tok.encode(prompt, add_special_tokens=False)
    # the tool's own summary is the sum over the rounds read from its log
    assert sum(r.accepted + 1 for r in run.rounds) == run.n_predict
    assert sum(r.accepted for r in run.rounds) == run.n_accept
    assert sum(r.k for r in run.rounds) == run.n_drafted
    assert all(r.k <= k for r in run.rounds)
    # greedy speculation is lossless: the tokens it emitted are the target's greedy tokens
    emitted = [t for r in run.rounds for t in (*r.draft_tokens[: r.accepted], r.last_token)]
    with Engine(model) as eng:
        assert emitted == eng.greedy(prompt_ids, len(emitted))
    out = tmp_path / "log"
    llamacpp.write_round_log(
        run, out, model=model, prompt_ids=prompt_ids, run_id="llamacpp-k3", prompt_id="p0", budget=k
    )
    log = read_round_log(out)  # validated on read
    assert log.num_rounds == len(run.rounds)
    assert int(log["emitted"].sum()) == run.n_predict
    assert int(log["accepted"].sum()) == run.n_accept
    assert list(log["k"]) == [r.k for r in run.rounds]
    assert list(log["context_len"]) == [r.context_len for r in run.rounds]
    assert np.allclose(log["t_verify_ms"], [r.t_verify_ms for r in run.rounds])
    assert set(log["kernel"]) == {"llama.cpp"}
    # the replayed passes (specmoe's engine, the same tokens) accept what llama.cpp accepted
    passes = llamacpp.replay_routing(model, prompt_ids, run)
    for r, v in zip(run.rounds, passes, strict=True):
        d = np.asarray(r.draft_tokens, dtype=np.int64)
        t = np.asarray(v.tokens, dtype=np.int64)
        got = leading_match(d, np.array([0, len(d)]), t, np.array([0, len(t)]))[0]
        assert got == r.accepted and v.tokens[r.accepted] == r.last_token
        assert v.routing.shape == (r.k + 1, 4, 8)


def test_bench_engine_llamacpp_writes_its_verify_times(gguf, tmp_path, capsys):
    from specmoe.cli import main

    argv = ["bench", "--engine", "llama.cpp", "--model", str(gguf["bf16"]), "--depths", "32,64"]
    assert main([*argv, "--n-max", "3", "--reps", "2", "--out", str(tmp_path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads((tmp_path / "llamacpp_verify.json").read_text())
    assert printed["verify"] == saved["verify"]
    assert sorted(saved["verify"]) == ["32", "64"]
    for rows in saved["verify"].values():
        assert [r["n"] for r in rows] == [1, 2, 3]
        assert all(len(r["samples_ms"]) == 2 and r["min_ms"] <= r["median_ms"] for r in rows)


def test_run_engine_llamacpp_writes_round_logs_and_a_summary(tmp_path, capsys):
    from specmoe.cli import main
    from specmoe.formats.roundlog import read_round_log

    argv = ["run", "--engine", "llama.cpp", "--drafter", "draft-model", "--k", "0,3"]
    argv += ["--num-prompts", "1", "--tokens", "32", "--out", str(tmp_path), "--json"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert printed == saved
    assert saved["plain_tokens_per_s"] > 0 and list(saved["by_k"]) == ["3"]
    (row,) = saved["runs"]
    log = read_round_log(tmp_path / "rounds")
    assert log.num_rounds == row["logged_rounds"]
    assert set(log["k"]) <= {0, 1, 2, 3} and set(log["budget"]) == {3}
    manifest = json.loads((tmp_path / "run.json").read_text())
    assert manifest["options"]["engine"] == "llama.cpp" and manifest["grid"]["k"] == [0, 3]


def test_server_synthetic_acceptance_counts(gguf):
    from specmoe.engines.llamacpp_server import serve_completion, synthetic_run

    prompt = _stdlib_text(300)
    plain = serve_completion(gguf["bf16"], prompt, n_predict=48)
    assert plain.predicted_n == 48 and plain.draft_n == 0 and plain.tokens_per_s > 0
    every = synthetic_run(gguf["bf16"], gguf["draft"], prompt, k=4, acceptance=1.0, n_predict=48)
    assert every.predicted_n == 48 and every.draft_n > 0
    assert every.draft_n_accepted == every.draft_n  # rate 1: every draft accepted
    # each round: 4 drafts accepted and one target token, less at the end of the budget
    assert every.draft_n <= 4 * (48 // 5 + 1)
    none = synthetic_run(gguf["bf16"], gguf["draft"], prompt, k=4, acceptance=0.0, n_predict=48)
    assert none.draft_n > 0 and none.draft_n_accepted == 0


def _gguf_eps(path) -> float:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from gguf import GGUFReader;"
        "print(repr(float(GGUFReader(sys.argv[2]).fields["
        "'olmoe.attention.layer_norm_rms_epsilon'].contents())))"
    )
    src = str(llamacpp.cache_root() / "src" / "gguf-py")
    proc = subprocess.run(
        [sys.executable, "-c", code, src, str(path)], capture_output=True, text=True, check=True
    )
    return float(proc.stdout)


def test_export_keeps_the_checkpoints_rmsnorm_epsilon(gguf, tmp_path):
    """llama.cpp's OLMoE converter writes 1e-5 whatever config.json says; the export keeps
    the checkpoint's value (a lifted model's is the source's times d/D)."""
    import shutil

    from specmoe.engines.llamacpp import export_gguf

    assert _gguf_eps(gguf["f32"]) == pytest.approx(1e-5, rel=1e-6)  # the bundled value
    model = tmp_path / "model"
    shutil.copytree(llamacpp_model_dir(), model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["rms_norm_eps"] = 2.5e-6
    (model / "config.json").write_text(json.dumps(cfg))
    out = export_gguf(model, tmp_path / "eps.gguf", outtype="f32")
    assert _gguf_eps(out) == pytest.approx(2.5e-6, rel=1e-6)  # float32 in the file
