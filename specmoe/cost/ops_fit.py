"""Per-operation fits of a verification pass and their sum, the whole-pass time (numpy only).

Legend: ``n`` tokens of the pass, ``d`` context depth (tokens already in the KV cache), ``L``
decoder layers. Times in milliseconds, bytes in bytes, flops in floating-point operations.

Each operation of one decoder layer (or of the model head) is fitted as

    t_op(n, d) = t0 + bytes_op(n, d) / β_op + flops_op(n, d) / peak_op + n · c_tok + d · c_d,

with only the terms the operation needs (:data:`TERMS`): a projection's flops grow with n and
its weight bytes are the same at every n (so they sit in t0), attention's bytes grow with the
depth d it reads and its flops with n·(d + n), the framework's per-layer overhead is a fixed
time and a per-token time (and, for an engine whose work outside its graph grows with the
KV cache it sets up, a per-context-token time ``c_d``: the ``depth`` term, used by
:func:`specmoe.engines.llamacpp_ops.refit`'s ``step1-depth`` form). The constants are non-negative least squares on relative error
(each row divided by its measured time), on a subset of the measured (n, d); ε is scored on
the shapes the fit did not see.

:func:`whole_pass_time` sums the fits into a whole-pass time; it generalises the sum over
layers by Eq. (22) (:func:`specmoe.cost.step.verify_time_from_op_times`) from the expert
operation alone to every operation of the pass.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specmoe.errors import InputError

# term -> the fit key it becomes, and how a coefficient in ms per unit is turned into that key
TERMS = ("t0", "bytes", "flops", "tokens", "depth")
FIT_KEYS = {
    "t0": "t0_ms",
    "bytes": "bytes_gbps",
    "flops": "gflops",
    "tokens": "per_token_ms",
    "depth": "per_depth_ms",
}


@dataclass(frozen=True)
class OpFit:
    """One operation's fit: ``coef`` (ms per unit of each term), its terms, and ``fit`` as the
    profile stores it (t0_ms, bytes_gbps, gflops, per_token_ms, per_depth_ms; a rate is None when its
    coefficient is zero: that term did not help the fit)."""

    terms: tuple[str, ...]
    coef: tuple[float, ...]

    @property
    def fit(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for term, c in zip(self.terms, self.coef, strict=True):
            if term in ("bytes", "flops"):  # ms per byte -> GB/s; ms per flop -> GFLOP/s
                out[FIT_KEYS[term]] = None if c == 0 else 1e-6 / c
            else:
                out[FIT_KEYS[term]] = float(c)
        return out

    def predict(self, features: Mapping[str, np.ndarray | float]) -> np.ndarray:
        """Predicted ms at the features (arrays of one shape; ``t0`` needs none)."""
        total: np.ndarray | float = 0.0
        for term, c in zip(self.terms, self.coef, strict=True):
            total = total + (c if term == "t0" else c * np.asarray(features[term], float))
        return np.asarray(total, float)


def coef_from_fit(fit: Mapping[str, Any], terms: Sequence[str]) -> tuple[float, ...]:
    """The ms-per-unit coefficients back from a stored ``fit`` (the inverse of ``OpFit.fit``)."""
    out = []
    for term in terms:
        v = fit.get(FIT_KEYS[term])
        if term in ("bytes", "flops"):
            out.append(0.0 if v is None else 1e-6 / float(v))
        else:
            out.append(float(v or 0.0))
    return tuple(out)


def _nnls_small(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few columns, exactly: the best of every column subset
    whose unconstrained solution is non-negative (the optimum is one of them)."""
    k = a.shape[1]
    best, best_res = np.zeros(k), float(np.sum(b * b))
    for r in range(1, k + 1):
        for cols in itertools.combinations(range(k), r):
            sol, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(sol < 0):
                continue
            x = np.zeros(k)
            x[list(cols)] = sol
            res = float(np.sum((a @ x - b) ** 2))
            if res < best_res * (1 - 1e-12):
                best, best_res = x, res
    return best


