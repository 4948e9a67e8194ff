"""`specmoe validate` with the throughput taken as the expected tokens per second of the
measured steps (``specmoe/validate/rules-llamacpp-steps.json``): T(k, a) = 1000 G_a(k) / V(k),
G_a(k) = 1 + a + ... + a^k, V(k) = tau_r(k + 1) + h(k), tau_r the mean over the throughput
prompts of each prompt's median over its oracle generations at k of each generation's median
verification pass. Checked against loops over the generations (exact sums of powers), and
against the realised tokens per second, which the rule set must not read."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from _synthetic_runs import ACC, K
from test_validate_one_kernel import _world
from test_validate_rounds import (
    P,
    R,
    _add_rounds,
    _brute,
    refuses_measured_field,
    refuses_runs_without_rounds,
)

from specmoe.formats.runs import load_runs
from specmoe.validate import intervals as iv
from specmoe.validate.rules import load_rules
from specmoe.validate.score import validate
from specmoe.validate.whole_pass import steps_throughput

ROOT = Path(__file__).resolve().parents[1]
RULES_LC = ROOT / "specmoe/validate/rules-llamacpp.json"
RULES_ST = ROOT / "specmoe/validate/rules-llamacpp-steps.json"


def _T_loops(tv: np.ndarray, h: list[float]) -> list[list[float]]:
    """T[a][k] by loops: G_a(k) as an exact sum of powers of the acceptance value (a
    Fraction of its decimal), V(k) from the per-prompt medians of the generations' passes."""
    med, _ = _brute(tv)
    out = []
    for a in ACC:
        fa = Fraction(str(a))
        row = []
        for k in range(len(K)):
            g = sum(fa**i for i in range(k + 1))
            v = sum(float(med[p, k]) for p in range(P)) / P + h[k]
            row.append(float(1000 * g / Fraction(v)))
        out.append(row)
    return out


def test_steps_throughput_is_g_over_the_step_time():
    V = np.array([2.0, 2.5, 3.0])
    T = steps_throughput(V, [0.5, 1.0])
    assert T.tolist() == [[500.0, 600.0, 1750 / 3], [500.0, 800.0, 1000.0]]
    Tb = steps_throughput(np.stack([V, 2 * V]), [0.5, 1.0])
    assert Tb.shape == (2, 2, 3) and np.allclose(Tb[1], T / 2)


def test_steps_side_against_loops_over_the_generations(tmp_path):
    plan, runs = _world(tmp_path, one_kernel=True)
    tv = _add_rounds(runs)
    (m,) = load_runs(runs)
    (c,) = validate(plan, runs, rules_path=str(RULES_ST)).configurations
    want = _T_loops(tv, m.draft_ms.tolist())
    got = np.asarray(c.measured.tokens_per_s)
    assert got == pytest.approx(np.asarray(want), rel=1e-12)
    kstar = [int(np.argmax(r)) for r in want]  # the first maximiser, as k* is defined
    assert list(c.measured.k_star) == kstar
    wp = c.versions["whole_pass"]
    loss = [1 - want[i][wp.k_hat[i]] / want[i][kstar[i]] for i in range(len(ACC))]
    assert wp.max_loss == pytest.approx(max(loss), rel=1e-12, abs=1e-15)
    assert wp.kstar_within_one == sum(abs(a - b) <= 1 for a, b in zip(wp.k_hat, kstar, strict=True))
    assert any("expected tokens per second of the measured steps" in n for n in c.notes)
    # the verify rule is still the sweep's (rules-llamacpp.json's tau), not the rounds'
    (c_lc,) = validate(plan, runs, rules_path=str(RULES_LC)).configurations
    assert c.measured.verify_on_ms == c_lc.measured.verify_on_ms
    assert wp.verify_error == c_lc.versions["whole_pass"].verify_error
    assert wp.k_hat == c_lc.versions["whole_pass"].k_hat  # the prediction does not move


