"""The power of a llama.cpp throughput design under ``rules-llamacpp-steps.json``, before its runs.

That rule set measures T(k, a) = 1000 G_a(k) / V(k), V(k) = tau_r(k + 1) + h(k), with tau_r
the mean over the throughput prompts of each prompt's median over its oracle generations at k
of each generation's median verification pass (``specmoe.validate.whole_pass``). Its only
sampling noise is the spread of those per-prompt medians between prompts. This script takes a
campaign folder of ``docs/runs-protocol-llamacpp.md`` (``--from-runs``, e.g.
``results/cpu/llamacpp/whole-pass/round15-lifted``), and for each configuration in it:

- the true step times V(k): the runs' own, tau_r(k + 1) + h(k) over all their prompts (h(k)
  the median over the generations at k of (decode time - sum of the passes) / rounds);
- the noise: the relative standard deviation of the per-prompt medians between prompts at
  each k; one level for every k, the median over k, floored at ``--floor`` (2%: a few
  prompts estimate a spread poorly);
- for P prompts (``--prompts``), the share of ``--sims`` simulated campaigns in which a
  *perfect* prediction (k_hat* = the argmax of G_a(k) / V(k) with the true V) passes the
  k* rule (within one at >= 10 of 11 acceptance values) and the loss rule (<= 5% at every
  acceptance value), each prompt's V drawn as V(k) (1 + e), e normal with that deviation.

Prints a table and writes ``power-steps.json`` and ``power-steps.txt`` under ``--out``.

Usage: ``python scripts/llamacpp_power_steps.py --from-runs FOLDER [--out DIR]
[--prompts 2,3,4,6] [--sims 4000] [--floor 0.02] [--seed 0] [--configs A,B]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specmoe._io import atomic_write_json, atomic_write_text  # noqa: E402
from specmoe.commands.efficiency import parse_ints  # noqa: E402
from specmoe.errors import InputError  # noqa: E402

ACCEPTANCE = [round(0.2 + i * 0.078, 3) for i in range(11)]
KS = list(range(9))


def generations(
    folder: Path, configs: list[str] | None = None
) -> dict[tuple[str, int], list[dict]]:
    """{(config, depth): the oracle generations of every unit}, each with its prompt index;
    ``configs``: only these configurations' folders."""
    out: dict[tuple[str, int], list[dict]] = {}
    for unit in sorted(folder.glob("*/units/oracle-*.json")):
        if configs is not None and unit.parent.parent.name not in configs:
            continue
        try:
            u = json.loads(unit.read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"{unit}: not a readable unit ({exc})".splitlines()[0]) from None
        for g in u.get("generations", []):
            if g.get("median_t_verify_ms") is None or not g.get("rounds"):
                raise InputError(f"{unit}: a generation without median_t_verify_ms or rounds")
            out.setdefault((unit.parent.parent.name, int(u["depth"])), []).append(
                {**g, "prompt_index": u["prompt_index"]}
            )
    if not out:
        raise InputError(f"{folder}: no oracle units (*/units/oracle-*.json)")
    return out


