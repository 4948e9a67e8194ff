"""Where the Oracle stops (paper 000 Appendix B, Figures B1-B7).

Legend for shapes: ``G`` responses (generations), ``n`` positions (padded), ``K`` the largest
budget, ``T`` reference positions of all responses, ``L`` MoE layers, ``m`` slots, ``B``
bootstrap resamples.

The Oracle is :mod:`specmoe.oracle.ssp` on :func:`specmoe.oracle.counterfactual
.build_counterfactual` with the per-budget cost model (4) of paper 000 (``kind="model"``):
C(k, i) = β0_k + α_k·Ū(i, k) + c_k·L_i + T_D(k). At a state i it chooses k*(i); the pass verifies
reference positions i..i+k*. Its decisions are weighted by the occupancy π(i), the probability
that a round starts at i under its policy (1 on the path where every acceptance is recorded).

* **New experts** of the next token at a transition (i, d), d >= 1: per layer the experts of
  reference position i+d not among those of positions i..i+d-1, averaged over layers; that is
  Ū(i, d) - Ū(i, d-1) with Ū the union of :func:`specmoe.oracle.counterfactual.window_union`.
  At a visited state the pass **continues** at d = 1..k* and **stops** at d = k*+1 (the token
  the Oracle left out; only where i+k*+1 is inside the response). Figure B5 compares the two and
  the positions by the boundary type before the next token (:mod:`specmoe.analysis.boundaries`).
* **First draft mismatch** (Figure B5, right pair): in each recorded round with M < k, the new
  experts of the mismatched draft (pass position M+1, against positions 0..M) against those of
  the position before it (position M against 0..M-1, M >= 1); both from the recorded routing.
* **The expert term** (Figure B4): the same Oracle with α_k·Ū(i, k) removed from the cost
  (:func:`cost_without_expert_term`; equal to the cost model with α = 0), solved again for its
  own value function J'. At a state the full Oracle visits, the expert term *moves the boundary*
  where Q'(i, k*+1) < Q'(i, k*), with Q(i, k) = C(k, i) + J(i+1) + Σ_{d<=k} S(i, d)·(J(i+d+1) -
  J(i+d)) the action value of :mod:`specmoe.oracle.ssp` (so k*+1 becomes cheaper without it);
  the share of positions where the two Oracles' choices differ is reported over visited states
  (π-weighted) and over every position. A second variant replaces α_k·Ū(i, k) by α_k times the
  mean of Ū(·, k) over positions (the expert term blind to which experts a position needs).
* Figure B3: the π-weighted shares of k* = 1 and k* >= 4, and the mean k* by the boundary type
  at the stop. Intervals are a percentile bootstrap over responses (each resampled with all its
  positions), as the paper's response-level clustered bootstrap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specmoe.analysis.boundaries import TYPES, boundary_types
from specmoe.analysis.effects import cluster_weights, percentile_interval
from specmoe.errors import InputError
from specmoe.formats.roundlog import RoundLog
from specmoe.oracle.costmodel import CostModel
from specmoe.oracle.counterfactual import Counterfactual, window_union

__all__ = [
    "Reference",
    "action_values",
    "concat_logs",
    "cost_with_mean_expert_term",
    "cost_without_expert_term",
    "evaluate_policy",
    "reference_sequences",
    "stops_analysis",
]


def concat_logs(logs: list[RoundLog]) -> RoundLog:
    """Several round logs as one (rows in order; list columns re-offset)."""
    if len(logs) == 1:
        return logs[0]
    cols = set(logs[0].data)
    for lg in logs[1:]:
        cols &= set(lg.data)
    data = {c: np.concatenate([lg.data[c] for lg in logs]) for c in logs[0].data if c in cols}
    lists = {}
    for c in logs[0].lists:
        if not all(c in lg.lists for lg in logs):
            continue
        vals = np.concatenate([lg.lists[c][0] for lg in logs])
        offs, base = [np.zeros(1, np.int64)], 0
        for lg in logs:
            o = lg.lists[c][1]
            offs.append(o[1:] + base)
            base += int(o[-1])
        lists[c] = (vals, np.concatenate(offs))
    return RoundLog(data, lists, " + ".join(lg.name for lg in logs))


@dataclass(frozen=True, eq=False)
class Reference:
    """The reference sequences of the Oracle's responses (order of ``cf.generation_id``)."""

    ids: np.ndarray  # [T, L, m] routing of each reference position
    tokens: np.ndarray  # [T] the token at each position (-1: unknown, position 0)
    base: np.ndarray  # [G] first row of each response
    length: np.ndarray  # [G]
    rounds: RoundLog  # the recorded rounds of these responses, by (response, round)
    round_gen: np.ndarray  # [R] response of each recorded round
    round_start: np.ndarray  # [R] its start position


