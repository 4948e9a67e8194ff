"""Target efficiency against batch size: the activated-expert-bytes estimate on hand
computations, batch unions against brute-force set unions, batch rows taking their own table
windows (against one-sequence forced routing), the measurement and the CLI on a tiny model, and
bad input as one-line errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ipf import sticky_trace

from specmoe.cli import main
from specmoe.cost.efficiency import (
    activated_bytes_efficiency,
    batch_unique,
    choose_starts,
    expected_tokens,
    layer_map,
    speedup,
    summarise_efficiency,
    window_rows,
)
from specmoe.errors import InputError
from specmoe.formats.trace import RoutingTrace, save_trace
from specmoe.routing.ipf import fit_moments, save_moments
from specmoe.routing.overlap import uniform_union
from specmoe.spec import get_preset

# ------------------------------------------------------------------------------------------
# The estimate and the speedup model (numpy only)


def test_estimate_on_hand_computations():
    # One C_expert: (10 + 8·1) / (10 + 20·1) = 18 / 30.
    assert activated_bytes_efficiency(10.0, 1.0, 8, 20) == pytest.approx(0.6)
    # Per layer: (100 + 2·8 + 3·8) / (100 + 2·12 + 3·20) = 140 / 184.
    assert activated_bytes_efficiency(100.0, [2.0, 3.0], [8, 8], [12, 20]) == pytest.approx(
        140 / 184
    )
    # No verification overhead in experts: efficiency 1; no dense bytes: k / unique.
    assert activated_bytes_efficiency(5.0, 2.0, [8, 8], [8, 8]) == 1.0
    assert activated_bytes_efficiency(0.0, 1.0, 8, 32) == pytest.approx(0.25)
    with pytest.raises(InputError):
        activated_bytes_efficiency(1.0, [1.0, 1.0], [8, 8], [8])


def test_expected_tokens_and_speedup():
    assert expected_tokens(0.0, 3) == 1.0
    assert expected_tokens(1.0, 3) == 4.0
    # a = 0.5, K = 2: 1 + 0.5 + 0.25.
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    # Free verification and drafts: the speedup is G; a verification twice a step halves it.
    assert speedup(10.0, 10.0, 3, acceptance=0.7, draft_cost=0.0) == pytest.approx(
        expected_tokens(0.7, 3)
    )
    assert speedup(10.0, 20.0, 3, acceptance=0.7, draft_cost=0.0) == pytest.approx(
        expected_tokens(0.7, 3) / 2
    )
    # Draft tokens at 0.1 step each, K = 5: G · 10 / (12 + 5).
    assert speedup(10.0, 12.0, 5, acceptance=0.6, draft_cost=0.1) == pytest.approx(
        expected_tokens(0.6, 5) * 10 / 17
    )
    with pytest.raises(InputError, match="acceptance") as exc:
        expected_tokens(1.5, 3)
    assert exc.value.argument == "acceptance"
    with pytest.raises(InputError) as exc:
        speedup(10.0, 12.0, 5, acceptance=0.6, draft_cost=-0.1)
    assert exc.value.argument == "draft_cost"


def test_g_and_speedup_are_the_theorys():
    """G_a(K) and the speedup are paper 002's G_a(k) and Eq. (9) (specmoe.cost.theory), exact
    Fractions rounded once, on the closed interval a in [0, 1]."""
    from fractions import Fraction as F

    from specmoe.cost import theory

    for a in (0.0, 0.3, 0.7, 0.95, 1.0):
        for k in range(6):
            assert expected_tokens(a, k) == float(theory.expected_tokens(F(a), k))
    assert expected_tokens(0.5, np.array([0, 1, 2])).tolist() == [1.0, 1.5, 1.75]
    V = [10.0, 10.4, 11.0, 11.9]
    for a in (0.2, 0.6, 0.9):
        for k in range(4):
            c = (V[k] - 10.0) / (k * 10.0) if k else 0.0  # V(k) = t_verify + k c t_step
            s = speedup(10.0, 10.0, k, acceptance=a, draft_cost=c)
            assert s == pytest.approx(float(theory.speedup(V, a, k)), rel=1e-15)
    assert theory.step_speedup(F(1, 2), 2, plain=F(1), step=F(7, 4)) == F(1)


# ------------------------------------------------------------------------------------------
# Windows and unions


def _brute_union(table, starts, position, s):
    T, L, _ = table.shape
    out = []
    for layer in range(L):
        seen = set()
        for b in starts:
            for i in range(s):
                seen.update(int(e) for e in table[(b + position + i) % T, layer])
        out.append(len(seen))
    return out


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    B=st.integers(1, 9),
    s=st.integers(1, 8),
    position=st.integers(0, 50),
)
def test_batch_unique_is_the_set_union(seed, B, s, position):
    rng = np.random.default_rng(seed)
    T, L, N, m = 37, 3, 16, 3
    table = np.argsort(rng.random((T, L, N)), axis=2)[:, :, :m]
    starts = rng.integers(0, T, size=B)
    rows = window_rows(starts, position, s, T)
    assert rows.shape == (B, s)
    assert batch_unique(table, rows).tolist() == _brute_union(table, starts, position, s)


def test_uniform_union_matches_its_expectation():
    from specmoe.engine.efficiency import uniform_table

    tab = uniform_table(20000, 2, 64, 8, seed=3)
    rng = np.random.default_rng(0)
    for r in (1, 4, 32):
        counts = [
            batch_unique(tab.experts, rng.integers(0, 20000, size=r)).mean() for _ in range(300)
        ]
        assert np.mean(counts) == pytest.approx(uniform_union(64, 8, r)[-1], rel=0.02)


def test_starts_stay_inside_documents_and_differ():
    offsets = np.array([0, 10, 13, 40, 41, 100])
    rng = np.random.default_rng(1)
    for _ in range(20):
        starts = choose_starts(offsets, 8, 8, rng)
        assert len(set(starts.tolist())) == 8
        doc = np.searchsorted(offsets, starts, side="right") - 1
        assert np.all(starts + 8 <= offsets[doc + 1])
    # No document is long enough: any row, still distinct where possible.
    starts = choose_starts(np.array([0, 3, 6]), 4, 8, rng)
    assert len(set(starts.tolist())) == 4


def test_layer_map_by_relative_depth():
    assert layer_map(4, 16).tolist() == [0, 5, 10, 15]
    assert layer_map(1, 16).tolist() == [0]
    assert layer_map(3, 3).tolist() == [0, 1, 2]


def test_summary_rows_on_known_records():
    rec = []
    for rep, (t1, t3) in enumerate([(10.0, 20.0), (12.0, 18.0), (11.0, 30.0)]):
        rec.append(
            {
                "routing": "u",
                "batch": 2,
                "k": None,
                "repetition": rep,
                "t_ms": t1,
                "unique": [16, 16],
            }
        )
        rec.append(
            {"routing": "u", "batch": 2, "k": 3, "repetition": rep, "t_ms": t3, "unique": [40, 44]}
        )
    (row,) = summarise_efficiency(
        rec,
        dense_bytes=100.0,
        expert_bytes=[1.0, 1.0],
        kv_bytes={2: 50.0},
        acceptance=0.5,
        draft_cost=0.1,
    )
    assert row["t_step_ms"] == 11.0 and row["t_verify_ms"] == 20.0
    assert row["efficiency"] == pytest.approx(11 / 20)
    assert row["efficiency_range"] == pytest.approx([11 / 30, 12 / 18])
    assert row["estimate"] == pytest.approx((100 + 32) / (100 + 84))
    assert row["estimate_with_kv"] == pytest.approx((150 + 32) / (150 + 84))
    assert row["gap"] == pytest.approx(11 / 20 - 132 / 184)
    assert row["speedup"] == pytest.approx(1.875 * 11 / (20 + 3 * 0.1 * 11))
    assert row["rows"] == 8 and row["k_active"] == 32 and row["unique"] == 84


# ------------------------------------------------------------------------------------------
# Forced routing of a batch (tiny random models)


@pytest.fixture(scope="module")
def olmoe(tiny_moe):
    return tiny_moe("olmoe", num_experts=8, top_k=2, num_layers=2)


def _table(T, L, N, m, seed=0):
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((T, L, N)), axis=2)[:, :, :m].astype(np.int64)


def test_batch_rows_take_their_own_windows(olmoe):
    import torch

    from specmoe.engine.capture import RouterRecorder
    from specmoe.engine.efficiency import BatchForcedRouting
    from specmoe.engine.switch import ForcedRouting

    table = _table(53, 2, 8, 2, seed=4)
    starts, position, s = np.array([0, 17, 31]), 5, 4
    x = torch.randint(0, 257, (3, s), generator=torch.Generator().manual_seed(0))
    with BatchForcedRouting(olmoe, table) as forced, RouterRecorder(olmoe) as rec:
        forced.set_windows(starts, position)
        with torch.inference_mode():
            batched = olmoe(input_ids=x).logits
        got = np.sort(rec.pop()[0], axis=-1).reshape(3, s, 2, 2)  # [B, s, L, m]
    want = np.sort(table[(starts[:, None] + position + np.arange(s)) % 53], axis=-1)
    assert np.array_equal(got, want)
    # Different sequences really route differently, not the same window three times.
    assert not np.array_equal(got[0], got[1]) and not np.array_equal(got[1], got[2])
    # Each row equals its sequence run alone under one-sequence forced routing at its start.
    for b in range(3):
        single = ForcedRouting(olmoe, table).install()
        try:
            single.offset, single.position = int(starts[b]), position
            with torch.inference_mode():
                alone = olmoe(input_ids=x[b : b + 1]).logits
        finally:
            single.remove()
        torch.testing.assert_close(batched[b], alone[0], rtol=1e-4, atol=1e-5)


def test_measurement_on_a_tiny_model(olmoe):
    from specmoe.engine.efficiency import RoutingTable, measure_efficiency, model_bytes

    const = RoutingTable("const", np.tile(np.array([[[1, 5]]]), (64, 2, 1)), np.array([0, 64]))
    rand = RoutingTable("rand", _table(64, 2, 8, 2, seed=1), np.array([0, 32, 64]))
    out = measure_efficiency(
        olmoe, [const, rand], batches=[1, 3], ks=[1, 2], context=6, repeats=2, warmup=1, seed=0
    )
    recs = out["records"]
    assert len(recs) == 2 * 2 * 2 * 3  # tables × B × repetitions × (step + 2 K)
    assert out["calls"]["dedup"] > 0 and out["calls"]["per_slot"] > 0
    for r in recs:
        s = 1 if r["k"] is None else r["k"] + 1
        assert r["rows"] == r["batch"] * s and r["t_ms"] > 0
        if r["routing"] == "const":
            assert r["unique"] == [2, 2]
        else:
            assert all(2 <= u <= min(8, 2 * r["rows"]) for u in r["unique"])
    nb = model_bytes(olmoe)
    # Experts: gate_up [8, 2I, h] and down [8, h, I] of float32 → 3·h·I·4 bytes per expert.
    cfg = olmoe.config
    assert nb.expert == [3 * cfg.hidden_size * cfg.intermediate_size * 4.0] * 2
    total = sum(p.numel() * 4 for p in olmoe.parameters())
    emb = olmoe.get_input_embeddings().weight.numel() * 4
    assert nb.dense == total - emb - nb.expert_total
    rows = summarise_efficiency(
        recs, dense_bytes=nb.dense, expert_bytes=nb.expert, kv_bytes=out["kv_bytes"]
    )
    for r in rows:
        if r["routing"] == "const":
            assert r["estimate"] == 1.0  # the verification reads no extra expert
    assert out["kv_bytes"][3] == pytest.approx(3 * out["kv_bytes"][1])


def test_per_slot_kernel_runs_per_slot(olmoe):
    from specmoe.engine.efficiency import RoutingTable, measure_efficiency

    rand = RoutingTable("rand", _table(40, 2, 8, 2), np.array([0, 40]))
    import torch

    from specmoe.kernels.cpu import num_threads

    threads = (torch.get_num_threads(), num_threads())
    out = measure_efficiency(
        olmoe,
        [rand],
        batches=[2],
        ks=[1],
        context=4,
        repeats=1,
        warmup=0,
        kernel="per_slot",
        clock="cpu",
    )
    assert "dedup" not in out["calls"] and out["calls"]["per_slot"] > 0
    assert all(r["t_ms"] == r["t_cpu_ms"] for r in out["records"])
    assert (torch.get_num_threads(), num_threads()) == threads  # one thread only inside


# ------------------------------------------------------------------------------------------
# Bad input: one-line errors before any model is built


@pytest.fixture(scope="module")
def stats32(tmp_path_factory):
    """Statistics of N = 32, m = 4 (OLMoE has N = 64, m = 8) with lags 1..3."""
    tr = sticky_trace(3000, 2, 32, 4, [0.4, 0.6], seed=2, doc_len=300)
    path = tmp_path_factory.mktemp("stats") / "stats32.json"
    save_moments(fit_moments(tr, max_lag=3), path)
    return path


def test_statistics_of_another_shape_or_too_few_lags(stats32):
    from specmoe.engine.efficiency import synthetic_table
    from specmoe.routing.ipf import load_moments

    mom = load_moments(stats32)
    olmoe = get_preset("OLMoE-1B-7B-0125")
    with pytest.raises(InputError, match=r"N=32, m=4 does not fit") as exc:
        synthetic_table(mom, olmoe, 2, 100, variant="skewed", max_pass=4)
    assert "\n" not in str(exc.value)
    same = olmoe.__class__(
        name="small",
        num_experts=32,
        top_k=4,
        num_moe_layers=2,
        hidden_size=8,
        expert_intermediate=8,
    )
    with pytest.raises(InputError, match="lags"):
        synthetic_table(mom, same, 2, 100, variant="skewed", max_pass=8)  # K = 7 > 3 lags
    other_m = olmoe.__class__(
        name="m2", num_experts=32, top_k=2, num_moe_layers=2, hidden_size=8, expert_intermediate=8
    )
    with pytest.raises(InputError, match="m=4"):
        synthetic_table(mom, other_m, 2, 100, variant="uniform", max_pass=4)
    tab = synthetic_table(mom, same, 3, 200, variant="uniform", max_pass=4, seed=1)
    assert tab.experts.shape == (200, 3, 4) and tab.name == "ipf-uniform"


def _cli(capsys, *argv):
    rc = main(["efficiency", *map(str, argv)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _one_error_line(err: str, needle: str) -> bool:
    """The error is one line, the last on stderr (progress lines may precede it)."""
    lines = err.splitlines()
    return (
        lines[-1].startswith("specmoe efficiency: error: ")
        and needle in lines[-1]
        and sum("error" in line for line in lines) == 1
        and "Traceback" not in err
    )


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--routing", "ipf-skewed"], "does not fit the model"),  # OLMoE: N=64, m=8
        (
            ["--model", "gpt-oss-20b", "--routing", "ipf-uniform", "--k", "3,7"],
            "--k 7",
        ),  # N=32, m=4; lags 1..3
        (["--batch", "0,2"], "--batch"),
        (["--k", "three"], "--k"),
        (["--acceptance", "1.5"], "--acceptance"),
        (["--routing", "uniform,nowhere.npz"], "nowhere.npz"),
        (["--model", "NoSuchModel"], "--model"),
        (["--layers", "99"], "--layers"),
    ],
)
def test_cli_bad_input_is_one_line(capsys, stats32, argv, needle):
    rc, out, err = _cli(
        capsys,
        "--model",
        "OLMoE-1B-7B-0125",
        "--layers",
        "2",
        "--stats",
        stats32,
        "--k",
        "3",
        *argv,
    )
    assert rc == 2 and out == ""
    assert _one_error_line(err, needle)


def test_cli_recorded_trace_of_another_shape(capsys, tmp_path):
    tr = sticky_trace(200, 2, 32, 4, [0.5, 0.5], seed=1)
    save_trace(
        RoutingTrace(experts=tr.experts, doc_offsets=tr.doc_offsets, num_experts=32),
        tmp_path / "t32.npz",
    )
    rc, out, err = _cli(
        capsys, "--model", "OLMoE-1B-7B-0125", "--layers", "2", "--routing", tmp_path / "t32.npz"
    )
    assert rc == 2 and out == "" and _one_error_line(err, "N=32, m=4")


def test_cli_end_to_end_on_a_tiny_model(capsys, tmp_path, olmoe):
    model_dir = tmp_path / "tiny"
    olmoe.save_pretrained(model_dir)
    tr = sticky_trace(600, 2, 8, 2, [0.5, 0.7], seed=3, doc_len=100)
    save_trace(tr, tmp_path / "rec.npz")
    rc, out, err = _cli(
        capsys,
        "--model",
        model_dir,
        "--routing",
        f"uniform,ipf-skewed,{tmp_path / 'rec.npz'}",
        "--batch",
        "1,4",
        "--k",
        "1,3",
        "--context",
        "8",
        "--repeats",
        "2",
        "--warmup",
        "0",
        "--tokens",
        "300",
        "--json",
        "--out",
        tmp_path / "res",
    )
    assert rc == 0, err
    rec = json.loads(out)
    assert [t["name"] for t in rec["routings"]] == ["uniform", "ipf-skewed", "rec"]
    assert len(rec["rows"]) == 3 * 2 * 2
    for r in rec["rows"]:
        assert r["efficiency"] == pytest.approx(r["t_step_ms"] / r["t_verify_ms"])
        assert 0 < r["estimate"] <= 1 and math.isfinite(r["speedup"])
        assert r["k_active"] <= r["unique"] <= 2 * 8
    on_disk = json.loads((tmp_path / "res" / "efficiency.json").read_text())
    assert len(on_disk["records"]) == 3 * 2 * 2 * 3
    for name in ("efficiency_vs_batch", "speedup_vs_batch", "measured_vs_estimate"):
        assert (tmp_path / "res" / f"{name}.png").stat().st_size > 1000


@pytest.mark.parametrize(
    "argv, shown",
    [
        (["--vocab", "1"], "--vocab: must lie in 2.."),
        (["--dense-dtype", "float99"], "--dense-dtype: 'float99' is not a torch dtype name"),
    ],
)
def test_cli_shows_build_model_errors_with_their_flags(capsys, argv, shown):
    """build_model names its own arguments (vocab, dense_dtype); the CLI shows their flags."""
    rc, out, err = _cli(
        capsys, "--model", "OLMoE-1B-7B-0125", "--layers", "2", "--routing", "uniform", *argv
    )
    assert rc == 2 and out == ""
    assert _one_error_line(err, shown)
    assert err.strip().splitlines()[-1].startswith(f"specmoe efficiency: error: {shown}")
