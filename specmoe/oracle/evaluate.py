"""Online policies against the Oracle on held-out generations.

Legend for shapes: ``G`` generations, ``n`` positions, ``K`` L_max.

Protocol. Prompts are split at random (``seed``) into training and held-out sets; every run's
rounds of a held-out prompt are held out, so no budget's rounds of a test text reach training.
From the training rounds: the cost model the policies use (per-budget fits), the typical
union of each budget's pass (the median modelled Ū), the prior acceptance rate, the value of a
token λ (the training Oracle's median marginal value of a token, λ_i = (J(i+1) - J(i+K+1))/K
at the recorded round starts, which the Delta-space boundary approximates) and the best fixed
K. On the
held-out reference sequences every policy is simulated round by round on the counterfactual
model of :mod:`specmoe.oracle.counterfactual`: a recorded match or mismatch is replayed, an
unrecorded draft is accepted at random with the generation's rate (``repeats`` seeds, averaged),
and a round costs C(k, i) of the cost model fitted on all rounds, the same cost under which
the Oracle's S_max on the held-out set is computed. speedup = plain-decoding time / policy
time; share_of_oracle = speedup / S_max. For scale, ``oracle_rate_only`` is the Oracle that
knows each held-out generation's acceptance rate but not which drafts will match (the
counterfactual with ``acceptance="geometric"``): ``s_max`` is its value under independent
acceptance at that rate, ``speedup_on_recorded`` its budgets replayed on the recorded
outcomes (where acceptance comes in runs). The gap to S_max is the value of knowing, before
drafting, which drafts the target will accept.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from specmoe.errors import InputError
from specmoe.formats.roundlog import RoundLog
from specmoe.oracle.analysis import make_cost_model, oracle_costs
from specmoe.oracle.costmodel import CostModel
from specmoe.oracle.counterfactual import Counterfactual, build_counterfactual
from specmoe.oracle.delta import delta_space
from specmoe.oracle.policies import (
    ConfidenceCalibration,
    FixedK,
    MarginalRule,
    RoundState,
    StaircasePolicy,
)
from specmoe.oracle.ssp import OracleSummary, summarise, survival

__all__ = [
    "PolicyInputs",
    "PolicyScore",
    "evaluate_policies",
    "learn_policy_inputs",
    "simulate",
    "split_prompts",
]


@dataclass(frozen=True)
class PolicyScore:
    name: str
    speedup: float
    share_of_oracle: float
    time_ms: float
    mean_k: float
    mean_accepted: float
    rounds: float


def simulate(
    policy,
    cf: Counterfactual,
    cost: np.ndarray,
    *,
    rng: np.random.Generator,
    fill_confidence: float,
    draft_ms: np.ndarray | None = None,
) -> tuple[float, float, float, float]:
    """Run ``policy`` over every generation of ``cf`` at cost [G, n, K+1].

    -> (total time ms, rounds, mean k, mean accepted). A budget above the drafts the drafter
    can make there drafts those (k = min(k, A_i)). A drafted position whose outcome was
    recorded replays it; otherwise it is accepted with probability q_j (drawn from ``rng``).
    Unknown confidences are ``fill_confidence``. A policy that reads the drafter's confidence
    must draft a token to see it: with ``draft_ms`` [K+1] (the draft time of k tokens) a round
    that stops at k < A_i also pays the draft time of the (k+1)-th token it looked at and left
    out, draft_ms[k+1] - draft_ms[k].
    """
    k_max = cost.shape[2] - 1
    total = rounds = sum_k = sum_a = 0.0
    conf_all = np.where(np.isnan(cf.confidence), fill_confidence, cf.confidence)
    peek = (
        np.diff(np.asarray(draft_ms, float))
        if draft_ms is not None and getattr(policy, "use_confidence", False)
        else None
    )
    for g in range(len(cf.length)):
        n_g = int(cf.length[g])
        w = n_g + k_max + 1
        q, known, conf = cf.q[g, :w], cf.known[g, :w], conf_all[g, :w]
        draws = rng.random(w)
        hit = np.where(known, q > 0.5, draws < q)
        if hasattr(policy, "reset"):
            policy.reset()
        hist: list[tuple[int, int]] = []
        i = 0
        while i < n_g:
            state = RoundState(i, int(cf.context[g, i]), hist, conf[i + 1 : i + k_max + 1])
            k = min(max(int(policy.choose(state)), 0), k_max, int(cf.avail[g, i]))
            run = hit[i + 1 : i + k + 1]
            acc = k if run.all() else int(np.argmin(run))
            total += cost[g, i, k]
            if peek is not None and k < min(k_max, int(cf.avail[g, i])):
                total += peek[k]
            rounds += 1
            sum_k += k
            sum_a += acc
            hist.append((k, acc))
            i += acc + 1
    return total, rounds, sum_k / max(rounds, 1), sum_a / max(rounds, 1)


class _TablePolicy:
    """Budgets read from a table [G, n] (an Oracle's policy), one generation after another."""

    def __init__(self, table: np.ndarray, name: str):
        self.table, self.name, self.g = table, name, -1

    def reset(self) -> None:  # called at each generation; every simulation runs them all
        self.g = (self.g + 1) % len(self.table)

    def choose(self, state: RoundState) -> int:
        return int(self.table[self.g, state.position])


def split_prompts(log: RoundLog, *, test_fraction: float, seed: int) -> np.ndarray:
    """bool [R]: the rounds of held-out prompts."""
    if not 0 < test_fraction < 1:
        raise InputError(f"{test_fraction} (must be in (0, 1))", argument="test_fraction")
    codes, labels = log.codes("prompt_id")
    if len(labels) < 2:
        raise InputError(f"{log.name}: one prompt only; a held-out split needs two or more")
    rng = np.random.default_rng(seed)
    n_test = min(max(1, round(test_fraction * len(labels))), len(labels) - 1)
    test = np.zeros(len(labels), bool)
    test[rng.permutation(len(labels))[:n_test]] = True
    return test[codes]


def _step_time_fn(model, cf: Counterfactual):
    live = np.arange(cf.union.shape[1])[None, :] < cf.length[:, None]
    ok = live[:, :, None] & cf.feasible()  # passes of k drafts
    union = np.array(
        [
            np.median(cf.union[:, :, k][ok[:, :, k]])
            if ok[:, :, k].any()
            else np.median(cf.union[:, :, k][live])
            for k in range(cf.k_max + 1)
        ]
    )
    # [K+1] typical Ū of a pass of k drafts
    base = model.truncate(cf.k_max).evaluate(union, np.asarray(0.0))
    slope = np.asarray(model.c[: cf.k_max + 1])

    def step_times(context_len: float) -> np.ndarray:
        """V(k) = C(k) at the typical union of each budget and this context, k = 0..K."""
        return base + slope * context_len

    return step_times


@dataclass(frozen=True, eq=False)
class PolicyInputs:
    """What the online policies learn from round logs (see :func:`learn_policy_inputs`)."""

    step_times: Callable[[float], np.ndarray]  # context length -> [V(0), ..., V(K)] (ms)
    value_per_token: float  # λ, ms: the Oracle's median marginal value of a token
    boundary_slope: float  # the Delta-space boundary slope, ms per token
    prior: float  # the pooled acceptance rate
    cost_model: CostModel
    counterfactual: Counterfactual
    oracle: OracleSummary
    calibration: ConfidenceCalibration | None = None  # confidence -> P(accepted), if recorded
    warnings: tuple[str, ...] = ()  # unphysical constants of the cost fits (fit_warnings)

    def staircase(self, **options) -> StaircasePolicy:
        return StaircasePolicy(self.step_times, prior=self.prior, **options)

    def marginal(self, **options) -> MarginalRule:
        return MarginalRule(self.step_times, self.value_per_token, prior=self.prior, **options)


def _calibration(cf: Counterfactual) -> ConfidenceCalibration | None:
    """Isotonic P(accepted | confidence) from the recorded drafts that carry a confidence."""
    ok = cf.known & np.isfinite(cf.confidence)
    if ok.sum() < 2 or len(np.unique(cf.q[ok])) < 2:
        return None
    return ConfidenceCalibration.fit(cf.confidence[ok], cf.q[ok])


def learn_policy_inputs(log: RoundLog, *, l_max: int = 8) -> PolicyInputs:
    """Fit the per-budget costs and the draft time, build the counterfactual, solve the Oracle
    and read off λ and the prior: everything a policy needs, from ``log`` alone."""
    from specmoe.oracle.regression import fit_draft_time, fit_verify_by_k, fit_warnings

    cf = build_counterfactual(log)
    cf = cf.truncate(min(l_max, cf.k_max))
    fits = fit_verify_by_k(log)
    model = make_cost_model(log, "model", cf.k_max, fits=fits, draft=fit_draft_time(log))
    cost = oracle_costs(cf, model)
    summary, sol, _ = summarise(cost, cf.q, cf.length)
    dl = delta_space(
        cost,
        survival(cf.q, cf.k_max, cost.shape[1]),
        sol.value,
        sol.policy,
        cf.round_gen,
        cf.round_start,
    )
    lam = dl.marginal_value.get("median", float("nan"))
    if not np.isfinite(lam):
        raise InputError(f"{log.name}: no round recorded at the largest budget")
    return PolicyInputs(
        step_times=_step_time_fn(model, cf),
        value_per_token=lam,
        boundary_slope=dl.slope,
        prior=float(np.average(cf.rate, weights=cf.length)),
        cost_model=model,
        counterfactual=cf,
        oracle=summary,
        calibration=_calibration(cf),
        warnings=tuple(fit_warnings(fits[k] for k in sorted(fits))),
    )


def _plain(cost: np.ndarray, length: np.ndarray) -> float:
    live = np.arange(cost.shape[1])[None, :] < length[:, None]
    return float(np.where(live, cost[:, :, 0], 0.0).sum())


def evaluate_policies(
    log: RoundLog,
    *,
    l_max: int = 8,
    test_fraction: float = 0.5,
    repeats: int = 3,
    seed: int = 0,
    decay: float = 0.9,
    quiet: bool = True,
) -> dict:
    """Score fixed K (1..L_max and the training-best), the staircase and the marginal rule."""

    def say(msg):
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    test_rows = split_prompts(log, test_fraction=test_fraction, seed=seed)
    train_log, test_log = log.select(~test_rows), log.select(test_rows)
    say("learning from the training prompts (costs, Oracle, value of a token)")
    learned = learn_policy_inputs(train_log, l_max=l_max)
    say("Oracle on the held-out prompts")
    cf_test = build_counterfactual(test_log)
    top = min(learned.counterfactual.k_max, cf_test.k_max)
    cf_test = cf_test.truncate(top)
    cf_train = learned.counterfactual.truncate(top)
    from specmoe.oracle.regression import fit_verify_by_k, fit_warnings

    fits = fit_verify_by_k(log)  # the held-out costs: the fits of the whole log, as the Oracle's
    test_model = make_cost_model(log, "model", top, fits=fits)
    warnings = fit_warnings(fits[k] for k in sorted(fits))
    warnings += [f"training prompts: {w}" for w in learned.warnings]
    cost_test = oracle_costs(cf_test, test_model)
    oracle_test, _, _ = summarise(cost_test, cf_test.q, cf_test.length)
    # the Oracle that knows each generation's acceptance rate, not which drafts will match
    cf_rate = build_counterfactual(test_log, acceptance="geometric").truncate(top)
    oracle_rate, sol_rate, _ = summarise(
        oracle_costs(cf_rate, test_model), cf_rate.q, cf_rate.length
    )
    plain_test = _plain(cost_test, cf_test.length)
    fill = learned.prior

    def score(policy, cf, cost, plain, s_max, draft):
        res = [
            simulate(
                policy,
                cf,
                cost,
                rng=np.random.default_rng([seed, r]),
                fill_confidence=fill,
                draft_ms=draft,
            )
            for r in range(repeats)
        ]
        t, rounds, mk, ma = (float(np.mean(v)) for v in zip(*res))
        sp = plain / t
        return PolicyScore(policy.name, sp, sp / s_max, t, mk, ma, rounds)

    say("choosing the best fixed K on the training prompts")
    cost_train = oracle_costs(cf_train, learned.cost_model)
    plain_train = _plain(cost_train, cf_train.length)
    train_fixed = {
        k: score(FixedK(k), cf_train, cost_train, plain_train, learned.oracle.s_max, None).speedup
        for k in range(top + 1)
    }
    best_k = max(train_fixed, key=lambda k: (train_fixed[k], -k))
    best = FixedK(best_k)
    has_conf = bool(np.isfinite(cf_test.confidence).any())
    policies = [
        *(FixedK(k) for k in range(1, top + 1)),
        best,
        learned.staircase(decay=decay),
        learned.staircase(decay=decay, markov=True),
        learned.marginal(decay=decay, name="marginal", use_confidence=has_conf),
        learned.marginal(decay=decay, name="marginal-ewma", use_confidence=False),
    ]
    if has_conf and learned.calibration is not None:
        policies.append(
            learned.marginal(
                decay=decay, name="marginal-calibrated", calibration=learned.calibration
            )
        )
    lam, prior = learned.value_per_token, learned.prior
    # the rate-only Oracle's budgets, replayed on the recorded outcomes
    rate_replay = score(
        _TablePolicy(sol_rate.policy, "oracle-rate-only"),
        cf_test,
        cost_test,
        plain_test,
        oracle_test.s_max,
        None,
    )
    out = []
    for p in policies:
        say(f"simulating {p.name}")
        s = score(
            p,
            cf_test,
            cost_test,
            plain_test,
            oracle_test.s_max,
            np.asarray(test_model.draft[: top + 1]),
        )
        if p is best:
            s = replace(s, name=f"fixed-best (K={best_k})")
        out.append(s)
    return {
        "oracle": {
            "s_max": oracle_test.s_max,
            "mean_k": oracle_test.mean_k,
            "mean_accepted": oracle_test.mean_accepted,
            "time_ms": oracle_test.time_ms,
        },
        "oracle_rate_only": {
            "s_max": oracle_rate.s_max,
            "mean_k": oracle_rate.mean_k,
            "mean_accepted": oracle_rate.mean_accepted,
            "speedup_on_recorded": rate_replay.speedup,
            "share_of_oracle": rate_replay.share_of_oracle,
        },
        "plain_ms": plain_test,
        "l_max": top,
        "policies": {s.name: s for s in out},
        "training": {
            "prompts_held_out": len(np.unique(test_log["prompt_id"])),
            "prompts_training": len(np.unique(train_log["prompt_id"])),
            "generations_held_out": len(cf_test.length),
            "value_per_token_ms": lam,
            "boundary_slope_ms": learned.boundary_slope,
            "prior_acceptance": prior,
            "best_fixed_k": best_k,
            "fixed_k_speedup": train_fixed,
        },
        "repeats": repeats,
        "warnings": warnings,
        "seed": seed,
    }
