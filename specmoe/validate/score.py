"""``specmoe validate``: score a plan against measured runs with the pre-registered rules.

Three versions of the prediction (paper 002 Section 4), each a whole-model verify time
tau_hat_p(n) for the per-slot and the deduplicating kernel at n = 1..n_max:

* the **prediction**: Eq. (22), tau_hat_p(n) = tau_meas(1) + sum_l (t_p,l(n) - t_l(1)), with
  each layer's fitted operation time at the union bytes of recorded routing windows (the
  profile's ``op_time.predicted``);
* the **measured-time version**: Eq. (22) with each layer's measured median operation time on
  those windows (``op_time.measured``);
* the **calibrated version**: the measured-time version plus the growth with n of the time
  outside the expert operation, taken from the measured verify time with deduplication off:
  tau_cal_p(n) = tau_mt_p(n) + (tau_off(n) - tau_mt_slot(n));
* the **whole-pass prediction** (only when the plan carries ``whole_pass``): every other
  operation's fit from the per-operation benchmark at the configuration's depth
  (:func:`specmoe.cost.ops_fit.whole_pass_time`) plus the plan's expert operation of Eq. (5);
  it does not use tau_meas(1). A rule set whose ``scored_version`` is ``whole_pass``
  (``rules-whole-pass.json``) decides its rules, which name version ``prediction``, on it, and
  scores its verify error from ``definitions.verify_error_pass_sizes.min``.

Runs of an engine with one expert kernel, a deduplicating one (``Measured.kernels`` is
("dedup",): llama.cpp's CPU MUL_MAT_ID), have no per-slot verify time: Eq. (22) takes tau(1)
from the dedup pass (a one-token pass has no duplicate slot, so both kernels do the same work
there), and the scores that need the per-slot time (the measured saving and crossover, the
saving band and sign, the calibrated version, the per-slot verify error) are not scored
(None; a rule on them holds = null), as a note says.

A rule set with ``definitions.measured`` also sets the measured side: tau_p(n) the mean over
prompts of per-prompt medians and T(k, a) the median over prompts x repeats, with percentile
bootstrap intervals over prompts for every score of every version, and each verdict's
``interval`` and ``decided`` (:mod:`specmoe.validate.whole_pass`,
:mod:`specmoe.validate.intervals`). A campaign record that names the prediction of a runs
folder has its plan's and profile's SHA-256 checked before anything is scored.

Eq. (22) is :func:`specmoe.cost.step.whole_model_verify_time`; the best draft length, the
speedup and the bounds (18), (20), (21) come from :mod:`specmoe.cost`. Each configuration
(model x depth x engine/device) is scored as in Tables 3, 4, 7 and 8: the largest saving error
and the share of points inside the band of (18); the crossover predicted and measured; the
acceptance values where k_hat* is within one of the measured best; the largest throughput lost
at k_hat*; the verify-time error; the best speedup inside (21) with delta the step-time error.
The rules and tolerances are read from ``specmoe/validate/rules.json``
(:mod:`specmoe.validate.rules`) and decided unchanged. The runs folder format is
:mod:`specmoe.formats.runs`; the plan is read as a :class:`~specmoe.cost.plan_result.Plan`.
:func:`score_configuration` gives a :class:`~specmoe.validate.result.ConfigurationScore` and
:func:`validate` a :class:`~specmoe.validate.result.Validation` (``to_dict()``: validation.json).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.cost import bounds
from specmoe.cost.plan import load_plan
from specmoe.cost.plan_result import Plan
from specmoe.errors import InputError
from specmoe.formats.runs import Measured, load_runs
from specmoe.spec import ModelSpec
from specmoe.validate.result import (
    SCHEMA,
    ConfigurationScore,
    MeasuredCurves,
    PerKernel,
    RulesFile,
    RuleSummary,
    Validation,
    VersionScore,
)
from specmoe.validate.rules import (
    VERSIONS,
    RuleSet,
    crossover_distance,
    decide,
    kstar_scores,
    load_rules,
    saving_band_scores,
    sign_scores,
    speedup_scores,
    step_time_error,
    verify_error,
)
from specmoe.validate.whole_pass import (
    check_recorded_prediction,
    measured_side,
    scored_version,
    version_intervals,
    whole_pass_version,
)

__all__ = [
    "SCHEMA",
    "ConfigurationScore",
    "Validation",
    "prediction_versions",
    "score_configuration",
    "validate",
]

MS = 1e3


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
# the three versions


def _expert_sum(op: np.ndarray, num_layers: int) -> np.ndarray:
    """M_hat_p(n) = sum_l t_p,l(n) over the model's layers (the layer mean of the timed layers
    times num_layers when only some were timed, as Eq. (22) does)."""
    return op.sum(axis=0) if op.shape[0] == num_layers else op.mean(axis=0) * num_layers


def prediction_versions(
    profile: Any, tau1_ms: float, verify_off_ms: np.ndarray | None, *, num_layers: int, n_max: int
) -> dict[str, dict[str, np.ndarray]]:
    """For each version, ``verify_ms`` {per_slot, dedup} [n_max] and ``expert_ms`` {per_slot,
    dedup} [n_max], at n = 1..n_max. ``verify_off_ms`` [>= n_max] is the measured verify time
    with deduplication off (the calibration); None (runs of one, deduplicating kernel): no
    calibrated version."""
    from specmoe.cost.step import whole_model_verify_time

    missing = [n for n in range(1, n_max + 1) if n not in profile.n]
    if missing:
        raise InputError(f"bandwidth profile: no operation times at pass size {missing[0]}")
    idx = [profile.n.index(n) for n in range(1, n_max + 1)]
    out: dict[str, dict[str, np.ndarray]] = {}
    for version, source in (("prediction", "predicted"), ("measured_time", "measured")):
        tau = {
            p: whole_model_verify_time(
                profile, p, tau1_ms / MS, source=source, num_layers=num_layers
            )[idx]
            * MS
            for p in ("per_slot", "dedup")
        }
        expert = {
            p: _expert_sum(np.asarray(profile.op_time[p][source], float), num_layers)[idx] * MS
            for p in ("per_slot", "dedup")
        }
        out[version] = {"verify_ms": tau, "expert_ms": expert}
    if verify_off_ms is None:
        return out
    mt = out["measured_time"]
    growth = np.asarray(verify_off_ms[:n_max], float) - mt["verify_ms"]["per_slot"]
    out["calibrated"] = {
        "verify_ms": {p: mt["verify_ms"][p] + growth for p in ("per_slot", "dedup")},
        "expert_ms": mt["expert_ms"],
        "outside_growth_ms": growth,
    }
    return out


# ------------------------------------------------------------------------------------------
# scoring one configuration


def score_configuration(
    m: Measured,
    profile: Any,
    *,
    num_layers: int,
    eps: float,
    rules: RuleSet,
    plan: Plan | None = None,
) -> ConfigurationScore:
    """Every score of one configuration for the three versions (and the whole-pass version
    when ``plan`` carries it), and each rule's verdict."""
    from specmoe.cost.step import crossover
    from specmoe.formats.runs import rounds_verify_side

    rounds = rules.verify_side == "rounds"
    if rounds:  # tau_p(n) from the oracle generations' own passes (rules-llamacpp-rounds.json)
        m = rounds_verify_side(m)
    n_top = min(max(m.n), max(profile.n))
    n_hi = min(n_top, rules.n_max)
    if n_hi < rules.n_min:
        raise InputError(
            f"runs {m.name}: pass sizes reach only {n_top}, the rules score "
            f"n = {rules.n_min}..{rules.n_max}"
        )
    notes: list[str] = []
    if rounds:
        notes.append(
            "verify side: the oracle generations' own verification passes (median per "
            "generation, k = n - 1), not the verify sweep; the prediction is summed over the "
            "generations' cache lengths"
        )
    K = len(m.k) - 1
    if K + 1 > n_top:
        notes.append(f"draft lengths cut to k <= {n_top - 1}: verify times reach n = {n_top}")
        K = n_top - 1
    acc = m.acceptance
    h = np.zeros(K + 1) if m.draft_ms is None else m.draft_ms[: K + 1]
    if m.draft_ms is None:
        notes.append("no measured draft time: h(k) = 0")
    side = None
    if rules.measured_side is not None:  # definitions.measured: the statistics, with intervals
        side = measured_side(m, rules, n_top=n_top, K=K, n_hi=n_hi)
        off, on, T = side.off, side.on, side.T
        notes.extend(side.notes)
    else:
        off = None if m.verify_off_ms is None else m.verify_off_ms[:n_top]
        on = m.verify_on_ms[:n_top]
        T = m.throughput[:, : K + 1]
    if off is None:
        notes.append(
            "one kernel timed (dedup): tau(1) of Eq. (22) is the dedup pass's; the measured "
            "saving and crossover, the saving band and sign, the calibrated version and the "
            "per-slot verify error are not scored"
        )
    tau1 = float((on if off is None else off)[0])
    versions = prediction_versions(profile, tau1, off, num_layers=num_layers, n_max=n_top)
    scored_as = scored_version(rules)
    if plan is not None:
        steps = None
        if m.context_len is not None and m.throughput_tokens is not None:
            steps = range(m.context_len, m.context_len + m.throughput_tokens)
        wpv, note = whole_pass_version(
            plan,
            profile,
            m.depth,
            n_top,
            context=m.context_len,
            step_contexts=steps,
            verify_contexts=steps if rounds else None,
        )
        if wpv is not None:
            versions["whole_pass"] = wpv
        if note:
            notes.append(note)
    n_all = np.arange(1, n_top + 1)
    sc = slice(rules.n_min - 1, n_hi)  # the scored pass sizes
    n_sc = n_all[sc]
    S = None if off is None else off - on
    cross_meas = None if S is None else crossover(S[:n_hi], n_all[:n_hi])
    kernel = "dedup" if m.throughput_dedup else "per_slot"
    measured_tau = {"dedup": on} if off is None else {"per_slot": off, "dedup": on}
    V = (measured_tau[kernel][: K + 1] + h).tolist()  # measured step times
    samples = None
    if m.per_prompt_off_ms is not None:
        samples = (m.per_prompt_off_ms - m.per_prompt_on_ms)[:, :n_top][:, sc]

    scores: dict[str, VersionScore] = {}
    for version in (*VERSIONS, *(["whole_pass"] if "whole_pass" in versions else [])):
        if version not in versions:
            continue  # the calibrated version, on runs of one kernel
        v = versions[version]
        tau = v["verify_ms"]
        v_eps = v.get("epsilon", eps)
        vsc = sc
        if version == "whole_pass" and scored_as == "whole_pass":
            lo = rules.definitions.get("verify_error_pass_sizes", {}).get("min", rules.n_min)
            vsc = slice(int(lo) - 1, n_hi)
        S_hat = tau["per_slot"] - tau["dedup"]
        cross = crossover(S_hat[:n_hi], n_all[:n_hi])
        if S is None:  # one kernel: no measured saving
            band = dict(_NO_SAVING)
        else:
            band = saving_band_scores(
                S_hat[sc],
                S[sc],
                v["expert_ms"]["per_slot"][sc],
                v["expert_ms"]["dedup"][sc],
                v_eps,
                edge_inside=rules.band_edge_inside,
            )
        verr = {
            p: verify_error(tau[p][vsc], measured_tau[p][vsc]) for p in tau if p in measured_tau
        }
        V_hat = (tau[kernel][: K + 1] + h).tolist()
        # the step times at the throughput runs' cache lengths, where a version has them
        V_step = (v.get("step_verify_ms", tau)[kernel][: K + 1] + h).tolist()
        ks = kstar_scores(V_step, T, acc)
        delta = step_time_error(V_hat, V)
        thr_best = (T / T[:, :1]).max(axis=1)
        sp = speedup_scores(
            V_step,
            V,
            acc,
            delta,
            measured_best=(thr_best if rules.speedup_reference == "throughput_runs" else None),
        )
        sign = sign_scores(
            S_hat[sc],
            samples,
            level=rules.sign_level,
            resamples=rules.sign_resamples,
            seed=rules.sign_seed,
        )
        loss_bound = float(bounds.throughput_loss_bound(delta))  # bound (20)
        growth = v.get("outside_growth_ms")
        vint = None
        if side is not None:
            vint = version_intervals(
                side,
                rules,
                version=version,
                tau_hat=tau,
                S_hat=S_hat,
                band=np.asarray(band["band_ms"], float),
                sc=sc,
                vsc=vsc,
                n_hi=n_hi,
                cross_pred=cross,
                k_hat=ks["k_hat"],
                kernel=kernel,
                h=h,
                acceptance=acc,
            )
        scores[version] = VersionScore(
            verify_ms=PerKernel(tuple(tau["per_slot"].tolist()), tuple(tau["dedup"].tolist())),
            expert_ms=PerKernel(
                tuple(v["expert_ms"]["per_slot"].tolist()), tuple(v["expert_ms"]["dedup"].tolist())
            ),
            saving_ms=tuple(S_hat.tolist()),
            crossover=cross,
            band_ms=tuple(band["band_ms"]),
            inside_band=tuple(band["inside"]),
            saving_in_band_count=band["saving_in_band_count"],
            implied_epsilon=band["implied_epsilon"],
            verify_error_by_kernel=PerKernel(verr.get("per_slot"), verr["dedup"]),
            step_ms=tuple(V_hat),
            k_hat=tuple(ks["k_hat"]),
            within_one=tuple(ks["within_one"]),
            loss=tuple(ks["loss"]),
            loss_bound=loss_bound,
            loss_inside_bound=tuple(x <= loss_bound + 1e-12 for x in ks["loss"]),
            speedup_predicted=tuple(sp["predicted"]),
            speedup_measured=tuple(sp["measured"]),
            speedup_inside_bound=None if sp["inside"] is None else tuple(sp["inside"]),
            speedup_factor=sp["factor"],
            sign_counted=sign["sign_counted"],
            kstar_within_one=ks["kstar_within_one"],
            kstar_within_one_of=ks["kstar_within_one_of"],
            verify_error=(
                max(verr[p] for p in rules.verify_error_kernels)
                if all(p in verr for p in rules.verify_error_kernels)
                else None  # a kernel the rules name was not timed
            ),
            crossover_distance=(None if S is None else crossover_distance(cross, cross_meas, n_hi)),
            saving_in_band_share=band["saving_in_band_share"],
            max_loss=ks["max_loss"],
            sign_agreement_share=sign["sign_agreement_share"],
            speedup_in_bound_share=sp["speedup_in_bound_share"],
            saving_error_ms=band["saving_error_ms"],
            delta=delta,
            outside_growth_ms=None if growth is None else tuple(growth.tolist()),
            intervals=vint,
        )
    interval = None
    if S is not None:
        interval = sign_scores(
            S[sc],
            samples,
            level=rules.sign_level,
            resamples=rules.sign_resamples,
            seed=rules.sign_seed,
        )["interval_ms"]
    measured = MeasuredCurves(
        verify_off_ms=None if off is None else tuple(off.tolist()),
        verify_on_ms=tuple(on.tolist()),
        saving_ms=None if S is None else tuple(S.tolist()),
        draft_ms=tuple(h.tolist()),
        step_ms=tuple(V),
        k_star=tuple(int(np.flatnonzero(r == r.max())[0]) for r in T),
        tokens_per_s=tuple(tuple(r) for r in T.tolist()),
        throughput_best_speedup=tuple((T / T[:, :1]).max(axis=1).tolist()),
        saving_interval_ms=None if interval is None else tuple(tuple(r) for r in interval),
        intervals=None if side is None else side.intervals,
    )
    verdicts = decide(
        rules,
        _rule_scores(scores, scored_as),
        None if side is None else _rule_intervals(scores, scored_as),
    )
    for r in verdicts:
        if r.decided and r.holds is not None and r.rule.holds(r.interval[0], r.total) != r.holds:
            notes.append(
                f"{r.rule.id}: the point estimate lies outside its interval, which decides "
                f"the other way (holds stays the point estimate's verdict)"
            )
    return ConfigurationScore(
        name=m.name,
        model=m.model,
        depth=m.depth,
        device=m.device,
        engine=m.engine,
        n=tuple(n_all.tolist()),
        scored_n=tuple(n_sc.tolist()),
        acceptance_values=tuple(acc),
        k=tuple(range(K + 1)),
        kernel_of_runs=kernel,
        crossover_measured=cross_meas,
        measured=measured,
        versions=scores,
        rules=verdicts,
        notes=tuple(notes),
        sources=dict(m.sources),
        scored_version=scored_as if scored_as in scores else "prediction",
    )


