"""specmoe's C expert kernels on q8_0 weights against bf16, the read ceiling and ggml's q8_0.

At the shapes of ``--model`` (default OLMoE-1B-7B-0125: h 2048, I 1024, N 64, m 8), on
recorded windows of the bundled fit trace (``--layers`` layers, ``--windows`` windows per
layer and n), for n in ``--n`` on ``--threads`` threads, one JSON record (stdout, and
``--out``) with, per n and kernel (``per_slot`` and ``dedup``, each in q8_0 with fp32
activations, the default, in q8_0 with int16 activation blocks, ``q8_0_i16``
(:func:`specmoe.kernels.cpu.set_q8_activations`), and in bf16):

* the time of a pass (the mean over windows of the median over ``--reps``), the bytes it
  requests (per-slot n·m·b, dedup U·b; b = 3·h·I · 1.0625 bytes in q8_0, · 2 in bf16) and the
  bandwidth β = bytes / time;
* the read ceiling measured beside it: a 32 MiB read of another buffer
  (:class:`specmoe.bench.machine.CeilingProbe`) timed just before every kernel call, in one
  rotation with the other kernels (their order reversed every other repetition), its median
  and 10-90% spread over the calls of that kernel at that n;
* the roofline ratio time / max(bytes / ceiling beside, flops / fp32 matmul peak), flops
  2·n·m·3·h·I for both kinds (every slot's products are computed);
* q8_0 against bf16: the time ratios bf16 / q8_0 and bf16 / q8_0_i16 (> 1: q8_0 is faster);
* ggml's CPU MUL_MAT_ID FFN in q8_0 (:func:`specmoe.engines.ggml_mmid.time_mul_mat_id`, its
  own weight pool and its own ceiling in its rotation) on the same windows, where llama.cpp
  is built (``--no-ggml`` skips it).

Every call's experts are relabelled onto fresh slots of a pool at least twice the last-level
cache (:class:`specmoe.bench.passes.Rotation`), so the weights come from memory. The load
average before and after is recorded.

    python benchmarks/kernel_q8.py [--model OLMoE-1B-7B-0125] [--n 1,2,4,8] [--threads 1]
        [--clock cpu|wall] [--layers 2] [--windows 4] [--reps 7] [--no-ggml] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # its sibling modules, when loaded from a file
    sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _record import emit  # noqa: E402

from specmoe.commands.efficiency import parse_ints  # noqa: E402
from specmoe.errors import InputError  # noqa: E402


def _loadavg() -> list[str] | None:
    p = Path("/proc/loadavg")
    return p.read_text().split()[:3] if p.exists() else None


def _pools(slots_q8: int, slots_bf16: int, h: int, inter: int, seed: int):
    """Weight pools: bf16 tensors and q8_0 ones (quantised from the same kind of random
    weights, expert by expert: no float32 copy of a whole pool)."""
    from specmoe.kernels.q8 import Q8Weights, quantize_q8_0, row_bytes

    g = torch.Generator().manual_seed(seed)
    qgu = torch.empty(slots_q8, 2 * inter, row_bytes(h), dtype=torch.uint8)
    qd = torch.empty(slots_q8, h, row_bytes(inter), dtype=torch.uint8)
    bgu = torch.empty(slots_bf16, 2 * inter, h, dtype=torch.bfloat16)
    bd = torch.empty(slots_bf16, h, inter, dtype=torch.bfloat16)
    for e in range(max(slots_q8, slots_bf16)):
        wgu = torch.randn(1, 2 * inter, h, generator=g) / h**0.5
        wd = torch.randn(1, h, inter, generator=g) / inter**0.5
        if e < slots_q8:
            qgu[e] = quantize_q8_0(wgu).blocks[0]
            qd[e] = quantize_q8_0(wd).blocks[0]
        if e < slots_bf16:
            bgu[e], bd[e] = wgu[0].bfloat16(), wd[0].bfloat16()
    return (Q8Weights(qgu, h), Q8Weights(qd, inter)), (bgu, bd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="OLMoE-1B-7B-0125")
    ap.add_argument("--n", default="1,2,4,8")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", default="cpu", choices=("cpu", "wall"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-ggml", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    try:
        ns = parse_ints(a.n, "--n", low=1)
    except InputError:
        print(f"kernel_q8.py: --n: need positive integers, got {a.n!r}", file=sys.stderr)
        return 2
    if a.threads < 1 or (a.clock == "cpu" and a.threads != 1):
        print("kernel_q8.py: --threads: positive; --clock cpu needs one thread", file=sys.stderr)
        return 2
    try:
        record = run(a, ns)
    except InputError as exc:
        print(f"kernel_q8.py: {exc}", file=sys.stderr)
        return 2
    emit(record, a.out)
    return 0


def run(a: argparse.Namespace, ns: list[int]) -> dict:
    from specmoe.bench.machine import CeilingProbe, last_level_cache_bytes, measure_peak_flops
    from specmoe.bench.passes import Rotation, pool_size, recorded_windows
    from specmoe.bench.run import _select_layers, resolve_trace
    from specmoe.kernels import cpu
    from specmoe.kernels.q8 import BYTES_PER_WEIGHT
    from specmoe.spec import resolve_spec

    spec = resolve_spec(a.model)
    num, h, inter, m = spec.num_experts, spec.hidden_size, spec.expert_intermediate, spec.top_k
    clock = time.thread_time if a.clock == "cpu" else time.perf_counter
    torch.set_num_threads(a.threads)
    cpu.set_num_threads(a.threads)
    load_before = _loadavg()
    t0 = time.perf_counter()
    peak = measure_peak_flops("cpu", torch.float32, clock=a.clock)
    llc = last_level_cache_bytes() or (256 << 20)
    weights = 3 * h * inter
    eb = {"q8_0": weights * BYTES_PER_WEIGHT, "bf16": weights * 2.0}  # bytes of one expert
    u_max = min(max(ns) * m, num)
    slots = {k: pool_size(num, u_max, v, 2 * llc) for k, v in eb.items()}
    pools = dict(zip(("q8_0", "bf16"), _pools(slots["q8_0"], slots["bf16"], h, inter, a.seed)))
    probe = CeilingProbe("cpu", threads=a.threads)
    tr, trace_label = resolve_trace(None, spec)
    if Path(trace_label).is_absolute():  # the bundled trace: named inside the package
        trace_label = "specmoe/data/traces/" + Path(trace_label).name
    layers = _select_layers(tr.num_layers, a.layers)
    rng = np.random.default_rng(a.seed)
    windows = {
        n: [
            w
            for li in layers
            for w in recorded_windows(tr.experts, tr.doc_offsets, n, li, a.windows, rng)
        ]
        for n in ns
    }
    kernels = [(k, t) for k in ("per_slot", "dedup") for t in ("q8_0", "q8_0_i16", "bf16")]
    rot = {t: Rotation(slots[t]) for t in eb}  # one rotation per pool: q8_0_i16 shares q8_0's
    impl = {
        t: cpu.implementation_of("dedup", dtype="q8_0" if t == "q8_0" else torch.bfloat16).to_dict()
        for t in eb
    }

    def call(kernel, t, ids_np, x, w):
        pool = "bf16" if t == "bf16" else "q8_0"
        ids = torch.from_numpy(rot[pool](ids_np))
        wgu, wd = pools[pool]
        fn = cpu.per_slot if kernel == "per_slot" else cpu.dedup
        xt = x.bfloat16() if t == "bf16" else x
        cpu.set_q8_activations("int16" if t == "q8_0_i16" else "float32")
        s = clock()
        fn(xt, wgu, wd, ids, w)
        return clock() - s

    per_n = []
    for n in ns:
        ws = windows[n]
        g = torch.Generator().manual_seed(a.seed + n)
        xs = [torch.randn(n, h, generator=g) for _ in ws]
        rw = [torch.rand(n, m, generator=g) for _ in ws]
        for (k, t), (i, win) in zip(kernels, enumerate(ws * len(kernels))):  # warm-up
            call(k, t, win.ids, xs[i % len(ws)], rw[i % len(ws)])
        times = {kt: [[] for _ in ws] for kt in kernels}
        ceil = {kt: [] for kt in kernels}
        for r in range(a.reps):
            order = kernels if r % 2 == 0 else kernels[::-1]
            for i, win in enumerate(ws):
                for kt in order:
                    s = clock()
                    probe()
                    ceil[kt].append(probe.gbps(clock() - s))
                    times[kt][i].append(call(*kt, win.ids, xs[i], rw[i]))
        rec = {
            "n": n,
            "windows": len(ws),
            "u_mean": float(np.mean([np.unique(w.ids).size for w in ws])),
        }
        for kt in kernels:
            k, t = kt
            tm = [statistics.median(v) for v in times[kt]]
            b = eb["bf16" if t == "bf16" else "q8_0"]
            if k == "per_slot":
                bts = [n * m * b for _ in ws]
            else:
                bts = [np.unique(w.ids).size * b for w in ws]
            flops = 2 * n * m * weights
            c = statistics.median(ceil[kt])
            roof = sum(max(b / (c * 1e9), flops / peak) for b in bts)
            rec[f"{k}/{t}"] = {
                "time_ms": 1e3 * float(np.mean(tm)),
                "bytes_mb": float(np.mean(bts)) / 1e6,
                "beta_gbps": float(sum(bts) / sum(tm) / 1e9),
                "ceiling_beside_gbps": c,
                "ceiling_p10_p90_gbps": [float(q) for q in np.percentile(ceil[kt], [10, 90])],
                "roofline_ratio": float(sum(tm) / roof),
                "roofline_bound": "bytes" if max(bts) / (c * 1e9) >= flops / peak else "flops",
            }
        for k in ("per_slot", "dedup"):
            rec[f"{k}/bf16_over_q8_0_time"] = (
                rec[f"{k}/bf16"]["time_ms"] / rec[f"{k}/q8_0"]["time_ms"]
            )
        per_n.append(rec)
        cpu.set_q8_activations("float32")
        print(f"kernel_q8: n={n} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)

    ggml = None
    if not a.no_ggml:
        ggml = _ggml(a, spec, windows, ns, peak)
    return {
        "benchmark": "kernel_q8",
        "model": spec.name,
        "shapes": {"h": h, "I": inter, "N": num, "m": m},
        "threads": a.threads,
        "clock": a.clock,
        "trace": trace_label,
        "layers": layers,
        "reps": a.reps,
        "bytes_per_weight": {"q8_0": BYTES_PER_WEIGHT, "bf16": 2.0},
        "expert_mb": {k: v / 1e6 for k, v in eb.items()},
        "pool_slots": slots,
        "peak_gflops_fp32": peak / 1e9,
        "q8_0_path": "C: weights dequantised on the fly to fp32 (AVX2 vpmovsxbd, vcvtdq2ps, "
        "block sums scaled by d for 1-2 tokens, else one multiply by d; FMA against fp32 "
        "activations)",
        "q8_0_i16_path": "C: x and the intermediate activation in int16 blocks of 32 with a "
        "scale each; vpmovsxbw, vpmaddwd, one conversion and one FMA by d*s per block",
        "implementations": impl,
        "compiler": cpu.c_status(),
        "per_n": per_n,
        "ggml_q8_0": ggml,
        "wall_s": time.perf_counter() - t0,
        "loadavg_before": load_before,
        "loadavg": _loadavg(),
    }


def _ggml(a, spec, windows, ns, peak) -> dict | None:
    """ggml's FFN in q8_0 on the same windows, or None (with the reason) without llama.cpp."""
    from specmoe.engines import ggml_mmid, llamacpp

    if not llamacpp.is_built():
        return {"skipped": f"llama.cpp {llamacpp.VERSION} is not built (make llama-cpp)"}
    num, h, inter, m = spec.num_experts, spec.hidden_size, spec.expert_intermediate, spec.top_k
    from specmoe.bench.machine import last_level_cache_bytes
    from specmoe.bench.passes import pool_size

    eb = ggml_mmid.weight_bytes("q8_0", h, inter)["ffn"]
    llc = last_level_cache_bytes() or (256 << 20)
    slots = pool_size(num, min(max(ns) * m, num), eb, 2 * llc)
    pool = ggml_mmid.random_weights("q8_0", slots, h, inter, seed=a.seed)
    out = []
    for n in ns:
        ws = windows[n]
        res = ggml_mmid.time_mul_mat_id(
            experts=num,
            hidden=h,
            inter=inter,
            top_k=m,
            ids=[w.ids for w in ws],
            wtype="q8_0",
            threads=a.threads,
            ops=("ffn",),
            reps=a.reps,
            warmup=1,
            clock=a.clock,
            seed=a.seed,
            pool=pool,
        )
        v = res["ops"]["ffn"]
        g = res["ceiling"]["gbps"]
        flops = 2 * n * m * 3 * h * inter
        roof = sum(max(b / (c * 1e9), flops / peak) for b, c in zip(v["bytes"], g))
        out.append(
            {
                "n": n,
                "time_ms": 1e3 * float(np.mean(v["median_s"])),
                "bytes_mb": float(np.mean(v["bytes"])) / 1e6,
                "beta_gbps": float(sum(v["bytes"]) / sum(v["median_s"]) / 1e9),
                "ceiling_beside_gbps": float(np.median(g)),
                "roofline_ratio": float(sum(v["median_s"]) / roof),
            }
        )
    return {
        "per_n": out,
        "pool_slots": slots,
        "note": "ggml's MUL_MAT_ID expert FFN (gate, up, swiglu, down, sum): q8_0 weights "
        "against activations quantised to q8_0 (its vec_dot type)",
    }


if __name__ == "__main__":
    sys.exit(main())
