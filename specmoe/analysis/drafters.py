"""MoE drafters, train-free: the analytic draft cost against batch size (paper 003 Section 9.3,
Appendix M). numpy only. A design study: no drafter is trained, no acceptance is measured.

Legend: ``B`` sequences of a batch, ``L_d`` draft layers, ``p`` the draft layer's kind
(``dense`` or ``moe``), ``K`` draft length.

**Draft cost (M.1).** Paper 003 anchors the draft cost at batch size 1 and adds the measured
incremental per-layer cost (which keeps the drafter's pipelining and framework overhead in the
anchor and counts attention once). The summary gives no formula; the one implemented is
(our reading, stated here once):

    C_p(B; L_d) = C_1 + L_d · c_p(B) − c_dense(1)
               = C_p(1; L_d) + L_d · (c_p(B) − c_p(1)),

with C_1 the cost of one step of the one-layer dense drafter at batch 1 (the anchor: attention,
norms, embedding, LM head, framework), c_p(B) the measured time of one draft layer's
feed-forward block of kind p on B rows (:mod:`specmoe.bench.drafters`), and so
C_p(1; L_d) = C_1 + L_d·c_p(1) − c_dense(1). At B = 1 the one-layer MoE drafter costs
C_1 + c_moe(1) − c_dense(1): the dense drafter's cost when both layers read the same bytes
(the dense width is m·I, the MoE layer's active width), as M.2 finds for Qwen3-30B.

**Bandwidth-bound.** A layer is bandwidth-bound while its time follows its bytes (the dense
layer's are fixed, the MoE layer's grow with the union U(B) of the batch's experts): its time
per byte t(B)/bytes(B) stays within a factor 1 + tol of the best (lowest) time per byte at any
batch up to B. It stops being bandwidth-bound at the first batch from which the time per byte
stays above that bound at every larger batch of the sweep (:func:`bandwidth_bound_limit`; the
running best and "stays" keep one noisy timing from deciding it). The roofline batch is where the
compute time at the matmul peak reaches the byte time at the memory ceiling,
flops(B)/peak >= bytes(B)/ceiling (:func:`roofline_batch`), with both rates measured by the
benchmark (:mod:`specmoe.bench.machine`).

**Speedup** with a drafter (Eq. (9) of paper 002, :func:`specmoe.cost.theory.step_speedup`):

    speedup(B, K) = G_a(K) · t_step(B) / (t_verify(B, K) + K · C_p(B; L_d)),

t_step and t_verify the target's one-token step and verification pass at batch B measured by
``specmoe efficiency`` (paper 003 Section 3's target efficiency E = t_step/t_verify, here on
synthetic routing), G_a(K) = (1 − a^(K+1))/(1 − a).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from specmoe.cost import theory
from specmoe.errors import InputError

__all__ = [
    "bandwidth_bound_limit",
    "draft_cost",
    "drafter_table",
    "first_cheaper",
    "layer_costs",
    "roofline_batch",
    "speedup_table",
]

KINDS = ("dense", "moe")


def draft_cost(anchor: float, dense_one: float, layer: Any, layers: int) -> np.ndarray:
    """M.1: C_p(B; L_d) = C_1 + L_d·c_p(B) − c_dense(1) for ``layer`` = c_p(B) (any shape).

    ``anchor`` C_1: one step of the one-layer dense drafter at batch 1; ``dense_one``
    c_dense(1): its layer's feed-forward time at batch 1; ``layers`` L_d >= 1."""
    c = np.asarray(layer, dtype=np.float64)
    if not np.isfinite(anchor) or anchor < 0:
        raise InputError(f"must be finite and >= 0, got {anchor}", argument="anchor")
    if not np.isfinite(dense_one) or dense_one < 0 or dense_one > anchor:
        raise InputError(
            f"must lie in [0, anchor={anchor}] (the anchor contains its layer), got {dense_one}",
            argument="dense_one",
        )
    if isinstance(layers, bool) or int(layers) != layers or layers < 1:
        raise InputError(f"must be an integer >= 1, got {layers}", argument="layers")
    if np.any(~np.isfinite(c)) or np.any(c < 0):
        raise InputError("layer costs must be finite and >= 0", argument="layer")
    return anchor - dense_one + int(layers) * c


def bandwidth_bound_limit(
    batches: Sequence[int], times: Sequence[float], nbytes: Sequence[float], *, tol: float = 0.25
) -> dict[str, Any]:
    """The batches over which a layer stays bandwidth-bound (see the module docstring).

    Returns ``ratio`` [B]: (t/bytes)(B) over the lowest t/bytes at any batch <= B (1 where the
    layer is at its best rate so far), ``first_unbound``: the first batch of the sweep from
    which every ratio exceeds 1 + tol (None when the last batch is still within it), and
    ``last_bound``: the batch before it (None when even the first batch is unbound)."""
    b = np.asarray(batches, dtype=np.int64)
    t = np.asarray(times, dtype=np.float64)
    y = np.asarray(nbytes, dtype=np.float64)
    if not (b.shape == t.shape == y.shape) or b.ndim != 1 or b.size == 0:
        raise InputError("batches, times and bytes must be [B] arrays of one length")
    if np.any(np.diff(b) <= 0):
        raise InputError("must increase", argument="batches")
    if np.any(t <= 0) or np.any(y <= 0):
        raise InputError("times and bytes must be positive", argument="times")
    if not tol >= 0:
        raise InputError(f"must be >= 0, got {tol}", argument="tol")
    per_byte = t / y
    ratio = per_byte / np.minimum.accumulate(per_byte)
    i = b.size  # first index from which every ratio > 1 + tol
    while i > 0 and ratio[i - 1] > 1 + tol:
        i -= 1
    return {
        "ratio": ratio.tolist(),
        "tol": tol,
        "last_bound": int(b[i - 1]) if i > 0 else None,
        "first_unbound": int(b[i]) if i < b.size else None,
    }


