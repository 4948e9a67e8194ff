"""Figures of ``specmoe inertia`` (paper 003 Appendix H, Figures 8 and 9) and ``specmoe stops``
(paper 000 Appendix B, Figures B3-B5), drawn from their JSON results (inertia.json, stops.json).

One PNG set per drafter, named ``inertia_*_<drafter>.png`` and ``stops_*_<drafter>.png``. Also
``specmoe drafters`` (paper 003 Appendix M: ``drafters_*.png``) and ``specmoe transfer`` (paper
002 Figure 7: ``transfer_<form>.png``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.report._mpl import agg_subplots, save_agg

__all__ = [
    "write_drafters_figures",
    "write_inertia_figures",
    "write_stops_figures",
    "write_transfer_figures",
]

COLORS = {"accepted": "#1f77b4", "first_rejection": "#d62728", "cascade": "#ff7f0e"}
LABELS = {"accepted": "accepted", "first_rejection": "first rejection", "cascade": "cascade"}


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(s)).strip("-") or "x"


def _err(rec: dict | None) -> tuple[float, float, float]:
    if not rec or rec.get("mean") is None:
        return np.nan, 0.0, 0.0
    m = rec["mean"]
    iv = rec.get("interval") or [m, m]
    return m, max(m - iv[0], 0.0), max(iv[1] - m, 0.0)


def _inertia_steps(r: dict, path: Path) -> Path:
    fig, ax = agg_subplots(1, 1, width=6.2, height=4.0)
    ax = ax[0, 0]
    steps = [s["step"] for s in r["steps"]]
    for i, kind in enumerate(LABELS):
        vals = [_err(s["kinds"][kind]) for s in r["steps"]]
        x = np.array(steps) + (i - 1) * 0.08
        ax.errorbar(
            x,
            [v[0] for v in vals],
            yerr=[[v[1] for v in vals], [v[2] for v in vals]],
            marker="o",
            capsize=3,
            color=COLORS[kind],
            label=LABELS[kind],
        )
    b = r["baselines"]
    ax.axhline(b["independence"], color="gray", ls="--", lw=1, label="independence")
    ax.axhline(b["uniform"], color="gray", ls=":", lw=1, label="uniform m/N")
    ax.set_xticks(steps)
    ax.set_xlabel("step s (position j against j - s)")
    ax.set_ylabel("overlap of top-k experts (layer mean)")
    ax.set_title(f"Routing overlap by kind of draft: {r['drafter']}")
    ax.legend(fontsize=8)
    return save_agg(fig, path)


def _inertia_layers(r: dict, path: Path) -> Path:
    n_layers = r["num_layers"]
    fig, axes = agg_subplots(1, 2, width=10, height=3.8)
    for ax, kind in zip(axes[0], ("first_rejection", "cascade")):
        for s in r["steps"]:
            c = s["vs_accepted"][kind]
            if not c:
                continue
            ax.plot(range(n_layers), c["layer_delta"], marker="o", label=f"step {s['step']}")
        ax.axhline(0, color="k", lw=0.8)
        for y in (-0.05, 0.05):
            ax.axhline(y, color="gray", ls=":", lw=0.8)
        ax.set_xticks(range(n_layers))
        ax.set_xlabel("MoE layer")
        ax.set_ylabel("Δ = accepted - rejected overlap")
        ax.set_title(f"Per-layer Δ, {LABELS[kind]} ({r['drafter']})")
        ax.legend(fontsize=8)
    return save_agg(fig, path)


def _inertia_anchor(r: dict, path: Path) -> Path:
    fig, ax = agg_subplots(1, 1, width=6.2, height=4.0)
    ax = ax[0, 0]
    recs = r.get("anchor") or []
    js = [a["position"] for a in recs]
    for i, kind in enumerate(LABELS):
        m = [a["kinds"][kind]["mean"] for a in recs]
        e = [a["kinds"][kind]["sem"] or 0.0 for a in recs]
        m = [np.nan if v is None else v for v in m]
        ax.errorbar(
            np.array(js) + (i - 1) * 0.08,
            m,
            yerr=e,
            marker="o",
            capsize=3,
            color=COLORS[kind],
            label=LABELS[kind],
        )
    for a in recs:
        c = a["vs_accepted"]["first_rejection"]
        if c and np.isfinite(c["d"]):
            ax.annotate(
                f"d={c['d']:+.2f}",
                (a["position"], ax.get_ylim()[0]),
                fontsize=7,
                ha="center",
                va="bottom",
            )
    ax.set_xticks(js)
    ax.set_xlabel("draft position j (overlap with position 0)")
    ax.set_ylabel("anchor overlap (layer mean) ± SEM")
    ax.set_title(f"Anchor overlap, step 0 to step j: {r['drafter']}")
    ax.legend(fontsize=8)
    return save_agg(fig, path)


def _inertia_effects(r: dict, path: Path) -> Path:
    fig, axes = agg_subplots(1, 2, width=10, height=3.8)
    steps = [s["step"] for s in r["steps"]]
    ax = axes[0, 0]
    for kind, off in (("first_rejection", -0.05), ("cascade", 0.05)):
        ds, lo, hi = [], [], []
        for s in r["steps"]:
            c = s["vs_accepted"][kind] or {}
            d = c.get("d", np.nan)
            iv = c.get("d_interval") or [d, d]
            ds.append(d)
            lo.append(d - iv[0] if np.isfinite(d) else 0)
            hi.append(iv[1] - d if np.isfinite(d) else 0)
        ax.errorbar(
            np.array(steps) + off,
            ds,
            yerr=[lo, hi],
            marker="o",
            capsize=3,
            color=COLORS[kind],
            label=LABELS[kind],
        )
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(steps)
    ax.set_xlabel("step s")
    ax.set_ylabel("Cohen's d (accepted - rejected)")
    ax.set_title("Effect size, prompt-clustered 95% interval")
    ax.legend(fontsize=8)
    ax = axes[0, 1]
    for key, label, ls in (
        ("overlap_normal", "2Φ(-|d|/2)", "-"),
        ("overlap_empirical", "empirical", "--"),
    ):
        ax.plot(
            steps,
            [(s["vs_accepted"]["first_rejection"] or {}).get(key, np.nan) for s in r["steps"]],
            marker="o",
            ls=ls,
            label=label,
        )
    ax.axhline(0.85, color="gray", ls=":", lw=1, label="paper 003: about 85%")
    ax.plot(
        steps,
        [np.nan if c is None else c["auc"] for c in r["classifier"]],
        marker="s",
        label="AUC (in sample)",
    )
    ax.plot(
        steps,
        [np.nan if c is None else c["oos_threshold_auc"] for c in r["classifier"]],
        marker="^",
        label="threshold AUC, held-out prompts",
    )
    ax.axhline(0.5, color="k", lw=0.8)
    ax.set_ylim(0.3, 1.02)
    ax.set_xticks(steps)
    ax.set_xlabel("step s")
    ax.set_title("Accepted vs first rejection: overlap and AUC")
    ax.legend(fontsize=7)
    return save_agg(fig, path)


def write_inertia_figures(d: dict[str, Any], out: str | Path) -> list[Path]:
    """The figures of an inertia.json result, into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in d.get("drafters", []):
        s = _slug(r["drafter"])
        paths.append(_inertia_steps(r, out / f"inertia_steps_{s}.png"))
        paths.append(_inertia_layers(r, out / f"inertia_layers_{s}.png"))
        if r.get("anchor"):
            paths.append(_inertia_anchor(r, out / f"inertia_anchor_{s}.png"))
        paths.append(_inertia_effects(r, out / f"inertia_effects_{s}.png"))
    return paths