def fit_op(
    terms: Sequence[str],
    features: Mapping[str, np.ndarray],
    times_ms: np.ndarray,
    *,
    signed: bool = False,
) -> OpFit:
    """Fit ``t = Σ_term c_term · feature_term`` (``t0``'s feature is 1), c >= 0, minimising the
    squared relative error. ``features[term]`` and ``times_ms`` are 1-D arrays of one length.
    ``signed``: a difference of times (an overhead, which may be negative): ordinary least
    squares on the absolute error, any sign."""
    terms = tuple(terms)
    bad = [t for t in terms if t not in TERMS]
    if bad or not terms:
        raise InputError(
            f"unknown {bad or terms!r} (choose from {', '.join(TERMS)})", argument="terms"
        )
    t = np.asarray(times_ms, float).ravel()
    if t.size < len(terms) or not np.all(np.isfinite(t)) or (not signed and np.any(t <= 0)):
        raise InputError(
            f"need at least {len(terms)} {'finite' if signed else 'positive finite'} times, "
            f"got {t.size}",
            argument="times_ms",
        )
    cols = [np.ones_like(t) if k == "t0" else np.asarray(features[k], float).ravel() for k in terms]
    a = np.stack(cols, axis=1)
    scale = np.maximum(np.abs(a).max(axis=0), 1e-300)  # column scaling keeps lstsq conditioned
    if signed:
        x = np.linalg.lstsq(a / scale, t, rcond=None)[0] / scale
    else:
        x = _nnls_small((a / scale) / t[:, None], np.ones_like(t)) / scale
    return OpFit(terms, tuple(float(v) for v in x))


def relative_errors(fit: OpFit, features: Mapping[str, np.ndarray], times_ms: np.ndarray):
    """|predicted − measured| / measured at each shape."""
    t = np.asarray(times_ms, float)
    return np.abs(fit.predict(features) - t) / t


def held_out_split(n_values: Sequence[int]) -> tuple[list[int], list[int]]:
    """(fit n, held-out n): every third n from the second, and the largest n (extrapolation),
    are held out; at least two n stay in the fit."""
    ns = sorted(int(v) for v in n_values)
    if len(ns) < 3:
        return ns, []
    held = {v for i, v in enumerate(ns) if i % 3 == 1} | {ns[-1]}
    fit = [v for v in ns if v not in held]
    return fit, sorted(held)


# how much lower the switch form's error over the fit rows must be to replace the one-line fit
SWITCH_GAIN = 2.0


@dataclass(frozen=True)
class SwitchFit:
    """A two-path fit in n (:func:`fit_switch`): ``low`` (a time per row, ``tokens``) at
    n <= ``switch_n``, ``high`` (the op's own terms) above it; ``rms`` the relative RMS error
    over the fit rows, and ``rms_plain`` the one-line fit's."""

    switch_n: int
    low: OpFit
    high: OpFit
    rms: float
    rms_plain: float

    def predict(self, n: np.ndarray, features: Mapping[str, np.ndarray]) -> np.ndarray:
        """Predicted ms at rows of pass size ``n`` and their features."""
        n = np.asarray(n, float)
        return np.where(n <= self.switch_n, self.low.predict(features), self.high.predict(features))


def _rms(pred: np.ndarray, t: np.ndarray) -> float:
    return float(np.sqrt(np.mean(((pred - t) / t) ** 2)))


def fit_switch(
    terms: Sequence[str],
    features: Mapping[str, np.ndarray],
    times_ms: np.ndarray,
    n: np.ndarray,
    *,
    gain: float = SWITCH_GAIN,
) -> SwitchFit | None:
    """The two-path form of a one-thread matrix product, or None where one line fits as well.

    Some CPU GEMM libraries (PyTorch's one-thread float32 ``linear`` among them) compute a few
    rows as that many matrix-vector products, each reading the whole weight matrix, and switch
    to a blocked product that reads it once per call from some row count on. Up to the switch
    the time is a time per row, ``t = c · n``; past it, the op's own terms (``t0 + flops``).
    For each candidate switch s -- a fit n with at least two distinct fit n above it -- the
    rows with n <= s are fitted by ``tokens`` alone and the others by ``terms`` (both by
    :func:`fit_op`); the s with the lowest relative RMS error over all rows is kept when that
    error is below 1/``gain`` of the one-line fit's (``fit_op(terms)`` on every row), else
    None. ``n`` gives each row's pass size; the arrays are those of :func:`fit_op`."""
    t = np.asarray(times_ms, float).ravel()
    n = np.asarray(n, float).ravel()
    feats = {k: np.asarray(v, float).ravel() for k, v in features.items()}
    plain = fit_op(terms, feats, t)
    rms_plain = _rms(plain.predict(feats), t)
    distinct = sorted(set(n.tolist()))
    best: SwitchFit | None = None
    for s in distinct:
        above = [v for v in distinct if v > s]
        if len(above) < 2 or np.sum(n > s) < len(tuple(terms)):
            continue
        lo, hi = n <= s, n > s
        low = fit_op(("tokens",), {k: v[lo] for k, v in feats.items()}, t[lo])
        high = fit_op(terms, {k: v[hi] for k, v in feats.items()}, t[hi])
        cand = SwitchFit(int(s), low, high, 0.0, rms_plain)
        rms = _rms(cand.predict(n, feats), t)
        if best is None or rms < best.rms:
            best = SwitchFit(int(s), low, high, rms, rms_plain)
    if best is None or best.rms * gain >= rms_plain:
        return None
    return best


