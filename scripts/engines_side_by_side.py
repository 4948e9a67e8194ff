"""The bundled model's verify pass in two engines on one machine: specmoe's engine (transformers'
model code with specmoe's deduplicating kernel) beside llama.cpp (its GGUF export, through
:class:`specmoe.engines.llamacpp_pass.LlamaCppEngine`), and the speedup each pass implies.

Both engines run the same verify sweep (:func:`specmoe.engine.measure.verify_passes`: a prompt
of d tokens, then passes of n = 1..9 tokens of its greedy continuation, each cropped back; the
first repetition a warm-up), one thread each, on the thread CPU clock, on the same validation
documents, the engines alternating prompt by prompt (which goes first alternates too), so that a
drift of the machine falls on both. τ(n) per engine is the mean over prompts of each prompt's
median over repetitions (the campaigns' statistic).

The speedup a pass implies at acceptance a is the best over k = 0..8 of
G_a(k) · τ(1) / τ(k + 1) (Eq. (1) of paper 002 with a free draft; the round's own work beyond
the pass, h(k), is left out: it belongs to the loop, not the engine); k* is its smallest
maximizer.

Writes ``--out`` (default ``results/cpu/llamacpp/side_by_side.json``) and prints a Markdown
table. Usage: ``python scripts/engines_side_by_side.py [--prompts P] [--repeats R]
[--depths 512,2048] [--gguf F]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

os.environ.setdefault("SPECMOE_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from specmoe._io import atomic_write_json  # noqa: E402

NS = list(range(1, 10))
ACCEPTANCE = [float(round(a, 3)) for a in np.linspace(0.2, 0.98, 11)]


def _tau(records: list[dict]) -> list[float]:
    """Mean over prompts of the per-prompt median of each n's pass time."""
    by: dict[tuple[str, int], list[float]] = {}
    for r in records:
        by.setdefault((r["prompt_id"], r["n"]), []).append(r["t_ms"])
    prompts = sorted({p for p, _ in by})
    return [float(np.mean([np.median(by[(p, n)]) for p in prompts])) for n in NS]


def best_speedup(tau: list[float], a: float) -> tuple[float, int]:
    """T_a(k*)/T_a(0) with V(k) = tau(k + 1) (Eq. (9) of paper 002), and k*(a)."""
    from specmoe.cost import theory

    k = theory.best_draft_length(tau, a)
    return float(theory.speedup(tau, a, k)), int(k)


def main(argv: list[str] | None = None) -> int:
    import torch
    from whole_pass_campaign import CONFIGS, Models

    from specmoe.engine.measure import verify_passes
    from specmoe.engine.runner import load_target
    from specmoe.engine.speculative import Engine
    from specmoe.engine.switch import KernelPolicy
    from specmoe.engines import llamacpp
    from specmoe.engines.llamacpp_pass import LlamaCppEngine
    from specmoe.kernels import cpu

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--depths", default="512,2048")
    ap.add_argument("--gguf", type=Path, default=Path("~/.cache/specmoe/gguf/bundled-f32.gguf"))
    ap.add_argument("--out", type=Path, default=ROOT / "results/cpu/llamacpp/side_by_side.json")
    args = ap.parse_args(argv)
    gguf = args.gguf.expanduser()
    if not gguf.is_file():
        print(f"engines_side_by_side: error: --gguf: {args.gguf}: no such file", file=sys.stderr)
        return 2
    try:
        depths = [int(d) for d in args.depths.split(",")]
    except ValueError:
        print(f"engines_side_by_side: error: --depths: {args.depths!r}", file=sys.stderr)
        return 2
    llamacpp.require_built()
    torch.set_num_threads(1)
    cpu.set_num_threads(1)
    net, _, label, _ = load_target("bundled")
    models = Models(CONFIGS, 0)
    engines = {
        "specmoe": Engine(net, policy=KernelPolicy("dedup"), clock="cpu"),
        "llama.cpp": LlamaCppEngine(gguf, n_ctx=4096, threads=1, clock="cpu"),
    }
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    result: dict = {
        "model": label,
        "gguf": f"{gguf.name} ({gguf.stat().st_size} bytes, f32 weights, f16 KV cache)",
        "llama_cpp": llamacpp.VERSION,
        "threads": 1,
        "clock": "thread CPU time",
        "prompts": args.prompts,
        "repeats": args.repeats,
        "warmup": 1,
        "n": NS,
        "acceptance": ACCEPTANCE,
        "command": "python scripts/engines_side_by_side.py " + " ".join(argv or sys.argv[1:]),
        "depths": {},
    }
    try:
        for d in depths:
            recs: dict[str, list] = {name: [] for name in engines}
            docs = models.prompts(d, args.prompts)
            for i, (pid, ids) in enumerate(docs):
                order = list(engines) if i % 2 == 0 else list(engines)[::-1]
                for name in order:
                    out = verify_passes(
                        engines[name],
                        [(pid, ids)],
                        n_values=NS,
                        repeats=args.repeats,
                        warmup=1,
                        settings=("dedup",),
                    )
                    recs[name].extend(out["records"])
                print(f"d={d} prompt {i + 1}/{len(docs)}", file=sys.stderr, flush=True)
            entry = {}
            for name, r in recs.items():
                tau = _tau(r)
                sp = [best_speedup(tau, a) for a in ACCEPTANCE]
                entry[name] = {
                    "tau_ms": tau,
                    "growth_per_token_ms": float(np.polyfit(NS[1:], tau[1:], 1)[0]),
                    "best_speedup": [s for s, _ in sp],
                    "kstar": [k for _, k in sp],
                }
            entry["prompts_used"] = [pid for pid, _ in docs]
            result["depths"][str(d)] = entry
    finally:
        for e in engines.values():
            e.close()
    result["load_start_end"] = [load0, os.getloadavg()[0]]
    result["wall_s"] = time.perf_counter() - t0
    atomic_write_json(args.out, result)
    for d, entry in result["depths"].items():
        print(f"\nd = {d}: tau(n) ms, n = 1..9")
        for name in engines:
            print(f"| {name} | " + " | ".join(f"{x:.3f}" for x in entry[name]["tau_ms"]) + " |")
        print(f"best speedup (k*) at a = {', '.join(map(str, ACCEPTANCE))}")
        for name in engines:
            e = entry[name]
            print(
                f"| {name} | "
                + " | ".join(
                    f"{s:.2f} ({k})" for s, k in zip(e["best_speedup"], e["kstar"], strict=True)
                )
                + " |"
            )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
