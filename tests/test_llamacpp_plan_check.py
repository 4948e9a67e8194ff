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
        (["--last-row-only", "--rows-fit", "line"], ("--rows-fit",)),
        (["--kv-type", "f32"], ("--kv-type", "'f32'")),
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


def _bench(scale, rows=True):
    def passes(base):
        return [
            {"n": n, "min_ms": scale * base * n, "median_ms": scale * base * n + 1,
             "mean_ms": scale * base * n + 2, "samples_ms": [1.0]}
            for n in (1, 2, 3)
        ]  # fmt: skip

    data = {
        "engine": "llama.cpp",
        "verify": {"512": passes(10.0)},
        "draft": {"verify": {"512": passes(0.3)}, "verify_rebuilt": {"512": passes(0.5)}},
    }
    if rows:
        data["output_rows"] = {
            "depths": {"512": [{"n": n, "extra_ms": {"median": scale * n}} for n in (1, 2, 3)]}
        }
    return data


def test_the_bracketed_profile_is_the_mean_of_both_benches(pc):
    """Every pass statistic and every row's extra time the mean of the bench before the cells
    and the one after (worked by hand: 10 n and 30 n ms give 20 n), the inputs untouched."""
    before, after = _bench(1.0), _bench(3.0)
    m = pc._mean_profile(before, after)
    assert [r["min_ms"] for r in m["verify"]["512"]] == [20.0, 40.0, 60.0]
    assert [r["median_ms"] for r in m["verify"]["512"]] == [21.0, 41.0, 61.0]
    assert [r["mean_ms"] for r in m["draft"]["verify_rebuilt"]["512"]] == pytest.approx(
        [3.0, 4.0, 5.0]
    )
    assert [r["extra_ms"]["median"] for r in m["output_rows"]["depths"]["512"]] == [2.0, 4.0, 6.0]
    assert before["verify"]["512"][0]["min_ms"] == 10.0 and m["bracketed"] is True
    other = _bench(3.0)
    other["verify"]["512"] = other["verify"]["512"][:2]
    with pytest.raises(ValueError, match="other passes"):
        pc._mean_profile(before, other)
    assert "output_rows" not in pc._mean_profile(_bench(1.0, rows=False), _bench(3.0, rows=False))
