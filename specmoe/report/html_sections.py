"""The sections of the HTML report (:mod:`specmoe.report.html`), one renderer per kind of result.

Each renderer takes the result's path, its parsed JSON (None for round logs) and the page's
figure collector, and returns an HTML fragment. Every value goes through ``html.escape``; a field
a file lacks is skipped, never assumed.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["render", "table"]

PNG_PATTERNS = {
    "plan": ("staircase", "saving", "speedup"),
    "validation": ("validate_",),
    "routing": ("reuse", "overlap", "layer_overlap", "ipf"),
    "oracle": ("oracle", "delta_space", "verify_cost", "draft_time"),
    "policies": ("polic",),
    "profile": ("bench", "bandwidth", "profile", "roofline", "op_time"),
    "runs": ("verify", "throughput", "runs"),
    "rounds": ("round",),
}


def esc(x: Any) -> str:
    return html.escape(str(x))


def num(x: Any, spec: str = ".4g") -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            return "–"
        return format(x, spec)
    return esc(x)


def pct(x: Any, digits: int = 1) -> str:
    return "–" if x is None else f"{100 * float(x):.{digits}f}%"


def verdict(h: bool | None) -> str:
    if h is True:
        return '<span class="holds">holds</span>'
    if h is False:
        return '<span class="fails">fails</span>'
    return '<span class="none">not scored</span>'


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1, caption: str = ""
) -> str:
    """An HTML table; cells are already-escaped HTML; the first ``left`` columns align left."""
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    head = "".join(
        f'<th{" class=l" if i < left else ""} scope="col">{h}</th>' for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=l' if i < left else ''}>{c}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _facts(pairs: Sequence[tuple[str, str]]) -> str:
    return table(["", ""], [[esc(k), v] for k, v in pairs if v not in (None, "")], left=1)


def _beside(path: Path, kind: str, figs, *, exclude: Sequence[str] = ()) -> list[str]:
    """Figures of this kind in the result's folder (a PNG is shown once on the page)."""
    folder = path if path.is_dir() else path.parent
    out = []
    for p in sorted(folder.glob("*.png")):
        if p in figs.claimed or not p.name.startswith(PNG_PATTERNS.get(kind, ())):
            continue
        if p.name in exclude:
            continue
        figs.claimed.add(p)
        out.append(figs.tag(figs.add_file(p), p.name))
    return out


# ------------------------------------------------------------------------------------------
# validation


VERSION_NAMES = {
    "prediction": "prediction",
    "measured_time": "measured-time",
    "calibrated": "calibrated",
    "whole_pass": "whole-pass",
}
VERSION_ABBREV = {
    "prediction": "pred",
    "measured_time": "mt",
    "calibrated": "cal",
    "whole_pass": "wp",
}


def decided_mark(d: bool | None) -> str:
    """Whether a verdict's interval decided it (under a rule set with intervals)."""
    if d is True:
        return '<span class="holds">decided</span>'
    if d is False:
        return '<span class="none">undecided</span>'
    return '<span class="none">no interval</span>'


def _interval(x: Any, pair: Any, spec: str = ".3g", *, as_pct: bool = False) -> str:
    """``x [lo, hi]``, escaped; the interval left out when there is none."""
    f = (lambda y: pct(y)) if as_pct else (lambda y: num(y, spec))
    if not pair:
        return f(x)
    return f"{f(x)} [{f(pair[0])}, {f(pair[1])}]"


