"""The plan as frozen dataclasses (times in ms), serialised to plan.json at the edge.

:class:`Plan` holds the inputs' description, the bytes and bandwidths, the saving with its
band (Eq. (18) of paper 002) and the crossover, one :class:`PolicyPlan` per kernel policy
(``per_slot``, ``dedup``, ``best``: verify times with the band of bound (17), step times, a0,
the staircase, the best draft length and speedup with bound (21)), the reuse thresholds of a
deduplicating engine (Eq. (14)), the same per-policy quantities under the kernel each serving
engine really runs (:class:`EnginePolicy`) and the engine settings; when the profile carries the
per-operation benchmark, a :class:`WholePassPlan` (the same per-policy quantities from the
whole-pass prediction). :meth:`Plan.to_dict` gives plan.json (schema ``specmoe.plan/1``, keys in
their order; ``whole_pass`` only when present) and :meth:`Plan.from_dict` reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specmoe.cost.engine_kernels import EngineKernel
from specmoe.errors import InputError

__all__ = [
    "KERNEL_SWITCH",
    "SCHEMA",
    "Bandwidths",
    "EnginePlan",
    "EnginePolicy",
    "Epsilon",
    "Level",
    "Plan",
    "PlanBytes",
    "PolicyPlan",
    "Saving",
    "WholePassPlan",
]

SCHEMA = "specmoe.plan/1"
KERNEL_SWITCH = (
    "the faster of the two kernels at each pass size: a kernel switch the engine would need "
    "(per-slot below the crossover, deduplicating from it); no engine has one"
)
POLICY_FIELDS = (
    "verify_ms",
    "verify_band_ms",
    "step_ms",
    "a0",
    "step_points",
    "staircase",
    "best_k",
    "speedup",
    "speedup_bound",
    "best_k_certain",
)


@dataclass(frozen=True)
class Epsilon:
    """The bandwidth error eps of each kernel's fit and the one used for every bandwidth."""

    per_slot: float | None
    dedup: float | None
    used: float


@dataclass(frozen=True)
class Bandwidths:
    """beta_slot(n), beta_dedup(n) [n_max] and the dense bandwidth beta_D, in GB/s."""

    per_slot: tuple[float, ...]
    dedup: tuple[float, ...]
    dense: float


@dataclass(frozen=True)
class PlanBytes:
    """D(n), E_slot(n), E_dedup(n) (union bytes), u_bar(n) [n_max], rho_bar_k [n_max - 1]."""

    dense: tuple[float, ...]
    slot: tuple[float, ...]
    union: tuple[float, ...]
    u_bar: tuple[float, ...]
    mean_reuse: tuple[float, ...]
    W: float
    m: int


@dataclass(frozen=True)
class Saving:
    """S(n) with its band (Eq. (18)), the faster kernel (Eq. (7)) and whether that sign is
    certain under eps (Eq. (19); None at n = 1, where one kernel runs)."""

    ms: tuple[float, ...]
    band_ms: tuple[float, ...]
    dedup_faster: tuple[bool, ...]
    kernel_decision_robust: tuple[bool | None, ...]


@dataclass(frozen=True)
class Level:
    """k*(a) = k on the open interval (a_from, a_to)."""

    a_from: float
    a_to: float
    k: int


@dataclass(frozen=True)
class PolicyPlan:
    """One kernel policy: [n_max] verify times and bands, [k_max + 1] step times, a0, the step
    points [k_max] and levels, and per acceptance value the best draft length, its speedup,
    the interval of bound (21) and whether k_hat* = k* is certain (both None without delta)."""

    verify_ms: tuple[float, ...]
    verify_band_ms: tuple[float, ...]
    step_ms: tuple[float, ...]
    a0: float
    step_points: tuple[float, ...]
    staircase: tuple[Level, ...]
    best_k: tuple[int, ...]
    speedup: tuple[float, ...]
    speedup_bound: tuple[tuple[float, float] | None, ...]
    best_k_certain: tuple[bool | None, ...]


