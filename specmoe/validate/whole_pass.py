"""The whole-pass version of ``specmoe validate`` (docs/runs-protocol-whole-pass.md).

tau_hat_p(n) = the sum of every other operation's fit of the per-operation benchmark at the
configuration's depth (:func:`specmoe.cost.ops_fit.whole_pass_time`, Eq. (22) generalised to
every operation) plus the plan's expert operation of Eq. (5) of paper 002, E_p(n)/beta_p(n);
it does not use the measured tau(1). :func:`scored_version` reads a rule set's
``scored_version`` (``rules-whole-pass.json`` names ``whole_pass``).

The measured side of a rule set with ``definitions.measured`` (:func:`measured_side`): tau_p(n)
the mean over prompts of per-prompt medians, T(k, a) the median over prompts x repeats, and
their percentile bootstrap over prompts (:mod:`specmoe.validate.intervals`);
:func:`version_intervals` recomputes every score of one version on each resample.
:func:`check_recorded_prediction` holds a scored plan and profile to the SHA-256 that the
campaign record committed before the runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specmoe._io import read_json
from specmoe.cost.ops_fit import whole_pass_time
from specmoe.cost.plan_result import Plan
from specmoe.errors import InputError
from specmoe.formats.runs import Measured, recorded_prediction
from specmoe.validate import intervals as iv
from specmoe.validate.result import MeasuredIntervals, VersionIntervals
from specmoe.validate.rules import METRICS, RuleSet, crossover_distance

__all__ = [
    "ANCHOR",
    "MeasuredSide",
    "check_recorded_prediction",
    "measured_side",
    "scored_version",
    "steps_throughput",
    "version_intervals",
    "whole_pass_version",
]


def whole_pass_version(
    plan: Plan,
    profile: Any,
    depth: int | None,
    n_max: int,
    *,
    context: int | None = None,
    step_contexts: Sequence[int] | None = None,
    verify_contexts: Sequence[int] | None = None,
) -> tuple[dict[str, Any] | None, str | None]:
    """The whole-pass version at n = 1..n_max, {verify_ms, expert_ms} per kernel and its
    combined error ``epsilon`` (the largest of the plan's), with a note; (None, note) when the
    plan has no ``whole_pass`` or too few pass sizes. The other operations are summed from
    the profile's ``whole_pass`` at ``context`` (the cache's length before the verify runs'
    passes) or, without one, at the configuration's ``depth``; without a profile
    ``whole_pass``, the plan's own sums at its context are used (and said in the note).

    ``step_contexts`` (the cache lengths of the throughput runs' passes): ``step_verify_ms``,
    the mean over them of the verify time, the step time's verify part that picks k̂*; it
    differs from ``verify_ms`` only where a profile's ``kv_pad`` makes the cells read step with
    the cache (otherwise ``verify_ms`` is used for both, as before).

    ``verify_contexts`` (a rule set whose verify side is the rounds' own passes,
    ``rules-llamacpp-rounds.json``): ``verify_ms`` is the mean over those cache lengths of the
    sum (``definitions.measured.tau_prediction``), and the step time the same.

    A profile ``whole_pass.level`` (``{"<depth>": s}``, ``scripts/llamacpp_level.py``) scales
    every time of the version at ``depth`` by s: the level of the benchmark's own passes
    measured beside the runs over the committed benchmark's. The draft's time is the runs',
    unscaled; with a draft of no cost a uniform factor leaves k̂* and the predicted speedup as
    they are, and moves the verify error only."""
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
    step = None
    if prof_wp is not None and (depth is not None or context is not None):
        d0 = int(depth if context is None else context)
        ops = np.array(
            [whole_pass_time(prof_wp, n, d0, wp.num_layers)[0] for n in range(1, n_max + 1)]
        )
        if verify_contexts is not None:
            cs = [int(c) for c in verify_contexts]
            ops = np.array(
                [
                    np.mean([whole_pass_time(prof_wp, n, c, wp.num_layers)[0] for c in cs])
                    for n in range(1, n_max + 1)
                ]
            )
        elif step_contexts is not None and prof_wp.get("kv_pad") is not None:
            cs = [int(c) for c in step_contexts]
            step = np.array(
                [
                    np.mean([whole_pass_time(prof_wp, n, c, wp.num_layers)[0] for c in cs])
                    for n in range(1, n_max + 1)
                ]
            )
    else:
        ops = np.asarray(wp.ops_ms[:n_max], float)
        note = f"whole-pass version: the plan's sums at depth {wp.context} (no profile whole_pass)"
    expert = {p: np.asarray(wp.expert_ms[p][:n_max], float) for p in ("per_slot", "dedup")}
    level = prof_wp.get("level") if prof_wp is not None else None
    if level is not None and depth is not None:
        if str(int(depth)) not in level:
            return None, (
                f"whole-pass version not scored: the profile's level has no depth {depth} "
                f"(it has {', '.join(sorted(level, key=int))})"
            )
        s = float(level[str(int(depth))])  # the benchmark's level beside the runs (round 7)
        ops, expert = ops * s, {p: e * s for p, e in expert.items()}
        if step is not None:
            step = step * s
        note = f"whole-pass version at the level measured beside the runs: x{s:.3f}"
    version = {
        "verify_ms": {p: ops + e for p, e in expert.items()},
        "expert_ms": expert,
        "epsilon": float(wp.epsilon_max),
    }
    if step is not None:
        version["step_verify_ms"] = {p: step + e for p, e in expert.items()}
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


# ------------------------------------------------------------------------------------------
# the measured side of definitions.measured, with its intervals (definitions.intervals)

# what each version takes from the runs, re-applied on every resample: tau(1) (Eq. (22)),
# tau_off(n) (the calibration) or nothing (the whole-pass prediction)
ANCHOR = {
    "prediction": "tau1",
    "measured_time": "tau1",
    "calibrated": "off",
    "whole_pass": None,
}


@dataclass(frozen=True)
class MeasuredSide:
    """The measured side of one configuration under ``definitions.measured``: point estimates
    tau_off(n), tau_on(n) [n] and T(k, a) [A, K]; their resamples ``tau_b`` {per_slot, dedup}
    [B, n] and ``T_b`` [B, A, K] (None without per-prompt samples); the measured crossover
    of each resample [B] (None as n_hi + 1); the serialisable ``intervals`` and notes. Runs of
    one, deduplicating kernel have ``off`` None, ``tau_b`` {dedup} and ``cross_b`` None."""

    off: np.ndarray | None
    on: np.ndarray
    T: np.ndarray
    tau_b: dict[str, np.ndarray] | None
    T_b: np.ndarray | None
    cross_b: tuple[int | None, ...] | None
    level: float
    intervals: MeasuredIntervals
    notes: tuple[str, ...]


def _pairs(iv: np.ndarray | None) -> Any:
    """[..., 2] intervals as nested tuples, NaN as None."""
    if iv is None:
        return None
    a = np.asarray(iv, dtype=np.float64)
    if a.ndim == 1:
        return tuple(None if not np.isfinite(x) else float(x) for x in a)
    return tuple(_pairs(r) for r in a)


def _repeats(x: np.ndarray | None) -> int | None:
    """The largest number of recorded repetitions of one cell of ``x`` [..., R] (NaN pads)."""
    return None if x is None else int(np.max(np.sum(~np.isnan(x), axis=-1)))


def steps_throughput(V: np.ndarray, acceptance: Sequence[float]) -> np.ndarray:
    """T(k, a) = 1000 G_a(k) / V(k) tokens per second, G_a(k) = 1 + a + ... + a^k (the
    expected tokens of a step of k drafts, each accepted with probability a until the first
    rejection; Eq. (9) of paper 002) and V(k) the measured step time in ms: [A, K] from
    ``V`` [K], or [B, A, K] from [B, K]."""
    V = np.asarray(V, dtype=np.float64)
    a = np.asarray(acceptance, dtype=np.float64)[:, None]
    k = np.arange(V.shape[-1])[None, :]
    G = np.cumsum(np.broadcast_to(a, (a.shape[0], k.shape[1])) ** k, axis=1)  # [A, K]
    return 1000.0 * G / V[..., None, :]


def measured_side(m: Measured, rules: RuleSet, *, n_top: int, K: int, n_hi: int) -> MeasuredSide:
    """The statistics of ``rules.measured_side`` on the runs ``m`` at n = 1..n_top and
    k = 0..K, with prompts resampled as ``definitions.intervals`` says. Without per-prompt
    verify times tau is ``verify_ms`` as given, without per-generation throughputs T is
    ``tokens_per_s`` as given (each said in a note), and their intervals are None."""
    from specmoe.cost.step import crossover

    level, resamples, seed = rules.interval_settings
    notes = []
    tau_b = None
    off: np.ndarray | None
    if m.per_prompt_on_ms is not None:  # the loader gives off beside on, or on alone
        pp = {"dedup": m.per_prompt_on_ms[:, :n_top]}
        if m.per_prompt_off_ms is not None:
            pp = {"per_slot": m.per_prompt_off_ms[:, :n_top], **pp}
        off = iv.mean_of_medians(pp["per_slot"]) if "per_slot" in pp else None
        on = iv.mean_of_medians(pp["dedup"])
        idx = iv.resample_prompts(pp["dedup"].shape[0], resamples=resamples, seed=seed)
        tau_b = {p: iv.mean_of_medians(x, idx) for p, x in pp.items()}
        tau_how = "mean over prompts of per-prompt medians"
    else:
        off = None if m.verify_off_ms is None else m.verify_off_ms[:n_top]
        on = m.verify_on_ms[:n_top]
        tau_how = "verify_ms of the runs (no per-prompt times)"
        notes.append("no per-prompt verify times: tau(n) is verify_ms as given, no interval")
    T_b = None
    if rules.throughput_side == "steps":
        from specmoe.formats.runs import rounds_verify_side

        r = m if rules.verify_side == "rounds" else rounds_verify_side(m)
        pp_v = r.per_prompt_on_ms[:, : K + 1]
        h = np.zeros(K + 1) if m.draft_ms is None else np.asarray(m.draft_ms[: K + 1], float)
        T = steps_throughput(pp_v.mean(axis=0) + h, m.acceptance)
        idx = iv.resample_prompts(pp_v.shape[0], resamples=resamples, seed=seed)
        T_b = steps_throughput(iv.mean_of_medians(pp_v, idx) + h, m.acceptance)
        thr_how = (
            "1000 G_a(k) / V(k), V(k) = tau_r(k + 1) + h(k): tau_r the mean over prompts of "
            "each prompt's median over its oracle generations at k of each generation's "
            "median verification pass"
        )
        real = iv.median_of_generations(m.per_prompt_tokens_per_s[:, : K + 1])
        notes.append(
            "throughput side: the expected tokens per second of the measured steps, "
            "G_a(k) / (tau_r(k + 1) + h(k)) from the rounds' own passes, not each "
            "generation's realised tokens per second (whose k* is "
            + " ".join(str(int(k)) for k in iv.kstar_samples(real))
            + ")"
        )
    elif m.per_prompt_tokens_per_s is not None:
        X = m.per_prompt_tokens_per_s[:, : K + 1]
        T = iv.median_of_generations(X)
        idx = iv.resample_prompts(X.shape[2], resamples=resamples, seed=seed)
        T_b = iv.median_of_generations(X, idx)
        thr_how = "median over prompts x repeats of per-generation tokens/s"
    else:
        T = m.throughput[:, : K + 1]
        thr_how = "tokens_per_s of the runs (no per-generation samples)"
        notes.append("no per-generation throughputs: T(k, a) is tokens_per_s as given, no interval")
    n_all = np.arange(1, n_hi + 1)
    cross_b = None
    saving_iv = None
    if tau_b is not None and "per_slot" in tau_b:
        S_b = tau_b["per_slot"] - tau_b["dedup"]
        cross_b = tuple(crossover(s[:n_hi], n_all) for s in S_b)
        saving_iv = iv.percentile_interval(S_b, level)
    intervals = MeasuredIntervals(
        level=level,
        resamples=resamples,
        seed=seed,
        tau=tau_how,
        throughput=thr_how,
        verify_prompts=None if tau_b is None else int(m.per_prompt_on_ms.shape[0]),
        verify_repeats=_repeats(
            m.per_prompt_repeats_on_ms
            if m.per_prompt_repeats_off_ms is None
            else m.per_prompt_repeats_off_ms
        ),
        throughput_prompts=None if T_b is None else int(m.per_prompt_tokens_per_s.shape[2]),
        throughput_repeats=_repeats(m.per_prompt_tokens_per_s),
        verify_off_ms=None
        if tau_b is None or "per_slot" not in tau_b
        else _pairs(iv.percentile_interval(tau_b["per_slot"], level)),
        verify_on_ms=None
        if tau_b is None
        else _pairs(iv.percentile_interval(tau_b["dedup"], level)),
        saving_ms=_pairs(saving_iv),
        tokens_per_s=None if T_b is None else _pairs(iv.percentile_interval(T_b, level)),
        k_star=None
        if T_b is None
        else _pairs(iv.percentile_interval(iv.kstar_samples(T_b).astype(float), level)),
    )
    return MeasuredSide(
        off=None if off is None else np.asarray(off, float),
        on=np.asarray(on, float),
        T=np.asarray(T, float),
        tau_b=tau_b,
        T_b=T_b,
        cross_b=cross_b,
        level=level,
        intervals=intervals,
        notes=tuple(notes),
    )


def version_intervals(
    side: MeasuredSide,
    rules: RuleSet,
    *,
    version: str,
    tau_hat: dict[str, np.ndarray],
    S_hat: np.ndarray,
    band: np.ndarray,
    sc: slice,
    vsc: slice,
    n_hi: int,
    cross_pred: int | None,
    k_hat: Sequence[int],
    kernel: str,
    h: np.ndarray,
    acceptance: Sequence[float],
) -> VersionIntervals:
    """The intervals of one version's scores (:class:`VersionIntervals`): each score of
    :mod:`specmoe.validate.rules` recomputed on every resample of the measured side, the
    version re-anchored as :data:`ANCHOR` says, k_hat* fixed. On runs of one, deduplicating
    kernel the scores that need the per-slot time stay None."""
    from specmoe.cost import bounds

    level = side.level
    out: dict[str, Any] = dict.fromkeys(METRICS)
    loss_iv = share = None
    K1 = len(h)
    if side.tau_b is not None:
        tb = side.tau_b
        anchor = ANCHOR.get(version)
        # tau(1) of Eq. (22): the per-slot pass's, or the dedup pass's on runs of one kernel
        ref, ref_point = (tb["per_slot"], side.off) if "per_slot" in tb else (tb["dedup"], side.on)
        if anchor == "tau1":
            shift = np.broadcast_to(ref[:, :1] - ref_point[0], ref.shape)
        elif anchor == "off":
            shift = tb["per_slot"] - side.off
        else:
            shift = np.zeros_like(ref)
        th = {p: np.asarray(tau_hat[p], float)[None, :] + shift for p in tb}
        if all(p in tb for p in rules.verify_error_kernels):
            out["verify_error"] = np.max(
                [
                    np.max(np.abs(th[p][:, vsc] - tb[p][:, vsc]) / tb[p][:, vsc], axis=1)
                    for p in rules.verify_error_kernels
                ],
                axis=0,
            )
        if side.cross_b is not None:
            out["crossover_distance"] = np.array(
                [crossover_distance(cross_pred, c, n_hi) for c in side.cross_b], float
            )
        if "per_slot" in tb:
            S_b = tb["per_slot"] - tb["dedup"]
            e = np.abs(np.asarray(S_hat, float)[sc][None, :] - S_b[:, sc])
            inside = e <= band[None, :] if rules.band_edge_inside else e < band[None, :]
            out["saving_in_band_share"] = inside.mean(axis=1)
            out["saving_error_ms"] = e.max(axis=1)
        V_b = tb[kernel][:, :K1] + h
        Vh_b = th[kernel][:, :K1] + h
        delta = np.max(np.abs(Vh_b - V_b) / V_b, axis=1)
        out["delta"] = delta
        if rules.speedup_reference == "step_times":
            pred = iv.best_speedup_samples(Vh_b, acceptance)
            meas = iv.best_speedup_samples(V_b, acceptance)
            f = np.array([float(bounds.speedup_factor(d)) if d < 1 else np.nan for d in delta])
            ok = (meas / f[:, None] <= pred) & (pred <= meas * f[:, None])
            out["speedup_in_bound_share"] = np.where(np.isfinite(f), ok.mean(axis=1), np.nan)
    if side.T_b is not None:
        k_b = iv.kstar_samples(side.T_b)
        within = np.abs(k_b - np.asarray(k_hat)[None, :]) <= 1
        out["kstar_within_one"] = within.sum(axis=1).astype(float)
        loss = iv.loss_samples(side.T_b, k_hat)
        out["max_loss"] = loss.max(axis=1)
        loss_iv = _pairs(iv.percentile_interval(loss, level))
        share = tuple(float(x) for x in iv.within_one_share(k_b, k_hat))
    metrics = {
        k: None if v is None else _pairs(iv.percentile_interval(v, level)) for k, v in out.items()
    }
    metrics = {k: None if v is None or None in v else v for k, v in metrics.items()}
    return VersionIntervals(metrics=metrics, loss=loss_iv, kstar_share=share)


# ------------------------------------------------------------------------------------------
# the prediction the campaign recorded before its runs


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_recorded_prediction(
    plan_path: str | Path, profile_path: str | Path, runs_folders: Sequence[str | Path]
) -> dict[str, str]:
    """For each runs folder whose campaign record names its prediction
    (:func:`specmoe.formats.runs.recorded_prediction`): the plan file scored (``plan_path``,
    or plan.json in that folder) and the profile it reads (``profile_path``) must have the
    SHA-256 recorded there; a mismatch is an ``InputError`` naming the file (a committed
    prediction is never rescored). Returns a note per checked folder."""
    plan_file = Path(plan_path)
    if plan_file.is_dir():
        plan_file = plan_file / "plan.json"
    notes: dict[str, str] = {}
    prof_file, level_note = level_base(Path(profile_path))
    for folder in runs_folders:
        rec = recorded_prediction(folder)
        if rec is None:
            continue
        checked = []
        got_plan, got_prof = _sha256(plan_file), _sha256(prof_file)
        for i, (plan_sha, prof_sha) in enumerate(rec.also):  # a further recorded version
            if plan_sha == got_plan and prof_sha in (None, got_prof):
                notes[str(folder)] = (
                    f"prediction checked: the plan{' and profile' if prof_sha else ''} scored "
                    f"have the sha256 that {_shown(rec.record)} recorded before the runs "
                    f"(further version {i + 1})"
                )
                break
        if str(folder) in notes:
            continue
        for what, file, want, recorded_as in (
            ("plan", plan_file, rec.plan_sha256, rec.plan),
            ("profile", prof_file, rec.profile_sha256, rec.profile),
        ):
            if want is None:
                continue
            got = _sha256(file)
            if got != want:
                raise InputError(
                    f"{file}: sha256 {got[:16]} is not the {want[:16]} that {rec.record} "
                    f"recorded for the {what} of the runs in {rec.folder}"
                    + (f" ({recorded_as})" if recorded_as else "")
                    + "; a committed prediction is scored as committed, never recomputed"
                )
            checked.append(what)
        if checked:
            notes[str(folder)] = (
                f"prediction checked: the {' and '.join(checked)} scored have the sha256 "
                f"that {_shown(rec.record)} recorded before the runs"
            )
        if level_note and str(folder) in notes:
            notes[str(folder)] += level_note
    return notes


LEVEL_KEYS = ("level", "level_how", "level_base")


def level_base(profile_path: Path) -> tuple[Path, str]:
    """The committed profile a level version stands on, and a note: a profile whose
    ``whole_pass`` has ``level`` and ``level_base`` (``{"profile": path from the profile's
    folder, "sha256": ...}``, written by ``scripts/llamacpp_level.py``) is checked as that base profile, after checking
    that the base has that SHA-256 and that the two differ only by those keys. Any other
    profile is its own base (and the note is empty). A mismatch is an ``InputError`` naming
    the file."""
    import json

    try:
        raw = json.loads(Path(profile_path).read_text())
    except (OSError, ValueError):
        return Path(profile_path), ""  # load_profile names what is wrong with it
    wp = raw.get("whole_pass") if isinstance(raw, dict) else None
    if not isinstance(wp, dict) or "level_base" not in wp:
        return Path(profile_path), ""
    base = wp["level_base"]
    if not (isinstance(base, dict) and isinstance(base.get("profile"), str) and base.get("sha256")):
        raise InputError(f"{profile_path}: whole_pass.level_base must name a profile and sha256")
    base_path = Path(profile_path).parent / base["profile"]  # relative to the version's folder
    if not base_path.is_file():
        raise InputError(f"{profile_path}: whole_pass.level_base: {base['profile']}: no such file")
    if _sha256(base_path) != base["sha256"]:
        raise InputError(
            f"{profile_path}: whole_pass.level_base: {base['profile']} does not have the "
            f"sha256 {str(base['sha256'])[:16]} it names"
        )
    want = json.loads(base_path.read_text())
    have = json.loads(json.dumps(raw))
    for k in LEVEL_KEYS:
        have["whole_pass"].pop(k, None)
        want.get("whole_pass", {}).pop(k, None)
    if have != want:
        raise InputError(
            f"{profile_path}: differs from its level_base {base['profile']} beyond "
            f"whole_pass.level (a level version changes nothing else)"
        )
    return base_path, (
        f"; the profile scored is that prediction with the level measured beside the runs "
        f"(whole_pass.level {wp.get('level')})"
    )


def _shown(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies under it (a result names no
    machine's absolute paths), else as given."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
