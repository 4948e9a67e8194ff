"""Helpers shared by the trace importers: the model spec and the number of experts N."""

from __future__ import annotations

from typing import Any

from specmoe import _io
from specmoe.errors import InputError


def model_spec(model: str | None) -> Any:
    if model is None:
        return None
    from specmoe.spec import resolve_spec

    return resolve_spec(model)


def resolve_num_experts(num_experts: int | None, spec: Any, found: Any, *, name: str) -> int:
    """N from the importer's ``num_experts`` argument, its model spec (argument ``model``) and
    the file (``found``, None when the file does not say); they must agree. ``name`` labels the
    file in errors, which name the argument at fault (``num_experts`` or ``model``)."""
    sources = {"given": "num_experts", "the model spec": "model", "the file's meta": None}
    cands = {
        k: v
        for k, v in zip(sources, (num_experts, getattr(spec, "num_experts", None), found))
        if v is not None
    }
    if not cands:
        raise InputError(
            f"{name}: the number of experts is unknown; give it, or a model spec",
            argument="num_experts",
        )
    for k, v in cands.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(
                f"{name}: number of experts ({k}) must be a positive integer, got {v!r:.40}",
                argument=sources[k],
            )
    if len(set(cands.values())) > 1:
        raise InputError(
            f"{name}: number of experts disagrees: "
            + ", ".join(f"{k} {v}" for k, v in cands.items()),
            argument="num_experts" if "given" in cands else "model",
        )
    return next(iter(cands.values()))


# ------------------------------------------------------------------------------------------
# Bounded reads: JSON with a size and depth limit, .npy members checked before allocation

JSON_LIMIT = 16 << 20  # bytes: the largest JSON file (profile, spec, config) read whole
JSON_DEPTH = _io.JSON_DEPTH  # the deepest nesting of lists and objects accepted in a JSON file
parse_json = _io.parse_json  # json.loads with the depth limit, one-line errors


def read_json_capped(
    path: Any, what: str = "JSON file", *, argument: str | None = None, limit: int | None = None
) -> Any:
    """:func:`specmoe._io.read_json` with the formats' smaller default limit
    (:data:`JSON_LIMIT`, 16 MiB) and :data:`JSON_DEPTH` levels of nesting; every failure is
    one ``InputError`` line naming the file, carrying ``argument``."""
    return _io.read_json(
        path, what, argument=argument, limit=JSON_LIMIT if limit is None else limit
    )


def sniff(path: Any) -> str:
    """What a file starts with: ``"zip"``, ``"npy"``, ``"parquet"``, ``"pickle"``, ``"empty"``
    or ``"other"`` (read before numpy or pyarrow sees the file: numpy would try a pickle)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        raise InputError(f"{path}: unreadable ({exc.strerror})") from None
    if not head:
        return "empty"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[:6] == b"\x93NUMPY":
        return "npy"
    if head[:4] == b"PAR1":
        return "parquet"
    if head[:1] == b"\x80":
        return "pickle"
    return "other"


def read_npy(fh: Any, size: int, name: str, *, header_only: bool = False) -> Any:
    """One ``.npy`` array from the open binary file ``fh`` of ``size`` bytes, checked before
    anything is allocated: a numeric dtype (an object array would need a pickle: refused) and a
    shape whose bytes fit in ``size``. ``name`` labels errors (a file and its member).
    ``header_only``: return ``(shape, dtype)`` without reading the data."""
    import math

    import numpy as np

    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f".npy format version {version} is not supported")
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"{name}: not a readable .npy array ({exc})".splitlines()[0]) from None
    if dtype.hasobject:
        raise InputError(
            f"{name}: holds Python objects (it would need a pickle, which specmoe never "
            "loads); expected numbers"
        )
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > size:
        raise InputError(
            f"{name}: declares shape {tuple(shape)} ({nbytes} bytes) but holds only {size} "
            "bytes (truncated or corrupt)"
        )
    if header_only:
        return tuple(shape), dtype
    buf = bytearray(nbytes)
    got = fh.readinto(buf) if nbytes else 0
    if got != nbytes:
        raise InputError(f"{name}: truncated: {got} of {nbytes} bytes of array data")
    fh.read(1)  # reach the end, so that a zip member's CRC is checked
    arr = np.frombuffer(buf, dtype=dtype)
    return arr.reshape(shape[::-1]).transpose() if fortran else arr.reshape(shape)


def read_members(
    path: Any, keys: tuple[str, ...], *, headers: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The arrays ``keys`` of the ``.npz`` file ``path`` (those it has), read without pickles:
    the zip signature is checked first, and each member's dtype and declared size before
    anything is allocated (:func:`read_npy`). Members named in ``headers`` give
    ``(shape, dtype, crc32)`` instead, from their header and the zip directory only."""
    import zipfile
    import zlib

    name = str(path)
    kind = sniff(path)
    if kind == "npy":
        raise InputError(f"{name}: a single .npy array, not a .npz trace")
    if kind == "empty":
        raise InputError(f"{name}: an empty file, not a .npz trace")
    if kind != "zip":
        what = {"pickle": "a pickle", "parquet": "a Parquet file"}.get(kind, "it")
        raise InputError(f"{name}: not a .npz trace ({what} lacks the zip signature of .npz)")
    out: dict[str, Any] = {}
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise InputError(
            f"{name}: truncated or corrupt .npz archive ({type(exc).__name__}: {exc})"
        ) from None
    with z:
        infos = {i.filename[:-4]: i for i in z.infolist() if i.filename.endswith(".npy")}
        for key in (*keys, *headers):
            info = infos.get(key)
            if info is None:
                continue
            label = f"{name}: member {key!r}"
            try:
                with z.open(info) as fh:
                    got = read_npy(fh, info.file_size, label, header_only=key in headers)
            except InputError:
                raise
            except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError) as exc:
                raise InputError(
                    f"{label} is corrupt ({type(exc).__name__}: {exc})".splitlines()[0]
                ) from None
            out[key] = (*got, info.CRC) if key in headers else got
    return out