# ------------------------------------------------------------------------------------------
# stops


def _bars(ax, labels, recs, color):
    vals = [_err(x) for x in recs]
    x = np.arange(len(labels))
    ax.bar(
        x,
        [v[0] for v in vals],
        yerr=[[v[1] for v in vals], [v[2] for v in vals]],
        capsize=3,
        color=color,
    )
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=20, fontsize=8)


def _stops_k(r: dict, path: Path) -> Path:
    fig, axes = agg_subplots(1, 2, width=10, height=3.8)
    ax = axes[0, 0]
    names = [("full", "full cost"), ("no_expert_term", "no expert term")]
    x = np.arange(2)
    for i, (key, label) in enumerate(names):
        ks = r["k_star"][key]
        vals = [_err(ks["k1"]), _err(ks["k_ge4"])]
        ax.bar(
            x + (i - 0.5) * 0.38,
            [v[0] for v in vals],
            width=0.38,
            yerr=[[v[1] for v in vals], [v[2] for v in vals]],
            capsize=3,
            label=label,
        )
    ax.set_xticks(x)
    ax.set_xticklabels(["k* = 1", "k* >= 4"])
    ax.set_ylabel("share of the Oracle's rounds")
    ax.set_title(f"Chosen length ({r['drafter']})")
    ax.legend(fontsize=8)
    ax = axes[0, 1]
    recs = [b for b in r["mean_k_by_boundary"] if b["type"] not in ("unknown",)]
    _bars(ax, [b["type"] for b in recs], recs, "#4c72b0")
    ax.set_ylabel("mean k*")
    ax.set_title("Mean k* by the boundary at the stop")
    return save_agg(fig, path)


