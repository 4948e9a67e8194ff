"""``specmoe report DIR``: one HTML page from whatever a results folder holds.

The page has a section for each kind of result found under DIR (searched a few folders deep):
routing statistics (``stats.json``), the bandwidth profile (``profile.json``), the plan
(``plan.json``), measured runs (``verify.json``, ``throughput.json``), the validation
(``validation.json``) with its rules and which hold, the Oracle (``oracle.json``), policies
(``policies.json``) and round logs (``*.parquet``). A kind that is absent is said, never
crashed on; a file that cannot be read is said with its reason. Figures are the PNG files
beside each result plus those drawn here from plan.json and validation.json by the figure
modules; they are written into ``<page>_files/`` beside the page and embedded in it as base64,
so the page alone is complete (``embed=False`` references the files instead). Plain semantic
HTML with a little CSS: no scripts, no network. A kind that is absent is said with what makes
it when the caller passes ``made_by`` (the command layer passes its command lines).

Sections are rendered by :mod:`specmoe.report.html_sections`.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specmoe._io import atomic_write_bytes, atomic_write_text
from specmoe.errors import InputError

__all__ = ["Found", "build_report", "discover", "write_report"]

MAX_DEPTH = 8
JSON_KINDS = {
    "stats.json": "routing",
    "ipf.json": "routing",
    "profile.json": "profile",
    "plan.json": "plan",
    "verify.json": "runs",
    "throughput.json": "runs",
    "validation.json": "validation",
    "oracle.json": "oracle",
    "policies.json": "policies",
    "inertia.json": "inertia",
    "stops.json": "stops",
    "drafters.json": "drafters",
    "transfer.json": "transfer",
    "llamacpp_verify.json": "llamacpp",
}
SCHEMA_KINDS = {
    "specmoe.bandwidth_profile/1": "profile",
    "specmoe.plan/1": "plan",
    "specmoe.validation/1": "validation",
}
ORDER = (
    "validation",
    "plan",
    "profile",
    "routing",
    "runs",
    "oracle",
    "policies",
    "inertia",
    "stops",
    "drafters",
    "transfer",
    "llamacpp",
    "rounds",
)
TITLES = {
    "validation": "Prediction against measurement",
    "plan": "Plan",
    "profile": "Bandwidth profile",
    "routing": "Routing statistics",
    "runs": "Measured runs",
    "oracle": "Oracle bound",
    "policies": "Draft-budget policies",
    "inertia": "Routing inertia of rejected drafts",
    "stops": "Where the Oracle stops",
    "drafters": "MoE against dense draft layers (design study)",
    "transfer": "Bandwidth transfer to a held-out model",
    "llamacpp": "llama.cpp beside specmoe's engine",
    "rounds": "Round logs",
}

CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
       max-width: 1100px; margin: 2em auto; padding: 0 1em; }
h1 { font-size: 1.7em; margin-bottom: .2em; } h2 { border-bottom: 2px solid #ddd;
     padding-bottom: .2em; margin-top: 2em; } h3 { margin-top: 1.4em; }
table { border-collapse: collapse; margin: .6em 0 1em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
th { background: #f2f2f2; } td.l, th.l { text-align: left; }
.holds { color: #0a6b20; font-weight: 600; } .fails { color: #b00020; font-weight: 600; }
.none { color: #777; } .note { color: #555; font-size: 13px; }
.missing { color: #777; font-style: italic; }
figure { display: inline-block; vertical-align: top; margin: .6em .6em .6em 0;
         max-width: 100%; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 13px; color: #555; }
code { background: #f5f5f5; padding: 0 3px; } nav ul { columns: 2; }
caption { text-align: left; font-size: 13px; color: #555; padding-bottom: 3px; }
"""


@dataclass
class Found:
    """The results found under a folder, by kind: [(path, data or None, error or None)]."""

    root: Path
    items: dict[str, list[tuple[Path, Any, str | None]]] = field(default_factory=dict)

    def add(self, kind: str, path: Path, data: Any, error: str | None = None) -> None:
        self.items.setdefault(kind, []).append((path, data, error))


