"""The acceptance estimators of ``specmoe.oracle.acceptance`` against exact values, brute
force and simulation (fixed seeds): the truncated-geometric mean and its inverse, the geometric
MLE and its Wilson interval, the mean-length score interval, the per-position rates and the
geometric test, the Markov rates, and the coverage of the intervals."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from specmoe.errors import InputError
from specmoe.oracle.acceptance import (
    SpecRecord,
    estimate_acceptance,
    geometric_test,
    solve_truncated_geometric,
    truncated_geometric_mean,
    truncated_geometric_variance,
    wilson_interval,
)


def simulate_steps(rng, a, k, steps, drafted=None):
    """(drafted, accepted) of ``steps`` steps: draft i accepted with probability a[i] (a list of
    per-position rates, or one rate) given 1..i-1 accepted; ``drafted`` per step (default k)."""
    rates = np.broadcast_to(np.asarray(a, float), (k,))
    d = np.full(steps, k) if drafted is None else np.asarray(drafted)
    u = rng.random((steps, k))
    ok = u < rates[None, :]
    ok &= np.arange(k)[None, :] < d[:, None]
    run = np.cumprod(ok, axis=1).sum(axis=1)
    return d.astype(int), run.astype(int)


def per_step_record(d, j, k, label="r"):
    return SpecRecord(
        len(d),
        int(d.sum()),
        int(j.sum()),
        k,
        step_drafted=tuple(int(x) for x in d),
        step_accepted=tuple(int(x) for x in j),
        full=bool((d == k).all()),
        label=label,
    )


# --- the truncated geometric model ----------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 16])
def test_truncated_mean_is_the_exact_sum(k):
    for a in (Fraction(0), Fraction(1, 7), Fraction(1, 2), Fraction(9, 10), Fraction(1)):
        exact = sum(a**i for i in range(1, k + 1))
        assert truncated_geometric_mean(float(a), k) == pytest.approx(float(exact), rel=1e-14)


def test_truncated_variance_is_the_enumerated_variance():
    for k in (1, 3, 6):
        for a in (0.2, 0.55, 0.93):
            p = [a**j * (1 - a) for j in range(k)] + [a**k]  # P(j accepted), j = 0..k
            mean = sum(j * q for j, q in enumerate(p))
            var = sum((j - mean) ** 2 * q for j, q in enumerate(p))
            assert truncated_geometric_variance(a, k) == pytest.approx(var, rel=1e-12)


@pytest.mark.parametrize("k", [1, 2, 4, 7, 12])
def test_solving_the_mean_recovers_a(k):
    for a in np.linspace(0.0, 1.0, 41):
        mean = float(sum(Fraction(float(a)) ** i for i in range(1, k + 1)))
        assert abs(solve_truncated_geometric(mean, k) - a) < 1e-9, (a, k)


def test_solving_a_mean_outside_0_k_is_refused():
    with pytest.raises(InputError, match="mean"):
        solve_truncated_geometric(4.5, 4)


def test_real_length_lower_bound_by_jensen():
    # drafts of 2 and 6 tokens (mean 4): solving at the mean length gives less than a
    a = 0.8
    mean = (truncated_geometric_mean(a, 2) + truncated_geometric_mean(a, 6)) / 2
    assert solve_truncated_geometric(mean, 4.0) < a


# --- the geometric MLE, by brute force ------------------------------------------------------


def test_mle_maximises_the_likelihood_on_a_grid():
    rng = np.random.default_rng(1)
    d, j = simulate_steps(rng, 0.6, 5, 300)
    est = estimate_acceptance([per_step_record(d, j, 5)])
    grid = np.linspace(1e-4, 1 - 1e-4, 20001)
    # the likelihood of each step: a^j (1-a) for j < d, a^d for j = d
    s, f = j.sum(), (j < d).sum()
    best = grid[np.argmax(s * np.log(grid) + f * np.log1p(-grid))]
    assert est.method == "geometric-mle" and est.exact
    assert abs(est.rate - best) < 1e-4
    assert est.rate == s / (s + f)
    assert est.rejections == f and est.accepted == s and est.steps == 300


def test_wilson_interval_matches_its_formula():
    lo, hi = wilson_interval(30, 40)
    z, n, p = 1.959963984540054, 40, 0.75
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert (lo, hi) == pytest.approx((c - h, c + h), rel=1e-12)
    assert wilson_interval(10, 10)[1] == 1.0 and wilson_interval(0, 10)[0] == 0.0


# --- per position, by brute force -----------------------------------------------------------


def test_per_position_counts_are_the_brute_force_counts():
    rng = np.random.default_rng(2)
    k = 4
    d, j = simulate_steps(rng, 0.7, k, 200, drafted=rng.integers(1, k + 1, 200))
    est = estimate_acceptance([per_step_record(d, j, k)])
    for p in est.per_position:
        i = p.position
        trials = sum(1 for dd, jj in zip(d, j) if dd >= i and jj >= i - 1)
        acc = sum(1 for jj in j if jj >= i)
        assert (p.trials, p.accepted, p.exact) == (trials, acc, True)
    assert est.rejections == int((j < d).sum())


def test_geometric_test_statistic_by_hand():
    t, s = [100, 60, 30], [60, 30, 21]
    a = sum(s) / sum(t)
    lr = 2 * sum(
        si * math.log(si / ti / a) + (ti - si) * math.log((1 - si / ti) / (1 - a))
        for si, ti in zip(s, t)
    )
    g = geometric_test(t, s)
    assert g.df == 2 and g.statistic == pytest.approx(lr, rel=1e-12)
    assert g.p_value == pytest.approx(math.exp(-lr / 2), rel=1e-9)  # chi2 with 2 df


def test_geometric_test_holds_its_level_and_sees_falling_rates():
    rng = np.random.default_rng(3)
    rejected = 0
    runs = 300
    for _ in range(runs):
        d, j = simulate_steps(rng, 0.7, 4, 150)
        rejected += estimate_acceptance([per_step_record(d, j, 4)]).geometric_test.p_value < 0.05
    assert 0.02 <= rejected / runs <= 0.09
    d, j = simulate_steps(rng, [0.9, 0.6, 0.3, 0.2], 4, 500)
    assert estimate_acceptance([per_step_record(d, j, 4)]).geometric_test.p_value < 1e-6


# --- Markov rates ---------------------------------------------------------------------------


def test_markov_rates_are_the_policy_states_counted_by_hand():
    steps = [(3, 3), (3, 1), (3, 0), (2, 2), (3, 3), (0, 0), (3, 2)]
    rec = SpecRecord(
        7,
        sum(x for x, _ in steps),
        sum(y for _, y in steps),
        3,
        step_drafted=tuple(x for x, _ in steps),
        step_accepted=tuple(y for _, y in steps),
    )
    m = estimate_acceptance([rec]).markov
    # the first step has no state; after a full acceptance: (3,1) after (3,3), (3,3) after
    # (2,2) and, past the k = 0 step that leaves the state as it was, (3,2): S 6, F 2;
    # after a rejection: (3,0) after (3,1), (2,2) after (3,0): S 2, F 1
    assert m.after_accept == pytest.approx(6 / 8) and m.after_accept_steps == 3
    assert m.after_reject == pytest.approx(2 / 3) and m.after_reject_steps == 2


def test_markov_rates_find_runs_of_acceptance():
    rng = np.random.default_rng(4)
    k, hot_rate, cold_rate = 3, 0.9, 0.5
    d, j, state = [], [], "hot"
    for _ in range(3000):
        a = hot_rate if state == "hot" else cold_rate
        acc = 0
        while acc < k and rng.random() < a:
            acc += 1
        d.append(k)
        j.append(acc)
        state = "hot" if acc == k else "cold"
    m = estimate_acceptance([per_step_record(np.array(d), np.array(j), k)]).markov
    assert abs(m.after_accept - hot_rate) < 0.03 and abs(m.after_reject - cold_rate) < 0.03
    assert m.p_value < 1e-10


# --- aggregate counts -----------------------------------------------------------------------


def test_totals_only_solve_the_mean_length():
    rec = SpecRecord(400, 1600, 900, 4, full=True)
    est = estimate_acceptance([rec])
    assert est.method == "mean-length" and est.exact and est.rejections is None
    assert truncated_geometric_mean(est.rate, 4) == pytest.approx(900 / 400, rel=1e-12)
    lo, hi = est.interval
    assert lo < est.rate < hi


def test_short_drafts_without_per_step_give_a_lower_bound():
    rng = np.random.default_rng(5)
    k = 5
    d, j = simulate_steps(rng, 0.8, k, 2000, drafted=rng.integers(1, k + 1, 2000))
    exact = estimate_acceptance([per_step_record(d, j, k)])
    hist = np.bincount(j, minlength=k + 1)
    rec = SpecRecord(2000, int(d.sum()), int(j.sum()), k, histogram=tuple(hist.tolist()))
    est = estimate_acceptance([rec])
    assert not est.exact and est.rate < exact.rate
    assert est.per_position[0].exact and not est.per_position[1].exact
    assert est.per_position[0].rate == exact.per_position[0].rate  # position 1: every step
    assert all(p.rate <= q.rate + 1e-12 for p, q in zip(est.per_position, exact.per_position))
    assert est.geometric_test is None


def test_histogram_and_per_step_agree_when_every_step_drafts_k():
    rng = np.random.default_rng(6)
    d, j = simulate_steps(rng, 0.65, 4, 500)
    a = estimate_acceptance([per_step_record(d, j, 4)])
    hist = tuple(np.bincount(j, minlength=5).tolist())
    b = estimate_acceptance([SpecRecord(500, 2000, int(j.sum()), 4, histogram=hist)])
    assert (a.rate, a.interval, a.rejections) == (b.rate, b.interval, b.rejections)
    assert [(p.trials, p.accepted) for p in a.per_position] == [
        (p.trials, p.accepted) for p in b.per_position
    ]


def test_unknown_draft_length_is_refused_naming_k():
    with pytest.raises(InputError) as exc:
        estimate_acceptance([SpecRecord(None, 100, 60, None)])
    assert exc.value.argument == "k"
    est = estimate_acceptance([SpecRecord(None, 100, 60, None)], k=4)
    assert est.steps == 25 and est.method == "mean-length"
    with pytest.raises(InputError, match="whole steps"):
        estimate_acceptance([SpecRecord(None, 101, 60, None)], k=4)


def test_a_different_exact_k_is_refused():
    with pytest.raises(InputError, match="draft length is 4"):
        estimate_acceptance([SpecRecord(10, 40, 20, 4, histogram=(2, 2, 2, 2, 2))], k=3)


# --- coverage by simulation -----------------------------------------------------------------


def _coverage(make, a, runs, seed):
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(runs):
        lo, hi = make(rng).interval
        hits += lo <= a <= hi
    return hits / runs


@pytest.mark.parametrize(("a", "k", "steps"), [(0.7, 4, 150), (0.35, 3, 80), (0.92, 6, 60)])
def test_mle_interval_covers_about_95_percent(a, k, steps):
    cov = _coverage(
        lambda rng: estimate_acceptance([per_step_record(*simulate_steps(rng, a, k, steps), k)]),
        a,
        400,
        seed=7,
    )
    assert 0.92 <= cov <= 0.98, cov


@pytest.mark.parametrize(("a", "k", "steps"), [(0.7, 4, 150), (0.4, 2, 100)])
def test_mean_length_interval_covers_about_95_percent(a, k, steps):
    def make(rng):
        _, j = simulate_steps(rng, a, k, steps)
        return estimate_acceptance([SpecRecord(steps, k * steps, int(j.sum()), k, full=True)])

    cov = _coverage(make, a, 400, seed=8)
    assert 0.92 <= cov <= 0.98, cov


def test_request_clustered_interval_widens_with_heterogeneous_requests():
    rng = np.random.default_rng(9)
    recs = []
    for r, a in enumerate(rng.uniform(0.3, 0.95, 30)):
        d, j = simulate_steps(rng, a, 4, 60)
        recs.append(per_step_record(d, j, 4, label=f"r{r}"))
    est = estimate_acceptance(recs)
    lo, hi = est.interval
    clo, chi = est.interval_requests
    assert chi - clo > 2 * (hi - lo)
    assert clo < est.rate < chi and est.requests == 30


def test_steps_that_drafted_nothing_are_refused():
    rec = SpecRecord(3, 0, 0, 2, step_drafted=(0, 0, 0), step_accepted=(0, 0, 0))
    with pytest.raises(InputError, match="drafted anything"):
        estimate_acceptance([rec])
    with pytest.raises(InputError, match="drafted anything"):
        estimate_acceptance([SpecRecord(0, 0, 0, 2, full=True)])