def step_times(gens: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(per-prompt medians of the generations' median passes [P, K], h(k) [K])."""
    prompts = sorted({g["prompt_index"] for g in gens})
    pp = np.array(
        [
            [
                np.median(
                    [
                        g["median_t_verify_ms"]
                        for g in gens
                        if g["k"] == k and g["prompt_index"] == p
                    ]
                )
                for k in KS
            ]
            for p in prompts
        ]
    )
    h = np.array(
        [
            np.median(
                [(g["decode_ms"] - g["sum_t_verify_ms"]) / g["rounds"] for g in gens if g["k"] == k]
            )
            for k in KS
        ]
    )
    return pp, h


def power(
    V: np.ndarray, sd: float, prompts: int, sims: int, rng: np.random.Generator
) -> tuple[float, float]:
    """(P(k* rule), P(loss rule)) of a perfect prediction, ``prompts`` prompts a campaign."""
    a = np.asarray(ACCEPTANCE)[:, None]
    G = np.cumsum(np.broadcast_to(a, (len(ACCEPTANCE), len(KS))) ** np.arange(len(KS)), axis=1)
    k_hat = np.argmax(G / V, axis=1)
    e = rng.normal(0.0, sd, size=(sims, prompts, len(KS)))
    Vm = (V[None, None, :] * (1 + e)).mean(axis=1)  # [sims, K]
    T = G[None] / Vm[:, None, :]  # [sims, A, K]
    k_star = np.argmax(T, axis=2)
    ok_k = (np.abs(k_star - k_hat[None]) <= 1).sum(axis=1) >= 10
    loss = 1 - np.take_along_axis(T, k_hat[None, :, None], axis=2)[..., 0] / T.max(axis=2)
    ok_l = loss.max(axis=1) <= 0.05
    return float(ok_k.mean()), float(ok_l.mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from-runs", required=True, help="a campaign folder of the protocol")
    ap.add_argument("--out", default=None, help="write power-steps.json and .txt here")
    ap.add_argument("--prompts", default="2,3,4,6", help="prompt counts to simulate")
    ap.add_argument("--sims", type=int, default=4000)
    ap.add_argument("--floor", type=float, default=0.02, help="least relative deviation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--configs",
        default=None,
        help="comma-separated: only these configurations of the folder (default: every one)",
    )
    args = ap.parse_args(argv)
    try:
        counts = parse_ints(args.prompts, "--prompts", low=1)
    except InputError as exc:
        print(f"llamacpp_power_steps: error: {exc}", file=sys.stderr)
        return 2
    if args.sims < 1 or not 0 <= args.floor < 1:
        print(
            "llamacpp_power_steps: error: --sims must be >= 1 and --floor in [0, 1)",
            file=sys.stderr,
        )
        return 2
    try:
        configs = None if args.configs is None else [c for c in args.configs.split(",") if c]
        gens = generations(Path(args.from_runs), configs)
    except InputError as exc:
        print(f"llamacpp_power_steps: error: {exc}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    rows, lines = [], []
    for (cfg, depth), gs in sorted(gens.items()):
        pp, h = step_times(gs)
        V = pp.mean(axis=0) + h
        rel = (
            pp.std(axis=0, ddof=1) / pp.mean(axis=0)
            if pp.shape[0] > 1
            else np.full(len(KS), np.nan)
        )
        sd = max(args.floor, float(np.nanmedian(rel)) if np.isfinite(rel).any() else args.floor)
        res = {P: power(V, sd, P, args.sims, rng) for P in counts}
        rows.append(
            {
                "config": cfg,
                "depth": depth,
                "prompts_in_runs": int(pp.shape[0]),
                "step_ms": V.tolist(),
                "h_ms": h.tolist(),
                "relative_sd_per_k": [None if not np.isfinite(x) else float(x) for x in rel],
                "relative_sd": sd,
                "power": {str(P): {"kstar": k, "loss": lo} for P, (k, lo) in res.items()},
            }
        )
        lines.append(f"{cfg} d={depth}: V(k) ms " + " ".join(f"{x:.1f}" for x in V))
        lines.append(
            f"  per-prompt spread {sd:.3f} (per k: "
            + " ".join("nan" if not np.isfinite(x) else f"{x:.3f}" for x in rel)
            + ")"
        )
        for P, (k, lo) in res.items():
            lines.append(
                f"  {P} prompts: P(k* within one at >= 10 of 11) {k:.2f}, P(loss <= 5%) {lo:.2f}"
            )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(
            out / "power-steps.json",
            {
                "from_runs": args.from_runs,
                "sims": args.sims,
                "seed": args.seed,
                "floor": args.floor,
                "configurations": rows,
            },
        )
        atomic_write_text(out / "power-steps.txt", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
