"""Facts about the machine the benchmark runs on: measured, or read from the system, never guessed.

* :func:`last_level_cache_bytes` reads the last-level cache from sysfs (CPU) or the device
  properties (CUDA L2); ``None`` when the system does not say.
* :func:`measure_ceiling` is the read bandwidth of a buffer much larger than that cache (at
  least 8x, and 1 GiB on a CPU), median over repetitions: the memory-bandwidth ceiling that the
  effective bandwidths of paper 002 Section 2 are set against.
* :func:`measure_peak_flops` is the matrix-multiply rate at the timed dtype, for the roofline
  bound ``max(bytes / ceiling, flops / peak)``.
"""

from __future__ import annotations

import glob
import os
import platform
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specmoe.errors import InputError

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG]?)i?B?\s*$", re.IGNORECASE)


def _parse_size(text: str) -> int | None:
    m = _SIZE_RE.match(text)
    if not m:
        return None
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


def cpu_last_level_cache_bytes(sysfs: str = "/sys/devices/system/cpu") -> int | None:
    """Total bytes of the CPU's last-level cache, from sysfs; None when sysfs does not say.

    Each cache instance is counted once (instances are told apart by ``shared_cpu_list``), so
    a processor with several L3 slices reports their sum.
    """
    best_level, instances = -1, {}
    for idx in glob.glob(os.path.join(sysfs, "cpu[0-9]*", "cache", "index[0-9]*")):
        try:
            with open(os.path.join(idx, "level")) as fh:
                level = int(fh.read().strip())
            with open(os.path.join(idx, "type")) as fh:
                kind = fh.read().strip()
            with open(os.path.join(idx, "size")) as fh:
                size = _parse_size(fh.read().strip())
            with open(os.path.join(idx, "shared_cpu_list")) as fh:
                shared = fh.read().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or size is None:
            continue
        if level > best_level:
            best_level, instances = level, {}
        if level == best_level:
            instances[shared] = size
    return sum(instances.values()) if instances else None


def last_level_cache_bytes(device: str = "cpu") -> int | None:
    """Last-level cache bytes of ``device`` ("cpu" or "cuda"), or None if unknown."""
    if device == "cuda":
        if not torch.cuda.is_available():
            return None
        size = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)
        return int(size) or None
    return cpu_last_level_cache_bytes()


def device_name(device: str = "cpu") -> str:
    """The processor or GPU name ("unknown CPU" when the system does not say)."""
    if device == "cuda":
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or f"unknown {platform.machine()} CPU"


