"""The Oracle: the DP against brute force, the counterfactual data, Delta space, the CLI."""

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specmoe.cli import main
from specmoe.formats.roundlog import write_round_log
from specmoe.oracle.analysis import oracle_analysis
from specmoe.oracle.counterfactual import build_counterfactual, window_union
from specmoe.oracle.delta import _quadrants, delta_space, fit_boundary
from specmoe.oracle.ssp import expected_accepted, occupancy, solve, summarise, survival
from specmoe.oracle.synthetic import synthetic_round_log

# ---------------------------------------------------------------------------------------------
# brute-force references


def _policy_cost(pol, cost, q, n, k_max):
    """Expected total cost of a Markov policy (budget per position), scalar forward pass."""
    pi = np.zeros(n + k_max + 2)
    pi[0] = 1.0
    total = 0.0
    for i in range(n):
        k = pol[i]
        total += pi[i] * cost[i, k]
        surv = 1.0
        for a in range(k + 1):
            nxt = surv * q[i + a + 1] if a < k else 0.0
            pi[min(i + a + 1, n)] += pi[i] * (surv - nxt)
            surv = nxt
    return total


def _best_sequence_memo(cost, q, n, k_max):
    """Least total cost over every budget sequence from 0 (q all 0 or 1): a forward recursion
    over positions with memory, independent of the backward dynamic programming."""
    import functools

    @functools.cache
    def best(i):
        if i >= n:
            return 0.0
        out = np.inf
        for k in range(k_max + 1):
            acc = 0
            while acc < k and q[i + acc + 1] == 1:
                acc += 1
            out = min(out, cost[i, k] + best(i + acc + 1))
        return out

    return best(0)


def _solve_both(cost, q, n):
    """Solve one generation on the scalar and on the vectorised path; they must agree."""
    import specmoe.oracle.ssp as ssp

    saved = ssp._SCALAR_BELOW
    try:
        out = []
        for threshold in (100, 0):
            ssp._SCALAR_BELOW = threshold
            out.append(solve(cost[None], q[None], np.array([n])))
    finally:
        ssp._SCALAR_BELOW = saved
    np.testing.assert_allclose(out[0].value, out[1].value, rtol=1e-12)
    np.testing.assert_array_equal(out[0].policy, out[1].policy)
    return out[0]


