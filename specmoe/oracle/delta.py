"""Delta space (paper 000, Figure 3): rejected budgets relative to the Oracle's choice.

Legend for shapes: ``R`` recorded rounds, ``K`` the largest budget, ``P`` points (R·K).

At each recorded round start i the Oracle chose k*; every other budget k is a rejected
candidate at (ΔE[Cost], ΔE[a]) = (C(k, i) - C(k*, i), E[A | i, k] - E[A | i, k*]), with C the
cost the Oracle optimised and E[A | i, k] = sum_{d<=k} S(i, d).

Quadrants (x = ΔE[Cost], y = ΔE[a]): I x > 0, y > 0 (dearer, more progress: the risk zone);
II x < 0, y > 0; III x < 0, y < 0 (cheaper, less progress: the caution zone); IV x > 0, y < 0.
Points with x = 0 or y = 0 (for example budgets past the draft's matching run, which add cost
and no progress) are counted on the axes. II and IV are empty when cost and expected progress
both rise with k.

The boundary. If J were linear with slope -λ near i, the Oracle's optimality would read
ΔE[Cost] >= λ·ΔE[a] for every rejected candidate: a line through the origin of slope λ (in
cost per token), with quadrant I points above it (their extra tokens cost more than λ each)
and quadrant III points above it too (the time they save is worth less than the tokens they
lose). The line is fitted as the slope that leaves the fewest points below it: when the
points are separable that is an interval [max over III of x/y, min over I of x/y] and its
midpoint is reported (its finite end when only one side constrains it, as when the Oracle
never stops short of a matching run and quadrant I is empty); otherwise the midpoint of the
best interval, with the number of points left below. It is compared with the DP's marginal
value of a token at each round, λ_i = (J(i+1) - J(i+K+1)) / K.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DeltaSpace", "delta_space", "fit_boundary"]


@dataclass(frozen=True)
class DeltaSpace:
    d_cost: np.ndarray  # [P] ΔE[Cost] (ms)
    d_accept: np.ndarray  # [P] ΔE[a] (tokens)
    k: np.ndarray  # [P] the rejected budget
    k_star: np.ndarray  # [P] the Oracle's choice at that round
    quadrants: dict  # {"I": n, "II": n, "III": n, "IV": n, "axes": n, "origin": n}
    slope: float  # fitted boundary slope (ms per token)
    slope_interval: tuple[float, float]  # the slopes that leave the fewest points below
    violations: int  # points below the fitted line
    marginal_value: dict  # λ_i summary: mean, median, p10, p90 (ms per token)
    below_own_lambda: float  # share of points with ΔCost < λ_i·Δa (local condition broken)

    def summary(self) -> dict:
        return {
            "points": len(self.d_cost),
            "quadrants": self.quadrants,
            "slope": self.slope,
            "slope_interval": list(self.slope_interval),
            "violations": self.violations,
            "marginal_value": self.marginal_value,
            "below_own_lambda": self.below_own_lambda,
        }


def _quadrants(x: np.ndarray, y: np.ndarray, tol: float) -> dict:
    zx, zy = np.abs(x) <= tol, np.abs(y) <= tol
    on = zx | zy
    return {
        "I": int(((x > tol) & (y > tol)).sum()),
        "II": int(((x < -tol) & (y > tol)).sum()),
        "III": int(((x < -tol) & (y < -tol)).sum()),
        "IV": int(((x > tol) & (y < -tol)).sum()),
        "axes": int((on & ~(zx & zy)).sum()),
        "origin": int((zx & zy).sum()),
    }


def fit_boundary(
    d_cost: np.ndarray, d_accept: np.ndarray, *, tol: float = 1e-12
) -> tuple[float, tuple[float, float], int]:
    """The slope λ of the line ΔCost = λ·Δa through the origin leaving the fewest points
    strictly below it: -> (midpoint slope, (lo, hi) best interval, violations)."""
    x, y = np.asarray(d_cost, float), np.asarray(d_accept, float)
    # a point constrains λ only when Δa != 0: y > 0 needs λ <= x/y, y < 0 needs λ >= x/y
    fixed = int(((np.abs(y) <= tol) & (x < -tol)).sum())  # below every line
    up, lo = x[y > tol] / y[y > tol], x[y < -tol] / y[y < -tol]
    if not len(up) and not len(lo):
        return float("nan"), (float("nan"), float("nan")), fixed
    if not len(lo):
        return float(up.min()), (-np.inf, float(up.min())), fixed
    if not len(up):
        return float(lo.max()), (float(lo.max()), np.inf), fixed
    cand = np.unique(np.concatenate([up, lo]))
    edges = np.sort(np.concatenate([[-np.inf, np.inf], cand, (cand[:-1] + cand[1:]) / 2]))
    # violations at λ: #(up < λ) + #(lo > λ), piecewise constant between candidates
    viol = (
        np.searchsorted(np.sort(up), edges, side="left")
        + len(lo)
        - np.searchsorted(np.sort(lo), edges, side="right")
    )
    best = int(viol.min())
    first = int(np.argmax(viol == best))
    run = first + int(np.argmax(np.append(viol[first:] != best, True)))  # end of that run
    a, b = float(edges[first]), float(edges[run - 1])
    mid = b if np.isinf(a) else a if np.isinf(b) else (a + b) / 2
    return mid, (a, b), best + fixed


def delta_space(
    cost: np.ndarray,
    surv: np.ndarray,
    value: np.ndarray,
    policy: np.ndarray,
    round_gen: np.ndarray,
    round_start: np.ndarray,
    *,
    tol: float = 1e-9,
) -> DeltaSpace:
    """cost [G, n, K+1], surv [G, n, K+1], value [G, n+K+2], policy [G, n]; rounds [R]."""
    g, i = round_gen, round_start
    kp1 = cost.shape[2]
    c = cost[g, i]  # [R, K+1]
    ea = np.cumsum(surv[g, i], axis=1) - 1.0  # E[A | i, k]
    ks = policy[g, i].astype(np.int64)
    rows = np.arange(len(g))
    dc = c - c[rows, ks][:, None]
    da = ea - ea[rows, ks][:, None]
    rej = (np.arange(kp1)[None, :] != ks[:, None]) & np.isfinite(c)  # drafts it can make
    x, y = dc[rej], da[rej]
    kk = np.broadcast_to(np.arange(kp1), dc.shape)[rej]
    kstar = np.broadcast_to(ks[:, None], dc.shape)[rej]
    slope, interval, viol = fit_boundary(x, y, tol=tol)
    k_max = kp1 - 1
    lam = (value[g, i + 1] - value[g, np.minimum(i + k_max + 1, value.shape[1] - 1)]) / k_max
    lam_p = np.broadcast_to(lam[:, None], dc.shape)[rej]
    mv = (
        {
            "mean": float(lam.mean()),
            "median": float(np.median(lam)),
            "p10": float(np.percentile(lam, 10)),
            "p90": float(np.percentile(lam, 90)),
        }
        if len(lam)
        else {}
    )
    below = float(np.mean(x < lam_p * y - tol)) if len(x) else float("nan")
    return DeltaSpace(
        d_cost=x,
        d_accept=y,
        k=kk,
        k_star=kstar,
        quadrants=_quadrants(x, y, tol),
        slope=slope,
        slope_interval=interval,
        violations=viol,
        marginal_value=mv,
        below_own_lambda=below,
    )
