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

An engine with one expert kernel, a deduplicating one (llama.cpp's CPU MUL_MAT_ID groups a
pass's rows by expert), has no per-slot setting to time: its ``verify_ms`` (and
``per_prompt_ms``, ``per_prompt_repeats_ms``) give ``"on"`` alone, ``verify_off_ms`` (and the
other per-slot arrays) are then None, and its throughput runs must say ``"dedup": true``.
``Measured.kernels`` names the settings a configuration has; the scores that need both (the
saving, the crossover, the calibrated version) are not scored on such runs.

Samples for the whole-pass scoring (docs/runs-protocol-whole-pass.md), all optional; files
without them load and score as before:

* ``verify.json`` configuration: ``"prompts": [ids]`` (one per row of ``per_prompt_ms``), and
  ``"per_prompt_repeats_ms": {"off": [P][n][R], "on": [P][n][R]}``, each recorded repetition
  of each prompt's pass time. ``per_prompt_ms`` then holds each prompt's median over its
  repetitions (it is derived from the repetitions when absent, and must agree with them when
  given).
* ``throughput.json`` configuration: ``"prompts": [ids]`` and ``"per_prompt_tokens_per_s":
  [A][K][P][R]``, each generation's tokens per second (acceptance value, draft length, prompt,
  repeat); the k = 0 column holds the same k = 0 generations at every acceptance value.
  ``tokens_per_s`` [A, K] stays (the median over prompts x repeats).
* ``throughput.json`` configuration: ``"per_prompt_round_verify_ms": [A][K][P][R]``, each of
  those generations' median verification-pass time (the pass that verifies k drafted tokens,
  n = k + 1), laid out as ``per_prompt_tokens_per_s``. :func:`rounds_verify_side` makes the
  verify side of a rule set whose ``definitions.measured.verify_side`` is ``"rounds"`` from it.