def _read_json(path: Path) -> tuple[Any, str | None]:
    """The JSON in ``path`` (size and depth limited by :func:`specmoe._io.read_json`), or
    None and the one-line reason it cannot be read (shown in the report)."""
    from specmoe._io import read_json
    from specmoe.errors import InputError

    try:
        return read_json(path, "result file", label=path.name), None
    except InputError as exc:
        return None, exc.message


def discover(root: str | os.PathLike) -> Found:
    """Every known result under ``root`` (``MAX_DEPTH`` folders deep, hidden ones skipped)."""
    root = Path(root)
    found = Found(root)
    round_dirs: set[Path] = set()

    def walk(folder: Path, depth: int) -> None:
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            return
        for p in entries:
            if p.name.startswith(".") or p.name.endswith("_files"):
                continue
            if p.is_dir():
                if depth < MAX_DEPTH:
                    walk(p, depth + 1)
            elif p.suffix == ".parquet":
                round_dirs.add(p.parent)
            elif p.suffix == ".json":
                kind = JSON_KINDS.get(p.name)
                data, err = _read_json(p)
                if kind is None and isinstance(data, dict):
                    kind = SCHEMA_KINDS.get(str(data.get("schema")))
                if kind is not None:
                    found.add(kind, p, data, err)

    walk(root, 0)
    # a round log is a folder of parts, one per run; the runs of one ``rounds/`` folder (the
    # layout of a run's output folder) read as one log; nested folders are reported once
    logs = {d.parent if d.parent.name == "rounds" else d for d in round_dirs}
    for d in sorted(logs):
        if not any(parent in logs for parent in d.parents):
            found.add("rounds", d, None)
    return found


def _pngs(root: Path) -> list[Path]:
    """PNG files under ``root`` (``MAX_DEPTH`` deep), outside hidden and ``*_files`` folders."""
    out = []
    for p in sorted(root.rglob("*.png")):
        rel = p.relative_to(root).parts
        if len(rel) - 1 > MAX_DEPTH or any(
            x.startswith(".") or x.endswith("_files") for x in rel[:-1]
        ):
            continue
        out.append(p)
    return out


# ------------------------------------------------------------------------------------------
# figures


