"""Expert kernels against their roofline and against their peers, at a model's real shapes.

Runs the expert-operation benchmark (:func:`specmoe.bench.run.benchmark`) at the shapes of
``--model`` (default OLMoE-1B-7B-0125, fp32 on the CPU) for our kernels and their peers, and
prints one JSON record (stdout) with, for n = 1..9 on recorded windows:

* each kernel's effective bandwidth β(n) (per-slot on n·m·b, dedup on U·b) and its roofline
  ratio: time / max(bytes / measured read ceiling, flops / measured matmul peak);
* the targets: β_dedup(n) >= 0.95 β_slot(1) at n = 2..9, and every kernel within 1.1 of its
  roofline at every n, each with a yes/no and the worst value;
* the read ceiling measured beside the kernels (a short read of another buffer timed in the
  same rotation as the kernels of every recorded pass, ``specmoe.bench.machine.CeilingProbe``)
  per n with its 10-90% spread, and each kernel's roofline ratio against it
  (``roofline_ratio_beside``, the one the targets use; ``--no-ceiling-beside`` reverts to the
  ceiling measured once before); the load average before and after;
* the time ratio of each peer to ours of the same kind (per-slot: ``per_slot_torch`` and
  ``hf_batched_mm`` against ``per_slot``; dedup: ``dedup_torch``, ``grouped_mm``,
  ``hf_grouped_mm``, ``hf_eager`` against ``dedup``; ``ggml``, ggml's CPU MUL_MAT_ID through
  llama.cpp's expert FFN graph (:mod:`specmoe.engines.ggml_mmid`), against both), summed over
  the recorded windows of each n.

``ggml`` in ``--kernels`` needs the llama.cpp build (``make llama-cpp``); it runs float32 and
bfloat16 weights in place. ``--dtype q8_0`` times ggml alone (specmoe's q8_0 kernels are timed
beside bf16 and ggml by ``benchmarks/kernel_q8.py``): its FFN on the same recorded windows,
weights in ggml's q8_0 layout (34 bytes per 32 weights) from a rotating pool, with the read
ceiling timed in the same rotation, each n against max(U·b / ceiling, flops / the float32
matmul peak).

Recorded windows come from ``--trace`` or the bundled fit trace; without either, from a sticky
synthetic trace (each expert kept by the next token with probability ``--keep``, 0.363 = ρ(2)
of OLMoE in paper 002 Section 2), said in the record.

    python benchmarks/kernel_roofline.py [--model OLMoE-1B-7B-0125] [--quick] [--clock wall|cpu]
        [--threads K] [--kernels per_slot,dedup,...,ggml] [--dtype float32|bfloat16|q8_0]
        [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specmoe.bench.machine import huge_pages
from specmoe.bench.run import Settings, benchmark
from specmoe.spec import resolve_spec

PEERS = {
    "per_slot": ["per_slot_torch", "hf_batched_mm", "ggml"],
    "dedup": ["dedup_torch", "grouped_mm", "hf_grouped_mm", "hf_eager", "ggml"],
}


def _c_build() -> dict:
    """The C kernels' build: its flags and source hash (the Zen 4 and Zen 5 sets differ)."""
    from specmoe.kernels.cpu import c_status

    st = c_status()
    return {k: st.get(k) for k in ("status", "flags", "source_sha256")}


