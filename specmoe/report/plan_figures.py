"""Figures of a plan (``specmoe plan --out``): the staircase, the saving with its band (like
Figure 4 of paper 002) and the best speedup against acceptance with its bound (Eq. (21)).

Each function takes a :class:`~specmoe.cost.plan.Plan` (or its plan.json dict) and writes one
PNG atomically; the matplotlib Agg canvas is used directly (no pyplot state). Every value drawn
is read from the plan, none recomputed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.report._mpl import agg_subplots, save_agg

__all__ = ["plot_saving", "plot_speedup", "plot_staircase", "write_plan_figures"]

COLORS = {"per_slot": "tab:blue", "dedup": "tab:red", "best": "black"}
LABELS = {"per_slot": "per-slot", "dedup": "deduplicating", "best": "faster kernel per pass"}


def _plan(plan: Any) -> Any:
    from specmoe.cost.plan import Plan

    return plan if isinstance(plan, Plan) else Plan.from_dict(plan)


def _title(plan: Any) -> str:
    return str(plan.model.get("name", ""))


def plot_staircase(plan: Any, path: str | os.PathLike) -> Path:
    """k*(a) against a for each policy, drawn from the exact step points (by Eq. (B.31))."""
    plan = _plan(plan)
    fig, axes = agg_subplots()
    ax = axes[0, 0]
    offsets = {"per_slot": -0.08, "dedup": 0.08, "best": 0.0}
    for p, pp in plan.policies.items():
        xs, ys = [], []
        for lvl in pp.staircase:
            xs += [lvl.a_from, lvl.a_to]
            ys += [lvl.k + offsets.get(p, 0.0)] * 2
        ax.plot(
            xs,
            ys,
            color=COLORS.get(p),
            lw=2 if p == "best" else 1.2,
            ls="-" if p == "best" else "--",
            label=LABELS.get(p, p),
        )
        pts = [a for a in pp.step_points if a < 1.0]
        ax.plot(pts, [offsets.get(p, 0.0)] * len(pts), "|", color=COLORS.get(p), ms=8)
    ax.set_xlim(0, 1)
    ax.set_xlabel("acceptance rate a")
    ax.set_ylabel("best draft length k*(a)")
    ax.set_title(f"Staircase {_title(plan)} (ticks: step points)")
    ax.legend(loc="upper left", fontsize=8)
    return save_agg(fig, path)


def plot_saving(plan: Any, path: str | os.PathLike) -> Path:
    """S(n) = tau_slot(n) - tau_dedup(n) with the band by Eq. (18); positive: dedup faster."""
    plan = _plan(plan)
    fig, axes = agg_subplots()
    ax = axes[0, 0]
    n = np.asarray(plan.n)
    s = np.asarray(plan.saving.ms, dtype=float)
    band = np.asarray(plan.saving.band_ms, dtype=float)
    ax.fill_between(
        n,
        s - band,
        s + band,
        color="tab:red",
        alpha=0.2,
        label=f"saving bound (18), eps = {plan.epsilon.used:.3f}",
    )
    ax.plot(n, s, "o-", color="tab:red", label="predicted saving S(n)")
    ax.axhline(0.0, color="grey", lw=0.8)
    cross = plan.crossover
    if cross is not None:
        ax.axvline(cross, color="black", ls=":", lw=1, label=f"crossover n = {cross}")
    ax.set_xlabel("tokens per pass n")
    ax.set_ylabel("saving (ms)")
    ax.set_title(f"Saving of deduplication {_title(plan)}")
    ax.legend(fontsize=8)
    return save_agg(fig, path)


def plot_speedup(plan: Any, path: str | os.PathLike) -> Path:
    """The best speedup T_a(k*)/T_a(0) of each policy at the plan's acceptance values; the
    ``best`` policy is shaded by its interval of bound (21), as the plan holds them."""
    plan = _plan(plan)
    fig, axes = agg_subplots()
    ax = axes[0, 0]
    acc = np.asarray(plan.acceptance, dtype=float)
    delta = plan.delta
    for p, pp in plan.policies.items():
        sp = np.asarray(pp.speedup, dtype=float)
        if p == "best" and all(b is not None for b in pp.speedup_bound) and acc.size:
            lo, hi = np.asarray(pp.speedup_bound, dtype=float).T
            ax.fill_between(
                acc, lo, hi, color="grey", alpha=0.2, label="bound (21) of the faster-kernel policy"
            )
        ax.plot(
            acc,
            sp,
            marker=".",
            color=COLORS.get(p),
            lw=2 if p == "best" else 1.2,
            ls="-" if p == "best" else "--",
            label=LABELS.get(p, p),
        )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlim(0, 1)
    ax.set_xlabel("acceptance rate a")
    ax.set_ylabel("best speedup over plain decoding")
    band = "" if delta is None else f" (shaded: bound (21), delta = {delta:.3f})"
    ax.set_title(f"Speedup {_title(plan)}{band}", fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    return save_agg(fig, path)


def write_plan_figures(plan: Any, out_dir: str | os.PathLike) -> list[Path]:
    """staircase.png, saving.png and speedup.png in ``out_dir``, from a Plan or plan.json dict."""
    plan = _plan(plan)
    out = Path(out_dir)
    return [
        plot_staircase(plan, out / "staircase.png"),
        plot_saving(plan, out / "saving.png"),
        plot_speedup(plan, out / "speedup.png"),
    ]
