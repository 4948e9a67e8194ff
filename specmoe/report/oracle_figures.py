"""Figures of the Oracle analysis (:func:`specmoe.oracle.analysis.oracle_analysis`), paper 000.

Figure 1 / A2: T_T against Ū_r for each budget K with the fitted line of model (4) at the
budget's median context. Figure 2: S_max, mean k and mean accepted length against L_max.
Figure 3: Delta space of the rejected candidates with the fitted boundary. Figure A6: draft
time against K with T_D = a·K + b. Each function writes one PNG atomically with the matplotlib
Agg canvas (no pyplot state).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from specmoe.report._mpl import agg_subplots, save_agg

__all__ = [
    "plot_delta_space",
    "plot_draft_time",
    "plot_oracle_bounds",
    "plot_policies",
    "plot_verify_cost",
    "write_oracle_figures",
]

_MAX_POINTS = 4000  # per panel, sampled evenly so large logs stay drawable


def _thin(n: int, limit: int = _MAX_POINTS) -> np.ndarray:
    return np.arange(n) if n <= limit else np.linspace(0, n - 1, limit).astype(np.int64)


def plot_verify_cost(log, fits, path: str | os.PathLike) -> Path:
    """T_T against Ū_r, one panel per K on shared axes, with the fitted line at median L."""
    ks = sorted(f.k for f in fits)
    cols = min(5, len(ks))
    rows = (len(ks) + cols - 1) // cols
    fig, axes = agg_subplots(rows, cols, width=2.6 * cols, height=2.3 * rows + 0.4)
    by_k = {f.k: f for f in fits}
    u_all, t_all = log["u_mean"], log["t_verify_ms"]
    for ax in axes.ravel()[len(ks) :]:
        ax.set_visible(False)
    for ax, k in zip(axes.ravel(), ks):
        sel = np.flatnonzero(log["k"] == k)
        pick = sel[_thin(len(sel))]
        ax.scatter(u_all[pick], t_all[pick], s=2, alpha=0.3, color="tab:blue", lw=0)
        f = by_k[k]
        u = np.linspace(u_all[sel].min(), u_all[sel].max(), 20)
        ax.plot(u, f.predict(u, f.median_l), color="tab:red", lw=1.2)
        ax.set_title(f"K={k}: α={f.alpha:.3g}, β0={f.beta0:.3g}", fontsize=8)
        ax.set_xlim(u_all.min() - 0.5, u_all.max() + 0.5)
        ax.set_ylim(np.percentile(t_all, 0.5) * 0.95, np.percentile(t_all, 99.5) * 1.05)
        ax.tick_params(labelsize=7)
    fig.supxlabel("Ū_r (distinct experts per pass, mean over layers)", fontsize=9)
    fig.supylabel("T_T (ms)", fontsize=9)
    return save_agg(fig, path)


def plot_oracle_bounds(result: dict, path: str | os.PathLike) -> Path:
    """Figure 2: S_max, mean k and mean accepted against L_max (``result``: the JSON dict)."""
    fig, axes = agg_subplots(1, 3, width=9.0, height=3.0)
    x = result["l_max"]
    for ax, key, label in zip(
        axes[0],
        ("s_max", "mean_k", "mean_accepted"),
        ("S_max (over plain decoding)", "mean chosen k", "mean accepted length"),
    ):
        ax.plot(x, result[key], "o-", color="black", ms=4)
        ax.set_xlabel("L_max")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    return save_agg(fig, path)


def plot_delta_space(delta, path: str | os.PathLike) -> Path:
    """Figure 3: ΔE[Cost] against ΔE[a] of rejected candidates, the boundary through (0, 0)."""
    fig, axes = agg_subplots(width=5.5, height=4.5)
    ax = axes[0, 0]
    x, y = np.asarray(delta.d_cost), np.asarray(delta.d_accept)
    pick = _thin(len(x), 20000)
    sc = ax.scatter(
        x[pick], y[pick], c=np.asarray(delta.k)[pick], s=4, cmap="viridis", lw=0, alpha=0.6
    )
    fig.colorbar(sc, ax=ax, label="rejected k")
    ax.axhline(0, color="grey", lw=0.6)
    ax.axvline(0, color="grey", lw=0.6)
    if len(y):
        ys = np.array([y.min(), y.max()])
        if np.isfinite(delta.slope):
            ax.plot(
                delta.slope * ys,
                ys,
                color="tab:red",
                lw=1.2,
                label=f"fitted boundary, {delta.slope:.3g} ms/token",
            )
        lam = delta.marginal_value.get("median")
        if lam is not None and np.isfinite(lam):
            ax.plot(
                lam * ys,
                ys,
                color="black",
                ls="--",
                lw=1,
                label=f"DP marginal value, {lam:.3g} ms/token",
            )
        ax.legend(fontsize=7, loc="lower right")
    q = delta.quadrants
    ax.set_title(
        f"I {q['I']} · II {q['II']} · III {q['III']} · IV {q['IV']} · axes {q['axes']}", fontsize=8
    )
    ax.set_xlabel("ΔE[Cost] (ms)")
    ax.set_ylabel("ΔE[a] (tokens)")
    return save_agg(fig, path)


def plot_draft_time(log, draft, path: str | os.PathLike) -> Path:
    """Figure A6: T_D per round against K with T_D = a·K + b (missing timings at 0)."""
    fig, axes = agg_subplots(width=5.0, height=3.5)
    ax = axes[0, 0]
    k = log["k"].astype(float)
    td = np.nan_to_num(log["t_draft_ms"] if "t_draft_ms" in log.data else np.zeros(len(k)))
    pick = _thin(len(k), 20000)
    jitter = np.random.default_rng(0).uniform(-0.15, 0.15, len(pick))
    ax.scatter(k[pick] + jitter, td[pick], s=2, alpha=0.3, lw=0)
    if draft is not None:
        ks = np.linspace(1, k.max(), 10)
        ax.plot(
            ks,
            draft.a * ks + draft.b,
            color="tab:red",
            label=f"T_D = {draft.a:.3g}·K + {draft.b:.3g} ms",
        )
        ax.legend(fontsize=8)
    ax.set_xlabel("K")
    ax.set_ylabel("T_D (ms)")
    return save_agg(fig, path)


def plot_policies(result: dict, path: str | os.PathLike) -> Path:
    """Held-out speedup of each online policy (``specmoe policy``), with the Oracle's S_max and
    the rate-only Oracle's as lines."""
    pol = result.get("policies", {})
    names = list(pol)
    fig, ax = agg_subplots(width=7.0, height=0.32 * len(names) + 1.6)
    ax = ax[0, 0]
    y = np.arange(len(names))
    sp = [float(pol[n]["speedup"]) for n in names]
    ax.barh(
        y,
        sp,
        color=[
            "#bbbbbb" if n.startswith("fixed-") and "best" not in n else "#3b6fb6" for n in names
        ],
    )
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    s_max = result.get("oracle", {}).get("s_max")
    ro = result.get("oracle_rate_only", {}) or {}
    rate = ro.get("speedup_on_recorded", ro.get("s_max"))
    if s_max:
        ax.axvline(s_max, color="k", lw=1.5, label=f"Oracle S_max {s_max:.3f}")
        ax.axvline(0.9 * s_max, color="k", lw=1, ls=":", label="90% of S_max")
    if rate:
        ax.axvline(
            rate, color="#c0392b", lw=1.2, ls="--", label=f"rate-only Oracle's budgets {rate:.3f}"
        )
    ax.axvline(1.0, color="#777777", lw=0.8)
    ax.set_xlabel("speedup over plain decoding (held-out prompts)")
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.01), ncol=3, fontsize=7, frameon=False)
    return save_agg(fig, path)


def write_oracle_figures(log, result, out_dir: str | os.PathLike) -> list[Path]:
    """Every figure of an ``OracleResult`` into ``out_dir``; -> the paths written."""
    out = Path(out_dir)
    paths = [
        plot_oracle_bounds(result.to_json(), out / "oracle_bounds.png"),
        plot_delta_space(result.delta, out / "delta_space.png"),
    ]
    paths.append(plot_verify_cost(log, result.regression["by_k"], out / "verify_cost.png"))
    if result.regression.get("draft_time") is not None:
        paths.append(plot_draft_time(log, result.regression["draft_time"], out / "draft_time.png"))
    return paths