def fit_over_depths(at, terms, feats, m, signed, errors):
    """One op's fit over the depths at the cells ``at`` (a boolean mask of one pass size's
    cells in a [depths, n] grid): ``t0`` and the terms that vary there (at most one fewer than
    the cells), with each cell's error when it is left out of the fit (``errors(fit, sel)`` ->
    (relative, absolute ms) at the cells ``sel``): (fit, terms, errors, absolute errors in ms).
    With one cell the fit is its median (``t0``) and nothing is left out: the lists are empty
    and the caller gives that cell's error another way."""
    tv = ["t0"] + [
        t for t in terms if t in ("bytes", "flops", "depth") and np.ptp(feats[t][at]) > 0
    ]
    tv = tv[: max(1, int(at.sum()) - 1)]
    fit = fit_op(tv, {k: x[at] for k, x in feats.items()}, m[at], signed=signed)
    errs: list[float] = []
    absd: list[float] = []
    if int(at.sum()) < 2:
        return fit, tv, errs, absd
    for j in np.flatnonzero(at.ravel()):  # leave one depth out
        keep = at.copy().ravel()
        keep[j] = False
        keep = keep.reshape(at.shape)
        f = fit_op(tv, {k: x[keep] for k, x in feats.items()}, m[keep], signed=signed)
        sel = np.zeros(at.size, bool)
        sel[j] = True
        e, a = errors(f, sel.reshape(at.shape))
        errs.append(float(e[0]))
        absd.append(float(a[0]))
    return fit, tv, errs, absd


# ---------------------------------------------------------------------------- the whole pass


def kv_width(d: Any, n: Any, pad: int) -> Any:
    """The KV cells a pass of n tokens after d cached ones attends over in an engine that
    pads its cache view: ``max(pad, ⌈(d + n) / pad⌉ · pad)``. llama.cpp's
    ``llama_kv_cache::get_n_kv`` (``src/llama-kv-cache.cpp``) takes the cells up to the last
    used one, padded to ``max(n_pad, 256)``; its non-flash attention computes K·Q, the masked
    softmax and V·P over every one of them, masked or not. Elementwise on arrays."""
    p = float(pad)
    return np.maximum(p, np.ceil((np.asarray(d, float) + np.asarray(n, float)) / p) * p)


def op_features(
    op: Mapping[str, Any], n: float, d: float, pad: int | None = None
) -> dict[str, float]:
    """The features of a stored op at (n, d): its ``shape`` coefficients (see bench.ops).
    ``pad`` (an engine's KV padding, a whole pass's ``kv_pad``): the cells read,
    :func:`kv_width`, stand for d + n in the attention's bytes and flops and for d in the
    ``depth`` term (the attention mask the engine fills covers the same cells)."""
    s = op.get("shape", {})
    width = d + n if pad is None else kv_width(d, n, pad)
    return {
        "bytes": s.get("bytes0", 0.0) + s.get("bytes_n", 0.0) * n + s.get("bytes_nd", 0.0) * width,
        "flops": s.get("flops_n", 0.0) * n + s.get("flops_nd", 0.0) * n * width,
        "tokens": n * 1.0,
        "depth": d * 1.0 if pad is None else width * 1.0,
    }