def reference_sequences(log: RoundLog, cf: Counterfactual) -> Reference:
    """Routing and tokens of the reference positions of ``cf``'s responses: position s_r + j,
    j = 0..M_r, is row j of round r's routing, and its token is the (s_r + j - 1)-th token the
    response emitted (the concatenation of each round's first M_r + 1 target tokens)."""
    labels = np.asarray(cf.generation_id).astype(str)
    gid = np.array([str(x) for x in log["generation_id"]])
    rows = np.flatnonzero(np.isin(gid, labels))
    sub = log.select(rows)
    gen = np.searchsorted(labels, gid[rows])
    order = np.lexsort((sub["round"], gen))
    sub, gen = sub.select(order), gen[order]
    L, m = int(sub["num_layers"][0]), int(sub["top_k"][0])
    rvals, roff = sub.lists["routing"]
    ids = rvals.reshape(-1, L, m)
    row0 = roff[:-1] // (L * m)
    em = sub["accepted"].astype(np.int64) + 1
    take = np.repeat(row0, em) + (np.arange(em.sum()) - np.repeat(np.cumsum(em) - em, em))
    tv, to = sub.lists["target_tokens"]
    emitted = tv[np.repeat(to[:-1], em) + (np.arange(em.sum()) - np.repeat(np.cumsum(em) - em, em))]
    length = np.bincount(gen, weights=em, minlength=len(labels)).astype(np.int64)
    if (length != cf.length).any():
        raise InputError(f"{log.name}: the responses do not match the Oracle's reference sequences")
    base = np.concatenate([[0], np.cumsum(length)[:-1]])
    tokens = np.empty(len(take), dtype=np.int64)
    for g in range(len(labels)):  # position p holds emitted token p - 1; position 0 is unknown
        lo, hi = base[g], base[g] + length[g]
        tokens[lo] = -1
        tokens[lo + 1 : hi] = emitted[lo : hi - 1]
    start = np.concatenate(
        [np.cumsum(em[gen == g]) - em[gen == g] for g in range(len(labels))]
    ).astype(np.int64)
    return Reference(ids[take], tokens, base, length, sub, gen, start)


def cost_without_expert_term(cost: np.ndarray, cf: Counterfactual, model: CostModel) -> np.ndarray:
    """C(k, i) - α_k·Ū(i, k): the Oracle's cost [G, n, K+1] with the expert term removed
    (infinite budgets stay infinite)."""
    alpha = np.asarray(model.truncate(cf.k_max).alpha, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(cost), cost - alpha * cf.union, cost)


def cost_with_mean_expert_term(
    cost: np.ndarray, cf: Counterfactual, model: CostModel
) -> np.ndarray:
    """C(k, i) - α_k·Ū(i, k) + α_k·mean_i Ū(i, k) (mean over feasible positions of every
    response): the expert term at each budget's average, blind to the position."""
    alpha = np.asarray(model.truncate(cf.k_max).alpha, dtype=np.float64)
    live = (np.arange(cf.union.shape[1])[None, :] < cf.length[:, None])[..., None] & np.isfinite(
        cost
    )
    mean_u = np.where(live, cf.union, 0.0).sum(axis=(0, 1)) / np.maximum(live.sum(axis=(0, 1)), 1)
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(cost), cost - alpha * cf.union + alpha * mean_u, cost)


