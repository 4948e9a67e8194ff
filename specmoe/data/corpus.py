"""The bundled corpus: the Python standard library's own source files, split by a path hash.

The text is real and written by others: the ``.py`` files of the running interpreter's
standard library (``sysconfig.get_paths()["stdlib"]``). ``site-packages`` is excluded (it is
not the standard library), and so are the test trees (any path with a ``test``, ``tests`` or
``idle_test`` component): on CPython 3.11 they hold 19 MB against 12 MB for the rest, are
dominated by repetitive assertion code and fixtures, and the rest already holds more text
(about 3.5 million tokens) than the bundled model's training budget consumes. Files that are
not valid UTF-8 are excluded as well.

Split rule: ``h = int(sha256(rel_path).hexdigest(), 16) % 100`` on the file's POSIX path
relative to the stdlib root; ``h < 80`` is *train*, ``80 <= h < 90`` is *fit* and
``h >= 90`` is *validation*. Within a split, documents are ordered by their sha256 digest (a
fixed pseudo-random order, so a prefix of a split is a fair sample of it). The split is
recorded in ``split.json`` beside this module (:func:`build_split` writes it); at run time
:func:`documents` reads the listed files from the running interpreter's stdlib and skips, with
a warning on stderr, any that this interpreter lacks.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from specmoe.errors import InputError

__all__ = [
    "SPLITS",
    "build_split",
    "bundled_draft_dir",
    "bundled_model_dir",
    "bundled_trace_path",
    "documents",
    "split_of",
    "stdlib_root",
]

SPLITS: tuple[str, ...] = ("train", "fit", "validation")
# Upper bounds (exclusive) of ``h % 100`` for each split, in SPLITS order.
_BOUNDS: tuple[int, ...] = (80, 90, 100)
_EXCLUDED_PARTS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
)
RULE = (
    "h = int(sha256(relative POSIX path, utf-8).hexdigest(), 16) % 100; "
    "train if h < 80, fit if h < 90, else validation; within a split, ordered by the "
    "sha256 hex digest"
)
EXCLUSION = (
    "*.py under the stdlib root; excluded: any path with a component in "
    + ", ".join(sorted(_EXCLUDED_PARTS))
    + ", and files that are not valid UTF-8"
)


def _data_dir() -> Path:
    # The package data ships inside the installed package (pyproject: package-data data/**/*).
    return Path(str(resources.files("specmoe.data")))


def bundled_model_dir() -> Path:
    """The bundled tiny OLMoE (config.json, model.safetensors, tokenizer files)."""
    return _data_dir() / "tiny_olmoe"


def bundled_draft_dir() -> Path:
    """The bundled tiny dense draft model (same tokenizer as the bundled OLMoE)."""
    return _data_dir() / "tiny_draft"


def bundled_trace_path(split: str) -> Path:
    """The bundled routing trace of the bundled model on ``split`` ('fit' or 'validation')."""
    valid = ("fit", "validation")
    if split not in valid:
        raise InputError(
            f"{split!r} has no bundled trace (choose from {', '.join(valid)})", argument="split"
        )
    return _data_dir() / "traces" / f"{split}.npz"


def split_path() -> Path:
    return _data_dir() / "split.json"


def stdlib_root() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def _digest(rel: str) -> str:
    return hashlib.sha256(rel.encode("utf-8")).hexdigest()


def split_of(rel_path: str) -> str:
    """The split a file belongs to, from its POSIX path relative to the stdlib root."""
    h = int(_digest(rel_path), 16) % 100
    for name, bound in zip(SPLITS, _BOUNDS):
        if h < bound:
            return name
    raise AssertionError("unreachable")  # pragma: no cover


def _eligible(root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _EXCLUDED_PARTS)
        for fn in sorted(filenames):
            p = Path(dirpath) / fn
            if not fn.endswith(".py") or not p.is_file():
                continue
            try:
                p.read_bytes().decode("utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            out.append(p.relative_to(root).as_posix())
    return out


def build_split(root: Path | None = None) -> dict[str, Any]:
    """Scan the stdlib at ``root`` (default: this interpreter's) and return the split record.

    The record is what ``split.json`` holds: the python version, the root it was built from
    (for information only), the rule, the exclusions and the relative paths of each split.
    """
    root = stdlib_root() if root is None else Path(root)
    paths: dict[str, list[str]] = {s: [] for s in SPLITS}
    for rel in _eligible(root):
        paths[split_of(rel)].append(rel)
    for s in SPLITS:
        paths[s].sort(key=_digest)
    return {
        "python_version": ".".join(map(str, sys.version_info[:3])),
        "source": "python standard library (*.py)",
        "rule": RULE,
        "exclusion": EXCLUSION,
        "splits": paths,
    }


@cache
def _load_split() -> dict[str, Any]:
    path = split_path()
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputError(f"{path}: the corpus split record is missing") from exc


def split_paths(split: str) -> list[str]:
    """The relative paths of ``split`` as recorded in split.json (in document order)."""
    if split not in SPLITS:
        raise InputError(
            f"unknown split {split!r} (choose from {', '.join(SPLITS)})", argument="split"
        )
    return list(_load_split()["splits"][split])


def documents(
    split: str, *, limit_tokens: int | None = None, tokenizer: Any = None
) -> list[tuple[str, str]]:
    """The (name, text) documents of ``split``, read from this interpreter's stdlib.

    ``name`` is the path relative to the stdlib root. Files listed in split.json that this
    interpreter lacks (or cannot decode) are skipped with one warning on stderr.

    ``limit_tokens``: keep documents in split order until their total token count (by
    ``tokenizer``, default the bundled model's tokenizer, no special tokens) reaches
    ``limit_tokens``; the last document is cut at the end of the ``limit_tokens``-th token, so
    the total is ``limit_tokens`` (re-tokenizing a cut can differ by a token or so).
    """
    rels = split_paths(split)
    if limit_tokens is not None and (not isinstance(limit_tokens, int) or limit_tokens < 1):
        raise InputError(
            f"must be a positive integer, got {limit_tokens!r}", argument="limit_tokens"
        )
    root = stdlib_root()
    if limit_tokens is not None and tokenizer is None:
        tokenizer = _bundled_tokenizer()
    out: list[tuple[str, str]] = []
    missing: list[str] = []
    total = 0
    for rel in rels:
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            missing.append(rel)
            continue
        if not text:
            continue
        if limit_tokens is not None:
            enc = tokenizer.encode(text, add_special_tokens=False)
            need = limit_tokens - total
            if len(enc.ids) >= need:
                end = enc.offsets[need - 1][1]
                out.append((rel, text[:end]))
                total = limit_tokens
                break
            total += len(enc.ids)
        out.append((rel, text))
    if missing:
        print(
            f"specmoe: warning: {len(missing)} of {len(rels)} {split} documents are not in "
            f"this interpreter's stdlib ({root}), skipped (e.g. {missing[0]})",
            file=sys.stderr,
        )
    return out


@cache
def _bundled_tokenizer() -> Any:
    from tokenizers import Tokenizer

    path = bundled_model_dir() / "tokenizer.json"
    if not path.exists():
        raise InputError(f"{path}: the bundled tokenizer is missing")
    return Tokenizer.from_file(str(path))