def _loadavg() -> list[str] | None:
    p = Path("/proc/loadavg")
    return p.read_text().split()[:3] if p.exists() else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="OLMoE-1B-7B-0125")
    ap.add_argument("--trace", default=None)
    ap.add_argument("--keep", type=float, default=0.363)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--kernels", default="per_slot,dedup,per_slot_torch,dedup_torch,grouped_mm")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--clock", default="wall", choices=("wall", "cpu"))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--windows", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="also write profile.json here")
    ap.add_argument(
        "--no-ceiling-beside",
        action="store_true",
        help="measure the read ceiling once before the kernels only",
    )
    a = ap.parse_args(argv)

    spec = resolve_spec(a.model)
    kernels = a.kernels.split(",")
    if a.dtype == "q8_0":
        if kernels != ["ggml"]:
            print(
                "kernel_roofline.py: --dtype q8_0: only --kernels ggml has a q8_0 path "
                "(specmoe's q8_0 kernels: benchmarks/kernel_q8.py)",
                file=sys.stderr,
            )
            return 2
        print(json.dumps(_ggml_q8(a, spec), indent=1))
        return 0
    if "ggml" in kernels:
        from specmoe.kernels.peers import register_ggml

        register_ggml()
    trace = a.trace
    trace_note = a.trace
    if trace is None:
        from specmoe.data.corpus import bundled_trace_path

        p = bundled_trace_path("fit")
        if p.exists():
            trace, trace_note = str(p), "bundled fit trace"
        else:
            from specmoe.routing.synth import sticky_trace

            trace = sticky_trace(spec.num_experts, spec.top_k, max(a.layers, 1), a.keep)
            trace_note = trace.name
    load_before = _loadavg()
    settings = Settings.for_run(
        quick=a.quick, device=a.device, max_layers=a.layers, windows=a.windows, reps=a.reps
    )
    res = benchmark(
        spec,
        trace=trace,
        device=a.device,
        dtype=a.dtype,
        quick=a.quick,
        seed=a.seed,
        progress=True,
        kernels=kernels,
        threads=a.threads,
        clock=a.clock,
        settings=settings,
        ceiling_beside=not a.no_ceiling_beside,
    )
    p = res.profile
    impls = p.extra.get("implementations", {})
    if "ggml" in impls:  # a peer that is not transformers' code
        impls["ggml"] = {**impls["ggml"], "requested": "ggml", "ran": "ggml"}
    beside = p.extra.get("ceiling_beside")
    ek = p.extra["kernels"]
    roles = p.extra["roles"]
    b1 = p.beta_slot[0]
    dedup_vs = [d / b1 for d in p.beta_dedup]
    roof_once = {k: v["roofline_ratio"] for k, v in ek.items()}
    roof = beside["roofline_ratio"] if beside else roof_once
    peers = {}
    rec = [r for r in res.records if r.source == "recorded"]
    for kind, names in PEERS.items():
        ours = roles[kind]
        for peer in names:
            if peer not in ek:
                continue
            peers[f"{peer}/{ours}"] = [
                float(
                    sum(r.timed[peer].median for r in rec if r.n == n)
                    / sum(r.timed[ours].median for r in rec if r.n == n)
                )
                for n in p.n
            ]
    record = {
        "benchmark": "kernel_roofline",
        "model": p.model_name,
        "device": p.device,
        "device_name": p.device_name,
        "dtype": p.dtype,
        "clock": p.extra["clock"],
        "threads": p.extra["threads"],
        "trace": trace_note,
        "quick": a.quick,
        "ceiling_gbps": p.ceiling_gbps,
        "peak_gflops": p.peak_gflops,
        "peak_dtype": p.extra.get("peak_dtype"),
        "n": p.n,
        "beta_gbps": {k: v["beta_gbps"] for k, v in ek.items()},
        "r": p.r,
        "u_bar": p.u_bar,
        "reread_cost": p.reread_cost,
        "epsilon": p.epsilon,
        "crossover": p.crossover,
        "ceiling_beside_gbps": beside["gbps"] if beside else None,
        "ceiling_beside_p10_p90_gbps": beside["gbps_p10_p90"] if beside else None,
        "roofline_ratio_once": roof_once,
        "roofline_ratio_beside": beside["roofline_ratio"] if beside else None,
        "roofline_ratio": roof,
        "target_dedup_vs_slot1": {
            "ratio": dedup_vs[1:],
            "worst": min(dedup_vs[1:]),
            "met": bool(min(dedup_vs[1:]) >= 0.95),
        },
        "target_roofline": {
            k: {"worst": max(v), "met": bool(max(v) <= 1.1)} for k, v in roof.items()
        },
        "peer_time_ratio": peers,
        "failed_kernels": p.extra.get("failed_kernels", {}),
        "wall_s": p.extra["wall_s"],
        "loadavg": _loadavg(),
        "loadavg_before": load_before,
        "huge_pages": huge_pages(),
        "c_kernels": _c_build(),
    }
    if a.out:
        p.save(Path(a.out) / "profile.json")
    print(json.dumps(record, indent=1))
    return 0


