"""Where the Oracle stops (specmoe.analysis.oracle_stops, specmoe.analysis.boundaries) against
independent references: the Oracle's own API with the expert cost set to zero, its solver's
values, set differences by brute force, hand-typed code boundaries."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from specmoe.analysis.boundaries import boundary_types, string_comment_starts
from specmoe.analysis.oracle_stops import (
    action_values,
    concat_logs,
    cost_with_mean_expert_term,
    cost_without_expert_term,
    evaluate_policy,
    reference_sequences,
    stops_analysis,
)
from specmoe.cli import main
from specmoe.formats.roundlog import read_round_log
from specmoe.oracle.analysis import make_cost_model, oracle_costs
from specmoe.oracle.counterfactual import build_counterfactual
from specmoe.oracle.ssp import solve, survival

ROOT = Path(__file__).resolve().parents[1]
DRAFT = ROOT / "results" / "cpu" / "bundled" / "rounds" / "draft-model"
NGRAM1 = ROOT / "results" / "cpu" / "bundled-policy" / "rounds" / "ngram" / "ngram-d512-q01"


@pytest.fixture(scope="module")
def oracle():
    log = read_round_log(DRAFT)
    cf = build_counterfactual(log)
    model = make_cost_model(log, "model", cf.k_max)
    return log, cf, model, oracle_costs(cf, model)


def test_no_expert_term_equals_the_oracle_api_with_zero_expert_cost(oracle):
    _log, cf, model, cost = oracle
    assert any(a != 0 for a in model.alpha)  # the expert term is there to remove
    mine = cost_without_expert_term(cost, cf, model)
    api = oracle_costs(cf, replace(model, alpha=(0.0,) * len(model.alpha)))
    fin = np.isfinite(api)
    assert (np.isfinite(mine) == fin).all()
    assert np.allclose(mine[fin], api[fin], rtol=0, atol=1e-12)
    # and so are the two Oracles' policies
    surv = survival(cf.q, cf.k_max, cost.shape[1])
    a = solve(mine, cf.q, cf.length, surv=surv)
    b = solve(api, cf.q, cf.length, surv=surv)
    assert (a.policy == b.policy).all() and np.allclose(a.value, b.value)


def test_mean_expert_term_keeps_the_average_cost_per_budget(oracle):
    _log, cf, model, cost = oracle
    mean = cost_with_mean_expert_term(cost, cf, model)
    live = (np.arange(cost.shape[1])[None, :] < cf.length[:, None])[..., None] & np.isfinite(cost)
    for k in range(cf.k_max + 1):
        m = live[..., k]
        assert mean[..., k][m].mean() == pytest.approx(cost[..., k][m].mean(), rel=1e-12)
        assert (
            np.ptp(mean[..., k][m] - cost[..., k][m] + model.alpha[k] * cf.union[..., k][m]) < 1e-9
        )


def test_action_values_reproduce_the_solver(oracle):
    _log, cf, _model, cost = oracle
    surv = survival(cf.q, cf.k_max, cost.shape[1])
    sol = solve(cost, cf.q, cf.length, surv=surv)
    q = action_values(cost, surv, sol.value)
    live = np.arange(cost.shape[1])[None, :] < cf.length[:, None]
    best = np.take_along_axis(q, sol.policy.astype(np.int64)[..., None], -1)[..., 0]
    assert np.allclose(best[live], sol.value[:, : cost.shape[1]][live])
    assert np.allclose(np.min(q, -1)[live], sol.value[:, : cost.shape[1]][live])
    # the optimal policy evaluated is J(0); any other policy costs at least as much
    assert np.allclose(evaluate_policy(cost, surv, sol.policy, cf.length), sol.total)
    ones = np.where(live, np.minimum(1, cf.avail), 0).astype(np.int8)
    assert (evaluate_policy(cost, surv, ones, cf.length) >= sol.total - 1e-9).all()


def test_reference_sequences_match_the_counterfactual_and_the_log(oracle):
    from specmoe.oracle.counterfactual import window_union

    log, cf, _model, _cost = oracle
    ref = reference_sequences(log, cf)
    ends = np.repeat(ref.base + ref.length, ref.length)
    u = window_union(ref.ids, np.arange(len(ref.ids)), ends, cf.k_max, 64)
    for g in range(len(cf.length)):
        lo = ref.base[g]
        for i in range(cf.length[g]):
            a = int(cf.avail[g, i])
            assert np.allclose(u[lo + i, : a + 1], cf.union[g, i, : a + 1])
    # tokens: the accepted drafts of each recorded round sit at s_r + 1..s_r + M_r
    rd = ref.rounds
    for r in range(0, len(rd), 7):
        m = int(rd["accepted"][r])
        at = ref.base[ref.round_gen[r]] + ref.round_start[r]
        assert (ref.tokens[at + 1 : at + 1 + m] == rd.list_of("draft_tokens", r)[:m]).all()
        assert (ref.ids[at] == rd.routing_of(r)[0]).all()


def test_new_experts_equal_set_differences(oracle):
    log, cf, _model, _cost = oracle
    ref = reference_sequences(log, cf)
    from specmoe.oracle.counterfactual import window_union

    ends = np.repeat(ref.base + ref.length, ref.length)
    u = window_union(ref.ids, np.arange(len(ref.ids)), ends, 3, 64)
    new = np.diff(u, axis=1)
    rng = np.random.default_rng(0)
    for t in rng.choice(ref.length[0] - 5, 20, replace=False):
        for d in (1, 2, 3):
            brute = np.mean(
                [
                    len(set(ref.ids[t + d, layer]) - set(ref.ids[t : t + d, layer].ravel()))
                    for layer in range(ref.ids.shape[1])
                ]
            )
            assert new[t, d - 1] == pytest.approx(brute, abs=1e-12)


def test_string_and_comment_openers():
    text = 'x = \'a#b\'  # c \'d\'\ns = """q\n\'""" + "e\\"f"\n'
    opens = [i for i, v in enumerate(string_comment_starts(text)) if v]
    assert [text[i] for i in opens] == ["'", "#", '"', '"']
    assert opens == [4, 11, 23, 35]


