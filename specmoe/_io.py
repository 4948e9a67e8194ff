"""Atomic file writes (write to a temporary name in the same folder, sync, then rename), JSON
reads with one-line errors, and a lock that keeps a second writer out of an output folder.

An interrupted run never leaves a half-written file that a later read takes as whole, and a
power cut after the rename cannot leave an empty one (the data is synced before the rename, the
folder after it).
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
        _fsync(tmp_path)
        os.replace(tmp_path, path)
        _fsync(path.parent)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _fsync(path: Path) -> None:
    """Flush ``path`` (a file or a folder) to the disk; a folder that cannot be opened or
    synced (some file systems) is left as it is."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if not path.is_dir():
            raise
        return
    try:
        os.fsync(fd)
    except OSError:
        if not path.is_dir():
            raise
    finally:
        os.close(fd)


LOCK_NAME = ".specmoe.lock"


@contextlib.contextmanager
def out_lock(path: str | os.PathLike, *, argument: str | None = "out") -> Iterator[Path]:
    """Hold the folder ``path`` for one writer: ``with out_lock(out): ...``.

    Takes an exclusive ``fcntl.flock`` on ``path/.specmoe.lock`` (written with the owner's
    pid), creating ``path`` if needed. While another process holds it this raises
    ``InputError`` naming ``path`` and that pid (``argument``: the caller's argument that
    gave ``path``, so a command shows its flag). The kernel drops the lock when its owner
    dies, so a killed writer leaves no stale lock. On exit the lock file is removed, and
    ``path`` too when this call made it and nothing was written there.
    """
    import fcntl

    from specmoe.errors import InputError

    folder = Path(path)
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"{folder}: cannot make the folder ({exc.strerror})", argument=argument
        ) from None
    if not folder.is_dir():
        raise InputError(f"{folder}: exists and is not a folder", argument=argument)
    lock = folder / LOCK_NAME
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise InputError(
                f"{folder}: not writable ({exc.strerror})", argument=argument
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise InputError(
                f"{folder}: another specmoe process (pid {owner}) is writing there; wait "
                "for it or choose another folder",
                argument=argument,
            ) from None
        try:  # the file may have been removed by its last owner between open and flock
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield folder
    finally:
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
        os.close(fd)  # releases the flock
        if made:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty


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


def home_as_tilde(words: list[str]) -> list[str]:
    """``words`` with the user's home directory written ``~`` where a word starts with it: a
    record names no particular machine's paths (a word that only starts with the home's name
    is kept)."""
    home = os.path.expanduser("~").rstrip("/")
    return [("~" + a[len(home) :]) if home and a.startswith(home + "/") else a for a in words]


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, dumps_json(obj) + "\n")


JSON_LIMIT = 64 << 20  # bytes: the largest JSON file read whole, unless the caller gives less
JSON_DEPTH = 100  # the deepest nesting of lists and objects accepted in a JSON file


def _depth_ok(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > limit:
                return False
            stack.extend(
                (v, depth + 1) for v in (node.values() if isinstance(node, dict) else node)
            )
    return True


def parse_json(
    text: str | bytes, name: str, *, what: str = "JSON", argument: str | None = None
) -> Any:
    """``json.loads(text)``, nested at most :data:`JSON_DEPTH` deep; a failure is one
    ``InputError`` line naming ``name`` (a file, or a file and its field)."""
    from specmoe.errors import InputError

    try:
        value = json.loads(text)
    except RecursionError:
        value = None
        deep = True
    except ValueError as exc:
        raise InputError(
            f"{name}: not a readable {what} ({exc})".splitlines()[0], argument=argument
        ) from None
    else:
        deep = not _depth_ok(value, JSON_DEPTH)
    if deep:
        raise InputError(
            f"{name}: {what} nested deeper than the limit of {JSON_DEPTH} levels",
            argument=argument,
        )
    return value


def read_json(
    path: str | os.PathLike,
    what: str = "JSON file",
    *,
    label: str | None = None,
    argument: str | None = None,
    limit: int | None = None,
) -> Any:
    """The JSON value in ``path``, read to at most ``limit`` bytes (default
    :data:`JSON_LIMIT`, 64 MiB; a device such as ``/dev/zero`` is read to the limit and
    refused) and nested at most :data:`JSON_DEPTH` deep. Every failure is one ``InputError``
    line: "LABEL: no such WHAT", "LABEL: not a readable JSON WHAT (reason)", "LABEL: larger
    than the limit of ... MiB for a WHAT", ... (LABEL: the path). ``argument``: the caller's
    argument that gave ``path``, carried by the error (``InputError.argument``) so that a
    command can name its flag."""
    from specmoe.errors import InputError

    p = Path(path)
    label = str(p) if label is None else label
    cap = JSON_LIMIT if limit is None else limit
    try:
        with open(p, "rb") as fh:
            data = fh.read(cap + 1)
    except FileNotFoundError:
        raise InputError(f"{label}: no such {what}", argument=argument) from None
    except IsADirectoryError:
        raise InputError(f"{label}: is a directory, not a {what}", argument=argument) from None
    except OSError as exc:
        raise InputError(
            f"{label}: unreadable {what} ({exc.strerror})", argument=argument
        ) from None
    if len(data) > cap:
        raise InputError(
            f"{label}: larger than the limit of {cap >> 20} MiB for a {what}", argument=argument
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(
            f"{label}: not a readable JSON {what} (not UTF-8)", argument=argument
        ) from None
    return parse_json(text, label, what=f"JSON {what}", argument=argument)
