"""Campaign units with declared resources, here and as Ray tasks, gathered into one folder.

References: the exact bytes each unit function writes, the records the runner must leave, and
the statuses a rerun must give. The Ray tests share one local runtime of 2 CPUs per module.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import _synthetic_runs
import pytest

from specmoe.cli import main
from specmoe.distributed.campaign import (
    MANIFEST,
    RECORDS,
    Unit,
    command_unit,
    run_campaign,
)
from specmoe.errors import InputError


def verify_unit(folder: Path, *, model: str, n: int) -> dict:
    (folder / model).mkdir()
    (folder / model / f"verify-{n}.json").write_text(json.dumps({"model": model, "n": n}))
    return {"n": n, "pid": os.getpid()}


def throughput_unit(folder: Path, *, model: str) -> dict:
    (folder / model / "rounds").mkdir(parents=True)
    (folder / model / "rounds" / "part-0.bin").write_bytes(bytes(range(256)) * 3)
    return {"tokens_per_s": 12.5}


def failing_unit(folder: Path) -> None:
    raise RuntimeError("the engine would not start")


def dies_once_unit(folder: Path, *, marker: str) -> str:
    """Kills its own worker on the first try (a lost node); succeeds on the retry."""
    m = Path(marker)
    if not m.exists():
        m.write_text("died once")
        os._exit(1)
    (folder / "after-retry.txt").write_text("ok")
    return "retried"


def two_units() -> list[Unit]:
    return [
        Unit("verify-n4", verify_unit, {"model": "toy", "n": 4}, num_cpus=1),
        Unit("throughput", throughput_unit, {"model": "toy"}, num_cpus=1),
    ]


def check_two_gathered(out: Path, result) -> None:
    assert [u.status for u in result.units] == ["done", "done"]
    assert json.loads((out / "toy" / "verify-4.json").read_text()) == {"model": "toy", "n": 4}
    assert (out / "toy" / "rounds" / "part-0.bin").read_bytes() == bytes(range(256)) * 3
    assert result.units[0].result["n"] == 4
    assert result.units[1].result == {"tokens_per_s": 12.5}
    assert result.units[0].files == ["toy/verify-4.json"]
    rec = json.loads((out / RECORDS / "throughput.json").read_text())
    assert rec["status"] == "done" and rec["files"] == ["toy/rounds/part-0.bin"]
    assert rec["resources"] == {"CPU": 1.0, "GPU": 0.0}
    manifest = json.loads((out / MANIFEST).read_text())
    assert [(u["name"], u["status"]) for u in manifest["units"]] == [
        ("verify-n4", "done"),
        ("throughput", "done"),
    ]


# ------------------------------------------------------------------------------------------
# in this process


def test_local_campaign_gathers_and_a_rerun_skips_done_units(tmp_path):
    out = tmp_path / "sweep"
    result = run_campaign(two_units(), out)
    check_two_gathered(out, result)
    again = run_campaign(two_units(), out)
    assert [u.status for u in again.units] == ["skipped", "skipped"]
    assert again.units[0].result == result.units[0].result  # read back from its record


def test_a_failed_unit_is_recorded_and_rerun(tmp_path):
    units = [*two_units(), Unit("broken", failing_unit)]
    result = run_campaign(units, tmp_path)
    assert [u.status for u in result.units] == ["done", "done", "failed"]
    assert result.failed[0].error == "RuntimeError: the engine would not start"
    assert not (tmp_path / RECORDS / "broken.json").exists()
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["units"][2]["status"] == "failed"
    assert [u.status for u in run_campaign(units, tmp_path).units] == [
        "skipped",
        "skipped",
        "failed",
    ]


def test_two_units_writing_one_file_fail_the_second(tmp_path):
    units = [
        Unit("a", verify_unit, {"model": "toy", "n": 1}),
        Unit("b", verify_unit, {"model": "toy", "n": 1}),
    ]
    result = run_campaign(units, tmp_path)
    assert [u.status for u in result.units] == ["done", "failed"]
    assert result.units[1].error == "writes toy/verify-1.json, also written by unit a"


def test_unit_and_campaign_arguments_are_checked(tmp_path):
    with pytest.raises(InputError, match=r"name: '\.\./x' must be"):
        Unit("../x", verify_unit)
    with pytest.raises(InputError, match="num_gpus: unit u: must be >= 0"):
        Unit("u", verify_unit, num_gpus=-1)
    with pytest.raises(InputError, match="units: two units are named 'a'"):
        run_campaign([Unit("a", failing_unit), Unit("a", failing_unit)], tmp_path)
    with pytest.raises(InputError, match="executor: must be 'local' or 'ray'"):
        run_campaign([], tmp_path, executor="mpi")


# ------------------------------------------------------------------------------------------
# on a local Ray runtime of 2 CPUs


def test_two_task_campaign_on_ray_gathers_its_results(tmp_path, ray_runtime):
    out = tmp_path / "sweep"
    result = run_campaign(two_units(), out, executor="ray")
    check_two_gathered(out, result)
    assert result.units[0].result["pid"] != os.getpid()  # ran in a Ray worker
    assert [u.status for u in run_campaign(two_units(), out, executor="ray").units] == [
        "skipped",
        "skipped",
    ]


def test_ray_unit_beyond_the_cluster_fails_at_once_and_a_lost_worker_is_retried(
    tmp_path, ray_runtime
):
    units = [
        Unit("needs-gpu", verify_unit, {"model": "g", "n": 1}, num_gpus=1),
        Unit("too-wide", verify_unit, {"model": "w", "n": 1}, num_cpus=3),
        Unit("dies-once", dies_once_unit, {"marker": str(tmp_path / "marker")}),
        Unit("broken", failing_unit),
    ]
    result = run_campaign(units, tmp_path / "out", executor="ray")
    by = {u.name: u for u in result.units}
    assert by["needs-gpu"].error == "needs 1 GPU but the cluster has 0"
    assert by["too-wide"].error == "needs 3 CPU but the cluster has 2"
    assert by["dies-once"].status == "done" and by["dies-once"].result == "retried"
    assert (tmp_path / "out" / "after-retry.txt").read_text() == "ok"
    assert by["broken"].status == "failed"
    assert "the engine would not start" in by["broken"].error


def test_cli_campaign_of_command_units_on_ray(tmp_path, ray_runtime, capsys):
    fit = Path(__file__).resolve().parents[1] / "specmoe" / "data" / "traces" / "fit.npz"
    units = {
        "units": [
            {"name": "spec-olmoe", "argv": ["spec", "OLMoE-1B-7B-0125", "--json"]},
            {
                "name": "stats-fit",
                "argv": ["stats", str(fit), "--max-n", "3", "--json"],
                "num_cpus": 1,
            },
        ]
    }
    path = tmp_path / "units.json"
    path.write_text(json.dumps(units))
    code = main(["campaign", str(path), "--out", str(tmp_path / "out"), "--ray", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and (out["done"], out["failed"]) == (2, 0)
    spec_rec = out["units"][0]["result"]["stdout"]
    assert spec_rec["name"] == "OLMoE-1B-7B-0125"
    assert out["units"][1]["result"]["stdout"]["max_n"] == 3


def test_command_unit_runs_specmoe_and_fails_on_a_bad_command(tmp_path):
    units = [
        command_unit("ok", ["spec", "OLMoE-1B-7B-0125", "--json"]),
        command_unit("bad", ["spec", "no-such-model"]),
    ]
    result = run_campaign(units, tmp_path)
    assert result.units[0].status == "done"
    assert result.units[0].result["stdout"]["name"] == "OLMoE-1B-7B-0125"
    assert result.units[1].status == "failed"
    assert "exit 2" in result.units[1].error and "neither a preset" in result.units[1].error


def test_cli_campaign_refuses_a_bad_units_file(tmp_path, capsys):
    path = tmp_path / "units.json"
    path.write_text(json.dumps({"units": [{"name": "x", "argv": "spec"}]}))
    assert main(["campaign", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "units[0]: 'argv' must be a non-empty list of strings" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# what the campaign gathers is read by validate and report as they read any results folder


def world_unit(folder: Path) -> dict:
    """A bandwidth profile, a plan on it and measured runs (``tests/_synthetic_runs``, shipped
    to the worker by value: a test helper is not importable there)."""
    plan, runs = _synthetic_runs.world(folder)
    return {"plan": plan.relative_to(folder).as_posix(), "runs": runs.name}


def test_validate_and_report_read_a_campaign_folder_unchanged(tmp_path, ray_runtime, capsys):
    import shutil

    ray_runtime.cloudpickle.register_pickle_by_value(_synthetic_runs)
    fit = Path(__file__).resolve().parents[1] / "specmoe" / "data" / "traces" / "fit.npz"
    units = [
        Unit("world", world_unit, {}, num_cpus=1),
        command_unit("routing", ["stats", str(fit), "--max-n", "3", "--out", "{out}/routing"]),
    ]
    out = tmp_path / "campaign"
    try:
        result = run_campaign(units, out, executor="ray")
    finally:
        ray_runtime.cloudpickle.unregister_pickle_by_value(_synthetic_runs)
    assert [u.status for u in result.units] == ["done", "done"], [u.error for u in result.units]
    assert (out / MANIFEST).is_file() and (out / RECORDS / "world.json").is_file()
    plan, runs = out / result.units[0].result["plan"], out / result.units[0].result["runs"]
    # the plan names its profile by the unit's folder on the worker: relocated to the campaign's
    named = json.loads(plan.read_text())["sources"]["bandwidth"]["path"]
    assert named == str((out / "profile.json").resolve())

    def read_both() -> tuple[dict, dict]:
        vdir, page = tmp_path / "validation", tmp_path / "page" / "report.html"
        shutil.rmtree(vdir, ignore_errors=True)
        argv = ["validate", "--plan", str(plan), "--runs", str(runs), "--json"]
        assert main([*argv, "--out", str(vdir)]) == 0
        scores = json.loads(capsys.readouterr().out)
        shutil.copytree(vdir, out / "validation", dirs_exist_ok=True)
        assert main(["report", str(out), "--out", str(page), "--json"]) == 0
        return scores, json.loads(capsys.readouterr().out)["found"]

    scores, found = read_both()
    assert scores["configurations"] and "all_hold" in scores
    assert {"plan", "profile", "runs", "routing", "validation"} <= set(found), found
    # the same folder less what the campaign adds (its manifest and unit records)
    (out / MANIFEST).unlink()
    shutil.rmtree(out / RECORDS)
    shutil.rmtree(out / "validation")
    assert read_both() == (scores, found)


def test_relocate_replaces_the_unit_folder_at_a_path_boundary_only():
    from specmoe.distributed.campaign import relocate

    roots = ["/tmp/specmoe-unit-ab"]
    doc = {
        "a": "/tmp/specmoe-unit-ab/plan/plan.json",
        "b": ["/tmp/specmoe-unit-ab", "/tmp/specmoe-unit-abc/x", "x/tmp/specmoe-unit-ab/y"],
        "c": 3,
    }
    assert relocate(doc, roots, "/runs/c") == {
        "a": "/runs/c/plan/plan.json",
        "b": ["/runs/c", "/tmp/specmoe-unit-abc/x", "x/tmp/specmoe-unit-ab/y"],
        "c": 3,
    }
