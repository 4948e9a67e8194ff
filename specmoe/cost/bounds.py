"""Error bounds of the predictions, Table 2 of paper 002 (Section 3.5, Appendix C).

Each bandwidth of the step time Eq. (5) is estimated as beta_hat = beta (1 + e) with |e| <= eps < 1
(one e per bandwidth), every other term exact. delta bounds the relative error of the full
predicted step time, (1 - delta) V(k) <= V_hat(k) <= (1 + delta) V(k).

Exact on Fractions (and ints), floats otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from specmoe.cost._exact import Number, check_number, is_exact, out, to_fraction
from specmoe.errors import InputError

__all__ = [
    "best_length_separated",
    "delta_from_epsilon",
    "kernel_decision_margin",
    "kernel_decision_robust",
    "relative_error_factor",
    "saving_bound",
    "speedup_factor",
    "speedup_interval",
    "throughput_loss_bound",
    "verify_time_bound",
]


def _eps(eps: Number, name: str = "eps", upper: Number = 1) -> Number:
    eps = check_number(eps, name)
    if not 0 <= eps < upper:
        raise InputError(f"{name}: bandwidth error must lie in [0, {upper}), got {eps!r}")
    return eps


def _delta(delta: Number, *, upper: bool = True) -> Number:
    delta = check_number(delta, "delta")
    if not (0 <= delta < 1 if upper else 0 <= delta):
        interval = "[0, 1)" if upper else "[0, inf)"
        raise InputError(f"step-time error must lie in {interval}, got {delta!r}", argument="delta")
    return delta


def relative_error_factor(eps: Number) -> Number:
    """Eq. (C.1) of paper 002: eps / (1 - eps), the largest relative move of one memory term
    M/beta when beta is off by a factor (1 + e), |e| <= eps < 1."""
    eps = _eps(eps)
    return out(to_fraction(eps) / (1 - to_fraction(eps)), is_exact(eps))


def delta_from_epsilon(eps: Number) -> Number:
    """Eq. (C.7) of paper 002: delta = eps / (1 - eps), the step-time error that bandwidth errors
    alone cause.

    Needs eps < 1/2 so that delta < 1 (the bounds (20) and (21) need 1 - delta > 0)."""
    eps = _eps(eps, upper=Fraction(1, 2))
    return relative_error_factor(eps)


def verify_time_bound(memory_time: Number | np.ndarray, eps: Number):
    """Eq. (17) of paper 002: |tau_hat_p(n) - tau_p(n)| <= eps/(1 - eps) M_p(n) <= eps/(1 - eps) tau_p(n),
    with M_p(n) = D(n)/beta_D + E_p(n)/beta_p(n) the memory part of the verify time."""
    f = relative_error_factor(eps)
    return _scale(memory_time, f, "memory_time")


def saving_bound(expert_slot: Number | np.ndarray, expert_dedup: Number | np.ndarray, eps: Number):
    """Eq. (18) of paper 002: |S_hat(n) - S(n)| <= eps/(1 - eps) (M^e_slot(n) + M^e_dedup(n)), with
    M^e_p(n) = E_p(n)/beta_p(n) the expert part of each kernel's verify time."""
    f = relative_error_factor(eps)
    if isinstance(expert_slot, np.ndarray) or isinstance(expert_dedup, np.ndarray):
        return _scale(np.asarray(expert_slot) + np.asarray(expert_dedup), f, "expert time")
    a = check_number(expert_slot, "expert_slot")
    b = check_number(expert_dedup, "expert_dedup")
    if a < 0 or b < 0:
        raise InputError("expert_slot, expert_dedup: expert times must be non-negative")
    return out(
        (to_fraction(a) + to_fraction(b)) * to_fraction(f),
        is_exact(a) and is_exact(b) and is_exact(f),
    )


