"""scripts/llamacpp_power.py --from-runs: llama.cpp's own variance components from a committed
campaign (round 7 of the llama.cpp protocol), the power of the design it ran and of a grid of
designs with their cost. Checked against a direct ANOVA of the units and the targets' meaning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "results/cpu/llamacpp/whole-pass/round7"


@pytest.fixture(scope="module")
def lp():
    return load_script("llamacpp_power")


@pytest.fixture(scope="module")
def res(lp):
    saved = lp.OWN_PROMPTS, lp.OWN_REPEATS, lp.OWN_TOKENS
    lp.OWN_PROMPTS, lp.OWN_REPEATS, lp.OWN_TOKENS = (8, 16), (2, 4), (128,)
    try:
        return lp.own_analysis(RUNS, ["llamacpp-bundled"], 0, target_kstar=0.5, target_loss=0.3)
    finally:
        lp.OWN_PROMPTS, lp.OWN_REPEATS, lp.OWN_TOKENS = saved


def test_the_repeat_noise_is_the_pooled_within_prompt_variance(res):
    """s_rep is the within-prompt spread of log t pooled over n (a direct computation)."""
    for c in res["configurations"]:
        d = c["depth"]
        files = sorted((RUNS / "llamacpp-bundled" / "units").glob(f"verify-d{d}-*.json"))
        ss = df = 0.0
        for f in files:
            recs = json.loads(f.read_text())["records"]
            for n in range(1, 10):
                x = np.log([r["t_ms"] for r in recs if r["n"] == n])
                ss += ((x - x.mean()) ** 2).sum()
                df += x.size - 1
        assert c["verify"]["s_rep"] == pytest.approx(np.sqrt(ss / df), rel=1e-9)
        assert c["verify"]["prompts"] == len(files)


def test_the_cheapest_design_meets_the_targets_and_none_cheaper_does(res):
    for c in res["configurations"]:
        t, best = c["targets"], c["cheapest"]
        ok = [
            x
            for x in c["designs"]
            if x["p_perfect_passes_kstar_rule"] >= t["kstar"]
            and x["p_perfect_passes_loss_rule"] >= t["loss"]
        ]
        if best is None:
            assert not ok
            continue
        assert best in ok and all(x["cpu_min"] >= best["cpu_min"] for x in ok)
        # the cost grows with the design
        by = {(x["prompts"], x["repeats"]): x["cpu_min"] for x in c["designs"]}
        assert by[(16, 4)] > by[(16, 2)] > by[(8, 2)]
        assert c["as_run"]["cpu_s_measured"] > 0 and c["cost_scale"] > 0


def test_a_folder_without_a_campaign_is_one_line(lp, tmp_path, capsys):
    assert lp.main(["--from-runs", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--from-runs" in err[0] and "runs_campaign.json" in err[0]
