"""Figures of the routing statistics (:class:`specmoe.routing.stats.RoutingStats`).

- ``reuse.png``: layer-mean reuse ρ(n) against n with the uniform curve 1 − q^(n−1) (like
  Figure 1 of paper 002), and layer-mean union U(n) against uniform N(1 − q^n), independent
  Σ_e 1 − (1 − p_e)^n and per-slot m·n; bootstrap bands where computed.
- ``overlap.png``: layer-mean pairwise overlap o(j) against the lag j with the independence
  Σ_e p_e²/m and uniform m/N baselines (paper 003 Section 6, Appendix I).
- ``layer_overlap.png``: o_l(j) per layer and lag as a heatmap, with each layer's
  independence baseline beside it (paper 003 Appendix J).

matplotlib is imported inside the functions only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specmoe.report._mpl import pyplot, save_pyplot

__all__ = ["plot_layer_overlap", "plot_overlap", "plot_reuse", "write_stats_figures"]


def plot_reuse(stats, *, title: str = ""):
    """Figure with ρ(n) and U(n), layer means, against uniform (and independent) routing."""
    plt = pyplot()
    n = np.arange(1, stats.max_n + 1)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.5, 3.6))
    iv = stats.intervals
    ax1.plot(n, stats.rho_mean, "o-", color="C0", label="measured, layer mean")
    if iv is not None:
        ax1.fill_between(
            n,
            iv.rho_mean.lo,
            iv.rho_mean.hi,
            color="C0",
            alpha=0.2,
            label=f"{iv.level:.0%} bootstrap",
        )
    ax1.plot(
        n,
        stats.uniform_rho,
        ":",
        color="k",
        label=f"uniform, 1 − q^(n−1), m/N = {stats.top_k}/{stats.num_experts}",
    )
    ax1.set(xlabel="consecutive tokens n", ylabel="reuse ρ(n)", ylim=(0, 1.02), xticks=n)
    ax1.legend(fontsize=7, loc="lower right")
    ax2.plot(n, stats.union_mean, "o-", color="C0", label="measured U(n)")
    if iv is not None:
        ax2.fill_between(n, iv.union_mean.lo, iv.union_mean.hi, color="C0", alpha=0.2)
    ax2.plot(n, stats.union_independent_mean, "--", color="C1", label="independent, popularity")
    ax2.plot(n, stats.uniform_union, ":", color="k", label="uniform, N(1 − q^n)")
    ax2.plot(n, stats.top_k * n, "-", color="0.6", lw=0.8, label="per-slot, m·n")
    ax2.set(xlabel="consecutive tokens n", ylabel="distinct experts per layer", xticks=n)
    ax2.legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def plot_overlap(stats, *, title: str = ""):
    """Figure with the layer-mean overlap o(j) per lag and its two baselines."""
    plt = pyplot()
    j = np.arange(1, stats.max_lag + 1)
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    ax.plot(j, stats.overlap_mean, "o-", color="C0", label="measured, layer mean")
    iv = stats.intervals
    if iv is not None:
        ax.fill_between(
            j,
            iv.overlap_mean.lo,
            iv.overlap_mean.hi,
            color="C0",
            alpha=0.2,
            label=f"{iv.level:.0%} bootstrap",
        )
    ind = float(stats.overlap_independent[:, 0].mean()) if stats.max_lag else np.nan
    ax.axhline(ind, ls="--", color="C1", label="independence, Σ p² / m")
    ax.axhline(stats.overlap_uniform, ls=":", color="k", label="uniform, m/N")
    ax.set(xlabel="lag j (tokens)", ylabel="overlap |S_t ∩ S_t+j| / m", ylim=(0, None))
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def plot_layer_overlap(stats, *, title: str = ""):
    """Heatmap of o_l(j) (layer × lag) with the per-layer independence baseline."""
    plt = pyplot()
    L = stats.num_layers
    fig, (ax, ax2) = plt.subplots(
        1, 2, figsize=(8, 0.6 + 0.22 * max(L, 8)), gridspec_kw={"width_ratios": [4, 1]}, sharey=True
    )
    im = ax.imshow(
        stats.overlap,
        aspect="auto",
        origin="lower",
        cmap="viridis",
        extent=(0.5, stats.max_lag + 0.5, -0.5, L - 0.5),
        vmin=0,
    )
    fig.colorbar(im, ax=ax, label="overlap o_l(j)")
    ax.set(xlabel="lag j", ylabel="MoE layer")
    labels = stats.layers if len(stats.layers) == L else list(range(L))
    step = max(1, L // 12)
    ax.set_yticks(range(0, L, step), [str(v) for v in labels[::step]])
    ax2.plot(
        stats.overlap[:, 0] if stats.max_lag else np.zeros(L), range(L), "o-", ms=3, label="o_l(1)"
    )
    ax2.plot(
        stats.overlap_independent[:, 0] if stats.max_lag else np.zeros(L),
        range(L),
        "--",
        color="C1",
        label="independence",
    )
    ax2.axvline(stats.overlap_uniform, ls=":", color="k", label="uniform")
    ax2.set(xlabel="overlap", xlim=(0, None))
    ax2.legend(fontsize=6)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def write_stats_figures(stats, out_dir, *, title: str = "") -> list[Path]:
    """Write reuse.png, overlap.png and layer_overlap.png (overlap ones need max_lag ≥ 1)."""
    out = Path(out_dir)
    makers = [("reuse.png", plot_reuse)]
    if stats.max_lag:
        makers += [("overlap.png", plot_overlap), ("layer_overlap.png", plot_layer_overlap)]
    return [save_pyplot(make(stats, title=title), out / name) for name, make in makers]
