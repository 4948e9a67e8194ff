"""Synthetic round logs: a drafter with a known acceptance process and a known linear cost.

Legend for shapes: ``G`` generations (prompts), ``n`` positions, ``P`` pass size, ``L`` MoE
layers, ``m`` slots, ``N`` experts.

The simulated world (every parameter is an argument, so tests know the truth):

* Each prompt has a reference continuation of ``tokens`` tokens (the target's greedy output)
  and a reference routing: at every position and layer the token picks m distinct experts by
  Gumbel-top-m over log-popularity (Zipf, exponent ``skew``) plus ``reuse_logit`` for the
  experts the previous token picked, so consecutive tokens share experts.
* Acceptance: the draft for position j matches the reference with probability p_j, drawn once
  per prompt (a deterministic drafter, as under greedy decoding): p_j = clip(a_c ± burst) with
  the sign a two-state Markov chain that switches with probability ``switch`` per position and a_c
  the rate of the prompt's category. ``draft_confidence`` is sigmoid(logit p_j ± 1 + noise),
  informative about the match.
* One run per budget K in ``budgets`` replays every prompt: a round at position s verifies
  positions s..s+K, accepts the leading matches M and emits M + 1 tokens. Positions after the
  first mismatch are wrong drafts, routed afresh from the previous position's experts.
* Cost: T_T = beta0(K) + alpha(K)·Ū + c·L + N(0, noise_ms²) (plus, with probability
  ``outlier_frac``, an exponential spike of mean 5 ms); T_D = draft_a·K + draft_b + N(0, 0.01²)
  for K >= 1 (0 at K = 0), null with probability ``missing_draft``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from specmoe.formats.roundlog import RoundLog, pass_stats

__all__ = ["default_alpha", "default_beta0", "synthetic_round_log"]

VOCAB = 32000


def default_beta0(k: int) -> float:
    """Fixed time per budget, shaped like paper 000 Table A4 (ms; a regime change at m = 5)."""
    return {0: 6.0, 1: 7.3, 2: 8.9, 3: 10.5}.get(int(k), 4.8 + 0.05 * (int(k) - 4))


def default_alpha(k: int) -> float:
    """Time per distinct expert (ms), 0.08 for passes of up to 4 tokens, 0.27 above (Table A4)."""
    return 0.08 if int(k) + 1 <= 4 else 0.27


def _routing_process(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    *,
    n_experts: int,
    top_k: int,
    reuse_logit: float,
    skew: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Reference routing [G, n, L, m] (int16) of a Markov reuse process, and the per-layer
    log-popularity [L, N] it used."""
    g, n, n_layers = shape
    logpop = -skew * np.log1p(np.arange(n_experts))
    perm = np.argsort(rng.random((n_layers, n_experts)), axis=1)  # popular experts per layer
    base = np.take_along_axis(np.broadcast_to(logpop, (n_layers, n_experts)), perm, axis=1)
    out = np.empty((g, n, n_layers, top_k), dtype=np.int16)
    prev = np.zeros((g, n_layers, n_experts), dtype=bool)
    for t in range(n):
        score = base + reuse_logit * prev + rng.gumbel(size=(g, n_layers, n_experts))
        pick = np.argpartition(-score, top_k - 1, axis=-1)[..., :top_k]
        out[:, t] = pick
        prev[:] = False
        np.put_along_axis(prev, pick, True, axis=-1)
    return out, base


def _resample(
    rng, prev_ids: np.ndarray, base: np.ndarray, *, n_experts: int, top_k: int, reuse_logit: float
) -> np.ndarray:
    """One routing step per row of ``prev_ids`` [B, L, m] -> [B, L, m] (a wrong draft's)."""
    b, n_layers, _ = prev_ids.shape
    prev = np.zeros((b, n_layers, n_experts), dtype=bool)
    np.put_along_axis(prev, prev_ids.astype(np.int64), True, axis=-1)
    score = base + reuse_logit * prev + rng.gumbel(size=(b, n_layers, n_experts))
    return np.argpartition(-score, top_k - 1, axis=-1)[..., :top_k].astype(np.int16)


