"""The measured side of the whole-pass rule set: bootstrap intervals against exact enumeration
and brute force, the decided flag, the runs files' sample fields, the committed prediction's
sha256 check, and the old runs and rules scoring exactly as before."""

from __future__ import annotations

import hashlib
import itertools
import json
import statistics
from pathlib import Path

import numpy as np
import pytest
from _synthetic_runs import ACC, K, draft_ms, measured_verify_ms, throughput_from_steps
from hypothesis import given, settings
from hypothesis import strategies as st
from test_validate_whole_pass import RULES_WP, _world

from specmoe.cli import main
from specmoe.errors import InputError
from specmoe.formats.runs import load_runs, recorded_prediction
from specmoe.validate import intervals as iv
from specmoe.validate.result import Validation
from specmoe.validate.rules import Rule
from specmoe.validate.score import validate

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------
# brute-force references


def _all_resamples(P: int) -> np.ndarray:
    """Every ordered resample of P prompts out of P: the exact bootstrap distribution."""
    return np.array(list(itertools.product(range(P), repeat=P)))


def _linear_quantile(xs: list[float], q: float) -> float:
    """numpy's default (linear) quantile, written out: h = (N - 1) q between order stats."""
    s = sorted(xs)
    h = (len(s) - 1) * q
    lo = int(np.floor(h))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (h - lo) * (s[hi] - s[lo])


def _inverse_cdf(xs: list[float], q: float) -> float:
    """The exact distribution's quantile: the smallest x with P(X <= x) >= q."""
    s = sorted(xs)
    for i, x in enumerate(s):
        if (i + 1) / len(s) >= q - 1e-15:
            return x
    return s[-1]


def _cdf_jump_margin(xs: list[float], x: float, q: float) -> float:
    """How far q lies inside the jump of the exact CDF at x: min(F(x) - q, q - F(x-))."""
    F = sum(v <= x for v in xs) / len(xs)
    F_minus = sum(v < x for v in xs) / len(xs)
    return min(F - q, q - F_minus)


PER_PROMPT = np.array([[3.0, 5.0], [4.0, 9.0], [7.5, 6.0]])  # [P = 3, n = 2] medians
# [A = 2, K = 3, P = 3, R = 2] tokens/s; the k = 0 column is shared by both acceptance values
GEN = np.array(
    [
        [[[10.0, 11.0], [9.0, 9.5], [12.0, 10.5]], [[12.0, 13.0], [8.0, 9.0], [14.0, 15.0]]],
        [[[10.0, 11.0], [9.0, 9.5], [12.0, 10.5]], [[11.0, 12.0], [10.0, 9.0], [12.5, 13.0]]],
    ]
)
GEN = np.concatenate([GEN, GEN[:, 1:2] * np.array([1.05, 0.9])[:, None, None, None]], axis=1)


def test_mean_of_medians_on_every_resample_is_the_exact_distribution():
    idx = _all_resamples(3)
    got = iv.mean_of_medians(PER_PROMPT, idx)  # [27, n]
    for j in range(PER_PROMPT.shape[1]):
        want = [statistics.fmean(PER_PROMPT[list(r), j]) for r in idx]
        assert got[:, j].tolist() == pytest.approx(want, rel=1e-15)
        pi = iv.percentile_interval(got[:, j], 0.95)
        assert pi[0] == pytest.approx(_linear_quantile(want, 0.025), rel=1e-14)
        assert pi[1] == pytest.approx(_linear_quantile(want, 0.975), rel=1e-14)


