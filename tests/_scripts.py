"""Import a file of ``scripts/`` (or ``benchmarks/``) as a module, the way its own
``python scripts/X.py`` run sees it:
``scripts/`` on ``sys.path`` (a script imports its siblings) and the module in ``sys.modules``
under its file's name (its dataclasses look their module up)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str, folder: str = "scripts") -> ModuleType:
    """``<folder>/<name>.py`` (``scripts`` or ``benchmarks``) imported as the module ``name``."""
    sys.path.insert(0, str(ROOT / folder))
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
