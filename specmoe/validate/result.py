"""A validation as frozen dataclasses (times in ms), serialised to validation.json at the edge.

:class:`Validation` holds what was scored (model, plan, profile, runs, the rule file by its
SHA-256, eps), one :class:`ConfigurationScore` per configuration (model x depth x
engine/device) and one :class:`RuleSummary` per rule. A configuration holds its measurements
(:class:`MeasuredCurves`), one :class:`VersionScore` per version of the prediction
(``prediction``, ``measured_time``, ``calibrated``, and ``whole_pass`` when the plan carries it)
and one :class:`~specmoe.validate.rules.RuleVerdict` per rule. Under a rule set with
``definitions.measured`` (``rules-whole-pass.json``) the measurements carry their bootstrap
intervals (:class:`MeasuredIntervals`), each version its scores' intervals
(:class:`VersionIntervals`), each verdict its interval and ``decided``; these keys are absent
from a validation under a rule set without it, which reads and writes as before.
Values that validation.json repeats (a configuration's headline scores, a rule's count of
configurations, the verdicts) are properties computed from the fields, not stored twice.

:meth:`Validation.to_dict` gives validation.json (schema ``specmoe.validation/1``, keys in their
order) and :meth:`Validation.from_dict` reads it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from specmoe.errors import InputError
from specmoe.validate.rules import METRICS, SUMMARY_ORDER, Rule, RuleVerdict, rule_fields

__all__ = [
    "SCHEMA",
    "ConfigurationScore",
    "MeasuredCurves",
    "MeasuredIntervals",
    "PerKernel",
    "RuleSummary",
    "RulesFile",
    "Validation",
    "VersionIntervals",
    "VersionScore",
]

SCHEMA = "specmoe.validation/1"
# the scores a rule can name (rules.METRICS) plus the count behind the count metric
METRIC_FIELDS = (METRICS[0], "kstar_within_one_of", *METRICS[1:])


def _list(v: Sequence | None) -> list | None:
    return None if v is None else list(v)


def _tup(v: Sequence | None) -> tuple | None:
    return None if v is None else tuple(v)


def _rows(v: Sequence[Sequence] | None) -> tuple[tuple, ...] | None:
    return None if v is None else tuple(tuple(r) for r in v)


def _nested(v: Any) -> Any:
    """Lists (of lists ...) as tuples; None stays."""
    return tuple(_nested(x) for x in v) if isinstance(v, list | tuple) else v


def _listed(v: Any) -> Any:
    """Tuples (of tuples ...) as lists, for JSON; None stays."""
    return [_listed(x) for x in v] if isinstance(v, list | tuple) else v


# ------------------------------------------------------------------------------------------
# rules


@dataclass(frozen=True)
class RuleSummary:
    """One rule over every configuration: ``per_configuration`` maps a configuration's name to
    its verdict; the rule holds when it holds in each (None when any was not scored).
    ``decided_per_configuration`` (under a rule set with intervals) maps it to whether the
    verdict's interval decided it."""

    rule: Rule
    per_configuration: dict[str, bool | None]
    decided_per_configuration: dict[str, bool | None] | None = None

    @property
    def holds(self) -> bool | None:
        vals = list(self.per_configuration.values())
        return None if any(v is None for v in vals) else all(vals)

    @property
    def configurations_holding(self) -> int:
        return sum(v is True for v in self.per_configuration.values())

    @property
    def configurations(self) -> int:
        return len(self.per_configuration)

    @property
    def decided(self) -> bool | None:
        """Every configuration's verdict decided by its interval (None without intervals, or
        when one configuration's could not be judged)."""
        if self.decided_per_configuration is None:
            return None
        vals = list(self.decided_per_configuration.values())
        return None if any(v is None for v in vals) else all(vals)

    def to_dict(self) -> dict[str, Any]:
        d = {
            **rule_fields(self.rule, SUMMARY_ORDER),
            "holds": self.holds,
            "configurations_holding": self.configurations_holding,
            "configurations": self.configurations,
            "per_configuration": dict(self.per_configuration),
        }
        if self.rule.not_applicable is not None:
            d["not_applicable"] = self.rule.not_applicable
        if self.decided_per_configuration is not None:
            d["decided"] = self.decided
            d["decided_per_configuration"] = dict(self.decided_per_configuration)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RuleSummary:
        dp = d.get("decided_per_configuration")
        return cls(
            rule=Rule.from_dict(d),
            per_configuration=dict(d["per_configuration"]),
            decided_per_configuration=None if dp is None else dict(dp),
        )


