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
    rec, dims = LO.time_llamacpp_operations(
        engine, doc, n_values=ns, depths=list(DEPTHS), reps=3, warmup=1, progress=False
    )
    L = dims.layers
    mult = {op: 1 if op in LO.MODEL_OPS else L * (2 if op == "norm" else 1) for op in LO.GROUPS}
    # per cell: every op per call times its calls, plus the engine's overhead, is the pass
    total = sum(mult[op] * rec.ms[op] for op in LO.GROUPS) + rec.ms["engine_overhead"]
    assert np.allclose(total, rec.ms["fwd"], rtol=0, atol=1e-9)
    assert np.all(rec.union >= dims.top_k) and np.all(rec.union <= ns[-1] * dims.top_k)
    assert np.all(rec.union[:, 0] == dims.top_k)  # n = 1: U = m
    wp = LO.summarize(rec, dims, n_values=ns, depths=list(DEPTHS))
    from specmoe.cost.ops_fit import op_time, whole_pass_time

    fit_n = wp["ops"]["qkv"]["fit_n"]
    for di, d in enumerate(DEPTHS):
        for n in fit_n:
            ni = ns.index(n)
            others, _ = whole_pass_time(wp, n, d, L)
            experts = L * np.median(rec.ms["experts"][di, ni])
            meas = wp["pass_ms"][di][ni]
            assert abs(others + experts - meas) / meas < 0.25, (d, n)
            for op in ("qkv", "attention", "head"):
                got = op_time(wp["ops"][op], n, d)
                m = wp["ops"][op]["median_ms"][di][ni]
                assert abs(got - m) / m < 0.5, (op, d, n)
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
