"""Speed of the Oracle's dynamic programme (and of the expert-union windows it needs).

Times :func:`specmoe.oracle.ssp.summarise` (survival, the backward DP, the forward occupancy
and the Figure 2 sums) on ``--positions`` positions (default 10^6) at L_max = ``--l-max``
(default 8), in two layouts: many generations of equal length (``--generation-len``, default
1000; the vectorised path) and one generation holding every position (the scalar path). Each
layout is also timed on the other path over a slice of ``--slice`` positions, extrapolated
linearly, as the peer. Costs are random; acceptance probabilities are 0 or 1 except a share
``--unknown`` (default 0.03) drawn in (0, 1), like the bonus positions of a counterfactual log.
Then :func:`specmoe.oracle.counterfactual.window_union` (Ū of every pass, k = 0..L_max) on
``--union-positions`` positions of routing with N = 128, m = 8 and ``--layers`` layers. Prints
one JSON record (stdout): medians and spreads of ``--repeats`` runs after a warm-up.

    python benchmarks/oracle_speed.py [--positions 1000000] [--l-max 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import specmoe.oracle.ssp as ssp
from specmoe.oracle.counterfactual import window_union


def _instance(g: int, n: int, k_max: int, unknown: float, seed: int):
    rng = np.random.default_rng(seed)
    cost = rng.uniform(5.0, 15.0, (g, n, k_max + 1)) + np.arange(k_max + 1) * 0.8
    q = (rng.random((g, n + k_max + 1)) < 0.7).astype(float)
    frac = rng.random(q.shape) < unknown
    q[frac] = rng.uniform(0.05, 0.95, int(frac.sum()))
    return cost, q, np.full(g, n)


def _time_summarise(threshold: int, inputs: tuple, repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls of summarise(*inputs) on the path chosen by
    ``threshold`` (0: vectorised; huge: scalar)."""
    saved = ssp._SCALAR_BELOW
    ssp._SCALAR_BELOW = threshold
    try:
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            ssp.summarise(*inputs)
            out.append(time.perf_counter() - t0)
        return out
    finally:
        ssp._SCALAR_BELOW = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=1_000_000)
    ap.add_argument("--generation-len", type=int, default=1000)
    ap.add_argument("--l-max", type=int, default=8)
    ap.add_argument("--unknown", type=float, default=0.03)
    ap.add_argument("--slice", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--union-positions", type=int, default=200_000)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    k = args.l_max
    record: dict = {
        "benchmark": "oracle_speed",
        "positions": args.positions,
        "l_max": k,
        "cpu_count": os.cpu_count(),
        "work": "positions x (L_max+1) candidates",
        "layouts": {},
    }
    n_len = args.generation_len
    layouts = {"batched": (args.positions // n_len, n_len), "single": (1, args.positions)}
    for name, (g, n) in layouts.items():
        print(f"{name}: {g} generation(s) x {n} positions", file=sys.stderr, flush=True)
        cost, q, length = _instance(g, n, k, args.unknown, args.seed)
        default = 0 if g >= ssp._SCALAR_BELOW else 10**9
        peer = 10**9 if default == 0 else 0
        _time_summarise(
            default, (cost[:, :200], q[:, : 200 + k + 1], np.minimum(length, 200)), 1
        )  # warm-up
        times = _time_summarise(default, (cost, q, length), args.repeats)
        # the peer path on a slice of the same instance, extrapolated linearly in positions
        if g > 1:
            gs = max(1, args.slice // n)
            sl = (cost[:gs], q[:gs], length[:gs])
            scale = g / gs
        else:
            sl = (cost[:, : args.slice], q[:, : args.slice + k + 1], np.array([args.slice]))
            scale = n / args.slice
        peer_times = _time_summarise(peer, sl, args.repeats)
        med = statistics.median(times)
        peer_med = statistics.median(peer_times) * scale
        record["layouts"][name] = {
            "generations": g,
            "generation_len": n,
            "path": "vectorised" if default == 0 else "scalar",
            "seconds_median": med,
            "seconds_min": min(times),
            "seconds_max": max(times),
            "positions_per_second": args.positions / med,
            "peer_path": "scalar" if default == 0 else "vectorised",
            "peer_seconds_extrapolated": peer_med,
            "speedup_over_peer": peer_med / med,
        }
    print("window_union", file=sys.stderr, flush=True)
    rng = np.random.default_rng(args.seed)
    t = args.union_positions
    ids = np.argsort(rng.random((t, args.layers, 128)), axis=-1)[..., :8].astype(np.int16)
    starts = np.arange(t)
    ends = np.full(t, t)
    window_union(ids[:1000], starts[:1000], np.full(1000, 1000), k, 128)
    ut = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        window_union(ids, starts, ends, k, 128)
        ut.append(time.perf_counter() - t0)
    record["window_union"] = {
        "positions": t,
        "layers": args.layers,
        "num_experts": 128,
        "top_k": 8,
        "seconds_median": statistics.median(ut),
        "position_layers_per_second": t * args.layers / statistics.median(ut),
    }
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
