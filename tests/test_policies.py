"""Online policies: their rules against brute force, the simulator against the DP, the CLI."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specmoe.cli import main
from specmoe.errors import InputError
from specmoe.formats.roundlog import write_round_log
from specmoe.oracle.counterfactual import build_counterfactual
from specmoe.oracle.evaluate import evaluate_policies, simulate, split_prompts
from specmoe.oracle.policies import FixedK, MarginalRule, RoundState, StaircasePolicy
from specmoe.oracle.ssp import occupancy, solve, survival
from specmoe.oracle.synthetic import synthetic_round_log


def _ewma_brute(history, decay, prior, weight):
    n = len(history)
    w = decay ** (n - 1 - np.arange(n))
    succ = sum(wi * a for wi, (k, a) in zip(w, history))
    trials = sum(wi * (a + (a < k)) for wi, (k, a) in zip(w, history))
    return (succ + weight * prior) / (trials + weight)


def _smallest_argmax(values):
    best = max(values)
    return min(i for i, v in enumerate(values) if v >= best - 1e-12 * abs(best))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=12), st.integers(0, 2**31 - 1), st.floats(0.5, 1.0))
def test_staircase_picks_the_theory_best_for_the_online_rate(ks, seed, decay):
    rng = np.random.default_rng(seed)
    history = [(k, int(rng.integers(0, k + 1))) for k in ks]
    v = np.cumsum(rng.uniform(0.5, 3.0, 5)) + 5.0

    pol = StaircasePolicy(
        lambda _ctx: v, decay=decay, prior=0.4, prior_weight=2.0, probe_every=10**6
    )
    state = RoundState(0, 100, history)
    a = _ewma_brute(history, decay, 0.4, 2.0)
    assert pol.rate(state) == pytest.approx(a)
    pol.reset()
    g = [(1 - a ** (k + 1)) / (1 - a) for k in range(5)]
    assert pol.choose(state) == _smallest_argmax([gk / vk for gk, vk in zip(g, v)])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), max_size=14), st.floats(0.5, 1.0))
def test_markov_staircase_keeps_one_rate_per_state(rounds, decay):
    history = [(k, min(a, k)) for k, a in rounds]
    # by hand: each drafted round belongs to the state left by the drafted round before it
    groups, cur = {"hot": [], "cold": []}, "hot"
    for k, a in history:
        if k:
            groups[cur].append((k, a))
            cur = "hot" if a == k else "cold"
    want = _ewma_brute(groups[cur], decay, 0.4, 2.0)
    v = np.array([5.0, 6.5, 7.5, 8.2, 9.0])
    pol = StaircasePolicy(
        lambda _ctx: v, decay=decay, prior=0.4, prior_weight=2.0, probe_every=10**6, markov=True
    )
    assert pol.name == "staircase-markov"
    for i in range(len(history) + 1):  # called round by round, as an engine does
        got = pol.rate(RoundState(0, 100, history[:i]))
    assert got == pytest.approx(want)
    fresh = StaircasePolicy(
        lambda _ctx: v, decay=decay, prior=0.4, prior_weight=2.0, probe_every=10**6, markov=True
    )
    assert fresh.rate(RoundState(0, 100, history)) == pytest.approx(want)  # all at once
    g = [(1 - want ** (k + 1)) / (1 - want) for k in range(5)]
    assert fresh.choose(RoundState(0, 100, history)) == _smallest_argmax(
        [gk / vk for gk, vk in zip(g, v, strict=True)]
    )


def test_staircase_probes_after_a_run_of_zeros():
    pol = StaircasePolicy(lambda _ctx: np.array([1.0, 100.0, 200.0]), probe_every=3)
    assert pol.choose(RoundState(0, 10, [(0, 0)] * 2)) == 0
    assert pol.choose(RoundState(0, 10, [(0, 0)] * 3)) == 1


def test_ewma_resets_for_a_new_generation():
    pol = StaircasePolicy(
        lambda _ctx: np.array([1.0, 1.1, 1.2]), decay=1.0, prior=0.5, prior_weight=2.0
    )
    assert pol.rate(RoundState(0, 0, [(2, 2)] * 5)) == pytest.approx(11 / 12)
    assert pol.rate(RoundState(0, 0, [(2, 0)])) == pytest.approx(1 / 3)  # shorter: fresh


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 6), st.integers(0, 2**31 - 1), st.booleans())
def test_marginal_rule_is_the_stop_rule_on_convex_costs(k_max, seed, use_conf):
    rng = np.random.default_rng(seed)
    inc = np.sort(rng.uniform(0.0, 3.0, k_max))  # non-decreasing increments: convex V
    v = np.concatenate([[5.0], 5.0 + np.cumsum(inc)])
    conf = rng.uniform(0, 1, k_max)
    lam = float(rng.uniform(0.5, 6.0))
    rule = MarginalRule(lambda _ctx: v, lam, prior=0.6, use_confidence=use_conf)
    k = rule.choose(RoundState(0, 0, [], conf))
    p = np.cumprod(conf) if use_conf else 0.6 ** np.arange(1, k_max + 1)
    stop = 0  # draft while p_d·λ > V(d) - V(d-1)
    while stop < k_max and p[stop] * lam > inc[stop]:
        stop += 1
    assert k == stop
    assert k == _smallest_argmax([lam * p[:j].sum() - v[j] for j in range(k_max + 1)])


def test_marginal_rule_looks_through_a_cheaper_regime():
    v = np.array([6.0, 8.0, 10.0, 12.0, 9.0])  # V(4) < V(3): a cheaper kernel from m = 5
    rule = MarginalRule(lambda _ctx: v, 4.0, use_confidence=True)
    assert rule.choose(RoundState(0, 0, [], [0.9, 0.9, 0.9, 0.9])) == 4


# ---------------------------------------------------------------------------------------------
# the simulator against the DP


@pytest.fixture(scope="module")
def synth():
    return synthetic_round_log(budgets=(0, 1, 2, 3), n_prompts=10, tokens=60, seed=13)


@pytest.fixture(scope="module")
def cf(synth):
    return build_counterfactual(synth)


def _cost(cf, seed=0):
    rng = np.random.default_rng(seed)
    base = np.array([6.0, 7.5, 8.5, 9.5])
    return base + 0.1 * cf.union + rng.uniform(0, 0.5, cf.union.shape)


def test_fixed_k_simulation_matches_the_exact_expectation(cf):
    cost = _cost(cf)
    n = cost.shape[1]
    s = survival(cf.q, cf.k_max, n)
    for k in (1, 3):
        pol = np.full((len(cf.length), n), k, dtype=np.int8)
        pi = occupancy(pol, s, cf.length)
        exact = float((pi * cost[:, :, k]).sum())
        sims = [
            simulate(FixedK(k), cf, cost, rng=np.random.default_rng(r), fill_confidence=0.5)[0]
            for r in range(30)
        ]
        assert np.mean(sims) == pytest.approx(exact, rel=0.01)


class _Replay:
    """A policy that reads the Oracle's table: the simulator must reproduce J(0)."""

    name = "replay"

    def __init__(self, policy, cf):
        self.table, self.cf, self.g = policy, cf, -1

    def reset(self):
        self.g += 1

    def choose(self, state):
        return int(self.table[self.g, state.position])