The cache lengths the passes ran at, both optional (then the whole-pass version is summed at
the configuration's depth, as before): ``"context_len"`` in a ``verify.json`` configuration,
the tokens cached before each timed pass (``depth - 1`` in
:func:`specmoe.engine.measure.verify_passes`), and ``"tokens"`` in a ``throughput.json``
configuration, the tokens each generation adds after its prompt, so that its passes run at
cache lengths ``context_len`` up to ``context_len + tokens``. An engine whose passes read a
padded KV view (``kv_pad`` in the profile's ``whole_pass``) costs a step by the cells it reads.

The innermost lists (repetitions) may differ in length between prompts; the arrays are padded
with NaN there. A campaign record ``runs_campaign.json`` in the folder of the model folders (or
in a model folder itself) may carry ``"predictions": {"<model folder name>": {"plan": PATH,
"plan_sha256": HEX, "profile": PATH, "profile_sha256": HEX}}``, the prediction committed before
that folder's runs: :func:`recorded_prediction` reads it, and ``specmoe validate`` refuses to
score another plan or profile against those runs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.errors import InputError

__all__ = [
    "CAMPAIGN_FILE",
    "THROUGHPUT_FILE",
    "VERIFY_FILE",
    "Measured",
    "RecordedPrediction",
    "load_runs",
    "recorded_prediction",
    "rounds_verify_side",
]

VERIFY_FILE = "verify.json"
THROUGHPUT_FILE = "throughput.json"
CAMPAIGN_FILE = "runs_campaign.json"


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
    verify_off_ms: np.ndarray | None  # [n]; None on an engine with the dedup kernel alone
    verify_on_ms: np.ndarray  # [n]
    per_prompt_off_ms: np.ndarray | None  # [P, n]
    per_prompt_on_ms: np.ndarray | None  # [P, n]
    draft_ms: np.ndarray | None  # [K]
    acceptance: list[float]  # [A]
    k: list[int]  # [K]
    throughput: np.ndarray  # [A, K] tokens/s
    throughput_dedup: bool = True
    sources: dict[str, str] = field(default_factory=dict)
    verify_prompts: tuple[str, ...] | None = None  # [P] ids of per_prompt_ms's rows
    per_prompt_repeats_off_ms: np.ndarray | None = None  # [P, n, R], NaN-padded
    per_prompt_repeats_on_ms: np.ndarray | None = None  # [P, n, R], NaN-padded
    throughput_prompts: tuple[str, ...] | None = None  # [P_t]
    per_prompt_tokens_per_s: np.ndarray | None = None  # [A, K, P_t, R], NaN-padded
    context_len: int | None = None  # tokens cached before each timed verify pass
    throughput_tokens: int | None = None  # tokens each throughput generation adds
    per_prompt_round_verify_ms: np.ndarray | None = None  # [A, K, P_t, R], NaN-padded

    @property
    def kernels(self) -> tuple[str, ...]:
        """The kernel settings timed: ("per_slot", "dedup"), or ("dedup",) alone."""
        return ("dedup",) if self.verify_off_ms is None else ("per_slot", "dedup")


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


def _samples(path: Path, name: str, v: Any, lead: tuple[int, ...]) -> np.ndarray:
    """[*lead, R] from nested lists of shape ``lead`` whose innermost lists (the repetitions,
    at least one positive finite number each) may differ in length: padded with NaN."""
    cells: list[list[float]] = []

    def walk(x: Any, depth: int, where: str) -> None:
        if not isinstance(x, list):
            raise InputError(f"{path}: {name}{where} is not a list")
        if depth == len(lead):
            if not x or any(isinstance(y, bool) or not isinstance(y, int | float) for y in x):
                raise InputError(f"{path}: {name}{where} must be a non-empty list of numbers")
            if not all(math.isfinite(y) and y > 0 for y in x):
                raise InputError(f"{path}: {name}{where} must hold positive finite numbers")
            cells.append([float(y) for y in x])
            return
        if len(x) != lead[depth]:
            raise InputError(
                f"{path}: {name} must be [{', '.join(map(str, lead))}, repeats], got "
                f"{len(x)} entries at level {depth + 1}{where and ' (' + where.strip() + ')'}"
            )
        for i, y in enumerate(x):
            walk(y, depth + 1, f"{where}[{i}]")

    walk(v, 0, "")
    r = max(len(c) for c in cells)
    out = np.full((len(cells), r), np.nan)
    for i, c in enumerate(cells):
        out[i, : len(c)] = c
    return out.reshape(*lead, r)


def _prompts(path: Path, v: Any, count: int | None) -> tuple[str, ...] | None:
    """The prompt ids (strings or integers, distinct), ``count`` of them when given."""
    if v is None:
        return None
    if (
        not isinstance(v, list)
        or not v
        or any(isinstance(x, bool) or not isinstance(x, str | int) for x in v)
    ):
        raise InputError(f"{path}: prompts must be a non-empty list of ids (strings or integers)")
    ids = tuple(str(x) for x in v)
    if len(set(ids)) != len(ids):
        raise InputError(f"{path}: prompts holds an id twice")
    if count is not None and len(ids) != count:
        raise InputError(f"{path}: prompts names {len(ids)} prompts, the samples have {count}")
    return ids


def _second_level(v: Any) -> int:
    """The prompt count of [A][K][P][R] samples without a prompts list (0 when malformed;
    :func:`_samples` then names the problem)."""
    try:
        return len(v[0][0])
    except (TypeError, IndexError, KeyError):
        return 0


def _verify_samples(
    vpath: Path,
    c: dict,
    n: int,
    pp_off: np.ndarray | None,
    pp_on: np.ndarray | None,
    keys: tuple[str, ...] = ("off", "on"),
) -> tuple[np.ndarray | None, ...]:
    """(per_prompt_off [P, n], per_prompt_on, repeats_off [P, n, R], repeats_on): the
    per-prompt medians derived from ``per_prompt_repeats_ms`` when absent, and checked
    against it when given (relative 1e-6, for rounding in the file). ``keys``: the settings
    the file gives (``("on",)`` alone: the off entries are None)."""
    rep = c.get("per_prompt_repeats_ms")
    if rep is None:
        return pp_off, pp_on, None, None
    if not isinstance(rep, dict) or any(k not in rep for k in keys):
        raise InputError(
            f"{vpath}: per_prompt_repeats_ms must give {' and '.join(map(repr, keys))}, "
            "as verify_ms does"
        )
    P = len(rep["on"]) if isinstance(rep["on"], list) else 0
    if pp_on is not None:
        P = pp_on.shape[0]
    r = {k: _samples(vpath, f"per_prompt_repeats_ms.{k}", rep[k], (P, n)) for k in keys}
    med = {k: np.nanmedian(v, axis=2) for k, v in r.items()}
    if pp_on is None:
        return med.get("off"), med["on"], r.get("off"), r["on"]
    given = {"off": pp_off, "on": pp_on}
    for kernel, got, want in ((k, given[k], med[k]) for k in keys):
        if not np.allclose(got, want, rtol=1e-6, atol=0.0):
            i = np.unravel_index(np.argmax(np.abs(got - want) / want), got.shape)
            raise InputError(
                f"{vpath}: per_prompt_ms.{kernel}[{i[0]}][{i[1]}] = {got[i]:.6g} is not the "
                f"median of per_prompt_repeats_ms.{kernel}[{i[0]}][{i[1]}] ({want[i]:.6g})"
            )
    return pp_off, pp_on, r.get("off"), r["on"]


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
        if not isinstance(vms, dict) or "on" not in vms:
            raise InputError(
                f"{vpath}: verify_ms must give 'off' and 'on' (deduplication), or 'on' alone"
            )
        keys = ("off", "on") if "off" in vms else ("on",)  # ("on",): one, deduplicating kernel
        on = _array(vpath, "verify_ms.on", vms["on"], 1)
        off = _array(vpath, "verify_ms.off", vms["off"], 1) if "off" in vms else None
        if on.size != len(n) or (off is not None and off.size != len(n)):
            raise InputError(f"{vpath}: verify_ms needs one time per pass size ({len(n)})")
        pp = c.get("per_prompt_ms")
        pp_off = pp_on = None
        if pp is not None:
            if not isinstance(pp, dict) or any(k not in pp for k in keys):
                raise InputError(
                    f"{vpath}: per_prompt_ms must give {' and '.join(map(repr, keys))}, "
                    "as verify_ms does"
                )
            pp_on = _array(vpath, "per_prompt_ms.on", pp["on"], 2)
            if "off" in keys:
                pp_off = _array(vpath, "per_prompt_ms.off", pp["off"], 2)
            if pp_on.shape[1] != len(n) or (pp_off is not None and pp_off.shape != pp_on.shape):
                raise InputError(
                    f"{vpath}: per_prompt_ms {' and '.join(keys)} must be [prompts, {len(n)}]"
                )
        pp_off, pp_on, rep_off, rep_on = _verify_samples(vpath, c, len(n), pp_off, pp_on, keys)
        v_ids = _prompts(vpath, c.get("prompts"), None if pp_on is None else pp_on.shape[0])
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
        t_ids = _prompts(tpath, t.get("prompts"), None)
        samples = t.get("per_prompt_tokens_per_s")
        if samples is not None:
            P_t = len(t_ids) if t_ids is not None else _second_level(samples)
            samples = _samples(tpath, "per_prompt_tokens_per_s", samples, (len(acc), len(ks), P_t))
        rounds = t.get("per_prompt_round_verify_ms")
        if rounds is not None:
            if samples is None:
                raise InputError(
                    f"{tpath}: per_prompt_round_verify_ms needs per_prompt_tokens_per_s "
                    "(the generations it belongs to)"
                )
            rounds = _samples(tpath, "per_prompt_round_verify_ms", rounds, samples.shape[:3])
            if rounds.shape != samples.shape or not np.array_equal(
                np.isnan(rounds), np.isnan(samples)
            ):
                raise InputError(
                    f"{tpath}: per_prompt_round_verify_ms must hold one time per generation "
                    "of per_prompt_tokens_per_s"
                )
        if off is None and not bool(t.get("dedup", True)):
            raise InputError(
                f"{tpath}: throughput runs with deduplication off need verify_ms.off in {vpath}"
            )
        h = c.get("draft_ms", t.get("draft_ms"))
        if h is not None:
            h = _array(vpath, "draft_ms", h, 1, positive=False)
            if h.size < len(ks):
                raise InputError(f"{vpath}: draft_ms needs h(k) for k = 0..{len(ks) - 1}")
            h = h[: len(ks)]
        ctx, gen = c.get("context_len"), t.get("tokens")
        if ctx is not None and (isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 0):
            raise InputError(f"{vpath}: context_len must be an integer >= 0, got {ctx!r}")
        if gen is not None and (isinstance(gen, bool) or not isinstance(gen, int) or gen < 1):
            raise InputError(f"{tpath}: tokens must be an integer >= 1, got {gen!r}")
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
                verify_prompts=v_ids,
                per_prompt_repeats_off_ms=rep_off,
                per_prompt_repeats_on_ms=rep_on,
                throughput_prompts=t_ids,
                per_prompt_tokens_per_s=samples,
                context_len=ctx,
                throughput_tokens=gen,
                per_prompt_round_verify_ms=rounds,
            )
        )
    names = [m.name for m in out]
    if len(set(names)) != len(names):
        raise InputError(f"{folder}: two configurations share a name", argument="runs")
    return out


