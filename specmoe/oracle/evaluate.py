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
time; share_of_oracle = speedup / S_max.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from specmoe.errors import InputError
from specmoe.oracle.analysis import make_cost_model, oracle_costs
from specmoe.oracle.counterfactual import Counterfactual, build_counterfactual
from specmoe.oracle.delta import delta_space
from specmoe.oracle.policies import FixedK, MarginalRule, RoundState, StaircasePolicy
from specmoe.oracle.ssp import summarise, survival
from specmoe.roundlog import RoundLog

__all__ = ["PolicyScore", "evaluate_policies", "simulate", "split_prompts"]


@dataclass(frozen=True)
class PolicyScore:
    name: str
    speedup: float
    share_of_oracle: float
    time_ms: float
    mean_k: float
    mean_accepted: float
    rounds: float


def simulate(policy, cf: Counterfactual, cost: np.ndarray, *, rng: np.random.Generator,
             fill_confidence: float) -> tuple[float, float, float, float]:
    """Run ``policy`` over every generation of ``cf`` at cost [G, n, K+1].

    -> (total time ms, rounds, mean k, mean accepted). A drafted position whose outcome was
    recorded replays it; otherwise it is accepted with probability q_j (drawn from ``rng``).
    Unknown confidences are ``fill_confidence``.
    """
    k_max = cost.shape[2] - 1
    total = rounds = sum_k = sum_a = 0.0
    conf_all = np.where(np.isnan(cf.confidence), fill_confidence, cf.confidence)
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
            state = RoundState(i, int(cf.context[g, i]), hist, conf[i + 1:i + k_max + 1])
            k = min(max(int(policy.choose(state)), 0), k_max)
            run = hit[i + 1:i + k + 1]
            acc = k if run.all() else int(np.argmin(run))
            total += cost[g, i, k]
            rounds += 1
            sum_k += k
            sum_a += acc
            hist.append((k, acc))
            i += acc + 1
    return total, rounds, sum_k / max(rounds, 1), sum_a / max(rounds, 1)


def split_prompts(log: RoundLog, *, test_fraction: float, seed: int) -> np.ndarray:
    """bool [R]: the rounds of held-out prompts."""
    if not 0 < test_fraction < 1:
        raise InputError(f"--test-fraction: {test_fraction} (must be in (0, 1))")
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
    union = np.median(cf.union[live], axis=0)                 # [K+1] typical Ū per budget
    base = model.truncate(cf.k_max).evaluate(union, np.asarray(0.0))
    slope = np.asarray(model.c[:cf.k_max + 1])

    def step_times(context_len: float) -> np.ndarray:
        return base + slope * context_len

    return step_times


def evaluate_policies(log: RoundLog, *, l_max: int = 8, test_fraction: float = 0.5,
                      repeats: int = 3, seed: int = 0, decay: float = 0.9,
                      quiet: bool = True) -> dict:
    """Score fixed K (1..L_max and the training-best), the staircase and the marginal rule."""
    from specmoe.oracle.regression import fit_draft_time, fit_verify_by_k

    def say(msg):
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    test_rows = split_prompts(log, test_fraction=test_fraction, seed=seed)
    train_log, test_log = log.select(~test_rows), log.select(test_rows)
    say("building counterfactual reference sequences")
    cf_train = build_counterfactual(train_log)
    cf_test = build_counterfactual(test_log)
    top = min(l_max, cf_train.k_max, cf_test.k_max)
    cf_train, cf_test = cf_train.truncate(top), cf_test.truncate(top)
    say("fitting costs (all rounds: evaluation; training rounds: policies)")
    truth = make_cost_model(log, "model", top)
    fits_train = fit_verify_by_k(train_log)
    learned = make_cost_model(train_log, "model", top, fits=fits_train,
                              draft=fit_draft_time(train_log))
    cost_test = oracle_costs(cf_test, truth)
    cost_train_learned = oracle_costs(cf_train, learned)
    say("Oracle on training and held-out generations")
    oracle_test, _, _ = summarise(cost_test, cf_test.q, cf_test.length)
    s_tr, sol_tr, _ = summarise(cost_train_learned, cf_train.q, cf_train.length)
    dl = delta_space(cost_train_learned, survival(cf_train.q, top, cost_train_learned.shape[1]),
                     sol_tr.value, sol_tr.policy, cf_train.round_gen, cf_train.round_start)
    lam = dl.marginal_value.get("median", float("nan"))
    if not np.isfinite(lam):
        raise InputError(f"{log.name}: no recorded round in the training generations")
    prior = float(np.average(cf_train.rate, weights=cf_train.length))
    fill = prior
    step_times = _step_time_fn(learned, cf_train)
    plain_test = float(np.where(np.arange(cost_test.shape[1])[None, :] < cf_test.length[:, None],
                                cost_test[:, :, 0], 0).sum())

    def score(policy, cf, cost, plain, s_max):
        res = [simulate(policy, cf, cost, rng=np.random.default_rng([seed, r]),
                        fill_confidence=fill) for r in range(repeats)]
        t, rounds, mk, ma = (float(np.mean(v)) for v in zip(*res))
        sp = plain / t
        return PolicyScore(policy.name, sp, sp / s_max, t, mk, ma, rounds)

    say("choosing the best fixed K on training generations")
    cost_train_truth = oracle_costs(cf_train, learned)
    plain_train = float(np.where(
        np.arange(cost_train_truth.shape[1])[None, :] < cf_train.length[:, None],
        cost_train_truth[:, :, 0], 0).sum())
    train_fixed = {k: score(FixedK(k), cf_train, cost_train_truth, plain_train,
                            s_tr.s_max).speedup for k in range(top + 1)}
    best_k = max(train_fixed, key=lambda k: (train_fixed[k], -k))
    policies = [FixedK(k) for k in range(1, top + 1)]
    best = FixedK(best_k)
    policies.append(best)
    policies.append(StaircasePolicy(step_times, decay=decay, prior=prior))
    policies.append(MarginalRule(step_times, lam, decay=decay, prior=prior,
                                 use_confidence=bool(np.isfinite(cf_test.confidence).any()),
                                 name="marginal"))
    policies.append(MarginalRule(step_times, lam, decay=decay, prior=prior,
                                 use_confidence=False, name="marginal-ewma"))
    out = []
    for p in policies:
        say(f"simulating {p.name}")
        s = score(p, cf_test, cost_test, plain_test, oracle_test.s_max)
        if p is best:
            s = PolicyScore(f"fixed-best (K={best_k})", *list(s.__dict__.values())[1:])
        out.append(s)
    return {
        "oracle": {"s_max": oracle_test.s_max, "mean_k": oracle_test.mean_k,
                   "mean_accepted": oracle_test.mean_accepted, "time_ms": oracle_test.time_ms},
        "plain_ms": plain_test, "l_max": top,
        "policies": {s.name: s for s in out},
        "training": {"prompts_held_out": len(np.unique(test_log["prompt_id"])),
                     "prompts_training": len(np.unique(train_log["prompt_id"])),
                     "generations_held_out": len(cf_test.length),
                     "value_per_token_ms": lam, "boundary_slope_ms": dl.slope,
                     "prior_acceptance": prior,
                     "best_fixed_k": best_k, "fixed_k_speedup": train_fixed},
        "repeats": repeats, "seed": seed,
    }
