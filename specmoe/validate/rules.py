"""The pre-registered rule set of ``specmoe validate`` and the scores it decides on.

The rules and their tolerances live in ``specmoe/validate/rules.json`` (package data), written
before the runs they score (paper 002 Section 4.4 and Table 8 do the same for DeepSeek-V2-Lite).
:func:`load_rules` reads and checks that file (or another rule set the caller names), and
:func:`decide` compares a configuration's scores against each rule, unchanged.

The score functions are pure functions of arrays, one per quantity of Tables 3, 4, 7 and 8 of
paper 002: :func:`crossover_distance`, :func:`kstar_scores`, :func:`saving_band_scores`,
:func:`verify_error`, :func:`step_time_error`, :func:`speedup_scores`, :func:`sign_scores`.
The theory (best draft length, speedup) and the bounds (18), (20), (21) come from
:mod:`specmoe.cost`; nothing here re-derives them.

Legend: ``n`` pass sizes, ``A`` acceptance values, ``K`` draft lengths 0..k_max, ``P`` prompts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import operator
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.cost import bounds, theory
from specmoe.errors import InputError
from specmoe.validate.intervals import decided

__all__ = [
    "METRICS",
    "VERSIONS",
    "Rule",
    "RuleSet",
    "RuleVerdict",
    "crossover_distance",
    "decide",
    "default_rules_path",
    "kstar_scores",
    "load_rules",
    "saving_band_scores",
    "sign_scores",
    "speedup_scores",
    "step_time_error",
    "verify_error",
]

RULES_SCHEMA = "specmoe.validate_rules/1"  # the schema id predates the file's move; it stays
VERSIONS = ("prediction", "measured_time", "calibrated")
METRICS = (
    "kstar_within_one",
    "verify_error",
    "crossover_distance",
    "saving_in_band_share",
    "max_loss",
    "sign_agreement_share",
    "speedup_in_bound_share",
    "saving_error_ms",
    "delta",
)
_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq}


# ------------------------------------------------------------------------------------------
# the rule set


@dataclass(frozen=True)
class Rule:
    """One scoring rule: ``metric`` of ``version`` compared by ``op`` with ``value``.

    With ``of`` (a count rule such as "at >= 10 of 11 acceptance values") the metric is a count
    over ``total`` values and the rule holds when count/total op value/of, so the same share
    applies when a run has another number of acceptance values. ``not_applicable`` (the rule
    file's reason, e.g. the crossover on an engine with one kernel) marks a rule that is
    reported and never decided: its verdict is holds = None; such a rule is not required."""

    id: str
    version: str
    metric: str
    op: str
    value: float
    text: str
    required: bool = True
    of: int | None = None
    not_applicable: str | None = None

    def holds(self, measured: float | None, total: int | None = None) -> bool | None:
        """The verdict on ``measured``; None when it could not be scored."""
        if measured is None or (isinstance(measured, float) and not math.isfinite(measured)):
            return None
        if self.of is not None:
            if not total:
                return None
            # count/total op value/of, compared without division
            return bool(_OPS[self.op](measured * self.of, self.value * total))
        return bool(_OPS[self.op](measured, self.value))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rule:
        """A rule as a validation.json verdict or summary spells it (already checked)."""
        return cls(
            id=d["id"],
            version=d["version"],
            metric=d["metric"],
            op=d["op"],
            value=d["value"],
            text=d["text"],
            required=d["required"],
            of=d["of"],
            not_applicable=d.get("not_applicable"),
        )


# the rule's own fields, in the order each JSON record of validation.json writes them
VERDICT_ORDER = ("id", "version", "metric", "op", "value", "of", "required", "text")
SUMMARY_ORDER = ("id", "text", "version", "metric", "op", "value", "of", "required")


def rule_fields(rule: Rule, order: tuple[str, ...]) -> dict[str, Any]:
    """The fields of ``rule`` named in ``order``, in that order (for the JSON records)."""
    return {key: getattr(rule, key) for key in order}


@dataclass(frozen=True)
class RuleVerdict:
    """One rule against one configuration: the ``measured`` score (of ``total`` values for a
    count rule) and whether it holds (None: not scored). Under a rule set with
    ``definitions.intervals`` (``with_interval``) also the metric's bootstrap ``interval``
    [lo, hi] and whether it ``decided`` the verdict (it lies on one side of the rule's value);
    ``holds`` stays the point estimate's verdict."""

    rule: Rule
    measured: Any
    total: int | None
    holds: bool | None
    interval: tuple[float, float] | None = None
    decided: bool | None = None
    with_interval: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = {
            **rule_fields(self.rule, VERDICT_ORDER),
            "measured": self.measured,
            "total": self.total,
            "holds": self.holds,
        }
        if self.rule.not_applicable is not None:
            d["not_applicable"] = self.rule.not_applicable
        if self.with_interval:
            d["interval"] = None if self.interval is None else list(self.interval)
            d["decided"] = self.decided
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RuleVerdict:
        iv = d.get("interval")
        return cls(
            rule=Rule.from_dict(d),
            measured=d["measured"],
            total=d["total"],
            holds=d["holds"],
            interval=None if iv is None else (iv[0], iv[1]),
            decided=d.get("decided"),
            with_interval="interval" in d,
        )


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]
    path: str
    sha256: str
    title: str
    n_min: int
    n_max: int
    acceptance_values: int
    verify_error_kernels: tuple[str, ...]
    speedup_reference: str
    sign_level: float
    sign_resamples: int
    sign_seed: int
    band_edge_inside: bool
    definitions: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def measured_side(self) -> dict[str, Any] | None:
        """``definitions.measured`` (the statistics of the measured side, e.g. tau_p(n) as the
        mean over prompts of per-prompt medians), or None: the rule set predates it and the
        runs' summaries are scored as given."""
        m = self.definitions.get("measured")
        return m if isinstance(m, dict) else None

    @property
    def verify_side(self) -> str:
        """Where tau_p(n) is measured: ``"sweep"`` (the verify runs, the default) or
        ``"rounds"`` (``definitions.measured.verify_side``: the oracle generations' own
        verification passes, :func:`specmoe.formats.runs.rounds_verify_side`)."""
        m = self.measured_side
        return str(m.get("verify_side", "sweep")) if m is not None else "sweep"

    @property
    def throughput_side(self) -> str:
        """How T(k, a) is measured: ``"generations"`` (the median over prompts x repeats of
        each generation's tokens per second, the default) or ``"steps"``
        (``definitions.measured.throughput_side``: G_a(k) over the measured step time V(k),
        :func:`specmoe.validate.whole_pass.steps_throughput`)."""
        m = self.measured_side
        return str(m.get("throughput_side", "generations")) if m is not None else "generations"

    @property
    def interval_settings(self) -> tuple[float, int, int]:
        """(level, resamples, seed) of ``definitions.intervals``, else of ``sign_interval``."""
        iv = self.definitions.get("intervals")
        if not isinstance(iv, dict):
            return self.sign_level, self.sign_resamples, self.sign_seed
        return (
            float(iv.get("level", self.sign_level)),
            int(iv.get("resamples", self.sign_resamples)),
            int(iv.get("seed", self.sign_seed)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "sha256": self.sha256,
            "title": self.title,
            "rules": [dataclasses.asdict(r) for r in self.rules],
        }


def default_rules_path() -> Path:
    """The pre-registered rule set shipped with the package."""
    return Path(str(resources.files("specmoe.validate") / "rules.json"))


def _get(d: dict, key: str, path: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    if key not in d:
        raise InputError(f"{path}: {where}{key} is missing")
    v = d[key]
    if isinstance(v, bool) and kind is not bool:
        raise InputError(f"{path}: {where}{key} must be {kind}, got {v!r}")
    if not isinstance(v, kind):
        raise InputError(f"{path}: {where}{key} has the wrong type ({type(v).__name__})")
    return v


def _bad(name: str, message: str) -> InputError:
    """An error in the rule set ``name``, naming load_rules's ``path`` argument."""
    return InputError(f"{name}: {message}", argument="path")


def load_rules(path: str | os.PathLike | None = None) -> RuleSet:
    """Read and check a rule set (default: the pre-registered one). Any problem is a one-line
    ``InputError`` naming the file."""
    p = default_rules_path() if path is None else Path(path)
    name = str(path) if path is not None else "specmoe/validate/rules.json"
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise _bad(name, "no such rules file") from None
    except OSError as exc:
        raise _bad(name, f"cannot read ({exc})") from None
    try:
        d = json.loads(raw)
    except ValueError as exc:
        raise _bad(name, f"not JSON ({exc})".splitlines()[0]) from None
    if not isinstance(d, dict) or d.get("schema") != RULES_SCHEMA:
        raise _bad(name, f"not a rule set (schema must be {RULES_SCHEMA!r})")
    defs = _get(d, "definitions", name, dict)
    side = (
        defs.get("measured", {}).get("verify_side")
        if isinstance(defs.get("measured"), dict)
        else None
    )
    if side is not None and side not in ("sweep", "rounds"):
        raise _bad(
            name, f"definitions.measured.verify_side must be 'sweep' or 'rounds', got {side!r}"
        )
    tside = (
        defs["measured"].get("throughput_side") if isinstance(defs.get("measured"), dict) else None
    )
    if tside is not None and tside not in ("generations", "steps"):
        raise _bad(
            name,
            f"definitions.measured.throughput_side must be 'generations' or 'steps', got {tside!r}",
        )
    ps = _get(defs, "pass_sizes", name, dict, "definitions.")
    n_min = _get(ps, "min", name, int, "definitions.pass_sizes.")
    n_max = _get(ps, "max", name, int, "definitions.pass_sizes.")
    if not 2 <= n_min <= n_max:
        raise _bad(name, f"pass_sizes must have 2 <= min <= max, got {n_min}..{n_max}")
    if defs.get("crossover_none_as", "n_max + 1") != "n_max + 1":
        raise _bad(name, "crossover_none_as must be 'n_max + 1'")
    kernels = tuple(_get(defs, "verify_error_kernels", name, list, "definitions."))
    if not kernels or any(k not in ("per_slot", "dedup") for k in kernels):
        raise _bad(name, "verify_error_kernels must name per_slot and/or dedup")
    ref = defs.get("speedup_reference", "step_times")
    if ref not in ("step_times", "throughput_runs"):
        raise _bad(name, f"speedup_reference must be step_times or throughput_runs, got {ref!r}")
    sign = defs.get("sign_interval", {})
    sign = sign if isinstance(sign, dict) else {}
    level = float(sign.get("level", 0.95))
    if not 0 < level < 1:
        raise _bad(name, "sign_interval.level must lie in (0, 1)")
    iv = defs.get("intervals")
    if iv is not None:
        if not isinstance(iv, dict):
            raise _bad(name, "definitions.intervals must be an object")
        lv, nb, sd = iv.get("level", 0.95), iv.get("resamples", 2000), iv.get("seed", 0)
        if isinstance(lv, bool) or not isinstance(lv, int | float) or not 0 < lv < 1:
            raise _bad(name, "definitions.intervals.level must lie in (0, 1)")
        if isinstance(nb, bool) or not isinstance(nb, int) or nb < 1:
            raise _bad(name, "definitions.intervals.resamples must be a positive integer")
        if isinstance(sd, bool) or not isinstance(sd, int) or sd < 0:
            raise _bad(name, "definitions.intervals.seed must be a non-negative integer")
    rules = []
    seen = set()
    for i, r in enumerate(_get(d, "rules", name, list)):
        where = f"rules[{i}]."
        if not isinstance(r, dict):
            raise _bad(name, f"rules[{i}] must be an object")
        rid = _get(r, "id", name, str, where)
        if rid in seen:
            raise _bad(name, f"rule id {rid!r} appears twice")
        seen.add(rid)
        version = _get(r, "version", name, str, where)
        if version not in VERSIONS:
            raise _bad(
                name, f"rule {rid!r}: version {version!r} is not one of {', '.join(VERSIONS)}"
            )
        metric = _get(r, "metric", name, str, where)
        if metric not in METRICS:
            raise _bad(name, f"rule {rid!r}: metric {metric!r} is not one of {', '.join(METRICS)}")
        op = _get(r, "op", name, str, where)
        if op not in _OPS:
            raise _bad(name, f"rule {rid!r}: op {op!r} is not one of {', '.join(_OPS)}")
        value = _get(r, "value", name, int | float, where)
        of = r.get("of")
        if of is not None and (isinstance(of, bool) or not isinstance(of, int) or of < 1):
            raise _bad(name, f"rule {rid!r}: of must be a positive integer")
        na = r.get("not_applicable")
        if na is not None and (not isinstance(na, str) or not na.strip()):
            raise _bad(name, f"rule {rid!r}: not_applicable must be a non-empty reason")
        if na is not None and r.get("required", True):
            raise _bad(name, f"rule {rid!r}: a rule that is not applicable cannot be required")
        rules.append(
            Rule(
                id=rid,
                version=version,
                metric=metric,
                op=op,
                value=float(value),
                text=str(r.get("text", "")),
                required=bool(r.get("required", True)),
                of=of,
                not_applicable=na,
            )
        )
    if not rules:
        raise _bad(name, "holds no rules")
    return RuleSet(
        rules=tuple(rules),
        path=name,
        sha256=hashlib.sha256(raw).hexdigest(),
        title=str(d.get("title", "")),
        n_min=n_min,
        n_max=n_max,
        acceptance_values=int(defs.get("acceptance_values", 11)),
        verify_error_kernels=kernels,
        speedup_reference=ref,
        sign_level=level,
        sign_resamples=int(sign.get("resamples", 2000)),
        sign_seed=int(sign.get("seed", 0)),
        band_edge_inside=bool(defs.get("band_edge_inside", True)),
        definitions=defs,
    )


def decide(
    rules: RuleSet,
    scores: Mapping[str, Mapping[str, Any]],
    intervals: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[RuleVerdict, ...]:
    """Each rule against one configuration's ``scores[version][metric]`` (a count metric also
    reads ``scores[version][metric + '_of']``, the number of values counted). With
    ``intervals[version][metric]`` ([lo, hi] or None) each verdict also carries the interval
    and whether it decides the rule (:func:`specmoe.validate.intervals.decided`)."""
    out = []
    for r in rules.rules:
        s = scores.get(r.version, {})
        measured = s.get(r.metric)
        total = s.get(f"{r.metric}_of")
        holds = None if r.not_applicable is not None else r.holds(measured, total)
        if intervals is None:
            out.append(RuleVerdict(rule=r, measured=measured, total=total, holds=holds))
            continue
        iv = intervals.get(r.version, {}).get(r.metric)
        iv = None if iv is None else (float(iv[0]), float(iv[1]))
        out.append(
            RuleVerdict(
                rule=r,
                measured=measured,
                total=total,
                holds=holds,
                interval=iv,
                decided=None if holds is None else decided(r, iv, total),
                with_interval=True,
            )
        )
    return tuple(out)


# ------------------------------------------------------------------------------------------
# the scores (pure functions)


def crossover_distance(predicted: int | None, measured: int | None, n_max: int) -> int:
    """|c_hat - c| with "none" counted as n_max + 1 (Table 8 of paper 002: a measured crossover
    at n = 9 counts as within one of none)."""
    a = n_max + 1 if predicted is None else int(predicted)
    b = n_max + 1 if measured is None else int(measured)
    return abs(a - b)


def kstar_scores(
    V_hat: Sequence[float], throughput: np.ndarray, acceptance: Sequence[float]
) -> dict[str, Any]:
    """The predicted best draft length k_hat*(a) from predicted step times ``V_hat`` [K] (the
    smallest maximiser of G_a(k)/V_hat(k), :func:`specmoe.cost.theory.best_draft_length`),
    against the measured best k*(a), the smallest maximiser of the measured ``throughput``
    [A, K]: how many acceptance values have |k_hat* - k*| <= 1, and the share of the best
    measured throughput lost by drafting k_hat*, 1 - T(k_hat*)/T(k*) (Table 3 of paper 002)."""
    T = np.asarray(throughput, dtype=np.float64)
    if T.ndim != 2 or T.shape[0] != len(acceptance) or T.shape[1] != len(V_hat):
        raise InputError(
            f"throughput: shape {T.shape} does not match {len(acceptance)} "
            f"acceptance values by {len(V_hat)} draft lengths"
        )
    k_hat, k_meas, loss = [], [], []
    for a, row in zip(acceptance, T):
        kh = theory.best_draft_length(list(V_hat), a)
        km = int(np.flatnonzero(row == row.max())[0])
        k_hat.append(kh)
        k_meas.append(km)
        loss.append(float(1.0 - row[kh] / row[km]))
    within = [abs(a - b) <= 1 for a, b in zip(k_hat, k_meas)]
    return {
        "k_hat": k_hat,
        "k_measured": k_meas,
        "within_one": within,
        "kstar_within_one": int(sum(within)),
        "kstar_within_one_of": len(within),
        "loss": loss,
        "max_loss": max(loss) if loss else None,
    }


def saving_band_scores(
    S_hat: np.ndarray,
    S: np.ndarray,
    expert_slot: np.ndarray,
    expert_dedup: np.ndarray,
    eps: float,
    *,
    edge_inside: bool = True,
) -> dict[str, Any]:
    """The saving against the band of Eq. (18) of paper 002,
    |S_hat(n) - S(n)| <= eps/(1 - eps) (M_hat_slot(n) + M_hat_dedup(n)), at each given n; also
    the largest saving error and the implied eps, the bandwidth error at which the band just
    covers it (Section 4.2)."""
    S_hat, S = np.asarray(S_hat, float), np.asarray(S, float)
    Ms, Md = np.asarray(expert_slot, float), np.asarray(expert_dedup, float)
    band = np.asarray(bounds.saving_bound(Ms, Md, eps), dtype=np.float64)
    err = np.abs(S_hat - S)
    inside = err <= band if edge_inside else err < band
    x = float(np.max(err / (Ms + Md))) if err.size else 0.0
    return {
        "band_ms": band.tolist(),
        "inside": inside.tolist(),
        "saving_in_band_share": float(inside.mean()) if inside.size else None,
        "saving_in_band_count": int(inside.sum()),
        "saving_in_band_of": int(inside.size),
        "saving_error_ms": float(err.max()) if err.size else None,
        "implied_epsilon": x / (1.0 + x),
    }


def verify_error(tau_hat: np.ndarray, tau: np.ndarray) -> float:
    """max_n |tau_hat(n) - tau(n)| / tau(n) over the given pass sizes (Tables 4 and 7)."""
    tau_hat, tau = np.asarray(tau_hat, float), np.asarray(tau, float)
    return float(np.max(np.abs(tau_hat - tau) / tau))


def step_time_error(V_hat: Sequence[float], V: Sequence[float]) -> float:
    """delta of Section 4.3 of paper 002: max_k |V_hat(k) - V(k)| / V(k)."""
    return verify_error(np.asarray(V_hat, float), np.asarray(V, float))


def speedup_scores(
    V_hat: Sequence[float],
    V: Sequence[float],
    acceptance: Sequence[float],
    delta: float,
    *,
    measured_best: Sequence[float] | None = None,
) -> dict[str, Any]:
    """The predicted best speedup T_hat(k_hat*)/T_hat(0) against bound (21) of paper 002 around
    the measured one: inside when (1 - delta)/(1 + delta) <= predicted/measured <=
    (1 + delta)/(1 - delta). The measured best speedup is max_k G_a(k) V(0)/V(k) from measured
    step times ``V``, or ``measured_best`` [A] when given (e.g. from throughput runs)."""
    pred = [float(theory.best_speedup(list(V_hat), a)) for a in acceptance]
    meas = (
        [float(theory.best_speedup(list(V), a)) for a in acceptance]
        if measured_best is None
        else [float(x) for x in measured_best]
    )
    if not 0 <= delta < 1:
        return {
            "predicted": pred,
            "measured": meas,
            "inside": None,
            "speedup_in_bound_share": None,
            "factor": None,
        }
    f = float(bounds.speedup_factor(delta))
    inside = [m / f <= p <= m * f for p, m in zip(pred, meas)]
    return {
        "predicted": pred,
        "measured": meas,
        "inside": inside,
        "factor": f,
        "speedup_in_bound_share": float(np.mean(inside)) if inside else None,
        "largest_error": float(max(abs(p / m - 1) for p, m in zip(pred, meas))),
    }


def sign_scores(
    S_hat: np.ndarray,
    saving_samples: np.ndarray | None,
    *,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Where the measured saving's interval excludes 0, does the prediction have its sign?
    ``saving_samples`` [P, n] holds each prompt's saving; the interval is the percentile
    bootstrap of the mean over prompts (Table 8 of paper 002). None without samples."""
    if saving_samples is None:
        return {"interval_ms": None, "sign_agreement_share": None, "sign_counted": 0}
    X = np.asarray(saving_samples, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != len(S_hat):
        raise InputError(f"saving samples: shape {X.shape} does not match {len(S_hat)} pass sizes")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, X.shape[0], size=(resamples, X.shape[0]))
    means = X[idx].mean(axis=1)  # [resamples, n]
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2], axis=0)
    counted = (lo > 0) | (hi < 0)
    agree = np.sign(np.asarray(S_hat, float)) == np.sign(X.mean(axis=0))
    k = int(counted.sum())
    return {
        "interval_ms": np.stack([lo, hi], axis=1).tolist(),
        "counted": counted.tolist(),
        "sign_counted": k,
        "sign_agreement_count": int((agree & counted).sum()),
        # no n with an interval excluding 0: the rule holds vacuously (0 of 0)
        "sign_agreement_share": float((agree & counted).sum() / k) if k else 1.0,
    }
