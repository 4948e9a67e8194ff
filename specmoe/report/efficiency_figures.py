"""Figures of ``specmoe efficiency`` (paper 003 Figures 1-3, measured; Section 5's estimate).

``efficiency_vs_batch.png``  target efficiency t_step / t_verify against B (log axis), one
                             panel per K, one colour per routing; measured (solid, with the
                             lowest and highest per-repetition ratio as a band) and the
                             activated-expert-bytes estimate (dashed).
``speedup_vs_batch.png``     speedup of speculation against B, one panel per routing, one line
                             per K (the acceptance model and draft cost in the title).
``measured_vs_estimate.png`` measured efficiency against the estimate, every (routing, B, K),
                             around the identity line; right, the gap measured − estimate
                             against B.

Each function takes the JSON record of ``specmoe efficiency`` and writes a PNG atomically.
matplotlib is imported inside the functions only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.report._mpl import pyplot, save_pyplot

__all__ = ["plot_efficiency", "plot_estimate", "plot_speedup", "write_figures"]


def _routings(rec: dict[str, Any]) -> list[str]:
    seen: list[str] = []
    for r in rec["rows"]:
        if r["routing"] not in seen:
            seen.append(r["routing"])
    return seen


def _series(rec: dict[str, Any], routing: str, k: int, key: str) -> tuple[np.ndarray, ...]:
    rows = sorted(
        (r for r in rec["rows"] if r["routing"] == routing and r["k"] == k),
        key=lambda r: r["batch"],
    )
    b = np.array([r["batch"] for r in rows], dtype=float)
    return b, np.array([np.nan if r.get(key) is None else r[key] for r in rows], dtype=float)


def _title(rec: dict[str, Any]) -> str:
    layers = f", {rec['moe_layers']} MoE layers" if rec.get("moe_layers") else ""
    return (
        f"{rec['model']}{' (dummy weights)' if rec.get('dummy_weights') else ''}{layers}, "
        f"{rec['kernel']} kernel, {rec.get('device_name', rec.get('device'))}, "
        f"context {rec['context']}"
    )


def _batch_axis(ax, batches) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches)
    ax.set_xticklabels([str(b) for b in batches])


def plot_efficiency(rec: dict[str, Any], path: str | os.PathLike) -> Path:
    plt = pyplot()
    ks = rec["ks"]
    fig, axes = plt.subplots(1, len(ks), figsize=(4.2 * len(ks), 3.8), squeeze=False, sharey=True)
    for ax, k in zip(axes[0], ks):
        for i, name in enumerate(_routings(rec)):
            b, eff = _series(rec, name, k, "efficiency")
            _, est = _series(rec, name, k, "estimate")
            rows = sorted(
                (r for r in rec["rows"] if r["routing"] == name and r["k"] == k),
                key=lambda r: r["batch"],
            )
            rng = [r.get("efficiency_range") for r in rows]
            if all(x is not None for x in rng) and rng:
                lo, hi = np.array(rng, dtype=float).T
                ax.fill_between(b, lo, hi, color=f"C{i}", alpha=0.15, lw=0)
            ax.plot(b, eff, "o-", color=f"C{i}", label=f"{name} measured")
            ax.plot(b, est, "x--", color=f"C{i}", lw=0.9, label=f"{name} estimate")
        _batch_axis(ax, rec["batches"])
        ax.set(xlabel="batch size B", title=f"K = {k}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("target efficiency t_step / t_verify")
    axes[0][-1].legend(fontsize=6)
    fig.suptitle(_title(rec), fontsize=8)
    fig.tight_layout()
    return save_pyplot(fig, path)


def plot_speedup(rec: dict[str, Any], path: str | os.PathLike) -> Path:
    plt = pyplot()
    names = _routings(rec)
    fig, axes = plt.subplots(
        1, len(names), figsize=(4.2 * len(names), 3.8), squeeze=False, sharey=True
    )
    for ax, name in zip(axes[0], names):
        for j, k in enumerate(rec["ks"]):
            b, sp = _series(rec, name, k, "speedup")
            ax.plot(b, sp, "o-", color=f"C{j}", label=f"K = {k}")
        ax.axhline(1.0, color="0.4", lw=0.8)
        _batch_axis(ax, rec["batches"])
        ax.set(xlabel="batch size B", title=name)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("speedup (model of acceptance, measured times)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(
        f"{_title(rec)}\nacceptance a = {rec['acceptance']}, a draft token costs "
        f"{rec['draft_cost']} target steps",
        fontsize=8,
    )
    fig.tight_layout()
    return save_pyplot(fig, path)


def plot_estimate(rec: dict[str, Any], path: str | os.PathLike) -> Path:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    markers = "osd^v<>"
    ks = rec["ks"]
    for i, name in enumerate(_routings(rec)):
        for j, k in enumerate(ks):
            rows = [r for r in rec["rows"] if r["routing"] == name and r["k"] == k]
            ax1.scatter(
                [r["estimate"] for r in rows],
                [r["efficiency"] for r in rows],
                color=f"C{i}",
                marker=markers[j % len(markers)],
                s=18,
                label=f"{name}" if j == 0 else None,
            )
            b, gap = _series(rec, name, k, "gap")
            ax2.plot(
                b,
                gap,
                marker=markers[j % len(markers)],
                color=f"C{i}",
                lw=0.8,
                label=f"{name}, K={k}",
            )
    lims = [0.0, 1.05]
    ax1.plot(lims, lims, "-", color="0.3", lw=0.8)
    ax1.set(
        xlim=lims,
        ylim=lims,
        xlabel="estimate (activated-expert bytes)",
        ylabel="measured target efficiency",
    )
    ax1.legend(fontsize=7, title="marker: K " + ", ".join(map(str, ks)), title_fontsize=7)
    ax2.axhline(0.0, color="0.4", lw=0.8)
    _batch_axis(ax2, rec["batches"])
    ax2.set(xlabel="batch size B", ylabel="gap: measured − estimate")
    ax2.legend(fontsize=5, ncol=2)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.suptitle(_title(rec), fontsize=8)
    fig.tight_layout()
    return save_pyplot(fig, path)


def write_figures(rec: dict[str, Any], out: str | os.PathLike) -> list[Path]:
    """The three figures into ``out``."""
    out = Path(out)
    return [
        plot_efficiency(rec, out / "efficiency_vs_batch.png"),
        plot_speedup(rec, out / "speedup_vs_batch.png"),
        plot_estimate(rec, out / "measured_vs_estimate.png"),
    ]
