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
The KV cache is float16 by default (llama.cpp's own default, what it serves with) or float32
(``kv_type``). :func:`capture_documents_gguf` is the teacher-forced capture of
:func:`specmoe.engine.capture.capture_documents` (the same windows, shards and resumption)
recorded inside llama.cpp (``specmoe capture --engine llama.cpp``).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specmoe.engines import llamacpp, llamacpp_shim
from specmoe.engines._llamacpp_routing_csrc import SOURCE
from specmoe.errors import InputError

__all__ = [
    "KV_TYPES",
    "LlamaRouting",
    "Recorded",
    "build_recorder",
    "capture_documents_gguf",
    "record_routing",
]

_ERRLEN = llamacpp_shim.SHIM_ERRLEN
KV_TYPES = llamacpp_shim.KV_TYPES  # the KV cache's type (llamacpp_shim.KV_TYPES)


build_recorder, _lib = llamacpp_shim.shim(
    SOURCE,
    name="routing",
    libs=llamacpp_shim.LIBLLAMA,
    what="llama.cpp routing",
    signatures={
        "rr_open": "p: c i i i i i p p c i",
        "rr_dims": "-: p p",
        "rr_record": "i: p p i p p p c i",
        "rr_meta": "i: p c c i",
        "rr_tokenize": "i: p c i p i",
        "rr_close": "-: p",
    },
)


@dataclass(frozen=True)
class Recorded:
    """One teacher-forced sequence in llama.cpp: ``experts [T, L, m]`` (highest probability
    first), ``probs [T, L, N]`` or None, ``layers`` the llama.cpp layer of each of the L."""

    experts: np.ndarray
    probs: np.ndarray | None
    layers: tuple[int, ...]


class LlamaRouting(llamacpp_shim.Closing):
    """One GGUF model loaded in libllama with a context of ``n_ctx`` tokens that decodes in
    ubatches of ``batch`` tokens on ``threads`` threads, its KV cache in ``kv_type`` (``f16``,
    llama.cpp's default, ``f32``, or ``q8_0``: keys in q8_0, values in f16); ``overrides``: float metadata values in place of the
    file's (llama.cpp's ``--override-kv KEY=float:VALUE``); a context manager."""

    def __init__(
        self,
        gguf: str | os.PathLike,
        *,
        n_ctx: int = 4096,
        batch: int = 64,
        threads: int = 1,
        kv_type: str = "f16",
        overrides: dict[str, float] | None = None,
    ):
        self._h, self.path, dims = llamacpp_shim.open_model(
            _lib(), "rr", gguf, n_ctx, batch, threads, kv_type, overrides
        )
        self.batch = int(batch)
        self.kv_type = kv_type
        self.n_layer, self.top_k, self.num_experts, self.n_ctx, self.n_vocab = dims

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

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text (``.name``: the architecture's ``<arch>.name``)."""
        if self._h is None:
            raise ValueError("meta: the model is closed")
        buf = ctypes.create_string_buffer(1024)
        n = _lib().rr_meta(self._h, key.encode(), buf, 1024)
        return None if n < 0 else buf.value.decode(errors="replace")

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


def record_routing(
    gguf: str | os.PathLike,
    token_ids: Sequence[int],
    *,
    batch: int = 64,
    threads: int = 1,
    probs: bool = False,
    kv_type: str = "f16",
) -> Recorded:
    """Open ``gguf``, record the routing of ``token_ids`` (one sequence from position 0),
    close. The context is the sequence's length."""
    n = len(token_ids)
    with LlamaRouting(gguf, n_ctx=max(n, 1), batch=batch, threads=threads, kv_type=kv_type) as rec:
        return rec.record(token_ids, probs=probs)


# ------------------------------------------------------------------------------------------
# teacher-forced capture into shards (the trace format of specmoe.engine.capture)


def _windows(n: int, c: int, ov: int) -> list[tuple[int, int, int]]:
    """``(start, ctx, end)`` per window, as :func:`specmoe.engine.capture.capture_tokens` cuts
    a sequence of ``n`` tokens: window ``[start - ctx, end)``, its first ``ctx`` tokens context
    only, so that every token is recorded once."""
    out, start = [], 0
    while start < n:
        ctx = 0 if start == 0 else min(ov, start)
        end = min(n, start - ctx + c)
        out.append((start, ctx, end))
        start = end
    return out


def capture_documents_gguf(
    gguf: str | os.PathLike,
    tokenizer: object,
    documents: Sequence[tuple[str, str]],
    out_dir: str | os.PathLike,
    *,
    max_tokens: int | None = None,
    max_context: int | None = None,
    overlap: int | None = None,
    shard_tokens: int = 1 << 16,
    batch: int = 64,
    threads: int = 1,
    source: str = "",
    model_name: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Teacher-forced capture of ``documents [(name, text)]`` in llama.cpp into shards under
    ``out_dir``: the windows, shards, manifest and resumption of
    :func:`specmoe.engine.capture.capture_documents`, the routing recorded inside llama.cpp.

    Tokens are ``tokenizer``'s (the model's own, no special tokens added: the same ids the
    transformers capture feeds). Weights: the router's probabilities of the chosen experts, as
    OLMoE's graph in llama.cpp uses them (it does not renormalise them). The shards record
    ``capture: teacher_forced:llama.cpp``, so that a resumed capture cannot mix engines."""
    from specmoe.engine.capture import _encode, _progress, check_capture_args, documents_digest
    from specmoe.formats.shards import ShardWriter

    check_capture_args(documents, max_tokens, shard_tokens)
    path = Path(gguf)
    if not path.is_file():
        raise InputError(f"{path}: no such GGUF file", argument="gguf")
    probe = LlamaRouting(path, n_ctx=16, batch=1, threads=threads)
    try:
        limit = int(probe.meta(".context_length") or 4096)
        arch = probe.meta("general.architecture") or "unknown"
        label = model_name or (probe.meta("general.name") or path.stem)
        num_experts, top_k = probe.num_experts, probe.top_k
    finally:
        probe.close()
    c = min(limit, 4096) if max_context is None else int(max_context)
    if not 2 <= c <= limit:
        raise InputError(
            f"must be in 2..{limit} (the model's context), got {c}", argument="max_context"
        )
    ov = c // 4 if overlap is None else int(overlap)
    if not 0 <= ov < c:
        raise InputError(f"must be in 0..{c - 1} (below max_context), got {ov}", argument="overlap")
    out = Path(out_dir)
    with LlamaRouting(path, n_ctx=c, batch=batch, threads=threads) as rec:
        first = rec.record([0], probs=False)  # which layers are MoE layers
        header = {
            "model": label,
            "model_type": arch,
            "num_experts": num_experts,
            "top_k": top_k,
            "layers": list(first.layers),
            "source": source,
            "capture": "teacher_forced:llama.cpp",
            "engine": f"llama.cpp {llamacpp.VERSION}",
            "max_context": c,
            "overlap": ov,
            "max_tokens": max_tokens,
            "documents_sha256": documents_digest(documents),
        }
        writer = ShardWriter(out, header, shard_tokens=shard_tokens, overwrite=overwrite)
        todo = [(str(n), t) for n, t in documents if str(n) not in writer.done]
        budget = None if max_tokens is None else max(0, max_tokens - writer.tokens)
        bar = _progress(
            budget if budget is not None else len(todo), enabled=progress, desc=f"capture {label}"
        )
        try:
            for name, text in todo:
                if budget is not None and budget <= 0:
                    break
                ids = _encode(tokenizer, text)
                if not ids:
                    continue
                cut = budget is not None and len(ids) > budget
                if cut:
                    ids = ids[:budget]
                e_parts, w_parts = [], []
                for start, ctx, end in _windows(len(ids), c, ov):
                    r = rec.record(ids[start - ctx : end], probs=True)
                    e_parts.append(r.experts[ctx:])
                    w_parts.append(np.take_along_axis(r.probs[ctx:], r.experts[ctx:], -1))
                writer.add(name, np.concatenate(e_parts), np.concatenate(w_parts), truncated=cut)
                if budget is not None:
                    budget -= len(ids)
                bar.update(len(ids) if budget is not None else 1)
        finally:
            writer.flush()
            bar.close()
    if not writer.shards:
        raise InputError("nothing to capture (every document is empty)", argument="documents")
    return out