def _interval_tables(cfgs: list[dict]) -> list[str]:
    """Under a rule set with intervals: what each configuration's measured side rests on, and
    each version's headline scores with their 95% intervals."""
    parts = []
    rows = []
    for c in cfgs:
        mi = c.get("measured", {}).get("intervals")
        if not mi:
            continue
        rows.append(
            [
                esc(c.get("name")),
                esc(mi.get("tau", "")),
                f"{num(mi.get('verify_prompts'))} × {num(mi.get('verify_repeats'))}",
                esc(mi.get("throughput", "")),
                f"{num(mi.get('throughput_prompts'))} × {num(mi.get('throughput_repeats'))}",
                f"{pct(mi.get('level'), 0)}, {num(mi.get('resamples'))} resamples, "
                f"seed {num(mi.get('seed'))}",
            ]
        )
    if not rows:
        return parts
    parts.append("<h3>The measured side and its intervals</h3>")
    parts.append(
        table(
            [
                "configuration",
                "τ(n)",
                "prompts × repetitions",
                "T(k, a)",
                "prompts × repeats",
                "bootstrap",
            ],
            rows,
            left=2,
        )
    )
    rows = []
    for c in cfgs:
        for v, s in c.get("versions", {}).items():
            m = s.get("intervals") or {}
            share = m.get("kstar_share")
            rows.append(
                [
                    esc(c.get("name")),
                    esc(VERSION_NAMES.get(v, v)),
                    _interval(s.get("kstar_within_one"), m.get("kstar_within_one"), "g")
                    + f" of {num(s.get('kstar_within_one_of'))}",
                    "–" if not share else esc(" ".join(f"{x:.2f}" for x in share)),
                    _interval(s.get("max_loss"), m.get("max_loss"), as_pct=True),
                    _interval(s.get("verify_error"), m.get("verify_error"), as_pct=True),
                    _interval(s.get("crossover_distance"), m.get("crossover_distance"), "g"),
                    _interval(s.get("saving_in_band_share"), m.get("saving_in_band_share"), ".2f"),
                ]
            )
    parts.append(
        table(
            [
                "configuration",
                "version",
                "k̂* within one",
                "share of resamples with k* within one of k̂*, per a",
                "max loss",
                "verify error",
                "crossover distance",
                "in band (18)",
            ],
            rows,
            left=2,
            caption="Each version's scores with their 95% bootstrap intervals (prompts resampled)",
        )
    )
    parts.append(
        '<p class="note">Intervals resample the prompts, each with all its repetitions or '
        "repeats; the prediction is held fixed (the paper's versions are re-anchored on each "
        "resample's τ(1) or τ_off(n), which they take from the runs) and k̂* at its point "
        "value. A verdict is decided when its interval lies on one side of the rule's value; "
        "undecided verdicts are shown, never removed.</p>"
    )
    return parts


def _rule_text(r: dict) -> str:
    thr = num(r.get("value"))
    if r.get("of"):
        thr = f"{num(r['value'])} of {r['of']}"
    return f"{esc(r.get('metric'))} {esc(r.get('op'))} {esc(thr)}"


