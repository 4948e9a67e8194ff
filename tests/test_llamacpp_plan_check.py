"""scripts/llamacpp_plan_check.py's arithmetic: the bracketing calibration and the scoring of a
plan version, against values worked by hand (the servers themselves run in the script only)."""

from __future__ import annotations

import pytest
from _scripts import load_script


@pytest.fixture(scope="module")
def pc():
    return load_script("llamacpp_plan_check")


def _cal(plain, rnd, tok, emit, ms):
    return {
        "overhead_plain_ms": plain,
        "overhead_round_ms": rnd,
        "overhead_token_ms": tok,
        "plain_cpu_ms_per_token": ms,
        "emit": {
            "overhead_round_ms": rnd,
            "overhead_token_ms": tok,
            "overhead_emit_ms": emit,
            "residual_ms": 0.0,
        },
    }


def test_the_plans_calibration_is_the_mean_of_before_and_after(pc):
    before, after = _cal(0.4, 2.8, 0.06, 0.0, 1.18), _cal(0.2, 2.0, 0.30, 0.5, 0.96)
    c = pc._bracket(before, after)
    assert c["overhead_plain_ms"] == pytest.approx(0.3)
    assert c["overhead_round_ms"] == pytest.approx(2.4)
    assert c["overhead_token_ms"] == pytest.approx(0.18)
    assert c["plain_cpu_ms_per_token"] == pytest.approx(1.07)
    # the emitted-token time is at most the plain token's whole overhead, which holds it
    assert c["emit"]["overhead_emit_ms"] == pytest.approx(0.25)
    assert pc._bracket(_cal(0.1, 1, 0, 0.9, 1), _cal(0.1, 1, 0, 0.9, 1))["emit"][
        "overhead_emit_ms"
    ] == pytest.approx(0.1)
    assert c["before"] is before and c["after"] is after


def test_a_version_is_scored_at_its_own_speedup_and_k(pc):
    settings = {"plans": [{"acceptance": 0.9, "draft_length": 2, "speedup_by_k": [1, 1.1, 1.32]}]}
    row = pc._scored("v", settings, 0.9, 2, 1.2)
    assert row["predicted_speedup_v"] == 1.32 and row["plan_k_v"] == 2
    assert row["relative_error_v"] == pytest.approx(0.1)
    assert pc._scored("v", settings, 0.9, 2, 1.25)["within_10pct_v"] is True  # +5.6%
    assert pc._scored("v", settings, 0.9, 1, 1.05)["within_10pct_v"] is True
    assert pc._scored("v", settings, 0.9, 2, 1.0)["within_10pct_v"] is False


def test_a_lifted_target_of_fewer_layers_than_the_bundled_model_is_refused(pc, capsys):
    with pytest.raises(SystemExit) as exc:
        pc.main(["--target", "lifted", "--lifted-layers", "3"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--lifted-layers" in err and "3" in err


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--acceptance", "0.7,x"], ("--acceptance", "'x'")),
        (["--acceptance", "0.7,1.0"], ("--acceptance",)),
        (["--reps", "0"], ("--reps", "0")),
        (["--k-max", "-1"], ("--k-max", "-1")),
        (["--tokens", "0"], ("--tokens", "0")),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_built(pc, capsys, monkeypatch, argv, names):
    def built():  # the check must refuse before it needs llama.cpp at all
        raise AssertionError("reached llama.cpp")

    monkeypatch.setattr(pc.llamacpp, "require_built", built)
    with pytest.raises(SystemExit) as exc:
        pc.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert all(n in err for n in names), err