def test_the_oracle_policy_simulates_to_its_value(cf):
    cost = _cost(cf, 1)
    sol = solve(cost, cf.q, cf.length)
    sims = [
        simulate(
            _Replay(sol.policy, cf), cf, cost, rng=np.random.default_rng(r), fill_confidence=0.5
        )[0]
        for r in range(40)
    ]
    assert np.mean(sims) == pytest.approx(sol.total.sum(), rel=0.01)


def test_split_is_by_prompt(synth):
    test = split_prompts(synth, test_fraction=0.3, seed=1)
    assert set(synth["prompt_id"][test]).isdisjoint(synth["prompt_id"][~test])
    assert len(set(synth["prompt_id"][test])) == 3


def test_evaluate_policies_is_bounded_by_the_oracle(synth):
    r = evaluate_policies(synth, l_max=3, repeats=2, seed=2)
    names = set(r["policies"])
    assert {"fixed-1", "fixed-2", "fixed-3", "staircase", "marginal", "marginal-ewma"} <= names
    assert any(n.startswith("fixed-best") for n in names)
    for p in r["policies"].values():
        assert 0 < p.speedup and p.share_of_oracle <= 1.02  # simulation noise only
        assert p.share_of_oracle == pytest.approx(p.speedup / r["oracle"]["s_max"])


