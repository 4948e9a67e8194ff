"""Matplotlib plumbing shared by the figure modules: figures and atomic PNG writes.

Two styles: figures on their own Agg canvas (:func:`agg_subplots`, :func:`save_agg`; no pyplot
state, safe in any process), and pyplot figures (:func:`pyplot`, :func:`save_pyplot`, which
closes the figure). Every PNG is written through :func:`specmoe._io.atomic_path`, so a figure
is either complete on disk or absent.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specmoe._io import atomic_path

__all__ = ["agg_figure", "agg_subplots", "pyplot", "save_agg", "save_pyplot"]


def agg_figure(width: float = 6.0, height: float = 4.0, *, dpi: int = 120) -> Any:
    """An empty matplotlib Figure on its own Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def agg_subplots(
    rows: int = 1, cols: int = 1, *, width: float = 6.0, height: float = 4.0, dpi: int = 120
) -> tuple[Any, Any]:
    """(figure, axes [rows, cols]) on an Agg canvas."""
    fig = agg_figure(width, height, dpi=dpi)
    return fig, fig.subplots(rows, cols, squeeze=False)


def save_agg(fig: Any, path: str | os.PathLike) -> Path:
    """Lay out and write an Agg figure as PNG, atomically."""
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png")
    return Path(path)


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (unless a backend is already chosen)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save_pyplot(fig: Any, path: str | os.PathLike) -> Path:
    """Write a pyplot figure as PNG (130 dpi, tight box), atomically, and close it."""
    path = Path(path)
    try:
        with atomic_path(path, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=130, bbox_inches="tight", format="png")
    finally:
        pyplot().close(fig)
    return path