def cpu_identity(cpuinfo: str = "/proc/cpuinfo") -> dict[str, object]:
    """What tells one x86 processor from another beyond its name (a virtual machine's name is
    often generic, "Intel(R) Xeon(R) Processor"): vendor, family, model and stepping, the
    last-level cache bytes, the online cores and the vector instruction sets. Keys whose value
    the system does not give are left out."""
    out: dict[str, object] = {"name": device_name("cpu")}
    keys = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping"}
    flags: list[str] = []
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = (part.strip() for part in line.partition(":"))
                if key in keys:
                    out[keys[key]] = value
                elif key == "flags":
                    flags = value.split()
    except OSError:
        pass
    vector = sorted(f for f in flags if f.startswith(("avx", "fma", "amx", "sse4")))
    if vector:
        out["isa"] = vector
    if (llc := cpu_last_level_cache_bytes()) is not None:
        out["llc_bytes"] = llc
    out["cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {k: v for k, v in out.items() if v is not None}


THP_ENV = "THP_MEM_ALLOC_ENABLE"


def huge_pages(sysfs: str = "/sys/kernel/mm/transparent_hugepage/enabled") -> dict[str, object]:
    """Whether this process's large tensors can sit on transparent huge pages: the kernel's
    mode (``always``, ``madvise`` or ``never``, the bracketed word of ``sysfs``; absent where
    the file is not there) and PyTorch's own switch ``$THP_MEM_ALLOC_ENABLE`` (with it set to 1
    before torch is imported, CPU allocations of 2 MiB and more are aligned to 2 MiB and asked
    for huge pages with ``madvise``). On a Zen 5 core the C kernels read 5-12% faster from such
    pages (``results/cpu/kernels/beside-2026-12-04-zen5/``), so a benchmark's record says which
    it had."""
    out: dict[str, object] = {"torch_env": os.environ.get(THP_ENV)}
    try:
        text = Path(sysfs).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    if m := re.search(r"\[(\w+)\]", text):
        out["mode"] = m.group(1)
    mode = out.get("mode")
    out["on"] = mode == "always" or (mode == "madvise" and out["torch_env"] == "1")
    return out


def check_device(device: str) -> str:
    if device not in ("cpu", "cuda"):
        raise InputError(f"unknown {device!r} (choose cpu or cuda)", argument="device")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("cuda: no CUDA device is available", argument="device")
    return device


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@dataclass(frozen=True)
class Ceiling:
    """A measured read bandwidth."""

    gbps: float  # median over repetitions, 1 GB = 1e9 B
    iqr_gbps: tuple[float, float]
    buffer_bytes: int
    llc_bytes: int | None  # None: the system did not say
    threads: int | None  # CPU threads of the best reading
    method: str


def _ceiling_buffer_bytes(device: str, llc: int | None) -> int:
    floor = (1 << 30) if device == "cpu" else (2 << 30)
    return max(floor, 8 * (llc or 0))


def _clock(clock: str):
    if clock == "wall":
        return time.perf_counter
    if clock == "cpu":
        return time.thread_time
    raise InputError(f"unknown {clock!r} (choose wall or cpu)", argument="clock")


def measure_ceiling(
    device: str = "cpu",
    *,
    reps: int = 7,
    threads: list[int] | None = None,
    buffer_bytes: int | None = None,
    clock: str = "wall",
) -> Ceiling:
    """Read bandwidth of a buffer much larger than the last-level cache (median of ``reps``).

    CPU: the C read loop of the kernel library (each thread sums its own contiguous share),
    tried at each thread count in ``threads`` (default 1..torch threads); the best median
    wins. Without the C library, ``torch.sum``. CUDA: ``torch.sum`` in float32 of an int32
    buffer, timed with events. ``clock="cpu"`` times the calling thread's CPU time (one
    thread only; see :mod:`specmoe.bench.timing`).
    """
    check_device(device)
    now = _clock(clock)
    if clock == "cpu":
        threads = [1]
    llc = last_level_cache_bytes(device)
    nbytes = buffer_bytes or _ceiling_buffer_bytes(device, llc)
    count = nbytes // 4
    if device == "cuda":
        buf = torch.ones(count, dtype=torch.int32, device="cuda")
        times = []
        for i in range(reps + 2):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            buf.sum(dtype=torch.float32)
            end.record()
            torch.cuda.synchronize()
            if i >= 2:
                times.append(start.elapsed_time(end) / 1e3)
        del buf
        return _ceiling_from(times, count * 4, llc, None, "torch.sum of an int32 buffer (CUDA)")
    from specmoe.kernels import _cbuild

    buf = torch.empty(count, dtype=torch.float32).uniform_(-1, 1)  # touches every page
    lib = _cbuild.load()
    candidates = threads or list(range(1, max(1, torch.get_num_threads()) + 1))
    best = None
    for k in candidates:
        times = []
        for i in range(reps + 1):
            prev = torch.get_num_threads()
            torch.set_num_threads(k)
            t0 = now()
            if lib is not None:
                lib.lib.specmoe_read(buf.data_ptr(), count, k)
            else:
                buf.sum()
            dt = now() - t0
            torch.set_num_threads(prev)
            if i >= 1:
                times.append(dt)
        method = (
            ("C read loop" if lib is not None else "torch.sum")
            + f", {k} thread(s)"
            + (", thread CPU time" if clock == "cpu" else "")
        )
        c = _ceiling_from(times, count * 4, llc, k, method)
        if best is None or c.gbps > best.gbps:
            best = c
    del buf
    assert best is not None
    return best


def _ceiling_from(
    times: list[float], nbytes: int, llc: int | None, threads: int | None, method: str
) -> Ceiling:
    q1, q3 = np.percentile(times, [25, 75])
    return Ceiling(
        gbps=nbytes / statistics.median(times) / 1e9,
        iqr_gbps=(nbytes / q3 / 1e9, nbytes / q1 / 1e9),
        buffer_bytes=nbytes,
        llc_bytes=llc,
        threads=threads,
        method=method,
    )


def measure_peak_flops(
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    size: int | None = None,
    reps: int = 5,
    clock: str = "wall",
) -> float:
    """Matrix-multiply rate (flop/s) of a square ``torch.mm`` at ``dtype``: median of reps,
    with torch's current thread count (``clock="cpu"``: one thread, its CPU time)."""
    check_device(device)
    now = _clock(clock)
    if clock == "cpu" and device != "cpu":
        raise InputError("cpu: thread CPU time does not measure CUDA kernels", argument="clock")
    size = size or (1024 if device == "cpu" else 8192)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    prev = torch.get_num_threads()
    if clock == "cpu":
        torch.set_num_threads(1)
    try:
        times = []
        for i in range(reps + 2):
            sync(device)
            t0 = now()
            torch.mm(a, b)
            sync(device)
            if i >= 2:
                times.append(now() - t0)
    finally:
        torch.set_num_threads(prev)
    return 2.0 * size**3 / statistics.median(times)


def roofline_peak_flops(
    device: str = "cpu", dtype: torch.dtype = torch.float32, *, clock: str = "wall"
) -> tuple[float, str]:
    """The flop rate of a roofline's compute term at ``dtype``, and the dtype it was measured at.

    On the CPU the expert kernels widen bfloat16 and float16 weights to float32 in registers
    and sum with float32 FMAs (or, with AVX-512 BF16, ``vdpbf16ps``), so their arithmetic peak
    is the faster of the two matrix-multiply rates: ``torch.mm`` at a reduced dtype can run a
    slow path (0.9 GFLOP/s in bfloat16 on an AVX2 core, against tens in float32), which as
    the peak would make the compute term dominate every roofline. On CUDA: the rate at ``dtype``.
    """
    peak = measure_peak_flops(device, dtype, clock=clock)
    if device != "cpu" or dtype == torch.float32:
        return peak, str(dtype).removeprefix("torch.")
    fp32 = measure_peak_flops(device, torch.float32, clock=clock)
    if fp32 > peak:
        return fp32, "float32"
    return peak, str(dtype).removeprefix("torch.")


class CeilingProbe:
    """A short read of another buffer, timed among the kernels (``benchmark(ceiling_beside=
    True)``): the read ceiling measured beside each kernel timing rather than once before.

    The buffer is at least twice the last-level cache and is read ``chunk_bytes`` at a time,
    each call the next chunk round the buffer, so every call reads from memory (the kernels'
    weight pool between two calls evicts the rest). ``gbps(seconds)`` converts one call's
    time. CPU: the C read loop of the kernel library on ``threads`` threads (torch.sum without
    it); CUDA: torch.sum of an int32 chunk."""

    def __init__(
        self,
        device: str = "cpu",
        *,
        threads: int = 1,
        chunk_bytes: int = 32 << 20,
        buffer_bytes: int | None = None,
    ) -> None:
        check_device(device)
        llc = last_level_cache_bytes(device) or (256 << 20)  # as the benchmark assumes
        total = max(buffer_bytes or 2 * llc, 4 * chunk_bytes)
        self.device, self.threads = device, int(threads)
        self.chunk = int(chunk_bytes) // 4
        self.chunks = max(2, total // (self.chunk * 4))
        if device == "cuda":
            self._buf = torch.ones(self.chunk * self.chunks, dtype=torch.int32, device="cuda")
            self._lib = None
        else:
            from specmoe.kernels import _cbuild

            self._buf = torch.empty(self.chunk * self.chunks, dtype=torch.float32).uniform_(-1, 1)
            self._lib = _cbuild.load()
        self._next = 0
        self.bytes = self.chunk * 4

    def __call__(self, *args: object, **kwargs: object) -> None:
        i, self._next = self._next, (self._next + 1) % self.chunks
        part = self._buf[i * self.chunk : (i + 1) * self.chunk]
        if self.device == "cuda":
            part.sum(dtype=torch.float32)
        elif self._lib is not None:
            self._lib.lib.specmoe_read(part.data_ptr(), part.numel(), self.threads)
        else:
            float(part.sum())

    def gbps(self, seconds: float) -> float:
        return self.bytes / seconds / 1e9
