"""Speculation theory in any positive step time (paper 002 Sections 3.2-3.4, Appendix B).

A step drafts k in {0, ..., k_max} tokens and verifies k + 1; its time is V(k) > 0, given as a
sequence ``V = [V(0), ..., V(k_max)]``. Acceptance is geometric at rate a in [0, 1). Nothing here
assumes a shape of V beyond positivity unless a function says so (the convex form of Eq. (10)).

Exactness: every function accepts Python ``Fraction``s (and ints) as well as floats. With only
exact inputs it computes in Fractions and returns Fractions (throughputs, speedups, thresholds).
Draft lengths and decisions are always computed exactly, floats being converted to the rational
numbers they are. Step points are roots of polynomials (algebraic numbers in general) and are
returned as floats, correctly rounded by exact bisection (see :func:`crossing_acceptance`).

Legend: ``k`` draft length, ``k_max`` its maximum, ``G_a(k) = 1 + a + ... + a^k``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from specmoe.cost._exact import (
    Number,
    check_acceptance,
    check_draft_length,
    check_number,
    check_step_times,
    is_exact,
    out,
    to_fraction,
    unit_root,
)
from specmoe.errors import InputError

__all__ = [
    "Staircase",
    "best_draft_length",
    "best_speedup",
    "convex_reaches",
    "crossing_acceptance",
    "dedup_speedup",
    "expected_tokens",
    "first_threshold",
    "reuse_threshold",
    "reuse_threshold_bytes",
    "speeds_up",
    "speedup",
    "staircase",
    "step_points",
    "step_points_convex",
    "step_speedup",
    "throughput",
]


def _exact_inputs(*values: Number | Sequence[Number]) -> bool:
    for v in values:
        if isinstance(v, list | tuple):
            if not all(is_exact(x) for x in v):
                return False
        elif not is_exact(v):
            return False
    return True


def _G(a: Fraction, k: int) -> Fraction:
    """G_a(k) by Horner (exact on Fractions)."""
    g = Fraction(1)
    for _ in range(k):
        g = 1 + a * g
    return g


def expected_tokens(a: Number, k: int) -> Number:
    """G_a(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a): tokens emitted per step on average
    under geometric acceptance (paper 002 Section 1; Leviathan et al., 2023).

    The one definition of G_a(k) (paper 003's speedup model calls it too). Defined on the
    closed interval a in [0, 1]: G_1(k) = k + 1 (every draft accepted)."""
    a = _closed_acceptance(a)
    k = check_draft_length(k, 1 << 30)
    return out(_G(to_fraction(a), k), is_exact(a))


def _closed_acceptance(a: Number) -> Number:
    a = check_number(a, "a")
    if not 0 <= a <= 1:
        raise InputError(f"acceptance must lie in [0, 1], got {a!r}", argument="a")
    return a


def step_speedup(a: Number, k: int, *, plain: Number, step: Number) -> Number:
    """Eq. (9) of paper 002: T_a(k)/T_a(0) = G_a(k) V(0)/V(k), the speedup of drafting k tokens
    from the plain step time ``plain`` = V(0) > 0 and the step time ``step`` = V(k) > 0.

    Exact on Fractions, a float otherwise; a in [0, 1] as for :func:`expected_tokens`."""
    a = _closed_acceptance(a)
    k = check_draft_length(k, 1 << 30)
    v0, vk = check_number(plain, "plain"), check_number(step, "step")
    if not (v0 > 0 and vk > 0):
        raise InputError(f"step times must be positive, got {v0!r}, {vk!r}", argument="step")
    g = _G(to_fraction(a), k)  # exact: one rounding at the end
    return out(g * to_fraction(v0) / to_fraction(vk), _exact_inputs(a, v0, vk))


def throughput(V: Sequence[Number], a: Number) -> list[Number]:
    """T_a(k) = G_a(k) / V(k) for k = 0..k_max (paper 002 Section 1), in tokens per unit of V."""
    V = check_step_times(V)
    a = check_acceptance(a)
    exact = _exact_inputs(V, a)
    af = to_fraction(a)
    return [out(_G(af, k) / to_fraction(v), exact) for k, v in enumerate(V)]


def _best(Vf: list[Fraction], af: Fraction) -> int:
    best, g_best = 0, Fraction(1)
    g = Fraction(1)
    for k in range(1, len(Vf)):
        g = 1 + af * g
        if g * Vf[best] > g_best * Vf[k]:  # T(k) > T(best), strictly: the smallest maximiser
            best, g_best = k, g
    return best


def best_draft_length(V: Sequence[Number], a: Number) -> int:
    """k*(a): the smallest maximiser of T_a(k) over k = 0..k_max (paper 002 Section 1).

    Computed exactly: floats are compared as the rationals they are. A fast float pass decides
    when the two best throughputs are separated by more than 1e-12 relatively (float rounding in
    G/V is below 1e-14 here), and exact Fractions decide the rest.
    """
    V = check_step_times(V)
    a = check_acceptance(a)
    if not _exact_inputs(V, a):
        af, g, T = float(a), 1.0, []
        for k, v in enumerate(V):
            if k:
                g = 1.0 + af * g
            T.append(g / float(v))
        order = sorted(range(len(T)), key=lambda k: (-T[k], k))
        top, second = order[0], order[1]
        if T[top] - T[second] > 1e-12 * T[top]:
            return top
    return _best([to_fraction(v) for v in V], to_fraction(a))


def speedup(V: Sequence[Number], a: Number, k: int) -> Number:
    """T_a(k) / T_a(0) = G_a(k) V(0) / V(k) by Eq. (9) (:func:`step_speedup`)."""
    V = check_step_times(V)
    a = check_acceptance(a)
    k = check_draft_length(k, len(V) - 1)
    return step_speedup(a, k, plain=V[0], step=V[k])


def best_speedup(V: Sequence[Number], a: Number) -> Number:
    """T_a(k*(a)) / T_a(0): the speedup at the best draft length (1 when k*(a) = 0)."""
    return speedup(V, a, best_draft_length(V, a))


def speeds_up(V: Sequence[Number], a: Number, k: int) -> bool:
    """Eq. (8) of paper 002: T_a(k) > T_a(0) iff V(k) - V(0) < (a + ... + a^k) V(0).

    Decided exactly (Eq. (B.2))."""
    V = check_step_times(V)
    a = check_acceptance(a)
    k = check_draft_length(k, len(V) - 1)
    V0, Vk = to_fraction(V[0]), to_fraction(V[k])
    return Vk - V0 < (_G(to_fraction(a), k) - 1) * V0


def first_threshold(V: Sequence[Number]) -> Number:
    """Eq. (B.4) of paper 002: a0 = V(1)/V(0) - 1; one draft is faster than none exactly when
    a > a0.

    May lie outside [0, 1): below 0 one draft always pays, at 1 or above it never does."""
    V = check_step_times(V)
    return out(to_fraction(V[1]) / to_fraction(V[0]) - 1, _exact_inputs(V))


# ------------------------------------------------------------------------------------------
# The staircase (paper 002 Section 3.3, Appendix B.3)


def _alpha(Vf: list[Fraction], k: int, i: int) -> float:
    """alpha_{k,i} (exact logic, float root), for i < k."""
    Vi, Vk = Vf[i], Vf[k]
    if Vk <= Vi:  # T(k) > T(i) at every a > 0 (and at 0 when Vk < Vi)
        return 0.0
    if Vk * (i + 1) >= Vi * (k + 1):  # G(k)/G(i) < (k+1)/(i+1) <= V(k)/V(i) on [0, 1)
        return 1.0
    # p(a) = V(i) P_k(a) - V(k) P_i(a): negative at 0, positive at 1, one sign change (B.26).
    coeffs = [Vi - Vk] * (i + 1) + [Vi] * (k - i)
    return unit_root(coeffs)


def crossing_acceptance(V: Sequence[Number], k: int, i: int) -> float:
    """alpha_{k,i}: the infimum of the acceptances a in [0, 1) at which draft length k has a
    higher throughput than i < k, 1.0 when there is none (paper 002 Appendix B.3).

    By Eq. (B.27), T_a(k) > T_a(i) iff G_a(k)/G_a(i) > V(k)/V(i), and G_a(k)/G_a(i) rises
    strictly from 1 at a = 0 towards (k+1)/(i+1) as a -> 1 (Eq. (B.26)). So alpha is 0 when
    V(k) <= V(i), 1 when V(k)/V(i) >= (k+1)/(i+1), and otherwise the unique root in (0, 1) of
    V(i) P_k(a) - V(k) P_i(a), found by exact bisection and correctly rounded to a double. The set
    {a : T_a(k) > T_a(i)} is then (alpha, 1), or [0, 1) when V(k) < V(i).
    """
    V = check_step_times(V)
    k_max = len(V) - 1
    k = check_draft_length(k, k_max, "k")
    i = check_draft_length(i, k_max, "i")
    if not i < k:
        raise InputError(f"i: must be below k={k}, got {i}")
    return _alpha([to_fraction(v) for v in V], k, i)


def step_points(V: Sequence[Number]) -> list[float]:
    """Eq. (B.31) of paper 002: [a_1, ..., a_kmax], a_j the infimum of the acceptances at which
    k*(a) >= j, 1.0 where draft length j is never reached (Section 1).

    The max-min formula Eq. (B.31), a_j = max_{i<j} min_{k>=j} alpha_{k,i}, valid for every
    positive V (jumps of more than one length included: then a_j = a_{j+1}). k*(a) >= j for every
    a in (a_j, 1) and k*(a) < j for every a in [0, a_j). Each alpha is correctly rounded and
    rounding is monotone, so each a_j is the double nearest to the exact step point.
    """
    V = check_step_times(V)
    Vf = [to_fraction(v) for v in V]
    k_max = len(Vf) - 1
    alpha = {(k, i): _alpha(Vf, k, i) for k in range(1, k_max + 1) for i in range(k)}
    return [
        max(min(alpha[k, i] for k in range(j, k_max + 1)) for i in range(j))
        for j in range(1, k_max + 1)
    ]


def _increments(Vf: list[Fraction]) -> list[Fraction]:
    return [Vf[i] - Vf[i - 1] for i in range(1, len(Vf))]


def step_points_convex(V: Sequence[Number]) -> list[float]:
    """Eq. (B.36) of paper 002: the step points in the convex-increment form (the roots behind
    Eq. (10), :func:`convex_reaches`).

    Requires 0 <= c_1 <= c_2 <= ... with c_i = V(i) - V(i-1) (V convex and non-decreasing).
    Then a_1 = min(c_1/V(0), 1) and a_j = inf{a : h_j(a) > c_j/V(j-1)} with
    h_j(a) = a^j / G_a(j-1), which rises strictly from 0 towards 1/j: a_j = 0 when c_j = 0,
    1 when c_j/V(j-1) >= 1/j, else the root of V(j-1) a^j - c_j G_a(j-1) in (0, 1). Agrees with
    :func:`step_points` whenever the condition holds.
    """
    V = check_step_times(V)
    Vf = [to_fraction(v) for v in V]
    c = _increments(Vf)
    if c[0] < 0 or any(c[i] > c[i + 1] for i in range(len(c) - 1)):
        raise InputError(
            "V: the increments c_i = V(i) - V(i-1) are not 0 <= c_1 <= c_2 <= ...; "
            "use step_points (Eq. (B.31)) for a general V"
        )
    pts = []
    for j in range(1, len(Vf)):
        cj, Vprev = c[j - 1], Vf[j - 1]
        if cj == 0:
            pts.append(0.0)
        elif cj * j >= Vprev:
            pts.append(1.0)
        elif j == 1:
            pts.append(float(cj / Vprev))
        else:
            pts.append(unit_root([-cj] * j + [Vprev]))
    return pts


def convex_reaches(V: Sequence[Number], a: Number, j: int) -> bool:
    """Eq. (10) of paper 002: under 0 <= c_1 <= c_2 <= ..., k*(a) >= j iff
    a^j V(j-1) > G_a(j-1) c_j. Decided exactly; ``InputError`` if V is not convex
    non-decreasing."""
    V = check_step_times(V)
    a = check_acceptance(a)
    j = check_draft_length(j, len(V) - 1, "j")
    if j < 1:
        raise InputError("j: must be at least 1")
    Vf = [to_fraction(v) for v in V]
    c = _increments(Vf)
    if c[0] < 0 or any(c[i] > c[i + 1] for i in range(len(c) - 1)):
        raise InputError("V: the increments are not 0 <= c_1 <= c_2 <= ... (Eq. (10) needs it)")
    af = to_fraction(a)
    return af**j * Vf[j - 1] > _G(af, j - 1) * c[j - 1]


@dataclass(frozen=True)
class Staircase:
    """The best draft length against acceptance.

    ``step_points[j-1]`` is a_j (1.0: never reached); ``levels`` lists ``(a_from, a_to, k)``: k*(a) = k
    on the open interval (a_from, a_to) (zero-width levels, skipped by a jump, are left out);
    ``k_at_zero`` is k*(0). At a step point itself k*(a) is the lower level (the sets
    {a : k*(a) >= j} are open at their infimum, Appendix B.3), unless the step point is 0.
    """

    step_points: list[float]
    levels: list[tuple[float, float, int]]
    k_at_zero: int

    def best(self, a: float) -> int:
        """k*(a) read off the step points: the largest j with a_j < a (exact at non-step a)."""
        return max([0] + [j for j, p in enumerate(self.step_points, 1) if p < a])


def staircase(V: Sequence[Number]) -> Staircase:
    """The staircase a -> k*(a) from the step points by Eq. (B.31) (:func:`step_points`)."""
    pts = step_points(V)
    bounds = [0.0, *pts, 1.0]
    levels = [
        (bounds[j], bounds[j + 1], j) for j in range(len(bounds) - 1) if bounds[j] < bounds[j + 1]
    ]
    return Staircase(step_points=pts, levels=levels, k_at_zero=best_draft_length(V, 0))


# ------------------------------------------------------------------------------------------
# Deduplicating engines (paper 002 Section 3.4, Appendix B.2)


def reuse_threshold(
    a: Number,
    k: int,
    *,
    m: Number,
    W: Number,
    tau1: Number,
    bandwidth_k: Number,
    bandwidth_1: Number,
    dense_growth_bytes: Number = 0,
    dense_bandwidth: Number | None = None,
    fixed_work_growth: Number = 0,
) -> Number:
    """Eq. (14) of paper 002: rho*_k(a), the least byte-weighted mean reuse rho_bar_k at which
    draft length k is faster than plain decoding on a deduplicating engine (f_l = 1),

        rho*_k(a) = 1 - B_k/(m W k) [ (G_a(k) - 1) tau(1) - dD_k/beta_D - dphi_k ]
                      - (1/k) (B_k/beta(1) - 1),

    with ``bandwidth_k`` = B_k = beta_dedup(k+1), ``bandwidth_1`` = beta(1), ``tau1`` = tau(1),
    ``dense_growth_bytes`` = dD_k = D(k+1) - D(1) read at ``dense_bandwidth`` = beta_D, and
    ``fixed_work_growth`` = dphi_k = phi_dedup(k+1) - phi(1). A draft/host time h enters as fixed
    work: tau1 = V(0) = tau(1) + h(0) and dphi_k includes h(k) - h(0) (Appendix B.2).
    T_a(k) > T_a(0) iff rho_bar_k > rho*_k(a) (Eq. (B.14)). Any real value may come out: below 0
    the draft pays at any reuse, at 1 or above at none.
    """
    a = check_acceptance(a)
    if isinstance(k, bool) or not hasattr(k, "__index__") or int(k) < 1:
        raise InputError(f"k: draft length must be a positive integer, got {k!r}")
    k = int(k)
    vals = {
        name: check_number(v, name)
        for name, v in (
            ("m", m),
            ("W", W),
            ("tau1", tau1),
            ("bandwidth_k", bandwidth_k),
            ("bandwidth_1", bandwidth_1),
            ("dense_growth_bytes", dense_growth_bytes),
            ("fixed_work_growth", fixed_work_growth),
        )
    }
    for name in ("m", "W", "tau1", "bandwidth_k", "bandwidth_1"):
        if not vals[name] > 0:
            raise InputError(f"{name}: must be positive, got {vals[name]!r}")
    if dense_bandwidth is not None:
        vals["dense_bandwidth"] = check_number(dense_bandwidth, "dense_bandwidth")
        if not vals["dense_bandwidth"] > 0:
            raise InputError(f"dense_bandwidth: must be positive, got {dense_bandwidth!r}")
    elif vals["dense_growth_bytes"] != 0:
        raise InputError("dense_bandwidth: needed when dense_growth_bytes is not 0")
    exact = _exact_inputs(a, *vals.values())
    f = {n: to_fraction(v) for n, v in vals.items()}
    dense_time = f["dense_growth_bytes"] / f["dense_bandwidth"] if "dense_bandwidth" in f else 0
    Bk, mW = f["bandwidth_k"], f["m"] * f["W"]
    Y = (_G(to_fraction(a), k) - 1) * f["tau1"] - dense_time - f["fixed_work_growth"]
    rho = 1 - Bk / (mW * k) * Y - (Bk / f["bandwidth_1"] - 1) / k
    return out(rho, exact)


def reuse_threshold_bytes(
    a: Number, k: int, *, m: Number, W: Number, D: Number = 0, kv: Sequence[Number] | None = None
) -> Number:
    """Eq. (16) of paper 002: rho*_k(a) in bytes (Eq. (B.16)), one bandwidth for every byte and
    no fixed time,

        rho*_k(a) = 1 - [ (G_a(k) - 1) V_dedup(0) - (kv(k) - kv(0)) ] / (m W k),

    with V_dedup(0) = D + m W + kv(0), the bytes of a plain step. ``kv`` is [kv(0), ..., kv(k)]
    (key-value bytes of a step verifying j + 1 tokens), zero when omitted.
    """
    a = check_acceptance(a)
    if isinstance(k, bool) or not hasattr(k, "__index__") or int(k) < 1:
        raise InputError(f"k: draft length must be a positive integer, got {k!r}")
    k = int(k)
    m, W, D = (check_number(v, n) for v, n in ((m, "m"), (W, "W"), (D, "D")))
    if not (m > 0 and W > 0 and D >= 0):
        raise InputError(f"m, W, D: need m > 0, W > 0, D >= 0, got {m!r}, {W!r}, {D!r}")
    if kv is None:
        kv0, kvk = 0, 0
    else:
        kv = [check_number(x, f"kv[{j}]") for j, x in enumerate(kv)]
        if len(kv) <= k:
            raise InputError(f"kv: needs kv(0..{k}), got {len(kv)} value(s)")
        kv0, kvk = kv[0], kv[k]
    exact = _exact_inputs(a, m, W, D, kv0, kvk)
    mW = to_fraction(m) * to_fraction(W)
    V0 = to_fraction(D) + mW + to_fraction(kv0)
    rho = 1 - ((_G(to_fraction(a), k) - 1) * V0 - (to_fraction(kvk) - to_fraction(kv0))) / (mW * k)
    return out(rho, exact)


def dedup_speedup(
    a: Number,
    k: int,
    *,
    tau1: Number,
    dedup_bytes: Number,
    m: Number,
    W: Number,
    bandwidth_k: Number,
    bandwidth_1: Number,
    dense_growth_bytes: Number = 0,
    dense_bandwidth: Number | None = None,
    fixed_work_growth: Number = 0,
) -> Number:
    """Eq. (15) of paper 002: T_a(k)/T_a(0) on a deduplicating engine,

        G_a(k) V(0) / ( V(0) + dD_k/beta_D + dphi_k + E_dedup(k+1)/B_k - m W/beta(1) ),

    with V(0) = ``tau1`` and ``dedup_bytes`` = E_dedup(k+1), the union bytes from routing alone.
    """
    a = check_acceptance(a)
    k = check_draft_length(k, 1 << 30)
    vals = [
        check_number(v, n)
        for v, n in (
            (tau1, "tau1"),
            (dedup_bytes, "dedup_bytes"),
            (m, "m"),
            (W, "W"),
            (bandwidth_k, "bandwidth_k"),
            (bandwidth_1, "bandwidth_1"),
            (dense_growth_bytes, "dense_growth_bytes"),
            (fixed_work_growth, "fixed_work_growth"),
        )
    ]
    if dense_bandwidth is not None:
        vals.append(check_number(dense_bandwidth, "dense_bandwidth"))
    tau1f, Ef, mf, Wf, Bk, B1, dD, dphi = (to_fraction(v) for v in vals[:8])
    if not (tau1f > 0 and Bk > 0 and B1 > 0):
        raise InputError("tau1, bandwidth_k, bandwidth_1: must be positive")
    dense_time = dD / to_fraction(vals[8]) if dense_bandwidth is not None else Fraction(0)
    Vk = tau1f + dense_time + dphi + Ef / Bk - mf * Wf / B1
    if not Vk > 0:
        raise InputError(f"the step time V({k}) of Eq. (13) is not positive ({float(Vk)!r})")
    return out(_G(to_fraction(a), k) * tau1f / Vk, _exact_inputs(a, *vals))
