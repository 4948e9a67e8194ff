"""The whole-pass benchmark's un-profiled passes against the verify sweep's, interleaved on one
llama.cpp engine (one thread, thread-CPU clock), so that both see the same machine.

A repetition runs, in alternating order, one cell of the benchmark at one depth
(:func:`specmoe.engines.llamacpp_ops.time_llamacpp_operations`, one repetition of every n, its
cache ``depth`` tokens) and the verify sweep of one prompt
(:func:`specmoe.engine.measure.verify_passes` on ``depth`` prompt tokens, its cache
``depth - 1``), each with ``--prime`` (a pass after an untimed one of its own size, llama.cpp's
graph reused) or without. A difference that stays when the two alternate within seconds is
the method's; one that appears only between a benchmark and runs made minutes apart is the
machine's.

Prints one JSON record: per n, the median of each side, and the median and 10th/90th
percentiles over repetitions of sweep / benchmark.

    python benchmarks/llamacpp_bench_vs_sweep.py --gguf MODEL.gguf [--depth 512] [--reps 12]
        [--prime] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # its sibling modules, when loaded from a file
    sys.path.insert(0, str(HERE))

from _record import add_pass_args, check_pass_args, emit, pass_fields, run_fields  # noqa: E402

from specmoe.engines import llamacpp  # noqa: E402

NS = tuple(range(1, 10))


def measure(eng, bench_tokens, docs, depth: int, reps: int, prime: bool) -> dict[str, np.ndarray]:
    """[reps, n] times (ms) of the benchmark's un-profiled passes and of the sweep's."""
    from specmoe.engine.measure import verify_passes
    from specmoe.engines.llamacpp_ops import time_llamacpp_operations

    out: dict[str, list] = {"benchmark": [], "sweep": []}
    for r in range(reps):
        for side in ("benchmark", "sweep") if r % 2 == 0 else ("sweep", "benchmark"):
            if side == "benchmark":
                rec, _ = time_llamacpp_operations(
                    eng, bench_tokens, n_values=NS, depths=[depth], reps=1, warmup=0,
                    progress=False, prime=prime,
                )  # fmt: skip
                out[side].append(rec.ms["fwd"][0, :, 0].tolist())
            else:
                pid, toks = docs[r % len(docs)]
                res = verify_passes(
                    eng, [(pid, toks[:depth])], settings=("dedup",), n_values=NS, repeats=1,
                    warmup=0, prime=prime,
                )  # fmt: skip
                row = [0.0] * len(NS)
                for x in res["records"]:
                    row[x["n"] - 1] = x["t_ms"]
                out[side].append(row)
    return {k: np.asarray(v, float) for k, v in out.items()}


def summarize(times: dict[str, np.ndarray]) -> dict:
    """Per n: each side's median and the sweep / benchmark ratio's median, p10 and p90 over
    repetitions (paired by repetition)."""
    ratio = times["sweep"] / times["benchmark"]
    return {
        "n": list(NS),
        "benchmark_ms": np.median(times["benchmark"], axis=0).tolist(),
        "sweep_ms": np.median(times["sweep"], axis=0).tolist(),
        "sweep_over_benchmark": {
            "median": np.median(ratio, axis=0).tolist(),
            "p10": np.percentile(ratio, 10, axis=0).tolist(),
            "p90": np.percentile(ratio, 90, axis=0).tolist(),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_pass_args(ap, "alternations (default 12)")
    ap.add_argument("--prime", action="store_true", help="both sides: passes after their size")
    args = ap.parse_args(argv)
    check_pass_args(ap, args)
    llamacpp.require_built()
    from specmoe.engine.models import load_tokenizer
    from specmoe.engine.runner import validation_prompts
    from specmoe.engines.llamacpp_pass import LlamaCppEngine

    tok = load_tokenizer("bundled")
    ((_, bench_tokens),) = validation_prompts(tok, count=1, context=args.depth + 256)
    docs = validation_prompts(tok, count=8, context=args.depth + 256)
    load0, t0 = os.getloadavg(), time.time()
    with LlamaCppEngine(args.gguf, n_ctx=args.depth + 512, threads=1, clock="cpu") as eng:
        times = measure(eng, bench_tokens, docs, args.depth, args.reps, args.prime)
    record = {
        **pass_fields("llamacpp_bench_vs_sweep", args),
        "prime": args.prime,
        "reps": args.reps,
        **summarize(times),
        "samples_ms": {k: v.tolist() for k, v in times.items()},
        **run_fields(load0, t0),
    }
    emit(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
