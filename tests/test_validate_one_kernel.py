"""`specmoe validate` on runs of an engine with one expert kernel, a deduplicating one
(llama.cpp's CPU MUL_MAT_ID): verify times with deduplication on alone load and score; the
scores that need the per-slot time are not scored; the rule set of docs/runs-protocol-llamacpp.md
reports the crossover rule as not applicable."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from _synthetic_runs import L, growth_ms, measured_verify_ms, write_plan, write_profile, write_runs
from test_plan_whole_pass import synthetic_whole_pass

from specmoe.cli import main
from specmoe.errors import InputError
from specmoe.formats.profile import load_profile
from specmoe.formats.runs import load_runs
from specmoe.validate.result import Validation
from specmoe.validate.rules import decide, load_rules
from specmoe.validate.score import validate

ROOT = Path(__file__).resolve().parents[1]
RULES_WP = ROOT / "specmoe/validate/rules-whole-pass.json"
RULES_LC = ROOT / "specmoe/validate/rules-llamacpp.json"


def _drop_off(folder: Path, *, repeats: bool = False) -> Path:
    """The runs folder as an engine with the dedup kernel alone writes it: every 'off' entry
    removed (with ``repeats``: each prompt's three repetitions given, on alone)."""
    v = json.loads((folder / "verify.json").read_text())
    for c in v["configurations"]:
        del c["verify_ms"]["off"]
        if "per_prompt_ms" in c:
            del c["per_prompt_ms"]["off"]
            if repeats:
                on = np.asarray(c["per_prompt_ms"]["on"])
                c["per_prompt_repeats_ms"] = {
                    "on": np.stack([on * 0.99, on, on * 1.02], axis=2).tolist()
                }
                del c["per_prompt_ms"]
    (folder / "verify.json").write_text(json.dumps(v))
    return folder


def _world(tmp: Path, *, one_kernel: bool, whole_pass: bool = True) -> tuple[Path, Path]:
    prof = write_profile(tmp / "profile.json")
    if whole_pass:
        p = load_profile(prof)
        dataclasses.replace(
            p, whole_pass={**synthetic_whole_pass(), "model": "tiny-moe", "layers": L}
        ).save(prof)
    plan = write_plan(tmp / "plan" / "plan.json", prof)
    runs = write_runs(tmp / "runs")
    return plan, (_drop_off(runs) if one_kernel else runs)


def test_on_alone_loads_with_per_slot_none(tmp_path):
    runs = _drop_off(write_runs(tmp_path / "runs"), repeats=True)
    (m,) = load_runs(runs)
    _, on = measured_verify_ms()
    assert m.kernels == ("dedup",)
    assert m.verify_off_ms is None and m.per_prompt_off_ms is None
    assert m.per_prompt_repeats_off_ms is None
    assert m.verify_on_ms == pytest.approx(on, rel=1e-12)
    # per_prompt_ms derived from the repetitions: the median of (0.99, 1, 1.02) x is x
    v = json.loads((runs / "verify.json").read_text())["configurations"][0]
    want = np.asarray(v["per_prompt_repeats_ms"]["on"])[:, :, 1]
    assert m.per_prompt_on_ms == pytest.approx(want, rel=1e-12)
    (m2,) = load_runs(write_runs(tmp_path / "both"))
    assert m2.kernels == ("per_slot", "dedup")


def test_on_alone_must_be_consistent(tmp_path):
    runs = write_runs(tmp_path / "runs")
    v = json.loads((runs / "verify.json").read_text())
    del v["configurations"][0]["verify_ms"]["off"]  # per_prompt_ms still gives off and on
    v["configurations"][0]["per_prompt_ms"] = {
        "off": v["configurations"][0]["per_prompt_ms"]["off"]
    }
    (runs / "verify.json").write_text(json.dumps(v))
    with pytest.raises(InputError, match="per_prompt_ms must give 'on'"):
        load_runs(runs)
    runs = _drop_off(write_runs(tmp_path / "r2"))
    t = json.loads((runs / "throughput.json").read_text())
    t["configurations"][0]["dedup"] = False
    (runs / "throughput.json").write_text(json.dumps(t))
    with pytest.raises(InputError, match=r"deduplication off need verify_ms\.off"):
        load_runs(runs)
    v = json.loads((runs / "verify.json").read_text())
    del v["configurations"][0]["verify_ms"]["on"]
    (runs / "verify.json").write_text(json.dumps(v))
    with pytest.raises(InputError, match="verify_ms must give 'off' and 'on'"):
        load_runs(runs)


def test_default_rules_score_the_dedup_kernel_and_leave_the_saving_unscored(tmp_path):
    plan, runs = _world(tmp_path, one_kernel=True, whole_pass=False)
    (c,) = validate(plan, runs).configurations
    _, on = measured_verify_ms()
    g = growth_ms()
    # Eq. (22) with tau(1) of the dedup pass (the same as the per-slot one at n = 1 here)
    pred = c.versions["prediction"]
    assert pred.verify_error == pytest.approx(float(np.max(g[1:] / on[1:])), rel=1e-12)
    assert pred.verify_error_by_kernel.per_slot is None
    assert "calibrated" not in c.versions
    assert c.measured.verify_off_ms is None and c.measured.saving_ms is None
    assert c.crossover_measured is None and pred.crossover_distance is None
    assert pred.saving_in_band_share is None and pred.sign_agreement_share is None
    rule = {r.rule.id: r for r in c.rules}
    assert rule["crossover_within_one"].holds is None
    assert rule["saving_in_band"].holds is None
    assert rule["kstar_within_one"].holds is True  # throughput follows the dedup step times
    assert any("one kernel timed (dedup)" in n for n in c.notes)


def test_whole_pass_rules_need_both_kernels_for_their_verify_error(tmp_path):
    plan, runs = _world(tmp_path, one_kernel=True)
    (c,) = validate(plan, runs, rules_path=str(RULES_WP)).configurations
    wp = c.versions["whole_pass"]
    assert wp.verify_error is None  # the rule set names per_slot too, which was not timed
    assert wp.verify_error_by_kernel.dedup is not None
    rule = {r.rule.id: r for r in c.rules}
    assert rule["verify_error_whole_pass"].holds is None
    assert rule["crossover_within_one"].holds is None


def test_llamacpp_rules_score_the_one_kernel_as_the_two_kernel_runs_score_dedup(tmp_path):
    """Removing the per-slot times changes no score the llama.cpp rule set decides: the same
    runs with and without 'off' give the same k_hat*, loss and dedup verify error, with the
    same intervals (tau(1) of the per-slot and the dedup pass are equal in these runs)."""
    plan1, runs1 = _world(tmp_path / "one", one_kernel=True)
    plan2, runs2 = _world(tmp_path / "two", one_kernel=False)
    (c1,) = validate(plan1, runs1, rules_path=str(RULES_LC)).configurations
    (c2,) = validate(plan2, runs2, rules_path=str(RULES_LC)).configurations
    assert set(c1.versions) == {"prediction", "measured_time", "whole_pass"}
    for name, v1 in c1.versions.items():
        v2 = c2.versions[name]
        assert v1.k_hat == v2.k_hat and v1.kstar_within_one == v2.kstar_within_one
        assert v1.max_loss == pytest.approx(v2.max_loss, rel=1e-12)
        assert v1.verify_error == pytest.approx(v2.verify_error_by_kernel.dedup, rel=1e-12)
        assert v1.verify_error == pytest.approx(v2.verify_error, rel=1e-12)
        assert v1.intervals.metrics["verify_error"] == pytest.approx(
            v2.intervals.metrics["verify_error"], rel=1e-12
        )
    # the verify error is the dedup one, from the per-prompt means, at every n = 1..9
    cfg = json.loads((runs1 / "verify.json").read_text())["configurations"][0]
    on = np.mean(cfg["per_prompt_ms"]["on"], axis=0)
    wp = np.asarray(c1.versions["whole_pass"].verify_ms.dedup)
    assert c1.versions["whole_pass"].verify_error == pytest.approx(
        float(np.max(np.abs(wp - on) / on)), rel=1e-12
    )
    r1 = {r.rule.id: r for r in c1.rules}
    r2 = {r.rule.id: r for r in c2.rules}
    assert r1["crossover_within_one"].holds is None and r1["crossover_within_one"].decided is None
    assert r2["crossover_within_one"].holds is None  # not applicable, whatever was measured
    assert r1["crossover_within_one"].to_dict()["not_applicable"].startswith("llama.cpp has one")
    for rid in ("kstar_within_one", "loss_at_kstar", "verify_error_whole_pass"):
        assert r1[rid].holds == r2[rid].holds is not None
        assert r1[rid].measured == pytest.approx(r2[rid].measured, rel=1e-12)
    assert c1.all_hold == c2.all_hold


def test_cli_writes_and_round_trips_one_kernel_scores(tmp_path, capsys):
    plan, runs = _world(tmp_path, one_kernel=True)
    out = tmp_path / "out"
    argv = ["validate", "--plan", str(plan), "--runs", str(runs), "--rules", str(RULES_LC)]
    rc = main([*argv, "--out", str(out)])
    text = capsys.readouterr().out
    assert rc in (0, 1)
    assert "n/a" in text and "crossover_within_one" in text
    d = json.loads((out / "validation.json").read_text())
    (c,) = d["configurations"]
    assert c["measured"]["verify_ms"]["off"] is None
    assert Validation.from_dict(d).to_dict() == d
    assert (out / "validate_saving.png").is_file() and (out / "validate_tau.png").is_file()


def test_not_applicable_rules_in_the_loader(tmp_path):
    rules = load_rules(RULES_LC)
    (cross,) = [r for r in rules.rules if r.id == "crossover_within_one"]
    assert cross.not_applicable and cross.required is False
    assert rules.verify_error_kernels == ("dedup",)
    # a score that would hold is still not decided
    (v,) = [x for x in decide(rules, {"prediction": {"crossover_distance": 0}}) if x.rule is cross]
    assert v.holds is None and v.measured == 0
    raw = json.loads(RULES_LC.read_text())
    for change, msg in (
        ({"required": True}, "cannot be required"),
        ({"not_applicable": ""}, "non-empty reason"),
        ({"not_applicable": 3}, "non-empty reason"),
    ):
        bad = json.loads(json.dumps(raw))
        (r,) = [r for r in bad["rules"] if r["id"] == "crossover_within_one"]
        r.update(change)
        p = tmp_path / "rules.json"
        p.write_text(json.dumps(bad))
        with pytest.raises(InputError, match=msg):
            load_rules(p)
    # the two rule sets differ only where the protocol says
    wp = json.loads(RULES_WP.read_text())
    assert [(r["id"], r["op"], r["value"], r.get("of")) for r in raw["rules"]] == [
        (r["id"], r["op"], r["value"], r.get("of")) for r in wp["rules"]
    ]
    assert [r["required"] for r in raw["rules"]] == [
        r["required"] and r["id"] != "crossover_within_one" for r in wp["rules"]
    ]
