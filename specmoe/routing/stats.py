"""Routing statistics of a trace: reuse ρ_l(n), union U_l(n), overlap o_l(j), popularity p_{l,e}.

Legend for shapes: ``T`` tokens, ``L`` MoE layers, ``m`` experts per token, ``N`` experts,
``n`` window lengths 1..max_n (entry n−1), ``lags`` 1..max_lag (entry j−1), ``D`` documents.

:func:`compute_stats` streams a trace (in memory, a file or a shard directory) into
:class:`RoutingStats`: the estimators of paper 002 Eq. (1)-(3), (11) and Appendix D.2, the
uniform and independence baselines and the overlap decomposition of paper 003 Section 6 and
Appendix G, and document-bootstrap intervals. The window engine (bitsets, popcounts,
per-document sums) is :mod:`specmoe.routing.windows`; baselines are
:mod:`specmoe.routing.overlap`; intervals :mod:`specmoe.routing.bootstrap`.

Array-level functions for other modules (stable names): :func:`window_union_counts` and
:func:`window_reuse_counts` (per window of one document), :func:`reuse_and_union` (ρ̂, Û on an
array with optional document offsets), :func:`pair_overlap`, :func:`expert_popularity`,
:func:`u_bar_of`, :func:`rho_bar_of`, and the baselines :func:`uniform_union`,
:func:`uniform_reuse`, :func:`independent_union`, :func:`independent_overlap`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from specmoe.cost.bytes import mean_reuse
from specmoe.errors import InputError
from specmoe.routing.overlap import (
    OverlapDecomposition,
    decompose_overlap,
    independent_overlap,
    independent_union,
    uniform_overlap,
    uniform_reuse,
    uniform_union,
)
from specmoe.routing.windows import (
    DEFAULT_MAX_LAG,
    DocumentSums,
    _as_source,
    _infer_n,
    _pair_counts,
    _shard_sums,
    _window_counts,
    document_sums,
    identity_bound,
    identity_residual,
    longest_document,
    overlap_from_sums,
    rho_union_from_sums,
    token_bitsets,
    trim_lags,
    window_reuse_counts,
    window_union_counts,
)

if TYPE_CHECKING:
    from specmoe.routing.bootstrap import StatsIntervals

__all__ = [
    "DocumentSums",
    "OverlapDecomposition",
    "ReuseUnion",
    "RoutingStats",
    "compute_stats",
    "document_sums",
    "expert_popularity",
    "independent_overlap",
    "independent_union",
    "pair_overlap",
    "reuse_and_union",
    "rho_bar_of",
    "stats_from_sums",
    "token_bitsets",
    "u_bar_of",
    "uniform_overlap",
    "uniform_reuse",
    "uniform_union",
    "window_reuse_counts",
    "window_union_counts",
]

# ------------------------------------------------------------------------------------------
# array-level conveniences


@dataclass(frozen=True)
class ReuseUnion:
    """ρ̂ [L, n] and Û [L, n] (entry n−1), windows [n] per window length, and overlap [L, lags]."""

    rho: np.ndarray
    union: np.ndarray
    windows: np.ndarray
    overlap: np.ndarray


def _array_sums(
    experts: np.ndarray,
    doc_offsets,
    num_experts: int | None,
    *,
    max_n: int,
    max_lag: int,
    aligned: bool,
) -> DocumentSums:
    experts = np.asarray(experts)
    if experts.ndim != 3:
        raise InputError(f"must be [T, L, m], got shape {experts.shape}", argument="experts")
    T, L, m = experts.shape
    off = (
        np.array([0, T], np.int64)
        if doc_offsets is None
        else np.asarray(doc_offsets, dtype=np.int64)
    )
    if off.ndim != 1 or off.size < 2 or off[0] != 0 or off[-1] != T or np.any(np.diff(off) <= 0):
        raise InputError(f"must increase strictly from 0 to T={T}", argument="doc_offsets")
    if max_n < 1:
        raise InputError(f"must be >= 1, got {max_n}", argument="max_n")
    if max_lag < 0:
        raise InputError(f"must be >= 0, got {max_lag}", argument="max_lag")
    n_exp = _infer_n(experts, num_experts)
    part = _shard_sums(
        experts, off, n_exp, max_n=max_n, max_lag=max_lag, aligned=aligned, per_doc_counts=False
    )
    lens = np.diff(off)
    return DocumentSums(
        num_experts=n_exp,
        top_k=m,
        layers=list(range(L)),
        max_n=max_n,
        max_lag=max_lag,
        aligned=aligned,
        lengths=lens,
        reuse=part["reuse"],
        union=part["union"],
        windows=_window_counts(lens, max_n, aligned),
        overlap=part["overlap"],
        pairs=_pair_counts(lens, max_lag),
        expert_counts=part["counts"],
    )


def reuse_and_union(
    experts: np.ndarray,
    *,
    max_n: int,
    doc_offsets=None,
    num_experts: int | None = None,
    aligned: bool = False,
    max_lag: int = 0,
) -> ReuseUnion:
    """ρ̂_l(n) and Û_l(n) for n = 1..max_n on an array [T, L, m] (paper 002 Eq. (1), App. D.2).

    ``doc_offsets`` [D+1] splits the tokens into documents (default: one document); windows
    never cross a document edge. ``aligned=True`` uses the same window starts for every n, so
    that Eq. (2) holds exactly. ``max_lag`` > 0 also computes the pairwise overlap.
    """
    sums = _array_sums(
        experts, doc_offsets, num_experts, max_n=max_n, max_lag=max_lag, aligned=aligned
    )
    rho, union = rho_union_from_sums(sums)
    return ReuseUnion(
        rho=rho, union=union, windows=sums.windows.sum(axis=0), overlap=overlap_from_sums(sums)
    )


def pair_overlap(
    experts: np.ndarray, *, max_lag: int, doc_offsets=None, num_experts: int | None = None
) -> np.ndarray:
    """[L, lags] o_l(j) = E|S_t ∩ S_{t+j}| / m over pairs inside one document (paper 003 §6)."""
    sums = _array_sums(experts, doc_offsets, num_experts, max_n=1, max_lag=max_lag, aligned=False)
    return overlap_from_sums(sums)


def expert_popularity(experts: np.ndarray, num_experts: int) -> np.ndarray:
    """[L, N] p_{l,e}: share of tokens whose layer-l set holds expert e (rows sum to m)."""
    experts = np.asarray(experts)
    T, L, _ = experts.shape
    idx = (np.arange(L, dtype=np.intp) * num_experts)[None, :, None] + experts
    return np.bincount(idx.ravel(), minlength=L * num_experts).reshape(L, num_experts) / T


# ------------------------------------------------------------------------------------------
# the public result


@dataclass(frozen=True)
class RoutingStats:
    """Reuse, union, overlap and popularity of one trace; arrays are indexed [L, n] (entry n−1
    is window length n) and [L, lags] (entry j−1 is lag j).

    ``rho``/``union`` [L, n]: ρ̂_l(n), Û_l(n) (paper 002 Eq. (1), Appendix D.2); ``rho_mean``,
    ``union_mean`` [n]: their plain layer means; ``rho_bar`` [n−1]: ρ̄_k for k = 1..max_n−1,
    the byte-weighted mean reuse of k drafted tokens, (1/(kW)) Σ_{j=2}^{k+1} Σ_l w_l ρ_l(j)
    (Eq. (11)); ``u_bar`` [n]: ū(n) = E_dedup(n)/E_slot(n) = Σ_l w_l U_l(n) / (m n Σ_l w_l)
    (Section 2), with ``layer_weights`` w_l the bytes of one expert of each layer when a model
    spec is given (``weighted``) and ones otherwise. ``uniform_rho``, ``uniform_union`` [n]:
    1 − q^(n−1) and N(1 − q^n), q = 1 − m/N. ``union_independent`` [L, n]: Σ_e 1 − (1 − p_e)^n.
    ``identity_error``: max over l, n of |Û_l(n) − m Σ_{j≤n}(1 − ρ̂_l(j))| (Eq. (2));
    ``identity_bound``: the most that window edges allow (zero when ``aligned``).
    ``overlap`` [L, lags]: ô_l(j); ``overlap_independent`` [L, lags]: Σ_e p_{l,e}²/m (the same
    at every lag); ``overlap_uniform``: m/N; ``popularity`` [L, N]: p_{l,e};
    ``decomposition``: :class:`~specmoe.routing.overlap.OverlapDecomposition`;
    ``intervals``: :class:`~specmoe.routing.bootstrap.StatsIntervals` or None.
    """

    num_experts: int
    top_k: int
    num_layers: int
    layers: list[int]
    tokens: int
    documents: int
    max_n: int
    max_lag: int
    aligned: bool
    windows: np.ndarray
    pairs: np.ndarray
    rho: np.ndarray
    union: np.ndarray
    rho_mean: np.ndarray
    union_mean: np.ndarray
    rho_bar: np.ndarray
    u_bar: np.ndarray
    layer_weights: np.ndarray
    weighted: bool
    uniform_rho: np.ndarray
    uniform_union: np.ndarray
    union_independent: np.ndarray
    union_independent_mean: np.ndarray
    identity_error: float
    identity_bound: float
    overlap: np.ndarray
    overlap_mean: np.ndarray
    overlap_independent: np.ndarray
    overlap_uniform: float
    popularity: np.ndarray
    decomposition: OverlapDecomposition
    intervals: StatsIntervals | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict (NaN becomes None)."""
        from specmoe._io import to_jsonable

        return to_jsonable(self)


