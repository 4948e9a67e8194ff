"""Target efficiency by activated-expert bytes, and the speedup of speculation against batch size
(paper 003 Sections 3, 5 and 8-9). numpy only.

Legend for shapes: ``B`` sequences of a batch, ``s`` tokens per sequence in one pass (1 for an
autoregressive step, K+1 for a verification pass), ``T`` rows of a routing table, ``L`` MoE
layers, ``m`` experts per token.

**Target efficiency** (paper 003 Section 3) is the time of one autoregressive step over the time
of one verification pass of K+1 tokens, both at batch size B:

    E(B, K) = t_step(B) / t_verify(B, K).

**Activated-expert bytes** (paper 003 Section 5) estimate it by assuming time proportional to
the bytes a pass reads: the dense bytes C_dense once, and C_expert for each distinct expert a
layer uses in the pass,

    E ≈ (C_dense + Σ_l k_l · C_expert,l) / (C_dense + Σ_l unique_l · C_expert,l),

where k_l is the number of experts layer l activates in the one-token step (m at B = 1, the
union of the B sequences' experts at batch B) and unique_l the distinct experts of the whole
verification pass (B·(K+1) rows). With one C_expert for every layer this is the paper's
(C_dense + k·C_expert) / (C_dense + unique_SD·C_expert) with k and unique_SD summed over layers.

**Batches of windows.** Sequence b of a batch takes the rows ``start_b + position + 0..s-1``
(mod T) of a routing table, so different sequences route like different places of a trace and
their experts union as they would in a served batch (:func:`window_rows`,
:func:`batch_unique`).

**Speedup** (paper 003 Figure 3, measured step times and a model of acceptance): with an
acceptance rate a, one round drafts K tokens and emits on average
G_a(K) = (1 − a^(K+1)) / (1 − a) tokens (Leviathan et al., 2023); a draft token costs a fraction
c of the target's one-token step at the same batch size, so

    speedup(B, K) = G_a(K) · t_step(B) / (t_verify(B, K) + K · c · t_step(B))
                  = G_a(K) / (1 / E(B, K) + K · c),

Eq. (9) of paper 002 with V(0) = t_step and V(K) = t_verify + K c t_step: G_a(K) is
:func:`specmoe.cost.theory.expected_tokens` and the ratio :func:`specmoe.cost.theory.step_speedup`
(exact arithmetic, rounded once). The uniform-routing union N(1 − (1 − m/N)^r) is
:func:`specmoe.routing.overlap.uniform_union`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specmoe.cost import theory
from specmoe.errors import InputError

__all__ = [
    "activated_bytes_efficiency",
    "batch_unique",
    "choose_starts",
    "expected_tokens",
    "layer_map",
    "speedup",
    "summarise_efficiency",
    "window_rows",
]


def layer_map(num_layers: int, source_layers: int) -> np.ndarray:
    """[L] the source layer of each of ``num_layers`` layers at the same relative depth."""
    if num_layers < 1 or source_layers < 1:
        raise InputError(f"layers must be >= 1, got {num_layers} and {source_layers}")
    if num_layers == 1 or source_layers == 1:
        return np.zeros(num_layers, dtype=np.int64)
    return np.rint(np.arange(num_layers) * (source_layers - 1) / (num_layers - 1)).astype(np.int64)


def window_rows(
    starts: Sequence[int] | np.ndarray, position: int, tokens: int, table_rows: int
) -> np.ndarray:
    """[B, s] table rows of a pass: sequence b, token i takes ``(starts[b] + position + i) mod T``.

    Rows flatten batch-major (``reshape(-1)``), the order in which an MoE block hands a batch's
    tokens to its router.
    """
    starts = np.asarray(starts, dtype=np.int64).reshape(-1)
    if tokens < 1 or table_rows < 1:
        raise InputError(f"tokens and table rows must be >= 1, got {tokens}, {table_rows}")
    return (starts[:, None] + int(position) + np.arange(tokens)[None, :]) % int(table_rows)


def batch_unique(table: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """[L] distinct experts each layer of ``table`` [T, L, m] uses in the rows ``rows`` (any
    shape, e.g. [B, s] from :func:`window_rows`): the union across every sequence and token."""
    table = np.asarray(table)
    if table.ndim != 3:
        raise InputError(f"table: expected expert ids [T, L, m], got shape {table.shape}")
    L = table.shape[1]
    ids = table[np.asarray(rows).reshape(-1)]  # [r, L, m]
    n_exp = int(table.max()) + 1
    seen = np.zeros((L, n_exp), dtype=bool)
    layer = np.broadcast_to(np.arange(L)[None, :, None], ids.shape)
    seen[layer.reshape(-1), ids.reshape(-1)] = True
    return seen.sum(axis=1)


def choose_starts(
    doc_offsets: Sequence[int] | np.ndarray, count: int, length: int, rng: np.random.Generator
) -> np.ndarray:
    """[count] distinct window starts of ``length`` tokens, each window inside one document
    where the documents allow it (uniform over such starts, without replacement); documents too
    short for a whole window are used only when no document is long enough."""
    off = np.asarray(doc_offsets, dtype=np.int64)
    if off.ndim != 1 or off.size < 2 or off[0] != 0 or np.any(np.diff(off) < 0):
        raise InputError("doc_offsets: expected a non-decreasing [D+1] array from 0")
    if count < 1 or length < 1:
        raise InputError(f"count and length must be >= 1, got {count}, {length}")
    T = int(off[-1])
    ends = np.repeat(off[1:], np.diff(off))  # [T] end of each row's document
    valid = np.flatnonzero(ends - np.arange(T) >= length)
    if valid.size == 0:
        valid = np.arange(T)
    return rng.choice(valid, size=count, replace=valid.size < count)


def activated_bytes_efficiency(
    dense_bytes: float,
    expert_bytes: float | Sequence[float],
    k: float | Sequence[float],
    unique: float | Sequence[float],
) -> float:
    """Eq. of paper 003 Section 5: (C_dense + Σ_l k_l C_expert,l) / (C_dense + Σ_l u_l C_expert,l).

    ``expert_bytes``: bytes of one expert (a scalar, or [L] per layer); ``k``: experts the
    one-token step activates ([L] per layer, or a scalar sum over layers with a scalar
    ``expert_bytes``); ``unique``: distinct experts of the verification pass, same shape.
    """
    w = np.asarray(expert_bytes, dtype=np.float64)
    kk = np.asarray(k, dtype=np.float64)
    uu = np.asarray(unique, dtype=np.float64)
    if kk.shape != uu.shape:
        raise InputError(f"k and unique must have the same shape, got {kk.shape} and {uu.shape}")
    if w.ndim and w.shape != kk.shape:
        raise InputError(f"expert_bytes [{w.size}] does not match k [{kk.size}]")
    if dense_bytes < 0 or np.any(w < 0) or np.any(kk < 0) or np.any(uu < 0):
        raise InputError("bytes and expert counts must be non-negative")
    num = float(dense_bytes + np.sum(kk * w))
    den = float(dense_bytes + np.sum(uu * w))
    if den <= 0:
        raise InputError("no bytes: dense_bytes and unique experts are all zero")
    return num / den


def expected_tokens(acceptance: float, k: int | np.ndarray) -> float | np.ndarray:
    """G_a(K) = (1 − a^(K+1)) / (1 − a) as a float (K + 1 at a = 1), for a draft length or an
    array of them: :func:`specmoe.cost.theory.expected_tokens`, the one definition."""
    kk = np.asarray(k)
    if np.any(kk < 0) or np.any(kk != np.floor(kk)):
        raise InputError(f"must be whole numbers >= 0, got {k}", argument="k")
    a = _acceptance(acceptance)
    g = [float(theory.expected_tokens(a, int(x))) for x in kk.reshape(-1)]
    return g[0] if kk.ndim == 0 else np.asarray(g, dtype=np.float64).reshape(kk.shape)


def _acceptance(a: float) -> float:
    """``a`` checked for the closed interval [0, 1], the error naming ``acceptance``."""
    try:
        theory.expected_tokens(a, 0)
    except InputError as exc:
        raise InputError(exc.message, argument="acceptance") from None
    return a


def speedup(
    t_step: float, t_verify: float, k: int, *, acceptance: float, draft_cost: float
) -> float:
    """G_a(K) · t_step / (t_verify + K · draft_cost · t_step): Eq. (9) of paper 002
    (:func:`specmoe.cost.theory.step_speedup`) with the plain step V(0) = t_step and the step
    V(K) = t_verify + K · draft_cost · t_step, a draft token costing ``draft_cost`` target steps
    (the affine draft cost of paper 003 Section 8)."""
    if t_step <= 0 or t_verify <= 0:
        raise InputError(
            f"times must be positive, got t_step={t_step}, t_verify={t_verify}",
            argument="t_verify" if t_step > 0 else "t_step",
        )
    if draft_cost < 0:
        raise InputError(f"must be >= 0, got {draft_cost}", argument="draft_cost")
    step = t_verify + k * draft_cost * t_step
    return float(
        theory.step_speedup(_acceptance(acceptance), int(k), plain=float(t_step), step=step)
    )


def summarise_efficiency(
    records: Sequence[dict],
    *,
    dense_bytes: float,
    expert_bytes: float | Sequence[float],
    kv_bytes: dict | None = None,
    acceptance: float = 0.7,
    draft_cost: float = 0.05,
) -> list[dict]:
    """One row per (routing, B, K) from timed passes.

    ``records``: dicts with ``routing``, ``batch`` B, ``k`` (None for the one-token step, else
    K), ``repetition``, ``t_ms`` and ``unique`` ([L] distinct experts per layer of that pass).
    ``kv_bytes``: {B: key-value bytes a pass reads at batch B}, for the estimate with the cache
    counted as dense bytes (paper 003 Section 9.2), else None.

    Rows come in the order the routings first appear in ``records``, then by B and K. A row
    holds the medians of t_step and t_verify over repetitions, the measured efficiency
    (their ratio) with the lowest and highest per-repetition ratio (a step and a verification of
    the same windows), k and unique (mean over repetitions, summed over layers, and per layer),
    the activated-expert-bytes estimate, the gap measured − estimate, G_a(K) and the speedup.
    """
    rows: list[dict] = []
    order = list(dict.fromkeys(r["routing"] for r in records))  # routings as first seen
    keys = sorted(
        {(r["routing"], int(r["batch"])) for r in records}, key=lambda x: (order.index(x[0]), x[1])
    )
    for routing, b in keys:
        sel = [r for r in records if r["routing"] == routing and int(r["batch"]) == b]
        step = {r["repetition"]: r for r in sel if r["k"] is None}
        if not step:
            raise InputError(f"routing {routing!r}, B={b}: no one-token step was timed")
        t1 = float(np.median([r["t_ms"] for r in step.values()]))
        k_l = np.mean([np.asarray(r["unique"], dtype=np.float64) for r in step.values()], axis=0)
        for kk in sorted({int(r["k"]) for r in sel if r["k"] is not None}):
            ver = {r["repetition"]: r for r in sel if r["k"] is not None and int(r["k"]) == kk}
            tv = float(np.median([r["t_ms"] for r in ver.values()]))
            u_l = np.mean([np.asarray(r["unique"], dtype=np.float64) for r in ver.values()], axis=0)
            ratios = [step[i]["t_ms"] / ver[i]["t_ms"] for i in ver if i in step]
            est = activated_bytes_efficiency(dense_bytes, expert_bytes, k_l, u_l)
            eff = t1 / tv
            row = {
                "routing": routing,
                "batch": b,
                "k": kk,
                "rows": b * (kk + 1),
                "t_step_ms": t1,
                "t_verify_ms": tv,
                "efficiency": eff,
                "efficiency_range": [float(min(ratios)), float(max(ratios))] if ratios else None,
                "repetitions": len(ver),
                "k_active": float(k_l.sum()),
                "unique": float(u_l.sum()),
                "k_active_per_layer": k_l.tolist(),
                "unique_per_layer": u_l.tolist(),
                "estimate": est,
                "gap": eff - est,
                "expected_tokens": expected_tokens(acceptance, kk),
                "speedup": speedup(t1, tv, kk, acceptance=acceptance, draft_cost=draft_cost),
            }
            if kv_bytes is not None and b in kv_bytes:
                row["estimate_with_kv"] = activated_bytes_efficiency(
                    dense_bytes + float(kv_bytes[b]), expert_bytes, k_l, u_l
                )
            rows.append(row)
    return rows
