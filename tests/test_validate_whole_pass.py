"""The whole-pass version of `specmoe validate`: scored when the plan carries it, decided by the
whole-pass rule set (its scored_version), absent otherwise."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from _synthetic_runs import L, measured_verify_ms, write_plan, write_profile, write_runs
from test_plan_whole_pass import hand_ops, synthetic_whole_pass

from specmoe.cost.plan import load_plan
from specmoe.formats.profile import load_profile
from specmoe.validate.score import validate

RULES_WP = Path(__file__).resolve().parents[1] / "specmoe/validate/rules-whole-pass.json"


def _world(tmp: Path, whole_pass: bool = True):
    prof = write_profile(tmp / "profile.json")
    if whole_pass:
        p = load_profile(prof)
        wp = {**synthetic_whole_pass(), "model": "tiny-moe", "layers": L}
        dataclasses.replace(p, whole_pass=wp).save(prof)
    plan = write_plan(tmp / "plan" / "plan.json", prof)
    return plan, write_runs(tmp / "runs")


def test_whole_pass_version_is_the_ops_at_the_run_depth_plus_the_plan_experts(tmp_path):
    plan, runs = _world(tmp_path)
    pl = load_plan(plan)
    assert pl.whole_pass is not None and pl.whole_pass.num_layers == L
    (c,) = validate(plan, runs).configurations
    v = c.versions["whole_pass"]
    off, on = measured_verify_ms()
    ops = np.array([hand_ops(n, 512, L)[0] for n in range(1, 10)])  # the runs' depth, 512
    want_slot = ops + np.asarray(pl.whole_pass.expert_ms["per_slot"])
    want_dedup = ops + np.asarray(pl.whole_pass.expert_ms["dedup"])
    assert v.verify_ms.per_slot == pytest.approx(want_slot, rel=1e-12)
    assert v.verify_ms.dedup == pytest.approx(want_dedup, rel=1e-12)
    # the default rule set scores n >= 2 with the dedup kernel, and decides on the prediction
    err = np.max(np.abs(want_dedup[1:] - on[1:]) / on[1:])
    assert v.verify_error == pytest.approx(err, rel=1e-12)
    assert v.verify_error_by_kernel.per_slot == pytest.approx(
        np.max(np.abs(want_slot[1:] - off[1:]) / off[1:]), rel=1e-12
    )
    rule = {r.rule.id: r for r in c.rules}
    assert rule["kstar_within_one"].measured == c.versions["prediction"].kstar_within_one


def test_the_whole_pass_rule_set_decides_on_the_whole_pass_version(tmp_path):
    plan, runs = _world(tmp_path)
    (c,) = validate(plan, runs, rules_path=str(RULES_WP)).configurations
    v = c.versions["whole_pass"]
    # definitions.measured: tau_p(n) is the mean over prompts of the per-prompt medians
    cfg = json.loads((runs / "verify.json").read_text())["configurations"][0]
    off = np.mean(cfg["per_prompt_ms"]["off"], axis=0)
    on = np.mean(cfg["per_prompt_ms"]["on"], axis=0)
    assert c.measured.verify_off_ms == pytest.approx(off, rel=1e-12)
    err = max(
        np.max(np.abs(np.asarray(v.verify_ms.per_slot) - off) / off),
        np.max(np.abs(np.asarray(v.verify_ms.dedup) - on) / on),
    )  # n = 1..9: verify_error_pass_sizes
    assert v.verify_error == pytest.approx(err, rel=1e-12)
    rule = {r.rule.id: r for r in c.rules}
    assert rule["verify_error_whole_pass"].measured == pytest.approx(err, rel=1e-12)
    assert rule["kstar_within_one"].measured == v.kstar_within_one
    assert rule["loss_at_kstar"].measured == v.max_loss
    assert rule["verify_error_whole_pass"].holds is bool(err <= 0.1)


def test_without_whole_pass_there_is_no_fourth_version(tmp_path):
    plan, runs = _world(tmp_path, whole_pass=False)
    (c,) = validate(plan, runs).configurations
    assert set(c.versions) == {"prediction", "measured_time", "calibrated"}
    (c,) = validate(plan, runs, rules_path=str(RULES_WP)).configurations
    assert "whole_pass" not in c.versions
    assert all(r.holds is None for r in c.rules)  # nothing to score the rules on