def test_the_2000_resample_interval_is_the_exact_distributions_percentile_interval():
    """With P = 3 the 2.5% and 97.5% points fall inside jumps of the exact bootstrap CDF (27
    equally likely resamples), so the Monte Carlo percentile interval must hit them exactly."""
    idx = iv.resample_prompts(3, resamples=2000, seed=0)
    exact = _all_resamples(3)
    got = iv.percentile_interval(iv.mean_of_medians(PER_PROMPT, idx), 0.95)  # [n, 2]
    for j in range(PER_PROMPT.shape[1]):
        dist = [statistics.fmean(PER_PROMPT[list(r), j]) for r in exact]
        for q, x in ((0.025, got[j, 0]), (0.975, got[j, 1])):
            ref = _inverse_cdf(dist, q)
            assert _cdf_jump_margin(dist, ref, q) > 0.01  # the check is well posed
            assert x == pytest.approx(ref, rel=1e-12)
    # the median over prompts x repeats, on the same draws
    T = iv.median_of_generations(GEN, idx)  # [B, A, K]
    T_iv = iv.percentile_interval(T, 0.95)
    for a, k in itertools.product(range(GEN.shape[0]), range(GEN.shape[1])):
        dist = [statistics.median(GEN[a, k, list(r), :].ravel().tolist()) for r in exact]
        for q, x in ((0.025, T_iv[a, k, 0]), (0.975, T_iv[a, k, 1])):
            ref = _inverse_cdf(dist, q)
            if _cdf_jump_margin(dist, ref, q) > 0.01:
                assert x == pytest.approx(ref, rel=1e-12), (a, k, q)


def test_throughput_scores_on_every_resample_match_brute_force():
    idx = _all_resamples(3)
    k_hat = [1, 2]
    T = iv.median_of_generations(GEN, idx)
    k_b = iv.kstar_samples(T)
    loss = iv.loss_samples(T, k_hat)
    share = iv.within_one_share(k_b, k_hat)
    A, Kn = GEN.shape[:2]
    within = np.zeros(A)
    for b, r in enumerate(idx):
        for a in range(A):
            row = [statistics.median(GEN[a, k, list(r), :].ravel().tolist()) for k in range(Kn)]
            best = max(row)
            ks = row.index(best)  # the smallest maximiser
            assert T[b, a].tolist() == pytest.approx(row, rel=1e-15)
            assert k_b[b, a] == ks
            assert loss[b, a] == pytest.approx(1 - row[k_hat[a]] / best, abs=1e-15)
            within[a] += abs(ks - k_hat[a]) <= 1
    assert share.tolist() == pytest.approx((within / len(idx)).tolist(), rel=1e-15)
    # the point estimate: the median over every prompt and repeat
    point = iv.median_of_generations(GEN)
    for a, k in itertools.product(range(A), range(Kn)):
        assert point[a, k] == statistics.median(GEN[a, k].ravel().tolist())


def test_median_of_ragged_repeats_leaves_the_padding_out():
    x = np.array([[1.0, 5.0, np.nan], [2.0, 3.0, 4.0], [np.nan, np.nan, np.nan]])
    got = iv.median_last(x)
    assert got[0] == 3.0 and got[1] == 3.0 and np.isnan(got[2])
    rng = np.random.default_rng(3)
    y = rng.normal(size=(5, 7, 8))
    assert np.array_equal(iv.median_last(y), np.median(y, axis=-1))


