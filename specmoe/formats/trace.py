"""The routing trace: which m experts each token selects in each MoE layer.

Legend for shapes: ``T`` tokens, ``L`` MoE layers, ``m`` slots (experts per token), ``D`` documents.

On-disk format (one canonical format, ``.npz``, written by :func:`save_trace`):

``experts``      integer array ``[T, L, m]``; ``experts[t, l]`` are the m *distinct* expert ids
                 in ``[0, N)`` that token t selected in MoE layer l (the slot order is the
                 router's, highest weight first where known).
``doc_offsets``  int64 ``[D+1]``: document d is tokens ``doc_offsets[d]:doc_offsets[d+1]``;
                 starts at 0, strictly increasing, ends at T. Windows never cross a document
                 boundary.
``weights``      optional float ``[T, L, m]``: the router weight of each slot.
``meta``         a JSON string (a 0-d unicode array) with at least ``num_experts``; usually also
                 ``model``, ``layers`` (the model's layer indices of the L MoE layers),
                 ``source`` and ``documents`` (document names).

A large trace is a directory of such ``.npz`` shards (read in sorted name order); every shard
holds whole documents and the shards agree on N, L, m and ``layers``. :func:`open_trace` reads
a file or a directory as one trace without loading every shard at once
(:meth:`TraceReader.iter_shards`). ``layers`` must list L distinct non-negative indices and
``documents``, when present, D names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specmoe._io import atomic_path, to_jsonable
from specmoe.errors import InputError
from specmoe.formats._common import parse_json, read_members

__all__ = ["RoutingTrace", "TraceReader", "load_trace", "open_trace", "save_trace"]


def _id_dtype(num_experts: int) -> np.dtype:
    return np.dtype(np.int16 if num_experts <= np.iinfo(np.int16).max else np.int32)


@dataclass(frozen=True, eq=False)
class RoutingTrace:
    """An in-memory routing trace (validated on construction).

    experts: [T, L, m] integer ids; doc_offsets: int64 [D+1]; weights: [T, L, m] or None.
    """

    experts: np.ndarray
    doc_offsets: np.ndarray
    num_experts: int
    weights: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    name: str = "trace"  # the file or argument the trace came from, for error messages

    def __post_init__(self) -> None:
        validate_arrays(
            self.experts, self.doc_offsets, self.num_experts, self.weights, name=self.name
        )
        object.__setattr__(self, "doc_offsets", np.asarray(self.doc_offsets, dtype=np.int64))
        if not isinstance(self.meta, dict):
            raise InputError(f"{self.name}: 'meta' must be a dict, got {type(self.meta).__name__}")
        meta = dict(self.meta)
        meta["num_experts"] = int(self.num_experts)
        meta.setdefault("layers", list(range(self.experts.shape[1])))
        _validate_meta(meta, self.experts.shape[1], len(self.doc_offsets) - 1, name=self.name)
        object.__setattr__(self, "meta", meta)

    # sizes ---------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return int(self.experts.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.experts.shape[1])

    @property
    def top_k(self) -> int:
        return int(self.experts.shape[2])

    @property
    def num_documents(self) -> int:
        return len(self.doc_offsets) - 1

    @property
    def layers(self) -> list[int]:
        return list(self.meta.get("layers", range(self.num_layers)))

    # views ---------------------------------------------------------------------------------
    def documents(self) -> Iterator[np.ndarray]:
        """Yield each document's experts, [t_d, L, m] (views, no copies)."""
        for a, b in zip(self.doc_offsets[:-1], self.doc_offsets[1:]):
            yield self.experts[a:b]

    def select_documents(self, index: np.ndarray | list[int]) -> RoutingTrace:
        """A new trace of the documents ``index`` (in that order; repeats allowed)."""
        index = np.asarray(index)
        if index.ndim != 1 or (
            index.size
            and (
                not np.issubdtype(index.dtype, np.integer)
                or index.min() < 0
                or index.max() >= self.num_documents
            )
        ):
            raise InputError(
                f"{self.name}: document index must be integers in "
                f"[0, {self.num_documents}), got {index.tolist()!r:.80}"
            )
        index = index.astype(np.int64)
        lengths = np.diff(self.doc_offsets)[index]
        parts = [self.experts[self.doc_offsets[i] : self.doc_offsets[i + 1]] for i in index]
        wparts = (
            None
            if self.weights is None
            else [self.weights[self.doc_offsets[i] : self.doc_offsets[i + 1]] for i in index]
        )
        meta = dict(self.meta)
        if "documents" in meta and len(meta["documents"]) == self.num_documents:
            meta["documents"] = [meta["documents"][i] for i in index]
        return RoutingTrace(
            experts=np.concatenate(parts) if parts else self.experts[:0],
            doc_offsets=np.concatenate([[0], np.cumsum(lengths)]),
            num_experts=self.num_experts,
            weights=(
                None if wparts is None else np.concatenate(wparts) if wparts else self.weights[:0]
            ),
            meta=meta,
            name=self.name,
        )

    def select_layers(self, layers: list[int] | np.ndarray) -> RoutingTrace:
        """A new trace with only the MoE layers at positions ``layers`` (0..L-1)."""
        layers = [int(i) for i in layers]
        if (
            not layers
            or len(set(layers)) != len(layers)
            or not all(0 <= i < self.num_layers for i in layers)
        ):
            raise InputError(
                f"{self.name}: layers must be distinct positions in "
                f"[0, {self.num_layers}), got {layers!r:.80}"
            )
        meta = dict(self.meta)
        meta["layers"] = [self.layers[i] for i in layers]
        return RoutingTrace(
            experts=self.experts[:, layers],
            doc_offsets=self.doc_offsets,
            num_experts=self.num_experts,
            weights=None if self.weights is None else self.weights[:, layers],
            meta=meta,
            name=self.name,
        )

    @staticmethod
    def concatenate(traces: list[RoutingTrace], *, name: str = "trace") -> RoutingTrace:
        """Join traces document-wise (they must agree on N, L and m)."""
        if not traces:
            raise InputError(f"{name}: no traces to join")
        _check_compatible(traces, name=name)
        offsets = [np.asarray([0], dtype=np.int64)]
        total = 0
        for tr in traces:
            offsets.append(tr.doc_offsets[1:] + total)
            total += tr.num_tokens
        weights = None
        if all(tr.weights is not None for tr in traces):
            weights = np.concatenate([tr.weights for tr in traces])
        meta = dict(traces[0].meta)
        meta.pop("documents", None)
        if all("documents" in tr.meta for tr in traces):
            meta["documents"] = [d for tr in traces for d in tr.meta["documents"]]
        if any("truncated" in tr.meta for tr in traces):  # the cut documents of every part
            meta["truncated"] = [d for tr in traces for d in tr.meta.get("truncated", [])]
        return RoutingTrace(
            experts=np.concatenate([tr.experts for tr in traces]),
            doc_offsets=np.concatenate(offsets),
            num_experts=traces[0].num_experts,
            weights=weights,
            meta=meta,
            name=name,
        )


