"""`specmoe plan` and :func:`build_plan` on a small synthetic model, trace and profile."""

from __future__ import annotations

import dataclasses
import json
import os
from fractions import Fraction as F
from pathlib import Path

import numpy as np
import pytest

from specmoe.cli import main
from specmoe.commands.plan import parse_acceptance, parse_draft_time, summary
from specmoe.cost import bounds, theory
from specmoe.cost.plan import build_plan
from specmoe.errors import InputError
from specmoe.spec import ModelSpec

stats_available = pytest.mark.skipif(
    not __import__("importlib").util.find_spec("specmoe.routing.stats"),
    reason="routing statistics module not available",
)

N, M, L, NMAX = 8, 2, 3, 6


def toy_spec(**kw) -> ModelSpec:
    args = dict(
        name="toy",
        num_experts=N,
        top_k=M,
        num_moe_layers=L,
        hidden_size=64,
        expert_intermediate=32,
        bytes_per_weight=4.0,
        dense_params=50_000,
        kv_elements_per_token=96,
    )
    args.update(kw)
    return ModelSpec(**args)


def toy_profile(spec: ModelSpec, *, n_max: int = NMAX, eps=(0.04, 0.06), dtype="float32"):
    from specmoe.formats.profile import BandwidthProfile

    bs = np.linspace(20.0, 30.0, n_max)
    bd = bs * np.linspace(0.95, 0.7, n_max)
    op = np.tile(np.linspace(1e-4, 3e-4, n_max), (L, 1))
    return BandwidthProfile(
        model=spec.to_dict(),
        device="cpu",
        dtype=dtype,
        ceiling_gbps=40.0,
        n=list(range(1, n_max + 1)),
        beta_slot=bs.tolist(),
        beta_dedup=bd.tolist(),
        r=(bd / bs).tolist(),
        u_bar=[1.0] * n_max,
        reread_cost=0.5,
        epsilon={"per_slot": eps[0], "dedup": eps[1]},
        crossover=None,
        fits={
            "per_slot": {"t_op": 1e-5, "c_u": 1e-10, "c_re": 5e-11},
            "dedup": {"t_op": 1e-5, "c_g": 1e-10, "c_t": 1e-6},
        },
        op_time={
            p: {"predicted": op.tolist(), "measured": op.tolist()} for p in ("per_slot", "dedup")
        },
        layers=list(range(L)),
        device_name="test cpu",
    )


def sticky_union(n_max: int = NMAX, keep: float = 0.5) -> np.ndarray:
    """U_l(n) of a process where each token keeps each earlier expert w.p. ``keep`` (toy)."""
    rho = np.array([0.0] + [1 - (1 - keep) ** (j - 1) * 0.9 for j in range(2, n_max + 1)])
    return np.tile(M * np.cumsum(1 - rho), (L, 1))


ACC = [F(0), F(1, 4), F(1, 2), F(13, 20), F(9, 10)]


def test_build_plan_against_theory():
    spec = toy_spec()
    plan = build_plan(
        spec,
        sticky_union(),
        toy_profile(spec),
        k_max=NMAX - 1,
        acceptance=ACC,
        draft_ms=[0.0] + [0.01 * k + 0.002 for k in range(1, NMAX)],
        expected_acceptance=F(13, 20),
    )
    d = plan.to_dict()
    for key in ("crossover", "step_points", "best_k", "speedup", "speedup_bound", "verify_ms"):
        assert key in d
    vm = plan.verify
    assert d["crossover"] == vm.crossover
    eps = 0.06
    delta = eps / (1 - eps)
    assert d["delta"] == pytest.approx(delta)
    for p in ("per_slot", "dedup", "best"):
        V = d["step_ms"][p]
        assert V == pytest.approx(np.asarray(d["verify_ms"][p]) + np.asarray(d["draft_ms"]))
        assert d["step_points"][p] == theory.step_points(V)
        for a, k, s, sb in zip(ACC, d["best_k"][p], d["speedup"][p], d["speedup_bound"][p]):
            assert k == theory.best_draft_length(V, a)
            assert s == pytest.approx(float(theory.best_speedup(V, a)), rel=1e-12)
            assert sb == pytest.approx(list(bounds.speedup_interval(s, delta)), rel=1e-12)
            assert sb[0] <= s <= sb[1]
    # the reuse threshold of Eq. (14) decides the dedup speedups of the same plan (Eq. (B.14))
    Vd = d["step_ms"]["dedup"]
    for a, row in zip(ACC, d["reuse_threshold"]["dedup"]):
        for k, thr in enumerate(row, 1):
            margin = d["bytes"]["mean_reuse"][k - 1] - thr
            if abs(margin) > 1e-9:
                assert (margin > 0) == theory.speeds_up(Vd, a, k)
    # each engine's settings at its own k*, from the step times under the kernel it runs
    eng = d["engine"]
    assert eng["settings"]["dedup_from_pass_size"] == d["crossover"]
    for name in ("vllm", "sglang", "llama.cpp"):
        k = theory.best_draft_length(d["engine_kernels"][name]["step_ms"], F(13, 20))
        assert eng[name]["draft_length"] == eng["settings"][name]["draft_length"] == k
    assert "kernel switch" in eng["best"]["kernel"]
    # Eq. (22) cross-check from the profile's operation times, tau(1) from Eq. (5)
    from specmoe.cost.step import whole_model_verify_time

    prof = toy_profile(spec)
    eq22 = whole_model_verify_time(prof, "dedup", vm.tau["per_slot"][0], num_layers=L) * 1e3
    assert d["verify_ms_eq22"]["dedup"] == pytest.approx(eq22.tolist(), rel=1e-12)
    assert d["verify_ms_eq22"]["per_slot"][0] == pytest.approx(d["verify_ms"]["per_slot"][0])
    text = summary(d)
    assert "staircase" in text and "crossover" in text
    assert ("--spec-type" in text) == (d["engine"]["llama.cpp"]["draft_length"] > 0)
    assert "--draft-max" not in text and "kernel switch the engine would need" in text


