"""Parquet routing traces: one row per token; ``doc``, ``doc_name``, ``pos``, ``layer_<l>``
``list<int>`` and ``weights_<l>`` ``list<float>`` (``docs/trace-format.md``).

Legend for shapes: ``T`` tokens, ``L`` MoE layers, ``m`` slots (experts per token).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.errors import InputError
from specmoe.formats._common import model_spec, parse_json, resolve_num_experts, sniff
from specmoe.formats.trace import RoutingTrace, TraceReader

__all__ = ["load_parquet", "save_parquet", "write_parquet"]


_META_KEY = b"specmoe.meta"


_WDTYPE_KEY = b"specmoe.weights_dtype"


def save_parquet(trace: RoutingTrace | TraceReader, path: str | os.PathLike) -> Path:
    """Write a trace (in memory, or a reader streamed shard by shard) as Parquet, atomically."""
    write_parquet(trace, Path(path))
    return Path(path)


def write_parquet(trace: RoutingTrace | TraceReader, path: Path) -> tuple[RoutingTrace, int, int]:
    """Write; return the first shard and the numbers of tokens and documents written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from specmoe._io import atomic_path, to_jsonable

    shards = iter([trace]) if isinstance(trace, RoutingTrace) else trace.iter_shards()
    first = next(shards)
    layers = first.layers
    id_type = pa.int16() if first.num_experts <= np.iinfo(np.int16).max else pa.int32()
    wtype = None
    if first.weights is not None:
        wtype = pa.float64() if first.weights.dtype == np.float64 else pa.float32()
    names = "documents" in first.meta
    fields = [pa.field("doc", pa.int32(), nullable=False)]
    fields += [pa.field("doc_name", pa.string())] if names else []
    fields += [pa.field("pos", pa.int32(), nullable=False)]
    fields += [pa.field(f"layer_{li}", pa.list_(id_type), nullable=False) for li in layers]
    if wtype is not None:
        fields += [pa.field(f"weights_{li}", pa.list_(wtype), nullable=False) for li in layers]
    meta = {k: v for k, v in first.meta.items() if k != "documents"}
    md = {_META_KEY: json.dumps(to_jsonable(meta)).encode()}
    if first.weights is not None:
        md[_WDTYPE_KEY] = str(first.weights.dtype).encode()
    schema = pa.schema(fields, metadata=md)
    doc0 = tokens = 0
    with (
        atomic_path(path) as tmp,
        pq.ParquetWriter(tmp, schema, compression="zstd", write_page_checksum=True) as writer,
    ):
        for tr in [first, *shards]:
            wd = None if tr.weights is None else tr.weights.dtype
            if wd != (None if first.weights is None else first.weights.dtype):
                raise InputError(
                    f"{tr.name}: shards disagree on router weights ({wd} here, "
                    f"{first.weights.dtype if wtype else None} in the first)"
                )
            for start in range(0, tr.num_tokens, _ROWS_PER_GROUP):
                writer.write_table(_table(tr, schema, doc0, names, wtype, start))
            doc0 += tr.num_documents
            tokens += tr.num_tokens
    return first, tokens, doc0


_ROWS_PER_GROUP = 1 << 20  # tokens per Parquet row group (bounds memory and list offsets)


def _table(tr: RoutingTrace, schema: Any, doc0: int, names: bool, wtype: Any, start: int) -> Any:
    """Rows ``start:start + _ROWS_PER_GROUP`` of one shard as an Arrow table."""
    import pyarrow as pa

    stop = min(tr.num_tokens, start + _ROWS_PER_GROUP)
    t, m = stop - start, tr.top_k
    lengths = np.diff(tr.doc_offsets)
    doc = np.repeat(np.arange(doc0, doc0 + tr.num_documents, dtype=np.int32), lengths)
    pos = (np.arange(tr.num_tokens) - np.repeat(tr.doc_offsets[:-1], lengths)).astype(np.int32)
    offsets = pa.array(np.arange(0, (t + 1) * m, m, dtype=np.int32))
    cols: list[Any] = [pa.array(doc[start:stop])]
    if names:
        docs = tr.meta.get("documents")
        cols.append(
            pa.array(
                np.array([str(d) for d in docs], dtype=object)[doc[start:stop] - doc0]
                if docs is not None
                else [None] * t,
                type=pa.string(),
            )
        )
    cols.append(pa.array(pos[start:stop]))
    id_type = schema.field(f"layer_{tr.layers[0]}").type.value_type
    for li in range(tr.num_layers):
        vals = pa.array(np.ascontiguousarray(tr.experts[start:stop, li]).ravel(), type=id_type)
        cols.append(pa.ListArray.from_arrays(offsets, vals))
    if wtype is not None:
        for li in range(tr.num_layers):
            vals = pa.array(
                np.ascontiguousarray(tr.weights[start:stop, li])
                .ravel()
                .astype(wtype.to_pandas_dtype()),
                type=wtype,
            )
            cols.append(pa.ListArray.from_arrays(offsets, vals))
    return pa.Table.from_arrays(cols, schema=schema)


