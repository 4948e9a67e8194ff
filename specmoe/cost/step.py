"""Verify time, saving and step time (paper 002 Section 3.1, Eqs. (5)-(7), and Eq. (22)).

Legend: ``n`` pass sizes 1..n_max, ``k`` draft lengths 0..k_max (a pass of k + 1 tokens), ``L``
MoE layers. Units: seconds, bytes, bytes per second (a :class:`BandwidthProfile` stores GB/s).

Kernel policies: ``per_slot`` (every pass per-slot), ``dedup`` (the deduplicating kernel from
n = 2; a one-token pass runs the per-slot kernel either way, so tau(1) carries no kernel index)
and ``best`` (the faster of the two at each pass size).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specmoe.cost.bytes import PassBytes
from specmoe.errors import InputError

__all__ = [
    "GB",
    "POLICIES",
    "VerifyModel",
    "crossover",
    "dedup_faster",
    "linear_draft_time",
    "profile_bandwidths",
    "step_times",
    "verify_model",
    "verify_time",
    "verify_time_from_op_times",
    "whole_model_verify_time",
]

GB = 1e9
POLICIES = ("per_slot", "dedup", "best")


def _positive(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise InputError(f"{name}: must be positive and finite, got {x!r:.80}")
    return a


def _nonneg(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise InputError(f"{name}: must be non-negative and finite, got {x!r:.80}")
    return a


def verify_time(
    *,
    dense_bytes: Any,
    dense_bandwidth: Any,
    expert_bytes: Any,
    expert_bandwidth: Any,
    t0: Any = 0.0,
    fixed_work: Any = 0.0,
) -> np.ndarray:
    """Eq. (5) of paper 002: tau_p(n) = t0 + D(n)/beta_D + E_p(n)/beta_p(n) + phi_p(n).

    ``t0`` >= 0 is time outside the memory reads, ``fixed_work`` = phi_p(n) >= 0 (launches)."""
    return (
        _nonneg(t0, "t0")
        + _nonneg(dense_bytes, "dense_bytes") / _positive(dense_bandwidth, "dense_bandwidth")
        + _nonneg(expert_bytes, "expert_bytes") / _positive(expert_bandwidth, "expert_bandwidth")
        + _nonneg(fixed_work, "fixed_work")
    )


def dedup_faster(u_bar: Any, r: Any) -> np.ndarray:
    """Eq. (7) of paper 002: with f_l = 1 and equal fixed work the deduplicating kernel is
    faster exactly when u_bar(n) < r(n) (the sign of the saving S(n) of Eq. (6))."""
    return _positive(u_bar, "u_bar") < _positive(r, "r")


def crossover(saving: Any, n: Any = None) -> int | None:
    """The crossover of paper 002 Section 2: the smallest pass size n >= 2 from which the
    deduplicating kernel stays faster, S(n') > 0 for every measured or predicted n' >= n up to
    the largest; None when S is not positive at the largest pass size.

    ``saving`` [k] at pass sizes ``n`` [k] (default 1..k, any order); n = 1 never counts (the
    same kernel runs a one-token pass). The one definition: the plan, the benchmark profile, the
    measured verify runs and the validation all call it."""
    s = np.asarray(saving, dtype=np.float64).reshape(-1)
    n = np.arange(1, s.size + 1) if n is None else np.asarray(n).reshape(-1)
    if n.shape != s.shape:
        raise InputError(f"{n.size} pass sizes for {s.size} savings", argument="n")
    best = None
    for i in np.argsort(n, kind="stable")[::-1]:
        if n[i] < 2 or not s[i] > 0:
            break
        best = int(n[i])
    return best


def linear_draft_time(slope: float, intercept: float, k_max: int) -> np.ndarray:
    """h(k) = slope k + intercept for k >= 1 and h(0) = 0 (no draft runs in plain decoding):
    a linear draft-time model like T_D = 0.459 K + 0.073 ms of paper 000 (Figure A6)."""
    if not (np.isfinite(slope) and np.isfinite(intercept)) or slope < 0 or intercept < 0:
        raise InputError(
            f"draft time: slope and intercept must be non-negative, got {slope!r}, {intercept!r}"
        )
    h = slope * np.arange(k_max + 1, dtype=np.float64) + intercept
    h[0] = 0.0
    return h


def step_times(tau: Any, h: Any = None) -> np.ndarray:
    """V(k) = tau_p(k + 1) + h(k), k = 0..len(tau)-1 (paper 002 Section 3.1); ``tau`` [n_max] holds
    tau_p(1..n_max) and ``h`` [k_max + 1] the draft/host time per step (0 when omitted)."""
    tau = _positive(tau, "tau")
    h = np.zeros_like(tau) if h is None else _nonneg(h, "h")
    if h.shape != tau.shape:
        raise InputError(f"h: {h.size} draft times for {tau.size} verify times")
    return tau + h


def verify_time_from_op_times(
    op_kernel: Any, op_one: Any, tau1: float, *, num_layers: int | None = None
) -> np.ndarray:
    """Eq. (22) of paper 002: tau_hat_p(n) = tau_meas(1) + sum_l (t_p,l(n) - t_l(1)).

    ``op_kernel`` [L, n_max]: layer l's expert-operation time with kernel p at pass size n;
    ``op_one`` [L]: the same layer's one-token time t_l(1) (the per-slot kernel's, which runs a
    one-token pass with deduplication off and on); ``tau1`` the measured whole-model time of a
    one-token pass. With ``num_layers`` different from L (timed layers are a subset of the model's),
    the sum over the model's layers takes the layer-mean of the timed ones times num_layers."""
    op = _positive(op_kernel, "op_kernel")
    one = _positive(op_one, "op_one")
    if op.ndim != 2 or one.shape != (op.shape[0],):
        raise InputError(f"op_kernel [L, n] and op_one [L] disagree: {op.shape}, {one.shape}")
    (tau1,) = _positive([tau1], "tau1")
    growth = op - one[:, None]
    total = (
        growth.sum(axis=0)
        if num_layers in (None, op.shape[0])
        else (growth.mean(axis=0) * num_layers)
    )
    return tau1 + total


def whole_model_verify_time(
    profile: Any,
    kernel: str,
    tau1: float,
    *,
    source: str = "predicted",
    num_layers: int | None = None,
) -> np.ndarray:
    """tau_hat_p(n) by Eq. (22) (:func:`verify_time_from_op_times`) from a
    :class:`~specmoe.formats.profile.BandwidthProfile`: ``source`` "predicted"
    uses the fits at the union bytes of recorded windows (the prediction), "measured" the
    measured median operation times (the measured-time version). Returns tau_hat_p(n) [n_max] at
    the profile's pass sizes; ``tau1`` is tau_meas(1) in seconds. A one-token pass runs the
    per-slot kernel with deduplication off and on, so tau_hat_p(1) = tau_meas(1) for both."""
    if kernel not in ("per_slot", "dedup"):
        raise InputError(f"kernel: choose per_slot or dedup, got {kernel!r}")
    if source not in ("predicted", "measured"):
        raise InputError(f"source: choose predicted or measured, got {source!r}")
    if 1 not in profile.n:
        raise InputError("profile: has no one-token pass (n = 1) for t_l(1)")
    i1 = profile.n.index(1)
    op = np.array(profile.op_time[kernel][source], dtype=np.float64)
    one = np.asarray(profile.op_time["per_slot"][source], dtype=np.float64)[:, i1]
    op[:, i1] = one  # a one-token pass runs the per-slot kernel with dedup off and on
    return verify_time_from_op_times(op, one, tau1, num_layers=num_layers)


def profile_bandwidths(profile: Any, n_max: int) -> dict[str, Any]:
    """beta_slot(n), beta_dedup(n) for n = 1..n_max in bytes/s, the dense bandwidth beta_D (the
    measured read ceiling) and eps per kernel, from a bandwidth profile."""
    missing = [n for n in range(1, n_max + 1) if n not in profile.n]
    if missing:
        raise InputError(
            f"the bandwidth profile covers pass sizes {min(profile.n)}..{max(profile.n)}, "
            f"not {missing[0]}",
            argument="n_max",
        )
    idx = [profile.n.index(n) for n in range(1, n_max + 1)]
    return {
        "beta_slot": np.asarray(profile.beta_slot, dtype=np.float64)[idx] * GB,
        "beta_dedup": np.asarray(profile.beta_dedup, dtype=np.float64)[idx] * GB,
        "beta_dense": float(profile.ceiling_gbps) * GB,
        "epsilon": dict(profile.epsilon),
    }


@dataclass(frozen=True)
class VerifyModel:
    """The verify times by Eq. (5) for both kernels at n = 1..n_max. Seconds, all [n_max].

    ``expert[p]`` is M^e_p(n) = E_p(n)/beta_p(n), ``memory[p]`` M_p(n) = D(n)/beta_D + M^e_p(n),
    ``tau[p]`` the verify time; ``p`` also takes ``best`` (the faster kernel at each n). At n = 1
    every policy runs the per-slot kernel."""

    n: np.ndarray
    dense_time: np.ndarray
    expert: dict[str, np.ndarray]
    memory: dict[str, np.ndarray]
    tau: dict[str, np.ndarray]
    saving: np.ndarray  # S(n) = tau_slot(n) - tau_dedup(n)
    u_bar: np.ndarray
    r: np.ndarray  # beta_dedup(n)/beta_slot(n)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def crossover(self) -> int | None:
        return crossover(self.saving, self.n)


def verify_model(
    pb: PassBytes,
    *,
    beta_slot: Any,
    beta_dedup: Any,
    beta_dense: float,
    t0: float = 0.0,
    phi_slot: Any = 0.0,
    phi_dedup: Any = 0.0,
) -> VerifyModel:
    """tau_p(n) by Eq. (5) (:func:`verify_time`) for both kernels and the ``best`` policy from
    the pass bytes and the bandwidths (bytes/s, [n_max] each), and the saving
    S(n) = tau_slot(n) - tau_dedup(n). With f_l = 1 and equal fixed work S(n) is Eq. (6),
    E_slot(n)/beta_slot(n) (1 - u_bar(n)/r(n)); computed here as the difference of the two
    verify times, it holds for any byte factor. With bandwidths measured on whole operation
    times (as in a profile), the fixed work is inside beta and phi = 0."""
    nn = pb.n.size
    bs, bd = _positive(beta_slot, "beta_slot"), _positive(beta_dedup, "beta_dedup")
    if bs.shape != (nn,) or bd.shape != (nn,):
        raise InputError(f"beta_slot, beta_dedup: need {nn} pass sizes, got {bs.shape}, {bd.shape}")
    phs = np.broadcast_to(_nonneg(phi_slot, "phi_slot"), (nn,)).copy()
    phd = np.broadcast_to(_nonneg(phi_dedup, "phi_dedup"), (nn,)).copy()
    beta_dense = _positive(beta_dense, "beta_dense")
    dense = pb.dense / beta_dense
    # a one-token pass runs the per-slot kernel: the dedup policy reads the per-slot bytes at
    # the per-slot bandwidth with the per-slot fixed work there
    dedup_bytes, bd_run = pb.dedup.copy(), bd.copy()
    dedup_bytes[0], bd_run[0], phd[0] = pb.slot[0], bs[0], phs[0]
    exp_slot = pb.slot / bs
    exp_dedup = dedup_bytes / bd_run
    t0 = float(_nonneg(t0, "t0"))
    tau_slot, tau_dedup = (
        verify_time(
            dense_bytes=pb.dense,
            dense_bandwidth=beta_dense,
            expert_bytes=e,
            expert_bandwidth=b,
            t0=t0,
            fixed_work=phi,
        )
        for e, b, phi in ((pb.slot, bs, phs), (dedup_bytes, bd_run, phd))
    )
    use_dedup = tau_dedup < tau_slot
    expert = {
        "per_slot": exp_slot,
        "dedup": exp_dedup,
        "best": np.where(use_dedup, exp_dedup, exp_slot),
    }
    memory = {p: dense + e for p, e in expert.items()}
    tau = {
        "per_slot": tau_slot,
        "dedup": tau_dedup,
        "best": np.where(use_dedup, tau_dedup, tau_slot),
    }
    return VerifyModel(
        n=pb.n,
        dense_time=dense,
        expert=expert,
        memory=memory,
        tau=tau,
        saving=tau_slot - tau_dedup,
        u_bar=pb.u_bar,
        r=bd / bs,
        extra={"uses_dedup": use_dedup},
    )
