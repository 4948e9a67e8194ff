"""Routing statistics: reuse, union, overlap, popularity, baselines, bootstrap and the CLI.

References are independent: per-window Python sets, exact fractions, closed forms.
"""

from __future__ import annotations

import itertools
import json
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specmoe.cli import main
from specmoe.errors import InputError
from specmoe.formats.trace import RoutingTrace, save_trace
from specmoe.routing import windows
from specmoe.routing.bootstrap import bootstrap_intervals, resampled_statistics
from specmoe.routing.overlap import (
    independent_overlap,
    independent_union,
    uniform_reuse,
    uniform_union,
)
from specmoe.routing.stats import (
    compute_stats,
    document_sums,
    expert_popularity,
    pair_overlap,
    reuse_and_union,
    rho_bar_of,
    u_bar_of,
    window_reuse_counts,
    window_union_counts,
)
from specmoe.spec import ModelSpec, resolve_spec

# ------------------------------------------------------------------------------------------
# helpers


def random_trace(rng, *, N, m, L, lengths, sticky=0.0) -> RoutingTrace:
    """Random routing; with probability ``sticky`` a token copies its predecessor's set."""
    T = int(sum(lengths))
    ex = np.empty((T, L, m), np.int64)
    for t in range(T):
        for layer in range(L):
            if t and sticky and rng.random() < sticky:
                ex[t, layer] = ex[t - 1, layer]
            else:
                ex[t, layer] = rng.choice(N, m, replace=False)
    off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return RoutingTrace(experts=ex, doc_offsets=off, num_experts=N)


def brute(trace: RoutingTrace, max_n: int, max_lag: int):
    """Per-window Python sets: exact Fractions for rho, union [L][n], overlap [L][lags]."""
    L, m = trace.num_layers, trace.top_k
    rho = [[Fraction(0)] * max_n for _ in range(L)]
    union = [[Fraction(0)] * max_n for _ in range(L)]
    ov = [[Fraction(0)] * max_lag for _ in range(L)]
    for layer in range(L):
        for n in range(1, max_n + 1):
            num = den = tot = 0
            for doc in trace.documents():
                sets = [set(doc[t, layer].tolist()) for t in range(len(doc))]
                for t in range(len(sets) - n + 1):
                    earlier = set().union(*sets[t : t + n - 1])
                    num += len(sets[t + n - 1] & earlier)
                    tot += len(earlier | sets[t + n - 1])
                    den += 1
            rho[layer][n - 1] = Fraction(num, m * den) if den else None
            union[layer][n - 1] = Fraction(tot, den) if den else None
        for j in range(1, max_lag + 1):
            num = den = 0
            for doc in trace.documents():
                sets = [set(doc[t, layer].tolist()) for t in range(len(doc))]
                for t in range(len(sets) - j):
                    num += len(sets[t] & sets[t + j])
                    den += 1
            ov[layer][j - 1] = Fraction(num, m * den) if den else None
    return rho, union, ov


def close(a, fracs) -> bool:
    a = np.asarray(a, float)
    b = np.array([[np.nan if f is None else float(f) for f in row] for row in fracs])
    return np.allclose(a, b, rtol=0, atol=1e-12, equal_nan=True)


traces = st.builds(
    lambda seed, N, m, L, lengths, sticky: random_trace(
        np.random.default_rng(seed), N=N, m=min(m, N - 1), L=L, lengths=lengths, sticky=sticky
    ),
    seed=st.integers(0, 2**31),
    N=st.integers(2, 140),
    m=st.integers(1, 5),
    L=st.integers(1, 3),
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=5),
    sticky=st.sampled_from([0.0, 0.5, 0.9]),
)


# ------------------------------------------------------------------------------------------
# against brute force


@settings(max_examples=40, deadline=None)
@given(tr=traces, max_n=st.integers(1, 5), max_lag=st.integers(1, 4))
def test_matches_python_sets(tr, max_n, max_lag):
    res = reuse_and_union(
        tr.experts,
        max_n=max_n,
        max_lag=max_lag,
        doc_offsets=tr.doc_offsets,
        num_experts=tr.num_experts,
    )
    rho, union, ov = brute(tr, max_n, max_lag)
    assert close(res.rho, rho) and close(res.union, union) and close(res.overlap, ov)
    assert np.allclose(
        pair_overlap(
            tr.experts, max_lag=max_lag, doc_offsets=tr.doc_offsets, num_experts=tr.num_experts
        ),
        res.overlap,
        equal_nan=True,
    )
    lens = np.diff(tr.doc_offsets)
    assert res.windows.tolist() == [
        int(np.maximum(lens - n + 1, 0).sum()) for n in range(1, max_n + 1)
    ]
    # the reuse of two consecutive tokens is the overlap at lag one: the same pairs
    if max_n >= 2 and np.isfinite(res.rho[0, 1]):
        assert np.allclose(res.rho[:, 1], res.overlap[:, 0])


