"""specmoe.analysis.transfer and ``specmoe transfer``: routing carried to another N and m, the two
pre-stated forms recovered exactly from profiles made by their own laws, held-out misses and
crossover counts against hand-computed values."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from specmoe.analysis import transfer as T
from specmoe.errors import InputError
from specmoe.formats.trace import load_trace
from specmoe.routing.ipf import fit_moments
from specmoe.routing.synth import uniform_moments

ROOT = Path(__file__).resolve().parents[1]
FIT = ROOT / "specmoe" / "data" / "traces" / "fit.npz"
BENCH = ROOT / "results" / "cpu" / "bench-transfer"
COMMITTED = ROOT / "results" / "cpu" / "analysis" / "transfer" / "transfer.json"


@pytest.fixture(scope="module")
def moments():
    return fit_moments(load_trace(FIT), max_lag=8)


def test_overlap_moments_is_uniform_moments_at_the_same_m(moments):
    a = T.overlap_moments(moments, num_experts=96, top_k=moments.top_k, layer_mean=False)
    b = uniform_moments(moments, 96)
    np.testing.assert_allclose(a.popularity, b.popularity, rtol=0, atol=1e-15)
    np.testing.assert_allclose(a.coactivation, b.coactivation, rtol=1e-13, atol=1e-15)


def test_overlap_moments_keeps_the_layer_mean_share_at_another_m(moments):
    a = T.overlap_moments(moments, num_experts=32, top_k=4)
    want = np.mean(moments.coactivation.sum(axis=2) / moments.top_k, axis=0)  # [J]
    assert a.num_layers == 1 and a.top_k == 4 and a.num_experts == 32
    np.testing.assert_allclose(a.coactivation[0].sum(axis=1) / 4, want, rtol=1e-12)
    np.testing.assert_allclose(a.popularity, 4 / 32)
    with pytest.raises(InputError, match="top_k"):
        T.overlap_moments(moments, num_experts=8, top_k=8)


def test_transfer_routing_draws_the_carried_overlap(moments):
    tr = T.transfer_routing(moments, num_experts=32, top_k=4, tokens=3000, seed=1)
    assert tr.experts.shape == (3000, 1, 4) and int(tr.experts.max()) < 32
    rows = tr.experts[:, 0, :].astype(np.int64)
    assert all(len(set(r)) == 4 for r in rows[:200])  # m distinct experts per token
    lag1 = np.mean([len(set(a) & set(b)) / 4 for a, b in itertools.pairwise(rows)])
    want = moments.overlap[:, 0].mean()
    assert abs(lag1 - want) < 0.03, (lag1, want)


def _profile(name, b, m, n, beta_slot, beta_dedup, u_bar, crossover=None):
    return {
        "model": {"name": name, "expert_bytes": b, "top_k": m},
        "n": list(n),
        "beta_slot": list(beta_slot),
        "beta_dedup": list(beta_dedup),
        "u_bar": list(u_bar),
        "crossover": crossover,
    }


def _ubar(n, m, keep):
    # a made-up byte share that falls with n, different per model
    return np.array([1.0] + [(m + (k - 1) * m * (1 - keep)) / (k * m) for k in n[1:]])


def _models_from_law(law):
    n = np.arange(1, 10)
    out = []
    for i, (b, m, keep) in enumerate([(9.4e6, 8, 0.4), (12.6e6, 8, 0.35), (17.3e6, 6, 0.3),
                                       (49.8e6, 4, 0.45), (352e6, 2, 0.38)]):  # fmt: skip
        ub = _ubar(n, m, keep)
        bs, bd = law(n, b, m, ub)
        out.append(T.profile_points(_profile(f"m{i}", b, m, n, bs, bd, ub)))
    return out


def test_loglinear_form_is_recovered_exactly():
    def law(n, b, m, ub):
        bs = np.exp(1.0 + 0.05 * np.log(n) + 0.1 * np.log(b / 1e9))
        bd = np.exp(0.5 - 0.2 * np.log(n) + 0.02 * np.log(b / 1e9))
        return bs, bd

    res = T.hold_out(_models_from_law(law), form="loglinear")
    assert res["beta_miss_max"] < 1e-10
    for row in res["models"]:
        np.testing.assert_allclose(row["r_pred"], row["r"], rtol=1e-10)


def test_structure_form_is_recovered_exactly():
    k_slot, k_dedup = (0.05, 1e-4, 0.02, 3e-6), (0.06, 2e-4, 0.004, 5e-6)

    def law(n, b, m, ub):
        bg = b / 1e9
        U = ub * n * m
        inv_s = k_slot[0] + k_slot[1] / bg + k_slot[2] * ub + k_slot[3] / (n * m * bg)
        inv_d = k_dedup[0] + k_dedup[1] / bg + k_dedup[2] * n * m / U + k_dedup[3] / (U * bg)
        return 1 / inv_s, 1 / inv_d

    models = _models_from_law(law)
    np.testing.assert_allclose(T.fit_form("structure", "per_slot", models), k_slot, rtol=1e-8)
    np.testing.assert_allclose(T.fit_form("structure", "dedup", models), k_dedup, rtol=1e-8)
    res = T.hold_out(models, form="structure")
    assert res["beta_miss_max"] < 1e-8
    # the loglinear form cannot represent this law: it misses
    assert T.hold_out(models, form="loglinear")["beta_miss_max"] > 1e-3


def test_misses_and_crossovers_by_hand():
    # three models with constant bandwidths: the loglinear fit on two points of b predicts the
    # third by a straight line in log b; slot exactly 10 GB/s everywhere (no miss), dedup 8, 8
    # and 4: the first two held out are predicted by the line through the other two.
    n = np.arange(1, 6)
    ub = np.array([1.0, 0.8, 0.7, 0.6, 0.5])
    profs = [
        _profile("a", 1e6, 8, n, [10] * 5, [8] * 5, ub, crossover=None),
        _profile("b", 1e7, 8, n, [10] * 5, [8] * 5, ub, crossover=4),
        _profile("c", 1e8, 8, n, [10] * 5, [4] * 5, ub, crossover=None),
    ]
    res = T.hold_out([T.profile_points(p) for p in profs], form="loglinear", n_report=(2, 4))
    rows = {r["held_out"]: r for r in res["models"]}
    np.testing.assert_allclose(rows["a"]["miss_slot"], 0, atol=1e-12)
    # held out "b": dedup line through (1e6, 8) and (1e8, 4) gives 8/sqrt(2) at 1e7
    np.testing.assert_allclose(rows["b"]["beta_dedup_pred"], 8 / np.sqrt(2), rtol=1e-12)
    np.testing.assert_allclose(rows["b"]["miss_dedup"], 1 - 1 / np.sqrt(2), rtol=1e-12)
    # held out "c": extrapolated flat at 8 from (1e6, 8), (1e7, 8): miss (8 - 4) / 4 = 100%
    np.testing.assert_allclose(rows["c"]["miss_dedup"], 1.0, rtol=1e-12)
    # crossovers: r = 0.8 measured for a and b, 0.4 for c; ū = 0.8, 0.7, 0.6, 0.5 at n = 2..5
    assert rows["a"]["crossover_own"] == 3  # 0.8 > 0.7 from n = 3 on
    assert rows["c"]["crossover_own"] is None  # 0.4 < ū everywhere
    assert rows["b"]["crossover_transferred"] == 5  # r̂ = 0.566 > ū only at n = 5
    assert rows["b"]["transferred_within_one"] and rows["b"]["own_within_one"]
    assert rows["c"]["own_within_one"]  # both "none up to n_max"
    assert not rows["c"]["transferred_within_one"]  # transferred 3 against none (= 6)
    assert res["configurations"] == 3
    assert res["beta_miss_max"] == pytest.approx(1.0)
    assert res["beta_miss_min"] == pytest.approx(0.0, abs=1e-12)


def test_bad_inputs():
    p = _profile("a", 1e6, 8, [1, 2], [1, 2], [1, 2], [1, 0.5])
    with pytest.raises(InputError, match="two models"):
        T.hold_out([T.profile_points(p)], form="loglinear")
    with pytest.raises(InputError, match="twice"):
        T.hold_out([T.profile_points(p), T.profile_points(p)], form="loglinear")
    with pytest.raises(InputError, match="form"):
        T.fit_form("cubic", "dedup", [T.profile_points(p)])
    with pytest.raises(InputError, match="positive"):
        T.profile_points({**p, "beta_slot": [0, 1]})
    with pytest.raises(InputError, match="not a bandwidth profile"):
        T.profile_points({"n": [1]})


@pytest.mark.skipif(not COMMITTED.exists(), reason="no committed transfer result")
def test_command_reproduces_the_committed_result(capsys):
    from specmoe.cli import main

    d = json.loads(COMMITTED.read_text())
    args = ["transfer", "--profiles", *[str(ROOT / p) for p in d["profiles"]], "--json"]
    assert main([*args, "--no-counters"]) == 0
    now = json.loads(capsys.readouterr().out)
    for form, r in d["forms"].items():
        for key in ("beta_miss_min", "beta_miss_median", "beta_miss_max", "r_miss_median"):
            assert now["forms"][form][key] == pytest.approx(r[key], rel=1e-9)
        for key in ("crossover_transferred_within_one", "crossover_own_within_one"):
            assert now["forms"][form][key] == r[key]
    assert now["memory_counters"] is None


def test_memory_counters_answers():
    from specmoe.commands.transfer import memory_counters

    mc = memory_counters()
    assert isinstance(mc["readable"], bool)
    assert mc["perf_event_paranoid"] is None or isinstance(mc["perf_event_paranoid"], int)
    if not mc["cpu_pmu"]:
        assert not mc["readable"] or mc["perf"]
