"""Speed of the routing statistics: bitset engine against per-window Python sets.

Generates a sticky Markov routing trace (default 10^6 tokens, 16 layers, N = 64, m = 8, in
documents of 2000-4000 tokens): each token keeps each expert of the previous token with
probability ``--keep`` and otherwise draws a replacement from a skewed per-layer popularity,
so reuse is well above the uniform m/N. Times :func:`specmoe.routing.stats.compute_stats` with
max_n = 9 and max_lag = 16 (median of ``--repeats`` runs after a warm-up on a slice), times a
straightforward per-window Python-set implementation of the same statistics on a slice of
whole documents and extrapolates it linearly in tokens, checks that both agree on the slice,
and prints one JSON record (stdout) with both times and their ratio.

    python benchmarks/stats_speed.py [--tokens 1000000] [--repeats 3] [--slice-tokens 6000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter

import numpy as np

from specmoe.formats.trace import RoutingTrace
from specmoe.routing.stats import compute_stats


def sticky_trace(
    *,
    tokens: int,
    layers: int,
    num_experts: int,
    top_k: int,
    keep: float,
    doc_len: tuple[int, int] = (2000, 4000),
    seed: int = 0,
) -> RoutingTrace:
    """A sticky Markov routing trace [T, L, m], documents generated in parallel."""
    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(int(rng.integers(doc_len[0], doc_len[1] + 1)))
    lengths[-1] -= sum(lengths) - tokens
    if lengths[-1] < 1:
        lengths.pop()
    lens = np.array(lengths)
    off = np.concatenate([[0], np.cumsum(lens)])
    D, L, N, m = lens.size, layers, num_experts, top_k
    # skewed popularity per layer, sampled through a pool of draws: pool [L, P]
    pop = rng.dirichlet(np.full(N, 1.5), size=L)
    pool_size = 1 << 16
    pool = np.stack([rng.choice(N, size=pool_size, p=pop[layer]) for layer in range(L)])
    layer_idx = np.arange(L)[None, :]
    cur = np.argsort(rng.random((D, L, N)), axis=-1)[..., :m].astype(np.int16)  # [D, L, m]
    experts = np.empty((int(off[-1]), L, m), dtype=np.int16)
    for i in range(int(lens.max())):
        if i:
            rep = rng.random((D, L, m)) > keep
            draw = rng.integers(pool_size, size=(D, L, m))
            for s in range(m):  # one slot at a time keeps the m experts distinct
                cand = pool[layer_idx, draw[..., s]]  # [D, L]
                clash = (cur == cand[..., None]).any(axis=-1)
                cur[..., s] = np.where(rep[..., s] & ~clash, cand, cur[..., s])
        active = np.nonzero(lens > i)[0]
        experts[off[active] + i] = cur[active]
    return RoutingTrace(
        experts=experts,
        doc_offsets=off,
        num_experts=N,
        meta={"source": "sticky Markov benchmark trace"},
    )


def naive_stats(trace: RoutingTrace, *, max_n: int, max_lag: int) -> dict[str, np.ndarray]:
    """The same estimators with a Python set per window: rho, union [L, n], overlap [L, lags]."""
    L, m = trace.num_layers, trace.top_k
    reuse = np.zeros((L, max_n))
    union = np.zeros((L, max_n))
    windows = np.zeros(max_n)
    ov = np.zeros((L, max_lag))
    pairs = np.zeros(max_lag)
    counts = [Counter() for _ in range(L)]
    for doc in trace.documents():
        sets = [[set(doc[t, layer].tolist()) for t in range(len(doc))] for layer in range(L)]
        t_d = len(doc)
        for layer in range(L):
            s = sets[layer]
            for t in range(t_d):
                counts[layer].update(s[t])
            for n in range(1, max_n + 1):
                for t in range(t_d - n + 1):
                    earlier = set().union(*s[t : t + n - 1])
                    reuse[layer, n - 1] += len(s[t + n - 1] & earlier)
                    union[layer, n - 1] += len(earlier | s[t + n - 1])
            for j in range(1, max_lag + 1):
                for t in range(t_d - j):
                    ov[layer, j - 1] += len(s[t] & s[t + j])
        windows += np.maximum(t_d - np.arange(max_n), 0)
        pairs += np.maximum(t_d - np.arange(1, max_lag + 1), 0)
    return {"rho": reuse / (m * windows), "union": union / windows, "overlap": ov / (m * pairs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--num-experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--keep", type=float, default=0.35)
    ap.add_argument("--max-n", type=int, default=9)
    ap.add_argument("--max-lag", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--slice-tokens",
        type=int,
        default=6000,
        help="tokens (whole documents) timed with Python sets",
    )
    ap.add_argument(
        "--bootstrap",
        type=int,
        default=2000,
        help="also time one run with this many resamples (0: skip)",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    trace = sticky_trace(
        tokens=args.tokens,
        layers=args.layers,
        num_experts=args.num_experts,
        top_k=args.top_k,
        keep=args.keep,
        seed=args.seed,
    )
    print(
        f"generated {trace.num_tokens} tokens in {trace.num_documents} documents "
        f"({time.perf_counter() - t0:.1f} s)",
        file=sys.stderr,
    )
    ends = trace.doc_offsets[1:]
    n_docs = max(1, int(np.searchsorted(ends, args.slice_tokens, side="right")))
    part = trace.select_documents(list(range(n_docs)))
    kw = {"max_n": args.max_n, "max_lag": args.max_lag}

    compute_stats(part, **kw)  # warm-up
    times = []
    for r in range(args.repeats):
        t0 = time.perf_counter()
        full = compute_stats(trace, **kw)
        times.append(time.perf_counter() - t0)
        print(f"compute_stats run {r + 1}: {times[-1]:.2f} s", file=sys.stderr)
    boot_s = None
    if args.bootstrap:
        t0 = time.perf_counter()
        compute_stats(trace, bootstrap=args.bootstrap, **kw)
        boot_s = time.perf_counter() - t0
        print(f"compute_stats with {args.bootstrap} resamples: {boot_s:.2f} s", file=sys.stderr)

    t0 = time.perf_counter()
    ref = naive_stats(part, **kw)
    naive_slice_s = time.perf_counter() - t0
    fast = compute_stats(part, **kw)
    agree = bool(
        np.allclose(ref["rho"], fast.rho)
        and np.allclose(ref["union"], fast.union)
        and np.allclose(ref["overlap"], fast.overlap)
    )
    naive_full_s = naive_slice_s * trace.num_tokens / part.num_tokens
    median = statistics.median(times)
    record = {
        "benchmark": "stats_speed",
        "tokens": trace.num_tokens,
        "documents": trace.num_documents,
        "layers": trace.num_layers,
        "num_experts": trace.num_experts,
        "top_k": trace.top_k,
        "max_n": args.max_n,
        "max_lag": args.max_lag,
        "rho_mean_2": float(full.rho_mean[1]),
        "rho_mean_9": float(full.rho_mean[-1]),
        "uniform_rho_2": float(full.uniform_rho[1]),
        "vectorised_s": {"median": median, "min": min(times), "max": max(times), "runs": times},
        "vectorised_with_bootstrap_s": boot_s,
        "bootstrap": args.bootstrap,
        "naive_slice_tokens": part.num_tokens,
        "naive_slice_s": naive_slice_s,
        "naive_extrapolated_s": naive_full_s,
        "speedup": naive_full_s / median,
        "agree_on_slice": agree,
        "tokens_per_s": trace.num_tokens / median,
    }
    print(json.dumps(record, indent=2))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
