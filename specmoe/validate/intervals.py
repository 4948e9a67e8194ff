"""Percentile bootstrap intervals of the measured side of a validation (pure numpy).

The statistics are those of ``definitions.measured`` of ``rules-whole-pass.json``: the verify
time tau_p(n) is the mean over prompts of each prompt's median over its repetitions
(:func:`mean_of_medians`); the throughput T(k, a) is the median over prompts x repeats of each
generation's tokens per second (:func:`median_of_generations`). Their intervals follow
``definitions.intervals``: prompts are resampled with replacement, P of P, each prompt taking
all its repetitions or repeats with it (:func:`resample_prompts`, the draws of
:func:`specmoe.validate.rules.sign_scores`, so the saving's interval is the same one); one
draw serves every pass size and both kernels of the verify sweeps, and every cell (k, a) of
the throughput runs, whose k = 0 column is shared by the acceptance values. The interval of a
statistic is its percentile interval over the resamples (:func:`percentile_interval`).

Per resample, the scores of :mod:`specmoe.validate.rules` are recomputed by the functions
here: the measured best draft length (:func:`kstar_samples`), the loss at a fixed k_hat*
(:func:`loss_samples`), the share of resamples whose k* is within one of k_hat*
(:func:`within_one_share`) and the best speedup of step times (:func:`best_speedup_samples`).
:func:`decided` says whether an interval decides a rule.

Legend: ``B`` resamples, ``P`` prompts, ``R`` repetitions (NaN-padded when they differ between
prompts), ``n`` pass sizes, ``A`` acceptance values, ``K`` draft lengths 0..k_max.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from specmoe.errors import InputError

__all__ = [
    "best_speedup_samples",
    "decided",
    "kstar_samples",
    "loss_samples",
    "mean_of_medians",
    "median_last",
    "median_of_generations",
    "percentile_interval",
    "resample_prompts",
    "within_one_share",
]

_CHUNK = 1 << 22  # values gathered at once by median_of_generations (32 MiB of float64)


def resample_prompts(prompts: int, *, resamples: int, seed: int) -> np.ndarray:
    """[B, P] prompt indices: ``resamples`` draws of ``prompts`` of ``prompts`` with
    replacement from ``numpy.random.default_rng(seed)``."""
    if prompts < 1:
        raise InputError(f"must be >= 1, got {prompts}", argument="prompts")
    if resamples < 1:
        raise InputError(f"must be >= 1, got {resamples}", argument="resamples")
    rng = np.random.default_rng(seed)
    return rng.integers(0, prompts, size=(resamples, prompts))


def percentile_interval(samples: np.ndarray, level: float) -> np.ndarray:
    """[..., 2]: the (1 - level)/2 and (1 + level)/2 quantiles (linear interpolation, as
    ``numpy.quantile``) of ``samples`` [B, ...] over the resamples. NaN samples (a score a
    resample cannot give) are left out; a cell with none left is NaN."""
    if not 0 < level < 1:
        raise InputError(f"must lie in (0, 1), got {level!r}", argument="level")
    x = np.asarray(samples, dtype=np.float64)
    q = [(1 - level) / 2, (1 + level) / 2]
    if np.isnan(x).any():
        with warnings.catch_warnings():  # an all-NaN cell stays NaN, which the caller reads
            warnings.simplefilter("ignore", RuntimeWarning)
            lo, hi = np.nanquantile(x, q, axis=0)
    else:
        lo, hi = np.quantile(x, q, axis=0)
    return np.stack([lo, hi], axis=-1)


def median_last(x: np.ndarray) -> np.ndarray:
    """The median over the last axis, NaN entries left out (the mean of the two middle values
    for an even count, as ``numpy.median``); NaN where a row holds no number."""
    x = np.sort(np.asarray(x, dtype=np.float64), axis=-1)  # NaN sort last
    c = np.sum(~np.isnan(x), axis=-1)
    lo = np.clip((c - 1) // 2, 0, None)[..., None]
    hi = np.clip(c // 2, 0, None)[..., None]
    m = (np.take_along_axis(x, lo, -1) + np.take_along_axis(x, hi, -1))[..., 0] / 2
    return np.where(c > 0, m, np.nan)


def mean_of_medians(per_prompt: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
    """tau(n) = the mean over prompts of the per-prompt medians ``per_prompt`` [P, n]: [n],
    or [B, n] over the resampled prompts ``idx`` [B, P]."""
    X = np.asarray(per_prompt, dtype=np.float64)
    if idx is None:
        return X.mean(axis=0)
    return X[np.asarray(idx)].mean(axis=1)


def median_of_generations(samples: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
    """T(k, a) = the median over prompts x repeats of ``samples`` [A, K, P, R] (tokens/s of
    each generation, NaN-padded): [A, K], or [B, A, K] over the resampled prompts ``idx``
    [B, P] (each prompt with all its repeats)."""
    X = np.asarray(samples, dtype=np.float64)
    if X.ndim != 4:
        raise InputError(f"must be [A, K, P, R], got shape {X.shape}", argument="samples")
    A, K, P, R = X.shape
    if idx is None:
        return median_last(X.reshape(A, K, P * R))
    idx = np.asarray(idx)
    B = idx.shape[0]
    out = np.empty((B, A, K))
    step = max(1, _CHUNK // max(1, A * K * P * R))
    for b0 in range(0, B, step):
        part = idx[b0 : b0 + step]  # [b, P]
        g = X[:, :, part, :]  # [A, K, b, P, R]
        med = median_last(g.reshape(A, K, part.shape[0], P * R))  # [A, K, b]
        out[b0 : b0 + step] = np.moveaxis(med, 2, 0)
    return out


def kstar_samples(T: np.ndarray) -> np.ndarray:
    """[..., A]: the smallest maximiser over k of the throughput ``T`` [..., A, K]."""
    return np.argmax(np.asarray(T, dtype=np.float64), axis=-1)


def loss_samples(T: np.ndarray, k_hat: Sequence[int]) -> np.ndarray:
    """[..., A]: 1 - T(k_hat*(a)) / max_k T(k) of ``T`` [..., A, K] at the fixed draft
    lengths ``k_hat`` [A]."""
    T = np.asarray(T, dtype=np.float64)
    kh = np.asarray(k_hat, dtype=np.intp)
    at = np.take_along_axis(T, np.broadcast_to(kh[:, None], (*T.shape[:-1], 1)), -1)[..., 0]
    return 1.0 - at / T.max(axis=-1)


def within_one_share(k_star: np.ndarray, k_hat: Sequence[int]) -> np.ndarray:
    """[A]: the share of resamples whose best draft length ``k_star`` [B, A] is within one
    of ``k_hat`` [A]."""
    k = np.asarray(k_star)
    return (np.abs(k - np.asarray(k_hat)[None, :]) <= 1).mean(axis=0)


def best_speedup_samples(V: np.ndarray, acceptance: Sequence[float]) -> np.ndarray:
    """[B, A]: max_k G_a(k) V(0) / V(k) (Eq. (9) of paper 002 at the best k) of step times
    ``V`` [B, K], G_a(k) = 1 + a + ... + a^k."""
    V = np.asarray(V, dtype=np.float64)
    a = np.asarray(acceptance, dtype=np.float64)[:, None]  # [A, 1]
    k = np.arange(V.shape[-1])[None, :]
    G = np.cumsum(np.broadcast_to(a, (a.shape[0], k.shape[1])) ** k, axis=1)  # [A, K]
    ratio = V[:, :1] / V  # [B, K]
    return (G[None, :, :] * ratio[:, None, :]).max(axis=-1)


def decided(rule, interval: Sequence[float] | None, total: int | None = None) -> bool | None:
    """Whether ``interval`` [lo, hi] of the rule's metric lies on one side of the rule's
    value: the rule (:meth:`specmoe.validate.rules.Rule.holds`, its own comparison deciding the
    value itself) gives one verdict at every point of it. None without an interval or a
    verdict. For ``==`` the interval must be the one point, or exclude the value."""
    if interval is None:
        return None
    lo, hi = (float(x) for x in interval)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return None
    a, b = rule.holds(lo, total), rule.holds(hi, total)
    if a is None or b is None:
        return None
    if rule.op == "==":
        scale = 1.0 if rule.of is None or not total else total / rule.of
        v = rule.value * scale
        return lo == hi or not lo <= v <= hi
    return a == b
