"""Routing inertia of rejected drafts (paper 003 Section 6.1, Section 9.4 and Appendix H).

Legend for shapes: ``P`` pairs, ``G`` clusters (prompt documents), ``S`` steps 1..max_step,
``J`` anchor distances 1..max_anchor, ``C`` the three kinds of pair, ``L`` MoE layers, ``m``
slots, ``B`` bootstrap resamples, ``V`` the values L·m + 1 of a pair's shared-slot count.

A verification pass of a round verifies positions 0..k: position 0 is the round's current token,
position j its draft j (the round log's ``routing`` [P, L, m]). For a draft position j and a
step s <= j, the pair's overlap at layer l is the share of top-m experts it shares with position
j - s (paper 003 Section 6: o_l = |S_{l,j} ∩ S_{l,j-s}| / m), and its overlap is the mean over
layers. With M the round's accepted count, draft j is

* **accepted** if j <= M (then every position j - s..j - 1 is accepted or the current token),
* a **first rejection** if j = M + 1: its predecessor is accepted (or is the current token), the
  deconfounded comparison of Appendix H.2, which holds the predecessor accepted in both this and
  the accepted population,
* in the **cascade** if j > M + 1: its predecessor was itself rejected (Appendix H.4).

The effect of a rejected population against the accepted one is Δ = mean_accepted -
mean_rejected (negative: the rejected drafts keep more of their predecessor's experts, the
"routing inertia"; paper 003 H.4 counts its layers with |Δ| > 0.05, "all in the negative
direction"), Cohen's d of accepted against rejected (same sign), and the overlap of the two
distributions (:mod:`specmoe.analysis.effects`: 2Φ(-|d|/2), the paper's "about 85%", and the
empirical overlap of the two observed discrete distributions). The anchor overlap (Appendix H.6,
Figure 9) is the overlap of draft j with position 0, by j. Intervals are a percentile bootstrap
over prompt documents, each resampled with all its pairs (clustered, as the paper's per-prompt
sampling). The early-rejection question of Section 9.4 is answered by the AUC of overlap alone as
a score for "first rejection" against "accepted": in sample (Mann-Whitney), and out of sample: a
threshold and direction fitted (Youden's J) on a random half of the prompts, its AUC (TPR + TNR)
/ 2 on the other half, both ways, over repeated halvings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specmoe.analysis.effects import (
    Moments,
    auc,
    best_threshold,
    cluster_weights,
    cohens_d,
    empirical_overlap,
    overlap_from_d,
    percentile_interval,
    threshold_auc,
)
from specmoe.errors import InputError
from specmoe.formats.roundlog import RoundLog

__all__ = [
    "KINDS",
    "OverlapPairs",
    "category_of",
    "inertia_analysis",
    "overlap_pairs",
    "pairs_from_log",
    "shared_experts",
]

KINDS = ("accepted", "first_rejection", "cascade")
ACCEPTED, FIRST, CASCADE = 0, 1, 2


def category_of(prompt_id: str) -> str:
    """The prompt's category: the top-level package (first folder) of a stdlib document's path,
    ``(module)`` for a top-level module file (``encodings/cp1026.py`` -> ``encodings``)."""
    parts = str(prompt_id).replace("\\", "/").split("/")
    return parts[0] if len(parts) > 1 else "(module)"


def shared_experts(a: np.ndarray, b: np.ndarray, num_experts: int) -> np.ndarray:
    """|S_a ∩ S_b| per row and layer: a, b [P, L, m] expert ids -> [P, L] (bitsets)."""
    from specmoe.oracle.counterfactual import expert_bits

    ba = expert_bits(np.asarray(a), num_experts)
    bb = expert_bits(np.asarray(b), num_experts)
    return np.bitwise_count(ba & bb).sum(axis=-1).astype(np.int64)


@dataclass(frozen=True, eq=False)
class OverlapPairs:
    """Pairs (draft j, position j - s) of verified positions, with what each is."""

    shared: np.ndarray  # [P, L] experts the pair shares per layer (0..m)
    step: np.ndarray  # [P] s
    position: np.ndarray  # [P] j (1..k)
    kind: np.ndarray  # [P] 0 accepted, 1 first rejection, 2 cascade
    cluster: np.ndarray  # [P] index into ``clusters``
    clusters: np.ndarray  # [G] prompt ids
    top_k: int
    num_experts: int

    @property
    def overlap(self) -> np.ndarray:
        """[P] the layer-mean overlap of each pair."""
        return self.shared.mean(axis=1) / self.top_k

    def select(self, mask: np.ndarray) -> OverlapPairs:
        return OverlapPairs(
            self.shared[mask],
            self.step[mask],
            self.position[mask],
            self.kind[mask],
            self.cluster[mask],
            self.clusters,
            self.top_k,
            self.num_experts,
        )


def overlap_pairs(
    ids: np.ndarray,
    round_row: np.ndarray,
    k: np.ndarray,
    accepted: np.ndarray,
    cluster: np.ndarray,
    clusters: np.ndarray,
    *,
    num_experts: int,
    max_step: int = 4,
    anchor: bool = False,
) -> OverlapPairs:
    """Every pair of a round's draft j with position j - s, s = 1..min(j, max_step); with
    ``anchor`` the pairs (j, 0) for j = 1..k instead (s = j).

    ids [T, L, m]: the verified positions of all rounds, round r's positions 0..k_r at rows
    round_row[r]..round_row[r] + k_r; k, accepted, cluster [R].
    """
    k = np.asarray(k, dtype=np.int64)
    acc = np.asarray(accepted, dtype=np.int64)
    if max_step < 1:
        raise InputError(f"must be >= 1, got {max_step}", argument="max_step")
    rr = np.repeat(np.arange(len(k)), np.maximum(k, 0))
    j = np.arange(len(rr)) - np.repeat(np.cumsum(np.maximum(k, 0)) - np.maximum(k, 0), k) + 1
    if anchor:
        rs, js, ss = rr, j, j
    else:
        per = np.minimum(j, max_step)
        rs = np.repeat(rr, per)
        js = np.repeat(j, per)
        ss = np.arange(len(rs)) - np.repeat(np.cumsum(per) - per, per) + 1
    base = np.asarray(round_row, dtype=np.int64)[rs]
    shared = shared_experts(ids[base + js], ids[base + js - ss], num_experts)
    m_r = acc[rs]
    kind = np.where(js <= m_r, ACCEPTED, np.where(js == m_r + 1, FIRST, CASCADE)).astype(np.int8)
    return OverlapPairs(
        shared=shared,
        step=ss,
        position=js,
        kind=kind,
        cluster=np.asarray(cluster, dtype=np.int64)[rs],
        clusters=np.asarray(clusters, dtype=object),
        top_k=int(ids.shape[2]),
        num_experts=int(num_experts),
    )


def _rounds(log: RoundLog) -> tuple[np.ndarray, np.ndarray, int]:
    """(ids [T, L, m], first row of each round [R], N) of a log with routing."""
    if not log.has("routing"):
        raise InputError(f"{log.name}: no routing column (record rounds with routing)")
    n_layers, top_k = log["num_layers"], log["top_k"]
    if np.isnan(n_layers).any() or np.ptp(n_layers) or np.ptp(top_k):
        raise InputError(f"{log.name}: num_layers/top_k missing or not constant")
    L, m = int(n_layers[0]), int(top_k[0])
    values, off = log.lists["routing"]
    if (np.diff(off) != log["pass_size"] * L * m).any():
        r = int(np.flatnonzero(np.diff(off) != log["pass_size"] * L * m)[0])
        raise InputError(f"{log.where(r)}: routing has no pass_size x {L} x {m} ids")
    ids = values.reshape(-1, L, m)
    n = int(np.nanmax(log["num_experts"])) if log.has("num_experts") else int(ids.max()) + 1
    return ids, off[:-1] // (L * m), n


def pairs_from_log(
    log: RoundLog, *, max_step: int = 4, anchor: bool = False, clusters: np.ndarray | None = None
) -> OverlapPairs:
    """:func:`overlap_pairs` of every drafted round (k >= 1) of ``log``, clustered by prompt."""
    ids, row0, n = _rounds(log)
    prompts = np.array([str(p) for p in log["prompt_id"]], dtype=object)
    labels = np.unique(prompts.astype(str)) if clusters is None else np.asarray(clusters, str)
    code = np.searchsorted(labels, prompts.astype(str))
    keep = log["k"] >= 1
    return overlap_pairs(
        ids,
        row0[keep],
        log["k"][keep],
        log["accepted"][keep],
        code[keep],
        labels.astype(object),
        num_experts=n,
        max_step=max_step,
        anchor=anchor,
    )


def baselines(log: RoundLog) -> dict:
    """The uniform overlap m/N and the independence baseline Σ_e p_{l,e}² / m (paper 003
    Section 6, :func:`specmoe.routing.overlap.independent_overlap`), from the popularity of the
    rounds' current tokens (position 0: the text the target emitted)."""
    from specmoe.routing.overlap import independent_overlap
    from specmoe.routing.stats import expert_popularity

    ids, row0, n = _rounds(log)
    pop = expert_popularity(ids[row0], n)
    ind = independent_overlap(pop, ids.shape[2])
    return {
        "uniform": ids.shape[2] / n,
        "independence": float(np.mean(ind)),
        "independence_layers": np.asarray(ind).tolist(),
    }