# the band scores of a configuration without a measured saving (one kernel timed)
_NO_SAVING: dict[str, Any] = {
    "band_ms": [],
    "inside": [],
    "saving_in_band_share": None,
    "saving_in_band_count": 0,
    "saving_error_ms": None,
    "implied_epsilon": None,
}


def _rule_scores(scores: dict[str, VersionScore], scored_as: str) -> dict[str, Any]:
    """Each version's metrics for :func:`decide`; with ``scored_as`` other than prediction,
    the rules' version ``prediction`` reads that version (no metrics: not scored)."""
    out: dict[str, Any] = {v: s.metrics() for v, s in scores.items()}
    if scored_as != "prediction":
        out["prediction"] = out.get(scored_as, {})
    return out


def _rule_intervals(scores: dict[str, VersionScore], scored_as: str) -> dict[str, Any]:
    """Each version's score intervals for :func:`decide`, read as :func:`_rule_scores`."""
    out: dict[str, Any] = {
        v: ({} if s.intervals is None else s.intervals.metrics) for v, s in scores.items()
    }
    if scored_as != "prediction":
        out["prediction"] = out.get(scored_as, {})
    return out


# ------------------------------------------------------------------------------------------
# the whole validation


def _load_plan(path: str | Path) -> Plan:
    try:
        return load_plan(path)
    except InputError as exc:
        raise InputError(exc.message, argument="plan_path") from None