def _stops_cases(r: dict, path: Path) -> Path:
    cases = r.get("cases", [])[:4]
    fig, axes = agg_subplots(1, max(len(cases), 1), width=3.2 * max(len(cases), 1), height=3.6)
    if not cases:
        axes[0, 0].text(
            0.5,
            0.5,
            "no state where k*+1 is cheaper\nwithout the expert term",
            ha="center",
            va="center",
        )
        axes[0, 0].set_axis_off()
    for ax, c in zip(axes[0], cases):
        prof = [np.nan if v is None else v for v in c["new_experts"]]
        toks = [*c["pass_tokens"][1:], c["next_token"] or "(end)"]
        col = ["#4c72b0"] * (len(prof) - 1) + ["#d62728"]
        ax.bar(range(len(prof)), prof, color=col)
        ax.set_xticks(range(len(prof)))
        ax.set_xticklabels([repr(t)[1:-1][:8] for t in toks], rotation=60, fontsize=7)
        ax.set_title(
            f"k*={c['k_star']}, Q gap {c['q_gap_without_expert_term_ms']:.3f} ms", fontsize=8
        )
        ax.set_ylabel("new experts (layer mean)")
    fig.suptitle(
        f"Where expert cost moves the boundary (red: token k*+1), {r['drafter']}", fontsize=9
    )
    return save_agg(fig, path)


def _stops_new(r: dict, path: Path) -> Path:
    fig, axes = agg_subplots(1, 3, width=13, height=3.8)
    ne = r["new_experts"]
    _bars(axes[0, 0], ["continue", "stop"], [ne["continue"], ne["stop"]], "#4c72b0")
    axes[0, 0].set_ylabel("new experts of the next token")
    axes[0, 0].set_title("Oracle continues vs stops")
    recs = [b for b in r["new_experts_by_boundary"] if b["type"] != "unknown"]
    _bars(axes[0, 1], [b["type"] for b in recs], [b["all"] for b in recs], "#55a868")
    axes[0, 1].set_title("By boundary type before the next token")
    mm = r["mismatch"]
    _bars(
        axes[0, 2],
        ["before mismatch", "first mismatch"],
        [mm["before_mismatch"], mm["first_mismatch_where_before_exists"]],
        "#c44e52",
    )
    axes[0, 2].set_title("Recorded rounds: first draft mismatch")
    fig.suptitle(f"New experts (95% response-clustered intervals), {r['drafter']}", fontsize=9)
    return save_agg(fig, path)


