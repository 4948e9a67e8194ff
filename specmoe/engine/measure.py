"""Verify-time measurements of whole-model passes (paper 002 Section 4): τ_p(n) with
deduplication off and on, the saving, the measured crossover, and verify-argmax agreement.

Legend for shapes: ``n`` tokens of a pass, ``P`` prompts, ``R`` repetitions.

For each prompt of d tokens the cache is filled with its first d - 1 tokens (the prefill), the
target's greedy continuation c_1..c_8 is decoded once (one-token passes, then cropped away), and
each pass of n tokens verifies ``[prompt[-1], c_1..c_{n-1}]`` at context depth d - 1: the pass
a speculative round runs when all its drafts are right. Each repetition times every n with
every kernel setting, the settings' order alternating between repetitions (A/B, B/A), and the
cache is cropped back after each pass. The first ``warmup`` repetitions are not recorded.

The verify-argmax agreement (paper 002 Appendix E) compares the target's argmax rows of the same
pass under the settings, over n = 2..9 (a one-token pass runs the same kernel under both), in
the first recorded repetition of each prompt: "rows agreeing / rows".

The saving S(n) = median τ_slot(n) - median τ_dedup(n) (positive: dedup faster), with a 95%
percentile bootstrap interval that resamples each setting's passes (prompts and repetitions)
with replacement; the measured crossover is the smallest n from which the point estimate stays
positive up to the largest n measured (paper 002 Section 2), None where there is none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from specmoe.engine.speculative import Engine, crop_cache, new_cache
from specmoe.engine.switch import KernelPolicy

__all__ = ["measured_crossover", "summarise_verify", "verify_passes"]


def verify_passes(
    engine: Engine,
    prompts: Sequence[tuple[str, Sequence[int]]],
    *,
    settings: Sequence[str] = ("per_slot", "dedup"),
    n_values: Sequence[int] = tuple(range(1, 10)),
    repeats: int = 3,
    warmup: int = 1,
    crossover: int | None = None,
    progress: Any = None,
    on_prompt: Any = None,
    prime: bool = False,
    train: int = 0,
) -> dict[str, Any]:
    """Time passes of n tokens under each kernel setting; returns records and agreement.

    ``prime``: each timed pass follows an untimed pass of the same tokens, so that it is a
    pass after one of its own size, as the passes of speculative rounds of one draft length
    are (llama.cpp reuses the graph of a pass of the same shape; without it every pass here
    but the first n = 1 follows a pass of another size).

    ``train`` (>= 2; 0: off): each timed pass is instead the median of the last ``train - 1``
    of ``train`` passes of n tokens in a row at the same cache length, each on the window one
    token after the one before along the prompt's last token and its greedy continuation (the
    first window the one timed otherwise): passes after passes of their own size on other
    tokens, as the verification passes of speculative rounds at one draft length are, and not
    the second after a pass of another size, which can cost twice a settled pass
    (results/cpu/llamacpp/round-passes/). A record's argmax and routing statistics are those
    of the train's first, untimed pass, on the window timed without ``train``.

    ``prompts``: (prompt id, tokens) pairs, every prompt at least 2 tokens; ``on_prompt(id)``
    is called before each (e.g. to point forced routing at the prompt's document). Returns
    ``{"records": [...], "agreement": {"rows": R, "agree": A, "near_ties": [...]}}`` where a
    record holds prompt_id, depth (prompt tokens), context_len (= depth - 1, the cache before
    the pass), setting, kernel, n, t_ms (the engine's clock), wall_ms,
    repetition, t_ms, u_mean, e_max.
    """
    from specmoe.formats.roundlog import pass_stats

    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    if isinstance(train, bool) or not isinstance(train, int) or train < 0 or train == 1:
        raise ValueError(f"train must be 0 (off) or an integer >= 2, got {train!r}")
    if train and prime:
        raise ValueError("train: a train's passes already follow passes of their size")
    max_n = max(n_values)
    span = max(train, 1) - 1  # a train's windows run this many tokens past its first
    records: list[dict[str, Any]] = []
    agree = rows = 0
    near: list[dict[str, Any]] = []
    saved = engine.policy
    try:
        for pid, tokens in prompts:
            tokens = [int(t) for t in tokens]
            if len(tokens) < 2:
                raise ValueError(f"prompt {pid!r}: needs at least 2 tokens")
            if on_prompt is not None:
                on_prompt(pid)
            kv = new_cache(engine.model)
            engine.prefill(kv, tokens[:-1])
            depth, ctx = len(tokens), len(tokens) - 1  # prompt tokens; cached before a pass
            cont, cur = [], tokens[-1]
            for _ in range(max_n - 1 + span):  # the greedy continuation
                cur = engine.forward(kv, [cur]).tokens[0]
                cont.append(cur)
            crop_cache(kv, ctx)
            for rep in range(warmup + repeats):
                order = list(settings) if rep % 2 == 0 else list(settings)[::-1]
                for n in n_values:
                    argmax: dict[str, Any] = {}
                    for s in order:
                        engine.set_policy(
                            KernelPolicy(
                                s, crossover=crossover, max_pass=max(saved.max_pass, max_n)
                            )
                        )
                        window = [tokens[-1], *cont[: n - 1]]
                        if prime:
                            engine.forward(kv, window)
                            crop_cache(kv, ctx)
                        v = engine.forward(kv, window)
                        crop_cache(kv, ctx)
                        if train:
                            seq = [tokens[-1], *cont]
                            runs = []
                            for i in range(1, train):
                                runs.append(engine.forward(kv, seq[i : i + n]))
                                crop_cache(kv, ctx)
                            v = dataclasses.replace(
                                v,
                                t_ms=float(np.median([x.t_ms for x in runs])),
                                wall_ms=float(np.median([x.wall_ms for x in runs])),
                            )
                        argmax[s] = v
                        if rep >= warmup:
                            u, e = pass_stats(v.routing, engine.num_experts)
                            records.append(
                                {
                                    "prompt_id": pid,
                                    "depth": depth,
                                    "context_len": ctx,
                                    "setting": s,
                                    "kernel": v.kernel,
                                    "n": n,
                                    "repetition": rep - warmup,
                                    "t_ms": v.t_ms,
                                    "wall_ms": v.wall_ms,
                                    "u_mean": float(u),
                                    "e_max": int(e),
                                }
                            )
                        if progress is not None:
                            progress.update(1)
                    if rep == warmup and n >= 2 and len(argmax) >= 2:
                        ref, *others = [argmax[s] for s in settings]
                        for o in others:
                            same = np.asarray(ref.tokens) == np.asarray(o.tokens)
                            rows += len(same)
                            agree += int(same.sum())
                            for j in np.flatnonzero(~same):
                                near.append(
                                    {
                                        "prompt_id": pid,
                                        "n": n,
                                        "row": int(j),
                                        "margin": float(min(ref.margin[j], o.margin[j])),
                                    }
                                )
    finally:
        engine.set_policy(saved)
    return {"records": records, "agreement": {"rows": rows, "agree": agree, "disagreements": near}}


def _bootstrap_median_diff(
    a: np.ndarray, b: np.ndarray, *, rng: np.random.Generator, draws: int = 2000
) -> tuple[float, float]:
    ia = rng.integers(0, len(a), size=(draws, len(a)))
    ib = rng.integers(0, len(b), size=(draws, len(b)))
    d = np.median(a[ia], axis=1) - np.median(b[ib], axis=1)
    lo, hi = np.percentile(d, [2.5, 97.5])
    return float(lo), float(hi)


def measured_crossover(saving: dict[int, float]) -> int | None:
    """The smallest n (>= 2) from which S(n) > 0 for every larger n measured; None if none:
    :func:`specmoe.cost.step.crossover` on the measured savings ``{n: S(n)}``."""
    from specmoe.cost.step import crossover

    return crossover(list(saving.values()), list(saving.keys()))


def summarise_verify(records: Sequence[dict[str, Any]], *, seed: int = 0) -> dict[str, Any]:
    """τ_p(n) per depth and setting (median, quartiles, count, mean Ū), S(n) with its 95%
    bootstrap interval, and the measured crossover."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    depths = sorted({r["depth"] for r in records})
    settings = sorted({r["setting"] for r in records})
    for d in depths:
        table: dict[str, Any] = {}
        times: dict[tuple[str, int], np.ndarray] = {}
        for s in settings:
            rows = []
            for n in sorted({r["n"] for r in records if r["depth"] == d and r["setting"] == s}):
                sel = [r for r in records if r["depth"] == d and r["setting"] == s and r["n"] == n]
                t = np.array([r["t_ms"] for r in sel])
                times[(s, n)] = t
                q1, med, q3 = np.percentile(t, [25, 50, 75])
                rows.append(
                    {
                        "n": n,
                        "median_ms": float(med),
                        "q25_ms": float(q1),
                        "q75_ms": float(q3),
                        "count": len(t),
                        "u_mean": float(np.mean([r["u_mean"] for r in sel])),
                        "kernel": sel[0]["kernel"],
                    }
                )
            table[s] = rows
        entry: dict[str, Any] = {"tau": table}
        if "per_slot" in settings and "dedup" in settings:
            saving, rows = {}, []
            for n in sorted({n for (s, n) in times if s == "dedup"}):
                if ("per_slot", n) not in times:
                    continue
                a, b = times[("per_slot", n)], times[("dedup", n)]
                s_n = float(np.median(a) - np.median(b))
                lo, hi = _bootstrap_median_diff(a, b, rng=rng)
                saving[n] = s_n
                rows.append({"n": n, "saving_ms": s_n, "ci95_ms": [lo, hi]})
            entry["saving"] = rows
            entry["crossover"] = measured_crossover(saving)
        out[str(d)] = entry
    return out