def op_time(op: Mapping[str, Any], n: float, d: float, pad: int | None = None) -> float:
    """One stored op's fitted time (ms) at (n, d), per call of it (its ``count`` not applied).
    An op with a one-row fit (``fit_n1``, ``terms_n1``: an engine whose kernels take another
    path for a single row, :func:`specmoe.engines.llamacpp_ops.refit`) uses it at n = 1 and
    ``fit`` at n >= 2. An op in the two-path form (``switch_n``, ``terms_low``, ``fit_low``:
    :func:`fit_switch`) uses the low fit at n <= ``switch_n``. An op with fits of its own per n (``fits_n``: ``{"n": {"terms",
    "fit"}}``, the ``pern-width`` form) uses the one at n where it has one. ``pad``: as
    :func:`op_features`."""
    per_n = op.get("fits_n")
    key = str(int(n)) if float(n) == int(n) else None
    if per_n is not None and key in per_n:
        terms = tuple(per_n[key]["terms"])
        fit = OpFit(terms, coef_from_fit(per_n[key]["fit"], terms))
    elif n == 1 and op.get("fit_n1") is not None:
        terms = tuple(op["terms_n1"])
        fit = OpFit(terms, coef_from_fit(op["fit_n1"], terms))
    elif op.get("switch_n") is not None and n <= op["switch_n"]:
        terms = tuple(op["terms_low"])
        fit = OpFit(terms, coef_from_fit(op["fit_low"], terms))
    else:
        terms = tuple(op["terms"])
        fit = OpFit(terms, coef_from_fit(op["fit"], terms))
    return float(fit.predict(op_features(op, n, d, pad)))


def whole_pass_time(
    profile_whole_pass: Mapping[str, Any], n: int, d: int, num_layers: int
) -> tuple[float, float]:
    """The whole pass without its expert operation, (τ_ms, ε), from per-operation fits.
    ``d`` is the cache's length before the pass; a whole pass with ``kv_pad`` (an engine that
    pads its KV view, :func:`kv_width`) gives its ops the cells read.

    Sums, by Eq. (22) generalised to every operation of the pass, the fit of each op whose
    ``in_sum`` is true: ``per: "model"`` ops once (embedding lookup, final norm + lm_head),
    ``per: "layer"`` ops ``num_layers`` times, each ``count`` times a layer (the two RMSNorms of
    a layer are one op counted twice), plus ``overhead`` (the engine's per-layer framework
    time: the whole layer's forward minus the sum of its timed parts) once per layer. Inside:
    embed, norm, qkv, attention, o_proj, router, shared/dense MLP where the model has them,
    head, overhead, the model's and the engine's overheads (``model_overhead``: the model
    forward minus its parts; ``engine_overhead``: the engine's pass minus the model forward --
    every row's argmax and the routing record). Not inside: ``experts`` (timed for the overhead only) -- the caller adds
    the expert operation from the expert fits (Eq. (4)/(E.1)) at the plan's bytes.

    ε is the error bound of the sum when every op errs by its own held-out ε in the same
    direction: (Σ ε_op · |t_op| + Σ err_ms) / Σ t_op, where an overhead (a difference of times,
    which may be negative) carries its held-out error as ``err_ms`` per call instead.
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise InputError(f"must be a positive integer, got {num_layers!r}", argument="num_layers")
    if not (isinstance(n, int) and n >= 1) or isinstance(n, bool):
        raise InputError(f"must be a positive integer, got {n!r}", argument="n")
    if not (isinstance(d, int) and d >= 0) or isinstance(d, bool):
        raise InputError(f"must be a non-negative integer, got {d!r}", argument="d")
    pad = profile_whole_pass.get("kv_pad")
    total = err = 0.0
    for op in profile_whole_pass["ops"].values():
        if not op.get("in_sum", True):
            continue
        reps = int(op.get("count", 1)) * (num_layers if op["per"] == "layer" else 1)
        t = op_time(op, n, d, pad) * reps
        total += t
        if op.get("err_ms") is not None:
            err += float(op["err_ms"]) * reps
        else:
            err += float(op["eps"]) * abs(t)
    return total, (err / total if total > 0 else math.nan)
