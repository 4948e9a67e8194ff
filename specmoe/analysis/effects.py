"""Effect sizes, distribution overlap, AUC and the cluster bootstrap of the analyses.

Legend for shapes: ``B`` bootstrap resamples, ``G`` clusters (documents or responses).

Paper 003 (Appendix H.3, Section 9.4) reports the accepted-against-rejected comparison of
routing overlap as Cohen's d and as the overlap of the two distributions ("accepted and rejected
distributions overlap by about 85%"). The summary text of the paper gives no formula for either;
the standard ones are used and named here:

* Cohen's d with the pooled standard deviation (Cohen 1988, Eq. 2.5.2):
  d = (mean_x - mean_y) / s_p, s_p^2 = ((n_x - 1) s_x^2 + (n_y - 1) s_y^2) / (n_x + n_y - 2),
  s^2 the unbiased sample variances.
* The overlapping coefficient of two normal distributions with a common standard deviation and
  standardised mean difference d (Inman and Bradley 1989): OVL = 2 Φ(-|d| / 2). It is the
  reading of d as "overlap" that the paper's numbers fit (d between 0.3 and 0.4 gives 88-84%;
  its "mean difference 3-7x smaller than the per-sample standard deviation" is d of 0.14-0.33).
  :func:`normal_overlap` gives the general case (two normals, any standard deviations), the
  integral of min(f, g); :func:`empirical_overlap` the same integral for two observed discrete
  distributions, sum_v min(p(v), q(v)), with no normal assumption.
* AUC: the Mann-Whitney probability P(X > Y) + P(X = Y) / 2 (Hanley and McNeil 1982), computed
  from midranks.
* The best threshold classifier: the threshold and direction maximising Youden's J = TPR - FPR
  on training data; the AUC of a binary classifier is (TPR + TNR) / 2 = (1 + J) / 2.
* The cluster bootstrap: G clusters drawn with replacement, cluster c appearing w_c times,
  (w_1..w_G) ~ Multinomial(G, 1/G) (the scheme of :mod:`specmoe.routing.bootstrap`); statistics
  are functions of the w-weighted sums of per-cluster sufficient statistics; the interval is the
  percentile interval.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from specmoe.errors import InputError

__all__ = [
    "Moments",
    "auc",
    "best_threshold",
    "cluster_weights",
    "cohens_d",
    "empirical_overlap",
    "moments",
    "normal_overlap",
    "overlap_from_d",
    "percentile_interval",
    "threshold_auc",
]


@dataclass(frozen=True)
class Moments:
    """Sufficient statistics of a sample: count, sum, sum of squares (any leading shape)."""

    n: np.ndarray
    s1: np.ndarray
    s2: np.ndarray

    @property
    def mean(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.s1 / self.n

    @property
    def var(self) -> np.ndarray:
        """Unbiased variance (NaN below two observations)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            v = (self.s2 - self.s1 * self.s1 / self.n) / (self.n - 1)
        return np.where(self.n > 1, np.maximum(v, 0.0), np.nan)


def moments(x: np.ndarray) -> Moments:
    x = np.asarray(x, dtype=np.float64)
    return Moments(np.asarray(float(x.size)), np.asarray(x.sum()), np.asarray((x * x).sum()))


def cohens_d(x: Moments, y: Moments) -> np.ndarray:
    """Cohen's d of x against y, pooled standard deviation (NaN where undefined)."""
    dof = x.n + y.n - 2
    with np.errstate(invalid="ignore", divide="ignore"):
        pooled = ((x.n - 1) * x.var + (y.n - 1) * y.var) / dof
        d = (x.mean - y.mean) / np.sqrt(pooled)
    return np.where((dof > 0) & (pooled > 0), d, np.nan)


def _phi(z: np.ndarray) -> np.ndarray:
    from scipy.special import ndtr

    return ndtr(z)


def overlap_from_d(d: np.ndarray | float) -> np.ndarray:
    """OVL = 2 Φ(-|d|/2): the overlap of two equal-variance normals d standard deviations apart."""
    return 2.0 * _phi(-np.abs(np.asarray(d, dtype=np.float64)) / 2.0)