def _instance(seed, n, k_max, *, deterministic=False):
    rng = np.random.default_rng(seed)
    cost = rng.uniform(1.0, 3.0, (n, k_max + 1))
    q = rng.integers(0, 2, n + k_max + 1).astype(float)
    if not deterministic:
        frac = rng.random(n + k_max + 1) < 0.5
        q[frac] = rng.uniform(0, 1, frac.sum())
    return cost, q


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_dp_equals_best_markov_policy(n, k_max, seed):
    cost, q = _instance(seed, n, k_max)
    best = min(
        _policy_cost(p, cost, q, n, k_max) for p in itertools.product(range(k_max + 1), repeat=n)
    )
    sol = _solve_both(cost, q, n)
    assert sol.total[0] == pytest.approx(best, rel=1e-12)
    assert _policy_cost(sol.policy[0], cost, q, n, k_max) == pytest.approx(best, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_dp_equals_enumerated_budget_sequences(n, k_max, seed):
    cost, q = _instance(seed, n, k_max, deterministic=True)
    sol = _solve_both(cost, q, n)
    assert sol.total[0] == pytest.approx(_best_sequence_memo(cost, q, n, k_max), rel=1e-12)
    pi = occupancy(sol.policy, survival(q[None], k_max, n), np.array([n]))
    assert set(np.unique(pi)) <= {0.0, 1.0}  # one path


def test_batched_generations_equal_separate_solves():
    rng = np.random.default_rng(4)
    lengths = np.array([7, 1, 12, 4])
    k_max, n = 3, 12
    cost = rng.uniform(1, 3, (4, n, k_max + 1))
    q = rng.uniform(0, 1, (4, n + k_max + 1))
    joint = solve(cost, q, lengths)
    for g, n_g in enumerate(lengths):
        alone = solve(cost[g : g + 1, :n_g], q[g : g + 1, : n_g + k_max + 1], np.array([n_g]))
        assert joint.total[g] == pytest.approx(alone.total[0], rel=1e-12)
        np.testing.assert_array_equal(joint.policy[g, :n_g], alone.policy[0])
        assert (joint.policy[g, n_g:] == 0).all()


def test_occupancy_reproduces_the_value_and_monte_carlo_agrees():
    rng = np.random.default_rng(8)
    n, k_max = 60, 4
    cost = rng.uniform(1, 3, (1, n, k_max + 1))
    q = rng.uniform(0.2, 0.95, (1, n + k_max + 1))
    sol = solve(cost, q, np.array([n]))
    s = survival(q, k_max, n)
    pi = occupancy(sol.policy, s, np.array([n]))
    picked = np.take_along_axis(cost, sol.policy[..., None].astype(np.int64), -1)[..., 0]
    assert (pi * picked).sum() == pytest.approx(sol.total[0], rel=1e-12)
    # a second implementation of the expectation: sample acceptances, follow the policy
    totals = []
    for _ in range(3000):
        i, t = 0, 0.0
        while i < n:
            k = sol.policy[0, i]
            t += cost[0, i, k]
            acc = 0
            while acc < k and rng.random() < q[0, i + acc + 1]:
                acc += 1
            i += acc + 1
        totals.append(t)
    assert abs(np.mean(totals) - sol.total[0]) < 4 * np.std(totals) / np.sqrt(len(totals))


def test_expected_accepted_is_the_sum_of_survivals():
    q = np.array([[0.0, 0.5, 0.5, 1.0, 0.2, 0.9, 0.3]])
    s = survival(q, 3, 4)
    np.testing.assert_allclose(s[0, 0], [1, 0.5, 0.25, 0.25])
    np.testing.assert_allclose(expected_accepted(s)[0, 0], [0, 0.5, 0.75, 1.0])


# ---------------------------------------------------------------------------------------------
# counterfactual data from a synthetic log


@pytest.fixture(scope="module")
def synth():
    return synthetic_round_log(budgets=(0, 1, 2, 3, 4), n_prompts=6, tokens=50, seed=11)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(1, 3), st.integers(0, 4), st.integers(0, 2**31 - 1))
def test_window_union_brute_force(t, layers, k_max, seed):
    rng = np.random.default_rng(seed)
    n_exp = int(rng.integers(2, 130))
    top_k = int(rng.integers(1, min(n_exp, 4) + 1))
    ids = np.stack(
        [
            np.stack([rng.choice(n_exp, top_k, replace=False) for _ in range(layers)])
            for _ in range(t)
        ]
    )
    starts = np.arange(t)
    ends = np.full(t, t)
    got = window_union(ids, starts, ends, k_max, n_exp)
    for s in range(t):
        for k in range(k_max + 1):
            rows = ids[s : min(s + k, t - 1) + 1]
            want = np.mean([len(set(rows[:, layer].ravel())) for layer in range(layers)])
            assert got[s, k] == pytest.approx(want)


def test_counterfactual_against_a_replay_of_the_rounds(synth):
    cf = build_counterfactual(synth)
    k_max = cf.k_max
    assert k_max == 4
    top = synth.select(synth["k"] == k_max)
    for g, gid in enumerate(cf.generation_id):
        rows = np.flatnonzero(top["generation_id"] == gid)
        ref, q, pos = [], {}, 0
        for r in rows:  # replay: the reference tokens' routing and each drafted outcome
            m = int(top["accepted"][r])
            ref.extend(top.routing_of(r)[: m + 1])
            for d in range(1, min(m + 1, k_max) + 1):
                q[pos + d] = 1.0 if d <= m else 0.0
            pos += m + 1
        assert cf.length[g] == pos == len(ref)
        ref = np.array(ref)
        for i in range(0, pos, 3):
            for k in range(k_max + 1):
                win = ref[i : min(i + k, pos - 1) + 1]
                want = np.mean([len(set(win[:, layer].ravel())) for layer in range(win.shape[1])])
                assert cf.union[g, i, k] == pytest.approx(want)
        for j, v in q.items():
            assert cf.known[g, j] and cf.q[g, j] == v
        unknown = [j for j in range(1, pos) if j not in q]
        assert all(not cf.known[g, j] and cf.q[g, j] == cf.rate[g] for j in unknown)


