"""The invariants of a round log (:mod:`specmoe.formats.roundlog`), checked on every read.

Legend: ``R`` rounds, ``P`` pass size (k + 1), ``L`` MoE layers, ``m`` slots (``top_k``), ``N``
experts per layer. Each failure is one ``InputError`` line naming the part file, the row in it
and the column: ``FILE: row N: COLUMN: what (count; first: generation G, round r)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from specmoe.errors import InputError

if TYPE_CHECKING:
    from specmoe.formats.roundlog import RoundLog

__all__ = ["MAX_MS", "validate"]

MAX_MS = 1e6  # a pass or a draft of more than 1000 s is no measurement


def _first_bad(log: RoundLog, bad: np.ndarray, column: str, what: str) -> None:
    """One line for the rows where ``bad`` holds: ``FILE: row N: COLUMN: WHAT (...)``."""
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"{log.where(r)}: {column}: {what} ({int(bad.sum())} round(s); first: generation "
            f"{log['generation_id'][r]!r}, round {int(log['round'][r])})"
        )


def _outside(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Not a finite value in [lo, hi] (NaN, infinities and huge values included)."""
    with np.errstate(invalid="ignore"):
        return ~(np.isfinite(v) & (v >= lo) & (v <= hi))


def validate(log: RoundLog) -> None:
    """Check the invariants of every round; raise ``InputError`` (one line naming the file,
    the row and the column) on the first that fails."""
    from specmoe.formats.roundlog import leading_match

    d = log.data
    k = d["k"]
    _first_bad(log, k < 0, "k", "k < 0")
    _first_bad(log, d["pass_size"] != k + 1, "pass_size", "pass_size != k + 1")
    if "budget" in d:
        _first_bad(log, d["budget"] < k, "budget", "budget < k")  # NaN (no budget): False
    _first_bad(log, (d["accepted"] < 0) | (d["accepted"] > k), "accepted", "accepted outside 0..k")
    _first_bad(log, d["emitted"] != d["accepted"] + 1, "emitted", "emitted != accepted + 1")
    _first_bad(
        log,
        _outside(d["t_verify_ms"], 1e-300, MAX_MS),
        "t_verify_ms",
        f"t_verify_ms not positive, finite and at most {MAX_MS:g}",
    )
    if "t_draft_ms" in d:
        td = d["t_draft_ms"]
        _first_bad(
            log,
            ~np.isnan(td) & _outside(td, 0.0, MAX_MS),
            "t_draft_ms",
            f"t_draft_ms not in [0, {MAX_MS:g}]",
        )
    _first_bad(log, d["context_len"] < 0, "context_len", "context_len < 0")
    for c in ("acceptance", "kv_usage"):
        if c in d:
            _first_bad(log, ~np.isnan(d[c]) & _outside(d[c], 0.0, 1.0), c, f"{c} not in [0, 1]")
    _check_u_e(log)
    for c in ("run_id", "prompt_id", "generation_id"):
        _first_bad(log, np.array([x is None or x == "" for x in d[c]]), c, f"an empty {c}")
    _check_keys(log)
    if "draft_tokens" in log.lists and "target_tokens" in log.lists:
        dv, do = log.lists["draft_tokens"]
        tv, to = log.lists["target_tokens"]
        has = np.diff(to) > 0
        _first_bad(log, has & (np.diff(do) != k), "draft_tokens", "len(draft_tokens) != k")
        _first_bad(
            log, has & (np.diff(to) != k + 1), "target_tokens", "len(target_tokens) != k + 1"
        )
        lm = leading_match(dv, do, tv, to)
        _first_bad(
            log,
            has & (lm != d["accepted"]),
            "accepted",
            "accepted != leading match of draft_tokens and target_tokens",
        )
    if "routing" in log.lists and "num_layers" in d and "top_k" in d:
        _check_routing(log)


