"""``specmoe plan --acceptance-from FILE``: the engine settings at the acceptance an engine
measured (the estimate of ``specmoe.formats.acceptance.load_acceptance``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from specmoe.cli import main
from specmoe.formats.acceptance import load_acceptance

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "results" / "cpu" / "bench" / "profile.json"
MODEL = ROOT / "specmoe" / "data" / "tiny_olmoe"


def _engines_fixtures():
    spec = importlib.util.spec_from_file_location(
        "acceptance_engines_fixtures", ROOT / "tests" / "test_acceptance_engines.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _plan(tmp_path, name, *extra):
    out = tmp_path / name
    argv = ["plan", "--model", str(MODEL), "--bandwidth", str(PROFILE), "--out", str(out)]
    assert main([*argv, *extra]) == 0
    return json.loads((out / "plan.json").read_text())


@pytest.mark.skipif(not PROFILE.is_file(), reason="results/cpu/bench/profile.json not present")
def test_plan_at_the_measured_acceptance_equals_the_plan_at_that_value(tmp_path):
    fx = _engines_fixtures()
    k = 4
    d, j = fx.steps_of(7, 0.55, k, 200)
    src = tmp_path / "vllm.json"  # a vLLM 0.33.0 chat response with detailed metrics
    src.write_text(
        json.dumps(fx.vllm_chat_response("r", fx.vllm_spec_metrics(k, d, j, detailed=True)))
    )
    est = load_acceptance(src)
    # the per-step maximum-likelihood rate, S / (S + F), counted here by brute force
    accepted = sum(j)
    rejections = sum(1 for dd, jj in zip(d, j) if jj < dd)
    assert est.rate == pytest.approx(accepted / (accepted + rejections), rel=1e-12)
    a = _plan(tmp_path, "from", "--acceptance-from", str(src))
    b = _plan(tmp_path, "at", "--expected-acceptance", repr(est.rate))
    assert a["engine"]["expected_acceptance"] == pytest.approx(est.rate, rel=1e-12)
    assert a["engine"]["settings"] == b["engine"]["settings"]
    assert any("measured in" in n for n in a["notes"])


def test_a_bad_acceptance_file_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "m.txt"
    bad.write_text("this is not an engine's metrics\n")
    rc = main(["plan", "--acceptance-from", str(bad), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "--acceptance-from" in err and str(bad) in err
    assert not (tmp_path / "o").exists()
