"""Window engine of the routing statistics: bitsets, popcounts and per-document sums.

Legend for shapes: ``T`` tokens, ``L`` MoE layers, ``m`` experts per token (slots), ``N``
experts, ``W`` = ⌈N/64⌉ 64-bit words of a token's expert set, ``D`` documents, ``n`` window
lengths 1..max_n (entry n−1), ``j`` lags 1..max_lag (entry j−1).

Estimators (paper 002 Eq. (1)-(3) and Appendix D.2). In layer l a window of n consecutive tokens
of one document, t..t+n−1, has union X_l,t(n) = |S_t ∪ ... ∪ S_{t+n−1}| and reuse count
|S_{t+n−1} ∩ (S_t ∪ ... ∪ S_{t+n−2})|. Over every such window of every document,

    ρ̂_l(n) = Σ reuse counts / (m · #windows(n)),   Û_l(n) = Σ unions / #windows(n),

so ρ̂_l(1) = 0 and Û_l(1) = m. Windows never cross a document edge. Eq. (2),
U_l(n) = m Σ_{j≤n}(1 − ρ_l(j)), holds exactly per window (Eq. (B.5) of paper 002); over a finite
trace the windows of length j and n differ near document ends, so the estimates satisfy it only
up to ``identity_error`` ≤ ``identity_bound`` = max over n of
m Σ_{j≤n}(1 − #windows(n)/#windows(j)) (the mean of values in [0, m] over a subset of its
windows moves by at most m times the share left out; see :func:`identity_bound`). With ``aligned=True`` every n uses the same window starts (those with room for max_n
tokens) and Eq. (2) holds exactly.

Pairwise overlap o_l(j) = Σ |S_t ∩ S_{t+j}| / (m · #pairs(j)) over pairs inside one document
(paper 003 Section 6); popularity p_{l,e} = share of tokens selecting e. Baselines and the
overlap decomposition are in :mod:`specmoe.routing.overlap`, document bootstrap intervals in
:mod:`specmoe.routing.bootstrap`, and the public result in :mod:`specmoe.routing.stats`.

Computation: each token's set is a bitset of W words; a window's earlier tokens are OR-ed over
shifted arrays and counted with popcounts. A trace is processed shard by shard and chunk by
chunk (with a halo of max(max_n − 1, max_lag) tokens), keeping per-document sums only
(:class:`DocumentSums`), the sufficient statistics of every estimate and of the bootstrap.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from specmoe.errors import InputError
from specmoe.formats.trace import RoutingTrace, TraceReader, open_trace

__all__ = [
    "DocumentSums",
    "document_sums",
    "identity_bound",
    "identity_residual",
    "longest_document",
    "merge_sums",
    "overlap_from_sums",
    "popcount",
    "rho_union_from_sums",
    "shard_sums",
    "token_bitsets",
    "trim_lags",
    "window_reuse_counts",
    "window_union_counts",
]

DEFAULT_MAX_LAG = 16
_CHUNK_BYTES = 8 << 20  # size of the per-chunk buffer of per-token values
_BYTE_POP = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


# ------------------------------------------------------------------------------------------
# bitsets


def token_bitsets(experts: np.ndarray, num_experts: int) -> np.ndarray:
    """[..., m] distinct expert ids -> [..., W] uint64 bitsets (bit e % 64 of word e // 64)."""
    e = np.asarray(experts)
    one, n_words = np.uint64(1), (int(num_experts) + 63) // 64
    out = np.zeros((*e.shape[:-1], n_words), dtype=np.uint64)
    for s in range(e.shape[-1]):  # a loop over the m slots beats a reduce over a short axis
        es = e[..., s].astype(np.uint64)
        if n_words == 1:
            out[..., 0] |= np.left_shift(one, es)
            continue
        bit, word = np.left_shift(one, es & np.uint64(63)), es >> np.uint64(6)
        for w in range(n_words):
            out[..., w] |= np.where(word == w, bit, np.uint64(0))
    return out


def popcount(words: np.ndarray) -> np.ndarray:
    """[..., W] uint64 -> [...] number of set bits over the W words (uint8 when W = 1)."""
    if hasattr(np, "bitwise_count"):
        c = np.bitwise_count(words)
    else:  # numpy < 2
        c = _BYTE_POP[np.ascontiguousarray(words).view(np.uint8)]
        c = c.reshape((*words.shape, 8)).sum(axis=-1, dtype=np.int32)
    if c.shape[-1] == 1:
        return c[..., 0]
    return c.sum(axis=-1, dtype=np.int32)


def _infer_n(experts: np.ndarray, num_experts: int | None) -> int:
    return int(num_experts) if num_experts is not None else int(np.max(experts)) + 1


def window_union_counts(
    experts_doc: np.ndarray, n: int, *, num_experts: int | None = None
) -> np.ndarray:
    """[t_d − n + 1, L] X_l,t(n): distinct experts of each window of n tokens of one document.

    ``experts_doc`` [t_d, L, m]; row t is the window t..t+n−1 (paper 002 Section 1). Empty
    when the document is shorter than n.
    """
    if n < 1:
        raise InputError(f"must be >= 1, got {n}", argument="n")
    bits = token_bitsets(experts_doc, _infer_n(experts_doc, num_experts))  # [t_d, L, W]
    t_d = bits.shape[0]
    if t_d < n:
        return np.zeros((0, bits.shape[1]), dtype=np.int32)
    acc = bits[n - 1 :].copy()
    for i in range(1, n):
        acc |= bits[n - 1 - i : t_d - i]
    return popcount(acc).astype(np.int32)


def window_reuse_counts(
    experts_doc: np.ndarray, n: int, *, num_experts: int | None = None
) -> np.ndarray:
    """[t_d − n + 1, L] |S_{t+n−1} ∩ (S_t ∪ ... ∪ S_{t+n−2})| for each window of one document.

    The numerator of Eq. (1) of paper 002 per window (row t is the window t..t+n−1); zero for
    n = 1.
    """
    if n < 1:
        raise InputError(f"must be >= 1, got {n}", argument="n")
    bits = token_bitsets(experts_doc, _infer_n(experts_doc, num_experts))
    t_d = bits.shape[0]
    if t_d < n:
        return np.zeros((0, bits.shape[1]), dtype=np.int32)
    earlier = np.zeros_like(bits[n - 1 :])
    for i in range(1, n):
        earlier |= bits[n - 1 - i : t_d - i]
    return popcount(earlier & bits[n - 1 :]).astype(np.int32)


# ------------------------------------------------------------------------------------------
# per-document sufficient statistics


@dataclass(frozen=True)
class DocumentSums:
    """Per-document sums from which every estimate and bootstrap resample is a ratio.

    ``lengths`` [D] tokens; ``reuse`` [D, L, n] Σ over windows of the reuse count;
    ``union`` [D, L, n] Σ over windows of X(n); ``windows`` [D, n] number of windows;
    ``overlap`` [D, L, lags] Σ over pairs of |S_t ∩ S_{t+j}|; ``pairs`` [D, lags];
    ``expert_counts`` [L, N] tokens selecting each expert; ``doc_expert_counts`` [D, L, N] the
    same per document (kept only when asked for, for the bootstrap of popularity).

    ``pooled``: the rows of ``reuse``, ``union``, ``windows``, ``overlap`` and ``pairs`` are
    summed over documents into one row ([1, ...]); ``lengths`` stays per document. Every point
    estimate is the same (each sums over the rows); only the bootstrap needs the rows
    per document, so pooled sums are what a pass without it keeps: O(L·n) per shard instead of
    O(D·L·n), in a worker's result and on the driver.
    """

    num_experts: int
    top_k: int
    layers: list[int]
    max_n: int
    max_lag: int
    aligned: bool
    lengths: np.ndarray
    reuse: np.ndarray
    union: np.ndarray
    windows: np.ndarray
    overlap: np.ndarray
    pairs: np.ndarray
    expert_counts: np.ndarray
    doc_expert_counts: np.ndarray | None = None
    pooled: bool = False

    @property
    def num_layers(self) -> int:
        return int(self.reuse.shape[1])

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def documents(self) -> int:
        return int(self.lengths.size)


def _window_counts(lengths: np.ndarray, max_n: int, aligned: bool) -> np.ndarray:
    """[D, n] windows of n tokens per document (all starts, or the max_n-aligned starts)."""
    n = np.arange(1, max_n + 1)
    if aligned:
        return np.repeat(np.maximum(lengths - max_n + 1, 0)[:, None], max_n, axis=1)
    return np.maximum(lengths[:, None] - n[None, :] + 1, 0)


def _pair_counts(lengths: np.ndarray, max_lag: int) -> np.ndarray:
    """[D, lags] pairs (t, t + j) inside each document."""
    j = np.arange(1, max_lag + 1)
    return np.maximum(lengths[:, None] - j[None, :], 0)


def _shard_sums(
    experts: np.ndarray,
    offsets: np.ndarray,
    num_experts: int,
    *,
    max_n: int,
    max_lag: int,
    aligned: bool,
    per_doc_counts: bool,
    chunk: int | None = None,
) -> dict[str, np.ndarray]:
    """Sums of one shard: experts [T, L, m], offsets [D_s + 1] (whole documents).

    Per chunk of tokens (plus a halo of earlier tokens) every per-token value, indexed by the
    last token of its window or pair, goes into one buffer Q [Tc, K·L] of K blocks: the reuse
    count I_n and union X_n for n = 2..max_n, then the pair overlap P_j for j = 1..max_lag.
    Values of windows that cross a document start (the first o tokens of a document for a
    block of offset o = n − 1 or j), or that end past the aligned starts, are zeroed; one
    ``reduceat`` over the document starts then gives every per-document sum.
    """
    T, L, m = experts.shape
    N = int(num_experts)
    D = offsets.size - 1
    starts, ends = offsets[:-1], offsets[1:]
    halo = max(max_n - 1, max_lag)
    # blocks: (lo_off, hi_off) of each block of L columns
    blocks = [(n - 1, max_n - n if aligned else 0) for n in range(2, max_n + 1) for _ in (0, 1)]
    blocks += [(j, 0) for j in range(1, max_lag + 1)]
    K = len(blocks)
    qdt = np.int16 if N < (1 << 15) else np.int32
    if chunk is None:  # keep Q near 8 MB
        chunk = min(max(_CHUNK_BYTES // max(K * L * qdt().itemsize, 1), 1024), 1 << 16)
    sums = np.zeros((D, K * L), np.int64)
    counts = np.zeros((D, L, N) if per_doc_counts else (L, N), np.int64)
    layer_base = (np.arange(L, dtype=np.intp) * N)[None, :, None]  # [1, L, 1]
    edge = np.arange(max(halo, 1))  # [H]
    for c0 in range(0, T, chunk):
        c1 = min(c0 + chunk, T)
        e0 = max(c0 - halo, 0)
        k0 = c0 - e0  # the core starts at local index k0
        bits = token_bitsets(experts[e0:c1], N)  # [Te, L, W]
        Te, Tc = bits.shape[0], c1 - c0
        Q = np.empty((Tc, K * L), qdt)  # [Tc, K·L]
        # reuse and union: earlier[t] = S_{t−1} ∪ ... ∪ S_{t−n+1}; X_n[t] = X_{n−1}[t−1] + m − I_n[t]
        earlier = np.zeros_like(bits)
        tmp = np.empty_like(bits)
        x_prev = np.full((Te, L), m, dtype=qdt)
        for n in range(2, max_n + 1):
            if n - 1 < Te:
                earlier[n - 1 :] |= bits[: Te - n + 1]
            inter = popcount(np.bitwise_and(earlier, bits, out=tmp))  # [Te, L]
            x = np.empty_like(x_prev)
            x[0] = m
            np.subtract(x_prev[:-1] + m, inter[1:], out=x[1:], casting="unsafe")
            col = 2 * (n - 2) * L
            Q[:, col : col + L] = inter[k0:]
            Q[:, col + L : col + 2 * L] = x[k0:]
            x_prev = x
        # pairwise overlap at lag j, indexed by the later token of the pair
        for j in range(1, max_lag + 1):
            col = (2 * (max_n - 1) + j - 1) * L
            a = max(k0, j)
            Q[: a - k0, col : col + L] = 0
            if a < Te:
                Q[a - k0 :, col : col + L] = popcount(
                    np.bitwise_and(bits[a:], bits[a - j : Te - j], out=tmp[a:])
                )
        # documents overlapping the core; zero the windows that cross an edge
        d0 = int(np.searchsorted(ends, c0, side="right"))
        d1 = int(np.searchsorted(starts, c1, side="left"))
        s, e = starts[d0:d1], ends[d0:d1]
        head = s[:, None] + edge[None, :]  # [Dc, H]
        hv = (head >= c0) & (head < np.minimum(e, c1)[:, None])
        head_row, head_i = head[hv] - c0, np.broadcast_to(edge, head.shape)[hv]
        tail = e[:, None] - 1 - edge[None, :]
        tv = (tail < c1) & (tail >= np.maximum(s, c0)[:, None])
        tail_row, tail_i = tail[tv] - c0, np.broadcast_to(edge, tail.shape)[tv]
        for b, (lo_off, hi_off) in enumerate(blocks):
            cols = slice(b * L, (b + 1) * L)
            if lo_off:
                Q[head_row[head_i < lo_off], cols] = 0
            if hi_off:
                Q[tail_row[tail_i < hi_off], cols] = 0
        seg = np.clip(s, c0, c1) - c0  # the core is covered by these documents
        if seg.size <= 256:  # a sum per document beats reduceat along axis 0 by ~10x
            bounds = np.append(seg, Tc)
            for i in range(seg.size):
                sums[d0 + i] += Q[bounds[i] : bounds[i + 1]].sum(axis=0, dtype=np.int64)
        else:
            sums[d0:d1] += np.add.reduceat(Q, seg, axis=0, dtype=np.int64)
        # popularity counts
        idx = layer_base + experts[c0:c1]  # [Tc, L, m]
        if per_doc_counts:
            doc = np.repeat(np.arange(d1 - d0, dtype=np.intp), np.diff(np.append(seg, Tc)))
            idx = idx + (doc * (L * N))[:, None, None]
            counts[d0:d1] += np.bincount(idx.ravel(), minlength=(d1 - d0) * L * N).reshape(
                d1 - d0, L, N
            )
        else:
            counts += np.bincount(idx.ravel(), minlength=L * N).reshape(L, N)
    lens = np.diff(offsets)
    reuse = np.zeros((D, L, max_n), np.int64)
    union = np.zeros((D, L, max_n), np.int64)
    union[:, :, 0] = m * _window_counts(lens, max_n, aligned)[:, :1]
    nn = max_n - 1
    if nn:
        iu = sums[:, : 2 * nn * L].reshape(D, nn, 2, L)
        reuse[:, :, 1:] = iu[:, :, 0].transpose(0, 2, 1)
        union[:, :, 1:] = iu[:, :, 1].transpose(0, 2, 1)
    overlap = sums[:, 2 * nn * L :].reshape(D, max_lag, L).transpose(0, 2, 1)
    return {
        "reuse": reuse,
        "union": union,
        "overlap": np.ascontiguousarray(overlap),
        "counts": counts,
    }


def _as_source(trace_or_reader) -> RoutingTrace | TraceReader:
    if isinstance(trace_or_reader, RoutingTrace | TraceReader):
        return trace_or_reader
    if isinstance(trace_or_reader, str | os.PathLike):
        return open_trace(trace_or_reader)
    raise InputError(
        f"expected a RoutingTrace, TraceReader or path, got {type(trace_or_reader).__name__}",
        argument="trace_or_reader",
    )


def longest_document(trace_or_reader) -> int | None:
    """Tokens of the longest document, from the offsets alone (None if a shard is unreadable).

    For a reader, :meth:`TraceReader.longest_document` reads only each shard's offsets, so
    that arguments can be checked before the pass over the expert arrays.
    """
    src = _as_source(trace_or_reader)
    if isinstance(src, RoutingTrace):
        return int(np.diff(src.doc_offsets).max())
    return src.longest_document()


def shard_sums(
    trace: RoutingTrace,
    *,
    max_n: int,
    max_lag: int,
    aligned: bool = False,
    per_document_counts: bool = False,
    pooled: bool = False,
) -> DocumentSums:
    """The :class:`DocumentSums` of one shard (whole documents): its exact sufficient statistics.

    :func:`merge_sums` of the shards' sums, in shard order, is the trace's sums. ``pooled``:
    one row of totals instead of a row per document (not with ``per_document_counts``).
    """
    if pooled and per_document_counts:
        raise InputError("pooled sums keep no per-document counts", argument="pooled")
    part = _shard_sums(
        trace.experts,
        trace.doc_offsets,
        trace.num_experts,
        max_n=int(max_n),
        max_lag=int(max_lag),
        aligned=aligned,
        per_doc_counts=per_document_counts,
    )
    lens = np.diff(trace.doc_offsets)
    counts = part["counts"]
    doc_counts = None
    if per_document_counts:  # D·L·N of them: halve their memory (a document has < 2^31 tokens)
        doc_counts = counts.astype(np.int32)
        counts = counts.sum(axis=0, dtype=np.int64)
    rows = {
        "reuse": part["reuse"],
        "union": part["union"],
        "windows": _window_counts(lens, int(max_n), aligned),
        "overlap": part["overlap"],
        "pairs": _pair_counts(lens, int(max_lag)),
    }
    if pooled:
        rows = {k: v.sum(axis=0, keepdims=True, dtype=np.int64) for k, v in rows.items()}
    return DocumentSums(
        num_experts=int(trace.num_experts),
        top_k=trace.top_k,
        layers=list(trace.layers),
        max_n=int(max_n),
        max_lag=int(max_lag),
        aligned=bool(aligned),
        lengths=lens,
        expert_counts=counts,
        doc_expert_counts=doc_counts,
        pooled=bool(pooled),
        **rows,
    )


_PER_DOCUMENT = ("lengths", "reuse", "union", "windows", "overlap", "pairs")
_ROWS = _PER_DOCUMENT[1:]


def merge_sums(parts: Sequence[DocumentSums]) -> DocumentSums:
    """The sums of the documents of ``parts`` taken in order: per-document arrays joined along
    D (pooled rows added), expert counts added (integers: exact in any grouping, so the merge
    is associative).

    The parts must agree on N, m, layers, max_n, max_lag, aligned, pooling and on whether
    they keep per-document expert counts; else an ``InputError`` naming ``parts``.
    """
    parts = list(parts)
    if not parts:
        raise InputError("no sums to merge", argument="parts")
    first = parts[0]
    if len(parts) == 1:
        return first
    key0 = _merge_key(first)
    for i, p in enumerate(parts[1:], start=1):
        key = _merge_key(p)
        if key != key0:
            what = next(
                f"{name}={a!r} but part 0 has {name}={b!r}"
                for name, a, b in zip(_MERGE_FIELDS, key, key0)
                if a != b
            )
            raise InputError(f"part {i} has {what}", argument="parts")
    cat = {k: np.concatenate([getattr(p, k) for p in parts]) for k in _PER_DOCUMENT}
    if first.pooled:
        for k in _ROWS:
            cat[k] = cat[k].sum(axis=0, keepdims=True, dtype=np.int64)
    doc_counts = None
    if first.doc_expert_counts is not None:
        doc_counts = np.concatenate([p.doc_expert_counts for p in parts])
    counts = first.expert_counts.astype(np.int64, copy=True)
    for p in parts[1:]:
        counts += p.expert_counts
    return replace(first, **cat, expert_counts=counts, doc_expert_counts=doc_counts)


_MERGE_FIELDS = (
    "num_experts",
    "top_k",
    "layers",
    "num_layers",
    "max_n",
    "max_lag",
    "aligned",
    "per_document_counts",
    "pooled",
)


def _merge_key(p: DocumentSums) -> tuple:
    return (
        p.num_experts,
        p.top_k,
        list(p.layers),
        p.num_layers,
        p.max_n,
        p.max_lag,
        p.aligned,
        p.doc_expert_counts is not None,
        p.pooled,
    )


def document_sums(
    trace_or_reader,
    *,
    max_n: int = 9,
    max_lag: int = DEFAULT_MAX_LAG,
    aligned: bool = False,
    per_document_counts: bool = False,
    pooled: bool = False,
    progress: Callable[[int, int], None] | None = None,
    executor=None,
) -> DocumentSums:
    """Stream a trace (in memory, a reader, or a path) shard by shard into :class:`DocumentSums`:
    :func:`shard_sums` of each shard, then :func:`merge_sums`.

    ``progress(done, total)`` is called after each shard. ``executor``: None computes the
    shards here, one at a time; else an executor of :func:`specmoe.routing.shardmap.map_shards`
    (e.g. Ray tasks) computes them, with the same result. ``pooled``: keep one row of totals
    per shard (:class:`DocumentSums`), enough for every point estimate.
    """
    from specmoe.routing.shardmap import map_shards

    if isinstance(max_n, bool) or not isinstance(max_n, int | np.integer) or max_n < 1:
        raise InputError(f"must be an integer >= 1, got {max_n!r}", argument="max_n")
    if isinstance(max_lag, bool) or not isinstance(max_lag, int | np.integer) or max_lag < 0:
        raise InputError(f"must be an integer >= 0, got {max_lag!r}", argument="max_lag")
    src = _as_source(trace_or_reader)
    parts = map_shards(
        src,
        shard_sums,
        executor=executor,
        progress=progress,
        max_n=int(max_n),
        max_lag=int(max_lag),
        aligned=bool(aligned),
        per_document_counts=bool(per_document_counts),
        pooled=bool(pooled),
    )
    return merge_sums(parts)


def trim_lags(sums: DocumentSums, max_lag: int) -> DocumentSums:
    """The same sums with lags 1..max_lag only."""
    return replace(
        sums,
        max_lag=int(max_lag),
        overlap=sums.overlap[:, :, :max_lag],
        pairs=sums.pairs[:, :max_lag],
    )


# ------------------------------------------------------------------------------------------
# estimates from sums


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num, den = np.broadcast_arrays(np.asarray(num, np.float64), np.asarray(den, np.float64))
    out = np.full(num.shape, np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def rho_union_from_sums(sums: DocumentSums) -> tuple[np.ndarray, np.ndarray]:
    """(ρ̂ [L, n], Û [L, n]) pooled over documents (paper 002 Eq. (1), Appendix D.2)."""
    win = sums.windows.sum(axis=0)  # [n]
    rho = _ratio(sums.reuse.sum(axis=0), sums.top_k * win[None, :])
    union = _ratio(sums.union.sum(axis=0), win[None, :])
    return rho, union


def overlap_from_sums(sums: DocumentSums) -> np.ndarray:
    """ô [L, lags] = Σ |S_t ∩ S_{t+j}| / (m · #pairs(j)) (paper 003 Section 6)."""
    return _ratio(sums.overlap.sum(axis=0), sums.top_k * sums.pairs.sum(axis=0)[None, :])


def identity_bound(windows: np.ndarray, top_k: int) -> np.ndarray:
    """[n] Bound on |Û(n) − m Σ_{j≤n}(1 − ρ̂(j))| from the windows of each length.

    ``windows`` [n] (total windows of each length, or [D, n] per document, summed). Term j of
    Û(n) averages the new-expert count m − I_j over the #windows(n) windows of length j that
    end inside a window of length n; ρ̂(j) averages it over all #windows(j). Values lie in
    [0, m], so the two means differ by at most m (1 − #windows(n)/#windows(j)).
    """
    w = np.asarray(windows, dtype=np.float64)
    if w.ndim == 2:
        w = w.sum(axis=0)
    out = np.zeros(w.shape)
    for k in range(w.size):
        if w[k] > 0:
            out[k] = top_k * np.sum(1.0 - w[k] / w[: k + 1])
    return out


def identity_residual(rho: np.ndarray, union: np.ndarray, top_k: int) -> np.ndarray:
    """[L, n] Û(n) − m Σ_{j≤n}(1 − ρ̂(j)) (paper 002 Eq. (2))."""
    return union - top_k * np.cumsum(1.0 - rho, axis=-1)