def _ggml_q8(a: argparse.Namespace, spec) -> dict:
    """ggml's FFN in q8_0 on the recorded windows the benchmark draws (same layers, windows per
    n, seed), against the read ceiling timed beside it; see the module docstring."""
    import numpy as np
    import torch

    from specmoe.bench.machine import measure_peak_flops
    from specmoe.bench.passes import recorded_windows
    from specmoe.bench.run import _select_layers, resolve_trace
    from specmoe.engines import ggml_mmid

    settings = Settings.for_run(
        quick=a.quick, device="cpu", max_layers=a.layers, windows=a.windows, reps=a.reps
    )
    tr, label = resolve_trace(a.trace, spec)
    threads = a.threads or 1
    clock = a.clock
    if clock == "cpu" and threads != 1:
        raise SystemExit("kernel_roofline.py: --clock cpu: one thread only")
    E, d, m, k = spec.num_experts, spec.hidden_size, spec.expert_intermediate, spec.top_k
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    peak = measure_peak_flops("cpu", torch.float32, clock=clock)
    torch.set_num_threads(prev)
    rng = np.random.default_rng(a.seed)
    load_before = _loadavg()
    layers = _select_layers(tr.num_layers, settings.max_layers)
    pool = None
    per_n = []
    for n in range(1, settings.n_max + 1):
        t = b = roof = 0.0
        ceil = []
        for li in layers:
            ws = recorded_windows(tr.experts, tr.doc_offsets, n, li, settings.windows, rng)
            res = ggml_mmid.time_mul_mat_id(
                experts=E,
                hidden=d,
                inter=m,
                top_k=k,
                ids=[w.ids for w in ws],
                wtype="q8_0",
                threads=threads,
                ops=("ffn",),
                reps=settings.reps,
                warmup=settings.warmup,
                clock=clock,
                seed=a.seed,
                pool=pool,
            )
            if pool is None:  # one pool for every call (made for u up to n·k of the first)
                from specmoe.bench.machine import last_level_cache_bytes
                from specmoe.bench.passes import pool_size

                eb = res["expert_bytes"]["ffn"]
                slots = pool_size(
                    E, min(settings.n_max * k, E), eb, 2 * (last_level_cache_bytes() or 0)
                )
                pool = ggml_mmid.random_weights("q8_0", slots, d, m, seed=a.seed)
            v = res["ops"]["ffn"]
            for tt, bb, g, ids in zip(v["median_s"], v["bytes"], res["ceiling"]["gbps"], ws):
                flops = 2 * ids.ids.size * 3 * d * m
                t, b = t + tt, b + bb
                roof += max(bb / (g * 1e9), flops / peak)
                ceil.append(g)
        per_n.append(
            {
                "n": n,
                "time_s": t,
                "bytes": b,
                "beta_gbps": b / t / 1e9,
                "roofline_ratio": t / roof,
                "ceiling_gbps": float(np.median(ceil)),
                "ceiling_p10_p90_gbps": [float(q) for q in np.percentile(ceil, [10, 90])],
            }
        )
    return {
        "benchmark": "kernel_roofline",
        "model": spec.name,
        "dtype": "q8_0",
        "kernels": ["ggml"],
        "note": "ggml alone; specmoe's q8_0 per_slot and dedup: benchmarks/kernel_q8.py",
        "clock": clock,
        "threads": threads,
        "trace": label,
        "layers": layers,
        "windows": settings.windows,
        "reps": settings.reps,
        "peak_gflops_fp32": peak / 1e9,
        "bytes_per_weight": 34 / 32,
        "ggml": per_n,
        "target_roofline": {
            "worst": max(r["roofline_ratio"] for r in per_n),
            "met": bool(max(r["roofline_ratio"] for r in per_n) <= 1.1),
        },
        "loadavg_before": load_before,
        "loadavg": _loadavg(),
        "huge_pages": huge_pages(),
    }


if __name__ == "__main__":
    sys.exit(main())