def render_validation(path: Path, d: dict, figs) -> str:
    parts = []
    ok = d.get("all_hold")
    parts.append(
        "<p><strong>Verdict:</strong> "
        + (
            '<span class="holds">every required rule holds</span>'
            if ok
            else '<span class="fails">not every required rule holds</span>'
        )
        + f" over {len(d.get('configurations', []))} configuration(s) of "
        f"<code>{esc(d.get('model', ''))}</code> on {esc(d.get('device', ''))} "
        f"{esc(d.get('device_name', ''))}.</p>"
    )
    rf = d.get("rules_file", {})
    parts.append(
        f'<p class="note">Rules read from <code>{esc(rf.get("path", ""))}</code> '
        f"(sha256 <code>{esc(str(rf.get('sha256', ''))[:16])}</code>), written before "
        f"the runs they score; bandwidth error ε = {num(d.get('epsilon'), '.3f')}.</p>"
    )
    parts.append("<h3>Rules</h3>")
    cfgs = d.get("configurations", [])
    scored_as = {c.get("scored_version", "prediction") for c in cfgs}
    with_iv = any("decided_per_configuration" in r for r in d.get("rules", []))

    def _version(r: dict) -> str:
        v = r.get("version")
        if v == "prediction" and scored_as == {"whole_pass"}:
            v = "whole_pass"  # the rule set's prediction is the whole-pass one
        return esc(VERSION_NAMES.get(v, v))

    rows = [
        [
            esc(r["id"])
            + ("" if r.get("required", True) else " <span class=none>(reported)</span>"),
            esc(r.get("text", "")),
            _version(r),
            _rule_text(r),
            f"{r.get('configurations_holding', '–')} of {r.get('configurations', '–')}",
            verdict(r.get("holds")),
            *(
                [
                    f"{sum(x is True for x in r['decided_per_configuration'].values())} of "
                    f"{len(r['decided_per_configuration'])}"
                ]
                if with_iv
                else []
            ),
        ]
        for r in d.get("rules", [])
    ]
    parts.append(
        table(
            ["rule", "statement", "version", "threshold", "configurations", "verdict"]
            + (["decided (interval on one side)"] if with_iv else []),
            rows,
            left=2,
        )
    )
    if cfgs:
        parts.append("<h3>Scores per configuration (Tables 3, 4 and 7 of paper 002)</h3>")
        present = {v for c in cfgs for v in c.get("versions", {})}
        vs = tuple(
            v for v in ("prediction", "measured_time", "calibrated", "whole_pass") if v in present
        )
        tag = " / ".join(VERSION_ABBREV[v] for v in vs)
        rows = []
        for c in cfgs:
            cr = c.get("crossover", {})
            A = len(c.get("acceptance_values", []))
            within = [c.get("versions", {}).get(v, {}).get("kstar_within_one") for v in vs]
            rows.append(
                [
                    esc(c.get("name")),
                    " / ".join(num(cr.get(v)) for v in vs)
                    + f" · {num(c.get('crossover_measured'))}",
                    " / ".join(num(w) for w in within) + f" of {A}",
                    pct(c.get("max_loss")),
                    " / ".join(pct(c.get("verify_error", {}).get(v)) for v in vs),
                    " / ".join(num(c.get("saving_error_ms", {}).get(v), ".3f") for v in vs),
                    pct(c.get("saving_in_band_share"), 0),
                    " / ".join(num(c.get("delta", {}).get(v), ".3f") for v in vs),
                ]
            )
        head = VERSION_ABBREV.get(next(iter(scored_as)) if len(scored_as) == 1 else "", "pred")
        parts.append(
            table(
                [
                    "configuration",
                    f"crossover {tag} · meas",
                    f"k̂* within one ({tag})",
                    f"max loss ({head})",
                    f"verify error ({tag})",
                    "saving error ms",
                    "in band (18)",
                    "δ",
                ],
                rows,
            )
        )
        parts.append(
            '<p class="note">pred: the prediction (fits at recorded windows, '
            "Eq. (22)); mt: measured operation times; cal: calibrated with the "
            "measured dedup-off verify time"
            + (
                "; wp: the whole-pass prediction (every operation of the pass from the "
                "per-operation benchmark, committed before the runs)"
                if "whole_pass" in vs
                else ""
            )
            + ". Loss: the largest share of the best "
            "measured throughput lost by drafting k̂*. δ: the largest relative "
            "step-time error, which sets bounds (20) and (21).</p>"
        )
        parts += _interval_tables(cfgs)
        rows = []
        for r in d.get("rules", []):
            cells = []
            for c in cfgs:
                cr = next((x for x in c.get("rules", []) if x.get("id") == r["id"]), {})
                m = cr.get("measured")
                shown = f"{num(m)} of {num(cr.get('total'))}" if cr.get("of") else num(m, ".3g")
                if "interval" in cr:
                    iv = cr.get("interval")
                    if iv:
                        shown += f" [{num(iv[0], '.3g')}, {num(iv[1], '.3g')}]"
                    cells.append(
                        f"{shown} {verdict(cr.get('holds'))} {decided_mark(cr.get('decided'))}"
                    )
                else:
                    cells.append(f"{shown} {verdict(cr.get('holds'))}")
            rows.append([esc(r["id"]), *cells])
        parts.append(
            table(
                ["rule"] + [esc(c.get("name")) for c in cfgs],
                rows,
                caption="Each rule in each configuration: the measured value"
                + (
                    " with its 95% interval, the verdict and whether the interval decides it"
                    if with_iv
                    else " and the verdict"
                ),
            )
        )
    have = {p.name for p in (path.parent.glob("validate_*.png"))}
    figs_html = _beside(path, "validation", figs)
    if not have and cfgs:
        from specmoe.report.validate_figures import write_validation_figures

        figs_html = [figs.tag(p, p.name) for p in figs.draw(write_validation_figures, d)]
    parts += figs_html
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------
# plan, profile, routing, runs


