"""The acceptance rate a of speculative decoding, estimated from what an engine counted.

Legend: ``k`` the longest draft of a verification step, ``j`` drafts accepted in a step,
``i`` a draft position (1..k).

The model is paper 002's i.i.d. acceptance: draft i is accepted with probability
a = P(draft i accepted | drafts 1..i-1 accepted), whatever i, so a step that drafts d tokens
accepts j < d with probability a^j (1 - a) and all d with a^d. What can be estimated depends
on what the engine kept (:class:`SpecRecord`):

* **Every step's (drafted, accepted)** (vLLM ``detailed``) or **per-position counts with every
  step drafting k** (a histogram of j, or the number of steps accepting at least i): the
  likelihood is a^S (1 - a)^F with S accepted drafts and F rejections (steps that accepted
  fewer than they drafted), so the maximum-likelihood rate is â = S / (S + F)
  (:func:`geometric_mle`, the same estimate as ``specmoe.engine.speculative.
  realised_acceptance`` and the policies' ``_Ewma`` without forgetting). Its interval is the
  Wilson score interval of S successes in S + F trials (:func:`wilson_interval`).
* **Totals only** (steps, drafted and accepted tokens, every step drafting k): the mean number
  of accepted drafts per step m = accepted / steps has expectation
  g(a, k) = E[j] = sum_{i=1..k} a^i = a (1 - a^k) / (1 - a) (g(1, k) = k), strictly increasing
  in a, so the estimate is the unique root of g(a, k) = m in [0, 1]
  (:func:`solve_truncated_geometric`). Its interval is the score set
  {a : |m - g(a, k)| <= z sqrt(Var_a(j) / steps)}, with Var_a(j) = sum_{i=1..k} (2i - 1) a^i -
  g(a, k)^2 (:func:`truncated_geometric_variance`).
* **Drafts shorter than k in some steps without per-step records**: a rejection cannot be
  told from a full acceptance of a short draft. The rate then solves g(a, d̄) = m at the mean
  draft length d̄ = drafted / steps (g continued to real d): g is concave in d, so by Jensen's
  inequality the root is a lower bound on a under the model; the estimate says ``exact=False``.

Per position i the conditional rate is a_i = s_i / t_i, with s_i the steps that accepted at
least i drafts and t_i those that drafted draft i after accepting drafts 1..i-1. The
likelihood factorises into one binomial per position, so "geometric" (every a_i equal) is
tested by the likelihood ratio 2 sum_i [s_i log(â_i/â) + (t_i - s_i) log((1-â_i)/(1-â))]
against chi-square with (positions - 1) degrees of freedom (:func:`geometric_test`).

Markov rates (where per-step sequences exist) use the staircase-markov policy's states
(``specmoe.oracle.policies``): after a step whose drafts were all accepted ("hot",
``after_accept``) or after a step with a rejection ("cold", ``after_reject``); steps drafting
nothing carry no outcome and leave the state as it was. The first step of each request has no
earlier step and is not counted. Each state's rate is the geometric MLE of its steps; equal
rates are tested by the likelihood ratio with one degree of freedom.

With several requests, ``interval_requests`` is the cluster-robust (ratio-estimator sandwich)
interval that treats requests, not drafts, as the independent units: wider when requests
differ in acceptance (different prompts), as real traffic does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

from specmoe.errors import InputError

__all__ = [
    "AcceptanceEstimate",
    "GeometricTest",
    "MarkovRates",
    "PositionRate",
    "SpecRecord",
    "estimate_acceptance",
    "geometric_mle",
    "geometric_test",
    "solve_truncated_geometric",
    "truncated_geometric_mean",
    "truncated_geometric_variance",
    "wilson_interval",
]


# ------------------------------------------------------------------------------------------
# The truncated geometric model


def truncated_geometric_mean(a: float, k: float) -> float:
    """g(a, k) = sum_{i=1..k} a^i = a (1 - a^k) / (1 - a): the expected number of accepted
    drafts in a step of k drafts at acceptance a in [0, 1]; g(1, k) = k. ``k`` may be real
    (the continuation used for a mean draft length), k >= 0."""
    if a >= 1.0:
        return float(k)
    if a <= 0.0:
        return 0.0
    return float(a * -math.expm1(k * math.log(a)) / (1.0 - a))


def truncated_geometric_variance(a: float, k: int) -> float:
    """Var_a(j) of the accepted drafts j of a step of k drafts: P(j >= i) = a^i for i <= k, so
    E[j] = sum a^i and E[j^2] = sum_{i=1..k} (2i - 1) a^i."""
    i = np.arange(1, int(k) + 1, dtype=float)
    p = float(a) ** i
    mean = float(p.sum())
    return max(float(((2 * i - 1) * p).sum()) - mean * mean, 0.0)


def solve_truncated_geometric(mean: float, k: float) -> float:
    """The a in [0, 1] with g(a, k) = ``mean`` (:func:`truncated_geometric_mean`), for
    0 <= mean <= k: g is strictly increasing in a, so the root is unique (Brent's method to
    machine precision)."""
    if not (k > 0 and 0.0 <= mean <= k):
        raise InputError(f"needs 0 <= mean <= k, got mean {mean!r}, k {k!r}", argument="mean")
    if mean == 0.0:
        return 0.0
    if mean == k:
        return 1.0
    return float(
        optimize.brentq(
            lambda a: truncated_geometric_mean(a, k) - mean, 0.0, 1.0, xtol=1e-15, rtol=1e-15
        )
    )


def geometric_mle(accepted: int, rejections: int) -> float:
    """â = S / (S + F): the maximum of a^S (1 - a)^F; NaN without trials."""
    n = accepted + rejections
    return accepted / n if n else float("nan")


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise InputError(f"must lie in (0, 1), got {confidence!r}", argument="confidence")
    return float(stats.norm.ppf(0.5 + confidence / 2.0))


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a rate from ``successes`` in ``trials``; (nan, nan)
    without trials."""
    if trials <= 0:
        return (float("nan"), float("nan"))
    z = _z(confidence)
    n, p = float(trials), successes / trials
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    lo = 0.0 if successes <= 0 else max(0.0, centre - half)
    hi = 1.0 if successes >= trials else min(1.0, centre + half)
    return (lo, hi)