class Figures:
    """Collects the page's figures into ``folder`` and renders <figure> tags."""

    def __init__(self, folder: Path, *, embed: bool, page_dir: Path):
        self.folder, self.embed, self.page_dir = folder, embed, page_dir
        self.written: list[Path] = []
        self.claimed: set[Path] = set()  # source PNGs already on the page
        self._names: set[str] = set()

    def _unique(self, name: str) -> str:
        stem, suffix = os.path.splitext(name)
        out, i = name, 1
        while out in self._names:
            i += 1
            out = f"{stem}-{i}{suffix}"
        self._names.add(out)
        return out

    def add_file(self, src: Path, *, prefix: str = "") -> Path:
        """Copy a PNG into the figures folder; -> its path there."""
        dst = self.folder / self._unique(f"{prefix}{src.name}")
        atomic_write_bytes(dst, src.read_bytes())
        self.written.append(dst)
        return dst

    def draw(self, fn, data: Any, *, prefix: str = "") -> list[Path]:
        """Call a figure module's ``write_*(data, out_dir)`` into a scratch folder and collect
        what it wrote; a failure is returned as a note by the caller."""
        import tempfile

        with tempfile.TemporaryDirectory(dir=self.folder) as tmp:
            paths = fn(data, Path(tmp))
            return [self.add_file(Path(p), prefix=prefix) for p in paths]

    def tag(self, path: Path, caption: str) -> str:
        if self.embed:
            b64 = base64.b64encode(path.read_bytes()).decode("ascii")
            src = f"data:image/png;base64,{b64}"
        else:
            src = html.escape(os.path.relpath(path, self.page_dir))
        return (
            f'<figure><img src="{src}" alt="{html.escape(caption)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )


# ------------------------------------------------------------------------------------------
# the page


def build_report(
    root: str | os.PathLike,
    out: str | os.PathLike,
    *,
    embed: bool = True,
    made_by: Mapping[str, str] | None = None,
) -> tuple[str, list[Path], dict[str, int]]:
    """The HTML text of the report on ``root``, the figure files written beside ``out`` and the
    number of results found per kind. ``made_by`` maps a kind (a key of ``TITLES``) to what
    produces it, shown where that kind is missing."""
    from specmoe.report import analysis_sections as asec
    from specmoe.report import engine_sections as esec
    from specmoe.report import html_sections as sec

    root, out = Path(root), Path(out)
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "no such results folder"
        raise InputError(f"{root}: {what}")
    if out.is_dir():
        raise InputError(f"{out}: is a directory, not the page's file name", argument="out")
    found = discover(root)
    figs = Figures(out.parent / f"{out.stem}_files", embed=embed, page_dir=out.parent)
    figs.folder.mkdir(parents=True, exist_ok=True)
    body: list[str] = []
    toc: list[str] = []
    for kind in ORDER:
        anchor = f"sec-{kind}"
        title = TITLES[kind]
        toc.append(
            f'<li><a href="#{anchor}">{html.escape(title)}</a>'
            + ("" if kind in found.items else ' <span class="none">(none)</span>')
            + "</li>"
        )
        body.append(f'<section id="{anchor}"><h2>{html.escape(title)}</h2>')
        entries = found.items.get(kind)
        if not entries:
            how = (made_by or {}).get(kind)
            body.append(
                f'<p class="missing">No {html.escape(title.lower())} in this folder'
                + (f" (made by <code>{html.escape(how)}</code>)" if how else "")
                + ".</p></section>"
            )
            continue
        for path, data, err in entries:
            rel = os.path.relpath(path, root)
            if len(entries) > 1 or kind in ("routing", "runs", "rounds"):
                body.append(f"<h3>{html.escape(rel)}</h3>")
            else:
                body.append(f'<p class="note">From <code>{html.escape(rel)}</code>.</p>')
            if err is not None:
                body.append(
                    f'<p class="fails">Could not read {html.escape(rel)}: {html.escape(err)}</p>'
                )
                continue
            try:
                render = (
                    asec.render
                    if kind in asec.KINDS
                    else esec.render
                    if kind in esec.KINDS
                    else sec.render
                )
                body.append(render(kind, path, data, figs, rel=rel))
            except Exception as exc:  # one bad file never sinks the page
                body.append(
                    f'<p class="fails">Could not render {html.escape(rel)}: '
                    f"{html.escape(type(exc).__name__)}: {html.escape(str(exc))}</p>"
                )
        body.append("</section>")
    other = [p for p in _pngs(root) if p not in figs.claimed]
    if other:
        toc.append('<li><a href="#sec-other">Other figures</a></li>')
        body.append('<section id="sec-other"><h2>Other figures</h2>')
        body += [
            figs.tag(figs.add_file(p, prefix=f"{p.parent.name}_"), os.path.relpath(p, root))
            for p in other
        ]
        body.append("</section>")
    counts = {k: len(v) for k, v in found.items.items()}
    page = "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>specmoe report: {html.escape(root.name or str(root))}</title>",
            f"<style>{CSS}</style></head><body>",
            f'<header><h1>specmoe report</h1><p class="note">Results folder '
            f"<code>{html.escape(str(root))}</code>. Found: "
            + (
                ", ".join(f"{n} {html.escape(TITLES[k].lower())}" for k, n in counts.items())
                or "nothing specmoe writes"
            )
            + ".</p></header>",
            f"<nav><ul>{''.join(toc)}</ul></nav>",
            *body,
            '<footer><p class="note">Equation and table numbers refer to the papers specmoe '
            "implements (paper 002: expert bytes, kernel bandwidth and the best draft length; "
            "paper 000: the Oracle).</p></footer>",
            "</body></html>",
            "",
        ]
    )
    return page, figs.written, counts


def write_report(
    root: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    embed: bool = True,
    made_by: Mapping[str, str] | None = None,
) -> tuple[Path, list[Path], dict[str, int]]:
    """Write :func:`build_report`'s page to ``out`` (default ``root/report.html``)."""
    out = Path(out) if out is not None else Path(root) / "report.html"
    page, figures, counts = build_report(root, out, embed=embed, made_by=made_by)
    atomic_write_text(out, page)
    return out, figures, counts