def _find_profile(
    plan: Plan, plan_path: str | Path, runs: str | Path, explicit: str | None
) -> Path:
    if explicit is not None:
        return Path(explicit)
    cands = []
    src = plan.sources.get("bandwidth", {}).get("path")
    if src:
        cands.append(Path(src))
    pp = Path(plan_path)
    base = pp if pp.is_dir() else pp.parent
    cands += [base / "profile.json", Path(runs) / "profile.json"]
    for c in cands:
        if c.is_file():
            return c
    raise InputError(
        f"{plan_path}: its bandwidth profile is not found (looked for "
        f"{', '.join(str(c) for c in cands)}); name one with profile_path",
        argument="plan_path",
    )


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", name.lower())


def _same_model(spec: ModelSpec, run_model: str) -> bool:
    """Whether runs labelled ``run_model`` are of the plan's model ``spec``: the spec's name
    (without a "[N layers]" suffix), or the folder of the HF config it was read from (a local
    model's label); a dummy-weight label "PRESET-dummy-NL" matches the preset cut to N layers."""
    if not run_model:
        return True
    base = re.sub(r"\[\d+ layers\]$", "", spec.name).strip()
    aliases = {_norm(spec.name), _norm(base)}
    if spec.source:
        p = Path(spec.source)
        aliases.add(_norm(p.parent.name if p.name == "config.json" else p.name))
    m = re.fullmatch(r"(.+)-dummy-(\d+)L", run_model)
    if m:
        layers = int(m.group(2))
        return _norm(m.group(1)) in aliases and layers in (
            spec.num_hidden_layers,
            spec.num_moe_layers,
        )
    aliases.discard("")
    return _norm(run_model) in aliases


