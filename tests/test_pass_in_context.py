"""benchmarks/pass_in_context.py: on the bundled model, the back-to-back passes and the
benchmark's own pass at every n, and its one-line refusals of bad arguments."""

from __future__ import annotations

import json

import pytest
from _scripts import load_script


@pytest.fixture(scope="module")
def pc():
    return load_script("pass_in_context", "benchmarks")


def test_it_times_the_pass_before_in_and_after_the_benchmark(pc, capsys):
    rc = pc.main(["--model", "bundled", "--n", "1,2,3,4,5", "--reps", "3", "--bench-reps", "3"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["kernel"] == "per_slot" and out["n"] == [1, 2, 3, 4, 5]
    for key in ("back_to_back_before_ms", "bench_pass_ms", "bench_model_ms",
                "back_to_back_after_ms"):  # fmt: skip
        assert set(out[key]) == {"1", "2", "3", "4", "5"}
        assert all(0 < v < 1e4 for v in out[key].values())
    # the engine pass holds the model forward: at every n the pass is not far below it
    for n in out["bench_pass_ms"]:
        assert out["bench_pass_ms"][n] > 0.5 * out["bench_model_ms"][n]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--n", "1,2,3"], "--n"),
        (["--n", "1,x,3,4,5"], "--n"),
        (["--depth", "0"], "--depth"),
        (["--reps", "0"], "--reps"),
        (["--model", "no-such-model-dir"], "--model"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(pc, argv, flag, capsys):
    rc = pc.main(argv)
    cap = capsys.readouterr()
    err = [ln for ln in cap.err.strip().splitlines() if ln.startswith("pass_in_context")]
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"pass_in_context: {flag}:"), cap.err
    assert cap.out == ""