def _scale(x, f: Number, name: str):
    if isinstance(x, np.ndarray):
        if np.any(x < 0):
            raise InputError(f"{name}: must be non-negative")
        return x * float(f)
    x = check_number(x, name)
    if x < 0:
        raise InputError(f"{name}: must be non-negative, got {x!r}")
    return out(to_fraction(x) * to_fraction(f), is_exact(x) and is_exact(f))


def kernel_decision_margin(eps: Number) -> float:
    """ln((1 + eps)/(1 - eps)): the margin of Eq. (19)."""
    eps = _eps(eps)
    return math.log((1 + float(eps)) / (1 - float(eps)))


def kernel_decision_robust(u_bar: Number, r: Number, eps: Number) -> bool:
    """Eq. (19) of paper 002: with f_l = 1 and equal fixed work, the predicted and the true times order the
    two kernels alike (both sides of Eq. (7) agree) when |ln r(n) - ln u_bar(n)| exceeds
    ln((1 + eps)/(1 - eps)). Decided exactly on Fractions: (1 - eps) max > (1 + eps) min
    for the ratio r/u_bar, i.e. r/u_bar > (1+eps)/(1-eps) or u_bar/r > (1+eps)/(1-eps)."""
    u = check_number(u_bar, "u_bar")
    r = check_number(r, "r")
    if not (u > 0 and r > 0):
        raise InputError(f"u_bar, r: must be positive, got {u!r}, {r!r}")
    e = to_fraction(_eps(eps))
    uf, rf = to_fraction(u), to_fraction(r)
    hi, lo = max(uf, rf), min(uf, rf)
    return hi * (1 - e) > lo * (1 + e)


def throughput_loss_bound(delta: Number) -> Number:
    """Eq. (20) of paper 002: drafting the predicted best length loses at most
    2 delta/(1 + delta) of the best throughput, T_a(k_hat*) >= (1 - delta)/(1 + delta) T_a(k*).

    Any delta >= 0 is accepted: at delta >= 1 the bound is at least 1, true and vacuous (a loss
    is a share of the best throughput), so a scorer can report it for any step-time error."""
    d = _delta(delta, upper=False)
    df = to_fraction(d)
    return out(2 * df / (1 + df), is_exact(d))


def best_length_separated(T: Sequence[Number], delta: Number) -> bool:
    """The separation condition of Eq. (20): (1 + delta)/(1 - delta) T_a(i) < T_a(k*) for every
    i != k*; when it holds, k_hat* = k* (the prediction finds the best length exactly)."""
    d = to_fraction(_delta(delta))
    Tf = [to_fraction(check_number(t, f"T[{i}]")) for i, t in enumerate(T)]
    if len(Tf) < 2:
        return True
    best = max(range(len(Tf)), key=lambda i: (Tf[i], -i))
    return all((1 + d) * Tf[i] < (1 - d) * Tf[best] for i in range(len(Tf)) if i != best)


def speedup_factor(delta: Number) -> Number:
    """(1 + delta)/(1 - delta), the factor of Eq. (21); with delta = eps/(1 - eps) it equals
    1/(1 - 2 eps) (Eq. (C.7)), 1.25 at eps = 0.1."""
    d = _delta(delta)
    df = to_fraction(d)
    return out((1 + df) / (1 - df), is_exact(d))


def speedup_interval(predicted: Number, delta: Number) -> tuple[Number, Number]:
    """Eq. (21) of paper 002: (1 - delta)/(1 + delta) <= [T_hat(k_hat*)/T_hat(0)] / [T(k*)/T(0)]
    <= (1 + delta)/(1 - delta). Returns the interval that holds the true best speedup given the
    predicted one: [predicted (1 - delta)/(1 + delta), predicted (1 + delta)/(1 - delta)]."""
    p = check_number(predicted, "predicted")
    if not p > 0:
        raise InputError(f"predicted: speedup must be positive, got {p!r}")
    f = speedup_factor(delta)
    exact = is_exact(p) and is_exact(f)
    pf, ff = to_fraction(p), to_fraction(f)
    return out(pf / ff, exact), out(pf * ff, exact)
