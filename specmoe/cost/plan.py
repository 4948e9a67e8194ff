"""The plan: bytes from routing over bandwidths from the benchmark, through the theory.

:func:`build_plan` combines a :class:`~specmoe.spec.ModelSpec`, the union U_l(n) of a routing
trace (mapped onto the spec's MoE layers) and the bandwidths of a profile into, for each kernel
policy (``per_slot``, ``dedup``, ``best``): the verify times tau_p(n) of Eq. (5) with the band of
Eq. (17), the step times V(k) = tau_p(k+1) + h(k), a0 (Eq. (B.4)), the staircase k*(a) with its
step points (Eq. (B.31)), the best speedup against a (Eq. (9)) with its bound (Eq. (21)), and for
the deduplicating engine the reuse thresholds rho*_k(a) (Eq. (14)); plus the saving S(n)
(Eq. (6)) with its band (Eq. (18)), the faster-kernel rule (Eqs. (7), (19)) and the crossover.
The ``best`` policy is a kernel switch no serving engine has; beside it, the same quantities
under the kernel each engine (vLLM, SGLang, llama.cpp) really runs at each n on the profile's
device (:mod:`specmoe.cost.engine_kernels`), and each engine's settings at its own k*
(:mod:`specmoe.cost.engine_settings`).
When the profile carries the per-operation benchmark (its ``whole_pass`` field), the same
per-policy quantities from the whole-pass prediction (:func:`_whole_pass`); the saving and the
crossover are the plan's own there (the other operations are the same for both kernels).
Equation numbers are those of paper 002.

Choices where the paper leaves a quantity to the engine: t0 = 0 and phi_p = 0 (the profile's
bandwidths are measured on whole operation times, so the fixed work of the expert operation is
inside them); beta_D is the measured read ceiling; kv(k) = kv-bytes-per-token (context + k);
one eps for every bandwidth, the larger of the two kernels' (as in paper 002 Section 4), and
delta = eps/(1 - eps) (Eq. (C.7)); f_l = 1 (the profile's dedup bandwidth is on union bytes).

The CLI is :mod:`specmoe.commands.plan`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.cost import bounds, theory
from specmoe.cost._exact import check_acceptance
from specmoe.cost.bytes import pass_bytes
from specmoe.cost.engine_kernels import compute_capability_of, engine_kernel
from specmoe.cost.engine_settings import EngineRequest, engine_settings, target_model_for
from specmoe.cost.ops_fit import whole_pass_time
from specmoe.cost.plan_result import (
    KERNEL_SWITCH,
    SCHEMA,
    Bandwidths,
    EnginePlan,
    EnginePolicy,
    Epsilon,
    Level,
    Plan,
    PlanBytes,
    PolicyPlan,
    Saving,
    WholePassPlan,
)
from specmoe.cost.step import (
    POLICIES,
    dedup_faster,
    profile_bandwidths,
    verify_model,
    whole_model_verify_time,
)
from specmoe.errors import InputError

__all__ = ["SCHEMA", "EngineRequest", "Plan", "build_plan", "load_plan", "read_plan"]

MS = 1e3


def _acceptance(a: Any, argument: str) -> Fraction | float:
    """An acceptance value in [0, 1); the error names ``argument``."""
    try:
        return check_acceptance(a, argument)
    except InputError as exc:
        raise InputError(str(exc).removeprefix(f"{argument}: "), argument=argument) from None


def _policy_eps(eps: dict[str, float]) -> float:
    return max(float(eps.get("per_slot", 0.0)), float(eps.get("dedup", 0.0)))


def _eq22(profile: Any, tau1: float, k_max: int, num_layers: int) -> dict[str, list] | None:
    """Eq. (22) with the profile's predicted per-layer operation times (the fits at the union
    bytes of recorded windows), summed onto the model's layers, from tau(1) of Eq. (5): a cross
    check of the bandwidth route; None when the profile holds no usable operation times."""
    try:
        idx = [profile.n.index(k) for k in range(1, k_max + 2)]
        return {
            p: (whole_model_verify_time(profile, p, tau1, num_layers=num_layers)[idx] * MS).tolist()
            for p in ("per_slot", "dedup")
        }
    except (InputError, KeyError, ValueError, TypeError, IndexError):
        return None


def _policy_plan(
    tau_ms: np.ndarray,
    band_ms: np.ndarray,
    h: np.ndarray,
    acc: Sequence[Fraction | float],
    delta: float | None,
) -> PolicyPlan:
    """One policy's plan from its verify times tau_p(n) [ms] and their band: the step times
    V(k) = tau_p(k+1) + h(k), a0 (Eq. (B.4)), the staircase and step points (Eq. (B.31)), and per
    acceptance value the best draft length, its speedup (Eq. (9)) with bound (21) and whether
    k_hat* = k* is certain (bound (20)); the bounds are None without ``delta``."""
    Vl = (tau_ms + h).tolist()  # every theory call uses the step times plan.json holds
    st = theory.staircase(Vl)
    ks, sps, sbs, certain = [], [], [], []
    for a in acc:
        k = theory.best_draft_length(Vl, a)
        s = float(theory.speedup(Vl, a, k))
        ks.append(k)
        sps.append(s)
        if delta is None:
            sbs.append(None)
            certain.append(None)
        else:
            sbs.append(tuple(float(x) for x in bounds.speedup_interval(s, delta)))
            certain.append(bounds.best_length_separated(theory.throughput(Vl, a), delta))
    return PolicyPlan(
        verify_ms=tuple(tau_ms.tolist()),
        verify_band_ms=tuple(np.asarray(band_ms, dtype=np.float64).tolist()),
        step_ms=tuple(Vl),
        a0=float(theory.first_threshold(Vl)),
        step_points=tuple(st.step_points),
        staircase=tuple(Level(lo, hi, k) for lo, hi, k in st.levels),
        best_k=tuple(ks),
        speedup=tuple(sps),
        speedup_bound=tuple(sbs),
        best_k_certain=tuple(certain),
    )


def _whole_pass(
    spec: Any,
    profile: Any,
    vm: Any,
    eps: float,
    h: np.ndarray,
    acc: Sequence[Fraction | float],
    context: int,
) -> WholePassPlan | None:
    """The whole-pass prediction (None when the profile has no ``whole_pass`` field):
    tau_hat_p(n) = whole_pass_time(n, context, L) + E_p(n)/beta_p(n), the sum over every other
    operation of the pass of its fit (:func:`specmoe.cost.ops_fit.whole_pass_time`, on all L
    decoder layers of the spec) plus the plan's expert operation of Eq. (5) (the same term as
    its verify times). Its error is the time-weighted sum of the operations' error and the
    expert term's, eps/(1 - eps) by Eq. (C.1): the bound when every part errs by its own
    error in the same direction. Bound (17) is eps_p(n)/(1 - eps_p(n)) tau_hat_p(n), delta is
    Eq. (C.7) of the largest combined error (the step time V = tau + h errs at most as much as
    tau, h being measured), and (20)/(21) follow from it."""
    wp = getattr(profile, "whole_pass", None)
    if wp is None:
        return None
    num_layers = int(spec.num_hidden_layers)
    ops = [whole_pass_time(wp, int(n), int(context), num_layers) for n in vm.n]
    ops_ms = np.array([t for t, _ in ops], dtype=np.float64)
    ops_eps = np.array([e for _, e in ops], dtype=np.float64)
    f_exp = float(bounds.relative_error_factor(eps)) if eps < 1 else math.inf
    expert, epsilon, tau = {}, {}, {}
    for p in POLICIES:
        expert[p] = vm.expert[p] * MS
        tau[p] = ops_ms + expert[p]
        epsilon[p] = (ops_eps * ops_ms + f_exp * expert[p]) / tau[p]
    eps_max = float(max(np.max(e) for e in epsilon.values()))
    delta = float(bounds.delta_from_epsilon(eps_max)) if eps_max < 0.5 else None
    policies = {}
    for p in POLICIES:
        band = [
            float(bounds.verify_time_bound(float(t), float(e))) if e < 1 else math.inf
            for t, e in zip(tau[p], epsilon[p], strict=True)
        ]
        policies[p] = _policy_plan(tau[p], np.asarray(band), h, acc, delta)
    return WholePassPlan(
        num_layers=num_layers,
        context=int(context),
        ops_ms=tuple(ops_ms.tolist()),
        ops_eps=tuple(ops_eps.tolist()),
        expert_ms={p: tuple(v.tolist()) for p, v in expert.items()},
        expert_eps=f_exp,
        epsilon={p: tuple(v.tolist()) for p, v in epsilon.items()},
        epsilon_max=eps_max,
        delta=delta,
        loss_bound=float(bounds.throughput_loss_bound(delta)) if delta is not None else None,
        policies=policies,
    )


def _engine_policies(
    spec: Any,
    profile: Any,
    vm: Any,
    eps: float,
    h: np.ndarray,
    acc: Sequence[Fraction | float],
    delta: float | None,
    request: EngineRequest,
) -> dict[str, EnginePolicy]:
    """Per engine of ``request``, the kernel it runs at each n on the profile's device (its
    rule from :mod:`specmoe.cost.engine_kernels`) and the policy plan under it: the verify time
    at n is tau_per_slot(n) where the engine reads per slot and tau_dedup(n) where it groups by
    expert (Eq. (5) with that kernel's bytes and bandwidth), with bound (17) of the same kernel."""
    cc = request.compute_capability
    if cc is None:
        cc = compute_capability_of(getattr(profile, "device_name", None))
    n_max = len(vm.n)
    out = {}
    for name in request.engines:
        ek = engine_kernel(
            name,
            str(getattr(profile, "device", "cpu")),
            n_max,
            num_experts=int(spec.num_experts),
            top_k=int(spec.top_k),
            compute_capability=cc,
            weight_type=request.weight_type,
        )
        pol = None
        if ek.kernel is not None:
            slot = np.array([x == "per_slot" for x in ek.kernel])
            tau = np.where(slot, vm.tau["per_slot"], vm.tau["dedup"]) * MS
            mem = np.where(slot, vm.memory["per_slot"], vm.memory["dedup"])
            pol = _policy_plan(tau, bounds.verify_time_bound(mem, eps) * MS, h, acc, delta)
        out[name] = EnginePolicy(ek, pol)
    return out


def _engine_plan(
    spec: Any,
    profile: Any,
    policies: dict[str, PolicyPlan],
    engine_pols: dict[str, EnginePolicy],
    a: Fraction | float,
    cross: int | None,
    request: EngineRequest,
) -> EnginePlan:
    """k* and its speedup at the expected acceptance ``a`` per kernel policy and per engine
    under its own kernel, and each engine's settings at its own k* (the faster-kernel policy's
    k* where the engine's rule cannot be evaluated, said in its notes)."""
    kk = {p: theory.best_draft_length(policies[p].step_ms, a) for p in POLICIES}
    sp = {p: float(theory.speedup(policies[p].step_ms, a, kk[p])) for p in POLICIES}
    labels = {"best": KERNEL_SWITCH}
    settings: dict[str, Any] = {}
    device = "cuda" if str(getattr(profile, "device", "cpu")).startswith("cuda") else "cpu"
    for name, ep in engine_pols.items():
        ek, pol = ep.kernel, ep.policy
        notes = []
        if pol is not None:
            kk[name] = theory.best_draft_length(pol.step_ms, a)
            sp[name] = float(theory.speedup(pol.step_ms, a, kk[name]))
            labels[name] = f"the kernel {ek.name} runs: {ek.rule}"
            k = kk[name]
        else:
            pol = policies["best"]
            k = kk["best"]
            notes.append(f"{ek.note}; k* from the faster-kernel policy instead")
        target, needs = target_model_for(name, spec.to_dict(), request.target_model)
        s = engine_settings(
            name,
            k=k,
            drafter=request.drafter,
            target_model=target,
            draft_model=request.draft_model,
            device=device,
            staircase=pol.staircase,
            step_points=pol.step_points,
            force_triton=device == "cuda",
        )
        s["notes"] = [*notes, *s.get("notes", [])]
        settings[name] = {"name": ek.name, "release": ek.release, **s, "needs": needs}
    settings["dedup_from_pass_size"] = cross
    settings["kernel_switch"] = KERNEL_SWITCH
    return EnginePlan(
        expected_acceptance=float(a),
        draft_length=kk,
        speedup=sp,
        settings=settings,
        labels=labels,
        drafter=request.drafter,
    )


def build_plan(
    spec: Any,
    union: Any,
    profile: Any,
    *,
    k_max: int = 8,
    acceptance: Sequence[Fraction | float] = (),
    draft_ms: Sequence[float] | None = None,
    context: int = 512,
    expected_acceptance: Fraction | float | None = None,
    notes: Sequence[str] = (),
    sources: dict[str, Any] | None = None,
    engines: EngineRequest | None = None,
) -> Plan:
    """The plan for ``spec`` with ``union`` [L, n >= k_max+1] (U_l(n), mapped onto the spec's L
    MoE layers) and a bandwidth ``profile`` measured on the spec's shapes at its dtype.

    ``acceptance``: the acceptance values of ``best_k``/``speedup`` (Fractions are exact);
    ``draft_ms``: h(0..k_max) in ms (zeros when omitted); ``context``: depth d for kv(k);
    ``engines``: the engines, drafter and models of the engine settings (default: all three
    engines with an n-gram drafter), whose kernels are evaluated on the profile's device.
    """
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 1:
        raise InputError(f"must be an integer >= 1, got {k_max!r}", argument="k_max")
    U = np.asarray(union, dtype=np.float64)
    if U.ndim != 2 or U.shape[1] < k_max + 1:
        raise InputError(
            f"needs pass sizes up to {k_max + 1}, got shape {U.shape}", argument="union"
        )
    U = U[:, : k_max + 1]
    acc = [_acceptance(a, "acceptance") for a in acceptance]
    h = np.zeros(k_max + 1) if draft_ms is None else np.asarray(draft_ms, dtype=np.float64)
    if h.shape != (k_max + 1,):
        raise InputError(f"needs h(k) for k = 0..{k_max}, got {h.size} values", argument="draft_ms")
    if not np.all(np.isfinite(h)) or np.any(h < 0):
        raise InputError("draft times must be non-negative", argument="draft_ms")
    h_s = h / MS

    try:
        bw = profile_bandwidths(profile, k_max + 1)
    except InputError as exc:
        if exc.argument != "n_max":
            raise
        top = max(profile.n)
        raise InputError(
            f"{exc.message}: a pass of k_max + 1 tokens needs k_max <= {top - 1}, got {k_max}",
            argument="k_max",
        ) from None
    pb = pass_bytes(spec, U, context=context)
    vm = verify_model(
        pb, beta_slot=bw["beta_slot"], beta_dedup=bw["beta_dedup"], beta_dense=bw["beta_dense"]
    )
    eps = _policy_eps(bw["epsilon"])
    delta = float(bounds.delta_from_epsilon(eps)) if eps < 0.5 else None
    cross = vm.crossover
    n = vm.n
    band = bounds.saving_bound(vm.expert["per_slot"], vm.expert["dedup"], eps) * MS
    band[0] = 0.0  # one kernel runs a one-token pass: S(1) = 0 exactly

    policies = {
        p: _policy_plan(
            vm.tau[p] * MS, bounds.verify_time_bound(vm.memory[p], eps) * MS, h, acc, delta
        )
        for p in POLICIES
    }

    # Reuse thresholds of a deduplicating engine, Eq. (14); h enters as fixed work (App. B.2).
    m, W = pb.m, pb.W
    V0 = float(vm.tau["dedup"][0] + h_s[0])
    thr = tuple(
        tuple(
            float(
                theory.reuse_threshold(
                    a,
                    k,
                    m=m,
                    W=W,
                    tau1=V0,
                    bandwidth_k=float(bw["beta_dedup"][k]),
                    bandwidth_1=float(bw["beta_slot"][0]),
                    dense_growth_bytes=float(pb.dense[k] - pb.dense[0]),
                    dense_bandwidth=bw["beta_dense"],
                    fixed_work_growth=float(h_s[k] - h_s[0]),
                )
            )
            for k in range(1, k_max + 1)
        )
        for a in acc
    )

    request = engines if engines is not None else EngineRequest()
    engine_pols = _engine_policies(spec, profile, vm, eps, h, acc, delta, request)
    engine = None
    if expected_acceptance is not None:
        a = _acceptance(expected_acceptance, "expected_acceptance")
        engine = _engine_plan(spec, profile, policies, engine_pols, a, cross, request)
    eq22 = _eq22(profile, float(vm.tau["per_slot"][0]), k_max, spec.num_moe_layers)
    return Plan(
        model=spec.to_dict(),
        sources=dict(sources or {}),
        notes=tuple(notes),
        k_max=k_max,
        context=context,
        n=tuple(n.tolist()),
        acceptance=tuple(float(a) for a in acc),
        draft_ms=tuple(h.tolist()),
        epsilon=Epsilon(bw["epsilon"].get("per_slot"), bw["epsilon"].get("dedup"), eps),
        delta=delta,
        loss_bound=float(bounds.throughput_loss_bound(delta)) if delta is not None else None,
        bandwidth_gbps=Bandwidths(
            per_slot=tuple((bw["beta_slot"] / 1e9).tolist()),
            dedup=tuple((bw["beta_dedup"] / 1e9).tolist()),
            dense=bw["beta_dense"] / 1e9,
        ),
        bytes=PlanBytes(
            dense=tuple(pb.dense.tolist()),
            slot=tuple(pb.slot.tolist()),
            union=tuple(pb.union.tolist()),
            u_bar=tuple(pb.u_bar.tolist()),
            mean_reuse=tuple(pb.mean_reuse.tolist()),
            W=pb.W,
            m=pb.m,
        ),
        r=tuple(vm.r.tolist()),
        saving=Saving(
            ms=tuple((vm.saving * MS).tolist()),
            band_ms=tuple(band.tolist()),
            # Eq. (7) (f_l = 1, equal fixed work phi = 0); one kernel runs a one-token pass
            dedup_faster=tuple(
                bool(x) and i > 0 for i, x in enumerate(dedup_faster(vm.u_bar, vm.r))
            ),
            kernel_decision_robust=tuple(
                bool(bounds.kernel_decision_robust(float(u), float(r), eps)) if i else None
                for i, (u, r) in enumerate(zip(vm.u_bar, vm.r))
            ),
        ),
        crossover=cross,
        crossover_measured_in_profile=getattr(profile, "crossover", None),
        policies=policies,
        verify_ms_eq22=None if eq22 is None else {p: tuple(v) for p, v in eq22.items()},
        reuse_threshold={"dedup": thr},
        engine=engine,
        whole_pass=_whole_pass(spec, profile, vm, eps, h, acc, context),
        engine_kernels=engine_pols,
        verify=vm,
    )


def read_plan(plan: str | os.PathLike, *, fields: Sequence[str] = ()) -> dict[str, Any]:
    """A plan.json written by ``specmoe plan`` (the file, or the folder holding it), as a dict.

    A missing or unreadable file, or one that is not a JSON object with each of ``fields``,
    raises ``InputError`` naming the file, with ``argument="plan"``.
    """
    from specmoe._io import read_json

    p = Path(plan)
    if p.is_dir():
        p = p / "plan.json"
    try:
        d = read_json(p, "plan file")
    except InputError as exc:
        raise InputError(str(exc), argument="plan") from None
    if not isinstance(d, dict):
        raise InputError(f"{p}: not a JSON object (is it a specmoe plan.json?)", argument="plan")
    for f in fields:
        if f not in d:
            raise InputError(f"{p}: no {f!r} field (is it a specmoe plan.json?)", argument="plan")
    return d


def load_plan(plan: str | os.PathLike) -> Plan:
    """A plan.json (the file or its folder) as a :class:`Plan`; errors as :func:`read_plan`."""
    d = read_plan(plan)
    try:
        return Plan.from_dict(d)
    except InputError as exc:
        raise InputError(f"{plan}: {exc.message}", argument="plan") from None
