"""A stand-in for recorded OLMoE routing while no recorded trace of OLMoE's shape is installed.

A sticky process at OLMoE-1B-7B's shape (N = 64 experts, m = 8, 16 MoE layers): each expert of
the previous token is kept with probability stick[l]; the free slots are drawn without
replacement with fixed, skewed per-layer popularity (Dirichlet(2) weights, Gumbel top-k).
stick[l] rises from 0.10 in the first layer to 0.42 at mid depth and falls to 0.30 in the last
(paper 003 Appendix J's depth profile: early layers near the independence baseline, mid layers
several times above it); at mid depth the lag-1 overlap is near OLMoE's measured reuse at n = 2
(0.363, paper 002 Section 2). Documents of 512 tokens; 8192 tokens in all.

Usage: python results/cpu/efficiency/standin_trace.py OUT.npz
"""

import sys

import numpy as np

from specmoe.formats.trace import RoutingTrace, save_trace

T, L, N, M, DOC = 8192, 16, 64, 8, 512
depth = np.arange(L) / (L - 1)
stick = np.where(depth < 0.5, 0.10 + 0.64 * depth, 0.42 - 0.24 * (depth - 0.5))
rng = np.random.default_rng(2024)
logw = np.log(rng.dirichlet(np.full(N, 2.0), size=L))  # [L, N]
out = np.empty((T, L, M), dtype=np.int16)
prev = None
for t in range(T):
    keys = logw + rng.gumbel(size=(L, N))
    if prev is not None and t % DOC:
        keep = np.zeros((L, N), dtype=bool)
        np.put_along_axis(keep, prev, rng.random((L, M)) < stick[:, None], axis=1)
        keys[keep] = np.inf
    prev = np.argpartition(-keys, M - 1, axis=1)[:, :M]
    out[t] = prev
meta = {
    "model": "OLMoE-1B-7B-0125",
    "source": "sticky stand-in for recorded routing (results/cpu/efficiency/standin_trace.py)",
    "stick": stick.round(4).tolist(),
}
save_trace(
    RoutingTrace(
        experts=out, doc_offsets=np.arange(0, T + 1, DOC), num_experts=N, meta=meta, name="standin"
    ),
    sys.argv[1],
)
