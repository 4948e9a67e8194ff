"""A synthetic plan, bandwidth profile and runs folder with known answers, for the validation and
report tests.

Four MoE layers; one layer's operation time (ms) with the per-slot kernel is
0.10 + 0.05 (n - 1) and with the deduplicating kernel 0.13 + 0.03 (n - 1) for n >= 2 (the
per-slot kernel runs n = 1 either way). Eq. (22) then predicts the saving
S_hat(n) = 4 (0.02 (n - 1) - 0.03) ms: negative at n = 2, positive from n = 3 (crossover 3).
The measured verify times add ``growth(n)`` (time outside the expert operation) to both kernels,
so the prediction's verify error is max growth(n)/tau_on(n) and the calibrated version is exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specmoe.cost import theory
from specmoe.formats.profile import BandwidthProfile
from specmoe.spec import ModelSpec

L = 4
N_MAX = 9
TAU1 = 5.0  # ms
ACC = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98]
K = list(range(9))


def spec() -> ModelSpec:
    return ModelSpec(
        name="tiny-moe",
        num_experts=8,
        top_k=2,
        num_moe_layers=L,
        hidden_size=64,
        expert_intermediate=32,
        bytes_per_weight=4.0,
    )


def op_times_ms() -> tuple[np.ndarray, np.ndarray]:
    n = np.arange(1, N_MAX + 1)
    slot = 0.10 + 0.05 * (n - 1)
    dedup = 0.13 + 0.03 * (n - 1)
    dedup[0] = slot[0]
    return np.tile(slot, (L, 1)), np.tile(dedup, (L, 1))


def predicted_saving_ms() -> np.ndarray:
    slot, dedup = op_times_ms()
    return (slot - dedup).sum(axis=0)


def write_profile(path: Path, *, eps: float = 0.05, measured_scale: float = 1.0) -> Path:
    slot, dedup = op_times_ms()
    n = list(range(1, N_MAX + 1))
    prof = BandwidthProfile(
        model=spec().to_dict(),
        device="cpu",
        dtype="float32",
        ceiling_gbps=20.0,
        n=n,
        beta_slot=[10.0] * N_MAX,
        beta_dedup=[6.0] * N_MAX,
        r=[0.6] * N_MAX,
        u_bar=[1.0 - 0.05 * (i - 1) for i in n],
        reread_cost=0.5,
        epsilon={"per_slot": eps / 2, "dedup": eps},
        crossover=3,
        fits={
            "per_slot": {"t_op": 1e-5, "c_u": 1e-9, "c_re": 5e-10},
            "dedup": {"t_op": 1e-5, "c_g": 1e-9, "c_t": 1e-6},
        },
        op_time={
            "per_slot": {
                "predicted": (slot / 1e3).tolist(),
                "measured": (slot * measured_scale / 1e3).tolist(),
            },
            "dedup": {
                "predicted": (dedup / 1e3).tolist(),
                "measured": (dedup * measured_scale / 1e3).tolist(),
            },
        },
        layers=list(range(L)),
        device_name="synthetic",
    )
    prof.save(path)
    return path


def write_plan(path: Path, profile: Path, *, model: ModelSpec | None = None) -> Path:
    """plan.json as ``specmoe plan`` writes it (build_plan on the profile, a geometric union),
    for ``model`` (default: the spec the profile was measured on)."""
    from specmoe.cost.plan import build_plan
    from specmoe.formats.profile import load_profile

    U = np.array([[8 * (1 - 0.75**n) for n in range(1, N_MAX + 1)]] * L)
    plan = build_plan(spec(), U, load_profile(profile), k_max=8, acceptance=ACC).to_dict()
    plan["model"] = (model or spec()).to_dict()
    plan["sources"] = {"bandwidth": {"path": str(profile)}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan))
    return path


def growth_ms(scale: float = 0.02) -> np.ndarray:
    return scale * np.arange(N_MAX) ** 1.5


def measured_verify_ms(
    growth: np.ndarray | None = None, saving_shift: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """tau_off(n), tau_on(n): Eq. (22) exactly plus ``growth`` on both kernels; ``saving_shift``
    [n] is added to tau_on (it lowers the measured saving by that much)."""
    slot, dedup = op_times_ms()
    g = growth_ms() if growth is None else growth
    off = TAU1 + (slot - slot[:, :1]).sum(axis=0) + g
    on = TAU1 + (dedup - slot[:, :1]).sum(axis=0) + g
    if saving_shift is not None:
        on = on + saving_shift
    return off, on


def draft_ms() -> np.ndarray:
    h = 0.3 * np.arange(len(K)) + 0.1
    h[0] = 0.0
    return h


def throughput_from_steps(V: np.ndarray) -> np.ndarray:
    """[A, K] tokens/s = G_a(k) / V(k) (V in ms)."""
    return np.array([[float(theory.expected_tokens(a, k)) / (V[k] / 1e3) for k in K] for a in ACC])


def write_runs(
    folder: Path,
    *,
    off: np.ndarray | None = None,
    on: np.ndarray | None = None,
    throughput: np.ndarray | None = None,
    per_prompt: bool = True,
    depths: tuple[int, ...] = (512,),
    model: str = "tiny-moe",
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if off is None or on is None:
        off, on = measured_verify_ms()
    h = draft_ms()
    if throughput is None:
        throughput = throughput_from_steps(on[: len(K)] + h)
    vcfg, tcfg = [], []
    rng = np.random.default_rng(1)
    for d in depths:
        c = {
            "depth": d,
            "n": list(range(1, len(off) + 1)),
            "verify_ms": {"off": off.tolist(), "on": on.tolist()},
            "draft_ms": h.tolist(),
        }
        if per_prompt:
            noise = rng.normal(0, 0.002, size=(6, len(off)))
            c["per_prompt_ms"] = {"off": (off + noise).tolist(), "on": (on + noise).tolist()}
        vcfg.append(c)
        tcfg.append(
            {
                "depth": d,
                "k": K,
                "acceptance": ACC,
                "tokens_per_s": np.asarray(throughput).tolist(),
                "dedup": True,
            }
        )
    (folder / "verify.json").write_text(
        json.dumps({"model": model, "device": "cpu", "engine": "specmoe", "configurations": vcfg})
    )
    (folder / "throughput.json").write_text(json.dumps({"model": model, "configurations": tcfg}))
    return folder


def world(tmp: Path, **runs_kw) -> tuple[Path, Path]:
    """(plan path, runs folder) of the default synthetic world."""
    prof = write_profile(tmp / "profile.json")
    plan = write_plan(tmp / "plan" / "plan.json", prof)
    runs = write_runs(tmp / "runs", **runs_kw)
    return plan, runs
