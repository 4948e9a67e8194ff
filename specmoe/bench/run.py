"""The expert-operation benchmark of paper 002 Section 2: time, fit, score, profile.

Legend: ``n`` tokens per pass (1..n_max), ``m`` slots, ``N`` experts, ``U`` distinct experts of
a pass, ``b`` bytes of one expert at the timed dtype, ``L`` timed trace layers.

:func:`benchmark` times one MoE layer's expert operation alone, at a ModelSpec's real shapes
with dummy weights, for each kernel, on two kinds of passes (:mod:`specmoe.bench.passes`):
chosen ids (U swept from m to min(nm, N) at each n) and windows of recorded routing (each timed
layer's windows of n consecutive tokens within documents). Then:

* fits on chosen ids at n = 2..n_max: Eq. (4) for per-slot kernels, Eq. (E.1) for dedup ones.
  Every layer has the same shapes and the same dummy weights, so one fit stands for every
  layer's; ε scores it per layer on that layer's recorded windows (n = 2..n_max), and is the
  median over layers of the per-layer median relative error (paper 002 Section 4);
* on recorded windows, with times and bytes summed over layers and windows (Table 1):
  β_slot(n) on n·m·b, β_dedup(n) on U·b, r(n), ū(n), the re-read cost c_re/c_u of Eq. (4),
  and the crossover (first n >= 2 from which Σ t_slot − Σ t_dedup stays positive);
* op_time per timed layer and n: the fit at the windows' mean bytes, and the mean over windows
  of each window's median measured time (t̄_{p,l}(n) of Eq. (22));
* the roofline of each kernel: Σ t / Σ max(bytes / ceiling, flops / peak) over the windows of
  each n, with bytes its requested bytes and flops 6·h·I per slot.

The result is a :class:`specmoe.formats.profile.BandwidthProfile` (kernels ``per_slot`` and
``dedup`` are the first per-slot and the first dedup kernel timed); every other kernel, the
chosen-id table behind the fits and the machine facts go under ``extra``. Its
``implementations`` say what each kernel name really ran while it was timed
(:func:`specmoe.kernels.implementation`, and every fallback the calls reported).
"""

from __future__ import annotations

import datetime
import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specmoe.bench import fit as F
from specmoe.bench.machine import (
    Ceiling,
    check_device,
    device_name,
    last_level_cache_bytes,
    measure_ceiling,
    roofline_peak_flops,
)
from specmoe.bench.passes import chosen_pass, distinct, pool_size, recorded_windows, u_grid
from specmoe.bench.timing import CLOCKS, Timed, make_pool, time_pass
from specmoe.errors import InputError
from specmoe.formats.profile import BandwidthProfile
from specmoe.formats.trace import RoutingTrace, load_trace
from specmoe.kernels import (
    get_kernel,
    implementation,
    kernel_kind,
    kernel_names,
    torch_dtype,
    watch_fallbacks,
)
from specmoe.spec import ModelSpec

__all__ = [
    "BenchResult",
    "Settings",
    "benchmark",
    "last_level_cache_bytes",
    "measure_ceiling",
    "run_benchmark",
    "summarize",
]

UNKNOWN_LLC_ASSUMED = 256 << 20  # flush size assumed when the system does not state its cache


@dataclass(frozen=True)
class Settings:
    """How much to time. ``quick`` fits ``specmoe plan``'s default budget (minutes on a CPU)."""

    n_max: int = 9
    reps: int = 5  # timed repetitions of each pass and kernel
    u_points: int = 6  # chosen U values per n
    passes_per_u: int = 2  # chosen passes (different random ids) per (n, U)
    windows: int = 4  # recorded windows per (layer, n)
    max_layers: int | None = None  # timed trace layers (evenly spaced); None: all
    warmup: int = 2

    @classmethod
    def for_run(cls, *, quick: bool, device: str, **overrides: Any) -> Settings:
        if quick:
            base = cls(reps=3, u_points=3, passes_per_u=1, windows=2, max_layers=4, warmup=1)
        else:
            base = cls(windows=4 if device == "cpu" else 16)
        kw = {k: v for k, v in overrides.items() if v is not None}
        for k, v in kw.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"must be a positive integer, got {v!r}", argument=k)
        return cls(**{**base.__dict__, **kw})