def render_plan(path: Path, d: dict, figs) -> str:
    parts = []
    model = d.get("model", {})
    src = d.get("sources", {})
    bw = src.get("bandwidth", {})
    eps = d.get("epsilon", {})
    parts.append(
        _facts(
            [
                ("model", esc(model.get("name", ""))),
                (
                    "bandwidths measured on",
                    esc(f"{bw.get('device', '')} {bw.get('device_name', '')}"),
                ),
                ("context depth", num(d.get("context"))),
                ("largest draft length", num(d.get("k_max"))),
                ("bandwidth error ε", num(eps.get("used"), ".3f")),
                ("step-time error δ", num(d.get("delta"), ".3f")),
                (
                    "crossover",
                    "none"
                    if d.get("crossover") is None and "crossover" in d
                    else num(d.get("crossover")),
                ),
            ]
        )
    )
    for note in d.get("notes", []):
        parts.append(f'<p class="note">Note: {esc(note)}</p>')
    n = d.get("n", [])
    vm = d.get("verify_ms", {})
    eq22 = d.get("verify_ms_eq22") or {}
    cols = [
        ("verify per-slot (ms)", vm.get("per_slot")),
        ("verify dedup (ms)", vm.get("dedup")),
        ("Eq. (22) per-slot", eq22.get("per_slot")),
        ("Eq. (22) dedup", eq22.get("dedup")),
        ("saving S(n) ms", d.get("saving_ms")),
        ("bound (18) ±", d.get("saving_band_ms")),
        ("ū(n)", d.get("bytes", {}).get("u_bar")),
        ("r(n)", d.get("r")),
    ]
    cols = [(h, v) for h, v in cols if isinstance(v, list) and len(v) >= len(n)]
    if n and cols:
        rows = [[num(nn)] + [num(v[i]) for _, v in cols] for i, nn in enumerate(n)]
        parts.append(table(["n"] + [esc(h) for h, _ in cols], rows))
    sp = d.get("step_points", {})
    if sp:
        K = max(len(v) for v in sp.values())
        rows = [[esc(p)] + [num(a, ".4f") for a in v] for p, v in sp.items()]
        parts.append(
            table(
                ["step points a_j"] + [f"j = {j}" for j in range(1, K + 1)],
                rows,
                caption="Acceptance above which the best draft length reaches j (Eq. (B.31))",
            )
        )
    acc = d.get("acceptance", [])
    bk, su = d.get("best_k", {}), d.get("speedup", {})
    if acc and bk:
        pols = [p for p in ("best", "dedup", "per_slot") if p in bk]
        rows = [
            [num(a, ".3g")]
            + [f"{num(bk[p][i])} ({num(su.get(p, [None] * len(acc))[i], '.3f')}×)" for p in pols]
            for i, a in enumerate(acc)
        ]
        parts.append(
            table(
                ["acceptance a"] + [f"k* ({esc(p)}), speedup" for p in pols],
                rows,
                caption="Best draft length and its speedup T_a(k*)/T_a(0)",
            )
        )
    eng = d.get("engine")
    if isinstance(eng, dict) and "best" in eng:
        b = eng["best"]
        parts.append(
            f"<p>At expected acceptance {num(eng.get('expected_acceptance'))}: draft "
            f"<strong>{num(b.get('draft_length'))}</strong> tokens "
            f"(predicted speedup {num(b.get('speedup'), '.3f')}×).</p>"
        )
    figs_html = _beside(path, "plan", figs)
    if not figs_html and "staircase" in d:
        from specmoe.report.plan_figures import write_plan_figures

        figs_html = [figs.tag(p, p.name) for p in figs.draw(write_plan_figures, d, prefix="plan_")]
    parts += figs_html
    return "\n".join(parts)


