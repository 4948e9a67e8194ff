"""Figures of the maximum-entropy union prediction (:mod:`specmoe.routing.ipf`).

``ipf_union.png``: left, the layer-mean union U(n) against n, measured and predicted by IPF,
with independent routing under measured popularity Σ_e 1 − (1 − p_e)^n and uniform routing
N(1 − q^n) (paper 003 Section 6.2); right, predicted against measured U_l(n) for every layer
(one marker per layer and n, colour by n) around the identity line, with ±2% guides.

matplotlib is imported inside the functions only. Both functions take the JSON record of
``specmoe ipf`` (:func:`specmoe.commands.ipf.build_result`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from specmoe.report._mpl import pyplot, save_pyplot

__all__ = ["plot_union", "plot_union_file"]


def plot_union(rec: dict[str, Any], *, title: str = ""):
    """The figure (see the module docstring) as a matplotlib Figure."""
    plt = pyplot()
    n = np.asarray(rec["n"], dtype=float)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    base = rec["baselines"]
    if rec.get("empirical_union") is not None:
        ax1.plot(n, rec["empirical_union"], "o-", color="k", label="measured")
    ax1.plot(n, rec["predicted_union"], "s--", color="C0", label=f"IPF ({rec['variant']})")
    ax1.plot(n, base["popularity_independent"], ":", color="C1", label="independent, popularity")
    ax1.plot(n, base["uniform_independent"], ":", color="C2", label="uniform, N(1 − q^n)")
    ax1.set(xlabel="consecutive tokens n", ylabel="distinct experts per layer (mean)", xticks=n)
    ax1.legend(fontsize=7)
    pred = np.asarray(rec["per_layer"]["predicted"], dtype=float)  # [L, S]
    emp = rec["per_layer"].get("empirical")
    if emp is not None:
        emp = np.asarray(emp, dtype=float)
        colors = plt.cm.viridis(np.linspace(0, 1, n.size))
        for s in range(n.size):
            ax2.scatter(emp[:, s], pred[:, s], s=12, color=colors[s], label=f"n={int(n[s])}")
        lo = float(min(emp.min(), pred.min()))
        hi = float(max(emp.max(), pred.max()))
        x = np.linspace(lo, hi, 2)
        ax2.plot(x, x, "-", color="0.3", lw=0.8)
        ax2.plot(x, 1.02 * x, ":", color="0.5", lw=0.8)
        ax2.plot(x, 0.98 * x, ":", color="0.5", lw=0.8, label="±2%")
        ax2.set(xlabel="measured U_l(n)", ylabel="IPF U_l(n)", title="per layer")
        ax2.legend(fontsize=6, ncol=2)
    else:
        for layer, row in enumerate(pred):
            ax2.plot(n, row, "-", lw=0.8, label=f"layer {layer}" if layer < 8 else None)
        ax2.set(xlabel="consecutive tokens n", ylabel="IPF U_l(n)", title="per layer", xticks=n)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def plot_union_file(rec: dict[str, Any], path: str | Path, *, title: str = "") -> Path:
    """Write :func:`plot_union` to ``path`` (PNG), atomically."""
    return save_pyplot(plot_union(rec, title=title), path)