def write_stops_figures(d: dict[str, Any], out: str | Path) -> list[Path]:
    """The figures of a stops.json result, into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in d.get("drafters", []):
        s = _slug(r["drafter"])
        paths.append(_stops_k(r, out / f"stops_k_{s}.png"))
        paths.append(_stops_cases(r, out / f"stops_cases_{s}.png"))
        paths.append(_stops_new(r, out / f"stops_new_experts_{s}.png"))
    return paths


# --- specmoe drafters (paper 003 Appendix M, Figures 11-12) ---------------------------------

KIND_COLORS = {"dense": "#1f77b4", "moe": "#d62728"}
LAYER_STYLES = ("-", "--", ":", "-.")


def _drafters_layers(d: dict, path: Path) -> Path:
    fig, ax = agg_subplots(1, 2, width=11.0, height=4.0)
    lay = d["layers"]
    for kind, c in KIND_COLORS.items():
        b = np.asarray(lay[kind]["batch"], dtype=float)
        t = np.asarray(lay[kind]["median_s"]) * 1e3
        y = np.asarray(lay[kind]["bytes"], dtype=float)
        ax[0, 0].plot(b, t, "o-", color=c, label=f"{kind} layer, measured")
        ax[0, 0].plot(b, y * t[0] / y[0], ":", color=c, lw=1, label=f"{kind}: bytes at B=1 rate")
        ax[0, 1].plot(b, y / (t / 1e3) / 1e9, "o-", color=c, label=kind)
        lb = d["bandwidth_bound"][kind].get("first_unbound")
        if lb is not None:
            ax[0, 0].axvline(lb, color=c, lw=0.8, ls="--")
    for a in ax[0]:
        a.set_xscale("log", base=2)
        a.set_xlabel("batch size B (one draft token per sequence)")
    ax[0, 0].set_yscale("log")
    ax[0, 0].set_ylabel("feed-forward time of one draft layer (ms)")
    ax[0, 0].legend(fontsize=7)
    ax[0, 1].set_ylabel("effective bandwidth (GB/s)")
    ax[0, 1].legend(fontsize=8)
    fig.suptitle(
        f"{d['model']} shapes, N={d['num_experts']}, m={d['top_k']}: dense vs MoE draft layer "
        "(design study; dashed: first batch beyond bandwidth-bound)",
        fontsize=9,
    )
    return save_agg(fig, path)


def _drafters_cost(d: dict, path: Path) -> Path:
    fig, ax = agg_subplots(1, 1, width=6.4, height=4.2)
    a = ax[0, 0]
    Ls = sorted({r["layers"] for r in d["drafters"]})
    for r in d["drafters"]:
        a.plot(r["batch"], np.asarray(r["cost_s"]) * 1e3, LAYER_STYLES[Ls.index(r["layers"]) % 4],
               color=KIND_COLORS[r["kind"]], marker="o", ms=3,
               label=f"{r['kind']}, {r['layers']} layer(s)")  # fmt: skip
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("batch size B")
    a.set_ylabel("draft cost per step C_p(B; L_d) (ms), M.1")
    a.set_title(f"Draft cost, anchored at B=1 ({d['anchor_ms']:.2f} ms), {d['model']}", fontsize=9)
    a.legend(fontsize=7)
    return save_agg(fig, path)


def _drafters_speedup(d: dict, path: Path) -> Path | None:
    rows = d.get("speedup") or []
    if not rows:
        return None
    fig, ax = agg_subplots(1, 1, width=6.4, height=4.2)
    a = ax[0, 0]
    Ls = sorted({r["layers"] for r in rows})
    k0 = min(r["k"] for r in rows)
    for kind in KIND_COLORS:
        for L in Ls:
            sel = sorted((r for r in rows if r["kind"] == kind and r["layers"] == L
                          and r["k"] == k0), key=lambda r: r["batch"])  # fmt: skip
            if sel:
                a.plot([r["batch"] for r in sel], [r["speedup"] for r in sel],
                       LAYER_STYLES[Ls.index(L) % 4], color=KIND_COLORS[kind], marker="o",
                       ms=3, label=f"{kind}, {L} layer(s)")  # fmt: skip
    a.axhline(1.0, color="gray", lw=0.8)
    a.set_xscale("log", base=2)
    a.set_xlabel("batch size B")
    a.set_ylabel(f"speedup at K={k0} (target on synthetic routing)")
    eff = d.get("efficiency") or {}
    a.set_title(f"Speedup with each drafter, a={eff.get('acceptance')}, target {eff.get('model')}",
                fontsize=9)  # fmt: skip
    a.legend(fontsize=7)
    return save_agg(fig, path)


def write_drafters_figures(d: dict[str, Any], out: str | Path) -> list[Path]:
    """The figures of a drafters.json result, into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        _drafters_layers(d, out / "drafters_layers.png"),
        _drafters_cost(d, out / "drafters_cost.png"),
    ]
    sp = _drafters_speedup(d, out / "drafters_speedup.png")
    return paths + ([sp] if sp is not None else [])