@dataclass(frozen=True)
class EnginePolicy:
    """One engine's real kernel per pass size (:class:`EngineKernel`, its rule read from the
    engine's source) and the policy plan under it (None when the rule cannot be evaluated)."""

    kernel: EngineKernel
    policy: PolicyPlan | None

    def to_dict(self) -> dict[str, Any]:
        d = self.kernel.to_dict()
        if self.policy is not None:
            d.update({name: _policy_field(self.policy, name) for name in POLICY_FIELDS})
        return d

    @classmethod
    def from_dict(cls, engine: str, d: dict[str, Any]) -> EnginePolicy:
        policy = None
        if "verify_ms" in d:
            policy = _policy_from({name: {engine: d[name]} for name in POLICY_FIELDS}, engine)
        return cls(EngineKernel.from_dict(engine, d), policy)


@dataclass(frozen=True)
class EnginePlan:
    """The best draft length and speedup at one expected acceptance per kernel policy
    (``per_slot``, ``dedup``, ``best``) and per engine under the kernel it really runs, a label
    per entry where it needs one (``labels``: ``best`` is a kernel switch no engine has), the
    drafter kind and the engines' settings (vLLM, SGLang, llama.cpp) at their own k*."""

    expected_acceptance: float
    draft_length: dict[str, int]
    speedup: dict[str, float]
    settings: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)
    drafter: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"expected_acceptance": self.expected_acceptance}
        if self.drafter is not None:
            out["drafter"] = self.drafter
        for p in self.draft_length:
            out[p] = {"draft_length": self.draft_length[p], "speedup": self.speedup[p]}
            if p in self.labels:
                out[p]["kernel"] = self.labels[p]
        out["settings"] = self.settings
        return out

    @classmethod
    def from_dict(cls, eng: dict[str, Any]) -> EnginePlan:
        names = [p for p in eng if p not in ("expected_acceptance", "settings", "drafter")]
        return cls(
            expected_acceptance=eng["expected_acceptance"],
            draft_length={p: eng[p]["draft_length"] for p in names},
            speedup={p: eng[p]["speedup"] for p in names},
            settings=eng["settings"],
            labels={p: eng[p]["kernel"] for p in names if "kernel" in eng[p]},
            drafter=eng.get("drafter"),
        )


@dataclass(frozen=True)
class WholePassPlan:
    """The whole-pass prediction: tau_hat_p(n) = the sum of every other operation's fit
    (:func:`specmoe.cost.ops_fit.whole_pass_time` at depth ``context`` on ``num_layers``
    layers, ``ops_ms`` [n_max] with its error ``ops_eps``) + the expert operation of the plan
    (``expert_ms[p]`` = E_p(n)/beta_p(n), Eq. (5), error ``expert_eps`` = eps/(1 - eps),
    Eq. (C.1)). ``epsilon[p]`` [n_max] is the combined error, the time-weighted sum
    (ops_eps ops_ms + expert_eps expert_ms) / tau_hat_p; ``delta`` = Eq. (C.7) of its largest
    value over n and policies (None when that is >= 1/2), ``loss_bound`` bound (20) of it.
    ``policies`` as :attr:`Plan.policies`, from these verify times."""

    num_layers: int
    context: int
    ops_ms: tuple[float, ...]
    ops_eps: tuple[float, ...]
    expert_ms: dict[str, tuple[float, ...]]
    expert_eps: float
    epsilon: dict[str, tuple[float, ...]]
    epsilon_max: float
    delta: float | None
    loss_bound: float | None
    policies: dict[str, PolicyPlan]

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_layers": self.num_layers,
            "context": self.context,
            "ops_ms": list(self.ops_ms),
            "ops_eps": list(self.ops_eps),
            "expert_ms": {p: list(v) for p, v in self.expert_ms.items()},
            "expert_eps": self.expert_eps,
            "epsilon": {p: list(v) for p, v in self.epsilon.items()},
            "epsilon_max": self.epsilon_max,
            "delta": self.delta,
            "loss_bound": self.loss_bound,
            **{
                name: {p: _policy_field(pp, name) for p, pp in self.policies.items()}
                for name in POLICY_FIELDS
            },
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WholePassPlan:
        return cls(
            num_layers=d["num_layers"],
            context=d["context"],
            ops_ms=tuple(d["ops_ms"]),
            ops_eps=tuple(d["ops_eps"]),
            expert_ms={p: tuple(v) for p, v in d["expert_ms"].items()},
            expert_eps=d["expert_eps"],
            epsilon={p: tuple(v) for p, v in d["epsilon"].items()},
            epsilon_max=d["epsilon_max"],
            delta=d["delta"],
            loss_bound=d["loss_bound"],
            policies={p: _policy_from(d, p) for p in d["verify_ms"]},
        )


