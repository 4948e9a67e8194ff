"""The level of the whole-pass benchmark measured beside a llama.cpp campaign's runs
(docs/runs-protocol-llamacpp.md, round 7), and the version it gives.

A campaign run with ``--level-probe`` (``scripts/llamacpp_campaign.py``) runs one cell of the
benchmark at the unit's depth just before each unit: one un-profiled pass of every n = 1..9,
each after an untimed pass of its own window, on the benchmark's prompt. The committed
profile's ``whole_pass.pass_ms`` holds the same passes (their medians) from the benchmark
that made the prediction. For a unit u at depth d:

    r_u = sum_n probe_u(n) / sum_n pass_ms(d, n)

and the level at d is the median of r_u over the verify units at d (the rule written before
the runs; the oracle units' probes are reported beside it, not used). The version is the
committed prediction with every time at depth d multiplied by that level: its profile is the
committed one plus ``whole_pass.level`` (``{"<depth>": level}``), which
:func:`specmoe.validate.whole_pass.whole_pass_version` applies; its plan is the committed
plan. With a draft of no cost (the oracle's) a uniform factor leaves k̂* and the predicted
speedup unchanged: the version tests the prediction's shape in n at the machine's level while
the runs ran.

Writes, under ``--out`` (one folder per configuration): ``profile.json``, ``plan.json`` and
``level.json`` (every unit's probe and r_u with the time it ran, the levels with the 10th and
90th percentiles, and per n the probes' median beside the sweep's τ(n): the benchmark's own
passes against the runs, as ``benchmarks/llamacpp_bench_vs_sweep.py`` compares them).

Usage: ``python scripts/llamacpp_level.py --predictions DIR --runs FOLDER --out DIR
[--configs llamacpp-bundled]``. Errors are one line, exit 2, and nothing is written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specmoe._io import atomic_write_bytes, atomic_write_json, read_json  # noqa: E402
from specmoe.errors import InputError  # noqa: E402


def _units(folder: Path) -> list[dict[str, Any]]:
    units = []
    for path in sorted((folder / "units").glob("*.json")):
        u = read_json(path, "campaign unit")
        if not isinstance(u, dict) or u.get("kind") not in ("verify", "oracle"):
            raise InputError(f"{path}: not a campaign unit (no kind verify or oracle)")
        u["_path"] = str(path)
        units.append(u)
    if not units:
        raise InputError(f"{folder / 'units'}: no campaign units")
    return units


def _reference(profile: dict[str, Any], depth: int, ns: list[int], where: str) -> np.ndarray:
    wp = profile.get("whole_pass") or {}
    ds, pn, pass_ms = wp.get("d"), wp.get("n"), wp.get("pass_ms")
    if not isinstance(ds, list) or not isinstance(pn, list) or not isinstance(pass_ms, list):
        raise InputError(f"{where}: no whole_pass.pass_ms (a llama.cpp whole-pass profile)")
    if depth not in ds:
        raise InputError(f"{where}: the benchmark has no depth {depth} (it has {ds})")
    missing = [n for n in ns if n not in pn]
    if missing:
        raise InputError(f"{where}: the benchmark has no pass of n = {missing[0]}")
    row = pass_ms[ds.index(depth)]
    return np.array([float(row[pn.index(n)]) for n in ns])


def level_of(profile: dict[str, Any], units: list[dict[str, Any]], where: str) -> dict[str, Any]:
    """The probes of ``units`` against ``profile``'s passes (module docstring): per unit r_u,
    per depth the level (median over its verify units) and the probes' and the sweep's
    per-n medians."""
    per_unit: list[dict[str, Any]] = []
    by_depth: dict[int, dict[str, list]] = {}
    for u in units:
        probe = u.get("level_probe")
        if not isinstance(probe, dict):
            raise InputError(f"{u['_path']}: no level_probe (run the campaign with --level-probe)")
        d, ns, ms = probe.get("depth"), probe.get("n"), probe.get("ms")
        if d != u.get("depth") or not isinstance(ns, list) or not isinstance(ms, list):
            raise InputError(f"{u['_path']}: level_probe is not a probe at the unit's depth")
        if len(ns) != len(ms) or not ms or not all(np.isfinite(ms)) or min(ms) <= 0:
            raise InputError(f"{u['_path']}: level_probe.ms must be positive times, one per n")
        ref = _reference(profile, int(d), [int(n) for n in ns], where)
        r = float(np.sum(ms) / np.sum(ref))
        per_unit.append({"unit": u.get("unit"), "kind": u["kind"], "depth": d, "ratio": r})
        at = by_depth.setdefault(int(d), {"verify": [], "oracle": [], "probe": [], "sweep": []})
        at[u["kind"]].append(r)
        if u["kind"] == "verify":
            at["probe"].append(ms)
            recs = u.get("records") or []
            at["sweep"].append(
                [float(np.median([x["t_ms"] for x in recs if x["n"] == n] or [np.nan])) for n in ns]
            )
    levels, depths = {}, {}
    for d, at in sorted(by_depth.items()):
        if not at["verify"]:
            raise InputError(f"{where}: no verify unit at depth {d} (the level needs them)")
        v = np.array(at["verify"])
        levels[str(d)] = float(np.median(v))
        probe, sweep = np.median(at["probe"], axis=0), np.nanmean(at["sweep"], axis=0)
        depths[str(d)] = {
            "level": levels[str(d)],
            "verify_units": len(v),
            "p10": float(np.percentile(v, 10)),
            "p90": float(np.percentile(v, 90)),
            "oracle_median": float(np.median(at["oracle"])) if at["oracle"] else None,
            "probe_median_ms": probe.tolist(),
            "sweep_tau_ms": sweep.tolist(),
            "sweep_over_probe": (sweep / probe).tolist(),
        }
    return {"levels": levels, "depths": depths, "units": per_unit}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--predictions", type=Path, required=True, help="the committed prediction")
    ap.add_argument("--runs", type=Path, required=True, help="the campaign's folder")
    ap.add_argument("--out", type=Path, required=True, help="the version's folder")
    ap.add_argument("--configs", default="llamacpp-bundled")
    args = ap.parse_args(argv)
    try:
        made = []
        for c in [c for c in args.configs.split(",") if c]:
            src = args.predictions / c
            prof_path, plan_path = src / "profile.json", src / "plan.json"
            for p in (prof_path, plan_path):
                if not p.is_file():
                    raise InputError(f"--predictions: {p}: no such file")
            profile = read_json(prof_path, "profile")
            read_json(plan_path, "plan")  # a JSON file, or one line naming it
            lev = level_of(profile, _units(args.runs / c), str(prof_path))
            profile = json.loads(json.dumps(profile))
            profile["whole_pass"]["level"] = lev["levels"]
            profile["whole_pass"]["level_base"] = {  # relative to the version's folder
                "profile": os.path.relpath(prof_path.resolve(), (args.out / c).resolve()),
                "sha256": hashlib.sha256(prof_path.read_bytes()).hexdigest(),
            }
            profile["whole_pass"]["level_how"] = (
                "median over the verify units of sum_n probe(n) / sum_n pass_ms(d, n): the "
                f"benchmark's passes measured beside the runs of {args.runs} "
                "(scripts/llamacpp_level.py)"
            )
            from specmoe.formats.profile import profile_from_dict

            profile_from_dict(profile, path=str(prof_path))  # the version loads as validate reads
            made.append((c, profile, plan_path, lev))
    except InputError as e:
        print(f"llamacpp_level: error: {e}", file=sys.stderr)
        return 2
    for c, profile, plan_path, lev in made:
        out = args.out / c
        atomic_write_json(out / "profile.json", profile)
        # the committed plan byte for byte (validate checks its recorded SHA-256)
        atomic_write_bytes(out / "plan.json", plan_path.read_bytes())
        atomic_write_json(out / "level.json", {"runs": str(args.runs), **lev})
        for d, x in lev["depths"].items():
            print(
                f"{c} d={d}: level {x['level']:.3f} [{x['p10']:.3f}, {x['p90']:.3f}] over "
                f"{x['verify_units']} verify units; sweep / probe "
                + " ".join(f"{v:.2f}" for v in x["sweep_over_probe"]),
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