def test_best_speedup_samples_is_the_theory():
    from specmoe.cost import theory

    V = np.array([[1.0, 1.2, 1.5, 1.9], [1.0, 1.05, 1.1, 1.2]])
    acc = [0.2, 0.6, 0.9]
    got = iv.best_speedup_samples(V, acc)
    for b, a in itertools.product(range(2), range(3)):
        assert got[b, a] == pytest.approx(float(theory.best_speedup(V[b].tolist(), acc[a])))


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 9).flatmap(
        lambda P: st.lists(
            st.lists(st.floats(0.1, 100.0), min_size=3, max_size=3), min_size=P, max_size=P
        )
    ),
    st.integers(0, 5),
)
def test_interval_holds_the_point_estimate_and_shares_are_shares(rows, seed):
    X = np.array(rows)  # [P, n] per-prompt medians
    idx = iv.resample_prompts(X.shape[0], resamples=2000, seed=seed)
    point = iv.mean_of_medians(X)
    pi = iv.percentile_interval(iv.mean_of_medians(X, idx), 0.95)
    tol = 1e-12 * np.abs(point)
    assert np.all(pi[:, 0] <= point + tol) and np.all(point - tol <= pi[:, 1])
    assert np.all(pi[:, 0] <= pi[:, 1])
    # the same rows as generations of a [A = 1, K = 3] throughput: share and loss stay in range
    G = X.T[None, :, :, None]  # [1, K = 3, P, R = 1]
    T = iv.median_of_generations(G, idx)
    share = iv.within_one_share(iv.kstar_samples(T), [0])
    assert np.all((share >= 0) & (share <= 1))
    loss = iv.loss_samples(T, [2])
    assert np.all((loss >= 0) & (loss < 1))


# ------------------------------------------------------------------------------------------
# decided


def _r(op, value, of=None):
    return Rule(id="r", version="prediction", metric="m", op=op, value=value, text="", of=of)


@pytest.mark.parametrize(
    ("rule", "interval", "total", "want"),
    [
        (_r("<=", 0.1), (0.02, 0.08), None, True),  # holds throughout
        (_r("<=", 0.1), (0.12, 0.3), None, True),  # fails throughout
        (_r("<=", 0.1), (0.05, 0.15), None, False),  # straddles the value
        (_r("<=", 0.1), (0.05, 0.1), None, True),  # the value itself holds under <=
        (_r("<", 0.1), (0.05, 0.1), None, False),  # ... and fails under <
        (_r("<=", 1), (0.0, 1.0), None, True),  # crossover distance 0..1: within one
        (_r(">=", 10, of=11), (10.0, 11.0), 11, True),  # every resample 10 or 11 of 11
        (_r(">=", 10, of=11), (9.0, 11.0), 11, False),
        (_r(">=", 10, of=11), (6.0, 9.0), 11, True),  # fails throughout
        (_r(">=", 10, of=11), (9.0, 10.0), 10, False),  # 9 of 10 misses the share of 10/11
        (_r(">=", 10, of=11), (10.0, 10.0), 10, True),
        (_r("==", 1.0), (1.0, 1.0), None, True),
        (_r("==", 1.0), (0.5, 1.0), None, False),
        (_r("==", 1.0), (0.2, 0.5), None, True),
        (_r("<=", 0.1), None, None, None),
        (_r("<=", 0.1), (float("nan"), 0.2), None, None),
    ],
)
def test_decided_when_the_interval_lies_on_one_side(rule, interval, total, want):
    assert iv.decided(rule, interval, total) is want


# ------------------------------------------------------------------------------------------
# runs with samples, scored by the whole-pass rule set

P_V, R_V, P_T, R_T = 5, 3, 4, 2


