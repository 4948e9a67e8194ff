"""The per-layer cost of a dense and an MoE draft layer against batch size (paper 003 App. M.1).

Legend: ``B`` sequences of a batch (one draft token each per draft step), ``h`` hidden size,
``I`` expert width, ``I_d`` the dense layer's width, ``N`` experts, ``m`` experts per token,
``U`` distinct experts the B tokens name, ``b`` bytes of one expert.

One draft step of a batch runs each draft layer on B rows. This module times, at a target's
shapes with dummy weights, the feed-forward block of one draft layer at each B, the only part
in which a dense and an MoE draft layer differ (attention, norms, embedding and LM head are
the same for both and sit in the batch-1 anchor of M.1, :mod:`specmoe.analysis.drafters`):

* ``dense``: a SwiGLU FFN of width I_d on the B rows (one GEMM chain; it is the expert
  operation with N = 1, m = 1, so the same kernel and weight layout run it), bytes 3·h·I_d·q;
* ``moe``: the router (B×h by h×N) and the expert operation with N experts of width I, top-m,
  the B tokens' ids drawn from B different places of a routing table (each sequence of a
  served batch is at its own place of its text), bytes U·b + N·h·q.

Every call reads its weights from memory: weights rotate over a pool of slots as in
:mod:`specmoe.bench.timing` (a slot is reused only after twice the last-level cache of other
reads). The two layers alternate within each repetition. Times are medians over repetitions.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from specmoe.bench.machine import last_level_cache_bytes
from specmoe.bench.passes import Rotation, pool_size
from specmoe.bench.timing import make_pool
from specmoe.errors import InputError
from specmoe.kernels import get_kernel, torch_dtype

__all__ = ["batch_ids", "time_draft_layers"]

UNKNOWN_LLC = 256 << 20


def batch_ids(table: np.ndarray, batch: int, rng: np.random.Generator) -> np.ndarray:
    """[B, m] expert ids of one draft step of a batch: B distinct rows of ``table`` [T, m]
    (each sequence at its own place of the routing), drawn without replacement."""
    table = np.asarray(table)
    if table.ndim != 2:
        raise InputError(f"expected [T, m] ids, got shape {table.shape}", argument="table")
    if not 1 <= batch <= table.shape[0]:
        raise InputError(
            f"must lie in 1..{table.shape[0]} (rows of the routing table)", argument="batch"
        )
    rows = rng.choice(table.shape[0], size=batch, replace=False)
    return np.asarray(table[rows], dtype=np.int64)


def _clock(clock: str) -> Callable[[], float]:
    if clock == "cpu":
        return time.thread_time
    if clock == "wall":
        return time.perf_counter
    raise InputError(f"unknown {clock!r} (choose wall or cpu)", argument="clock")


def time_draft_layers(
    *,
    hidden: int,
    expert_width: int,
    num_experts: int,
    top_k: int,
    dense_width: int,
    routing: np.ndarray,
    batches: Sequence[int],
    dtype: str = "bfloat16",
    kernel: str = "dedup_torch",
    activation: str = "swiglu",
    reps: int = 3,
    warmup: int = 1,
    clock: str = "cpu",
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Time the dense and the MoE draft layer at every B of ``batches`` (see the module doc).

    ``routing`` [T, L, m] (or [T, m]): the table the MoE layer's ids come from; repetition r
    uses layer r mod L. Returns {"records": [...], "dense_bytes", "expert_bytes",
    "router_bytes", "pool", "kernel", "dtype", "clock"}; a record holds ``layer``
    ("dense"/"moe"), ``batch``, ``u`` (distinct experts, mean over repetitions), ``bytes`` and
    ``flops`` (mean), ``times`` (seconds, one per repetition) and ``median_s``.
    """
    tdt = torch_dtype(dtype)
    q = torch.empty((), dtype=tdt).element_size()
    table = np.asarray(routing)
    if table.ndim == 2:
        table = table[:, None, :]
    if table.ndim != 3 or table.shape[2] != top_k:
        raise InputError(f"expected [T, L, m={top_k}] ids, got {table.shape}", argument="routing")
    if int(table.max()) >= num_experts:
        raise InputError(f"ids reach {int(table.max())} >= N={num_experts}", argument="routing")
    batches = sorted({int(b) for b in batches})
    if not batches or batches[0] < 1 or batches[-1] > table.shape[0]:
        raise InputError(f"must lie in 1..{table.shape[0]}", argument="batches")
    say = progress or (lambda _msg: None)
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    llc = last_level_cache_bytes("cpu") or UNKNOWN_LLC
    flush = 2 * llc
    b = 3 * hidden * expert_width * q
    bd = 3 * hidden * dense_width * q
    fn = get_kernel(kernel, "cpu")
    moe_slots = pool_size(num_experts, min(batches[-1] * top_k, num_experts), b, flush)
    dense_slots = int(1 + math.ceil(flush / bd))
    say(
        f"weights: {moe_slots} expert slots of {b / 1e6:.2f} MB and {dense_slots} dense slots "
        f"of {bd / 1e6:.1f} MB"
    )
    moe = make_pool(
        moe_slots, hidden, expert_width, dtype=tdt, device="cpu", activation=activation, seed=seed
    )
    dense = make_pool(
        dense_slots, hidden, dense_width, dtype=tdt, device="cpu", activation=activation,
        seed=seed + 1,
    )  # fmt: skip
    router = torch.empty(num_experts, hidden, dtype=tdt).uniform_(-(hidden**-0.5), hidden**-0.5)
    rot_moe, rot_dense = Rotation(moe_slots), Rotation(dense_slots)
    now = _clock(clock)
    records: list[dict[str, Any]] = []
    for B in batches:
        x = torch.from_numpy(rng.standard_normal((B, hidden), dtype=np.float32)).to(tdt)
        w_moe = torch.from_numpy(rng.dirichlet(np.ones(top_k), size=B).astype(np.float32)).to(tdt)
        ones = torch.ones(B, 1, dtype=tdt)
        zeros = np.zeros((B, 1), dtype=np.int64)
        rec = {
            k: {"layer": k, "batch": B, "times": [], "u": [], "bytes": [], "flops": []}
            for k in ("dense", "moe")
        }
        for rep in range(warmup + reps):
            ids = batch_ids(table[:, rep % table.shape[1], :], B, rng)
            u = int(np.unique(ids).size)
            calls = {
                "dense": (dense, rot_dense(zeros), ones, None),
                "moe": (moe, rot_moe(ids), w_moe, router),
            }
            order = ["dense", "moe"] if rep % 2 == 0 else ["moe", "dense"]
            for name in order:
                pool, slots, weights, gate = calls[name]
                idt = torch.from_numpy(slots)
                t0 = now()
                if gate is not None:
                    F.linear(x, gate)
                fn(x, pool.w_gate_up, pool.w_down, idt, weights, activation=activation,
                   check=False)  # fmt: skip
                dt = now() - t0
                if rep < warmup:
                    continue
                r = rec[name]
                r["times"].append(dt)
                if name == "moe":
                    r["u"].append(u)
                    r["bytes"].append(u * b + num_experts * hidden * q)
                    r["flops"].append(
                        2 * B * (top_k * 3 * hidden * expert_width + hidden * num_experts)
                    )
                else:
                    r["u"].append(1)
                    r["bytes"].append(bd)
                    r["flops"].append(2 * B * 3 * hidden * dense_width)
        for r in rec.values():
            r["median_s"] = float(statistics.median(r["times"]))
            for k in ("u", "bytes", "flops"):
                r[k] = float(np.mean(r[k]))
            records.append(r)
        say(
            f"B={B}: dense {rec['dense']['median_s'] * 1e3:.2f} ms, moe "
            f"{rec['moe']['median_s'] * 1e3:.2f} ms (U={rec['moe']['u']:.1f})"
        )
    return {
        "records": records,
        "dense_bytes": bd,
        "expert_bytes": b,
        "router_bytes": num_experts * hidden * q,
        "pool": {
            "moe_slots": moe_slots,
            "dense_slots": dense_slots,
            "flush_bytes": flush,
            "llc_bytes": llc,
        },
        "kernel": kernel,
        "dtype": str(tdt).removeprefix("torch."),
        "clock": clock,
    }
