"""The report section of llama.cpp beside specmoe's engine on the same model.

:mod:`specmoe.report.html` finds ``llamacpp_verify.json`` (written by
``scripts/llamacpp_runs.py``: llama-bench's verify passes of n tokens at each depth, per weight
type) and calls :func:`render`. Beside it, the section reads what it finds in the same folder
(``llamacpp_throughput.json``: plain decoding and draft-model speculation; ``synthetic.json``:
llama.cpp's synthetic acceptance) and, for specmoe's own engine on the same model, the
whole-pass campaign's ``tables.json`` of the bundled model under the results root
(``whole-pass/bundled/tables.json``, τ_p(n) with deduplication on). Every value goes through
``html.escape``; a missing file or field is said or skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["KINDS", "render"]

KINDS = ("llamacpp",)


def _read(path: Path) -> Any:
    from specmoe._io import read_json
    from specmoe.errors import InputError

    try:
        return read_json(path, "results file") if path.is_file() else None
    except InputError:
        return None


def _specmoe_tau(path: Path) -> dict[str, list[float]]:
    """depth -> specmoe's measured tau_dedup(n), from the whole-pass campaign of the bundled
    model in a folder above ``path`` (the first found), or {}."""
    for root in list(path.parents)[1:4]:
        t = _read(root / "whole-pass" / "bundled" / "tables.json")
        if isinstance(t, dict):
            out = {}
            for d, e in (t.get("depths") or {}).items():
                tau = (e or {}).get("tau_ms", {}).get("on")
                if tau:
                    out[str(d)] = tau
            return out
    return {}


def render_llamacpp(path: Path, d: dict, figs) -> str:
    from specmoe.report import html_sections as h

    parts = [
        f"<p>llama.cpp {h.esc(d.get('llama_cpp', '?'))} on the bundled model, one thread, "
        "flash attention off: one llama-bench batch of n tokens on a KV cache of depth d "
        "(a verification pass; llama-bench computes the logits of the last row only).</p>"
    ]
    ours = _specmoe_tau(path)
    for wt, by_depth in (d.get("verify") or {}).items():
        for depth, rows in sorted(by_depth.items(), key=lambda kv: int(kv[0])):
            rows = sorted(rows, key=lambda r: r.get("n", 0))
            tau = ours.get(str(depth))
            head = ["n", "llama.cpp median ms", "llama.cpp min ms"]
            head += ["specmoe ms (dedup)", "specmoe / llama.cpp"] if tau else []
            body = []
            for r in rows:
                n = int(r.get("n", 0))
                row = [str(n), h.num(r.get("median_ms"), ".3f"), h.num(r.get("min_ms"), ".3f")]
                if tau and 1 <= n <= len(tau):
                    med = r.get("median_ms")
                    row += [
                        h.num(tau[n - 1], ".3f"),
                        h.num(tau[n - 1] / med if med else None, ".1f"),
                    ]
                elif tau:
                    row += ["–", "–"]
                body.append(row)
            parts.append(h.table(head, body, caption=f"verify pass, {wt}, d = {depth}"))
    if not ours:
        parts.append(
            '<p class="note">specmoe\'s own engine on this model: no whole-pass campaign '
            "tables found above this folder.</p>"
        )
    thr = _read(path.parent / "llamacpp_throughput.json")
    for wt, t in ((thr or {}).get("throughput") or {}).items():
        plain = [p.get("tokens_per_s") for p in t.get("plain", []) if p.get("tokens_per_s")]
        rows = [
            [str(r.get("k")), h.esc(r.get("prompt", "")), h.num(r.get("median_tokens_per_s"), ".0f"),
             h.num(r.get("acceptance"), ".3f"), h.num(r.get("speedup_vs_plain_before"), ".2f")]
            for r in t.get("draft_model", [])
        ]  # fmt: skip
        if plain:
            parts.append(
                f"<p>Plain decoding, {h.esc(wt)}: "
                + ", ".join(h.num(p, ".0f") for p in plain)
                + " tokens/s.</p>"
            )
        if rows:
            parts.append(
                h.table(
                    ["k", "prompt", "tokens/s", "acceptance", "speedup"],
                    rows,
                    left=2,
                    caption=f"draft-model speculation, {wt}",
                )
            )
    syn = _read(path.parent / "synthetic.json")
    if isinstance(syn, dict) and syn.get("synthetic"):
        parts.append(_synthetic(syn, h))
    return "\n".join(parts)


def _synthetic(syn: dict, h: Any) -> str:
    """Per acceptance value: the best draft length of llama.cpp's synthetic acceptance (the
    median over prompts of each k's tokens/s) and its speedup over plain decoding."""
    import numpy as np

    plain = [p["tokens_per_s"] for p in syn.get("plain", []) if p.get("tokens_per_s")]
    base = float(np.median(plain)) if plain else None
    cells: dict[float, dict[int, list[float]]] = {}
    for r in syn["synthetic"]:
        if r.get("tokens_per_s") and r.get("acceptance") is not None:
            cells.setdefault(float(r["acceptance"]), {}).setdefault(int(r["k"]), []).append(
                float(r["tokens_per_s"])
            )
    rows = []
    for a in sorted(cells):
        med = {k: float(np.median(v)) for k, v in cells[a].items()}
        k = max(med, key=lambda j: (med[j], -j))
        best = med[k]
        if base is not None and base >= best:
            k, best = 0, base
        rows.append(
            [
                h.num(a, ".3f"),
                str(k),
                h.num(best, ".0f"),
                h.num(best / base if base else None, ".2f"),
            ]
        )
    return h.table(
        ["acceptance", "best k", "tokens/s", "speedup over plain"],
        rows,
        caption=f"llama.cpp's synthetic acceptance ({h.esc(syn.get('weights', ''))}, plain "
        f"{h.num(base, '.0f')} tokens/s)",
    )


def render(kind: str, path: Path, data: Any, figs, *, rel: str = "") -> str:
    from specmoe.report import html_sections as h

    if kind == "llamacpp" and isinstance(data, dict):
        return render_llamacpp(path, data, figs)
    return h.generic(data)