def _samples_runs(
    folder: Path,
    *,
    medians: bool = True,
    samples: bool = True,
    off: np.ndarray | None = None,
    on: np.ndarray | None = None,
    T: np.ndarray | None = None,
    repeat_sd: float = 0.004,
) -> Path:
    """A runs folder of the synthetic world with per-prompt repeats and per-generation
    throughputs (prompt effects and repeat noise around the means ``off``, ``on`` [n] and
    ``T`` [A, K], by default the synthetic world's)."""
    folder.mkdir(parents=True, exist_ok=True)
    if off is None or on is None:
        off, on = measured_verify_ms()
    h = draft_ms()
    rng = np.random.default_rng(7)
    eff = 1 + rng.normal(0, 0.01, size=(P_V, 1, 1))
    rep_off = off[None, :, None] * eff * (1 + rng.normal(0, repeat_sd, size=(P_V, len(off), R_V)))
    rep_on = on[None, :, None] * eff * (1 + rng.normal(0, repeat_sd, size=(P_V, len(on), R_V)))
    if T is None:
        T = throughput_from_steps(on[: len(K)] + h)  # [A, K]
    gen = T[:, :, None, None] * (1 + rng.normal(0, 0.01, size=(len(ACC), len(K), P_T, R_T)))
    gen[:, 0] = gen[0, 0]  # k = 0 runs once per prompt and repeat, for every acceptance value
    vc = {
        "depth": 512,
        "n": list(range(1, len(off) + 1)),
        "verify_ms": {"off": off.tolist(), "on": on.tolist()},
        "draft_ms": h.tolist(),
        "prompts": [f"doc{i}" for i in range(P_V)],
    }
    if samples:
        vc["per_prompt_repeats_ms"] = {"off": rep_off.tolist(), "on": rep_on.tolist()}
    if medians or not samples:
        vc["per_prompt_ms"] = {
            "off": np.median(rep_off, axis=2).tolist(),
            "on": np.median(rep_on, axis=2).tolist(),
        }
    tc = {
        "depth": 512,
        "k": K,
        "acceptance": ACC,
        "tokens_per_s": np.median(gen.reshape(len(ACC), len(K), -1), axis=2).tolist(),
        "dedup": True,
        "prompts": [f"doc{i}" for i in range(P_T)],
    }
    if samples:
        tc["per_prompt_tokens_per_s"] = gen.tolist()
    (folder / "verify.json").write_text(
        json.dumps(
            {"model": "tiny-moe", "device": "cpu", "engine": "specmoe", "configurations": [vc]}
        )
    )
    (folder / "throughput.json").write_text(
        json.dumps({"model": "tiny-moe", "configurations": [tc]})
    )
    return folder


def _world_with_samples(tmp: Path, **kw):
    plan, _ = _world(tmp)
    return plan, _samples_runs(tmp / "wp-runs" / "tiny", **kw)


def test_samples_load_and_the_medians_are_derived_or_checked(tmp_path):
    runs = _samples_runs(tmp_path / "a", medians=False)
    (m,) = load_runs(runs)
    v = json.loads((runs / "verify.json").read_text())["configurations"][0]
    rep = np.array(v["per_prompt_repeats_ms"]["off"])
    assert m.per_prompt_repeats_off_ms.shape == (P_V, 9, R_V)
    assert np.array_equal(m.per_prompt_off_ms, np.median(rep, axis=2))
    assert m.verify_prompts == tuple(f"doc{i}" for i in range(P_V))
    assert m.per_prompt_tokens_per_s.shape == (len(ACC), len(K), P_T, R_T)
    assert m.throughput_prompts == tuple(f"doc{i}" for i in range(P_T))
    # a median that is not the repeats' median is an error naming the file and the cell
    v["per_prompt_ms"] = {
        "off": np.median(rep, axis=2).tolist(),
        "on": np.median(rep, axis=2).tolist(),
    }
    (runs / "verify.json").write_text(json.dumps({"model": "tiny-moe", "configurations": [v]}))
    with pytest.raises(
        InputError, match=r"verify\.json: per_prompt_ms\.on\[\d\]\[\d\] = .* is not the median"
    ):
        load_runs(runs)


def test_ragged_repeats_are_padded_and_bad_shapes_name_the_file(tmp_path):
    runs = _samples_runs(tmp_path / "b", medians=False)
    t = json.loads((runs / "throughput.json").read_text())
    gen = t["configurations"][0]["per_prompt_tokens_per_s"]
    gen[3][4][1] = gen[3][4][1][:1]  # one repeat of prompt 1 at one cell
    (runs / "throughput.json").write_text(json.dumps(t))
    (m,) = load_runs(runs)
    assert np.isnan(m.per_prompt_tokens_per_s[3, 4, 1, 1])
    gen[3][4] = gen[3][4][:2]  # a prompt missing
    (runs / "throughput.json").write_text(json.dumps(t))
    with pytest.raises(InputError, match=r"throughput\.json: per_prompt_tokens_per_s must be"):
        load_runs(runs)
    t["configurations"][0]["prompts"] = ["a", "b"]
    (runs / "throughput.json").write_text(json.dumps(t))
    with pytest.raises(InputError, match=r"throughput\.json"):
        load_runs(runs)
    v = json.loads((runs / "verify.json").read_text())
    v["configurations"][0]["prompts"] = ["x", "x", "y", "z", "w"]
    (runs / "verify.json").write_text(json.dumps(v))
    with pytest.raises(InputError, match=r"verify\.json: prompts holds an id twice"):
        load_runs(runs)


