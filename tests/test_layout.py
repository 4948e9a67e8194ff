"""DESIGN.md's layout rules, checked: the numpy layers (routing, cost, oracle, validate, formats)
never import torch, transformers, matplotlib or the torch/CLI layers at any depth, and CLI code
(argparse, ``add_arguments``) lives only in ``specmoe/commands/`` and ``specmoe/cli.py``.

The dependency guard is two checks (``tests/_layout.py``): every module of those packages
imported with the forbidden names blocked, and a scan of their source that sees imports inside
functions and ``importlib.import_module("...")`` literals. Both are shown to fail on injected
violations."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from _layout import FORBIDDEN, GUARDED, ROOT, imported_names, scan_imports, walk_blocked


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package ``fakepkg`` under ``tmp_path`` with the given module sources."""
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""A package for the guard tests."""\n')
    for name, source in files.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.parent != pkg and not (path.parent / "__init__.py").exists():
            (path.parent / "__init__.py").write_text("")
        path.write_text(textwrap.dedent(source))
    return tmp_path


# --- the guard on the real packages ---------------------------------------------------------


def test_guarded_packages_import_with_torch_transformers_matplotlib_blocked():
    result = walk_blocked()
    assert result["failures"] == []
    assert result["leaked"] == []
    # every module file of every guarded package was imported
    expected = set()
    for pkg in GUARDED:
        folder = ROOT.joinpath(*pkg.split("."))
        for path in folder.rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            expected.add(".".join(parts))
    assert expected and set(result["imported"]) == expected


def test_guarded_sources_import_nothing_forbidden_at_any_depth():
    assert scan_imports() == []


def test_scanner_reads_every_guarded_file_and_sees_their_imports():
    # the scan is not vacuous: it parses the real files and finds their numpy/scipy imports
    names = set()
    for pkg in GUARDED:
        for path in ROOT.joinpath(*pkg.split(".")).rglob("*.py"):
            names |= {n for _, n in imported_names(path, ROOT)}
    assert "numpy" in names and any(n.startswith("scipy") for n in names)
    assert "specmoe.errors" in names


# --- the guard fails on injected violations -------------------------------------------------


def test_scanner_reports_imports_inside_functions(tmp_path):
    root = _package(
        tmp_path,
        {
            "lazy.py": "import numpy\n\ndef f():\n    import torch\n",
            "figs.py": "def g():\n    if True:\n        import matplotlib.pyplot as plt\n",
        },
    )
    found = scan_imports(("fakepkg",), root=root)
    assert found == [
        "fakepkg/figs.py:3: imports matplotlib.pyplot",
        "fakepkg/lazy.py:4: imports torch",
    ]


def test_scanner_reports_from_relative_and_dynamic_imports(tmp_path):
    root = _package(
        tmp_path,
        {
            "a.py": """\
                import importlib

                class C:
                    def m(self):
                        try:
                            from transformers import AutoModel
                        except ImportError:
                            pass

                def h():
                    return importlib.import_module("specmoe.engine.runner")

                def k():
                    return __import__("torch.nn")
                """,
            "b.py": "from specmoe import report\nfrom specmoe.cost import theory\n",
        },
    )
    found = scan_imports(("fakepkg",), root=root)
    assert "fakepkg/a.py:6: imports transformers" in found
    assert "fakepkg/a.py:11: imports specmoe.engine.runner" in found
    assert "fakepkg/a.py:14: imports torch.nn" in found
    assert "fakepkg/b.py:1: imports specmoe.report" in found
    assert not any("theory" in v for v in found)


def test_scanner_resolves_relative_imports_against_the_files_package(tmp_path):
    cost = tmp_path / "specmoe" / "cost"
    cost.mkdir(parents=True)
    (tmp_path / "specmoe" / "__init__.py").write_text("")
    (cost / "__init__.py").write_text("from . import rel\n")
    (cost / "rel.py").write_text(
        "from . import theory\nfrom ..routing import stats\n\n"
        "def f():\n    from ..engine import runner\n    from .. import bench\n"
    )
    found = scan_imports(("specmoe.cost",), root=tmp_path)
    assert found == [
        "specmoe/cost/rel.py:5: imports specmoe.engine",
        "specmoe/cost/rel.py:5: imports specmoe.engine.runner",
        "specmoe/cost/rel.py:6: imports specmoe.bench",
    ]


def test_scanner_allows_the_permitted_imports(tmp_path):
    root = _package(
        tmp_path,
        {
            "ok.py": """\
                import numpy as np
                from scipy import optimize
                from specmoe.errors import InputError

                def f():
                    import statsmodels.api as sm
                    from specmoe.routing import stats
                    return np, optimize, sm, stats, InputError
                """,
        },
    )
    assert scan_imports(("fakepkg",), root=root) == []


def test_walk_fails_on_a_top_level_torch_import(tmp_path):
    root = _package(tmp_path, {"bad.py": "import torch\n", "good.py": "import json\n"})
    result = walk_blocked(("fakepkg",), path=root)
    assert "fakepkg.good" in result["imported"]
    assert len(result["failures"]) == 1
    assert result["failures"][0].startswith("fakepkg.bad: ImportError: blocked import of torch")
    assert result["leaked"] == []


def test_walk_fails_on_a_blocked_import_through_another_module(tmp_path):
    # fakepkg.mid imports fakepkg.deep, which imports the CLI layer: both fail
    root = _package(
        tmp_path,
        {"mid.py": "from fakepkg import deep\n", "deep.py": "import specmoe.cli\n"},
    )
    result = walk_blocked(("fakepkg",), path=root)
    failed = sorted(f.split(":")[0] for f in result["failures"])
    assert failed == ["fakepkg.deep", "fakepkg.mid"]


def test_forbidden_list_covers_the_rule():
    assert {"torch", "transformers", "matplotlib"} <= set(FORBIDDEN)
    for layer in ("kernels", "bench", "engine", "engines", "commands", "report", "cli"):
        assert f"specmoe.{layer}" in FORBIDDEN


# --- CLI code lives only in commands/ -------------------------------------------------------


def _cli_code(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: what`` for each argparse import or ``add_arguments`` definition."""
    rel = path.relative_to(root).as_posix()
    lines = {
        line
        for line, name in imported_names(path, root)
        if name == "argparse" or name.startswith("argparse.")
    }
    out = [f"{rel}:{line}: imports argparse" for line in sorted(lines)]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name == "add_arguments"
        ):
            out.append(f"{rel}:{node.lineno}: defines add_arguments")
    return out


def test_cli_code_lives_only_in_commands():
    found, in_commands = [], []
    for path in sorted((ROOT / "specmoe").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        hits = _cli_code(path)
        if rel == "specmoe/cli.py" or rel.startswith("specmoe/commands/"):
            in_commands += hits
        else:
            found += hits
    assert found == []
    # the check sees CLI code where it does live
    assert any("specmoe/cli.py" in h and "argparse" in h for h in in_commands)
    assert any("specmoe/commands/plan.py" in h and "add_arguments" in h for h in in_commands)


def test_cli_check_sees_argparse_and_add_arguments_inside_functions(tmp_path):
    pkg = tmp_path / "specmoe" / "cost"
    pkg.mkdir(parents=True)
    bad = pkg / "bad.py"
    bad.write_text(
        "def add_arguments(p):\n    pass\n\ndef g():\n    from argparse import ArgumentParser\n"
    )
    assert _cli_code(bad, tmp_path) == [
        "specmoe/cost/bad.py:5: imports argparse",
        "specmoe/cost/bad.py:1: defines add_arguments",
    ]