def load_parquet(
    path: str | os.PathLike, *, num_experts: int | None = None, model: str | None = None
) -> RoutingTrace:
    """Read a Parquet trace (see :func:`save_parquet`; rows in any order), validated.

    N comes from the file's ``specmoe.meta`` metadata, ``num_experts`` or ``model``. Page
    checksums, where the file has them, are verified.
    """
    import pyarrow as pa

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such Parquet file")
    if sniff(path) != "parquet":
        raise InputError(f"{path}: not a Parquet trace (no Parquet signature)")
    try:
        return _read_parquet(path, num_experts=num_experts, model=model)
    except InputError:
        raise
    except (pa.ArrowException, OSError, ValueError, EOFError) as exc:  # a corrupt file
        raise InputError(
            f"{path}: not a readable Parquet trace ({type(exc).__name__}: {exc})".splitlines()[0]
        ) from None


def _read_parquet(path: Path, *, num_experts: int | None, model: str | None) -> RoutingTrace:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    name = str(path)
    table = pq.read_table(path, page_checksum_verification=True)
    md = table.schema.metadata or {}
    meta: dict[str, Any] = {}
    if _META_KEY in md:
        meta = parse_json(md[_META_KEY], f"{name}: metadata 'specmoe.meta'", what="JSON object")
        if not isinstance(meta, dict):
            raise InputError(f"{name}: metadata 'specmoe.meta' is not a JSON object")
    spec = model_spec(model)
    n = resolve_num_experts(num_experts, spec, meta.get("num_experts"), name=name)
    cols = set(table.column_names)
    for key in ("doc", "pos"):
        if key not in cols:
            raise InputError(f"{name}: missing column {key!r} (has {sorted(cols)!r:.120})")
    layer_cols = {int(c[6:]): c for c in cols if re.fullmatch(r"layer_\d+", c)}
    if not layer_cols:
        raise InputError(f"{name}: no layer_<i> columns of expert ids")
    layers = meta.get("layers")
    if not (isinstance(layers, list) and sorted(map(str, layers)) == sorted(map(str, layer_cols))):
        layers = sorted(layer_cols)
    layers = [int(li) for li in layers]
    wcols = {int(c[8:]): c for c in cols if re.fullmatch(r"weights_\d+", c)}
    if len(layer_cols) != sum(bool(re.fullmatch(r"layer_\d+", c)) for c in cols):
        raise InputError(f"{name}: two layer_<i> columns name the same layer")
    if wcols and set(wcols) != set(layers):
        raise InputError(
            f"{name}: weights_<i> columns {sorted(wcols)} do not match "
            f"layer_<i> columns {sorted(layers)}"
        )

    def ints(col: str) -> np.ndarray:
        c = table.column(col)
        if not pa.types.is_integer(c.type) or c.null_count:
            raise InputError(
                f"{name}: column {col!r} must hold integers without nulls, "
                f"got {c.type} with {c.null_count} nulls"
            )
        return c.to_numpy().astype(np.int64)

    def lists(col: str, kind: str, m: int | None) -> np.ndarray:
        c = table.column(col)
        if not (
            pa.types.is_list(c.type)
            or pa.types.is_large_list(c.type)
            or pa.types.is_fixed_size_list(c.type)
        ):
            raise InputError(f"{name}: column {col!r} must be a list column, got {c.type}")
        ok = (pa.types.is_integer if kind == "int" else pa.types.is_floating)(c.type.value_type)
        if not ok:
            raise InputError(
                f"{name}: column {col!r} holds {c.type.value_type}, not "
                f"{'integers' if kind == 'int' else 'floats'}"
            )
        lens = pc.list_value_length(c).to_numpy(zero_copy_only=False)
        m = int(lens[0]) if m is None and len(lens) else m
        flat = pc.list_flatten(c)
        if c.null_count or flat.null_count or np.any(lens != m):
            raise InputError(f"{name}: column {col!r} must hold {m} non-null values in every row")
        return flat.to_numpy().reshape(len(table), m)

    doc, pos = ints("doc"), ints("pos")
    if len(doc) == 0:
        raise InputError(f"{name}: empty trace (no rows)")
    order = np.lexsort((pos, doc))
    doc, pos = doc[order], pos[order]
    starts = np.flatnonzero(np.r_[True, doc[1:] != doc[:-1]])
    lengths = np.diff(np.r_[starts, len(doc)])
    if not np.array_equal(pos, np.arange(len(doc)) - np.repeat(starts, lengths)):
        bad = int(doc[np.flatnonzero(pos != np.arange(len(doc)) - np.repeat(starts, lengths))[0]])
        raise InputError(f"{name}: document {bad} does not hold each position 0..n-1 once")
    first = lists(layer_cols[layers[0]], "int", None)
    m = first.shape[1]
    experts = np.stack([first] + [lists(layer_cols[li], "int", m) for li in layers[1:]], axis=1)[
        order
    ]
    weights = None
    if wcols:
        weights = np.stack([lists(wcols[li], "float", m) for li in layers], axis=1)[order]
        wd = md.get(_WDTYPE_KEY, b"").decode(errors="replace")
        if wd in ("float16", "float32", "float64"):
            weights = weights.astype(wd)
    meta = dict(meta, layers=layers)
    meta.pop("documents", None)
    if "doc_name" in cols:
        names = table.column("doc_name").take(pa.array(order[starts]))
        if names.null_count == 0:
            meta["documents"] = [str(s) for s in names.to_pylist()]
    return RoutingTrace(
        experts=experts,
        doc_offsets=np.r_[0, np.cumsum(lengths)],
        num_experts=n,
        weights=weights,
        meta=meta,
        name=name,
    )
