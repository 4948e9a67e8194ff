"""Timing one layer's expert operation: weight pools, warm-up, alternation, medians.

Legend: ``P`` weight slots in the pool (>= N), ``h`` hidden, ``I`` expert width, ``n`` tokens,
``m`` slots.

Every timed call reads its weights from memory: each call's experts are relabelled onto fresh
slots of a pool large enough that a slot is reused only after at least twice the last-level
cache of other weights has been read (:class:`specmoe.bench.passes.Rotation`). Kernels
alternate within each repetition of a pass, in an order that rotates from one repetition to the
next, so a drift of the machine's speed (another job starting) touches every kernel alike.

Clocks: ``wall`` (``time.perf_counter``; on CUDA, events around the call) is the time a user
waits. ``cpu`` is the calling thread's CPU time (``time.thread_time``): on a shared machine it
leaves out the time the thread waited for a core, so it approximates the unloaded time; it is
meaningful only for single-threaded CPU kernels.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specmoe.bench.passes import Rotation
from specmoe.errors import InputError

CLOCKS = ("wall", "cpu")


@dataclass
class WeightPool:
    """Dummy weights of one MoE layer, P slots of the layer's shapes, in the timed dtype."""

    w_gate_up: Any  # [P, 2I, h]: a tensor, or Q8Weights (q8_0)
    w_down: Any  # [P, h, I]
    b_gate_up: torch.Tensor | None  # [P, 2I]
    b_down: torch.Tensor | None  # [P, h]
    activation: str
    rotation: Rotation = field(init=False)

    def __post_init__(self) -> None:
        self.rotation = Rotation(self.w_gate_up.shape[0])

    @property
    def slots(self) -> int:
        return int(self.w_gate_up.shape[0])


def make_pool(
    slots: int,
    hidden: int,
    inter: int,
    *,
    dtype: torch.dtype | str,
    device: str,
    activation: str = "swiglu",
    bias: bool = False,
    seed: int = 0,
) -> WeightPool:
    """Uniform dummy weights scaled like an initialised layer (no denormals, no overflow).
    ``dtype="q8_0"``: the same draws quantised to llama.cpp's q8_0 layout
    (:class:`specmoe.kernels.q8.Q8Weights`), a few slots at a time; biases stay float32."""
    g = torch.Generator(device=device).manual_seed(seed)
    q8 = str(dtype).lower() == "q8_0"
    fdt = torch.float32 if q8 else dtype

    def uni(*shape: int, scale: float) -> torch.Tensor:
        t = torch.empty(*shape, dtype=fdt, device=device)
        return t.uniform_(-scale, scale, generator=g)  # touches every page

    def weights(rows: int, cols: int, scale: float):
        if not q8:
            return uni(slots, rows, cols, scale=scale)
        from specmoe.kernels.q8 import Q8Weights, quantize_q8_0, row_bytes

        out = torch.empty(slots, rows, row_bytes(cols), dtype=torch.uint8, device=device)
        step = max(1, (64 << 20) // (rows * cols * 4))  # float32 draws of about 64 MiB at a time
        for s0 in range(0, slots, step):
            s1 = min(slots, s0 + step)
            out[s0:s1] = quantize_q8_0(uni(s1 - s0, rows, cols, scale=scale)).blocks
        return Q8Weights(out, cols)

    wgu = weights(2 * inter, hidden, hidden**-0.5)
    wd = weights(hidden, inter, inter**-0.5)
    bgu = uni(slots, 2 * inter, scale=0.1) if bias else None
    bd = uni(slots, hidden, scale=0.1) if bias else None
    return WeightPool(wgu, wd, bgu, bd, activation)


@dataclass
class Timed:
    """Repeated times of one pass with one kernel (seconds)."""

    times: list[float]

    @property
    def median(self) -> float:
        return float(statistics.median(self.times))

    @property
    def iqr(self) -> tuple[float, float]:
        if len(self.times) < 2:
            return (self.times[0], self.times[0])
        q = np.percentile(self.times, [25, 75])
        return (float(q[0]), float(q[1]))


def _timer(device: str, clock: str) -> Callable[[Callable[[], object]], float]:
    if clock not in CLOCKS:
        raise InputError(f"unknown {clock!r} (choose from {', '.join(CLOCKS)})", argument="clock")
    if device == "cuda":
        if clock == "cpu":
            raise InputError("cpu: thread CPU time does not measure CUDA kernels", argument="clock")

        def cuda_time(call: Callable[[], object]) -> float:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            call()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3

        return cuda_time
    clockfn = time.perf_counter if clock == "wall" else time.thread_time

    def cpu_time(call: Callable[[], object]) -> float:
        t0 = clockfn()
        call()
        return clockfn() - t0

    return cpu_time


def time_pass(
    pool: WeightPool,
    kernels: Sequence[tuple[str, Callable]],
    ids: np.ndarray,
    *,
    reps: int,
    device: str,
    clock: str,
    rng: np.random.Generator,
    rotate_from: int = 0,
) -> dict[str, Timed]:
    """Time one pass (``ids`` [n, m], experts in [0, N)) with every kernel, ``reps`` times.

    Each call gets its own relabelling onto fresh pool slots; kernels alternate within a
    repetition, starting from a different kernel each repetition.
    """
    timer = _timer(device, clock)
    n, m = ids.shape
    h = pool.w_gate_up.shape[2]
    dtype = pool.w_gate_up.dtype
    if dtype == "q8_0":  # q8_0 weights take float32 activations (specmoe.kernels.cpu)
        dtype = torch.float32
    x = torch.from_numpy(rng.standard_normal((n, h), dtype=np.float32)).to(device, dtype)
    w = torch.from_numpy(rng.dirichlet(np.ones(m), size=n).astype(np.float32)).to(device, dtype)
    out = {name: Timed([]) for name, _ in kernels}
    k = len(kernels)
    for rep in range(reps):
        for j in range(k):
            name, fn = kernels[(rep + rotate_from + j) % k]
            idt = torch.from_numpy(pool.rotation(ids)).to(device)

            def call(fn=fn, idt=idt):
                return fn(
                    x,
                    pool.w_gate_up,
                    pool.w_down,
                    idt,
                    w,
                    activation=pool.activation,
                    b_gate_up=pool.b_gate_up,
                    b_down=pool.b_down,
                    check=False,
                )

            out[name].times.append(timer(call))
    return out
