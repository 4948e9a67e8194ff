"""llama.cpp's verify pass with the logits of every row against the last row's only
(:mod:`specmoe.engines.llamacpp_rows`, which ``specmoe bench --engine llama.cpp`` runs too).

``llama-bench -p n -n 0`` decodes a batch of n tokens and asks for the logits of its last row
(``llama_batch_get_one``), so its lm_head multiplies one row. llama-server's verification of
k drafts asks for the logits of all k + 1 rows, so its lm_head multiplies k + 1 rows: a time
that grows with k which llama-bench's passes do not hold. This times both in libllama
(:class:`specmoe.engines.llamacpp_pass.LlamaCppEngine`, one thread, thread-CPU clock) on the
same tokens at the same depth, and prints one JSON record: per n, each variant's median and
10th/90th percentiles, and the median of the paired differences with a bootstrap interval.

Passes come in blocks of ``--block`` decodes of one variant (the first of a block, whose
graph is built anew, is not counted: later ones reuse it, as llama-bench's repetitions and the
server's rounds do); the variants' blocks alternate, ``--blocks`` of each per n. The cache is
cropped back to the depth after every pass.

    python benchmarks/llamacpp_output_rows.py --gguf MODEL.gguf [--depth 512] [--n 1,2,...,9]
        [--blocks 6] [--block 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # its sibling modules, when loaded from a file
    sys.path.insert(0, str(HERE))

from _record import emit, pass_fields, run_fields  # noqa: E402

from specmoe.engines import llamacpp  # noqa: E402
from specmoe.engines.llamacpp_pass import LlamaCppEngine  # noqa: E402
from specmoe.engines.llamacpp_rows import measure, summarize  # noqa: E402


def _ints(text: str, low: int) -> list[int]:
    """Comma-separated integers >= ``low``; a ``ValueError`` naming what is wrong."""
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"not a comma-separated list of integers: {text!r}") from None
    if not vals or min(vals) < low:
        raise ValueError(f"every value must be an integer >= {low}, got {text!r}")
    return vals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="the model's GGUF file")
    ap.add_argument("--depth", type=int, default=512, help="the KV cache's tokens (default 512)")
    ap.add_argument("--n", default="1,2,3,4,5,6,7,8,9", help="pass sizes (default 1..9)")
    ap.add_argument("--blocks", type=int, default=6, help="blocks of each variant per n")
    ap.add_argument("--block", type=int, default=4, help="decodes a block (the first not counted)")
    ap.add_argument("--out", default=None, help="also write the record to this file")
    args = ap.parse_args(argv)
    try:
        ns = _ints(args.n, 1)
    except ValueError as e:
        ap.error(f"--n: {e}")
    if args.depth < 1 or args.blocks < 1 or args.block < 2:
        ap.error("--depth and --blocks must be at least 1 and --block at least 2")
    if not Path(args.gguf).is_file():
        ap.error(f"--gguf: {args.gguf}: no such file")
    llamacpp.require_built()
    load0, t0 = os.getloadavg(), time.time()
    with LlamaCppEngine(args.gguf, n_ctx=args.depth + max(ns) + 16, threads=1) as eng:
        times = measure(eng, args.depth, ns, args.blocks, args.block)
        vocab = eng.vocab_size
    record = {
        **pass_fields("llamacpp_output_rows", args),
        "vocab": vocab,
        "blocks": args.blocks,
        "block": args.block,
        "rows": summarize(times),
        "samples_ms": {str(n): t for n, t in times.items()},
        **run_fields(load0, t0),
    }
    emit(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