def render_profile(path: Path, d: dict, figs) -> str:
    parts = []
    eps = d.get("epsilon", {})
    parts.append(
        _facts(
            [
                ("model", esc(d.get("model", {}).get("name", ""))),
                ("device", esc(f"{d.get('device', '')} {d.get('device_name', '')}")),
                ("dtype", esc(d.get("dtype", ""))),
                ("read ceiling", f"{num(d.get('ceiling_gbps'), '.1f')} GB/s"),
                (
                    "ε per-slot / dedup",
                    f"{num(eps.get('per_slot'), '.3f')} / {num(eps.get('dedup'), '.3f')}",
                ),
                ("re-read cost c_re/c_u", num(d.get("reread_cost"), ".3f")),
                ("crossover on recorded windows", num(d.get("crossover"))),
            ]
        )
    )
    n = d.get("n", [])
    cols = [
        ("β per-slot GB/s", d.get("beta_slot")),
        ("β dedup GB/s", d.get("beta_dedup")),
        ("r(n)", d.get("r")),
        ("ū(n)", d.get("u_bar")),
    ]
    cols = [(h, v) for h, v in cols if isinstance(v, list) and len(v) == len(n)]
    if n and cols:
        parts.append(
            table(
                ["n"] + [esc(h) for h, _ in cols],
                [[num(x)] + [num(v[i]) for _, v in cols] for i, x in enumerate(n)],
                caption="Effective bandwidth of each kernel (Table 1 of paper 002)",
            )
        )
    parts += _beside(path, "profile", figs)
    return "\n".join(parts)


def render_routing(path: Path, d: dict, figs) -> str:
    parts = []
    if "rho_mean" in d or "union_mean" in d:
        parts.append(
            _facts(
                [
                    ("trace", esc(d.get("trace", ""))),
                    ("model", esc(d.get("model") or "")),
                    (
                        "experts N, per token m",
                        f"{num(d.get('num_experts'))}, {num(d.get('top_k'))}",
                    ),
                    ("MoE layers", num(d.get("num_layers"))),
                    ("tokens", num(d.get("tokens"))),
                    ("documents", num(d.get("documents"))),
                ]
            )
        )
        cols = [
            ("reuse ρ(n)", d.get("rho_mean")),
            ("union U(n)", d.get("union_mean")),
            ("ū(n)", d.get("u_bar")),
            ("uniform ρ", d.get("uniform_rho")),
            ("uniform U", d.get("uniform_union")),
        ]
        cols = [(h, v) for h, v in cols if isinstance(v, list)]
        if cols:
            length = min(len(v) for _, v in cols)
            parts.append(
                table(
                    ["n"] + [esc(h) for h, _ in cols],
                    [[str(i + 1)] + [num(v[i]) for _, v in cols] for i in range(length)],
                    caption="Layer means against independent uniform routing",
                )
            )
    else:
        parts.append(generic(d))
    parts += _beside(path, "routing", figs)
    return "\n".join(parts)