def validate_arrays(
    experts: Any, doc_offsets: Any, num_experts: Any, weights: Any = None, *, name: str = "trace"
) -> None:
    """Check the trace invariants; raise ``InputError`` naming ``name`` and the first problem."""
    if not isinstance(experts, np.ndarray) or experts.ndim != 3:
        shape = getattr(experts, "shape", None)
        raise InputError(f"{name}: 'experts' must be an integer array [T, L, m], got shape {shape}")
    if not np.issubdtype(experts.dtype, np.integer):
        raise InputError(f"{name}: 'experts' must hold integers, got dtype {experts.dtype}")
    T, L, m = experts.shape
    if T == 0 or L == 0 or m == 0:
        raise InputError(f"{name}: empty trace (experts has shape {experts.shape})")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int | np.integer):
        raise InputError(f"{name}: num_experts must be an integer, got {num_experts!r}")
    if not m < num_experts:
        raise InputError(f"{name}: num_experts={num_experts} must exceed the {m} experts per token")
    if num_experts > 1 << 30:
        raise InputError(f"{name}: num_experts={num_experts} is implausibly large (> 2**30)")
    lo, hi = int(experts.min()), int(experts.max())
    if lo < 0 or hi >= num_experts:
        bad = lo if lo < 0 else hi
        raise InputError(f"{name}: expert id {bad} outside [0, {num_experts})")
    if m > 1:
        srt = np.sort(experts.reshape(-1, m), axis=1)
        dup = np.nonzero((srt[:, 1:] == srt[:, :-1]).any(axis=1))[0]
        if dup.size:
            t, layer = divmod(int(dup[0]), L)
            raise InputError(
                f"{name}: token {t} repeats an expert id within its {m} slots in layer {layer}"
                f" ({experts[t, layer].tolist()})"
            )
    off = np.asarray(doc_offsets) if doc_offsets is not None else None
    if off is None or off.ndim != 1 or off.size < 2:
        raise InputError(f"{name}: 'doc_offsets' must be a 1-d array [D+1] with D >= 1")
    if not np.issubdtype(off.dtype, np.integer):
        raise InputError(f"{name}: 'doc_offsets' must hold integers, got dtype {off.dtype}")
    # compare, never subtract: np.diff wraps around on unsigned dtypes
    if off[0] != 0 or np.any(off[1:] <= off[:-1]):
        raise InputError(f"{name}: 'doc_offsets' must start at 0 and increase strictly")
    if off[-1] != T:
        raise InputError(f"{name}: 'doc_offsets' ends at {int(off[-1])}, not at T={T}")
    if weights is not None:
        if not isinstance(weights, np.ndarray) or weights.shape != experts.shape:
            raise InputError(
                f"{name}: 'weights' shape {getattr(weights, 'shape', None)} "
                f"does not match experts {experts.shape}"
            )
        if not np.issubdtype(weights.dtype, np.floating):
            raise InputError(f"{name}: 'weights' must be floating, got dtype {weights.dtype}")
        if not np.all(np.isfinite(weights)):
            raise InputError(f"{name}: 'weights' holds NaN or inf")