def action_values(cost: np.ndarray, surv: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Q(i, k) = C(k, i) + J(i+1) + Σ_{d=1..k} S(i, d)·(J(i+d+1) - J(i+d)) [G, n, K+1], the
    quantity :func:`specmoe.oracle.ssp.solve` minimises (value [G, n+K+2] its J)."""
    g, n, kp1 = cost.shape
    idx = np.arange(n)[:, None] + np.arange(kp1 + 1)[None, :]  # [n, K+2]: i .. i+K+1
    w = value[:, idx]  # [G, n, K+2]
    inc = surv[:, :, 1:] * (w[:, :, 2:] - w[:, :, 1:-1])  # [G, n, K]
    with np.errstate(invalid="ignore"):
        return (
            cost
            + w[:, :, 1:2]
            + np.concatenate([np.zeros((g, n, 1)), np.cumsum(inc, axis=-1)], axis=-1)
        )


def evaluate_policy(
    cost: np.ndarray, surv: np.ndarray, policy: np.ndarray, length: np.ndarray
) -> np.ndarray:
    """[G] expected total time J_pi(0) of a fixed ``policy`` [G, n] under ``cost``: the
    recursion of :mod:`specmoe.oracle.ssp` with the minimum replaced by the policy's budget."""
    g, n, kp1 = cost.shape
    value = np.zeros((g, n + kp1 + 1))
    live = np.arange(n)[None, :] < np.asarray(length)[:, None]
    pol = policy.astype(np.int64)
    rows = np.arange(g)
    for i in range(n - 1, -1, -1):
        w = value[:, i + 1 : i + kp1 + 1]  # J(i+1..i+K+1)
        inc = surv[:, i, 1:] * (w[:, 1:] - w[:, :-1])
        q = cost[:, i, :] + w[:, :1] + np.concatenate([np.zeros((g, 1)), np.cumsum(inc, 1)], 1)
        value[:, i] = np.where(live[:, i], q[rows, pol[:, i]], 0.0)
    return value[:, 0]


def _wmean(x, w, gen, n_gen, wboot):
    """(point, interval source [B]) of a π-weighted mean clustered by response."""
    sw = np.bincount(gen, weights=w, minlength=n_gen)
    sx = np.bincount(gen, weights=w * x, minlength=n_gen)
    point = float(sx.sum() / sw.sum()) if sw.sum() > 0 else float("nan")
    if wboot is None:
        return point, None, float(sw.sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        reps = (wboot @ sx) / (wboot @ sw)
    return point, reps, float(sw.sum())


def _rec(x, w, gen, n_gen, wboot, confidence):
    p, reps, weight = _wmean(x, w, gen, n_gen, wboot)
    out = {"mean": p, "weight": weight, "responses": len(np.unique(gen[w > 0]))}
    if reps is not None:
        lo, hi = percentile_interval(reps[:, None], confidence)
        out["interval"] = [float(lo[0]), float(hi[0])]
    return out, reps


def _diff(a_reps, b_reps, a, b, confidence):
    out = {"difference": None if a["mean"] is None else a["mean"] - b["mean"]}
    if a_reps is not None and b_reps is not None:
        lo, hi = percentile_interval((a_reps - b_reps)[:, None], confidence)
        out["interval"] = [float(lo[0]), float(hi[0])]
    return out


def _text(pieces, toks) -> str:
    return "".join("" if t < 0 else pieces[int(t)] for t in toks)


def stops_analysis(
    log: RoundLog,
    pieces,
    *,
    l_max: int = 8,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    examples: int = 12,
    progress=None,
) -> dict:
    """Appendix B of paper 000 on ``log`` (round logs at several budgets, the counterfactual
    columns at the largest), ``pieces`` the decoded text of each token id."""
    from specmoe.oracle.analysis import make_cost_model, oracle_costs
    from specmoe.oracle.counterfactual import build_counterfactual
    from specmoe.oracle.ssp import occupancy, solve, survival

    say = progress or (lambda _msg: None)
    if n_boot < 0:
        raise InputError(f"must be >= 0, got {n_boot}", argument="n_boot")
    if l_max < 1:
        raise InputError(f"must be >= 1, got {l_max}", argument="l_max")
    say("building the counterfactual reference sequences")
    cf = build_counterfactual(log)
    if l_max < cf.k_max:
        cf = cf.truncate(l_max)
    K = cf.k_max
    say("fitting the per-budget verification cost (model (4))")
    model = make_cost_model(log, "model", K)
    cost = oracle_costs(cf, model)
    costs = {
        "full": cost,
        "no_expert_term": cost_without_expert_term(cost, cf, model),
        "mean_expert_term": cost_with_mean_expert_term(cost, cf, model),
    }
    surv = survival(cf.q, K, cost.shape[1])
    say("solving the Oracle under the full cost and without the expert term")
    sols = {name: solve(c, cf.q, cf.length, surv=surv) for name, c in costs.items()}
    pol = sols["full"].policy.astype(np.int64)
    pi = occupancy(sols["full"].policy, surv, cf.length)
    G, n = pol.shape
    live = np.arange(n)[None, :] < cf.length[:, None]
    visited = live & (pi > 1e-12)
    ref = reference_sequences(log, cf)
    n_exp = int(np.nanmax(log["num_experts"])) if log.has("num_experts") else int(ref.ids.max()) + 1
    ends = np.repeat(ref.base + ref.length, ref.length)
    say("new experts of every next token")
    U = window_union(ref.ids, np.arange(len(ref.ids)), ends, K + 1, n_exp)  # [T, K+2]
    new = np.diff(U, axis=1)  # [T, K+1]: new experts of position t+d, d = 1..K+1
    pos_in = np.arange(len(ref.ids)) - np.repeat(ref.base, ref.length)
    inside = (
        pos_in[:, None] + np.arange(1, K + 2)[None, :] < np.repeat(ref.length, ref.length)[:, None]
    )
    new = np.where(inside, new, np.nan)
    say("typing the boundaries")
    btype = np.empty(len(ref.tokens), dtype=object)
    for g in range(G):
        lo, hi = ref.base[g], ref.base[g] + ref.length[g]
        btype[lo:hi] = boundary_types(ref.tokens[lo:hi], pieces)
    # transitions of visited states: (state row t, d), d = 1..k*+1
    gi, ii = np.nonzero(visited)
    t_row = ref.base[gi] + ii
    kst = pol[gi, ii]
    w_state = pi[gi, ii]
    d_n = kst + 1
    tr_state = np.repeat(np.arange(len(t_row)), d_n)
    tr_d = np.arange(d_n.sum()) - np.repeat(np.cumsum(d_n) - d_n, d_n) + 1
    tr_row = t_row[tr_state]
    tr_new = new[tr_row, tr_d - 1]
    tr_stop = tr_d == kst[tr_state] + 1
    tr_w = w_state[tr_state]
    tr_gen = gi[tr_state]
    tr_type = btype[np.minimum(tr_row + tr_d, len(btype) - 1)]
    ok = np.isfinite(tr_new)
    wb = cluster_weights(G, n_boot, seed) if n_boot else None

    def rec(mask, x=tr_new, w=tr_w, gen=tr_gen):
        m = mask & np.isfinite(x) & (w > 0)
        return _rec(np.where(m, x, 0.0), np.where(m, w, 0.0), gen, G, wb, confidence)

    stop, stop_r = rec(ok & tr_stop)
    cont, cont_r = rec(ok & ~tr_stop)
    new_experts = {
        "stop": stop,
        "continue": cont,
        "stop_minus_continue": _diff(stop_r, cont_r, stop, cont, confidence),
    }
    by_type = []
    for ty in (*TYPES, "unknown"):
        sel = ok & (tr_type == ty)
        if not sel.any():
            continue
        a, _ = rec(sel)
        s_, _ = rec(sel & tr_stop)
        c_, _ = rec(sel & ~tr_stop)
        stop_share, _ = rec(sel, x=tr_stop.astype(float))
        by_type.append({"type": ty, "all": a, "stop": s_, "continue": c_, "stop_share": stop_share})
    # reference: every boundary type against "same" (the code analogue of no script change)
    # Figure B3: k* shares and mean k* by the boundary type at the stop
    st_gen = gi
    k_share = {}
    for name, sol in sols.items():
        kk = sol.policy.astype(np.int64)[gi, ii]
        dist = np.bincount(kk, weights=w_state, minlength=K + 1) / w_state.sum()
        one, _ = _rec((kk == 1).astype(float), w_state, st_gen, G, wb, confidence)
        four, _ = _rec((kk >= 4).astype(float), w_state, st_gen, G, wb, confidence)
        mk, _ = _rec(kk.astype(float), w_state, st_gen, G, wb, confidence)
        k_share[name] = {"distribution": dist.tolist(), "k1": one, "k_ge4": four, "mean_k": mk}
    stop_row = t_row + kst + 1
    has_next = (ii + kst + 1) < cf.length[gi]
    stop_type = np.where(has_next, btype[np.minimum(stop_row, len(btype) - 1)], "end")
    mean_k_by_type = []
    for ty in (*TYPES, "unknown", "end"):
        sel = stop_type == ty
        if sel.any():
            r, _ = _rec(kst[sel].astype(float), w_state[sel], st_gen[sel], G, wb, confidence)
            mean_k_by_type.append({"type": ty, **r})
    # the expert term: Q' at the full Oracle's choices
    say("action values of the Oracle without the expert term")
    out_terms = {}
    cases_rows = None
    for name in ("no_expert_term", "mean_expert_term"):
        q2 = action_values(costs[name], surv, sols[name].value)
        k2 = sols[name].policy.astype(np.int64)
        nxt = np.minimum(kst + 1, K)
        cheaper = (kst < K) & (q2[gi, ii, nxt] < q2[gi, ii, kst] - 1e-12)
        differ = k2[gi, ii] != kst
        differ_all = (k2 != pol) & live
        frac, _ = _rec(differ.astype(float), w_state, st_gen, G, wb, confidence)
        sh, _ = _rec(cheaper.astype(float), w_state, st_gen, G, wb, confidence)
        longer, _ = _rec((k2[gi, ii] > kst).astype(float), w_state, st_gen, G, wb, confidence)
        out_terms[name] = {
            "differ_share_visited": frac,
            "differ_share_all_positions": float(differ_all.sum() / live.sum()),
            "longer_share_visited": longer,
            "k_plus_1_cheaper_share": sh,
            "k_plus_1_cheaper_states": int(cheaper.sum()),
            "visited_states": len(gi),
        }
        if name == "no_expert_term":
            cases_rows = np.flatnonzero(cheaper)
            q_full = action_values(cost, surv, sols["full"].value)
            gap = q2[gi, ii, kst] - q2[gi, ii, nxt]
            gap_full = q_full[gi, ii, nxt] - q_full[gi, ii, kst]
    # mismatches in the recorded rounds of these responses
    say("new experts at the first draft mismatch")
    rd = ref.rounds
    L, m = ref.ids.shape[1], ref.ids.shape[2]
    rvals, roff = rd.lists["routing"]
    rids = rvals.reshape(-1, L, m)
    r0 = roff[:-1] // (L * m)
    kk_r, mm_r = rd["k"].astype(np.int64), rd["accepted"].astype(np.int64)
    ru = window_union(rids, r0, roff[1:] // (L * m), K, n_exp)  # [R, K+1]
    rnew = np.diff(ru, axis=1)  # [R, K]: new experts of pass position d, d = 1..K
    mis = mm_r < kk_r
    bef = mis & (mm_r >= 1)
    ones = np.ones(len(kk_r))
    rr = np.arange(len(kk_r))
    x_mis = np.where(mis, rnew[rr, np.minimum(mm_r, K - 1)], 0.0)
    x_bef = np.where(bef, rnew[rr, np.maximum(mm_r - 1, 0)], 0.0)
    a_mis, _ = _rec(x_mis, np.where(mis, ones, 0.0), ref.round_gen, G, wb, confidence)
    a_bef, a_bef_r = _rec(x_bef, np.where(bef, ones, 0.0), ref.round_gen, G, wb, confidence)
    # the same rounds where both exist, paired
    p_mis, p_mis_r = _rec(x_mis, np.where(bef, ones, 0.0), ref.round_gen, G, wb, confidence)
    mism_row = ref.base[ref.round_gen] + ref.round_start + mm_r + 1
    mis_in = mis & (ref.round_start + mm_r + 1 < ref.length[ref.round_gen])
    mis_type = np.where(mis_in, btype[np.minimum(mism_row, len(btype) - 1)], "end")
    mis_types = []
    for ty in (*TYPES, "unknown"):
        sel = mis_in & (mis_type == ty)
        if sel.any():
            share = float(sel.sum() / mis_in.sum())
            all_ty = float((btype == ty).sum() / len(btype))
            mis_types.append(
                {"type": ty, "share_of_mismatches": share, "share_of_positions": all_ty}
            )
    mismatch = {
        "rounds_with_mismatch": int(mis.sum()),
        "first_mismatch": a_mis,
        "before_mismatch": a_bef,
        "first_mismatch_where_before_exists": p_mis,
        "mismatch_minus_before": _diff(p_mis_r, a_bef_r, p_mis, a_bef, confidence),
        "boundary_types": mis_types,
    }

    # examples (B1/B6) and the shifted cases (B4)
    def example(s):
        g, i, k = int(gi[s]), int(ii[s]), int(kst[s])
        t = int(t_row[s])
        pass_toks = ref.tokens[t : t + k + 1]
        nxt_tok = ref.tokens[t + k + 1] if has_next[s] else None
        prof = [None if not np.isfinite(v) else float(v) for v in new[t, : k + 1]]
        return {
            "response": str(cf.generation_id[g]),
            "position": i,
            "k_star": k,
            "occupancy": float(w_state[s]),
            "pass_text": _text(pieces, pass_toks),
            "pass_tokens": [_text(pieces, [x]) for x in pass_toks],
            "next_token": None if nxt_tok is None else _text(pieces, [nxt_tok]),
            "boundary": str(stop_type[s]),
            "new_experts": prof,  # d = 1..k*+1 (the last: the token left out)
        }

    cases = []
    if cases_rows is not None and len(cases_rows):
        order = cases_rows[np.argsort(-gap[cases_rows], kind="stable")]
        for s in order[: max(examples, 4)]:
            e = example(s)
            e["q_gap_without_expert_term_ms"] = float(gap[s])
            e["q_gap_full_ms"] = float(gap_full[s])
            cases.append(e)
    ex = []
    real = np.flatnonzero((w_state > 0.5) & has_next)
    if len(real):
        seen: set[str] = set()

        def distinct(rows, n_max, why):
            got = []
            for s in rows:
                e = example(s)
                if e["pass_text"] not in seen and len(got) < n_max:
                    seen.add(e["pass_text"])
                    got.append(dict(e, why=why))
            return got

        ex += distinct(real[np.argsort(-kst[real], kind="stable")], examples // 3, "long k*")
        for ty in ("indent", "newline", "string/comment", "ident/punct"):
            sel = real[(stop_type[real] == ty) & (kst[real] <= 2)]
            ex += distinct(sel, 2, f"stop at {ty}")
    return {
        "l_max": K,
        "responses": G,
        "positions": int(cf.num_positions),
        "visited_states": len(gi),
        "expected_rounds": float(w_state.sum()),
        "cost_model": {
            "kind": model.kind,
            "beta0": list(model.beta0[: K + 1]),
            "alpha": list(model.alpha[: K + 1]),
            "c": list(model.c[: K + 1]),
            "draft": list(model.draft[: K + 1]),
        },
        # each Oracle's policy timed under the full cost: the speedup the expert term buys
        "s_max_under_full_cost": {
            name: float(
                np.where(live, cost[:, :, 0], 0.0).sum()
                / evaluate_policy(cost, surv, sol.policy, cf.length).sum()
            )
            for name, sol in sols.items()
        },
        "k_star": k_share,
        "mean_k_by_boundary": mean_k_by_type,
        "new_experts": new_experts,
        "new_experts_by_boundary": by_type,
        "mismatch": mismatch,
        "expert_term": out_terms,
        "cases": cases,
        "examples": ex,
        "boundary_share_of_positions": {
            ty: float((btype == ty).sum() / len(btype)) for ty in (*TYPES, "unknown")
        },
    }
