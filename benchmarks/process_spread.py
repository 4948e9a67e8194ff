"""How far one fresh process's timing of a matrix product is from another's, with and without
an environment setting (transparent huge pages for PyTorch's large buffers, by default).

The whole-pass benchmark's processes read the same pass 7-29% apart on one machine
(``results/cpu/whole-pass``, rounds 4-5 and ``bench-spread/``), where the repetitions inside a
process spread a few per cent. This times the largest operation of that pass alone (the
lm_head's one-thread float32 ``linear``, Qwen3-30B-A3B's 151,936 x 2048 by default) in fresh
processes, variants alternated process by process, each process's median over its
repetitions on the thread CPU clock, and reports every variant's spread over its processes.
The child also reports how much of its memory sits on huge pages (``AnonHugePages``).

    python benchmarks/process_spread.py --processes 8 --n 1,2,5 \\
        --variants "base=,thp=THP_MEM_ALLOC_ENABLE=1" > spread.json

Prints JSON: per variant, per n, every process's median (ms) and the range over the median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
rows, cols, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ns = [int(v) for v in sys.argv[4].split(",")]
w = torch.empty(rows, cols).uniform_(-0.02, 0.02)
out = {}
for n in ns:
    x = torch.empty(n, cols).uniform_(-1, 1)
    torch.nn.functional.linear(x, w)  # warm
    ts = []
    for _ in range(reps):
        t0 = time.thread_time()
        torch.nn.functional.linear(x, w)
        ts.append((time.thread_time() - t0) * 1e3)
    ts.sort()
    out[str(n)] = ts[len(ts) // 2]
huge = 0
try:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                huge = int(line.split()[1]) * 1024
except OSError:
    pass
print(json.dumps({"median_ms": out, "anon_huge_bytes": huge, "weight_bytes": rows * cols * 4}))
"""


def variants_of(spec: str) -> list[tuple[str, dict[str, str]]]:
    """``name=ENV=VALUE;ENV=VALUE,...`` as [(name, {ENV: VALUE})]; ValueError says what is
    wrong."""
    out = []
    for part in spec.split(","):
        name, _, env = part.partition("=")
        if not name:
            raise ValueError(f"empty name in {part!r}")
        if name in dict(out):
            raise ValueError(f"{name!r} twice")
        pairs = [kv for kv in env.split(";") if kv]
        if any("=" not in kv or not kv.split("=", 1)[0] for kv in pairs):
            raise ValueError(f"{part!r}: each setting is ENV=VALUE")
        out.append((name, dict(kv.split("=", 1) for kv in pairs)))
    return out


def summarize(runs: list[dict], ns: list[str]) -> dict:
    """Per n, every process's median, their median and their range over it."""
    per_n = {}
    for n in ns:
        v = [r["median_ms"][n] for r in runs]
        med = statistics.median(v)
        per_n[n] = {"median_ms": v, "median": med, "range_over_median": (max(v) - min(v)) / med}
    return per_n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=151936, help="the product's output rows")
    ap.add_argument("--cols", type=int, default=2048, help="its input width")
    ap.add_argument("--n", default="1,2,5", help="tokens a product, comma-separated")
    ap.add_argument("--reps", type=int, default=11, help="repetitions a process and n")
    ap.add_argument("--processes", type=int, default=8, help="fresh processes a variant")
    ap.add_argument(
        "--variants",
        default="base=,thp=THP_MEM_ALLOC_ENABLE=1",
        help="name=ENV=VALUE;ENV=VALUE,... (alternated process by process)",
    )
    args = ap.parse_args(argv)
    try:
        variants = variants_of(args.variants)
    except ValueError as exc:
        print(f"process_spread: --variants: {exc}", file=sys.stderr)
        return 2
    try:
        ns = [int(v) for v in args.n.split(",")]
    except ValueError:
        ns = [0]
    if min(ns) < 1:
        print(f"process_spread: --n: positive integers, comma-separated, got {args.n!r}",
              file=sys.stderr)  # fmt: skip
        return 2
    for flag, v in (("--processes", args.processes), ("--reps", args.reps), ("--rows", args.rows),
                    ("--cols", args.cols)):  # fmt: skip
        if v < 1:
            print(f"process_spread: {flag}: must be >= 1, got {v}", file=sys.stderr)
            return 2
    res: dict[str, list[dict]] = {name: [] for name, _ in variants}
    t0 = time.perf_counter()
    for i in range(args.processes):
        for name, env in variants if i % 2 == 0 else variants[::-1]:
            e = {**os.environ, "OMP_NUM_THREADS": "1", **env}
            for k in ("THP_MEM_ALLOC_ENABLE",):  # a variant without it runs without it
                if k not in env:
                    e.pop(k, None)
            p = subprocess.run(
                [sys.executable, "-c", CHILD, str(args.rows), str(args.cols), str(args.reps),
                 ",".join(str(n) for n in ns)],
                env=e, capture_output=True, text=True, check=True,
            )  # fmt: skip
            res[name].append(json.loads(p.stdout))
            print(f"{name} process {i + 1}: {res[name][-1]['median_ms']}", file=sys.stderr)
    summary = {}
    for name, runs in res.items():
        summary[name] = {
            "per_n": summarize(runs, [str(n) for n in ns]),
            "anon_huge_share": [r["anon_huge_bytes"] / r["weight_bytes"] for r in runs],
        }
    print(json.dumps({
        "shape": [args.rows, args.cols], "reps": args.reps, "processes": args.processes,
        "variants": dict(variants), "clock": "thread CPU", "threads": 1,
        "load_average": os.getloadavg(), "wall_s": time.perf_counter() - t0,
        "results": summary,
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
