"""`specmoe validate` with the verify side taken from the speculative rounds' own passes
(``specmoe/validate/rules-llamacpp-rounds.json``): tau_p(n) is the mean over the throughput
prompts of each prompt's median over its oracle generations at k = n - 1 of each generation's
median verification pass, and the whole-pass prediction is the mean of its sum over the cache
lengths those passes ran at. Checked against a second route to the same numbers: the same
per-generation times written as a verify sweep and scored by ``rules-llamacpp.json``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _synthetic_runs import ACC, K
from test_validate_one_kernel import _world

from specmoe.cli import main
from specmoe.cost.plan import load_plan
from specmoe.errors import InputError
from specmoe.formats.profile import load_profile
from specmoe.formats.runs import load_runs, rounds_verify_side
from specmoe.validate.rules import load_rules
from specmoe.validate.score import validate
from specmoe.validate.whole_pass import whole_pass_version

ROOT = Path(__file__).resolve().parents[1]
RULES_LC = ROOT / "specmoe/validate/rules-llamacpp.json"
RULES_RD = ROOT / "specmoe/validate/rules-llamacpp-rounds.json"
P, R = 5, 3


def _generations(rng: np.random.Generator, on: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tokens per second, median verify pass) [A, K, P, R] of fake oracle generations; the
    k = 0 column repeats one generation per prompt and repeat at every acceptance value, as
    the campaign writes it."""
    A, Kn = len(ACC), len(K)
    tps = rng.uniform(100, 200, size=(A, Kn, P, R))
    tv = on[None, :Kn, None, None] * rng.uniform(0.9, 1.1, size=(A, Kn, P, R))
    tps[:, 0] = tps[0, 0]
    tv[:, 0] = tv[0, 0]
    return tps, tv


def _add_rounds(runs: Path, seed: int = 0, *, tokens: int | None = None) -> np.ndarray:
    """Per-generation samples and their passes added to ``runs``' throughput.json; returns
    the passes [A, K, P, R]."""
    v = json.loads((runs / "verify.json").read_text())
    on = np.asarray(v["configurations"][0]["verify_ms"]["on"])
    tps, tv = _generations(np.random.default_rng(seed), on)
    t = json.loads((runs / "throughput.json").read_text())
    c = t["configurations"][0]
    c["prompts"] = [f"doc{p}" for p in range(P)]
    c["per_prompt_tokens_per_s"] = tps.tolist()
    c["tokens_per_s"] = np.median(tps.reshape(len(ACC), len(K), -1), axis=2).tolist()
    c["per_prompt_round_verify_ms"] = tv.tolist()
    if tokens is not None:
        c["tokens"] = tokens
        v["configurations"][0]["context_len"] = 511
        (runs / "verify.json").write_text(json.dumps(v))
    (runs / "throughput.json").write_text(json.dumps(t))
    return tv


def _brute(tv: np.ndarray) -> tuple[np.ndarray, list[list[list[float]]]]:
    """(per-prompt medians [P, K], the repetitions [P][K][...]) by loops over generations."""
    reps = []
    for p in range(P):
        row = []
        for k in range(len(K)):
            accs = [0] if k == 0 else range(len(ACC))
            row.append([float(tv[a, k, p, r]) for a in accs for r in range(R)])
        reps.append(row)
    return np.array([[np.median(c) for c in row] for row in reps]), reps


def test_rounds_side_is_the_median_over_each_prompts_generations(tmp_path):
    _, runs = _world(tmp_path, one_kernel=True)
    tv = _add_rounds(runs)
    (m,) = load_runs(runs)
    assert m.per_prompt_round_verify_ms.shape == tv.shape
    r = rounds_verify_side(m)
    med, reps = _brute(tv)
    assert r.n == list(range(1, len(K) + 1))
    assert r.per_prompt_on_ms == pytest.approx(med, rel=1e-15)
    assert r.verify_on_ms == pytest.approx(med.mean(axis=0), rel=1e-15)
    assert r.verify_prompts == tuple(f"doc{p}" for p in range(P))
    assert r.verify_off_ms is None and r.per_prompt_off_ms is None
    # k = 0 counts each generation once (R), k >= 1 every acceptance value's (A * R)
    counts = np.sum(~np.isnan(r.per_prompt_repeats_on_ms), axis=2)
    assert counts[:, 0].tolist() == [R] * P and counts[:, 1:].min() == len(ACC) * R
    for p in range(P):
        for k in range(len(K)):
            got = r.per_prompt_repeats_on_ms[p, k]
            assert sorted(got[~np.isnan(got)].tolist()) == sorted(reps[p][k])


