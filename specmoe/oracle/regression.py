"""Per-round verification cost and draft time from round logs (paper 000, Appendix A).

Legend: ``R`` rounds, ``F`` folds, ``B`` bootstrap resamples, ``p`` regressors.

Model (4) of paper 000, per budget K: T_T = beta0 + alpha·Ū_r + c·L, fitted by OLS with
standard errors clustered by generation (statsmodels ``cov_type="cluster"``). Out-of-sample
error uses scikit-learn ``GroupKFold(5)`` by generation: R², RMSE and MAPE per held-out fold
(mean and a t-interval across folds, Table A2) and on the pooled out-of-fold predictions (Table
A4's OOS MAPE). Robustness on one budget (Table A7): a generation (cluster) bootstrap with
percentile intervals, computed exactly from per-generation sufficient statistics X'X and X'y;
Huber M-estimation (statsmodels ``RLM`` with ``HuberT``); refitting after dropping the 1% of
rounds with the largest absolute OLS residual; the first and second half of each run in log
order; leave-one-category-out refits. Draft time (Figure A6): T_D = a·K + b by OLS over rounds
with K >= 1 and a recorded positive T_D (zero or null marks a missing timing).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specmoe.errors import InputError
from specmoe.formats.roundlog import RoundLog

__all__ = [
    "DraftFit",
    "VerifyFit",
    "cross_validate",
    "factor_importance",
    "fit_draft_time",
    "fit_verify",
    "fit_verify_by_k",
    "pooled_models",
    "regression_report",
    "robustness",
]


def _design(*cols: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(len(cols[0]))] + [np.asarray(c, float) for c in cols])


def _independent(x: np.ndarray) -> np.ndarray:
    """The columns of x that raise its rank, in order (drops aliased dummy interactions)."""
    norm = np.linalg.norm(x, axis=0)
    xn = x / np.where(norm > 0, norm, 1.0)
    gram = xn.T @ xn
    keep: list[int] = []
    for j in range(x.shape[1]):
        if norm[j] > 0 and np.linalg.matrix_rank(
            gram[np.ix_([*keep, j], [*keep, j])], tol=1e-9
        ) > len(keep):
            keep.append(j)
    return x[:, keep]


def _ols(x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None):
    from statsmodels.regression.linear_model import OLS

    model = OLS(y, x)
    if groups is not None and len(np.unique(groups)) > 1:
        return model.fit(cov_type="cluster", cov_kwds={"groups": groups})
    return model.fit()


@dataclass(frozen=True)
class CrossValidation:
    """Per-fold metrics [F] and pooled out-of-fold metrics."""

    r2: np.ndarray
    rmse: np.ndarray
    mape: np.ndarray
    pooled_r2: float
    pooled_rmse: float
    pooled_mape: float

    def interval(self, name: str) -> tuple[float, float]:
        """(mean, half-width of the 95% t-interval across folds) of a fold metric."""
        from scipy import stats

        v = getattr(self, name)
        if len(v) < 2:
            return float(v.mean()), float("nan")
        return float(v.mean()), float(
            stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))
        )


def cross_validate(
    x: np.ndarray, y: np.ndarray, groups: np.ndarray, *, n_splits: int = 5
) -> CrossValidation | None:
    """GroupKFold(n_splits) by ``groups`` of the least-squares fit y ~ x (x holds its constant).

    None when there are fewer than two groups.
    """
    from sklearn.linear_model import LinearRegression
    from sklearn.metrics import mean_absolute_percentage_error, r2_score
    from sklearn.model_selection import GroupKFold

    n_groups = len(np.unique(groups))
    if n_groups < 2:
        return None
    folds = GroupKFold(n_splits=min(n_splits, n_groups))
    pred = np.empty_like(y, dtype=float)
    r2, rmse, mape = [], [], []
    for train, test in folds.split(x, y, groups):
        fit = LinearRegression(fit_intercept=False).fit(x[train], y[train])
        pred[test] = fit.predict(x[test])
        r2.append(r2_score(y[test], pred[test]))
        rmse.append(float(np.sqrt(np.mean((y[test] - pred[test]) ** 2))))
        mape.append(mean_absolute_percentage_error(y[test], pred[test]))
    return CrossValidation(
        np.array(r2),
        np.array(rmse),
        np.array(mape),
        float(r2_score(y, pred)),
        float(np.sqrt(np.mean((y - pred) ** 2))),
        float(mean_absolute_percentage_error(y, pred)),
    )


@dataclass(frozen=True)
class VerifyFit:
    """T_T = beta0 + alpha·Ū + c·L at one budget k (ms; se: clustered by generation)."""

    k: int
    beta0: float
    alpha: float
    c: float
    se_beta0: float
    se_alpha: float
    se_c: float
    n: int
    generations: int
    r2: float
    oos_r2: float
    oos_rmse: float
    oos_mape: float
    median_t: float
    median_u: float
    median_l: float

    def predict(self, u: np.ndarray, context: np.ndarray) -> np.ndarray:
        return self.beta0 + self.alpha * np.asarray(u) + self.c * np.asarray(context)


def fit_warnings(fits) -> list[str]:
    """Unphysical constants of model (4) fits, one sentence each: a negative fixed time beta0
    (no pass takes negative time: the line extrapolates below the measured Ū and L) or a
    negative cost per expert (alpha) or per context token (c). Empty when all are >= 0."""
    out = []
    for f in fits:
        for name, value, unit in (
            ("beta0", f.beta0, "ms fixed time"),
            ("alpha", f.alpha, "ms per unique expert"),
            ("c", f.c, "ms per context token"),
        ):
            if np.isfinite(value) and value < 0:
                out.append(
                    f"K={f.k}: {name} = {value:.4g} {unit} is negative (unphysical: the "
                    f"fit extrapolates beyond the measured rounds; its costs are suspect)"
                )
    return out


def _frame(log: RoundLog) -> dict[str, np.ndarray]:
    gen, _ = log.codes("generation_id")
    run, _ = log.codes("run_id")
    cat, cat_labels = (
        log.codes("category")
        if log.has("category")
        else (np.zeros(len(log), np.int64), np.array([""]))
    )
    first = np.zeros(len(log), dtype=bool)  # the first half of each run, in log order
    for r in np.unique(run):
        idx = np.flatnonzero(run == r)
        first[idx[: len(idx) // 2]] = True
    f = {
        "t": log["t_verify_ms"],
        "u": log["u_mean"],
        "L": log["context_len"].astype(float),
        "k": log["k"],
        "m": log["pass_size"].astype(float),
        "gen": gen,
        "cat": cat,
        "first_half": first,
        "cat_labels": cat_labels,
    }
    for c in ("e_max", "kv_usage", "t_draft_ms"):
        f[c] = log[c] if c in log.data else np.full(len(log), np.nan)
    return f


def fit_verify(log: RoundLog, k: int, *, frame: dict | None = None) -> VerifyFit:
    """Model (4) of paper 000 at budget ``k`` (Table A4)."""
    f = _frame(log) if frame is None else frame
    sel = f["k"] == k
    if sel.sum() < 4:
        raise InputError(f"{log.name}: only {int(sel.sum())} round(s) at K={k}; need 4 to fit")
    y, g = f["t"][sel], f["gen"][sel]
    # a regressor constant at this budget (Ū at K = 0 is always m) is not identifiable: its
    # coefficient is reported as 0 with a NaN standard error
    cols = [c for c in ("u", "L") if np.ptp(f[c][sel]) > 0]
    x = _design(*[f[c][sel] for c in cols])
    res = _ols(x, y, g)
    cv = cross_validate(x, y, g)
    nan = float("nan")
    coef = {"u": (0.0, nan), "L": (0.0, nan)}
    for j, c in enumerate(cols, 1):
        coef[c] = (float(res.params[j]), float(res.bse[j]))
    return VerifyFit(
        k=int(k),
        beta0=float(res.params[0]),
        alpha=coef["u"][0],
        c=coef["L"][0],
        se_beta0=float(res.bse[0]),
        se_alpha=coef["u"][1],
        se_c=coef["L"][1],
        n=int(sel.sum()),
        generations=len(np.unique(g)),
        r2=float(res.rsquared),
        oos_r2=cv.pooled_r2 if cv else nan,
        oos_rmse=cv.pooled_rmse if cv else nan,
        oos_mape=cv.pooled_mape if cv else nan,
        median_t=float(np.median(y)),
        median_u=float(np.median(f["u"][sel])),
        median_l=float(np.median(f["L"][sel])),
    )


def fit_verify_by_k(log: RoundLog, *, frame: dict | None = None) -> dict[int, VerifyFit]:
    """Model (4) for every budget with at least 4 rounds."""
    f = _frame(log) if frame is None else frame
    ks, counts = np.unique(f["k"], return_counts=True)
    return {int(k): fit_verify(log, int(k), frame=f) for k, c in zip(ks, counts) if c >= 4}


def _cluster_bootstrap(x, y, groups, *, n_boot: int, seed: int) -> np.ndarray:
    """[B, p] OLS coefficients over resamples of whole groups (with replacement)."""
    codes, inv = np.unique(groups, return_inverse=True)
    p = x.shape[1]
    xtx = np.zeros((len(codes), p, p))
    xty = np.zeros((len(codes), p))
    np.add.at(xtx, inv, x[:, :, None] * x[:, None, :])
    np.add.at(xty, inv, x * y[:, None])
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(codes), (n_boot, len(codes)))
    w = np.stack([np.bincount(d, minlength=len(codes)) for d in draws]).astype(float)
    a = np.einsum("bg,gij->bij", w, xtx)
    b = np.einsum("bg,gi->bi", w, xty)
    return np.linalg.solve(a + 1e-12 * np.eye(p), b[..., None])[..., 0]


def robustness(
    log: RoundLog, k: int, *, n_boot: int = 999, seed: int = 0, frame: dict | None = None
) -> list[dict]:
    """Table A7 at budget ``k``: rows {check, alpha, c, beta0, alpha_lo, alpha_hi, ...}."""
    from statsmodels.robust.norms import HuberT
    from statsmodels.robust.robust_linear_model import RLM

    f = _frame(log) if frame is None else frame
    sel = f["k"] == k
    x, y, g = _design(f["u"][sel], f["L"][sel]), f["t"][sel], f["gen"][sel]
    rows = []

    def row(name, params, lo=None, hi=None):
        r = {
            "check": name,
            "beta0": float(params[0]),
            "alpha": float(params[1]),
            "c": float(params[2]),
        }
        if lo is not None:
            r.update(
                alpha_lo=float(lo[1]),
                alpha_hi=float(hi[1]),
                c_lo=float(lo[2]),
                c_hi=float(hi[2]),
                beta0_lo=float(lo[0]),
                beta0_hi=float(hi[0]),
            )
        rows.append(r)

    res = _ols(x, y, g)
    ci = np.asarray(res.conf_int())
    row("OLS, clustered SE", res.params, ci[:, 0], ci[:, 1])
    if n_boot > 0 and len(np.unique(g)) > 1:
        boot = _cluster_bootstrap(x, y, g, n_boot=n_boot, seed=seed)
        lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
        row(f"Bootstrap by generation, {n_boot}", boot.mean(axis=0), lo, hi)
    row("Huber regression", RLM(y, x, M=HuberT()).fit().params)
    resid = np.abs(y - x @ res.params)
    keep = resid <= np.quantile(resid, 0.99)
    row("1% outlier trimming", _ols(x[keep], y[keep]).params)
    half = f["first_half"][sel]
    for name, part in (("First half of run", half), ("Second half of run", ~half)):
        if part.sum() > x.shape[1]:
            row(name, _ols(x[part], y[part]).params)
    cats = f["cat"][sel]
    if len(np.unique(cats)) > 1:
        fits = np.array([_ols(x[cats != c], y[cats != c]).params for c in np.unique(cats)])
        rows.append(
            {
                "check": f"Leave one category out ({len(fits)} refits)",
                "beta0": float(np.median(fits[:, 0])),
                "alpha": float(np.median(fits[:, 1])),
                "c": float(np.median(fits[:, 2])),
                "alpha_lo": float(fits[:, 1].min()),
                "alpha_hi": float(fits[:, 1].max()),
                "c_lo": float(fits[:, 2].min()),
                "c_hi": float(fits[:, 2].max()),
                "beta0_lo": float(fits[:, 0].min()),
                "beta0_hi": float(fits[:, 0].max()),
            }
        )
    return rows


_FACTORS = {
    "u_mean": "u",
    "pass_size": "m",
    "e_max": "e_max",
    "context_len": "L",
    "kv_usage": "kv_usage",
}


def factor_importance(
    log: RoundLog, *, frame: dict | None = None, mask: np.ndarray | None = None
) -> list[dict]:
    """Table A2 on the pool of rounds: each factor alone and beyond Ū_r (GroupKFold(5)).

    ``delta_rmse`` is RMSE(Ū alone) - RMSE(Ū + factor) per fold (positive: the factor helps).
    """
    f = _frame(log) if frame is None else frame
    sel = np.ones(len(f["t"]), bool) if mask is None else mask
    y, g, u = f["t"][sel], f["gen"][sel], f["u"][sel]
    base = cross_validate(_design(u), y, g)
    if base is None:
        return []
    rows = []
    for name, key in _FACTORS.items():
        v = f[key][sel]
        if not np.isfinite(v).all() or np.ptp(v) == 0:
            continue
        alone = cross_validate(_design(v), y, g)
        r = {
            "factor": name,
            "r2": alone.interval("r2"),
            "rmse": alone.interval("rmse"),
            "corr_with_u": float(np.corrcoef(v, u)[0, 1]) if np.ptp(u) else float("nan"),
        }
        if key != "u":
            both = cross_validate(_design(u, v), y, g)
            d = base.rmse - both.rmse
            r["delta_rmse"] = (float(d.mean()), _t_half(d) if len(d) > 1 else float("nan"))
        rows.append(r)
    return rows


def _t_half(v: np.ndarray) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))


def pooled_models(log: RoundLog, *, frame: dict | None = None) -> list[dict]:
    """Table A6: Ū + L, Ū + L + γK and Ū × C(K) + L on the pool (patsy formulas)."""
    import patsy

    f = _frame(log) if frame is None else frame
    data = {"t": f["t"], "u": f["u"], "L": f["L"], "K": f["k"].astype(float)}
    rows = []
    for label, formula in (
        ("U + L", "t ~ u + L"),
        ("U + L + gamma K", "t ~ u + L + K"),
        ("U x C(K) + L", "t ~ u * C(K) + L"),
    ):
        y, x = patsy.dmatrices(formula, data, return_type="matrix")
        y = np.asarray(y)[:, 0]
        x = _independent(np.asarray(x))
        res = _ols(x, y)
        cv = cross_validate(x, y, f["gen"])
        rows.append(
            {
                "model": label,
                "r2": float(res.rsquared),
                "cv_rmse": cv.pooled_rmse if cv else float("nan"),
                "cv_mape": cv.pooled_mape if cv else float("nan"),
            }
        )
    return rows


def category_table(log: RoundLog, *, frame: dict | None = None) -> list[dict]:
    """Tables A3 and A5 per category: OOS R² of Ū and Ū + L, ΔRMSE from L, α and c at the
    largest budget with clustered standard errors."""
    f = _frame(log) if frame is None else frame
    labels = f["cat_labels"]
    if len(labels) < 2:
        return []
    k_top = int(f["k"].max())
    rows = []
    for ci, label in enumerate(labels):
        sel = f["cat"] == ci
        y, g = f["t"][sel], f["gen"][sel]
        cu = cross_validate(_design(f["u"][sel]), y, g)
        cul = cross_validate(_design(f["u"][sel], f["L"][sel]), y, g)
        top = sel & (f["k"] == k_top)
        r = {"category": str(label) or None, "rounds": int(sel.sum())}
        if cu is not None:
            r.update(
                oos_r2_u=cu.interval("r2"),
                oos_r2_u_l=cul.interval("r2"),
                delta_rmse_l=(
                    float((cu.rmse - cul.rmse).mean()),
                    _t_half(cu.rmse - cul.rmse) if len(cu.rmse) > 1 else float("nan"),
                ),
            )
        if top.sum() > 3:
            res = _ols(_design(f["u"][top], f["L"][top]), f["t"][top], f["gen"][top])
            r.update(
                k=k_top,
                alpha=float(res.params[1]),
                se_alpha=float(res.bse[1]),
                c=float(res.params[2]),
                se_c=float(res.bse[2]),
                n=int(top.sum()),
                r2=float(res.rsquared),
            )
        rows.append(r)
    return sorted(rows, key=lambda r: -r.get("oos_r2_u", (-np.inf,))[0])


@dataclass(frozen=True)
class DraftFit:
    """T_D = a·K + b (ms), OLS over rounds with a recorded draft time (Figure A6)."""

    a: float
    b: float
    se_a: float
    se_b: float
    n: int
    missing: int

    def predict(self, k: np.ndarray | int) -> np.ndarray:
        k = np.asarray(k, dtype=float)
        return np.where(k > 0, self.a * k + self.b, 0.0)


def fit_draft_time(log: RoundLog) -> DraftFit | None:
    """Figure A6's draft-time model; None when fewer than 3 timed drafted rounds or one K."""
    k = log["k"].astype(float)
    td = log["t_draft_ms"] if "t_draft_ms" in log.data else np.full(len(log), np.nan)
    drafted = k > 0
    ok = drafted & np.isfinite(td) & (td > 0)
    if ok.sum() < 3 or np.ptp(k[ok]) == 0:
        return None
    gen, _ = log.codes("generation_id")
    res = _ols(_design(k[ok]), td[ok], gen[ok])
    return DraftFit(
        a=float(res.params[1]),
        b=float(res.params[0]),
        se_a=float(res.bse[1]),
        se_b=float(res.bse[0]),
        n=int(ok.sum()),
        missing=int((drafted & ~ok).sum()),
    )


def regression_report(log: RoundLog, *, n_boot: int = 999, seed: int = 0) -> dict:
    """Every table of Appendix A that the log supports, as JSON-ready dicts."""
    f = _frame(log)
    fits = fit_verify_by_k(log, frame=f)
    k_top = max(fits)
    return {
        "by_k": [fits[k] for k in sorted(fits)],
        "factor_importance": factor_importance(log, frame=f),
        "pooled_models": pooled_models(log, frame=f),
        "by_category": category_table(log, frame=f),
        "robustness": {
            "k": k_top,
            "rows": robustness(log, k_top, n_boot=n_boot, seed=seed, frame=f),
        },
        "draft_time": fit_draft_time(log),
    }
