"""Error bounds of Table 2 of paper 002 (Eqs. (17)-(21), (C.7)) under random bandwidth errors,
checked in exact arithmetic."""

from __future__ import annotations

import math
from fractions import Fraction as F

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specmoe.cost import bounds, theory
from specmoe.errors import InputError

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

pos = st.builds(F, st.integers(1, 200), st.integers(1, 9))
nonneg = st.builds(F, st.integers(0, 50), st.integers(1, 9))
eps_s = st.builds(F, st.integers(0, 45), st.just(100))  # eps in [0, 0.45]


def unit():
    return st.builds(F, st.integers(-100, 100), st.just(100))  # t in [-1, 1]


def tau(t0, D, bD, E, b, phi):
    """Eq. (5) in exact arithmetic (independent of the package)."""
    return t0 + D / bD + E / b + phi


@SETTINGS
@given(t0=nonneg, D=nonneg, bD=pos, E=nonneg, b=pos, phi=nonneg, eps=eps_s, tD=unit(), tE=unit())
def test_verify_time_bound_eq17(t0, D, bD, E, b, phi, eps, tD, tE):
    eD, eE = eps * tD, eps * tE
    true = tau(t0, D, bD, E, b, phi)
    est = tau(t0, D, bD * (1 + eD), E, b * (1 + eE), phi)
    M = D / bD + E / b
    bound = bounds.verify_time_bound(M, eps)
    assert isinstance(bound, F)
    assert abs(est - true) <= bound <= bounds.verify_time_bound(true, eps)
    # attained when every bandwidth is low by eps: the factor eps/(1 - eps) is sharp
    worst = tau(t0, D, bD * (1 - eps), E, b * (1 - eps), phi)
    assert worst - true == bound


@SETTINGS
@given(
    D=nonneg,
    bD=pos,
    Es=nonneg,
    bs=pos,
    Ed=nonneg,
    bd=pos,
    eps=eps_s,
    tD=unit(),
    ts=unit(),
    td=unit(),
    phi=nonneg,
)
def test_saving_bound_eq18(D, bD, Es, bs, Ed, bd, eps, tD, ts, td, phi):
    bD_hat = bD * (1 + eps * tD)  # one dense estimate for both kernels
    S = tau(0, D, bD, Es, bs, phi) - tau(0, D, bD, Ed, bd, phi)
    S_hat = tau(0, D, bD_hat, Es, bs * (1 + eps * ts), phi) - tau(
        0, D, bD_hat, Ed, bd * (1 + eps * td), phi
    )
    assert abs(S_hat - S) <= bounds.saving_bound(Es / bs, Ed / bd, eps)


@SETTINGS
@given(Es=pos, bs=pos, Ed=pos, bd=pos, eps=eps_s, ts=unit(), td=unit(), phi=nonneg)
def test_faster_kernel_margin_eq19(Es, bs, Ed, bd, eps, ts, td, phi):
    u_bar, r = Ed / Es, bd / bs  # x/y = u_bar/r with x, y the two expert times
    robust = bounds.kernel_decision_robust(u_bar, r, eps)
    if abs(math.log(float(r)) - math.log(float(u_bar))) > bounds.kernel_decision_margin(eps) + 1e-9:
        assert robust
    if robust:
        true_sign = (Ed / bd + phi) < (Es / bs + phi)
        est_sign = (Ed / (bd * (1 + eps * td)) + phi) < (Es / (bs * (1 + eps * ts)) + phi)
        assert true_sign == est_sign == (u_bar < r)


step_times = st.lists(pos, min_size=2, max_size=6)
deltas = st.builds(F, st.integers(0, 90), st.just(100))
acc = st.builds(F, st.integers(0, 99), st.just(100))