def u_bar_of(union: np.ndarray, weights: np.ndarray, top_k: int) -> np.ndarray:
    """[..., n] ū(n) = Σ_l w_l U_l(n) / (m n Σ_l w_l) from union [..., L, n] (paper 002 §2)."""
    w = np.asarray(weights, dtype=np.float64)
    n = np.arange(1, union.shape[-1] + 1)
    return np.tensordot(w, union, axes=([0], [-2])) / (top_k * n * w.sum())


def rho_bar_of(rho: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[n−1] ρ̄_k for k = 1..n−1 by Eq. (11) (:func:`specmoe.cost.bytes.mean_reuse`) from ρ̂_l(j)
    [L, n] and the layer weights w_l [L]; NaN from the first k whose pass of k + 1 tokens has
    no windows (ρ̂ is NaN there)."""
    r = np.asarray(rho, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    out = np.full(r.shape[-1] - 1, np.nan)
    finite = np.isfinite(r).all(axis=0)  # [n]: window lengths with windows
    k_ok = int(np.argmin(finite[1:])) if not finite[1:].all() else out.size
    for k in range(1, k_ok + 1):
        out[k - 1] = mean_reuse(w, r[:, : k_ok + 1], k)
    return out


def layer_weights_for(spec, sums_or_trace) -> np.ndarray:
    """[L] w_l from a ModelSpec that agrees with the trace's N, m and layers (else an
    ``InputError`` in the argument ``spec``)."""
    N, m, L = sums_or_trace.num_experts, sums_or_trace.top_k, sums_or_trace.num_layers
    if (spec.num_experts, spec.top_k) != (N, m):
        raise InputError(
            f"model {spec.name!r} has N={spec.num_experts}, m={spec.top_k} but "
            f"the trace has N={N}, m={m}",
            argument="spec",
        )
    w = np.asarray(spec.layer_expert_bytes, dtype=np.float64)
    if spec.num_moe_layers == L:
        return w
    pos = {layer: i for i, layer in enumerate(spec.moe_layer_indices)}
    layers = getattr(sums_or_trace, "layers", None)
    layers = list(sums_or_trace.meta.get("layers", range(L)) if layers is None else layers)
    if len(layers) == L and all(layer in pos for layer in layers):
        return w[[pos[layer] for layer in layers]]
    raise InputError(
        f"model {spec.name!r} has {spec.num_moe_layers} MoE layers but the trace "
        f"has {L} (layers {layers[:8]}{'...' if L > 8 else ''})",
        argument="spec",
    )


def stats_from_sums(sums: DocumentSums, *, spec=None) -> RoutingStats:
    """Every point estimate of :class:`RoutingStats` from per-document sums (no intervals)."""
    N, m, L = sums.num_experts, sums.top_k, sums.num_layers
    w = layer_weights_for(spec, sums) if spec is not None else np.ones(L)
    rho, union = rho_union_from_sums(sums)  # [L, n]
    popularity = sums.expert_counts / max(sums.tokens, 1)  # [L, N]
    u_unif = uniform_union(N, m, sums.max_n)
    u_ind = independent_union(popularity, sums.max_n)  # [L, n]
    ov = overlap_from_sums(sums)  # [L, lags]
    ov_ind = independent_overlap(popularity, m)  # [L]
    resid = identity_residual(rho, union, m)
    return RoutingStats(
        num_experts=N,
        top_k=m,
        num_layers=L,
        layers=list(sums.layers),
        tokens=sums.tokens,
        documents=sums.documents,
        max_n=sums.max_n,
        max_lag=sums.max_lag,
        aligned=sums.aligned,
        windows=sums.windows.sum(axis=0),
        pairs=sums.pairs.sum(axis=0),
        rho=rho,
        union=union,
        rho_mean=rho.mean(axis=0),
        union_mean=union.mean(axis=0),
        rho_bar=rho_bar_of(rho, w),
        u_bar=u_bar_of(union, w, m),
        layer_weights=w,
        weighted=spec is not None,
        uniform_rho=uniform_reuse(N, m, sums.max_n),
        uniform_union=u_unif,
        union_independent=u_ind,
        union_independent_mean=u_ind.mean(axis=0),
        identity_error=float(np.max(np.abs(resid))),
        identity_bound=float(np.max(identity_bound(sums.windows, m))),
        overlap=ov,
        overlap_mean=ov.mean(axis=0),
        overlap_independent=np.repeat(ov_ind[:, None], ov.shape[1], axis=1),
        overlap_uniform=uniform_overlap(N, m),
        popularity=popularity,
        decomposition=decompose_overlap(
            ov,
            ov_ind,
            uniform_overlap(N, m),
            union_mean=union.mean(axis=0),
            union_independent_mean=u_ind.mean(axis=0),
            union_uniform=u_unif,
        ),
    )


def compute_stats(
    trace_or_reader,
    *,
    max_n: int = 9,
    max_lag: int | None = None,
    spec=None,
    bootstrap: int = 0,
    seed: int = 0,
    aligned: bool = False,
    progress: Callable[[int, int], None] | None = None,
    executor=None,
) -> RoutingStats:
    """Reuse, union, overlap and popularity of a trace, streamed shard by shard.

    ``trace_or_reader``: a :class:`RoutingTrace`, a :class:`TraceReader` or a path.
    ``max_n``: longest window (at least one document must hold it). ``max_lag``: longest
    overlap lag; None means 16, cut to the longest document minus one. ``spec``: a ModelSpec
    whose w_l weight ū(n) and ρ̄_k (its N and m must match the trace). ``bootstrap``: number
    of document resamples for 95% percentile intervals (paper 002 Appendix D.2 uses 2000),
    drawn with ``seed``. ``aligned``: use the same window starts for every n (Eq. (2) exact).
    ``executor``: None computes the shards' sums in this process; an executor of
    :func:`specmoe.routing.shardmap.map_shards` (Ray tasks) computes them elsewhere, with the
    same sums bit for bit, hence the same statistics and intervals.
    A bad argument, or one the trace cannot meet, is an ``InputError`` naming it.
    """
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, int | np.integer) or bootstrap < 0:
        raise InputError(f"must be an integer >= 0, got {bootstrap!r}", argument="bootstrap")
    if max_lag is not None and (
        isinstance(max_lag, bool) or not isinstance(max_lag, int | np.integer) or max_lag < 1
    ):
        raise InputError(f"must be an integer >= 1, got {max_lag!r}", argument="max_lag")
    src = _as_source(trace_or_reader)
    name = getattr(src, "name", None) or str(getattr(src, "path", "trace"))
    if spec is not None:  # fail before the pass over the data
        layer_weights_for(spec, src)
    longest = longest_document(src)
    if (
        isinstance(max_n, int | np.integer)
        and longest is not None
        and max_n > longest
        and max_n >= 1
    ):
        raise InputError(
            f"{max_n} is longer than every document of {name} (longest: {longest} tokens)",
            argument="max_n",
        )
    if max_lag is not None and longest is not None and max_lag > longest - 1:
        raise InputError(
            f"{max_lag} leaves no pair of tokens inside a document of {name} "
            f"(longest: {longest} tokens)",
            argument="max_lag",
        )
    lag = DEFAULT_MAX_LAG if max_lag is None else max_lag
    if max_lag is None and longest is not None:
        lag = min(lag, longest - 1)
    sums = document_sums(
        src,
        max_n=max_n,
        max_lag=lag,
        aligned=aligned,
        per_document_counts=bootstrap > 0,
        pooled=bootstrap == 0,  # the bootstrap alone needs the rows of each document
        progress=progress,
        executor=executor,
    )
    longest = int(sums.lengths.max())
    if sums.windows[:, -1].sum() == 0:
        raise InputError(
            f"{max_n} is longer than every document of {name} (longest: {longest} tokens)"
            + (" with room for aligned windows" if aligned else ""),
            argument="max_n",
        )
    if max_lag is None:
        sums = trim_lags(sums, min(lag, longest - 1))
    elif max_lag > longest - 1:
        raise InputError(
            f"{max_lag} leaves no pair of tokens inside a document of {name} "
            f"(longest: {longest} tokens)",
            argument="max_lag",
        )
    stats = stats_from_sums(sums, spec=spec)
    if bootstrap:
        from specmoe.routing.bootstrap import bootstrap_intervals

        stats = replace(
            stats,
            intervals=bootstrap_intervals(
                sums, resamples=int(bootstrap), seed=seed, layer_weights=stats.layer_weights
            ),
        )
    return stats
