"""Document-bootstrap intervals of the routing statistics (paper 002 Appendix D.2).

Legend for shapes: ``B`` resamples, ``D`` documents, ``L`` MoE layers, ``N`` experts,
``n`` window lengths 1..max_n, ``lags`` 1..max_lag.

A resample draws D documents with replacement; document d then appears c_d times, with
(c_1, ..., c_D) ~ Multinomial(D, 1/D). Every statistic is a ratio of per-document sums
(:class:`~specmoe.routing.windows.DocumentSums`), so a resample's statistic is the same ratio
of the c-weighted sums: a block of resamples is one matrix product C [B, D] @ sums [D, ...].
The interval is the percentile interval of the B resampled statistics (the paper: 2000
resamples, 95%). With all c_d = 1 the formulas give the point estimates.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np

from specmoe.errors import InputError
from specmoe.routing.windows import DocumentSums

__all__ = ["Interval", "StatsIntervals", "bootstrap_intervals", "resampled_statistics"]

_BLOCK = 250


@dataclass(frozen=True)
class Interval:
    """Percentile interval: ``lo`` and ``hi`` have the shape of the statistic."""

    lo: np.ndarray
    hi: np.ndarray


@dataclass(frozen=True)
class StatsIntervals:
    """Bootstrap intervals of the layer means and ū, ρ̄, per-layer overlap and the temporal share.

    ``rho_mean``, ``union_mean``, ``u_bar`` [n]; ``rho_bar`` [n−1]; ``overlap_mean``,
    ``temporal_share`` [lags]; ``overlap`` [L, lags]; ``overlap_independent_mean`` scalar
    interval of the layer mean of Σ_e p_e²/m.
    """

    level: float
    resamples: int
    seed: int
    rho_mean: Interval
    union_mean: Interval
    u_bar: Interval
    rho_bar: Interval
    overlap_mean: Interval
    overlap: Interval
    overlap_independent_mean: Interval
    temporal_share: Interval


def _div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num, den = np.broadcast_arrays(num, den)
    out = np.full(num.shape, np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def resampled_statistics(
    sums: DocumentSums, weights: np.ndarray, *, layer_weights: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """The statistics of :class:`StatsIntervals` for document weights ``weights`` [B, D].

    Returns arrays with a leading B axis. Needs ``sums.doc_expert_counts`` for the popularity
    terms (``overlap_independent_mean``, ``temporal_share``).
    """
    C = np.asarray(weights, dtype=np.float64)  # [B, D]
    B, D = C.shape
    L, m = sums.num_layers, sums.top_k
    w = np.ones(L) if layer_weights is None else np.asarray(layer_weights, np.float64)
    n = np.arange(1, sums.max_n + 1)
    win = C @ sums.windows  # [B, n]
    reuse = (C @ sums.reuse.reshape(D, -1)).reshape(B, L, -1)  # [B, L, n]
    union = (C @ sums.union.reshape(D, -1)).reshape(B, L, -1)
    rho = _div(reuse, m * win[:, None, :])
    uni = _div(union, win[:, None, :])
    per_j = np.einsum("l,bln->bn", w, rho) / w.sum()
    pairs = C @ sums.pairs  # [B, lags]
    ov = _div((C @ sums.overlap.reshape(D, -1)).reshape(B, L, -1), m * pairs[:, None, :])
    out = {
        "rho_mean": rho.mean(axis=1),
        "union_mean": uni.mean(axis=1),
        "u_bar": np.einsum("l,bln->bn", w, uni) / (m * n * w.sum()),
        "rho_bar": np.cumsum(per_j[:, 1:], axis=-1) / np.arange(1, sums.max_n),
        "overlap_mean": ov.mean(axis=1),
        "overlap": ov,
    }
    if sums.doc_expert_counts is not None:
        tokens = C @ np.asarray(sums.lengths, dtype=np.float64)  # [B]
        counts = (C @ sums.doc_expert_counts.reshape(D, -1)).reshape(B, L, -1)  # [B, L, N]
        p = _div(counts, tokens[:, None, None])
        ind = (p * p).sum(axis=-1).mean(axis=1) / m  # [B]
        uniform = m / sums.num_experts
        o_mean = out["overlap_mean"]
        out["overlap_independent_mean"] = ind
        out["temporal_share"] = _div(o_mean - ind[:, None], o_mean - uniform)
    return out


def bootstrap_intervals(
    sums: DocumentSums,
    *,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    layer_weights: np.ndarray | None = None,
) -> StatsIntervals:
    """Percentile intervals from ``resamples`` multinomial document resamples drawn with ``seed``.

    ``sums`` must hold per-document expert counts (``document_sums(...,
    per_document_counts=True)``). The same sums, seed and resamples give the same intervals.
    """
    if isinstance(resamples, bool) or not isinstance(resamples, int | np.integer) or resamples < 1:
        raise InputError(
            f"must be a positive number of resamples, got {resamples!r}", argument="resamples"
        )
    if not 0 < level < 1:
        raise InputError(f"must be in (0, 1), got {level}", argument="level")
    if sums.pooled or sums.doc_expert_counts is None:
        raise InputError(
            "the bootstrap needs per-document expert counts "
            "(document_sums(..., per_document_counts=True))",
            argument="sums",
        )
    rng = np.random.default_rng(seed)
    D = sums.documents
    f64 = {
        k: np.asarray(getattr(sums, k), dtype=np.float64)
        for k in ("lengths", "reuse", "union", "windows", "overlap", "pairs", "doc_expert_counts")
    }
    sums = replace(sums, **f64)  # converted once, not in every block's matrix products
    pvals = np.full(D, 1.0 / D)
    blocks: list[dict[str, np.ndarray]] = []
    for b0 in range(0, resamples, _BLOCK):
        b = min(_BLOCK, resamples - b0)
        C = rng.multinomial(D, pvals, size=b)  # [b, D]
        blocks.append(resampled_statistics(sums, C, layer_weights=layer_weights))
    q = 100 * np.array([(1 - level) / 2, (1 + level) / 2])

    def interval(key: str) -> Interval:
        vals = np.concatenate([blk[key] for blk in blocks])  # [B, ...]
        if vals.shape[1:] and vals.shape[-1] == 0:
            empty = np.zeros(vals.shape[1:])
            return Interval(lo=empty, hi=empty)
        with warnings.catch_warnings():  # all-NaN slices (no windows in a resample) stay NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            lo, hi = np.nanpercentile(vals, q, axis=0)
        return Interval(lo=lo, hi=hi)

    return StatsIntervals(
        level=float(level),
        resamples=int(resamples),
        seed=int(seed),
        rho_mean=interval("rho_mean"),
        union_mean=interval("union_mean"),
        u_bar=interval("u_bar"),
        rho_bar=interval("rho_bar"),
        overlap_mean=interval("overlap_mean"),
        overlap=interval("overlap"),
        overlap_independent_mean=interval("overlap_independent_mean"),
        temporal_share=interval("temporal_share"),
    )