def _mean_length_interval(
    mean: float, k: float, steps: int, confidence: float
) -> tuple[float, float]:
    """{a : |mean - g(a, k)| <= z sqrt(Var_a(j) / steps)}: the score interval of the
    mean-length estimate; g and the standardised gap are monotone, so each end is one root.
    A real ``k`` (a mean draft length) takes the variance at the nearest whole length."""
    z = _z(confidence)
    a_hat = solve_truncated_geometric(mean, k)
    k_var = max(1, round(k))

    def gap(a: float) -> float:
        sd = math.sqrt(truncated_geometric_variance(a, k_var) / steps)
        d = truncated_geometric_mean(a, k) - mean
        return d / sd if sd > 0 else math.copysign(math.inf, d) if d else 0.0

    lo = 0.0 if a_hat <= 0.0 else optimize.brentq(lambda a: gap(a) + z, 0.0, a_hat, xtol=1e-12)
    hi = 1.0 if a_hat >= 1.0 else optimize.brentq(lambda a: gap(a) - z, a_hat, 1.0, xtol=1e-12)
    return (float(lo), float(hi))


def _loglik(s: float, f: float, a: float) -> float:
    out = 0.0
    if s:
        out += s * math.log(a) if a > 0 else -math.inf
    if f:
        out += f * math.log1p(-a) if a < 1 else -math.inf
    return out


# ------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class PositionRate:
    """a_i = accepted / trials at draft ``position`` i (1-based), with its Wilson interval.
    ``exact=False``: trials is an upper bound (drafts shorter than k), so the rate is a lower
    bound."""

    position: int
    trials: int
    accepted: int
    rate: float
    interval: tuple[float, float]
    exact: bool = True


@dataclass(frozen=True)
class GeometricTest:
    """Likelihood-ratio test of one rate at every position: ``statistic`` against chi-square
    with ``df`` degrees of freedom; ``p_value`` small means the per-position rates differ."""

    statistic: float
    df: int
    p_value: float


@dataclass(frozen=True)
class MarkovRates:
    """Geometric rates of the steps after a full acceptance and after a rejection."""

    after_accept: float
    after_accept_interval: tuple[float, float]
    after_accept_steps: int
    after_reject: float
    after_reject_interval: tuple[float, float]
    after_reject_steps: int
    statistic: float  # likelihood ratio of equal rates, chi-square with 1 df
    p_value: float


