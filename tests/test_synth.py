"""Synthetic routing: exact cardinality, determinism, stationarity, fidelity to the statistics
it was drawn from, the sampling step's inclusion probabilities, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ipf import sticky_trace

from specmoe.cli import main
from specmoe.errors import InputError
from specmoe.formats.trace import RoutingTrace, load_trace, save_trace
from specmoe.routing.ipf import ExpertMoments, fit_moments, load_moments, save_moments
from specmoe.routing.overlap import uniform_union
from specmoe.routing.stats import compute_stats
from specmoe.routing.synth import (
    chain_tables,
    rescale_to_sum,
    synth_fidelity,
    synthesize,
    systematic_sample,
)


@pytest.fixture(scope="module")
def source():
    """Statistics of a sticky process with skewed popularity and layer-dependent overlap."""
    tr = sticky_trace(12000, 3, 32, 4, [0.3, 0.55, 0.8], seed=11, doc_len=600)
    return fit_moments(tr, max_lag=8)


@pytest.fixture(scope="module")
def synthetic(source):
    return synthesize(source, 24000, seed=5)


def test_every_token_has_m_distinct_experts(source, synthetic):
    ex = synthetic.experts
    assert ex.shape == (24000, 3, 4) and synthetic.num_experts == 32
    srt = np.sort(ex, axis=2)
    assert np.all(srt[..., 1:] > srt[..., :-1]) and ex.min() >= 0 and ex.max() < 32


def test_fidelity_to_source_statistics(source, synthetic):
    f = synth_fidelity(source, synthetic)
    assert np.all(f["popularity_r"] > 0.99), f["popularity_r"]
    assert f["overlap_max_abs_diff"] < 0.02, f["overlap_diff"]
    assert f["union_max_abs_rel_err"] < 0.03, f["union_rel_err"]
    # the check is not vacuous: a trace with the right popularity but no memory fails it
    rng = np.random.default_rng(0)
    shuffled = synthetic.experts[rng.permutation(synthetic.num_tokens)]
    g = synth_fidelity(
        source,
        RoutingTrace(
            experts=shuffled, doc_offsets=np.array([0, synthetic.num_tokens]), num_experts=32
        ),
    )
    assert np.all(g["popularity_r"] > 0.99)
    assert g["overlap_max_abs_diff"] > 0.1 and g["union_max_abs_rel_err"] > 0.1


def test_stationary_across_positions(synthetic):
    # no window boundaries: lag-1 overlap is the same at every phase t mod w and in both halves
    ex = synthetic.experts.astype(np.int64)
    hit = (ex[:-1, :, :, None] == ex[1:, :, None, :]).any(-1).mean(axis=(1, 2))  # [T-1]
    w = synthetic.meta["synthetic"]["window"]
    by_phase = np.array([hit[k::w].mean() for k in range(w)])
    assert np.ptp(by_phase) < 0.02, by_phase
    half = hit.size // 2
    assert abs(hit[:half].mean() - hit[half:].mean()) < 0.01


def test_same_seed_same_trace_and_seed_matters(source):
    a = synthesize(source, 300, seed=3, window=4)
    b = synthesize(source, 300, seed=3, window=4)
    c = synthesize(source, 300, seed=4, window=4)
    np.testing.assert_array_equal(a.experts, b.experts)
    assert not np.array_equal(a.experts, c.experts)


def test_uniform_variant_and_memoryless_source():
    # independent uniform routing: synthetic union follows N(1 - q^n) and popularity is flat
    rng = np.random.default_rng(2)
    T, N, m = 30000, 16, 2
    ex = np.argsort(rng.random((T, 2, N)), axis=2)[:, :, :m]
    mo = fit_moments(
        RoutingTrace(experts=ex, doc_offsets=np.array([0, T]), num_experts=N), max_lag=4
    )
    syn = synthesize(mo, 20000, seed=1, variant="uniform")
    u = compute_stats(syn, max_n=5, max_lag=1).union_mean
    np.testing.assert_allclose(u, uniform_union(N, m, 5), rtol=0.01)
    pop = fit_moments(syn, max_lag=1).popularity
    assert np.abs(pop - m / N).max() < 0.01


def test_layer_mapping_and_spec_checks(source):
    tr = synthesize(source, 50, num_layers=5, num_experts=32, top_k=4, seed=0, window=3)
    assert tr.num_layers == 5
    assert tr.meta["synthetic"]["layer_map"] == [0, 0, 1, 2, 2]
    for kw, needle in (
        (dict(num_experts=64), "N=64"),
        (dict(top_k=2), "m=2"),
        (dict(window=10), "needs lags up to 9"),
        (dict(window=1), "must be >= 2"),
        (dict(num_layers=0), "must be >= 1"),
        (dict(doc_tokens=0), "must be >= 1"),
        (dict(variant="zipf"), "unknown variant"),
        (dict(bins=0), "must be in 1..32"),
    ):
        with pytest.raises(InputError) as ei:
            synthesize(source, 50, **kw)
        (argument,) = kw
        assert ei.value.argument == argument and needle in str(ei.value), (kw, str(ei.value))
        assert str(ei.value).startswith(f"{argument}: ") and "--" not in str(ei.value)
    with pytest.raises(InputError) as ei:
        synthesize(source, 0)
    assert ei.value.argument == "num_tokens"


def test_chain_tables_are_the_window_law_conditionals(source):
    trans, ctx_law, info = chain_tables(source, window=4)
    assert info["ipf_fallbacks"] == 0
    assert trans.shape == (3, 32, 8) and np.all((trans >= 0) & (trans <= 1))
    # the chain's one-step marginal reproduces the popularity: Σ_ctx P(ctx) P(1 | ctx) = p_e
    np.testing.assert_allclose((ctx_law * trans).sum(axis=2), source.popularity, atol=1e-8)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), N=st.integers(3, 20))
def test_rescale_sums_to_m_with_caps(data, N):
    m = data.draw(st.integers(1, N - 1))
    pi = np.array(data.draw(st.lists(st.floats(1e-6, 10.0), min_size=N, max_size=N)))[None]
    x = rescale_to_sum(pi, m)
    assert x.sum() == pytest.approx(m, rel=1e-9)
    assert np.all(x <= 1 + 1e-12) and np.all(x > 0)
    free = x[0] < 1 - 1e-9
    if free.sum() > 1:  # uncapped entries keep their proportions
        ratio = x[0, free] / pi[0, free]
        np.testing.assert_allclose(ratio, ratio[0], rtol=1e-9)


def test_systematic_sample_has_the_inclusion_probabilities():
    rng = np.random.default_rng(7)
    x = rescale_to_sum(rng.random((1, 10)) ** 3 + 0.01, 3)  # [1, 10], sums to 3
    draws = 40000
    counts = np.zeros(10)
    order = rng.random((draws, 10)).argsort(axis=1)
    u = rng.random(draws)
    chosen = systematic_sample(np.repeat(x, draws, axis=0), order, u, 3)  # [draws, 3]
    assert np.all(np.sort(chosen, axis=1)[:, 1:] > np.sort(chosen, axis=1)[:, :-1])
    np.add.at(counts, chosen.ravel(), 1)
    se = np.sqrt(x[0] * (1 - x[0]) / draws) + 1e-9
    assert np.all(np.abs(counts / draws - x[0]) < 5 * se), (counts / draws, x[0])


def test_stats_file_gives_the_same_trace(tmp_path, source):
    path = save_moments(source, tmp_path / "stats.json")
    a = synthesize(source, 200, seed=9, window=4)
    b = synthesize(load_moments(path), 200, seed=9, window=4)
    np.testing.assert_array_equal(a.experts, b.experts)


def test_cli_synth(tmp_path, capsys, source):
    tr = sticky_trace(3000, 2, 16, 2, [0.4, 0.7], seed=1, doc_len=300)
    save_trace(tr, tmp_path / "src.npz")
    out = tmp_path / "syn.npz"
    rc = main(
        [
            "synth",
            "--from",
            str(tmp_path / "src.npz"),
            "--tokens",
            "2000",
            "--seed",
            "3",
            "--out",
            str(out),
            "--json",
            "--save-stats",
            str(tmp_path / "s.json"),
            "--max-lag",
            "4",
        ]
    )
    assert rc == 0
    rec = json.loads(capsys.readouterr().out)
    syn = load_trace(out)
    assert rec["tokens"] == syn.num_tokens == 2000 and syn.top_k == 2
    assert rec["fidelity"]["popularity_r_min"] > 0.9
    # from the STATS file, with the same seed: the same trace
    rc = main(
        [
            "synth",
            "--from",
            str(tmp_path / "s.json"),
            "--tokens",
            "2000",
            "--seed",
            "3",
            "--out",
            str(tmp_path / "again.npz"),
        ]
    )
    assert rc == 0
    np.testing.assert_array_equal(load_trace(tmp_path / "again.npz").experts, syn.experts)
    capsys.readouterr()
    # a model whose N differs from the statistics: bad input, one line, exit 2
    rc = main(
        [
            "synth",
            "--from",
            str(tmp_path / "s.json"),
            "--tokens",
            "10",
            "--model",
            "OLMoE-1B-7B-0125",
            "--out",
            str(tmp_path / "x.npz"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "N=64" in err[-1] and not (tmp_path / "x.npz").exists()
    assert err[-1].startswith("specmoe synth: error: --model: "), err[-1]


@pytest.mark.parametrize(
    "extra,flag,needle",
    [
        (["--max-lag", "0"], "--max-lag", "must be an integer >= 1"),  # fit_moments' max_lag
        (["--window", "1"], "--window", "must be >= 2"),  # synthesize's window
        (["--window", "12"], "--window", "needs lags up to 11"),  # beyond the fitted lags
        (["--doc-tokens", "0"], "--doc-tokens", "must be >= 1"),  # synthesize's doc_tokens
        (["--model", "OLMoE-1B-7B-0125"], "--model", "N=64"),  # synthesize's num_experts
    ],
)
def test_cli_names_the_flag_of_the_bad_argument(tmp_path, capsys, extra, flag, needle):
    tr = sticky_trace(600, 2, 16, 2, [0.4, 0.7], seed=1, doc_len=200)
    save_trace(tr, tmp_path / "src.npz")
    out = tmp_path / "syn.npz"
    argv = ["synth", "--from", str(tmp_path / "src.npz"), "--tokens", "50", "--out", str(out)]
    assert main([*argv, *extra]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()  # progress lines, then the error
    assert cap.out == "" and [e for e in err if "error:" in e] == err[-1:], cap.err
    assert err[-1].startswith(f"specmoe synth: error: {flag}: ") and needle in err[-1], err[-1]
    assert not out.exists()


def test_bad_statistics_raise():
    with pytest.raises(InputError):
        ExpertMoments(
            num_experts=4,
            top_k=1,
            popularity=np.full((1, 4), 0.25),
            coactivation=np.full((1, 2, 4), 1.5),
        )  # not a probability


@pytest.mark.slow
def test_bundled_trace_fidelity():
    """Measured on the 120k-token fit trace: popularity r >= 0.9997, overlap within 0.003,
    union within 2.7% (n = 9; the pairwise law's own error on these traces is 2.9%)."""
    from specmoe.data import bundled_trace_path
    from specmoe.formats.trace import open_trace

    path = bundled_trace_path("fit")
    if not path.exists():
        pytest.skip("bundled traces not built")
    mo = fit_moments(open_trace(path), max_lag=8)
    f = synth_fidelity(mo, synthesize(mo, 30000, seed=0))
    assert np.all(f["popularity_r"] > 0.99)
    assert f["overlap_max_abs_diff"] < 0.02
    assert f["union_max_abs_rel_err"] < 0.03


def test_sticky_trace_reuses_about_keep_and_is_seeded():
    from specmoe.routing.synth import sticky_trace

    n, m, keep = 1000, 4, 0.6
    tr = sticky_trace(n, m, 2, keep, tokens=3000, docs=3, seed=4)
    ex = tr.experts
    assert ex.shape == (3000, 2, m) and tr.doc_offsets.tolist() == [0, 1000, 2000, 3000]
    assert all(len(set(row)) == m for row in ex.reshape(-1, m))  # distinct per token
    shared = [len(set(a) & set(b)) for a, b in zip(ex[1:, 0], ex[:-1, 0], strict=True)]
    # E[shared]/m = keep + (1 - keep)·(m - E[kept])/(N - E[kept]) ≈ keep for N >> m
    assert np.mean(shared) / m == pytest.approx(keep, abs=0.03)
    again = sticky_trace(n, m, 2, keep, tokens=3000, docs=3, seed=4)
    assert np.array_equal(again.experts, ex)
    custom = sticky_trace(8, 2, 1, 0.5, tokens=10, doc_offsets=[0, 3, 10])
    assert custom.doc_offsets.tolist() == [0, 3, 10]
