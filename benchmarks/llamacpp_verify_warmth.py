"""What a verify pass costs depending on what ran just before it, in llama.cpp (one thread,
thread-CPU clock, :class:`specmoe.engines.llamacpp_pass.LlamaCppEngine`).

:func:`specmoe.engine.measure.verify_passes` (the verify sweeps of both campaigns) prefills a
prompt but its last token, computes the greedy continuation with one-token passes, crops, and
times passes of n tokens on [last prompt token, continuation...]: every timed token was just
computed, so its experts and the cache rows it reads were just read. The whole-pass benchmark
(:func:`specmoe.engines.llamacpp_ops.time_llamacpp_operations`) times a window of the text that
no recent pass computed, after a pass of other tokens. A pass in speculative decoding carries
draft tokens the target has not computed. Three ways of timing the same pass sizes, on the
same prompts, after the same fresh prefill of ``depth - 1`` tokens, in alternating order:

* ``greedy``: the verify sweep's windows (after its greedy continuation);
* ``text``: the prompt's own next tokens, right after the prefill;
* ``text_later``: a window of the text 40-140 tokens further on, on a cache kept from the last
  prefill (not computed since).

Prints one JSON record: per mode, per n, the median and 10th/90th percentiles over
repetitions, and each mode's median over the ``greedy`` one paired by repetition.

    python benchmarks/llamacpp_verify_warmth.py --gguf MODEL.gguf [--depth 512] [--reps 12]
        [--out FILE]
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

MODES = ("greedy", "text", "text_later")
NS = tuple(range(1, 10))


def measure(eng, docs, depth: int, reps: int) -> dict[str, np.ndarray]:
    """[reps, n] times (ms) of each mode (module docstring)."""
    from specmoe.engine.speculative import crop_cache, new_cache

    ctx = depth - 1
    out: dict[str, list] = {m: [] for m in MODES}
    kv = new_cache(eng.model)
    for r in range(reps):
        tokens = [int(x) for x in docs[r % len(docs)][1]]
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            if mode != "text_later" or kv.get_seq_length() < ctx:
                crop_cache(kv, 0)
                eng.prefill(kv, tokens[:ctx])
            crop_cache(kv, ctx)
            if mode == "greedy":
                cont, cur = [], tokens[ctx]
                for _ in range(max(NS) - 1):
                    cur = eng.forward(kv, [cur]).tokens[0]
                    cont.append(cur)
                crop_cache(kv, ctx)
                wins = [[tokens[ctx], *cont[: n - 1]] for n in NS]
            else:
                s = ctx if mode == "text" else ctx + 40 + (r * 13) % 100
                wins = [tokens[s : s + n] for n in NS]
            row = []
            for w in wins:
                row.append(eng.forward(kv, w).t_ms)
                crop_cache(kv, ctx)
            out[mode].append(row)
    return {m: np.asarray(v, float) for m, v in out.items()}


def summarize(times: dict[str, np.ndarray]) -> dict[str, dict]:
    """Per mode: median, p10, p90 per n; and the median of (mode / greedy) paired by repetition."""
    g = times["greedy"]
    return {
        m: {
            "n": list(NS),
            "median_ms": np.median(t, axis=0).tolist(),
            "p10_ms": np.percentile(t, 10, axis=0).tolist(),
            "p90_ms": np.percentile(t, 90, axis=0).tolist(),
            "over_greedy": np.median(t / g, axis=0).tolist(),
        }
        for m, t in times.items()
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_pass_args(ap, "repetitions of each mode (default 12)")
    args = ap.parse_args(argv)
    check_pass_args(ap, args)
    llamacpp.require_built()
    from specmoe.engine.models import load_tokenizer
    from specmoe.engine.runner import validation_prompts
    from specmoe.engines.llamacpp_pass import LlamaCppEngine

    docs = validation_prompts(load_tokenizer("bundled"), count=12, context=args.depth + 256)
    load0, t0 = os.getloadavg(), time.time()
    with LlamaCppEngine(args.gguf, n_ctx=args.depth + 512, threads=1, clock="cpu") as eng:
        times = measure(eng, docs, args.depth, args.reps)
    record = {
        **pass_fields("llamacpp_verify_warmth", args),
        "context_len": args.depth - 1,
        "reps": args.reps,
        "modes": summarize(times),
        "samples_ms": {m: t.tolist() for m, t in times.items()},
        **run_fields(load0, t0),
    }
    emit(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