@settings(max_examples=25, deadline=None)
@given(
    tr=traces,
    chunk=st.integers(1, 9),
    max_n=st.integers(1, 4),
    max_lag=st.integers(0, 3),
    aligned=st.booleans(),
)
def test_chunking_does_not_change_sums(tr, chunk, max_n, max_lag, aligned):
    kw = dict(max_n=max_n, max_lag=max_lag, aligned=aligned, per_doc_counts=True)
    ref = windows._shard_sums(tr.experts, tr.doc_offsets, tr.num_experts, chunk=10**6, **kw)
    got = windows._shard_sums(tr.experts, tr.doc_offsets, tr.num_experts, chunk=chunk, **kw)
    for key in ref:
        assert np.array_equal(ref[key], got[key]), key


def test_many_short_documents():
    # more documents per chunk than the per-document loop takes (the reduceat path)
    rng = np.random.default_rng(4)
    tr = random_trace(rng, N=10, m=2, L=1, lengths=rng.integers(1, 6, size=400), sticky=0.5)
    res = reuse_and_union(
        tr.experts, max_n=3, max_lag=2, doc_offsets=tr.doc_offsets, num_experts=10
    )
    rho, union, ov = brute(tr, 3, 2)
    assert close(res.rho, rho) and close(res.union, union) and close(res.overlap, ov)


@settings(max_examples=30, deadline=None)
@given(tr=traces, n=st.integers(1, 5))
def test_window_counts_per_window(tr, n):
    doc = tr.experts[: int(tr.doc_offsets[1])]
    got_u = window_union_counts(doc, n, num_experts=tr.num_experts)
    got_r = window_reuse_counts(doc, n, num_experts=tr.num_experts)
    assert got_u.shape == got_r.shape == (max(len(doc) - n + 1, 0), tr.num_layers)
    for t in range(len(doc) - n + 1):
        for layer in range(tr.num_layers):
            sets = [set(doc[u, layer].tolist()) for u in range(t, t + n)]
            assert got_u[t, layer] == len(set().union(*sets))
            assert got_r[t, layer] == len(sets[-1] & set().union(*sets[:-1]))
    # Eq. (B.5) of paper 002 per window: X(n) = X(n−1) + m − reuse count
    if n >= 2 and len(doc) >= n:
        prev = window_union_counts(doc, n - 1, num_experts=tr.num_experts)[:-1]
        assert np.array_equal(got_u, prev + tr.top_k - got_r)


@settings(max_examples=30, deadline=None)
@given(tr=traces)
def test_popularity_counts_tokens(tr):
    p = expert_popularity(tr.experts, tr.num_experts)
    ref = np.zeros_like(p)
    for layer in range(tr.num_layers):
        for t in range(tr.num_tokens):
            for e in tr.experts[t, layer]:
                ref[layer, e] += 1 / tr.num_tokens
    assert np.allclose(p, ref) and np.allclose(p.sum(axis=1), tr.top_k)
    st_ = compute_stats(tr, max_n=1)
    assert np.allclose(st_.popularity, p)


# ------------------------------------------------------------------------------------------
# exact values on hand-made traces


def test_identical_tokens_reuse_everything():
    ex = np.tile(np.array([[3, 7, 1], [0, 2, 5]]), (30, 1, 1))  # [30, 2, 3]
    tr = RoutingTrace(experts=ex, doc_offsets=np.array([0, 12, 30]), num_experts=10)
    s = compute_stats(tr, max_n=6, max_lag=5)
    assert np.array_equal(s.rho[:, 0], [0, 0]) and np.all(s.rho[:, 1:] == 1.0)
    assert np.all(s.union == 3.0) and np.all(s.overlap == 1.0)
    assert np.allclose(s.u_bar, 1 / np.arange(1, 7))
    assert s.identity_error == 0.0