@dataclass(frozen=True)
class AcceptanceEstimate:
    """The acceptance rate ``rate`` (a) with its ``interval`` at ``confidence``.

    ``method``: ``"geometric-mle"`` (S / (S + F)) or ``"mean-length"`` (the root of
    g(a, k) = mean accepted per step). ``exact=False``: a lower bound (drafts shorter than k
    without per-step records). ``k``: the longest draft. ``rejections``: F, None when the
    engine's counts cannot tell it. ``per_position``: a_i where the engine counts positions.
    ``source``: what was read (engine and format), ``engine``: ``vllm``, ``sglang`` or
    ``llama.cpp``; ``files``: the files."""

    rate: float
    interval: tuple[float, float]
    method: str
    exact: bool
    k: int | None
    steps: int
    drafted: int
    accepted: int
    rejections: int | None
    mean_accepted: float
    per_position: tuple[PositionRate, ...]
    geometric_test: GeometricTest | None
    markov: MarkovRates | None
    interval_requests: tuple[float, float] | None
    requests: int
    confidence: float
    source: str = ""
    engine: str = ""
    files: tuple[str, ...] = ()
    skipped: int = 0
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SpecRecord:
    """One request's (or one server's) speculative counts, as an engine recorded them.

    ``steps`` verification steps drafting ``drafted`` tokens in all, ``accepted`` of them
    accepted. ``k``: the longest draft (None: unknown); ``k_exact=False``: ``k`` is the engine's
    number of draft tokens per step, the draft length only for a chain (SGLang: a tree of top-k
    > 1 drafts more tokens than its depth). ``histogram[j]``: steps that accepted j drafts
    (j = 0..k). ``accepted_per_pos[i-1]``: steps that accepted at least i drafts.
    ``step_drafted`` / ``step_accepted``: every step, in order. ``full``: whether every step
    drafted k (None: unknown)."""

    steps: int | None
    drafted: int
    accepted: int
    k: int | None = None
    k_exact: bool = True
    histogram: tuple[int, ...] | None = None
    accepted_per_pos: tuple[int, ...] | None = None
    step_drafted: tuple[int, ...] | None = None
    step_accepted: tuple[int, ...] | None = None
    full: bool | None = None
    label: str = ""
    notes: tuple[str, ...] = field(default=())


# ------------------------------------------------------------------------------------------
# Per-record counts


@dataclass
class _Counts:
    steps: int
    drafted: int
    accepted: int
    k: int
    full: bool
    rejections: int | None
    s: np.ndarray  # [k] steps accepting >= i
    t: np.ndarray  # [k] trials at position i (upper bounds unless full or per-step)
    per_step: bool


def _resolve_k(rec: SpecRecord, k: int | None) -> tuple[int, bool | None]:
    name = rec.label or "record"
    if k is not None and rec.k is not None and k != rec.k:
        longest = _longest(rec)
        if rec.k_exact:
            raise InputError(f"{name}: the engine's draft length is {rec.k}, not {k}", argument="k")
        if longest is not None and longest > k:
            raise InputError(
                f"{name}: a step accepted {longest} drafts, more than k = {k}", argument="k"
            )
        return k, True  # a tree of depth k: every step drafts its full depth
    kk = rec.k if rec.k is not None else k
    if kk is None:
        raise InputError(
            f"{name}: the engine does not say how long its drafts are; give the draft "
            "length (every step drafting that many)",
            argument="k",
        )
    if kk < 1:
        raise InputError(
            f"{name}: draft length must be >= 1, got {kk}",
            argument="k" if rec.k is None else "records",
        )
    return kk, rec.full


def _longest(rec: SpecRecord) -> int | None:
    if rec.step_accepted:
        return max(rec.step_accepted)
    if rec.histogram is not None:
        nz = [j for j, c in enumerate(rec.histogram) if c]
        return max(nz) if nz else 0
    if rec.accepted_per_pos is not None:
        nz = [i + 1 for i, c in enumerate(rec.accepted_per_pos) if c]
        return max(nz) if nz else 0
    return None