def rounds_verify_side(m: Measured) -> Measured:
    """``m`` with its verify side taken from the speculative rounds' own passes
    (``rules-llamacpp-rounds.json``, ``definitions.measured.tau``): for each throughput prompt
    and n = 1..k_max + 1, the repetitions are the medians of the verification passes of every
    oracle generation at k = n - 1 (every acceptance value and repeat; the k = 0 generations,
    which ``per_prompt_tokens_per_s`` repeats at every acceptance value, once), and the
    per-prompt time is their median. The verify sweep's times and the per-slot arrays are
    dropped (the rounds run the dedup kernel alone); the prompts are the throughput runs'."""
    r = m.per_prompt_round_verify_ms
    if r is None:
        where = m.sources.get("throughput", "throughput.json")
        raise InputError(
            f"{where}: has no per_prompt_round_verify_ms (each generation's median verification "
            "pass), which a rule set with verify_side 'rounds' scores"
        )
    if not m.throughput_dedup:
        raise InputError(
            f"{m.sources.get('throughput', 'throughput.json')}: the rounds' passes of runs with "
            "deduplication off are not the dedup kernel's"
        )
    A, K, P, R = r.shape
    cols = [r[0, 0]] + [r[:, k].transpose(1, 0, 2).reshape(P, A * R) for k in range(1, K)]
    width = max(c.shape[1] for c in cols)
    rep = np.full((P, K, width), np.nan)
    for k, c in enumerate(cols):
        rep[:, k, : c.shape[1]] = c
    pp = np.nanmedian(rep, axis=2)
    return dataclasses.replace(
        m,
        n=list(range(1, K + 1)),
        verify_off_ms=None,
        verify_on_ms=pp.mean(axis=0),
        per_prompt_off_ms=None,
        per_prompt_on_ms=pp,
        per_prompt_repeats_off_ms=None,
        per_prompt_repeats_on_ms=rep,
        verify_prompts=m.throughput_prompts,
        sources={**m.sources, "verify": m.sources.get("throughput", "") + " (rounds' passes)"},
    )