def test_build_plan_errors():
    """Library errors name build_plan's own arguments (the command maps them to its flags)."""
    spec = toy_spec()
    prof = toy_profile(spec)
    cases = [
        ("k_max", dict(k_max=0)),
        ("k_max", dict(k_max=NMAX + 1, union=sticky_union(NMAX + 2))),
        ("acceptance", dict(k_max=3, acceptance=[F(1)])),
        ("draft_ms", dict(k_max=3, draft_ms=[0, -1, 0, 0])),
        ("expected_acceptance", dict(k_max=3, expected_acceptance=1.5)),
    ]
    for argument, kw in cases:
        union = kw.pop("union", sticky_union())
        with pytest.raises(InputError) as exc:
            build_plan(spec, union, prof, **kw)
        assert exc.value.argument == argument
        assert str(exc.value).startswith(f"{argument}: ") and "--" not in str(exc.value)


def test_parse_acceptance_and_draft_time(tmp_path):
    assert parse_acceptance("0.65") == [F(13, 20)]
    assert parse_acceptance("0:0.3:0.1,0.95") == [F(0), F(1, 10), F(2, 10), F(3, 10), F(19, 20)]
    for bad in ("1.0", "-0.1", "x", "0:1:0"):
        with pytest.raises(InputError, match="--acceptance"):
            parse_acceptance(bad)
    h, _ = parse_draft_time("0.459,0.073", 3)
    assert h.tolist() == [0.0, 0.532, 0.459 * 2 + 0.073, 0.459 * 3 + 0.073]
    (tmp_path / "h.json").write_text("[0, 0.5, 0.9, 1.2]")
    assert parse_draft_time(str(tmp_path / "h.json"), 3)[0].tolist() == [0, 0.5, 0.9, 1.2]
    (tmp_path / "h.txt").write_text("k ms\n0 0\n1 0.4\n2 0.7\n")
    assert parse_draft_time(str(tmp_path / "h.txt"), 2)[0].tolist() == [0, 0.4, 0.7]
    with pytest.raises(InputError, match="k = 3"):
        parse_draft_time(str(tmp_path / "h.txt"), 3)
    (tmp_path / "bad.json").write_text("[0, -0.5]")
    with pytest.raises(InputError, match="non-negative"):
        parse_draft_time(str(tmp_path / "bad.json"), 1)
    with pytest.raises(InputError, match="--draft-time"):
        parse_draft_time("1,-2", 2)


# ------------------------------------------------------------------------------------------
# the command


@pytest.fixture()
def inputs(tmp_path):
    from specmoe.formats.trace import RoutingTrace, save_trace

    spec = toy_spec()
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec.to_dict()))
    prof_path = tmp_path / "profile.json"
    toy_profile(spec).save(prof_path)
    rng = np.random.default_rng(1)
    T = 300
    experts = np.zeros((T, L, M), dtype=np.int64)
    for layer in range(L):
        cur = rng.choice(N, M, replace=False)
        for t in range(T):
            if rng.random() < 0.5:
                cur = rng.choice(N, M, replace=False)
            experts[t, layer] = cur
    trace_path = tmp_path / "trace.npz"
    save_trace(
        RoutingTrace(experts=experts, doc_offsets=np.array([0, 120, T]), num_experts=N), trace_path
    )
    other = toy_spec(name="other", hidden_size=128)
    other_path = tmp_path / "other_profile.json"
    toy_profile(other).save(other_path)
    return {
        "spec": str(spec_path),
        "profile": str(prof_path),
        "trace": str(trace_path),
        "other": str(other_path),
        "tmp": tmp_path,
    }


