"""Baselines for reuse, union and pairwise overlap, and the three-level overlap decomposition.

Legend for shapes: ``L`` MoE layers, ``N`` experts, ``m`` experts per token, ``n`` window
lengths 1..max_n, ``j`` lags 1..max_lag.

Three levels of pairwise overlap o_l(j) = E|S_{l,t} ∩ S_{l,t+j}| / m (paper 003 Section 6 and
Appendix G):

- uniform: every token draws its m experts uniformly and independently, o = m/N;
- independence: every token draws its m experts independently with the layer's empirical
  popularity p_{l,e} = P(e ∈ S_{l,t}) (Σ_e p_{l,e} = m), so E|S ∩ S'| = Σ_e p_{l,e}², and
  o_ind = Σ_e p_{l,e}² / m (equal to m/N exactly when p is uniform);
- empirical: the measured o_l(j).

The popularity part of overlap is o_ind − m/N and the temporal part is o_l(j) − o_ind. Paper 003
reports the temporal part as a share of the overlap above the uniform baseline ("temporal overlap
accounts for 69-92% of total overlap", "most overlap beyond the uniform baseline"), so
``temporal_share = (o − o_ind) / (o − m/N)``; the ratio o / o_ind ("3.3x the independence
baseline") is reported beside it. The same three levels apply to the union of n tokens
(paper 003 Section 6.2): uniform N(1 − q^n), independent Σ_e 1 − (1 − p_e)^n, empirical U(n).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "OverlapDecomposition",
    "decompose_overlap",
    "independent_overlap",
    "independent_union",
    "uniform_overlap",
    "uniform_reuse",
    "uniform_union",
]


def uniform_union(num_experts: int, top_k: int, max_n: int) -> np.ndarray:
    """[n] Expected distinct experts of n independent uniform tokens, N(1 − q^n), q = 1 − m/N.

    MoESD's count, quoted in paper 002 Section 1; entry n−1 is window length n.
    """
    q = 1.0 - top_k / num_experts
    n = np.arange(1, max_n + 1)
    return num_experts * (1.0 - q**n)


def uniform_reuse(num_experts: int, top_k: int, max_n: int) -> np.ndarray:
    """[n] Reuse under independent uniform routing, ρ(n) = 1 − q^(n−1) (paper 002 after Eq. (2)).

    Entry n−1 is window length n; ρ(1) = 0.
    """
    q = 1.0 - top_k / num_experts
    n = np.arange(1, max_n + 1)
    return 1.0 - q ** (n - 1)


def uniform_overlap(num_experts: int, top_k: int) -> float:
    """Pairwise overlap of independent uniform tokens, m/N (paper 003 Section 6)."""
    return top_k / num_experts


def independent_overlap(popularity: np.ndarray, top_k: int) -> np.ndarray:
    """[L] Independence baseline of pairwise overlap, Σ_e p_{l,e}² / m (paper 003 Appendix G).

    ``popularity`` [L, N]: p_{l,e}, the share of tokens whose layer-l set holds expert e.
    """
    p = np.asarray(popularity, dtype=np.float64)
    return (p * p).sum(axis=-1) / top_k


def independent_union(popularity: np.ndarray, max_n: int) -> np.ndarray:
    """[L, n] Expected distinct experts of n tokens drawn independently with popularity p.

    Expert e is missed by one token with probability 1 − p_{l,e}, by n independent tokens with
    probability (1 − p_{l,e})^n, so U_ind(n) = Σ_e 1 − (1 − p_{l,e})^n. This is exact for any
    within-token dependence (only the marginals enter the expectation); with p = m/N it is
    N(1 − q^n).
    """
    p = np.asarray(popularity, dtype=np.float64)  # [L, N]
    n = np.arange(1, max_n + 1, dtype=np.float64)  # [n]
    miss = np.clip(1.0 - p, 0.0, 1.0)[:, None, :] ** n[None, :, None]  # [L, n, N]
    return (1.0 - miss).sum(axis=-1)


@dataclass(frozen=True)
class OverlapDecomposition:
    """Overlap split into a popularity part and a temporal part (paper 003 Section 6, App. G).

    Per layer: ``popularity_part`` [L] = o_ind − m/N; ``temporal_part`` [L, lags] = o − o_ind;
    ``temporal_share`` [L, lags] = (o − o_ind)/(o − m/N) (NaN where o = m/N); ``ratio``
    [L, lags] = o / o_ind. The ``mean_*`` fields apply the same formulas to the layer means
    of o and o_ind. Union savings (paper 003 Section 6.2), entry n−1 for window length n:
    ``union_popularity_saving`` [n] = 1 − Ū_ind(n)/U_unif(n), the share of the uniform union that
    popularity alone removes; ``union_temporal_saving`` [n] = 1 − Ū(n)/Ū_ind(n), the further
    share that temporal overlap removes beyond independence.
    """

    uniform: float
    popularity_part: np.ndarray
    temporal_part: np.ndarray
    temporal_share: np.ndarray
    ratio: np.ndarray
    mean_popularity_part: float
    mean_temporal_part: np.ndarray
    mean_temporal_share: np.ndarray
    mean_ratio: np.ndarray
    union_popularity_saving: np.ndarray
    union_temporal_saving: np.ndarray


def _share(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num, den = np.broadcast_arrays(np.asarray(num, float), np.asarray(den, float))
    out = np.full(num.shape, np.nan)
    ok = np.abs(den) > 1e-12
    np.divide(num, den, out=out, where=ok)
    return out


def decompose_overlap(
    overlap: np.ndarray,
    independent: np.ndarray,
    uniform: float,
    *,
    union_mean: np.ndarray,
    union_independent_mean: np.ndarray,
    union_uniform: np.ndarray,
) -> OverlapDecomposition:
    """Three-level decomposition of overlap and union (see :class:`OverlapDecomposition`).

    ``overlap`` [L, lags], ``independent`` [L]; the union arguments are [n] layer means.
    """
    o = np.asarray(overlap, dtype=np.float64)  # [L, lags]
    ind = np.asarray(independent, dtype=np.float64)[:, None]  # [L, 1]
    o_mean = o.mean(axis=0)  # [lags]
    ind_mean = float(ind.mean())
    return OverlapDecomposition(
        uniform=float(uniform),
        popularity_part=ind[:, 0] - uniform,
        temporal_part=o - ind,
        temporal_share=_share(o - ind, o - uniform),
        ratio=_share(o, np.broadcast_to(ind, o.shape)),
        mean_popularity_part=ind_mean - uniform,
        mean_temporal_part=o_mean - ind_mean,
        mean_temporal_share=_share(o_mean - ind_mean, o_mean - uniform),
        mean_ratio=_share(o_mean, np.full(o_mean.shape, ind_mean)),
        union_popularity_saving=1.0 - _share(union_independent_mean, union_uniform),
        union_temporal_saving=1.0 - _share(union_mean, union_independent_mean),
    )
