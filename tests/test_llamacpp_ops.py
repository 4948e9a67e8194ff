"""The per-operation benchmark of llama.cpp (specmoe.engines.llamacpp_ops): grouping of its
graph's nodes, the launch-overhead subtraction, the fits, the profile and the plan on it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _llamacpp import needs_llamacpp

from specmoe.engines import llamacpp_ops as LO
from specmoe.errors import InputError

DEPTHS = (64, 160)
N_MAX = 5


# ------------------------------------------------------------------------------------------
# pure: a hand-made pass


HAND = [  # (name, op, ms): one layer's worth of the graph's shapes, then the head
    ("embd", "GET_ROWS", 0.100),
    ("norm-0", "RMS_NORM", 0.004),
    ("attn_norm-0", "MUL", 0.003),
    ("Qcur-0", "MUL_MAT", 0.020),
    ("norm-0", "RMS_NORM", 0.003),
    ("Qcur_normed-0", "MUL", 0.0025),
    ("Qcur_normed-0 (reshaped)", "RESHAPE", 0.0010),
    ("Qcur-0", "ROPE", 0.006),
    ("cache_v_l0 (reshaped) (view)", "SET_ROWS", 0.008),
    ("cache_k_l0 (view) (permuted)", "PERMUTE", 0.0020),
    ("kq-0", "MUL_MAT", 0.090),
    ("kqv_out-0", "CONT", 0.003),
    ("node_12", "MUL_MAT", 0.012),
    ("ffn_inp-0", "ADD", 0.0033),
    ("norm-0", "RMS_NORM", 0.002),
    ("ffn_norm-0", "MUL", 0.0022),
    ("ffn_moe_logits-0", "MUL_MAT", 0.0095),
    ("ffn_moe_topk-0", "VIEW", 0.0015),
    ("ffn_moe_gate-0", "MUL_MAT_ID", 0.060),
    ("ffn_moe_weighted-0 (view)", "VIEW", 0.0016),
    ("node_20", "ADD", 0.0018),
    ("ffn_moe_out-0", "ADD", 0.0014),
    ("l_out-0", "ADD", 0.0019),
    ("norm", "RMS_NORM", 0.0018),
    ("result_norm", "MUL", 0.0017),
    ("result_output", "MUL_MAT", 0.385),
]
HAND_GROUPS = [
    "embed", "norm", "norm", "qkv", "qkv", "qkv", "qkv", "attention", "attention", "attention",
    "attention", "attention", "o_proj", "overhead", "norm", "norm", "router", "router",
    "experts", "experts", "experts", "experts", "overhead", "head", "head", "head",
]  # fmt: skip


def test_classify_hand_pass():
    got = LO.classify([(a, b) for a, b, _ in HAND])
    assert [g for g, _ in got] == HAND_GROUPS
    layers = [layer for _, layer in got]
    assert layers[0] is None and layers[-3:] == [None, None, None]
    assert all(layer == 0 for layer in layers[1:-3])


def test_base_name():
    assert LO.base_name("cache_v_l2 (reshaped) (view)") == ("cache_v", 2)
    assert LO.base_name("Qcur-13") == ("Qcur", 13)
    assert LO.base_name("result_output") == ("result_output", None)
    assert LO.base_name("ffn_moe_weighted-3 (view)") == ("ffn_moe_weighted", 3)


def test_launch_subtraction_hand_computed():
    # no-op nodes: RESHAPE 0.0010, PERMUTE 0.0020, VIEW 0.0015, VIEW 0.0016 -> median 0.00155
    launch = LO.launch_overhead([(op, ms) for _, op, ms in HAND])
    assert launch == pytest.approx(0.00155, abs=1e-12)
    g = LO.group_pass(HAND, num_layers=1)
    assert g.launch_ms == pytest.approx(0.00155)
    c = 0.00155
    want = {
        "embed": 0.100 - c,
        "norm": 0.004 + 0.003 + 0.002 + 0.0022 - 4 * c,
        "qkv": 0.020 + 0.003 + 0.0025 + 0.0010 - 4 * c,
        "attention": 0.006 + 0.008 + 0.0020 + 0.090 + 0.003 - 5 * c,
        "o_proj": 0.012 - c,
        "overhead": 0.0033 + 0.0019 - 2 * c,
        "router": 0.0095 + 0.0015 - 2 * c,
        "experts": 0.060 + 0.0016 + 0.0018 + 0.0014 - 4 * c,
        "head": 0.0018 + 0.0017 + 0.385 - 3 * c,
    }
    for k, v in want.items():
        assert g.ms[k] == pytest.approx(v, abs=1e-12), k
    assert g.experts_layer_ms[0] == pytest.approx(want["experts"], abs=1e-12)
    assert sum(g.count.values()) == len(HAND)
    assert g.corrected_ms == pytest.approx(sum(ms for *_, ms in HAND) - len(HAND) * c)
    g0 = LO.group_pass(HAND, num_layers=1, launch_ms=0.0)
    assert g0.corrected_ms == pytest.approx(g0.raw_ms)


def test_bad_inputs_pure():
    with pytest.raises(InputError, match="nodes"):
        LO.group_pass([], num_layers=1)
    assert LO.launch_overhead([("MUL_MAT", 1.0)]) == 0.0


# ------------------------------------------------------------------------------------------
# against llama.cpp


@pytest.fixture(scope="module")
def doc():
    from specmoe.engine.models import load_tokenizer
    from specmoe.engine.runner import validation_prompts

    ((_, ids),) = validation_prompts(load_tokenizer("bundled"), count=1, context=max(DEPTHS) + 64)
    return ids


@pytest.fixture(scope="module")
def engine(gguf):
    from specmoe.engines.llamacpp_pass import LlamaCppEngine

    with LlamaCppEngine(gguf, n_ctx=512) as e:
        yield e


# ------------------------------------------------------------------------------------------
# pure: the fit forms (refit) on a whole_pass made from known functions


def _stored(times, terms=("t0", "flops"), shape=None, ns=range(1, 10), ds=(256, 512, 1024, 2048)):
    """A whole_pass whose one op 'qkv' has median_ms = times(n, d), and an engine_overhead."""
    ns, ds = list(ns), list(ds)
    med = [[float(times(n, d)) for n in ns] for d in ds]
    op = {
        "per": "layer",
        "count": 1,
        "in_sum": True,
        "terms": list(terms),
        "shape": shape or {"flops_n": 1e6},
        "fit": {},
        "eps": 0.0,
        "median_ms": med,
        "p10_ms": med,
        "p90_ms": med,
    }
    ovh = {**op, "terms": ["t0", "tokens"], "shape": {}, "median_ms": [[0.0] * len(ns)] * len(ds)}
    ovh.update(eps_of="pass", p10_ms=ovh["median_ms"], p90_ms=ovh["median_ms"])
    return {
        "ops": {"qkv": op, "engine_overhead": ovh},
        "n": ns,
        "d": ds,
        "layer_ms": med,
        "pass_ms": med,
        "layers": 1,
    }


def test_step1_recovers_a_one_row_step_exactly_and_linear_cannot():
    """A kernel whose n = 1 path costs 1 ms and whose n >= 2 path costs 1.5 + 0.2 n ms (the
    shape of llama.cpp's MUL_MAT step): the step1 form reproduces every cell, the linear one
    misses n = 2 by more than 10%."""
    from specmoe.cost.ops_fit import op_time

    def t(n, d):
        return 1.0 if n == 1 else 1.5 + 0.2 * n  # flops_n = 1e6 per n: 0.2 ms = 5 GFLOP/s

    wp = _stored(t)
    s1 = LO.refit(wp, "step1")
    op = s1["ops"]["qkv"]
    assert s1["fit_form"] == "step1" and op["fit_n"] == [2, 4, 5, 7, 8]
    assert op["held_n"] == [3, 6, 9] and op["terms_n1"] == ["t0"]
    for n in range(1, 10):
        for d in wp["d"]:
            assert op_time(op, n, d) == pytest.approx(t(n, d), rel=1e-9)
    assert op["eps"] == pytest.approx(0.0, abs=1e-9) and op["eps_n1"] == pytest.approx(0.0)
    lin = LO.refit(wp, "linear")["ops"]["qkv"]
    assert "fit_n1" not in lin and lin["fit_n"] == [1, 3, 4, 6, 7]
    assert abs(op_time(lin, 2, 512) - t(2, 512)) / t(2, 512) > 0.10


def test_step1_one_row_fit_follows_depth_and_is_scored_leaving_a_depth_out():
    """At n = 1 attention reads d: the one-row fit takes the bytes term (it varies with d),
    and its error is held out by depth (a line through three depths predicts the fourth)."""
    from specmoe.cost.ops_fit import op_time

    def t(n, d):  # 2 bytes per (d + n) at 1 GB/s = 2e-6 ms per token of depth
        return (0.3 if n == 1 else 0.5) + 2e-6 * (d + n) * 1.0 + 0.05 * n

    wp = _stored(t, terms=("t0", "bytes", "tokens"), shape={"bytes_nd": 2.0})
    op = LO.refit(wp, "step1")["ops"]["qkv"]
    assert op["terms_n1"] == ["t0", "bytes"]
    assert op_time(op, 1, 4096) == pytest.approx(t(1, 4096), rel=1e-9)  # extrapolates in d
    assert op["eps_n1"] == pytest.approx(0.0, abs=1e-9)


def _with_overhead(wp, times):
    """``wp`` with engine_overhead's medians = times(n, d) (a signed difference of times)."""
    med = [[float(times(n, d)) for n in wp["n"]] for d in wp["d"]]
    ovh = {**wp["ops"]["engine_overhead"], "median_ms": med, "p10_ms": med, "p90_ms": med}
    return {**wp, "ops": {**wp["ops"], "engine_overhead": ovh}}


def test_step1_depth_recovers_an_overhead_that_grows_with_depth_and_step1_cannot():
    """An engine overhead of 0.1 ms + 1.2e-4 ms per token of context at every n, with a
    per-token part past the first row: step1-depth reproduces every cell (and extrapolates
    in d), only in engine_overhead; step1 (no depth term) misses d = 2048 by the depth's share."""
    from specmoe.cost.ops_fit import op_time

    def ovh(n, d):
        return 0.1 + 1.2e-4 * d + (0.0 if n == 1 else 0.01 * n)

    wp = _with_overhead(_stored(lambda n, d: 1.0 if n == 1 else 1.5 + 0.2 * n), ovh)
    v3 = LO.refit(wp, "step1-depth")
    op = v3["ops"]["engine_overhead"]
    assert v3["fit_form"] == "step1-depth"
    assert op["terms"] == ["t0", "tokens", "depth"] and op["terms_n1"] == ["t0", "depth"]
    assert op["fit"]["per_depth_ms"] == pytest.approx(1.2e-4, rel=1e-9)
    for n in range(1, 10):
        for d in (*wp["d"], 8192):
            assert op_time(op, n, d) == pytest.approx(ovh(n, d), rel=1e-9, abs=1e-12)
    assert op["err_ms"] == pytest.approx(0.0, abs=1e-12)
    assert v3["ops"]["qkv"]["terms"] == ["t0", "flops"]  # only DEPTH_OPS take the term
    s1 = LO.refit(v3, "step1")["ops"]["engine_overhead"]  # a refit drops the depth term
    assert s1["terms"] == ["t0", "tokens"] and "per_depth_ms" not in s1["fit"]
    assert abs(op_time(s1, 1, 2048) - ovh(1, 2048)) > 0.05


def test_a_profile_with_the_depth_term_loads_and_sums(tmp_path):
    """The profile format takes the depth term; whole_pass_time adds d · c_d."""
    from specmoe.cost.ops_fit import whole_pass_time
    from specmoe.formats.profile import whole_pass_from_dict

    wp = _with_overhead(_stored(lambda n, d: 0.5 + 0.1 * n), lambda n, d: 1e-4 * d)
    v3 = LO.refit({**wp, "model": "m", "dtype": "f32", "clock": "cpu"}, "step1-depth")
    whole_pass_from_dict(v3)
    a, _ = whole_pass_time(v3, 3, 1000, 1)
    b, _ = whole_pass_time(v3, 3, 2000, 1)
    assert b - a == pytest.approx(0.1, rel=1e-6)  # 1000 more tokens of context at 1e-4 ms


def test_refit_linear_reproduces_summarize_and_bad_form_is_named():
    wp = _stored(lambda n, d: 0.5 + 0.1 * n)
    a = LO.refit(wp, "linear")
    b = LO.refit(a, "linear")
    assert a["ops"]["qkv"]["fit"] == b["ops"]["qkv"]["fit"]
    s1 = LO.refit(wp, "step1")
    assert "fit_n1" not in LO.refit(s1, "linear")["ops"]["qkv"]  # a refit drops the old form
    with pytest.raises(InputError, match="step1"):
        LO.refit(wp, "cubic")


@pytest.mark.parametrize("config", ["llamacpp-bundled", "llamacpp-lifted"])
def test_refit_linear_reproduces_the_benchmarks_own_fits(config):
    """The committed predictions were fitted by summarize from every repetition; refit from
    their stored medians gives the same fits and ε (the fits use only the medians)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    path = root / "results/cpu/llamacpp/whole-pass/predictions" / config / "profile.json"
    wp = json.loads(path.read_text())["whole_pass"]
    again = LO.refit(wp, "linear")
    for name, op in wp["ops"].items():
        got = again["ops"][name]
        for key, v in op["fit"].items():
            assert (v is None) == (got["fit"][key] is None)
            if v is not None:
                assert got["fit"][key] == pytest.approx(v, rel=1e-9, abs=1e-12)
        assert got["eps"] == pytest.approx(op["eps"], abs=1e-12)


def test_bench_fit_from_a_profile_without_a_llamacpp_whole_pass(tmp_path, capsys):
    """specmoe's own whole-pass profile is not llama.cpp's: one line naming it, nothing written."""
    from pathlib import Path

    from specmoe.cli import main

    root = Path(__file__).resolve().parents[1]
    src = root / "results/cpu/whole-pass/predictions/bundled/profile.json"
    out = tmp_path / "out"
    rc = main(["bench", "--engine", "llama.cpp", "--whole-pass", "--model", "bundled",
               "--from", str(src), "--fit", "step1", "--out", str(out)])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(src) in err[0]
    assert not (out / "profile.json").exists()


def test_bench_fit_needs_the_llamacpp_whole_pass(capsys):
    from specmoe.cli import main

    assert main(["bench", "--model", "bundled", "--fit", "step1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fit" in err[0]


@needs_llamacpp
def test_grouping_covers_every_node_once(engine, doc):
    from specmoe.engine.speculative import crop_cache, new_cache

    kv = new_cache(engine.model)
    engine.prefill(kv, doc[:64])
    prof = engine.profile(kv, doc[64:67])
    crop_cache(kv, 64)
    nodes = [(x.name, x.op, x.ms) for x in prof.nodes]
    groups = LO.classify([(a, b) for a, b, _ in nodes])
    assert len(groups) == len(nodes)
    L = engine.num_layers
    # brute force: every node's group by op and name, counted
    by = {}
    for (_, op, _), (g, layer) in zip(nodes, groups, strict=True):
        by.setdefault((op, g), []).append(layer)
    assert sorted(by[("MUL_MAT_ID", "experts")]) == sorted(list(range(L)) * 3)
    assert sum(len(v) for (op, _), v in by.items() if op == "MUL_MAT_ID") == 3 * L
    assert sorted(by[("ROPE", "attention")]) == sorted(list(range(L)) * 2)
    assert sorted(by[("MUL_MAT", "o_proj")]) == list(range(L))
    assert sorted(by[("MUL_MAT", "qkv")]) == sorted(list(range(L)) * 3)
    assert sorted(by[("MUL_MAT", "attention")]) == sorted(list(range(L)) * 2)  # K·Q, V·P
    assert len(by[("MUL_MAT", "router")]) == L and by[("MUL_MAT", "head")] == [None]
    assert sorted(by[("RMS_NORM", "norm")]) == sorted(list(range(L)) * 2)
    assert len(by[("SET_ROWS", "attention")]) == 2 * L
    g = LO.group_pass(nodes, L)
    assert sum(g.count.values()) == len(nodes)
    for grp in LO.GROUPS:  # each group's time is the sum of its own nodes, once
        want = sum(t - g.launch_ms for (_, _, t), (gg, _) in zip(nodes, groups) if gg == grp)
        assert g.ms[grp] == pytest.approx(want, abs=1e-9)
    noop = [t for _, op, t in nodes if op in LO.NOOPS]
    assert noop and g.launch_ms == pytest.approx(float(np.median(noop)))


@pytest.fixture(scope="module")
def bench_out(gguf, tmp_path_factory):
    from specmoe.cli import main

    out = tmp_path_factory.mktemp("llamacpp-wp")
    argv = ["bench", "--engine", "llama.cpp", "--whole-pass", "--model", str(gguf)]
    argv += ["--depths", ",".join(map(str, DEPTHS)), "--n-max", str(N_MAX), "--reps", "3"]
    assert main([*argv, "--out", str(out)]) == 0
    return out


@needs_llamacpp
def test_records_add_up_and_fits_reproduce(engine, doc):
    ns = list(range(1, N_MAX + 1))
    from specmoe.cost.ops_fit import op_time, whole_pass_time

    def measure():
        rec, dims = LO.time_llamacpp_operations(
            engine, doc, n_values=ns, depths=list(DEPTHS), reps=5, warmup=1, progress=False
        )  # 5: with 3 a cell's median missed the fit by 30% once on a quiet machine
        # the benchmark's own form (step1: llama.cpp's one-row MUL_MAT path has a fit of its
        # own; one line through n = 1 and n >= 2 misses the step by more than these bounds)
        wp = LO.refit(LO.summarize(rec, dims, n_values=ns, depths=list(DEPTHS)), "step1")
        errs, op_errs = {}, {}
        for di, d in enumerate(DEPTHS):
            for n in [1, *wp["ops"]["qkv"]["fit_n"]]:
                ni = ns.index(n)
                others, _ = whole_pass_time(wp, n, d, dims.layers)
                experts = dims.layers * np.median(rec.ms["experts"][di, ni])
                meas = wp["pass_ms"][di][ni]
                errs[d, n] = abs(others + experts - meas) / meas
                for op in ("qkv", "attention", "head"):
                    got = op_time(wp["ops"][op], n, d)
                    m = wp["ops"][op]["median_ms"][di][ni]
                    op_errs[op, d, n] = abs(got - m) / m
        return rec, dims, errs, op_errs

    def reproduces(errs, op_errs):
        return (
            sum(e >= 0.25 for e in errs.values()) <= 1
            and np.median(list(errs.values())) < 0.1
            and sum(e >= 0.5 for e in op_errs.values()) <= 1
        )

    # timed beside the suite's other worker: one cell whose median a neighbour disturbed may
    # miss (a CI run once read 2.04 ms at d = 64, n = 4 where the fit gave 1.34), a run of the
    # suite once read the median error at 0.106, and a fresh-clone run once read every cell at
    # d = 64 20-22% off in two timings in a row (the neighbour's load moving between the ops
    # and the pass); so up to three timings are taken, and the fit must reproduce every other
    # cell of one of them, with a small median error (a wrong form misses all three)
    for _ in range(3):
        rec, dims, errs, op_errs = measure()
        if reproduces(errs, op_errs):
            break
    L = dims.layers
    mult = {op: 1 if op in LO.MODEL_OPS else L * (2 if op == "norm" else 1) for op in LO.GROUPS}
    # per cell: every op per call times its calls, plus the engine's overhead, is the pass
    total = sum(mult[op] * rec.ms[op] for op in LO.GROUPS) + rec.ms["engine_overhead"]
    assert np.allclose(total, rec.ms["fwd"], rtol=0, atol=1e-9)
    assert np.all(rec.union >= dims.top_k) and np.all(rec.union <= ns[-1] * dims.top_k)
    assert np.all(rec.union[:, 0] == dims.top_k)  # n = 1: U = m
    assert sum(e >= 0.25 for e in errs.values()) <= 1 and np.median(list(errs.values())) < 0.1, errs
    assert sum(e >= 0.5 for e in op_errs.values()) <= 1, op_errs
    exp = LO.expert_fit(rec, dims, n_values=ns)
    assert exp["beta_dedup"][0] == pytest.approx(exp["beta_slot"][0])  # U = m at n = 1
    assert np.allclose(exp["r"], exp["u_bar"])  # the same times on both definitions


@needs_llamacpp
def test_profile_loads_and_plans(bench_out, tmp_path):
    from specmoe.cli import main
    from specmoe.cost.plan import load_plan
    from specmoe.formats.profile import load_profile
    from specmoe.spec import resolve_spec
    from specmoe.validate.whole_pass import whole_pass_version

    spec = resolve_spec("specmoe/data/tiny_olmoe")
    prof = load_profile(bench_out / "profile.json", spec=spec)
    wp = prof.whole_pass
    assert wp["d"] == list(DEPTHS) and wp["n"] == list(range(1, N_MAX + 1))
    assert set(wp["ops"]) == {*LO.GROUPS, "engine_overhead"}
    assert not wp["ops"]["experts"]["in_sum"]
    assert 0 < wp["launch_ms"]["median"] < 0.05
    assert prof.implementations["dedup"]["op"] == "MUL_MAT_ID"
    out = tmp_path / "plan"
    argv = ["plan", "--model", "specmoe/data/tiny_olmoe", "--bandwidth"]
    argv += [str(bench_out / "profile.json"), "--trace", "specmoe/data/traces/validation.npz"]
    argv += ["--k-max", str(N_MAX - 1), "--context", str(DEPTHS[0]), "--out", str(out)]
    assert main(argv) == 0
    plan = load_plan(out / "plan.json")
    for d in DEPTHS:
        version, note = whole_pass_version(plan, prof, d, N_MAX)
        assert note is None
        v = np.asarray(version["verify_ms"]["dedup"])
        assert np.all(np.diff(v) > -0.5 * v[:-1]) and np.all(v > 0)
    raw = json.loads((bench_out / "profile.json").read_text())
    assert raw["whole_pass"]["engine"] == "llama.cpp"


@needs_llamacpp
@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--threads", "2"], "--threads"),
        (["--clock", "wall"], "--clock"),
        (["--processes", "2"], "--processes"),
        (["--depths", "0"], "--depths"),
        (["--n-max", "0"], "--n-max"),
    ],
)
def test_bad_cli_inputs(gguf, tmp_path, capsys, extra, flag):
    from specmoe.cli import main

    argv = ["bench", "--engine", "llama.cpp", "--whole-pass", "--model", str(gguf)]
    assert main([*argv, *extra, "--out", str(tmp_path / "o")]) == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "o" / "profile.json").exists()


@needs_llamacpp
def test_bad_inputs_engine(engine, doc, tmp_path, capsys):
    from specmoe.cli import main

    with pytest.raises(InputError, match="tokens"):
        LO.time_llamacpp_operations(engine, doc[:100], n_values=[1, 2], depths=[99], reps=1)
    with pytest.raises(InputError, match="reps"):
        LO.time_llamacpp_operations(engine, doc, n_values=[1, 2], depths=[8], reps=0)
    with pytest.raises(InputError, match="depths"):
        LO.time_llamacpp_operations(engine, doc, n_values=[1], depths=[], reps=1)
    argv = ["bench", "--engine", "llama.cpp", "--whole-pass", "--model"]
    assert main([*argv, str(tmp_path / "missing.gguf")]) == 2
    assert "--model" in capsys.readouterr().err


def _cells(d: int, n: int, pad: int = 256) -> int:
    """llama.cpp's get_n_kv for one sequence, by counting: the smallest multiple of ``pad``
    that holds the d + n used cells, at least ``pad``."""
    w = pad
    while w < d + n:
        w += pad
    return w


def test_kv_width_is_llamacpps_padded_view():
    from hypothesis import given
    from hypothesis import strategies as st

    from specmoe.cost.ops_fit import kv_width

    assert [int(kv_width(d, n, 256)) for d, n in ((0, 1), (255, 1), (511, 1), (512, 1), (511, 2))] == [
        256, 256, 512, 768, 768
    ]  # fmt: skip

    @given(st.integers(0, 10**6), st.integers(1, 64), st.sampled_from([1, 32, 256]))
    def check(d, n, pad):
        assert int(kv_width(d, n, pad)) == _cells(d, n, pad)

    check()
    got = kv_width(np.array([[511.0, 512.0]]), np.array([[1.0, 1.0]]), 256)
    assert got.tolist() == [[512.0, 768.0]]


def test_step1_width_recovers_attention_over_the_padded_view_and_step1_depth_cannot():
    """Attention and the engine's mask cost per KV cell read, cells = llama.cpp's padded view:
    step1-width reproduces every cell of the grid and the off-grid cache lengths the verify
    runs have (511 + 1 reads 512 cells, 512 + 1 reads 768); step1-depth, fitted on the same
    grid (depths multiples of 256: d + 256 cells at every n), misses one token after 511."""
    from specmoe.cost.ops_fit import op_time, whole_pass_time
    from specmoe.formats.profile import whole_pass_from_dict

    def att(n, d):  # 2 bytes a cell at 0.01 GB/s: 2e-4 ms a cell
        return (0.3 if n == 1 else 0.5) + 2e-4 * _cells(d, n) + 0.05 * n

    def ovh(n, d):
        return 0.1 + 1e-4 * _cells(d, n)

    wp = _stored(att, terms=("t0", "bytes", "tokens"), shape={"bytes_nd": 2.0})
    wp = {**_with_overhead(wp, ovh), "model": "m", "dtype": "f32", "clock": "cpu"}
    v4 = LO.refit(wp, "step1-width")
    assert v4["fit_form"] == "step1-width" and v4["kv_pad"] == LO.KV_PAD == 256
    whole_pass_from_dict(v4)
    op, eo = v4["ops"]["qkv"], v4["ops"]["engine_overhead"]
    assert eo["terms"] == ["t0", "tokens", "depth"]
    for n in range(1, 10):
        for d in (*wp["d"], 511, 600, 2047, 3000):
            assert op_time(op, n, d, 256) == pytest.approx(att(n, d), rel=1e-9)
            assert op_time(eo, n, d, 256) == pytest.approx(ovh(n, d), rel=1e-9, abs=1e-12)
    total, _ = whole_pass_time(v4, 1, 511, 1)
    assert total == pytest.approx(att(1, 511) + ovh(1, 511), rel=1e-9)
    v3 = LO.refit(wp, "step1-depth")
    assert "kv_pad" not in v3 and "kv_pad" not in LO.refit(v4, "step1")  # the form decides
    miss = abs(op_time(v3["ops"]["qkv"], 1, 511) - att(1, 511)) / att(1, 511)
    assert miss > 0.05
    with pytest.raises(InputError, match="kv_pad"):
        whole_pass_from_dict({**v4, "kv_pad": 0})


def _tile_cost(n: int) -> float:
    """ms a KV cell of a K·Q product of n tokens, not monotone in n: n = 3, 4 and 8 dearer a
    token than 5-7 and 9, the shape measured on the Zen 4 core (results/cpu/llamacpp/kv-width/),
    and the one-token path dearest."""
    if n == 1:
        return 6e-4
    per_token = {2: 1.5e-5, 3: 3e-5, 4: 2.3e-5, 8: 1.6e-5}.get(n, 1e-5)
    return per_token * n


def test_pern_width_follows_each_pass_size_where_a_line_in_n_cannot():
    """Attention whose per-cell cost is not monotone in n (n = 4 and 8 dearer than 5 and 9): pern-width reproduces every n at
    every cache length, on the grid and off it, with a held-out ε of 0 (each n's line over
    the depths, scored leaving one depth out); step1-width, a line in n past n = 1, misses
    n = 4 at 2048 by more than 10% (12%). Its fits survive the profile's reader, and an n it has no
    fit of its own for falls back to the step1-width fit."""
    from specmoe.cost.ops_fit import op_time, whole_pass_time
    from specmoe.formats.profile import whole_pass_from_dict

    def att(n, d):
        return 0.2 + _tile_cost(n) * _cells(d, n)

    assert att(4, 2048) > att(5, 2048) and att(8, 2048) > att(9, 2048)
    wp = _stored(att, terms=("t0", "bytes", "tokens"), shape={"bytes_nd": 2.0},
                 ds=(256, 512, 1024, 2048, 2304))  # fmt: skip
    wp = {**wp, "model": "m", "dtype": "f32", "clock": "cpu"}
    v9 = LO.refit(wp, "pern-width")
    assert v9["fit_form"] == "pern-width" and v9["kv_pad"] == 256
    whole_pass_from_dict(v9)
    op = v9["ops"]["qkv"]
    assert sorted(op["fits_n"], key=int) == [str(n) for n in range(1, 10)]
    assert op["eps"] == pytest.approx(0.0, abs=1e-9)
    for n in range(1, 10):
        assert op["fits_n"][str(n)]["terms"] == ["t0", "bytes"]  # tokens is flat at one n
        for d in (*wp["d"], 511, 767, 2047, 2175):
            assert op_time(op, n, d, 256) == pytest.approx(att(n, d), rel=1e-9)
    total, _ = whole_pass_time(v9, 4, 2047, 1)
    assert total == pytest.approx(att(4, 2047), rel=1e-9, abs=1e-12)
    v8 = LO.refit(wp, "step1-width")
    assert (
        "fits_n" not in v8["ops"]["qkv"]
        and "fits_n" not in LO.refit(v9, "step1-width")["ops"]["qkv"]
    )
    miss = abs(op_time(v8["ops"]["qkv"], 4, 2048, 256) - att(4, 2048)) / att(4, 2048)
    assert miss > 0.1
    fallback = {**op, "fits_n": {k: v for k, v in op["fits_n"].items() if k != "4"}}
    assert op_time(fallback, 4, 2048, 256) == pytest.approx(op_time(v8["ops"]["qkv"], 4, 2048, 256))


def test_pern_width_scores_a_depth_it_did_not_see():
    """ε of the per-n fits is scored leaving one depth out: a cell off every line (a bump at
    d = 1024, n = 3 of 30%) gives a positive ε, and the step1-width fit stays the fallback."""

    def att(n, d):
        return (0.2 + 1e-4 * n * _cells(d, n)) * (1.3 if (n, d) == (3, 1024) else 1.0)

    wp = _stored(att, terms=("t0", "bytes", "tokens"), shape={"bytes_nd": 2.0},
                 ds=(256, 512, 1024, 2048, 2304))  # fmt: skip
    op = LO.refit({**wp, "model": "m", "dtype": "f32", "clock": "cpu"}, "pern-width")["ops"]["qkv"]
    assert op["eps_max"] > 0.1 and op["eps"] >= 0.0


@pytest.mark.parametrize(
    "fits_n, words",
    [
        ([], "non-empty object"),
        ({"0": {"terms": ["t0"], "fit": {"t0_ms": 1.0}}}, "pass size"),
        ({"2": {"terms": ["nope"], "fit": {}}}, "terms must list"),
        ({"2": {"terms": ["t0"], "fit": {"t0_ms": float("nan")}}}, "fits_n"),
    ],
)
def test_bad_per_n_fits_are_refused_naming_the_op(fits_n, words):
    from specmoe.formats.profile import whole_pass_from_dict

    wp = _stored(lambda n, d: 1.0 + 0.1 * n)
    wp = LO.refit({**wp, "model": "m", "dtype": "f32", "clock": "cpu"}, "pern-width")
    bad = {**wp, "ops": {**wp["ops"], "qkv": {**wp["ops"]["qkv"], "fits_n": fits_n}}}
    with pytest.raises(InputError, match=words) as exc:
        whole_pass_from_dict(bad)
    assert "qkv" in str(exc.value)


def test_benchmark_records_write_the_home_directory_as_a_tilde(monkeypatch, tmp_path):
    """A record's command names no particular machine's home: ``$HOME/x`` becomes ``~/x``;
    other paths, and a word that only starts with the home's name, are kept."""
    from _scripts import load_script

    rec = load_script("_record", "benchmarks")
    home = tmp_path / "home" / "u"
    monkeypatch.setenv("HOME", str(home))
    got = rec.command_line(
        "benchmarks/b.py", ["--gguf", f"{home}/m.gguf", f"{home}x/m.gguf", "/srv/m.gguf", "3"]
    )
    assert got == f"python benchmarks/b.py --gguf ~/m.gguf {home}x/m.gguf /srv/m.gguf 3"


class _Meta:
    """An engine that answers GGUF metadata from a dict, as strings (libllama's
    llama_model_meta_val_str: what Dims.of reads)."""

    def __init__(self, meta, vocab=50):
        self._m, self.vocab_size, self.path = meta, vocab, "fake.gguf"

    def meta(self, key):
        v = self._m.get(key)
        return None if v is None else str(v)


def test_attention_bytes_follow_the_kv_caches_type():
    """K·Q and V·P read a cell's keys and values: 2 bytes each for f16, 4 for f32, and for q8_0
    keys ggml's block_q8_0 (32 int8 and one f16 scale: 34 bytes a 32) beside f16 values."""
    m = {"general.architecture": "olmoe", "general.file_type": 0, "olmoe.block_count": 4,
         "olmoe.embedding_length": 128, "olmoe.attention.head_count": 4,
         "olmoe.expert_count": 8, "olmoe.expert_used_count": 2,
         "olmoe.expert_feed_forward_length": 64}  # fmt: skip
    k = 4 * 32  # kv heads x head width
    for kv, k_bytes, v_bytes in (("f16", 2, 2), ("f32", 4, 4), ("q8_0", 34 / 32, 2)):
        dims = LO.Dims.of(_Meta(m), kv)
        assert dims.shape("attention")["bytes_nd"] == pytest.approx(2.0 * k * (k_bytes + v_bytes))


# ------------------------------------------------------------------------------------------
# the level of a saved profile today (specmoe bench --level-of)


def test_pass_level_is_the_ratio_of_sums_exactly():
    from fractions import Fraction as F

    then, now = [1.0, 2.0, 3.0], [2.0, 2.0, 5.0]
    got = LO.pass_level(then, now)
    assert F(got["level"]).limit_denominator(100) == F(9, 6)
    assert [F(x).limit_denominator(100) for x in got["ratio"]] == [F(2), F(1), F(5, 3)]
    for bad in (([1.0], [1.0, 2.0]), ([1.0, 0.0], [1.0, 1.0]), ([], []), ([1.0], [float("nan")])):
        with pytest.raises(InputError):
            LO.pass_level(*bad)


_ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
_LC_PROFILE = _ROOT / "results/cpu/llamacpp/whole-pass/predictions/llamacpp-bundled/profile.json"


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--level-of", str(_LC_PROFILE)], "--level-of: only with --engine llama.cpp --whole-pass"),
        (["--engine", "llama.cpp", "--whole-pass", "--level-of", str(_LC_PROFILE),
          "--pass-train", "12"], "--level-of: not with --pass-train"),
        (["--engine", "llama.cpp", "--whole-pass", "--level-of", str(_LC_PROFILE),
          "--kv-type", "q8_0"], "--level-of: not with --kv-type"),
        (["--engine", "llama.cpp", "--whole-pass", "--level-of", str(_LC_PROFILE),
          "--depths", "333"], "--depths: "),
        (["--engine", "llama.cpp", "--whole-pass", "--level-of", str(_LC_PROFILE),
          "--n-max", "3"], "--n-max: not with --level-of"),
        (["--engine", "llama.cpp", "--whole-pass", "--level-of",
          str(_ROOT / "results/cpu/whole-pass/predictions/bundled/profile.json")],
         "not a llama.cpp whole-pass profile"),
        (["--engine", "llama.cpp", "--whole-pass", "--level-of", "no-such-profile.json"],
         "no-such-profile.json"),
    ],
)  # fmt: skip
def test_level_of_refuses_bad_input_in_one_line_writing_nothing(extra, words, tmp_path, capsys):
    from specmoe.cli import main

    out = tmp_path / "out"
    assert main(["bench", "--model", "bundled", *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not (out / "profile.json").exists() and not (out / "level.json").exists()


@needs_llamacpp
def test_level_of_times_the_profiles_own_passes_again(bench_out, gguf, tmp_path, capsys):
    """The level written is the ratio of the sums of the passes it wrote, against the
    profile's own pass_ms at that depth; the profile written loads with whole_pass.level and
    is the saved one otherwise; and a GGUF of other bytes is refused, naming --model."""
    from specmoe.cli import main
    from specmoe.formats.profile import load_profile

    src = bench_out / "profile.json"
    saved = json.loads(src.read_text())["whole_pass"]
    out = tmp_path / "lv"
    argv = ["bench", "--engine", "llama.cpp", "--whole-pass", "--model", str(gguf),
            "--level-of", str(src), "--depths", str(DEPTHS[-1]), "--reps", "1"]  # fmt: skip
    assert main([*argv, "--out", str(out), "--json"]) == 0
    rec = json.loads((out / "level.json").read_text())
    cell = rec["depths"][str(DEPTHS[-1])]
    then = saved["pass_ms"][saved["d"].index(DEPTHS[-1])]
    assert cell["then_ms"] == pytest.approx(then)
    assert len(cell["now_ms"]) == len(saved["n"]) == N_MAX
    assert cell["level"] == pytest.approx(sum(cell["now_ms"]) / sum(then))
    assert 0.2 < cell["level"] < 5  # the same machine, minutes apart
    assert rec["train"] == saved["train"] and rec["kv_type"] == saved["kv_type"]
    prof = load_profile(out / "profile.json")
    assert prof.whole_pass["level"] == {str(DEPTHS[-1]): cell["level"]}
    assert prof.whole_pass["pass_ms"] == saved["pass_ms"] and prof.whole_pass["ops"] == saved["ops"]
    capsys.readouterr()
    other = tmp_path / "bf16.gguf"
    assert main(["export", "--format", "gguf", "--model", "bundled", "--out", str(other)]) == 0
    capsys.readouterr()
    bad = [*argv[:5], str(other), *argv[6:]]
    assert main([*bad, "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model" in err[-1] and "bytes" in err[-1], err
    assert not (tmp_path / "bad" / "level.json").exists()
