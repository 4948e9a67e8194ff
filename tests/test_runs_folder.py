"""The runs folder reader (specmoe.formats.runs) and the JSON reader it uses: an error in the
folder names the argument ``runs``, which ``specmoe validate`` shows as ``--runs``; an error
inside a file names the file."""

from __future__ import annotations

import json

import pytest
from _synthetic_runs import world

from specmoe._io import read_json
from specmoe.cli import main
from specmoe.errors import InputError
from specmoe.formats.runs import VERIFY_FILE, load_runs


def test_folder_errors_name_the_argument(tmp_path):
    _, runs = world(tmp_path)
    assert load_runs(runs) and load_runs(runs=runs)
    (tmp_path / "empty").mkdir()
    for folder, needle in ((tmp_path / "void", "no such folder"), (tmp_path / "empty", "has no")):
        with pytest.raises(InputError) as ei:
            load_runs(folder)
        msg = str(ei.value)
        assert ei.value.argument == "runs" and msg.startswith(f"runs: {folder}: "), msg
        assert needle in msg and "--" not in msg


def test_an_error_inside_a_file_names_the_file(tmp_path):
    _, runs = world(tmp_path)
    verify = runs / VERIFY_FILE
    d = json.loads(verify.read_text())
    d["configurations"][0]["n"] = [2, 3]
    verify.write_text(json.dumps(d))
    with pytest.raises(InputError) as ei:
        load_runs(runs)
    assert ei.value.argument is None and str(ei.value).startswith(f"{verify}: n must be")


def test_validate_shows_the_runs_flag(tmp_path, capsys):
    plan, _ = world(tmp_path)
    (tmp_path / "empty").mkdir()
    assert main(["validate", "--plan", str(plan), "--runs", str(tmp_path / "empty")]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert cap.out == "" and len(err) == 1, cap.err
    assert err[0].startswith(f"specmoe validate: error: --runs: {tmp_path / 'empty'}: has no")


def test_read_json_carries_the_callers_argument(tmp_path):
    (tmp_path / "bad.json").write_text("{")
    for path, needle in ((tmp_path / "none.json", "no such plan"), (tmp_path / "bad.json", "not")):
        with pytest.raises(InputError) as ei:
            read_json(path, "plan", argument="plan")
        assert ei.value.argument == "plan"
        assert str(ei.value).startswith(f"plan: {path}: {needle}"), str(ei.value)
        with pytest.raises(InputError) as ei:
            read_json(path, "plan")
        assert ei.value.argument is None and str(ei.value).startswith(f"{path}: ")
