"""``bench --whole-pass --processes K``: the benchmark measured in K fresh processes, the median
process's profile kept and every process's pass times recorded beside it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specmoe.commands.bench import median_process

grids = st.lists(
    st.lists(st.lists(st.floats(0.01, 100.0), min_size=3, max_size=3), min_size=2, max_size=2),
    min_size=1,
    max_size=9,
)


@settings(max_examples=200, deadline=None)
@given(grids)
def test_the_median_process_is_the_middle_one_by_its_log_time_sum(pass_ms):
    scores = [sum(math.log(v) for row in p for v in row) for p in pass_ms]
    i = median_process(pass_ms)
    below = sum(s < scores[i] for s in scores)
    above = sum(s > scores[i] for s in scores)
    ties = sum(s == scores[i] for s in scores) - 1
    k = len(scores)
    # brute force: the lower middle rank (k - 1) // 2 lies within this score's run of ties
    assert below <= (k - 1) // 2 <= below + ties
    assert above <= k - 1 - (k - 1) // 2 + ties


def test_median_process_of_three_known_runs():
    fast, mid, slow = [[1.0, 2.0]], [[2.0, 2.0]], [[3.0, 9.0]]
    assert median_process([slow, fast, mid]) == 2
    assert median_process([fast, slow]) == 0  # an even count: the lower middle one


@pytest.mark.parametrize("value", ["0", "-2", "65"])
def test_bad_processes_exit_2_with_one_line(value, capsys, tmp_path):
    from specmoe.cli import main

    out = tmp_path / "out"
    rc = main(["bench", "--whole-pass", "--model", "bundled", "--processes", value,
               "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and "--processes" in err[0]
    assert not out.exists()


def test_processes_without_whole_pass_exit_2(capsys, tmp_path):
    from specmoe.cli import main

    rc = main(["bench", "--model", "bundled", "--processes", "3", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--whole-pass" in err[0]
    assert not (tmp_path / "o").exists()


def test_two_processes_keep_one_of_their_own_profiles(tmp_path, capsys):
    pytest.importorskip("transformers")
    from specmoe.cli import main

    out = tmp_path / "wp"
    argv = ["bench", "--whole-pass", "--model", "bundled", "--depths", "8,32", "--n-max", "4"]
    argv += ["--reps", "3", "--processes", "2", "--json", "--out", str(out)]
    assert main(argv) == 0
    wp = json.loads((out / "whole_pass.json").read_text())["whole_pass"]
    proc = wp["processes"]
    assert proc["count"] == 2 and len(proc["pass_ms"]) == 2 and len(proc["model_ms"]) == 2
    assert proc["chosen"] == median_process(proc["pass_ms"])
    # the profile kept is the chosen process's own measurement, whole
    assert wp["pass_ms"] == proc["pass_ms"][proc["chosen"]]
    assert wp["model_ms"] == proc["model_ms"][proc["chosen"]]
    assert wp["d"] == [8, 32] and wp["n"] == [1, 2, 3, 4]
    printed = json.loads(capsys.readouterr().out)
    assert printed["whole_pass"]["processes"]["chosen"] == proc["chosen"]
    # every process's medians of every op are recorded, the kept one's among them
    assert set(proc["ops_median_ms"]) == set(wp["ops"]) and len(proc["layer_ms"]) == 2
    for op, per in proc["ops_median_ms"].items():
        assert np.asarray(per).shape == (2, 2, 4)
        assert per[proc["chosen"]] == wp["ops"][op]["median_ms"]
    # and refitted on the per-cell median over the processes (two: their mean)
    rc = main(["bench", "--whole-pass", "--from", str(out / "whole_pass.json"), "--fit",
               "pern-processes", "--json", "--out", str(tmp_path / "pp")])  # fmt: skip
    new = json.loads(capsys.readouterr().out)["whole_pass"]
    assert rc == 0 and new["fit_form"] == "pern-processes"
    for op, per in proc["ops_median_ms"].items():
        assert np.allclose(new["ops"][op]["median_ms"], np.mean(per, axis=0), rtol=1e-12)
        assert new["processes"]["kept_median_ms"][op] == wp["ops"][op]["median_ms"]
        assert set(new["ops"][op]["fits_n"]) == {"1", "2", "3", "4"}