def test_disjoint_consecutive_sets():
    # token t uses block t mod 8 of 8 experts: no reuse within 8 tokens, full reuse at lag 8
    T, m = 40, 8
    ex = np.array([[np.arange(m) + m * (t % 8)] for t in range(T)])  # [T, 1, 8]
    tr = RoutingTrace(experts=ex, doc_offsets=np.array([0, T]), num_experts=64)
    s = compute_stats(tr, max_n=8, max_lag=9)
    assert np.all(s.rho == 0.0) and np.array_equal(s.union[0], m * np.arange(1, 9))
    assert np.all(s.overlap[0, :7] == 0) and s.overlap[0, 7] == 1.0 and s.overlap[0, 8] == 0
    assert np.allclose(s.u_bar, 1.0)
    # popularity is uniform, so the independence baseline is m/N and popularity explains nothing
    assert np.allclose(s.overlap_independent, m / 64) and np.isclose(
        s.decomposition.mean_popularity_part, 0.0
    )


def test_windows_never_cross_documents():
    # each document repeats one set, and consecutive documents use disjoint sets
    ex = np.concatenate([np.full((5, 1, 2), [2 * d, 2 * d + 1]) for d in range(4)])
    tr = RoutingTrace(experts=ex, doc_offsets=np.arange(0, 21, 5), num_experts=8)
    s = compute_stats(tr, max_n=5, max_lag=4)
    assert np.all(s.rho[0, 1:] == 1.0) and np.all(s.union == 2.0) and np.all(s.overlap == 1.0)


# ------------------------------------------------------------------------------------------
# Eq. (2): exact with aligned windows, within the edge bound otherwise


@settings(max_examples=30, deadline=None)
@given(tr=traces, max_n=st.integers(1, 5))
def test_identity_exact_aligned_and_bounded_otherwise(tr, max_n):
    if np.diff(tr.doc_offsets).max() < max_n:
        with pytest.raises(InputError, match=r"^max_n: ") as ei:
            compute_stats(tr, max_n=max_n)
        assert ei.value.argument == "max_n"
        return
    a = compute_stats(tr, max_n=max_n, aligned=True)
    assert a.identity_error < 1e-9 and a.identity_bound == 0.0
    s = compute_stats(tr, max_n=max_n)
    assert s.identity_error <= s.identity_bound + 1e-9


def test_identity_bound_closed_form_and_shrinks():
    # D documents of equal length t: bound(n) = m Σ_{j≤n} (n − j)/(t − j + 1), exactly
    m, max_n, D = 4, 6, 3
    for t in (10, 100, 1000):
        w = np.array([[t - n + 1 for n in range(1, max_n + 1)]] * D)
        got = windows.identity_bound(w, m)
        ref = [
            m * sum(Fraction(n - j, t - j + 1) for j in range(1, n + 1))
            for n in range(1, max_n + 1)
        ]
        assert np.allclose(got, [float(r) for r in ref], rtol=1e-12)
    rng = np.random.default_rng(3)
    errs = []
    for t in (40, 400):
        tr = random_trace(rng, N=16, m=m, L=2, lengths=[t] * 3, sticky=0.6)
        s = compute_stats(tr, max_n=max_n)
        assert s.identity_error <= s.identity_bound
        errs.append(s.identity_bound)
    assert errs[1] < errs[0] / 5


# ------------------------------------------------------------------------------------------
# uniform routing: the closed forms within sampling error


