"""Power analysis of the whole-pass runs campaign (docs/runs-protocol-whole-pass.md).

Reads the committed CPU runs of docs/runs-protocol.md (``results/cpu/<model>/units/*.json``: every
verify pass of every prompt and repetition, every oracle generation), estimates the spread of
the quantities the whole-pass rules decide on, and sizes prompts x repeats x tokens so that

  (a) the 95% bootstrap interval of tau(n) (prompts resampled) is within +-2.5% at every n,
      a quarter of the 10% verify-error rule, in at least 90% of simulated campaigns;
  (b) the measured best draft length k* is within one of the argmax of the means with
      probability >= 0.95 at every acceptance value (the k* rule of paper 002, Table 8);
  (c) the 95% interval of the loss 1 - T(k)/T(k_true) at k = k_true +- 1 is within +-2.5%,
      half of the 5% throughput-loss rule, at every acceptance value.

The model (stated in power.json):

* verify pass: log t[p, r, n] = log tau(n) + pi_p + e_pr, pi_p ~ N(0, s_prompt^2) a prompt
  effect, e_pr ~ N(0, s_rep^2) repeat-to-repeat noise, independent; estimated per n and kernel
  by one-way random-effects ANOVA over prompts and pooled by degrees of freedom;
* generation of T tokens at draft length k, acceptance a: log throughput =
  log(G_a(k) / V(k)) + pi_p + g + w, G_a(k) = (1 - a^(k+1))/(1 - a) (Eq. (9) of paper 002),
  V(k) the measured mean step time; pi_p the prompt effect shared by every cell of a prompt;
  g ~ N(0, s_gen^2) a per-generation (session) effect; w the within-generation noise: per-round
  time noise independent given the configuration, with the per-pass CV s_rep of the verify
  sweeps, over T/G rounds, and the randomness of the rounds a T-token generation needs
  (renewal variance Var(e)/(G^3) T of the iid oracle acceptances, e the tokens one round emits);
* the cell statistic is the median over the prompts x repeats generations; k = 0 runs once per
  prompt and repeat and serves every acceptance value.

Pure numpy, seeded, a few seconds. Writes ``results/cpu/power/power.json`` and ``power.txt``
and prints the JSON. Usage: ``python scripts/power_analysis.py [--runs results/cpu] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = (("bundled", 512), ("bundled", 2048), ("olmoe-dummy-4L", 512), ("olmoe-dummy-4L", 2048))
ACCEPTANCE = tuple(round(0.2 + 0.078 * i, 3) for i in range(11))
K_MAX = 8
TARGETS = {
    "tau_halfwidth": 0.025,
    "tau_assurance": 0.90,
    "kstar_within_one": 0.95,
    "loss_halfwidth": 0.025,
}
VERIFY_PROMPTS = (6, 8, 12, 16, 24, 32)
VERIFY_REPEATS = (2, 3, 4, 5, 6)
PROMPTS = (2, 4, 6, 8, 12)
REPEATS = (1, 2, 3)
TOKENS = (32, 64, 128, 256)
# the design docs/runs-protocol-whole-pass.md adopted from this grid: (verify P, R), (P, R, T)
PROTOCOL = {"bundled": ((32, 4), (12, 3, 256)), "olmoe-dummy-4L": ((24, 3), (6, 2, 128))}


# ------------------------------------------------------------------------------------------
# estimation


def anova(x: np.ndarray) -> tuple[float, float, int, int]:
    """One-way random-effects ANOVA of ``x`` [P, R] (log times): (s_prompt^2, s_rep^2,
    between df, within df); s_prompt^2 = max(0, (MS_b - MS_w)/R)."""
    P, R = x.shape
    m = x.mean(axis=1)
    msw = float(((x - m[:, None]) ** 2).sum() / (P * (R - 1))) if R > 1 else float("nan")
    msb = float(R * ((m - m.mean()) ** 2).sum() / (P - 1)) if P > 1 else float("nan")
    sp = max(0.0, (msb - msw) / R) if P > 1 and R > 1 else float("nan")
    return sp, msw, P - 1, P * (R - 1)


def verify_variance(records: list[dict], settings: tuple[str, ...] = ("per_slot", "dedup")) -> dict:
    """Per kernel setting and n: the prompt and repeat components of log t, and their pooled
    values (weighted by degrees of freedom). ``settings``: the kernel settings the records
    hold (llama.cpp's runs: dedup alone)."""
    prompts = sorted({r["prompt_id"] for r in records})
    reps = sorted({r["repetition"] for r in records})
    out: dict = {"prompts": len(prompts), "repeats": len(reps), "per_n": {}}
    tau: dict = {}
    num_p = num_e = df_p = df_e = 0.0
    worst_p = worst_e = 0.0
    for setting in settings:
        rows = []
        for n in range(1, 10):
            x = np.full((len(prompts), len(reps)), np.nan)
            for r in records:
                if r["setting"] == setting and r["n"] == n:
                    x[prompts.index(r["prompt_id"]), reps.index(r["repetition"])] = r["t_ms"]
            x = np.log(x)
            sp, se, dfb, dfw = anova(x)
            rows.append(
                {
                    "n": n,
                    "s_prompt": float(np.sqrt(sp)) if sp == sp else None,
                    "s_rep": float(np.sqrt(se)),
                    "median_ms": float(np.exp(np.median(x))),
                }
            )
            num_e += se * dfw
            df_e += dfw
            if sp == sp:
                num_p += sp * dfb
                df_p += dfb
                worst_p = max(worst_p, sp)
            worst_e = max(worst_e, se)
        out["per_n"][setting] = rows
        tau[setting] = [row["median_ms"] for row in rows]
    out["s_prompt"] = float(np.sqrt(num_p / df_p)) if df_p else None
    out["s_rep"] = float(np.sqrt(num_e / df_e))
    out["s_prompt_worst_n"] = float(np.sqrt(worst_p))
    out["s_rep_worst_n"] = float(np.sqrt(worst_e))
    out["df"] = {"prompt": int(df_p), "rep": int(df_e)}
    return out, tau


def generation_variance(gens: list[dict], s_rep: float) -> dict:
    """Step time per k (decode time per round, mean over generations) and the per-generation
    effect s_gen: the variance of log step time across the acceptance values at fixed k and
    prompt, less the per-round noise s_rep^2 / rounds it contains."""
    by: dict = {}
    for g in gens:
        by.setdefault((g["prompt_id"], g["k"]), []).append(g)
    V = np.zeros(K_MAX + 1)
    resid, df, expect = 0.0, 0, 0.0
    for k in range(K_MAX + 1):
        steps = [np.log(g["decode_ms"] / g["rounds"]) for g in gens if g["k"] == k]
        V[k] = float(np.exp(np.mean(steps)))
    for (_, k), gs in by.items():
        if k == 0 or len(gs) < 2:
            continue
        s = np.log([g["decode_ms"] / g["rounds"] for g in gs])
        resid += float(((s - s.mean()) ** 2).sum())
        df += len(gs) - 1
        expect += float(np.sum([s_rep**2 / g["rounds"] for g in gs])) * (len(gs) - 1) / len(gs)
    s_gen2 = max(0.0, (resid - expect) / df) if df else 0.0
    prefill = float(np.median([g["prefill_ms"] for g in gens]))
    return {
        "step_ms": V.tolist(),
        "s_gen": float(np.sqrt(s_gen2)),
        "df": df,
        "s_step_observed": float(np.sqrt(resid / df)) if df else None,
        "prefill_ms": prefill,
        "tokens": int(gens[0]["tokens"]),
        "prompts": len({g["prompt_id"] for g in gens}),
    }


# ------------------------------------------------------------------------------------------
# the model's moments


def emitted_moments(a: float, k: int) -> tuple[float, float]:
    """Mean G_a(k) and variance of the tokens one oracle round emits, 1 + min(Geom(a), k)."""
    j = np.arange(k + 1)
    p = a**j * (1 - a)
    p[-1] = a**k
    e = j + 1.0
    mean = float((p * e).sum())
    return mean, float((p * e * e).sum() - mean**2)


def smooth_steps(step_ms: list[float]) -> list[float]:
    """The step-time model of the means: V(0) as measured, and for k >= 1 the least-squares
    fit V(k) = alpha + beta ln k (non-decreasing and concave in k, as a union of experts that
    saturates), so that the true argmax is not set by the noise of one measured V(k)."""
    v = np.asarray(step_ms, dtype=np.float64)
    k = np.arange(1, v.size)
    X = np.stack([np.ones(k.size), np.log(k)], axis=1)
    coef, *_ = np.linalg.lstsq(X, v[1:], rcond=None)
    return [float(v[0]), *(X @ coef).tolist()]


def cell_model(step_ms: list[float], s_rep: float, tokens: int):
    """Means mu [A, K] (tokens/s) and within-generation log-sd w [A, K] of the cells."""
    mu = np.zeros((len(ACCEPTANCE), K_MAX + 1))
    w = np.zeros_like(mu)
    for i, a in enumerate(ACCEPTANCE):
        for k in range(K_MAX + 1):
            g, var = emitted_moments(a, k)
            mu[i, k] = 1000.0 * g / step_ms[k]
            w[i, k] = np.sqrt(var / (g * tokens) + s_rep**2 * g / tokens)
    return mu, w


def smallest_argmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.argmax(x, axis=axis)  # numpy returns the first maximiser


# ------------------------------------------------------------------------------------------
# simulated campaigns


def tau_power(s_prompt: float, s_rep: float, P: int, R: int, rng, sims=400, boot=1000):
    """Relative half-width of the 95% percentile bootstrap interval (prompts resampled) of the
    mean over prompts of each prompt's median over repeats: its median and 90th percentile
    over simulated campaigns."""
    x = rng.normal(0, s_prompt, (sims, P, 1)) + rng.normal(0, s_rep, (sims, P, R))
    stat = np.exp(np.median(x, axis=2))  # [sims, P] per-prompt medians, tau = 1
    idx = rng.integers(0, P, (boot, P))
    bm = stat[:, idx].mean(axis=2)  # [sims, boot]
    lo, hi = np.quantile(bm, [0.025, 0.975], axis=1)
    hw = (hi - lo) / 2 / stat.mean(axis=1)
    return float(np.median(hw)), float(np.quantile(hw, 0.9))


def throughput_power(mu, w, s_prompt, s_gen, P, R, rng, sims=400):
    """Per acceptance value: P(|k*_meas - k_true| <= 1), P(k*_meas = k_true), the 95% half-width of the loss at
    k_true +- 1, and the probability that a perfect prediction (k_hat = k_true) passes the
    10-of-11 rule and the 5% loss rule."""
    A, K = mu.shape
    k_true = smallest_argmax(mu)
    pi = rng.normal(0, s_prompt, (sims, 1, 1, P, 1))
    noise = rng.normal(0, 1, (sims, A, K, P, R)) * np.sqrt(
        s_gen**2 + w[None, :, :, None, None] ** 2
    )
    noise[:, :, 0] = noise[:, :1, 0]  # k = 0: one run per prompt and repeat, every a
    logT = np.log(mu)[None, :, :, None, None] + pi + noise
    stat = np.exp(np.median(logT.reshape(sims, A, K, P * R), axis=3))  # [sims, A, K]
    k_meas = smallest_argmax(stat, axis=2)
    within = np.abs(k_meas - k_true[None]) <= 1
    rows = np.arange(A)
    best = np.take_along_axis(stat, k_meas[..., None], 2)[..., 0]
    at_true = stat[:, rows, k_true]
    loss_perfect = 1 - at_true / best
    hws = []
    for i in range(A):
        h = 0.0
        for kk in (k_true[i] - 1, k_true[i] + 1):
            if 0 <= kk < K:
                loss = 1 - stat[:, i, kk] / stat[:, i, k_true[i]]
                lo, hi = np.quantile(loss, [0.025, 0.975])
                h = max(h, float((hi - lo) / 2))
        hws.append(h)
    return {
        "k_true": k_true.tolist(),
        "p_within_one": within.mean(axis=0).tolist(),
        "p_exact": (k_meas == k_true[None]).mean(axis=0).tolist(),
        "loss_halfwidth": hws,
        "p_perfect_passes_kstar_rule": float((within.sum(axis=1) >= 10).mean()),
        "p_perfect_passes_loss_rule": float((loss_perfect.max(axis=1) <= 0.05).mean()),
    }


def verify_cost_s(tau_ms, prefill_ms, P, R):
    """CPU seconds of the verify sweeps: per prompt one prefill, 1 warm-up + R repetitions of
    both settings at n = 1..9."""
    return float(
        P * ((R + 1) * (sum(tau_ms["per_slot"]) + sum(tau_ms["dedup"])) + prefill_ms) / 1000.0
    )


def throughput_cost_s(mu, prefill_ms, P, R, T, *, prefill_each: bool = False):
    """CPU seconds of the oracle grid (90 cells at k >= 1 and one k = 0 run) at P prompts x R
    repeats x T tokens; one prefill per prompt and repeat (the cache cropped back to the
    prompt between generations), or one per generation with ``prefill_each``."""
    gen = P * R * ((T / mu[:, 1:]).sum() + T / mu[0, 0])
    prefills = P * R * (mu[:, 1:].size + 1 if prefill_each else 1)
    return float(gen + prefills * prefill_ms / 1000.0)


# ------------------------------------------------------------------------------------------


def load(runs: Path, model: str, depth: int):
    units = runs / model / "units"
    vfiles = sorted(units.glob(f"verify-d{depth}*.json"))
    records = [r for f in vfiles for r in json.loads(f.read_text())["records"]]
    ofiles = sorted(units.glob(f"oracle-d{depth}-*.json"))
    gens = [g for f in ofiles for g in json.loads(f.read_text())["generations"]]
    return records, gens


def analyse(runs: Path, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out: dict = {"model": MODEL_TEXT, "targets": TARGETS, "seed": seed, "configurations": []}
    for model, depth in CONFIGS:
        records, gens = load(runs, model, depth)
        v, tau = verify_variance(records)
        gv = generation_variance(gens, v["s_rep"])
        steps = smooth_steps(gv["step_ms"])
        gv["step_model_ms"] = steps
        sp, se = v["s_prompt"] if v["s_prompt"] is not None else 0.0, v["s_rep"]
        cfg = {
            "model": model,
            "depth": depth,
            "verify": v,
            "throughput": gv,
            "verify_designs": [],
            "throughput_designs": [],
        }
        for P in VERIFY_PROMPTS:
            for R in VERIFY_REPEATS:
                med, p90 = tau_power(sp, se, P, R, rng)
                _, p90_worst = tau_power(v["s_prompt_worst_n"], v["s_rep_worst_n"], P, R, rng)
                cfg["verify_designs"].append(
                    {
                        "prompts": P,
                        "repeats": R,
                        "tau_halfwidth_median": med,
                        "tau_halfwidth_p90": p90,
                        "tau_halfwidth_p90_worst_n": p90_worst,
                        "meets": p90 <= TARGETS["tau_halfwidth"],
                        "cost_cpu_s": verify_cost_s(tau, gv["prefill_ms"], P, R),
                    }
                )
        for P in PROMPTS:
            for R in REPEATS:
                for T in TOKENS:
                    mu, w = cell_model(steps, se, T)
                    tp = throughput_power(mu, w, sp, gv["s_gen"], P, R, rng)
                    ok = (
                        min(tp["p_within_one"]) >= TARGETS["kstar_within_one"],
                        max(tp["loss_halfwidth"]) <= TARGETS["loss_halfwidth"],
                    )
                    cfg["throughput_designs"].append(
                        {
                            "prompts": P,
                            "repeats": R,
                            "tokens": T,
                            "min_p_within_one": min(tp["p_within_one"]),
                            "max_loss_halfwidth": max(tp["loss_halfwidth"]),
                            "p_perfect_passes_kstar_rule": tp["p_perfect_passes_kstar_rule"],
                            "p_perfect_passes_loss_rule": tp["p_perfect_passes_loss_rule"],
                            "meets": {"kstar": ok[0], "loss": ok[1]},
                            "cost_cpu_s": throughput_cost_s(mu, gv["prefill_ms"], P, R, T),
                            "cost_cpu_s_prefill_each": throughput_cost_s(
                                mu, gv["prefill_ms"], P, R, T, prefill_each=True
                            ),
                        }
                    )
        good = [d for d in cfg["verify_designs"] if d["meets"]]
        cfg["verify_cheapest"] = min(good, key=lambda d: d["cost_cpu_s"]) if good else None
        good = [d for d in cfg["throughput_designs"] if all(d["meets"].values())]
        best = min(good, key=lambda d: d["cost_cpu_s"]) if good else None
        cfg["throughput_cheapest"] = best
        if best is not None:
            mu, w = cell_model(steps, se, best["tokens"])
            cfg["throughput_cheapest_detail"] = throughput_power(
                mu,
                w,
                sp,
                gv["s_gen"],
                best["prompts"],
                best["repeats"],
                np.random.default_rng(seed + 1),
                sims=2000,
            )
        (vp, vr), (tp_, tr, tt) = PROTOCOL[model]
        cfg["protocol_design"] = {
            "verify": next(
                d for d in cfg["verify_designs"] if (d["prompts"], d["repeats"]) == (vp, vr)
            ),
            "throughput": next(
                d
                for d in cfg["throughput_designs"]
                if (d["prompts"], d["repeats"], d["tokens"]) == (tp_, tr, tt)
            ),
        }
        mu, w = cell_model(steps, se, gv["tokens"])
        cfg["as_run"] = throughput_power(
            mu, w, sp, gv["s_gen"], gv["prompts"], 1, np.random.default_rng(seed + 2), sims=2000
        )
        out["configurations"].append(cfg)
    return out


MODEL_TEXT = __doc__.split("The model (stated in power.json):")[1].split("Pure numpy")[0].strip()


def summary(res: dict) -> str:
    lines = ["Power analysis of the whole-pass runs campaign (scripts/power_analysis.py)", ""]
    for c in res["configurations"]:
        v, g = c["verify"], c["throughput"]
        lines.append(
            f"{c['model']} d={c['depth']}: verify {v['prompts']} prompts x "
            f"{v['repeats']} repeats, s_prompt {v['s_prompt']:.4f} (worst n "
            f"{v['s_prompt_worst_n']:.4f}), s_rep {v['s_rep']:.4f} (worst n "
            f"{v['s_rep_worst_n']:.4f}); s_gen {g['s_gen']:.4f} over {g['df']} df"
        )
        a = c["as_run"]
        lines.append(
            f"  as run ({g['prompts']} prompt(s), 1 repeat, {g['tokens']} tokens): "
            f"P(k* within one) min {min(a['p_within_one']):.2f}, "
            f"P(perfect prediction passes 10/11) {a['p_perfect_passes_kstar_rule']:.2f}, "
            f"the 5% loss rule {a['p_perfect_passes_loss_rule']:.2f}"
        )
        b = c["verify_cheapest"]
        lines.append(
            "  verify: no design in the grid meets (a)"
            if b is None
            else f"  verify (a): {b['prompts']} prompts x {b['repeats']} repeats, p90 "
            f"half-width {b['tau_halfwidth_p90']:.4f} (worst-n variances "
            f"{b['tau_halfwidth_p90_worst_n']:.4f}), ~{b['cost_cpu_s'] / 60:.1f} CPU min"
        )
        b = c["throughput_cheapest"]
        lines.append(
            "  throughput: no design in the grid meets (b) and (c)"
            if b is None
            else f"  throughput (b, c): {b['prompts']} prompts x {b['repeats']} repeats x "
            f"{b['tokens']} tokens, P(within one) min {b['min_p_within_one']:.3f}, "
            f"loss half-width {b['max_loss_halfwidth']:.4f}, "
            f"~{b['cost_cpu_s'] / 3600:.2f} CPU h "
            f"({b['cost_cpu_s_prefill_each'] / 3600:.2f} h with a prefill per run)"
        )
        v, t = c["protocol_design"]["verify"], c["protocol_design"]["throughput"]
        lines.append(
            f"  protocol design: verify {v['prompts']} x {v['repeats']} (p90 half-width "
            f"{v['tau_halfwidth_p90']:.4f}, worst-n {v['tau_halfwidth_p90_worst_n']:.4f}); "
            f"throughput {t['prompts']} x {t['repeats']} x {t['tokens']}: P(within one) "
            f"min {t['min_p_within_one']:.3f}, loss half-width "
            f"{t['max_loss_halfwidth']:.3f}, P(perfect passes 10/11) "
            f"{t['p_perfect_passes_kstar_rule']:.3f}, passes loss rule "
            f"{t['p_perfect_passes_loss_rule']:.3f}, ~{t['cost_cpu_s'] / 3600:.2f} CPU h "
            f"+ verify {v['cost_cpu_s'] / 60:.1f} min"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(ROOT / "results" / "cpu"))
    ap.add_argument("--out", default=str(ROOT / "results" / "cpu" / "power"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    res = analyse(Path(args.runs), args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(res, indent=1)
    (out / "power.json").write_text(text + "\n")
    (out / "power.txt").write_text(summary(res))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
