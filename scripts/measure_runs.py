"""The CPU measurement campaign of docs/runs-protocol.md: verify times and speculative throughput.

Writes, under ``--out`` (default ``results/cpu``), one folder per model:

``<model>/units/<unit>.json``      the raw output of each finished unit of work (resumable)
``<model>/rounds/<drafter>/<unit>/rounds/<run id>/part-*.parquet``   round logs
``<model>/verify_tables.json``     τ_p(n) per depth and setting, saving with 95% CI, crossover,
                                   verify-argmax agreement, per-prompt medians
``<model>/throughput_tables.json`` per drafter, depth, k (and a): tokens/s, tokens per round,
                                   realised acceptance, oracle mismatches, T_T, T_D, h(k)
``<model>/verify.json``, ``<model>/throughput.json``   the ``specmoe validate`` runs format
                                   (configurations with both a verify sweep and a full oracle
                                   grid)
``runs_campaign.json``             command, machine, versions, every unit's status and load

Rerunning the same command skips finished units and reruns unfinished ones from the start.
``--budget MIN`` stops starting units after MIN minutes. ``--quick`` runs a few-minute subset
into ``out/runs-quick`` for an end-to-end demonstration.

Usage: ``python scripts/measure_runs.py [--quick] [--budget 30] [--out DIR]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("SPECMOE_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from specmoe._io import atomic_write_json  # noqa: E402

ACCEPTANCE = [float(round(a, 3)) for a in np.linspace(0.2, 0.98, 11)]
DUMMY = "OLMoE-1B-7B-0125"
POLICY_PROMPTS = 24  # the amendment's policy prompts
CLOCK = "cpu"  # the CPU time of the one thread (docs/runs-protocol.md, Engine)


@dataclass(frozen=True)
class Unit:
    name: str
    model: str  # "bundled", "bundled-policy" (other prompts) or "dummy"
    kind: str  # verify | oracle | ngram | draft-model
    depth: int
    prompts: tuple[int, ...]  # indices into the prompt documents
    params: dict[str, Any] = field(default_factory=dict)


def plan(quick: bool) -> tuple[list[Unit], dict[str, Any]]:
    """The units of the protocol (or of the quick demo), in run order."""
    if quick:
        cfg = {"layers": 1, "docs": 3, "min_tokens": 512}
        units = [
            Unit("verify-d512", "bundled", "verify", 512, (0, 1), {"repeats": 1, "warmup": 1}),
            Unit(
                "oracle-d512-p0",
                "bundled",
                "oracle",
                512,
                (0,),
                {"ks": list(range(5)), "accs": [0.5, 0.9], "tokens": 32},
            ),
            Unit("ngram-d512-p2", "bundled", "ngram", 512, (2,), {"ks": [0, 2, 4], "tokens": 32}),
            Unit(
                "draft-model-d512-p2",
                "bundled",
                "draft-model",
                512,
                (2,),
                {"ks": [0, 2, 4], "tokens": 32},
            ),
            Unit("verify-d512", "dummy", "verify", 512, (0,), {"repeats": 1, "warmup": 0}),
            Unit(
                "oracle-d512-p0",
                "dummy",
                "oracle",
                512,
                (0,),
                {"ks": [0, 1, 2], "accs": [0.8], "tokens": 8},
            ),
        ]
        return units, cfg
    cfg = {"layers": 4, "docs": 9, "min_tokens": 2048}
    units: list[Unit] = []
    for d in (512, 2048):
        units.append(
            Unit(
                f"verify-d{d}", "bundled", "verify", d, tuple(range(6)), {"repeats": 5, "warmup": 1}
            )
        )
    for d in (512, 2048):
        for p in (0, 1):
            units.append(
                Unit(
                    f"oracle-d{d}-p{p}",
                    "bundled",
                    "oracle",
                    d,
                    (p,),
                    {"ks": list(range(9)), "accs": ACCEPTANCE, "tokens": 128},
                )
            )
    for kind in ("ngram", "draft-model"):
        for p in (6, 7, 8):
            units.append(
                Unit(
                    f"{kind}-d512-p{p}",
                    "bundled",
                    kind,
                    512,
                    (p,),
                    {"ks": list(range(9)), "tokens": 128},
                )
            )
    for d in (512, 2048):
        for p in (0, 1):
            units.append(
                Unit(f"verify-d{d}-p{p}", "dummy", "verify", d, (p,), {"repeats": 3, "warmup": 1})
            )
    for d in (512, 2048):
        units.append(
            Unit(
                f"oracle-d{d}-p0",
                "dummy",
                "oracle",
                d,
                (0,),
                {"ks": list(range(9)), "accs": ACCEPTANCE, "tokens": 32},
            )
        )
    # amendment: the Oracle's and the policies' prompts (docs/runs-protocol.md)
    for kind in ("ngram", "draft-model"):
        for p in range(POLICY_PROMPTS):
            units.append(
                Unit(
                    f"{kind}-d512-q{p:02d}",
                    "bundled-policy",
                    kind,
                    512,
                    (p,),
                    {"ks": list(range(9)), "tokens": 256},
                )
            )
    return units, cfg


# ------------------------------------------------------------------------------------------
# machine state


def _load() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return float("nan")


def _mem_available_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def _machine() -> dict[str, Any]:
    import platform

    import torch
    import transformers

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_total_gb": _mem_total_gb(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "kernel_threads": int(os.environ.get("SPECMOE_NUM_THREADS", "1")),
    }


def _mem_total_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


# ------------------------------------------------------------------------------------------
# models and prompts (loaded lazily, once)


class Models:
    def __init__(self, cfg: dict[str, Any], seed: int):
        self.cfg, self.seed = cfg, seed
        self._cache: dict[str, Any] = {}
        self.docs: list[tuple[str, list[int]]] = []

    def policy_prompts(self, tokenizer: Any) -> list[tuple[str, list[int]]]:
        """The amendment's policy prompts: validation documents of >= 512 tokens that are none
        of the protocol's nine, in split order, truncated to 512 tokens."""
        if "policy-docs" not in self._cache:
            from specmoe.data import corpus
            from specmoe.engine.runner import encode, validation_prompts

            taken = {name for name, _ in validation_prompts(tokenizer, count=9, context=2048)}
            docs = []
            for name, text in corpus.documents("validation"):
                ids = encode(tokenizer, text) if name not in taken else []
                if len(ids) >= 512:
                    docs.append((name, ids[:512]))
                if len(docs) == POLICY_PROMPTS:
                    break
            if len(docs) < POLICY_PROMPTS:
                raise SystemExit(f"only {len(docs)} policy prompts, {POLICY_PROMPTS} needed")
            self._cache["policy-docs"] = docs
        return self._cache["policy-docs"]

    def prompts(self, tokenizer: Any) -> list[tuple[str, list[int]]]:
        if not self.docs:
            from specmoe.engine.runner import validation_prompts

            self.docs = validation_prompts(
                tokenizer, count=self.cfg["docs"], context=self.cfg["min_tokens"]
            )
        return self.docs

    def get(self, key: str) -> dict[str, Any]:
        if key in self._cache:
            return self._cache[key]
        from specmoe.engine.runner import forced_from, load_target

        if key in ("bundled", "bundled-policy"):
            if key == "bundled-policy" and "bundled" in self._cache:
                entry = {**self._cache["bundled"], "folder": key}
            else:
                net, tok, label, _ = load_target("bundled")
                entry = {
                    "model": net,
                    "tokenizer": tok,
                    "label": label,
                    "forced": None,
                    "prefill": "model",
                    "folder": key,
                }
        else:
            net, tok, label, _ = load_target(
                f"{DUMMY}-dummy", layers=self.cfg["layers"], seed=self.seed
            )
            from specmoe.data import corpus

            trace = corpus.bundled_trace_path("validation")
            forced = forced_from("bundled:validation", net) if trace.exists() else None
            entry = {
                "model": net,
                "tokenizer": tok,
                "label": label,
                "forced": forced,
                "prefill": "skip",
                "folder": f"olmoe-dummy-{self.cfg['layers']}L",
            }
        self._cache[key] = entry
        return entry

    def draft(self) -> Any:
        if "bundled-draft" not in self._cache:
            from specmoe.engine.drafters import load_draft_model

            self._cache["bundled-draft"] = load_draft_model(None)
        return self._cache["bundled-draft"]


