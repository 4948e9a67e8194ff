"""``specmoe campaign UNITS.json --out DIR [--ray [ADDRESS]]``: run a sweep of specmoe command
lines, each a unit with its declared CPUs and GPUs, and gather their files into DIR.

UNITS.json: ``{"units": [{"name": "bench-n1", "argv": ["bench", ..., "--out", "{out}/bench"],
"num_cpus": 2, "num_gpus": 1, "resources": {}}, ...]}``; ``{out}`` is the unit's own folder,
whose files land in DIR at the same relative paths (:mod:`specmoe.distributed.campaign`).
Without ``--ray`` the units run here, one after another; with it, as Ray tasks placed where
their resources are free. Rerunning skips finished units. DIR/campaign.json lists every unit's
status; ``--json`` prints it. Exit status 1 when a unit failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specmoe.commands._common import check_out_dir, out_folder
from specmoe.commands._ray import add_ray_arguments, ray_runtime
from specmoe.errors import InputError


def add_arguments(parser) -> None:
    parser.add_argument("units", metavar="UNITS.json", help="the campaign's units (see above)")
    parser.add_argument("--out", required=True, metavar="DIR", help="campaign folder")
    parser.add_argument(
        "--fresh", action="store_true", help="rerun every unit, even those recorded as done"
    )
    add_ray_arguments(parser, "run the units")
    parser.add_argument("--json", action="store_true", help="print JSON on stdout")


def load_units(path: str) -> list:
    """The units of a UNITS.json file (each a :func:`command_unit`); bad entries name the file."""
    from specmoe._io import read_json
    from specmoe.distributed.campaign import command_unit

    doc = read_json(path, "campaign units file")
    entries = doc.get("units") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{path}: needs a non-empty list 'units'")
    units = []
    for i, e in enumerate(entries):
        where = f"{path}: units[{i}]"
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            raise InputError(f"{where}: needs a 'name'")
        argv = e.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise InputError(f"{where}: 'argv' must be a non-empty list of strings")
        extra = set(e) - {"name", "argv", "num_cpus", "num_gpus", "resources"}
        if extra:
            raise InputError(f"{where}: unknown field {sorted(extra)[0]!r}")
        res = e.get("resources", {})
        if not isinstance(res, dict):
            raise InputError(f"{where}: 'resources' must be an object")
        try:
            units.append(
                command_unit(
                    e["name"],
                    argv,
                    num_cpus=e.get("num_cpus", 1),
                    num_gpus=e.get("num_gpus", 0),
                    **res,
                )
            )
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
    return units


def run(args) -> int:
    with out_folder(args.out):
        return _run(args)


def _run(args) -> int:
    from specmoe._io import dumps_json, to_jsonable
    from specmoe.distributed.campaign import run_campaign

    check_out_dir(args.out)
    units = load_units(args.units)

    def progress(res) -> None:
        msg = f"campaign: {res.name}: {res.status}"
        if res.error:
            msg += f" ({res.error})"
        elif res.seconds is not None:
            msg += f" in {res.seconds:.1f} s" + (f" on {res.node}" if res.node else "")
        print(msg, file=sys.stderr, flush=True)

    with ray_runtime(args, "campaign") as info:
        result = run_campaign(
            units,
            Path(args.out),
            executor="local" if info is None else "ray",
            resume=not args.fresh,
            progress=progress,
        )
    counts = {s: sum(u.status == s for u in result.units) for s in ("done", "skipped", "failed")}
    if args.json:
        print(dumps_json(to_jsonable({"out": str(result.out), **counts, "units": result.units})))
    else:
        print(
            f"{args.out}: {counts['done']} done, {counts['skipped']} already done, "
            f"{counts['failed']} failed"
        )
    return 1 if counts["failed"] else 0