def test_whole_pass_scores_carry_intervals_and_decided(tmp_path):
    plan, runs = _world_with_samples(tmp_path)
    val = validate(plan, runs, rules_path=str(RULES_WP))
    (c,) = val.configurations
    (m,) = load_runs(runs)
    assert (
        c.scored_version == "whole_pass"
        and c.kstar_within_one == c.versions["whole_pass"].kstar_within_one
    )
    # the point estimates are the statistics of definitions.measured
    assert c.measured.verify_off_ms == pytest.approx(m.per_prompt_off_ms.mean(axis=0), rel=1e-14)
    T = np.median(m.per_prompt_tokens_per_s.reshape(len(ACC), len(K), -1), axis=2)
    assert np.array_equal(np.array(c.measured.tokens_per_s), T)
    mi = c.measured.intervals
    assert (mi.verify_prompts, mi.verify_repeats, mi.throughput_prompts, mi.throughput_repeats) == (
        P_V,
        R_V,
        P_T,
        R_T,
    )
    # tau's interval: the prompts resampled with the rule set's seed, by hand
    idx = np.random.default_rng(0).integers(0, P_V, size=(2000, P_V))
    boot = m.per_prompt_off_ms[idx].mean(axis=1)
    lo, hi = np.quantile(boot, [0.025, 0.975], axis=0)
    assert np.array(mi.verify_off_ms) == pytest.approx(np.stack([lo, hi], 1), rel=1e-12)
    # the saving's interval is the sign rule's
    assert np.array(mi.saving_ms)[1:] == pytest.approx(np.array(c.measured.saving_interval_ms))
    # every version has the same metrics with intervals; the k* share per acceptance value
    for name, v in c.versions.items():
        assert v.intervals is not None, name
        assert set(v.intervals.metrics) >= {"verify_error", "max_loss", "kstar_within_one"}
        assert len(v.intervals.kstar_share) == len(ACC)
        assert all(0 <= s <= 1 for s in v.intervals.kstar_share)
        lo_e, hi_e = v.intervals.metrics["verify_error"]
        assert lo_e <= hi_e
    # the whole-pass verify error by hand on each resample (it takes nothing from the runs)
    wp = c.versions["whole_pass"]
    tb_off = m.per_prompt_off_ms[idx].mean(axis=1)
    tb_on = m.per_prompt_on_ms[idx].mean(axis=1)
    e = np.maximum(
        np.max(np.abs(np.array(wp.verify_ms.per_slot) - tb_off) / tb_off, axis=1),
        np.max(np.abs(np.array(wp.verify_ms.dedup) - tb_on) / tb_on, axis=1),
    )
    assert wp.intervals.metrics["verify_error"] == pytest.approx(
        tuple(np.quantile(e, [0.025, 0.975])), rel=1e-12
    )
    # the k* share by hand, on the throughput's own draws
    idt = np.random.default_rng(0).integers(0, P_T, size=(2000, P_T))
    X = m.per_prompt_tokens_per_s
    Tb = np.stack([np.median(X[:, :, r, :].reshape(len(ACC), len(K), -1), axis=2) for r in idt])
    kb = Tb.argmax(axis=2)
    share = (np.abs(kb - np.array(wp.k_hat)) <= 1).mean(axis=0)
    assert wp.intervals.kstar_share == pytest.approx(tuple(share), rel=1e-15)
    # verdicts: the scored version's interval, decided as the rule says, holds unchanged
    for r in c.rules:
        assert r.with_interval
        want = wp.intervals.metrics.get(r.rule.metric)
        assert r.interval == (None if want is None else tuple(want)), r.rule.id
        if r.interval is not None and r.holds is not None:
            assert r.decided is (
                r.rule.holds(r.interval[0], r.total) == r.rule.holds(r.interval[1], r.total)
            )
    rv = {r.rule.id: r for r in c.rules}
    assert rv["verify_error_whole_pass"].holds is False and rv["verify_error_whole_pass"].decided
    assert rv["saving_sign"].interval is None and rv["saving_sign"].decided is None
    d = val.to_dict()
    assert d["rules"][0]["decided_per_configuration"] == {c.name: c.rules[0].decided}
    assert "interval" in d["configurations"][0]["rules"][0]
    # validation.json reads back whole
    assert Validation.from_dict(json.loads(json.dumps(d))) == val