# ------------------------------------------------------------------------------------------
# units


def run_unit(unit: Unit, models: Models, folder: Path, *, seed: int) -> dict[str, Any]:
    from specmoe.engine.measure import verify_passes
    from specmoe.engine.runner import run_grid
    from specmoe.engine.speculative import Engine
    from specmoe.engine.switch import KernelPolicy

    m = models.get(unit.model)
    docs = (
        models.policy_prompts(m["tokenizer"])
        if unit.model == "bundled-policy"
        else models.prompts(m["tokenizer"])
    )
    prompts = [(docs[i][0], docs[i][1][: unit.depth]) for i in unit.prompts]
    forced = m["forced"]
    routing: dict[str, Any] = {}

    def point(pid: str) -> None:
        if forced is not None:
            by_name = pid in forced.documents
            idx = forced.use_document(
                pid if by_name else prompts.index(next(p for p in prompts if p[0] == pid))
            )
            routing[pid] = {"trace_document": idx, "matched_by_name": by_name}

    engine = Engine(
        m["model"], policy=KernelPolicy("dedup"), forced=forced, prefill=m["prefill"], clock=CLOCK
    )
    try:
        if unit.kind == "verify":
            bar = _bar(
                len(prompts) * 9 * 2 * (unit.params["repeats"] + unit.params["warmup"]),
                f"{m['folder']} {unit.name}",
                "pass",
            )
            out = verify_passes(
                engine,
                prompts,
                repeats=unit.params["repeats"],
                warmup=unit.params["warmup"],
                progress=bar,
                on_prompt=point,
            )
            bar.close()
        else:
            point(prompts[0][0])
            rounds = folder / "rounds" / unit.kind / unit.name
            if rounds.exists():
                shutil.rmtree(rounds)  # rule 3: never resume a partial unit
            gens = run_grid(
                engine,
                prompts,
                drafter=unit.kind,
                ks=unit.params["ks"],
                accs=unit.params.get("accs"),
                tokens=unit.params["tokens"],
                label=m["label"],
                out=rounds,
                seed=seed,
                draft_model=models.draft() if unit.kind == "draft-model" else None,
                forced=None,
                depth=unit.depth,
            )
            out = {"generations": gens}
    finally:
        engine.close()
    out["prompts"] = [p for p, _ in prompts]
    out["forced_routing"] = routing or None
    return out


