"""Figures of a validation (``specmoe validate --out``), after Figures 4 and 5 of paper 002.

* ``validate_saving.png``: per configuration, the measured saving S(n) (with its interval when
  per-prompt times exist), the prediction with the band of bound (18), the measured-time and
  the calibrated versions.
* ``validate_kstar.png``: per configuration, the measured best draft length k*(a) and each
  version's k_hat*(a), with the within-one band.
* ``validate_verify.png``: per configuration, the measured verify time with deduplication off
  and on, against each version's.

Each function takes a :class:`~specmoe.validate.result.Validation` and writes one PNG atomically
with the matplotlib Agg canvas (no pyplot state); :func:`write_validation_figures` also takes
the validation.json dict (the report reads it from disk).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.report._mpl import agg_figure, save_agg
from specmoe.validate.result import Validation

__all__ = ["plot_kstar", "plot_saving", "plot_verify", "write_validation_figures"]

STYLE = {
    "prediction": ("tab:red", "-", "prediction"),
    "measured_time": ("tab:grey", "--", "measured-time version"),
    "calibrated": ("tab:blue", ":", "calibrated version"),
}


def _grid(count: int, *, width: float = 4.2, height: float = 3.2):
    cols = min(count, 2) or 1
    rows = max(1, math.ceil(count / cols))
    fig = agg_figure(width * cols, height * rows, dpi=110)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(max(count, 1))]
    return fig, axes


def plot_saving(v: Validation, path: str | os.PathLike) -> Path:
    """Saving S(n) measured against the three versions, with the band of Eq. (18)."""
    cfgs = v.configurations
    fig, axes = _grid(len(cfgs))
    for ax, c in zip(axes, cfgs):
        n_all = np.asarray(c.n)
        sc = np.asarray(c.scored_n)
        idx = sc - 1
        S = np.asarray(c.measured.saving_ms, float)
        pred = c.prediction
        S_hat = np.asarray(pred.saving_ms, float)
        band = np.asarray(pred.band_ms, float)
        ax.fill_between(
            sc,
            S_hat[idx] - band,
            S_hat[idx] + band,
            color="tab:red",
            alpha=0.18,
            label=f"bound (18), eps = {v.epsilon:.3f}",
        )
        for name, (color, ls, label) in STYLE.items():
            ax.plot(n_all, c.versions[name].saving_ms, ls=ls, color=color, lw=1.4, label=label)
        iv = c.measured.saving_interval_ms
        if iv:
            iv = np.asarray(iv, float)
            ax.errorbar(
                sc,
                S[idx],
                yerr=np.clip([S[idx] - iv[:, 0], iv[:, 1] - S[idx]], 0, None),
                fmt="none",
                ecolor="black",
                elinewidth=0.8,
                capsize=2,
            )
        ax.plot(n_all, S, "o", color="black", ms=4, label="measured S(n)")
        ax.axhline(0.0, color="grey", lw=0.7)
        inside = pred.saving_in_band_count
        ax.set_title(f"{c.name}  ({inside} of {len(sc)} in band)", fontsize=9)
        ax.set_xlabel("tokens per pass n")
        ax.set_ylabel("saving (ms)")
    axes[0].legend(fontsize=7)
    return save_agg(fig, path)


def plot_kstar(v: Validation, path: str | os.PathLike) -> Path:
    """Measured best draft length against acceptance, with each version's k_hat*."""
    cfgs = v.configurations
    fig, axes = _grid(len(cfgs))
    for ax, c in zip(axes, cfgs):
        a = np.asarray(c.acceptance_values, float)
        km = np.asarray(c.measured.k_star, float)
        ax.fill_between(a, km - 1, km + 1, color="0.85", step="mid", label="within one")
        ax.plot(a, km, "o-", color="black", drawstyle="steps-mid", label="measured k*")
        offs = {"prediction": -0.12, "measured_time": 0.0, "calibrated": 0.12}
        for name, (color, _ls, label) in STYLE.items():
            kh = np.asarray(c.versions[name].k_hat, float) + offs[name]
            ax.plot(a, kh, "s", mfc="none", color=color, ms=5, label=f"k̂* {label}")
        ax.set_title(f"{c.name}  ({c.kstar_within_one} of {len(a)} within one)", fontsize=9)
        ax.set_xlabel("acceptance a")
        ax.set_ylabel("draft length")
        ax.set_ylim(-1.2, max(c.k) + 1.2)
    axes[0].legend(fontsize=7, loc="upper left")
    return save_agg(fig, path)


def plot_verify(v: Validation, path: str | os.PathLike) -> Path:
    """Verify time with deduplication off (per-slot) and on against each version's."""
    cfgs = v.configurations
    fig, axes = _grid(len(cfgs))
    for ax, c in zip(axes, cfgs):
        n = np.asarray(c.n)
        ax.plot(
            n,
            c.measured.verify_off_ms,
            "o",
            color="black",
            mfc="none",
            ms=5,
            label="measured, dedup off",
        )
        ax.plot(
            n,
            c.measured.verify_on_ms,
            "o",
            color="black",
            ms=4,
            label="measured, dedup on",
        )
        for name, (color, ls, label) in STYLE.items():
            ax.plot(
                n,
                c.versions[name].verify_ms.dedup,
                ls=ls,
                color=color,
                label=f"{label}, dedup",
            )
        ax.set_title(c.name, fontsize=9)
        ax.set_xlabel("tokens per pass n")
        ax.set_ylabel("verify time (ms)")
    axes[0].legend(fontsize=7)
    return save_agg(fig, path)


def write_validation_figures(
    validation: Validation | dict[str, Any], out_dir: str | os.PathLike
) -> list[Path]:
    """validate_saving.png, validate_kstar.png and validate_verify.png in ``out_dir``; a
    validation.json dict is read with :meth:`Validation.from_dict`."""
    v = validation if isinstance(validation, Validation) else Validation.from_dict(validation)
    out = Path(out_dir)
    if not v.configurations:
        return []
    return [
        plot_saving(v, out / "validate_saving.png"),
        plot_kstar(v, out / "validate_kstar.png"),
        plot_verify(v, out / "validate_verify.png"),
    ]