# ------------------------------------------------------------------------------------------
# the prediction a campaign recorded for a runs folder


@dataclass(frozen=True)
class RecordedPrediction:
    """The prediction that the campaign record ``record`` committed for the runs folder named
    ``folder``: the plan and profile paths as written there (relative to the repository root
    or to the record's folder) and their SHA-256 (None where the record gives none)."""

    record: str
    folder: str
    plan: str | None
    plan_sha256: str | None
    profile: str | None
    profile_sha256: str | None
    also: tuple[
        tuple[str | None, str | None], ...
    ] = ()  # further versions' (plan, profile) SHA-256


def _sha(record: Path, folder: str, entry: dict, key: str) -> str | None:
    v = entry.get(key)
    if v is None:
        return None
    if (
        not isinstance(v, str)
        or len(v) != 64
        or any(ch not in "0123456789abcdef" for ch in v.lower())
    ):
        raise InputError(f"{record}: predictions.{folder}.{key} must be 64 hex digits")
    return v.lower()


def recorded_prediction(folder: str | Path) -> RecordedPrediction | None:
    """The prediction recorded for the runs folder ``folder`` (one model's verify.json and
    throughput.json) under ``predictions.<folder name>`` of ``runs_campaign.json`` in the
    folder above it, else in the folder itself; None when neither records one. A malformed
    entry is an ``InputError`` naming the record."""
    f = Path(folder)
    for record in (f.resolve().parent / CAMPAIGN_FILE, f / CAMPAIGN_FILE):
        if not record.is_file():
            continue
        d = _read_json(record)
        preds = d.get("predictions") if isinstance(d, dict) else None
        if preds is None:
            continue
        if not isinstance(preds, dict):
            raise InputError(f"{record}: predictions must be an object keyed by runs folder")
        entry = preds.get(f.resolve().name)
        if entry is None:
            continue
        name = f.resolve().name
        if not isinstance(entry, dict):
            raise InputError(f"{record}: predictions.{name} must be an object")
        paths = {}
        for key in ("plan", "profile"):
            v = entry.get(key)
            if v is not None and not isinstance(v, str):
                raise InputError(f"{record}: predictions.{name}.{key} must be a path")
            paths[key] = v
        also = entry.get("also", [])
        if not isinstance(also, list) or not all(isinstance(e, dict) for e in also):
            raise InputError(f"{record}: predictions.{name}.also must be a list of objects")
        return RecordedPrediction(
            record=str(record),
            folder=name,
            plan=paths["plan"],
            plan_sha256=_sha(record, name, entry, "plan_sha256"),
            profile=paths["profile"],
            profile_sha256=_sha(record, name, entry, "profile_sha256"),
            also=tuple(
                (_sha(record, name, e, "plan_sha256"), _sha(record, name, e, "profile_sha256"))
                for e in also
            ),
        )
    return None
