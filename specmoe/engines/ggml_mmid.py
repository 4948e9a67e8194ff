"""ggml's CPU MUL_MAT_ID, llama.cpp's expert kernel, timed alone at any shapes.

Legend: ``E`` experts (``P`` pool slots >= E), ``d`` hidden, ``m`` expert width, ``k`` slots per
token (top-k), ``n`` tokens, ``U`` distinct experts of a pass.

A small C harness (:mod:`specmoe.engines._ggml_mmid_csrc`) is compiled on first use against
the ggml headers and libraries of the llama.cpp build (:func:`specmoe.engines.llamacpp.
cache_root`), into ``<cache root>/specmoe-ggml_mmid/`` under a name hashed from the llama.cpp
version, the source and the compiler. It builds llama.cpp's MoE FFN graph for one layer (gate
and up ``MUL_MAT_ID``, ``swiglu_split``, down ``MUL_MAT_ID``, the routing weights, the sum over
slots) on the caller's weights without copying them, and times ``ggml_graph_compute`` on ggml's
own threadpool.

* :class:`Harness`: one graph (the whole FFN, or one ``MUL_MAT_ID`` alone) at fixed shapes.
* :func:`ffn`: y [n, d] of the whole FFN, for checks against :mod:`specmoe.kernels.reference`.
* :func:`time_mul_mat_id`: times the FFN and each ``MUL_MAT_ID`` alone on given ids, each call's
  experts relabelled onto fresh slots of a pool larger than twice the last-level cache (so
  every call reads its weights from memory, as :mod:`specmoe.bench.timing` does), with a read
  ceiling timed in the same rotation.

Bytes moved: ggml groups a pass's rows by expert and reads each selected expert once, so an
operation moves ``U`` experts' weights: ``U · rows · row_size(type, cols)``, with
``row_size`` 4 B (f32), 2 B (bf16) or 34 B per 32 weights (q8_0) per weight
(:func:`weight_bytes`).
"""

from __future__ import annotations

import statistics
import time
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.engines import llamacpp, llamacpp_shim
from specmoe.engines._ggml_mmid_csrc import SOURCE

__all__ = [
    "MODES",
    "TYPES",
    "Harness",
    "build",
    "dequantize",
    "ffn",
    "op_bytes",
    "quantize",
    "time_mul_mat_id",
    "vec_dot_ns",
    "weight_bytes",
]

TYPES = ("f32", "bf16", "q8_0")
MODES = {"ffn": 0, "gate": 1, "up": 2, "down": 3}
_BLOCK = {"f32": (1, 4), "bf16": (1, 2), "q8_0": (32, 34)}  # weights per block, bytes per block


def _check_type(wtype: str) -> str:
    if wtype not in TYPES:
        raise ValueError(f"wtype: unknown {wtype!r} (choose from {', '.join(TYPES)})")
    return wtype


def row_size(wtype: str, cols: int) -> int:
    """Bytes of one row of ``cols`` weights of ``wtype`` (q8_0: 34 bytes per 32 weights)."""
    per, nbytes = _BLOCK[_check_type(wtype)]
    if cols % per:
        raise ValueError(f"cols: {cols} is not a multiple of {wtype}'s block of {per} weights")
    return cols // per * nbytes


def weight_bytes(wtype: str, hidden: int, inter: int) -> dict[str, int]:
    """One expert's bytes per operation: gate and up [m, d] rows, down [d, m] rows, and the FFN
    (their sum)."""
    g = inter * row_size(wtype, hidden)
    dn = hidden * row_size(wtype, inter)
    return {"gate": g, "up": g, "down": dn, "ffn": 2 * g + dn}


def op_bytes(ids: np.ndarray, wtype: str, hidden: int, inter: int, op: str = "ffn") -> int:
    """Bytes an operation moves on ``ids`` [n, k]: the union of the selected experts'
    weights."""
    if op not in MODES:
        raise ValueError(f"op: unknown {op!r} (choose from {', '.join(MODES)})")
    return int(np.unique(np.asarray(ids)).size) * weight_bytes(wtype, hidden, inter)[op]