def test_undecided_verdicts_are_reported_not_removed(tmp_path):
    """Runs built around the whole-pass prediction: the measured verify time 1/0.9 of it up to
    prompt effects (the verify error sits at the rule's 10%), and at two acceptance values
    k_hat* + 2 as fast as k_hat* (their k* swaps under resampling): both verdicts are given,
    on the point estimate, with decided false."""
    plan, base = _world_with_samples(tmp_path)
    (c0,) = validate(plan, base, rules_path=str(RULES_WP)).configurations
    wp0 = c0.versions["whole_pass"]
    T = throughput_from_steps(np.array(wp0.step_ms))  # k* = k_hat* at the true means
    tied = [a for a in range(len(ACC)) if wp0.k_hat[a] + 2 < len(K)][:2]
    for a in tied:
        T[a, wp0.k_hat[a] + 2] = T[a, wp0.k_hat[a]]
    runs = _samples_runs(
        tmp_path / "around" / "tiny",
        off=np.array(wp0.verify_ms.per_slot) / 0.9,
        on=np.array(wp0.verify_ms.dedup) / 0.9,
        T=T,
        repeat_sd=0.0005,
    )
    v = validate(plan, runs, rules_path=str(RULES_WP))
    (c,) = v.configurations
    rv = {r.rule.id: r for r in c.rules}
    for rid in ("verify_error_whole_pass", "kstar_within_one"):
        r = rv[rid]
        assert r.holds is not None and r.decided is False, (rid, r.measured, r.interval)
        lo, hi = r.interval
        assert r.rule.holds(lo, r.total) != r.rule.holds(hi, r.total)
    s = c.versions["whole_pass"].intervals.kstar_share
    assert any(0 < s[a] < 1 for a in tied)
    summary = {r.rule.id: r for r in v.rules}
    assert summary["kstar_within_one"].decided is False
    assert summary["kstar_within_one"].per_configuration[c.name] is rv["kstar_within_one"].holds


def test_without_samples_the_whole_pass_set_falls_back_with_a_note(tmp_path):
    plan, runs = _world_with_samples(tmp_path, samples=False)
    (c,) = validate(plan, runs, rules_path=str(RULES_WP)).configurations
    (m,) = load_runs(runs)
    assert np.array_equal(np.array(c.measured.tokens_per_s), m.throughput)
    assert any("no per-generation throughputs" in n for n in c.notes)
    rv = {r.rule.id: r for r in c.rules}
    assert rv["kstar_within_one"].interval is None and rv["kstar_within_one"].decided is None
    assert rv["kstar_within_one"].holds is not None  # scored on the point estimate
    assert rv["verify_error_whole_pass"].interval is not None  # per-prompt medians are there