def plan_argv(inputs):
    """``specmoe plan`` on the fixture's spec, trace and profile (more flags follow)."""
    return ["plan", "--model", inputs["spec"], "--trace", inputs["trace"], "--bandwidth",
            inputs["profile"]]  # fmt: skip


@stats_available
def test_cli_json_and_out(inputs, capsys):
    out = inputs["tmp"] / "out"
    rc = main(
        [
            *plan_argv(inputs),
            "--k-max",
            "5",
            "--acceptance",
            "0.5,0.65,0.9",
            "--json",
            "--out",
            str(out),
            "--draft-time",
            "0.01,0.002",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    d = json.loads(captured.out)  # stdout holds the JSON and nothing else
    assert d["acceptance"] == [0.5, 0.65, 0.9]
    assert set(d["best_k"]) == {"per_slot", "dedup", "best"}
    assert len(d["step_points"]["best"]) == 5 and len(d["verify_ms"]["dedup"]) == 6
    on_disk = json.loads((out / "plan.json").read_text())
    assert on_disk == d
    for name in ("staircase.png", "saving.png", "speedup.png", "summary.txt"):
        assert (out / name).stat().st_size > 0
    assert not list(out.glob(".*tmp"))


@stats_available
def test_cli_summary_and_layer_mapping(inputs, capsys):
    big = toy_spec(num_moe_layers=5, name="toy5")
    spec_path = inputs["tmp"] / "spec5.json"
    spec_path.write_text(json.dumps(big.to_dict()))
    prof_path = inputs["tmp"] / "p5.json"
    toy_profile(big).save(prof_path)
    rc = main(
        [
            "plan",
            "--model",
            str(spec_path),
            "--trace",
            inputs["trace"],
            "--bandwidth",
            str(prof_path),
            "--k-max",
            "4",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "layer-mean" in captured.err
    assert "staircase" in captured.out and "crossover" in captured.out


@stats_available
def test_cli_layers_cuts_the_spec(inputs, capsys):
    big = toy_spec(num_moe_layers=5, name="toy5")
    spec_path = inputs["tmp"] / "spec5l.json"
    spec_path.write_text(json.dumps(big.to_dict()))
    rc = main(
        [
            "plan",
            "--model",
            str(spec_path),
            "--layers",
            "3",
            "--trace",
            inputs["trace"],
            "--bandwidth",
            inputs["profile"],
            "--k-max",
            "4",
            "--json",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    model = json.loads(captured.out)["model"]
    assert model["num_moe_layers"] == 3 and model["name"] == "toy5[3 layers]"
    assert "layer-mean" not in captured.err  # 3 spec layers = the trace's 3 layers
    rc = main(
        [
            "plan",
            "--model",
            str(spec_path),
            "--layers",
            "9",
            "--trace",
            inputs["trace"],
            "--bandwidth",
            inputs["profile"],
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--layers" in err
    assert len(err.splitlines()) == 1


@stats_available
@pytest.mark.parametrize(
    "extra, word",
    [
        (["--acceptance", "1.2"], "--acceptance"),
        (["--k-max", "0"], "--k-max"),
        (["--draft-time=-1,0"], "--draft-time"),
        (["--expected-acceptance", "1"], "--expected-acceptance"),
        # the engine settings' flags (specmoe.cost.engine_settings)
        (["--drafter", "draft-model"], "--draft-model"),
        (["--drafter", "eagle"], "--draft-model"),
        (["--engine", "tgi"], "--engine"),
        (["--compute-capability", "nine"], "--compute-capability"),
    ],
)
def test_cli_bad_input_is_one_line(inputs, capsys, extra, word):
    rc = main(
        [
            *plan_argv(inputs),
            *extra,
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and word in err


@stats_available
def test_cli_profile_for_another_model(inputs, capsys):
    rc = main(
        [
            "plan",
            "--model",
            inputs["spec"],
            "--trace",
            inputs["trace"],
            "--bandwidth",
            inputs["other"],
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "profile is for model 'other'" in err
    assert len(err.splitlines()) == 1


@stats_available
def test_cli_k_max_beyond_profile(inputs, capsys):
    rc = main(
        [
            *plan_argv(inputs),
            "--k-max",
            "7",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    # build_plan's k_max error, shown with the flag that fed it
    assert rc == 2 and err[-1].startswith("specmoe plan: error: --k-max: ")
    assert "k_max <= 5" in err[-1]


@stats_available
def test_default_profile_is_benchmarked_once_then_cached(inputs, capsys, monkeypatch):
    import sys
    import types

    from specmoe.commands import plan as plan_cli

    calls = []

    def fake_run_benchmark(
        spec, *, trace=None, device="cpu", dtype="float32", quick=False, progress=True
    ):
        calls.append((spec.name, device, dtype, quick, trace.num_layers))
        return toy_profile(spec, dtype=dtype)

    monkeypatch.setitem(
        sys.modules, "specmoe.bench.run", types.SimpleNamespace(run_benchmark=fake_run_benchmark)
    )
    monkeypatch.setenv("SPECMOE_CACHE_DIR", str(inputs["tmp"] / "cache"))
    monkeypatch.setattr(
        plan_cli, "_default_trace", lambda: __import__("pathlib").Path(inputs["trace"])
    )
    args = ["plan", "--model", inputs["spec"], "--k-max", "3", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert calls == [("toy", "cpu", "float32", True, L)]
    cached = list((inputs["tmp"] / "cache" / "profiles").glob("toy-cpu-float32-*.json"))
    assert len(cached) == 1
    assert main(args) == 0  # second run: read from the cache
    second = json.loads(capsys.readouterr().out)
    assert len(calls) == 1
    assert second["step_points"] == first["step_points"]
    assert second["sources"]["bandwidth"]["cached"] is True
    assert main([*args, "--rebench"]) == 0
    capsys.readouterr()
    assert len(calls) == 2


# ------------------------------------------------------------------------------------------
# the Plan dataclass and plan.json

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = [
    ROOT / "results/cpu/plan/plan.json",
    ROOT / "results/cpu/plan-olmoe-dummy-4L/plan.json",
]


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.parent.name)
def test_plan_json_round_trips_through_the_dataclass(path):
    """Plan.from_dict(plan.json).to_dict() is the file, keys in the same order."""
    from specmoe.cost.plan import Plan, load_plan

    d = json.loads(path.read_text())
    plan = Plan.from_dict(d)
    assert json.dumps(plan.to_dict()) == json.dumps(d)
    assert load_plan(path.parent) == plan
    assert plan.crossover == d["crossover"]
    assert plan.policies["best"].speedup == tuple(d["speedup"]["best"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.crossover = 3


@stats_available
def test_committed_plan_is_rebuilt_exactly():
    """build_plan on the committed profile and the bundled trace gives results/cpu/plan's
    plan.json field for field (sources aside: they name the paths of the run)."""
    import argparse

    from specmoe._io import dumps_json
    from specmoe.commands.plan import add_arguments, make_plan

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--model", "specmoe/data/tiny_olmoe", "--bandwidth", "results/cpu/bench/profile.json"]
    )
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        plan, d = make_plan(args)
        d = json.loads(dumps_json(d))  # as plan.json holds it
    finally:
        os.chdir(cwd)
    want = json.loads(COMMITTED[0].read_text())
    assert list(d) == list(want)
    assert {k: v for k, v in d.items() if k != "sources"} == {
        k: v for k, v in want.items() if k != "sources"
    }
    assert summary(plan) == summary(want)


def test_plan_file_errors_name_the_plan_argument(tmp_path):
    from specmoe.cost.plan import load_plan, read_plan

    (tmp_path / "plan.json").write_text('{"schema": "specmoe.plan/1"}')
    with pytest.raises(InputError) as exc:
        load_plan(tmp_path)
    assert exc.value.argument == "plan" and "--" not in str(exc.value)
    with pytest.raises(InputError) as exc:
        read_plan(tmp_path / "missing.json")
    assert exc.value.argument == "plan" and "missing.json" in str(exc.value)


def test_a_bad_cached_profile_names_the_cache_file_and_rebench(tmp_path, monkeypatch, capsys):
    """Finding 8: a damaged profile in the cache stops a plain `specmoe plan` with one line that
    names the cached file and says --rebench measures again (and no benchmark runs)."""
    import specmoe.bench.run as bench_run
    from specmoe.cli import main
    from specmoe.commands.plan import _default_trace, cached_profile_path, trace_hash
    from specmoe.spec import resolve_spec

    def no_bench(*a, **k):
        raise AssertionError("benchmarked instead of refusing the cached profile")

    monkeypatch.setattr(bench_run, "run_benchmark", no_bench)
    monkeypatch.setenv("SPECMOE_CACHE_DIR", str(tmp_path / "cache"))
    spec = resolve_spec("OLMoE-1B-7B-0125")
    cached = cached_profile_path(spec, "cpu", "float32", trace_hash(_default_trace()))
    assert cached.is_relative_to(tmp_path / "cache" / "profiles")
    cached.parent.mkdir(parents=True)
    cached.write_text('{"model": {"name": 3}, "n": "nine"}')
    assert main(["plan", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("specmoe plan: error: the cached bandwidth profile "), err
    assert str(cached) in err[-1] and "--rebench" in err[-1]
    assert not (tmp_path / "out").exists()