def _check_u_e(log: RoundLog) -> None:
    """Ū_r in [0, min(P·m, N)] and E_max in 1..P (bounds known from the columns present)."""
    d = log.data
    p = d["pass_size"].astype(np.float64)
    m = d.get("top_k", np.full(len(p), np.nan))
    n = d.get("num_experts", np.full(len(p), np.nan))
    hi = np.fmin(np.where(np.isnan(m), np.inf, p * m), np.where(np.isnan(n), np.inf, n))
    hi = np.where(np.isinf(hi), MAX_MS, hi)  # neither known: only a plausibility cap
    u = d["u_mean"]
    with np.errstate(invalid="ignore"):
        bad = ~(np.isfinite(u) & (u >= 0) & (u <= hi + 1e-9))
    _first_bad(log, bad, "u_mean", "u_mean not finite in [0, min(pass_size·top_k, N)]")
    if "e_max" in d:
        e = d["e_max"]
        with np.errstate(invalid="ignore"):
            bad = ~np.isnan(e) & ~((e >= 1) & (e <= p))
        _first_bad(log, bad, "e_max", "e_max not in 1..pass_size")


def _check_keys(log: RoundLog) -> None:
    """(generation, round) unique; each generation's rounds 0..R-1; an ended generation has
    the rounds and the tokens its part records (else it was truncated)."""
    gen, names = log.codes("generation_id")
    rnd = log["round"]
    order = np.lexsort((np.arange(len(rnd)), rnd, gen))  # by generation, round, then row
    g, r = gen[order], rnd[order]
    dup = np.zeros(len(rnd), bool)
    dup[order[1:]] = (g[1:] == g[:-1]) & (r[1:] == r[:-1])
    if dup.any():
        first = int(np.flatnonzero(dup)[0])
        j = int(np.flatnonzero(order == first)[0])
        raise InputError(
            f"{log.where(first)}: round: duplicate key (generation "
            f"{log['generation_id'][first]!r}, round {int(rnd[first])}), first in "
            f"{log.where(int(order[j - 1]))} ({int(dup.sum())} duplicate round(s): a log "
            "read twice?)"
        )
    start = np.r_[True, g[1:] != g[:-1]]
    rank = np.arange(len(g)) - np.maximum.accumulate(np.where(start, np.arange(len(g)), 0))
    gap = np.zeros(len(rnd), bool)
    gap[order] = r != rank
    _first_bad(log, gap, "round", "rounds of the generation not 0, 1, ... (a missing round)")
    if not log.ended:
        return
    counts = np.bincount(gen, minlength=len(names))
    tokens = np.bincount(gen, weights=log["emitted"], minlength=len(names))
    for i, name in enumerate(names):
        info = log.ended.get(str(name))
        if info is None:
            continue
        for key, have in (("rounds", int(counts[i])), ("tokens", int(tokens[i]))):
            want = info.get(key)
            if want is not None and int(want) != have:
                raise InputError(
                    f"{info.get('file', log.name)}: generation {str(name)!r}: "
                    f"{'round' if key == 'rounds' else 'emitted'}: {have} {key} read, its part "
                    f"records {int(want)} (a truncated generation)"
                )


def _check_routing(log: RoundLog) -> None:
    """Routing of length P·L·m, ids in [0, N) (N where known), no id twice in a token."""
    d = log.data
    values, off = log.lists["routing"]
    n = np.diff(off)
    want = d["pass_size"] * np.nan_to_num(d["num_layers"]) * np.nan_to_num(d["top_k"])
    _first_bad(log, (n > 0) & (n != want), "routing", "len(routing) != pass_size·num_layers·top_k")
    if not len(values):
        return
    row = np.repeat(np.arange(len(n)), n)  # [values] the row of each id
    v = values.astype(np.int64)
    cap = d.get("num_experts", np.full(len(n), np.nan))[row]
    with np.errstate(invalid="ignore"):
        bad_id = (v < 0) | (~np.isnan(cap) & (v >= cap))
    if bad_id.any():
        bad = np.zeros(len(n), bool)
        bad[row[bad_id]] = True
        r = int(np.flatnonzero(bad)[0])
        hi = (
            "N"
            if np.isnan(d.get("num_experts", [np.nan] * len(n))[r])
            else f"{d['num_experts'][r]:g}"
        )
        _first_bad(log, bad, "routing", f"an expert id outside [0, {hi})")
    m_row = np.nan_to_num(d["top_k"]).astype(np.int64)
    for m in np.unique(m_row[n > 0]):
        if m < 2:
            continue
        sel = m_row[row] == m
        slots = np.sort(v[sel].reshape(-1, m), axis=1)  # [tokens·layers, m]
        rep = (np.diff(slots, axis=1) == 0).any(axis=1)
        if rep.any():
            bad = np.zeros(len(n), bool)
            bad[row[sel][::m][rep]] = True
            _first_bad(log, bad, "routing", "an expert id repeated among a token's top_k slots")
