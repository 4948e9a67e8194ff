"""Synthetic routing from fitted statistics (paper 003 Section 8, Appendix L).

Legend for shapes: ``T`` tokens, ``L`` MoE layers, ``N`` experts, ``m`` experts per token,
``w`` window length, ``C = 2**(w-1)`` contexts, ``J`` lags.

Method (the paper samples each expert's IPF pattern per window and repairs cardinality; it is
silent on window boundaries, so we choose a stationary construction):

1. **Window laws.** For every layer l and expert e, :func:`specmoe.routing.ipf.solve_windows`
   gives the maximum-entropy law P_{l,e} on {0,1}^w meeting the marginal p_e and the lagged
   co-activations c_e(j), j = 1..w-1. ``skewed``: p_e is e's measured popularity and
   c_e(j) = p_e² + ρ_b(j) p_e (1 − p_e), where ρ_b(j) = Σ_{e∈b} (c_e(j) − p_e²) / Σ_{e∈b}
   p_e (1 − p_e) is the lag-j correlation of activation pooled over e's popularity bin b (so
   Σ_e c_e(j), hence the overlap o_l(j), is kept exactly, while a very popular expert is not
   given an infeasible anti-correlation); with ``bins = N`` each expert keeps its own measured
   c_e(j). ``uniform``: p = m/N and c(j) = m·o_l(j)/N for every expert.
2. **A Markov chain over patterns.** Each expert's activation bits follow the order-(w-1) chain
   whose transition is the window law's conditional,
   π_{l,e,t} = P_{l,e}(x_w = 1 | x_1..x_{w-1} = the expert's last w-1 bits).
   Windows therefore overlap by w-1 tokens and there is no window boundary: the process is
   stationary after a burn-in (discarded), and every window of w tokens is drawn from the
   fitted law up to the coupling of step 3.
3. **Cardinality repair.** The N chains of a layer are coupled so that every token has exactly m
   distinct experts: the activation probabilities π are rescaled to sum to m (capped at 1) and
   m experts are drawn by systematic probability-proportional-to-size sampling over a fresh
   random ordering of the experts, which includes expert e with exactly its rescaled
   probability. The drawn bits (not the unrepaired ones) feed each chain's history.

The synthetic trace is one document unless ``doc_tokens`` splits it. Same inputs and seed give
the same trace. Layers of a spec with a different layer count take the statistics of the source
layer at the same relative depth; m must match the statistics, and so must N for ``skewed``. The
``uniform`` variant carries the source's layer overlaps o_l(j) to another expert count N'
(:func:`uniform_moments`: p = m/N', c(j) = m·o_l(j)/N'), the scaling of paper 003 Appendix M.3:
the reuse of a token's experts by its successors is kept, the popularity skew is not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specmoe.errors import InputError
from specmoe.formats.trace import RoutingTrace
from specmoe.routing.ipf import (
    VARIANTS,
    ExpertMoments,
    bin_experts,
    check_ipf_cost,
    fit_moments,
    solve_windows,
)

__all__ = [
    "chain_tables",
    "rescale_to_sum",
    "sticky_trace",
    "synth_fidelity",
    "synthesize",
    "systematic_sample",
    "uniform_moments",
]


def uniform_moments(
    moments: ExpertMoments,
    num_experts: int,
    *,
    top_k: int | None = None,
    layer_mean: bool = False,
) -> ExpertMoments:
    """The ``uniform`` variant's moments at N' = ``num_experts`` experts and m' = ``top_k``
    (default the source's m): every expert has p = m'/N' and c(j) = m'·o_l(j)/N',
    o_l(j) = Σ_e c_{l,e}(j)/m the source layer's overlap at lag j, so the overlap o_l(j) is the
    source's exactly. ``layer_mean``: one layer whose o(j) is the mean over the source's
    layers."""
    N2 = int(num_experts)
    m2 = moments.top_k if top_k is None else int(top_k)
    if not 0 < m2 < N2:
        arg = "num_experts" if top_k is None else "top_k"
        raise InputError(f"must leave 0 < m < N (m={m2}, N={N2})", argument=arg)
    o = moments.overlap  # [L, J]
    if layer_mean:
        o = o.mean(axis=0, keepdims=True)
    if np.any(o > 1 + 1e-12) or np.any(o < 0):
        raise InputError("overlaps outside [0, 1]", argument="moments")  # pragma: no cover
    L = o.shape[0]
    co = np.repeat((m2 * np.minimum(o, 1.0) / N2)[:, :, None], N2, axis=2)  # [L, J, N']
    return ExpertMoments(
        num_experts=N2,
        top_k=m2,
        popularity=np.full((L, N2), m2 / N2),
        coactivation=co,
        tokens=moments.tokens,
        union=None,
        meta={**moments.meta, "uniform_from_num_experts": moments.num_experts},
    )


def _layer_map(num_layers: int, source_layers: int) -> np.ndarray:
    """[L'] source layer of each synthetic layer, by relative depth."""
    if num_layers == 1 or source_layers == 1:
        return np.zeros(num_layers, dtype=np.int64)
    return np.rint(np.arange(num_layers) * (source_layers - 1) / (num_layers - 1)).astype(np.int64)


def _expert_targets(
    moments: ExpertMoments, *, variant: str, bins: int
) -> tuple[np.ndarray, np.ndarray]:
    """Marginal [L, N] and co-activation [L, N, J] targets of every expert's chain."""
    N, m, L = moments.num_experts, moments.top_k, moments.num_layers
    if variant == "uniform":
        p = np.full((L, N), m / N)
        c = np.repeat((moments.coactivation.sum(axis=2) / N)[:, None, :], N, axis=1)
        return p, c
    p = moments.popularity
    co = moments.coactivation.transpose(0, 2, 1)  # [L, N, J]
    lo = np.maximum(0.0, 2.0 * p - 1.0)[:, :, None]  # a valid 2x2 table needs
    if bins >= N:  # 2p − 1 <= c <= p
        return p, np.clip(co, lo, p[:, :, None])
    b = bin_experts(p, bins)  # [L, N]
    onehot = (b[:, :, None] == np.arange(bins)).astype(np.float64)  # [L, N, K]
    var = p * (1.0 - p)  # [L, N]
    cov = co - (p**2)[:, :, None]  # [L, N, J]
    vb = np.einsum("ln,lnk->lk", var, onehot)  # [L, K]
    cb = np.einsum("lnj,lnk->lkj", cov, onehot)  # [L, K, J]
    rho_b = np.divide(cb, vb[:, :, None], out=np.zeros_like(cb), where=vb[:, :, None] > 0)
    rho = np.take_along_axis(rho_b, b[:, :, None], axis=1)  # [L, N, J]
    c = (p**2)[:, :, None] + rho * var[:, :, None]
    return p, np.clip(c, lo, p[:, :, None])


def chain_tables(
    moments: ExpertMoments,
    *,
    window: int,
    variant: str = "skewed",
    bins: int = 8,
    tol: float = 1e-10,
    max_iter: int = 5000,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Transition tables [L, N, C] (P(active | context)), context laws [L, N, C], IPF summary.

    A context is the expert's last w-1 bits, oldest as the most significant bit. Rows whose IPF
    did not converge (or were infeasible) fall back to independence (c = p²) and are counted.
    """
    moments.check_window(window, name="window")
    L, N = moments.num_layers, moments.num_experts
    p, c = _expert_targets(moments, variant=variant, bins=bins)
    p, c = p.reshape(-1), c.reshape(L * N, -1)[:, : window - 1]
    sol = solve_windows(p, c, window, tol=tol, max_iter=max_iter)
    probs = sol.probs
    bad = ~sol.converged
    if bad.any():
        indep = solve_windows(
            p[bad], np.outer(p[bad] ** 2, np.ones(window - 1)), window, tol=tol, max_iter=max_iter
        )
        probs = probs.copy()
        probs[bad] = indep.probs
    pw = probs.reshape(L, N, -1, 2)  # [L, N, C, 2]
    ctx_law = pw.sum(axis=3)
    with np.errstate(divide="ignore", invalid="ignore"):
        trans = np.where(ctx_law > 0, pw[..., 1] / ctx_law, p.reshape(L, N, 1))
    info = {
        "window": window,
        "variant": variant,
        "bins": bins if variant == "skewed" else 1,
        "ipf_iterations": sol.iterations,
        "ipf_fallbacks": int(bad.sum()),
        "ipf_status": {s: int((sol.status == s).sum()) for s in np.unique(sol.status)},
    }
    return np.clip(trans, 0.0, 1.0), ctx_law, info


def systematic_sample(x: np.ndarray, order: np.ndarray, u: np.ndarray, m: int) -> np.ndarray:
    """m distinct columns per row drawn with inclusion probabilities x [L, N] (rows sum to m,
    entries <= 1): systematic sampling (Madow) over the column order ``order`` [L, N] with
    offsets u [L] in [0, 1). Returns [L, m]. Column e is drawn iff one of u, u+1, ..., u+m-1
    falls in its interval of the cumulative sums, which has length x_e <= 1; with u uniform
    that happens with probability exactly x_e.
    """
    L, N = x.shape
    rows = np.arange(L)[:, None]
    cs = np.cumsum(x[rows, order], axis=1)
    cs *= m / cs[:, -1:]
    # Rows of cumulative sums shifted by (m+1) per row stay sorted when flattened, so one
    # searchsorted finds every row's m positions at once.
    shift = rows * (m + 1)
    thr = np.asarray(u).reshape(L, 1) + np.arange(m) + shift  # [L, m]
    pos = np.searchsorted((cs + shift).ravel(), thr.ravel(), side="right")
    pos = np.minimum(pos.reshape(L, m) - rows * N, N - 1)
    return order[rows, pos]


def rescale_to_sum(pi: np.ndarray, m: int) -> np.ndarray:
    """Scale each row of pi [L, N] (positive) to sum m with every entry capped at 1: the capped
    entries are 1 and the rest are s·pi with one s per row (water-filling)."""
    x = pi.copy()
    capped = np.zeros(pi.shape, dtype=bool)
    for _ in range(pi.shape[1]):
        free = np.where(capped, 0.0, pi).sum(axis=1)
        s = (m - capped.sum(axis=1)) / free
        x = np.where(capped, 1.0, pi * s[:, None])
        over = (x > 1.0) & ~capped
        if not over.any():
            break
        capped |= over
    return np.minimum(x, 1.0)


MAX_ENTRIES = 5 * 10**8  # tokens x layers x m of one synthetic trace


def synthesize(
    moments: ExpertMoments,
    num_tokens: int,
    *,
    num_layers: int | None = None,
    num_experts: int | None = None,
    top_k: int | None = None,
    window: int | None = None,
    variant: str = "skewed",
    bins: int = 8,
    seed: int = 0,
    doc_tokens: int | None = None,
    burn_in: int = 64,
    chunk: int = 256,
) -> RoutingTrace:
    """A synthetic trace of ``num_tokens`` tokens (see the module docstring for the method).

    ``num_experts``/``top_k`` (e.g. from a ModelSpec) must equal the statistics' N and m;
    ``num_layers`` may differ (layers mapped by relative depth). ``window`` defaults to
    min(J+1, 9) for statistics with J lags. A bad argument is an ``InputError`` naming it.
    """
    N, m = moments.num_experts, moments.top_k
    if num_experts is not None and num_experts != N and variant == "uniform" and top_k in (None, m):
        moments, N = uniform_moments(moments, num_experts), int(num_experts)
    if num_experts is not None and num_experts != N:
        raise InputError(
            f"N={num_experts} experts but the statistics have N={N} (the uniform variant "
            "carries the overlaps to another N)",
            argument="num_experts",
        )
    if top_k is not None and top_k != m:
        raise InputError(
            f"m={top_k} experts per token but the statistics have m={m}", argument="top_k"
        )
    if variant not in VARIANTS:
        raise InputError(
            f"unknown variant {variant!r} (choose from {', '.join(VARIANTS)})", argument="variant"
        )
    if num_tokens < 1:
        raise InputError(f"must be >= 1, got {num_tokens}", argument="num_tokens")
    if doc_tokens is not None and doc_tokens < 1:
        raise InputError(f"must be >= 1, got {doc_tokens}", argument="doc_tokens")
    window = min(moments.max_lag + 1, 9) if window is None else int(window)
    if window < 2:
        raise InputError(f"must be >= 2, got {window}", argument="window")
    L_src = moments.num_layers
    L = L_src if num_layers is None else int(num_layers)
    if L < 1:
        raise InputError(f"must be >= 1, got {L}", argument="num_layers")
    if num_tokens * L * m > MAX_ENTRIES:
        raise InputError(
            f"{num_tokens} tokens x {L} layers x m={m} = {num_tokens * L * m:.3g} routing "
            f"entries, more than the limit of {MAX_ENTRIES:.0e} (about 1 GiB)",
            argument="num_tokens",
        )
    try:  # the chain's IPF: L*N laws on 2^window patterns
        check_ipf_cost(L_src * N, window, window)
    except InputError as exc:
        raise InputError(exc.message, argument="window") from None
    trans, ctx_law, info = chain_tables(moments, window=window, variant=variant, bins=bins)
    lmap = _layer_map(L, L_src)
    trans, ctx_law = trans[lmap], ctx_law[lmap]  # [L, N, C]
    rng = np.random.default_rng(seed)
    C = trans.shape[2]
    # Initial contexts from each expert's context law, then a burn-in of coupled steps.
    cum = np.cumsum(ctx_law, axis=2)
    u = rng.random((L, N, 1)) * cum[:, :, -1:]
    ctx = np.minimum((cum <= u).sum(axis=2), C - 1)  # [L, N]
    out = np.empty((num_tokens, L, m), dtype=np.int16 if N <= 32767 else np.int32)
    rows = np.arange(L)[:, None]
    flat_trans = trans.reshape(-1)
    base = np.arange(L * N).reshape(L, N) * C  # [L, N] row starts
    total = burn_in + num_tokens
    t = 0
    while t < total:
        k = min(chunk, total - t)
        order = rng.random((k, L, N)).argsort(axis=2)  # fresh ordering per token
        thr = rng.random((k, L))  # systematic offsets
        for i in range(k):
            x = rescale_to_sum(flat_trans[base + ctx] + 1e-12, m)  # [L, N] inclusion probs
            chosen = systematic_sample(x, order[i], thr[i], m)  # [L, m]
            srt = np.sort(chosen, axis=1)
            dup = (srt[:, 1:] == srt[:, :-1]).any(axis=1)
            for layer in np.nonzero(dup)[0]:  # float ties: rare
                chosen[layer] = rng.choice(N, size=m, replace=False, p=x[layer] / x[layer].sum())
            bits = np.zeros((L, N), dtype=np.int64)
            bits[rows, chosen] = 1
            ctx = ((ctx << 1) | bits) & (C - 1)
            if t + i >= burn_in:
                out[t + i - burn_in] = chosen
        t += k
    if doc_tokens is None:
        offsets = np.array([0, num_tokens])
    else:
        offsets = np.unique(np.append(np.arange(0, num_tokens, doc_tokens), num_tokens))
    meta = {
        "num_experts": N,
        "model": moments.meta.get("model", "synthetic"),
        "source": f"synthetic from {moments.meta.get('source', 'statistics')}",
        "synthetic": {**info, "seed": seed, "burn_in": burn_in, "layer_map": lmap.tolist()},
    }
    return RoutingTrace(
        experts=out, doc_offsets=offsets, num_experts=N, meta=meta, name="synthetic"
    )


def synth_fidelity(
    source: ExpertMoments, trace: RoutingTrace, *, max_n: int | None = None
) -> dict[str, Any]:
    """Compare a synthetic trace with the statistics it was drawn from (same layer count).

    popularity_r: [L] Pearson r of per-expert popularity; overlap_diff: [L, J] synthetic −
    source o_l(j); union_rel_err: [S] (layer-mean U_synth(n) − U_source(n)) / U_source(n),
    for n = 2..max_n, when the source statistics carry a measured union.
    """
    if trace.num_layers != source.num_layers:
        raise InputError(
            f"{trace.num_layers} layers, but the statistics have {source.num_layers}",
            argument="trace",
        )
    J = source.max_lag
    max_n = J + 1 if max_n is None else max_n
    syn = fit_moments(trace, max_lag=max(J, max_n - 1))
    r = np.array(
        [
            np.corrcoef(a, b)[0, 1] if a.std() > 0 and b.std() > 0 else np.nan
            for a, b in zip(source.popularity, syn.popularity)
        ]
    )
    od = syn.overlap[:, :J] - source.overlap
    res: dict[str, Any] = {
        "popularity_r": r,
        "popularity_r_min": float(np.nanmin(r)) if np.isfinite(r).any() else None,
        "overlap_source": source.overlap.mean(axis=0),
        "overlap_synth": syn.overlap[:, :J].mean(axis=0),
        "overlap_diff": od,
        "overlap_max_abs_diff": float(np.abs(od).max()),
        "n": list(range(2, max_n + 1)),
    }
    if source.union is not None and source.union.shape[1] >= max_n:
        us = syn.union[:, 1:max_n].mean(axis=0)
        u0 = source.union[:, 1:max_n].mean(axis=0)
        res.update(
            union_source=u0,
            union_synth=us,
            union_rel_err=(us - u0) / u0,
            union_max_abs_rel_err=float(np.abs((us - u0) / u0).max()),
        )
    return res


def sticky_trace(
    num_experts: int,
    top_k: int,
    layers: int,
    keep: float,
    *,
    tokens: int = 1500,
    docs: int = 10,
    doc_offsets: Any = None,
    seed: int = 0,
    source: str | None = None,
) -> RoutingTrace:
    """A simple sticky routing process, for benchmarks and tests without a recorded trace:
    each layer's token keeps each of the previous token's experts with probability ``keep``
    and draws the rest uniformly from the experts it did not keep (a dropped one may come
    back, so the share reused is keep plus a little; not a fitted model).
    Documents split the tokens evenly (``docs``) unless ``doc_offsets`` is given."""
    if not 0 <= keep <= 1:
        raise InputError(f"must lie in [0, 1], got {keep}", argument="keep")
    if not 1 <= top_k <= num_experts:
        raise InputError(f"must lie in 1..num_experts={num_experts}, got {top_k}", argument="top_k")
    rng = np.random.default_rng(seed)
    ex = np.zeros((tokens, layers, top_k), dtype=np.int64)
    for li in range(layers):
        prev = rng.choice(num_experts, top_k, replace=False)
        for t in range(tokens):
            kept = prev[rng.random(top_k) < keep]
            rest = np.setdiff1d(np.arange(num_experts), kept)
            prev = np.concatenate([kept, rng.choice(rest, top_k - kept.size, replace=False)])
            ex[t, li] = prev
    offsets = (
        np.linspace(0, tokens, docs + 1).astype(np.int64)
        if doc_offsets is None
        else np.asarray(doc_offsets, dtype=np.int64)
    )
    return RoutingTrace(
        experts=ex,
        doc_offsets=offsets,
        num_experts=num_experts,
        meta={"source": source or f"sticky synthetic routing, keep {keep}"},
        name=f"sticky synthetic routing (keep {keep})",
    )
