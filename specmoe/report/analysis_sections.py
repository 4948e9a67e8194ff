"""The report sections of the analyses in :mod:`specmoe.analysis`: routing inertia of rejected
drafts (``inertia.json``, paper 003 Section 9.4 and Appendix H) and where the Oracle stops
(``stops.json``, paper 000 Appendix B).

:mod:`specmoe.report.html` finds these files (its ``JSON_KINDS``) and calls :func:`render` for
the kinds in :data:`KINDS`. Every value goes through ``html.escape``; a field a file lacks is
skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["KINDS", "render"]

KINDS = ("inertia", "stops")


def render(kind: str, path: Path, data: Any, figs, *, rel: str = "") -> str:
    from specmoe.report.html_sections import generic

    return generic(data)