def test_the_old_rule_set_ignores_the_samples(tmp_path):
    """Under rules.json the sample fields change nothing: the same scores as the same runs
    without them, and no interval keys."""
    plan, runs = _world_with_samples(tmp_path)
    plain = _samples_runs(tmp_path / "plain" / "tiny", samples=False)
    a = validate(plan, runs).to_dict()
    b = validate(plan, plain).to_dict()
    for d in (a, b):
        d["runs"] = None
        d["configurations"][0]["sources"] = None
    assert a == b
    assert "interval" not in a["configurations"][0]["rules"][0]
    assert "intervals" not in a["configurations"][0]["measured"]
    assert "decided" not in a["rules"][0]


# ------------------------------------------------------------------------------------------
# the committed prediction


def _record(runs: Path, plan: Path, profile: Path, *, plan_sha=None, profile_sha=None) -> Path:
    def sha(p):
        return hashlib.sha256(p.read_bytes()).hexdigest()

    rec = runs.parent / "runs_campaign.json"
    rec.write_text(
        json.dumps(
            {
                "protocol": "docs/runs-protocol-whole-pass.md",
                "predictions": {
                    runs.name: {
                        "plan": "predictions/plan.json",
                        "plan_sha256": plan_sha or sha(plan),
                        "profile": "predictions/profile.json",
                        "profile_sha256": profile_sha or sha(profile),
                    }
                },
            }
        )
    )
    return rec


def test_a_matching_prediction_is_scored_with_a_note(tmp_path):
    plan, runs = _world_with_samples(tmp_path)
    rec = _record(runs, plan, tmp_path / "profile.json")
    got = recorded_prediction(runs)
    assert got is not None and got.record == str(rec) and got.folder == "tiny"
    (c,) = validate(plan, runs, rules_path=str(RULES_WP)).configurations
    assert any(n.startswith("prediction checked: the plan and profile") for n in c.notes)
    # the folder above, given as --runs, checks the same record
    (c,) = validate(plan, runs.parent, rules_path=str(RULES_WP)).configurations
    assert any(n.startswith("prediction checked") for n in c.notes)


def test_a_further_version_recorded_before_the_runs_is_scored_and_an_unrecorded_one_is_not(
    tmp_path,
):
    """A second version (``also``) recorded beside the first is accepted with its own note;
    the first still is; a version recorded nowhere is refused."""

    def sha(p):
        return hashlib.sha256(p.read_bytes()).hexdigest()

    plan, runs = _world_with_samples(tmp_path)
    prof = tmp_path / "profile.json"
    rec = _record(runs, plan, prof, plan_sha="1" * 64, profile_sha="2" * 64)
    d = json.loads(rec.read_text())
    d["predictions"][runs.name]["also"] = [
        {"plan": "v2/plan.json", "plan_sha256": sha(plan), "profile_sha256": sha(prof)}
    ]
    rec.write_text(json.dumps(d))
    got = recorded_prediction(runs)
    assert got.also == ((sha(plan), sha(prof)),)
    (c,) = validate(plan, runs, rules_path=str(RULES_WP)).configurations
    assert any("further version 1" in n for n in c.notes)
    d["predictions"][runs.name]["also"][0]["plan_sha256"] = "3" * 64
    rec.write_text(json.dumps(d))
    with pytest.raises(InputError, match="recorded"):
        validate(plan, runs, rules_path=str(RULES_WP))
    d["predictions"][runs.name]["also"] = "v2"
    rec.write_text(json.dumps(d))
    with pytest.raises(InputError, match="also must be a list"):
        recorded_prediction(runs)


