"""Per-operation medians of a verify pass of the bundled model, as JSON on stdout.

    python benchmarks/whole_pass_ops.py [--depths 512,2048] [--n-max 9] [--reps 7]

Times every operation of one decoder layer and of the model head alone
(:func:`specmoe.bench.ops.time_operations`: thread CPU time, one thread, the engine's per-slot
kernel switch installed) and prints, per op, its medians [depth][n] in ms, its fit and its
held-out ε, with the whole layer's and the whole model's forward beside them.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="512,2048")
    ap.add_argument("--n-max", type=int, default=9)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)

    from specmoe.bench.ops import time_operations
    from specmoe.engine.runner import load_target

    net, _, label, _ = load_target("bundled")
    res = time_operations(
        net,
        n_values=list(range(1, args.n_max + 1)),
        depths=[int(d) for d in args.depths.split(",")],
        reps=args.reps,
        model_name=label,
    )
    wp = res.whole_pass
    out = {
        "model": wp["model"],
        "layers": wp["layers"],
        "clock": wp["clock"],
        "cold": res.cold,
        "notes": wp["notes"],
        "n": wp["n"],
        "d": wp["d"],
        "wall_s": res.wall_s,
        "ops": {
            k: {"median_ms": v["median_ms"], "fit": v["fit"], "eps": v["eps"], "per": v["per"]}
            for k, v in wp["ops"].items()
        },
        "layer_ms": wp["layer_ms"],
        "model_ms": wp["model_ms"],
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
