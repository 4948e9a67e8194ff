"""``specmoe run`` resumes: an interrupted run (SIGINT, SIGKILL, an exception at a random round)
rerun with the same command gives the round log of an uninterrupted run, row for row; a folder
holding another run's work is refused; a second writer is refused."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

from specmoe.cli import main
from specmoe.errors import InputError
from specmoe.formats.roundlog import RoundLogWriter, read_round_log

ROOT = Path(__file__).resolve().parents[1]
BASE = [
    "--model",
    "bundled",
    "--drafter",
    "ngram",
    "--k",
    "0..2",
    "--tokens",
    "24",
    "--context",
    "64",
    "--num-prompts",
    "2",
    "--threads",
    "1",
    "--quiet",
]
GENERATIONS = 3 * 2  # k x prompts
# the columns a rerun reproduces exactly (not the timing columns)
SCALARS = (
    "run_id",
    "prompt_id",
    "generation_id",
    "round",
    "k",
    "budget",
    "pass_size",
    "accepted",
    "emitted",
    "context_len",
    "u_mean",
    "e_max",
    "kernel",
    "drafter",
    "acceptance",
    "num_layers",
    "top_k",
    "num_experts",
)
LISTS = ("routing", "draft_tokens", "target_tokens")


@pytest.fixture(autouse=True)
def _threads():
    import torch

    from specmoe.kernels import cpu

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
    cpu.set_num_threads(None)


def _run(out, *extra, capsys=None):
    """Exit status and stderr (less transformers' weight-loading bar, which --quiet leaves)."""
    rc = main(["run", *BASE, "--out", str(out), *extra])
    err = capsys.readouterr().err if capsys is not None else ""
    return rc, "\n".join(ln for ln in err.splitlines() if "Loading weights" not in ln)


def _same_rows(a, b):
    a, b = read_round_log(a), read_round_log(b)
    assert len(a) == len(b)
    for c in SCALARS:
        x, y = a[c], b[c]
        if x.dtype == object:
            assert list(x) == list(y), c
        else:
            np.testing.assert_array_equal(x, y, err_msg=c)
    for c in LISTS:
        np.testing.assert_array_equal(a.lists[c][0], b.lists[c][0], err_msg=c)
        np.testing.assert_array_equal(a.lists[c][1], b.lists[c][1], err_msg=c)


def _whole(out, tokens=24):
    """Every generation of the log is whole: its rounds emit exactly ``tokens`` tokens."""
    if not (out / "rounds").exists() or not list((out / "rounds").rglob("*.parquet")):
        return 0
    try:
        log = read_round_log(out / "rounds")
    except InputError as exc:
        assert "empty round log" in str(exc)
        return 0
    gens = np.unique(log["generation_id"])
    for g in gens:
        assert log["emitted"][log["generation_id"] == g].sum() == tokens, g
    return len(gens)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "out"
    assert main(["run", *BASE, "--out", str(out)]) == 0
    return out


def test_a_rerun_of_a_finished_run_does_nothing(reference, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    summary = out / "summary.json"
    summary.write_text(summary.read_text().replace(str(reference), str(out)))  # the copy's own
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    rc, _ = _run(out, capsys=capsys)
    assert rc == 0
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # no generation redone, summary.json unchanged byte for byte


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_interruption_at_a_random_round_then_a_rerun_equals_a_clean_run(
    reference, tmp_path, monkeypatch, seed
):
    total = len(read_round_log(reference / "rounds"))
    stop_at = int(np.random.default_rng(seed).integers(1, total))
    out = tmp_path / "out"
    real = RoundLogWriter.append
    count = {"n": 0}

    def append(self, **row):
        count["n"] += 1
        if count["n"] == stop_at:
            raise KeyboardInterrupt
        return real(self, **row)

    monkeypatch.setattr(RoundLogWriter, "append", append)
    assert main(["run", *BASE, "--out", str(out)]) == 130
    done = _whole(out)  # no unfinished generation is read as finished
    assert done < GENERATIONS
    monkeypatch.setattr(RoundLogWriter, "append", real)
    assert main(["run", *BASE, "--out", str(out)]) == 0
    _same_rows(out / "rounds", reference / "rounds")
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["generations"]) == GENERATIONS


def _cli_cmd(out, *extra):
    return [sys.executable, "-m", "specmoe.cli", "run", *BASE, "--out", str(out), *extra]


def _interrupt(out, sig, delay, *, mid_decode=False):
    """Start the run, wait until it decodes (its lock is taken), then ``sig`` after ``delay``.
    ``mid_decode``: wait instead for its first finished generation, so that the signal falls
    between generations on a machine of any speed (the whole run takes well under a second on
    a fast core)."""
    proc = subprocess.Popen(
        _cli_cmd(out),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        # a test worker may ignore SIGINT, and a child inherits that: Python then installs no
        # KeyboardInterrupt handler, and the run never sees the signal
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60

    def started() -> bool:
        if not mid_decode:
            return (out / "run.json").exists()
        return (
            any((out / "rounds").glob("*/part-*.parquet")) if (out / "rounds").exists() else False
        )

    while not started():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    time.sleep(delay)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    return proc.returncode


def _signal_then_rerun(reference, tmp_path, sig, delay, *, mid_decode=False):
    out = tmp_path / f"out-{sig}-{delay:.3f}"
    rc = _interrupt(out, sig, delay, mid_decode=mid_decode)
    # -SIGINT: the signal came after the run, at the interpreter's exit
    assert rc in (0, 130, -signal.SIGINT, -signal.SIGKILL), rc
    done = _whole(out)  # no unfinished generation reads as finished
    assert main(["run", *BASE, "--out", str(out)]) == 0  # the same command again
    _same_rows(out / "rounds", reference / "rounds")
    return rc, done


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_a_signal_then_a_rerun_equals_a_clean_run(reference, tmp_path, sig):
    delay = float(np.random.default_rng(int(sig)).uniform(0.0, 0.02))
    rc, done = _signal_then_rerun(reference, tmp_path, sig, delay, mid_decode=True)
    assert rc != 0 and done < GENERATIONS  # it was interrupted while decoding


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
@pytest.mark.parametrize("seed", range(4))
def test_signals_at_many_points_then_a_rerun_equals_a_clean_run(reference, tmp_path, sig, seed):
    delay = float(np.random.default_rng(100 * seed + int(sig)).uniform(0.0, 1.5))
    _signal_then_rerun(reference, tmp_path, sig, delay)


def test_a_second_writer_on_one_out_exits_2_and_the_first_finishes(reference, tmp_path, capsys):
    out = tmp_path / "out"
    first = subprocess.Popen(
        _cli_cmd(out, "--tokens", "64"), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while not (out / "run.json").exists():
        assert first.poll() is None, first.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    rc, err = _run(out, "--tokens", "64", capsys=capsys)
    assert first.poll() is None  # the first was still running when the second was refused
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--out" in lines[0] and str(first.pid) in lines[0]
    assert first.wait(timeout=120) == 0, first.stderr.read().decode()
    assert _whole(out, tokens=64) == GENERATIONS


def test_a_doubled_log_is_refused_by_the_reader_and_the_oracle(reference, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    part = sorted((out / "rounds").rglob("part-*.parquet"))[0]
    copy = part.with_name("part-000099.parquet")
    shutil.copy(part, copy)
    with pytest.raises(InputError) as e:
        read_round_log(out / "rounds")
    assert copy.name in str(e.value) and "round" in str(e.value)
    assert main(["oracle", "--runs", str(out / "rounds")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    lines = [ln for ln in err if not ln.startswith("reading ")]  # the progress line
    assert len(lines) == 1 and copy.name in lines[0] and "duplicate" in lines[0], err


def test_acceptance_0_8_and_0_8004_are_two_units(tmp_path):
    out = tmp_path / "out"
    args = ["run", "--model", "bundled", "--drafter", "oracle", "--k", "1", "--tokens", "8"]
    args += ["--context", "32", "--num-prompts", "1", "--quiet", "--out", str(out)]
    assert main([*args, "--acceptance", "0.8,0.8004"]) == 0
    runs = sorted(p.name for p in (out / "rounds").iterdir())
    assert len(runs) == 2, runs
    log = read_round_log(out / "rounds")
    assert sorted(set(log["acceptance"])) == [0.8, 0.8004]
    assert len(set(log["generation_id"])) == 2


def test_a_folder_of_another_run_is_refused_unless_resume_or_overwrite(reference, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    kept = {p: p.read_bytes() for p in (out / "rounds").rglob("*.parquet")}
    for extra in (["--k", "0..1"], ["--tokens", "16"], ["--repeats", "2"]):
        # refused before the model loads: one line on stderr, no weight-loading bar
        assert main(["run", *BASE, "--out", str(out), *extra]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    for extra, flag in (
        (["--tokens", "16"], "--tokens"),
        (["--seed", "3"], "--seed"),
        (["--num-prompts", "1", "--prompt-offset", "1"], "prompts"),
        (["--k", "0..3"], "--k"),
    ):
        rc, err = _run(out, *extra, capsys=capsys)
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1, err
        assert "--out" in lines[0] and flag in lines[0] and "--overwrite" in lines[0], lines[0]
    assert {p: p.read_bytes() for p in (out / "rounds").rglob("*.parquet")} == kept
    # --resume with a wider grid keeps every finished generation and adds the new ones
    rc, _ = _run(out, "--k", "0..3", "--resume", capsys=capsys)
    assert rc == 0
    assert all(p.read_bytes() == b for p, b in kept.items())
    log = read_round_log(out / "rounds")
    assert sorted(set(log["k"])) == [0, 1, 2, 3]
    # --resume does not mix results of other options: --tokens differs, so still refused
    rc, err = _run(out, "--tokens", "16", "--resume", capsys=capsys)
    assert rc == 2 and "--tokens" in err and "--overwrite" in err
    # --overwrite starts the folder anew
    rc, _ = _run(out, "--tokens", "16", "--overwrite", capsys=capsys)
    assert rc == 0
    assert _whole(out, tokens=16) == GENERATIONS
    assert len(json.loads((out / "summary.json").read_text())["generations"]) == GENERATIONS


def test_a_folder_with_a_round_log_and_no_manifest_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "rounds" / "x").mkdir(parents=True)
    (out / "rounds" / "x" / "part-000000.parquet").write_bytes(b"someone else's")
    rc, err = _run(out, capsys=capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--out" in err
    assert (out / "rounds" / "x" / "part-000000.parquet").read_bytes() == b"someone else's"


def test_run_help_documents_resume_and_overwrite(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--resume" in text and "--overwrite" in text and "skips finished" in text


def test_the_committed_round_logs_still_load():
    root = ROOT / "results" / "cpu" / "bundled-policy" / "rounds"
    if not root.exists():
        pytest.skip("no committed runs")
    run = sorted(p.parent for p in root.rglob("part-*.parquet"))[0]
    log = read_round_log(run)
    assert len(log) > 0 and set(np.unique(log["round"])) >= {0}
    assert os.path.basename(str(run)).startswith("model=")
