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

Usage: ``python scripts/llamacpp_power.py [--out DIR] [--steps FILE] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

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
    args = ap.parse_args(argv)
    steps = dict(STEPS)
    if args.steps is not None:
        steps.update(json.loads(args.steps.read_text()))
    res = analyse(steps, args.seed)
    text = summary(res)
    print(text, end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "power.json").write_text(json.dumps(res, indent=1) + "\n")
        (args.out / "power.txt").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
