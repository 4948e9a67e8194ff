"""Maximum-entropy IPF: against an independent convex-dual solver, ipfn, brute-force counts,
exact special cases, and measured unions of traces it did not fit on."""

from __future__ import annotations

import contextlib
import io
import itertools
import json

import numpy as np
import pytest
import scipy.optimize
from hypothesis import given, settings
from hypothesis import strategies as st

from specmoe.cli import main
from specmoe.errors import InputError
from specmoe.formats.trace import RoutingTrace, save_trace
from specmoe.routing.ipf import (
    STATUS_CONVERGED,
    STATUS_INFEASIBLE,
    STATUS_NOT_CONVERGED,
    ExpertMoments,
    bin_experts,
    coactivation_counts,
    fit_document_moments,
    fit_moments,
    ipf_pairwise,
    load_moments,
    pattern_bits,
    predict_union,
    save_moments,
    solve_windows,
    stationary_moments,
)
from specmoe.routing.stats import compute_stats

# ------------------------------------------------------------------------------------------
# Reference routing processes and solvers


def sticky_trace(
    T: int,
    L: int,
    N: int,
    m: int,
    stick,
    *,
    alpha: float = 2.0,
    seed: int = 0,
    doc_len: int | None = None,
) -> RoutingTrace:
    """Each of the previous token's experts stays with probability stick[l]; the free slots are
    drawn without replacement from the other experts with fixed popularity weights (Gumbel
    top-k). A first-order process with skewed popularity and decaying overlap."""
    rng = np.random.default_rng(seed)
    logw = np.log(rng.dirichlet(np.full(N, alpha), size=L))  # [L, N]
    stick = np.asarray(stick, dtype=float)[:, None]
    out = np.empty((T, L, m), dtype=np.int16)
    prev = None
    for t in range(T):
        keys = logw + rng.gumbel(size=(L, N))
        if prev is not None and not (doc_len and t % doc_len == 0):
            keep = np.zeros((L, N), dtype=bool)
            np.put_along_axis(keep, prev, rng.random((L, m)) < stick, axis=1)
            keys[keep] = np.inf
        prev = np.argpartition(-keys, m - 1, axis=1)[:, :m]
        out[t] = prev
    off = [0, T] if not doc_len else sorted(set(range(0, T, doc_len)) | {T})
    return RoutingTrace(experts=out, doc_offsets=np.asarray(off), num_experts=N)


def dual_maxent(M: np.ndarray) -> np.ndarray:
    """Maximum-entropy law with moments M [n, n] from the convex dual: minimise
    log Σ_x exp(θ·f(x)) − θ·c over θ, f(x) = (x_i, x_i x_k (i<k)), by trust-region Newton."""
    n = M.shape[0]
    X = np.array(list(itertools.product((0, 1), repeat=n)), dtype=float)
    iu = np.triu_indices(n, 1)
    F = np.concatenate([X, X[:, iu[0]] * X[:, iu[1]]], axis=1)
    c = np.concatenate([np.diag(M), M[iu]])

    def parts(th):
        a = F @ th
        w = np.exp(a - a.max())
        q = w / w.sum()
        mean = F.T @ q
        return a.max() + np.log(w.sum()) - th @ c, mean - c, (F.T * q) @ F - np.outer(mean, mean)

    res = scipy.optimize.minimize(
        lambda t: parts(t)[0],
        np.zeros(F.shape[1]),
        jac=lambda t: parts(t)[1],
        hess=lambda t: parts(t)[2],
        method="trust-exact",
        options={"gtol": 1e-12},
    )
    a = F @ res.x
    q = np.exp(a - a.max())
    return q / q.sum()


def moments_of(Q: np.ndarray, n: int) -> np.ndarray:
    X = pattern_bits(n).astype(float)
    return (X.T * Q) @ X


def entropy(q: np.ndarray) -> float:
    q = q[q > 0]
    return float(-(q * np.log(q)).sum())


