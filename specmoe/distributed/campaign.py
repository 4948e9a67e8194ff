"""Campaign units with declared resources, run here or as Ray tasks, gathered into one folder.

A :class:`Unit` is a callable ``func(folder, **kwargs) -> result`` (a JSON-able value) that
writes its files under ``folder``, with the CPUs, GPUs and custom Ray resources it needs.
:func:`run_campaign` runs every unit (in this process one after another, or as Ray tasks that
Ray places on nodes with the declared resources free) and gathers, into the campaign folder
``out``:

``out/<path>``                       every file a unit wrote, at the same path relative to its
                                     folder (two units writing one path: the second fails), so
                                     units that write ``verify.json``-style layouts build the
                                     folder ``specmoe validate`` and ``specmoe report`` read
``out/campaign-units/<unit>.json``   each finished unit's record (status, result, seconds,
                                     node, files, resources), written after its files
``out/campaign.json``                every unit's status, rewritten as units finish

A unit runs in a fresh temporary folder on its worker and its files travel back with its
result, so no shared file system is needed (``max_bytes`` caps one unit's files). Every file
is written atomically. A path that a unit writes into its JSON files or its result, inside its
own folder (a plan naming the profile it was built on), is relocated to the campaign folder:
the unit's folder prefix is replaced by ``out``'s, so the gathered files name each other where
they now are. Rerunning the same campaign skips units with a ``done`` record and
reruns the rest (failed, or cut off by a killed worker or driver) from the start. A unit that
needs more of a resource than the whole cluster has fails at once instead of waiting forever.

:func:`command_unit` makes a unit of one ``specmoe`` command line (``{out}`` in its arguments
is the unit's folder), run in a subprocess of the worker.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specmoe._io import atomic_write_bytes, atomic_write_json, read_json, to_jsonable
from specmoe.errors import InputError

__all__ = [
    "CampaignResult",
    "Unit",
    "UnitResult",
    "command_unit",
    "run_campaign",
    "run_specmoe_command",
    "run_unit",
]

RECORDS = "campaign-units"
MANIFEST = "campaign.json"
MAX_UNIT_BYTES = 1 << 30
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+-]{0,199}$")


@dataclass(frozen=True)
class Unit:
    """One unit of a campaign: ``func(folder, **kwargs)`` and the resources it needs.

    ``name``: unique in the campaign, letters, digits and ``._=+-`` (its record's file name).
    ``num_cpus``, ``num_gpus``: what Ray reserves for it (fractions allowed); ``resources``:
    custom Ray resources (e.g. ``{"H200": 1}``).
    """

    name: str
    func: Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise InputError(
                f"{self.name!r} must be 1-200 letters, digits or ._=+- (not first)",
                argument="name",
            )
        for key, v in (("num_cpus", self.num_cpus), ("num_gpus", self.num_gpus)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
                raise InputError(f"unit {self.name}: must be >= 0, got {v!r}", argument=key)
        for k, v in self.resources.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
                raise InputError(
                    f"unit {self.name}: {k} must be >= 0, got {v!r}", argument="resources"
                )

    @property
    def demands(self) -> dict[str, float]:
        """Ray's names for what the unit reserves (``CPU``, ``GPU``, custom)."""
        return {"CPU": float(self.num_cpus), "GPU": float(self.num_gpus), **self.resources}


@dataclass(frozen=True)
class UnitResult:
    """``status``: ``done`` (run now), ``skipped`` (done by an earlier run: its record's
    result) or ``failed`` (``error`` says why; it reruns next time)."""

    name: str
    status: str
    result: Any = None
    error: str | None = None
    seconds: float | None = None
    node: str | None = None
    files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CampaignResult:
    out: Path
    units: list[UnitResult]
    executor: str

    @property
    def failed(self) -> list[UnitResult]:
        return [u for u in self.units if u.status == "failed"]


# ------------------------------------------------------------------------------------------
# the task body: the same in this process and on a Ray worker


def run_unit(func: Callable[..., Any], kwargs: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """Run ``func(folder, **kwargs)`` in a fresh temporary folder; return its result, the
    files it wrote (``{relative path: bytes}``), its seconds and the node's name."""
    with tempfile.TemporaryDirectory(prefix="specmoe-unit-") as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        result = func(folder, **kwargs)
        seconds = time.perf_counter() - t0
        files: dict[str, bytes] = {}
        total = 0
        for path in sorted(folder.rglob("*")):
            if path.is_symlink() or not path.is_file():
                continue
            total += path.stat().st_size
            if total > max_bytes:
                raise InputError(f"wrote more than {max_bytes} bytes of files", argument="unit")
            files[path.relative_to(folder).as_posix()] = path.read_bytes()
        roots = sorted({str(folder), str(folder.resolve())}, key=len, reverse=True)
    return {
        "result": to_jsonable(result),
        "files": files,
        "seconds": seconds,
        "node": socket.gethostname(),
        "roots": roots,
    }


def relocate(value: Any, roots: Sequence[str], out: str) -> Any:
    """``value`` (JSON-able) with every string's prefix ``root`` (one of ``roots``, a unit's
    folder on its worker) replaced by ``out``, at a path boundary."""
    if isinstance(value, str):
        for root in roots:
            if value == root or value.startswith(root + "/"):
                return out + value[len(root) :]
        return value
    if isinstance(value, list):
        return [relocate(v, roots, out) for v in value]
    if isinstance(value, dict):
        return {k: relocate(v, roots, out) for k, v in value.items()}
    return value


def _relocate_file(rel: str, data: bytes, roots: Sequence[str], out: str) -> bytes:
    """A JSON file's bytes with the unit's folder relocated (other files, and JSON that does
    not name the folder or does not parse, unchanged)."""
    if not rel.endswith(".json") or not any(r.encode() in data for r in roots):
        return data
    import json

    try:
        doc = json.loads(data)
    except ValueError:
        return data
    moved = relocate(doc, roots, out)
    if moved == doc:
        return data
    text = json.dumps(moved, indent=2 if data.lstrip()[:2] in (b"{\n", b"[\n") else None)
    return (text + ("\n" if data.endswith(b"\n") else "")).encode()


def run_specmoe_command(folder: Path, *, argv: Sequence[str], threads: int | None = None) -> dict:
    """``specmoe ARGV`` in a subprocess, ``{out}`` in ARGV replaced by ``folder``; the result is
    its exit status and stdout (a ``--json`` record parsed). A non-zero status fails the unit."""
    args = [str(a).replace("{out}", str(folder)) for a in argv]
    env = dict(os.environ)
    if threads:
        env.update({"SPECMOE_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)})
    code = "import sys; from specmoe.cli import main; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"specmoe {' '.join(args)}: exit {proc.returncode}: {tail[0]}")
    import json

    try:
        out: Any = json.loads(proc.stdout)
    except ValueError:
        out = proc.stdout[-4000:]
    return {"exit": proc.returncode, "stdout": out}


def command_unit(
    name: str, argv: Sequence[str], *, num_cpus: float = 1.0, num_gpus: float = 0.0, **resources
) -> Unit:
    """A unit running ``specmoe ARGV`` (``{out}``: the unit's folder), its threads = its CPUs."""
    return Unit(
        name=name,
        func=run_specmoe_command,
        kwargs={"argv": [str(a) for a in argv], "threads": max(int(num_cpus), 1)},
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        resources=resources,
    )


# ------------------------------------------------------------------------------------------
# gathering


class _Gatherer:
    def __init__(self, out: Path, units: Sequence[Unit], executor: str):
        self.out, self.units, self.executor = out, {u.name: u for u in units}, executor
        self.results: dict[str, UnitResult] = {}
        self.owner: dict[str, str] = {}  # file -> unit that wrote it

    def record_path(self, name: str) -> Path:
        return self.out / RECORDS / f"{name}.json"

    def done_before(self, name: str) -> UnitResult | None:
        path = self.record_path(name)
        if not path.is_file():
            return None
        rec = read_json(path, what="campaign unit record")
        if not isinstance(rec, dict) or rec.get("status") != "done":
            return None
        for f in rec.get("files", []):
            self.owner.setdefault(f, name)
        return UnitResult(
            name=name,
            status="skipped",
            result=rec.get("result"),
            seconds=rec.get("seconds"),
            node=rec.get("node"),
            files=list(rec.get("files", [])),
        )

    def place(self, name: str, payload: dict[str, Any]) -> UnitResult:
        files = payload["files"]
        clash = [f for f in files if self.owner.get(f, name) != name]
        if clash:
            return self.fail(
                name, f"writes {clash[0]}, also written by unit {self.owner[clash[0]]}"
            )
        roots, dest = payload.get("roots", []), str(self.out.resolve())
        for rel, data in files.items():
            atomic_write_bytes(self.out / rel, _relocate_file(rel, data, roots, dest))
            self.owner[rel] = name
        res = UnitResult(
            name=name,
            status="done",
            result=relocate(payload["result"], roots, dest),
            seconds=payload["seconds"],
            node=payload["node"],
            files=sorted(files),
        )
        unit = self.units[name]
        atomic_write_json(self.record_path(name), {**to_jsonable(res), "resources": unit.demands})
        self.results[name] = res
        self.write_manifest()
        return res

    def fail(self, name: str, error: str) -> UnitResult:
        res = UnitResult(name=name, status="failed", error=error)
        self.results[name] = res
        self.record_path(name).unlink(missing_ok=True)
        self.write_manifest()
        return res

    def write_manifest(self) -> None:
        atomic_write_json(
            self.out / MANIFEST,
            {
                "executor": self.executor,
                "units": [
                    {
                        "name": n,
                        "status": self.results[n].status if n in self.results else "pending",
                        "error": self.results[n].error if n in self.results else None,
                        "seconds": self.results[n].seconds if n in self.results else None,
                        "node": self.results[n].node if n in self.results else None,
                        "resources": u.demands,
                    }
                    for n, u in self.units.items()
                ],
            },
        )


def _error_text(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None) or exc
    last = traceback.format_exception_only(type(cause), cause)[-1].strip()
    return last[:2000]


def run_campaign(
    units: Sequence[Unit],
    out: str | os.PathLike,
    *,
    executor: str = "local",
    resume: bool = True,
    max_bytes: int = MAX_UNIT_BYTES,
    progress: Callable[[UnitResult], None] | None = None,
) -> CampaignResult:
    """Run ``units`` and gather their files and results into ``out`` (see the module docstring).

    ``executor``: ``"local"`` (this process, one unit after another) or ``"ray"`` (one Ray task
    per unit with its declared resources, on the runtime of
    :func:`~specmoe.distributed.ray_runtime.ray_session`). ``resume``: skip units that a record
    in ``out`` says are done. ``progress(result)`` after each unit.
    """
    units = list(units)
    names = [u.name for u in units]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise InputError(f"two units are named {dup!r}", argument="units")
    if executor not in ("local", "ray"):
        raise InputError(f"must be 'local' or 'ray', got {executor!r}", argument="executor")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    g = _Gatherer(out, units, executor)
    todo: list[Unit] = []
    for u in units:
        prev = g.done_before(u.name) if resume else None
        if prev is not None:
            g.results[u.name] = prev
            if progress is not None:
                progress(prev)
        else:
            todo.append(u)
    g.write_manifest()

    def finish(res: UnitResult) -> None:
        if progress is not None:
            progress(res)

    if executor == "local":
        for u in todo:
            try:
                payload = run_unit(u.func, u.kwargs, max_bytes)
            except Exception as exc:
                finish(g.fail(u.name, _error_text(exc)))
                continue
            finish(g.place(u.name, payload))
    else:
        _run_on_ray(todo, g, max_bytes, finish)
    return CampaignResult(out=out, units=[g.results[n] for n in names], executor=executor)


def _run_on_ray(todo: list[Unit], g: _Gatherer, max_bytes: int, finish) -> None:
    from specmoe.distributed.ray_runtime import import_ray

    ray = import_ray("executor")
    have = ray.cluster_resources()
    task = ray.remote(run_unit)
    refs: dict[Any, str] = {}
    for u in todo:
        short = next(
            (
                f"needs {need:g} {key} but the cluster has {have.get(key, 0.0):g}"
                for key, need in u.demands.items()
                if need > have.get(key, 0.0)
            ),
            None,
        )
        if short is not None:
            finish(g.fail(u.name, short))
            continue
        opts: dict[str, Any] = {"num_cpus": u.num_cpus, "num_gpus": u.num_gpus, "max_retries": 1}
        if u.resources:
            opts["resources"] = dict(u.resources)
        refs[task.options(**opts).remote(u.func, u.kwargs, max_bytes)] = u.name
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            name = refs[ref]
            try:
                payload = ray.get(ref)
            except Exception as exc:
                finish(g.fail(name, _error_text(exc)))
                continue
            finish(g.place(name, payload))
