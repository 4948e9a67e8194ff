"""The power of the llama.cpp campaign's design (docs/runs-protocol-llamacpp.md), before its runs.

No llama.cpp run under the protocol exists, so the variance components are borrowed from the
power analysis of the whole-pass campaign (``results/cpu/power/power.json``, made by
``scripts/power_analysis.py`` from specmoe's own runs): the bundled model's for
llamacpp-bundled, olmoe-dummy-4L's (the same OLMoE-1B-7B shapes and bf16 experts, four layers)
for llamacpp-lifted. The step times are llama.cpp's own (``--steps``: a JSON file
``{"<config> d=<depth>": [V(0), ..., V(8)] ms}``; default: the figures written below, the
adapter's measured pass and draft times for the bundled model, llama-bench's for the lift). The simulation is
``power_analysis.tau_power`` and ``power_analysis.throughput_power`` unchanged: the share of
simulated campaigns in which a *perfect* prediction passes the k* and loss rules, and the
90th-percentile half-width of tau_p(n)'s interval.

With ``--from-runs FOLDER`` (a campaign folder of this protocol, e.g.
``results/cpu/llamacpp/whole-pass/round7``) the variance components are llama.cpp's own,
estimated from that campaign's units as ``scripts/power_analysis.py`` estimates specmoe's
(``verify_variance`` on the dedup setting, ``generation_variance`` on the oracle generations),
and the step times V(k) are those generations' own (decode time per round): as measured,
smoothed as ``power_analysis`` smooths them, and on a line in k for k >= 1 (the designs' step
model: llama.cpp's step grows about linearly in the pass). It then reports
the power of the design that was run and of a grid of throughput designs (prompts x repeats x
tokens, at most the qualifying prompts), each with its CPU cost: the model's cost
(``power_analysis.throughput_cost_s``) scaled by the ratio of the campaign's measured oracle
CPU time to the model's cost of the design it ran (the engine's loop, the oracle's reference
and the prefills the model leaves out). ``--target-kstar`` and ``--target-loss`` (defaults 0.9
and 0.8) name the cheapest design in which a perfect prediction passes the 10-of-11 and the
loss rule with at least that probability at the depth.

Usage: ``python scripts/llamacpp_power.py [--out DIR] [--steps FILE] [--seed 0]
[--from-runs FOLDER [--configs llamacpp-bundled]]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import power_analysis as pa  # noqa: E402

# the protocol's design: (verify prompts, recorded repeats), (throughput prompts, repeats, tokens)
DESIGN = {
    "llamacpp-bundled d=512": ((32, 4), (8, 2, 128), ("bundled", 512)),
    "llamacpp-bundled d=2048": ((31, 4), (8, 2, 128), ("bundled", 2048)),
    "llamacpp-lifted d=512": ((8, 3), (3, 1, 24), ("olmoe-dummy-4L", 512)),
    "llamacpp-lifted d=2048": ((8, 3), (2, 1, 16), ("olmoe-dummy-4L", 2048)),
}


def _tau(t1: float, slope: float) -> list[float]:
    return [t1 + slope * (n - 1) for n in range(1, 10)]


# h(k) of the oracle draft on llama.cpp, ms (k = 0: none), and tau(n) of the bundled model's
# pass through the adapter (logits of every row), both measured before the design on one
# prompt (docs/runs-protocol-llamacpp.md, "Measured before the design"; load average 4-5)
_H = [0.0, 0.51, 0.57, 0.66, 0.63, 0.67, 0.66, 0.70, 0.68]
_TAU = {
    512: [1.9, 2.9, 3.3, 4.0, 4.2, 4.4, 4.4, 4.9, 5.25],
    2048: [2.34, 4.31, 5.12, 5.68, 5.35, 6.3, 7.27, 7.6, 7.0],
}
# V(k) = tau(k + 1) + h(k). lifted: a line through the 4-layer lift's passes through the
# adapter (d = 512: 68, 109, 187, 286 ms at n = 1, 2, 5, 9; d = 2048: 94, 123, 204, 369 ms),
# h(k) left out (under 1 ms against 68-380 ms)
STEPS = {
    "llamacpp-bundled d=512": [_TAU[512][k] + _H[k] for k in range(9)],
    "llamacpp-bundled d=2048": [_TAU[2048][k] + _H[k] for k in range(9)],
    "llamacpp-lifted d=512": _tau(68.0, 27.5),
    "llamacpp-lifted d=2048": _tau(90.0, 36.0),
}


def analyse(steps: dict[str, list[float]], seed: int) -> dict:
    power = json.loads((ROOT / "results" / "cpu" / "power" / "power.json").read_text())
    src = {(c["model"], c["depth"]): c for c in power["configurations"]}
    rng = np.random.default_rng(seed)
    out = {}
    for name, ((pv, rv), (pt, rt, tokens), key) in DESIGN.items():
        c = src[key]
        s_prompt, s_rep = c["verify"]["s_prompt"], c["verify"]["s_rep"]
        s_gen = c["throughput"]["s_gen"]
        # the whole-pass analysis smooths V(k) for k >= 1 to alpha + beta ln k; these step
        # times grow about linearly in k, so both are reported: smoothed and as given
        thr = {}
        for how, V in (("smoothed", pa.smooth_steps(steps[name])), ("as_given", steps[name])):
            mu, w = pa.cell_model(V, s_rep, tokens)
            thr[how] = pa.throughput_power(mu, w, s_prompt, s_gen, pt, rt, rng)
        med, p90 = pa.tau_power(s_prompt, s_rep, pv, rv, rng)
        out[name] = {
            "variances_from": f"results/cpu/power/power.json {key[0]} d={key[1]}",
            "s_prompt": s_prompt,
            "s_rep": s_rep,
            "s_gen": s_gen,
            "step_ms": steps[name],
            "verify": {
                "prompts": pv,
                "repeats": rv,
                "tau_halfwidth_median": med,
                "tau_halfwidth_p90": p90,
            },
            "throughput": {"prompts": pt, "repeats": rt, "tokens": tokens, **thr},
        }
    return out


OWN_PROMPTS = (8, 12, 16, 24, 31)
OWN_REPEATS = (2, 3, 4, 6)
OWN_TOKENS = (128, 256)


def linear_steps(step_ms: list[float]) -> list[float]:
    """V(0) as measured and for k >= 1 the least-squares line alpha + beta k: llama.cpp's
    step grows about linearly in the pass size on these models (its matrix products and the
    expert union both), where ``power_analysis.smooth_steps``'s alpha + beta ln k saturates
    and puts near-ties between k = 1 and k = 8."""
    v = np.asarray(step_ms, dtype=np.float64)
    k = np.arange(1, v.size)
    X = np.stack([np.ones(k.size), k], axis=1)
    coef, *_ = np.linalg.lstsq(X, v[1:], rcond=None)
    return [float(v[0]), *(X @ coef).tolist()]


def own_analysis(
    folder: Path, configs: list[str], seed: int, *, target_kstar: float, target_loss: float
) -> dict:
    """llama.cpp's own variance components from a campaign ``folder`` (module docstring), the
    power of the design it ran, and of the grid OWN_PROMPTS x OWN_REPEATS x OWN_TOKENS."""
    from specmoe.errors import InputError

    record = json.loads((folder / "runs_campaign.json").read_text())
    rng = np.random.default_rng(seed)
    out: dict = {"from_runs": str(folder), "seed": seed, "configurations": []}
    for c in configs:
        design = record.get("design", {}).get(c)
        if design is None:
            raise InputError(f"{folder / 'runs_campaign.json'}: no design for {c}")
        for d in design["depths"]:
            records, gens = pa.load(folder, c, d)
            if not records or not gens:
                raise InputError(f"{folder / c / 'units'}: no verify or oracle units at d = {d}")
            v, _ = pa.verify_variance(records, settings=("dedup",))
            gv = pa.generation_variance(gens, v["s_rep"])
            sp, se = v["s_prompt"] or 0.0, v["s_rep"]
            P0, R0, T0 = design["throughput_at_depth"][str(d)]
            units = [
                u
                for k, u in record["units"].items()
                if k.startswith(f"{c}/oracle-d{d}-") and u.get("status") == "done"
            ]
            cpu_measured = float(sum(u["cpu_s"] for u in units))
            cfg: dict = {
                "configuration": c,
                "depth": d,
                "verify": v,
                "throughput": gv,
                "as_run": {"prompts": P0, "repeats": R0, "tokens": T0},
                "designs": [],
            }
            models = {
                "linear": linear_steps(gv["step_ms"]),
                "smoothed": pa.smooth_steps(gv["step_ms"]),
                "as_given": gv["step_ms"],
            }
            for how, V in models.items():
                mu, w = pa.cell_model(V, se, T0)
                cfg["as_run"][how] = pa.throughput_power(mu, w, sp, gv["s_gen"], P0, R0, rng)
            V = models["linear"]  # the designs' step model
            cfg["step_model_ms"] = V
            mu0, _ = pa.cell_model(V, se, T0)
            scale = cpu_measured / pa.throughput_cost_s(mu0, gv["prefill_ms"], P0, R0, T0)
            cfg["as_run"]["cpu_s_measured"] = cpu_measured
            cfg["cost_scale"] = scale
            for P in OWN_PROMPTS:
                for R in OWN_REPEATS:
                    for T in OWN_TOKENS:
                        mu, w = pa.cell_model(V, se, T)
                        tp = pa.throughput_power(mu, w, sp, gv["s_gen"], P, R, rng)
                        cfg["designs"].append(
                            {
                                "prompts": P,
                                "repeats": R,
                                "tokens": T,
                                "p_perfect_passes_kstar_rule": tp["p_perfect_passes_kstar_rule"],
                                "p_perfect_passes_loss_rule": tp["p_perfect_passes_loss_rule"],
                                "min_p_within_one": min(tp["p_within_one"]),
                                "cpu_min": scale
                                * pa.throughput_cost_s(mu, gv["prefill_ms"], P, R, T)
                                / 60.0,
                            }
                        )
            good = [
                x
                for x in cfg["designs"]
                if x["p_perfect_passes_kstar_rule"] >= target_kstar
                and x["p_perfect_passes_loss_rule"] >= target_loss
            ]
            cfg["targets"] = {"kstar": target_kstar, "loss": target_loss}
            cfg["cheapest"] = min(good, key=lambda x: x["cpu_min"]) if good else None
            out["configurations"].append(cfg)
    return out


def own_summary(res: dict) -> str:
    lines = [f"llama.cpp's own variance components from {res['from_runs']}", ""]
    for c in res["configurations"]:
        v, g, a = c["verify"], c["throughput"], c["as_run"]
        lines.append(
            f"{c['configuration']} d={c['depth']}: s_prompt {v['s_prompt'] or 0:.3f}, s_rep "
            f"{v['s_rep']:.3f}, s_gen {g['s_gen']:.3f}; V(k) ms "
            + " ".join(f"{x:.2f}" for x in g["step_ms"])
        )
        for how in ("linear", "smoothed", "as_given"):
            x = a[how]
            lines.append(
                f"  as run ({a['prompts']} x {a['repeats']} x {a['tokens']}, "
                f"{a['cpu_s_measured'] / 60:.1f} CPU min), V(k) {how}: true k* {x['k_true']}; "
                f"a perfect prediction passes 10/11 with P {x['p_perfect_passes_kstar_rule']:.2f},"
                f" the 5% loss rule with P {x['p_perfect_passes_loss_rule']:.2f}"
            )
        best = c["cheapest"]
        t = c["targets"]
        lines.append(
            f"  cheapest design with P(k* rule) >= {t['kstar']} and P(loss rule) >= "
            f"{t['loss']} (V(k) linear): "
            + (
                f"{best['prompts']} x {best['repeats']} x {best['tokens']}, P "
                f"{best['p_perfect_passes_kstar_rule']:.2f} / "
                f"{best['p_perfect_passes_loss_rule']:.2f}, about {best['cpu_min']:.0f} CPU min"
                if best
                else "none in the grid"
            )
        )
    return "\n".join(lines) + "\n"


def summary(res: dict) -> str:
    lines = [__doc__.splitlines()[0], ""]
    for name, r in res.items():
        t, v = r["throughput"], r["verify"]
        lines.append(
            f"{name}: verify {v['prompts']} x {v['repeats']}: p90 half-width of tau "
            f"{v['tau_halfwidth_p90']:.4f}; throughput {t['prompts']} x {t['repeats']} x "
            f"{t['tokens']} (variances: {r['variances_from']})"
        )
        for how in ("smoothed", "as_given"):
            x = t[how]
            lines.append(
                f"  V(k) {how}: true k* {x['k_true']}; P(k* within one) min "
                f"{min(x['p_within_one']):.2f}; a perfect prediction passes 10/11 with P "
                f"{x['p_perfect_passes_kstar_rule']:.2f}, the 5% loss rule with P "
                f"{x['p_perfect_passes_loss_rule']:.2f}"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="write power.json and power.txt here")
    ap.add_argument("--steps", type=Path, default=None, help="JSON of step times V(k), ms")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--from-runs", type=Path, default=None, help="a campaign folder: its own variances"
    )
    ap.add_argument("--configs", default="llamacpp-bundled", help="with --from-runs")
    ap.add_argument("--target-kstar", type=float, default=0.9)
    ap.add_argument("--target-loss", type=float, default=0.8)
    args = ap.parse_args(argv)
    if args.from_runs is not None:
        from specmoe.errors import InputError

        if not (args.from_runs / "runs_campaign.json").is_file():
            print(
                f"llamacpp_power: error: --from-runs: {args.from_runs}: no runs_campaign.json",
                file=sys.stderr,
            )
            return 2
        try:
            res = own_analysis(
                args.from_runs, [c for c in args.configs.split(",") if c], args.seed,
                target_kstar=args.target_kstar, target_loss=args.target_loss,
            )  # fmt: skip
        except InputError as e:
            print(f"llamacpp_power: error: {e}", file=sys.stderr)
            return 2
        return _emit(res, own_summary(res), args.out, "power-own")
    steps = dict(STEPS)
    if args.steps is not None:
        steps.update(json.loads(args.steps.read_text()))
    res = analyse(steps, args.seed)
    return _emit(res, summary(res), args.out, "power")


def _emit(res: dict, text: str, out: Path | None, stem: str) -> int:
    """Print the summary; with ``out``, write STEM.json and STEM.txt there."""
    from specmoe._io import atomic_write_text

    print(text, end="")
    if out is not None:
        atomic_write_text(out / f"{stem}.json", json.dumps(res, indent=1) + "\n")
        atomic_write_text(out / f"{stem}.txt", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
