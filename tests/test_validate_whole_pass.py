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


def _cells(d: int, n: int, pad: int = 256) -> int:
    w = pad
    while w < d + n:  # llama.cpp's get_n_kv, by counting
        w += pad
    return w


def _hand_ops_padded(n: int, d: int, layers: int) -> float:
    """hand_ops with attention reading the padded view's cells instead of d + n."""
    w = _cells(d, n)
    att, att_w = (
        1000 * (d + n) * 1e-6 / 10.0 + 2000 * n * (d + n) * 1e-6 / 20.0,
        1000 * w * 1e-6 / 10.0 + 2000 * n * w * 1e-6 / 20.0,
    )
    return hand_ops(n, d, layers)[0] + layers * (att_w - att)


def test_a_padded_kv_view_is_scored_at_the_runs_cache_lengths(tmp_path):
    """A profile with kv_pad and runs that give context_len (511: a prompt of 512 tokens) and
    the throughput generations' tokens (128): the verify times are the ops one token short of
    the depth, reading llama.cpp's padded view (512 cells at n = 1, 768 at n >= 2), and k̂* is
    picked from the step times averaged over the cache lengths 511..638 the generations pass."""
    from _synthetic_runs import draft_ms

    from specmoe.cost import theory

    prof = write_profile(tmp_path / "profile.json")
    p = load_profile(prof)
    wp = {**synthetic_whole_pass(), "model": "tiny-moe", "layers": L, "kv_pad": 256}
    dataclasses.replace(p, whole_pass=wp).save(prof)
    plan = write_plan(tmp_path / "plan" / "plan.json", prof)
    runs = write_runs(tmp_path / "runs")
    for name, key, value in (
        ("verify.json", "context_len", 511),
        ("throughput.json", "tokens", 128),
    ):
        raw = json.loads((runs / name).read_text())
        raw["configurations"][0][key] = value
        (runs / name).write_text(json.dumps(raw))
    pl = load_plan(plan)
    (c,) = validate(plan, runs).configurations
    v = c.versions["whole_pass"]
    ops = np.array([_hand_ops_padded(n, 511, L) for n in range(1, 10)])
    dedup = np.asarray(pl.whole_pass.expert_ms["dedup"])
    assert v.verify_ms.dedup == pytest.approx(ops + dedup, rel=1e-12)
    assert ops[1] - ops[0] > 0.1  # the step at 512 cells is in the prediction
    step = np.array(
        [np.mean([_hand_ops_padded(n, c0, L) for c0 in range(511, 639)]) for n in range(1, 10)]
    )
    V = (step + dedup)[: len(draft_ms())] + draft_ms()
    acc = json.loads((runs / "throughput.json").read_text())["configurations"][0]["acceptance"]
    assert list(v.k_hat) == [theory.best_draft_length(list(V), a) for a in acc]
    V_verify = (ops + dedup)[: len(draft_ms())] + draft_ms()  # what the verify context picks
    assert list(v.k_hat) != [theory.best_draft_length(list(V_verify), a) for a in acc]
    # without the runs' cache lengths: the configuration's depth, as before
    (c0,) = validate(plan, write_runs(tmp_path / "runs0")).configurations
    ops0 = np.array([_hand_ops_padded(n, 512, L) for n in range(1, 10)])
    assert c0.versions["whole_pass"].verify_ms.dedup == pytest.approx(ops0 + dedup, rel=1e-12)


@pytest.mark.parametrize(
    "name, key, bad", [("verify.json", "context_len", -1), ("throughput.json", "tokens", 0)]
)
def test_bad_cache_lengths_are_named(tmp_path, name, key, bad):
    from specmoe.errors import InputError
    from specmoe.formats.runs import load_runs

    runs = write_runs(tmp_path / "runs")
    raw = json.loads((runs / name).read_text())
    raw["configurations"][0][key] = bad
    (runs / name).write_text(json.dumps(raw))
    with pytest.raises(InputError, match=f"{name}: {key} must be an integer"):
        load_runs(runs)


def test_a_level_scales_the_version_at_its_depth_only(tmp_path):
    """A profile ``whole_pass.level`` (the benchmark's level beside the runs, round 7)
    multiplies every time of the version at the runs' depth, and nothing else; a level
    without the runs' depth scores no whole-pass version and says why."""
    plan, runs = _world(tmp_path)
    (c0,) = validate(plan, runs).configurations
    prof = tmp_path / "profile.json"
    p = load_profile(prof)
    for level, scale in (({"512": 1.37, "2048": 0.5}, 1.37), ({"2048": 2.0}, None)):
        dataclasses.replace(p, whole_pass={**p.whole_pass, "level": level}).save(prof)
        (c,) = validate(write_plan(tmp_path / "p2" / "plan.json", prof), runs).configurations
        if scale is None:
            assert "whole_pass" not in c.versions
            assert any("level has no depth 512" in n for n in c.notes)
            continue
        v, v0 = c.versions["whole_pass"], c0.versions["whole_pass"]
        for k in ("per_slot", "dedup"):
            got, want = getattr(v.verify_ms, k), getattr(v0.verify_ms, k)
            assert got == pytest.approx(scale * np.asarray(want), rel=1e-12)
        assert c.versions["prediction"].verify_ms.dedup == c0.versions["prediction"].verify_ms.dedup


@pytest.mark.parametrize(
    "level, match",
    [([1.0], "must be an object"), ({"d512": 1.0}, "is not a depth"), ({"512": 0.0}, "> 0"),
     ({"512": "x"}, "level")],
)  # fmt: skip
def test_bad_levels_are_named(tmp_path, level, match):
    from specmoe.errors import InputError

    prof = write_profile(tmp_path / "profile.json")
    wp = {**synthetic_whole_pass(), "model": "tiny-moe", "layers": L, "level": level}
    raw = json.loads(prof.read_text())
    raw["whole_pass"] = json.loads(json.dumps(wp))
    prof.write_text(json.dumps(raw))
    with pytest.raises(InputError, match=match):
        load_profile(prof)