@dataclass(frozen=True)
class RulesFile:
    """The rule set scored against: its path, SHA-256 and title."""

    path: str
    sha256: str
    title: str


# ------------------------------------------------------------------------------------------
# one configuration


@dataclass(frozen=True)
class PerKernel:
    """One value (or curve [n]) for the per-slot and the deduplicating kernel."""

    per_slot: Any
    dedup: Any

    def to_dict(self) -> dict[str, Any]:
        return {"per_slot": _plain(self.per_slot), "dedup": _plain(self.dedup)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PerKernel:
        return cls(per_slot=_frozen(d["per_slot"]), dedup=_frozen(d["dedup"]))


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _frozen(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


Pair = tuple[float | None, float | None]


@dataclass(frozen=True)
class VersionIntervals:
    """The 95% (``definitions.intervals.level``) bootstrap intervals of one version's scores,
    resampling prompts: ``metrics`` [lo, hi] per score the rules can name (None where the runs
    lack the samples, or the score has no resampled value, as the sign share), ``loss`` [A, 2]
    the loss at k_hat*(a), ``kstar_share`` [A] the share of resamples whose measured k* is
    within one of k_hat*(a). The prediction is held fixed, except that the paper's versions are
    re-anchored on each resample's tau(1) (prediction, measured-time) or tau_off(n)
    (calibrated), which they take from the runs; k_hat* is held at its point value."""

    metrics: dict[str, Pair | None]
    loss: tuple[Pair, ...] | None
    kstar_share: tuple[float, ...] | None

    def to_dict(self) -> dict[str, Any]:
        return {
            **{k: _listed(v) for k, v in self.metrics.items()},
            "loss": _listed(self.loss),
            "kstar_share": _listed(self.kstar_share),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VersionIntervals:
        return cls(
            metrics={k: _nested(v) for k, v in d.items() if k not in ("loss", "kstar_share")},
            loss=_nested(d["loss"]),
            kstar_share=_nested(d["kstar_share"]),
        )


@dataclass(frozen=True)
class MeasuredIntervals:
    """How the measured side was computed (``tau``, ``throughput``: the statistic, or the
    summary the runs gave when they lack the samples), from how many prompts and repetitions
    (the largest count per prompt), and its percentile bootstrap intervals at ``level`` over
    ``resamples`` draws of the prompts (seed ``seed``): tau_off(n) and tau_on(n) [n, 2], the
    saving S(n) [n, 2], T(k, a) [A, K, 2] and the measured k*(a) [A, 2]; None where the runs
    lack the samples."""

    level: float
    resamples: int
    seed: int
    tau: str
    throughput: str
    verify_prompts: int | None
    verify_repeats: int | None
    throughput_prompts: int | None
    throughput_repeats: int | None
    verify_off_ms: tuple[Pair, ...] | None
    verify_on_ms: tuple[Pair, ...] | None
    saving_ms: tuple[Pair, ...] | None
    tokens_per_s: tuple[tuple[Pair, ...], ...] | None
    k_star: tuple[Pair, ...] | None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _listed(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MeasuredIntervals:
        return cls(**{f.name: _nested(d[f.name]) for f in fields(cls)})


@dataclass(frozen=True)
class VersionScore:
    """One version of the prediction in one configuration, at n = 1..n_max (``band_ms`` and
    ``inside_band`` at the scored n): verify and expert-operation times, the saving S_hat(n)
    with its crossover and the band of bound (18), the step times V_hat(k) with k_hat*(a), the
    loss at k_hat* against bound (20), the best speedup against bound (21), and the scores the
    rules decide on (:data:`METRIC_FIELDS`). ``outside_growth_ms`` only for ``calibrated``."""

    verify_ms: PerKernel
    expert_ms: PerKernel
    saving_ms: tuple[float, ...]
    crossover: int | None
    band_ms: tuple[float, ...]
    inside_band: tuple[bool, ...]
    saving_in_band_count: int
    implied_epsilon: float
    verify_error_by_kernel: PerKernel
    step_ms: tuple[float, ...]
    k_hat: tuple[int, ...]
    within_one: tuple[bool, ...]
    loss: tuple[float, ...]
    loss_bound: float
    loss_inside_bound: tuple[bool, ...]
    speedup_predicted: tuple[float, ...]
    speedup_measured: tuple[float, ...]
    speedup_inside_bound: tuple[bool, ...] | None
    speedup_factor: float | None
    sign_counted: int
    kstar_within_one: int
    kstar_within_one_of: int
    verify_error: float
    crossover_distance: int
    saving_in_band_share: float | None
    max_loss: float | None
    sign_agreement_share: float | None
    speedup_in_bound_share: float | None
    saving_error_ms: float | None
    delta: float
    outside_growth_ms: tuple[float, ...] | None = None
    intervals: VersionIntervals | None = None

    def metrics(self) -> dict[str, Any]:
        """The scores by name, as :func:`specmoe.validate.rules.decide` reads them."""
        return {f: getattr(self, f) for f in METRIC_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "verify_ms": self.verify_ms.to_dict(),
            "expert_ms": self.expert_ms.to_dict(),
            "saving_ms": list(self.saving_ms),
            "crossover": self.crossover,
            "band_ms": list(self.band_ms),
            "inside_band": list(self.inside_band),
            "saving_in_band_count": self.saving_in_band_count,
            "implied_epsilon": self.implied_epsilon,
            "verify_error_by_kernel": self.verify_error_by_kernel.to_dict(),
            "step_ms": list(self.step_ms),
            "k_hat": list(self.k_hat),
            "within_one": list(self.within_one),
            "loss": list(self.loss),
            "loss_bound": self.loss_bound,
            "loss_inside_bound": list(self.loss_inside_bound),
            "speedup_predicted": list(self.speedup_predicted),
            "speedup_measured": list(self.speedup_measured),
            "speedup_inside_bound": _list(self.speedup_inside_bound),
            "speedup_factor": self.speedup_factor,
            "sign_counted": self.sign_counted,
            **self.metrics(),
        }
        if self.outside_growth_ms is not None:
            d["outside_growth_ms"] = list(self.outside_growth_ms)
        if self.intervals is not None:
            d["intervals"] = self.intervals.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VersionScore:
        return cls(
            verify_ms=PerKernel.from_dict(d["verify_ms"]),
            expert_ms=PerKernel.from_dict(d["expert_ms"]),
            saving_ms=tuple(d["saving_ms"]),
            crossover=d["crossover"],
            band_ms=tuple(d["band_ms"]),
            inside_band=tuple(d["inside_band"]),
            saving_in_band_count=d["saving_in_band_count"],
            implied_epsilon=d["implied_epsilon"],
            verify_error_by_kernel=PerKernel.from_dict(d["verify_error_by_kernel"]),
            step_ms=tuple(d["step_ms"]),
            k_hat=tuple(d["k_hat"]),
            within_one=tuple(d["within_one"]),
            loss=tuple(d["loss"]),
            loss_bound=d["loss_bound"],
            loss_inside_bound=tuple(d["loss_inside_bound"]),
            speedup_predicted=tuple(d["speedup_predicted"]),
            speedup_measured=tuple(d["speedup_measured"]),
            speedup_inside_bound=_tup(d["speedup_inside_bound"]),
            speedup_factor=d["speedup_factor"],
            sign_counted=d["sign_counted"],
            outside_growth_ms=_tup(d.get("outside_growth_ms")),
            intervals=(
                None if d.get("intervals") is None else VersionIntervals.from_dict(d["intervals"])
            ),
            **{f: d[f] for f in METRIC_FIELDS},
        )


@dataclass(frozen=True)
class MeasuredCurves:
    """A configuration's measurements as scored: tau_off(n), tau_on(n) and the saving S(n)
    [n], h(k), V(k) and the best draft length k*(a) [A], throughput [A, K], the best measured
    speedup [A] and the saving's interval [scored n, 2] (None without per-prompt times).
    Under ``definitions.measured`` tau and the throughput are its statistics (the mean over
    prompts of per-prompt medians, the median over prompts x repeats), with ``intervals``."""

    verify_off_ms: tuple[float, ...] | None  # None: one, deduplicating kernel timed
    verify_on_ms: tuple[float, ...]
    saving_ms: tuple[float, ...] | None  # None: one kernel timed, no saving measured
    draft_ms: tuple[float, ...]
    step_ms: tuple[float, ...]
    k_star: tuple[int, ...]
    tokens_per_s: tuple[tuple[float, ...], ...]
    throughput_best_speedup: tuple[float, ...]
    saving_interval_ms: tuple[tuple[float, float], ...] | None
    intervals: MeasuredIntervals | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {
            "verify_ms": {"off": _list(self.verify_off_ms), "on": list(self.verify_on_ms)},
            "saving_ms": _list(self.saving_ms),
            "draft_ms": list(self.draft_ms),
            "step_ms": list(self.step_ms),
            "k_star": list(self.k_star),
            "tokens_per_s": [list(r) for r in self.tokens_per_s],
            "throughput_best_speedup": list(self.throughput_best_speedup),
            "saving_interval_ms": (
                None
                if self.saving_interval_ms is None
                else [list(r) for r in self.saving_interval_ms]
            ),
        }
        if self.intervals is not None:
            d["intervals"] = self.intervals.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MeasuredCurves:
        return cls(
            verify_off_ms=_tup(d["verify_ms"]["off"]),
            verify_on_ms=tuple(d["verify_ms"]["on"]),
            saving_ms=_tup(d["saving_ms"]),
            draft_ms=tuple(d["draft_ms"]),
            step_ms=tuple(d["step_ms"]),
            k_star=tuple(d["k_star"]),
            tokens_per_s=_rows(d["tokens_per_s"]),
            throughput_best_speedup=tuple(d["throughput_best_speedup"]),
            saving_interval_ms=_rows(d.get("saving_interval_ms")),
            intervals=(
                None if d.get("intervals") is None else MeasuredIntervals.from_dict(d["intervals"])
            ),
        )


@dataclass(frozen=True)
class ConfigurationScore:
    """Every score of one configuration: its pass sizes ``n`` (``scored_n`` those the rules
    score), acceptance values [A] and draft lengths ``k``, the kernel its throughput runs used,
    the measurements, each version's scores (keyed by ``specmoe.validate.rules.VERSIONS``, and
    ``whole_pass``) and each rule's verdict. The headline scores (k_hat* within one, loss, band
    share, predicted crossover) are those of ``scored_version``, the version the rules decide
    on: the prediction, or the whole-pass prediction under a rule set that names it."""

    name: str
    model: str
    depth: int
    device: str
    engine: str
    n: tuple[int, ...]
    scored_n: tuple[int, ...]
    acceptance_values: tuple[float, ...]
    k: tuple[int, ...]
    kernel_of_runs: str
    crossover_measured: int | None
    measured: MeasuredCurves
    versions: dict[str, VersionScore]
    rules: tuple[RuleVerdict, ...]
    notes: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)
    scored_version: str = "prediction"

    @property
    def prediction(self) -> VersionScore:
        return self.versions["prediction"]

    @property
    def scored(self) -> VersionScore:
        """The version the rules decide on (``scored_version``)."""
        return self.versions.get(self.scored_version, self.prediction)

    @property
    def kstar_within_one(self) -> int:
        return self.scored.kstar_within_one

    @property
    def max_loss(self) -> float | None:
        return self.scored.max_loss

    @property
    def saving_in_band_share(self) -> float | None:
        return self.scored.saving_in_band_share

    @property
    def crossover_predicted(self) -> int | None:
        return self.scored.crossover

    def by_version(self, name: str) -> dict[str, Any]:
        """``name`` (a VersionScore field) of each version, keyed by version."""
        return {v: getattr(self.versions[v], name) for v in self.versions}

    @property
    def all_hold(self) -> bool:
        required = [r for r in self.rules if r.rule.required]
        return bool(required) and all(r.holds is True for r in required)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "depth": self.depth,
            "device": self.device,
            "engine": self.engine,
            "n": list(self.n),
            "scored_n": list(self.scored_n),
            "acceptance_values": list(self.acceptance_values),
            "k": list(self.k),
            "kernel_of_runs": self.kernel_of_runs,
            "kstar_within_one": self.kstar_within_one,
            "max_loss": self.max_loss,
            "verify_error": self.by_version("verify_error"),
            "saving_error_ms": self.by_version("saving_error_ms"),
            "saving_in_band_share": self.saving_in_band_share,
            "crossover_predicted": self.crossover_predicted,
            "crossover_measured": self.crossover_measured,
            "crossover": self.by_version("crossover"),
            "delta": self.by_version("delta"),
            "measured": self.measured.to_dict(),
            "versions": {v: s.to_dict() for v, s in self.versions.items()},
            "rules": [r.to_dict() for r in self.rules],
            "all_hold": self.all_hold,
            "notes": list(self.notes),
            "sources": dict(self.sources),
            **(
                {}
                if self.scored_version == "prediction"
                else {"scored_version": self.scored_version}
            ),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConfigurationScore:
        return cls(
            name=d["name"],
            model=d["model"],
            depth=d["depth"],
            device=d["device"],
            engine=d["engine"],
            n=tuple(d["n"]),
            scored_n=tuple(d["scored_n"]),
            acceptance_values=tuple(d["acceptance_values"]),
            k=tuple(d["k"]),
            kernel_of_runs=d["kernel_of_runs"],
            crossover_measured=d["crossover_measured"],
            measured=MeasuredCurves.from_dict(d["measured"]),
            versions={v: VersionScore.from_dict(s) for v, s in d["versions"].items()},
            rules=tuple(RuleVerdict.from_dict(r) for r in d["rules"]),
            notes=tuple(d.get("notes", ())),
            sources=dict(d.get("sources", {})),
            scored_version=d.get("scored_version", "prediction"),
        )


# ------------------------------------------------------------------------------------------
# the whole validation


@dataclass(frozen=True)
class Validation:
    """A plan scored against measured runs: the inputs, eps (the larger of the profile's two
    kernel errors), the plan's crossover (from bandwidths, for reference), the device, every
    configuration and every rule over them. ``all_hold``: every required rule holds;
    ``all_rules_hold``: every rule does."""

    model: str
    plan: str
    profile: str
    runs: str
    rules_file: RulesFile
    epsilon: float
    crossover_plan: int | None
    device: str
    device_name: str
    configurations: tuple[ConfigurationScore, ...]
    rules: tuple[RuleSummary, ...]

    @property
    def all_hold(self) -> bool:
        return all(s.holds is True for s in self.rules if s.rule.required)

    @property
    def all_rules_hold(self) -> bool:
        return all(s.holds is True for s in self.rules)

    def to_dict(self) -> dict[str, Any]:
        """validation.json: the same keys, order and values as schema ``specmoe.validation/1``."""
        rf = self.rules_file
        return {
            "schema": SCHEMA,
            "model": self.model,
            "plan": self.plan,
            "profile": self.profile,
            "runs": self.runs,
            "rules_file": {"path": rf.path, "sha256": rf.sha256, "title": rf.title},
            "epsilon": self.epsilon,
            "crossover_plan": self.crossover_plan,
            "device": self.device,
            "device_name": self.device_name,
            "configurations": [c.to_dict() for c in self.configurations],
            "rules": [s.to_dict() for s in self.rules],
            "all_hold": self.all_hold,
            "all_rules_hold": self.all_rules_hold,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, where: str = "validation") -> Validation:
        """A validation.json dict back as a :class:`Validation`; a missing or malformed field
        is an ``InputError`` naming ``where``."""
        try:
            if d.get("schema") != SCHEMA:
                raise KeyError("schema")
            rf = d["rules_file"]
            return cls(
                model=d["model"],
                plan=d["plan"],
                profile=d["profile"],
                runs=d["runs"],
                rules_file=RulesFile(rf["path"], rf["sha256"], rf["title"]),
                epsilon=d["epsilon"],
                crossover_plan=d["crossover_plan"],
                device=d["device"],
                device_name=d["device_name"],
                configurations=tuple(ConfigurationScore.from_dict(c) for c in d["configurations"]),
                rules=tuple(RuleSummary.from_dict(s) for s in d["rules"]),
            )
        except KeyError as exc:
            raise InputError(
                f"no {exc.args[0]!r} field (is it a specmoe validation.json?)", argument=where
            ) from None
        except (TypeError, AttributeError, ValueError) as exc:
            raise InputError(f"not a specmoe validation.json ({exc})", argument=where) from None