# ---------------------------------------------------------------------------------------------
# the statistics


def _group_sums(pairs: OverlapPairs, key: np.ndarray, n_keys: int) -> dict[str, np.ndarray]:
    """Per cluster, key and kind: n, Σx, Σx², Σx_l, histogram of the shared count (sum over
    layers): [G, K, C], [G, K, C, L], [G, K, C, V]."""
    g, c = len(pairs.clusters), len(KINDS)
    n_layers = pairs.shared.shape[1]
    v = n_layers * pairs.top_k + 1
    x = pairs.overlap
    flat = (pairs.cluster * n_keys + key) * c + pairs.kind
    size = g * n_keys * c
    n = np.bincount(flat, minlength=size).reshape(g, n_keys, c).astype(np.float64)
    s1 = np.bincount(flat, weights=x, minlength=size).reshape(g, n_keys, c)
    s2 = np.bincount(flat, weights=x * x, minlength=size).reshape(g, n_keys, c)
    lay = np.stack(
        [
            np.bincount(flat, weights=pairs.shared[:, i] / pairs.top_k, minlength=size)
            for i in range(n_layers)
        ],
        axis=-1,
    ).reshape(g, n_keys, c, n_layers)
    lay2 = np.stack(
        [
            np.bincount(flat, weights=(pairs.shared[:, i] / pairs.top_k) ** 2, minlength=size)
            for i in range(n_layers)
        ],
        axis=-1,
    ).reshape(g, n_keys, c, n_layers)
    hist = np.bincount(flat * v + pairs.shared.sum(axis=1), minlength=size * v).reshape(
        g, n_keys, c, v
    )
    return {"n": n, "s1": s1, "s2": s2, "lay": lay, "lay2": lay2, "hist": hist.astype(float)}