def _bar(total: int, desc: str, unit: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)


# ------------------------------------------------------------------------------------------
# aggregation


def _units(folder: Path) -> dict[str, dict[str, Any]]:
    import json

    return {p.stem: json.loads(p.read_text()) for p in sorted((folder / "units").glob("*.json"))}


def aggregate(folder: Path, label: str) -> None:
    """Rewrite the tables of one model folder from its finished units."""
    from specmoe.engine.measure import summarise_verify

    units = _units(folder)
    if not units:
        return
    records = [r for u in units.values() for r in u.get("records", [])]
    tables: dict[str, Any] = {"model": label, "configurations": {}}
    if records:
        tables["configurations"] = summarise_verify(records)
        for d, entry in tables["configurations"].items():
            agree = [
                u["agreement"]
                for u in units.values()
                if "agreement" in u and any(r["depth"] == int(d) for r in u["records"])
            ]
            entry["agreement"] = {
                "agree": sum(a["agree"] for a in agree),
                "rows": sum(a["rows"] for a in agree),
                "disagreements": [x for a in agree for x in a["disagreements"]],
            }
            entry["per_prompt_median_ms"] = _per_prompt(records, int(d))
        atomic_write_json(folder / "verify_tables.json", tables)
    gens = [g for u in units.values() for g in u.get("generations", [])]
    thr = _throughput_tables(gens)
    if thr:
        atomic_write_json(folder / "throughput_tables.json", {"model": label, **thr})
    _validate_files(folder, label, records, gens)