@dataclass
class Record:
    """One timed pass: its ids' summary and each kernel's times."""

    source: str  # "chosen" or "recorded"
    layer: int | None  # trace layer position (recorded) or None (chosen)
    n: int
    u: int
    start: int | None  # first token of a recorded window
    ids: np.ndarray | None = None  # [n, m] expert ids as chosen or recorded
    timed: dict[str, Timed] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "layer": self.layer,
            "n": self.n,
            "u": self.u,
            "start": self.start,
            "ids": None if self.ids is None else self.ids.tolist(),
            "kernels": {
                k: {"median": t.median, "q1": t.iqr[0], "q3": t.iqr[1], "times": t.times}
                for k, t in self.timed.items()
            },
        }


@dataclass
class BenchResult:
    profile: BandwidthProfile
    records: list[Record]
    ceiling: Ceiling


def resolve_trace(
    trace: RoutingTrace | str | os.PathLike | None, spec: ModelSpec
) -> tuple[RoutingTrace, str]:
    """The trace to draw recorded windows from (default: the bundled fit trace)."""
    if trace is None:
        from specmoe.data.corpus import bundled_trace_path

        path = bundled_trace_path("fit")
        if not path.exists():
            raise InputError(
                f"the bundled fit trace ({path.name}) is not installed; "
                f"pass a trace of routing recorded from {spec.name}",
                argument="trace",
            )
        trace = path
    label = str(trace) if not isinstance(trace, RoutingTrace) else trace.name
    tr = trace if isinstance(trace, RoutingTrace) else load_trace(trace)
    if (tr.num_experts, tr.top_k) != (spec.num_experts, spec.top_k):
        raise InputError(
            f"{label}: routing has N={tr.num_experts}, m={tr.top_k} but "
            f"model {spec.name} has N={spec.num_experts}, m={spec.top_k}",
            argument="trace",
        )
    return tr, label


def _select_layers(num: int, max_layers: int | None) -> list[int]:
    if max_layers is None or max_layers >= num:
        return list(range(num))
    return sorted({round(v) for v in np.linspace(0, num - 1, max_layers)})


def _check_kernels(kernels: list[str], device: str) -> tuple[str, str]:
    valid = [k for k in kernel_names(device) if k != "reference"]
    for k in kernels:
        if k not in valid:
            raise InputError(
                f"unknown or unavailable {k!r} on {device} (choose from {', '.join(valid)})",
                argument="kernels",
            )
    slot = next((k for k in kernels if kernel_kind(k) == "per_slot"), None)
    dedup = next((k for k in kernels if kernel_kind(k) == "dedup"), None)
    if slot is None or dedup is None:
        raise InputError(
            f"need at least one per-slot and one dedup kernel (got {', '.join(kernels)})",
            argument="kernels",
        )
    return slot, dedup


@contextmanager
def _threads(device: str, threads: int | None):
    from specmoe.kernels import cpu

    if device != "cpu" or threads is None:
        yield
        return
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    cpu.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(prev)
        cpu.set_num_threads(None)


