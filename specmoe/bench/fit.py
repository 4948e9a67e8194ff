"""Fits and summaries of expert-operation timings (paper 002 Section 2, Appendix E), numpy only.

Legend: ``n`` tokens per pass, ``m`` slots, ``U`` distinct experts of the pass, ``b`` bytes of
one expert of the timed layer, ``t`` the median time of one pass over repetitions (s).

* Per-slot kernel, Eq. (4) of paper 002: ``t = t_op + c_u·U·b + c_re·(nm − U)·b``; the re-read
  cost ``c_re / c_u`` is 1 when a repeated slot is read again from memory and near 0 when an
  on-chip cache serves it.
* Deduplicating kernel, Eq. (E.1): ``t = t_op + c_g·U·b + c_t·n``.

Both are fitted by ordinary least squares on the passes with chosen ids at n = 2..n_max, and
scored on windows of recorded routing that they did not see: ``ε`` is the median relative error
``|t̂ − t| / t`` (Section 4 of paper 002 takes the median over windows, then over layers).

Effective bandwidths (Section 2, Table 1): over recorded windows, with times and bytes summed
over layers and windows, ``β_slot(n) = Σ n·m·b / Σ t_slot``, ``β_dedup(n) = Σ U·b / Σ t_dedup``,
``r(n) = β_dedup / β_slot`` and ``ū(n) = Σ U / Σ n·m`` (= E_dedup(n) / E_slot(n)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("per_slot", "dedup")
PARAMS = {"per_slot": ("t_op", "c_u", "c_re"), "dedup": ("t_op", "c_g", "c_t")}


def design(kind: str, n: np.ndarray, u: np.ndarray, m: int, b: float) -> np.ndarray:
    """Eqs. (4) and (E.1) of paper 002: the regressors [k, 3] of the per-slot time
    t_op + c_u U b + c_re (n m - U) b (``per_slot``) or the deduplicating time
    t_op + c_g U b + c_t n (``dedup``)."""
    n = np.asarray(n, dtype=float)
    u = np.asarray(u, dtype=float)
    if kind == "per_slot":
        return np.column_stack([np.ones_like(u), u * b, (n * m - u) * b])
    if kind == "dedup":
        return np.column_stack([np.ones_like(u), u * b, n])
    raise ValueError(f"kind: unknown {kind!r} (choose per_slot or dedup)")


@dataclass(frozen=True)
class TimeFit:
    """A least-squares fit by Eq. (4) or (E.1) (:func:`design`)."""

    kind: str
    coef: dict[str, float]  # t_op (s), c_u/c_re or c_g (s/byte), c_t (s/token)
    rank: int  # rank of the design matrix (3 = every constant identified)
    n_passes: int
    rms_rel: float  # root-mean-square relative residual on the fitted passes

    def predict(self, n: np.ndarray, u: np.ndarray, m: int, b: float) -> np.ndarray:
        beta = np.array([self.coef[p] for p in PARAMS[self.kind]])
        return design(self.kind, n, u, m, b) @ beta

    @property
    def reread_cost(self) -> float | None:
        """c_re / c_u (per-slot fits only; None when c_u is not positive)."""
        if self.kind != "per_slot" or not self.coef["c_u"] > 0:
            return None
        return self.coef["c_re"] / self.coef["c_u"]


def fit_time(
    kind: str, n: np.ndarray, u: np.ndarray, t: np.ndarray, *, m: int, b: float
) -> TimeFit:
    """Least squares by Eq. (4) (``kind="per_slot"``) or Eq. (E.1) (``"dedup"``), :func:`design`.

    Columns are scaled to unit norm before solving, so seconds, bytes and tokens, which differ
    by ten orders of magnitude, do not spoil the conditioning.
    """
    x = design(kind, n, u, m, b)
    t = np.asarray(t, dtype=float)
    if x.shape[0] != t.shape[0] or x.shape[0] == 0:
        raise ValueError(f"fit_time: {x.shape[0]} passes but {t.shape[0]} times")
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    sol, _, rank, _ = np.linalg.lstsq(x / scale, t, rcond=None)
    beta = sol / scale
    resid = (x @ beta - t) / t
    return TimeFit(
        kind=kind,
        coef=dict(zip(PARAMS[kind], map(float, beta))),
        rank=int(rank),
        n_passes=int(t.size),
        rms_rel=float(np.sqrt(np.mean(resid**2))),
    )


def relative_errors(
    fit: TimeFit, n: np.ndarray, u: np.ndarray, t: np.ndarray, *, m: int, b: float
) -> np.ndarray:
    """|t̂ − t| / t on each pass."""
    t = np.asarray(t, dtype=float)
    return np.abs(fit.predict(n, u, m, b) - t) / t


def bandwidths(
    n_values: list[int],
    n: np.ndarray,
    u: np.ndarray,
    t_slot: np.ndarray,
    t_dedup: np.ndarray,
    *,
    m: int,
    b: float,
) -> dict[str, list[float]]:
    """β_slot, β_dedup (B/s), r and ū at each n in ``n_values``, from per-window times.

    ``n``, ``u``, ``t_slot`` and ``t_dedup`` are per recorded window (any layers); sums run
    over the windows of each n, as in Table 1 of paper 002.
    """
    n, u = np.asarray(n), np.asarray(u, dtype=float)
    t_slot, t_dedup = np.asarray(t_slot, dtype=float), np.asarray(t_dedup, dtype=float)
    out: dict[str, list[float]] = {"beta_slot": [], "beta_dedup": [], "r": [], "u_bar": []}
    for k in n_values:
        sel = n == k
        if not sel.any():
            raise ValueError(f"bandwidths: no recorded window of n={k}")
        req = k * m * b * sel.sum()
        union = u[sel].sum() * b
        bs = req / t_slot[sel].sum()
        bd = union / t_dedup[sel].sum()
        out["beta_slot"].append(float(bs))
        out["beta_dedup"].append(float(bd))
        out["r"].append(float(bd / bs))
        out["u_bar"].append(float(union / req))
    return out


def crossover(n_values: list[int], saving: list[float]) -> int | None:
    """First n >= 2 from which the saving T_slot(n) - T_dedup(n) stays positive, or None: the
    crossover of :func:`specmoe.cost.step.crossover` at the benchmark's pass sizes."""
    from specmoe.cost.step import crossover as _crossover

    return _crossover(saving, n_values)
