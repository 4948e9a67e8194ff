"""The runs-protocol campaign of ``scripts/measure_runs.py`` as Ray tasks, gathered into one folder.

Each unit of ``measure_runs.plan`` (verify-time sweeps, Oracle/n-gram/draft-model throughput
grids) becomes a :class:`specmoe.distributed.campaign.Unit` that declares ``--cpus-per-unit``
CPUs (and ``--gpus-per-unit`` GPUs) and runs ``measure_runs.run_unit`` in its own folder; its
files (``<model>/units/<unit>.json`` and the round logs under ``<model>/rounds/...``) land in
``--out`` at the same paths the script writes, and ``measure_runs.aggregate`` then writes each
model folder's tables and the ``verify.json``/``throughput.json`` that ``specmoe validate`` and
``specmoe report`` read, unchanged. A rerun skips finished units (their records in
``--out/campaign-units/``), as the script does.

Timed units must not share a machine: give each unit a whole node (``--cpus-per-unit`` = the
node's cores) or one slot of a custom resource that each node has once (``--node-slot``,
``ray start --resources '{"node-slot": 1}'``). Every node needs this checkout at the same path
(or ``ray job submit --working-dir``) and the same environment.

    python scripts/ray_runs_campaign.py [--quick] [--ray ADDRESS] [--ray-cpus N]
        [--cpus-per-unit 1] [--gpus-per-unit 0] [--node-slot] [--out DIR] [--dry-run]
        [--only UNIT...]

``--dry-run`` lists the units and their resources without starting Ray.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "scripts")):
    if p not in sys.path:
        sys.path.insert(0, p)


def _folder_of(unit: Any, cfg: dict[str, Any]) -> str:
    """The model folder ``measure_runs.main`` writes a unit into."""
    return unit.model if unit.model.startswith("bundled") else f"olmoe-dummy-{cfg['layers']}L"


def protocol_unit(folder: Path, *, name: str, model: str, quick: bool, seed: int) -> dict:
    """One unit of the protocol, run as ``measure_runs.main`` runs it, into ``folder``."""
    for p in (str(ROOT), str(ROOT / "scripts")):
        if p not in sys.path:
            sys.path.insert(0, p)
    import os

    import measure_runs as mr
    import torch

    from specmoe._io import atomic_write_json
    from specmoe.kernels import cpu

    torch.set_num_threads(1)
    cpu.set_num_threads(int(os.environ.get("SPECMOE_NUM_THREADS", "1")))
    units, cfg = mr.plan(quick)
    unit = next(u for u in units if u.name == name and u.model == model)
    models = mr.Models(cfg, seed)
    sub = folder / _folder_of(unit, cfg)
    t0 = time.perf_counter()
    result = mr.run_unit(unit, models, sub, seed=seed)
    result.update(
        {
            "unit": unit.name,
            "kind": unit.kind,
            "depth": unit.depth,
            "params": unit.params,
            "wall_s": time.perf_counter() - t0,
        }
    )
    atomic_write_json(sub / "units" / f"{unit.name}.json", result)
    return {"label": models.get(unit.model)["label"], "wall_s": result["wall_s"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the script's demonstration subset")
    ap.add_argument("--out", type=Path, default=None, help="default out/runs-ray[-quick]")
    ap.add_argument("--ray", default=None, metavar="ADDRESS", help="a cluster (default: local)")
    ap.add_argument("--ray-cpus", type=int, default=None, help="CPUs of a local runtime")
    ap.add_argument("--cpus-per-unit", type=float, default=1.0)
    ap.add_argument("--gpus-per-unit", type=float, default=0.0)
    ap.add_argument("--node-slot", action="store_true", help="one unit per node (see above)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true", help="list the units, start nothing")
    ap.add_argument(
        "--only", nargs="+", default=None, metavar="UNIT", help="run only these units (names)"
    )
    args = ap.parse_args(argv)
    import measure_runs as mr

    from specmoe.distributed.campaign import Unit, run_campaign

    units, cfg = mr.plan(args.quick)
    out = args.out or ROOT / "out" / ("runs-ray-quick" if args.quick else "runs-ray")
    extra = {"node-slot": 1.0} if args.node_slot else {}
    campaign = [
        Unit(
            name=f"{_folder_of(u, cfg)}.{u.name}",
            func=protocol_unit,
            kwargs={"name": u.name, "model": u.model, "quick": args.quick, "seed": args.seed},
            num_cpus=args.cpus_per_unit,
            num_gpus=args.gpus_per_unit,
            resources=extra,
        )
        for u in units
    ]
    if args.only:
        keep = [i for i, u in enumerate(campaign) if u.name in set(args.only)]
        if len(keep) != len(set(args.only)):
            raise SystemExit(f"--only: unknown unit among {args.only}")
        units, campaign = [units[i] for i in keep], [campaign[i] for i in keep]
    if args.dry_run:
        for u in campaign:
            print(json.dumps({"unit": u.name, "resources": u.demands}))
        return 0
    import ray

    from specmoe.distributed.ray_runtime import ray_session

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # a script, not a package
    with ray_session(args.ray, num_cpus=args.ray_cpus):
        result = run_campaign(
            campaign,
            out,
            executor="ray",
            progress=lambda r: print(f"{r.name}: {r.status} {r.error or ''}", file=sys.stderr),
        )
    labels: dict[str, str] = {}
    for u, r in zip(units, result.units):
        if isinstance(r.result, dict) and "label" in r.result:
            labels[_folder_of(u, cfg)] = r.result["label"]
    for folder, label in labels.items():  # the tables and the validate/report files
        mr.aggregate(out / folder, label)
    print(
        f"{out}: {len(result.units) - len(result.failed)} units done, {len(result.failed)} failed"
    )
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
