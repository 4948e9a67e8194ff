"""benchmarks/llamacpp_process_spread.py: the alternation of transparent-huge-page modes
between processes, the mode written before each process and restored after (also on an
error), the per-mode summary against a direct computation, and its refusals of bad
arguments."""

from __future__ import annotations

import json

import pytest
from _scripts import load_script
from hypothesis import given
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def ps():
    return load_script("llamacpp_process_spread", "benchmarks")


def test_the_mode_is_the_bracketed_word(ps, tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert ps.thp_mode(f) == "madvise"
    f.write_text("[always] madvise never\n")
    assert ps.thp_mode(f) == "always"
    assert ps.thp_mode(tmp_path / "missing") is None


@given(p=st.integers(1, 40))
def test_two_modes_alternate_in_pairs_and_neither_always_goes_first(p):
    ps = load_script("llamacpp_process_spread", "benchmarks")
    seq = ps.order(["a", "b"], p)
    assert len(seq) == p
    assert abs(seq.count("a") - seq.count("b")) <= 1  # balanced
    pairs = [seq[i : i + 2] for i in range(0, p - 1, 2)]
    assert all(sorted(x) == ["a", "b"] for x in pairs)  # each pair has both
    if len(pairs) >= 2:
        assert pairs[0][0] != pairs[1][0]  # the first of a pair alternates
    assert ps.order(["x"], p) == ["x"] * p


def _bench_json(ms_by_n: dict[int, float]) -> str:
    rows = [
        {
            "n_prompt": n,
            "n_gen": 0,
            "n_depth": 64,
            "samples_ns": [ms * 1e6, ms * 1e6, ms * 1e6 + 1],
            "n_threads": 1,
            "flash_attn": False,
            "model_type": "tiny",
            "model_size": 1,
            "type_k": "f16",
            "type_v": "f16",
        }
        for n, ms in ms_by_n.items()
    ]
    return json.dumps(rows)


def _fake_machine(ps, tmp_path, monkeypatch):
    """A THP file found at madvise, a GGUF file and a llama-bench path, all under tmp_path."""
    thp = tmp_path / "enabled"
    thp.write_text("always [madvise] never\n")
    monkeypatch.setattr(ps, "THP", thp)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    import specmoe.engines.llamacpp as lc

    monkeypatch.setattr(lc, "tool", lambda name: tmp_path / name)
    return thp, gguf


def test_modes_are_written_before_each_process_and_restored(ps, tmp_path, monkeypatch, capsys):
    thp, gguf = _fake_machine(ps, tmp_path, monkeypatch)
    seen = []
    times = iter([1.0, 2.0, 4.0, 3.0])  # n = 1 medians of processes 0..3

    def fake(cmd, cpu=None):
        seen.append(thp.read_text().strip())
        t = next(times)
        return _bench_json({1: t, 2: 2 * t}), 2048

    monkeypatch.setattr(ps, "run_process", fake)
    assert ps.main(["--gguf", str(gguf), "--depth", "64", "--ns", "1,2", "--processes", "4",
                    "--thp-modes", "always,madvise"]) == 0  # fmt: skip
    assert seen == ["always", "madvise", "madvise", "always"]
    assert thp.read_text().strip() == "madvise"  # the mode found, back
    rec = json.loads(capsys.readouterr().out)
    a = rec["summary"]["always"]["1"]
    assert a["process_medians_ms"] == [1.0, 3.0] and a["spread"] == 3.0 and a["median_ms"] == 2.0
    m = rec["summary"]["madvise"]["2"]
    assert m["process_medians_ms"] == [4.0, 8.0] and m["spread"] == 2.0
    assert rec["processes"][0]["anon_huge_kib_max"] == 2048


def test_the_mode_found_comes_back_after_an_error(ps, tmp_path, monkeypatch):
    thp, gguf = _fake_machine(ps, tmp_path, monkeypatch)

    def boom(cmd, cpu=None):
        raise SystemExit("llamacpp_process_spread: llama-bench failed: no output")

    monkeypatch.setattr(ps, "run_process", boom)
    with pytest.raises(SystemExit):
        ps.main(["--gguf", str(gguf), "--thp-modes", "always,madvise"])
    assert thp.read_text().strip() == "madvise"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--gguf", "x.gguf", "--ns", "a"], "--ns"),
        (["--gguf", "x.gguf", "--ns", "0"], "--ns"),
        (["--gguf", "x.gguf", "--thp-modes", "sometimes"], "sometimes"),
        (["--gguf", "x.gguf", "--kv-type", "q4"], "--kv-type"),
        (["--gguf", "no-such.gguf"], "no-such.gguf"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(ps, argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    with pytest.raises(SystemExit) as exc:
        ps.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert words in err, err
