"""``specmoe plan --acceptance-from FILE`` when no step rejected a draft: the measured rate is 1
(every drafted token accepted, as n-gram drafts on repetitive text often are), which the theory's
a < 1 excludes; the plan is made at the largest acceptance below 1 and says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specmoe.cli import main

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "results" / "cpu" / "bench" / "profile.json"
MODEL = ROOT / "specmoe" / "data" / "tiny_olmoe"


def _vllm_all_accepted(k: int, steps: int) -> dict:
    """A /v1/completions body whose ``metrics.speculative_decoding`` is vLLM 0.32's
    ``RequestSpecDecodeMetrics.to_dict()`` (vllm/v1/metrics/stats.py) at the ``detailed``
    level, every step accepting all k drafts."""
    hist = [0] * k + [steps]
    spec = {
        "mean_acceptance_length": 1.0 + k,
        "draft_acceptance_rate": 1.0,
        "acceptance_histogram": hist,
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": k * steps,
        "num_draft_tokens": k * steps,
        "num_spec_tokens": k,
        "per_step_accepted": [k] * steps,
        "per_step_drafted": [k] * steps,
    }
    return {"id": "cmpl-0", "object": "text_completion", "choices": [],
            "metrics": {"speculative_decoding": spec}}  # fmt: skip


def _plan(tmp_path, name, *extra):
    out = tmp_path / name
    argv = ["plan", "--model", str(MODEL), "--bandwidth", str(PROFILE), "--engine", "vllm"]
    assert main([*argv, "--out", str(out), *extra]) == 0
    return json.loads((out / "plan.json").read_text())


@pytest.mark.skipif(not PROFILE.is_file(), reason="results/cpu/bench/profile.json not present")
def test_a_measured_acceptance_of_one_plans_at_the_limit_below_one(tmp_path):
    src = tmp_path / "metrics.json"
    src.write_text(json.dumps(_vllm_all_accepted(4, 9)))
    got = _plan(tmp_path, "from", "--acceptance-from", str(src))
    limit = float(np.nextafter(1.0, 0.0))
    assert got["engine"]["expected_acceptance"] == limit
    assert any("no drafted token was rejected" in n for n in got["notes"])
    near = _plan(tmp_path, "near", "--expected-acceptance", "0.999999")
    assert got["engine"]["settings"] == near["engine"]["settings"]
