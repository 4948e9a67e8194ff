"""Figures of a validation (``specmoe validate --out``), after Figures 4 and 5 of paper 002.

* ``validate_saving.png``: per configuration, the measured saving S(n) (with its interval when
  per-prompt times exist), the prediction with the band of bound (18), the measured-time and
  the calibrated versions.
* ``validate_kstar.png``: per configuration, the measured best draft length k*(a) and each
  version's k_hat*(a), with the within-one band.
* ``validate_verify.png``: per configuration, the measured verify time with deduplication off
  and on (with its interval when the validation has intervals), against each version's.

With the whole-pass version its curves join the others'. A validation under a rule set with
intervals (``rules-whole-pass.json``) adds:

* ``validate_tau.png``: per configuration and kernel, each version's relative verify-time
  error (tau_hat(n) - tau(n))/tau(n) at every n, with the range the measured interval of tau(n)
  gives it, against the rule's 10%;
* ``validate_loss.png``: per configuration, the throughput lost at each version's k_hat*(a)
  with its interval against the rule's 5%, and the share of resamples whose measured k* is
  within one of k_hat*(a).

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

__all__ = [
    "plot_kstar",
    "plot_loss",
    "plot_saving",
    "plot_tau",
    "plot_verify",
    "write_validation_figures",
]

STYLE = {
    "prediction": ("tab:red", "-", "prediction"),
    "measured_time": ("tab:grey", "--", "measured-time version"),
    "calibrated": ("tab:blue", ":", "calibrated version"),
    "whole_pass": ("tab:green", "-.", "whole-pass prediction"),
}


def _styles(c) -> list[tuple[str, tuple[str, str, str]]]:
    """The versions a configuration has, in the order and style of :data:`STYLE`."""
    return [(k, st) for k, st in STYLE.items() if k in c.versions]


def _rule_value(v: Validation, metric: str) -> float | None:
    """The value of the first rule on ``metric`` (the line a figure draws), if any."""
    return next((r.rule.value for r in v.rules if r.rule.metric == metric), None)


def _yerr(point: np.ndarray, iv: Any) -> np.ndarray | None:
    """Error-bar lengths [2, m] of the intervals ``iv`` [m, 2] around ``point`` [m]; None when
    there are none (missing bounds count as zero length)."""
    if iv is None:
        return None
    a = np.array([[np.nan if x is None else x for x in r] for r in iv], float)
    p = np.asarray(point, float)[: len(a)]
    return np.nan_to_num(np.clip([p - a[:, 0], a[:, 1] - p], 0, None))


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
        if c.measured.saving_ms is None:  # one kernel timed: no saving to draw
            ax.text(0.5, 0.5, "one kernel timed (dedup):\nno saving measured", ha="center",
                    va="center", transform=ax.transAxes, fontsize=9)  # fmt: skip
            ax.set_title(c.name, fontsize=9)
            continue
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
        for name, (color, ls, label) in _styles(c):
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
    if axes[0].get_legend_handles_labels()[0]:
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
        mi = c.measured.intervals
        if mi is not None and mi.k_star is not None:
            ax.errorbar(
                a,
                km,
                yerr=_yerr(km, mi.k_star),
                fmt="none",
                ecolor="black",
                elinewidth=0.8,
                capsize=2,
                label="k* 95% interval",
            )
        offs = {"prediction": -0.12, "measured_time": 0.0, "calibrated": 0.12, "whole_pass": 0.24}
        for name, (color, _ls, label) in _styles(c):
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
        if c.measured.verify_off_ms is not None:
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
        mi = c.measured.intervals
        if mi is not None:
            for meas, ivs in (
                (c.measured.verify_off_ms, mi.verify_off_ms),
                (c.measured.verify_on_ms, mi.verify_on_ms),
            ):
                if ivs is not None and meas is not None:
                    ax.errorbar(
                        n,
                        meas,
                        yerr=_yerr(meas, ivs),
                        fmt="none",
                        ecolor="black",
                        elinewidth=0.8,
                        capsize=2,
                    )
        for name, (color, ls, label) in _styles(c):
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


def plot_tau(v: Validation, path: str | os.PathLike) -> Path:
    """Each version's relative verify-time error at every n, per kernel, with the range that
    the measured interval of tau(n) gives it, against the verify-error rule."""
    cfgs = v.configurations
    fig = agg_figure(8.4, 3.2 * max(1, len(cfgs)), dpi=110)
    limit = _rule_value(v, "verify_error")
    kernels = (("per_slot", "verify_off_ms", "dedup off"), ("dedup", "verify_on_ms", "dedup on"))
    for i, c in enumerate(cfgs):
        n = np.asarray(c.n)
        mi = c.measured.intervals
        for j, (kernel, field, title) in enumerate(kernels):
            ax = fig.add_subplot(max(1, len(cfgs)), 2, 2 * i + j + 1)
            if getattr(c.measured, field) is None:  # one kernel timed (dedup)
                ax.text(0.5, 0.5, f"{title}: not timed", ha="center", va="center",
                        transform=ax.transAxes, fontsize=9)  # fmt: skip
                ax.set_title(f"{c.name}, {title}", fontsize=9)
                continue
            tau = np.asarray(getattr(c.measured, field), float)
            ivs = None if mi is None else getattr(mi, field)
            if limit is not None:
                ax.axhspan(-limit, limit, color="0.9", label=f"±{limit:.0%} (rule)")
            ax.axhline(0.0, color="grey", lw=0.7)
            for name, (color, ls, label) in _styles(c):
                pred = np.asarray(getattr(c.versions[name].verify_ms, kernel), float)[: len(tau)]
                err = pred / tau - 1
                ax.plot(n, err, ls=ls, color=color, marker=".", lw=1.3, label=label)
                if ivs is not None:
                    a = np.array([[np.nan if x is None else x for x in r] for r in ivs], float)
                    ax.fill_between(
                        n, pred / a[:, 1] - 1, pred / a[:, 0] - 1, color=color, alpha=0.2
                    )
            ax.set_title(f"{c.name}, {title}", fontsize=9)
            ax.set_xlabel("tokens per pass n")
            ax.set_ylabel("(predicted − measured) / measured")
            ax.yaxis.set_major_formatter(_percent())
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    return save_agg(fig, path)


def _percent():
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(1.0, decimals=0)


def plot_loss(v: Validation, path: str | os.PathLike) -> Path:
    """The loss at each version's k_hat*(a) with its interval against the loss rule, and the
    share of resamples whose k* is within one of k_hat*(a)."""
    cfgs = v.configurations
    fig = agg_figure(8.4, 3.2 * max(1, len(cfgs)), dpi=110)
    limit = _rule_value(v, "max_loss")
    for i, c in enumerate(cfgs):
        a = np.asarray(c.acceptance_values, float)
        ax = fig.add_subplot(max(1, len(cfgs)), 2, 2 * i + 1)
        bx = fig.add_subplot(max(1, len(cfgs)), 2, 2 * i + 2)
        if limit is not None:
            ax.axhline(limit, color="black", lw=0.8, ls="--", label=f"{limit:.0%} (rule)")
        width = 0.012
        styles = _styles(c)
        for j, (name, (color, _ls, label)) in enumerate(styles):
            s = c.versions[name]
            x = a + (j - (len(styles) - 1) / 2) * width
            loss = np.asarray(s.loss, float)
            iv = None if s.intervals is None else s.intervals.loss
            ax.errorbar(
                x, loss, yerr=_yerr(loss, iv), fmt="o", ms=3.5, color=color, capsize=2, label=label
            )
            if s.intervals is not None and s.intervals.kstar_share is not None:
                bx.plot(a, s.intervals.kstar_share, "s-", color=color, ms=3.5, lw=1.0, label=label)
        ax.set_title(f"{c.name}: loss at k̂*", fontsize=9)
        ax.set_xlabel("acceptance a")
        ax.set_ylabel("1 − T(k̂*)/T(k*)")
        ax.yaxis.set_major_formatter(_percent())
        bx.set_title("share of resamples with k* within one of k̂*", fontsize=9)
        bx.set_xlabel("acceptance a")
        bx.set_ylim(-0.05, 1.05)
        if i == 0:
            ax.legend(fontsize=7)
    return save_agg(fig, path)


def write_validation_figures(
    validation: Validation | dict[str, Any], out_dir: str | os.PathLike
) -> list[Path]:
    """validate_saving.png, validate_kstar.png and validate_verify.png in ``out_dir`` (and
    validate_tau.png, validate_loss.png when the validation has intervals); a validation.json
    dict is read with :meth:`Validation.from_dict`."""
    v = validation if isinstance(validation, Validation) else Validation.from_dict(validation)
    out = Path(out_dir)
    if not v.configurations:
        return []
    figs = [
        plot_saving(v, out / "validate_saving.png"),
        plot_kstar(v, out / "validate_kstar.png"),
        plot_verify(v, out / "validate_verify.png"),
    ]
    if any(c.measured.intervals is not None for c in v.configurations):
        figs += [plot_tau(v, out / "validate_tau.png"), plot_loss(v, out / "validate_loss.png")]
    return figs