# ---------------------------------------------------------------------------------------------
# the CLI


def test_cli_policy_json_and_errors(tmp_path, synth, capsys):
    runs = tmp_path / "runs"
    for k in synth.budgets:
        write_round_log(synth.select(synth["k"] == k), runs / f"k{k}.parquet")
    rc = main(
        [
            "policy",
            "--runs",
            str(runs),
            "--json",
            "--repeats",
            "1",
            "--l-max",
            "2",
            "--out",
            str(tmp_path / "pol"),
        ]
    )
    cap = capsys.readouterr()
    assert rc == 0
    d = json.loads(cap.out)
    assert json.loads((tmp_path / "pol" / "policies.json").read_text()) == d
    assert (tmp_path / "pol" / "policies.png").read_bytes()[:4] == b"\x89PNG"
    assert d["l_max"] == 2
    for p in d["policies"].values():
        assert {"speedup", "share_of_oracle"} <= set(p)
    rc = main(["policy", "--runs", str(runs), "--test-fraction", "1.5"])
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()  # progress line, then the error
    assert rc == 2 and cap.out == "" and [e for e in err if "error:" in e] == err[-1:]
    # split_prompts' test_fraction, shown as the flag that fed it
    assert err[-1] == "specmoe policy: error: --test-fraction: 1.5 (must be in (0, 1))"
    with pytest.raises(InputError) as ei:
        split_prompts(synth, test_fraction=1.5, seed=0)
    assert ei.value.argument == "test_fraction" and str(ei.value).startswith("test_fraction: ")
    (tmp_path / "one").mkdir()
    write_round_log(synth.select(synth["k"] == 3), tmp_path / "one" / "k3.parquet")
    rc = main(["policy", "--runs", str(tmp_path / "one"), "--json"])
    cap = capsys.readouterr()
    assert rc == 2 and cap.out == "" and "one budget only" in cap.err


def test_learned_inputs_are_the_cost_model_at_the_typical_union(synth):
    from specmoe.oracle.evaluate import learn_policy_inputs

    inp = learn_policy_inputs(synth, l_max=3)
    m, cf = inp.cost_model, inp.counterfactual
    live = np.arange(cf.union.shape[1])[None, :] < cf.length[:, None]
    union = np.median(cf.union[live], axis=0)
    for ctx in (0.0, 700.0):
        want = [m.beta0[k] + m.draft[k] + m.alpha[k] * union[k] + m.c[k] * ctx for k in range(4)]
        np.testing.assert_allclose(inp.step_times(ctx), want)
    assert inp.value_per_token > 0 and 0 < inp.prior < 1
    assert inp.marginal().value_per_token == inp.value_per_token
    assert inp.staircase().choose(RoundState(0, 500, [])) in range(4)


# ---------------------------------------------------------------------------------------------
# confidence: calibration and the cost of looking


def _pav(x, y):
    """Pool-adjacent-violators by hand: the least-squares non-decreasing fit at sorted x."""
    order = np.argsort(x, kind="stable")
    xs, ys = np.asarray(x, float)[order], np.asarray(y, float)[order]
    ux, inv = np.unique(xs, return_inverse=True)
    sums, counts = np.bincount(inv, ys), np.bincount(inv).astype(float)
    blocks = [[s, c, 1] for s, c in zip(sums, counts, strict=True)]  # sum, weight, members
    i = 0
    while i < len(blocks) - 1:
        if blocks[i][0] / blocks[i][1] > blocks[i + 1][0] / blocks[i + 1][1] + 1e-15:
            a, b = blocks[i], blocks.pop(i + 1)
            blocks[i] = [a[0] + b[0], a[1] + b[1], a[2] + b[2]]
            i = max(i - 1, 0)
        else:
            i += 1
    fit = np.concatenate([[s / c] * m for s, c, m in blocks])
    return ux, fit


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 40), st.integers(0, 2**31 - 1))
def test_confidence_calibration_is_the_isotonic_fit(n, seed):
    from specmoe.oracle.policies import ConfidenceCalibration

    rng = np.random.default_rng(seed)
    c = rng.choice(np.linspace(0, 1, 11), n)
    y = (rng.random(n) < c).astype(float)
    cal = ConfidenceCalibration.fit(c, y)
    ux, want = _pav(c, y)
    np.testing.assert_allclose(cal(ux), want, atol=1e-12)
    grid = np.linspace(-0.5, 1.5, 41)
    got = cal(grid)
    assert (np.diff(got) >= -1e-12).all() and (got >= 0).all() and (got <= 1).all()


