"""``specmoe plan --engine llama.cpp --llamacpp-profile FILE``: the speedup from llama.cpp's own
pass times, the best k and llama-server's flags.

The arithmetic is checked against brute force with its own G_a(k) = (1 - a^(k+1)) / (1 - a) on
generated profiles; the flags are checked by starting llama-server with them on the bundled
GGUFs (skipped when llama.cpp is not built, as in tests/test_llamacpp_engine.py).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import time
import urllib.request
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specmoe.cli import main
from specmoe.cost.llamacpp_plan import (
    extra_ms,
    llamacpp_plan,
    load_llamacpp_profile,
    server_flags,
)
from specmoe.engines import llamacpp
from specmoe.errors import InputError

REQUIRED = bool(os.environ.get("SPECMOE_REQUIRE_LLAMACPP"))
needs_llamacpp = pytest.mark.skipif(
    not llamacpp.is_built() and not REQUIRED,
    reason=f"llama.cpp {llamacpp.VERSION} is not built (make llama-cpp)",
)

# the committed figures' shape: bf16 at d = 512, medians in ms (results/cpu/llamacpp/README.md)
TARGET_MS = [0.699, 0.557, 0.688, 0.800, 0.891, 1.027, 1.191, 1.316, 1.482]
DRAFT_MS = [0.45, 0.40, 0.45, 0.50, 0.55, 0.60, 0.65, 0.70, 0.75]


def _rows(ms):
    return [{"n": i + 1, "median_ms": v, "min_ms": v, "mean_ms": v} for i, v in enumerate(ms)]


def _profile(path, target=TARGET_MS, draft=DRAFT_MS, depth=512, **change):
    data = {
        "engine": "llama.cpp",
        "llama_cpp": "0.3.36",
        "model": "bundled",
        "dtype": "bf16",
        "threads": 1,
        "reps": 5,
        "verify": {str(depth): _rows(target)},
        "draft": {"model": "bundled-draft", "dtype": "bf16", "verify": {str(depth): _rows(draft)}},
    }
    data.update(change)
    path.write_text(json.dumps(data))
    return path


def _brute(target, draft, a, k_max):
    """S(a, k) for k = 0..k_max by the formulas alone: V(k) = tau_T(k+1) + tau_D(k+1) + k tau_D(1)
    (V(0) = tau_T(1)), G by the closed form."""
    V = [target[0]] + [target[k] + draft[k] + k * draft[0] for k in range(1, k_max + 1)]
    G = [(k + 1.0) if a == 1 else (1 - a ** (k + 1)) / (1 - a) for k in range(k_max + 1)]
    return [G[k] * V[0] / V[k] for k in range(k_max + 1)]


times = st.lists(st.floats(0.05, 5.0), min_size=9, max_size=9)


@settings(max_examples=60, deadline=None)
@given(target=times, draft=times, a=st.floats(0.0, 0.999), k_max=st.integers(1, 8))
def test_best_k_and_speedup_against_brute_force(tmp_path_factory, target, draft, a, k_max):
    path = _profile(tmp_path_factory.mktemp("p") / "v.json", target, draft)
    plan = llamacpp_plan(
        load_llamacpp_profile(path), [a], depth=512, k_max=k_max, target_model="T", draft_model="D"
    )
    (row,) = plan["plans"]
    brute = _brute(target, draft, a, k_max)
    assert row["speedup_by_k"] == pytest.approx(brute, rel=1e-12)
    assert row["speedup_by_k"][0] == 1.0
    best = max(brute)
    assert brute[row["draft_length"]] >= best * (1 - 1e-12)
    # the smallest maximiser: no smaller k is clearly as fast
    assert all(brute[k] < best * (1 + 1e-12) for k in range(row["draft_length"]))
    assert row["speedup"] == pytest.approx(brute[row["draft_length"]], rel=1e-12)
    # the staircase gives the same k at a (away from its step points)
    for lv in plan["staircase"]:
        if lv["a_from"] + 1e-9 < a < lv["a_to"] - 1e-9:
            assert lv["k"] == row["draft_length"]


@settings(max_examples=40, deadline=None)
@given(target=times, draft=times, grid=st.lists(st.floats(0.0, 0.999), min_size=2, max_size=8))
def test_best_k_rises_with_acceptance(tmp_path_factory, target, draft, grid):
    path = _profile(tmp_path_factory.mktemp("p") / "v.json", target, draft)
    grid = sorted(set(grid))
    plan = llamacpp_plan(
        load_llamacpp_profile(path), grid, depth=512, k_max=8, target_model="T", draft_model="D"
    )
    ks = [r["draft_length"] for r in plan["plans"]]
    assert ks == sorted(ks)


def test_speedup_at_zero_drafts_is_one(tmp_path):
    path = _profile(tmp_path / "v.json")
    grid = [0.0, 0.3, 0.7, 0.95, 0.999]
    plan = llamacpp_plan(
        load_llamacpp_profile(path), grid, depth=512, k_max=8, target_model="T", draft_model="D"
    )
    assert all(r["speedup_by_k"][0] == 1.0 for r in plan["plans"])
    assert plan["plans"][0]["draft_length"] == 0  # a = 0: a draft only costs


def test_cli_prints_flags_and_plain_when_speculation_does_not_pay(tmp_path, capsys):
    # a draft model as slow as the target: nothing pays at a = 0.3, k = 1 pays at a = 0.98
    slow = [v * 0.4 for v in TARGET_MS]
    path = _profile(tmp_path / "v.json", draft=slow)
    out = tmp_path / "plan"
    argv = ["plan", "--engine", "llama.cpp", "--llamacpp-profile", str(path)]
    argv += ["--acceptance", "0.3,0.98", "--target-model", "t.gguf", "--draft-model", "d.gguf"]
    assert main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads((out / "plan.json").read_text())
    s = data["engine"]["settings"]["llama.cpp"]
    lo, hi = s["plans"]
    assert lo["draft_length"] == 0 and not lo["pays"]
    assert lo["command"] == ["llama-server", "-m", "t.gguf", "-t", "1", "-fa", "off"]
    assert "a = 0.3: speculation does not pay" in text
    assert hi["draft_length"] >= 1
    k = str(hi["draft_length"])
    assert hi["command"][1:] == shlex.split(
        f"-m t.gguf -md d.gguf --spec-type draft-simple --spec-draft-n-max {k} "
        "--spec-draft-n-min 0 --spec-draft-p-min 0 -t 1 -fa off"
    )
    assert hi["shell"] in text
    V = s["step_ms"]
    assert V[1] == pytest.approx(TARGET_MS[1] + slow[1] + slow[0])


def test_server_flags_plain_and_speculative():
    assert server_flags(k=0, target="t", draft=None) == ["-m", "t", "-t", "1", "-fa", "off"]
    argv = server_flags(k=3, target="t", draft="d", threads=2)
    assert argv[argv.index("--spec-draft-n-max") + 1] == "3"
    assert argv[argv.index("-t") + 1] == "2"
    assert "-ctk" not in argv and "-ctkd" not in argv  # f16: llama.cpp's default


def test_server_flags_and_the_plan_carry_the_profiles_kv_cache_type(tmp_path):
    """A profile benchmarked with q8_0 keys plans llama-server with them: the target's cache
    (-ctk) always, the draft's (-ctkd) when drafting; a profile without the field is f16; a
    type llama-bench cannot have timed is one error naming the file."""
    assert server_flags(k=0, target="t", draft=None, kv_type="q8_0")[-2:] == ["-ctk", "q8_0"]
    argv = server_flags(k=2, target="t", draft="d", kv_type="q8_0")
    assert argv[-4:] == ["-ctk", "q8_0", "-ctkd", "q8_0"]
    prof = load_llamacpp_profile(_profile(tmp_path / "q8.json", kv_type="q8_0"))
    assert prof.meta["kv_type"] == "q8_0"
    plan = llamacpp_plan(
        prof, [0.2, 0.99], depth=512, k_max=8, target_model="t.gguf", draft_model="d.gguf"
    )
    assert plan["kv_type"] == "q8_0"
    for p in plan["plans"]:
        assert p["command"][-2:] == (["-ctkd", "q8_0"] if p["draft_length"] else ["-ctk", "q8_0"])
        assert "-ctk q8_0" in p["shell"]
    assert {p["draft_length"] > 0 for p in plan["plans"]} == {False, True}
    assert load_llamacpp_profile(_profile(tmp_path / "old.json")).meta["kv_type"] == "f16"
    with pytest.raises(InputError, match=r"bad\.json.*kv_type 'q4_0'"):
        load_llamacpp_profile(_profile(tmp_path / "bad.json", kv_type="q4_0"))


def _bad_cases(tmp_path):
    base = json.loads(_profile(tmp_path / "ok.json").read_text())
    cases = {}

    def put(name, data):
        p = tmp_path / f"{name}.json"
        p.write_text(data if isinstance(data, str) else json.dumps(data))
        cases[name] = p

    put("not_json", "{")
    put("other_engine", {**base, "engine": "specmoe"})
    put("no_draft", {k: v for k, v in base.items() if k != "draft"})
    put("gap", {**base, "verify": {"512": [r for r in base["verify"]["512"] if r["n"] != 3]}})
    put("negative", {**base, "verify": {"512": [{"n": 1, "median_ms": -1.0}]}})
    put("verify_list", {**base, "verify": [1, 2]})
    cases["missing"] = tmp_path / "missing.json"
    return cases


@pytest.mark.parametrize(
    "case,words",
    [
        ("missing", "no such file"),
        ("not_json", "not readable JSON"),
        ("other_engine", "not a llama.cpp profile"),
        ("no_draft", "no draft-model passes"),
        ("gap", "no pass of n = 3"),
        ("negative", "not a positive number"),
        ("verify_list", "not an object of depths"),
    ],
)
def test_bad_profile_is_one_line_exit_2(case, words, tmp_path, capsys):
    path = _bad_cases(tmp_path)[case]
    rc = main(["plan", "--engine", "llama.cpp", "--llamacpp-profile", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert (len(err) == 1 and err[0].startswith("error: --llamacpp-profile")) or (
        len(err) == 1 and "--llamacpp-profile" in err[0]
    )
    assert words in err[0]


@pytest.mark.parametrize(
    "extra,words",
    [
        (["--context", "2048"], "--context"),
        (["--engine", "vllm"], "only with --engine llama.cpp"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(extra, words, tmp_path, capsys):
    path = _profile(tmp_path / "v.json")
    rc = main(["plan", "--engine", "llama.cpp", "--llamacpp-profile", str(path), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and words in err[0]


def test_bench_draft_model_needs_llamacpp_engine(capsys):
    rc = main(["bench", "--model", "bundled", "--draft-model", "bundled-draft"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--draft-model" in err[0]
    for argv in (
        ["--model", "bundled"],
        ["--model", "bundled", "--engine", "llama.cpp", "--whole-pass"],
    ):
        rc = main(["bench", *argv, "--no-output-rows"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and "--no-output-rows" in err[0]


# ------------------------------------------------------------------------------------------
# llama.cpp itself


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@needs_llamacpp
@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_bench_plan_and_llama_server_starts_with_the_flags(kv, tmp_path, capsys):
    """bench times the target and the draft model (their KV caches in ``kv``: llama-bench
    reports the type it ran); the plan's printed command, run as it is (plus a port), starts
    llama-server: its /health answers 200."""
    gguf = {}
    for name, model in [("target", "bundled"), ("draft", "bundled-draft")]:
        gguf[name] = tmp_path / f"{name}.gguf"
        argv = ["export", "--format", "gguf", "--model", model, "--out", str(gguf[name])]
        assert main([*argv, "--outtype", "bf16"]) == 0
    prof = tmp_path / "bench"
    argv = ["bench", "--engine", "llama.cpp", "--model", str(gguf["target"])]
    argv += ["--draft-model", str(gguf["draft"]), "--depths", "64", "--n-max", "4", "--reps", "2"]
    assert main([*argv, "--kv-type", kv, "--out", str(prof)]) == 0
    data = json.loads((prof / "llamacpp_verify.json").read_text())
    assert data["kv_type"] == kv
    # the bundled model's heads are 32 wide: an f16 cache gets the note where this CPU's f16
    # dot product steps past 32 (AVX-512), a q8_0 one never
    want = llamacpp.scalar_attention_note(32, llamacpp.cpu_flags()) if kv == "f16" else None
    assert data.get("notes", []) == ([want] if want else [])
    assert [r["n"] for r in data["draft"]["verify"]["64"]] == [1, 2, 3, 4]
    rows = data["output_rows"]["depths"]["64"]  # libllama's paired passes, 6 blocks of 3 counted
    assert [r["n"] for r in rows] == [1, 2, 3, 4]
    assert all(r["all_rows_ms"]["count"] == r["last_row_ms"]["count"] == 18 for r in rows)
    out = tmp_path / "plan"
    argv = [
        "plan",
        "--engine",
        "llama.cpp",
        "--llamacpp-profile",
        str(prof / "llamacpp_verify.json"),
    ]
    argv += ["--context", "64", "--acceptance", "0.999", "--out", str(out)]
    argv += ["--target-model", str(gguf["target"]), "--draft-model", str(gguf["draft"])]
    assert main(argv) == 0
    capsys.readouterr()
    s = json.loads((out / "plan.json").read_text())["engine"]["settings"]["llama.cpp"]
    assert s["k_max"] == 3  # passes of up to 4 tokens timed
    plans = s["plans"]
    # the speculative command whatever k* is (k = 1 if a does not make a draft pay)
    cmd = plans[0]["command"]
    if plans[0]["draft_length"] == 0:
        cmd = [
            "llama-server",
            *server_flags(k=1, target=str(gguf["target"]), draft=str(gguf["draft"]), kv_type=kv),
        ]
    assert s["kv_type"] == kv and s["notes"] == data.get("notes", [])
    assert ("-ctk" in cmd) == (kv != "f16") and ("-ctkd" in cmd) == (kv != "f16")
    port = _free_port()
    argv = [
        str(llamacpp.tool("llama-server")),
        *cmd[1:],
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    log = tmp_path / "server.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [*argv, "-c", "512", "--no-warmup"], stdout=fh, stderr=subprocess.STDOUT
        )
    try:
        deadline, status = time.time() + 120, None
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    status = r.status
                    break
            except OSError:
                time.sleep(0.2)
        assert status == 200, log.read_text()[-2000:]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "speculative" in log.read_text().lower() or "draft" in log.read_text().lower()


def test_statistic_picks_the_profile_column(tmp_path, capsys):
    data = json.loads(_profile(tmp_path / "v.json").read_text())
    for r in data["verify"]["512"]:
        r["min_ms"] = r["median_ms"] / 2
    (tmp_path / "v.json").write_text(json.dumps(data))
    out = tmp_path / "plan"
    argv = ["plan", "--engine", "llama.cpp", "--llamacpp-profile", str(tmp_path / "v.json")]
    assert main([*argv, "--llamacpp-statistic", "min", "--out", str(out)]) == 0
    capsys.readouterr()
    s = json.loads((out / "plan.json").read_text())["engine"]["settings"]["llama.cpp"]
    assert s["statistic"] == "min_ms"
    assert s["tau_target_ms"] == pytest.approx([v / 2 for v in TARGET_MS])
    assert s["step_ms"][1] == pytest.approx(TARGET_MS[1] / 2 + DRAFT_MS[1] + DRAFT_MS[0])


def test_overhead_adds_to_plain_and_rounds(tmp_path, capsys):
    path = _profile(tmp_path / "v.json")
    out = tmp_path / "plan"
    argv = ["plan", "--engine", "llama.cpp", "--llamacpp-profile", str(path)]
    assert main([*argv, "--llamacpp-overhead", "0.25,1.5", "--out", str(out)]) == 0
    capsys.readouterr()
    s = json.loads((out / "plan.json").read_text())["engine"]["settings"]["llama.cpp"]
    V = s["step_ms"]
    assert V[0] == pytest.approx(TARGET_MS[0] + 0.25)
    assert V[2] == pytest.approx(TARGET_MS[2] + DRAFT_MS[2] + 2 * DRAFT_MS[0] + 1.5)
    a = s["plans"][-1]["acceptance"]
    g = (1 - a**3) / (1 - a)
    assert s["plans"][-1]["speedup_by_k"][2] == pytest.approx(g * V[0] / V[2])
    out3 = tmp_path / "plan3"
    assert main([*argv, "--llamacpp-overhead", "0.25,1.5,0.5", "--out", str(out3)]) == 0
    capsys.readouterr()
    s3 = json.loads((out3 / "plan.json").read_text())["engine"]["settings"]["llama.cpp"]
    assert s3["step_ms"][2] == pytest.approx(V[2] + 2 * 0.5)
    for bad in ("1", "a,b", "1,-2", "1,2,3,4,5", "nan,1", "0.25,1,0,0.5"):
        rc = main([*argv, "--llamacpp-overhead", bad])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and "--llamacpp-overhead" in err[0]


@settings(max_examples=60, deadline=None)
@given(
    o=st.tuples(*(st.floats(0, 3) for _ in range(3))),
    share=st.floats(0, 1),
    a=st.floats(0, 0.999),
)
def test_a_per_emitted_token_time_scores_every_k_as_brute_force(tmp_path_factory, o, share, a):
    """With o_emit ms per emitted token, a round of k drafts costs V(k) + o_emit G_a(k) and a
    plain token V(0) (o_emit inside o_plain): the plan's speedups and k* equal a brute force
    over k of tokens per ms, computed here from the pass times alone."""
    from fractions import Fraction as F

    path = _profile(tmp_path_factory.mktemp("p") / "v.json")
    o_plain, o_round, o_tok = o
    o_emit = o_plain * share
    prof = load_llamacpp_profile(str(path))
    s = llamacpp_plan(prof, [a], depth=512, k_max=8, target_model="T", draft_model="D",
                      overhead=(o_plain, o_round, o_tok, o_emit))  # fmt: skip
    p = s["plans"][0]

    def rate(k):  # tokens per ms of one round, exactly
        g = sum(F(a) ** j for j in range(k + 1))
        if k == 0:
            return 1 / (F(TARGET_MS[0]) + F(o_plain))
        step = F(TARGET_MS[k]) + F(DRAFT_MS[k]) + k * F(DRAFT_MS[0]) + F(o_round) + k * F(o_tok)
        return g / (step + F(o_emit) * g)

    rates = [rate(k) for k in range(9)]
    best = max(rates)
    assert p["draft_length"] == rates.index(best)
    for k in range(9):
        assert p["speedup_by_k"][k] == pytest.approx(float(rates[k] / rates[0]), rel=1e-9)
    assert s["overhead_ms"]["emitted_token"] == o_emit


@settings(max_examples=40, deadline=None)
@given(target=times, draft=times, extra=times, a=st.floats(0.0, 0.999))
def test_the_drafts_two_graph_builds_a_round_come_from_the_rebuilt_passes(
    tmp_path_factory, target, draft, extra, a
):
    """With ``draft.verify_rebuilt`` (tau_D^b), a round of k drafts costs tau_T(k+1) +
    tau_D^b(k+1) + tau_D^b(1) + (k-1) tau_D(1) (the re-evaluation and the first one-token
    draft build their graphs; the other drafts reuse), checked against that sum by hand."""
    rebuilt = [d + e for d, e in zip(draft, extra, strict=True)]
    path = tmp_path_factory.mktemp("p") / "v.json"
    _profile(path, target, draft)
    data = json.loads(path.read_text())
    data["draft"]["verify_rebuilt"] = {"512": _rows(rebuilt)}
    path.write_text(json.dumps(data))
    s = llamacpp_plan(load_llamacpp_profile(path), [a], depth=512, k_max=8, target_model="T",
                      draft_model="D")  # fmt: skip
    V = [target[0]] + [
        target[k] + rebuilt[k] + rebuilt[0] + (k - 1) * draft[0] for k in range(1, 9)
    ]
    assert s["step_ms"] == pytest.approx(V, rel=1e-12) and s["graph_builds"] is True
    G = [(1 - a ** (k + 1)) / (1 - a) for k in range(9)]
    kp = s["plans"][0]["draft_length"]
    assert G[kp] / V[kp] == pytest.approx(max(G[k] / V[k] for k in range(9)), rel=1e-12)


def test_rebuilt_passes_that_do_not_match_the_drafts_are_refused(tmp_path):
    path = _profile(tmp_path / "v.json")
    data = json.loads(path.read_text())
    data["draft"]["verify_rebuilt"] = {"512": _rows(DRAFT_MS[:5])}
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"draft\.verify_rebuilt\[512\] has not the passes"):
        load_llamacpp_profile(path)


def test_bench_verify_turns_graph_reuse_off_only_when_asked(monkeypatch, tmp_path):
    seen = []

    def fake_run(cmd, *, what, timeout=0, env=None):
        seen.append(env)
        raise RuntimeError("stop")

    monkeypatch.setattr(llamacpp, "_run", fake_run)
    monkeypatch.setattr(llamacpp, "tool", lambda name: tmp_path / name)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    for reuse in (True, False):
        with pytest.raises(RuntimeError):
            llamacpp.bench_verify(model, depth=8, graph_reuse=reuse)
    assert seen == [None, {"LLAMA_GRAPH_REUSE_DISABLE": "1"}]


def _with_rows(path, extra, depth=512):
    """The profile at ``path`` with an ``output_rows`` section whose paired medians are ``extra``."""
    data = json.loads(path.read_text())
    rows = [{"n": i + 1, "extra_ms": {"median": v, "ci95": [v, v]}} for i, v in enumerate(extra)]
    data["output_rows"] = {"depths": {str(depth): rows}}
    path.write_text(json.dumps(data))
    return path


@settings(max_examples=40, deadline=None)
@given(
    target=times,
    draft=times,
    extra=st.lists(st.floats(-0.5, 3.0), min_size=9, max_size=9),
    a=st.floats(0.0, 0.999),
)
def test_output_rows_add_to_every_speculative_round_only(tmp_path_factory, target, draft, extra, a):
    """With ``output_rows`` r(n), V(k >= 1) = tau_T(k+1) + r(k+1) + tau_D(k+1) + k tau_D(1),
    r clamped at 0 and r(1) = 0 (a plain token is one row, as llama-bench's); V(0) unchanged;
    without rows (``rows=False``, --llamacpp-last-row-only) the plan is the plain one."""
    path = _with_rows(_profile(tmp_path_factory.mktemp("p") / "v.json", target, draft), extra)
    prof = load_llamacpp_profile(path)
    s = llamacpp_plan(prof, [a], depth=512, k_max=8, target_model="T", draft_model="D")
    r = [0.0] + [max(0.0, x) for x in extra[1:]]
    V = [target[0]] + [target[k] + r[k] + draft[k] + k * draft[0] for k in range(1, 9)]
    assert s["step_ms"] == pytest.approx(V, rel=1e-12) and s["output_rows"] is True
    assert s["step_parts_ms"]["target_rows"] == pytest.approx([0.0, *r[1:]], rel=1e-12)
    G = [(k + 1.0) if a == 1 else (1 - a ** (k + 1)) / (1 - a) for k in range(9)]
    assert s["plans"][0]["speedup_by_k"] == pytest.approx(
        [G[k] * V[0] / V[k] for k in range(9)], rel=1e-12
    )
    plain = llamacpp_plan(
        prof, [a], depth=512, k_max=8, target_model="T", draft_model="D", rows=False
    )
    assert plain["output_rows"] is False
    assert plain["plans"][0]["speedup_by_k"] == pytest.approx(
        _brute(target, draft, a, 8), rel=1e-12
    )


def test_output_rows_move_k_down_and_the_cli_can_leave_them_out(tmp_path, capsys):
    """A row cost large enough at k >= 2 moves k* from 3 to 1 at a = 0.9 (worked by hand:
    target 10, 11, 12, 13 ms, draft 0.1 ms; with r(2..4) = 0, 5, 15 ms, V = 10, 11.2, 17.3,
    28.4 and S(0.9, k) = 1.696, 1.566, 1.211 at k = 1, 2, 3, against 1.696, 2.203, 2.566
    without)."""
    path = _profile(tmp_path / "v.json", [10.0, 11.0, 12.0, 13.0], [0.1] * 4)
    _with_rows(path, [0.0, 0.0, 5.0, 15.0])
    base = ["plan", "--engine", "llama.cpp", "--llamacpp-profile", str(path)]
    base += ["--acceptance", "0.9", "--k-max", "3"]
    for extra, k in [([], 1), (["--llamacpp-last-row-only"], 3)]:
        assert main([*base, *extra, "--json"]) == 0
        s = json.loads(capsys.readouterr().out)["engine"]["settings"]["llama.cpp"]
        assert s["plans"][0]["draft_length"] == k, (extra, s["step_ms"])
    assert main(base) == 0
    assert "target rows r_T(k+1) ms" in capsys.readouterr().out
    rc = main(["plan", "--llamacpp-last-row-only"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--llamacpp-last-row-only" in err[0]


def _ols(ns, ys):
    """Least squares c0 + c1 n by its closed form in exact fractions."""
    ns, ys = [Fraction(n) for n in ns], [Fraction(y) for y in ys]
    nb, yb = sum(ns) / len(ns), sum(ys) / len(ys)
    c1 = sum((n - nb) * (y - yb) for n, y in zip(ns, ys)) / sum((n - nb) ** 2 for n in ns)
    return yb - c1 * nb, c1


@settings(max_examples=60, deadline=None)
@given(medians=st.lists(st.integers(-2000, 30000).map(lambda v: v / 1000), min_size=2, max_size=11))
def test_rows_line_is_the_least_squares_line_on_two_rows_and_more(medians):
    """``line``: r(1) = 0 and r(n) = max(0, c0 + c1 n), (c0, c1) the least-squares line through
    the medians at n >= 2 (checked against the closed form in exact fractions); ``median``:
    the clamped medians. With one median past n = 1 the line is that median."""
    rows = [{"n": i + 1, "extra_ms": {"median": v}} for i, v in enumerate(medians)]
    got = extra_ms(rows, "line")
    ns = list(range(2, len(medians) + 1))
    if len(ns) >= 2:
        c0, c1 = _ols(ns, [Fraction(v).limit_denominator(1000) for v in medians[1:]])
        want = [0.0] + [max(0.0, float(c0 + c1 * n)) for n in ns]
    else:
        want = [0.0, max(0.0, medians[1])]
    assert got == pytest.approx(want, abs=1e-9)
    assert extra_ms(rows, "median") == [0.0] + [max(0.0, v) for v in medians[1:]]


def test_rows_line_worked_example_and_a_line_is_kept():
    """Medians 1, 5, 3 ms at n = 2, 3, 4 (by hand: mean n 3, mean r 3, slope 2 / 2 = 1,
    intercept 0) give 2, 3, 4 ms; medians on a line stay as they are."""
    rows = [{"n": n, "extra_ms": {"median": v}} for n, v in [(1, 0.4), (2, 1), (3, 5), (4, 3)]]
    assert extra_ms(rows, "line") == pytest.approx([0.0, 2.0, 3.0, 4.0], abs=1e-12)
    rows = [{"n": n, "extra_ms": {"median": 0.5 + 2.5 * n}} for n in range(1, 10)]
    assert extra_ms(rows, "line") == pytest.approx(
        [0.0] + [0.5 + 2.5 * n for n in range(2, 10)], abs=1e-9
    )
    with pytest.raises(ValueError, match="median, line"):
        extra_ms(rows, "spline")


def test_rows_line_moves_k_and_is_a_flag_of_the_llamacpp_plan_only(tmp_path, capsys):
    """Worked by hand: target 10, 11, 12, 13 ms, draft 0.1 ms, rows' medians 0, 0, 9, 3 at
    n = 1..4. By median r = 0, 9, 3 at n = 2..4: V = 10, 11.2, 21.3, 16.4, and at a = 0.6
    (G = 1.6, 1.96, 2.176 at k = 1..3) S = 1.429, 0.920, 1.327, so k* = 1. By line (on
    n = 2..4: mean n 3, mean r 4, slope 3 / 2, intercept -0.5) r = 2.5, 4, 5.5: V = 10, 13.7,
    16.3, 18.9, S = 1.168, 1.202, 1.151, so k* = 2. A plan outside --llamacpp-profile refuses
    the flag."""
    path = _profile(tmp_path / "v.json", [10.0, 11.0, 12.0, 13.0], [0.1] * 4)
    _with_rows(path, [0.0, 0.0, 9.0, 3.0])
    base = ["plan", "--engine", "llama.cpp", "--llamacpp-profile", str(path)]
    base += ["--acceptance", "0.6", "--k-max", "3", "--json"]
    want = {"median": ([10.0, 11.2, 21.3, 16.4], 1), "line": ([10.0, 13.7, 16.3, 18.9], 2)}
    for fit, (V, k_star) in want.items():
        assert main([*base, "--llamacpp-rows", fit]) == 0
        s = json.loads(capsys.readouterr().out)["engine"]["settings"]["llama.cpp"]
        assert s["step_ms"] == pytest.approx(V, rel=1e-12), fit
        assert s["output_rows_fit"] == fit
        G = [(1 - 0.6 ** (k + 1)) / 0.4 for k in range(4)]
        assert s["plans"][0]["speedup_by_k"] == pytest.approx(
            [G[k] * V[0] / V[k] for k in range(4)], rel=1e-12
        )
        assert s["plans"][0]["draft_length"] == k_star, fit
    rc = main(["plan", "--llamacpp-rows", "line"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--llamacpp-rows" in err[0]


@pytest.mark.parametrize(
    "rows,words",
    [
        ([1, 2], "no object of depths"),
        ({"512": [{"n": 1, "extra_ms": {"median": 0.0}}]}, "has not the passes of verify"),
        ({"512": [{"n": 1}]}, "a row without extra_ms.median"),
        ({"512": [{"n": 2, "extra_ms": {"median": 0.0}}]}, "n = 1..N once each"),
        (
            {"64": [{"n": i + 1, "extra_ms": {"median": 0.0}} for i in range(9)]},
            "has not the passes of verify",
        ),
    ],
)
def test_bad_output_rows_are_refused_naming_the_file(rows, words, tmp_path):
    path = _profile(tmp_path / "v.json")
    data = json.loads(path.read_text())
    data["output_rows"] = {"depths": rows} if isinstance(rows, dict) else rows
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=words) as exc:
        load_llamacpp_profile(path)
    assert str(path) in str(exc.value)
