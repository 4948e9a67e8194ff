"""specmoe validate: the scoring rules on hand-made inputs with known answers, the rule set read
from its file, the --json schema and bad input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from _synthetic_runs import (
    ACC,
    TAU1,
    K,
    draft_ms,
    growth_ms,
    measured_verify_ms,
    predicted_saving_ms,
    spec,
    throughput_from_steps,
    world,
    write_plan,
    write_profile,
    write_runs,
)

from specmoe.cli import main
from specmoe.cost import theory
from specmoe.errors import InputError
from specmoe.validate.result import Validation
from specmoe.validate.rules import (
    crossover_distance,
    default_rules_path,
    kstar_scores,
    load_rules,
    saving_band_scores,
    sign_scores,
    speedup_scores,
)
from specmoe.validate.score import validate


def _rule(d, rid):
    """The verdict (of a configuration) or summary (of a validation) of rule ``rid``."""
    return next(r for r in d.rules if r.rule.id == rid)


# ------------------------------------------------------------------------------------------
# the pre-registered rule set


def test_preregistered_rules_encode_the_targets():
    rules = {r.id: r for r in load_rules().rules}
    k = rules["kstar_within_one"]
    assert (k.version, k.op, k.value, k.of, k.required) == ("prediction", ">=", 10, 11, True)
    assert (rules["verify_error_prediction"].op, rules["verify_error_prediction"].value) == (
        "<=",
        0.10,
    )
    assert rules["verify_error_calibrated"].version == "calibrated"
    assert rules["verify_error_calibrated"].value == 0.05
    assert (rules["crossover_within_one"].metric, rules["crossover_within_one"].value) == (
        "crossover_distance",
        1,
    )
    assert (rules["saving_in_band"].op, rules["saving_in_band"].value) == (">=", 1.0)
    assert all(
        r.required
        for r in rules.values()
        if r.id
        in (
            "kstar_within_one",
            "verify_error_prediction",
            "verify_error_calibrated",
            "crossover_within_one",
            "saving_in_band",
        )
    )
    raw = json.loads(default_rules_path().read_text())
    assert raw["definitions"]["pass_sizes"] == {
        "min": 2,
        "max": 9,
        "note": raw["definitions"]["pass_sizes"]["note"],
    }


def test_count_rule_is_a_share_of_the_values():
    k = next(r for r in load_rules().rules if r.id == "kstar_within_one")
    assert k.holds(10, 11) is True
    assert k.holds(9, 11) is False
    assert k.holds(11, 11) is True
    assert k.holds(9, 10) is False  # 0.90 < 10/11
    assert k.holds(10, 10) is True
    assert k.holds(None, 11) is None


# ------------------------------------------------------------------------------------------
# scores on hand-made inputs


@pytest.mark.parametrize(
    ("pred", "meas", "dist"),
    [
        (5, 7, 2),
        (3, 4, 1),
        (4, 4, 0),
        (None, 9, 1),
        (None, None, 0),
        (3, None, 7),
        (9, None, 1),
    ],
)
def test_crossover_distance_counts_none_as_n_max_plus_one(pred, meas, dist):
    assert crossover_distance(pred, meas, 9) == dist


def test_saving_exactly_at_the_band_edge_is_inside():
    # eps = 1/2: eps/(1 - eps) = 1, so the band is M_slot + M_dedup = 3 ms
    S_hat = np.array([1.0, -0.5])
    Ms, Md = np.array([2.0, 2.0]), np.array([1.0, 1.0])
    at_edge = saving_band_scores(S_hat, S_hat + np.array([3.0, -3.0]), Ms, Md, 0.5)
    assert at_edge["band_ms"] == [3.0, 3.0]
    assert at_edge["inside"] == [True, True]
    assert at_edge["saving_in_band_share"] == 1.0
    assert at_edge["implied_epsilon"] == pytest.approx(0.5)
    beyond = saving_band_scores(S_hat, S_hat + np.array([3.0 + 1e-9, 0.0]), Ms, Md, 0.5)
    assert beyond["inside"] == [False, True]
    assert beyond["saving_in_band_share"] == 0.5
    strict = saving_band_scores(S_hat, S_hat + 3.0, Ms, Md, 0.5, edge_inside=False)
    assert strict["inside"] == [False, False]


def test_kstar_nine_of_eleven_within_one():
    V = [10.0, 11.0, 12.5, 14.5, 17.0, 20.0, 23.5, 27.5, 32.0]
    k_hat = [theory.best_draft_length(V, a) for a in ACC]
    k_meas = list(k_hat)
    k_meas[0] = k_hat[0] + 2 if k_hat[0] + 2 <= 8 else k_hat[0] - 2
    k_meas[-1] = k_hat[-1] - 2 if k_hat[-1] >= 2 else k_hat[-1] + 2
    T = np.array([[100.0 - abs(k - km) for k in K] for km in k_meas])
    s = kstar_scores(V, T, ACC)
    assert s["k_hat"] == k_hat and s["k_measured"] == k_meas
    assert s["kstar_within_one"] == 9 and s["kstar_within_one_of"] == 11
    assert s["max_loss"] == pytest.approx(2 / 100)  # T = 98 at k_hat, 100 at the best


def test_kstar_exact_when_throughput_follows_the_step_times():
    V = np.array([10.0, 10.8, 11.9, 13.2, 14.8, 16.6, 18.7, 21.0, 23.6])
    s = kstar_scores(V.tolist(), throughput_from_steps(V), ACC)
    assert s["k_hat"] == s["k_measured"]
    assert s["max_loss"] == pytest.approx(0.0, abs=1e-12)


def test_speedup_bound_common_factor_and_outside():
    V = [10.0, 11.0, 12.5, 14.5, 17.0, 20.0, 23.5, 27.5, 32.0]
    # a common factor on every step time leaves every speedup unchanged: inside at delta = 0
    s = speedup_scores([2.0 * v for v in V], V, ACC, 0.0)  # exact in binary
    assert s["speedup_in_bound_share"] == 1.0
    assert s["predicted"] == pytest.approx(s["measured"])
    # V_hat(k) = V(k) (1 + 0.2) for k >= 1 only: at a = 0.98 the ratio of best speedups is
    # about 1/1.2, outside (1 - d)/(1 + d) for d = 0.05 and inside for d = 0.2
    V_hat = [V[0]] + [1.2 * v for v in V[1:]]
    tight = speedup_scores(V_hat, V, [0.98], 0.05)
    loose = speedup_scores(V_hat, V, [0.98], 0.2)
    ratio = tight["predicted"][0] / tight["measured"][0]
    assert ratio == pytest.approx(1 / 1.2)
    assert tight["inside"] == [False] and loose["inside"] == [True]


def test_sign_counts_only_intervals_that_exclude_zero():
    # n0: clearly positive; n1: clearly negative; n2: straddles 0 (not counted)
    X = np.array([[1.0, -1.0, 0.5], [1.1, -0.9, -0.5], [0.9, -1.1, 0.4], [1.0, -1.0, -0.4]])
    ok = sign_scores(np.array([0.3, -0.2, -9.0]), X, resamples=500)
    assert ok["counted"] == [True, True, False]
    assert ok["sign_agreement_share"] == 1.0
    bad = sign_scores(np.array([0.3, 0.2, 9.0]), X, resamples=500)
    assert bad["sign_agreement_share"] == 0.5
    assert sign_scores(np.zeros(3), None)["sign_agreement_share"] is None


# ------------------------------------------------------------------------------------------
# end to end on the synthetic world


def test_validate_known_answers(tmp_path):
    plan, runs = world(tmp_path)
    d = validate(plan, runs)
    (c,) = d.configurations
    _, on = measured_verify_ms()
    g = growth_ms()
    # the prediction misses exactly the growth outside the expert operation
    want = float(np.max(g[1:] / on[1:]))
    assert c.versions["prediction"].verify_error == pytest.approx(want, rel=1e-12)
    assert c.versions["calibrated"].verify_error == pytest.approx(0.0, abs=1e-12)
    assert c.prediction.saving_ms == pytest.approx(predicted_saving_ms())
    assert c.prediction.verify_ms.per_slot[0] == pytest.approx(TAU1)
    assert c.crossover_predicted == 3 and c.crossover_measured == 3
    assert c.saving_in_band_share == 1.0
    assert c.kstar_within_one == 11
    assert d.all_hold is True
    assert all(r.holds is True for r in c.rules)


def test_calibrated_version_reproduces_the_dedup_off_time(tmp_path):
    prof = write_profile(tmp_path / "profile.json", measured_scale=1.1)
    plan = write_plan(tmp_path / "plan.json", prof)
    runs = write_runs(tmp_path / "runs")
    (c,) = validate(plan, runs).configurations
    off, _ = measured_verify_ms()
    assert c.versions["calibrated"].verify_ms.per_slot == pytest.approx(off)
    mt = c.versions["measured_time"].verify_ms.per_slot
    assert mt[1] - mt[0] == pytest.approx(4 * 0.05 * 1.1)


def test_nine_of_eleven_fails_the_kstar_rule(tmp_path):
    off, on = measured_verify_ms()
    h = draft_ms()
    V_hat = measured_verify_ms(growth=np.zeros(9))[1] + h  # the prediction's step times
    k_hat = [theory.best_draft_length(V_hat.tolist(), a) for a in ACC]
    k_meas = list(k_hat)
    for i in (0, 5):
        k_meas[i] = k_hat[i] + 2 if k_hat[i] <= 6 else k_hat[i] - 2
    T = np.array([[100.0 - abs(k - km) for k in K] for km in k_meas])
    plan, runs = world(tmp_path, off=off, on=on, throughput=T)
    d = validate(plan, runs)
    (c,) = d.configurations
    assert c.kstar_within_one == 9
    assert _rule(c, "kstar_within_one").holds is False
    assert _rule(d, "kstar_within_one").holds is False
    assert d.all_hold is False
    # one more value within one: 10 of 11 holds
    k_meas[5] = k_hat[5]
    T = np.array([[100.0 - abs(k - km) for k in K] for km in k_meas])
    write_runs(tmp_path / "runs", off=off, on=on, throughput=T)
    assert _rule(validate(plan, runs), "kstar_within_one").holds is True


def test_crossover_off_by_two_fails_off_by_one_holds(tmp_path):
    shift = np.zeros(9)
    shift[2:4] = 0.2  # measured S(3), S(4) < 0: measured crossover 5, predicted 3
    off, on = measured_verify_ms(saving_shift=shift)
    plan, runs = world(tmp_path, off=off, on=on)
    (c,) = validate(plan, runs).configurations
    assert (c.crossover_predicted, c.crossover_measured) == (3, 5)
    assert _rule(c, "crossover_within_one").holds is False
    assert _rule(c, "crossover_within_one").measured == 2
    shift[3] = 0.0  # measured crossover 4
    off, on = measured_verify_ms(saving_shift=shift)
    write_runs(tmp_path / "runs", off=off, on=on)
    (c,) = validate(plan, runs).configurations
    assert c.crossover_measured == 4
    assert _rule(c, "crossover_within_one").holds is True


def test_band_share_counts_points_outside(tmp_path):
    shift = np.zeros(9)
    shift[8] = 1.0  # the measured saving at n = 9 is 1 ms lower: outside the band
    off, on = measured_verify_ms(saving_shift=shift)
    plan, runs = world(tmp_path, off=off, on=on)
    (c,) = validate(plan, runs).configurations
    assert c.prediction.inside_band == (True,) * 7 + (False,)
    assert c.saving_in_band_share == pytest.approx(7 / 8)
    assert _rule(c, "saving_in_band").holds is False


def test_a_modified_rules_file_changes_the_verdict(tmp_path):
    plan, runs = world(tmp_path)
    assert validate(plan, runs).all_hold is True
    raw = json.loads(default_rules_path().read_text())
    for r in raw["rules"]:
        if r["id"] == "verify_error_prediction":
            r["value"] = 0.05  # the synthetic prediction misses by 6.9%
    path = tmp_path / "stricter.json"
    path.write_text(json.dumps(raw))
    d = validate(plan, runs, rules_path=str(path))
    assert _rule(d, "verify_error_prediction").holds is False
    assert d.all_hold is False
    assert d.rules_file.sha256 != validate(plan, runs).rules_file.sha256


def test_two_depths_are_two_configurations(tmp_path):
    plan, runs = world(tmp_path, depths=(512, 4096))
    d = validate(plan, runs)
    assert [c.depth for c in d.configurations] == [512, 4096]
    assert all(r.configurations == 2 for r in d.rules)


# ------------------------------------------------------------------------------------------
# the command


def test_cli_json_schema(tmp_path, capsys):
    plan, runs = world(tmp_path)
    rc = main(
        [
            "validate",
            "--plan",
            str(plan),
            "--runs",
            str(runs),
            "--json",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0
    d = json.loads(captured.out)  # stdout holds the JSON and nothing else
    assert {"configurations", "all_hold", "rules", "rules_file"} <= set(d)
    (c,) = d["configurations"]
    for key in (
        "name",
        "acceptance_values",
        "kstar_within_one",
        "max_loss",
        "verify_error",
        "crossover_predicted",
        "crossover_measured",
        "rules",
        "all_hold",
    ):
        assert key in c
    assert set(c["verify_error"]) == {"prediction", "measured_time", "calibrated"}
    assert len(c["acceptance_values"]) == 11
    assert all(isinstance(r["holds"], bool) for r in c["rules"])
    for name in (
        "validation.json",
        "validate_saving.png",
        "validate_kstar.png",
        "validate_verify.png",
    ):
        assert (tmp_path / "out" / name).is_file()
    assert json.loads((tmp_path / "out" / "validation.json").read_text()) == d


def _bad(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err[-1] if err else ""


def test_bad_input_is_one_line_exit_2(tmp_path, capsys):
    plan, runs = world(tmp_path)
    rc, msg = _bad(capsys, ["validate", "--plan", str(tmp_path / "nope.json"), "--runs", str(runs)])
    assert rc == 2 and msg.startswith("specmoe validate: error: --plan: ") and "no such plan" in msg
    with pytest.raises(InputError) as exc:  # the library names its own argument
        validate(tmp_path / "nope.json", runs)
    assert exc.value.argument == "plan_path" and "--" not in str(exc.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, msg = _bad(capsys, ["validate", "--plan", str(plan), "--runs", str(empty)])
    assert rc == 2 and "verify.json" in msg
    other = write_plan(
        tmp_path / "other" / "plan.json",
        tmp_path / "profile.json",
        model=spec().__class__(
            name="other-moe",
            num_experts=8,
            top_k=2,
            num_moe_layers=4,
            hidden_size=64,
            expert_intermediate=32,
        ),
    )
    rc, msg = _bad(capsys, ["validate", "--plan", str(other), "--runs", str(runs)])
    assert rc == 2 and "other-moe" in msg and "tiny-moe" in msg
    assert msg.startswith("specmoe validate: error: --plan: ")
    (tmp_path / "rules.json").write_text('{"schema": "nope"}')
    rc, msg = _bad(
        capsys,
        [
            "validate",
            "--plan",
            str(plan),
            "--runs",
            str(runs),
            "--rules",
            str(tmp_path / "rules.json"),
        ],
    )
    assert rc == 2 and msg.startswith("specmoe validate: error: --rules: ")
    assert "not a rule set" in msg
    with pytest.raises(InputError) as exc:
        load_rules(tmp_path / "rules.json")
    assert exc.value.argument == "path" and "--" not in str(exc.value)
    with pytest.raises(InputError) as exc:
        validate(plan, runs, rules_path=str(tmp_path / "rules.json"))
    assert exc.value.argument == "rules_path"


def test_runs_shape_errors_name_the_file(tmp_path):
    plan, runs = world(tmp_path)
    d = json.loads((runs / "throughput.json").read_text())
    d["configurations"][0]["tokens_per_s"] = [[1.0, 2.0]]
    (runs / "throughput.json").write_text(json.dumps(d))
    with pytest.raises(InputError, match=r"throughput\.json.*tokens_per_s"):
        validate(plan, runs)


def test_model_labels_of_the_runs_match_the_plan():
    from specmoe.spec import get_preset
    from specmoe.validate.score import _same_model

    cut = get_preset("OLMoE-1B-7B-0125").with_layers(4)
    assert _same_model(cut, "OLMoE-1B-7B-0125-dummy-4L")
    assert not _same_model(cut, "OLMoE-1B-7B-0125-dummy-16L")
    assert not _same_model(cut, "Qwen3-30B-A3B")
    local = dataclasses.replace(
        spec(), name="olmoe", source="models/tiny_olmoe/config.json", num_hidden_layers=4
    )
    assert _same_model(local, "tiny_olmoe")
    assert not _same_model(local, "OLMoE-1B-7B-0125-dummy-4L")


def test_a_folder_of_model_folders_scores_the_plans_model_only(tmp_path):
    plan, _ = world(tmp_path)
    top = tmp_path / "campaign"
    write_runs(top / "tiny", model="tiny-moe", depths=(512, 2048))
    write_runs(top / "other", model="other-moe")
    d = validate(plan, top)
    assert [c.depth for c in d.configurations] == [512, 2048]
    assert {c.model for c in d.configurations} == {"tiny-moe"}
    with pytest.raises(InputError, match="other-moe"):
        validate(plan, top / "other")


# ------------------------------------------------------------------------------------------
# the result: frozen dataclasses, validation.json at the edge

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = [
    ("results/cpu/plan/plan.json", "results/cpu", "results/cpu/validation"),
    (
        "results/cpu/plan-olmoe-dummy-4L",
        "results/cpu/olmoe-dummy-4L",
        "results/cpu/validation-olmoe-dummy-4L",
    ),
]


def _same_json(got, want, where="") -> None:
    """Same keys in the same order, same lists, same ints, strings and flags; floats to 1e-12."""
    assert type(got) is type(want) or {type(got), type(want)} == {int, float}, where
    if isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            _same_json(got[k], want[k], f"{where}/{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            _same_json(a, b, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(want, bool):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15), where
    else:
        assert got == want, where


@pytest.mark.parametrize(("plan", "runs", "out"), CAMPAIGN)
def test_to_dict_recomputes_the_committed_validation(plan, runs, out, monkeypatch):
    monkeypatch.chdir(ROOT)
    committed = json.loads((ROOT / out / "validation.json").read_text())
    got = validate(plan, runs).to_dict()
    assert json.loads(json.dumps(got)) == got  # plain JSON types only
    # the campaign was scored with the same rules under their earlier file name
    assert list(got["rules_file"]) == list(committed["rules_file"])
    got["rules_file"] = committed["rules_file"]
    _same_json(got, committed)


@pytest.mark.parametrize("out", [c[2] for c in CAMPAIGN])
def test_from_dict_round_trips_the_committed_validation(out):
    committed = json.loads((ROOT / out / "validation.json").read_text())
    v = Validation.from_dict(committed)
    assert v.to_dict() == committed
    assert list(v.to_dict()) == list(committed)
    assert Validation.from_dict(v.to_dict()) == v
    c = v.configurations[0]
    # the repeated headline values are the prediction's, computed from its fields
    assert c.kstar_within_one == c.versions["prediction"].kstar_within_one
    assert c.by_version("delta") == committed["configurations"][0]["delta"]


def test_a_validation_is_frozen(tmp_path):
    plan, runs = world(tmp_path)
    v = validate(plan, runs)
    (c,) = v.configurations
    for obj, name in (
        (v, "epsilon"),
        (v, "configurations"),
        (c, "versions"),
        (c.measured, "saving_ms"),
        (c.prediction, "verify_error"),
        (c.prediction.verify_ms, "dedup"),
        (c.rules[0], "holds"),
        (v.rules[0], "per_configuration"),
    ):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, None)
    assert isinstance(c.prediction.saving_ms, tuple)
    assert Validation.from_dict(json.loads(json.dumps(v.to_dict()))) == v


def test_from_dict_of_a_foreign_file_is_one_input_error():
    with pytest.raises(InputError, match="schema") as exc:
        Validation.from_dict({"schema": "specmoe.plan/1"}, where="path")
    assert exc.value.argument == "path"
    d = json.loads((ROOT / CAMPAIGN[0][2] / "validation.json").read_text())
    del d["configurations"][0]["measured"]
    with pytest.raises(InputError, match="'measured'"):
        Validation.from_dict(d)


def test_figures_from_the_validation_or_its_json(tmp_path):
    from specmoe.report.validate_figures import write_validation_figures

    d = json.loads((ROOT / CAMPAIGN[0][2] / "validation.json").read_text())
    a = write_validation_figures(d, tmp_path / "a")
    b = write_validation_figures(Validation.from_dict(d), tmp_path / "b")
    assert (
        [p.name for p in a]
        == [p.name for p in b]
        == [
            "validate_saving.png",
            "validate_kstar.png",
            "validate_verify.png",
        ]
    )
    assert all(p.read_bytes() == q.read_bytes() for p, q in zip(a, b))


def test_the_preregistered_rule_file_is_the_one_the_committed_scores_used():
    """The rule set is never edited in place: its bytes hash to the sha256 that the committed
    validations of results/cpu recorded when they were scored."""
    import hashlib
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256((root / "specmoe" / "validate" / "rules.json").read_bytes()).hexdigest()
    for name in ("validation", "validation-olmoe-dummy-4L"):
        recorded = json.loads((root / "results" / "cpu" / name / "validation.json").read_text())
        assert recorded["rules_file"]["sha256"] == digest, name