def test_counterfactual_is_exact_at_recorded_round_starts(synth):
    cf = build_counterfactual(synth)
    s = survival(cf.q, cf.k_max, cf.union.shape[1])
    ea = expected_accepted(s)[cf.round_gen, cf.round_start]
    np.testing.assert_allclose(ea, cf.accepted)  # min(M, k), exactly
    model_u = cf.union[cf.round_gen, cf.round_start]
    m = cf.accepted[:, -1]
    for k in range(cf.k_max + 1):  # the pass's first M+1 positions are reference tokens
        ok = k <= m
        np.testing.assert_allclose(model_u[ok, k], cf.union_recorded[ok, k])


def test_geometric_acceptance_uses_the_rate_everywhere(synth):
    cf = build_counterfactual(synth, acceptance="geometric")
    assert not cf.known.any()
    np.testing.assert_allclose(cf.q, np.repeat(cf.rate[:, None], cf.q.shape[1], axis=1))


def test_oracle_analysis_bounds(synth):
    res = oracle_analysis(synth, l_max=4, tables=False)
    s = res.summaries
    s_max = [x.s_max for x in s]
    assert [x.l_max for x in s] == [1, 2, 3, 4]
    assert all(v >= 1 - 1e-12 for v in s_max)  # plain decoding is among the choices
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(s_max))  # more budgets never hurt
    for x in s:
        assert 0 <= x.mean_accepted <= x.mean_k <= x.l_max and 0 <= x.cap_rate <= 1
        assert x.plain_ms / x.time_ms == pytest.approx(x.s_max)


# ---------------------------------------------------------------------------------------------
# Delta space


def test_quadrants_brute_force():
    rng = np.random.default_rng(3)
    x, y = rng.integers(-2, 3, 200).astype(float), rng.integers(-2, 3, 200).astype(float)
    q = _quadrants(x, y, 0.0)
    want = _brute_quadrants(x, y)
    assert q == want and sum(q.values()) == 200


def _brute_quadrants(x, y):
    out = {"I": 0, "II": 0, "III": 0, "IV": 0, "axes": 0, "origin": 0}
    for a, b in zip(x, y):
        if a == 0 and b == 0:
            out["origin"] += 1
        elif a == 0 or b == 0:
            out["axes"] += 1
        else:
            out[
                {
                    (True, True): "I",
                    (False, True): "II",
                    (False, False): "III",
                    (True, False): "IV",
                }[(a > 0, b > 0)]
            ] += 1
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-20, 20), st.integers(-5, 5)), min_size=1, max_size=25))
def test_fit_boundary_leaves_the_fewest_points_below(points):
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    slope, (lo, hi), viol = fit_boundary(x, y)
    if not np.isfinite(slope):
        return

    def below(lam):
        return int(np.sum(x < lam * y - 1e-12))

    grid = np.concatenate([np.linspace(-30, 30, 2401), [slope, lo, hi]])
    grid = grid[np.isfinite(grid)]
    assert below(slope) == viol == min(below(v) for v in grid)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 30), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_monotone_costs_leave_quadrants_two_and_four_empty(n, k_max, seed):
    rng = np.random.default_rng(seed)
    cost = np.cumsum(rng.uniform(0.1, 2.0, (1, n, k_max + 1)), axis=2)  # rising in k
    q = rng.uniform(0, 1, (1, n + k_max + 1))
    q[rng.random(q.shape) < 0.4] = 1.0
    sol = solve(cost, q, np.array([n]))
    s = survival(q, k_max, n)
    starts = np.arange(n)
    d = delta_space(cost, s, sol.value, sol.policy, np.zeros(n, np.int64), starts)
    assert d.quadrants["II"] == 0 and d.quadrants["IV"] == 0
    assert len(d.d_cost) == n * k_max
    # the Oracle's own choice is never beaten: each rejected k costs at least as much overall
    ea = expected_accepted(s)[0]
    for i in range(n):
        k_star = sol.policy[0, i]
        for k in range(k_max + 1):
            w = sol.value[0]
            exp_next = w[i + 1] + np.sum(s[0, i, 1 : k + 1] * np.diff(w[i + 1 : i + k + 2]))
            assert cost[0, i, k] + exp_next >= sol.value[0, i] - 1e-9
        assert ea[i, k_star] <= k_star


