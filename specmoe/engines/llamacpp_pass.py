"""llama.cpp behind specmoe's :class:`~specmoe.engine.speculative.Engine` interface: the
verification passes of specmoe's own loops (:func:`specmoe.engine.measure.verify_passes`,
:func:`specmoe.engine.speculative.speculative_generate`, :func:`specmoe.engine.runner.run_grid`)
run inside libllama, unchanged.

Legend for shapes: ``n`` tokens of a pass, ``L`` layers, ``m`` experts per token (top-k),
``M`` graph nodes of one pass.

A small C shim (:mod:`specmoe.engines._llamacpp_pass_csrc`, compiled on first use by
:func:`specmoe.engines.llamacpp.compile_shim`) opens a GGUF model with one context of one
sequence (flash attention off, as llama-bench is run here; KV cache float16, llama.cpp's
default, or float32), decodes a pass of n tokens at positions C..C+n-1 (C the cache's length)
with the logits of every row, and returns each row's argmax and top-1 minus top-2 logit
margin (computed in C) and the thread CPU time and wall time of the ``llama_decode`` call
alone (with ``llama_synchronize``). Cropping removes the positions >= C'
(``llama_memory_seq_rm``).

**Clock.** With one thread (``threads=1``, the default) the CPU backend computes the graph in
the calling thread: the thread CPU time of a decode was 0.999 of its wall time (median over
passes of n = 1..9 at depth 512, bundled model as f32 GGUF, on 2 cores with a load average of
3.6 from a compile), and below it only in passes the scheduler interrupted. So ``clock="cpu"``
(the thread CPU time, which leaves out waits for a core while other jobs run) times the whole
pass, as :class:`~specmoe.engine.speculative.Engine`'s ``cpu`` clock does. With more threads
the workers' time is not in the calling thread's: use ``clock="wall"``.

**Routing.** ``record_routing=True`` records every row's experts through the eval callback on
the ``ffn_moe_topk-<l>`` nodes, as :mod:`specmoe.engines.llamacpp_routing` does. Asking the
callback for a node cuts the graph there (the scheduler computes up to the node, synchronises
and hands it over), so it is off by default for timed passes; then ``Verified.routing`` is
filled with -1 ``[n, L, m]`` and :func:`specmoe.formats.roundlog.pass_stats` gives NaN Ū and
-1 E_max for it (a round log of such a run holds no routing, and ``validate`` says so).

**Kernel.** llama.cpp's CPU MUL_MAT_ID groups a pass's rows by expert (``ggml-cpu.c``, "group
rows by src0 matrix") and runs each expert's weights once over its rows: a deduplicating kernel
at every n. ``policy`` is ``KernelPolicy("dedup")``; no other setting exists here.

**Profile.** :meth:`LlamaCppEngine.profile` runs one pass with the callback asking for every
node, so that each node is computed alone, and records each node's name, op
(``ggml_op_desc``) and time (the difference of thread CPU timestamps taken as each node is
handed over; the first node's from the decode call's start, so it holds the graph's build and
the inputs' upload). Computing nodes one by one costs a graph launch each: the per-node sum
differs from the unprofiled pass (bundled model as f32 GGUF, depth 512: 0.94x at n = 1, 1.20x
at n = 4, 1.12x at n = 9; 1.2-1.4x at n = 4, depth 64).

**Against llama-bench.** On the bundled f32 GGUF at depth 512 (2 cores, load 2.3-4) a pass here
took 1.5-2x what ``llama-bench -p n -n 0 -d 512 -t 1 -fa off`` reports in the same minutes
(median of 20: n = 1 2.10 ms against 0.98-1.12, n = 9 5.29 against 2.73-3.73). Not from the eval
callback (a shim without it timed the same), a threadpool attached as llama-bench does, the
context size (528-4096), random against real tokens, torch loaded in the process, or the logits
of every row (the last row's only: 1.54 ms at n = 1). The cause is graph reuse: llama-bench
repeats each n, and a decode of the same token and output counts as the one before it reuses
that graph (``llama_context::process_ubatch``); this engine's passes change n (and a sweep crops
between them), so every pass builds and allocates its graph. llama-bench itself, run with
``LLAMA_GRAPH_REUSE_DISABLE=1`` (bundled bf16 GGUF, depth 512, 30 repetitions, two alternating
runs beside a one-thread job on the other core), takes a median 1.73-1.79 ms at n = 1 against
0.93-1.22 with reuse, 2.85-2.96 against 2.44-2.49 at n = 5, 4.03-4.06 against 3.74-3.97 at
n = 9: a graph build costs about 0.3-0.8 ms on this model, most of the gap.

**Caches.** There is one context: :func:`specmoe.engine.speculative.new_cache` on
``engine.model`` clears it and returns a handle (:class:`LlamaKV`) with ``get_seq_length()``
and ``crop()`` as ``DynamicCache`` has them; an older handle is then stale, and using it is a
``ValueError``. :meth:`LlamaCppEngine.greedy` (the oracle drafter's reference) decodes in a
second, scratch context of the same model (made on first use, with its own KV cache), so that
it leaves the timed context's cache as it was.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specmoe.engine.speculative import Verified
from specmoe.engine.switch import KernelPolicy
from specmoe.engines import llamacpp_shim
from specmoe.engines._llamacpp_pass_csrc import SOURCE
from specmoe.errors import InputError

__all__ = ["KV_TYPES", "LlamaCppEngine", "LlamaKV", "NodeTime", "Profile", "build_shim"]

KV_TYPES = llamacpp_shim.KV_TYPES
_ERRLEN = llamacpp_shim.SHIM_ERRLEN
_NAME, _OP = 64, 32  # the shim's fixed name widths
_PREFILL_BATCH = 512  # n_batch = n_ubatch, llama.cpp's default ubatch
_TIMED, _SCRATCH = 0, 1  # context slots


build_shim, _lib = llamacpp_shim.shim(
    SOURCE,
    name="pass",
    libs=llamacpp_shim.LIBLLAMA,
    what="llama.cpp pass",
    signatures={
        "lp_open": "p: c i i i i i p p c i",
        "lp_dims": "-: p p",
        "lp_length": "i: p i",
        "lp_crop": "i: p i i c i",
        "lp_decode": "i: p i p i i i p p p p q p p p p p p c i",
        "lp_meta": "i: p c c i",
        "lp_close": "-: p",
    },
)


@dataclass(frozen=True)
class NodeTime:
    """One graph node of a profiled pass: its name, its op and its time (thread CPU and wall)."""

    name: str
    op: str
    ms: float
    wall_ms: float


@dataclass(frozen=True)
class Profile:
    """The nodes of one profiled pass in graph order, and the profiled decode's own times."""

    nodes: tuple[NodeTime, ...]
    t_ms: float
    wall_ms: float

    @property
    def sum_ms(self) -> float:
        return float(sum(x.ms for x in self.nodes))

    def by_op(self) -> dict[str, float]:
        """Milliseconds per op, summed over the pass's nodes."""
        out: dict[str, float] = {}
        for x in self.nodes:
            out[x.op] = out.get(x.op, 0.0) + x.ms
        return out


