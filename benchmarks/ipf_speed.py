"""Speed of the batched IPF solver against the ``ipfn`` package on the same problems.

The problem: a 48-layer, 128-expert model (Qwen3-30B-A3B's shape, m = 8) and a window of n = 4
tokens. Every expert of every layer is its own maximum-entropy problem on {0,1}^4 (6144
problems): its marginal p_e is a skewed popularity (a Dirichlet draw scaled to sum m per layer)
and its co-activation at lag j is c_e(j) = p_e² + ρ_l(j) p_e (1 − p_e), with a per-layer lag
correlation ρ_l(j) = ρ_l · 0.8^(j−1), ρ_l drawn in [0.2, 0.5] (overlaps like those of paper 003
Section 6). Every 2x2 pairwise table of the 4 positions is a constraint (6 tables).

specmoe solves all 6144 problems in one call (:func:`specmoe.routing.ipf.solve_windows`, a
[6144, 16] table). ipfn is called once per expert problem (a 2x2x2x2 array with the six 2x2
aggregates) on a random sample of ``--ipfn-problems`` problems (default 256; 0 means all 6144),
and its total time is extrapolated to all problems from the mean time per problem. Both run to a
tight tolerance (specmoe: every cell within 1e-10; ipfn: every cell within a relative 1e-9, no
early stop on stagnation), the answers are compared on the sampled problems, and the script
prints one JSON record (also written to ``--out FILE``). The specmoe runs are interleaved with
the ipfn calls (A/B alternation), and the ratio is ipfn's total over specmoe's median.

    python benchmarks/ipf_speed.py [--ipfn-problems 256] [--repeats 5] [--seed 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import platform
import sys
import time

import numpy as np

from specmoe._io import atomic_write_json, dumps_json
from specmoe.routing.ipf import solve_windows

L, N, M, WINDOW = 48, 128, 8, 4


def make_problem(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Marginals p [L*N] and co-activations c [L*N, WINDOW-1] (see the module docstring)."""
    rng = np.random.default_rng(seed)
    pop = rng.dirichlet(np.full(N, 0.8), size=L) * M  # [L, N], rows sum to m
    pop = np.minimum(pop, 0.95)
    rho = rng.uniform(0.2, 0.5, size=L)[:, None] * 0.8 ** np.arange(WINDOW - 1)  # [L, J]
    c = pop[:, :, None] ** 2 + rho[:, None, :] * (pop * (1 - pop))[:, :, None]
    return pop.reshape(-1), c.reshape(L * N, -1)


def ipfn_solve(ipfn_cls, p: float, c: np.ndarray) -> np.ndarray:
    """One problem with ipfn: the uniform 2x2x2x2 seed fitted to its six pairwise tables."""
    dims, tables = [], []
    for i, k in itertools.combinations(range(WINDOW), 2):
        cc = c[k - i - 1]
        dims.append([i, k])
        tables.append(np.array([[1 - 2 * p + cc, p - cc], [p - cc, cc]]))
    seed = np.full((2,) * WINDOW, 1.0 / 2**WINDOW)
    with contextlib.redirect_stdout(io.StringIO()):  # ipfn prints its stopping reason
        out = ipfn_cls(
            seed, tables, dims, convergence_rate=1e-9, max_iteration=10000, rate_tolerance=0.0
        ).iteration()
    return np.asarray(out).reshape(-1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--ipfn-problems",
        type=int,
        default=256,
        help="expert problems timed with ipfn (0: all 6144; default 256)",
    )
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of specmoe (default 5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, metavar="FILE", help="also write the JSON here")
    args = ap.parse_args(argv)
    try:
        from ipfn.ipfn import ipfn as ipfn_cls
    except ImportError:
        print("ipf_speed: the ipfn package is not installed (pip install ipfn)", file=sys.stderr)
        return 2
    p, c = make_problem(args.seed)
    B = p.size
    print(
        f"ipf_speed: {B} problems ({L} layers x {N} experts), n={WINDOW}, "
        f"{WINDOW * (WINDOW - 1) // 2} pairwise tables each",
        file=sys.stderr,
    )
    sol = solve_windows(p, c, WINDOW, tol=1e-10)  # warm-up, and the answer
    times: list[float] = []

    def time_ours() -> None:
        t0 = time.perf_counter()
        solve_windows(p, c, WINDOW, tol=1e-10)
        times.append(time.perf_counter() - t0)

    rng = np.random.default_rng(args.seed + 1)
    k = B if args.ipfn_problems <= 0 or args.ipfn_problems >= B else args.ipfn_problems
    sample = np.arange(B) if k == B else np.sort(rng.choice(B, size=k, replace=False))
    # A/B alternation: the specmoe runs are spread through the ipfn loop, so both see the same
    # machine load.
    repeats = max(1, args.repeats)
    slots = set(np.linspace(0, k, repeats, endpoint=False).astype(int).tolist())
    per, diffs, any_diffs = [], [], []
    for done, b in enumerate(sample):
        if done in slots:
            time_ours()
        t0 = time.perf_counter()
        ref = ipfn_solve(ipfn_cls, float(p[b]), c[b])
        per.append(time.perf_counter() - t0)
        diffs.append(np.abs(ref - sol.probs[b]).max())
        any_diffs.append(abs(ref[0] - sol.probs[b, 0]))  # P(active at least once)
        if (done + 1) % 64 == 0:
            print(f"ipf_speed: ipfn {done + 1}/{k}", file=sys.stderr, flush=True)
    while len(times) < repeats:
        time_ours()
    ours = float(np.median(times))
    per = np.asarray(per)
    ipfn_total = float(per.mean() * B)
    rec = {
        "benchmark": "ipf_speed",
        "problem": {
            "layers": L,
            "experts": N,
            "top_k": M,
            "n": WINDOW,
            "problems": B,
            "tables_per_problem": WINDOW * (WINDOW - 1) // 2,
            "seed": args.seed,
        },
        "specmoe": {
            "seconds_median": ours,
            "seconds_min": float(min(times)),
            "seconds_max": float(max(times)),
            "runs": len(times),
            "sweeps": sol.iterations,
            "converged": int(sol.converged.sum()),
            "tolerance": 1e-10,
        },
        "ipfn": {
            "problems_timed": int(k),
            "sampled": bool(k < B),
            "seconds_per_problem_median": float(np.median(per)),
            "seconds_per_problem_iqr": [
                float(np.percentile(per, 25)),
                float(np.percentile(per, 75)),
            ],
            "seconds_total": ipfn_total,
            "extrapolated": bool(k < B),
            "relative_tolerance": 1e-9,
        },
        "ratio_ipfn_over_specmoe": ipfn_total / ours,
        "agreement": {
            "max_abs_probability_difference": float(max(diffs)),
            "max_abs_p_active_difference": float(max(any_diffs)),
        },
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cpus": os.cpu_count(),
        },
    }
    if args.out:
        atomic_write_json(args.out, rec)
    print(dumps_json(rec))
    return 0 if max(diffs) < 1e-8 else 1


if __name__ == "__main__":
    sys.exit(main())