def render_runs(path: Path, d: dict, figs) -> str:
    parts = []
    cfgs = d.get("configurations", [d]) if isinstance(d, dict) else []
    for c in cfgs:
        label = c.get("name") or f"depth {c.get('depth', c.get('context', '?'))}"
        if "verify_ms" in c:
            n = c.get("n", [])
            off, on = c["verify_ms"].get("off", []), c["verify_ms"].get("on", [])
            rows = [[num(x), num(a), num(b), num(a - b, ".3f")] for x, a, b in zip(n, off, on)]
            parts.append(
                table(
                    ["n", "dedup off (ms)", "dedup on (ms)", "saving (ms)"],
                    rows,
                    caption=f"Verify time, {label}",
                )
            )
        if "tokens_per_s" in c:
            ks = c.get("k", [])
            rows = []
            for a, row in zip(c.get("acceptance", []), c["tokens_per_s"]):
                best = max(range(len(row)), key=lambda i: (row[i], -i))
                rows.append(
                    [num(a, ".3g")]
                    + [
                        f"<strong>{num(v, '.1f')}</strong>" if i == best else num(v, ".1f")
                        for i, v in enumerate(row)
                    ]
                )
            parts.append(
                table(
                    ["a"] + [f"k = {k}" for k in ks],
                    rows,
                    caption=f"Throughput, tokens/s (bold: measured best), {label}",
                )
            )
    if not parts:
        parts.append(generic(d))
    parts += _beside(path, "runs", figs)
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------
# oracle, policies, round logs, anything else


def render_oracle(path: Path, d: dict, figs) -> str:
    parts = [
        _facts(
            [("tokens", num(d.get("tokens"))), ("plain decoding ms", num(d.get("plain_ms"), ".4g"))]
        )
    ]
    L = d.get("l_max", [])
    cols = [
        (h, d.get(k))
        for h, k in (
            ("S_max", "s_max"),
            ("mean k", "mean_k"),
            ("mean accepted", "mean_accepted"),
            ("cap rate", "cap_rate"),
            ("rounds", "rounds"),
        )
    ]
    cols = [(h, v) for h, v in cols if isinstance(v, list) and len(v) == len(L)]
    if L and cols:
        parts.append(
            table(
                ["L_max"] + [esc(h) for h, _ in cols],
                [[num(x)] + [num(v[i]) for _, v in cols] for i, x in enumerate(L)],
                caption="The Oracle's best speedup S_max against the budget (paper 000)",
            )
        )
    figs_html = _beside(path, "oracle", figs)
    if not figs_html and L:
        from specmoe.report.oracle_figures import plot_oracle_bounds

        def draw(data, out):
            return [plot_oracle_bounds(data, out / "oracle_bounds.png")]

        figs_html = [figs.tag(p, p.name) for p in figs.draw(draw, d)]
    parts += figs_html
    return "\n".join(parts)


def render_rounds(path: Path, _data: Any, figs) -> str:
    import numpy as np

    from specmoe.formats.roundlog import read_round_log

    log = read_round_log(path, check=False)
    gens = len(set(log["generation_id"]))
    codes, labels = log.codes("drafter")
    parts = [
        _facts(
            [
                ("rounds", num(log.num_rounds)),
                ("generations", num(gens)),
                ("drafters", esc(", ".join(x or "–" for x in labels))),
            ]
        )
    ]
    rows = []
    k = log["k"]
    for di, dl in enumerate(labels):
        for kk in np.unique(k[codes == di]):
            m = (codes == di) & (k == kk)
            td = log["t_draft_ms"][m]
            rows.append(
                [
                    esc(dl or "–"),
                    num(int(kk)),
                    num(int(m.sum())),
                    num(float(log["accepted"][m].mean()), ".3f"),
                    num(float(log["emitted"][m].mean()), ".3f"),
                    num(float(log["t_verify_ms"][m].mean()), ".4g"),
                    num(float(np.nanmean(td)) if np.any(~np.isnan(td)) else None, ".4g"),
                ]
            )
    parts.append(
        table(
            [
                "drafter",
                "k",
                "rounds",
                "mean accepted",
                "mean emitted",
                "mean verify ms",
                "mean draft ms",
            ],
            rows,
        )
    )
    parts += _beside(path, "rounds", figs)
    return "\n".join(parts)


