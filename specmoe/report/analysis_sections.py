"""The report sections of the analyses in :mod:`specmoe.analysis`: routing inertia of rejected
drafts (``inertia.json``, paper 003 Section 9.4 and Appendix H) and where the Oracle stops
(``stops.json``, paper 000 Appendix B); MoE against dense draft layers (``drafters.json``, paper
003 Appendix M, a design study) and bandwidth transfer to a held-out model (``transfer.json``,
paper 002 Appendix E, Figure 7).

:mod:`specmoe.report.html` finds these files (its ``JSON_KINDS``) and calls :func:`render` for
the kinds in :data:`KINDS`. Every value goes through ``html.escape``; a field a file lacks is
skipped. The figures beside the file (``inertia_*.png``, ``stops_*.png``) are shown once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["KINDS", "render"]

KINDS = ("inertia", "stops", "drafters", "transfer")


def _h():
    from specmoe.report import html_sections as h

    return h


def _iv(iv, spec=".3f") -> str:
    h = _h()
    if not iv or iv[0] is None:
        return ""
    return f" [{h.num(iv[0], spec)}, {h.num(iv[1], spec)}]"


def _figures(path: Path, prefix: str, figs) -> list[str]:
    folder = path if path.is_dir() else path.parent
    out = []
    for p in sorted(folder.glob(f"{prefix}*.png")):
        if p in figs.claimed:
            continue
        figs.claimed.add(p)
        out.append(figs.tag(figs.add_file(p), p.name))
    return out


def render_inertia(path: Path, d: dict, figs) -> str:
    h = _h()
    parts = [
        '<p class="note">Overlap of each verified draft\'s top-k experts with the position s '
        "before it (paper 003 Section 6.1, Appendix H). Δ and d are accepted minus rejected: "
        "negative means routing inertia. Intervals: percentile bootstrap over prompt documents "
        f"({h.esc(d.get('n_boot'))} resamples, {h.pct(d.get('confidence'), 0)}).</p>"
    ]
    paper = d.get("paper") or {}
    if paper:
        parts.append(
            f'<p class="note">Paper ({h.esc(paper.get("source", ""))}): step 1 first rejection '
            f"{h.num(paper.get('step1_first_rejection'))} against accepted "
            f"{h.num(paper.get('step1_accepted'))}; distributions overlap about "
            f"{h.pct(paper.get('distribution_overlap'), 0)}.</p>"
        )
    for r in d.get("drafters", []):
        b = r.get("baselines", {})
        parts.append(
            f"<h4>{h.esc(r.get('drafter'))}: {h.num(r.get('prompts'))} prompts, "
            f"{h.num(r.get('rounds'))} drafted rounds</h4>"
            f'<p class="note">Baselines: uniform m/N {h.num(b.get("uniform"), ".3f")}, '
            f"independence {h.num(b.get('independence'), '.3f')}.</p>"
        )
        rows = []
        for s, c in zip(r.get("steps", []), r.get("classifier", [])):
            k = s["kinds"]
            f = s["vs_accepted"].get("first_rejection") or {}
            ca = s["vs_accepted"].get("cascade") or {}
            rows.append(
                [
                    h.num(s["step"]),
                    h.num(k["accepted"]["mean"], ".4f") + f" ({k['accepted']['n']})",
                    h.num(k["first_rejection"]["mean"], ".4f") + f" ({k['first_rejection']['n']})",
                    h.num(k["cascade"]["mean"], ".4f") + f" ({k['cascade']['n']})",
                    h.num(f.get("delta"), "+.4f") + _iv(f.get("delta_interval"), "+.4f"),
                    h.num(f.get("d"), "+.3f") + _iv(f.get("d_interval"), "+.3f"),
                    h.num(ca.get("d"), "+.3f"),
                    h.num(f.get("overlap_normal"), ".3f"),
                    h.num(f.get("overlap_empirical"), ".3f"),
                    "–" if c is None else h.num(c["auc"], ".3f"),
                    "–" if c is None else h.num(c["oos_threshold_auc"], ".3f"),
                ]
            )
        parts.append(
            h.table(
                [
                    "step",
                    "accepted (n)",
                    "first rejection (n)",
                    "cascade (n)",
                    "Δ acc − first",
                    "d acc − first",
                    "d acc − cascade",
                    "OVL 2Φ(−|d|/2)",
                    "OVL empirical",
                    "AUC",
                    "threshold AUC, held-out prompts",
                ],
                rows,
                caption="Overlap with the predecessor at step s (layer mean)",
            )
        )
        sl = r.get("slices", [])
        if sl:
            rows = []
            for x in sl:
                s1 = x["steps"][0]
                rows.append(
                    [
                        h.esc(x["category"]),
                        h.num(x["prompts"]),
                        h.num(s1.get("n_accepted")),
                        h.num(s1.get("n_first_rejection")),
                        h.num(s1.get("delta"), "+.4f") + _iv(s1.get("delta_interval"), "+.4f"),
                        h.num(s1.get("d"), "+.3f"),
                    ]
                )
            parts.append(
                h.table(
                    ["category", "prompts", "accepted", "first rejections", "Δ step 1", "d"],
                    rows,
                    caption="Held-out slices: prompt categories (the document's top-level package)",
                )
            )
    parts += _figures(path, "inertia_", figs)
    return "\n".join(parts)


def _rec(x: dict | None, spec=".3f") -> str:
    h = _h()
    if not x:
        return "–"
    return h.num(x.get("mean"), spec) + _iv(x.get("interval"), spec)


def render_stops(path: Path, d: dict, figs) -> str:
    h = _h()
    parts = [
        '<p class="note">The offline Oracle (paper 000) at each state it visits: new experts of '
        "the next token (experts not yet used in the pass) where it stops and where it "
        "continues, at the first draft mismatch, by the code boundary before the token; the "
        "same Oracle without its expert term α·Ū. Intervals: percentile bootstrap over "
        f"responses ({h.esc(d.get('n_boot'))} resamples).</p>"
    ]
    for r in d.get("drafters", []):
        ne, mm = r.get("new_experts", {}), r.get("mismatch", {})
        et = (r.get("expert_term") or {}).get("no_expert_term", {})
        ks = (r.get("k_star") or {}).get("full", {})
        k0 = (r.get("k_star") or {}).get("no_expert_term", {})
        sm = r.get("s_max_under_full_cost", {})
        parts.append(f"<h4>{h.esc(r.get('drafter'))}</h4>")
        parts.append(
            h.table(
                ["", "value"],
                [
                    [
                        "responses, positions",
                        f"{h.num(r.get('responses'))}, {h.num(r.get('positions'))}",
                    ],
                    ["visited states", h.num(r.get("visited_states"))],
                    ["new experts at the stop", _rec(ne.get("stop"))],
                    ["new experts where it continues", _rec(ne.get("continue"))],
                    [
                        "stop − continue",
                        h.num((ne.get("stop_minus_continue") or {}).get("difference"), "+.3f")
                        + _iv((ne.get("stop_minus_continue") or {}).get("interval"), "+.3f"),
                    ],
                    ["first mismatch", _rec(mm.get("first_mismatch_where_before_exists"))],
                    ["position before the mismatch", _rec(mm.get("before_mismatch"))],
                    [
                        "k* = 1 (full / no expert term)",
                        f"{_rec(ks.get('k1'))} / {_rec(k0.get('k1'))}",
                    ],
                    [
                        "k* ≥ 4 (full / no expert term)",
                        f"{_rec(ks.get('k_ge4'))} / {_rec(k0.get('k_ge4'))}",
                    ],
                    [
                        "choices differ without the expert term (visited)",
                        _rec(et.get("differ_share_visited")),
                    ],
                    ["choices differ (all positions)", h.pct(et.get("differ_share_all_positions"))],
                    [
                        "states where k*+1 is cheaper without it",
                        f"{h.num(et.get('k_plus_1_cheaper_states'))} of "
                        f"{h.num(et.get('visited_states'))}",
                    ],
                    [
                        "S_max, full / no-expert policy (timed at the full cost)",
                        f"{h.num(sm.get('full'), '.4f')} / {h.num(sm.get('no_expert_term'), '.4f')}",
                    ],
                ],
            )
        )
        rows = [
            [
                h.esc(b["type"]),
                _rec(b.get("all")),
                _rec(b.get("stop")),
                _rec(b.get("continue")),
                _rec(b.get("stop_share")),
            ]
            for b in r.get("new_experts_by_boundary", [])
        ]
        parts.append(
            h.table(
                ["boundary", "new experts", "at stops", "where it continues", "stop share"],
                rows,
                caption="By the boundary before the next token (Figure B5)",
            )
        )
        mk = r.get("mean_k_by_boundary", [])
        if mk:
            parts.append(
                h.table(
                    ["boundary at the stop", "mean k*", "rounds"],
                    [[h.esc(b["type"]), _rec(b), h.num(b.get("weight"), ".1f")] for b in mk],
                    caption="Mean chosen length by the boundary at the stop (Figure B3)",
                )
            )
        for key, cap in (
            ("cases", "Where the expert term moves the boundary (Figure B4)"),
            ("examples", "Example fragments (Figures B1/B6); | marks the stop"),
        ):
            ex = r.get(key, [])
            if not ex:
                continue
            rows = [
                [
                    f"<code>{h.esc(repr(e['pass_text'] + '|' + (e['next_token'] or '')))}</code>",
                    h.num(e["k_star"]),
                    h.esc(e.get("boundary")),
                    h.esc(", ".join("–" if v is None else f"{v:.2f}" for v in e["new_experts"])),
                    h.esc(e.get("why", ""))
                    if key == "examples"
                    else h.num(e.get("q_gap_without_expert_term_ms"), ".4f"),
                ]
                for e in ex
            ]
            last = "why" if key == "examples" else "Q′(k*) − Q′(k*+1) ms"
            parts.append(
                h.table(
                    ["fragment", "k*", "boundary", "new experts d = 1..k*+1", last],
                    rows,
                    caption=cap,
                )
            )
    parts += _figures(path, "stops_", figs)
    return "\n".join(parts)


def _ms(x) -> str:
    return _h().num(None if x is None else 1e3 * x, ".3g")


def render_drafters(path: Path, d: dict, figs) -> str:
    h = _h()
    parts = [
        '<p class="note"><b>A design study</b> (paper 003 Section 9.3, Appendix M): dummy '
        "weights, synthetic routing, no trained drafter and no measured acceptance. Draft cost "
        "of M.1: C_p(B; L_d) = C_1 + L_d·c_p(B) − c_dense(1), anchored at the one-layer dense "
        "drafter's step at batch 1 (C_1) plus the measured feed-forward time c_p(B) of each "
        "draft layer on B rows.</p>",
        h._facts(
            [
                ("target shapes", h.esc(d.get("model"))),
                (
                    "experts N, per token m",
                    f"{h.esc(d.get('num_experts'))}, "
                    f"{h.esc(d.get('top_k'))} ({h.pct(d.get('activation_share'), 2)} active)",
                ),
                (
                    "expert width, dense width",
                    f"{h.esc(d.get('expert_width'))}, {h.esc(d.get('dense_width'))}",
                ),
                (
                    "anchor C_1",
                    f"{h.num(d.get('anchor_ms'), '.3g')} ms ({h.esc(d.get('anchor_rule'))})",
                ),
                (
                    "kernel, dtype, clock",
                    f"{h.esc(d.get('kernel'))}, {h.esc(d.get('dtype'))}, {h.esc(d.get('clock'))}",
                ),
                ("routing", h.esc((d.get("routing") or {}).get("source"))),
            ]
        ),
    ]
    lay = d.get("layers") or {}
    if "dense" in lay and "moe" in lay:
        rows = [
            [
                h.esc(B),
                _ms(lay["dense"]["median_s"][i]),
                _ms(lay["moe"]["median_s"][i]),
                h.num(lay["moe"]["u"][i], ".1f"),
            ]
            for i, B in enumerate(lay["dense"]["batch"])
        ]
        parts.append(h.table(["B", "dense layer (ms)", "MoE layer (ms)", "U of the batch"], rows,
                             caption="Feed-forward time of one draft layer (median)"))  # fmt: skip
    bb = d.get("bandwidth_bound") or {}
    if bb:
        rows = [
            [
                h.esc(k),
                h.esc(v.get("last_bound")),
                h.esc(v.get("first_unbound")),
                h.esc(v.get("roofline_batch", "–")),
            ]
            for k, v in bb.items()
        ]
        parts.append(h.table(["layer", "bandwidth-bound up to B", "first B beyond", "roofline B"],
                             rows, caption="Bandwidth-bound: time per byte within 1 + "
                             f"{next(iter(bb.values())).get('tol')} of the best at any smaller "
                             "batch; roofline: flops at the matmul peak reach bytes at the "
                             "memory ceiling"))  # fmt: skip
    ch = d.get("moe_cheaper_from") or {}
    if ch:
        parts.append(
            '<p class="note">MoE drafter cheaper than the dense one from B = '
            + ", ".join(f"{h.esc(v)} (L_d = {h.esc(k)})" for k, v in ch.items())
            + " (None: not within the sweep).</p>"
        )
    sp = d.get("speedup") or []
    if sp:
        k0 = min(r["k"] for r in sp)
        Bs = sorted({r["batch"] for r in sp})
        keys = sorted({(r["kind"], r["layers"]) for r in sp})
        rows = []
        for kind, L in keys:
            by = {
                r["batch"]: r for r in sp if r["kind"] == kind and r["layers"] == L and r["k"] == k0
            }
            rows.append(
                [h.esc(f"{kind}, {L} layer(s)")]
                + [h.num(by[B]["speedup"], ".3f") if B in by else "–" for B in Bs]
            )
        eff = d.get("efficiency") or {}
        parts.append(h.table(["drafter"] + [f"B={B}" for B in Bs], rows,
                             caption=f"Speedup at K={k0}, a={eff.get('acceptance')}, target "
                             f"{eff.get('model')} ({eff.get('layers')} MoE layers) on "
                             f"{eff.get('routing')} routing"))  # fmt: skip
    parts += _figures(path, "drafters_", figs)
    return "\n".join(parts)


def render_transfer(path: Path, d: dict, figs) -> str:
    h = _h()
    paper = d.get("paper") or {}
    parts = [
        '<p class="note">Each model held out in turn; each form (fixed in '
        "<code>specmoe/analysis/transfer.py</code> before any held-out prediction) fitted on "
        "the other models' bandwidth profiles predicts the held-out β_slot(n), β_dedup(n), "
        "r(n) and crossover (paper 002 Appendix E, Figure 7). Paper: β miss "
        f"{h.esc(paper.get('beta_miss'))}; r miss {h.esc(paper.get('r_miss'))}; crossover "
        f"within one {h.esc(paper.get('crossover_within_one'))}.</p>"
    ]
    for form, r in (d.get("forms") or {}).items():
        rows = []
        for m in r.get("models", []):
            rm = (r.get("r_miss_by_model") or {}).get(m["held_out"], [None, None])
            idx = [j for j, n in enumerate(m["n"]) if n in set(r.get("n_report", []))]
            bm = [m["miss_slot"][j] for j in idx] + [m["miss_dedup"][j] for j in idx]
            rows.append([
                h.esc(m["held_out"]), h.num(m["expert_bytes"] / 1e6, ".1f"),
                f"{h.pct(min(bm), 0)}-{h.pct(max(bm), 0)}" if bm else "–",
                f"{h.pct(rm[0], 0)}-{h.pct(rm[1], 0)}",
                h.esc(m["crossover_bench"]), h.esc(m["crossover_own"]),
                h.esc(m["crossover_transferred"]),
            ])  # fmt: skip
        parts.append(h.table(
            ["held out", "expert MB", "β miss", "r miss", "crossover (bench)", "own r", "transferred"],
            rows,
            caption=f"form {form}: β miss {h.pct(r.get('beta_miss_min'), 0)}-"
            f"{h.pct(r.get('beta_miss_max'), 0)}, median {h.pct(r.get('beta_miss_median'), 0)} at "
            f"n = {', '.join(map(str, r.get('n_report', [])))}; crossover within one: "
            f"transferred {r.get('crossover_transferred_within_one')} of "
            f"{r.get('configurations')}, own {r.get('crossover_own_within_one')} of "
            f"{r.get('configurations')}",
        ))  # fmt: skip
    mc = d.get("memory_counters")
    if mc:
        parts.append(
            f'<p class="note">Hardware counters of memory traffic: '
            f"{'readable' if mc.get('readable') else 'not readable'} here (perf "
            f"{h.esc(mc.get('perf') or 'absent')}, perf_event_paranoid "
            f"{h.esc(mc.get('perf_event_paranoid'))}, CPU PMU "
            f"{'present' if mc.get('cpu_pmu') else 'absent'}).</p>"
        )
    parts += _figures(path, "transfer_", figs)
    return "\n".join(parts)


def render(kind: str, path: Path, data: Any, figs, *, rel: str = "") -> str:
    if kind == "inertia" and isinstance(data, dict):
        return render_inertia(path, data, figs)
    if kind == "stops" and isinstance(data, dict):
        return render_stops(path, data, figs)
    if kind == "drafters" and isinstance(data, dict):
        return render_drafters(path, data, figs)
    if kind == "transfer" and isinstance(data, dict):
        return render_transfer(path, data, figs)
    return _h().generic(data)
