"""Per-round cost regression: recovery of known coefficients, cluster bootstrap, robustness."""

import numpy as np
import pytest

from specmoe.errors import InputError
from specmoe.oracle.regression import (
    _cluster_bootstrap,
    _design,
    cross_validate,
    factor_importance,
    fit_draft_time,
    fit_verify,
    fit_verify_by_k,
    pooled_models,
    regression_report,
    robustness,
)
from specmoe.oracle.synthetic import default_alpha, default_beta0, synthetic_round_log

C_TRUE = 1.1e-3


@pytest.fixture(scope="module")
def log():
    return synthetic_round_log(
        budgets=(0, 2, 3, 4, 6),
        n_prompts=12,
        tokens=80,
        categories={"a": 0.8, "b": 0.6, "c": 0.45},
        seed=21,
        missing_draft=0.1,
    )


def test_per_budget_fits_recover_the_simulated_cost(log):
    fits = fit_verify_by_k(log)
    assert sorted(fits) == [0, 2, 3, 4, 6]
    for k in (2, 3, 4, 6):
        f = fits[k]
        assert abs(f.alpha - default_alpha(k)) < 5 * f.se_alpha + 0.01
        assert abs(f.c - C_TRUE) < 5 * f.se_c + 5e-5
        assert abs(f.beta0 - default_beta0(k)) < 5 * f.se_beta0 + 0.1
        assert f.r2 > 0.8 and f.oos_mape < 0.02 and f.n == int((log["k"] == k).sum())
    # at K = 0 Ū is always m: alpha is not identifiable, the intercept absorbs alpha·m
    f0 = fits[0]
    assert f0.alpha == 0.0 and np.isnan(f0.se_alpha)
    assert f0.beta0 == pytest.approx(default_beta0(0) + default_alpha(0) * 6, abs=0.1)


def test_fit_needs_rounds(log):
    with pytest.raises(InputError, match="K=5"):
        fit_verify(log, 5)


def test_cluster_bootstrap_equals_refits_on_resampled_generations():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(7), rng.integers(2, 6, 7))
    x = _design(rng.normal(size=len(groups)), rng.normal(size=len(groups)))
    y = x @ [1.0, 2.0, -0.5] + rng.normal(size=len(groups))
    boot = _cluster_bootstrap(x, y, groups, n_boot=5, seed=3)
    draws = np.random.default_rng(3).integers(0, 7, (5, 7))
    for b, draw in enumerate(draws):
        rows = np.concatenate([np.flatnonzero(groups == g) for g in draw])
        want = np.linalg.lstsq(x[rows], y[rows], rcond=None)[0]
        np.testing.assert_allclose(boot[b], want, rtol=1e-8, atol=1e-10)


def test_cross_validation_exact_and_noise():
    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(10), 20)
    u = rng.uniform(5, 25, 200)
    exact = cross_validate(_design(u), 3.0 + 0.2 * u, groups)
    assert exact.pooled_r2 == pytest.approx(1.0) and exact.pooled_rmse < 1e-9
    assert exact.pooled_mape < 1e-9 and len(exact.r2) == 5
    noise = cross_validate(_design(u), rng.normal(10, 1, 200), groups)
    assert noise.pooled_r2 < 0.05
    assert cross_validate(_design(u), u, np.zeros(200)) is None  # one group


def test_robustness_checks_resist_outliers():
    log = synthetic_round_log(
        budgets=(4, 5),
        n_prompts=10,
        tokens=100,
        outlier_frac=0.02,
        categories={"a": 0.7, "b": 0.5},
        seed=9,
    )
    rows = {r["check"].split(",")[0].split(" (")[0]: r for r in robustness(log, 4, n_boot=49)}
    assert set(rows) == {
        "OLS",
        "Bootstrap by generation",
        "Huber regression",
        "1% outlier trimming",
        "First half of run",
        "Second half of run",
        "Leave one category out",
    }
    truth = default_alpha(4)
    ols = abs(rows["OLS"]["alpha"] - truth)
    assert abs(rows["Huber regression"]["alpha"] - truth) < ols
    assert abs(rows["1% outlier trimming"]["alpha"] - truth) < ols
    b = rows["Bootstrap by generation"]
    assert b["alpha_lo"] <= rows["OLS"]["alpha"] <= b["alpha_hi"]
    loco = rows["Leave one category out"]
    assert loco["alpha_lo"] <= loco["alpha"] <= loco["alpha_hi"]


def test_factor_importance_and_pooled_models(log):
    rows = {r["factor"]: r for r in factor_importance(log)}
    assert rows["u_mean"]["r2"][0] > rows["context_len"]["r2"][0]
    assert rows["pass_size"]["corr_with_u"] > 0.8
    assert "delta_rmse" in rows["context_len"] and "delta_rmse" not in rows["u_mean"]
    pooled = {r["model"]: r for r in pooled_models(log)}
    # the simulated cost changes regime at m = 5: K as a category fits, K as a line does not
    assert pooled["U x C(K) + L"]["cv_rmse"] < 0.5 * pooled["U + L + gamma K"]["cv_rmse"]
    assert pooled["U + L + gamma K"]["r2"] >= pooled["U + L"]["r2"] - 1e-12


def test_draft_time_model(log):
    d = fit_draft_time(log)
    assert d.a == pytest.approx(0.459, abs=0.005) and d.b == pytest.approx(0.073, abs=0.03)
    drafted = log["k"] > 0
    assert d.missing == int((drafted & np.isnan(log["t_draft_ms"])).sum()) > 0
    assert d.n == int(drafted.sum()) - d.missing
    np.testing.assert_allclose(d.predict([0, 2]), [0.0, 2 * d.a + d.b])


def test_report_has_every_table(log):
    r = regression_report(log, n_boot=9)
    assert [f.k for f in r["by_k"]] == [0, 2, 3, 4, 6]
    assert r["robustness"]["k"] == 6
    cats = {row["category"] for row in r["by_category"]}
    assert cats == {"a", "b", "c"}
    assert all(abs(row["alpha"] - default_alpha(6)) < 0.03 for row in r["by_category"])


def test_a_negative_fixed_time_is_a_warning_in_the_oracle_output():
    """Finding 12: a fit with beta0 < 0 (unphysical) is said, in the result and on stderr."""
    from specmoe.oracle.analysis import oracle_analysis
    from specmoe.oracle.regression import fit_warnings

    neg = synthetic_round_log(
        budgets=(0, 2, 4),
        n_prompts=6,
        tokens=40,
        seed=3,
        beta0={0: 6.0, 2: -3.0, 4: 6.0},
        alpha={0: 0.05, 2: 0.6, 4: 0.05},
    )
    assert (neg["t_verify_ms"] > 0).all()  # every pass still takes positive time
    fits = fit_verify_by_k(neg)
    assert fits[2].beta0 < 0
    warns = fit_warnings(fits.values())
    assert any(w.startswith("K=2: beta0 = -") and "unphysical" in w for w in warns), warns
    res = oracle_analysis(neg, l_max=4, n_boot=0, tables=False)
    assert res.to_json()["warnings"] == list(res.warnings) and res.warnings
    clean = oracle_analysis(
        synthetic_round_log(budgets=(0, 2, 4), n_prompts=6, tokens=40, seed=3),
        l_max=4,
        n_boot=0,
        tables=False,
    )
    assert clean.warnings == ()
