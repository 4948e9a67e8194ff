"""Online draft-budget policies: one method, ``choose(state) -> k``, callable from an engine.

Legend: ``K`` the largest budget (L_max).

A policy sees only what an engine knows before it verifies: the position and context length,
the (k, accepted) outcomes of this generation's earlier rounds, and optionally the drafter's
confidence in each of the next drafts. It never sees the target's tokens. Create one policy
object per generation (request), or call :meth:`reset` between generations; a shorter history
than last time also starts afresh. ``docs/policies.md`` shows the engine loop.

* :class:`FixedK` always drafts k.
* :class:`StaircasePolicy` estimates the acceptance rate online and drafts the best draft
  length of the theory for it, k*(â) = the smallest maximiser of G_â(k)/V(k) (paper 002
  Section 1, ``specmoe.cost.theory.best_draft_length``), with V(k) the step time at the current
  context. â is the geometric maximum-likelihood rate with exponential forgetting: every round
  adds ``accepted`` successes and one failure unless all k drafts were accepted, counts decay by
  ``decay`` per round, and a prior of ``prior_weight`` trials at ``prior`` is added. After
  ``probe_every`` rounds at k = 0 in a row it drafts one token, so that â keeps learning.
  With ``markov=True`` (``staircase-markov``) it keeps two such estimates, one for rounds that
  follow a round whose drafts were all accepted and one for rounds that follow a rejection
  (rounds at k = 0 carry no outcome and leave the state as it was), and uses the one of the
  current state: acceptance comes in runs (repeated text, easy stretches), so the round after
  a full acceptance is likelier to accept again.
* :class:`MarginalRule` drafts while the value of the next draft exceeds its cost: draft d is
  worth P(drafts 1..d all accepted)·λ, with λ the value of a token in ms (the slope of the
  Delta-space boundary, Figure 3 of paper 000) and the probability the product of the drafter's
  confidences (or â^d without them); it costs V(d) - V(d-1). The rule picks
  k = argmax_k [λ·sum_{d<=k} p_d - V(k)] (the smallest on ties): the last k up to which the
  marginal condition p_d·λ > V(d) - V(d-1) holds in sum. When V has non-decreasing increments
  this is exactly "draft while p_d·λ > V(d) - V(d-1)" (p_d never rises); when V steps down (a
  cheaper kernel or graph from some pass size on) it looks through the step instead of
  stopping in front of it. It is the local form of the Oracle's choice: the Oracle's k*
  satisfies ΔE[Cost] >= λ·ΔE[a] against every other k. With ``calibration`` (a monotone map
  from the drafter's confidence to the chance its draft is accepted, fitted on earlier rounds:
  :class:`ConfidenceCalibration`) the probabilities are the calibrated confidences.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

__all__ = [
    "ConfidenceCalibration",
    "FixedK",
    "MarginalRule",
    "Policy",
    "RoundState",
    "StaircasePolicy",
]


@dataclass(frozen=True)
class RoundState:
    """What an engine knows before a round: ``history`` holds (k, accepted) of earlier rounds
    of this generation; ``confidence`` the drafter's probabilities of the next drafts (or
    None)."""

    position: int
    context_len: int
    history: Sequence[tuple[int, int]] = ()
    confidence: Sequence[float] | None = None


class Policy(Protocol):
    name: str

    def choose(self, state: RoundState) -> int: ...


@dataclass
class FixedK:
    k: int

    @property
    def name(self) -> str:
        return f"fixed-{self.k}"

    def choose(self, state: RoundState) -> int:
        return self.k

    def reset(self) -> None:
        pass


@dataclass
class _Ewma:
    """Geometric acceptance rate with exponential forgetting, folded in from a history."""

    decay: float = 0.9
    prior: float = 0.5
    prior_weight: float = 2.0
    succ: float = 0.0
    trials: float = 0.0
    seen: int = 0

    def update(self, history: Sequence[tuple[int, int]]) -> float:
        if len(history) < self.seen:
            self.succ = self.trials = 0.0
            self.seen = 0
        for k, acc in history[self.seen :]:
            self.succ = self.decay * self.succ + acc
            self.trials = self.decay * self.trials + acc + (1 if acc < k else 0)
        self.seen = len(history)
        return (self.succ + self.prior_weight * self.prior) / (self.trials + self.prior_weight)


def _best_draft_length(v: Sequence[float], a: float) -> int:
    from specmoe.cost.theory import best_draft_length

    return int(best_draft_length(v, min(max(a, 0.0), 1.0 - 1e-9)))


@dataclass
class StaircasePolicy:
    """k*(â) of the theory at step times ``step_times(context_len) -> [V(0), ..., V(K)]``."""

    step_times: Callable[[float], np.ndarray]
    decay: float = 0.9
    prior: float = 0.5
    prior_weight: float = 2.0
    probe_every: int = 8
    markov: bool = False
    name: str = "staircase"
    _rate: _Ewma = field(init=False, repr=False)
    _after: dict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.markov and self.name == "staircase":
            self.name = "staircase-markov"
        self.reset()

    def reset(self) -> None:
        self._rate = _Ewma(self.decay, self.prior, self.prior_weight)
        # state "hot" (the last drafted round accepted everything) or "cold"
        self._after = {
            "hot": _Ewma(self.decay, self.prior, self.prior_weight),
            "cold": _Ewma(self.decay, self.prior, self.prior_weight),
            "seen": 0,
            "state": "hot",
            "hist": {"hot": [], "cold": []},
        }

    def rate(self, state: RoundState) -> float:
        if not self.markov:
            return self._rate.update(state.history)
        a = self._after
        if len(state.history) < a["seen"]:
            self.reset()
            a = self._after
        for k, acc in state.history[a["seen"] :]:
            if k > 0:
                a["hist"][a["state"]].append((k, acc))
                a["state"] = "hot" if acc == k else "cold"
        a["seen"] = len(state.history)
        cur = a["state"]
        return a[cur].update(a["hist"][cur])

    def choose(self, state: RoundState) -> int:
        a = self.rate(state)
        k = _best_draft_length(list(map(float, self.step_times(state.context_len))), a)
        tail = state.history[-self.probe_every :]
        if k == 0 and len(tail) == self.probe_every and all(kk == 0 for kk, _ in tail):
            return 1
        return k


@dataclass(frozen=True)
class ConfidenceCalibration:
    """P(draft accepted | the drafter's confidence c): isotonic (non-decreasing) regression of
    the recorded outcomes on c, a step function through ``knots`` -> ``values`` (linear between
    knots, constant outside)."""

    knots: tuple[float, ...]
    values: tuple[float, ...]

    @classmethod
    def fit(cls, confidence: np.ndarray, accepted: np.ndarray) -> ConfidenceCalibration:
        from sklearn.isotonic import IsotonicRegression

        c = np.asarray(confidence, float)
        y = np.asarray(accepted, float)
        ok = np.isfinite(c) & np.isfinite(y)
        if ok.sum() < 2:
            raise ValueError("confidence calibration needs at least two outcomes")
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(c[ok], y[ok])
        return cls(tuple(map(float, iso.X_thresholds_)), tuple(map(float, iso.y_thresholds_)))

    def __call__(self, confidence) -> np.ndarray:
        return np.interp(np.asarray(confidence, float), self.knots, self.values)


@dataclass
class MarginalRule:
    """k = argmax_k [λ·sum_{d<=k} P(drafts 1..d accepted) - V(k)] (λ = ``value_per_token``, ms)."""

    step_times: Callable[[float], np.ndarray]
    value_per_token: float
    decay: float = 0.9
    prior: float = 0.5
    prior_weight: float = 2.0
    use_confidence: bool = True
    name: str = "marginal"
    calibration: Callable[[np.ndarray], np.ndarray] | None = None
    _rate: _Ewma = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._rate = _Ewma(self.decay, self.prior, self.prior_weight)

    def choose(self, state: RoundState) -> int:
        v = np.asarray(self.step_times(state.context_len), dtype=float)
        k_max = len(v) - 1
        a = self._rate.update(state.history)
        conf = state.confidence if self.use_confidence else None
        if conf is not None and len(conf):
            c = np.asarray(conf, float)[:k_max]
            if self.calibration is not None:
                c = self.calibration(c)
            p = np.cumprod(np.clip(c, 0.0, 1.0))
            p = np.concatenate([p, np.zeros(k_max - len(p))])  # nothing drafted: no value
        else:
            p = a ** np.arange(1, k_max + 1)
        gain = self.value_per_token * np.concatenate([[0.0], np.cumsum(p)]) - v
        return int(np.argmax(gain))