def test_steps_intervals_resample_the_prompts_of_the_passes(tmp_path):
    """The loss interval by a second route: each resample of prompts (the scorer's own
    indices) recomputed by loops, its loss at the fixed k_hat*, the percentile interval."""
    plan, runs = _world(tmp_path, one_kernel=True)
    tv = _add_rounds(runs, seed=3)
    (m,) = load_runs(runs)
    rules = load_rules(RULES_ST)
    (c,) = validate(plan, runs, rules_path=str(RULES_ST)).configurations
    level, B, seed = rules.interval_settings
    idx = iv.resample_prompts(P, resamples=B, seed=seed)
    med, _ = _brute(tv)
    h = m.draft_ms
    k_hat = c.versions["whole_pass"].k_hat
    G = np.array([[sum(a**i for i in range(k + 1)) for k in range(len(K))] for a in ACC])
    losses = []
    for b in range(B):
        V = med[idx[b]].mean(axis=0) + h
        T = 1000 * G / V
        losses.append(max(1 - T[i, k_hat[i]] / T[i].max() for i in range(len(ACC))))
    lo, hi = np.percentile(losses, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    got = c.versions["whole_pass"].intervals.metrics["max_loss"]
    assert got == pytest.approx((lo, hi), rel=1e-9, abs=1e-12)


def test_realised_tokens_per_second_do_not_move_the_steps_scores(tmp_path):
    """The acceptance draws leave the measured side: new realised tokens per second (the
    rounds' passes unchanged) change rules-llamacpp.json's throughput and none of this rule
    set's scores."""
    plan, runs = _world(tmp_path, one_kernel=True)
    _add_rounds(runs)
    (a,) = validate(plan, runs, rules_path=str(RULES_ST)).configurations
    (a_lc,) = validate(plan, runs, rules_path=str(RULES_LC)).configurations
    t = json.loads((runs / "throughput.json").read_text())
    c = t["configurations"][0]
    tps = np.asarray(c["per_prompt_tokens_per_s"]) * np.random.default_rng(9).uniform(
        0.5, 1.5, size=(len(ACC), len(K), P, R)
    )
    tps[:, 0] = tps[0, 0]
    c["per_prompt_tokens_per_s"] = tps.tolist()
    c["tokens_per_s"] = np.median(tps.reshape(len(ACC), len(K), -1), axis=2).tolist()
    (runs / "throughput.json").write_text(json.dumps(t))
    (b,) = validate(plan, runs, rules_path=str(RULES_ST)).configurations
    (b_lc,) = validate(plan, runs, rules_path=str(RULES_LC)).configurations
    assert a_lc.measured.tokens_per_s != b_lc.measured.tokens_per_s
    assert a.measured.tokens_per_s == b.measured.tokens_per_s
    for name, v in a.versions.items():
        w = b.versions[name]
        assert (v.k_hat, v.max_loss, v.kstar_within_one) == (
            w.k_hat,
            w.max_loss,
            w.kstar_within_one,
        )
        assert v.intervals.metrics == w.intervals.metrics
    assert [(x.rule.id, x.holds, x.decided) for x in a.rules] == [
        (x.rule.id, x.holds, x.decided) for x in b.rules
    ]


def test_rule_set_changes_the_throughput_side_alone():
    a, b = json.loads(RULES_LC.read_text()), json.loads(RULES_ST.read_text())
    strip = ("text",)
    assert [{k: v for k, v in r.items() if k not in strip} for r in a["rules"]] == [
        {k: v for k, v in r.items() if k not in strip} for r in b["rules"]
    ]
    da, db = a["definitions"], b["definitions"]
    changed = {k for k in da.keys() | db.keys() if da.get(k) != db.get(k)}
    assert changed == {"measured", "intervals", "measured_best_k"}
    assert {k: v for k, v in da["measured"].items() if k != "throughput"} == {
        k: v for k, v in db["measured"].items() if k not in ("throughput", "throughput_side")
    }
    assert {k: v for k, v in da["intervals"].items() if k != "throughput"} == {
        k: v for k, v in db["intervals"].items() if k != "throughput"
    }
    st, lc = load_rules(RULES_ST), load_rules(RULES_LC)
    assert (st.throughput_side, st.verify_side) == ("steps", "sweep")
    assert lc.throughput_side == "generations"


def test_bad_steps_input_is_one_line_and_exit_2(tmp_path, capsys):
    refuses_runs_without_rounds(tmp_path, capsys, RULES_ST)
    refuses_measured_field(
        tmp_path, RULES_ST, "throughput_side", "step", "'generations' or 'steps'"
    )
