"""Imports and exports of routing traces: vLLM and SGLang routed experts, Parquet.

Legend for shapes: ``T`` tokens, ``R`` layers an engine records, ``L`` MoE layers kept,
``m`` slots (experts per token), ``D`` documents. The formats are described in
``docs/trace-format.md``; every import ends in :class:`RoutingTrace`, validated like a
``.npz`` trace.

Engines (``--enable-return-routed-experts``) return, per request, an integer array
``[T, R, m]``: vLLM as a NumPy array (offline), nested lists or a base64 ``.npy`` (server);
SGLang as base64 of the flattened row-major array (int32 unless ``routed_experts_dtype``
says otherwise). ``R`` may count every decoder layer (dense ones hold placeholders): with a
model spec the MoE layers are kept by index; without one, layers that hold one constant
value (-1, or a value repeated across the m>1 slots) are dropped as placeholders.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.errors import InputError
from specmoe.routing.trace import RoutingTrace, TraceReader, open_trace, save_trace

__all__ = ["import_routed_experts", "load_parquet", "save_parquet"]

ENGINES = ("vllm", "sglang")
FORMATS_IN = ("npz", "vllm", "sglang", "parquet")
FORMATS_OUT = ("npz", "parquet")
_RESPONSE_KEYS = {"choices", "meta_info", "routed_experts", "prompt_routed_experts"}
_META_KEY = b"specmoe.meta"
_WDTYPE_KEY = b"specmoe.weights_dtype"


# ------------------------------------------------------------------------------------------
# engine imports: collect (document name, payload parts, dtype hint), decode, stack


def _natural_key(p: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def _load_npy(path: Path) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as exc:  # numpy raises many types on corrupt files
        raise InputError(
            f"{path}: not a readable .npy array ({type(exc).__name__}: {exc})".splitlines()[0]
        ) from None
    if not isinstance(arr, np.ndarray):
        arr.close()
        raise InputError(f"{path}: a .npz archive, not one .npy array per request")
    return arr


def _from_response(obj: dict, base: str) -> list[tuple[str, list[Any], str | None]]:
    """Documents of one engine response (vLLM or SGLang, native or OpenAI-compatible)."""
    name = str(obj.get("id", base))
    prompt = [obj["prompt_routed_experts"]] if obj.get("prompt_routed_experts") is not None else []
    if isinstance(obj.get("choices"), list):
        docs = []
        for i, ch in enumerate(obj["choices"]):
            if not isinstance(ch, dict):
                raise InputError(f"{base}: choice {i} is not an object")
            ext = ch.get("sgl_ext") if isinstance(ch.get("sgl_ext"), dict) else {}
            payload = ch.get("routed_experts", ext.get("routed_experts"))
            if payload is None:
                raise InputError(
                    f"{base}: choice {i} has no 'routed_experts' (was the server "
                    f"started with --enable-return-routed-experts?)"
                )
            dtype = ch.get("routed_experts_dtype", ext.get("routed_experts_dtype"))
            docs.append(
                (name if len(obj["choices"]) == 1 else f"{name}/{i}", [*prompt, payload], dtype)
            )
        return docs
    info = obj.get("meta_info") if isinstance(obj.get("meta_info"), dict) else obj
    if info.get("routed_experts") is None:
        raise InputError(
            f"{base}: response has no 'routed_experts' (was the server started "
            f"with --enable-return-routed-experts?)"
        )
    name = str(info.get("id", name))
    return [(name, [*prompt, info["routed_experts"]], info.get("routed_experts_dtype"))]


def _from_json_value(value: Any, base: str) -> list[tuple[str, list[Any], str | None]]:
    if isinstance(value, dict) and _RESPONSE_KEYS & value.keys():
        return _from_response(value, base)
    if isinstance(value, list | str):
        return [(base, [value], None)]
    raise InputError(
        f"{base}: expected nested lists, a base64 string or an engine response, "
        f"got {type(value).__name__}"
    )


def _collect(path: Path) -> list[tuple[str, list[Any], str | None]]:
    """One entry per document, in file order (a directory: natural order of names)."""
    if path.is_dir():
        files = sorted(
            (p for p in path.glob("*.npy") if not p.name.startswith(".")), key=_natural_key
        )
        if not files:
            raise InputError(f"{path}: directory holds no .npy files (one per request)")
        return [(p.stem, [_load_npy(p)], None) for p in files]
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.suffix == ".npy":
        return [(path.stem, [_load_npy(path)], None)]
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            values = [json.loads(line) for line in text.splitlines() if line.strip()]
            top: Any = values
        else:
            top = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(
            f"{path}: not readable JSON ({type(exc).__name__}: {exc})".splitlines()[0]
        ) from None
    if isinstance(top, dict) and not (_RESPONSE_KEYS & top.keys()):  # keyed by request id
        items = [(str(k), v) for k, v in top.items()]
    elif isinstance(top, list) and path.suffix != ".jsonl" and _int_depth(top) in (1, 3):
        items = [(path.stem, top)]  # one request: [len, layers, top_k] or flattened
    elif isinstance(top, list):
        items = [(str(i), v) for i, v in enumerate(top)]
    else:
        items = [(path.stem, top)]
    docs = [d for key, v in items for d in _from_json_value(v, f"{path}: {key}")]
    if not docs:
        raise InputError(f"{path}: holds no requests")
    return [(n.removeprefix(f"{path}: "), parts, dt) for n, parts, dt in docs]


def _int_depth(value: Any) -> int:
    """How deep lists nest above the first int (0 when the first leaf is not an int)."""
    depth = 0
    while isinstance(value, list) and value:
        value, depth = value[0], depth + 1
    return depth if isinstance(value, int) and not isinstance(value, bool) else 0


def _decode(
    payload: Any, dtype_hint: str | None, *, layers: int | None, top_k: int | None, name: str
) -> np.ndarray:
    """One payload as [T, R, m] integers."""
    if isinstance(payload, str):
        try:
            raw = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise InputError(f"{name}: 'routed_experts' string is not base64") from None
        if raw[:6] == b"\x93NUMPY":
            try:
                arr = np.load(io.BytesIO(raw), allow_pickle=False)
            except Exception as exc:
                raise InputError(
                    f"{name}: base64 .npy payload is corrupt ({type(exc).__name__})"
                ) from None
        else:
            try:
                dtype = (
                    np.dtype(dtype_hint or "int32") if isinstance(dtype_hint, str | None) else None
                )
            except (TypeError, ValueError):
                dtype = None
            if dtype is None or dtype.kind not in "iu":
                raise InputError(
                    f"{name}: routed_experts_dtype {dtype_hint!r} is not an integer type"
                ) from None
            if len(raw) % dtype.itemsize:
                raise InputError(
                    f"{name}: {len(raw)} bytes are not a whole number of {dtype} expert ids"
                )
            arr = np.frombuffer(raw, dtype=dtype)
    else:
        try:
            arr = np.asarray(payload)
        except (ValueError, TypeError, OverflowError):
            raise InputError(
                f"{name}: ragged nested lists (requests must be [len, layers, top_k])"
            ) from None
    if arr.size == 0:
        raise InputError(f"{name}: no tokens (an empty routed_experts of shape {arr.shape})")
    if not np.issubdtype(arr.dtype, np.integer):
        raise InputError(
            f"{name}: expert ids must be integers, got dtype {arr.dtype} and shape {arr.shape}"
        )
    if arr.dtype == np.uint64:  # numpy would join uint64 and int64 records as floats
        if arr.max() > np.iinfo(np.int64).max:
            raise InputError(f"{name}: expert id {int(arr.max())} is out of any range")
        arr = arr.astype(np.int64)
    if arr.ndim == 3:
        if (layers, top_k) != (None, None) and arr.shape[1:] != (
            layers or arr.shape[1],
            top_k or arr.shape[2],
        ):
            raise InputError(
                f"{name}: shape {arr.shape} disagrees with layers={layers}, "
                f"top_k={top_k} (from --layers/--top-k or --model)"
            )
        return arr
    if arr.ndim == 2 and (layers or top_k):
        width = arr.shape[1]
        r, k = (layers, width // layers) if layers else (width // top_k, top_k)
        if (top_k and layers and layers * top_k != width) or r * k != width or not r * k:
            raise InputError(
                f"{name}: rows of {width} ids do not split into --layers {layers} x --top-k {top_k}"
            )
        return arr.reshape(arr.shape[0], r, k)
    if arr.ndim == 1 and layers and top_k:
        if arr.size % (layers * top_k):
            raise InputError(
                f"{name}: {arr.size} ids are not a whole number of tokens of "
                f"--layers {layers} x --top-k {top_k}"
            )
        return arr.reshape(-1, layers, top_k)
    need = "--layers and --top-k" if arr.ndim <= 1 else "--layers or --top-k"
    raise InputError(f"{name}: ids of shape {arr.shape} need {need} to become [len, layers, top_k]")


def _moe_layers(experts: np.ndarray, spec: Any, *, name: str) -> tuple[np.ndarray, list[int]]:
    """Keep the MoE layers of a [T, R, m] record: [T, L, m] and their model layer indices."""
    r, m = experts.shape[1:]
    if spec is not None:
        if m != spec.top_k:
            raise InputError(
                f"{name}: records {m} experts per token but model {spec.name} routes {spec.top_k}"
            )
        keep = list(spec.moe_layer_indices)
        if r == spec.num_moe_layers:
            return experts, keep
        if r == spec.num_hidden_layers and max(keep) < r:
            return experts[:, keep], keep
        raise InputError(
            f"{name}: records {r} layers but model {spec.name} has "
            f"{spec.num_moe_layers} MoE layers of {spec.num_hidden_layers}"
        )
    flat = experts.reshape(-1, r, m)
    first = flat[:1, :, :1]
    constant = np.all(flat == first, axis=(0, 2))  # [R]
    placeholder = constant & ((first[0, :, 0] < 0) | (m > 1))
    keep = [i for i in range(r) if not placeholder[i]]
    if not keep:
        raise InputError(f"{name}: every recorded layer holds placeholders only")
    return (experts if len(keep) == r else experts[:, keep]), keep


def import_routed_experts(
    path: str | os.PathLike,
    *,
    engine: str,
    num_experts: int | None = None,
    model: str | None = None,
    layers: int | None = None,
    top_k: int | None = None,
) -> RoutingTrace:
    """Read the routed experts an engine returned (one document per request).

    ``path``: one ``.npy`` ``[T, R, m]``, a directory of them, or a JSON / JSON-lines file
    (see the module docstring). ``num_experts`` (N) or ``model`` (a spec for
    :func:`specmoe.spec.resolve_spec`) must be given; every id is checked against [0, N).
    """
    if engine not in ENGINES:
        raise InputError(f"engine {engine!r} unknown (choose from {', '.join(ENGINES)})")
    path = Path(path)
    spec = _spec(model)
    n = _num_experts(num_experts, spec, None, name=str(path))
    if (
        spec is not None
        and layers is None
        and top_k is None
        and (spec.num_hidden_layers == spec.num_moe_layers)
    ):  # flattened records: unambiguous
        layers, top_k = spec.num_moe_layers, spec.top_k
    arrays, names = [], []
    for doc, parts, dtype in _collect(path):
        label = f"{path}: request {doc}"
        dec = [_decode(p, dtype, layers=layers, top_k=top_k, name=label) for p in parts]
        if len({a.shape[1:] for a in dec}) > 1:
            raise InputError(
                f"{label}: prompt and output routing differ in shape {[a.shape for a in dec]}"
            )
        arr = dec[0] if len(dec) == 1 else np.concatenate(dec)
        if arr.shape[0] == 0:
            raise InputError(f"{label}: no tokens")
        if arrays and arr.shape[1:] != arrays[0].shape[1:]:
            raise InputError(
                f"{label}: shape {arr.shape} disagrees with request {names[0]} "
                f"{arrays[0].shape} in layers or top_k"
            )
        arrays.append(arr)
        names.append(doc)
    lengths = [a.shape[0] for a in arrays]
    stacked = np.concatenate(arrays)
    experts, kept = _moe_layers(stacked, spec, name=str(path))
    meta = {
        "source": engine,
        "documents": names,
        "layers": kept,
        "engine_layers": int(stacked.shape[1]),
    }
    if spec is not None:
        meta["model"] = spec.name
    if 0 <= experts.min() and experts.max() < n:  # else validation names the bad id
        experts = experts.astype(np.int16 if n <= np.iinfo(np.int16).max else np.int32)
    return RoutingTrace(
        experts=experts,
        doc_offsets=np.concatenate([[0], np.cumsum(lengths)]),
        num_experts=n,
        meta=meta,
        name=str(path),
    )


def _spec(model: str | None) -> Any:
    if model is None:
        return None
    from specmoe.spec import resolve_spec

    return resolve_spec(model)


def _num_experts(given: int | None, spec: Any, found: Any, *, name: str) -> int:
    """N from --num-experts, the model spec and the file; they must agree."""
    cands = {
        k: v
        for k, v in (
            ("--num-experts", given),
            ("--model", getattr(spec, "num_experts", None)),
            ("the file's meta", found),
        )
        if v is not None
    }
    if not cands:
        raise InputError(
            f"{name}: the number of experts is unknown; give --num-experts N or --model SPEC"
        )
    for k, v in cands.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(
                f"{name}: number of experts ({k}) must be a positive integer, got {v!r:.40}"
            )
    if len(set(cands.values())) > 1:
        raise InputError(
            f"{name}: number of experts disagrees: "
            + ", ".join(f"{k} says {v}" for k, v in cands.items())
        )
    return next(iter(cands.values()))


# ------------------------------------------------------------------------------------------
# Parquet: one row per token; doc, doc_name, pos, layer_<l> list<int>, weights_<l> list<float>


def save_parquet(trace: RoutingTrace | TraceReader, path: str | os.PathLike) -> Path:
    """Write a trace (in memory, or a reader streamed shard by shard) as Parquet, atomically."""
    _write_parquet(trace, Path(path))
    return Path(path)


def _write_parquet(trace: RoutingTrace | TraceReader, path: Path) -> tuple[RoutingTrace, int, int]:
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
        try:
            meta = json.loads(md[_META_KEY])
        except (ValueError, RecursionError):
            meta = None  # type: ignore[assignment]
        if not isinstance(meta, dict):
            raise InputError(f"{name}: metadata 'specmoe.meta' is not a JSON object")
    spec = _spec(model)
    n = _num_experts(num_experts, spec, meta.get("num_experts"), name=name)
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


# ------------------------------------------------------------------------------------------
# `specmoe convert`

_SUFFIX_IN = {".npz": "npz", ".parquet": "parquet", ".pq": "parquet"}
_SUFFIX_OUT = {".npz": "npz", ".parquet": "parquet", ".pq": "parquet"}


def _infer_in(path: Path) -> str:
    if path.is_dir():
        if any(path.glob("*.npz")):
            return "npz"
        raise InputError(
            f"{path}: cannot tell the input format of this directory; give "
            f"--from vllm or --from sglang for .npy requests"
        )
    fmt = _SUFFIX_IN.get(path.suffix.lower())
    if fmt is None:
        raise InputError(
            f"{path}: cannot tell the input format from suffix "
            f"{path.suffix or '(none)'!r}; give --from ({', '.join(FORMATS_IN)})"
        )
    return fmt


def _infer_out(path: Path) -> str:
    fmt = _SUFFIX_OUT.get(path.suffix.lower())
    if fmt is None:
        raise InputError(
            f"{path}: cannot tell the output format from suffix "
            f"{path.suffix or '(none)'!r}; give --to ({', '.join(FORMATS_OUT)})"
        )
    return fmt


def add_arguments(parser) -> None:
    parser.add_argument("input", metavar="IN", help="trace file or directory to read")
    parser.add_argument("output", metavar="OUT", help="file to write (.npz or .parquet)")
    parser.add_argument(
        "--from",
        dest="src",
        choices=FORMATS_IN,
        default=None,
        help="input format (default: from the suffix)",
    )
    parser.add_argument(
        "--to",
        dest="dst",
        choices=FORMATS_OUT,
        default=None,
        help="output format (default: from the suffix)",
    )
    parser.add_argument(
        "--num-experts",
        type=int,
        default=None,
        metavar="N",
        help="experts per MoE layer (ids are checked against [0, N))",
    )
    parser.add_argument(
        "--model",
        default=None,
        metavar="SPEC",
        help="model preset, HF config or spec JSON (gives N, m, MoE layers)",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=None,
        metavar="R",
        help="layers per token in a flattened engine record",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        default=None,
        metavar="K",
        help="experts per token in a flattened engine record",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args) -> int:
    from specmoe._io import dumps_json

    src, dst = Path(args.input), Path(args.output)
    for flag, v in (
        ("--num-experts", args.num_experts),
        ("--layers", args.layers),
        ("--top-k", args.top_k),
    ):
        if v is not None and v < 1:
            raise InputError(f"{flag} must be a positive integer, got {v}")
    fmt_in = args.src or _infer_in(src)
    fmt_out = args.dst or _infer_out(dst)
    if src.exists() and dst.exists() and src.resolve() == dst.resolve():
        raise InputError(f"{dst}: OUT is the input itself; write to another path")
    trace: RoutingTrace | TraceReader
    if fmt_in == "npz":
        trace = open_trace(src)
        spec = _spec(args.model)
        _num_experts(args.num_experts, spec, trace.num_experts, name=str(src))
        if spec is not None and spec.top_k != trace.top_k:
            raise InputError(
                f"{src}: holds {trace.top_k} experts per token but model "
                f"{spec.name} routes {spec.top_k}"
            )
    elif fmt_in == "parquet":
        trace = load_parquet(src, num_experts=args.num_experts, model=args.model)
    else:
        trace = import_routed_experts(
            src,
            engine=fmt_in,
            num_experts=args.num_experts,
            model=args.model,
            layers=args.layers,
            top_k=args.top_k,
        )
    if fmt_out == "npz":
        head = trace if isinstance(trace, RoutingTrace) else trace.load()
        save_trace(head, dst)
        tokens, docs = head.num_tokens, head.num_documents
    else:
        head, tokens, docs = _write_parquet(trace, dst)
    result = {
        "input": str(src),
        "from": fmt_in,
        "output": str(dst),
        "to": fmt_out,
        "num_experts": head.num_experts,
        "num_layers": head.num_layers,
        "top_k": head.top_k,
        "layers": head.layers,
        "num_tokens": tokens,
        "num_documents": docs,
        "with_weights": head.weights is not None,
    }
    if "engine_layers" in head.meta:
        result["dropped_layers"] = sorted(set(range(head.meta["engine_layers"])) - set(head.layers))
    if args.json:
        print(dumps_json(result))
    else:
        print(
            f"{src} ({fmt_in}) -> {dst} ({fmt_out}): {tokens} tokens in {docs} "
            f"document{'s' * (docs != 1)}, "
            f"L={head.num_layers}, m={head.top_k}, N={head.num_experts}"
        )
    return 0
