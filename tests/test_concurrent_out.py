"""Two writers to one ``--out`` folder: the second exits 2 with one line naming ``--out`` and
writes nothing (finding 11 of issue 12: two ``stats`` or two ``run`` mixed their files)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from specmoe._io import LOCK_NAME, out_lock
from specmoe.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIT = ROOT / "specmoe" / "data" / "traces" / "fit.npz"
TINY = ROOT / "specmoe" / "data" / "tiny_olmoe" / "config.json"
PROFILE = ROOT / "results" / "cpu" / "bench" / "profile.json"
PLAN = ROOT / "results" / "cpu" / "plan" / "plan.json"
ROUNDS = ROOT / "results" / "cpu" / "bundled-policy" / "rounds" / "ngram"
MEASURED = ROOT / "results" / "cpu" / "bundled"
CLI = [
    sys.executable,
    "-c",
    "import sys; from specmoe.cli import main; sys.exit(main(sys.argv[1:]))",
]

# every command that writes into an --out folder, with inputs that would otherwise succeed
WRITERS = {
    "stats": f"stats {FIT}",
    "ipf": f"ipf {FIT} --max-n 3",
    "bench": f"bench --model {TINY}",
    "plan": f"plan --model {TINY} --bandwidth {PROFILE}",
    "oracle": f"oracle --runs {ROUNDS}",
    "policy": f"policy --runs {ROUNDS}",
    "validate": f"validate --plan {PLAN} --runs {MEASURED}",
    "efficiency": f"efficiency --model {TINY.parent}",
    "run": "run --model bundled --tokens 4",
    "capture": "capture --model bundled --tokens 8",
}


def _refused(verb: str, rc: int, err: str, out: Path) -> None:
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("specmoe ")]
    assert rc == 2, err[-2000:]
    assert "Traceback" not in err
    assert lines and lines[-1].startswith(f"specmoe {verb}: error: --out: "), err[-2000:]
    assert [ln for ln in lines if ": error:" in ln] == lines[-1:]
    assert str(out) in lines[-1] and "another specmoe process" in lines[-1]
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing written


@pytest.mark.parametrize("verb", sorted(WRITERS))
def test_a_second_writer_is_refused(verb, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPECMOE_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    with out_lock(out):  # the first writer (this process holds the flock on another fd)
        rc = main([*WRITERS[verb].split(), "--out", str(out)])
        cap = capsys.readouterr()
        _refused(verb, rc, cap.err, out)
        assert cap.out == ""
    assert not out.exists()  # the first writer made it and wrote nothing: removed again


def test_two_stats_processes_one_out(tmp_path):
    """A real second process: ``specmoe stats --out X`` while another holds X."""
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from specmoe._io import out_lock\n"
            f"with out_lock({str(out)!r}):\n"
            "    print('held', flush=True)\n"
            "    sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        proc = subprocess.run(
            [*CLI, "stats", str(FIT), "--out", str(out)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert time.monotonic() - t0 < 60
        _refused("stats", proc.returncode, proc.stderr, out)
        assert proc.stdout == ""
        assert str(holder.pid) in proc.stderr  # the holder's pid is named
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    # once the first writer is gone the same command writes its results
    proc = subprocess.run(
        [*CLI, "stats", str(FIT), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "stats.json").is_file() and not (out / LOCK_NAME).exists()