build, _lib = llamacpp_shim.shim(
    SOURCE,
    name="ggml_mmid",
    libs=["ggml-cpu", "ggml-base", "ggml"],
    what="ggml harness",
    signatures={
        "smm_new": "p: " + " ".join(["i"] * 8 + ["p", "Q", "Q"] * 3),
        "smm_run": "d: p p p p p i",
        "smm_free": "-: p",
        "smm_type_id": "i: c",
        "smm_row_size": "Q: i Q",
        "smm_quantize": "Q: i p p Q Q",
        "smm_dequantize": "-: i p p Q",
        "smm_vec_dot_ns": "d: i i i i i",
        "smm_read": "d: p Q",
    },
)


def _tid(wtype: str) -> int:
    return int(_lib().smm_type_id(_check_type(wtype).encode()))


def quantize(w: np.ndarray, wtype: str = "q8_0") -> np.ndarray:
    """ggml's quantization (``ggml_quantize_chunk``) of float32 rows w [..., cols] -> uint8
    [..., row_size(wtype, cols)]; f32 and bf16 come back as their bytes."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    cols = w.shape[-1]
    rs = row_size(wtype, cols)
    rows = w.size // cols
    out = np.empty((*w.shape[:-1], rs), dtype=np.uint8)
    got = _lib().smm_quantize(_tid(wtype), w.ctypes.data, out.ctypes.data, rows, cols)
    if got != rows * rs:
        raise RuntimeError(f"ggml_quantize_chunk wrote {got} bytes, expected {rows * rs}")
    return out


def dequantize(q: np.ndarray, wtype: str, cols: int) -> np.ndarray:
    """ggml's own ``to_float`` of rows quantized by :func:`quantize` -> float32 [..., cols]."""
    q = np.ascontiguousarray(q, dtype=np.uint8)
    rs = row_size(wtype, cols)
    if q.shape[-1] != rs:
        raise ValueError(f"q: last dimension {q.shape[-1]} is not {wtype}'s row of {rs} bytes")
    out = np.empty((*q.shape[:-1], cols), dtype=np.float32)
    _lib().smm_dequantize(_tid(wtype), q.ctypes.data, out.ctypes.data, out.size)
    return out


def vec_dot_ns(wtype: str, *, rows: int, cols: int, tokens: int = 1, reps: int = 20) -> float:
    """ns per call of ggml's own ``vec_dot`` for ``wtype`` (one weight row against one
    activation row converted to its vec_dot type), every token against every one of ``rows``
    rows as ggml's ``MUL_MAT_ID`` block does: ``rows`` sets where the weights sit (16 rows, ggml's
    block, of 2048 bf16 weights are 64 KiB: L2). Thread CPU time."""
    row_size(wtype, cols)
    t = _lib().smm_vec_dot_ns(_tid(wtype), rows, cols, tokens, reps)
    if t < 0:
        raise RuntimeError("ggml harness: out of memory")
    return float(t)


def check_ids(ids: np.ndarray, experts: int, top_k: int | None = None) -> np.ndarray:
    """ids [n, k] as int32 with every expert in [0, experts) (ggml reads them unchecked)."""
    a = np.asarray(ids)
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"ids: need a 2-d [n, k] array, got shape {a.shape}")
    if top_k is not None and a.shape[1] != top_k:
        raise ValueError(f"ids: {a.shape[1]} slots per token, expected top_k = {top_k}")
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"ids: need integers, got {a.dtype}")
    if a.min() < 0 or a.max() >= experts:
        raise ValueError(f"ids: experts must lie in [0, {experts}), got {a.min()}..{a.max()}")
    return np.ascontiguousarray(a, dtype=np.int32)