def test_boundary_types_of_hand_typed_code():
    pieces = [
        "def",
        " f",
        "(",
        "x",
        "):",
        "\n    ",
        "return",
        " x",
        "\n",
        "#",
        " done",
        "\n",
        "y",
        " =",
        " '",
        "s",
        "'",
    ]
    got = boundary_types(np.arange(len(pieces)), pieces)
    want = [
        "unknown",
        "same",
        "ident/punct",
        "ident/punct",
        "ident/punct",
        "indent",
        "same",
        "same",
        "indent",
        "string/comment",
        "ident/punct",
        "newline",
        "same",
        "ident/punct",
        "string/comment",
        "ident/punct",
        "ident/punct",
    ]
    # "\n" after "    return x" starts a line at indentation 0: an indentation change; the
    # "\n" after "# done" keeps indentation 0: a plain newline; after a token of blanks only
    # ("\n" before "y") there is no character to compare: "same"
    assert list(got) == want
    toks = np.arange(len(pieces))
    toks[0] = -1
    assert boundary_types(toks, pieces)[1] == "unknown"


def test_stops_analysis_is_consistent(oracle):
    log, _cf, _model, _cost = oracle
    pieces = [f"t{i} " for i in range(4096)]
    res = stops_analysis(log, pieces, n_boot=50, seed=1)
    ks = res["k_star"]["full"]
    assert sum(ks["distribution"]) == pytest.approx(1.0)
    ne = res["new_experts"]
    assert ne["stop_minus_continue"]["difference"] == pytest.approx(
        ne["stop"]["mean"] - ne["continue"]["mean"]
    )
    et = res["expert_term"]["no_expert_term"]
    assert 0 <= et["differ_share_visited"]["mean"] <= 1
    assert et["k_plus_1_cheaper_states"] <= et["visited_states"]
    for c in res["cases"]:
        assert c["q_gap_without_expert_term_ms"] > 0
    # the full Oracle's own policy is the fastest under the full cost
    s = res["s_max_under_full_cost"]
    assert s["full"] >= s["no_expert_term"] - 1e-12 and s["full"] >= s["mean_expert_term"] - 1e-12


def test_concat_logs_reads_as_the_parts():
    a, b = read_round_log(DRAFT), read_round_log(NGRAM1)
    c = concat_logs([a, b])
    assert len(c) == len(a) + len(b)
    r = len(a) + 5
    assert (c.routing_of(r) == b.routing_of(5)).all()
    assert (c.list_of("draft_tokens", r) == b.list_of("draft_tokens", 5)).all()


def test_stops_command_writes_json_and_figures(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["stops", "--runs", str(NGRAM1), "--n-boot", "20", "--json", "--out", str(out)])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schema"] == "specmoe.stops/1" and d["drafters"][0]["drafter"] == "ngram"
    assert json.loads((out / "stops.json").read_text()) == d
    assert {p.name for p in out.glob("*.png")} == {
        "stops_k_ngram.png",
        "stops_cases_ngram.png",
        "stops_new_experts_ngram.png",
    }
    from specmoe.report.html import build_report

    page, figures, counts = build_report(out, tmp_path / "page.html")
    assert counts.get("stops") == 1 and "Could not render" not in page
    assert "By the boundary before the next token" in page and len(figures) == 3
