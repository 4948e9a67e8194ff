"""The power analysis of scripts/power_analysis.py against independent references, and the
whole-pass rule set read through the project's loader."""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from specmoe.validate.rules import decide, load_rules

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "specmoe" / "validate" / "rules-whole-pass.json"


@pytest.fixture(scope="module")
def pa():
    spec = importlib.util.spec_from_file_location(
        "power_analysis", ROOT / "scripts" / "power_analysis.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def test_bootstrap_width_matches_the_analytic_interval_of_a_mean(pa):
    # normal prompt effects, no repeat noise: the percentile bootstrap of a mean over P values
    # has half-width 1.96 sigma sqrt((P - 1)/P) / sqrt(P) (the plug-in sd of the mean)
    sigma, P = 0.05, 40
    med, p90 = pa.tau_power(sigma, 1e-9, P, 1, np.random.default_rng(1), sims=300, boot=800)
    analytic = 1.959964 * sigma * math.sqrt((P - 1) / P) / math.sqrt(P)
    assert med == pytest.approx(analytic, rel=0.06)
    assert p90 > med


def test_bootstrap_width_shrinks_with_repeats_only_through_the_repeat_noise(pa):
    rng = np.random.default_rng(2)
    only_prompt = [pa.tau_power(0.04, 1e-9, 12, r, rng, sims=200, boot=500)[0] for r in (1, 4)]
    only_rep = [pa.tau_power(1e-9, 0.04, 12, r, rng, sims=200, boot=500)[0] for r in (1, 4)]
    assert only_prompt[1] == pytest.approx(only_prompt[0], rel=0.1)
    assert only_rep[1] < 0.65 * only_rep[0]


def test_argmax_of_two_cells_matches_the_normal_probability(pa):
    # two draft lengths, one generation per cell, log-normal noise sd s: the measured argmax is
    # the true one with probability Phi(ln(mu1/mu0) / (s sqrt 2))
    mu = np.tile([100.0, 102.0], (11, 1))
    w = np.zeros_like(mu)
    s = 0.03
    out = pa.throughput_power(mu, w, 0.0, s, 1, 1, np.random.default_rng(3), sims=20000)
    exact = _phi(math.log(1.02) / (s * math.sqrt(2)))
    assert out["k_true"] == [1] * 11
    assert np.allclose(out["p_exact"], exact, atol=0.012)
    assert out["p_within_one"] == [1.0] * 11  # two cells are always within one


def test_a_prompt_effect_shared_by_every_cell_does_not_move_the_argmax(pa):
    mu = np.tile([100.0, 103.0, 101.0], (11, 1))
    w = np.full_like(mu, 0.01)
    alone = pa.throughput_power(mu, w, 0.0, 0.0, 1, 1, np.random.default_rng(4), sims=4000)
    shared = pa.throughput_power(mu, w, 0.5, 0.0, 1, 1, np.random.default_rng(4), sims=4000)
    assert np.allclose(alone["p_exact"], shared["p_exact"], atol=0.03)
    assert min(alone["p_exact"]) > 0.85


def _rounds(a: float, k: int, T: int, rng, n: int) -> np.ndarray:
    """Rounds an oracle generation of T tokens needs, by direct simulation of the drafts."""
    out = np.zeros(n)
    for i in range(n):
        t = r = 0
        while t < T:
            flags = rng.random(k) < a
            acc = int(np.argmin(flags)) if not flags.all() else k
            t += acc + 1
            r += 1
        out[i] = r
    return out


@pytest.mark.parametrize(("a", "k"), [(0.59, 5), (0.9, 8), (0.3, 2)])
def test_renewal_variance_of_the_rounds_matches_direct_simulation(pa, a, k):
    T = 128
    g, var = pa.emitted_moments(a, k)
    assert g == pytest.approx((1 - a ** (k + 1)) / (1 - a))  # G_a(k), Eq. (9) of paper 002
    rounds = _rounds(a, k, T, np.random.default_rng(5), 3000)
    model_sd = pa.cell_model([1.0] * 9, 0.0, T)[1][
        pa.ACCEPTANCE.index(a) if a in pa.ACCEPTANCE else 0, k
    ]
    direct_sd = float(np.std(np.log(rounds)))
    assert math.sqrt(var / (g * T)) == pytest.approx(direct_sd, rel=0.12)
    if a in pa.ACCEPTANCE:
        assert model_sd == pytest.approx(direct_sd, rel=0.12)


def test_anova_recovers_the_two_components(pa):
    rng = np.random.default_rng(6)
    x = rng.normal(0, 0.05, (400, 1)) + rng.normal(0, 0.02, (400, 5))
    sp, se, dfb, dfw = pa.anova(x)
    assert math.sqrt(sp) == pytest.approx(0.05, rel=0.1)
    assert math.sqrt(se) == pytest.approx(0.02, rel=0.05)
    assert (dfb, dfw) == (399, 1600)


def test_smoothed_step_times_are_non_decreasing(pa):
    noisy = [94.9, 151.8, 186.4, 213.9, 236.0, 235.5, 264.0, 253.7, 278.4]
    v = pa.smooth_steps(noisy)
    assert v[0] == noisy[0]
    assert all(b >= a for a, b in itertools.pairwise(v[1:]))
    assert any(b < a for a, b in itertools.pairwise(noisy))  # the input is not monotone


def test_committed_power_results_are_what_the_script_writes(pa, tmp_path):
    committed = ROOT / "results" / "cpu" / "power" / "power.json"
    if not committed.is_file():
        pytest.skip("results/cpu/power not written")
    assert pa.main(["--out", str(tmp_path)]) == 0
    # the same numbers, to the last few bits: a processor's BLAS may round a sum differently
    new, old = (json.loads(p.read_text()) for p in (tmp_path / "power.json", committed))
    _close(new, old, "power.json")


def _close(a, b, where):
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), where
    else:
        assert a == b, where


