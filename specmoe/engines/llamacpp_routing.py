"""Routing recorded inside llama.cpp: every token's experts in every layer, from its own graph.

Legend for shapes: ``T`` tokens, ``L`` layers, ``m`` experts per token (top-k), ``N`` experts.

llama.cpp's tools do not report routing. This module compiles a small C recorder
(:mod:`specmoe.engines._llamacpp_routing_csrc`) against the headers and ``libllama`` of the
build that ``make llama-cpp`` made (:func:`specmoe.engines.llamacpp.cache_root`), on first use,
into ``<cache root>/specmoe-routing/`` under a name hashed from the llama.cpp version, the
recorder's source and the compiler; it is loaded with ctypes. The recorder is llama.cpp's eval
callback on the ``ffn_moe_topk-<l>`` nodes of its MoE graph (``build_moe_ffn`` in
``src/llama-graph.cpp``: ``argsort_top_k`` of the router's softmax, ``[m, n]`` int32, highest
probability first) and, when asked, ``ffn_moe_probs-<l>`` (the softmax, ``[N, n]`` float32).

:class:`LlamaRouting` is one loaded model and context; :meth:`LlamaRouting.record` is a
teacher-forced pass of one token sequence from position 0 on an empty KV cache, in ubatches of
``batch`` tokens: ``experts [T, L, m]`` in llama.cpp's order (highest probability first) and,
with ``probs=True``, ``probs [T, L, N]``. :func:`record_routing` opens, records and closes.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from specmoe.engines import llamacpp
from specmoe.engines._llamacpp_routing_csrc import SOURCE
from specmoe.errors import InputError

__all__ = ["LlamaRouting", "Recorded", "build_recorder", "record_routing"]

_ERRLEN = 512
_LOCK = threading.Lock()


def _compiler() -> str:
    from specmoe.kernels._cbuild import find_compiler

    cc = find_compiler()
    if cc is None:
        raise RuntimeError("llama.cpp routing: no C compiler found (set CC)")
    return cc


@cache
def build_recorder() -> Path:
    """The compiled recorder (built on first use, once per llama.cpp version, source and
    compiler), beside the llama.cpp build."""
    root = llamacpp.require_built()
    with _LOCK:
        cc = _compiler()
        lib_dir = root / "build" / "bin"
        key = hashlib.sha256(
            "\0".join([llamacpp.VERSION, SOURCE, cc, str(root)]).encode()
        ).hexdigest()[:16]
        target = root / "specmoe-routing" / f"routing_{llamacpp.VERSION}_{key}.so"
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        inc = [root / "src" / "include", root / "src" / "ggml" / "include"]
        with tempfile.TemporaryDirectory(prefix="specmoe-llamacpp-cc-") as tmp:
            src = Path(tmp) / "routing.c"
            src.write_text(SOURCE, encoding="utf-8")
            out = Path(tmp) / "routing.so"
            cmd = [*cc.split(), "-O2", "-std=c11", "-shared", "-fPIC", str(src), "-o", str(out)]
            cmd += [f"-I{d}" for d in inc]
            cmd += [f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}", "-lllama", "-lggml-base", "-lggml"]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
            if res.returncode != 0 or not out.is_file():
                tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
                raise RuntimeError(f"llama.cpp routing: the recorder did not compile: {tail}")
            fd, part = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
            os.close(fd)
            Path(part).write_bytes(out.read_bytes())
            os.replace(part, target)
        return target


@cache
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build_recorder()))
    p, i, c = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    lib.rr_open.argtypes = [c, i, i, i, c, i]
    lib.rr_open.restype = p
    lib.rr_dims.argtypes = [p, p]
    lib.rr_dims.restype = None
    lib.rr_record.argtypes = [p, p, i, p, p, p, c, i]
    lib.rr_record.restype = i
    lib.rr_tokenize.argtypes = [p, c, i, p, i]
    lib.rr_tokenize.restype = i
    lib.rr_close.argtypes = [p]
    lib.rr_close.restype = None
    return lib


@dataclass(frozen=True)
class Recorded:
    """One teacher-forced sequence in llama.cpp: ``experts [T, L, m]`` (highest probability
    first), ``probs [T, L, N]`` or None, ``layers`` the llama.cpp layer of each of the L."""

    experts: np.ndarray
    probs: np.ndarray | None
    layers: tuple[int, ...]


class LlamaRouting:
    """One GGUF model loaded in libllama with a context of ``n_ctx`` tokens that decodes in
    ubatches of ``batch`` tokens on ``threads`` threads; a context manager."""

    def __init__(
        self, gguf: str | os.PathLike, *, n_ctx: int = 4096, batch: int = 64, threads: int = 1
    ):
        path = Path(gguf)
        if not path.is_file():
            raise InputError(f"{path}: no such GGUF file", argument="gguf")
        for name, v in (("n_ctx", n_ctx), ("batch", batch), ("threads", threads)):
            if int(v) < 1:
                raise InputError(f"must be >= 1, got {v}", argument=name)
        lib = _lib()
        err = ctypes.create_string_buffer(_ERRLEN)
        h = lib.rr_open(str(path).encode(), int(n_ctx), int(batch), int(threads), err, _ERRLEN)
        if not h:
            raise InputError(f"{path}: {err.value.decode(errors='replace')}", argument="gguf")
        self._h = h
        self.path = path
        self.batch = int(batch)
        dims = (ctypes.c_int32 * 5)()
        lib.rr_dims(h, dims)
        self.n_layer, self.top_k, self.num_experts, self.n_ctx, self.n_vocab = map(int, dims)

    def record(self, token_ids: Sequence[int], *, probs: bool = False) -> Recorded:
        """The routing of ``token_ids`` at positions 0..T-1 (teacher-forced, empty cache)."""
        if self._h is None:
            raise ValueError("record: the model is closed")
        toks = np.ascontiguousarray(np.asarray(list(token_ids), dtype=np.int32))
        if toks.size == 0:
            raise InputError("empty sequence", argument="token_ids")
        if toks.size > self.n_ctx:
            raise InputError(
                f"{toks.size} tokens exceed the context of {self.n_ctx}", argument="token_ids"
            )
        t, nl = int(toks.size), self.n_layer
        ids = np.empty((t, nl, self.top_k), dtype=np.int32)
        pr = np.empty((t, nl, self.num_experts), dtype=np.float32) if probs else None
        filled = np.zeros(nl, dtype=np.int64)
        err = ctypes.create_string_buffer(_ERRLEN)
        rc = _lib().rr_record(
            self._h,
            toks.ctypes.data,
            t,
            ids.ctypes.data,
            None if pr is None else pr.ctypes.data,
            filled.ctypes.data,
            err,
            _ERRLEN,
        )
        msg = err.value.decode(errors="replace")
        if rc == 2:
            raise InputError(msg, argument="token_ids")
        if rc != 0:
            raise RuntimeError(f"llama.cpp routing: {msg}")
        moe = [layer for layer in range(nl) if filled[layer] > 0]
        short = [layer for layer in moe if filled[layer] != t]
        if not moe or short:
            raise RuntimeError(
                f"llama.cpp routing: layers saw {filled.tolist()} positions of {t} "
                "(no ffn_moe_topk nodes, or a layer that skipped tokens)"
            )
        return Recorded(
            experts=ids[:, moe].astype(np.int64),
            probs=None if pr is None else pr[:, moe],
            layers=tuple(moe),
        )

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's tokens of ``text`` (``llama_tokenize``: no BOS/EOS added, special
        tokens written in the text parsed as such, as a transformers tokenizer does)."""
        if self._h is None:
            raise ValueError("tokenize: the model is closed")
        raw = text.encode("utf-8")
        cap = len(raw) + 16
        for _ in range(2):
            out = np.empty(cap, dtype=np.int32)
            n = _lib().rr_tokenize(self._h, raw, len(raw), out.ctypes.data, cap)
            if n >= 0:
                return out[:n].tolist()
            cap = -n
        raise RuntimeError("llama.cpp routing: llama_tokenize asked for more room twice")

    def close(self) -> None:
        if self._h is not None:
            _lib().rr_close(self._h)
            self._h = None

    def __enter__(self) -> LlamaRouting:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - a safety net; close() is the contract
        try:
            self.close()
        except Exception:
            pass


def record_routing(
    gguf: str | os.PathLike,
    token_ids: Sequence[int],
    *,
    batch: int = 64,
    threads: int = 1,
    probs: bool = False,
) -> Recorded:
    """Open ``gguf``, record the routing of ``token_ids`` (one sequence from position 0),
    close. The context is the sequence's length."""
    n = len(token_ids)
    with LlamaRouting(gguf, n_ctx=max(n, 1), batch=batch, threads=threads) as rec:
        return rec.record(token_ids, probs=probs)
