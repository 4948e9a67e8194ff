"""Figures of a bandwidth profile (``specmoe bench --out``).

* ``bandwidth.png``: effective bandwidth of each kernel against the pass size n, per-slot on
  requested bytes n·m·b and dedup on union bytes U·b, median over recorded windows with the
  interquartile range, and the measured read ceiling (like Figure 2 of paper 002).
* ``bench_time_vs_u.png``: one panel per n, the median time of each pass with chosen ids
  against U, with the fits Eq. (4) (per-slot) and Eq. (E.1) (dedup) drawn through them.
* ``roofline.png``: each kernel's time over its roofline bound max(bytes / ceiling,
  flops / peak) against n.

Each function takes the profile (a :class:`BandwidthProfile` or its JSON dict) and writes one
PNG atomically; the matplotlib Agg canvas is used directly (no pyplot state).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.report._mpl import agg_subplots, save_agg

__all__ = ["plot_bandwidth", "plot_roofline", "plot_time_vs_u", "write_figures"]

STYLE = {"per_slot": ("tab:blue", "-", "o"), "dedup": ("tab:red", "--", "s")}
PEER_COLORS = [
    "tab:green",
    "tab:purple",
    "tab:orange",
    "tab:brown",
    "tab:olive",
    "tab:cyan",
    "tab:pink",
]


def _as_dict(profile: Any) -> dict[str, Any]:
    return profile if isinstance(profile, dict) else profile.to_dict()


def _kernel_styles(d: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    ek = d.get("extra", {}).get("kernels", {})
    roles = d.get("extra", {}).get("roles", {})
    out, i = {}, 0
    for k, v in ek.items():
        role = next((r for r, name in roles.items() if name == k), None)
        if role:
            out[k] = STYLE[role]
        else:
            out[k] = (
                PEER_COLORS[i % len(PEER_COLORS)],
                "-" if v["kind"] == "per_slot" else "--",
                "^" if v["kind"] == "per_slot" else "v",
            )
            i += 1
    return out


def _title(d: dict[str, Any]) -> str:
    return f"{d.get('model', {}).get('name', '')}, {d.get('device_name', '')} {d.get('dtype', '')}"


def plot_bandwidth(profile: Any, path: str | os.PathLike) -> Path:
    """β of each kernel against n with its IQR over recorded windows, and the ceiling."""
    d = _as_dict(profile)
    fig, axes = agg_subplots()
    ax = axes[0, 0]
    n = np.asarray(d["n"])
    ek = d.get("extra", {}).get("kernels", {})
    styles = _kernel_styles(d)
    if ek:
        for k, v in ek.items():
            color, ls, marker = styles[k]
            on = "n·m·b" if v["kind"] == "per_slot" else "U·b"
            ax.plot(
                n,
                v["beta_gbps"],
                ls=ls,
                marker=marker,
                color=color,
                mfc=color if v["kind"] == "per_slot" else "white",
                label=f"{k}, on {on}",
            )
            q = np.asarray(v.get("beta_iqr_gbps") or [])
            if q.size:
                ax.fill_between(n, q[:, 0], q[:, 1], color=color, alpha=0.15, lw=0)
    else:
        for key, role in (("beta_slot", "per_slot"), ("beta_dedup", "dedup")):
            color, ls, marker = STYLE[role]
            ax.plot(n, d[key], ls=ls, marker=marker, color=color, label=role)
    ax.axhline(d["ceiling_gbps"], color="gray", ls=":", label="measured read ceiling")
    ax.set_xlabel("tokens per pass n")
    ax.set_ylabel("effective bandwidth (GB/s)")
    ax.set_ylim(bottom=0)
    ax.set_xticks(n)
    ax.set_title(f"Expert-operation bandwidth: {_title(d)}", fontsize=9)
    ax.legend(fontsize=7)
    return save_agg(fig, path)


def plot_time_vs_u(profile: Any, path: str | os.PathLike) -> Path:
    """Median time of each chosen-ids pass against U, one panel per n >= 2, with the fits."""
    d = _as_dict(profile)
    ek = d.get("extra", {}).get("kernels", {})
    m = int(d["model"]["top_k"])
    b = float(d.get("extra", {}).get("expert_bytes") or d["model"]["expert_bytes"])
    ns = [n for n in d["n"] if n >= 2]
    cols = min(4, max(1, len(ns)))
    rows = max(1, -(-len(ns) // cols))
    fig, axes = agg_subplots(rows, cols, width=3.0 * cols, height=2.4 * rows)
    styles = _kernel_styles(d)
    for i, n in enumerate(ns):
        ax = axes[i // cols, i % cols]
        for k, v in ek.items():
            color, ls, marker = styles[k]
            pts = np.asarray([p for p in v.get("chosen", []) if p[0] == n], dtype=float)
            if pts.size:
                ax.plot(pts[:, 1], pts[:, 2] * 1e3, marker, color=color, ms=3, ls="none")
                u = np.linspace(pts[:, 1].min(), pts[:, 1].max(), 30)
                f = v["fit"]
                if v["kind"] == "per_slot":
                    t = f["t_op"] + f["c_u"] * u * b + f["c_re"] * (n * m - u) * b
                else:
                    t = f["t_op"] + f["c_g"] * u * b + f["c_t"] * n
                ax.plot(u, t * 1e3, ls=ls, color=color, lw=1, label=k if i == 0 else None)
        ax.set_title(f"n = {n}", fontsize=8)
        ax.tick_params(labelsize=7)
        if i % cols == 0:
            ax.set_ylabel("time (ms)", fontsize=8)
        if i // cols == rows - 1:
            ax.set_xlabel("distinct experts U", fontsize=8)
    for j in range(len(ns), rows * cols):
        axes[j // cols, j % cols].set_visible(False)
    if ns and ek:
        axes[0, 0].legend(fontsize=6)
    fig.suptitle(f"Chosen ids: time against U with fits (4) and (E.1): {_title(d)}", fontsize=9)
    return save_agg(fig, path)


def plot_roofline(profile: Any, path: str | os.PathLike) -> Path:
    """Each kernel's time over max(bytes / ceiling, flops / peak), against n."""
    d = _as_dict(profile)
    ek = d.get("extra", {}).get("kernels", {})
    fig, axes = agg_subplots()
    ax = axes[0, 0]
    styles = _kernel_styles(d)
    for k, v in ek.items():
        color, ls, marker = styles[k]
        ax.plot(d["n"], v["roofline_ratio"], ls=ls, marker=marker, color=color, label=k)
    ax.axhline(1.0, color="gray", ls=":")
    ax.axhline(1.25, color="gray", ls="--", lw=0.8, label="1.25")
    ax.set_xlabel("tokens per pass n")
    ax.set_ylabel("time / roofline bound")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Roofline: {_title(d)}", fontsize=9)
    ax.legend(fontsize=7)
    return save_agg(fig, path)


def write_figures(profile: Any, out: str | os.PathLike) -> list[Path]:
    """All figures of a profile into the folder ``out``."""
    out = Path(out)
    d = _as_dict(profile)
    paths = [plot_bandwidth(d, out / "bandwidth.png")]
    if d.get("extra", {}).get("kernels"):
        paths.append(plot_time_vs_u(d, out / "bench_time_vs_u.png"))
        paths.append(plot_roofline(d, out / "roofline.png"))
    return paths
