"""The campaign of docs/runs-protocol-whole-pass.md: verify sweeps and oracle throughput runs
sized by its power analysis, scored against the whole-pass prediction committed before them.

Writes, under ``--out`` (default ``results/cpu/whole-pass``):

``runs_campaign.json``             command, machine, design, the SHA-256 of every committed
                                   prediction (field ``predictions``), every unit's status,
                                   load and available memory at its start and end
``<config>/units/<unit>.json``     the raw output of each finished unit (resumable)
``<config>/rounds/<unit>/...``     round logs of the throughput units (Parquet)
``<config>/verify.json``, ``<config>/throughput.json``   the ``specmoe validate`` runs format,
                                   with each prompt's median pass time (and every repetition),
                                   each generation's tokens/s as [A][K][P][R], and h(k)
``<config>/tables.json``           per depth: tau_p(n) (mean over prompts of per-prompt
                                   medians), T(k, a) (median over prompts x repeats), h(k)

A unit is (configuration, depth, experiment, prompt[, repeat]): a verify unit is one prompt's
sweep (a warm-up repetition and the recorded ones, n = 1..9, both kernel settings alternating
order); a throughput unit is one prompt's repeat of every draft length and acceptance value
(k = 0 once), in an order shuffled by (seed, prompt, repeat). Verify units run first, then the
throughput units, repeat r of every prompt before repeat r + 1. Rerunning the same command
skips finished units; an unfinished unit is rerun from its start with its partial round logs
deleted (the protocol's discard rule 3). ``--budget MIN`` starts no unit after MIN minutes.

The predictions (``--predictions``, default ``results/cpu/whole-pass/predictions``) are
``<config>/plan.json`` and ``<config>/profile.json``, committed before the campaign starts: a
configuration whose prediction is missing, not committed, or changed since its SHA-256 was
recorded does not run (exit 2).

Usage: ``python scripts/whole_pass_campaign.py [--configs bundled,...] [--budget MIN]``;
``--quick`` runs a seconds-long subset into ``out/whole-pass-quick`` (no prediction needed).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

os.environ.setdefault("SPECMOE_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from measure_runs import _load, _machine, _mem_available_gb, skip_unit  # noqa: E402

from specmoe._io import atomic_write_json, read_json  # noqa: E402

PROTOCOL = "docs/runs-protocol-whole-pass.md"
ACCEPTANCE = [float(round(a, 3)) for a in np.linspace(0.2, 0.98, 11)]
KS = list(range(9))
NS = list(range(1, 10))
CLOCK = "cpu"
TAIL = 256  # a prompt's document must hold d + TAIL tokens


@dataclass(frozen=True)
class Config:
    name: str
    spec: str  # load_target spec
    layers: int | None
    depths: tuple[int, ...]
    verify: tuple[int, int]  # prompts, recorded repeats (one warm-up more)
    throughput: tuple[int, int, int]  # prompts, repeats, tokens
    prefill: str  # "model" or "skip" (the dummy models' prefill expert output)
    forced: str | None  # forced-routing trace spec


CONFIGS = {
    "bundled": Config("bundled", "bundled", None, (512, 2048), (32, 4), (12, 3, 256), "model", None),
    "olmoe-dummy-4L": Config(
        "olmoe-dummy-4L", "OLMoE-1B-7B-0125-dummy", 4, (512, 2048), (24, 3), (6, 2, 128), "skip",
        "bundled:validation",
    ),
    "qwen3-dummy-4L": Config(
        "qwen3-dummy-4L", "Qwen3-30B-A3B-dummy", 4, (512,), (24, 3), (6, 2, 128), "skip",
        "results/cpu/whole-pass/predictions/qwen3-dummy-4L/routing.npz",
    ),
}  # fmt: skip
QUICK = {
    "bundled": Config("bundled", "bundled", None, (64,), (2, 1), (2, 1, 8), "model", None),
}


@dataclass(frozen=True)
class Unit:
    config: str
    name: str
    kind: str  # verify | oracle
    depth: int
    prompt: int
    repeat: int | None = None


def units_of(cfg: Config) -> list[Unit]:
    """The protocol's units of one configuration, in run order."""
    out: list[Unit] = []
    for d in cfg.depths:
        pv, _ = cfg.verify
        out += [Unit(cfg.name, f"verify-d{d}-p{p:02d}", "verify", d, p) for p in range(pv)]
        pt, rt, _ = cfg.throughput
        out += [
            Unit(cfg.name, f"oracle-d{d}-r{r}-p{p:02d}", "oracle", d, p, r)
            for r in range(rt)
            for p in range(pt)
        ]
    return out