class _Progress:
    """Progress on stderr (rich), or nothing."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._p = None
        self.console = None
        if enabled:
            try:
                from rich.console import Console
            except ImportError:  # plain lines on stderr without rich
                return
            self.console = Console(stderr=True)

    def say(self, text: str) -> None:
        if not self.enabled:
            return
        if self.console is None:
            import re

            print(re.sub(r"\[/?bold\]", "", text), file=sys.stderr, flush=True)
        else:
            self.console.print(text)

    def start(self, total: int, label: str) -> None:
        if not self.enabled or self.console is None:
            self.say(f"{label}: {total} passes")
            return
        from rich.progress import BarColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

        self._p = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            "{task.completed}/{task.total}",
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self._p.start()
        self._task = self._p.add_task(label, total=total)

    def advance(self) -> None:
        if self._p is not None:
            self._p.advance(self._task)

    def stop(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None


def benchmark(
    spec: ModelSpec,
    *,
    trace: RoutingTrace | str | os.PathLike | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    quick: bool = False,
    seed: int = 0,
    progress: bool = True,
    kernels: list[str] | None = None,
    threads: int | None = None,
    clock: str = "wall",
    settings: Settings | None = None,
    ceiling_beside: bool = False,
) -> BenchResult:
    """Time, fit and score; see the module docstring. ``threads`` (CPU): None picks the thread
    count with the highest measured ceiling. ``ceiling_beside``: a short read of another buffer
    (:class:`specmoe.bench.machine.CeilingProbe`) is timed among the kernels of every recorded
    pass, in the same rotation, and the profile's ``extra`` gains the ceiling measured beside
    each n and each kernel's roofline ratio against it (``ceiling_beside``)."""
    t_start = time.perf_counter()
    check_device(device)
    q8 = str(dtype).lower() == "q8_0"
    if q8 and device != "cpu":
        raise InputError("q8_0 weights run on the cpu device only (the C kernels)",
                         argument="dtype")  # fmt: skip
    tdtype = torch.float32 if q8 else torch_dtype(dtype)  # q8_0: float32 activations
    if clock not in CLOCKS:
        raise InputError(f"unknown {clock!r} (choose from {', '.join(CLOCKS)})", argument="clock")
    kernels = list(kernels or ["per_slot", "dedup"])
    slot_k, dedup_k = _check_kernels(kernels, device)
    cfg = settings or Settings.for_run(quick=quick, device=device)
    tr, trace_label = resolve_trace(trace, spec)
    dtype = "q8_0" if q8 else str(tdtype).removeprefix("torch.")
    if q8 and (spec.hidden_size % 32 or spec.expert_intermediate % 32):
        raise InputError(
            f"q8_0 needs hidden and expert widths that are multiples of 32, got "
            f"{spec.hidden_size} and {spec.expert_intermediate}",
            argument="dtype",
        )
    if q8:  # only the C kernels take q8_0 weights: say so before any measurement
        from specmoe.kernels import cpu as _ccpu

        reason = _ccpu.c_reason(device="cpu", dtype="q8_0", strided=False)
        c_kernels = [k for k in kernels if k in ("per_slot", "dedup")]
        if reason is not None or len(c_kernels) < 2:
            raise InputError(
                "q8_0 weights need specmoe's C per_slot and dedup kernels"
                + (f" ({reason})" if reason else f", got --kernels {','.join(kernels)}"),
                argument="dtype",
            )
    tspec = spec.with_dtype(dtype)
    b = tspec.expert_bytes
    m, num, h, inter = spec.top_k, spec.num_experts, spec.hidden_size, spec.expert_intermediate
    prog = _Progress(progress)
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)

    # 1. The machine's ceiling, first of all.
    if threads is not None and (isinstance(threads, bool) or threads < 1):
        raise InputError(f"must be a positive integer, got {threads!r}", argument="threads")
    if clock == "cpu":
        if device != "cpu" or (threads or 1) != 1:
            raise InputError(
                "cpu: thread CPU time measures single-threaded CPU kernels only "
                "(one thread, on the cpu device)",
                argument="clock",
            )
        threads = 1
    ceiling = measure_ceiling(device, threads=[threads] if threads else None, clock=clock)
    if device == "cpu":
        threads = threads or ceiling.threads
    llc = ceiling.llc_bytes
    prog.say(
        f"[bold]ceiling[/bold] {ceiling.gbps:.2f} GB/s (read of "
        f"{ceiling.buffer_bytes / 2**30:.1f} GiB; last-level cache "
        f"{'unknown' if llc is None else f'{llc / 2**20:.0f} MiB'}; {ceiling.method})"
    )
    with _threads(device, threads):
        peak, peak_dtype = roofline_peak_flops(device, tdtype, clock=clock)
        prog.say(
            f"[bold]matmul peak[/bold] {peak / 1e9:.1f} GFLOP/s ({peak_dtype}, "
            f"{device_name(device)})"
        )
        fns = [(k, get_kernel(k, device)) for k in kernels]
        probe = None
        if ceiling_beside:
            from specmoe.bench.machine import CeilingProbe

            probe = CeilingProbe(device, threads=threads or 1)

        # 2. Weights: a pool big enough that every timing reads from memory.
        n_values = list(range(1, cfg.n_max + 1))
        u_max = min(cfg.n_max * m, num)
        flush = 2 * (llc if llc is not None else UNKNOWN_LLC_ASSUMED)
        slots = pool_size(num, u_max, b, flush)
        pool = make_pool(
            slots,
            h,
            inter,
            dtype="q8_0" if q8 else tdtype,
            device=device,
            activation=spec.activation,
            bias=spec.expert_bias,
            seed=seed,
        )
        prog.say(
            f"weights: {slots} expert slots of {b / 1e6:.2f} MB ({slots * b / 1e9:.2f} GB)"
            f", each reused after >= {flush / 2**20:.0f} MiB of other reads"
        )

        # 3. The passes.
        records: list[Record] = []
        for n in n_values:
            for u in u_grid(n, m, num, cfg.u_points):
                for _ in range(cfg.passes_per_u if n > 1 else 1):
                    records.append(
                        Record("chosen", None, n, u, None, chosen_pass(n, m, num, u, rng))
                    )
        layers = _select_layers(tr.num_layers, cfg.max_layers)
        for li in layers:
            for n in n_values:
                for w in recorded_windows(tr.experts, tr.doc_offsets, n, li, cfg.windows, rng):
                    records.append(Record("recorded", li, n, distinct(w.ids), w.start, w.ids))
        missing = [
            n for n in n_values if not any(r.source == "recorded" and r.n == n for r in records)
        ]
        if missing:
            raise InputError(
                f"{trace_label}: no document has {missing[0]} tokens; "
                f"recorded windows are needed at every n up to {cfg.n_max}",
                argument="trace",
            )

        impls = {k: implementation(k, device, dtype=dtype if q8 else tdtype) for k in kernels}
        with watch_fallbacks() as fell:  # what really ran, when it is not what a name asks for
            # 4. Warm-up (compilation, thread pools, caches of the allocator), then time. A kernel
            #    that fails here (a peer on an unsupported dtype or device) is left out and said.
            failed: dict[str, str] = {}
            for name in kernels if q8 else []:  # q8_0 weights: the C kernels' path only
                if impls[name].ran != "c":
                    failed[name] = "no q8_0 path (q8_0 weights are the C kernels' only)"
                    prog.say(f"[bold]left out[/bold] {name}: {failed[name]}")
            for name, fn in [(k, f) for k, f in fns if k not in failed]:
                try:
                    for rec in [records[0], records[len(records) // 2], records[-1]]:
                        time_pass(
                            pool,
                            [(name, fn)],
                            rec.ids,
                            reps=cfg.warmup,
                            device=device,
                            clock=clock,
                            rng=rng,
                        )
                except InputError:
                    raise
                except Exception as exc:
                    failed[name] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
                    prog.say(f"[bold]left out[/bold] {name}: {failed[name]}")
            if failed:
                kernels = [k for k in kernels if k not in failed]
                fns = [(k, f) for k, f in fns if k not in failed]
                if slot_k in failed or dedup_k in failed:
                    try:
                        slot_k, dedup_k = _check_kernels(kernels, device)
                    except InputError:
                        raise RuntimeError(
                            "no per-slot or no dedup kernel ran: "
                            + "; ".join(f"{k}: {v}" for k, v in failed.items())
                        ) from None
            order = rng.permutation(len(records))
            prog.start(len(records), "timing passes")
            try:
                for i, idx in enumerate(order):
                    rec = records[idx]
                    beside = probe is not None and rec.source == "recorded"
                    rec.timed = time_pass(
                        pool,
                        [*fns, (CEILING, probe)] if beside else fns,
                        rec.ids,
                        reps=cfg.reps,
                        device=device,
                        clock=clock,
                        rng=rng,
                        rotate_from=i,
                    )
                    prog.advance()
            finally:
                prog.stop()
        ran = {k: fell.get(k, impls[k]).to_dict() for k in kernels}
        del pool
    wall = time.perf_counter() - t_start
    prof = summarize(
        records,
        tspec,
        kernels=kernels,
        slot_kernel=slot_k,
        dedup_kernel=dedup_k,
        layers=layers,
        trace=tr,
        n_values=n_values,
        ceiling=ceiling,
        peak=peak,
        device=device,
        dtype=dtype,
        settings=cfg,
        threads=threads,
        clock=clock,
        pool_slots=slots,
        flush_bytes=flush,
        wall_s=wall,
        trace_label=trace_label,
        seed=seed,
        quick=quick,
        implementations=ran,
    )
    prof.extra["failed_kernels"] = failed
    prof.extra["peak_dtype"] = peak_dtype
    if probe is not None:
        prof.extra["ceiling_beside"] = ceiling_beside_summary(
            records, tspec, kernels, n_values, probe.bytes, peak
        )
    return BenchResult(profile=prof, records=records, ceiling=ceiling)


CEILING = "ceiling"  # the probe's name among the timed kernels of a pass


def ceiling_beside_summary(
    records: list[Record],
    spec: ModelSpec,
    kernels: list[str],
    n_values: list[int],
    probe_bytes: int,
    peak: float | None,
) -> dict[str, Any]:
    """Per n: the read ceiling measured beside the kernels (median and 10-90% of each recorded
    pass's median probe), and each kernel's roofline ratio against the ceiling of its own pass:
    sum of t / sum of max(bytes / ceiling of that pass, flops / peak), as the profile's
    ``roofline_ratio`` against the one ceiling measured before."""
    m, b = spec.top_k, spec.expert_bytes
    flops_per_slot = 6.0 * spec.hidden_size * spec.expert_intermediate
    rec = [r for r in records if r.source == "recorded" and CEILING in r.timed]
    ceil = np.array([probe_bytes / r.timed[CEILING].median for r in rec])  # bytes/s
    ns = np.array([r.n for r in rec])
    us = np.array([r.u for r in rec], dtype=float)
    out: dict[str, Any] = {"probe_bytes": int(probe_bytes), "gbps": [], "gbps_p10_p90": []}
    for n in n_values:
        c = ceil[ns == n]
        out["gbps"].append(float(np.median(c) / 1e9))
        out["gbps_p10_p90"].append([float(q / 1e9) for q in np.percentile(c, [10, 90])])
    ratios: dict[str, list[float]] = {}
    for k in kernels:
        t = np.array([r.timed[k].median for r in rec])
        req = ns * m * b if kernel_kind(k) == "per_slot" else us * b
        bound = np.maximum(req / ceil, ns * m * flops_per_slot / peak if peak else 0.0)
        ratios[k] = [float(t[ns == n].sum() / bound[ns == n].sum()) for n in n_values]
    out["roofline_ratio"] = ratios
    return out


def run_benchmark(
    spec: ModelSpec,
    *,
    trace: RoutingTrace | str | os.PathLike | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    quick: bool = False,
    seed: int = 0,
    progress: bool = True,
) -> BandwidthProfile:
    """The bandwidth profile of ``spec``'s expert operation on this machine (see module doc)."""
    return benchmark(
        spec, trace=trace, device=device, dtype=dtype, quick=quick, seed=seed, progress=progress
    ).profile


# ----------------------------------------------------------------------------------- summary


def _arrays(records: list[Record], source: str, kernel: str) -> dict[str, np.ndarray]:
    sel = [r for r in records if r.source == source]
    return {
        "n": np.array([r.n for r in sel]),
        "u": np.array([r.u for r in sel], dtype=float),
        "t": np.array([r.timed[kernel].median for r in sel]),
        "layer": np.array([-1 if r.layer is None else r.layer for r in sel]),
    }


def summarize(
    records: list[Record],
    spec: ModelSpec,
    *,
    kernels: list[str],
    slot_kernel: str,
    dedup_kernel: str,
    layers: list[int],
    trace: RoutingTrace,
    n_values: list[int],
    ceiling: Ceiling,
    peak: float | None,
    device: str,
    dtype: str,
    settings: Settings,
    threads: int | None,
    clock: str,
    pool_slots: int,
    flush_bytes: float,
    wall_s: float,
    trace_label: str,
    seed: int,
    quick: bool,
    implementations: dict[str, dict[str, Any]] | None = None,
) -> BandwidthProfile:
    """Fits, scores, bandwidths and op times from timed records (pure numpy).
    ``implementations``: what each kernel name ran (:meth:`specmoe.kernels.KernelImpl.to_dict`)."""
    m, b = spec.top_k, spec.expert_bytes
    flops_per_slot = 6.0 * spec.hidden_size * spec.expert_intermediate
    ceil_bps = ceiling.gbps * 1e9
    per_kernel: dict[str, dict[str, Any]] = {}
    for k in kernels:
        kind = kernel_kind(k)
        ch = _arrays(records, "chosen", k)
        rec = _arrays(records, "recorded", k)
        fit_sel = ch["n"] >= 2
        tf = F.fit_time(kind, ch["n"][fit_sel], ch["u"][fit_sel], ch["t"][fit_sel], m=m, b=b)
        eps_layers = []
        for li in layers:
            sel = (rec["layer"] == li) & (rec["n"] >= 2)
            if sel.any():
                eps_layers.append(
                    float(
                        np.median(
                            F.relative_errors(
                                tf, rec["n"][sel], rec["u"][sel], rec["t"][sel], m=m, b=b
                            )
                        )
                    )
                )
        req = rec["n"] * m * b if kind == "per_slot" else rec["u"] * b
        bound = np.maximum(req / ceil_bps, rec["n"] * m * flops_per_slot / peak if peak else 0)
        beta, iqr, roof, pred, meas = [], [], [], [], []
        for n in n_values:
            s = rec["n"] == n
            beta.append(float(req[s].sum() / rec["t"][s].sum()))
            q = np.percentile(req[s] / rec["t"][s], [25, 75])
            iqr.append([float(q[0]), float(q[1])])
            roof.append(float(rec["t"][s].sum() / bound[s].sum()))
        for li in layers:
            pl, ml = [], []
            for n in n_values:
                s = (rec["layer"] == li) & (rec["n"] == n)
                if not s.any():  # the layer's documents are all shorter than n
                    s = rec["n"] == n
                pl.append(float(np.mean(tf.predict(rec["n"][s], rec["u"][s], m, b))))
                ml.append(float(np.mean(rec["t"][s])))
            pred.append(pl)
            meas.append(ml)
        per_kernel[k] = {
            "kind": kind,
            "fit": tf,
            "epsilon": float(np.median(eps_layers)),
            "epsilon_by_layer": eps_layers,
            "beta": beta,
            "beta_iqr": iqr,
            "roofline": roof,
            "predicted": pred,
            "measured": meas,
            "chosen": ch,
            "recorded": rec,
        }
    ks, kd = per_kernel[slot_kernel], per_kernel[dedup_kernel]
    rec_s, rec_d = ks["recorded"], kd["recorded"]
    bw = F.bandwidths(n_values, rec_s["n"], rec_s["u"], rec_s["t"], rec_d["t"], m=m, b=b)
    saving = [
        float(rec_s["t"][rec_s["n"] == n].sum() - rec_d["t"][rec_d["n"] == n].sum())
        for n in n_values
    ]
    eps = {"per_slot": ks["epsilon"], "dedup": kd["epsilon"]}
    eps_raw = dict(eps)
    eps = {p: min(v, 0.999) for p, v in eps.items()}  # the profile format requires ε < 1
    fit_out = {
        p: dict(per_kernel[k]["fit"].coef)
        for p, k in (("per_slot", slot_kernel), ("dedup", dedup_kernel))
    }
    op_time = {
        p: {"predicted": per_kernel[k]["predicted"], "measured": per_kernel[k]["measured"]}
        for p, k in (("per_slot", slot_kernel), ("dedup", dedup_kernel))
    }
    # Predictions must be positive for the profile; a fit with a negative intercept can dip
    # below zero at small bytes: floor at the smallest measured time's tenth, and say so.
    floored = False
    for p in op_time:
        rows = op_time[p]["predicted"]
        lo = 0.1 * min(min(r) for r in op_time[p]["measured"])
        for r in rows:
            for i, v in enumerate(r):
                if not v > lo:
                    r[i] = lo
                    floored = True
    extra = {
        "kernels": {
            k: {
                "kind": v["kind"],
                "beta_gbps": [x / 1e9 for x in v["beta"]],
                "beta_iqr_gbps": [[q / 1e9 for q in qq] for qq in v["beta_iqr"]],
                "roofline_ratio": v["roofline"],
                "epsilon": v["epsilon"],
                "epsilon_by_layer": v["epsilon_by_layer"],
                "fit": {
                    **v["fit"].coef,
                    "rank": v["fit"].rank,
                    "rms_rel": v["fit"].rms_rel,
                    "reread_cost": v["fit"].reread_cost,
                },
                "chosen": [
                    [int(n), int(u), float(t)]
                    for n, u, t in zip(v["chosen"]["n"], v["chosen"]["u"], v["chosen"]["t"])
                ],
                "op_time_measured": v["measured"],
            }
            for k, v in per_kernel.items()
        },
        "roles": {"per_slot": slot_kernel, "dedup": dedup_kernel},
        "epsilon_raw": eps_raw,
        "predicted_floored": floored,
        "expert_bytes": b,
        "flops_per_slot": flops_per_slot,
        "llc_bytes": ceiling.llc_bytes,
        "llc_note": None
        if ceiling.llc_bytes is not None
        else f"last-level cache unknown; flushed as if it were {UNKNOWN_LLC_ASSUMED >> 20} MiB",
        "ceiling_iqr_gbps": list(ceiling.iqr_gbps),
        "ceiling_method": ceiling.method,
        "ceiling_buffer_bytes": ceiling.buffer_bytes,
        "threads": threads,
        "clock": clock,
        "pool_slots": pool_slots,
        "flush_bytes": flush_bytes,
        "wall_s": wall_s,
        "settings": settings.__dict__,
        "saving_s": saving,
        "quick": quick,
    }
    reread = ks["fit"].reread_cost
    return BandwidthProfile(
        model=spec.to_dict(),
        device=device,
        dtype=dtype,
        ceiling_gbps=ceiling.gbps,
        n=n_values,
        beta_slot=[x / 1e9 for x in bw["beta_slot"]],
        beta_dedup=[x / 1e9 for x in bw["beta_dedup"]],
        r=bw["r"],
        u_bar=bw["u_bar"],
        reread_cost=None if reread is None or not math.isfinite(reread) else reread,
        epsilon=eps,
        crossover=F.crossover(n_values, saving),
        fits=fit_out,
        op_time=op_time,
        layers=[trace.layers[i] for i in layers],
        device_name=device_name(device),
        peak_gflops=None if peak is None else peak / 1e9,
        implementations=dict(implementations or {}),
        source={
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "trace": trace_label,
            "seed": seed,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "torch": torch.__version__,
        },
        extra=extra,
    )