def naive_union(trace: RoutingTrace, n: int) -> np.ndarray:
    """[L] mean distinct experts over windows of n tokens inside a document (plain Python)."""
    L = trace.num_layers
    tot, cnt = np.zeros(L), 0
    for a, b in zip(trace.doc_offsets[:-1], trace.doc_offsets[1:]):
        for t in range(a, b - n + 1):
            cnt += 1
            for layer in range(L):
                tot[layer] += len(set(trace.experts[t : t + n, layer].ravel().tolist()))
    return tot / cnt


@pytest.fixture(scope="module")
def sticky_split():
    """A fit and a validation trace of the same sticky process (different documents)."""
    tr = sticky_trace(16000, 3, 32, 4, [0.3, 0.55, 0.8], seed=3, doc_len=400)
    D = tr.num_documents
    return tr.select_documents(np.arange(0, D, 2)), tr.select_documents(np.arange(1, D, 2))


# ------------------------------------------------------------------------------------------
# The solver


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 5), seed=st.integers(0, 2**31 - 1))
def test_ipf_matches_convex_dual_solver(n, seed):
    rng = np.random.default_rng(seed)
    Q = rng.dirichlet(np.full(2**n, 0.7)) * 0.98 + 0.02 / 2**n  # interior: every pattern > 0
    M = moments_of(Q, n)
    sol = ipf_pairwise(M[None], tol=1e-13, max_iter=20000)
    assert sol.status[0] == STATUS_CONVERGED
    ref = dual_maxent(M)
    np.testing.assert_allclose(sol.probs[0], ref, atol=1e-8, rtol=0)
    # it meets the moments, and no law with these moments has more entropy (Q has them)
    np.testing.assert_allclose(moments_of(sol.probs[0], n), M, atol=1e-12)
    assert entropy(sol.probs[0]) >= entropy(Q) - 1e-12


def test_stationary_window_matches_dual_and_ipfn():
    ipfn = pytest.importorskip("ipfn")
    p, c = 0.09, np.array([0.05, 0.03, 0.02])
    M = stationary_moments([p], c[None], 4)[0]
    sol = solve_windows(np.array([p]), c[None], 4, tol=1e-13)
    np.testing.assert_allclose(sol.probs[0], dual_maxent(M), atol=1e-8, rtol=0)
    tables = [
        np.array([[1 - 2 * p + c[k - i - 1], p - c[k - i - 1]], [p - c[k - i - 1], c[k - i - 1]]])
        for i, k in itertools.combinations(range(4), 2)
    ]
    dims = [[i, k] for i, k in itertools.combinations(range(4), 2)]
    with contextlib.redirect_stdout(io.StringIO()):
        ref = ipfn.ipfn.ipfn(
            np.full((2,) * 4, 1 / 16),
            tables,
            dims,
            convergence_rate=1e-12,
            max_iteration=5000,
            rate_tolerance=0,
        ).iteration()
    np.testing.assert_allclose(sol.probs[0], ref.reshape(-1), atol=1e-9, rtol=0)


