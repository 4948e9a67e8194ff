"""Imports of routing recorded by serving engines: vLLM and SGLang routed experts.

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
from specmoe.formats._common import model_spec, read_npy, resolve_num_experts, sniff
from specmoe.formats.trace import RoutingTrace

__all__ = ["import_routed_experts"]

ENGINES = ("vllm", "sglang")


_RESPONSE_KEYS = {"choices", "meta_info", "routed_experts", "prompt_routed_experts"}


# ------------------------------------------------------------------------------------------
# engine imports: collect (document name, payload parts, dtype hint), decode, stack


def _natural_key(p: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def _load_npy(path: Path) -> np.ndarray:
    kind = sniff(path)
    if kind == "zip":
        raise InputError(f"{path}: a .npz archive, not one .npy array per request")
    if kind != "npy":
        raise InputError(f"{path}: not a .npy array (no .npy signature)")
    with open(path, "rb") as fh:
        return read_npy(fh, path.stat().st_size, str(path))


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
    if not path.is_file():
        raise InputError(f"{path}: not a regular file (a device or pipe has no end to read to)")
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
    payload: Any,
    dtype_hint: str | None,
    *,
    layers: int | None,
    top_k: int | None,
    name: str,
    from_spec: bool = False,
) -> np.ndarray:
    """One payload as [T, R, m] integers. A shape error names the argument ``layers`` or
    ``top_k`` (``model`` when ``from_spec``: the importer took both from the model spec)."""
    if isinstance(payload, str):
        try:
            raw = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise InputError(f"{name}: 'routed_experts' string is not base64") from None
        if raw[:6] == b"\x93NUMPY":
            arr = read_npy(io.BytesIO(raw), len(raw), f"{name}: base64 .npy payload")
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

    # the argument to blame: the model spec when the shape came from it, else the one given
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
    ``layers`` and ``top_k`` give the shape of flattened records (SGLang's base64). Errors in
    an argument name it (``InputError.argument``); errors in the file name the file.
    """
    if engine not in ENGINES:
        raise InputError(
            f"{engine!r} unknown (choose from {', '.join(ENGINES)})", argument="engine"
        )
    path = Path(path)
    spec = model_spec(model)
    n = resolve_num_experts(num_experts, spec, None, name=str(path))
    from_spec = (
        spec is not None
        and layers is None
        and top_k is None
        and (spec.num_hidden_layers == spec.num_moe_layers)
    )
    if from_spec:  # flattened records: unambiguous
        layers, top_k = spec.num_moe_layers, spec.top_k
    arrays, names = [], []
    for doc, parts, dtype in _collect(path):
        label = f"{path}: request {doc}"
        dec = [
            _decode(p, dtype, layers=layers, top_k=top_k, name=label, from_spec=from_spec)
            for p in parts
        ]
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