class Harness:
    """One ggml graph at fixed shapes on the caller's weights (kept alive by the harness).

    ``w_gate_up`` [P, 2m, row bytes of d] and ``w_down`` [P, d, row bytes of m]: any object
    with the buffer protocol or a ``data_ptr()`` (numpy, torch), contiguous, in ``wtype``'s
    ggml layout (bf16: torch.bfloat16's bits). The gate is rows [0, m) of each expert's
    gate_up, the up rows [m, 2m) (:func:`specmoe.kernels._contract.activate`)."""

    def __init__(
        self,
        wtype: str,
        w_gate_up: Any,
        w_down: Any,
        *,
        experts: int,
        hidden: int,
        inter: int,
        top_k: int,
        n: int,
        threads: int = 1,
        op: str = "ffn",
    ) -> None:
        _check_type(wtype)
        if op not in MODES:
            raise ValueError(f"op: unknown {op!r} (choose from {', '.join(MODES)})")
        for name, v in (
            ("experts", experts),
            ("hidden", hidden),
            ("inter", inter),
            ("top_k", top_k),
            ("n", n),
            ("threads", threads),
        ):
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")
        if top_k > experts:
            raise ValueError(f"top_k: {top_k} exceeds experts = {experts}")
        rd, rm = row_size(wtype, hidden), row_size(wtype, inter)
        gu_ptr = _pointer("w_gate_up", w_gate_up, experts * 2 * inter * rd)
        dn_ptr = _pointer("w_down", w_down, experts * hidden * rm)
        self.wtype, self.op = wtype, op
        self.experts, self.hidden, self.inter, self.top_k, self.n = experts, hidden, inter, top_k, n
        self.threads = int(threads)
        self._keep = (w_gate_up, w_down)
        lib = _lib()
        self._lib = lib
        nb2g = 2 * inter * rd
        self._h = lib.smm_new(
            _tid(wtype),
            experts,
            hidden,
            inter,
            top_k,
            n,
            self.threads,
            MODES[op],
            gu_ptr,
            rd,
            nb2g,
            gu_ptr + inter * rd,
            rd,
            nb2g,
            dn_ptr,
            rm,
            hidden * rm,
        )
        if not self._h:
            raise RuntimeError("ggml harness: could not allocate the graph")
        if op == "down":
            self.in_shape, self.out_shape = (n, top_k, inter), (n, top_k, hidden)
        elif op == "ffn":
            self.in_shape, self.out_shape = (n, hidden), (n, hidden)
        else:
            self.in_shape, self.out_shape = (n, hidden), (n, top_k, inter)

    def run(
        self,
        inp: np.ndarray,
        ids: np.ndarray,
        weights: np.ndarray | None = None,
        *,
        clock: str = "wall",
        checked: bool = False,
    ) -> tuple[np.ndarray, float]:
        """(output, seconds of ``ggml_graph_compute``) for input [n, d] (``down``: [n, k, m]),
        ids [n, k] and routing weights [n, k] (the FFN only). ``clock``: ``wall`` or ``cpu``
        (the calling thread's CPU time, one thread only)."""
        if clock not in ("wall", "cpu"):
            raise ValueError(f"clock: unknown {clock!r} (choose wall or cpu)")
        if clock == "cpu" and self.threads != 1:
            raise ValueError("clock: thread CPU time measures one thread only (threads = 1)")
        x = np.ascontiguousarray(inp, dtype=np.float32)
        if x.shape != self.in_shape:
            raise ValueError(f"inp: shape {x.shape}, expected {self.in_shape}")
        idx = ids if checked else check_ids(ids, self.experts, self.top_k)
        if idx.shape[0] != self.n:
            raise ValueError(f"ids: {idx.shape[0]} tokens, expected n = {self.n}")
        w = None
        if self.op == "ffn":
            if weights is None:
                raise ValueError("weights: the FFN needs routing weights [n, k]")
            w = np.ascontiguousarray(weights, dtype=np.float32)
            if w.shape != (self.n, self.top_k):
                raise ValueError(f"weights: shape {w.shape}, expected {(self.n, self.top_k)}")
        out = np.empty(self.out_shape, dtype=np.float32)
        t = self._lib.smm_run(
            self._h,
            x.ctypes.data,
            idx.ctypes.data,
            None if w is None else w.ctypes.data,
            out.ctypes.data,
            1 if clock == "cpu" else 0,
        )
        if t < 0:
            raise RuntimeError("ggml harness: ggml_graph_compute failed")
        return out, float(t)

    def close(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h:
            self._lib.smm_free(h)

    def __del__(self) -> None:
        self.close()


def _pointer(name: str, buf: Any, nbytes: int) -> int:
    if hasattr(buf, "data_ptr"):  # torch
        if not buf.is_contiguous() or buf.device.type != "cpu":
            raise ValueError(f"{name}: must be a contiguous CPU tensor")
        have, ptr = buf.numel() * buf.element_size(), int(buf.data_ptr())
    else:
        a = buf
        if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
            raise ValueError(f"{name}: must be a C-contiguous numpy array or torch tensor")
        have, ptr = a.nbytes, int(a.ctypes.data)
    if have != nbytes:
        raise ValueError(f"{name}: {have} bytes, the shapes need {nbytes}")
    return ptr


def ffn(
    x: np.ndarray,
    w_gate_up: Any,
    w_down: Any,
    ids: np.ndarray,
    weights: np.ndarray,
    *,
    wtype: str,
    inter: int,
    threads: int = 1,
) -> np.ndarray:
    """y [n, d] of ggml's expert FFN (one call; weights in ``wtype``'s layout, see
    :class:`Harness`)."""
    x = np.asarray(x, dtype=np.float32)
    n, d = x.shape
    rd = row_size(wtype, d)
    experts = _nbytes(w_gate_up) // (2 * inter * rd)
    h = Harness(
        wtype,
        w_gate_up,
        w_down,
        experts=experts,
        hidden=d,
        inter=inter,
        top_k=np.asarray(ids).shape[-1],
        n=n,
        threads=threads,
    )
    try:
        return h.run(x, ids, weights)[0]
    finally:
        h.close()


def _nbytes(buf: Any) -> int:
    return buf.numel() * buf.element_size() if hasattr(buf, "data_ptr") else np.asarray(buf).nbytes


def random_weights(
    wtype: str, slots: int, hidden: int, inter: int, *, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Dummy weights of ``slots`` experts in ``wtype``'s layout (uniform, scaled like an
    initialised layer, as :func:`specmoe.bench.timing.make_pool`): gate_up [P, 2m, row of d],
    down [P, d, row of m] as uint8 (f32 as float32, bf16 as uint16)."""
    rng = np.random.default_rng(seed)
    rd, rm = row_size(wtype, hidden), row_size(wtype, inter)
    gu = np.empty((slots, 2 * inter, rd), dtype=np.uint8)
    dn = np.empty((slots, hidden, rm), dtype=np.uint8)
    for e in range(slots):  # expert by expert: no float32 copy of the whole pool
        for dst, shape, scale in (
            (gu, (2 * inter, hidden), hidden**-0.5),
            (dn, (hidden, inter), inter**-0.5),
        ):
            w = rng.uniform(-scale, scale, size=shape).astype(np.float32)
            if wtype == "f32":
                dst[e] = w.view(np.uint8)
            elif wtype == "bf16":
                dst[e] = _to_bf16(w).view(np.uint8)
            else:
                dst[e] = quantize(w, wtype)
    return gu, dn


def _to_bf16(w: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (as torch and ggml's fp32_to_bf16)."""
    u = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@cache
def _probe(threads: int) -> Any:
    from specmoe.bench.machine import CeilingProbe

    return CeilingProbe("cpu", threads=threads)


def _loadavg() -> list[float] | None:
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def time_mul_mat_id(
    *,
    experts: int,
    hidden: int,
    inter: int,
    top_k: int,
    ids: list[np.ndarray],
    wtype: str = "bf16",
    threads: int = 1,
    ops: tuple[str, ...] = ("ffn", "gate", "up", "down"),
    reps: int = 5,
    warmup: int = 2,
    clock: str = "wall",
    flush: str = "pool",
    ceiling: bool = True,
    seed: int = 0,
    pool: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Time ggml's expert FFN and each ``MUL_MAT_ID`` alone on every pass of ``ids`` (a list of
    [n, k] arrays, experts in [0, experts); one n for all).

    ``flush``: ``pool`` relabels each call's experts onto fresh slots of a pool at least twice
    the last-level cache larger than a pass (:class:`specmoe.bench.passes.Rotation`), so every
    call reads its weights from memory; ``none`` uses the ``experts`` weights as given, warm in
    cache after the first call (as ``test-backend-ops perf`` times them). ``ceiling``: a read
    of another buffer (:class:`specmoe.bench.machine.CeilingProbe`) timed in the same rotation.
    ``pool``: weights made by :func:`random_weights` to reuse across calls.

    Returns a dict: per op the times [pass][rep] (seconds), medians, the bytes each pass moves
    (:func:`op_bytes`) and the bandwidth; the ceiling's times; the machine's load before and
    after; the pool and the clock."""
    if not ids:
        raise ValueError("ids: need at least one pass")
    passes = [check_ids(a, experts, top_k) for a in ids]
    n = passes[0].shape[0]
    if any(p.shape[0] != n for p in passes):
        raise ValueError("ids: every pass must have the same number of tokens")
    if flush not in ("pool", "none"):
        raise ValueError(f"flush: unknown {flush!r} (choose pool or none)")
    for op in ops:
        if op not in MODES:
            raise ValueError(f"ops: unknown {op!r} (choose from {', '.join(MODES)})")
    if clock == "cpu" and threads != 1:
        raise ValueError("clock: thread CPU time measures one thread only (threads = 1)")
    from specmoe.bench.machine import last_level_cache_bytes
    from specmoe.bench.passes import Rotation, pool_size

    llc = last_level_cache_bytes("cpu")
    per_expert = weight_bytes(wtype, hidden, inter)["ffn"]
    u_max = max(int(np.unique(p).size) for p in passes)
    slots = experts
    if flush == "pool":
        slots = pool_size(experts, u_max, per_expert, 2 * (llc or (256 << 20)))
    if pool is None:
        pool = random_weights(wtype, slots, hidden, inter, seed=seed)
    slots = pool[0].shape[0]
    if slots < experts:
        raise ValueError(f"pool: {slots} slots, fewer than experts = {experts}")
    load_before = _loadavg()
    harness = {
        op: Harness(
            wtype,
            pool[0],
            pool[1],
            experts=slots,
            hidden=hidden,
            inter=inter,
            top_k=top_k,
            n=n,
            threads=threads,
            op=op,
        )
        for op in ops
    }
    probe = _probe(threads) if ceiling else None
    rng = np.random.default_rng(seed)
    rot = Rotation(slots)
    names = [*ops, *(["ceiling"] if probe else [])]
    times = {k: [[] for _ in passes] for k in names}
    now = time.thread_time if clock == "cpu" else time.perf_counter
    t_start = time.perf_counter()
    for pi, p in enumerate(passes):
        x = rng.standard_normal((n, hidden), dtype=np.float32)
        a = rng.standard_normal((n, top_k, inter), dtype=np.float32)
        w = rng.dirichlet(np.ones(top_k), size=n).astype(np.float32)
        for rep in range(warmup + reps):
            for j in range(len(names)):
                name = names[(rep + pi + j) % len(names)]
                if name == "ceiling":
                    t0 = now()
                    probe()
                    dt = now() - t0
                else:
                    idt = rot(p).astype(np.int32) if flush == "pool" else p
                    inp = a if name == "down" else x
                    dt = harness[name].run(inp, idt, w, clock=clock, checked=True)[1]
                if rep >= warmup:
                    times[name][pi].append(dt)
    wall = time.perf_counter() - t_start
    for h in harness.values():
        h.close()
    out_ops: dict[str, Any] = {}
    for op in ops:
        nbytes = [op_bytes(p, wtype, hidden, inter, op) for p in passes]
        med = [statistics.median(t) for t in times[op]]
        out_ops[op] = {
            "times_s": times[op],
            "median_s": med,
            "bytes": nbytes,
            "gbps": [b / t / 1e9 for b, t in zip(nbytes, med)],
            "sum_median_s": float(sum(med)),
            "sum_bytes": int(sum(nbytes)),
        }
    res: dict[str, Any] = {
        "engine": "ggml",
        "llama_cpp": llamacpp.VERSION,
        "wtype": wtype,
        "experts": experts,
        "hidden": hidden,
        "inter": inter,
        "top_k": top_k,
        "n": n,
        "threads": threads,
        "clock": clock,
        "flush": flush,
        "pool_slots": slots,
        "llc_bytes": llc,
        "expert_bytes": weight_bytes(wtype, hidden, inter),
        "u": [int(np.unique(p).size) for p in passes],
        "reps": reps,
        "warmup": warmup,
        "ops": out_ops,
        "loadavg_before": load_before,
        "loadavg_after": _loadavg(),
        "wall_s": wall,
    }
    if probe is not None:
        med = [statistics.median(t) for t in times["ceiling"]]
        res["ceiling"] = {
            "bytes": probe.bytes,
            "times_s": times["ceiling"],
            "gbps": [probe.gbps(t) for t in med],
        }
    return res
