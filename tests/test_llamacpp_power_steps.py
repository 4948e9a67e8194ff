"""scripts/llamacpp_power_steps.py: the power of a throughput design under
rules-llamacpp-steps.json from a committed campaign's units (round 15 of the llama.cpp
protocol). Checked against the scorer's own statistic on the same runs, and against the
limits a noiseless and a very noisy measured side must reach."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _scripts import load_script

from specmoe.formats.runs import load_runs
from specmoe.validate.whole_pass import steps_throughput

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "results/cpu/llamacpp/whole-pass/round15-lifted"


@pytest.fixture(scope="module")
def ps():
    return load_script("llamacpp_power_steps")


def test_step_times_are_the_scorers(ps):
    """V(k) = tau_r(k + 1) + h(k) from the units equals what validate's loader and rounds side
    build from the committed throughput.json and verify.json of the same runs."""
    from specmoe.formats.runs import rounds_verify_side

    ((key, gens),) = ps.generations(RUNS).items()
    assert key == ("llamacpp-lifted", 512)
    pp, h = ps.step_times(gens)
    (m,) = load_runs(RUNS / "llamacpp-lifted")
    r = rounds_verify_side(m)
    assert pp == pytest.approx(r.per_prompt_on_ms, rel=1e-12)
    assert h == pytest.approx(m.draft_ms, rel=1e-9)


def test_power_limits(ps):
    rng = np.random.default_rng(0)
    V = np.array([24.0, 40.5, 51.4, 60.8, 70.5, 80.3, 88.0, 97.0, 104.3])
    assert ps.power(V, 0.0, 3, 200, rng) == (1.0, 1.0)  # no noise: the truth itself
    k, loss = ps.power(V, 0.5, 3, 2000, rng)  # half the step time: k* anywhere
    assert k < 0.5 and loss < 0.5
    a, b = ps.power(V, 0.05, 2, 4000, rng), ps.power(V, 0.05, 12, 4000, rng)
    assert b[0] >= a[0] and b[1] > a[1]  # more prompts, more power
    # a perfect prediction's k_hat* is the argmax of the scorer's T on the true V
    T = steps_throughput(V, ps.ACCEPTANCE)
    assert T.shape == (11, 9) and T.argmax(axis=1).tolist() == sorted(T.argmax(axis=1).tolist())


def test_bad_input_is_one_line_and_exit_2(ps, tmp_path, capsys):
    assert ps.main(["--from-runs", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no oracle units" in err[0] and str(tmp_path) in err[0]
    assert ps.main(["--from-runs", str(RUNS), "--prompts", "0,3"]) == 2
    assert "--prompts" in capsys.readouterr().err
    out = tmp_path / "out"
    assert (
        ps.main(["--from-runs", str(RUNS), "--prompts", "3", "--sims", "50", "--out", str(out)])
        == 0
    )
    assert (out / "power-steps.json").is_file() and (out / "power-steps.txt").is_file()