def _per_prompt(records: list[dict[str, Any]], depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in ("per_slot", "dedup"):
        pids = sorted({r["prompt_id"] for r in records if r["depth"] == depth})
        ns = sorted({r["n"] for r in records if r["depth"] == depth})
        out[s] = {
            "prompts": pids,
            "n": ns,
            "median_ms": [
                [
                    float(
                        np.median(
                            [
                                r["t_ms"]
                                for r in records
                                if r["depth"] == depth
                                and r["setting"] == s
                                and r["prompt_id"] == p
                                and r["n"] == n
                            ]
                        )
                    )
                    for n in ns
                ]
                for p in pids
            ],
        }
    return out


def _h(gens: list[dict[str, Any]]) -> float:
    """Time per step beyond the verify pass: median of (decode - Σ T_T) / rounds."""
    return float(np.median([(g["decode_ms"] - g["sum_t_verify_ms"]) / g["rounds"] for g in gens]))


def _throughput_tables(gens: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for drafter in sorted({g["drafter"] for g in gens}):
        per_depth: dict[str, Any] = {}
        for d in sorted({g["depth"] for g in gens if g["drafter"] == drafter}):
            rows = []
            sel = [g for g in gens if g["drafter"] == drafter and g["depth"] == d]
            keys = sorted(
                {(g["k"], -1.0 if g["acceptance"] is None else g["acceptance"]) for g in sel}
            )
            for k, a in keys:
                gs = [
                    g
                    for g in sel
                    if g["k"] == k
                    and (g["acceptance"] if g["acceptance"] is not None else -1.0) == a
                ]
                drafted = sum(g["drafted"] for g in gs)
                rows.append(
                    {
                        "k": k,
                        "acceptance": None if a < 0 else a,
                        "generations": len(gs),
                        "prompts": [g["prompt_id"] for g in gs],
                        "tokens_per_s": float(np.median([g["tokens_per_s"] for g in gs])),
                        "tokens_per_s_each": [g["tokens_per_s"] for g in gs],
                        "tokens_per_s_wall": float(np.median([g["tokens_per_s_wall"] for g in gs])),
                        "tokens_per_round": float(np.mean([g["tokens_per_round"] for g in gs])),
                        "realised_acceptance": (
                            float(np.nanmean([g["realised_acceptance"] for g in gs])) if k else None
                        ),
                        "accepted_share": (
                            sum(g["accepted"] for g in gs) / drafted if drafted else None
                        ),
                        "mismatches": int(sum(g["mismatches"] for g in gs)),
                        "median_t_verify_ms": float(
                            np.median([g["median_t_verify_ms"] for g in gs])
                        ),
                        "median_t_draft_ms": float(np.median([g["median_t_draft_ms"] for g in gs])),
                        "h_ms": _h(gs),
                    }
                )
            per_depth[str(d)] = rows
        out[drafter] = per_depth
    return out


def _validate_files(
    folder: Path, label: str, records: list[dict[str, Any]], gens: list[dict[str, Any]]
) -> None:
    """verify.json and throughput.json in the `specmoe validate` runs format, for the depths
    with a verify sweep and a complete oracle grid."""
    vconf, tconf = [], []
    oracle = [g for g in gens if g["drafter"] == "oracle"]
    for d in sorted({r["depth"] for r in records}):
        sel = [g for g in oracle if g["depth"] == d]
        ks = sorted({g["k"] for g in sel})
        accs = sorted({g["acceptance"] for g in sel if g["acceptance"] is not None})
        if not sel or ks != list(range(len(ks))) or len(ks) < 2 or not accs:
            continue
        grid = np.full((len(accs), len(ks)), np.nan)
        for i, a in enumerate(accs):
            for j, k in enumerate(ks):
                gs = [g for g in sel if g["k"] == k and (k == 0 or g["acceptance"] == a)]
                if gs:
                    grid[i, j] = np.median([g["tokens_per_s"] for g in gs])
        if np.isnan(grid).any():
            continue
        rec = [r for r in records if r["depth"] == d]
        ns = sorted({r["n"] for r in rec})
        med = {
            s: [
                float(np.median([r["t_ms"] for r in rec if r["setting"] == s and r["n"] == n]))
                for n in ns
            ]
            for s in ("per_slot", "dedup")
        }
        pp = _per_prompt(records, d)
        vconf.append(
            {
                "depth": d,
                "n": ns,
                "verify_ms": {"off": med["per_slot"], "on": med["dedup"]},
                "per_prompt_ms": {
                    "off": pp["per_slot"]["median_ms"],
                    "on": pp["dedup"]["median_ms"],
                },
                "draft_ms": [_h([g for g in sel if g["k"] == k]) for k in ks],
            }
        )
        tconf.append(
            {"depth": d, "k": ks, "acceptance": accs, "tokens_per_s": grid.tolist(), "dedup": True}
        )
    if vconf:
        head = {"model": label, "device": "cpu", "engine": "specmoe"}
        atomic_write_json(folder / "verify.json", {**head, "configurations": vconf})
        atomic_write_json(folder / "throughput.json", {"model": label, "configurations": tconf})


# ------------------------------------------------------------------------------------------


def skip_unit(status: dict, key: str, done: Path, start: float, budget_min: float) -> bool:
    """True, with the unit's status set, when the unit is done (its file exists: resumed) or
    the campaign's budget of minutes since ``start`` is spent."""
    if done.exists():
        status.setdefault(key, {})["status"] = "done"
        return True
    if (time.perf_counter() - start) / 60 > budget_min:
        status[key] = {"status": "not run (budget spent)"}
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    import json

    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default results/cpu; --quick: out/runs-quick)",
    )
    ap.add_argument("--quick", action="store_true", help="a few-minute demonstration subset")
    ap.add_argument(
        "--budget",
        type=float,
        default=30.0,
        help="minutes after which no new unit starts (default 30)",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = args.out or (ROOT / "out" / "runs-quick" if args.quick else ROOT / "results" / "cpu")
    torch.set_num_threads(1)
    from specmoe.kernels import cpu

    cpu.set_num_threads(int(os.environ["SPECMOE_NUM_THREADS"]))
    units, cfg = plan(args.quick)
    manifest_path = out / "runs_campaign.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest.update(
        {
            "protocol": "docs/runs-protocol.md",
            "quick": args.quick,
            "clock": CLOCK,
            "command": "python scripts/measure_runs.py " + " ".join(argv or sys.argv[1:]),
            "machine": _machine(),
            "config": cfg,
            "seed": args.seed,
            "budget_min": args.budget,
        }
    )
    status = manifest.setdefault("units", {})
    models = Models(cfg, args.seed)
    start = time.perf_counter()
    for unit in units:
        key = f"{unit.model}/{unit.name}"
        folder = out / (
            unit.model if unit.model.startswith("bundled") else f"olmoe-dummy-{cfg['layers']}L"
        )
        done = folder / "units" / f"{unit.name}.json"
        if skip_unit(status, key, done, start, args.budget):
            continue
        if unit.kind == "draft-model":
            from specmoe.data import corpus

            if not (corpus.bundled_draft_dir() / "config.json").is_file():
                status[key] = {"status": "not run (no bundled draft model)"}
                continue
        info = {
            "status": "running",
            "load_start": _load(),
            "mem_available_gb_start": _mem_available_gb(),
            "started": time.time(),
        }
        status[key] = info
        atomic_write_json(manifest_path, manifest)
        t0 = time.perf_counter()
        result = run_unit(unit, models, folder, seed=args.seed)
        result.update(
            {
                "unit": unit.name,
                "kind": unit.kind,
                "depth": unit.depth,
                "params": unit.params,
                "wall_s": time.perf_counter() - t0,
            }
        )
        atomic_write_json(done, result)
        info.update(
            {
                "status": "done",
                "wall_s": time.perf_counter() - t0,
                "load_end": _load(),
                "mem_available_gb_end": _mem_available_gb(),
            }
        )
        aggregate(folder, models.get(unit.model)["label"])
        atomic_write_json(manifest_path, manifest)
    manifest["elapsed_min_this_invocation"] = (time.perf_counter() - start) / 60
    atomic_write_json(manifest_path, manifest)
    for key, info in status.items():
        print(
            f"{key}: {info['status']}" + (f" ({info['wall_s']:.0f} s)" if "wall_s" in info else ""),
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
