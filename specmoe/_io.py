"""Atomic file writes (write to a temporary name in the same folder, then rename) and JSON reads
with one-line errors.

An interrupted run never leaves a half-written file that a later read takes as whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` if the block succeeds.

    ``suffix`` defaults to the target's own suffix (numpy and pyarrow look at it).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.",
        suffix=(path.suffix if suffix is None else suffix) + ".tmp",
        dir=path.parent,
    )
    os.close(fd)
    tmp_path = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp makes 0600; give the usual file mode
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def atomic_write(path: str | os.PathLike, writer: Callable[[Path], Any]) -> Path:
    """Call ``writer(tmp_path)`` and rename the result onto ``path``."""
    with atomic_path(path) as tmp:
        writer(tmp)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write(path, lambda p: p.write_bytes(data))


def to_jsonable(obj: Any) -> Any:
    """Convert numpy scalars/arrays, dataclasses, Fractions and paths into JSON types.

    Non-finite floats become ``None`` (JSON has no NaN).
    """
    import dataclasses
    import math
    from fractions import Fraction

    import numpy as np

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.bool_ | bool):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, Fraction):
        obj = float(obj)
    if isinstance(obj, np.floating | float):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return obj


def dumps_json(obj: Any, *, indent: int | None = 2) -> str:
    return json.dumps(to_jsonable(obj), indent=indent)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, dumps_json(obj) + "\n")


def read_json(
    path: str | os.PathLike,
    what: str = "JSON file",
    *,
    label: str | None = None,
    argument: str | None = None,
) -> Any:
    """The JSON value in ``path``; a missing file or bad JSON is one ``InputError`` line:
    "LABEL: no such WHAT" or "LABEL: not a readable JSON WHAT (reason)" (LABEL: the path).
    ``argument``: the caller's argument that gave ``path``, carried by the error
    (``InputError.argument``) so that a command can name its flag."""
    from specmoe.errors import InputError

    p = Path(path)
    label = str(p) if label is None else label
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{label}: no such {what}", argument=argument) from None
    except (OSError, ValueError) as exc:
        raise InputError(
            f"{label}: not a readable JSON {what} ({exc})".splitlines()[0], argument=argument
        ) from None
