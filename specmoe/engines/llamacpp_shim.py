"""Loading the C shims that :func:`specmoe.engines.llamacpp.compile_shim` builds against the
llama.cpp build (the pass shim, the routing recorder, the MUL_MAT_ID harness) with ctypes, and
the arguments their open functions share.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from specmoe.cost.llamacpp_plan import KV_TYPES as _PLAN_KV_TYPES
from specmoe.engines import llamacpp
from specmoe.errors import InputError

__all__ = [
    "KV_TYPES",
    "LIBLLAMA",
    "SHIM_ERRLEN",
    "Closing",
    "kv_overrides",
    "load_shim",
    "open_model",
    "shim",
]

# the KV cache's type: llama.cpp's default, float32, or keys in q8_0 and values in f16
# (``-ctk q8_0``; llama.cpp quantizes V only with flash attention): the shim's code is the index
KV_TYPES = _PLAN_KV_TYPES
LIBLLAMA = ["llama", "ggml-base", "ggml"]  # the libraries of a shim against libllama

# the ctypes of the letters in load_shim's signatures
_CTYPES: dict[str, Any] = {
    "p": ctypes.c_void_p,
    "i": ctypes.c_int,
    "c": ctypes.c_char_p,
    "q": ctypes.c_int64,
    "Q": ctypes.c_longlong,
    "d": ctypes.c_double,
    "-": None,
}
SHIM_ERRLEN = 512  # the bytes of a shim's error buffer (SM_ERRLEN in the C prelude)


def load_shim(path: Path, signatures: dict[str, str]) -> ctypes.CDLL:
    """The compiled shim at ``path`` (from :func:`specmoe.engines.llamacpp.compile_shim`) loaded with ctypes, each
    function of ``signatures`` typed: ``{"name": "r: a b ..."}``, one letter each for the
    result ``r`` (``-`` for void) and the arguments: ``p`` pointer, ``i`` int, ``c`` char
    pointer, ``q`` int64, ``Q`` long long, ``d`` double."""
    lib = ctypes.CDLL(str(path))
    for name, sig in signatures.items():
        res, _, args = sig.partition(":")
        fn = getattr(lib, name)
        fn.restype = _CTYPES[res.strip()]
        fn.argtypes = [_CTYPES[a] for a in args.split()]
    return lib


def shim(
    source: str, *, name: str, libs: list[str], what: str, signatures: dict[str, str]
) -> tuple[Callable[[], Path], Callable[[], ctypes.CDLL]]:
    """A shim's ``build()`` (its compiled library's path, from
    :func:`specmoe.engines.llamacpp.compile_shim`) and ``lib()`` (the library loaded and typed by
    :func:`load_shim`), each made once per process (``functools.cache``)."""

    @cache
    def build() -> Path:
        return llamacpp.compile_shim(source, name=name, libs=libs, what=what)

    build.__doc__ = (
        f"The compiled {what} shim (built on first use, once per llama.cpp version, source and "
        "compiler), beside the llama.cpp build; an ``InputError`` if llama.cpp is not built."
    )

    @cache
    def lib() -> ctypes.CDLL:
        return load_shim(build(), signatures)

    return build, lib


def kv_overrides(overrides: dict[str, float] | None) -> tuple[int, ctypes.Array, ctypes.Array]:
    """Float metadata overrides as a shim's open takes them: their count, the keys (char
    pointers) and the values (doubles); arrays of at least one entry."""
    over = dict(overrides or {})
    keys = (ctypes.c_char_p * max(1, len(over)))(*[k.encode() for k in over])
    vals = (ctypes.c_double * max(1, len(over)))(*[float(v) for v in over.values()])
    return len(over), keys, vals


def open_model(
    lib: ctypes.CDLL,
    prefix: str,
    gguf: str | os.PathLike,
    n_ctx: int,
    batch: int,
    threads: int,
    kv_type: str,
    overrides: dict[str, float] | None,
) -> tuple[int, Path, tuple[int, ...]]:
    """``<prefix>_open`` of a shim against libllama on the GGUF file ``gguf``: its handle, the
    path, and ``<prefix>_dims`` (layers, experts per token, experts, context, vocabulary). Bad
    arguments, and a file llama.cpp does not open, are an ``InputError`` naming the argument
    (llama.cpp's own message for the file)."""
    path = Path(gguf)
    if not path.is_file():
        raise InputError(f"{path}: no such GGUF file", argument="gguf")
    for name, v in (("n_ctx", n_ctx), ("batch", batch), ("threads", threads)):
        if isinstance(v, bool) or int(v) < 1:
            raise InputError(f"must be >= 1, got {v}", argument=name)
    if kv_type not in KV_TYPES:
        raise InputError(
            f"unknown {kv_type!r} (choose from {', '.join(KV_TYPES)})", argument="kv_type"
        )
    err = ctypes.create_string_buffer(SHIM_ERRLEN)
    h = getattr(lib, f"{prefix}_open")(
        str(path).encode(),
        int(n_ctx),
        int(batch),
        int(threads),
        KV_TYPES.index(kv_type),
        *kv_overrides(overrides),
        err,
        SHIM_ERRLEN,
    )
    if not h:
        raise InputError(f"{path}: {err.value.decode(errors='replace')}", argument="gguf")
    dims = (ctypes.c_int32 * 5)()
    getattr(lib, f"{prefix}_dims")(h, dims)
    return h, path, tuple(map(int, dims))


_C = TypeVar("_C", bound="Closing")


class Closing:
    """A holder of a shim's handle that frees it in ``close()``: a context manager, and closed
    when collected (a safety net; ``close()`` is the contract)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - a safety net
        try:
            self.close()
        except Exception:
            pass