# --- specmoe transfer (paper 002 Appendix E, Figure 7) --------------------------------------


def _transfer_form(d: dict, form: str, path: Path) -> Path:
    r = d["forms"][form]
    fig, ax = agg_subplots(1, 2, width=11.0, height=4.6)
    cmap = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
    keep = set(r["n_report"])
    lo, hi = np.inf, 0.0
    for i, m in enumerate(r["models"]):
        c = cmap[i % len(cmap)]
        idx = [j for j, n in enumerate(m["n"]) if n in keep]
        for k, face in (("slot", c), ("dedup", "none")):
            x = np.asarray(m[f"beta_{k}"])[idx]
            y = np.asarray(m[f"beta_{k}_pred"])[idx]
            ax[0, 0].scatter(x, y, s=30, edgecolors=c, facecolors=face,
                             label=m["held_out"] if k == "slot" else None)  # fmt: skip
            lo, hi = min(lo, x.min(), y.min()), max(hi, x.max(), y.max())
        ax[0, 1].scatter(np.asarray(m["r"])[idx], np.asarray(m["r_pred"])[idx], s=30, color=c,
                         label=m["held_out"])  # fmt: skip
    ax[0, 0].plot([lo, hi], [lo, hi], ":", color="gray")
    if hi > 10 * lo:  # a log scale only where the bandwidths span a decade
        ax[0, 0].set_xscale("log")
        ax[0, 0].set_yscale("log")
    ax[0, 0].set_xlabel("measured β (GB/s)")
    ax[0, 0].set_ylabel("predicted from the other models (GB/s)")
    ax[0, 0].set_title("filled: per-slot, open: dedup", fontsize=9)
    ax[0, 0].legend(fontsize=7)
    rr = [v for m in r["models"] for v in m["r"] + m["r_pred"] if np.isfinite(v)]
    ax[0, 1].plot([min(rr), max(rr)], [min(rr), max(rr)], ":", color="gray")
    ax[0, 1].set_xlabel("measured r(n)")
    ax[0, 1].set_ylabel("predicted r(n)")
    fig.suptitle(
        f"Held-out bandwidth, form {form} (n = {', '.join(map(str, r['n_report']))}): miss "
        f"{100 * r['beta_miss_min']:.0f}-{100 * r['beta_miss_max']:.0f}%, median "
        f"{100 * r['beta_miss_median']:.0f}%",
        fontsize=9,
    )
    return save_agg(fig, path)


def write_transfer_figures(d: dict[str, Any], out: str | Path) -> list[Path]:
    """The Figure-7 analogue of a transfer.json result, one PNG per form, into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return [_transfer_form(d, f, out / f"transfer_{_slug(f)}.png") for f in d["forms"]]
