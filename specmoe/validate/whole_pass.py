"""The whole-pass version of ``specmoe validate`` (docs/runs-protocol-whole-pass.md).

tau_hat_p(n) = the sum of every other operation's fit of the per-operation benchmark at the
configuration's depth (:func:`specmoe.cost.ops_fit.whole_pass_time`, Eq. (22) generalised to
every operation) plus the plan's expert operation of Eq. (5) of paper 002, E_p(n)/beta_p(n);
it does not use the measured tau(1). :func:`scored_version` reads a rule set's
``scored_version`` (``rules-whole-pass.json`` names ``whole_pass``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from specmoe._io import read_json
from specmoe.cost.ops_fit import whole_pass_time
from specmoe.cost.plan_result import Plan
from specmoe.errors import InputError
from specmoe.validate.rules import RuleSet

__all__ = ["scored_version", "whole_pass_version"]


def whole_pass_version(
    plan: Plan, profile: Any, depth: int | None, n_max: int
) -> tuple[dict[str, Any] | None, str | None]:
    """The whole-pass version at n = 1..n_max, {verify_ms, expert_ms} per kernel and its
    combined error ``epsilon`` (the largest of the plan's), with a note; (None, note) when the
    plan has no ``whole_pass`` or too few pass sizes. The other operations are summed at the
    configuration's ``depth`` from the profile's ``whole_pass``; without one, the plan's own
    sums at its context are used (and said in the note)."""
    wp = plan.whole_pass
    if wp is None:
        return None, None
    if len(wp.ops_ms) < n_max:
        return None, (
            f"whole-pass version not scored: the plan predicts n <= {len(wp.ops_ms)}, "
            f"the runs reach n = {n_max}"
        )
    note = None
    prof_wp = getattr(profile, "whole_pass", None)
    if prof_wp is not None and depth is not None:
        ops = np.array(
            [whole_pass_time(prof_wp, n, int(depth), wp.num_layers)[0] for n in range(1, n_max + 1)]
        )
    else:
        ops = np.asarray(wp.ops_ms[:n_max], float)
        note = f"whole-pass version: the plan's sums at depth {wp.context} (no profile whole_pass)"
    expert = {p: np.asarray(wp.expert_ms[p][:n_max], float) for p in ("per_slot", "dedup")}
    version = {
        "verify_ms": {p: ops + e for p, e in expert.items()},
        "expert_ms": expert,
        "epsilon": float(wp.epsilon_max),
    }
    return version, note


def scored_version(rules: RuleSet) -> str:
    """The rule set's ``scored_version`` (the version its rules named ``prediction`` stand
    for): ``prediction`` unless the file names another."""
    try:
        raw = read_json(Path(rules.path), "rules file")
    except InputError:
        return "prediction"
    v = raw.get("scored_version", "prediction") if isinstance(raw, dict) else "prediction"
    return v if isinstance(v, str) else "prediction"
