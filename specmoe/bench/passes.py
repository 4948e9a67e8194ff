"""The expert ids the benchmark feeds each kernel (paper 002 Section 2), numpy only.

Legend: ``n`` tokens per pass, ``m`` slots per token, ``N`` experts, ``U`` distinct experts
that the pass's n·m slots name.

Two kinds of passes:

* chosen ids (:func:`chosen_pass`): for a pass size n and a target U with
  ``m <= U <= min(nm, N)``, the n·m slots name exactly U distinct experts and each token's m
  slots are distinct (as a router's are). The U experts are drawn at random; slot s = t·m + j
  takes expert ``pool[s mod U]`` (so every expert of the pool appears, as evenly as n·m
  allows), then each token's slot order is shuffled. U = m is the heaviest repetition (every
  token names the same m experts), U = min(nm, N) none.
* recorded windows (:func:`recorded_windows`): n consecutive tokens of one document of a
  routing trace in one layer, ids copied as recorded. Windows never cross a document boundary.

:class:`Rotation` relabels the experts of each timed pass onto a pool of P >= N weight slots,
advancing through the pool, so that between two uses of one slot at least ``flush_bytes`` of
other weights are read: every timing reads its weights from memory, not from the last-level
cache. Relabelling keeps which slots share an expert, so the bytes and the repetition pattern
of the pass are unchanged.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from specmoe.errors import InputError


def u_grid(n: int, m: int, num_experts: int, points: int) -> list[int]:
    """``points`` values of U from m (heavy repetition) to min(nm, N) (none), both included."""
    hi = min(n * m, num_experts)
    if n == 1 or hi == m:
        return [m]
    k = max(2, min(points, hi - m + 1))
    return sorted({round(v) for v in np.linspace(m, hi, k)})


def chosen_pass(n: int, m: int, num_experts: int, u: int, rng: np.random.Generator) -> np.ndarray:
    """[n, m] ids whose n·m slots name exactly ``u`` distinct experts, distinct per token."""
    if not m <= u <= min(n * m, num_experts):
        raise InputError(f"U={u} must lie in [m={m}, min(nm, N)={min(n * m, num_experts)}]")
    pool = rng.choice(num_experts, size=u, replace=False)
    ids = pool[np.arange(n * m) % u].reshape(n, m)  # consecutive m of a cycle of u >= m: distinct
    for t in range(n):
        ids[t] = ids[t, rng.permutation(m)]
    return ids


def distinct(ids: np.ndarray) -> int:
    """U of one pass: the number of distinct experts its slots name."""
    return int(np.unique(ids).size)


@dataclass(frozen=True)
class Window:
    layer: int  # position of the layer in the trace (0..L-1)
    start: int  # first token
    ids: np.ndarray  # [n, m]

    @property
    def n(self) -> int:
        return int(self.ids.shape[0])


def recorded_windows(
    experts: np.ndarray,
    doc_offsets: np.ndarray,
    n: int,
    layer: int,
    count: int,
    rng: np.random.Generator,
) -> list[Window]:
    """Up to ``count`` windows of n consecutive tokens within documents, drawn without
    replacement (all of them when fewer exist), ordered by start. ``experts`` is [T, L, m]."""
    starts = [np.arange(a, b - n + 1) for a, b in itertools.pairwise(doc_offsets) if b - a >= n]
    if not starts:
        return []
    allstarts = np.concatenate(starts)
    pick = np.sort(rng.choice(allstarts, size=min(count, allstarts.size), replace=False))
    return [
        Window(layer, int(s), np.asarray(experts[s : s + n, layer], dtype=np.int64)) for s in pick
    ]


class Rotation:
    """Relabel each pass's experts onto a rotating pool of ``pool`` weight slots.

    Between two uses of one slot, at least ``pool - u_max`` other slots are used, that is at
    least ``flush_bytes`` when ``pool = max(N, u_max + ceil(flush_bytes / expert_bytes))``
    (:func:`pool_size`).
    """

    def __init__(self, pool: int):
        self.pool = int(pool)
        self.next = 0

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        uniq, inv = np.unique(ids, return_inverse=True)
        slots = (self.next + np.arange(uniq.size)) % self.pool
        self.next = int((self.next + uniq.size) % self.pool)
        return slots[inv.reshape(ids.shape)].astype(np.int64)


def pool_size(num_experts: int, u_max: int, expert_bytes: float, flush_bytes: float) -> int:
    """Weight slots so that every slot is reused only after ``flush_bytes`` of other reads."""
    return int(max(num_experts, u_max + math.ceil(flush_bytes / expert_bytes)))