@settings(max_examples=30, deadline=None)
@given(p=st.floats(0.0, 0.6), n=st.integers(1, 7))
def test_independent_constraints_give_product_law(p, n):
    sol = solve_windows(np.array([p]), np.full((1, max(n - 1, 1)), p * p), n)
    assert sol.status[0] == STATUS_CONVERGED
    bits = pattern_bits(n)
    k = bits.sum(axis=1)
    np.testing.assert_allclose(sol.probs[0], p**k * (1 - p) ** (n - k), atol=1e-9)
    assert sol.p_any[0] == pytest.approx(1 - (1 - p) ** n, abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(
    p=st.floats(0.01, 0.5),
    r=st.lists(st.floats(0.0, 1.0), min_size=5, max_size=5),
    n=st.integers(2, 6),
)
def test_solution_is_a_reversal_symmetric_law_with_its_moments(p, r, n):
    # a stationary first-order chain has feasible lagged moments: c(j) = p P(x_j=1 | x_0=1)
    stay = r[0] * (1 - p) + p  # P(1 -> 1) >= p: positive correlation
    a = (p - p * stay) / (1 - p)  # P(0 -> 1) keeps p stationary
    lam = stay - a
    c = np.array([p * (p + (1 - p) * lam**j) for j in range(1, n)])
    sol = solve_windows(np.array([p]), c[None], n, max_iter=20000)
    if sol.status[0] != STATUS_CONVERGED:  # solutions on the boundary: only approached
        assert sol.max_violation[0] < 1e-6
        return
    q = sol.probs[0]
    assert q.min() >= 0 and q.sum() == pytest.approx(1, abs=1e-12)
    np.testing.assert_allclose(moments_of(q, n), stationary_moments([p], c[None], n)[0], atol=1e-9)
    rev = q.reshape((2,) * n).transpose(tuple(range(n))[::-1]).reshape(-1)
    np.testing.assert_allclose(q, rev, atol=1e-8)


def test_infeasible_and_non_convergent_are_statuses():
    # c > p makes a negative cell: infeasible, not iterated
    sol = solve_windows(np.array([0.1, 0.1]), np.array([[0.2, 0.0], [0.05, 0.02]]), 3)
    assert sol.status.tolist() == [STATUS_INFEASIBLE, STATUS_CONVERGED]
    assert np.isnan(sol.probs[0]).all() and np.isfinite(sol.probs[1]).all()
    # every table valid, jointly impossible: x1 = x2 = x3 always (lag 1) but never x1 = x3 = 1
    sol = solve_windows(np.array([0.5]), np.array([[0.5, 0.0]]), 3, max_iter=3000)
    assert sol.status[0] == STATUS_NOT_CONVERGED and sol.max_violation[0] > 1e-3


def test_prediction_moves_edge_estimates_into_the_valid_box():
    # an always-active run measured over pairs can put c a hair above p: clipped and counted
    pop = np.full((1, 4), 0.5)
    co = np.array([[[0.5005, 0.2, 0.1, 0.4]], [[0.3, 0.2, 0.1, 0.3]]]).reshape(1, 2, 4)
    pred = predict_union(
        ExpertMoments(num_experts=4, top_k=2, popularity=pop, coactivation=co), max_n=3, bins=4
    )
    assert pred.clipped == 1 and np.all(np.isfinite(pred.predicted))
    # the same as predicting from the clipped target c = p
    ref = predict_union(
        ExpertMoments(
            num_experts=4,
            top_k=2,
            popularity=pop,
            coactivation=np.where(co > pop[:, None], 0.5, co),
        ),
        max_n=3,
        bins=4,
    )
    np.testing.assert_allclose(pred.predicted, ref.predicted, atol=1e-8)


def test_bad_moment_shapes_raise():
    with pytest.raises(InputError):
        ipf_pairwise(np.zeros((2, 3)))
    with pytest.raises(InputError):
        stationary_moments([0.1], [[0.01]], 4)


# ------------------------------------------------------------------------------------------
# Statistics and prediction


def test_coactivation_counts_match_brute_force():
    tr = sticky_trace(300, 2, 12, 3, [0.5, 0.7], seed=1, doc_len=37)
    counts, pairs = coactivation_counts(tr.experts, tr.doc_offsets, 12, max_lag=4)
    doc = np.repeat(np.arange(tr.num_documents), np.diff(tr.doc_offsets))
    for j in range(1, 5):
        ref = np.zeros((2, 12))
        npair = 0
        for t in range(tr.num_tokens - j):
            if doc[t] != doc[t + j]:
                continue
            npair += 1
            for layer in range(2):
                for e in set(tr.experts[t, layer].tolist()) & set(
                    tr.experts[t + j, layer].tolist()
                ):
                    ref[layer, e] += 1
        assert pairs[j - 1] == npair
        np.testing.assert_array_equal(counts[:, j - 1], ref)


def test_fit_moments_agrees_with_stats(sticky_split):
    fit, _ = sticky_split
    mo = fit_moments(fit, max_lag=8)
    st_ = compute_stats(fit, max_n=9, max_lag=8)
    np.testing.assert_allclose(mo.overlap, st_.overlap, atol=1e-12)
    np.testing.assert_allclose(mo.popularity.sum(axis=1), 4.0)
    np.testing.assert_allclose(mo.union[:, 2], naive_union(fit, 3), rtol=1e-12)


def test_skewed_prediction_within_2pct_on_held_out_documents(sticky_split):
    fit, val = sticky_split
    pred = predict_union(fit_moments(fit, max_lag=8), max_n=9, variant="skewed", bins=8)
    assert pred.converged
    emp = compute_stats(val, max_n=9, max_lag=1).union[:, 1:].mean(axis=0)
    err = np.abs(pred.mean_predicted / emp - 1)
    assert err.max() < 0.02, err
    # both independence baselines are far off on a process with overlap
    assert np.all(pred.popularity_baseline.mean(axis=0)[1:] > 1.2 * emp[1:])
    assert np.all(pred.uniform_baseline[1:] > pred.popularity_baseline.mean(axis=0)[1:])


def test_uniform_routing_predicts_the_uniform_baseline():
    rng = np.random.default_rng(5)
    T, L, N, m = 20000, 2, 16, 3
    ex = np.argsort(rng.random((T, L, N)), axis=2)[:, :, :m]
    tr = RoutingTrace(experts=ex, doc_offsets=np.array([0, T]), num_experts=N)
    mo = fit_moments(tr, max_lag=5)
    for variant in ("uniform", "skewed"):
        pred = predict_union(mo, max_n=6, variant=variant, bins=4)
        np.testing.assert_allclose(pred.mean_predicted, pred.uniform_baseline, rtol=0.01)
        np.testing.assert_allclose(pred.mean_predicted, mo.union[:, 1:].mean(axis=0), rtol=0.01)


def test_skewed_with_equal_popularity_equals_uniform():
    L, N, J = 2, 8, 3
    pop = np.full((L, N), 2 / N)
    co = np.broadcast_to(np.array([0.12, 0.08, 0.06])[None, :, None], (L, J, N)).copy()
    mo = ExpertMoments(num_experts=N, top_k=2, popularity=pop, coactivation=co)
    a = predict_union(mo, max_n=4, variant="uniform")
    b = predict_union(mo, max_n=4, variant="skewed", bins=4)
    np.testing.assert_allclose(a.predicted, b.predicted, rtol=1e-9)
    assert np.all(np.diff(a.predicted, axis=1) > 0) and np.all(a.predicted < N)


def test_bin_experts_splits_by_popularity():
    pop = np.array([[0.5, 0.1, 0.3, 0.2, 0.4, 0.0]])
    b = bin_experts(pop, 3)
    assert b.tolist() == [[2, 0, 1, 1, 2, 0]]
    with pytest.raises(InputError):
        bin_experts(pop, 7)


def test_document_moments_are_each_documents_own(sticky_split):
    fit = sticky_split[0].select_documents([0, 1, 2])
    parts = fit_document_moments(fit, max_lag=4)
    assert [q.tokens for q in parts] == np.diff(fit.doc_offsets).tolist()
    for d, part in enumerate(parts):
        ref = fit_moments(fit.select_documents([d]), max_lag=4)
        np.testing.assert_allclose(part.popularity, ref.popularity, atol=1e-12)
        np.testing.assert_allclose(part.coactivation, ref.coactivation, atol=1e-12)
    # equal documents: the mixture is the pooled law's prediction
    twice = fit.select_documents([1, 1])
    a = predict_union(fit_document_moments(twice, max_lag=4), max_n=5, bins=4)
    b = predict_union(fit_moments(fit.select_documents([1]), max_lag=4), max_n=5, bins=4)
    assert a.pooling == "documents" and b.pooling == "trace"
    np.testing.assert_allclose(a.predicted, b.predicted, rtol=1e-9)
    np.testing.assert_allclose(a.popularity_baseline, b.popularity_baseline, rtol=1e-12)


def test_document_mixture_keeps_per_document_regimes():
    # every document routes with its own popularity (a regime): pooled pairwise statistics
    # overstate the union of long windows; the per-document mixture does not
    docs = [sticky_trace(300, 2, 32, 4, [0.3, 0.5], alpha=0.3, seed=100 + d) for d in range(48)]
    tr = RoutingTrace.concatenate(docs)
    fit, val = tr.select_documents(np.arange(0, 48, 2)), tr.select_documents(np.arange(1, 48, 2))
    emp = compute_stats(val, max_n=9, max_lag=1).union[:, 1:].mean(axis=0)
    pooled = predict_union(fit_moments(fit, max_lag=8), max_n=9, bins=8)
    mixed = predict_union(fit_document_moments(fit, max_lag=8), max_n=9, bins=8)
    # short documents can give (by a hair) jointly infeasible tables: IPF says so
    assert pooled.converged and mixed.max_violation.max() < 1e-4
    assert np.abs(mixed.mean_predicted / emp - 1).max() < 0.03
    assert (pooled.mean_predicted / emp - 1)[-1] > 0.05


def test_window_beyond_statistics_and_bad_variant_raise(sticky_split):
    mo = fit_moments(sticky_split[0], max_lag=3)
    for kw, argument, needle in (
        (dict(max_n=5), "max_n", "needs lags up to 4"),
        (dict(max_n=4, variant="zipf"), "variant", "unknown variant 'zipf'"),
        (dict(max_n=4, bins=99), "bins", "must be in 1..32"),
        (dict(max_n=4, tol=0.0), "tol", "must be > 0"),
        (dict(max_n=4, max_iter=0), "max_iter", "must be >= 1"),
        (dict(max_n=4, min_n=5), "max_n", "need 1 <= min_n <= max_n"),
    ):
        with pytest.raises(InputError) as ei:
            predict_union(mo, **kw)
        assert ei.value.argument == argument, (kw, str(ei.value))
        assert str(ei.value).startswith(f"{argument}: ") and needle in str(ei.value)


def test_fits_name_max_lag(sticky_split):
    """max_lag < 1, or longer than every document: an error in the argument max_lag."""
    tr = sticky_split[0]
    longest = int(np.diff(tr.doc_offsets).max())
    for fit in (fit_moments, fit_document_moments):
        for bad, needle in ((0, "must be an integer >= 1"), (longest, "no document is longer")):
            with pytest.raises(InputError) as ei:
                fit(tr, max_lag=bad)
            assert ei.value.argument == "max_lag" and needle in str(ei.value), str(ei.value)
            assert "--" not in str(ei.value)


def test_stats_file_round_trip_and_errors(tmp_path, sticky_split):
    mo = fit_moments(sticky_split[0], max_lag=3)
    path = save_moments(mo, tmp_path / "s.json")
    back = load_moments(path)
    np.testing.assert_allclose(back.coactivation, mo.coactivation, atol=1e-9)
    np.testing.assert_allclose(back.union, mo.union, atol=1e-9)
    assert (back.num_experts, back.top_k) == (mo.num_experts, mo.top_k)
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(InputError, match=r"bad\.json"):
        load_moments(tmp_path / "bad.json")
    obj = json.loads(path.read_text())
    obj["coactivation"][0][0][0] = 2.0
    (tmp_path / "range.json").write_text(json.dumps(obj))
    with pytest.raises(InputError, match="out of range"):
        load_moments(tmp_path / "range.json")


# ------------------------------------------------------------------------------------------
# CLI


def test_cli_json_is_clean_and_complete(tmp_path, capsys, sticky_split):
    fit, val = sticky_split
    save_trace(fit, tmp_path / "fit.npz")
    save_trace(val, tmp_path / "val.npz")
    rc = main(
        [
            "ipf",
            str(tmp_path / "fit.npz"),
            "--validate",
            str(tmp_path / "val.npz"),
            "--max-n",
            "5",
            "--json",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert rc == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["n"] == [2, 3, 4, 5] and rec["variant"] == "skewed"
    assert rec["pooling"] == "documents" and rec["per_layer"]["status"][0][0] == "converged"
    assert len(rec["per_layer"]["predicted"]) == 3 and len(rec["per_layer"]["empirical"]) == 3
    emp = compute_stats(val, max_n=5, max_lag=1).union[:, 1:]
    np.testing.assert_allclose(rec["empirical_union"], emp.mean(axis=0))
    assert set(rec["baselines"]) >= {"uniform_independent", "popularity_independent"}
    for name in ("ipf.json", "stats.json", "ipf_union.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    # the written STATS file is a valid fit source; n beyond its lags is bad input
    rc = main(["ipf", str(tmp_path / "out" / "stats.json"), "--max-n", "5", "--json"])
    again = json.loads(capsys.readouterr().out)
    assert rc == 0 and again["n"] == [2, 3, 4, 5] and again["pooling"] == "trace"
    assert main(["ipf", str(tmp_path / "out" / "stats.json"), "--pool", "documents"]) == 2
    capsys.readouterr()
    assert main(["ipf", str(tmp_path / "out" / "stats.json"), "--max-n", "7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specmoe ipf: error: --max-n: n=7 needs lags")


@pytest.mark.parametrize("pool", ["documents", "trace"])
def test_cli_max_n_beyond_every_document_names_max_n(tmp_path, capsys, sticky_split, pool):
    """The fits' max_lag is --max-n minus one: the command names --max-n, not max_lag."""
    tr = sticky_split[0]
    save_trace(tr, tmp_path / "fit.npz")
    longest = int(np.diff(tr.doc_offsets).max())
    argv = ["ipf", str(tmp_path / "fit.npz"), "--max-n", str(longest + 1), "--pool", pool]
    assert main(argv) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()  # progress lines, then the error
    assert cap.out == "" and [e for e in err if "error:" in e] == err[-1:], cap.err
    assert err[-1].startswith("specmoe ipf: error: --max-n: "), err[-1]
    assert f"no document is longer than {longest} tokens" in err[-1] and "max_lag" not in err[-1]


def test_cli_rejects_mismatched_validation_trace(tmp_path, capsys, sticky_split):
    save_trace(sticky_split[0], tmp_path / "fit.npz")
    save_trace(sticky_split[0].select_layers([0, 1]), tmp_path / "two.npz")
    assert (
        main(
            [
                "ipf",
                str(tmp_path / "fit.npz"),
                "--validate",
                str(tmp_path / "two.npz"),
                "--max-n",
                "3",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--validate" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------
# Real routing (slow)


@pytest.mark.slow
def test_bundled_traces_within_2pct():
    from specmoe.data import bundled_trace_path

    fit, val = bundled_trace_path("fit"), bundled_trace_path("validation")
    if not (fit.exists() and val.exists()):
        pytest.skip("bundled traces not built")
    from specmoe.formats.trace import open_trace

    emp = compute_stats(open_trace(val), max_n=9, max_lag=1).union[:, 1:].mean(axis=0)
    # measured on the 120k-token traces: documents +0.4..+1.6%, trace +0.4..+3.6%
    mixed = predict_union(fit_document_moments(open_trace(fit), max_lag=8), max_n=9)
    assert np.abs(mixed.mean_predicted / emp - 1).max() < 0.02
    pooled = predict_union(fit_moments(open_trace(fit), max_lag=8), max_n=9)
    assert np.abs(pooled.mean_predicted / emp - 1).max() < 0.04


@pytest.mark.slow
def test_random_hf_model_traces(tmp_path, tiny_moe, byte_tok):
    """A randomly initialised OLMoE on the corpus' fit and validation documents.

    Random-weight routing sits in a regime per document (overlap that hardly decays with the
    lag), so the pooled law misses long windows (measured: +6% at n = 9) while the mixture of
    per-document laws stays within 3% (measured: at most 2.9%, of which 1.8% is the shift of
    o(1) between the fit and validation documents, already at n = 2).
    """
    from specmoe.data import documents
    from specmoe.engine.capture import capture_documents
    from specmoe.formats.trace import open_trace

    model = tiny_moe(
        "olmoe", seed=1, num_experts=64, top_k=8, num_layers=4, hidden=64, context=1024
    )

    def docs(split, k):
        return [(n, t.encode()[:600].decode("utf-8", "ignore")) for n, t in documents(split)[:k]]

    fit = capture_documents(
        model, byte_tok, docs("fit", 50), tmp_path / "fit", progress=False, max_context=1024
    )
    val = capture_documents(
        model, byte_tok, docs("validation", 25), tmp_path / "val", progress=False, max_context=1024
    )
    emp = compute_stats(open_trace(val), max_n=9, max_lag=1).union[:, 1:].mean(axis=0)
    pooled = predict_union(fit_moments(open_trace(fit), max_lag=8), max_n=9)
    mixed = predict_union(fit_document_moments(open_trace(fit), max_lag=8), max_n=9)
    # short documents can give (by a hair) jointly infeasible tables: IPF says so
    assert pooled.converged and mixed.max_violation.max() < 1e-4
    assert np.abs(mixed.mean_predicted / emp - 1).max() < 0.035
    # both beat independent routing with the measured popularity by far
    for pred in (pooled, mixed):
        err = np.abs(pred.mean_predicted / emp - 1)
        base = np.abs(pred.popularity_baseline.mean(axis=0) / emp - 1)
        assert np.all(err[1:] < 0.5 * base[1:])


def test_ipf_work_beyond_the_stated_limit_is_refused_up_front():
    """Finding 10: the cost grows as laws x 2^n x n(n-1)/2; beyond IPF_MAX_UPDATES (or the
    table bytes) predict_union refuses on max_n before solving anything."""
    from specmoe.routing.ipf import IPF_MAX_UPDATES, check_ipf_cost, ipf_cost

    assert ipf_cost(1, 3) == (4 * 1 + 8 * 3, 8 * 8 * (1 + 4 * 3 * 2))
    u12, _ = ipf_cost(864, 12)  # the bundled trace, documents pooled: still allowed
    u13, _ = ipf_cost(864, 13)
    assert u12 <= IPF_MAX_UPDATES < u13 and u13 > 2 * u12
    check_ipf_cost(864, 12)
    with pytest.raises(
        InputError, match=r"^max_n: 13 with 864 laws needs .*\(limit 4e\+08\)"
    ) as exc:
        check_ipf_cost(864, 13)
    assert exc.value.argument == "max_n"
    with pytest.raises(InputError, match="2\\^100"):
        check_ipf_cost(1, 100)


def test_stats_file_popularity_must_sum_to_top_k(tmp_path):
    """Finding 12 / 8: popularities summing to 8 with top_k 2, all zero, or of the wrong type
    are refused, each in one line naming the file and the field."""
    import json

    from specmoe.routing.ipf import load_moments, save_moments

    good = save_moments(_moments_for_file(), tmp_path / "good.json")
    obj = json.loads(good.read_text())
    load_moments(good)
    cases = {
        "sum.json": ({**obj, "top_k": obj["top_k"] - 1}, "popularity.*sum to"),
        "zero.json": (
            {**obj, "popularity": [[0.0] * obj["num_experts"]] * obj["num_layers"]},
            "popularity.*all zero",
        ),
        "type.json": ({**obj, "top_k": "two"}, "'top_k' must be an integer"),
        "pop.json": ({**obj, "popularity": {"a": 1}}, "'popularity' must"),
    }
    for name, (bad, pattern) in cases.items():
        p = tmp_path / name
        p.write_text(json.dumps(bad))
        with pytest.raises(InputError, match=pattern) as exc:
            load_moments(p)
        assert str(exc.value).startswith(str(p)) and "\n" not in str(exc.value)


def _moments_for_file():
    from specmoe.routing.ipf import fit_moments

    return fit_moments(sticky_trace(300, 2, 16, 2, [0.5, 0.2], seed=4), max_lag=3)