# ------------------------------------------------------------------------------------------
# the rule set


def test_whole_pass_rules_load_through_the_project_loader():
    rs = load_rules(RULES)
    ids = {r.id: r for r in rs.rules}
    required = {r.id for r in rs.rules if r.required}
    assert required == {
        "kstar_within_one",
        "loss_at_kstar",
        "verify_error_whole_pass",
        "crossover_within_one",
    }
    assert (ids["kstar_within_one"].value, ids["kstar_within_one"].of) == (10, 11)
    assert ids["loss_at_kstar"].metric == "max_loss" and ids["loss_at_kstar"].value == 0.05
    assert ids["verify_error_whole_pass"].value == 0.1
    assert ids["crossover_within_one"].value == 1
    assert set(rs.verify_error_kernels) == {"per_slot", "dedup"}
    assert rs.definitions["verify_error_pass_sizes"] == {
        "min": 1,
        "max": 9,
        "note": rs.definitions["verify_error_pass_sizes"]["note"],
    }
    assert rs.sha256 == hashlib.sha256(RULES.read_bytes()).hexdigest()


def test_whole_pass_rules_decide_scores():
    rs = load_rules(RULES)
    good = {
        "kstar_within_one": 10,
        "kstar_within_one_of": 11,
        "max_loss": 0.05,
        "verify_error": 0.099,
        "crossover_distance": 1,
    }
    bad = dict(good, kstar_within_one=9, max_loss=0.051)
    verdict = {v.rule.id: v.holds for v in decide(rs, {"prediction": good}) if v.rule.required}
    assert all(verdict.values())
    verdict = {v.rule.id: v.holds for v in decide(rs, {"prediction": bad}) if v.rule.required}
    assert verdict == {
        "kstar_within_one": False,
        "loss_at_kstar": False,
        "verify_error_whole_pass": True,
        "crossover_within_one": True,
    }


def test_the_old_rule_set_is_unchanged():
    old = ROOT / "specmoe" / "validate" / "rules.json"
    assert hashlib.sha256(old.read_bytes()).hexdigest().startswith("b58a0a37")
