"""The measurements ``specmoe validate`` scores: one :class:`Measured` per configuration.

A configuration is one model at one context depth on one engine and device (paper 002
Section 4). Its measurements are those of Section 4: the whole-model verify time with
deduplication off and on at n = 1..n_max, and the throughput of speculative decoding with the
oracle draft at draft lengths k = 0..k_max and several acceptance values.

A runs folder holds them as JSON (times in ms, throughput in tokens per second):

``verify.json``::

    {"model": NAME, "device": "cpu", "engine": "specmoe",
     "configurations": [{"depth": 512, "n": [1, ..., 9],
                         "verify_ms": {"off": [...], "on": [...]},          # medians [n]
                         "per_prompt_ms": {"off": [[...]], "on": [[...]]},  # optional [P, n]
                         "draft_ms": [h(0), ..., h(k_max)]}, ...]}           # optional

``throughput.json``::

    {"model": NAME, "configurations": [{"depth": 512, "k": [0, ..., 8],
        "acceptance": [0.2, ..., 0.98], "tokens_per_s": [[...]],            # [A, K]
        "dedup": true}, ...]}

``dedup`` says whether the throughput runs verified with deduplication on (the default, as in
paper 002) or off; it picks the kernel of the predicted step time. Each configuration may also
carry ``"name"``, ``"device"`` and ``"engine"``. A single object with the fields of one
configuration (no ``configurations`` list) is one configuration. Any problem is a one-line
``InputError`` naming the file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.errors import InputError

__all__ = ["THROUGHPUT_FILE", "VERIFY_FILE", "Measured", "load_runs"]

VERIFY_FILE = "verify.json"
THROUGHPUT_FILE = "throughput.json"


@dataclass(frozen=True)
class Measured:
    """One configuration's measurements. Shapes: ``n`` pass sizes 1..n_max, ``P`` prompts,
    ``A`` acceptance values, ``K`` draft lengths 0..k_max."""

    name: str
    model: str
    depth: int
    device: str
    engine: str
    n: list[int]
    verify_off_ms: np.ndarray  # [n]
    verify_on_ms: np.ndarray  # [n]
    per_prompt_off_ms: np.ndarray | None  # [P, n]
    per_prompt_on_ms: np.ndarray | None  # [P, n]
    draft_ms: np.ndarray | None  # [K]
    acceptance: list[float]  # [A]
    k: list[int]  # [K]
    throughput: np.ndarray  # [A, K] tokens/s
    throughput_dedup: bool = True
    sources: dict[str, str] = field(default_factory=dict)


def _read_json(path: Path) -> Any:
    from specmoe._io import read_json

    return read_json(path, "runs file")


def _array(path: Path, name: str, v: Any, ndim: int, *, positive: bool = True) -> np.ndarray:
    try:
        a = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{path}: {name} is not an array of numbers") from None
    if a.ndim != ndim or a.size == 0:
        raise InputError(f"{path}: {name} must be a non-empty {ndim}-d array, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise InputError(f"{path}: {name} holds a non-finite value")
    if positive and np.any(a <= 0):
        raise InputError(f"{path}: {name} must be positive")
    if not positive and np.any(a < 0):
        raise InputError(f"{path}: {name} must be non-negative")
    return a


def _configs(path: Path, d: Any) -> tuple[dict, list[dict]]:
    if not isinstance(d, dict):
        raise InputError(f"{path}: must be a JSON object")
    cfgs = d.get("configurations", [d])
    if not isinstance(cfgs, list) or not cfgs or not all(isinstance(c, dict) for c in cfgs):
        raise InputError(f"{path}: configurations must be a non-empty list of objects")
    return d, cfgs


def _depth(path: Path, c: dict) -> int:
    dep = c.get("depth", c.get("context"))
    if isinstance(dep, bool) or not isinstance(dep, int) or dep < 0:
        raise InputError(f"{path}: each configuration needs an integer depth, got {dep!r}")
    return dep


def load_runs(runs: str | Path) -> list[Measured]:
    """Every configuration of the runs folder ``runs``, matched by depth (and name, when given)
    between ``verify.json`` and ``throughput.json``. A folder without them reads each
    sub-folder that has both (one folder per model, as ``scripts/measure_runs.py`` writes
    them). A missing or incomplete folder is an error in the argument ``runs``; an error
    inside a file names the file."""
    folder = Path(runs)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder", argument="runs")
    if not (folder / VERIFY_FILE).exists():
        subs = [
            d
            for d in sorted(folder.iterdir())
            if d.is_dir() and (d / VERIFY_FILE).is_file() and (d / THROUGHPUT_FILE).is_file()
        ]
        if subs:
            return [m for d in subs for m in _load_folder(d)]
    return _load_folder(folder)


def _load_folder(folder: Path) -> list[Measured]:
    vpath, tpath = folder / VERIFY_FILE, folder / THROUGHPUT_FILE
    for p in (vpath, tpath):
        if not p.is_file():
            raise InputError(
                f"{folder}: has no {p.name} (expected {VERIFY_FILE} and {THROUGHPUT_FILE})",
                argument="runs",
            )
    vtop, vcfgs = _configs(vpath, _read_json(vpath))
    ttop, tcfgs = _configs(tpath, _read_json(tpath))
    vm, tm = vtop.get("model"), ttop.get("model")
    if vm and tm and vm != tm:
        raise InputError(
            f"{folder}: {VERIFY_FILE} is for model {vm!r} but {THROUGHPUT_FILE} for {tm!r}",
            argument="runs",
        )
    thr: dict[tuple, dict] = {}
    for c in tcfgs:
        key = (_depth(tpath, c), c.get("name"))
        if key in thr:
            raise InputError(f"{tpath}: two configurations at depth {key[0]}")
        thr[key] = c
    out = []
    for c in vcfgs:
        depth = _depth(vpath, c)
        name = c.get("name")
        t = thr.get((depth, name)) or (thr.get((depth, None)) if name is not None else None)
        if t is None:
            raise InputError(
                f"{tpath}: no throughput runs for the configuration at depth "
                f"{depth}" + (f" ({name})" if name else "")
            )
        n = c.get("n")
        if (
            not isinstance(n, list)
            or not n
            or any(isinstance(x, bool) or not isinstance(x, int) for x in n)
            or n != list(range(1, len(n) + 1))
        ):
            raise InputError(f"{vpath}: n must be the pass sizes 1, 2, ..., n_max")
        vms = c.get("verify_ms")
        if not isinstance(vms, dict) or "off" not in vms or "on" not in vms:
            raise InputError(f"{vpath}: verify_ms must give 'off' and 'on' (deduplication)")
        off = _array(vpath, "verify_ms.off", vms["off"], 1)
        on = _array(vpath, "verify_ms.on", vms["on"], 1)
        if off.size != len(n) or on.size != len(n):
            raise InputError(f"{vpath}: verify_ms needs one time per pass size ({len(n)})")
        pp = c.get("per_prompt_ms")
        pp_off = pp_on = None
        if pp is not None:
            if not isinstance(pp, dict) or "off" not in pp or "on" not in pp:
                raise InputError(f"{vpath}: per_prompt_ms must give 'off' and 'on'")
            pp_off = _array(vpath, "per_prompt_ms.off", pp["off"], 2)
            pp_on = _array(vpath, "per_prompt_ms.on", pp["on"], 2)
            if pp_off.shape != pp_on.shape or pp_off.shape[1] != len(n):
                raise InputError(
                    f"{vpath}: per_prompt_ms off and on must both be [prompts, {len(n)}]"
                )
        ks = t.get("k")
        if not isinstance(ks, list) or len(ks) < 2 or ks != list(range(len(ks))):
            raise InputError(f"{tpath}: k must be the draft lengths 0, 1, ..., k_max")
        acc = t.get("acceptance")
        if (
            not isinstance(acc, list)
            or not acc
            or any(
                isinstance(a, bool)
                or not isinstance(a, int | float)
                or not math.isfinite(a)
                or not 0 <= a < 1
                for a in acc
            )
        ):
            raise InputError(f"{tpath}: acceptance must be a list of values in [0, 1)")
        T = _array(tpath, "tokens_per_s", t.get("tokens_per_s"), 2)
        if T.shape != (len(acc), len(ks)):
            raise InputError(
                f"{tpath}: tokens_per_s must be [{len(acc)} acceptance values, "
                f"{len(ks)} draft lengths], got {list(T.shape)}"
            )
        h = c.get("draft_ms", t.get("draft_ms"))
        if h is not None:
            h = _array(vpath, "draft_ms", h, 1, positive=False)
            if h.size < len(ks):
                raise InputError(f"{vpath}: draft_ms needs h(k) for k = 0..{len(ks) - 1}")
            h = h[: len(ks)]
        model = str(c.get("model") or vm or tm or "")
        device = str(c.get("device") or vtop.get("device") or "")
        engine = str(c.get("engine") or vtop.get("engine") or "")
        label = name or " ".join(x for x in (model, engine, device, f"d={depth}") if x)
        out.append(
            Measured(
                name=label,
                model=model,
                depth=depth,
                device=device,
                engine=engine,
                n=list(n),
                verify_off_ms=off,
                verify_on_ms=on,
                per_prompt_off_ms=pp_off,
                per_prompt_on_ms=pp_on,
                draft_ms=h,
                acceptance=[float(a) for a in acc],
                k=list(ks),
                throughput=T,
                throughput_dedup=bool(t.get("dedup", True)),
                sources={"verify": str(vpath), "throughput": str(tpath)},
            )
        )
    names = [m.name for m in out]
    if len(set(names)) != len(names):
        raise InputError(f"{folder}: two configurations share a name", argument="runs")
    return out