@dataclass(frozen=True)
class Plan:
    """Everything ``specmoe plan`` predicts for one model on one machine (times in ms).

    ``model`` is the spec's own serialisation (:meth:`specmoe.spec.ModelSpec.to_dict`),
    ``sources`` the description of the trace and profile; ``verify`` (not serialised) is the
    :class:`~specmoe.cost.step.VerifyModel` in seconds when the plan was built here."""

    model: dict[str, Any]
    sources: dict[str, Any]
    notes: tuple[str, ...]
    k_max: int
    context: int
    n: tuple[int, ...]
    acceptance: tuple[float, ...]
    draft_ms: tuple[float, ...]
    epsilon: Epsilon
    delta: float | None
    loss_bound: float | None
    bandwidth_gbps: Bandwidths
    bytes: PlanBytes
    r: tuple[float, ...]
    saving: Saving
    crossover: int | None
    crossover_measured_in_profile: int | None
    policies: dict[str, PolicyPlan]
    verify_ms_eq22: dict[str, tuple[float, ...]] | None
    reuse_threshold: dict[str, tuple[tuple[float, ...], ...]]
    engine: EnginePlan | None = None
    whole_pass: WholePassPlan | None = None
    engine_kernels: dict[str, EnginePolicy] | None = None
    verify: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """plan.json: the same keys, order and values as schema ``specmoe.plan/1``."""
        pol = self.policies
        d: dict[str, Any] = {
            "schema": SCHEMA,
            "model": self.model,
            "sources": self.sources,
            "notes": list(self.notes),
            "k_max": self.k_max,
            "context": self.context,
            "n": list(self.n),
            "acceptance": list(self.acceptance),
            "draft_ms": list(self.draft_ms),
            "epsilon": {
                "per_slot": self.epsilon.per_slot,
                "dedup": self.epsilon.dedup,
                "used": self.epsilon.used,
            },
            "delta": self.delta,
            "loss_bound": self.loss_bound,
            "bandwidth_gbps": {
                "per_slot": list(self.bandwidth_gbps.per_slot),
                "dedup": list(self.bandwidth_gbps.dedup),
                "dense": self.bandwidth_gbps.dense,
            },
            "bytes": {
                "dense": list(self.bytes.dense),
                "slot": list(self.bytes.slot),
                "union": list(self.bytes.union),
                "u_bar": list(self.bytes.u_bar),
                "mean_reuse": list(self.bytes.mean_reuse),
                "W": self.bytes.W,
                "m": self.bytes.m,
            },
            "r": list(self.r),
            "saving_ms": list(self.saving.ms),
            "saving_band_ms": list(self.saving.band_ms),
            "dedup_faster": list(self.saving.dedup_faster),
            "kernel_decision_robust": list(self.saving.kernel_decision_robust),
            "crossover": self.crossover,
            "crossover_measured_in_profile": self.crossover_measured_in_profile,
        }
        for name in POLICY_FIELDS:
            d[name] = {p: _policy_field(pp, name) for p, pp in pol.items()}
        d["verify_ms_eq22"] = (
            None
            if self.verify_ms_eq22 is None
            else {p: list(v) for p, v in self.verify_ms_eq22.items()}
        )
        d["reuse_threshold"] = {
            p: [list(row) for row in rows] for p, rows in self.reuse_threshold.items()
        }
        if self.engine_kernels is not None:
            d["engine_kernels"] = {e: ep.to_dict() for e, ep in self.engine_kernels.items()}
        if self.engine is not None:
            d["engine"] = self.engine.to_dict()
        if self.whole_pass is not None:
            d["whole_pass"] = self.whole_pass.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, where: str = "plan") -> Plan:
        """A plan.json dict back as a :class:`Plan`; a missing or malformed field is an
        ``InputError`` naming ``where`` and the field."""
        try:
            if d.get("schema") != SCHEMA:
                raise KeyError("schema")
            _check_types(d)
            eps, bw, b = d["epsilon"], d["bandwidth_gbps"], d["bytes"]
            policies = {p: _policy_from(d, p) for p in d["verify_ms"]}
            eng = d.get("engine")
            engine = None if eng is None else EnginePlan.from_dict(eng)
            ek = d.get("engine_kernels")
            eq22 = d.get("verify_ms_eq22")
            wp = d.get("whole_pass")
            return cls(
                model=d["model"],
                sources=d.get("sources", {}),
                notes=tuple(d.get("notes", ())),
                k_max=d["k_max"],
                context=d["context"],
                n=tuple(d["n"]),
                acceptance=tuple(d["acceptance"]),
                draft_ms=tuple(d["draft_ms"]),
                epsilon=Epsilon(eps["per_slot"], eps["dedup"], eps["used"]),
                delta=d["delta"],
                loss_bound=d["loss_bound"],
                bandwidth_gbps=Bandwidths(tuple(bw["per_slot"]), tuple(bw["dedup"]), bw["dense"]),
                bytes=PlanBytes(
                    dense=tuple(b["dense"]),
                    slot=tuple(b["slot"]),
                    union=tuple(b["union"]),
                    u_bar=tuple(b["u_bar"]),
                    mean_reuse=tuple(b["mean_reuse"]),
                    W=b["W"],
                    m=b["m"],
                ),
                r=tuple(d["r"]),
                saving=Saving(
                    ms=tuple(d["saving_ms"]),
                    band_ms=tuple(d["saving_band_ms"]),
                    dedup_faster=tuple(d["dedup_faster"]),
                    kernel_decision_robust=tuple(d["kernel_decision_robust"]),
                ),
                crossover=d["crossover"],
                crossover_measured_in_profile=d.get("crossover_measured_in_profile"),
                policies=policies,
                verify_ms_eq22=None if eq22 is None else {p: tuple(v) for p, v in eq22.items()},
                reuse_threshold={
                    p: tuple(tuple(row) for row in rows)
                    for p, rows in d.get("reuse_threshold", {}).items()
                },
                engine=engine,
                whole_pass=None if wp is None else WholePassPlan.from_dict(wp),
                engine_kernels=None
                if ek is None
                else {e: EnginePolicy.from_dict(e, v) for e, v in ek.items()},
            )
        except KeyError as exc:
            raise InputError(
                f"no {exc.args[0]!r} field (is it a specmoe plan.json?)", argument=where
            ) from None
        except (TypeError, AttributeError, ValueError) as exc:
            raise InputError(f"not a specmoe plan.json ({exc})", argument=where) from None