class _Recorder:
    """Wraps a policy and records (generation, position, k) of every choice."""

    def __init__(self, inner):
        self.inner, self.g, self.calls = inner, -1, []
        self.name, self.use_confidence = inner.name, inner.use_confidence

    def reset(self):
        self.g += 1
        self.inner.reset()

    def choose(self, state):
        k = self.inner.choose(state)
        self.calls.append((self.g, state.position, k))
        return k


def test_a_confidence_policy_pays_for_the_draft_it_looked_at(cf):
    cost = _cost(cf, 2)
    v = lambda _ctx: np.array([6.0, 7.5, 8.5, 9.5])  # noqa: E731
    k_max = cf.k_max
    runs = {}
    for name, draft in (("free", None), ("paid", np.arange(k_max + 1) * 1.25)):
        rec = _Recorder(MarginalRule(v, 4.0, use_confidence=True))
        t = simulate(
            rec, cf, cost, rng=np.random.default_rng(5), fill_confidence=0.6, draft_ms=draft
        )[0]
        runs[name] = (t, rec.calls)
    assert runs["free"][1] == runs["paid"][1]  # the same rounds: cost does not steer
    stopped = sum(
        min(k, k_max, int(cf.avail[g, i])) < min(k_max, int(cf.avail[g, i]))
        for g, i, k in runs["paid"][1]
    )
    assert stopped > 0
    assert runs["paid"][0] - runs["free"][0] == pytest.approx(1.25 * stopped)
    # a policy that does not read confidences never pays for looking
    t0 = simulate(FixedK(1), cf, cost, rng=np.random.default_rng(5), fill_confidence=0.6)[0]
    t1 = simulate(
        FixedK(1),
        cf,
        cost,
        rng=np.random.default_rng(5),
        fill_confidence=0.6,
        draft_ms=np.arange(k_max + 1) * 1.25,
    )[0]
    assert t0 == t1


def test_policy_report_has_the_rate_only_oracle(synth):
    r = evaluate_policies(synth, l_max=3, repeats=1, seed=2)
    ro = r["oracle_rate_only"]
    assert 1 - 1e-9 <= ro["s_max"] <= r["oracle"]["s_max"] + 1e-9
    # its budgets on the recorded outcomes: no better than the Oracle that knows them
    assert ro["speedup_on_recorded"] <= r["oracle"]["s_max"] * 1.02
    assert ro["share_of_oracle"] == pytest.approx(ro["speedup_on_recorded"] / r["oracle"]["s_max"])
    assert "marginal-calibrated" in r["policies"]  # the synthetic log has confidences


def test_policy_reports_the_oracle_fit_warnings(tmp_path, synth, capsys):
    """A fit with beta0 < 0 (unphysical) is said by ``specmoe policy`` as by ``specmoe
    oracle``: one ``warning:`` line per constant on stderr and the ``warnings`` field."""
    neg = synthetic_round_log(
        budgets=(0, 2, 4),
        n_prompts=6,
        tokens=40,
        seed=3,
        beta0={0: 6.0, 2: -3.0, 4: 6.0},
        alpha={0: 0.05, 2: 0.6, 4: 0.05},
    )
    for name, log in (("neg", neg), ("clean", synth)):
        runs = tmp_path / name
        for k in log.budgets:
            write_round_log(log.select(log["k"] == k), runs / f"k{k}.parquet")
    rc = main(["policy", "--runs", str(tmp_path / "neg"), "--json", "--repeats", "1"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    d = json.loads(cap.out)
    assert d["warnings"] and any(w.startswith("K=2: beta0 = -") for w in d["warnings"])
    lines = [ln for ln in cap.err.splitlines() if ln.startswith("specmoe policy: warning: ")]
    assert [ln.removeprefix("specmoe policy: warning: ") for ln in lines] == d["warnings"]
    assert evaluate_policies(neg, repeats=1)["warnings"] == d["warnings"]
    rc = main(["policy", "--runs", str(tmp_path / "clean"), "--json", "--repeats", "1"])
    cap = capsys.readouterr()
    assert rc == 0 and json.loads(cap.out)["warnings"] == [] and "warning:" not in cap.err
