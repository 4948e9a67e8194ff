"""Counterfactual data from rounds recorded at the largest budget K (paper 000, the Oracle).

Legend for shapes: ``R`` rounds, ``G`` generations, ``n`` positions (padded to the longest
generation), ``K`` the largest budget, ``L`` MoE layers, ``m`` slots, ``W`` 64-bit words of an
expert bitset.

Two views of the same rounds:

**Per recorded round** (exact). A round recorded at budget K that verified d <= K drafts (a
drafter may propose fewer than its budget: the round log's ``k``, its budget ``budget``) with
accepted count M would, at any budget k <= K, have verified min(k, d) drafts and accepted
``min(M, k)``, and its pass would have needed the union of the experts of its routing
positions 0..min(k, d) (:attr:`Counterfactual.accepted`, :attr:`Counterfactual.union_recorded`).
The draft of a budget k is the first k tokens of the draft of budget K: true of the three
drafters of :mod:`specmoe.engine.drafters` (greedy, one token after another, or a prefix of one
prompt-lookup continuation).

**Per position of the reference sequence** (the Oracle's states). The reference sequence of a
generation is the text it emitted: position 0 is the first round's current token, round r
starts at s_r = emitted tokens before it, and positions s_r..s_r+M_r are its current token and
its accepted drafts. Every reference position was verified exactly once as the pass input, so
its routing is known. A pass started at any position i with budget k is then modelled as:

* availability: a round started at i drafts at most A_i tokens, whatever its budget
  (:attr:`Counterfactual.avail`): A = d_r at the start of recorded round r and at the positions
  of its accepted drafts. The oracle drafter and the draft model draft their budget (d_r = K)
  except where the token limit cuts it near a generation's end; a prompt-lookup drafter
  proposes fewer when its match repeats a period of d_r tokens just before the current one,
  and accepted drafts continue that period, so a round started inside them finds the same
  period (an approximation where the lookup would find another match). Budgets above A_i are
  the pass of A_i: the Oracle's cost of them is infinite, so it never chooses them, and a
  simulated policy drafts min(k, A_i).
* acceptance: the draft for position j is accepted with probability q_j. q_j = 1 where a
  recorded round drafted j from the reference prefix and matched, 0 where that draft was the
  first mismatch; where no round drafted j from the reference prefix (the bonus token after a
  fully accepted round) q_j is the generation's acceptance rate, the geometric maximum
  likelihood estimate sum(M) / sum(M + [M < d]). Drafts are accepted in order, independently
  given the q_j. This assumes the draft for a position depends on the reference prefix only,
  not on where its round started (exact for a deterministic drafter of the prefix, such as the
  oracle drafter of paper 002; an approximation for EAGLE-style drafters whose features depend
  on depth). At recorded round starts it reproduces ``min(M, k)`` exactly.
* experts: the union, per layer, of the reference routing of positions i..i+k (clipped at the
  generation's end), averaged over layers. Past the first mismatch a real pass verifies wrong
  drafts, whose routing is unknown except in the recorded rounds; :attr:`union_gap` measures
  the difference at the recorded round starts.
* context: L_i = context_len of the round covering i plus the offset of i in that round.

With ``acceptance="geometric"`` every q_j is the generation's rate instead (an expectation over
a geometric acceptance model, ignoring the recorded matches).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from specmoe.errors import InputError
from specmoe.formats.roundlog import COUNTERFACTUAL, RoundLog

__all__ = ["Counterfactual", "build_counterfactual", "expert_bits", "window_union"]

_CHUNK_BYTES = 1 << 25  # the bitsets of one chunk of window starts


def expert_bits(ids: np.ndarray, num_experts: int) -> np.ndarray:
    """Expert bitsets: ids [T, L, m] -> uint64 [T, L, W], bit e % 64 of word e // 64 set for
    each expert e a row selected. The m experts of a row are distinct, so the OR of their bits
    is their sum (taken slot by slot over contiguous [T, L] planes)."""
    words = (int(num_experts) + 63) // 64
    x = np.ascontiguousarray(np.moveaxis(ids, 2, 0)).astype(np.uint64)  # [m, T, L]
    shifts = np.left_shift(np.uint64(1), x & np.uint64(63))
    out = np.empty((*ids.shape[:2], words), dtype=np.uint64)
    if words == 1:
        out[..., 0] = shifts.sum(axis=0, dtype=np.uint64)
        return out
    word = x >> np.uint64(6)
    for w in range(words):
        out[..., w] = np.where(word == w, shifts, np.uint64(0)).sum(axis=0, dtype=np.uint64)
    return out


def window_union(
    ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, k_max: int, num_experts: int
) -> np.ndarray:
    """Mean over layers of the distinct experts of rows s..min(s+k, e-1), for k = 0..k_max.

    ids [T, L, m]; starts, ends [S] (rows; a window never reaches row ``ends``). -> [S, K+1].
    Computed with expert bitsets in chunks of rows.
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    out = np.empty((len(starts), k_max + 1))
    n_layers = ids.shape[1]
    chunk = max(256, _CHUNK_BYTES // (8 * n_layers * ((int(num_experts) + 63) // 64)))
    for a in range(0, len(starts), chunk):
        s, e = starts[a : a + chunk], ends[a : a + chunk]
        if not len(s):
            continue
        lo, hi = int(s.min()), int(min(e.max(), s.max() + k_max + 1))
        bits = expert_bits(ids[lo:hi], num_experts)
        acc = bits[s - lo].copy()
        out[a : a + len(s), 0] = np.bitwise_count(acc).sum(axis=(1, 2)) / n_layers
        for k in range(1, k_max + 1):
            ok = s + k < e
            acc[ok] |= bits[s[ok] + k - lo]
            out[a : a + len(s), k] = np.bitwise_count(acc).sum(axis=(1, 2)) / n_layers
    return out


@dataclass(frozen=True, eq=False)
class Counterfactual:
    """The Oracle's inputs. Per recorded round [R, ...]; per generation [G]; per position [G, n]."""

    k_max: int
    round_gen: np.ndarray  # [R] generation index of each recorded round
    round_start: np.ndarray  # [R] its start position s_r
    accepted: np.ndarray  # [R, K+1] min(M_r, k)
    union_recorded: np.ndarray  # [R, K+1] Ū of the pass of k+1 recorded positions
    generation_id: np.ndarray  # [G] object
    category: np.ndarray  # [G] object (None: none)
    length: np.ndarray  # [G] tokens emitted (the final state)
    rate: np.ndarray  # [G] acceptance rate (geometric MLE)
    q: np.ndarray  # [G, n+K+1] acceptance probability of a draft at position j
    known: np.ndarray  # [G, n+K+1] whether q_j was observed (0 or 1)
    confidence: np.ndarray  # [G, n+K+1] the drafter's confidence at j (NaN: unknown)
    union: np.ndarray  # [G, n, K+1] modelled Ū of a pass at i with budget k
    context: np.ndarray  # [G, n] context length L_i
    avail: np.ndarray  # [G, n] drafts a round started at i proposes (A_i <= K)

    @property
    def num_positions(self) -> int:
        return int(self.length.sum())

    @property
    def union_gap(self) -> np.ndarray:
        """[K+1] mean |modelled - recorded| Ū at the recorded round starts, per budget."""
        model = self.union[self.round_gen, self.round_start]
        return np.abs(model - self.union_recorded).mean(axis=0)

    def feasible(self, k_max: int | None = None) -> np.ndarray:
        """bool [G, n, K+1]: budget k drafts k tokens at position i (k <= A_i)."""
        k = self.k_max if k_max is None else k_max
        return np.arange(k + 1)[None, None, :] <= self.avail[:, :, None]

    def truncate(self, l_max: int) -> Counterfactual:
        """The same data with budgets 0..l_max only."""
        if not 0 <= l_max <= self.k_max:
            raise InputError(
                f"{l_max} outside 0..{self.k_max} (the recorded budget)", argument="l_max"
            )
        return replace(
            self,
            k_max=l_max,
            accepted=self.accepted[:, : l_max + 1],
            union_recorded=self.union_recorded[:, : l_max + 1],
            union=self.union[:, :, : l_max + 1],
            avail=np.minimum(self.avail, l_max),
        )

    def select(self, generations: np.ndarray) -> Counterfactual:
        """The generations at indices ``generations`` (recorded rounds follow)."""
        gi = np.asarray(generations, dtype=np.int64)
        new = np.full(len(self.length), -1)
        new[gi] = np.arange(len(gi))
        keep = new[self.round_gen] >= 0
        n = int(self.length[gi].max(initial=0))
        k = self.k_max
        return replace(
            self,
            round_gen=new[self.round_gen[keep]],
            round_start=self.round_start[keep],
            accepted=self.accepted[keep],
            union_recorded=self.union_recorded[keep],
            generation_id=self.generation_id[gi],
            category=self.category[gi],
            length=self.length[gi],
            rate=self.rate[gi],
            q=self.q[gi, : n + k + 1],
            known=self.known[gi, : n + k + 1],
            confidence=self.confidence[gi, : n + k + 1],
            union=self.union[gi, :n],
            context=self.context[gi, :n],
            avail=self.avail[gi, :n],
        )


def _require_counterfactual(log: RoundLog) -> None:
    missing = [c for c in COUNTERFACTUAL if not log.has(c)]
    if missing:
        raise InputError(
            f"{log.name}: missing counterfactual column(s) {', '.join(missing)} "
            "(the Oracle needs rounds recorded with routing and tokens)"
        )


def build_counterfactual(log: RoundLog, *, acceptance: str = "counterfactual") -> Counterfactual:
    """The Oracle's inputs from the generations recorded entirely at the log's largest budget
    (the ``budget`` column, or ``k`` where a log has none)."""
    if acceptance not in ("counterfactual", "geometric"):
        raise InputError(
            f"{acceptance!r} (choose counterfactual or geometric)", argument="acceptance"
        )
    _require_counterfactual(log)
    drafted = np.asarray(log["k"], dtype=np.int64)
    has_budget = "budget" in log.data and not np.isnan(log["budget"]).all()
    bud = (
        np.where(np.isnan(log["budget"]), drafted, log["budget"]).astype(np.int64)
        if has_budget
        else drafted
    )
    k_max = int(bud.max())
    if k_max < 1:
        raise InputError(f"{log.name}: every round has k = 0; the Oracle needs drafted rounds")
    gen_codes, gen_labels = log.codes("generation_id")
    # A generation recorded at L_max: every round at budget K. A log without budgets gives
    # k; there a round with k < K that drafted every token the limit left (k = tokens still
    # to generate - 1, the engine's cap near a generation's end) also counts as budget K.
    at_max = bud == k_max
    if not has_budget:
        order = np.lexsort((np.asarray(log["round"]), gen_codes))
        em = np.asarray(log["emitted"], dtype=np.int64)[order]
        gc = gen_codes[order]
        total = np.bincount(gc, weights=em, minlength=len(gen_labels)).astype(np.int64)
        csum = np.cumsum(em)
        first = np.searchsorted(gc, gc)  # gc is sorted: each group's first row
        before = csum - em - (csum - em)[first]  # tokens emitted before the round
        capped = np.zeros(len(bud), dtype=bool)
        capped[order] = drafted[order] == total[gc] - before - 1
        at_max |= capped & (drafted < k_max)
    ok_gen = np.ones(len(gen_labels), dtype=bool)
    np.logical_and.at(ok_gen, gen_codes, at_max)
    has_max = np.zeros(len(gen_labels), dtype=bool)
    np.logical_or.at(has_max, gen_codes, drafted == k_max)
    ok_gen &= has_max
    rows = np.flatnonzero(ok_gen[gen_codes])
    if rows.size == 0:
        why = (
            ""
            if has_budget
            else "; the log has no budget column, so a round that "
            "drafted fewer than K counts as K's only where the token limit cut it"
        )
        raise InputError(
            f"{log.name}: no generation has every round at the largest budget "
            f"K={k_max} (the Oracle needs generations recorded at L_max{why})"
        )
    sub = log.select(rows)
    gen, labels = sub.codes("generation_id")
    order = np.lexsort((sub["round"], gen))
    if (order != np.arange(len(order))).any():
        sub, gen = sub.select(order), gen[order]
    n_layers, top_k = sub["num_layers"], sub["top_k"]
    if np.isnan(n_layers).any() or np.ptp(n_layers) or np.ptp(top_k):
        raise InputError(
            f"{log.name}: num_layers/top_k missing or not constant in the rounds at K={k_max}"
        )
    n_layers, top_k = int(n_layers[0]), int(top_k[0])
    g_count = len(labels)
    first = np.concatenate([[0], np.flatnonzero(np.diff(gen)) + 1])
    idx_in_gen = np.arange(len(gen)) - np.repeat(first, np.diff(np.append(first, len(gen))))
    bad = sub["round"] != idx_in_gen
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"{log.name}: generation {sub['generation_id'][r]!r} has rounds "
            f"missing or repeated (expected round {idx_in_gen[r]}, found "
            f"{int(sub['round'][r])})"
        )
    m_acc = sub["accepted"]
    d_r = sub["k"].astype(np.int64)  # drafts each round verified (<= K)
    emitted = m_acc + 1
    csum = np.cumsum(emitted)
    gen_end = csum[np.append(first[1:] - 1, len(gen) - 1)]
    gen_base = np.concatenate([[0], gen_end[:-1]])
    length = gen_end - gen_base
    start = csum - emitted - gen_base[gen]  # s_r within its generation
    # reference rows: positions s_r..s_r+M_r of each round
    rvals, roff = sub.lists["routing"]
    row_size = n_layers * top_k
    ids = rvals.reshape(-1, n_layers, top_k)
    row0 = roff[:-1] // row_size
    take = np.repeat(row0, emitted) + (
        np.arange(emitted.sum()) - np.repeat(csum - emitted, emitted)
    )
    ref = ids[take]  # [sum n, L, m], in generation-major position order
    n_exp = int(np.nanmax(sub["num_experts"])) if sub.has("num_experts") else int(ids.max()) + 1
    gpos_end = np.repeat(gen_end, length)
    flat_union = window_union(ref, np.arange(len(ref)), gpos_end, k_max, n_exp)
    n = int(length.max())
    union = np.zeros((g_count, n, k_max + 1))
    gidx = np.repeat(np.arange(g_count), length)
    pidx = np.arange(len(ref)) - np.repeat(gen_base, length)
    union[gidx, pidx] = flat_union
    context = np.zeros((g_count, n))
    context[gidx, pidx] = np.repeat(sub["context_len"] - start, emitted) + pidx
    avail = np.zeros((g_count, n), dtype=np.int16)
    avail[gidx, pidx] = np.repeat(d_r, emitted)
    # a budget above A_i is the pass of A_i
    union = np.take_along_axis(
        union,
        np.minimum(np.arange(k_max + 1)[None, None, :], avail[:, :, None].astype(np.int64)),
        axis=2,
    )
    # recorded per-round counterfactual
    accepted = np.minimum(m_acc[:, None], np.arange(k_max + 1)[None, :])
    union_rec = window_union(ids, row0, roff[1:] // row_size, k_max, n_exp)
    # acceptance probabilities per position
    trials = m_acc + (m_acc < d_r)
    succ = np.bincount(gen, weights=m_acc, minlength=g_count)
    tri = np.bincount(gen, weights=trials, minlength=g_count)
    pooled = succ.sum() / max(tri.sum(), 1)
    rate = np.where(tri > 0, succ / np.maximum(tri, 1), pooled)
    width = n + k_max + 1
    q = np.repeat(rate[:, None], width, axis=1)
    known = np.zeros((g_count, width), dtype=bool)
    conf = np.full((g_count, width), np.nan)
    if acceptance == "counterfactual":
        d_len = np.minimum(m_acc + 1, d_r)  # drafts made from the reference prefix
        rr = np.repeat(np.arange(len(gen)), d_len)
        d = np.arange(d_len.sum()) - np.repeat(np.cumsum(d_len) - d_len, d_len) + 1  # 1-based
        pos = start[rr] + d
        q[gen[rr], pos] = (d <= m_acc[rr]).astype(float)
        known[gen[rr], pos] = True
        if sub.has("draft_confidence"):
            cv, co = sub.lists["draft_confidence"]
            has = (co[1:] - co[:-1])[rr] > 0
            conf[gen[rr][has], pos[has]] = cv[co[:-1][rr][has] + d[has] - 1]
    cat = sub["category"] if "category" in sub.data else np.full(len(gen), None, object)
    return Counterfactual(
        k_max=k_max,
        round_gen=gen,
        round_start=start,
        accepted=accepted,
        union_recorded=union_rec,
        generation_id=labels.astype(object),
        category=cat[first],
        length=length,
        rate=rate,
        q=q,
        known=known,
        confidence=conf,
        union=union,
        context=context,
        avail=avail,
    )