def test_rounds_rules_score_as_the_same_passes_written_as_a_sweep(tmp_path):
    """Second route: the rounds' passes written into verify.json as its per-prompt
    repetitions and scored by rules-llamacpp.json give every score of rules-llamacpp-rounds.json
    on the original runs, intervals included (no cache lengths given: both sum at the depth)."""
    plan, runs = _world(tmp_path / "a", one_kernel=True)
    tv = _add_rounds(runs)
    (c_rd,) = validate(plan, runs, rules_path=str(RULES_RD)).configurations
    _, reps = _brute(tv)
    v = json.loads((runs / "verify.json").read_text())
    cfg = v["configurations"][0]
    cfg["per_prompt_repeats_ms"] = {"on": reps}
    cfg["prompts"] = [f"doc{p}" for p in range(P)]
    del cfg["per_prompt_ms"]
    cfg["verify_ms"]["on"] = np.mean([[np.median(c) for c in row] for row in reps], axis=0).tolist()
    (runs / "verify.json").write_text(json.dumps(v))
    (c_lc,) = validate(plan, runs, rules_path=str(RULES_LC)).configurations
    for name, a in c_rd.versions.items():
        b = c_lc.versions[name]
        assert a.verify_error == pytest.approx(b.verify_error, rel=1e-12)
        assert a.k_hat == b.k_hat and a.max_loss == pytest.approx(b.max_loss, rel=1e-12)
        assert a.intervals.metrics == b.intervals.metrics
    assert c_rd.measured.verify_on_ms == pytest.approx(c_lc.measured.verify_on_ms, rel=1e-12)
    assert [(x.rule.id, x.holds, x.decided) for x in c_rd.rules] == [
        (x.rule.id, x.holds, x.decided) for x in c_lc.rules
    ]
    assert any("own verification passes" in n for n in c_rd.notes)
    assert not any("own verification passes" in n for n in c_lc.notes)


def test_rounds_prediction_is_the_mean_over_the_generations_cache_lengths(tmp_path):
    plan, runs = _world(tmp_path, one_kernel=True)
    tv = _add_rounds(runs, tokens=16)
    (c,) = validate(plan, runs, rules_path=str(RULES_RD)).configurations
    pl, prof = load_plan(plan), load_profile(tmp_path / "profile.json")
    each = [whole_pass_version(pl, prof, 512, 9, context=ctx)[0] for ctx in range(511, 527)]
    want = np.mean([e["verify_ms"]["dedup"] for e in each], axis=0)
    got = np.asarray(c.versions["whole_pass"].verify_ms.dedup)
    assert got == pytest.approx(want, rel=1e-12)
    at_start = each[0]["verify_ms"]["dedup"]
    assert not np.allclose(got, at_start)  # the depth term moves it: the mean is not d - 1's
    meas = _brute(tv)[0].mean(axis=0)
    assert c.versions["whole_pass"].verify_error == pytest.approx(
        float(np.max(np.abs(want - meas) / meas)), rel=1e-12
    )


def test_rule_set_changes_the_verify_side_alone():
    a, b = json.loads(RULES_LC.read_text()), json.loads(RULES_RD.read_text())
    strip = ("text",)
    assert [{k: v for k, v in r.items() if k not in strip} for r in a["rules"]] == [
        {k: v for k, v in r.items() if k not in strip} for r in b["rules"]
    ]
    assert {k: v for k, v in a["definitions"]["intervals"].items() if k != "tau"} == {
        k: v for k, v in b["definitions"]["intervals"].items() if k != "tau"
    }
    assert load_rules(RULES_RD).verify_side == "rounds"
    assert load_rules(RULES_LC).verify_side == "sweep"


def refuses_runs_without_rounds(tmp_path: Path, capsys, rules: Path) -> tuple[Path, Path]:
    """``specmoe validate`` under ``rules`` on runs without the rounds' passes: exit 2, one
    line naming throughput.json and the missing field, nothing written. Returns (plan, runs)."""
    plan, runs = _world(tmp_path, one_kernel=True)
    out = tmp_path / "out"
    argv = ["validate", "--plan", str(plan), "--runs", str(runs), "--rules", str(rules)]
    assert main([*argv, "--out", str(out)]) == 2
    errs = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert len(errs) == 1 and errs[0].startswith("specmoe validate: error: ")
    assert "throughput.json" in errs[0] and "per_prompt_round_verify_ms" in errs[0]
    assert not out.exists()
    return plan, runs


def refuses_measured_field(tmp_path: Path, rules: Path, key: str, value: str, allowed: str) -> None:
    """``rules`` with ``definitions.measured[key] = value`` is refused, naming the field and
    what it may be."""
    raw = json.loads(rules.read_text())
    raw["definitions"]["measured"][key] = value
    bad = tmp_path / "rules.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(InputError, match=f"{key} must be {allowed}"):
        load_rules(bad)


def test_bad_rounds_input_is_one_line_and_exit_2(tmp_path, capsys):
    _, runs = refuses_runs_without_rounds(tmp_path, capsys, RULES_RD)
    _add_rounds(runs)
    t = json.loads((runs / "throughput.json").read_text())
    t["configurations"][0]["per_prompt_round_verify_ms"][0][1] = [[1.0]]  # one prompt, not 5
    (runs / "throughput.json").write_text(json.dumps(t))
    with pytest.raises(InputError, match="per_prompt_round_verify_ms must be"):
        load_runs(runs)
    del t["configurations"][0]["per_prompt_tokens_per_s"]
    t["configurations"][0]["per_prompt_round_verify_ms"] = [[[[1.0]]]]
    (runs / "throughput.json").write_text(json.dumps(t))
    with pytest.raises(InputError, match="needs per_prompt_tokens_per_s"):
        load_runs(runs)
    refuses_measured_field(tmp_path, RULES_RD, "verify_side", "sweeps", "'sweep' or 'rounds'")
