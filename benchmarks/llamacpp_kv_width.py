"""Does a llama.cpp verification pass cost what its KV cache holds, or what its padded KV view
reads? Settled passes of n tokens at cache lengths on both sides of the view's steps.

llama.cpp attends over the cells its KV view holds: the used cells after the batch is placed,
padded up to a multiple of 256 (``llama_kv_cache::get_n_kv``), masked or not. A pass of n
tokens on a cache of d tokens reads ``256 * ceil((d + n) / 256)`` cells: after 255 tokens one
token reads 256 cells, after 256 it reads 512. The whole-pass prediction's fit forms take
either the cache's length (``step1-depth``) or the view's width (``step1-width``) as the
attention's variable (:func:`specmoe.engines.llamacpp_ops.refit`). This times both sides of
each step, so the two can be told apart: if the time follows the width, the passes at d = 255
and 256 differ by as much as 256 and 511 do; if it follows the depth, they do not.

One libllama engine (:class:`specmoe.engines.llamacpp_pass.LlamaCppEngine`, one thread,
thread-CPU clock). A repetition visits every depth, in an order rotated from one repetition
to the next; at a depth it prefills a fresh cache with that many tokens of a validation document, then
for each n a train of ``--train`` passes of n tokens on the next windows of the text (cropped
back to the depth after each, so every pass follows one of its own size, as a generation's
rounds at one draft length do; the two-token train first: a one-token pass after a prefill
takes several passes to settle, after a two-token pass one: results/cpu/llamacpp/round-passes/).
The first ``--drop`` passes of a train are not counted. With ``--profile P``, each train is
followed by P passes with every graph node timed alone
(:meth:`~specmoe.engines.llamacpp_pass.LlamaCppEngine.profile`), summed by node name over the
layers (``kq-0``, ``kq-1``, ... as ``kq``): which of the pass's nodes steps where. Prints one
JSON record: per depth
and n, the median of each repetition's train median, with the 10th and 90th percentiles over
repetitions, the cells the view reads, and the load average before and after.

    python benchmarks/llamacpp_kv_width.py --gguf MODEL.gguf [--depths 255,256,...]
        [--ns 2,1] [--reps 8] [--train 12] [--drop 2] [--profile 0] [--n-ctx N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # its sibling modules, when loaded from a file
    sys.path.insert(0, str(HERE))

from _record import command_line  # noqa: E402

DEPTHS = "255,256,383,511,512,639,767,768,1023,1024,1535,2047,2048,2175,2303"
KV_PAD = 256


def view_cells(depth: int, n: int, pad: int = KV_PAD) -> int:
    """The cells a pass of ``n`` tokens on a cache of ``depth`` reads (llama.cpp's
    ``get_n_kv``: the used cells after the batch, padded up to ``pad``)."""
    return max(pad, -(-(depth + n) // pad) * pad)


def _text_tokens(count: int) -> list[int]:
    """``count`` tokens of the first validation document that long (the bundled corpus, the
    bundled tokenizer: llama.cpp tokenizes it identically), as the campaigns' prompts."""
    from specmoe.engine.models import load_tokenizer
    from specmoe.engine.runner import validation_prompts

    ((_, ids),) = validation_prompts(load_tokenizer("bundled"), count=1, context=count)
    return list(ids)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="the model's GGUF file")
    ap.add_argument("--depths", default=DEPTHS, help=f"cache lengths (default {DEPTHS})")
    ap.add_argument("--ns", default="2,1", help="batch sizes, in train order (default 2,1)")
    ap.add_argument("--reps", type=int, default=8, help="repetitions (default 8)")
    ap.add_argument("--train", type=int, default=12, help="passes a train (default 12)")
    ap.add_argument("--drop", type=int, default=2, help="a train's uncounted passes (2)")
    ap.add_argument(
        "--n-ctx",
        type=int,
        default=0,
        help="the context's size (default 0: the deepest cache and its trains, plus 256)",
    )
    ap.add_argument(
        "--profile", type=int, default=0, help="profiled passes after each train (default 0)"
    )
    ap.add_argument("--out", default=None, help="also write the record to this file")
    args = ap.parse_args(argv)
    try:
        depths = [int(x) for x in args.depths.split(",") if x.strip()]
        ns = [int(x) for x in args.ns.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--depths/--ns: not a list of integers: {args.depths!r}, {args.ns!r}")
    if not depths or min(depths) < 1 or not ns or min(ns) < 1:
        ap.error("--depths and --ns must hold positive integers")
    if args.n_ctx < 0:
        ap.error(f"--n-ctx: must be >= 0, got {args.n_ctx}")
    if args.profile < 0:
        ap.error(f"--profile: must be >= 0, got {args.profile}")
    if args.reps < 1 or args.train < 1 or not 0 <= args.drop < args.train:
        ap.error("--reps and --train must be >= 1 and --drop in [0, --train)")
    if not Path(args.gguf).is_file():
        ap.error(f"--gguf: {args.gguf}: no such file")
    from specmoe.engines.llamacpp_pass import LlamaCppEngine

    need = max(depths) + args.train * max(ns) + max(ns) + 16
    n_ctx = args.n_ctx or need + KV_PAD
    if n_ctx < need:
        ap.error(f"--n-ctx: {n_ctx} does not hold the deepest cache and its trains ({need})")
    text = _text_tokens(need)
    load0, t0 = os.getloadavg(), time.time()
    times: dict[tuple[int, int], list[float]] = {(d, n): [] for d in depths for n in ns}
    nodes: dict[tuple[int, int], dict[str, list[float]]] = {(d, n): {} for d in depths for n in ns}
    with LlamaCppEngine(args.gguf, n_ctx=n_ctx, threads=1, clock="cpu") as e:
        for r in range(args.reps):
            order = depths[r % len(depths) :] + depths[: r % len(depths)]
            for d in order:
                kv = e.model.new_cache()
                e.prefill(kv, text[:d])
                for n in ns:
                    ts = []
                    for j in range(args.train):
                        window = text[d + j : d + j + n]
                        ts.append(e.time_pass(kv, window, all_rows=False))
                        kv.crop(-n)
                    times[(d, n)].append(float(np.median(ts[args.drop :])))
                    for j in range(args.profile):
                        window = text[d + j : d + j + n]
                        by_name: dict[str, float] = {}
                        for x in e.profile(kv, window).nodes:
                            key = x.name.rsplit("-", 1)[0] if x.name[-1:].isdigit() else x.name
                            by_name[key] = by_name.get(key, 0.0) + x.ms
                        kv.crop(-n)
                        for key, ms in by_name.items():
                            nodes[(d, n)].setdefault(key, []).append(ms)
            print(f"repetition {r + 1}/{args.reps}", file=sys.stderr, flush=True)
    rows = []
    for (d, n), v in times.items():
        q10, q50, q90 = np.percentile(v, [10, 50, 90])
        rows.append(
            {
                "depth": d,
                "n": n,
                "cells": view_cells(d, n),
                "median_ms": float(q50),
                "p10_ms": float(q10),
                "p90_ms": float(q90),
                "train_medians_ms": v,
                **(
                    {"nodes_ms": {k: float(np.median(x)) for k, x in nodes[(d, n)].items()}}
                    if args.profile
                    else {}
                ),
            }
        )
    record = {
        "gguf": Path(args.gguf).name,
        "command": command_line("benchmarks/llamacpp_kv_width.py", list(argv or sys.argv[1:])),
        "clock": "thread CPU, one thread",
        "reps": args.reps,
        "train": args.train,
        "drop": args.drop,
        "kv_pad": KV_PAD,
        "n_ctx": n_ctx,
        "profile": args.profile,
        "rows": sorted(rows, key=lambda x: (x["n"], x["depth"])),
        "load_before": load0,
        "load_after": os.getloadavg(),
        "wall_s": time.time() - t0,
    }
    text_out = json.dumps(record, indent=1)
    print(text_out)
    if args.out:
        from specmoe._io import atomic_write_text

        atomic_write_text(Path(args.out), text_out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