def test_summarise_cap_rate_counts_runs_cut_short():
    # one generation, deterministic: drafts always match, but budget 2 is very dear
    n, k_max = 12, 2
    q = np.ones((1, n + k_max + 1))
    cost = np.tile([10.0, 11.0, 100.0], (1, n, 1))
    summary, sol, pi = summarise(cost, q, np.array([n]))
    assert (sol.policy[0][pi[0] > 0] == 1).all()
    assert summary.cap_rate == pytest.approx(1.0) and summary.mean_accepted == pytest.approx(1)


# ---------------------------------------------------------------------------------------------
# the CLI


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory, synth):
    d = tmp_path_factory.mktemp("runs")
    for k in synth.budgets:
        write_round_log(synth.select(synth["k"] == k), d / f"k{k}" / "part-000000.parquet")
    return d


def test_cli_oracle_json(runs_dir, capsys, tmp_path):
    rc = main(
        [
            "oracle",
            "--runs",
            str(runs_dir),
            "--json",
            "--n-boot",
            "19",
            "--out",
            str(tmp_path / "out"),
            "--no-figures",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    d = json.loads(out)
    assert d["l_max"] == [1, 2, 3, 4] and len(d["s_max"]) == 4
    for key in ("mean_k", "mean_accepted", "cap_rate"):
        assert len(d[key]) == 4
    q = d["delta_space"]["quadrants"]
    assert set(q) == {"I", "II", "III", "IV", "axes", "origin"}
    assert "slope" in d["delta_space"]
    assert {r["k"] for r in d["regression"]["by_k"]} == {0, 1, 2, 3, 4}
    assert d["regression"]["robustness"]["rows"][1]["check"].startswith("Bootstrap")
    assert json.loads((tmp_path / "out" / "oracle.json").read_text()) == d


def _write_bad(tmp_path, log, name):
    write_round_log(log, tmp_path / name / "part-000000.parquet")
    return str(tmp_path / name)


def test_cli_oracle_bad_input_is_one_line(tmp_path, synth, capsys):
    no_cf = synth.select(np.arange(len(synth)))
    no_cf.lists.clear()
    cases = {
        _write_bad(tmp_path, no_cf, "nocf"): "missing counterfactual column",
        _write_bad(tmp_path, synth.select(synth["k"] == 4), "one"): "one budget only",
        str(tmp_path / "void"): "no such file",
    }
    for path, message in cases.items():
        rc = main(["oracle", "--runs", path, "--json"])
        cap = capsys.readouterr()
        assert rc == 2 and cap.out == ""
        assert len(cap.err.strip().splitlines()) == 2  # progress line + the error
        assert message in cap.err.strip().splitlines()[-1]


def test_library_errors_name_the_argument(synth):
    from specmoe.errors import InputError
    from specmoe.oracle.analysis import make_cost_model

    cf = build_counterfactual(synth)
    calls = [
        (lambda: oracle_analysis(synth, l_max=0, tables=False), "l_max", "0 (must be >= 1)"),
        (lambda: oracle_analysis(synth, cost="median", tables=False), "cost", "'median'"),
        (lambda: build_counterfactual(synth, acceptance="x"), "acceptance", "choose"),
        (lambda: cf.truncate(cf.k_max + 1), "l_max", "outside 0.."),
        (lambda: make_cost_model(synth, "median", cf.k_max), "kind", "'median'"),
    ]
    for call, argument, needle in calls:
        with pytest.raises(InputError) as ei:
            call()
        msg = str(ei.value)
        assert ei.value.argument == argument and msg.startswith(f"{argument}: "), msg
        assert needle in msg and "--" not in msg, msg


def test_cli_oracle_names_the_flag(runs_dir, capsys):
    """oracle_analysis' l_max is the command's --l-max."""
    assert main(["oracle", "--runs", str(runs_dir), "--l-max", "0", "--json"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()  # progress line, then the error
    assert cap.out == "" and [e for e in err if "error:" in e] == err[-1:], cap.err
    assert err[-1] == "specmoe oracle: error: --l-max: 0 (must be >= 1)"


def test_scalar_and_vectorised_paths_agree(monkeypatch):
    import specmoe.oracle.ssp as ssp

    rng = np.random.default_rng(6)
    lengths = np.array([30, 5, 44, 17, 1, 40])
    k_max, n = 5, 44
    cost = rng.uniform(1, 3, (6, n, k_max + 1))
    q = rng.uniform(0, 1, (6, n + k_max + 1))
    q[rng.random(q.shape) < 0.5] = 1.0
    s = survival(q, k_max, n)
    monkeypatch.setattr(ssp, "_SCALAR_BELOW", 0)
    vec = solve(cost, q, lengths)
    vec_pi = occupancy(vec.policy, s, lengths)
    monkeypatch.setattr(ssp, "_SCALAR_BELOW", 100)
    sca = solve(cost, q, lengths)
    np.testing.assert_allclose(sca.value, vec.value, rtol=1e-12)
    np.testing.assert_array_equal(sca.policy, vec.policy)
    np.testing.assert_allclose(occupancy(sca.policy, s, lengths), vec_pi, rtol=1e-12, atol=1e-15)


def test_oracle_modules_import_numpy_and_scipy_only():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for m in ('torch', 'statsmodels', 'sklearn', 'pyarrow', 'matplotlib', 'pandas'):\n"
        "    sys.modules[m] = None\n"
        "import specmoe.formats.roundlog, specmoe.oracle.analysis, specmoe.oracle.evaluate\n"
        "import specmoe.commands.oracle, specmoe.commands.policy, specmoe.oracle.synthetic\n"
        "import specmoe.report.oracle_figures\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_figures_are_written(synth, tmp_path):
    pytest.importorskip("matplotlib")
    from specmoe.report.oracle_figures import write_oracle_figures

    res = oracle_analysis(synth, l_max=4, tables=False)
    paths = write_oracle_figures(synth, res, tmp_path)
    assert {p.name for p in paths} == {
        "oracle_bounds.png",
        "delta_space.png",
        "verify_cost.png",
        "draft_time.png",
    }
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_budgets_borrow_the_nearest_fit_and_say_so():
    log = synthetic_round_log(budgets=(1, 3), n_prompts=4, tokens=30, seed=2)
    res = oracle_analysis(log, l_max=8, tables=False)
    assert res.cost_model.source == (1, 1, 1, 3)  # K=2 is as near to 1 as to 3: the smaller
    assert [s.l_max for s in res.summaries] == [1, 2, 3]
    notes = " ".join(res.notes)
    assert "K=0" in notes and "K=2" in notes and "capped at 3" in notes
    for measured in (True, False):
        res = oracle_analysis(log, l_max=3, tables=False, cost="measured" if measured else "model")
        assert res.cost_model.kind == ("measured" if measured else "model")


def test_delta_space_boundary_tracks_the_marginal_value_of_a_token(synth):
    # under an expectation over acceptance every candidate moves E[a]: the rejected points
    # hug a line through the origin whose slope is the DP's value of a token (Figure 3)
    d = oracle_analysis(synth, tables=False, acceptance="geometric").delta
    assert d.quadrants["II"] == 0 and d.quadrants["axes"] == 0
    assert d.quadrants["I"] > 0 and d.quadrants["III"] > 0
    assert d.violations < 0.05 * len(d.d_cost)
    assert abs(d.slope / d.marginal_value["median"] - 1) < 0.3


# ---------------------------------------------------------------------------------------------
# drafters that propose fewer drafts than their budget (prompt lookup)


def _lookup_log(seed: int, budgets=(0, 1, 2, 4), tokens: int = 60, perfect: bool = False):
    """Round logs of a replayed engine loop: the target's greedy text is a fixed token sequence
    with repeats, the drafter the real prompt-lookup drafter (it proposes fewer than its
    budget near the end of a repeat, or none), routing a fixed random row per reference
    position (random rows for wrong drafts); ``perfect``: a drafter that proposes the
    reference itself, its whole budget but for the token limit. Returns (log, prompt,
    reference, routing)."""
    from specmoe.engine.drafters import NgramDrafter
    from specmoe.formats.roundlog import RoundLog

    rng = np.random.default_rng(seed)
    motif = rng.integers(0, 12, 5)
    seq = np.concatenate(
        [
            rng.integers(0, 12, 8),
            motif,
            rng.integers(0, 12, 6),
            motif,
            motif,
            rng.integers(0, 12, 80),
        ]
    )
    prompt, ref = seq[:6].tolist(), seq[6 : 6 + tokens + 1].tolist()
    n_l, m, n_e = 2, 2, 8
    route = np.stack(
        [np.stack([rng.choice(n_e, m, replace=False) for _ in range(n_l)]) for _ in range(len(ref))]
    )  # [pos, L, m]
    drafter = NgramDrafter(max_ngram=2)
    rows, lists = [], {"routing": [], "draft_tokens": [], "target_tokens": []}
    for budget in budgets:
        s, rnd = 0, 0
        while s < tokens:
            k_cap = min(budget, tokens - s - 1)
            drafts = (
                ref[s + 1 : s + 1 + k_cap]
                if perfect
                else drafter.propose(prompt + ref[: s + 1], k_cap).tokens
            )
            k = len(drafts)
            acc = 0
            while acc < k and drafts[acc] == ref[s + 1 + acc]:
                acc += 1
            tgt = ref[s + 1 : s + 2 + acc] + rng.integers(0, 12, k - acc).tolist()
            r = route[s : s + k + 1].copy()
            for j in range(acc + 1, k + 1):
                r[j] = [rng.choice(n_e, m, replace=False) for _ in range(n_l)]
            rows.append(
                {
                    "run_id": f"k={budget}",
                    "prompt_id": "p0",
                    "generation_id": f"k={budget}/p0",
                    "round": rnd,
                    "k": k,
                    "budget": budget,
                    "accepted": acc,
                    "context_len": len(prompt) + s,
                }
            )
            lists["routing"].append(r.ravel())
            lists["draft_tokens"].append(np.asarray(drafts, np.int64))
            lists["target_tokens"].append(np.asarray(tgt, np.int64))
            s, rnd = s + acc + 1, rnd + 1
    data = {
        c: np.array([r[c] for r in rows], dtype=object if c.endswith("_id") else np.int64)
        for c in rows[0]
    }
    nr = len(rows)
    data["budget"] = data["budget"].astype(np.float64)
    data.update(
        pass_size=data["k"] + 1,
        emitted=data["accepted"] + 1,
        t_verify_ms=1.0 + 0.1 * data["k"] + rng.uniform(0, 0.01, nr),
        u_mean=np.ones(nr),
        num_layers=np.full(nr, float(n_l)),
        top_k=np.full(nr, float(m)),
        num_experts=np.full(nr, float(n_e)),
    )
    packed = {}
    for c, vals in lists.items():
        off = np.concatenate([[0], np.cumsum([len(v) for v in vals])]).astype(np.int64)
        packed[c] = (np.concatenate(vals), off)
    return RoundLog(data, packed, "lookup log"), prompt, ref, route


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_counterfactual_with_short_proposals_matches_the_replayed_drafter(seed):
    from specmoe.engine.drafters import NgramDrafter
    from specmoe.formats.roundlog import validate

    log, prompt, ref, _route = _lookup_log(seed)
    validate(log)
    assert (log["k"] < log["budget"]).any()  # some rounds drafted fewer
    cf = build_counterfactual(log)
    assert cf.k_max == 4 and len(cf.length) == 1  # the budget, not the drafted count
    top = log.select(log["budget"] == 4)
    np.testing.assert_array_equal(cf.round_start, np.cumsum(top["emitted"]) - top["emitted"])
    drafter = NgramDrafter(max_ngram=2)
    n = int(cf.length[0])
    for r, s in enumerate(cf.round_start):
        d = int(top["k"][r])
        assert cf.avail[0, s] == d  # exact where a round started
        want_d = len(drafter.propose(prompt + ref[: s + 1], min(4, n - s - 1)).tokens)
        assert want_d == d
        for k in range(5):
            kk = min(k, d)
            assert cf.accepted[r, k] == min(int(top["accepted"][r]), k)
            win = top.routing_of(r)[: kk + 1]
            want = np.mean([len(set(win[:, layer].ravel())) for layer in range(2)])
            assert cf.union_recorded[r, k] == pytest.approx(want)
            assert cf.union[0, s, k] == cf.union[0, s, min(k, int(cf.avail[0, s]))]
    # a mismatch is known only where a draft was made: never past a round's proposal
    for r, s in enumerate(cf.round_start):
        d, m = int(top["k"][r]), int(top["accepted"][r])
        if m == d < 4 and s + d + 1 < n:
            assert cf.q[0, s + d + 1] == cf.rate[0] or cf.known[0, s + d + 1]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oracle_with_short_proposals_equals_enumerated_budget_sequences(seed):
    from specmoe.oracle.analysis import make_cost_model, oracle_costs
    from specmoe.oracle.regression import fit_draft_time, fit_verify_by_k

    log, *_ = _lookup_log(seed)
    cf = build_counterfactual(log)
    model = make_cost_model(
        log, "model", cf.k_max, fits=fit_verify_by_k(log), draft=fit_draft_time(log)
    )
    cost = oracle_costs(cf, model)
    feas = cf.feasible()
    assert np.isinf(
        cost[~feas & (np.arange(cost.shape[1])[None, :, None] < cf.length[:, None, None])]
    ).all()
    n = int(cf.length[0])
    summary, sol, _ = summarise(cost, cf.q, cf.length)
    assert (sol.policy[0, :n] <= cf.avail[0, :n]).all()
    # brute force: every budget sequence, budget k at i drafting min(k, A_i), q_j in {0, 1}
    # where known; unknown q_j set to 0 and 1 in turn makes the outcome deterministic
    for fill in (0.0, 1.0):
        q = np.where(cf.known[0], cf.q[0], fill)
        c = np.where(np.isfinite(cost[0]), cost[0], np.inf)
        want = _best_sequence_memo(c[:n], q, n, cf.k_max)
        got = solve(cost[:, :n], q[None], cf.length).total[0]
        assert got == pytest.approx(want, rel=1e-12)
    assert summary.s_max >= 1 - 1e-12 and summary.mean_k <= cf.avail[0, :n].max()


def test_log_without_budgets_counts_rounds_cut_by_the_token_limit():
    """A log from before the budget column: a round with k < K that drafted every token the
    limit left counts as the largest budget's; a round that drafted fewer mid-generation
    does not."""
    from dataclasses import replace

    from specmoe.errors import InputError

    def without_budget(log):
        return replace(log, data={c: v for c, v in log.data.items() if c != "budget"})

    log, *_ = _lookup_log(0, budgets=(0, 3), tokens=42, perfect=True)
    legacy = without_budget(log)
    cut = (legacy["k"] < 3) & (legacy["k"] > 0)
    assert cut.any()  # the limit cut the last rounds
    cf, cf_b = build_counterfactual(legacy), build_counterfactual(log)
    assert len(cf.length) == 1 and cf.length[0] == 42
    np.testing.assert_array_equal(cf.avail, cf_b.avail)
    np.testing.assert_allclose(cf.union, cf_b.union)
    lookup, *_ = _lookup_log(0, budgets=(0, 4), tokens=60)
    mid = lookup.select(lookup["budget"] == 4)
    assert (mid["k"][:-3] < 4).any()  # short proposals mid-generation
    assert len(build_counterfactual(lookup).length) == 1
    with pytest.raises(InputError, match="largest budget"):
        build_counterfactual(without_budget(lookup))