def _stats(sums: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Statistics from (weighted) sums with the cluster axis summed away: [..., K, C, ...]."""
    n, s1, s2 = sums["n"], sums["s1"], sums["s2"]
    mom = Moments(n, s1, s2)
    lay = Moments(n[..., None], sums["lay"], sums["lay2"])
    acc = Moments(n[..., :1], s1[..., :1], s2[..., :1])
    acc_l = Moments(n[..., :1, None], sums["lay"][..., :1, :], sums["lay2"][..., :1, :])
    d = cohens_d(acc, mom)  # [..., K, C]: accepted against each kind (C=0: 0)
    hist = sums["hist"]
    return {
        "mean": mom.mean,
        "sd": np.sqrt(mom.var),
        "layer_mean": lay.mean,
        "delta": acc.mean - mom.mean,
        "layer_delta": acc_l.mean - lay.mean,
        "layer_d": cohens_d(acc_l, lay),
        "d": d,
        "overlap_normal": overlap_from_d(d),
        "overlap_empirical": empirical_overlap(hist[..., :1, :], hist),
    }


def _boot(sums: dict[str, np.ndarray], w: np.ndarray) -> dict[str, np.ndarray]:
    """The statistics of every resample: weights w [B, G] -> arrays [B, ...]."""
    return _stats({name: np.tensordot(w, v, axes=(1, 0)) for name, v in sums.items()})


def _point(sums: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return _stats({name: v.sum(axis=0) for name, v in sums.items()})


@dataclass(frozen=True)
class Classifier:
    """Overlap alone as a score for "first rejection" (positive) against "accepted"."""

    step: int
    positives: int
    negatives: int
    auc: float  # in sample, P(rejected overlap > accepted) + ties/2
    auc_best_direction: float  # max(auc, 1 - auc)
    threshold: float  # fitted on all pairs (Youden's J)
    direction: int  # +1: high overlap predicts a rejection
    threshold_auc_in_sample: float  # (TPR + TNR)/2 of that rule, in sample
    oos_threshold_auc: float  # mean over folds: rule fitted on one half of the prompts
    oos_threshold_auc_range: tuple[float, float]
    oos_auc: float  # the continuous score on the held-out half, direction from the other
    folds: int


def classifier(
    pairs: OverlapPairs, step: int, *, splits: int = 20, seed: int = 0
) -> Classifier | None:
    """The best threshold classifier of Section 9.4's early-rejection question at one step."""
    sel = (pairs.step == step) & (pairs.kind != CASCADE)
    x, y, cl = pairs.overlap[sel], pairs.kind[sel] == FIRST, pairs.cluster[sel]
    if not y.any() or y.all():
        return None
    a = auc(x[y], x[~y])
    t, s, _ = best_threshold(x[y], x[~y])
    in_s = threshold_auc(x[y], x[~y], t, s)
    present = np.unique(cl)
    rng = np.random.default_rng(seed)
    thr, cont = [], []
    if len(present) >= 2:
        for _ in range(splits):
            perm = rng.permutation(present)
            half = set(perm[: len(perm) // 2].tolist())
            in_a = np.array([c in half for c in cl])
            for train, test in ((in_a, ~in_a), (~in_a, in_a)):
                ytr, yte = y[train], y[test]
                if not (ytr.any() and (~ytr).any() and yte.any() and (~yte).any()):
                    continue
                tt, ss, _ = best_threshold(x[train][ytr], x[train][~ytr])
                thr.append(threshold_auc(x[test][yte], x[test][~yte], tt, ss))
                sign = 1 if auc(x[train][ytr], x[train][~ytr]) >= 0.5 else -1
                cont.append(auc(sign * x[test][yte], sign * x[test][~yte]))
    nan = float("nan")
    return Classifier(
        step=step,
        positives=int(y.sum()),
        negatives=int((~y).sum()),
        auc=a,
        auc_best_direction=max(a, 1 - a),
        threshold=t,
        direction=s,
        threshold_auc_in_sample=in_s,
        oos_threshold_auc=float(np.mean(thr)) if thr else nan,
        oos_threshold_auc_range=(float(np.min(thr)), float(np.max(thr))) if thr else (nan, nan),
        oos_auc=float(np.mean(cont)) if cont else nan,
        folds=len(thr),
    )


def _summary(
    pairs: OverlapPairs, key: np.ndarray, keys: list[int], w: np.ndarray | None, confidence: float
) -> list[dict]:
    """One record per key (a step or an anchor distance): per kind and per comparison."""
    sums = _group_sums(pairs, key, len(keys))
    pt = _point(sums)
    bt = _boot(sums, w) if w is not None else None
    lo, hi = {}, {}
    if bt is not None:
        for name, v in bt.items():
            lo[name], hi[name] = percentile_interval(v, confidence)
    n_tot = sums["n"].sum(axis=0)

    def iv(name, *idx):
        if bt is None:
            return None
        return [float(lo[name][idx]), float(hi[name][idx])]

    out = []
    for i, kv in enumerate(keys):
        kinds = {}
        for c, kind in enumerate(KINDS):
            n = int(n_tot[i, c])
            kinds[kind] = {
                "n": n,
                "mean": float(pt["mean"][i, c]) if n else None,
                "sd": float(pt["sd"][i, c]) if n > 1 else None,
                "sem": float(pt["sd"][i, c] / np.sqrt(n)) if n > 1 else None,
                "interval": iv("mean", i, c) if n else None,
                "layers": pt["layer_mean"][i, c].tolist() if n else None,
                "prompts": int((sums["n"][:, i, c] > 0).sum()),
            }
        comps = {}
        for c, kind in list(enumerate(KINDS))[1:]:
            if not (n_tot[i, 0] and n_tot[i, c]):
                comps[kind] = None
                continue
            ld = pt["layer_delta"][i, c]
            comps[kind] = {
                "delta": float(pt["delta"][i, c]),
                "delta_interval": iv("delta", i, c),
                "d": float(pt["d"][i, c]),
                "d_interval": iv("d", i, c),
                "overlap_normal": float(pt["overlap_normal"][i, c]),
                "overlap_normal_interval": iv("overlap_normal", i, c),
                "overlap_empirical": float(pt["overlap_empirical"][i, c]),
                "overlap_empirical_interval": iv("overlap_empirical", i, c),
                "layer_delta": ld.tolist(),
                "layer_delta_interval": None
                if bt is None
                else [lo["layer_delta"][i, c].tolist(), hi["layer_delta"][i, c].tolist()],
                "layer_d": pt["layer_d"][i, c].tolist(),
                "layers_abs_delta_over_0.05": int((np.abs(ld) > 0.05).sum()),
                "layers_negative": int((ld < 0).sum()),
                "layers_positive": int((ld > 0).sum()),
            }
        out.append({"kinds": kinds, "vs_accepted": comps, "_key": kv})
    return out


def inertia_analysis(
    pairs: OverlapPairs,
    anchor: OverlapPairs | None = None,
    *,
    max_step: int = 4,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    splits: int = 20,
    categories: dict[str, str] | None = None,
) -> dict:
    """Steps 1..max_step (per kind, the comparisons with the accepted drafts, per layer),
    the anchor overlap by draft index, the classifier at each step and the held-out slices by
    prompt category (``categories``: prompt id -> category; default :func:`category_of`)."""
    if n_boot < 0:
        raise InputError(f"must be >= 0, got {n_boot}", argument="n_boot")
    if not 0 < confidence < 1:
        raise InputError(f"must be in (0, 1), got {confidence}", argument="confidence")
    if not len(pairs.step):
        raise InputError("no drafted rounds (k >= 1) with routing to compare", argument="pairs")
    g = len(pairs.clusters)
    w = cluster_weights(g, n_boot, seed) if n_boot else None
    steps = list(range(1, max_step + 1))
    sel = pairs.step <= max_step
    p = pairs.select(sel)
    by_step = _summary(p, p.step - 1, steps, w, confidence)
    for rec, s in zip(by_step, steps):
        rec["step"] = s
        del rec["_key"]
    out = {
        "prompts": g,
        "pairs": int(sel.sum()),
        "steps": by_step,
        "classifier": [
            None if c is None else c.__dict__
            for c in (classifier(p, s, splits=splits, seed=seed) for s in steps)
        ],
    }
    if anchor is not None and len(anchor.step):
        js = list(range(1, int(anchor.position.max()) + 1))
        recs = _summary(anchor, anchor.position - 1, js, w, confidence)
        for rec, j in zip(recs, js):
            rec["position"] = j
            del rec["_key"]
        out["anchor"] = recs
    cat_of = categories or {str(c): category_of(str(c)) for c in pairs.clusters}
    cats = sorted({cat_of[str(c)] for c in pairs.clusters})
    slices = []
    for cat in cats:
        members = np.array([cat_of[str(c)] == cat for c in pairs.clusters])
        keep = members[p.cluster]
        if not keep.any():
            continue
        sub = p.select(keep)
        # re-index the clusters of the slice so its bootstrap resamples its own prompts
        idx = np.flatnonzero(members)
        remap = np.full(g, -1)
        remap[idx] = np.arange(len(idx))
        sub = OverlapPairs(
            sub.shared,
            sub.step,
            sub.position,
            sub.kind,
            remap[sub.cluster],
            pairs.clusters[idx],
            sub.top_k,
            sub.num_experts,
        )
        ws = cluster_weights(len(idx), n_boot, seed) if n_boot and len(idx) >= 2 else None
        recs = _summary(sub, sub.step - 1, steps, ws, confidence)
        slices.append(
            {
                "category": cat,
                "prompts": len(idx),
                "prompt_ids": [str(x) for x in pairs.clusters[idx]],
                "steps": [
                    {
                        "step": s,
                        "n_accepted": r["kinds"]["accepted"]["n"],
                        "n_first_rejection": r["kinds"]["first_rejection"]["n"],
                        "accepted": r["kinds"]["accepted"]["mean"],
                        "first_rejection": r["kinds"]["first_rejection"]["mean"],
                        **(
                            {}
                            if r["vs_accepted"]["first_rejection"] is None
                            else {
                                k: r["vs_accepted"]["first_rejection"][k]
                                for k in ("delta", "delta_interval", "d", "overlap_normal")
                            }
                        ),
                    }
                    for s, r in zip(steps, recs)
                ],
            }
        )
    out["slices"] = slices
    return out
