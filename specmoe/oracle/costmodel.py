"""The cost C(k, i) of a round at budget k, for the Oracle and the policies.

Legend for shapes: ``G`` generations, ``n`` positions, ``K`` the largest budget.

Two kinds:

* ``model``: C(k, i) = beta0_k + alpha_k·Ū(i, k) + c_k·L_i + T_D(k), the per-budget fits of
  model (4) of paper 000 at the pass's modelled experts and context, plus the draft-time model
  T_D(k) = a·k + b (0 at k = 0).
* ``measured``: C(k, i) = the median measured T_T + T_D of the log's rounds at budget k, the
  same at every position (a cost blind to which experts a pass needs).

A budget the log has no rounds at takes the coefficients (or the median) of the nearest
recorded budget, the smaller on a tie; :attr:`CostModel.source` says which. In particular plain
decoding (k = 0) without K = 0 runs is extrapolated from the smallest recorded budget, with
Ū = m at one token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specmoe.errors import InputError

__all__ = ["CostModel", "fitted_cost_model", "measured_cost_model"]


@dataclass(frozen=True)
class CostModel:
    """Coefficients per budget k = 0..K (ms); ``source[k]`` names the budget they came from."""

    kind: str
    beta0: tuple[float, ...]
    alpha: tuple[float, ...]
    c: tuple[float, ...]
    draft: tuple[float, ...]
    source: tuple[int, ...]

    @property
    def k_max(self) -> int:
        return len(self.beta0) - 1

    def evaluate(self, union: np.ndarray, context: np.ndarray) -> np.ndarray:
        """C [..., K'+1] from union [..., K'+1] (Ū of each budget's pass) and context [...]."""
        kp1 = union.shape[-1]
        if kp1 > len(self.beta0):
            raise InputError(f"cost model covers budgets 0..{self.k_max}, asked for {kp1 - 1}")
        b0, al, cc, dr = (np.asarray(v[:kp1]) for v in (self.beta0, self.alpha, self.c, self.draft))
        return b0 + dr + al * union + cc * np.asarray(context)[..., None]

    def step_times(self, union: np.ndarray, context: float) -> np.ndarray:
        """V(k), k = 0..K, at a typical union per budget [K+1] and one context length."""
        return self.evaluate(np.asarray(union, float), np.asarray(float(context)))

    def truncate(self, l_max: int) -> CostModel:
        s = slice(0, l_max + 1)
        return CostModel(
            self.kind, self.beta0[s], self.alpha[s], self.c[s], self.draft[s], self.source[s]
        )


def _nearest(have: list[int], k: int) -> int:
    return min(have, key=lambda h: (abs(h - k), h))


def fitted_cost_model(fits: dict, draft, k_max: int) -> CostModel:
    """From ``regression.fit_verify_by_k`` fits and a ``DraftFit`` (None: no draft time)."""
    if not fits:
        raise InputError("no budget has enough rounds to fit the verification cost")
    have = sorted(fits)
    src = tuple(_nearest(have, k) for k in range(k_max + 1))
    draft_ms = tuple(
        float(draft.predict(k)) if draft is not None else 0.0 for k in range(k_max + 1)
    )
    return CostModel(
        "model",
        tuple(fits[s].beta0 for s in src),
        tuple(fits[s].alpha for s in src),
        tuple(fits[s].c for s in src),
        draft_ms,
        src,
    )


def measured_cost_model(
    k: np.ndarray, t_verify: np.ndarray, t_draft: np.ndarray, k_max: int
) -> CostModel:
    """Median measured T_T + T_D per budget (a missing draft time counts as the budget's
    median draft time)."""
    have = sorted(int(v) for v in np.unique(k))
    med = {}
    for b in have:
        sel = k == b
        td = t_draft[sel]
        td = td[np.isfinite(td) & (td > 0)] if b > 0 else np.zeros(1)
        med[b] = float(np.median(t_verify[sel])) + (float(np.median(td)) if len(td) else 0.0)
    src = tuple(_nearest(have, b) for b in range(k_max + 1))
    zero = (0.0,) * (k_max + 1)
    return CostModel("measured", tuple(med[s] for s in src), zero, zero, zero, src)