def _validate_meta(meta: dict[str, Any], num_layers: int, num_documents: int, *, name: str) -> None:
    """``layers``: L distinct non-negative ints; ``documents`` (if present): D names."""
    layers = meta["layers"]
    if (
        not isinstance(layers, list)
        or len(layers) != num_layers
        or not all(
            isinstance(x, int | np.integer) and not isinstance(x, bool) and x >= 0 for x in layers
        )
        or len(set(layers)) != num_layers
    ):
        raise InputError(
            f"{name}: meta 'layers' must list the {num_layers} distinct "
            f"non-negative layer indices of the MoE layers, got {layers!r:.80}"
        )
    meta["layers"] = [int(x) for x in layers]
    if "documents" in meta:
        docs = meta["documents"]
        if (
            not isinstance(docs, list)
            or len(docs) != num_documents
            or not all(isinstance(d, str | int) and not isinstance(d, bool) for d in docs)
        ):
            raise InputError(
                f"{name}: meta 'documents' must list {num_documents} document "
                f"names, got {docs!r:.80}"
            )


def _check_compatible(traces: list[RoutingTrace], *, name: str) -> None:
    first = traces[0]
    for tr in traces[1:]:
        if (tr.num_experts, tr.num_layers, tr.top_k) != (
            first.num_experts,
            first.num_layers,
            first.top_k,
        ):
            raise InputError(
                f"{name}: mismatched shards: {tr.name} has N={tr.num_experts}, "
                f"L={tr.num_layers}, m={tr.top_k} but {first.name} has N={first.num_experts}, "
                f"L={first.num_layers}, m={first.top_k}"
            )
        if tr.layers != first.layers:
            raise InputError(
                f"{name}: mismatched shards: {tr.name} holds layers {tr.layers} but "
                f"{first.name} holds layers {first.layers}"
            )
        models = (tr.meta.get("model"), first.meta.get("model"))
        if None not in models and models[0] != models[1]:
            raise InputError(
                f"{name}: mismatched shards: {tr.name} holds model {models[0]!r} but "
                f"{first.name} holds model {models[1]!r}"
            )


# ------------------------------------------------------------------------------------------
# I/O


