"""Routing inertia of rejected drafts (specmoe.analysis.inertia, specmoe.analysis.effects)
against independent references: set intersections by brute force, Cohen's d on exact fractions,
the Mann-Whitney count, numerical integration of two normals, an enumerated bootstrap."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from specmoe.analysis.effects import (
    auc,
    best_threshold,
    cluster_weights,
    cohens_d,
    empirical_overlap,
    moments,
    normal_overlap,
    overlap_from_d,
    threshold_auc,
)
from specmoe.analysis.inertia import (
    CASCADE,
    FIRST,
    category_of,
    inertia_analysis,
    overlap_pairs,
    pairs_from_log,
)
from specmoe.cli import main

ROOT = Path(__file__).resolve().parents[1]
NGRAM = ROOT / "results" / "cpu" / "bundled" / "rounds" / "ngram"


def _tiny(seed=0, rounds=(3, 2, 4, 1, 3), accepted=(1, 2, 0, 1, 3), L=2, m=3, N=7):
    """Hand-made routing: round r verifies k_r + 1 positions of L layers, m distinct experts."""
    rng = np.random.default_rng(seed)
    k = np.array(rounds)
    ids = np.stack(
        [
            np.stack([rng.choice(N, m, replace=False) for _ in range(L)])
            for _ in range(int((k + 1).sum()))
        ]
    )
    row0 = np.concatenate([[0], np.cumsum(k + 1)[:-1]])
    return ids, row0, k, np.array(accepted), N


def _brute(ids, row0, k, acc, max_step, anchor=False):
    out = []
    for r in range(len(k)):
        for j in range(1, k[r] + 1):
            steps = [j] if anchor else range(1, min(j, max_step) + 1)
            for s in steps:
                a, b = ids[row0[r] + j], ids[row0[r] + j - s]
                shared = [len(set(a[layer]) & set(b[layer])) for layer in range(ids.shape[1])]
                kind = 0 if j <= acc[r] else (1 if j == acc[r] + 1 else 2)
                out.append((r, j, s, kind, *shared))
    return sorted(out)


@pytest.mark.parametrize("anchor", [False, True])
def test_overlap_pairs_match_set_intersections(anchor):
    ids, row0, k, acc, N = _tiny()
    cl = np.arange(len(k)) % 2
    p = overlap_pairs(
        ids, row0, k, acc, cl, np.array(["a", "b"]), num_experts=N, max_step=2, anchor=anchor
    )
    # round of each pair, recovered from its cluster and position order
    rr = np.repeat(np.arange(len(k)), k)
    if not anchor:
        rr = np.repeat(rr, np.minimum(np.concatenate([np.arange(1, x + 1) for x in k]), 2))
    got = sorted(
        (int(r), int(j), int(s), int(c), *map(int, sh))
        for r, j, s, c, sh in zip(rr, p.position, p.step, p.kind, p.shared)
    )
    assert got == _brute(ids, row0, k, acc, 2, anchor)
    assert np.allclose(p.overlap, p.shared.mean(1) / 3)


def test_kinds_follow_the_accepted_count():
    ids, row0, k, acc, N = _tiny()
    p = overlap_pairs(
        ids, row0, k, acc, np.zeros(len(k), int), np.array(["a"]), num_experts=N, max_step=1
    )
    # round 2 accepted 0 of 4: draft 1 is its first rejection, 2..4 the cascade
    assert (p.kind[(p.position == 1)][2]) == FIRST
    r2 = slice(int(k[:2].sum()), int(k[:3].sum()))
    assert p.kind[r2].tolist() == [FIRST, CASCADE, CASCADE, CASCADE]
    # round 4 accepted all 3: no rejection
    assert (p.kind[-3:] == 0).all()


def test_cohens_d_equals_the_direct_formula_on_fractions():
    x = [Fraction(1, 8), Fraction(3, 8), Fraction(1, 2), Fraction(5, 8), Fraction(1, 8)]
    y = [Fraction(0), Fraction(1, 4), Fraction(1, 8), Fraction(3, 8)]

    def mean(v):
        return sum(v, Fraction(0)) / len(v)

    def var(v):
        mu = mean(v)
        return sum(((a - mu) ** 2 for a in v), Fraction(0)) / (len(v) - 1)

    pooled = ((len(x) - 1) * var(x) + (len(y) - 1) * var(y)) / (len(x) + len(y) - 2)
    d2 = (mean(x) - mean(y)) ** 2 / pooled  # exact d squared
    d = float(cohens_d(moments(np.array(x, float)), moments(np.array(y, float))))
    assert d > 0
    assert d * d == pytest.approx(float(d2), rel=1e-12)


def test_auc_equals_the_mann_whitney_count():
    rng = np.random.default_rng(3)
    pos = rng.integers(0, 6, 37) / 8
    neg = rng.integers(0, 7, 41) / 8
    count = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg)
    assert auc(pos, neg) == pytest.approx(count / (len(pos) * len(neg)), abs=1e-14)
    assert auc(neg, pos) == pytest.approx(1 - count / (len(pos) * len(neg)), abs=1e-14)


def test_best_threshold_is_the_best_youden_rule_by_brute_force():
    rng = np.random.default_rng(5)
    pos = rng.normal(0.3, 1, 40).round(1)
    neg = rng.normal(0.0, 1, 50).round(1)
    t, s, j = best_threshold(pos, neg)
    best = max(
        ((pos * sg >= tt * sg).mean() - (neg * sg >= tt * sg).mean())
        for tt in np.concatenate([pos, neg, [-99, 99]])
        for sg in (1, -1)
    )
    assert j == pytest.approx(best, abs=1e-12)
    assert threshold_auc(pos, neg, t, s) == pytest.approx((1 + j) / 2, abs=1e-12)


@pytest.mark.parametrize(
    ("mu1", "sd1", "mu2", "sd2"),
    [(0, 1, 0.38, 1), (0, 1, 2, 1), (0.3, 0.1, 0.35, 0.12), (0, 1, 1, 2.5), (0, 1, 0, 1)],
)
def test_normal_overlap_equals_numerical_integration(mu1, sd1, mu2, sd2):
    from scipy import integrate, stats

    def f(x):
        return min(stats.norm.pdf(x, mu1, sd1), stats.norm.pdf(x, mu2, sd2))

    lo = min(mu1 - 12 * sd1, mu2 - 12 * sd2)
    hi = max(mu1 + 12 * sd1, mu2 + 12 * sd2)
    pts = sorted({mu1, mu2, (mu1 + mu2) / 2})
    ref, _ = integrate.quad(f, lo, hi, points=pts, limit=400, epsabs=1e-12)
    assert normal_overlap(mu1, sd1, mu2, sd2) == pytest.approx(ref, abs=1e-7)
    if sd1 == sd2:
        d = (mu2 - mu1) / sd1
        assert float(overlap_from_d(d)) == pytest.approx(ref, abs=1e-7)


def test_the_papers_85_percent_is_a_d_of_about_0_38():
    # 2Φ(-|d|/2) = 0.85 at |d| = 0.377
    assert float(overlap_from_d(0.377)) == pytest.approx(0.85, abs=1e-3)


def test_empirical_overlap_of_histograms():
    assert float(empirical_overlap(np.array([2, 2, 0]), np.array([0, 1, 3]))) == pytest.approx(0.25)
    assert np.isnan(empirical_overlap(np.array([0, 0]), np.array([1, 1])))


def test_cluster_bootstrap_matches_the_enumerated_bootstrap():
    """G = 3 prompts: the 27 equally likely ordered resamples give the exact bootstrap law of
    the pooled accepted mean; the seeded Monte Carlo bootstrap reproduces its atoms and its
    percentile interval."""
    ids, row0, k, acc, N = _tiny(seed=1, rounds=(3, 2, 4, 2, 3, 3), accepted=(1, 2, 0, 1, 3, 2))
    cl = np.array([0, 1, 2, 0, 1, 2])
    p = overlap_pairs(ids, row0, k, acc, cl, np.array(["a", "b", "c"]), num_experts=N, max_step=1)
    x, kind, c = p.overlap, p.kind, p.cluster
    sel = kind == 0
    exact = []
    for draw in itertools.product(range(3), repeat=3):
        w = np.bincount(draw, minlength=3)
        num = sum(w[g] * x[sel & (c == g)].sum() for g in range(3))
        den = sum(w[g] * (sel & (c == g)).sum() for g in range(3))
        exact.append(num / den)
    exact = np.array(exact)
    B = 20000
    res = inertia_analysis(p, n_boot=B, seed=7, max_step=1, splits=2)
    iv = res["steps"][0]["kinds"]["accepted"]["interval"]
    assert iv[0] == pytest.approx(exact.min(), abs=1e-12)
    assert iv[1] == pytest.approx(exact.max(), abs=1e-12)
    # every atom's frequency within 5 standard errors of its exact probability
    w = cluster_weights(3, B, 7)
    sums = np.array([x[sel & (c == g)].sum() for g in range(3)])
    cnts = np.array([(sel & (c == g)).sum() for g in range(3)])
    reps = (w @ sums) / (w @ cnts)
    for v in np.unique(exact.round(12)):
        pr = np.mean(np.isclose(exact, v))
        fr = np.mean(np.isclose(reps, v))
        assert abs(fr - pr) < 5 * math.sqrt(pr * (1 - pr) / B) + 1e-12
    assert res["steps"][0]["kinds"]["accepted"]["mean"] == pytest.approx(x[sel].mean(), abs=1e-14)


def test_category_of_prompt_documents():
    assert category_of("encodings/cp1026.py") == "encodings"
    assert category_of("lib2to3/pgen2/token.py") == "lib2to3"
    assert category_of("heapq.py") == "(module)"


def test_analysis_on_a_committed_round_log_matches_a_direct_count():
    from specmoe.formats.roundlog import read_round_log

    log = read_round_log(NGRAM)
    p = pairs_from_log(log, max_step=4)
    res = inertia_analysis(p, n_boot=0, max_step=4, splits=2)
    # step 1, first rejections: one per round that rejected a draft (accepted < k)
    k, a = log["k"], log["accepted"]
    n_first = int(((k >= 1) & (a < k)).sum())
    n_acc = int(a[k >= 1].sum())
    s1 = res["steps"][0]
    assert s1["kinds"]["first_rejection"]["n"] == n_first
    assert s1["kinds"]["accepted"]["n"] == n_acc
    # the mean of first rejections at step 1, by sets
    vals = []
    for r in np.flatnonzero((k >= 1) & (a < k))[:50]:
        R = log.routing_of(int(r))
        j = int(a[r]) + 1
        vals.append(
            np.mean([len(set(R[j, layer]) & set(R[j - 1, layer])) / 8 for layer in range(4)])
        )
    sel = (p.step == 1) & (p.kind == FIRST)
    assert np.allclose(sorted(p.overlap[sel][:50]), sorted(vals)) or len(vals) < 50
    c = s1["vs_accepted"]["first_rejection"]
    assert c["delta"] == pytest.approx(
        s1["kinds"]["accepted"]["mean"] - s1["kinds"]["first_rejection"]["mean"]
    )
    assert c["overlap_normal"] == pytest.approx(float(overlap_from_d(c["d"])))


def test_inertia_command_writes_json_and_figures(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(
        [
            "inertia",
            "--runs",
            str(NGRAM),
            "--n-boot",
            "20",
            "--splits",
            "2",
            "--json",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schema"] == "specmoe.inertia/1" and d["drafters"][0]["drafter"] == "ngram"
    assert json.loads((out / "inertia.json").read_text()) == d
    assert {p.name for p in out.glob("*.png")} >= {
        "inertia_steps_ngram.png",
        "inertia_layers_ngram.png",
        "inertia_anchor_ngram.png",
        "inertia_effects_ngram.png",
    }
    from specmoe.report.html import build_report

    page, figures, counts = build_report(out, tmp_path / "page.html")
    assert counts.get("inertia") == 1 and "Could not render" not in page
    assert "Overlap with the predecessor at step s" in page and len(figures) >= 4
