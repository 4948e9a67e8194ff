"""The dependency rule of DESIGN.md's "Layout", as two checks a test can run on any package.

``scan_imports`` reads the source (AST) and sees every import at any depth: ``import x`` and
``from x import y`` inside functions, classes, ``try`` and ``if`` blocks, relative imports
resolved against the file's package, ``from specmoe import engine`` as ``specmoe.engine``,
and the string literal of ``importlib.import_module("...")`` / ``__import__("...")``.

``walk_blocked`` imports every module of some packages (``pkgutil.walk_packages``) in a fresh
interpreter whose import system refuses the forbidden names, so a top-level import of one of
them, direct or through another module, fails the walk.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The numpy/scipy layers and what they must never import (DESIGN.md, "Layout").
GUARDED = (
    "specmoe.routing",
    "specmoe.cost",
    "specmoe.oracle",
    "specmoe.validate",
    "specmoe.formats",
)
FORBIDDEN = (
    "torch",
    "transformers",
    "matplotlib",
    "specmoe.kernels",
    "specmoe.bench",
    "specmoe.engine",
    "specmoe.engines",
    "specmoe.commands",
    "specmoe.report",
    "specmoe.cli",
)


def is_forbidden(name: str, forbidden: tuple[str, ...] = FORBIDDEN) -> bool:
    """Whether module ``name`` is one of ``forbidden`` or lies inside one of them."""
    return any(name == f or name.startswith(f + ".") for f in forbidden)


def _package_of(path: Path, root: Path) -> str:
    """The dotted package that holds the module file ``path`` (``root`` holds the top package)."""
    # a module's package and an __init__.py's package are both the folder that holds the file
    return ".".join(path.relative_to(root).parent.parts)


def _resolve(module: str | None, level: int, package: str) -> str:
    """The absolute name of ``from <level dots><module> import ...`` written in ``package``."""
    if level == 0:
        return module or ""
    base = package.split(".")
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


_DYNAMIC = {"import_module", "__import__"}


def imported_names(path: Path, root: Path) -> list[tuple[int, str]]:
    """Every module name the file at ``path`` imports, with its line, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _package_of(path, root)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module, node.level, package)
            found.append((node.lineno, base))
            # `from specmoe import engine` imports the module specmoe.engine
            found.extend((node.lineno, f"{base}.{a.name}") for a in node.names if a.name != "*")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in _DYNAMIC and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    target = arg.value
                    if target.startswith("."):
                        level = len(target) - len(target.lstrip("."))
                        target = _resolve(target.lstrip(".") or None, level, package)
                    found.append((node.lineno, target))
    return found


def scan_imports(
    packages: tuple[str, ...] = GUARDED,
    root: Path = ROOT,
    forbidden: tuple[str, ...] = FORBIDDEN,
) -> list[str]:
    """``file:line: imports NAME`` for every forbidden import in the source of ``packages``."""
    violations: list[str] = []
    for pkg in packages:
        folder = root.joinpath(*pkg.split("."))
        files = sorted(folder.rglob("*.py")) if folder.is_dir() else []
        if not files:
            violations.append(f"{pkg}: no source files under {folder}")
        for path in files:
            for line, name in imported_names(path, root):
                if is_forbidden(name, forbidden):
                    rel = path.relative_to(root)
                    violations.append(f"{rel}:{line}: imports {name}")
    return sorted(set(violations))


_WALK = r"""
import importlib, importlib.abc, json, pkgutil, sys

packages, forbidden = json.loads(sys.argv[1])

def blocked(name):
    return any(name == f or name.startswith(f + ".") for f in forbidden)

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if blocked(name):
            raise ImportError(f"blocked import of {name}")
        return None

sys.meta_path.insert(0, Block())
imported, failures = [], []
for pkg in packages:
    try:
        top = importlib.import_module(pkg)
    except Exception as exc:
        failures.append(f"{pkg}: {type(exc).__name__}: {exc}")
        continue
    imported.append(pkg)
    def onerror(name):
        exc = sys.exc_info()[1]
        failures.append(f"{name}: {type(exc).__name__}: {exc}")
    for info in pkgutil.walk_packages(getattr(top, "__path__", []), pkg + ".", onerror=onerror):
        try:
            importlib.import_module(info.name)
            imported.append(info.name)
        except Exception as exc:
            failures.append(f"{info.name}: {type(exc).__name__}: {exc}")
leaked = sorted(m for m in sys.modules if blocked(m))
print(json.dumps({"imported": imported, "failures": failures, "leaked": leaked}))
"""


def walk_blocked(
    packages: tuple[str, ...] = GUARDED,
    forbidden: tuple[str, ...] = FORBIDDEN,
    path: Path | None = None,
) -> dict:
    """Import every module of ``packages`` in a fresh interpreter that refuses ``forbidden``.

    Returns ``{"imported": [...], "failures": ["module: error", ...], "leaked": [...]}``;
    ``path`` goes first on ``sys.path`` (``ROOT`` when None).
    """
    env_path = str(path or ROOT)
    code = f"import sys; sys.path.insert(0, {env_path!r})\n" + _WALK
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps([list(packages), list(forbidden)])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=env_path,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the import walk crashed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