def save_trace(trace: RoutingTrace, path: str | os.PathLike, *, compress: bool = True) -> Path:
    """Write ``trace`` to ``path`` (.npz), atomically."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {
        "experts": trace.experts.astype(_id_dtype(trace.num_experts), copy=False),
        "doc_offsets": trace.doc_offsets.astype(np.int64, copy=False),
        "meta": np.array(json.dumps(to_jsonable(trace.meta))),
    }
    if trace.weights is not None:
        arrays["weights"] = trace.weights
    with atomic_path(path, suffix=".npz") as tmp:
        with open(tmp, "wb") as fh:
            (np.savez_compressed if compress else np.savez)(fh, **arrays)
    return path


_MEMBERS = ("experts", "doc_offsets", "weights", "meta")


def _read_npz(path: Path) -> RoutingTrace:
    name = str(path)
    arrays = read_members(path, _MEMBERS)
    for key in ("experts", "doc_offsets", "meta"):
        if key not in arrays:
            raise InputError(f"{name}: missing array {key!r} (has {sorted(arrays)})")
    meta_raw = arrays["meta"]
    if meta_raw.ndim != 0 or meta_raw.dtype.kind not in "US":
        raise InputError(f"{name}: 'meta' must be a JSON object string, got {meta_raw.dtype}")
    meta = parse_json(str(meta_raw), f"{name}: 'meta'", what="JSON object string")
    if not isinstance(meta, dict):
        raise InputError(f"{name}: 'meta' must be a JSON object string, not {type(meta).__name__}")
    if "num_experts" not in meta:
        raise InputError(f"{name}: 'meta' lacks num_experts")
    return RoutingTrace(
        experts=arrays["experts"],
        doc_offsets=arrays["doc_offsets"],
        num_experts=meta["num_experts"],
        weights=arrays.get("weights"),
        meta=meta,
        name=name,
    )


class TraceReader:
    """A trace on disk: one ``.npz`` file or a directory of ``.npz`` shards, read lazily.

    The header (N, L, m, T, D) comes from reading each shard's small arrays; ``iter_shards``
    yields one validated :class:`RoutingTrace` at a time.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise InputError(f"{self.path}: no such trace file or directory")
        if self.path.is_dir():
            self.files = sorted(p for p in self.path.glob("*.npz") if not p.name.startswith("."))
            if not self.files:
                raise InputError(f"{self.path}: directory holds no .npz trace shards")
            from specmoe.formats.shards import check_shard_headers

            check_shard_headers(self.path, self.files)
        else:
            self.files = [self.path]
        first = self._shard(0)
        self.num_experts = first.num_experts
        self.num_layers = first.num_layers
        self.top_k = first.top_k
        self.meta = first.meta
        self._first = first

    def _shard(self, i: int) -> RoutingTrace:
        return _read_npz(self.files[i])

    def iter_shards(self) -> Iterator[RoutingTrace]:
        """Each shard, validated, and consistent with the others (N, L, m, layers, model)."""
        for i in range(len(self.files)):
            tr = self._first if i == 0 else self._shard(i)
            if i:
                _check_compatible([self._first, tr], name=str(self.path))
            yield tr

    def longest_document(self) -> int | None:
        """Tokens of the longest document, from each shard's small ``doc_offsets`` array alone
        (the expert arrays are not read); None when a shard is unreadable (reading it with
        :meth:`iter_shards` then says why)."""
        longest = 0
        for path in self.files:
            try:
                off = read_members(path, ("doc_offsets",))["doc_offsets"].astype(np.int64)
            except (InputError, KeyError, ValueError, TypeError):
                return None
            if off.ndim != 1 or off.size < 2:
                return None
            longest = max(longest, int(np.diff(off).max()))
        return longest

    def load(self) -> RoutingTrace:
        shards = list(self.iter_shards())
        if len(shards) == 1:
            return shards[0]
        return RoutingTrace.concatenate(shards, name=str(self.path))


def open_trace(path: str | os.PathLike) -> TraceReader:
    """Open a trace file or shard directory (see the module docstring for the format)."""
    return TraceReader(path)


def load_trace(path: str | os.PathLike) -> RoutingTrace:
    """Read a whole trace (file or shard directory) into memory, validated."""
    return open_trace(path).load()