class LlamaKV:
    """The timed context's KV cache as ``DynamicCache`` shows it to specmoe's loops."""

    def __init__(self, engine: LlamaCppEngine, serial: int):
        self._engine = engine
        self._serial = serial

    def _check(self) -> None:
        if self._engine._serial != self._serial:
            raise ValueError("LlamaKV: stale cache (new_cache() has cleared the context since)")

    def get_seq_length(self) -> int:
        self._check()
        return self._engine._length(_TIMED)

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last ``-tokens_to_remove`` tokens (0: nothing), as transformers 5's
        ``DynamicCache.crop`` does; a positive count, or more tokens than the cache holds, is a
        ``ValueError``."""
        self._check()
        have, remove = self._engine._length(_TIMED), -int(tokens_to_remove)
        if remove < 0:
            raise ValueError(
                f"crop: {tokens_to_remove} is positive (pass minus the tokens to remove)"
            )
        if remove > have:
            raise ValueError(f"crop: the cache holds {have} tokens, cannot remove {remove}")
        if remove:
            self._engine._crop(_TIMED, have - remove)


class _Model:
    """``engine.model``: what :func:`~specmoe.engine.speculative.new_cache` is given."""

    def __init__(self, engine: LlamaCppEngine):
        self._engine = engine

    def new_cache(self) -> LlamaKV:
        return self._engine._new_cache()


class LlamaCppEngine(llamacpp_shim.Closing):
    """A GGUF model in libllama with specmoe's Engine interface (module docstring).

    ``n_ctx``: the context's tokens; ``threads``: decode threads (1: the compute runs in the
    calling thread); ``kv_type``: ``f16`` (llama.cpp's default), ``f32``, or
    ``q8_0`` (keys in q8_0, values in f16: ``-ctk q8_0``); ``record_routing``:
    record each pass's experts (cuts the graph, see the module docstring); ``clock``: ``cpu``
    (thread CPU time of the decode) or ``wall``; ``overrides``: float GGUF metadata in place of
    the file's (llama.cpp's ``--override-kv KEY=float:VALUE``). A context manager.
    """

    def __init__(
        self,
        gguf: str | os.PathLike,
        *,
        n_ctx: int = 4096,
        threads: int = 1,
        kv_type: str = "f16",
        record_routing: bool = False,
        clock: str = "cpu",
        overrides: dict[str, float] | None = None,
    ):
        if clock not in ("wall", "cpu"):
            raise InputError(f"unknown {clock!r} (choose wall or cpu)", argument="clock")
        self._h, self.path, dims = llamacpp_shim.open_model(
            _lib(), "lp", gguf, n_ctx, _PREFILL_BATCH, threads, kv_type, overrides
        )
        self.threads = int(threads)
        self.kv_type = kv_type
        self.record_routing = bool(record_routing)
        self.clock = clock
        self.now = time.perf_counter if clock == "wall" else time.thread_time
        self.num_layers, self.top_k, self.num_experts, self.n_ctx, self.vocab_size = dims
        self._policy = KernelPolicy("dedup")
        self._serial = 0
        self.model = _Model(self)

    # -- the Engine interface --------------------------------------------------------------
    @property
    def policy(self) -> KernelPolicy:
        return self._policy

    def set_policy(self, policy: KernelPolicy | str) -> None:
        """Only ``dedup``: llama.cpp's CPU expert kernel deduplicates at every pass size."""
        setting = policy if isinstance(policy, str) else policy.setting
        if setting != "dedup":
            raise InputError(
                f"{setting!r}: llama.cpp's CPU expert kernel groups rows by expert "
                "(dedup is its only setting)",
                argument="policy",
            )
        self._policy = policy if isinstance(policy, KernelPolicy) else KernelPolicy("dedup")

    def prefill(self, kv: LlamaKV, tokens: Sequence[int]) -> None:
        """Feed ``tokens`` into ``kv`` (in ubatches of 512, logits of the last row only)."""
        kv._check()
        if len(tokens):
            self._decode(_TIMED, tokens, all_logits=False)

    def forward(self, kv: LlamaKV, tokens: Sequence[int]) -> Verified:
        """One timed pass of ``tokens`` after the cache: the argmax of each row, its top-2
        margin, the decode's time on the engine's clock (and the wall clock)."""
        kv._check()
        if not len(tokens):
            raise ValueError("forward: no tokens")
        n = len(tokens)
        mode = 1 if self.record_routing else 0
        r = self._decode(_TIMED, tokens, all_logits=True, mode=mode)
        routing = r["routing"] if mode else np.full((n, self.num_layers, self.top_k), -1)
        t_ms = r["cpu_ms"] if self.clock == "cpu" else r["wall_ms"]
        return Verified(r["argmax"].tolist(), routing, t_ms, r["margin"], "dedup", r["wall_ms"])

    def time_pass(self, kv: LlamaKV, tokens: Sequence[int], *, all_rows: bool = True) -> float:
        """One pass of ``tokens`` after the cache, its time (ms) on the engine's clock alone:
        with the logits of every row (``all_rows``, as :meth:`forward` and llama-server's
        verification of drafts ask for them) or of the last row only (as ``llama-bench -p n``
        asks). Like :meth:`forward`, it extends the cache."""
        kv._check()
        if not len(tokens):
            raise ValueError("time_pass: no tokens")
        r = self._decode(_TIMED, tokens, all_logits=bool(all_rows))
        return r["cpu_ms"] if self.clock == "cpu" else r["wall_ms"]

    def profile(self, kv: LlamaKV, tokens: Sequence[int], *, max_nodes: int = 1 << 16) -> Profile:
        """One pass of ``tokens`` after the cache with every graph node timed alone (module
        docstring); like :meth:`forward`, it extends the cache."""
        kv._check()
        if not len(tokens):
            raise ValueError("profile: no tokens")
        r = self._decode(_TIMED, tokens, all_logits=True, mode=2, max_nodes=max_nodes)
        names, ops, cpu, wall = r["profile"]
        nodes = tuple(
            NodeTime(a, b, float(c) / 1e6, float(d) / 1e6)
            for a, b, c, d in zip(names, ops, cpu, wall, strict=True)
        )
        return Profile(nodes, r["cpu_ms"], r["wall_ms"])

    def greedy(self, prompt: Sequence[int], count: int) -> list[int]:
        """Plain greedy decoding (one-token passes) in the scratch context: the next
        ``count`` tokens after ``prompt``; the timed context's cache is left as it was."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise InputError("prompt: empty")
        self._crop(_SCRATCH, 0)
        if len(prompt) > 1:
            self._decode(_SCRATCH, prompt[:-1], all_logits=False)
        out, current = [], prompt[-1]
        for _ in range(int(count)):
            current = int(self._decode(_SCRATCH, [current], all_logits=True)["argmax"][0])
            out.append(current)
        self._crop(_SCRATCH, 0)
        return out

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text (``.name``: the architecture's ``<arch>.name``)."""
        buf = ctypes.create_string_buffer(1024)
        n = _lib().lp_meta(self._handle(), key.encode(), buf, 1024)
        return None if n < 0 else buf.value.decode(errors="replace")

    def close(self) -> None:
        if self._h is not None:
            _lib().lp_close(self._h)
            self._h = None
            self._serial += 1

    # -- the shim --------------------------------------------------------------------------
    def _handle(self) -> int:
        if self._h is None:
            raise ValueError("LlamaCppEngine: the model is closed")
        return self._h

    def _new_cache(self) -> LlamaKV:
        self._crop(_TIMED, 0)
        self._serial += 1
        return LlamaKV(self, self._serial)

    def _length(self, slot: int) -> int:
        return int(_lib().lp_length(self._handle(), slot))

    def _crop(self, slot: int, keep: int) -> None:
        err = ctypes.create_string_buffer(_ERRLEN)
        if _lib().lp_crop(self._handle(), slot, int(keep), err, _ERRLEN) != 0:
            raise RuntimeError(f"llama.cpp pass: {err.value.decode(errors='replace')}")

    def _decode(
        self,
        slot: int,
        tokens: Sequence[int],
        *,
        all_logits: bool,
        mode: int = 0,
        max_nodes: int = 0,
    ) -> dict[str, Any]:
        h = self._handle()
        toks = np.ascontiguousarray(np.asarray(list(tokens), dtype=np.int32))
        n, nl = int(toks.size), self.num_layers
        argmax = np.zeros(n, dtype=np.int32)
        margin = np.zeros(n, dtype=np.float32)
        ids = np.empty((n, nl, self.top_k), dtype=np.int32) if mode == 1 else None
        filled = np.zeros(nl, dtype=np.int64)
        cap = int(max_nodes) if mode == 2 else 0
        names = ctypes.create_string_buffer(max(1, cap * _NAME))
        ops = ctypes.create_string_buffer(max(1, cap * _OP))
        cpu, wall = np.zeros(max(1, cap), np.int64), np.zeros(max(1, cap), np.int64)
        count = np.zeros(1, dtype=np.int64)
        times = np.zeros(2, dtype=np.int64)
        err = ctypes.create_string_buffer(_ERRLEN)
        rc = _lib().lp_decode(
            h,
            slot,
            toks.ctypes.data,
            n,
            int(all_logits),
            mode,
            argmax.ctypes.data,
            margin.ctypes.data,
            None if ids is None else ids.ctypes.data,
            filled.ctypes.data,
            cap,
            names,
            ops,
            cpu.ctypes.data,
            wall.ctypes.data,
            count.ctypes.data,
            times.ctypes.data,
            err,
            _ERRLEN,
        )
        msg = err.value.decode(errors="replace")
        if rc == 2:
            raise InputError(msg, argument="tokens")
        if rc != 0:
            raise RuntimeError(f"llama.cpp pass: {msg}")
        out: dict[str, Any] = {
            "argmax": argmax,
            "margin": margin,
            "cpu_ms": float(times[0]) / 1e6,
            "wall_ms": float(times[1]) / 1e6,
        }
        if mode == 1:
            moe = [layer for layer in range(nl) if filled[layer] > 0]
            if not moe or any(filled[layer] != n for layer in moe):
                raise RuntimeError(
                    f"llama.cpp pass: layers saw {filled.tolist()} positions of {n} "
                    "(no ffn_moe_topk nodes, or a layer that skipped tokens)"
                )
            out["routing"] = ids[:, moe].astype(np.int64)
        if mode == 2:
            k = int(count[0])
            raw_n, raw_o = names.raw, ops.raw
            out["profile"] = (
                [_cstr(raw_n[i * _NAME : (i + 1) * _NAME]) for i in range(k)],
                [_cstr(raw_o[i * _OP : (i + 1) * _OP]) for i in range(k)],
                cpu[:k].tolist(),
                wall[:k].tolist(),
            )
        return out


def _cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode(errors="replace")