def validate(
    plan_path: str | Path,
    runs: str | Path,
    *,
    rules_path: str | None = None,
    profile_path: str | None = None,
) -> Validation:
    """Score every configuration of ``runs`` against the plan's model and bandwidth profile with
    the rule set ``rules_path`` (default: the pre-registered one)."""
    from specmoe.formats.profile import check_profile_matches, load_profile

    try:
        rules = load_rules(rules_path)
    except InputError as exc:
        raise InputError(exc.message, argument="rules_path") from None
    plan = _load_plan(plan_path)
    try:
        spec = ModelSpec.from_dict(plan.model)
    except (TypeError, ValueError, KeyError, InputError) as exc:
        raise InputError(
            f"{plan_path}: its model is not a model spec ({exc})", argument="plan_path"
        ) from None
    every = load_runs(runs)
    configs = [m for m in every if _same_model(spec, m.model)]
    if not configs:
        models = ", ".join(sorted({repr(m.model) for m in every}))
        raise InputError(
            f"{plan_path}: is for model {spec.name!r} but the runs in {runs} are for {models}",
            argument="plan_path",
        )
    skipped = sorted({m.model for m in every if not _same_model(spec, m.model)})
    if skipped:
        _err(
            f"validate: scoring the runs of {spec.name}; skipping those of "
            f"{', '.join(skipped)} (another plan scores them)"
        )
    ppath = _find_profile(plan, plan_path, runs, profile_path)
    profile = load_profile(ppath)
    check_profile_matches(profile, spec, path=str(ppath))
    eps = max(float(profile.epsilon["per_slot"]), float(profile.epsilon["dedup"]))
    folders = {m.name: str(Path(m.sources["verify"]).parent) for m in configs}
    checked = check_recorded_prediction(plan_path, ppath, sorted(set(folders.values())))
    scored = []
    for m in configs:
        _err(f"validate: scoring {m.name}")
        c = score_configuration(
            m, profile, num_layers=spec.num_moe_layers, eps=eps, rules=rules, plan=plan
        )
        if folders[m.name] in checked:
            c = dataclasses.replace(c, notes=(*c.notes, checked[folders[m.name]]))
        scored.append(c)
    with_iv = rules.measured_side is not None
    summary = tuple(
        RuleSummary(
            rule=r,
            per_configuration={c.name: c.rules[i].holds for c in scored},
            decided_per_configuration=(
                {c.name: c.rules[i].decided for c in scored} if with_iv else None
            ),
        )
        for i, r in enumerate(rules.rules)
    )
    return Validation(
        model=spec.name,
        plan=str(plan_path),
        profile=str(ppath),
        runs=str(runs),
        rules_file=RulesFile(path=rules.path, sha256=rules.sha256, title=rules.title),
        epsilon=eps,
        crossover_plan=plan.crossover,  # Eq. (5) from bandwidths, for reference
        device=profile.device,
        device_name=profile.device_name,
        configurations=tuple(scored),
        rules=summary,
    )