def test_uniform_routing_matches_closed_forms():
    rng = np.random.default_rng(11)
    N, m, L, T = 32, 4, 2, 12000
    ex = np.argsort(rng.random((T, L, N)), axis=-1)[..., :m]
    tr = RoutingTrace(experts=ex, doc_offsets=np.array([0, T // 2, T]), num_experts=N)
    max_n = 9
    s = compute_stats(tr, max_n=max_n, max_lag=4)
    q = 1 - m / N
    assert np.allclose(s.uniform_union, N * (1 - q ** np.arange(1, 10)))
    assert np.allclose(s.uniform_rho, 1 - q ** np.arange(9))
    for n in range(2, max_n + 1):
        # per-window values, their spread, and T/n effectively independent windows
        x = window_union_counts(ex, n, num_experts=N)
        r = window_reuse_counts(ex, n, num_experts=N) / m
        se_u = x.std() / np.sqrt(x.size / n)
        se_r = r.std() / np.sqrt(r.size / n)
        assert abs(s.union_mean[n - 1] - s.uniform_union[n - 1]) < 5 * se_u
        assert abs(s.rho_mean[n - 1] - s.uniform_rho[n - 1]) < 5 * se_r
    # ρ(2) ≈ m/N, and overlap ≈ the independence ≈ the uniform baseline at every lag
    assert abs(s.rho_mean[1] - m / N) < 5 * np.sqrt(m / N / (L * T * m))
    assert np.allclose(s.overlap, m / N, atol=0.01)
    assert np.allclose(s.overlap_independent, m / N, atol=0.002)


def test_independent_skewed_routing_has_no_temporal_overlap():
    rng = np.random.default_rng(5)
    N, m, T = 16, 2, 20000
    p = np.linspace(1, 6, N)
    p /= p.sum()
    keys = np.log(rng.random((T, 1, N))) / p  # weighted sampling w/o repl.
    ex = np.argsort(-keys, axis=-1)[..., :m]
    tr = RoutingTrace(experts=ex, doc_offsets=np.array([0, T]), num_experts=N)
    s = compute_stats(tr, max_n=4, max_lag=3)
    assert s.overlap_independent[0, 0] > s.overlap_uniform + 0.01  # popularity is skewed
    assert np.allclose(s.overlap[0], s.overlap_independent[0], atol=0.01)
    assert np.allclose(s.union[0], s.union_independent[0], rtol=0.01)
    assert np.all(np.abs(s.decomposition.mean_temporal_part) < 0.01)


def test_baselines_closed_forms():
    N, m = 12, 3
    p = np.full((2, N), m / N)
    assert np.allclose(independent_union(p, 7), uniform_union(N, m, 7))
    assert np.allclose(independent_overlap(p, m), m / N)
    # union of one token is m, and U(n) − U(n−1) = m(1 − ρ(n)) under uniform routing
    u, r = uniform_union(N, m, 7), uniform_reuse(N, m, 7)
    assert np.isclose(u[0], m) and np.allclose(np.diff(u), m * (1 - r[1:]))


# ------------------------------------------------------------------------------------------
# byte weighting: ū(n) and ρ̄_k


def test_u_bar_and_rho_bar_against_fractions():
    union = np.array([[2, 3.5, 4], [2, 2.5, 3]])  # [L=2, n=3], m = 2
    rho = np.array([[0, 0.25, 0.5], [0, 0.75, 0.5]])
    w = np.array([1.0, 3.0])
    u = u_bar_of(union, w, 2)
    for n in range(1, 4):
        ref = (Fraction(1) * Fraction(union[0, n - 1]) + 3 * Fraction(union[1, n - 1])) / (
            2 * n * 4
        )
        assert u[n - 1] == pytest.approx(float(ref), abs=1e-15)
    rb = rho_bar_of(rho, w)  # Eq. (11)
    assert rb[0] == pytest.approx((0.25 + 3 * 0.75) / 4)
    assert rb[1] == pytest.approx(((0.25 + 3 * 0.75) + (0.5 + 3 * 0.5)) / (2 * 4))


def test_rho_bar_is_eq11_of_the_cost_model():
    """rho_bar_of is Eq. (11) as specmoe.cost.bytes.mean_reuse computes it, k by k; NaN from
    the first window length without windows (rho NaN there)."""
    from specmoe.cost.bytes import mean_reuse

    rng = np.random.default_rng(3)
    rho = rng.uniform(0, 1, size=(5, 9))
    w = rng.uniform(1, 4, size=5)
    rb = rho_bar_of(rho, w)
    assert rb.tolist() == [mean_reuse(w, rho, k) for k in range(1, 9)]
    rho[:, 6:] = np.nan  # no windows of 7 tokens or more
    rb = rho_bar_of(rho, w)
    assert rb[:5].tolist() == [mean_reuse(w, rho[:, :6], k) for k in range(1, 6)]
    assert np.isnan(rb[5:]).all() and rb.shape == (8,)


def test_spec_weighting_and_eq12():
    rng = np.random.default_rng(2)
    tr = random_trace(rng, N=16, m=2, L=3, lengths=[30, 25], sticky=0.5)
    spec = ModelSpec(
        name="toy", num_experts=16, top_k=2, num_moe_layers=3, hidden_size=8, expert_intermediate=4
    )
    s = compute_stats(tr, max_n=5, spec=spec, aligned=True)
    assert s.weighted and np.allclose(s.layer_weights, spec.expert_bytes)
    n = np.arange(1, 6)
    assert np.allclose(s.u_bar, s.union.sum(axis=0) / (2 * n * 3))
    # Eq. (12): E_dedup(k+1) = mW + mWk(1 − ρ̄_k), exact with aligned windows
    W = spec.total_expert_bytes
    e_dedup = (s.layer_weights[:, None] * s.union).sum(axis=0)
    k = np.arange(1, 5)
    assert np.allclose(e_dedup[1:], 2 * W + 2 * W * k * (1 - s.rho_bar))
    # a spec of more layers picks the trace's layers; a mismatched one is an InputError
    big = ModelSpec(
        name="big", num_experts=16, top_k=2, num_moe_layers=8, hidden_size=8, expert_intermediate=4
    )
    assert np.allclose(compute_stats(tr, max_n=2, spec=big).layer_weights, big.expert_bytes)
    bad = ModelSpec(
        name="bad", num_experts=32, top_k=2, num_moe_layers=3, hidden_size=8, expert_intermediate=4
    )
    with pytest.raises(InputError, match="N=32") as ei:
        compute_stats(tr, max_n=2, spec=bad)
    assert ei.value.argument == "spec"


# ------------------------------------------------------------------------------------------
# bootstrap


@pytest.fixture(scope="module")
def sticky_trace():
    rng = np.random.default_rng(7)
    lengths = rng.integers(20, 60, size=24)
    return random_trace(rng, N=16, m=2, L=2, lengths=lengths, sticky=0.5)


def test_resample_equals_repeated_documents(sticky_trace):
    tr = sticky_trace
    sums = document_sums(tr, max_n=4, max_lag=3, per_document_counts=True)
    c = np.random.default_rng(0).multinomial(
        tr.num_documents, np.full(tr.num_documents, 1 / tr.num_documents)
    )
    rep = tr.select_documents(np.repeat(np.arange(tr.num_documents), c))
    ref = compute_stats(rep, max_n=4, max_lag=3)
    got = resampled_statistics(sums, c[None, :])
    assert np.allclose(got["rho_mean"][0], ref.rho_mean)
    assert np.allclose(got["union_mean"][0], ref.union_mean)
    assert np.allclose(got["u_bar"][0], ref.u_bar)
    assert np.allclose(got["overlap"][0], ref.overlap)
    assert np.isclose(got["overlap_independent_mean"][0], ref.overlap_independent[:, 0].mean())
    assert np.allclose(got["temporal_share"][0], ref.decomposition.mean_temporal_share)
    ones = resampled_statistics(sums, np.ones((1, tr.num_documents)))
    point = compute_stats(tr, max_n=4, max_lag=3)
    assert np.allclose(ones["rho_bar"][0], point.rho_bar)


def test_bootstrap_covers_point_and_is_reproducible(sticky_trace):
    s = compute_stats(sticky_trace, max_n=4, max_lag=3, bootstrap=400, seed=1)
    iv = s.intervals
    assert iv.resamples == 400 and iv.level == 0.95
    for name in ("rho_mean", "union_mean", "u_bar", "overlap_mean"):
        point, band = getattr(s, name), getattr(iv, name)
        assert np.all(band.lo <= point + 1e-12) and np.all(point <= band.hi + 1e-12), name
    assert np.all(iv.rho_mean.hi[1:] > iv.rho_mean.lo[1:])  # a real spread
    again = compute_stats(sticky_trace, max_n=4, max_lag=3, bootstrap=400, seed=1).intervals
    other = compute_stats(sticky_trace, max_n=4, max_lag=3, bootstrap=400, seed=2).intervals
    assert np.array_equal(again.rho_mean.lo, iv.rho_mean.lo)
    assert np.array_equal(again.overlap.hi, iv.overlap.hi)
    assert not np.array_equal(other.rho_mean.lo, iv.rho_mean.lo)
    with pytest.raises(InputError):
        bootstrap_intervals(document_sums(sticky_trace, max_n=2), resamples=10)


# ------------------------------------------------------------------------------------------
# shards


def test_sharded_directory_equals_concatenated(tmp_path, sticky_trace):
    tr = sticky_trace
    cut = [0, 5, 6, 15, tr.num_documents]
    d = tmp_path / "shards"
    for i, (a, b) in enumerate(itertools.pairwise(cut)):
        save_trace(tr.select_documents(list(range(a, b))), d / f"part{i:02d}.npz")
    seen = []
    kw = dict(max_n=5, max_lag=4, bootstrap=50, seed=3)
    whole = compute_stats(tr, **kw)
    sharded = compute_stats(d, progress=lambda i, n: seen.append((i, n)), **kw)
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    a, b = whole.to_dict(), sharded.to_dict()
    assert json.dumps(a) == json.dumps(b)


# ------------------------------------------------------------------------------------------
# arguments and the CLI


def test_bad_arguments(sticky_trace):
    """Each bad argument is an error that names that argument (not a command-line flag)."""
    for kw, pattern in (
        (dict(max_n=0), "^max_n: must be an integer >= 1"),
        (dict(max_n=1000), "^max_n: 1000 is longer than every document"),
        (dict(max_lag=0), "^max_lag: must be an integer >= 1"),
        (dict(max_lag=1000), "^max_lag: 1000 leaves no pair"),
        (dict(bootstrap=-1), "^bootstrap: must be an integer >= 0"),
        (dict(spec=resolve_spec("OLMoE-1B-7B-0125")), "^spec: model 'OLMoE-1B-7B-0125'"),
    ):
        with pytest.raises(InputError, match=pattern) as ei:
            compute_stats(sticky_trace, **kw)
        assert ei.value.argument == next(iter(kw)) and "--" not in str(ei.value)
    s = compute_stats(sticky_trace.select_documents([0]), max_n=2)
    assert s.max_lag == min(16, int(np.diff(sticky_trace.doc_offsets)[0]) - 1)


@pytest.fixture()
def trace_file(tmp_path, sticky_trace):
    return save_trace(sticky_trace, tmp_path / "t.npz")


def test_cli_json(capsys, trace_file, sticky_trace):
    assert (
        main(
            [
                "stats",
                str(trace_file),
                "--max-n",
                "4",
                "--max-lag",
                "3",
                "--json",
                "--bootstrap",
                "20",
            ]
        )
        == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert (d["num_experts"], d["top_k"], d["num_layers"], d["tokens"], d["documents"]) == (
        16,
        2,
        2,
        sticky_trace.num_tokens,
        sticky_trace.num_documents,
    )
    assert np.array(d["rho"]).shape == (2, 4) and np.array(d["union"]).shape == (2, 4)
    assert len(d["rho_mean"]) == len(d["union_mean"]) == len(d["u_bar"]) == 4
    assert np.array(d["overlap"]).shape == (2, 3)
    assert set(d["intervals"]["rho_mean"]) == {"lo", "hi"}
    assert "uniform_union" in d and "overlap_independent" in d and "decomposition" in d


def test_cli_summary_and_out(capsys, trace_file, tmp_path):
    out = tmp_path / "out"
    assert main(["stats", str(trace_file), "--max-n", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rho_mean" in text and "overlap" in text
    d = json.loads((out / "stats.json").read_text())
    assert len(d["rho_mean"]) == 3
    for name in ("reuse.png", "overlap.png", "layer_overlap.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["no-such-trace.npz"],
        ["{trace}", "--max-n", "0"],
        ["{trace}", "--max-n", "500"],
        ["{trace}", "--max-lag", "0"],
        ["{trace}", "--model", "OLMoE-1B-7B-0125"],
    ],
)
def test_cli_bad_input_is_one_line(capsys, trace_file, argv):
    argv = [a.format(trace=trace_file) for a in argv]
    assert main(["stats", *argv, "--json"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["--max-n", "500"], "--max-n"),  # compute_stats' max_n: longer than every document
        (["--max-lag", "500"], "--max-lag"),  # its max_lag: no pair of tokens that far apart
        (["--model", "OLMoE-1B-7B-0125"], "--model"),  # its spec: N and m disagree
    ],
)
def test_cli_names_the_flag_of_a_library_argument(capsys, trace_file, argv, flag):
    assert main(["stats", str(trace_file), *argv]) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert cap.out == "" and len(lines) == 1, cap.err
    assert lines[0].startswith(f"specmoe stats: error: {flag}: "), lines[0]
    assert "max_n" not in lines[0] and "max_lag" not in lines[0] and "spec:" not in lines[0]