def roofline_batch(
    batches: Sequence[int],
    flops: Sequence[float],
    nbytes: Sequence[float],
    *,
    ceiling_gbps: float,
    peak_gflops: float,
) -> int | None:
    """The first B of the sweep with flops(B)/peak >= bytes(B)/ceiling (None: never)."""
    if not (ceiling_gbps > 0 and peak_gflops > 0):
        raise InputError("ceiling and peak must be positive", argument="ceiling_gbps")
    f = np.asarray(flops, dtype=np.float64) / (peak_gflops * 1e9)
    m = np.asarray(nbytes, dtype=np.float64) / (ceiling_gbps * 1e9)
    hit = np.flatnonzero(f >= m)
    return int(np.asarray(batches)[hit[0]]) if hit.size else None


def layer_costs(records: Sequence[dict]) -> dict[str, dict[str, list[float]]]:
    """{kind: {"batch", "median_s", "bytes", "flops", "u"}} sorted by batch, from the records
    of :func:`specmoe.bench.drafters.time_draft_layers`."""
    out: dict[str, dict[str, list[float]]] = {}
    for kind in KINDS:
        rows = sorted((r for r in records if r["layer"] == kind), key=lambda r: r["batch"])
        if not rows:
            raise InputError(f"no {kind} layer was timed", argument="records")
        out[kind] = {k: [r[k] for r in rows] for k in ("batch", "median_s", "bytes", "flops", "u")}
    if out["dense"]["batch"] != out["moe"]["batch"]:
        raise InputError("the dense and MoE layers were timed at different batches")
    return out


def drafter_table(
    costs: dict[str, dict[str, list[float]]], *, anchor_s: float, layers: Sequence[int]
) -> list[dict[str, Any]]:
    """One row per (kind, L_d): M.1's C_p(B; L_d) [B] in seconds, from :func:`layer_costs`.
    The anchor's own layer is the dense layer at the smallest batch timed (batch 1)."""
    dense_one = costs["dense"]["median_s"][0]
    rows = []
    for kind in KINDS:
        for L in layers:
            c = draft_cost(anchor_s, dense_one, costs[kind]["median_s"], L)
            rows.append(
                {
                    "kind": kind,
                    "layers": int(L),
                    "batch": costs[kind]["batch"],
                    "cost_s": c.tolist(),
                }
            )
    return rows


def first_cheaper(dense: Sequence[float], moe: Sequence[float], batches: Sequence[int]):
    """The first batch from which the MoE drafter stays cheaper than the dense one (the
    crossing of M.2), or None."""
    d, m = np.asarray(dense, dtype=np.float64), np.asarray(moe, dtype=np.float64)
    best = None
    for i in range(d.size - 1, -1, -1):
        if not m[i] < d[i]:
            break
        best = int(batches[i])
    return best


def speedup_table(
    efficiency_rows: Sequence[dict],
    drafters: Sequence[dict],
    *,
    routing: str,
    acceptance: float,
) -> list[dict[str, Any]]:
    """Speedup(B, K) of each drafter row at the batches both the target's efficiency rows
    (``specmoe efficiency`` rows of ``routing``: batch, k, t_step_ms, t_verify_ms) and the
    drafter's costs have: Eq. (9) of paper 002 with V(0) = t_step, V(K) = t_verify + K·C."""
    eff = [r for r in efficiency_rows if r["routing"] == routing]
    if not eff:
        names = sorted({r["routing"] for r in efficiency_rows})
        raise InputError(f"no rows of routing {routing!r} (has {', '.join(names)})",
                         argument="routing")  # fmt: skip
    out = []
    for d in drafters:
        cost = dict(zip(d["batch"], d["cost_s"]))
        for r in eff:
            B, K = int(r["batch"]), int(r["k"])
            if B not in cost:
                continue
            step = r["t_step_ms"] / 1e3
            ver = r["t_verify_ms"] / 1e3 + K * cost[B]
            s = theory.step_speedup(acceptance, K, plain=step, step=ver)
            out.append(
                {
                    "kind": d["kind"],
                    "layers": d["layers"],
                    "batch": B,
                    "k": K,
                    "t_step_ms": r["t_step_ms"],
                    "t_verify_ms": r["t_verify_ms"],
                    "efficiency": r["t_step_ms"] / r["t_verify_ms"],
                    "draft_ms": cost[B] * 1e3,
                    "draft_share": K * cost[B] / ver,
                    "speedup": float(s),
                }
            )
    return out