@pytest.mark.parametrize("which", ["plan", "profile"])
def test_a_prediction_that_is_not_the_recorded_one_exits_2_naming_the_file(tmp_path, capsys, which):
    plan, runs = _world_with_samples(tmp_path)
    prof = tmp_path / "profile.json"
    _record(runs, plan, prof, **{f"{which}_sha": "0" * 64})
    rc = main(
        [
            "validate",
            "--plan",
            str(plan),
            "--runs",
            str(runs),
            "--rules",
            str(RULES_WP),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len([line for line in err if "error" in line]) == 1
    named = plan if which == "plan" else prof
    assert err[-1].startswith("specmoe validate: error: ") and str(named) in err[-1]
    assert "0000000000000000" in err[-1] and "runs_campaign.json" in err[-1]
    assert not (tmp_path / "o" / "validation.json").exists()  # never a rescoring
    # the old rule set is refused the same way: the check is on the runs, not the rules
    assert main(["validate", "--plan", str(plan), "--runs", str(runs)]) == 2


def test_a_malformed_record_is_an_error_naming_it(tmp_path):
    plan, runs = _world_with_samples(tmp_path)
    (runs.parent / "runs_campaign.json").write_text(
        json.dumps({"predictions": {"tiny": {"plan_sha256": "xyz"}}})
    )
    with pytest.raises(InputError, match=r"runs_campaign\.json: predictions\.tiny\.plan_sha256"):
        validate(plan, runs)


# ------------------------------------------------------------------------------------------
# the committed CPU campaign scores as it was scored

CAMPAIGN = [
    ("results/cpu/plan/plan.json", "results/cpu", "results/cpu/validation"),
    (
        "results/cpu/plan-olmoe-dummy-4L",
        "results/cpu/olmoe-dummy-4L",
        "results/cpu/validation-olmoe-dummy-4L",
    ),
]


@pytest.mark.parametrize(("plan", "runs", "out"), CAMPAIGN)
def test_rescoring_the_committed_campaign_writes_the_committed_files(
    plan, runs, out, tmp_path, monkeypatch
):
    """docs/validation.md "Scoring the CPU campaign", re-run: validation.json and
    validation.txt byte for byte."""
    monkeypatch.chdir(ROOT)
    assert main(["validate", "--plan", plan, "--runs", runs, "--out", str(tmp_path)]) == 0
    for name in ("validation.json", "validation.txt"):
        assert (tmp_path / name).read_bytes() == (ROOT / out / name).read_bytes(), name


# ------------------------------------------------------------------------------------------
# figures and the report


def test_figures_and_report_show_every_version_with_intervals(tmp_path):
    from specmoe.report.html_sections import render_validation
    from specmoe.report.validate_figures import write_validation_figures

    plan, runs = _world_with_samples(tmp_path)
    v = validate(plan, runs, rules_path=str(RULES_WP))
    d = json.loads(json.dumps(v.to_dict()))
    a = write_validation_figures(v, tmp_path / "a")
    b = write_validation_figures(d, tmp_path / "b")
    names = [p.name for p in a]
    assert (
        names
        == [p.name for p in b]
        == [
            "validate_saving.png",
            "validate_kstar.png",
            "validate_verify.png",
            "validate_tau.png",
            "validate_loss.png",
        ]
    )
    assert all(p.read_bytes() == q.read_bytes() for p, q in zip(a, b))

    class Figs:  # the report's figure collector, reduced to what the section calls
        def __init__(self):
            self.claimed = set()

        def tag(self, p, name):
            return f"<img alt={name}>"

        def add_file(self, p):
            return p

    (tmp_path / "a" / "validation.json").write_text(json.dumps(d))
    page = render_validation(tmp_path / "a" / "validation.json", d, Figs())
    assert "decided (interval on one side)" in page and "whole-pass" in page
    assert page.count('class="none">undecided') + page.count('class="holds">decided') == sum(
        r.decided is not None for r in v.configurations[0].rules
    )
    for name in ("validate_tau.png", "validate_loss.png"):
        assert f"<img alt={name}>" in page
    (c,) = v.configurations
    lo, hi = c.versions["whole_pass"].intervals.metrics["verify_error"]
    assert f"[{100 * lo:.1f}%, {100 * hi:.1f}%]" in page