_INTS = ("k_max", "context")
_LISTS = {  # field -> the type of its members (None allowed where a value was not finite)
    "n": "integers",
    "acceptance": "numbers",
    "draft_ms": "numbers",
    "r": "numbers",
    "saving_ms": "numbers",
    "saving_band_ms": "numbers",
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool))


def _check_types(d: dict[str, Any]) -> None:
    """The scalar and list fields a reader uses hold what plan.json writes; a field of another
    type is a ``ValueError`` naming it (reported by :meth:`Plan.from_dict`)."""
    for key in _INTS:
        if key in d and not _is_int(d[key]):
            raise ValueError(f"field {key!r} must be an integer, got {d[key]!r:.40}")
    for key, kind in _LISTS.items():
        if key not in d:
            continue
        v = d[key]
        ok = _is_int if kind == "integers" else _is_number
        if not isinstance(v, list) or not all(ok(x) for x in v):
            raise ValueError(f"field {key!r} must be a list of {kind}, got {v!r:.40}")


def _policy_field(pp: PolicyPlan, name: str) -> Any:
    v = getattr(pp, name)
    if name == "a0":
        return v
    if name == "staircase":
        return [{"from": lv.a_from, "to": lv.a_to, "k": lv.k} for lv in v]
    if name == "speedup_bound":
        return [None if b is None else list(b) for b in v]
    return list(v)


def _policy_from(d: dict[str, Any], p: str) -> PolicyPlan:
    return PolicyPlan(
        verify_ms=tuple(d["verify_ms"][p]),
        verify_band_ms=tuple(d["verify_band_ms"][p]),
        step_ms=tuple(d["step_ms"][p]),
        a0=d["a0"][p],
        step_points=tuple(d["step_points"][p]),
        staircase=tuple(Level(lv["from"], lv["to"], lv["k"]) for lv in d["staircase"][p]),
        best_k=tuple(d["best_k"][p]),
        speedup=tuple(d["speedup"][p]),
        speedup_bound=tuple(None if b is None else tuple(b) for b in d["speedup_bound"][p]),
        best_k_certain=tuple(d["best_k_certain"][p]),
    )
