"""benchmarks/process_spread.py: its variants' parsing, its per-n summary against a direct
computation, a tiny end-to-end run (two variants alternated, huge pages reported), and its
one-line refusals of bad arguments."""

from __future__ import annotations

import json
import statistics

import pytest
from _scripts import load_script


@pytest.fixture(scope="module")
def ps():
    return load_script("process_spread", "benchmarks")


def test_variants_parse(ps):
    assert ps.variants_of("base=,thp=THP_MEM_ALLOC_ENABLE=1;A=b=c") == [
        ("base", {}),
        ("thp", {"THP_MEM_ALLOC_ENABLE": "1", "A": "b=c"}),
    ]


def test_summary_is_the_median_and_range(ps):
    runs = [{"median_ms": {"1": 10.0, "2": 20.0}}, {"median_ms": {"1": 12.0, "2": 19.0}},
            {"median_ms": {"1": 11.0, "2": 25.0}}]  # fmt: skip
    s = ps.summarize(runs, ["1", "2"])
    assert s["1"]["median"] == 11.0 and s["1"]["range_over_median"] == pytest.approx(2 / 11)
    assert s["2"]["median_ms"] == [20.0, 19.0, 25.0]
    assert s["2"]["range_over_median"] == pytest.approx(6 / statistics.median([20, 19, 25]))


def test_a_tiny_run_alternates_and_reports(ps, capsys):
    rc = ps.main(["--rows", "4096", "--cols", "512", "--n", "1,3", "--reps", "3",
                  "--processes", "2"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and set(out["results"]) == {"base", "thp"}
    for name in ("base", "thp"):
        r = out["results"][name]
        assert set(r["per_n"]) == {"1", "3"} and len(r["per_n"]["1"]["median_ms"]) == 2
        assert all(t > 0 for t in r["per_n"]["3"]["median_ms"])
    assert out["results"]["base"]["anon_huge_share"] == [0.0, 0.0]  # none asked for


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--variants", "=x"], "--variants"),
        (["--variants", "a=,a=B=1"], "--variants"),
        (["--variants", "a=NOVALUE"], "--variants"),
        (["--n", "1,0"], "--n"),
        (["--n", "one"], "--n"),
        (["--processes", "0"], "--processes"),
        (["--reps", "0"], "--reps"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(ps, argv, flag, capsys):
    rc = ps.main(argv)
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"process_spread: {flag}:"), err
    assert cap.out == ""