@SETTINGS
@given(V=step_times, delta=deltas, a=acc, data=st.data())
def test_best_length_and_speedup_bounds_eq20_eq21(V, delta, a, data):
    V_hat = [v * (1 + delta * data.draw(unit())) for v in V]
    k = theory.best_draft_length(V, a)
    k_hat = theory.best_draft_length(V_hat, a)
    T = theory.throughput(V, a)
    T_hat = theory.throughput(V_hat, a)
    loss = 1 - T[k_hat] / T[k]
    assert 0 <= loss <= bounds.throughput_loss_bound(delta)  # Eq. (20)
    if bounds.best_length_separated(T, delta):
        assert k_hat == k
    pred = T_hat[k_hat] / T_hat[0]
    true = T[k] / T[0]
    lo, hi = bounds.speedup_interval(pred, delta)  # Eq. (21)
    assert lo <= true <= hi
    assert theory.best_speedup(V_hat, a) == pred


@SETTINGS
@given(V=step_times, c=pos, a=acc)
def test_common_factor_keeps_best_length(V, c, a):
    assert theory.best_draft_length([v * c for v in V], a) == theory.best_draft_length(V, a)


@SETTINGS
@given(
    eps=st.builds(F, st.integers(0, 49), st.just(100)),
    parts=st.lists(
        st.tuples(nonneg, pos, nonneg, pos, nonneg, unit(), unit()), min_size=2, max_size=5
    ),
)
def test_delta_from_epsilon_c7(eps, parts):
    delta = bounds.delta_from_epsilon(eps)
    assert delta == eps / (1 - eps)
    assert bounds.speedup_factor(delta) == 1 / (1 - 2 * eps)
    for D, bD, E, b, h, tD, tE in parts:  # each V(k) = Eq. (5) + exact draft time h
        if D == 0 and E == 0 and h == 0:
            continue
        V = D / bD + E / b + h
        V_hat = D / (bD * (1 + eps * tD)) + E / (b * (1 + eps * tE)) + h
        assert (1 - delta) * V <= V_hat <= (1 + delta) * V


def test_input_checks():
    with pytest.raises(InputError, match="eps"):
        bounds.delta_from_epsilon(0.5)
    with pytest.raises(InputError, match="eps"):
        bounds.verify_time_bound(1.0, 1.0)
    with pytest.raises(InputError, match="delta"):
        bounds.speedup_interval(1.2, 1.0)
    with pytest.raises(InputError, match="memory_time"):
        bounds.verify_time_bound(-1.0, 0.1)
    assert bounds.kernel_decision_margin(0.0) == 0.0
    assert bounds.throughput_loss_bound(F(1, 9)) == F(1, 5)
    # Eq. (20) at delta >= 1 is vacuous but true: the bound reaches 1, a loss never exceeds 1
    assert bounds.throughput_loss_bound(1) == 1 and bounds.throughput_loss_bound(F(3)) == F(3, 2)
    with pytest.raises(InputError, match="delta"):
        bounds.throughput_loss_bound(-0.1)
    assert bounds.speedup_interval(F(2), F(1, 9)) == (F(8, 5), F(5, 2))


@SETTINGS
@given(
    eps=st.builds(F, st.integers(0, 45), st.just(100)),
    a=acc,
    parts=st.lists(
        st.tuples(nonneg, pos, pos, pos, nonneg, unit(), unit()), min_size=2, max_size=5
    ),
)
def test_bandwidth_errors_within_eps_keep_eq20_eq21(eps, a, parts):
    """V(k) from Eq. (5) plus an exact draft time, every bandwidth off by at most eps:
    the bounds (20) and (21) hold with delta = eps/(1 - eps) (Eq. (C.7))."""
    V = [D / bD + E / b + h for D, bD, E, b, h, _, _ in parts]
    V_hat = [
        D / (bD * (1 + eps * tD)) + E / (b * (1 + eps * tE)) + h for D, bD, E, b, h, tD, tE in parts
    ]
    delta = bounds.delta_from_epsilon(eps)
    k, k_hat = theory.best_draft_length(V, a), theory.best_draft_length(V_hat, a)
    T = theory.throughput(V, a)
    assert 1 - T[k_hat] / T[k] <= bounds.throughput_loss_bound(delta)
    lo, hi = bounds.speedup_interval(theory.best_speedup(V_hat, a), delta)
    assert lo <= theory.best_speedup(V, a) <= hi
