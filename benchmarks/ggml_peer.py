"""ggml's CPU MUL_MAT_ID at a model's shapes: its time against the union of experts.

Times llama.cpp's expert FFN graph and each ``MUL_MAT_ID`` alone
(:func:`specmoe.engines.ggml_mmid.time_mul_mat_id`) at the shapes of ``--model`` (default
OLMoE-1B-7B-0125: d = 2048, m = 1024, E = 64, top-8), and prints one JSON record:

* ``recorded``: n = 1..9 on windows of the bundled fit trace (recorded routing of the bundled
  model, same E and top-k), for each weight type and thread count, weights read from memory
  (a rotating pool), a read ceiling timed in the same rotation;
* ``union_fixed``: n = 1..9 with every token on the same U experts (U = top-k): time against
  the number of (token, slot) pairs with the bytes fixed;
* ``n_fixed``: n = 9 with U = top-k .. E distinct experts (chosen ids): time against bytes with
  the (token, slot) pairs fixed;
* ``warm``: the recorded windows without the pool, the weights warm in cache after the first
  call, as ``test-backend-ops perf`` times the op.

    python benchmarks/ggml_peer.py [--types f32,bf16,q8_0] [--threads 1,2] [--windows 3]
        [--reps 5] [--parts recorded,union_fixed,n_fixed,warm] [--out FILE]

One thread uses the thread-CPU clock (``--clock cpu``, the default), more threads the wall
clock. The machine's load average is recorded before and after each part.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # its sibling modules, when loaded from a file
    sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from _record import emit  # noqa: E402

from specmoe.bench.passes import chosen_pass, recorded_windows  # noqa: E402
from specmoe.engines import ggml_mmid  # noqa: E402
from specmoe.spec import resolve_spec  # noqa: E402

PARTS = ("recorded", "union_fixed", "n_fixed", "warm")


def _summary(res: dict) -> dict:
    """The figures of one timing: per op the summed median time and bytes, GB/s; the ceiling's
    median and 10-90%."""
    out = {
        "u": res["u"],
        "loadavg_before": res["loadavg_before"],
        "loadavg_after": res["loadavg_after"],
    }
    for op, v in res["ops"].items():
        allt = [t for row in v["times_s"] for t in row]
        out[op] = {
            "ms": 1e3 * v["sum_median_s"] / len(v["median_s"]),
            "ms_p10_p90": [1e3 * float(q) for q in np.percentile(allt, [10, 90])],
            "mb": v["sum_bytes"] / len(v["bytes"]) / 1e6,
            "gbps": v["sum_bytes"] / v["sum_median_s"] / 1e9,
        }
    if "ceiling" in res:
        g = res["ceiling"]["gbps"]
        out["ceiling_gbps"] = float(np.median(g))
        out["ceiling_gbps_p10_p90"] = [float(q) for q in np.percentile(g, [10, 90])]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="OLMoE-1B-7B-0125")
    ap.add_argument("--types", default="f32,bf16,q8_0")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--clock", default="cpu", choices=("wall", "cpu"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    spec = resolve_spec(a.model)
    E, d, m, k = spec.num_experts, spec.hidden_size, spec.expert_intermediate, spec.top_k
    from specmoe.bench.run import resolve_trace

    tr, _ = resolve_trace(None, spec)
    rng = np.random.default_rng(a.seed)
    parts = a.parts.split(",")
    record: dict = {"benchmark": "ggml_peer", "model": spec.name, "experts": E, "hidden": d,
                    "inter": m, "top_k": k, "trace": "bundled fit trace", "layer": a.layer,
                    "llama_cpp": ggml_mmid.llamacpp.VERSION, "runs": []}  # fmt: skip
    t0 = time.perf_counter()
    from specmoe.bench.machine import last_level_cache_bytes
    from specmoe.bench.passes import pool_size

    for wtype in a.types.split(","):
        b = ggml_mmid.weight_bytes(wtype, d, m)["ffn"]
        slots = pool_size(E, min(9 * k, E), b, 2 * (last_level_cache_bytes() or 0))
        pool = ggml_mmid.random_weights(wtype, slots, d, m, seed=a.seed)
        warm_pool = (pool[0][:E], pool[1][:E])
        for threads in [int(t) for t in a.threads.split(",")]:
            clock = a.clock if threads == 1 else "wall"
            base = {"wtype": wtype, "threads": threads, "clock": clock}
            jobs = []  # (part, n, ids, ops, flush)
            for part in parts:
                for n in range(1, 10):
                    if part in ("recorded", "warm"):
                        ws = recorded_windows(
                            tr.experts, tr.doc_offsets, n, a.layer, a.windows, rng
                        )
                        ops = ("ffn", "gate", "up", "down") if part == "recorded" else ("gate",)
                        flush = "pool" if part == "recorded" else "none"
                        jobs.append((part, n, [w.ids for w in ws], ops, flush))
                    elif part == "union_fixed":
                        ids = [chosen_pass(n, k, E, k, rng) for _ in range(a.windows)]
                        jobs.append((part, n, ids, ("gate", "down"), "pool"))
                    elif part == "n_fixed" and n == 9:
                        for u in range(k, E + 1, k):
                            ids = [chosen_pass(9, k, E, u, rng) for _ in range(a.windows)]
                            jobs.append((part, 9, ids, ("gate", "down"), "pool"))
            for part, n, ids, ops, flush in jobs:
                res = ggml_mmid.time_mul_mat_id(
                    experts=E,
                    hidden=d,
                    inter=m,
                    top_k=k,
                    ids=ids,
                    wtype=wtype,
                    threads=threads,
                    ops=ops,
                    reps=a.reps,
                    warmup=1,
                    clock=clock,
                    flush=flush,
                    seed=a.seed,
                    pool=pool if flush == "pool" else warm_pool,
                )
                record["runs"].append({**base, "part": part, "n": n, **_summary(res)})
            print(
                f"{wtype} threads={threads} done ({time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
            )
        del pool, warm_pool
    record["wall_s"] = time.perf_counter() - t0
    emit(record, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
