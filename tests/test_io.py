"""specmoe._io: the atomic writer syncs before it renames; out_lock keeps a second writer out."""

import os
import signal
import subprocess
import sys
import time

import pytest

from specmoe import _io
from specmoe.errors import InputError


def test_atomic_write_fsyncs_the_file_before_the_rename(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append(("fsync", os.path.realpath(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        calls.append(("replace", os.fspath(src)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "a.json"
    _io.atomic_write_text(target, "{}\n")
    assert target.read_text() == "{}\n"
    kinds = [c[0] for c in calls]
    assert "replace" in kinds
    i = kinds.index("replace")
    tmp = calls[i][1]
    # the temporary file itself was synced before it took the target's name
    assert ("fsync", os.path.realpath(tmp)) in calls[:i]
    # and the folder after it (the rename is durable too)
    assert ("fsync", os.path.realpath(tmp_path)) in calls[i + 1 :]


def test_out_lock_refuses_a_second_writer_and_is_released(tmp_path):
    out = tmp_path / "out"
    with _io.out_lock(out):
        assert out.is_dir()
        with pytest.raises(InputError) as e, _io.out_lock(out):
            pass
        assert e.value.argument == "out"
        msg = str(e.value)
        assert "\n" not in msg and str(out) in msg and str(os.getpid()) in msg
        (out / "kept.txt").write_text("x")
    with _io.out_lock(out):  # released on exit
        pass
    assert sorted(p.name for p in out.iterdir()) == ["kept.txt"]  # no lock file left behind


def test_out_lock_removes_a_folder_it_made_and_left_empty(tmp_path):
    out = tmp_path / "new" / "out"
    with _io.out_lock(out, argument="dest"):
        pass
    assert not out.exists()


def test_out_lock_of_a_killed_owner_is_free(tmp_path):
    out = tmp_path / "out"
    code = (
        "import sys, time; from specmoe._io import out_lock\n"
        "with out_lock(sys.argv[1]):\n"
        "    print('locked', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"locked"
        with pytest.raises(InputError, match=str(proc.pid)), _io.out_lock(out):
            pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 5
    while True:  # a dead owner's lock is stale: the next writer takes it
        try:
            with _io.out_lock(out):
                break
        except InputError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