def synthetic_round_log(
    *,
    budgets: Sequence[int] = (0, 1, 2, 3, 4, 5, 6, 7, 8),
    n_prompts: int = 24,
    tokens: int = 160,
    categories: Mapping[str, float] | None = None,
    burst: float = 0.25,
    switch: float = 0.05,
    num_layers: int = 4,
    num_experts: int = 64,
    top_k: int = 6,
    reuse_logit: float = 1.5,
    skew: float = 0.6,
    beta0: Mapping[int, float] | None = None,
    alpha: Mapping[int, float] | None = None,
    c: float = 1.1e-3,
    draft_a: float = 0.459,
    draft_b: float = 0.073,
    noise_ms: float = 0.05,
    outlier_frac: float = 0.0,
    missing_draft: float = 0.0,
    prompt_len: tuple[int, int] = (100, 800),
    seed: int = 0,
) -> RoundLog:
    """Simulate one run per budget over the same prompts; return the rounds as a RoundLog.

    ``categories`` maps category -> mean acceptance rate a_c (default code 0.8, chat 0.55);
    prompts cycle through them. ``beta0``/``alpha`` map K -> ms (defaults
    :func:`default_beta0`, :func:`default_alpha`). The log's ``acceptance`` column holds a_c.
    """
    rng = np.random.default_rng(seed)
    cats = dict(categories or {"code": 0.8, "chat": 0.55})
    budgets = sorted(int(k) for k in budgets)
    kmax = budgets[-1]
    b0 = {k: (beta0 or {}).get(k, default_beta0(k)) for k in budgets}
    al = {k: (alpha or {}).get(k, default_alpha(k)) for k in budgets}
    g = int(n_prompts)
    cat_names = list(cats)
    cat_of = np.array([cat_names[i % len(cat_names)] for i in range(g)], dtype=object)
    rate = np.array([cats[c_] for c_ in cat_of])
    n = tokens + kmax + 2
    ref, base = _routing_process(
        rng,
        (g, n, num_layers),
        n_experts=num_experts,
        top_k=top_k,
        reuse_logit=reuse_logit,
        skew=skew,
    )
    sign = np.where(rng.random(g) < 0.5, 1.0, -1.0)[:, None] * np.cumprod(
        np.where(rng.random((g, n)) < switch, -1.0, 1.0), axis=1
    )
    p = np.clip(rate[:, None] + burst * sign, 0.02, 0.98)
    match = rng.random((g, n)) < p  # the drafter's outcome at each position, fixed per prompt
    logit = np.log(p / (1 - p)) + np.where(match, 1.0, -1.0) + rng.normal(0, 0.3, (g, n))
    conf = (1 / (1 + np.exp(-logit))).astype(np.float32)
    tok = rng.integers(0, VOCAB, (g, n)).astype(np.int32)
    plen = rng.integers(prompt_len[0], prompt_len[1] + 1, g)

    cols: dict[str, list] = {
        c_: []
        for c_ in (
            "run_id",
            "prompt_id",
            "generation_id",
            "category",
            "round",
            "k",
            "accepted",
            "t_verify_ms",
            "t_draft_ms",
            "context_len",
            "u_mean",
            "e_max",
            "acceptance",
        )
    }
    lists: dict[str, list] = {
        "routing": [],
        "draft_tokens": [],
        "target_tokens": [],
        "draft_confidence": [],
    }
    for k in budgets:
        s = np.zeros(g, dtype=np.int64)
        rnd = 0
        while True:
            act = np.flatnonzero(s < tokens)
            if not len(act):
                break
            sa = s[act]
            pos = sa[:, None] + np.arange(k + 1)  # [B, P]
            mt = match[act[:, None], pos[:, 1:]] if k else np.zeros((len(act), 0), bool)
            m_run = (
                np.where(mt.all(1), k, np.argmin(mt, axis=1))
                if k
                else np.zeros(len(act), dtype=np.int64)
            )
            routing = ref[act[:, None], pos]  # [B, P, L, m]
            for d in range(1, k + 1):  # wrong drafts: fresh routing from the previous row
                wrong = np.flatnonzero(d > m_run)
                if len(wrong):
                    routing[wrong, d] = _resample(
                        rng,
                        routing[wrong, d - 1],
                        base,
                        n_experts=num_experts,
                        top_k=top_k,
                        reuse_logit=reuse_logit,
                    )
            u, e = pass_stats(routing, num_experts)
            ctx = plen[act] + sa
            t_t = (
                b0[k]
                + al[k] * u
                + c * ctx
                + rng.normal(0, noise_ms, len(act))
                + (rng.random(len(act)) < outlier_frac) * rng.exponential(5.0, len(act))
            )
            t_d = (
                (draft_a * k + draft_b + rng.normal(0, 0.01, len(act))) if k else np.zeros(len(act))
            )
            t_d = np.where(rng.random(len(act)) < missing_draft, np.nan, t_d)
            # tokens: the reference up to the first mismatch, then a wrong draft, then noise
            tgt = tok[act[:, None], pos + 1]  # [B, P]: the target's token after each position
            beyond = np.arange(k + 1)[None, :] > m_run[:, None]
            tgt = np.where(beyond, rng.integers(0, VOCAB, tgt.shape), tgt)
            dft = tgt[:, :k].copy()
            first_wrong = np.arange(k)[None, :] == m_run[:, None]
            dft = np.where(
                first_wrong, (dft + 1 + rng.integers(0, VOCAB - 1, dft.shape)) % VOCAB, dft
            )
            dft = np.where(
                np.arange(k)[None, :] > m_run[:, None], rng.integers(0, VOCAB, dft.shape), dft
            )
            cf = conf[act[:, None], pos[:, 1:]]
            for b, gi in enumerate(act):
                run = f"synth-k{k}"
                cols["run_id"].append(run)
                cols["prompt_id"].append(f"p{gi:04d}")
                cols["generation_id"].append(f"{run}/p{gi:04d}")
                cols["category"].append(cat_of[gi])
                lists["routing"].append(routing[b].ravel())
                lists["draft_tokens"].append(dft[b])
                lists["target_tokens"].append(tgt[b])
                lists["draft_confidence"].append(cf[b])
            cols["round"].append(np.full(len(act), rnd))
            cols["k"].append(np.full(len(act), k))
            cols["accepted"].append(m_run)
            cols["t_verify_ms"].append(t_t)
            cols["t_draft_ms"].append(t_d)
            cols["context_len"].append(ctx)
            cols["u_mean"].append(u)
            cols["e_max"].append(e)
            cols["acceptance"].append(rate[act])
            s[act] += m_run + 1
            rnd += 1
    # rounds were produced step-major; order them by run, generation, round
    data = {}
    for c_ in ("run_id", "prompt_id", "generation_id", "category"):
        data[c_] = np.array(cols[c_], dtype=object)
    for c_ in ("round", "k", "accepted", "context_len"):
        data[c_] = np.concatenate(cols[c_]).astype(np.int64)
    for c_ in ("t_verify_ms", "t_draft_ms", "u_mean", "e_max", "acceptance"):
        data[c_] = np.concatenate(cols[c_]).astype(np.float64)
    nr = len(data["k"])
    data["pass_size"] = data["k"] + 1
    data["budget"] = data["k"].astype(np.float64)  # every round drafts its budget
    data["emitted"] = data["accepted"] + 1
    data["num_layers"] = np.full(nr, float(num_layers))
    data["top_k"] = np.full(nr, float(top_k))
    data["num_experts"] = np.full(nr, float(num_experts))
    data["kv_usage"] = data["context_len"] / 4096.0
    data["kernel"] = np.full(nr, "slot", dtype=object)
    data["drafter"] = np.full(nr, "oracle", dtype=object)
    order = np.lexsort((data["round"], data["generation_id"].astype(str)))
    data = {c_: v[order] for c_, v in data.items()}
    out_lists = {}
    for c_, vals in lists.items():
        vals = [vals[i] for i in order]
        lengths = np.array([len(v) for v in vals], dtype=np.int64)
        flat = np.concatenate(vals) if vals else np.zeros(0)
        out_lists[c_] = (flat, np.concatenate([[0], np.cumsum(lengths)]))
    out_lists["routing"] = (out_lists["routing"][0].astype(np.int16), out_lists["routing"][1])
    out_lists["draft_tokens"] = (
        out_lists["draft_tokens"][0].astype(np.int32),
        out_lists["draft_tokens"][1],
    )
    out_lists["target_tokens"] = (
        out_lists["target_tokens"][0].astype(np.int32),
        out_lists["target_tokens"][1],
    )
    out_lists["draft_confidence"] = (
        out_lists["draft_confidence"][0].astype(np.float32),
        out_lists["draft_confidence"][1],
    )
    return RoundLog(data, out_lists, name="synthetic")