def normal_overlap(mu1: float, sd1: float, mu2: float, sd2: float) -> float:
    """∫ min(f1, f2) dx for the normals N(mu1, sd1²) and N(mu2, sd2²), in closed form.

    The densities cross where (x-mu1)²/sd1² - (x-mu2)²/sd2² = 2 ln(sd2/sd1) (a quadratic; one
    root when sd1 = sd2); between consecutive crossings one density is the smaller, and the
    integral is a sum of normal probabilities of those intervals.
    """
    if not (sd1 > 0 and sd2 > 0) or not all(map(math.isfinite, (mu1, sd1, mu2, sd2))):
        raise InputError(f"standard deviations must be positive and finite, got {sd1}, {sd2}")
    a = 1 / sd1**2 - 1 / sd2**2
    b = -2 * (mu1 / sd1**2 - mu2 / sd2**2)
    c = mu1**2 / sd1**2 - mu2**2 / sd2**2 - 2 * math.log(sd2 / sd1)
    if abs(a) < 1e-14 * max(1 / sd1**2, 1 / sd2**2):
        roots = [] if b == 0 else [-c / b]
    else:
        disc = b * b - 4 * a * c
        roots = (
            []
            if disc < 0
            else sorted([(-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)])
        )
    edges = [-math.inf, *roots, math.inf]

    def cdf(x: float, mu: float, sd: float) -> float:
        return float(_phi(np.asarray((x - mu) / sd))) if math.isfinite(x) else float(x > 0)

    total = 0.0
    for lo, hi in itertools.pairwise(edges):
        mid = (
            (lo + hi) / 2
            if math.isfinite(lo) and math.isfinite(hi)
            else ((hi - 1.0) if math.isfinite(hi) else (lo + 1.0) if math.isfinite(lo) else 0.0)
        )
        f1 = math.exp(-0.5 * ((mid - mu1) / sd1) ** 2) / sd1
        f2 = math.exp(-0.5 * ((mid - mu2) / sd2) ** 2) / sd2
        mu, sd = (mu1, sd1) if f1 <= f2 else (mu2, sd2)
        total += cdf(hi, mu, sd) - cdf(lo, mu, sd)
    return total


def empirical_overlap(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """sum_v min(p(v), q(v)) of two histograms on the same support (last axis), each normalised
    to 1: the overlap of two observed discrete distributions (NaN where one is empty)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    sp, sq = p.sum(-1, keepdims=True), q.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.minimum(p / sp, q / sq).sum(-1)
    return np.where((sp[..., 0] > 0) & (sq[..., 0] > 0), out, np.nan)


def auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(X > Y) + P(X = Y)/2 for X from ``positive``, Y from ``negative`` (midranks)."""
    from scipy.stats import rankdata

    pos = np.asarray(positive, dtype=np.float64).ravel()
    neg = np.asarray(negative, dtype=np.float64).ravel()
    if not len(pos) or not len(neg):
        return float("nan")
    ranks = rankdata(np.concatenate([pos, neg]))
    u = ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2
    return float(u / (len(pos) * len(neg)))


def best_threshold(positive: np.ndarray, negative: np.ndarray) -> tuple[float, int, float]:
    """(threshold t, direction s, Youden J) of the rule "positive when s·x >= s·t" with the
    largest TPR - FPR over every threshold between observed values (s = +1: high scores are
    positive; -1: low ones). Ties in J go to s = +1, then to the smaller threshold."""
    pos = np.asarray(positive, dtype=np.float64).ravel()
    neg = np.asarray(negative, dtype=np.float64).ravel()
    if not len(pos) or not len(neg):
        return float("nan"), 1, float("nan")
    vals = np.unique(np.concatenate([pos, neg]))
    cands = np.concatenate([[vals[0] - 1.0], (vals[:-1] + vals[1:]) / 2, [vals[-1] + 1.0]])
    best = (-math.inf, 0.0, 1)
    for s in (1, -1):
        tpr = (s * pos[None, :] >= s * cands[:, None]).mean(axis=1)
        fpr = (s * neg[None, :] >= s * cands[:, None]).mean(axis=1)
        j = tpr - fpr
        i = int(np.argmax(j))
        if j[i] > best[0] + 1e-15:
            best = (float(j[i]), float(cands[i]), s)
    return best[1], best[2], best[0]


def threshold_auc(positive: np.ndarray, negative: np.ndarray, t: float, s: int) -> float:
    """(TPR + TNR) / 2 of the rule "positive when s·x >= s·t": the AUC of that binary classifier."""
    pos = np.asarray(positive, dtype=np.float64).ravel()
    neg = np.asarray(negative, dtype=np.float64).ravel()
    if not len(pos) or not len(neg):
        return float("nan")
    tpr = float((s * pos >= s * t).mean())
    tnr = float((s * neg < s * t).mean())
    return (tpr + tnr) / 2


def cluster_weights(num_clusters: int, n_boot: int, seed: int) -> np.ndarray:
    """[B, G] resample weights: each row ~ Multinomial(G, 1/G) (G clusters with replacement)."""
    if num_clusters < 1:
        raise InputError("no clusters to resample", argument="num_clusters")
    rng = np.random.default_rng(seed)
    return rng.multinomial(num_clusters, np.full(num_clusters, 1.0 / num_clusters), size=n_boot)


def percentile_interval(
    replicates: np.ndarray, confidence: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """The percentile interval of ``replicates`` [B, ...] (NaN replicates left out)."""
    a = (1 - confidence) / 2
    r = np.asarray(replicates, dtype=np.float64)
    if r.shape[0] == 0:
        nan = np.full(r.shape[1:], np.nan)
        return nan, nan
    with np.errstate(invalid="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            lo = np.nanquantile(r, a, axis=0)
            hi = np.nanquantile(r, 1 - a, axis=0)
    return lo, hi
