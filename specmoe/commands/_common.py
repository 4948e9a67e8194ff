"""Checks every command makes before it computes: ``--out`` can be written, seeds and counts
are in range, a read file is a bounded regular file. Each failure is one ``InputError`` line
naming the flag (exit 2). :func:`out_folder` also holds an output folder against a second
writer for as long as the command runs."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from specmoe.errors import InputError

SEED_LIMIT = 2**63  # numpy and torch both take seeds in [0, 2**63)
MAX_TEXT_BYTES = 64 << 20  # the largest small input (draft-time table, STATS) read whole


def _prove_writable(folder: Path, flag: str, shown: str) -> None:
    """Create and remove a temporary folder in ``folder`` (as root, os.access proves nothing)."""
    try:
        probe = tempfile.mkdtemp(prefix=".specmoe-probe-", dir=folder)
        os.rmdir(probe)
    except OSError as exc:
        raise InputError(f"{flag}: {shown}: cannot write in {folder} ({exc.strerror})") from None


def _existing_ancestor(path: Path, flag: str, shown: str) -> Path:
    parent = path
    while not parent.exists():
        if parent.is_symlink():  # a dangling link
            raise InputError(f"{flag}: {shown}: {parent} is a broken link")
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"{flag}: {shown}: {parent} is not a directory")
    return parent


def _refuse_proc(path: Path, flag: str, shown: str) -> None:
    parts = path.absolute().parts
    if len(parts) > 1 and parts[1] in ("proc", "sys"):
        raise InputError(f"{flag}: {shown}: /{parts[1]} is not a place for results")


def check_out_dir(path: str | os.PathLike | None, flag: str = "--out") -> Path | None:
    """``path`` is a directory that exists and can be written, or can be made: refuses an
    existing file, /proc and /sys, and parents that cannot be written. Creates nothing."""
    if path is None:
        return None
    p = Path(path)
    _refuse_proc(p, flag, str(path))
    if p.exists() and not p.is_dir():
        raise InputError(f"{flag}: {path}: exists and is not a directory")
    _prove_writable(_existing_ancestor(p, flag, str(path)), flag, str(path))
    return p


@contextlib.contextmanager
def out_folder(path: str | os.PathLike | None, flag: str = "--out") -> Iterator[Path | None]:
    """``with out_folder(args.out): ...``: :func:`check_out_dir`, then the folder is held for
    this process alone (:func:`specmoe._io.out_lock`) until the block ends: a second writer
    exits 2 naming ``flag`` before it computes anything. ``None`` (no folder) holds nothing."""
    from specmoe._io import out_lock

    if path is None:
        yield None
        return
    check_out_dir(path, flag)
    with contextlib.ExitStack() as stack:
        try:
            folder = stack.enter_context(out_lock(path, argument=None))
        except InputError as exc:
            raise InputError(f"{flag}: {exc.message}") from None
        yield folder


def check_out_file(path: str | os.PathLike | None, flag: str = "--out") -> Path | None:
    """``path`` is a file name that can be written (replaced atomically): refuses a directory,
    /proc and /sys, and folders that cannot be written. Creates nothing."""
    if path is None:
        return None
    p = Path(path)
    _refuse_proc(p, flag, str(path))
    if p.is_dir():
        raise InputError(f"{flag}: {path}: is a directory, expected a file name")
    if p.exists() and not p.is_file():
        raise InputError(f"{flag}: {path}: exists and is not a regular file")
    _prove_writable(_existing_ancestor(p.parent, flag, str(path)), flag, str(path))
    return p


def check_seed(seed: int, flag: str = "--seed") -> None:
    if not 0 <= seed < SEED_LIMIT:
        raise InputError(f"{flag}: must be in 0..2**63-1, got {seed}")


def check_int(value: int | None, flag: str, *, low: int, high: int | None = None) -> None:
    """``low <= value <= high`` (``None`` passes: the default applies)."""
    if value is None:
        return
    if value < low or (high is not None and value > high):
        rng = f">= {low}" if high is None else f"in {low}..{high}"
        raise InputError(f"{flag}: must be {rng}, got {value}")


def check_at_most(value: int | None, flag: str, high: int) -> None:
    """A resource limit only (the low end is the library's own check)."""
    if value is not None and value > high:
        raise InputError(f"{flag}: must be at most {high}, got {value}")


def check_float(value: float, flag: str, *, low: float, high: float, closed: str = "[]") -> None:
    """A finite ``value`` in the interval; ``closed`` says which ends belong to it."""
    ok = math.isfinite(value)
    ok = ok and (value >= low if closed[0] == "[" else value > low)
    ok = ok and (value <= high if closed[1] == "]" else value < high)
    if not ok:
        raise InputError(
            f"{flag}: must be a number in {closed[0]}{low:g}, {high:g}{closed[1]}, got {value}"
        )


def check_small_file(path: str | os.PathLike, flag: str, *, limit: int = MAX_TEXT_BYTES) -> Path:
    """``path`` is a regular file of at most ``limit`` bytes (not a folder, device or pipe)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{flag}: {path}: no such file")
    if not p.is_file():
        raise InputError(f"{flag}: {path}: not a regular file")
    size = p.stat().st_size
    if size > limit:
        raise InputError(f"{flag}: {path}: {size} bytes, more than the {limit >> 20} MiB limit")
    return p


def add_runs_argument(parser) -> None:
    """``--runs DIR``: the round logs that ``oracle`` and ``policy`` read."""
    parser.add_argument(
        "--runs",
        required=True,
        metavar="DIR",
        help="round logs: a Parquet file or a directory of them",
    )
