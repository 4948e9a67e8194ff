"""The Oracle analysis of a set of runs: regression, S_max against L_max, Delta space.

Legend for shapes: ``G`` generations, ``n`` positions, ``K`` the largest budget.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np

from specmoe.errors import InputError
from specmoe.formats.roundlog import RoundLog, read_round_log
from specmoe.oracle.costmodel import CostModel, fitted_cost_model, measured_cost_model
from specmoe.oracle.counterfactual import Counterfactual, build_counterfactual
from specmoe.oracle.delta import DeltaSpace, delta_space
from specmoe.oracle.ssp import OracleSummary, summarise, survival

__all__ = ["OracleResult", "load_runs", "oracle_analysis", "oracle_costs"]


def load_runs(path: str | os.PathLike) -> RoundLog:
    """Read round logs for the Oracle: several budgets and the counterfactual columns."""
    from specmoe.oracle.counterfactual import _require_counterfactual

    log = read_round_log(path)
    ks = log.budgets
    if len(ks) < 2:
        raise InputError(
            f"{path}: one budget only (K={int(ks[0])}); the Oracle needs runs at "
            "several budgets to fit the cost of each"
        )
    _require_counterfactual(log)
    return log


def make_cost_model(log: RoundLog, kind: str, k_max: int, *, fits=None, draft=None) -> CostModel:
    """The cost the Oracle optimises: ``model`` (per-K fits) or ``measured`` (medians)."""
    if kind == "model":
        from specmoe.oracle.regression import fit_draft_time, fit_verify_by_k

        fits = fit_verify_by_k(log) if fits is None else fits
        draft = fit_draft_time(log) if draft is None else draft
        return fitted_cost_model(fits, draft, k_max)
    if kind == "measured":
        td = log["t_draft_ms"] if "t_draft_ms" in log.data else np.full(len(log), np.nan)
        return measured_cost_model(log["k"], log["t_verify_ms"], td, k_max)
    raise InputError(f"{kind!r} (choose model or measured)", argument="kind")


def oracle_costs(cf: Counterfactual, model: CostModel) -> np.ndarray:
    """C [G, n, K+1] at every position of every reference sequence; infinite for a budget the
    drafter cannot fill there (k > A_i, :meth:`Counterfactual.feasible`)."""
    cost = model.truncate(cf.k_max).evaluate(cf.union, cf.context)
    return np.where(cf.feasible(), cost, np.inf)  # budgets above A_i: never chosen


@dataclass(frozen=True, eq=False)
class OracleResult:
    summaries: list[OracleSummary]
    delta: DeltaSpace
    regression: dict
    cost_model: CostModel
    counterfactual: dict
    l_max_recorded: int
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # unphysical fit constants (regression.fit_warnings)

    def to_json(self) -> dict:
        s = self.summaries
        return {
            "l_max": [x.l_max for x in s],
            "s_max": [x.s_max for x in s],
            "mean_k": [x.mean_k for x in s],
            "mean_accepted": [x.mean_accepted for x in s],
            "cap_rate": [x.cap_rate for x in s],
            "rounds": [x.rounds for x in s],
            "time_ms": [x.time_ms for x in s],
            "plain_ms": s[0].plain_ms if s else None,
            "tokens": s[0].tokens if s else 0,
            "l_max_recorded": self.l_max_recorded,
            "delta_space": self.delta.summary(),
            "cost_model": self.cost_model,
            "counterfactual": self.counterfactual,
            "regression": self.regression,
            "notes": list(self.notes),
            "warnings": list(self.warnings),
        }


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def oracle_analysis(
    log: RoundLog,
    *,
    l_max: int = 8,
    cost: str = "model",
    acceptance: str = "counterfactual",
    n_boot: int = 999,
    seed: int = 0,
    tables: bool = True,
    quiet: bool = True,
) -> OracleResult:
    """Figure 2 (S_max, mean k, mean accepted against L_max = 1..l_max), Figure 3 (Delta
    space at l_max), the per-budget fits and draft-time model and, with ``tables``, every
    table of Appendix A (``regression.regression_report``). ``cost`` is the ``kind`` of
    :func:`make_cost_model`; ``acceptance`` that of :func:`build_counterfactual`."""
    if l_max < 1:
        raise InputError(f"{l_max} (must be >= 1)", argument="l_max")
    if cost not in ("model", "measured"):
        raise InputError(f"{cost!r} (choose model or measured)", argument="cost")
    _say("building counterfactual reference sequences", quiet)
    cf = build_counterfactual(log, acceptance=acceptance)
    top = min(l_max, cf.k_max)
    from specmoe.oracle.regression import (
        fit_draft_time,
        fit_verify_by_k,
        fit_warnings,
        regression_report,
    )

    if tables:
        _say("fitting verification cost (per budget, robustness)", quiet)
        report = regression_report(log, n_boot=n_boot, seed=seed)
    else:
        _say("fitting verification cost per budget", quiet)
        fits_k = fit_verify_by_k(log)
        report = {"by_k": [fits_k[k] for k in sorted(fits_k)], "draft_time": fit_draft_time(log)}
    fits = {f.k: f for f in report["by_k"]}
    draft = report["draft_time"]
    model = make_cost_model(log, cost, cf.k_max, fits=fits, draft=draft)
    cost_full = oracle_costs(cf, model)
    summaries = []
    sol = None
    for lm in range(1, top + 1):
        _say(f"Oracle at L_max={lm}", quiet)
        summary, sol, _ = summarise(cost_full[:, :, : lm + 1], cf.q, cf.length)
        summaries.append(summary)
    surv = survival(cf.q, top, cost_full.shape[1])
    delta = delta_space(
        cost_full[:, :, : top + 1], surv, sol.value, sol.policy, cf.round_gen, cf.round_start
    )
    info = {
        "generations": len(cf.length),
        "positions": cf.num_positions,
        "recorded_rounds": len(cf.round_gen),
        "acceptance": acceptance,
        "known_share": float(
            cf.known[:, 1:][
                np.arange(cf.known.shape[1] - 1)[None, :] < cf.length[:, None] - 1
            ].mean()
        )
        if cf.num_positions > len(cf.length)
        else float("nan"),
        "union_gap": cf.union_gap[: top + 1].tolist(),
        "cost": cost,
    }
    notes = []
    if l_max > cf.k_max:
        notes.append(f"L_max capped at {cf.k_max}, the largest recorded budget")
    for k, src in enumerate(model.source[: top + 1]):
        if src != k:
            notes.append(f"no rounds at K={k}: its cost uses the fit (or median) at K={src}")
    for n in notes:
        _say(f"note: {n}", quiet)
    warn = tuple(fit_warnings(fits[k] for k in sorted(fits)))
    return OracleResult(summaries, delta, report, model, info, cf.k_max, tuple(notes), warn)
