"""Bytes of a verification pass (paper 002 Section 1 "Bytes", Eqs. (2), (3), (11), (12); Table 6).

Legend: ``L`` MoE layers, ``n`` pass sizes 1..n_max (tokens verified in one pass), ``k`` draft
lengths (a pass of k + 1 tokens).

Routing arrays, as the routing statistics give them:
``rho``    [L, n_max]: rho[l, j-1] = rho_l(j), the consecutive-token reuse Eq. (1), rho_l(1) = 0
``union``  [L, n_max]: union[l, n-1] = U_l(n), the mean number of distinct experts of n tokens

Every function accepts Fractions (lists of them, or object arrays) and then computes exactly;
float input gives float64 arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from specmoe.errors import InputError

__all__ = [
    "BYTE_FACTORS",
    "PassBytes",
    "byte_share",
    "dedup_bytes_from_mean_reuse",
    "dedup_request_bytes",
    "dense_pass_bytes",
    "layer_mean",
    "mean_reuse",
    "pass_bytes",
    "reuse_from_union",
    "reuse_gap",
    "slot_bytes",
    "union_bytes",
    "union_from_reuse",
]

# Table 6 of paper 002: f_l, the bytes the deduplicating kernel reads per distinct expert of
# layer l over w_l, per (engine, model and format) as read from source. specmoe's own kernels
# read each distinct expert once: f_l = 1.
BYTE_FACTORS: dict[tuple[str, str], Fraction] = {
    ("llama.cpp Metal", "OLMoE Q8_0"): Fraction(1),
    ("llama.cpp Metal", "gpt-oss MXFP4"): Fraction(1),
    ("llama.cpp Metal", "Qwen3 Q4_K_M (low)"): Fraction(214, 100),
    ("llama.cpp Metal", "Qwen3 Q4_K_M (high)"): Fraction(233, 100),
    ("MLX-LM", "OLMoE 4-bit"): Fraction(10, 9),
    ("llama.cpp CUDA", "OLMoE Q8_0"): Fraction(1),
    ("llama.cpp CUDA", "gpt-oss MXFP4"): Fraction(500, 459),
    ("specmoe", "any"): Fraction(1),
}


def _array(x: Any, name: str, ndim: int) -> np.ndarray:
    """An object array when every entry is a Python int or Fraction (exact mode), else float64."""
    arr = np.asarray(x, dtype=object)
    if arr.ndim != ndim:
        raise InputError(f"{name}: expected a {ndim}-d array, got shape {arr.shape}")
    if arr.size == 0:
        raise InputError(f"{name}: empty")
    flat = arr.ravel()
    if all(isinstance(v, int | Fraction) and not isinstance(v, bool) for v in flat):
        return arr  # exact: Python ints and Fractions stay exact
    try:
        out = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{name}: not numeric") from None
    if not np.all(np.isfinite(out)):
        raise InputError(f"{name}: holds NaN or inf")
    return out


def _weights(w: Any, L: int) -> np.ndarray:
    wa = _array(w, "w", 1)
    if wa.shape[0] != L:
        raise InputError(f"w: {wa.shape[0]} layer byte counts for {L} layers")
    if any(not v > 0 for v in wa):
        raise InputError("w: expert bytes must be positive")
    return wa


def union_from_reuse(rho: Any, m: int) -> np.ndarray:
    """Eq. (2) of paper 002: U_l(n) = m sum_{j=1..n} (1 - rho_l(j)) (linearity of expectation,
    Eq. (B.6))."""
    r = _array(rho, "rho", 2)
    return m * np.cumsum(1 - r, axis=1)


def reuse_from_union(union: Any, m: int) -> np.ndarray:
    """rho_l(n) = 1 - (U_l(n) - U_l(n-1))/m with U_l(0) = 0: the inverse of Eq. (2)
    (:func:`union_from_reuse`, Eq. (B.6))."""
    U = _array(union, "union", 2)
    prev = np.concatenate([U[:, :1] * 0, U[:, :-1]], axis=1)
    return 1 - (U - prev) / m


def slot_bytes(m: int, W: Any, n: Any) -> Any:
    """E_slot(n) = m n W: one expert read per slot (Section 1)."""
    return m * np.asarray(n, dtype=object if isinstance(W, Fraction) else np.float64) * W


def union_bytes(w: Any, union: Any) -> np.ndarray:
    """E_dedup(n) = sum_l w_l U_l(n): the expected union bytes of a pass of n tokens [n_max]."""
    U = _array(union, "union", 2)
    return (_weights(w, U.shape[0])[:, None] * U).sum(axis=0)


def dedup_request_bytes(w: Any, union: Any, byte_factor: Any = 1) -> np.ndarray:
    """E_p(n) of the deduplicating kernel in the verify time by Eq. (5): sum_l f_l w_l U_l(n), with f_l >= 1 the
    byte factor (a number or one per layer; Table 6, :data:`BYTE_FACTORS`)."""
    U = _array(union, "union", 2)
    f = np.broadcast_to(np.asarray(byte_factor, dtype=object), (U.shape[0],))
    if any(not v >= 1 for v in f):
        raise InputError(f"byte_factor: f_l must be at least 1, got {byte_factor!r}")
    if U.dtype != object:
        f = f.astype(np.float64)
    return ((f * _weights(w, U.shape[0]))[:, None] * U).sum(axis=0)


def reuse_gap(w: Any, rho: Any, m: int) -> np.ndarray:
    """Eq. (3) of paper 002: E_slot(n) - E_dedup(n) = m sum_l w_l sum_{j<=n} rho_l(j) >= 0, the
    bytes reuse would save [n_max]."""
    r = _array(rho, "rho", 2)
    return m * (_weights(w, r.shape[0])[:, None] * np.cumsum(r, axis=1)).sum(axis=0)


def byte_share(w: Any, union: Any, m: int) -> np.ndarray:
    """u_bar(n) = E_dedup(n)/E_slot(n): the share of the per-slot bytes that deduplication
    requests (Section 2), [n_max] for n = 1..n_max."""
    U = _array(union, "union", 2)
    wa = _weights(w, U.shape[0])
    n = np.arange(1, U.shape[1] + 1, dtype=object if U.dtype == object else np.float64)
    return union_bytes(wa, U) / (m * n * wa.sum())


def mean_reuse(w: Any, rho: Any, k: int) -> Any:
    """Eq. (11) of paper 002: rho_bar_k = (1/(k W)) sum_{j=2..k+1} sum_l w_l rho_l(j), the
    byte-weighted mean reuse of the k drafted tokens of a pass of k + 1 tokens."""
    r = _array(rho, "rho", 2)
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k < r.shape[1]:
        raise InputError(
            f"k: must lie in 1..{r.shape[1] - 1} (rho holds n <= {r.shape[1]}), got {k!r}"
        )
    wa = _weights(w, r.shape[0])
    total = (wa[:, None] * r[:, 1 : k + 1]).sum()
    return total / (k * wa.sum())


def dedup_bytes_from_mean_reuse(m: int, W: Any, k: int, rho_bar: Any) -> Any:
    """Eq. (12) of paper 002: E_dedup(k+1) = m W + m W k (1 - rho_bar_k), a count from routing
    alone."""
    return m * W + m * W * k * (1 - rho_bar)


def dense_pass_bytes(D: Any, kv_per_token: Any, n: Any, *, context: int = 0) -> np.ndarray:
    """D(n) = D + kv(n - 1), the bytes read once per pass of n tokens (the dense term of the
    verify time by Eq. (5)).

    kv(k) = kv_per_token (context + k): a step verifying k + 1 tokens at context depth
    ``context`` reads the key-value cache of the context and of the k drafted positions (a
    choice: the paper leaves kv(k) to the engine; it only needs kv >= 0)."""
    if context < 0:
        raise InputError(f"context: depth must be non-negative, got {context}")
    n = np.asarray(n)
    return D + kv_per_token * (context + n - 1)


def layer_mean(arr: Any, num_layers: int) -> tuple[np.ndarray, str]:
    """Map per-layer statistics [L_trace, n] onto ``num_layers`` model layers.

    Same count: unchanged. Otherwise every model layer gets the mean over the trace's layers (the
    layer-mean), and the returned note says so."""
    a = np.asarray(arr)
    if a.shape[0] == num_layers:
        return a, f"{num_layers} trace layers used as the model's {num_layers} MoE layers"
    mean = a.mean(axis=0) if a.dtype != object else a.sum(axis=0) / a.shape[0]
    return (
        np.repeat(mean[None, :], num_layers, axis=0),
        f"the trace has {a.shape[0]} MoE layers, the model {num_layers}: every model layer "
        f"takes the layer-mean of the trace's statistics",
    )


@dataclass(frozen=True)
class PassBytes:
    """The bytes of passes of n = 1..n_max tokens for one model and routing. All [n_max]."""

    n: np.ndarray  # pass sizes 1..n_max
    dense: np.ndarray  # D(n)
    slot: np.ndarray  # E_slot(n) = m n W
    union: np.ndarray  # E_dedup(n) = sum_l w_l U_l(n), the union bytes
    dedup: np.ndarray  # sum_l f_l w_l U_l(n), requested by the deduplicating kernel
    u_bar: np.ndarray  # E_dedup(n)/E_slot(n)
    mean_reuse: np.ndarray  # [n_max - 1]: rho_bar_k for k = 1..n_max-1, Eq. (11)
    m: int
    W: float


def pass_bytes(spec: Any, union: Any, *, context: int = 0, byte_factor: Any = 1) -> PassBytes:
    """Every byte count of the verify time by Eq. (5) for a :class:`~specmoe.spec.ModelSpec` and ``union``
    [L, n_max] (already mapped onto the spec's L MoE layers; see :func:`layer_mean`)."""
    U = _array(union, "union", 2)
    if U.shape[0] != spec.num_moe_layers:
        raise InputError(f"union: {U.shape[0]} layers for a model with {spec.num_moe_layers}")
    m = spec.top_k
    w = np.asarray(spec.layer_expert_bytes, dtype=np.float64)
    W = float(w.sum())
    n = np.arange(1, U.shape[1] + 1)
    rho = reuse_from_union(U, m)
    mr = np.array([mean_reuse(w, rho, k) for k in range(1, U.shape[1])], dtype=np.float64)
    return PassBytes(
        n=n,
        dense=dense_pass_bytes(
            spec.dense_bytes, spec.kv_bytes_per_token, n, context=context
        ).astype(np.float64),
        slot=(m * n * W).astype(np.float64),
        union=union_bytes(w, U).astype(np.float64),
        dedup=dedup_request_bytes(w, U, byte_factor).astype(np.float64),
        u_bar=byte_share(w, U, m).astype(np.float64),
        mean_reuse=mr,
        m=m,
        W=W,
    )
