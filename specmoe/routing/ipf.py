"""Maximum-entropy prediction of unique experts by iterative proportional fitting (paper 003).

Legend for shapes: ``B`` independent problems (experts, bins or layers batched together),
``n`` tokens in a window, ``P = 2**n`` activation patterns, ``L`` MoE layers, ``N`` experts,
``J`` lags, ``K`` popularity bins.

The model (paper 003 Section 6.3, Appendices K and L). Fix a layer and a window of n consecutive
tokens. Expert e's activation pattern is the binary vector x = (x_1, ..., x_n), x_i = 1 when e
is among the token at position i's m experts. Its law P_e on the 2^n patterns is taken to be the
distribution of largest entropy that meets

* the marginals   P_e(x_i = 1) = p_e                   for every position i, and
* the pairs       P_e(x_i = 1, x_{i+j} = 1) = c_e(j)   for every pair at lag j = 1..n-1,

that is, every 2x2 pairwise table of (x_i, x_k) is fixed: cells (1,1) = c, (1,0) = (0,1) = p − c,
(0,0) = 1 − 2p + c. The constraints are position-independent (a stationary process). The
solution is the Boltzmann distribution P(x) ∝ exp(Σ_i h_i x_i + Σ_{i<k} J_ik x_i x_k); IPF finds
it by cycling through the n(n−1)/2 pairwise tables, each step rescaling the four cells of one
table to their targets (Deming–Stephan IPF, which converges to the I-projection of the uniform
starting table onto the constraint set, i.e. the maximum-entropy solution, whenever a positive
solution exists). The predicted union is Û(n) = Σ_e P_e(x ≠ 0) = Σ_e (1 − P_e(0, ..., 0)).

Two variants:

* ``uniform``: every expert has p = m/N and c(j) = m·o(j)/N, with o(j) = E|S_t ∩ S_{t+j}|/m the
  layer's measured overlap at lag j; Û(n) = N (1 − P(0)).
* ``skewed``: per layer the experts are sorted by measured popularity and split into K bins of
  (nearly) equal size; bin b uses its mean popularity p_b and its mean measured co-activation
  c_b(j) = mean_e P(e ∈ S_t ∩ S_{t+j}); Û(n) = Σ_b |b| (1 − P_b(0)).

Pooling. ``trace`` (the paper's method): one set of statistics, hence one stationary law, for
the whole fit trace. ``documents`` (our extension, :func:`fit_document_moments`): every fit
document gets its own laws and the prediction is their mean weighted by each document's windows
of n tokens. The second keeps routing that stays in one regime for a whole document (pairwise
overlap that hardly decays with the lag, as in randomly initialised models), which a single
pairwise law spreads over too many experts at long windows.

The statistics are measured inside documents: popularity p_e = P(e ∈ S_t) over all tokens, and
co-activation c_e(j) = P(e ∈ S_t ∩ S_{t+j}) over the pairs (t, t+j) of one document.

Baselines (paper 002 Section 1; paper 003 Section 6.2): independent uniform routing N(1 − q^n)
with q = 1 − m/N (Huang et al.), and independent routing with measured popularity
Σ_e (1 − (1 − p_e)^n).

Failure to converge and infeasible constraints are statuses of the result, not exceptions.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specmoe._io import atomic_write_json
from specmoe.errors import InputError
from specmoe.formats.trace import RoutingTrace, TraceReader
from specmoe.routing.overlap import independent_union, uniform_union
from specmoe.routing.shardmap import map_shards
from specmoe.routing.stats import compute_stats, token_bitsets

__all__ = [
    "STATUS_CONVERGED",
    "STATUS_INFEASIBLE",
    "STATUS_NOT_CONVERGED",
    "ExpertMoments",
    "IPFSolution",
    "UnionPrediction",
    "bin_experts",
    "check_ipf_cost",
    "check_popularity",
    "coactivation_counts",
    "fit_document_moments",
    "fit_moments",
    "ipf_cost",
    "ipf_pairwise",
    "load_moments",
    "pattern_bits",
    "predict_union",
    "save_moments",
    "shard_coactivation",
    "shard_document_moments",
    "solve_windows",
    "stationary_moments",
]

STATUS_CONVERGED = "converged"
STATUS_NOT_CONVERGED = "not_converged"
STATUS_INFEASIBLE = "infeasible"
STATS_FORMAT = "specmoe-expert-moments"

# ------------------------------------------------------------------------------------------
# Measured statistics


@dataclass(frozen=True, eq=False)
class ExpertMoments:
    """First and lagged second moments of each expert's activation, per layer.

    popularity:   [L, N]    P(e ∈ S_t), summing to m over e.
    coactivation: [L, J, N] P(e ∈ S_t ∩ S_{t+j}) for lags j = 1..J (pairs inside a document).
    union:        [L, J+1] or None: measured U_l(n) for n = 1..J+1 (for reference only).
    """

    num_experts: int
    top_k: int
    popularity: np.ndarray
    coactivation: np.ndarray
    tokens: int = 0
    union: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        pop = np.asarray(self.popularity, dtype=np.float64)
        co = np.asarray(self.coactivation, dtype=np.float64)
        if pop.ndim != 2 or pop.shape[1] != self.num_experts:
            raise InputError(
                f"must be [L, N={self.num_experts}], got {pop.shape}", argument="popularity"
            )
        if co.ndim != 3 or co.shape[0] != pop.shape[0] or co.shape[2] != self.num_experts:
            raise InputError(
                f"must be [L={pop.shape[0]}, J, N={self.num_experts}], got {co.shape}",
                argument="coactivation",
            )
        if not 0 < self.top_k < self.num_experts:
            raise InputError(
                f"{self.top_k} must lie in 1..N-1 (N={self.num_experts})", argument="top_k"
            )
        if not (np.all(np.isfinite(pop)) and np.all(np.isfinite(co))):
            raise InputError("hold NaN or inf", argument="popularity/coactivation")
        # c_e(j) <= p_e need not hold exactly (pairs and tokens differ at document edges);
        # moments that no law meets show up as an IPF status, not here.
        if min(pop.min(), co.min()) < 0 or max(pop.max(), co.max()) > 1:
            raise InputError("out of range: must lie in [0, 1]", argument="popularity/coactivation")
        object.__setattr__(self, "popularity", pop)
        object.__setattr__(self, "coactivation", co)
        if self.union is not None:
            object.__setattr__(self, "union", np.asarray(self.union, dtype=np.float64))

    @property
    def num_layers(self) -> int:
        return int(self.popularity.shape[0])

    @property
    def max_lag(self) -> int:
        return int(self.coactivation.shape[1])

    @property
    def overlap(self) -> np.ndarray:
        """[L, J] o_l(j) = E|S_t ∩ S_{t+j}| / m."""
        return self.coactivation.sum(axis=2) / self.top_k

    def check_window(self, n: int, *, name: str = "max_n") -> None:
        """Windows of ``n`` tokens need lags 1..n-1; else an ``InputError`` whose argument is
        ``name`` (the caller's argument that gave ``n``)."""
        if n - 1 > self.max_lag:
            raise InputError(
                f"n={n} needs lags up to {n - 1}, but the statistics "
                f"cover lags 1..{self.max_lag} (n <= {self.max_lag + 1})",
                argument=name,
            )


def _doc_ids(offsets: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


def coactivation_counts(
    experts: np.ndarray, doc_offsets: np.ndarray, num_experts: int, *, max_lag: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-expert lagged co-activation counts of one trace array.

    experts: [T, L, m]. Returns counts [L, J, N], the number of t with e ∈ S_{l,t} ∩ S_{l,t+j}
    and t, t+j in the same document, and pairs [J], the number of such t.
    """
    ex = np.asarray(experts).astype(np.int64)
    T, L, _ = ex.shape
    N = int(num_experts)
    doc = _doc_ids(np.asarray(doc_offsets))
    words = token_bitsets(ex, N)  # [T, L, W] uint64
    word, bit = ex >> 6, (ex & 63).astype(np.uint64)  # [T, L, m]
    flat = ex + (np.arange(L) * N)[None, :, None]  # ids unique across layers
    counts = np.zeros((L, max_lag, N))
    pairs = np.zeros(max_lag)
    for j in range(1, min(max_lag, T - 1) + 1):
        valid = doc[:-j] == doc[j:]  # [T-j]
        pairs[j - 1] = valid.sum()
        later = np.take_along_axis(words[j:], word[:-j], axis=2)  # S_{t+j} word of each slot
        hit = ((later >> bit[:-j]) & np.uint64(1)).astype(bool) & valid[:, None, None]
        counts[:, j - 1] = np.bincount(flat[:-j][hit], minlength=L * N).reshape(L, N)
    return counts, pairs


def shard_coactivation(trace: RoutingTrace, *, max_lag: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`coactivation_counts` of one shard: counts [L, J, N] and pairs [J] (integers held
    in float64, exact below 2^53, so shards add up to the same totals in any grouping)."""
    return coactivation_counts(trace.experts, trace.doc_offsets, trace.num_experts, max_lag=max_lag)


def fit_moments(
    trace: RoutingTrace | TraceReader, *, max_lag: int = 8, executor=None
) -> ExpertMoments:
    """Measure popularity and per-expert lagged co-activation of a trace (file shards streamed).

    popularity[l, e] = #{t: e ∈ S_{l,t}} / T; coactivation[l, j-1, e] = #{t: e ∈ S_{l,t} ∩
    S_{l,t+j}} / #{t: t and t+j in the same document}, so Σ_e coactivation / m is the overlap
    o_l(j) of :func:`specmoe.routing.stats.compute_stats`, which also supplies the popularity
    and the measured union U_l(n), n = 1..max_lag+1, kept for reference. ``executor``: where
    the per-shard sums are computed (:func:`specmoe.routing.shardmap.map_shards`; None: here);
    the counts are integers, so the moments are the same either way.
    """
    _check_max_lag(max_lag)
    try:
        stats = compute_stats(trace, max_n=max_lag + 1, max_lag=max_lag, executor=executor)
    except InputError as exc:  # its max_n is ours + 1: both say the documents are too short
        if exc.argument not in ("max_n", "max_lag"):
            raise
        raise InputError(_too_short(trace, max_lag), argument="max_lag") from None
    counts = np.zeros((stats.num_layers, max_lag, stats.num_experts))
    pairs = np.zeros(max_lag)
    for c, p in map_shards(trace, shard_coactivation, executor=executor, max_lag=max_lag):
        counts += c
        pairs += p
    meta = {
        "layers": list(stats.layers),
        "source": str(getattr(trace, "path", getattr(trace, "name", "trace"))),
    }
    if getattr(trace, "meta", {}).get("model"):
        meta["model"] = trace.meta["model"]
    return ExpertMoments(
        num_experts=stats.num_experts,
        top_k=stats.top_k,
        popularity=stats.popularity,
        coactivation=counts / pairs[None, :, None],
        tokens=stats.tokens,
        union=stats.union,
        meta=meta,
    )


def shard_document_moments(trace: RoutingTrace, *, max_lag: int) -> list[ExpertMoments]:
    """:class:`ExpertMoments` of each document of one shard longer than ``max_lag`` tokens."""
    N, L = trace.num_experts, trace.num_layers
    names = trace.meta.get("documents") or []
    out: list[ExpertMoments] = []
    for d, (a, b) in enumerate(zip(trace.doc_offsets[:-1], trace.doc_offsets[1:])):
        if b - a <= max_lag:
            continue
        ex = trace.experts[a:b].astype(np.int64)
        flat = ex + (np.arange(L) * N)[None, :, None]
        pop = np.bincount(flat.ravel(), minlength=L * N).reshape(L, N) / (b - a)
        counts, pairs = coactivation_counts(ex, np.array([0, b - a]), N, max_lag=max_lag)
        meta = {"document": names[d] if d < len(names) else int(d)}
        out.append(
            ExpertMoments(
                num_experts=N,
                top_k=trace.top_k,
                popularity=pop,
                coactivation=counts / pairs[None, :, None],
                tokens=int(b - a),
                meta=meta,
            )
        )
    return out


def fit_document_moments(
    trace: RoutingTrace | TraceReader, *, max_lag: int = 8, executor=None
) -> list[ExpertMoments]:
    """The statistics of each document of more than ``max_lag`` tokens, one
    :class:`ExpertMoments` each (``tokens`` is the document's length; ``union`` is None).
    Shorter documents have no pair at lag ``max_lag`` and are left out. ``executor`` as in
    :func:`fit_moments` (each document's moments come from its own shard alone)."""
    _check_max_lag(max_lag)
    parts = map_shards(trace, shard_document_moments, executor=executor, max_lag=max_lag)
    out = [mo for part in parts for mo in part]
    if not out:
        raise InputError(_too_short(trace, max_lag), argument="max_lag")
    return out


def _check_max_lag(max_lag: Any) -> None:
    if isinstance(max_lag, bool) or not isinstance(max_lag, int | np.integer) or max_lag < 1:
        raise InputError(f"must be an integer >= 1, got {max_lag!r}", argument="max_lag")


def _too_short(trace: RoutingTrace | TraceReader, max_lag: int) -> str:
    name = getattr(trace, "name", None) or str(getattr(trace, "path", "trace"))
    return f"{name}: no document is longer than {max_lag} tokens"


def save_moments(moments: ExpertMoments, path: str | os.PathLike) -> Path:
    """Write the statistics as a small JSON ("STATS") file, atomically."""

    def r(a: np.ndarray) -> list:
        return np.round(a, 9).tolist()

    obj = {
        "format": STATS_FORMAT,
        "version": 1,
        "num_experts": moments.num_experts,
        "top_k": moments.top_k,
        "num_layers": moments.num_layers,
        "max_lag": moments.max_lag,
        "tokens": moments.tokens,
        "meta": moments.meta,
        "popularity": r(moments.popularity),
        "coactivation": r(moments.coactivation),
        "union": None if moments.union is None else r(moments.union),
    }
    return atomic_write_json(path, obj)


STATS_MAX_BYTES = 256 << 20  # a STATS file of 256 MiB holds ~10^7 numbers: far beyond any model


def _stats_array(obj: dict, key: str, ndim: int, path: Path) -> np.ndarray:
    """Field ``key`` of a STATS file as a finite float array of ``ndim`` dimensions."""
    value = obj[key]
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(
            f"{path}: field {key!r} must be a nested list of numbers, got {type(value).__name__}"
        ) from None
    if a.ndim != ndim:
        raise InputError(f"{path}: field {key!r} must have {ndim} dimensions, got {a.ndim}")
    if not np.all(np.isfinite(a)):
        raise InputError(f"{path}: field {key!r} holds NaN or inf")
    return a


def _stats_int(obj: dict, key: str, path: Path, *, low: int) -> int:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InputError(f"{path}: field {key!r} must be an integer >= {low}, got {value!r}")
    return value


def check_popularity(popularity: np.ndarray, top_k: int, *, tol: float = 1e-6) -> None:
    """Each layer's popularities P(e ∈ S_t) sum to m (every token routes to m experts);
    ``tol`` allows the 9-decimal rounding of a STATS file. Raises naming the layer."""
    sums = np.asarray(popularity, dtype=np.float64).sum(axis=1)  # [L]
    if not sums.size:
        raise InputError("holds no layers", argument="popularity")
    bad = np.nonzero(np.abs(sums - top_k) > tol * popularity.shape[1])[0]
    if bad.size:
        layer = int(bad[0])
        what = "are all zero" if sums[layer] == 0 else f"sum to {sums[layer]:.6g}"
        raise InputError(
            f"layer {layer}: popularities {what}, not top_k = {top_k} "
            f"({bad.size} of {sums.size} layers)",
            argument="popularity",
        )


def load_moments(path: str | os.PathLike) -> ExpertMoments:
    """Read a STATS file written by :func:`save_moments`; every failure is one line naming the
    file and the field: a regular file of at most ``STATS_MAX_BYTES``, integer N, m (m < N),
    finite popularity [L, N] in [0, 1] summing to m per layer, co-activation [L, J, N]."""
    from specmoe._io import read_json

    path = Path(path)
    if path.exists() and not path.is_file():
        raise InputError(f"{path}: not a regular file (a statistics file is JSON)")
    if path.is_file() and path.stat().st_size > STATS_MAX_BYTES:
        raise InputError(
            f"{path}: {path.stat().st_size} bytes, more than a statistics file's "
            f"{STATS_MAX_BYTES >> 20} MiB limit"
        )
    try:
        obj = read_json(path, "statistics file")
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply for a statistics file") from None
    if not isinstance(obj, dict) or obj.get("format") != STATS_FORMAT:
        raise InputError(f"{path}: not a specmoe statistics file (format != {STATS_FORMAT!r})")
    try:
        num_experts = _stats_int(obj, "num_experts", path, low=2)
        top_k = _stats_int(obj, "top_k", path, low=1)
        popularity = _stats_array(obj, "popularity", 2, path)
        coactivation = _stats_array(obj, "coactivation", 3, path)
        union = None if obj.get("union") is None else _stats_array(obj, "union", 2, path)
        tokens = _stats_int(obj, "tokens", path, low=0) if "tokens" in obj else 0
        meta = obj.get("meta") or {}
        if not isinstance(meta, dict):
            raise InputError(f"{path}: field 'meta' must be an object, got {type(meta).__name__}")
        moments = ExpertMoments(
            num_experts=num_experts,
            top_k=top_k,
            popularity=popularity,
            coactivation=coactivation,
            tokens=tokens,
            union=union,
            meta=dict(meta),
        )
        check_popularity(moments.popularity, top_k)
    except KeyError as exc:
        raise InputError(f"{path}: statistics file lacks field {exc}") from None
    except InputError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise InputError(f"{path}: field {exc}") from None
    return moments


# ------------------------------------------------------------------------------------------
# The IPF solver


def pattern_bits(n: int) -> np.ndarray:
    """[2**n, n] the patterns in C order: pattern index = Σ_i x_i 2^(n-1-i); row 0 is all zeros."""
    return np.array(list(itertools.product((0, 1), repeat=n)), dtype=np.int8).reshape(-1, n)


def stationary_moments(p: np.ndarray, c: np.ndarray, n: int) -> np.ndarray:
    """[B, n, n] moment matrices: diagonal p, entry (i, k) = c[|i-k| - 1] (c is [B, >= n-1])."""
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    c = np.asarray(c, dtype=np.float64).reshape(p.size, -1)
    if n > 1 and c.shape[1] < n - 1:
        raise InputError(
            f"a window of n={n} needs co-activation at lags 1..{n - 1}, got {c.shape[1]} lags"
        )
    lag = np.abs(np.subtract.outer(np.arange(n), np.arange(n)))
    M = np.empty((p.size, n, n))
    M[:] = np.where(lag == 0, 0.0, np.nan)
    off = lag > 0
    M[:, off] = c[:, lag[off] - 1]
    idx = np.arange(n)
    M[:, idx, idx] = p[:, None]
    return M


@dataclass(frozen=True, eq=False)
class IPFSolution:
    """Maximum-entropy pattern laws of B problems.

    probs:         [B, 2**n] (NaN for infeasible rows); pattern order of :func:`pattern_bits`.
    status:        [B] ``converged`` | ``not_converged`` | ``infeasible``.
    max_violation: [B] largest |fitted − target| over every cell of every pairwise table.
    """

    n: int
    probs: np.ndarray
    status: np.ndarray
    max_violation: np.ndarray
    iterations: int

    @property
    def converged(self) -> np.ndarray:
        return self.status == STATUS_CONVERGED

    @property
    def p_any(self) -> np.ndarray:
        """[B] P(x ≠ 0): the probability that the expert is active at least once."""
        return 1.0 - self.probs[:, 0]


def _pair_tables(M: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Target 2x2 tables [B, pairs, 4] (cell 2·x_i + x_k) from moment matrices [B, n, n]."""
    n = M.shape[1]
    pairs = [(i, k) for i in range(n) for k in range(i + 1, n)]
    tab = np.empty((M.shape[0], len(pairs), 4))
    for q, (i, k) in enumerate(pairs):
        pi, pk, c = M[:, i, i], M[:, k, k], M[:, i, k]
        tab[:, q, 3] = c
        tab[:, q, 2] = pi - c
        tab[:, q, 1] = pk - c
        tab[:, q, 0] = 1.0 - pi - pk + c
    return pairs, tab


def ipf_pairwise(
    moments: np.ndarray,
    *,
    tol: float = 1e-10,
    max_iter: int = 5000,
    feasibility_tol: float = 1e-12,
    check_every: int = 4,
    stall_sweeps: int = 200,
) -> IPFSolution:
    """Maximum-entropy laws on {0,1}^n meeting given first and pairwise moments, by IPF.

    moments: [B, n, n] symmetric; diagonal P(x_i = 1), off-diagonal P(x_i = 1, x_k = 1).
    Starts from the uniform table and cycles through the pairwise 2x2 tables (i < k in
    lexicographic order), rescaling the four cells of each to their targets (a cell whose current
    mass is 0 stays 0). A row stops when every cell of every table is within ``tol`` (absolute)
    of its target, checked every ``check_every`` sweeps, after ``max_iter`` sweeps, or when its
    violation has not fallen by 10% over ``stall_sweeps`` sweeps. A row with a negative target
    cell (beyond ``feasibility_tol``) is ``infeasible`` and not iterated; a row that stops off
    target is ``not_converged`` (jointly infeasible tables, which IPF cycles on, or a solution
    on the boundary of the constraint set that IPF only approaches).
    """
    M = np.asarray(moments, dtype=np.float64)
    if M.ndim != 3 or M.shape[1] != M.shape[2] or M.shape[1] < 1:
        raise InputError(f"must be [B, n, n], got shape {M.shape}", argument="moments")
    if not np.all(np.isfinite(M)):
        raise InputError("hold NaN or inf", argument="moments")
    if not tol > 0:
        raise InputError(f"must be > 0, got {tol}", argument="tol")
    if max_iter < 1:
        raise InputError(f"must be >= 1, got {max_iter}", argument="max_iter")
    B, n = M.shape[0], M.shape[1]
    M = 0.5 * (M + M.transpose(0, 2, 1))
    if n == 1:  # no pairs: the marginal alone
        p = M[:, 0, 0]
        bad = (p < -feasibility_tol) | (p > 1 + feasibility_tol)
        probs = np.stack([1 - p, p], axis=1)
        probs[bad] = np.nan
        status = np.where(bad, STATUS_INFEASIBLE, STATUS_CONVERGED)
        return IPFSolution(1, probs, status, np.where(bad, np.nan, 0.0), 0)
    pairs, tab = _pair_tables(M)  # [B, Q, 4]
    Q = len(pairs)
    bits = pattern_bits(n).astype(np.int64)  # [P, n]
    cell = np.stack([2 * bits[:, i] + bits[:, k] for i, k in pairs])  # [Q, P]
    onehot = np.zeros((2**n, Q * 4))  # [P, 4Q]
    onehot[np.arange(2**n)[:, None], 4 * np.arange(Q)[None, :] + cell.T] = 1.0
    onehot_t = np.ascontiguousarray(onehot.T)  # [4Q, P]
    # Patterns lead, problems trail ([P, b], problems contiguous): the pattern axis viewed as
    # (before i, x_i, between, x_k, after) lets one pair's marginal be a sum over the other
    # axes and its rescale a broadcast multiply, both over contiguous rows of problems.
    views = [(2**i, 2, 2 ** (k - i - 1), 2, 2 ** (n - k - 1)) for i, k in pairs]
    infeasible = (tab < -feasibility_tol).any(axis=(1, 2))
    tab = np.clip(tab, 0.0, None)
    probs = np.full((B, 2**n), np.nan)
    viol = np.full(B, np.nan)
    live = np.nonzero(~infeasible)[0]  # rows still iterating
    work = np.full((2**n, live.size), 1.0 / 2**n)  # [P, b]
    tq = np.ascontiguousarray(tab[live].transpose(1, 2, 0))  # [Q, 4, b] targets
    v_ref = np.full(live.size, np.inf)  # violation at the last mark
    it = 0
    while live.size and it < max_iter:
        mark = it > 0 and it % stall_sweeps < check_every
        for _ in range(min(check_every, max_iter - it)):
            for q in range(Q):
                view = work.reshape(*views[q], -1)
                cur = view.sum(axis=(0, 2, 4)).reshape(4, -1)  # [4, b], cell 2·x_i + x_k
                f = np.divide(tq[q], cur, out=np.zeros_like(cur), where=cur > 0)
                view *= f.reshape(1, 2, 1, 2, 1, -1)
            it += 1
        v = np.abs(onehot_t @ work - tq.reshape(4 * Q, -1)).max(axis=0)  # [b]
        done = v <= tol
        stalled = np.zeros_like(done)
        if mark:  # no real progress over stall_sweeps sweeps: a cycle or a boundary solution
            stalled = v > 0.9 * v_ref
            v_ref = v
        fin = done | stalled | (it >= max_iter)
        if fin.any():
            probs[live[fin]] = work[:, fin].T
            viol[live[fin]] = v[fin]
            keep = ~fin
            live, v_ref = live[keep], v_ref[keep]
            work, tq = np.ascontiguousarray(work[:, keep]), np.ascontiguousarray(tq[:, :, keep])
    status = np.where(
        infeasible, STATUS_INFEASIBLE, np.where(viol <= tol, STATUS_CONVERGED, STATUS_NOT_CONVERGED)
    )
    return IPFSolution(n, probs, status, viol, it)


def solve_windows(p: np.ndarray, c: np.ndarray, n: int, **kw: Any) -> IPFSolution:
    """IPF for B stationary problems: marginal p [B], co-activation c [B, >= n-1] at lags 1.."""
    return ipf_pairwise(stationary_moments(p, c, n), **kw)


IPF_MAX_UPDATES = 4 * 10**8  # cell updates per sweep, summed over the window lengths
IPF_MAX_BYTES = 2 << 30  # pattern tables of the longest window


def ipf_cost(problems: int, max_n: int, min_n: int = 2) -> tuple[int, int]:
    """(cell updates of one IPF sweep summed over n = min_n..max_n, bytes of the tables at
    max_n): a sweep rescales the n(n−1)/2 pairwise tables over all 2^n patterns of each of
    ``problems`` laws; the tables are the [2^n, problems] laws and the [2^n, 2n(n−1)] cell map.
    Both double (and more) with each n."""
    updates = sum(problems * 2**n * (n * (n - 1) // 2) for n in range(min_n, max_n + 1))
    nbytes = 8 * 2**max_n * (problems + 4 * max_n * (max_n - 1))
    return updates, nbytes


def check_ipf_cost(problems: int, max_n: int, min_n: int = 2) -> None:
    """Refuse (``InputError`` on ``max_n``) IPF work beyond ``IPF_MAX_UPDATES`` cell updates per
    sweep or ``IPF_MAX_BYTES`` of tables (:func:`ipf_cost`)."""
    if max_n > 40:  # 2^n itself is out of reach; no need to sum
        raise InputError(
            f"{max_n} needs 2^{max_n} activation patterns per law: far beyond the limit "
            f"of {IPF_MAX_UPDATES:.0e} cell updates per sweep",
            argument="max_n",
        )
    updates, nbytes = ipf_cost(problems, max_n, min_n)
    if updates > IPF_MAX_UPDATES or nbytes > IPF_MAX_BYTES:
        raise InputError(
            f"{max_n} with {problems} laws needs {updates:.2g} cell updates per IPF sweep "
            f"(limit {IPF_MAX_UPDATES:.0e}) and {nbytes / 2**30:.2g} GiB of tables (limit "
            f"{IPF_MAX_BYTES >> 30} GiB); each n beyond doubles both: choose a smaller n, "
            "fewer bins or one pooled law",
            argument="max_n",
        )


# ------------------------------------------------------------------------------------------
# Predicting the union


def bin_experts(popularity: np.ndarray, bins: int) -> np.ndarray:
    """[L, N] bin index of each expert: per layer, sorted by popularity, ``bins`` near-equal parts."""
    L, N = popularity.shape
    if not 1 <= bins <= N:
        raise InputError(f"must be in 1..{N} (the experts per layer), got {bins}", argument="bins")
    order = np.argsort(popularity, axis=1, kind="stable")
    rank_bin = (np.arange(N) * bins) // N  # [N] bin of each rank
    out = np.empty((L, N), dtype=np.int64)
    np.put_along_axis(out, order, np.broadcast_to(rank_bin, (L, N)), axis=1)
    return out


@dataclass(frozen=True, eq=False)
class UnionPrediction:
    """Predicted unique experts per layer and window length.

    n: [S] window lengths; predicted: [L, S]; status: [L, S] worst status over the layer's bins;
    max_violation: [L, S]; uniform_baseline: [S]; popularity_baseline: [L, S]; clipped: number
    of co-activation targets moved into the valid range max(0, 2p − 1) <= c <= p.
    """

    n: np.ndarray
    predicted: np.ndarray
    status: np.ndarray
    max_violation: np.ndarray
    uniform_baseline: np.ndarray
    popularity_baseline: np.ndarray
    variant: str
    bins: int
    iterations: int
    pooling: str = "trace"
    clipped: int = 0

    @property
    def converged(self) -> bool:
        return bool(np.all(self.status == STATUS_CONVERGED))

    @property
    def mean_predicted(self) -> np.ndarray:
        """[S] layer mean."""
        return self.predicted.mean(axis=0)


VARIANTS = ("uniform", "skewed")


def _bin_targets(
    moments: ExpertMoments, variant: str, bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per layer and bin: marginal p [L, K], co-activation c [L, K, J], experts per bin [L, K]."""
    N, m, L = moments.num_experts, moments.top_k, moments.num_layers
    if variant == "uniform":
        p = np.full((L, 1), m / N)
        c = (moments.coactivation.sum(axis=2) / N)[:, None, :]  # [L, 1, J] = m o_l(j)/N
        return p, c, np.full((L, 1), float(N))
    b = bin_experts(moments.popularity, bins)  # [L, N]
    onehot = (b[:, :, None] == np.arange(bins)).astype(np.float64)  # [L, N, K]
    size = onehot.sum(axis=1)  # [L, K]
    p = np.einsum("ln,lnk->lk", moments.popularity, onehot) / size
    c = np.einsum("ljn,lnk->lkj", moments.coactivation, onehot) / size[:, :, None]
    return p, c, size


def predict_union(
    moments: ExpertMoments | Sequence[ExpertMoments],
    *,
    max_n: int = 9,
    min_n: int = 2,
    variant: str = "skewed",
    bins: int = 8,
    tol: float = 1e-10,
    max_iter: int = 5000,
) -> UnionPrediction:
    """Û_l(n) for n = min_n..max_n by maximum-entropy IPF (see the module docstring).

    ``moments`` is one set of statistics (the paper's method: one stationary law for the whole
    trace), or a sequence of single-document statistics (:func:`fit_document_moments`): then
    each document d gets its own maximum-entropy laws and Û_l(n) = Σ_d w_d(n) Û_{l,d}(n) /
    Σ_d w_d(n), with w_d(n) = T_d − n + 1 its windows of n tokens. This mixture over documents
    is our extension: it keeps routing that stays in a regime for a whole document (pairwise
    overlap that hardly decays with the lag), which one pooled pairwise law cannot. The
    baselines use the pooled popularity. Every layer, bin (and document) of one n is solved as
    one batch [D*L*K, 2**n].
    """
    if variant not in VARIANTS:
        raise InputError(
            f"unknown variant {variant!r} (choose from {', '.join(VARIANTS)})", argument="variant"
        )
    if not 1 <= min_n <= max_n:
        raise InputError(
            f"need 1 <= min_n <= max_n, got {min_n}..{max_n}",
            argument="min_n" if min_n < 1 else "max_n",
        )
    parts = [moments] if isinstance(moments, ExpertMoments) else list(moments)
    if not parts:
        raise InputError(
            "no statistics to predict from (no document long enough?)", argument="moments"
        )
    first = parts[0]
    N, m, L = first.num_experts, first.top_k, first.num_layers
    for part in parts:
        part.check_window(max_n)
        if (part.num_experts, part.top_k, part.num_layers) != (N, m, L):
            raise InputError("document statistics disagree on N, m or L", argument="moments")
    ns = np.arange(min_n, max_n + 1)
    D = len(parts)
    check_ipf_cost(D * L * (1 if variant == "uniform" else min(bins, N)), max_n, min_n)
    targets = [_bin_targets(part, variant, bins) for part in parts]
    p = np.stack([t[0] for t in targets])  # [D, L, K]
    c = np.stack([t[1] for t in targets])  # [D, L, K, J]
    size = np.stack([t[2] for t in targets])  # [D, L, K]
    K = p.shape[2]
    # Estimates at document edges can leave c a hair outside the box 2p − 1 <= c <= p that a
    # 2x2 table needs; such targets are moved into it and counted (``clipped``).
    box = np.clip(c, np.maximum(0.0, 2 * p - 1)[..., None], p[..., None])
    clipped = int((np.abs(box - c)[..., : max_n - 1] > 1e-12).sum())
    c = box
    tokens = np.array([part.tokens for part in parts], dtype=np.float64)  # [D]
    pred = np.zeros((L, ns.size))
    status = np.empty((L, ns.size), dtype=object)
    viol = np.zeros((L, ns.size))
    iters = 0
    rank = {STATUS_CONVERGED: 0, STATUS_NOT_CONVERGED: 1, STATUS_INFEASIBLE: 2}
    for s, n in enumerate(ns):
        sol = solve_windows(
            p.reshape(-1), c.reshape(D * L * K, -1), int(n), tol=tol, max_iter=max_iter
        )
        iters = max(iters, sol.iterations)
        per = (size * sol.p_any.reshape(D, L, K)).sum(axis=2)  # [D, L]
        w = np.maximum(tokens - n + 1, 0.0) if D > 1 else np.ones(1)
        pred[:, s] = (w[:, None] * per).sum(axis=0) / w.sum()
        st = np.vectorize(rank.get)(sol.status.reshape(D, L, K)).max(axis=(0, 2))
        status[:, s] = np.array(list(rank))[st]
        viol[:, s] = sol.max_violation.reshape(D, L, K).max(axis=(0, 2))
    pooled = np.einsum("d,dln->ln", tokens, np.stack([q.popularity for q in parts]))
    pooled /= tokens.sum() if D > 1 else 1.0
    if D == 1:
        pooled = first.popularity
    return UnionPrediction(
        n=ns,
        predicted=pred,
        status=status.astype(str),
        max_violation=viol,
        uniform_baseline=uniform_union(N, m, max_n)[ns - 1],
        popularity_baseline=independent_union(pooled, max_n)[:, ns - 1],
        variant=variant,
        bins=K,
        iterations=iters,
        pooling="trace" if isinstance(moments, ExpertMoments) else "documents",
        clipped=clipped,
    )
