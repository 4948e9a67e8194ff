"""The time llama.cpp's verify pass spends on the logits of every row beyond the last row's.

``llama-bench -p n -n 0`` decodes a batch of n tokens asking for the logits of its last row
only (``common_batch_get_one``), so its lm_head multiplies one row. llama-server's verification
of k drafts asks for the logits of all k + 1 rows (each is sampled), so its lm_head multiplies
k + 1 rows, and their logits are copied out: a time that grows with k which llama-bench's passes
do not hold. (The draft context's re-evaluation of the target's batch asks for its last row
only: ``common/speculative.cpp``, "only the last token is output".)

:func:`measure` times both in libllama (:class:`specmoe.engines.llamacpp_pass.LlamaCppEngine`)
on the same tokens at the same depth: per n, ``blocks`` blocks of ``block`` decodes of each
variant, the variants' blocks alternating (the first decode of a block builds its graph anew
and is not counted; later ones reuse it, as llama-bench's repetitions and the server's rounds
do); the cache is cropped back to the depth after every pass. :func:`summarize` pairs them in
measuring order: the extra time at n is the median of the paired differences, with a
bootstrap interval. :func:`output_rows` does both for a GGUF file at several depths, the
``output_rows`` section of ``llamacpp_verify.json`` (``specmoe bench --engine llama.cpp``),
which :mod:`specmoe.cost.llamacpp_plan` adds to the target's pass.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["VARIANTS", "measure", "output_rows", "summarize"]

VARIANTS = ("last_row", "all_rows")


def measure(
    engine, depth: int, ns: Sequence[int], blocks: int, block: int, seed: int = 0
) -> dict[int, dict[str, list[float]]]:
    """Per n: the counted times (ms, the engine's clock) of each variant, in measuring order."""
    if blocks < 1 or block < 2:
        raise ValueError(f"blocks must be >= 1 and block >= 2, got {blocks} and {block}")
    rng = np.random.default_rng(seed)
    vocab = engine.vocab_size
    kv = engine.model.new_cache()
    engine.prefill(kv, rng.integers(0, vocab, depth).tolist())
    out: dict[int, dict[str, list[float]]] = {}
    for n in ns:
        tokens = rng.integers(0, vocab, n).tolist()
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for b in range(blocks):
            order = VARIANTS if b % 2 == 0 else VARIANTS[::-1]
            for v in order:
                for j in range(block):
                    t = engine.time_pass(kv, tokens, all_rows=v == "all_rows")
                    kv.crop(-n)
                    if j:  # the first of a block builds the graph
                        times[v].append(t)
        out[int(n)] = times
    return out


def summarize(
    times: dict[int, dict[str, list[float]]], *, seed: int = 0, boot: int = 2000
) -> list[dict[str, Any]]:
    """Per n: each variant's median, 10th and 90th percentiles and count, and ``extra_ms``: the
    median of the paired differences (all rows minus last row, in measuring order) with a 95%
    bootstrap interval of that median; ``extra_ms_per_extra_row`` divides it by n - 1."""
    rng = np.random.default_rng(seed)
    rows = []
    for n, t in times.items():
        a, b = np.asarray(t["last_row"], float), np.asarray(t["all_rows"], float)
        m = min(a.size, b.size)
        if m == 0:
            raise ValueError(f"n={n}: no counted passes")
        d = b[:m] - a[:m]
        bs = np.median(rng.choice(d, (boot, m)), axis=1)
        rows.append(
            {
                "n": int(n),
                **{
                    f"{v}_ms": {
                        "median": float(np.median(x)),
                        "p10": float(np.percentile(x, 10)),
                        "p90": float(np.percentile(x, 90)),
                        "count": int(x.size),
                    }
                    for v, x in (("last_row", a), ("all_rows", b))
                },
                "extra_ms": {
                    "median": float(np.median(d)),
                    "ci95": [float(np.percentile(bs, 2.5)), float(np.percentile(bs, 97.5))],
                },
                "extra_ms_per_extra_row": float(np.median(d)) / (n - 1) if n > 1 else None,
            }
        )
    return rows


def output_rows(
    gguf: str | os.PathLike,
    depths: Sequence[int],
    n_max: int,
    *,
    threads: int = 1,
    blocks: int = 6,
    block: int = 4,
    seed: int = 0,
    progress: bool = True,
    kv_type: str = "f16",
) -> dict[str, Any]:
    """The ``output_rows`` section of ``llamacpp_verify.json``: per depth, :func:`summarize`'s
    rows at n = 1..``n_max`` (thread-CPU clock at one thread, wall clock with more), the KV
    cache in ``kv_type``."""
    from specmoe.engines.llamacpp_pass import LlamaCppEngine

    clock = "cpu" if threads == 1 else "wall"
    by_depth: dict[str, list[dict[str, Any]]] = {}
    n_ctx = max(depths) + n_max + 16
    with LlamaCppEngine(gguf, n_ctx=n_ctx, threads=threads, clock=clock, kv_type=kv_type) as e:
        for d in depths:
            if progress:
                print(
                    f"bench: libllama target n=1..{n_max} at depth {d}, every row's logits "
                    "against the last row's",
                    file=sys.stderr,
                )
            by_depth[str(d)] = summarize(measure(e, d, range(1, n_max + 1), blocks, block, seed))
    return {
        "method": "libllama passes with every row's logits against the last row's only, "
        "blocks alternating, paired medians (specmoe.engines.llamacpp_rows)",
        "clock": clock,
        "threads": threads,
        "blocks": blocks,
        "block": block,
        "depths": by_depth,
    }