def _counts(rec: SpecRecord, k: int | None) -> _Counts:
    name = rec.label or "record"
    kk, full = _resolve_k(rec, k)
    if rec.step_accepted is not None and rec.step_drafted is not None:
        d = np.asarray(rec.step_drafted, dtype=np.int64)
        j = np.asarray(rec.step_accepted, dtype=np.int64)
        if j.size and (int(d.max()) > kk or int(j.max()) > kk):
            raise InputError(f"{name}: a step drafted more than k = {kk}", argument="k")
        pos = np.arange(1, kk + 1)[:, None]
        s = (j[None, :] >= pos).sum(axis=1)
        t = ((d[None, :] >= pos) & (j[None, :] >= pos - 1)).sum(axis=1)
        full = bool((d == kk).all())
        return _Counts(
            int(d.size), int(d.sum()), int(j.sum()), kk, full, int((j < d).sum()), s, t, True
        )
    steps = rec.steps
    if steps is None:
        if kk is None or rec.drafted % kk:
            raise InputError(
                f"{name}: {rec.drafted} draft tokens are not whole steps of {kk}", argument="k"
            )
        steps, full = rec.drafted // kk, True
    if full is None:
        full = rec.drafted == kk * steps
    s = None
    if rec.histogram is not None:
        h = np.asarray(rec.histogram, dtype=np.int64)
        if h.size > kk + 1 and h[kk + 1 :].any():
            raise InputError(f"{name}: a step accepted more than k = {kk} drafts", argument="k")
        h = np.pad(h[: kk + 1], (0, max(0, kk + 1 - h.size)))
        s = np.cumsum(h[::-1])[::-1][1:]  # s_i = sum_{j >= i} h_j, i = 1..k
    elif rec.accepted_per_pos is not None:
        p = np.asarray(rec.accepted_per_pos, dtype=np.int64)
        if p.size > kk and p[kk:].any():
            raise InputError(f"{name}: a step accepted more than k = {kk} drafts", argument="k")
        s = np.pad(p[:kk], (0, max(0, kk - p.size)))
    if s is None:
        empty = np.zeros(0, dtype=np.int64)
        return _Counts(steps, rec.drafted, rec.accepted, kk, full, None, empty, empty, False)
    t = np.concatenate([[steps], s[:-1]])
    rejections = int(steps - s[-1]) if full else None
    return _Counts(steps, rec.drafted, rec.accepted, kk, full, rejections, s, t, False)


# ------------------------------------------------------------------------------------------
# Tests


def geometric_test(trials: Sequence[int], accepted: Sequence[int]) -> GeometricTest | None:
    """Likelihood-ratio test that every position's conditional rate accepted_i / trials_i is
    one rate; None with fewer than two positions that have trials."""
    t = np.asarray(trials, dtype=float)
    s = np.asarray(accepted, dtype=float)
    keep = t > 0
    t, s = t[keep], s[keep]
    if t.size < 2:
        return None
    a = s.sum() / t.sum()
    lr = 2.0 * sum(_loglik(si, ti - si, si / ti) - _loglik(si, ti - si, a) for si, ti in zip(s, t))
    lr = max(lr, 0.0)
    df = int(t.size - 1)
    return GeometricTest(float(lr), df, float(stats.chi2.sf(lr, df)))


def _markov(records: Sequence[SpecRecord], confidence: float) -> MarkovRates | None:
    sf = {"hot": [0, 0, 0], "cold": [0, 0, 0]}  # accepted, rejections, steps
    for rec in records:
        state = None
        for d, j in zip(rec.step_drafted, rec.step_accepted):
            if d <= 0:
                continue
            if state is not None:
                sf[state][0] += j
                sf[state][1] += int(j < d)
                sf[state][2] += 1
            state = "hot" if j == d else "cold"
    (sh, fh, nh), (sc, fc, nc) = sf["hot"], sf["cold"]
    if not nh and not nc:
        return None
    a_h, a_c = geometric_mle(sh, fh), geometric_mle(sc, fc)
    if sh + fh and sc + fc:
        pool = geometric_mle(sh + sc, fh + fc)
        lr = 2.0 * (_loglik(sh, fh, a_h) + _loglik(sc, fc, a_c) - _loglik(sh + sc, fh + fc, pool))
        lr = max(lr, 0.0)
        p = float(stats.chi2.sf(lr, 1))
    else:
        lr, p = float("nan"), float("nan")
    return MarkovRates(
        a_h,
        wilson_interval(sh, sh + fh, confidence),
        nh,
        a_c,
        wilson_interval(sc, sc + fc, confidence),
        nc,
        float(lr),
        p,
    )


def _cluster_interval(
    num: np.ndarray, den: np.ndarray, confidence: float
) -> tuple[float, float, float] | None:
    """The ratio sum(num) / sum(den) with its cluster-robust interval (clusters: entries)."""
    keep = den > 0
    num, den = num[keep].astype(float), den[keep].astype(float)
    r = num.size
    if r < 2:
        return None
    ratio = num.sum() / den.sum()
    var = r / (r - 1) * float(((num - ratio * den) ** 2).sum()) / den.sum() ** 2
    half = _z(confidence) * math.sqrt(var)
    return ratio, ratio - half, ratio + half