def generic(d: Any, *, limit: int = 30) -> str:
    """Scalars as a two-column table and lists of objects as tables (first ``limit`` rows)."""
    if not isinstance(d, dict):
        return (
            f"<p>{esc(type(d).__name__)} with {len(d) if hasattr(d, '__len__') else 1} entries.</p>"
        )
    parts = []
    scalars = [(k, v) for k, v in d.items() if isinstance(v, str | int | float | bool) or v is None]
    if scalars:
        parts.append(_facts([(k, num(v)) for k, v in scalars]))
    for k, v in d.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            keys = [
                c for c in v[0] if isinstance(v[0][c], str | int | float | bool) or v[0][c] is None
            ][:12]
            if keys:
                rows = [[num(x.get(c)) for c in keys] for x in v[:limit]]
                parts.append(table([esc(c) for c in keys], rows, caption=str(k)))
    return "\n".join(parts) or "<p class=note>No fields to show.</p>"


def render_policies(path: Path, d: Any, figs) -> str:
    pol = d.get("policies") if isinstance(d, dict) else None
    if not isinstance(pol, dict) or not pol:
        return "\n".join([generic(d), *_beside(path, "policies", figs)])
    oracle = d.get("oracle", {}) or {}
    ro = d.get("oracle_rate_only") or {}
    rate = ro.get("speedup_on_recorded", ro.get("s_max"))
    tr = d.get("training", {}) or {}
    parts = [
        _facts(
            [
                ("held-out Oracle S_max", num(oracle.get("s_max"), ".4g")),
                (
                    "Oracle knowing only the acceptance rate: its value, its budgets on "
                    "the recorded outcomes",
                    f"{num(ro.get('s_max'), '.4g')}, {num(ro.get('speedup_on_recorded'), '.4g')}",
                ),
                ("L_max", num(d.get("l_max"))),
                (
                    "prompts held out / training",
                    f"{num(tr.get('prompts_held_out'))} / {num(tr.get('prompts_training'))}",
                ),
                ("value of a token λ, ms", num(tr.get("value_per_token_ms"), ".4g")),
                ("prior acceptance", num(tr.get("prior_acceptance"), ".3f")),
                ("best fixed K on training", num(tr.get("best_fixed_k"))),
            ]
        )
    ]
    rows = []
    for name, p in pol.items():
        sp = p.get("speedup")
        rows.append(
            [
                esc(name),
                num(sp, ".3f"),
                num(p.get("share_of_oracle"), ".1%"),
                num(sp / rate if sp is not None and rate else None, ".1%"),
                num(p.get("mean_k"), ".2f"),
                num(p.get("mean_accepted"), ".2f"),
            ]
        )
    parts.append(
        table(
            [
                "policy",
                "speedup",
                "share of S_max",
                "share of rate-only budgets",
                "mean k",
                "mean accepted",
            ],
            rows,
            caption="Online policies simulated on the held-out prompts",
        )
    )
    figs_html = _beside(path, "policies", figs)
    if not figs_html:
        from specmoe.report.oracle_figures import plot_policies

        def draw(data, out):
            return [plot_policies(data, out / "policies.png")]

        figs_html = [figs.tag(q, q.name) for q in figs.draw(draw, d)]
    parts += figs_html
    return "\n".join(parts)


RENDERERS = {
    "validation": render_validation,
    "plan": render_plan,
    "profile": render_profile,
    "routing": render_routing,
    "runs": render_runs,
    "oracle": render_oracle,
    "policies": render_policies,
    "rounds": render_rounds,
}


def render(kind: str, path: Path, data: Any, figs, *, rel: str = "") -> str:
    return RENDERERS[kind](path, data, figs)
