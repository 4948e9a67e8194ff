"""The offline Oracle: the speculation budget as a stochastic shortest path (paper 000).

Legend for shapes: ``G`` generations, ``n`` positions (padded), ``K`` the largest budget.

Formulation. The states of a generation of n_g tokens are its positions i = 0..n_g; n_g is
terminal. At state i the Oracle picks a budget k in 0..K, pays C(k, i) (verification plus
drafting, from the cost model) and drafts positions i+1..i+k; the drafts are accepted in order,
draft j with probability q_j independently, so the accepted count A has survival
S(i, d) = P(A >= d) = q_{i+1}···q_{i+d} for d <= k. The pass emits A + 1 tokens and the next
state is min(i + A + 1, n_g). The Oracle minimises the expected total time to finish:

    J(n_g) = 0,
    J(i) = min_k [ C(k, i) + E J(min(i + A + 1, n_g)) ]
         = min_k [ C(k, i) + J(i+1) + sum_{d=1..k} S(i, d) (J(i+d+1) - J(i+d)) ],

with J = 0 past n_g. "Expected" is over the acceptance of drafts whose outcome the recorded
rounds do not fix (q_j strictly between 0 and 1); where every q_j is 0 or 1 (the deterministic
counterfactual on the reference sequence) J(0) is the least total time over all budget
sequences. Transitions only move forward, so one backward pass is exact: O(n·G·K) work. With
many generations each step over positions is vectorised over generations and budgets (n numpy
steps); with few, a scalar loop per generation is faster and used instead. Ties go to the
smaller budget.

The theoretical maximum speedup over plain decoding (Figure 2 of paper 000) is
S_max = sum_g T_plain,g / sum_g J_g(0), with T_plain,g = sum_{i < n_g} C(0, i).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "OracleSolution",
    "OracleSummary",
    "expected_accepted",
    "occupancy",
    "solve",
    "summarise",
    "survival",
]


def survival(q: np.ndarray, k_max: int, n: int | None = None) -> np.ndarray:
    """S[g, i, d] = q[g, i+1]···q[g, i+d] for d = 0..k_max: q [G, >= n+K+1] -> [G, n, K+1]."""
    q = np.asarray(q, dtype=np.float64)
    n = q.shape[1] - k_max - 1 if n is None else n
    s = np.ones((q.shape[0], n, k_max + 1))
    for d in range(1, k_max + 1):
        s[:, :, d] = s[:, :, d - 1] * q[:, d : d + n]
    return s


def expected_accepted(surv: np.ndarray) -> np.ndarray:
    """E[A | i, k] = sum_{d=1..k} S(i, d): [..., K+1] -> [..., K+1]."""
    out = np.cumsum(surv, axis=-1) - surv[..., :1]
    return out


@dataclass(frozen=True, eq=False)
class OracleSolution:
    """value [G, n+K+2]: J (0 from n_g on); policy [G, n]: k* (int8; 0 past n_g)."""

    value: np.ndarray
    policy: np.ndarray
    length: np.ndarray

    @property
    def total(self) -> np.ndarray:
        """[G] J(0): the least expected time of each generation."""
        return self.value[:, 0]


# Below this many generations a per-generation scalar loop beats the vectorised step (numpy's
# per-call overhead dominates a step over few generations); both compute the same recursion.
_SCALAR_BELOW = 24


def _solve_scalar(cost: list, surv: list, n: int, k_max: int) -> tuple[list, list]:
    """One generation: cost, surv flat lists [n·(K+1)] -> (J [n+K+2], policy [n])."""
    value = [0.0] * (n + k_max + 2)
    policy = [0] * n
    kp1 = k_max + 1
    for i in range(n - 1, -1, -1):
        base = i * kp1
        acc = value[i + 1]
        best, best_k = cost[base] + acc, 0
        for d in range(1, kp1):
            acc += surv[base + d] * (value[i + d + 1] - value[i + d])
            v = cost[base + d] + acc
            if v < best:
                best, best_k = v, d
        value[i] = best
        policy[i] = best_k
    return value, policy


def solve(
    cost: np.ndarray, q: np.ndarray, length: np.ndarray, *, surv: np.ndarray | None = None
) -> OracleSolution:
    """Backward dynamic programming: cost [G, n, K+1], q [G, n+K+1], length [G]."""
    cost = np.asarray(cost, dtype=np.float64)
    g, n, kp1 = cost.shape
    k_max = kp1 - 1
    length = np.asarray(length, dtype=np.int64)
    s = survival(q, k_max, n) if surv is None else surv
    if g < _SCALAR_BELOW:
        value = np.zeros((g, n + kp1 + 1))
        policy = np.zeros((g, n), dtype=np.int8)
        for j in range(g):
            n_g = int(length[j])
            v, p = _solve_scalar(
                cost[j, :n_g].ravel().tolist(), s[j, :n_g].ravel().tolist(), n_g, k_max
            )
            value[j, : len(v)] = v
            policy[j, :n_g] = p
        return OracleSolution(value=value, policy=policy, length=length)
    # position-major copies so each step reads contiguous [K+1, G] blocks
    c_t = np.ascontiguousarray(cost.transpose(1, 2, 0))  # [n, K+1, G]
    s_t = np.ascontiguousarray(s[:, :, 1:].transpose(1, 2, 0))  # [n, K, G]
    value = np.zeros((n + kp1 + 1, g))
    policy = np.zeros((n, g), dtype=np.int8)
    live = np.arange(n)[:, None] < length[None, :]  # [n, G]
    q_buf = np.empty((kp1, g))
    for i in range(n - 1, -1, -1):
        w = value[i + 1 : i + kp1 + 1]  # [K+1, G]: J(i+1..i+K+1)
        np.subtract(w[1:], w[:-1], out=q_buf[1:])
        q_buf[1:] *= s_t[i]
        np.cumsum(q_buf[1:], axis=0, out=q_buf[1:])
        q_buf[0] = 0.0
        q_buf += w[0]
        q_buf += c_t[i]
        k = q_buf.argmin(axis=0)
        value[i] = np.where(live[i], np.take_along_axis(q_buf, k[None], 0)[0], 0.0)
        policy[i] = np.where(live[i], k, 0)
    return OracleSolution(value=value.T.copy(), policy=policy.T.copy(), length=length)


def _occupancy_scalar(policy: list, surv: list, n: int, kp1: int) -> list:
    """One generation: policy [n], surv flat [n·(K+1)] -> pi [n]."""
    pi = [0.0] * (n + kp1 + 1)
    pi[0] = 1.0 if n else 0.0
    for i in range(n):
        p = pi[i]
        if p == 0.0:
            continue
        k, base = policy[i], i * kp1
        for a in range(k):
            pi[i + a + 1] += p * (surv[base + a] - surv[base + a + 1])
        pi[i + k + 1] += p * surv[base + k]
    return pi[:n]


def occupancy(policy: np.ndarray, surv: np.ndarray, length: np.ndarray) -> np.ndarray:
    """pi[g, i]: probability that a round starts at position i under ``policy`` [G, n].

    Forward pass: pi(0) = 1 and pi(i) sends pi(i)·P(A = a) to i + a + 1, with
    P(A = a) = S(i, a) - S(i, a+1) for a < k and S(i, k) for a = k.
    """
    g, n = policy.shape
    kp1 = surv.shape[2]
    length = np.asarray(length)
    if g < _SCALAR_BELOW:
        out = np.zeros((g, n))
        for j in range(g):
            n_g = int(length[j])
            out[j, :n_g] = _occupancy_scalar(
                policy[j, :n_g].tolist(), surv[j, :n_g].ravel().tolist(), n_g, kp1
            )
        return out
    pi = np.zeros((n + kp1 + 1, g))
    pi[0] = (length > 0).astype(float)
    s_t = surv.transpose(1, 2, 0)  # [n, K+1, G]
    a = np.arange(kp1)[:, None]
    pol_t = policy.T.astype(np.int64)
    live = np.arange(n)[:, None] < length[None, :]
    for i in range(n):
        k = pol_t[i]
        si = s_t[i]
        nxt = np.where(a + 1 <= k, np.vstack([si[1:], np.zeros((1, g))]), 0.0)
        p = np.where(a <= k, si - nxt, 0.0)
        pi[i + 1 : i + kp1 + 1] += p * np.where(live[i], pi[i], 0.0)
    return np.where(live.T, pi[:n].T, 0.0)


@dataclass(frozen=True)
class OracleSummary:
    """Figure 2 quantities of one L_max (expectations under the Oracle's policy)."""

    l_max: int
    s_max: float  # sum T_plain / sum J(0)
    mean_k: float  # E[sum k] / E[rounds]
    mean_accepted: float  # E[sum A] / E[rounds]
    cap_rate: float  # share of rounds with k* below the draft's matching run
    rounds: float  # expected rounds, all generations
    time_ms: float  # sum J(0)
    plain_ms: float  # sum T_plain
    tokens: int


def summarise(
    cost: np.ndarray, q: np.ndarray, length: np.ndarray
) -> tuple[OracleSummary, OracleSolution, np.ndarray]:
    """Solve and summarise: -> (summary, solution, occupancy [G, n])."""
    _g, n, kp1 = cost.shape
    k_max = kp1 - 1
    s = survival(q, k_max, n)
    sol = solve(cost, q, length, surv=s)
    pi = occupancy(sol.policy, s, length)
    k = sol.policy.astype(np.int64)
    ea = np.take_along_axis(expected_accepted(s), k[..., None], -1)[..., 0]
    # capped: the draft would have matched beyond k* (P(A >= k*+1) = S(i, k*+1)), k* < L_max
    nxt = np.minimum(k + 1, k_max)[..., None]
    can = (k < k_max) & np.isfinite(np.take_along_axis(cost, nxt, -1)[..., 0])
    beyond = np.where(can, np.take_along_axis(s, nxt, -1)[..., 0], 0.0)
    live = np.arange(n)[None, :] < length[:, None]
    plain = float(np.where(live, cost[:, :, 0], 0.0).sum())
    rounds = float(pi.sum())
    summary = OracleSummary(
        l_max=k_max,
        s_max=plain / float(sol.total.sum()),
        mean_k=float((pi * k).sum()) / rounds,
        mean_accepted=float((pi * ea).sum()) / rounds,
        cap_rate=float((pi * beyond).sum()) / rounds,
        rounds=rounds,
        time_ms=float(sol.total.sum()),
        plain_ms=plain,
        tokens=int(length.sum()),
    )
    return summary, sol, pi
