"""Imports of routing recorded by serving engines: vLLM and SGLang routed experts.

Legend for shapes: ``T`` tokens, ``R`` layers an engine records, ``L`` MoE layers kept,
``m`` slots (experts per token), ``D`` documents. The formats are described in
``docs/trace-format.md``; the layouts of responses, streams and folders are read by
:mod:`specmoe.formats.engine_layouts`; every import ends in :class:`RoutingTrace`, validated
like a ``.npz`` trace.

Engines (``--enable-return-routed-experts``) return, per request, an integer array
``[T, R, m]``: vLLM as a NumPy array (offline), nested lists (server, <= 0.21) or a base64
``.npy`` (server, 0.33); SGLang as base64 of the flattened row-major array (int32 unless
``routed_experts_dtype`` says uint16 or uint8). Both engines record every decoder layer
(``R`` = the model's ``num_hidden_layers``), dense ones as zeros: with a model spec the MoE
layers are kept by index and the dense ones must hold one constant value; without one, layers
that hold one constant value (-1, or a value repeated across the m>1 slots) are dropped as
placeholders. Requests without routing (aborted, or empty) are skipped: recorded in the
trace's ``meta["skipped"]`` and said in one :class:`SkippedRequestsWarning`.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.errors import InputError
from specmoe.formats._common import model_spec, read_npy, resolve_num_experts
from specmoe.formats.engine_layouts import collect
from specmoe.formats.trace import RoutingTrace

__all__ = ["SkippedRequestsWarning", "import_routed_experts", "skipped_summary"]

ENGINES = ("vllm", "sglang")
IDS_DTYPES = ("int32", "uint16", "uint8")  # SGLang's wire dtypes (routed_experts_wire.py)


class SkippedRequestsWarning(UserWarning):
    """Some requests of an engine file carried no routing and were skipped."""


def _skipped_text(skipped: list[dict], total: int, shown: int = 8) -> str:
    names = ", ".join(f"{s['request']} ({s['reason']})" for s in skipped[:shown])
    more = f", and {len(skipped) - shown} more" if len(skipped) > shown else ""
    return (
        f"skipped {len(skipped)} of {total} request{'s' * (total != 1)} "
        f"without routing: {names}{more}"
    )


def skipped_summary(path: Any, skipped: list[dict], total: int) -> str:
    """One line: how many requests of ``total`` were skipped, which (the first 8), and why."""
    return f"{path}: {_skipped_text(skipped, total)}"


# ------------------------------------------------------------------------------------------
# one payload -> integer array; shapes


def _integer_dtype(value: Any) -> np.dtype | None:
    """The integer dtype a record (or ``ids_dtype``) names, as SGLang reads it (stripped,
    lower case); None when it names none."""
    try:
        dtype = np.dtype(value.strip().lower()) if isinstance(value, str) else None
    except Exception:  # numpy's parser raises several types on odd strings
        dtype = None
    return dtype if dtype is not None and dtype.kind in "iu" else None


def _raw(payload: Any, dtype_hint: Any, default: np.dtype, *, name: str) -> np.ndarray:
    """One payload as an integer array of any shape (size 0 allowed: the caller skips it)."""
    if isinstance(payload, str):
        try:
            raw = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise InputError(f"{name}: 'routed_experts' string is not base64") from None
        if raw[:6] == b"\x93NUMPY":  # vLLM: numpy2base64, an .npy file's bytes
            arr = read_npy(io.BytesIO(raw), len(raw), f"{name}: base64 .npy payload")
        else:  # SGLang: the flattened ids' bytes
            dtype = default if dtype_hint is None else _integer_dtype(dtype_hint)
            if dtype is None:
                raise InputError(
                    f"{name}: routed_experts_dtype {dtype_hint!r:.40} is not an integer type"
                )
            if len(raw) % dtype.itemsize:
                raise InputError(
                    f"{name}: {len(raw)} bytes are not a whole number of {dtype} expert ids"
                )
            arr = np.frombuffer(raw, dtype=dtype.newbyteorder("<"))
    else:
        try:
            arr = np.asarray(payload)
        except (ValueError, TypeError, OverflowError, RecursionError):
            raise InputError(
                f"{name}: ragged nested lists (requests must be [len, layers, top_k])"
            ) from None
    if arr.size == 0:
        return arr
    if not np.issubdtype(arr.dtype, np.integer):
        raise InputError(
            f"{name}: expert ids must be integers, got dtype {arr.dtype} and shape {arr.shape}"
        )
    if arr.dtype == np.uint64:  # numpy would join uint64 and int64 records as floats
        if arr.max() > np.iinfo(np.int64).max:
            raise InputError(f"{name}: expert id {int(arr.max())} is out of any range")
        arr = arr.astype(np.int64)
    return arr


def _fits(arr: np.ndarray, r: int, k: int) -> bool:
    if arr.ndim == 1:
        return arr.size % (r * k) == 0
    return arr.ndim == 2 and arr.shape[1] == r * k


def _reshape(
    arr: np.ndarray, layers: int | None, top_k: int | None, *, name: str, from_spec: bool
) -> np.ndarray:
    """One payload as [T, R, m]. A shape error names the argument ``layers`` or ``top_k``
    (``model`` when ``from_spec``: the importer took both from the model spec)."""

    def blame(arg: str) -> str:
        return "model" if from_spec else arg

    told = f"layers={layers}, top_k={top_k}" + (" (from the model spec)" if from_spec else "")
    if arr.ndim == 3:
        if (layers, top_k) != (None, None) and arr.shape[1:] != (
            layers or arr.shape[1],
            top_k or arr.shape[2],
        ):
            wrong = "layers" if layers and arr.shape[1] != layers else "top_k"
            raise InputError(
                f"{name}: shape {arr.shape} disagrees with {told}", argument=blame(wrong)
            )
        return arr
    if arr.ndim == 2 and (layers or top_k):
        width = arr.shape[1]
        r, k = (layers, width // layers) if layers else (width // top_k, top_k)
        if (top_k and layers and layers * top_k != width) or r * k != width or not r * k:
            raise InputError(
                f"{name}: rows of {width} ids do not split into {told}",
                argument=blame("layers" if layers else "top_k"),
            )
        return arr.reshape(arr.shape[0], r, k)
    if arr.ndim == 1 and layers and top_k:
        if arr.size % (layers * top_k):
            raise InputError(
                f"{name}: {arr.size} ids are not a whole number of tokens of {told}",
                argument=blame("layers"),
            )
        return arr.reshape(-1, layers, top_k)
    need = "layers and top_k" if arr.ndim <= 1 else "layers or top_k"
    raise InputError(
        f"{name}: ids of shape {arr.shape} need {need} to become [len, layers, top_k]",
        argument="top_k" if layers else "layers",
    )


def _constant_layers(experts: np.ndarray) -> np.ndarray:
    """[R] bool: the layers whose every id (all tokens, all slots) is one value."""
    return np.all(experts == experts[:1, :, :1], axis=(0, 2))


def _spec_shape(raws: list[tuple[str, np.ndarray]], spec: Any) -> tuple[int | None, int | None]:
    """(R, m) of flattened records from a model spec: every decoder layer (what vLLM 0.33 and
    SGLang 0.5 record) or the MoE layers only, whichever splits every record; every decoder
    layer first, unless its dense layers would not hold one constant value."""
    k = spec.top_k
    cands = list(dict.fromkeys((spec.num_hidden_layers, spec.num_moe_layers)))
    flat = [(n, a) for n, a in raws if a.ndim < 3]
    if not flat:  # [T, R, m] records: _moe_layers maps them
        return None, None
    fits = [r for r in cands if all(_fits(a, r, k) for _, a in flat)]
    if not fits:
        r = cands[0]
        label, arr = next((n, a) for n, a in flat if not _fits(a, r, k))
        if len(cands) == 1:  # unambiguous: the model is at fault
            _reshape(arr, r, k, name=label, from_spec=True)
        raise InputError(
            f"{label}: {arr.size} ids split into neither the {cands[0]} decoder layers nor "
            f"the {cands[1]} MoE layers of model {spec.name} at top_k {k}: need layers and "
            "top_k for another layout",
            argument="layers",
        )
    if len(fits) > 1 and fits[0] == spec.num_hidden_layers:
        dense = [i for i in range(fits[0]) if i not in set(spec.moe_layer_indices)]
        ok = all(
            _constant_layers(a.reshape(-1, fits[0], k))[dense].all() for _, a in flat if a.size
        )
        if not ok:
            return fits[1], k
    return fits[0], k


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
            dense = [i for i in range(r) if i not in set(keep)]
            varying = [i for i in dense if not _constant_layers(experts[:, [i]])[0]]
            if varying:
                raise InputError(
                    f"{name}: layer {varying[0]} is dense in model {spec.name} but its ids vary "
                    "(engines record a dense layer as one constant): is the record from this "
                    "model?"
                )
            return experts[:, keep], keep
        raise InputError(
            f"{name}: records {r} layers but model {spec.name} has "
            f"{spec.num_moe_layers} MoE layers of {spec.num_hidden_layers}"
        )
    first = experts[:1, :, :1]
    constant = _constant_layers(experts)  # [R]
    placeholder = constant & ((first[0, :, 0] < 0) | (m > 1))
    keep = [i for i in range(r) if not placeholder[i]]
    if not keep:
        raise InputError(f"{name}: every recorded layer holds placeholders only")
    return (experts if len(keep) == r else experts[:, keep]), keep


# ------------------------------------------------------------------------------------------
# the import


def import_routed_experts(
    path: str | os.PathLike,
    *,
    engine: str,
    num_experts: int | None = None,
    model: str | None = None,
    layers: int | None = None,
    top_k: int | None = None,
    start: int | None = None,
    ids_dtype: str | None = None,
) -> RoutingTrace:
    """Read the routed experts an engine returned (one document per request).

    ``path``: one ``.npy`` ``[T, R, m]``; a JSON file (a response, a list of them, requests
    keyed by id, nested lists); a JSON-lines file or saved server-sent-event stream (one
    response or chunk per line, ``data:`` prefixes optional); or a folder of such files (see
    :mod:`specmoe.formats.engine_layouts`). ``num_experts`` (N) or ``model`` (a spec for
    :func:`specmoe.spec.resolve_spec`) must be given; every id is checked against [0, N).
    ``layers`` and ``top_k`` give the shape of flattened records (SGLang's base64); a model
    spec gives it too. ``start``: the position of row 0 in each request's sequence where the
    record does not say (the request's ``routed_experts_prompt_start`` in vLLM,
    ``routed_experts_start_len`` in SGLang; default 0); ``meta["start_offsets"]`` holds each
    document's. ``ids_dtype``: the dtype of raw base64 ids where the record names none
    (default int32). Requests without routing are skipped (``meta["skipped"]`` and one
    :class:`SkippedRequestsWarning`); a file with none usable is an error. Errors in an
    argument name it (``InputError.argument``); errors in the file name the file.
    """
    if engine not in ENGINES:
        raise InputError(
            f"{engine!r} unknown (choose from {', '.join(ENGINES)})", argument="engine"
        )
    if start is not None and (isinstance(start, bool) or not isinstance(start, int) or start < 0):
        raise InputError(f"must be a non-negative integer, got {start!r:.40}", argument="start")
    default = np.dtype(np.int32)
    if ids_dtype is not None:
        default = _integer_dtype(ids_dtype)
        if default is None:
            raise InputError(
                f"{ids_dtype!r:.40} is not an integer type (SGLang sends {', '.join(IDS_DTYPES)})",
                argument="ids_dtype",
            )
    path = Path(path)
    spec = model_spec(model)
    n = resolve_num_experts(num_experts, spec, None, name=str(path))
    requests, skipped_reqs = collect(path)
    skipped = [{"request": s.name, "reason": s.reason} for s in skipped_reqs]

    # decode every part; a request whose parts are all empty is skipped
    decoded: list[tuple[Any, str, list[np.ndarray]]] = []
    for req in requests:
        label = f"{path}: request {req.name}"
        parts = [_raw(p, req.dtype, default, name=label) for p in req.parts]
        parts = [a for a in parts if a.size]
        if not parts:
            skipped.append({"request": req.name, "reason": "no tokens"})
            continue
        decoded.append((req, label, parts))
    total = len(decoded) + len(skipped)
    if not decoded:
        if not skipped:
            raise InputError(f"{path}: holds no requests")
        raise InputError(
            f"{path}: no request with routing ({_skipped_text(skipped, total)}; was the "
            "server started with "
            "--enable-return-routed-experts?)"
        )

    from_spec = spec is not None and layers is None and top_k is None
    if from_spec:
        layers, top_k = _spec_shape([(lb, a) for _, lb, ps in decoded for a in ps], spec)
    arrays, names, starts = [], [], {}
    for req, label, parts in decoded:
        dec = [_reshape(a, layers, top_k, name=label, from_spec=from_spec) for a in parts]
        if len({a.shape[1:] for a in dec}) > 1:
            raise InputError(
                f"{label}: prompt and output routing differ in shape {[a.shape for a in dec]}"
            )
        arr = dec[0] if len(dec) == 1 else np.concatenate(dec)
        if arrays and arr.shape[1:] != arrays[0].shape[1:]:
            raise InputError(
                f"{label}: shape {arr.shape} disagrees with request {names[0]} "
                f"{arrays[0].shape} in layers or top_k"
            )
        arrays.append(arr)
        names.append(req.name)
        starts[req.name] = req.start if req.start is not None else (start or 0)
    lengths = [a.shape[0] for a in arrays]
    stacked = np.concatenate(arrays)  # [T, R, m]
    experts, kept = _moe_layers(stacked, spec, name=str(path))
    meta: dict[str, Any] = {
        "source": engine,
        "documents": names,
        "layers": kept,
        "engine_layers": int(stacked.shape[1]),
        "start_offsets": starts,
    }
    if spec is not None:
        meta["model"] = spec.name
    if skipped:
        meta["skipped"] = skipped
        warnings.warn(SkippedRequestsWarning(skipped_summary(path, skipped, total)), stacklevel=2)
    if 0 <= experts.min() and experts.max() < n:  # else validation names the bad id
        experts = experts.astype(np.int16 if n <= np.iinfo(np.int16).max else np.int32)
    return RoutingTrace(
        experts=experts,
        doc_offsets=np.concatenate([[0], np.cumsum(lengths)]),
        num_experts=n,
        meta=meta,
        name=str(path),
    )