# ------------------------------------------------------------------------------------------
# The estimate


def estimate_acceptance(
    records: Sequence[SpecRecord], *, k: int | None = None, confidence: float = 0.95
) -> AcceptanceEstimate:
    """The acceptance rate of ``records`` pooled (module docstring for the methods).

    ``k``: the draft length where the records do not say it (or, for a record whose ``k`` is
    not exact, the depth of its draft tree); a record that states a different exact ``k`` is an
    error. Records without any drafted step are an error (nothing to estimate)."""
    _z(confidence)
    if not records:
        raise InputError("no speculative-decoding records", argument="records")
    counts = [_counts(r, k) for r in records]
    ks = {c.k for c in counts}
    if len(ks) > 1:
        raise InputError(
            f"records draft up to different lengths {sorted(ks)}; estimate them apart",
            argument="records",
        )
    kk = ks.pop()
    steps = sum(c.steps for c in counts)
    drafted = sum(c.drafted for c in counts)
    accepted = sum(c.accepted for c in counts)
    if steps == 0 or drafted == 0:
        raise InputError("no verification step drafted anything", argument="records")
    full = all(c.full for c in counts)
    positional = all(c.s.size for c in counts)
    rejections = (
        sum(c.rejections for c in counts) if all(c.rejections is not None for c in counts) else None
    )
    notes: list[str] = []
    mean = accepted / steps
    per_step = all(c.per_step for c in counts)
    if rejections is not None:
        method, exact = "geometric-mle", True
        rate = geometric_mle(accepted, rejections)
        interval = wilson_interval(accepted, accepted + rejections, confidence)
        ci = _cluster_interval(
            np.array([c.accepted for c in counts]),
            np.array([c.accepted + c.rejections for c in counts]),
            confidence,
        )
        by_req = None if ci is None else (max(0.0, ci[1]), min(1.0, ci[2]))
    else:
        method = "mean-length"
        length = kk if full else drafted / steps
        exact = full
        rate = solve_truncated_geometric(min(mean, length), length)
        interval = _mean_length_interval(min(mean, length), length, steps, confidence)
        if not full:
            notes.append(
                f"some steps drafted fewer than k = {kk} tokens (mean {length:.3f}) and the "
                "engine does not say which: the rate is a lower bound"
            )
        ci = _cluster_interval(
            np.array([c.accepted for c in counts]), np.array([c.steps for c in counts]), confidence
        )
        by_req = None
        if ci is not None:
            lo_m, hi_m = max(0.0, ci[1]), min(float(length), ci[2])
            by_req = (
                solve_truncated_geometric(lo_m, length),
                solve_truncated_geometric(hi_m, length),
            )
    per_position: tuple[PositionRate, ...] = ()
    test = None
    if positional:
        s = np.sum([c.s for c in counts], axis=0)
        t = np.sum([c.t for c in counts], axis=0)
        exact_pos = per_step or full
        per_position = tuple(
            PositionRate(
                i + 1,
                int(t[i]),
                int(s[i]),
                float(s[i] / t[i]) if t[i] else float("nan"),
                wilson_interval(int(s[i]), int(t[i]), confidence),
                bool(exact_pos or i == 0),
            )
            for i in range(kk)
        )
        if exact_pos:
            test = geometric_test(t, s)
        else:
            notes.append(
                "per-position rates past position 1 are lower bounds (the engine does not "
                "count the steps that drafted each position); no geometric test"
            )
    markov = _markov(records, confidence) if per_step else None
    for r in records:
        notes.extend(n for n in r.notes if n not in notes)
    return AcceptanceEstimate(
        rate=float(rate),
        interval=(float(interval[0]), float(interval[1])),
        method=method,
        exact=bool(exact),
        k=int(kk),
        steps=int(steps),
        drafted=int(drafted),
        accepted=int(accepted),
        rejections=None if rejections is None else int(rejections),
        mean_accepted=float(mean),
        per_position=per_position,
        geometric_test=test,
        markov=markov,
        interval_requests=None if by_req is None else (float(by_req[0]), float(by_req[1])),
        requests=len(records),
        confidence=float(confidence),
        notes=tuple(notes),
    )
