"""Bandwidth transfer to a held-out model (paper 002 Appendix E "Transfer", Figure 7). numpy only.

Legend: ``M`` models of one engine (here: one machine and specmoe's CPU kernels), ``n`` tokens
of a pass, ``p`` the kernel (``per_slot`` or ``dedup``), ``b`` bytes of one expert of the
model at the timed dtype.

**The question.** Can the effective bandwidth β_p(n) of a kernel be characterised once per
engine and carried to a model whose expert operation was never timed? Paper 002 holds out one
model at a time and fits the others; the fit misses the held-out bandwidth by 9 to 206%
(median 23% on CUDA, 47% on Metal) and places the crossover within one in 1 of 6 CUDA and
2 of 8 Metal configurations, against 6 of 6 and 7 of 8 with each model's own measurement.

**The forms, fixed before any held-out prediction was made** (this docstring was committed
before the first held-out prediction was computed; nothing below was chosen after looking at
a held-out miss):

* ``loglinear`` (the paper's form, Appendix E): per kernel p, by least squares over the
  (model, n) points of the *other* models at n = 2..n_max,

      log β_p(n) = a_p + s_p · log n + g_p · log b.

* ``structure`` (the second form, from the kernel's structure, stated in advance): time per
  requested byte, 1/β, as the sum of the costs a kernel of specmoe's structure pays. Each expert
  product pays a fixed cost o (a call, its thread dispatch), each first read of an expert
  streams b bytes from memory at one rate, each repeated read (a per-slot kernel naming an
  expert again in the same pass) at another (from cache), and each token row of a product
  costs compute proportional to b (6·h·I flops per row, b = 3·h·I·bytes per weight); the pass
  pays a fixed cost t_op. Dividing the pass time by its requested bytes gives, per kernel,
  a linear model in four regressors with no term chosen after seeing a miss:

      per-slot:  1/β_slot(n)  = k0 + k1 / b + k2 · ū(n)        + k3 / (n·m·b),
      dedup:     1/β_dedup(n) = k0 + k1 / b + k2 · n·m / U(n)  + k3 / (U(n)·b),

  (per-slot: n·m products of one row each, U(n) of them first reads, so the stream/cache mix
  is ū(n) = U(n)/(n·m); dedup: U(n) products of n·m/U(n) rows on average, all first reads),
  fitted by least squares on the other models' points at n = 2..n_max. U(n) and ū(n) are the
  held-out model's own from its recorded windows: routing is an input of the prediction, not
  a timing.

**What is predicted** for the held-out model: β_slot(n) and β_dedup(n) at n = 2..n_max, the
ratio r(n) = β_dedup(n)/β_slot(n) and the crossover: the smallest n >= 2 from which
ū(n) < r(n) holds at every larger n (Eq. (7) of paper 002 with equal fixed work: the
deduplicating kernel is faster where the byte share ū(n) = E_dedup(n)/E_slot(n) is below the
bandwidth ratio), with ū(n) from the model's routing. The same rule on the model's own
measured r(n) is the "measured" crossover; the benchmark's own crossover (from the summed
operation times, with the kernels' fixed work) is reported beside it.

**The miss** of a predicted bandwidth is |β̂ − β| / β at each n (the paper reports the range
and the median over models, kernels and n = 2, 4, 6, 8); of r the same relative error.

**Routing at each model's shapes.** The models' own routing is not recorded here, so each
benchmark draws its recorded windows from synthetic routing at the model's N and m carried
from the bundled trace's overlap statistics (:func:`overlap_moments`, :func:`transfer_routing`):
the uniform-IPF construction of :mod:`specmoe.routing.synth` with p = m'/N' and
c(j) = m'·ō(j)/N', ō(j) the layer-mean overlap at lag j of the source (the fraction of a token's
experts that the token j later reuses), so the share of reused experts is the source's at every
N' and m'. With m' = m and one layer per source layer it is
:func:`specmoe.routing.synth.uniform_moments` exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specmoe.errors import InputError
from specmoe.formats.trace import RoutingTrace
from specmoe.routing.ipf import ExpertMoments

__all__ = [
    "fit_form",
    "hold_out",
    "overlap_moments",
    "predict_form",
    "profile_points",
    "transfer_routing",
]


def overlap_moments(
    moments: ExpertMoments, *, num_experts: int, top_k: int, layer_mean: bool = True
) -> ExpertMoments:
    """Uniform-IPF moments at N' = ``num_experts``, m' = ``top_k`` with the source's overlap.

    Every expert gets p = m'/N' and c(j) = m'·o(j)/N' with o(j) the source's overlap at lag j
    (o_l(j) = Σ_e c_{l,e}(j)/m); ``layer_mean``: one layer whose o(j) is the mean over the
    source's layers (the benchmark times one layer), else one layer per source layer.
    """
    from dataclasses import replace

    from specmoe.routing.synth import uniform_moments

    out = uniform_moments(moments, num_experts, top_k=int(top_k), layer_mean=layer_mean)
    return replace(
        out,
        meta={
            **moments.meta,
            "overlap_from": {
                "num_experts": moments.num_experts,
                "top_k": moments.top_k,
                "layers": moments.num_layers,
                "layer_mean": layer_mean,
            },
        },
    )


def transfer_routing(
    moments: ExpertMoments,
    *,
    num_experts: int,
    top_k: int,
    tokens: int = 2048,
    window: int = 9,
    seed: int = 0,
) -> RoutingTrace:
    """One layer of uniform-IPF routing at (N', m') with the source's layer-mean overlap
    (:func:`overlap_moments`), drawn by :func:`specmoe.routing.synth.synthesize`."""
    from specmoe.routing.synth import synthesize

    mo = overlap_moments(moments, num_experts=num_experts, top_k=top_k)
    tr = synthesize(mo, tokens, window=window, variant="uniform", seed=seed)
    meta: dict[str, Any] = {
        **tr.meta,
        "source": f"uniform IPF at N={num_experts}, m={top_k} from the layer-mean overlap of "
        f"{moments.meta.get('file', moments.meta.get('source', 'the source statistics'))}",
    }
    return RoutingTrace(
        experts=tr.experts,
        doc_offsets=tr.doc_offsets,
        num_experts=tr.num_experts,
        meta=meta,
        name="transfer routing",
    )


# --- the held-out prediction ---------------------------------------------------------------

FORMS = ("loglinear", "structure")
KERNELS = ("per_slot", "dedup")


def profile_points(profile: dict[str, Any], *, name: str = "profile") -> dict[str, Any]:
    """The numbers a transfer fit reads from one bandwidth profile (a ``profile.json`` dict):
    model name, expert bytes b, m, n [k], β_slot(n), β_dedup(n) (GB/s, recorded windows),
    ū(n), U(n) = ū(n)·n·m, r(n) and the benchmark's crossover."""
    try:
        model = profile["model"]
        n = np.asarray(profile["n"], dtype=np.int64)
        bs = np.asarray(profile["beta_slot"], dtype=np.float64)
        bd = np.asarray(profile["beta_dedup"], dtype=np.float64)
        ub = np.asarray(profile["u_bar"], dtype=np.float64)
        b = float(model["expert_bytes"])
        m = int(model["top_k"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{name}: not a bandwidth profile ({exc})") from None
    timed = (profile.get("extra") or {}).get("expert_bytes")
    if isinstance(timed, (int, float)) and timed > 0:
        b = float(timed)  # the bytes of one expert at the timed dtype
    if not (n.shape == bs.shape == bd.shape == ub.shape) or n.size < 2:
        raise InputError(f"{name}: n, beta_slot, beta_dedup and u_bar differ in length")
    if np.any(bs <= 0) or np.any(bd <= 0) or np.any(ub <= 0) or b <= 0:
        raise InputError(f"{name}: bandwidths, byte shares and expert bytes must be positive")
    return {
        "model": str(model.get("name", name)),
        "b": b,
        "m": m,
        "n": n,
        "beta_slot": bs,
        "beta_dedup": bd,
        "u_bar": ub,
        "U": ub * n * m,
        "r": bd / bs,
        "crossover": profile.get("crossover"),
    }


def _design(form: str, kernel: str, pts: dict[str, Any], idx: np.ndarray) -> np.ndarray:
    """[k, p] regressors of ``form`` for ``kernel`` at the points ``idx`` of one model."""
    n = pts["n"][idx].astype(np.float64)
    b = np.full(n.shape, pts["b"] / 1e9)  # GB
    one = np.ones_like(n)
    if form == "loglinear":
        return np.column_stack([one, np.log(n), np.log(b)])
    if form == "structure":
        m = pts["m"]
        if kernel == "per_slot":
            return np.column_stack([one, 1 / b, pts["u_bar"][idx], 1 / (n * m * b)])
        U = pts["U"][idx]
        return np.column_stack([one, 1 / b, n * m / U, 1 / (U * b)])
    raise InputError(f"unknown form {form!r} (choose from {', '.join(FORMS)})", argument="form")


def _response(form: str, beta: np.ndarray) -> np.ndarray:
    return np.log(beta) if form == "loglinear" else 1.0 / beta


def _inverse(form: str, y: np.ndarray) -> np.ndarray:
    if form == "loglinear":
        return np.exp(y)
    with np.errstate(divide="ignore"):
        return np.where(y > 0, 1.0 / np.where(y > 0, y, 1.0), np.inf)


def fit_form(form: str, kernel: str, models: list[dict[str, Any]], *, n_min: int = 2) -> np.ndarray:
    """Least-squares coefficients of ``form`` for ``kernel`` on the points n >= n_min of every
    model in ``models`` (:func:`profile_points` dicts); see the module docstring."""
    if kernel not in KERNELS:
        raise InputError(f"unknown kernel {kernel!r}", argument="kernel")
    X, y = [], []
    for pts in models:
        idx = np.flatnonzero(pts["n"] >= n_min)
        X.append(_design(form, kernel, pts, idx))
        y.append(_response(form, pts[f"beta_{'slot' if kernel == 'per_slot' else 'dedup'}"][idx]))
    A, Y = np.vstack(X), np.concatenate(y)
    if A.shape[0] < A.shape[1]:
        raise InputError(f"{A.shape[0]} points for {A.shape[1]} coefficients", argument="models")
    coef, *_ = np.linalg.lstsq(A, Y, rcond=None)
    return coef


def predict_form(
    form: str, kernel: str, coef: np.ndarray, pts: dict[str, Any], idx: np.ndarray
) -> np.ndarray:
    """β̂ (GB/s) of ``kernel`` at the points ``idx`` of one model from a fit's ``coef``."""
    return _inverse(form, _design(form, kernel, pts, idx) @ coef)


def _within_one(a: int | None, b: int | None, n_max: int) -> bool:
    """|a − b| <= 1 with "no crossover up to n_max" counted as n_max + 1."""
    fa = n_max + 1 if a is None else a
    fb = n_max + 1 if b is None else b
    return abs(fa - fb) <= 1


def hold_out(
    models: list[dict[str, Any]], *, form: str, n_report: tuple[int, ...] = (2, 4, 6, 8)
) -> dict[str, Any]:
    """Hold out each model in turn, fit ``form`` on the others, predict its β_slot(n),
    β_dedup(n), r(n) at n >= 2 and its crossover (module docstring). Misses are relative,
    |pred − measured| / measured, summarised at the pass sizes ``n_report``."""
    from specmoe.cost.step import crossover

    if len(models) < 2:
        raise InputError("need profiles of at least two models", argument="models")
    names = [p["model"] for p in models]
    if len(set(names)) != len(names):
        raise InputError(f"a model appears twice: {names}", argument="models")
    rows = []
    for i, held in enumerate(models):
        others = [p for j, p in enumerate(models) if j != i]
        idx = np.flatnonzero(held["n"] >= 2)
        n = held["n"][idx]
        n_max = int(held["n"].max())
        pred = {k: predict_form(form, k, fit_form(form, k, others), held, idx) for k in KERNELS}
        meas = {"per_slot": held["beta_slot"][idx], "dedup": held["beta_dedup"][idx]}
        r_hat = pred["dedup"] / pred["per_slot"]
        r = held["r"][idx]
        ub = held["u_bar"][idx]
        miss = {k: np.abs(pred[k] - meas[k]) / meas[k] for k in KERNELS}
        r_miss = np.abs(r_hat - r) / r
        cross_t = crossover(r_hat - ub, n)
        cross_own = crossover(r - ub, n)
        cross_bench = held["crossover"]
        rows.append(
            {
                "held_out": held["model"],
                "expert_bytes": held["b"],
                "fitted_on": [p["model"] for p in others],
                "n": n.tolist(),
                "beta_slot": meas["per_slot"].tolist(),
                "beta_dedup": meas["dedup"].tolist(),
                "beta_slot_pred": pred["per_slot"].tolist(),
                "beta_dedup_pred": pred["dedup"].tolist(),
                "r": r.tolist(),
                "r_pred": r_hat.tolist(),
                "u_bar": ub.tolist(),
                "miss_slot": miss["per_slot"].tolist(),
                "miss_dedup": miss["dedup"].tolist(),
                "miss_r": r_miss.tolist(),
                "crossover_bench": cross_bench,
                "crossover_own": cross_own,
                "crossover_transferred": cross_t,
                "transferred_within_one": _within_one(cross_t, cross_bench, n_max),
                "own_within_one": _within_one(cross_own, cross_bench, n_max),
            }
        )
    sel = [(row, j) for row in rows for j, nn in enumerate(row["n"]) if nn in set(n_report)]
    beta_miss = np.array(
        [row[f"miss_{k}"][j] for row, j in sel for k in ("slot", "dedup")], dtype=np.float64
    )
    r_miss = np.array([row["miss_r"][j] for row, j in sel], dtype=np.float64)
    return {
        "form": form,
        "n_report": list(n_report),
        "models": rows,
        "beta_miss_min": float(beta_miss.min()) if beta_miss.size else None,
        "beta_miss_median": float(np.median(beta_miss)) if beta_miss.size else None,
        "beta_miss_max": float(beta_miss.max()) if beta_miss.size else None,
        "r_miss_by_model": {
            row["held_out"]: [
                float(min(row["miss_r"][j] for r2, j in sel if r2 is row)),
                float(max(row["miss_r"][j] for r2, j in sel if r2 is row)),
            ]
            for row in rows
            if any(r2 is row for r2, _ in sel)
        },
        "r_miss_median": float(np.median(r_miss)) if r_miss.size else None,
        "crossover_transferred_within_one": sum(r["transferred_within_one"] for r in rows),
        "crossover_own_within_one": sum(r["own_within_one"] for r in rows),
        "configurations": len(rows),
    }