# ------------------------------------------------------------------------------------------
# the committed predictions


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _committed(path: Path) -> bool:
    """True when ``path`` is tracked by git with no uncommitted change."""
    try:
        rel = path.resolve().relative_to(ROOT)
        tracked = subprocess.run(
            ["git", "ls-files", "--error-unmatch", str(rel)], cwd=ROOT, capture_output=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", str(rel)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    except (ValueError, OSError):
        return False
    return tracked.returncode == 0 and not dirty.stdout.strip()


def check_prediction(
    record: dict[str, Any], cfg: str, folder: Path, *, also: bool = False
) -> str | None:
    """Record the configuration's prediction SHA-256s (first time) or check them; an error
    line when the prediction is missing, not committed or changed. ``also``: a further
    version committed before the same runs and scored beside the first (``--also-predictions``),
    kept in the entry's ``also`` list."""
    folder = Path(folder).resolve()  # a relative --predictions is taken from the working dir
    files = {"plan": folder / cfg / "plan.json", "profile": folder / cfg / "profile.json"}
    for key, path in files.items():
        if not path.is_file():
            return f"{path}: no committed {key} for configuration {cfg!r}"
        if not _committed(path):
            return f"{path}: not committed (the protocol commits the prediction before its runs)"
    now = {key: sha256(path) for key, path in files.items()}
    preds = record.setdefault("predictions", {})
    entry = {
        **{k: str(p.relative_to(ROOT)) for k, p in files.items()},
        **{f"{k}_sha256": v for k, v in now.items()},
        "recorded": time.time(),
    }
    if also:
        if cfg not in preds:
            return f"{cfg}: --also-predictions needs the configuration's first prediction"
        slot = preds[cfg].setdefault("also", [])
        old = next((e for e in slot if e.get("plan") == entry["plan"]), None)
        if old is None:
            if any(u.startswith(f"{cfg}/") for u in record.get("units", {})):
                return f"{files['plan']}: the runs of {cfg!r} have started; a version added now was not committed before them"
            slot.append(entry)
            return None
    else:
        old = preds.get(cfg)
    if old is None:
        preds[cfg] = entry
        return None
    for key, value in now.items():
        if old.get(f"{key}_sha256") != value:
            return f"{files[key]}: changed since its SHA-256 was recorded (never recomputed)"
    return None


def check_processor(cfg: str, folder: Path) -> tuple[dict[str, Any], str | None]:
    """Configuration ``cfg``'s prediction profile (in ``folder``) and an error line when it is
    unreadable or this processor is not the one it was measured on: the profile's
    ``device_name`` and, where the prediction records it (``machine.json``, amendment 9), the
    processor's family, model, stepping, cache, cores and instruction sets."""
    from specmoe.bench.machine import device_name

    path = Path(folder).resolve() / cfg / "profile.json"
    try:
        prof = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return {}, f"{path}: unreadable prediction profile ({exc})"
    want, have = prof.get("device_name", ""), device_name("cpu")
    if want and want != have:
        return prof, (
            f"{path}: {cfg}'s prediction was measured on {want!r}; this machine is {have!r} "
            "(its units run only on the prediction's processor)"
        )
    ident = Path(folder).resolve() / cfg / "machine.json"
    if ident.exists():  # amendment 9: the processor's identity beyond its name
        from specmoe.bench.machine import cpu_identity

        try:
            was = json.loads(ident.read_text())
        except ValueError as exc:
            return prof, f"{ident}: unreadable ({exc})"
        now = cpu_identity()
        for key in ("vendor", "family", "model", "stepping", "llc_bytes", "cores", "isa"):
            if key in was and was[key] != now.get(key):
                return prof, (
                    f"{ident}: {cfg}'s prediction was measured on a processor with {key} "
                    f"{was[key]!r}; here it is {now.get(key)!r} (its units run only on the "
                    "prediction's processor)"
                )
    return prof, None


def pinned_source(cfg: str, folder: Path) -> tuple[Path | None, str | None]:
    """The C kernel source a configuration's prediction pins, and an error line: its
    ``kernels.c`` (the source its benchmark compiled), or, for a version that reuses another
    prediction's benchmark, its ``kernels.json`` naming that file (``source``, relative to the
    repository) with its ``sha256``, checked; (None, None) where it pins none."""
    here = Path(folder).resolve() / cfg
    if (here / "kernels.c").is_file():
        return here / "kernels.c", None
    ref = here / "kernels.json"
    if not ref.is_file():
        return None, None
    try:
        entry = json.loads(ref.read_text())
        path, want = ROOT / entry["source"], entry["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"{ref}: not a kernel reference with source and sha256 ({exc})"
    if not path.is_file():
        return None, f"{ref}: its source {entry['source']} is not there"
    if sha256(path) != want:
        return None, f"{ref}: {entry['source']} is not the source of SHA-256 {want}"
    return path.resolve(), None


def check_machine(cfg: str, folder: Path) -> str | None:
    """An error line when this machine or these kernels are not the ones the configuration's
    prediction was measured on (the protocol's amendments 8 and 9): its profile's processor
    (``device_name``), where the prediction records it (``machine.json``) the processor's
    family, model, stepping, cache, cores and instruction sets, and, where the profile records
    it, the C kernels' source SHA-256 and compiler. A
    configuration's units run only where its prediction holds; a campaign spread over
    several sessions resumes only on the same processor with the same kernels."""
    from specmoe.errors import InputError
    from specmoe.kernels._cbuild import SOURCE_ENV, build, source_sha256

    path = Path(folder).resolve() / cfg / "profile.json"
    pinned, err = pinned_source(cfg, folder)
    if err:
        return err
    pinned = pinned or Path(folder).resolve() / cfg / "kernels.c"
    if os.environ.get(SOURCE_ENV) and Path(os.environ[SOURCE_ENV]).resolve() != pinned:
        return (
            f"{path}: ${SOURCE_ENV} is {os.environ[SOURCE_ENV]}, not {cfg}'s kernels.c (run "
            "configurations with different kernels in separate invocations)"
        )
    prof, err = check_processor(cfg, folder)
    if err:
        return err
    impl = prof.get("implementations") or {}
    kernels = {
        (v.get("compiler") or {}).get("source_sha256")
        for v in impl.values()
        if isinstance(v, dict) and v.get("ran") == "c"
    } - {None}
    try:
        here = build()
    except InputError as exc:  # a pinned source that does not build
        return str(exc)
    if kernels and here.lib is None:
        return (
            f"{path}: {cfg}'s prediction timed the C kernels; here they do not build ({here.error})"
        )
    if kernels and kernels != {source_sha256()}:
        return (
            f"{path}: {cfg}'s prediction timed the C kernels of source {sorted(kernels)[0]}; "
            f"these are {source_sha256()} (its units run only with the prediction's kernels)"
        )
    now = here.status()
    for v in impl.values():  # the same compiler, flags and instruction sets as the prediction's
        was = (v.get("compiler") or {}) if isinstance(v, dict) and v.get("ran") == "c" else {}
        for key in ("version", "flags", "avx2", "avx512_bf16"):
            if key in was and was[key] != now.get(key):
                return (
                    f"{path}: {cfg}'s prediction built the C kernels with {key} "
                    f"{was[key]!r}; here it is {now.get(key)!r}"
                )
    return None


def pin_kernels(names: list[str], folder: Path) -> str | None:
    """Build the C kernels the configurations' predictions timed: where a prediction folder
    pins a source (:func:`pinned_source`: the source its benchmark compiled), point
    ``$SPECMOE_KERNEL_SOURCE`` at it before any kernel is built, so that later changes of the
    package's kernels do not change what a campaign under way runs (amendment 8). An error
    line when two configurations of one invocation pinned different sources."""
    from specmoe.kernels._cbuild import SOURCE_ENV

    pinned = {}
    for c in names:
        path, err = pinned_source(c, folder)
        if err:
            return err
        if path is not None:
            try:
                pinned.setdefault(path.read_bytes(), []).append((c, path))
            except OSError as exc:
                return f"{path}: unreadable kernel source ({exc.strerror})"
    if len(pinned) > 1:
        (a, _), (b, _) = [v[0] for v in pinned.values()][:2]
        return f"{a} and {b} pin different kernel sources: run them in separate invocations"
    if pinned:
        os.environ[SOURCE_ENV] = str(next(iter(pinned.values()))[0][1])
    return None


# ------------------------------------------------------------------------------------------
# models and prompts


class Models:
    def __init__(self, configs: dict[str, Config], seed: int):
        self.configs, self.seed = configs, seed
        self._cfg: str | None = None
        self._entry: dict[str, Any] = {}
        self._docs: dict[int, list[tuple[str, list[int]]]] = {}
        self._tokenizer: Any = None

    def get(self, name: str) -> dict[str, Any]:
        """The engine's model of one configuration (one loaded at a time: the dummy ones are
        gigabytes)."""
        if self._cfg == name:
            return self._entry
        import gc

        from specmoe.engine.runner import forced_from, load_target

        self._entry = {}
        gc.collect()
        cfg = self.configs[name]
        net, tok, label, _ = load_target(cfg.spec, layers=cfg.layers, seed=self.seed)
        spec = cfg.forced
        if spec is not None and not spec.startswith("bundled:"):
            spec = str(ROOT / spec)
        self._entry = {
            "model": net,
            "label": label,
            "forced": forced_from(spec, net) if spec else None,
        }
        self._tokenizer = self._tokenizer or tok
        self._cfg = name
        return self._entry

    def prompts(self, depth: int, count: int) -> list[tuple[str, list[int]]]:
        """The first ``count`` validation documents with at least depth + 256 tokens, in split
        order, truncated to ``depth`` (all of them when fewer qualify)."""
        if depth not in self._docs:
            from specmoe.data import corpus
            from specmoe.engine.models import load_tokenizer
            from specmoe.engine.runner import encode

            tok = self._tokenizer or load_tokenizer("bundled")
            docs = []
            for name, text in corpus.documents("validation"):
                ids = encode(tok, text)
                if len(ids) >= depth + TAIL:
                    docs.append((name, ids[:depth]))
            self._docs[depth] = docs
        return self._docs[depth][:count]


# ------------------------------------------------------------------------------------------
# units


def run_unit(unit: Unit, cfg: Config, models: Models, folder: Path, *, seed: int) -> dict:
    from specmoe.engine.measure import verify_passes
    from specmoe.engine.speculative import Engine
    from specmoe.engine.switch import KernelPolicy

    m = models.get(cfg.name)
    count = cfg.verify[0] if unit.kind == "verify" else cfg.throughput[0]
    docs = models.prompts(unit.depth, count)
    pid, ids = docs[unit.prompt]
    forced = m["forced"]
    routing = None
    if forced is not None:  # prompt p takes the trace's document p (by name when it has it)
        by_name = pid in forced.documents
        routing = {
            "trace_document": forced.use_document(pid if by_name else unit.prompt),
            "matched_by_name": by_name,
        }
    engine = Engine(
        m["model"], policy=KernelPolicy("dedup"), forced=forced, prefill=cfg.prefill, clock=CLOCK
    )
    cpu0 = time.process_time()
    try:
        if unit.kind == "verify":
            out = verify_passes(engine, [(pid, ids)], n_values=NS, repeats=cfg.verify[1], warmup=1)
        else:
            # (forced routing: pointed above, once)
            gens = oracle_generations(engine, unit, (pid, ids), folder, cfg, m["label"], seed)
            out = {"generations": gens}
    finally:
        engine.close()
    out.update(
        prompt_id=pid,
        prompt_index=unit.prompt,
        repeat=unit.repeat,
        forced_routing=routing,
        cpu_s=time.process_time() - cpu0,
    )
    return out


def oracle_generations(
    engine: Any,
    unit: Unit,
    prompt: tuple[str, list[int]],
    folder: Path,
    cfg: Any,
    label: str,
    seed: int,
    **more: Any,
) -> list:
    """A throughput unit's generations (``run_grid`` with the oracle drafter: every k and
    acceptance once, ``cfg.throughput``'s tokens each, in the order shuffled by (seed, prompt,
    repeat)), its round logs under ``folder/rounds/<unit>`` (a partial unit's deleted first);
    ``more`` to ``run_grid``."""
    from specmoe.engine.runner import run_grid

    rounds = folder / "rounds" / unit.name
    if rounds.exists():
        shutil.rmtree(rounds)  # discard rule 3: never resume a partial unit
    rep = int(unit.repeat or 0)
    return run_grid(
        engine,
        [prompt],
        drafter="oracle",
        ks=KS,
        accs=ACCEPTANCE,
        tokens=cfg.throughput[2],
        label=label,
        out=rounds,
        seed=seed,
        repeats=1,
        rep_offset=rep,
        depth=unit.depth,
        shuffle_seed=int(np.random.SeedSequence([seed, unit.prompt, rep]).generate_state(1)[0]),
        progress=False,
        seed_by_acceptance=True,
        **more,
    )


# ------------------------------------------------------------------------------------------
# aggregation: the validate runs format


def _unit_files(folder: Path) -> list[dict[str, Any]]:
    return [read_json(p, "unit file") for p in sorted((folder / "units").glob("*.json"))]


# the kernel settings of a verify unit and their keys in the runs format
SETTINGS = (("per_slot", "off"), ("dedup", "on"))


def aggregate(
    folder: Path,
    label: str,
    cfg: Config,
    have: dict[int, tuple[int, int]],
    *,
    settings: tuple[tuple[str, str], ...] = SETTINGS,
    engine: str = "specmoe",
) -> None:
    """Rewrite verify.json, throughput.json and tables.json of one configuration from its
    finished units; a depth enters the runs files only when all its units are done (``have``:
    depth -> the verify and throughput prompts that qualify). ``settings``: the (kernel
    setting, runs-format key) pairs the verify units timed (an engine with the dedup kernel
    alone: ``(("dedup", "on"),)``); ``engine``: the runs files' engine."""
    units = _unit_files(folder)
    vconf, tconf, tables = [], [], {}
    for d in cfg.depths:
        vu = [u for u in units if u["kind"] == "verify" and u["depth"] == d]
        tu = [u for u in units if u["kind"] == "oracle" and u["depth"] == d]
        entry: dict[str, Any] = {"verify_units": len(vu), "throughput_units": len(tu)}
        if vu:
            vu.sort(key=lambda u: u["prompt_index"])
            prompts = [u["prompt_id"] for u in vu]
            reps: dict[str, list] = {}
            for s, key in settings:
                reps[key] = [
                    [
                        [
                            r["t_ms"]
                            for r in sorted(u["records"], key=lambda r: r["repetition"])
                            if r["setting"] == s and r["n"] == n
                        ]
                        for n in NS
                    ]
                    for u in vu
                ]
            med = {k: np.median(np.asarray(v, float), axis=2) for k, v in reps.items()}
            entry["tau_ms"] = {k: v.mean(axis=0).tolist() for k, v in med.items()}
            entry["prompts_verify"] = prompts
            agree = [u["agreement"] for u in vu]
            entry["agreement"] = {
                "agree": sum(a["agree"] for a in agree),
                "rows": sum(a["rows"] for a in agree),
                "disagreements": [x for a in agree for x in a["disagreements"]],
            }
        if tu:
            gens = [g for u in tu for g in u["generations"]]
            entry["h_ms"] = [_h([g for g in gens if g["k"] == k]) for k in KS]
        nv, nt = have[d]
        complete = len(vu) == nv and len(tu) == nt * cfg.throughput[1]
        entry["complete"] = bool(complete)
        if tu and complete:
            tu.sort(key=lambda u: (u["prompt_index"], u["repeat"]))
            pidx = sorted({u["prompt_index"] for u in tu})
            rset = sorted({u["repeat"] for u in tu})
            grid = np.full((len(ACCEPTANCE), len(KS), len(pidx), len(rset)), np.nan)
            rgrid = np.full_like(grid, np.nan)  # each generation's median verification pass
            for u in tu:
                p, r = pidx.index(u["prompt_index"]), rset.index(u["repeat"])
                for g in u["generations"]:
                    j = KS.index(g["k"])
                    rows = range(len(ACCEPTANCE)) if g["k"] == 0 else [
                        ACCEPTANCE.index(g["acceptance"])
                    ]  # fmt: skip
                    for i in rows:
                        grid[i, j, p, r] = g["tokens_per_s"]
                        if g.get("median_t_verify_ms") is not None:
                            rgrid[i, j, p, r] = g["median_t_verify_ms"]
            if not np.isnan(grid).any():
                flat = grid.reshape(len(ACCEPTANCE), len(KS), -1)
                entry["throughput_tokens_per_s"] = np.median(flat, axis=2).tolist()
                gens = [g for u in tu for g in u["generations"]]
                vconf.append(
                    {
                        "depth": d,
                        "context_len": d - 1,  # verify_passes and the round loop prefill d - 1
                        "n": NS,
                        "prompts": prompts,
                        "verify_ms": entry["tau_ms"],
                        "per_prompt_ms": {k: v.tolist() for k, v in med.items()},
                        "per_prompt_repeats_ms": reps,
                        "draft_ms": entry["h_ms"],
                    }
                )
                tconf.append(
                    {
                        "depth": d,
                        "k": KS,
                        "acceptance": ACCEPTANCE,
                        "prompts": [
                            next(u["prompt_id"] for u in tu if u["prompt_index"] == p) for p in pidx
                        ],
                        "tokens_per_s": entry["throughput_tokens_per_s"],
                        "per_prompt_tokens_per_s": grid.tolist(),
                        "dedup": True,
                    }
                )
                if not np.isnan(rgrid).any():  # the rounds' own passes (rules-*-rounds.json)
                    tconf[-1]["per_prompt_round_verify_ms"] = rgrid.tolist()
                if gens and all("tokens" in g for g in gens):  # each generation's new tokens
                    tconf[-1]["tokens"] = int(np.median([g["tokens"] for g in gens]))
        tables[str(d)] = entry
    atomic_write_json(folder / "tables.json", {"model": label, "depths": tables})
    if vconf:
        head = {"model": label, "device": "cpu", "engine": engine}
        atomic_write_json(folder / "verify.json", {**head, "configurations": vconf})
        atomic_write_json(folder / "throughput.json", {"model": label, "configurations": tconf})


def _h(gens: list[dict[str, Any]]) -> float:
    """Time per step beyond the verify pass: median of (decode - sum of T_T) / rounds."""
    if not gens:
        return float("nan")
    return float(np.median([(g["decode_ms"] - g["sum_t_verify_ms"]) / g["rounds"] for g in gens]))


# ------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------
# the campaign record (runs_campaign.json) and one unit's run


def add_campaign_args(ap: argparse.ArgumentParser, results: str, configs: dict) -> None:
    """``--out`` (default ``results``), ``--configs`` (of ``configs``), ``--predictions``
    (default ``results/predictions``) and ``--also-predictions``."""
    ap.add_argument("--out", type=Path, default=None, help=f"default {results}")
    ap.add_argument(
        "--configs",
        default=",".join(configs),
        help=f"comma-separated configurations, in run order (default {','.join(configs)})",
    )
    ap.add_argument(
        "--predictions",
        type=Path,
        default=ROOT / results / "predictions",
        help="folder of <config>/plan.json and profile.json (committed)",
    )
    ap.add_argument(
        "--also-predictions",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a further version's <config>/plan.json and profile.json, committed before the "
        "runs and recorded beside --predictions' (scored beside it by specmoe validate)",
    )


def parse_design(design: str) -> tuple[int, int, int]:
    """``--throughput-design P,R,T``: prompts, repeats, tokens (positive integers)."""
    try:
        thr = tuple(int(x) for x in design.split(","))
    except ValueError:
        thr = ()
    if len(thr) != 3 or min(thr) < 1:
        raise ValueError(f"--throughput-design: {design!r} is not P,R,T (positive integers)")
    return thr  # type: ignore[return-value]


def add_run_args(ap: argparse.ArgumentParser) -> None:
    """``--budget``, ``--quick`` and ``--seed``."""
    ap.add_argument("--budget", type=float, default=1e9, help="minutes; no unit starts after")
    ap.add_argument("--quick", action="store_true", help="a seconds-long subset, no prediction")
    ap.add_argument("--seed", type=int, default=0)


def design_of(cfg: Config, **more: Any) -> dict[str, Any]:
    """A configuration's design as the campaign record keeps it (``more`` after its sizes)."""
    return {
        "depths": list(cfg.depths),
        "verify_prompts_x_repeats": list(cfg.verify),
        "throughput_prompts_x_repeats_x_tokens": list(cfg.throughput),
        **more,
        "n": NS,
        "k": KS,
        "acceptance": ACCEPTANCE,
    }


def open_record(
    record_path: Path,
    args: argparse.Namespace,
    *,
    protocol: str,
    design: dict[str, Any],
    command: str,
    names: list[str],
) -> dict[str, Any]:
    """The campaign record at ``record_path`` (empty when there is none) with this
    invocation's fields (``args.quick``, ``args.seed``), its command and its machine appended."""
    record = read_json(record_path, "campaign record") if record_path.exists() else {}
    if "machine" in record and "invocations" not in record:  # a record from before the field
        record["invocations"] = [{"started": None, "machine": record["machine"]}]
        for info in record.get("units", {}).values():
            info.setdefault("invocation", 0)
    record.update(
        {
            "protocol": protocol,
            "quick": args.quick,
            "clock": CLOCK,
            "seed": args.seed,
            "machine": _machine(),
        }
    )
    # an invocation naming some configurations keeps the design of the others it ran before
    record["design"] = {**record.get("design", {}), **design}
    record.setdefault("commands", []).append(command)
    # each invocation's machine, so that units of one configuration run on two machines show
    record.setdefault("invocations", []).append(
        {"started": time.time(), "machine": record["machine"], "configs": names}
    )
    return record


def record_qualifying(record: dict[str, Any], c: str, have: dict[int, tuple[int, int]]) -> None:
    """Configuration ``c``'s qualifying prompts per depth (verify, throughput) in the record."""
    record.setdefault("qualifying_prompts", {})[c] = {
        str(d): {"verify": v, "throughput": t} for d, (v, t) in have.items()
    }


def too_few_prompts(
    status: dict[str, Any], key: str, unit: Unit, have: dict[int, tuple[int, int]]
) -> bool:
    """Whether ``unit``'s prompt is past its depth's qualifying documents (then so recorded)."""
    qual = have[unit.depth][0 if unit.kind == "verify" else 1]
    if unit.prompt >= qual:
        status[key] = {"status": f"not run (only {qual} qualifying documents)"}
        return True
    return False


def start_unit(record: dict[str, Any], record_path: Path, key: str) -> tuple[dict, float]:
    """The status of unit ``key``, with the load and available memory at its start, in the
    record (written), and its start on ``time.perf_counter``'s clock."""
    info = {
        "status": "running",
        "invocation": len(record["invocations"]) - 1,
        "load_start": _load(),
        "mem_available_gb_start": _mem_available_gb(),
        "started": time.time(),
    }
    record["units"][key] = info
    atomic_write_json(record_path, record)
    t0 = time.perf_counter()
    print(f"{key} ...", file=sys.stderr, flush=True)
    return info, t0


def finish_unit(
    result: dict[str, Any], unit: Unit, t0: float, done: Path, info: dict[str, Any]
) -> None:
    """A unit's output, with its wall time since ``t0``, written to ``done``; its status
    ``info`` done, with the load and available memory at its end."""
    result.update(unit=unit.name, kind=unit.kind, depth=unit.depth)
    result["wall_s"] = time.perf_counter() - t0
    atomic_write_json(done, result)
    info.update(
        status="done",
        wall_s=result["wall_s"],
        cpu_s=result["cpu_s"],
        load_end=_load(),
        mem_available_gb_end=_mem_available_gb(),
    )


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_campaign_args(ap, "results/cpu/whole-pass", CONFIGS)
    add_run_args(ap)
    ap.add_argument(
        "--throughput-design",
        default=None,
        metavar="P,R,T",
        help="the throughput design of the named configurations: prompts, repeats, tokens "
        "(the protocol's amendment 11), instead of the configuration's",
    )
    args = ap.parse_args(argv)
    table = QUICK if args.quick else CONFIGS
    names = [c for c in args.configs.split(",") if c] if not args.quick else list(QUICK)
    bad = [c for c in names if c not in table]
    if bad:
        print(f"whole_pass_campaign: error: --configs: unknown {bad[0]!r}", file=sys.stderr)
        return 2
    if args.throughput_design is not None:
        try:
            thr = parse_design(args.throughput_design)
        except ValueError as exc:
            print(f"whole_pass_campaign: error: {exc}", file=sys.stderr)
            return 2
        table = {**table, **{c: dataclasses.replace(table[c], throughput=thr) for c in names}}
    out = args.out or ROOT / ("out/whole-pass-quick" if args.quick else "results/cpu/whole-pass")
    torch.set_num_threads(1)
    if not args.quick and (err := pin_kernels(names, args.predictions)):
        print(f"whole_pass_campaign: error: {err}", file=sys.stderr)
        return 2
    from specmoe.kernels import cpu

    cpu.set_num_threads(int(os.environ["SPECMOE_NUM_THREADS"]))
    record_path = out / "runs_campaign.json"
    record = open_record(
        record_path,
        args,
        protocol=PROTOCOL,
        design={c: design_of(table[c]) for c in names},
        command="python scripts/whole_pass_campaign.py " + " ".join(argv or sys.argv[1:]),
        names=names,
    )
    out.mkdir(parents=True, exist_ok=True)
    if not args.quick:  # every named configuration's prediction, before any of its units
        for c in names:
            if c == "qwen3-dummy-4L":
                continue  # recorded when its first unit starts (the protocol's amendment)
            err = check_prediction(record, c, args.predictions)
            for extra in args.also_predictions:
                err = err or check_prediction(record, c, extra, also=True)
            if err:
                print(f"whole_pass_campaign: error: {err}", file=sys.stderr)
                return 2
    atomic_write_json(record_path, record)
    status = record.setdefault("units", {})
    models = Models(table, args.seed)
    start = time.perf_counter()
    for c in names:
        cfg, folder = table[c], out / c
        have = {
            d: (len(models.prompts(d, cfg.verify[0])), len(models.prompts(d, cfg.throughput[0])))
            for d in cfg.depths
        }
        record_qualifying(record, c, have)
        for unit in units_of(cfg):
            key = f"{c}/{unit.name}"
            done = folder / "units" / f"{unit.name}.json"
            if skip_unit(status, key, done, start, args.budget):
                continue
            if too_few_prompts(status, key, unit, have):
                continue
            if not args.quick:  # only where a unit will run: a finished configuration needs neither
                err = check_machine(c, args.predictions)
                if not err and c == "qwen3-dummy-4L":
                    err = check_prediction(record, c, args.predictions)
                    for extra in args.also_predictions:
                        err = err or check_prediction(record, c, extra, also=True)
                if err:
                    print(f"whole_pass_campaign: error: {err}", file=sys.stderr)
                    atomic_write_json(record_path, record)
                    return 2
            info, t0 = start_unit(record, record_path, key)
            result = run_unit(unit, cfg, models, folder, seed=args.seed)
            finish_unit(result, unit, t0, done, info)
            aggregate(folder, models.get(c)["label"], cfg, have)
            atomic_write_json(record_path, record)
            print(f"{key}: {result['wall_s']:.1f} s", file=sys.stderr, flush=True)
        if (folder / "units").exists():
            aggregate(folder, models.get(c)["label"], cfg, have)
    record["elapsed_min_last_invocation"] = (time.perf_counter() - start) / 60
    atomic_write_json(record_path, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
