"""``specmoe transfer``: bandwidth of a held-out model from the other models' profiles
(paper 002 Appendix E "Transfer", Figure 7).

``specmoe transfer --profiles P [P ...] [--forms loglinear,structure] [--n-report 2,4,6,8]
[--json] [--out DIR]``

Each ``P`` is a ``profile.json`` of ``specmoe bench`` (or a folder holding one), one per model,
all from one machine and kernel set. Each model is held out in turn; each form of
:mod:`specmoe.analysis.transfer` (fixed before any held-out prediction) is fitted on the
others and predicts the held-out β_slot(n), β_dedup(n), r(n) and crossover. Prints the misses
beside the paper's; ``--out DIR`` writes transfer.json and the Figure-7 analogue. The record
also says whether this machine exposes a hardware counter of memory traffic (``perf``), the
CPU counterpart of the DRAM bytes paper 002 reads with Nsight Compute.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from specmoe.commands._common import check_out_dir, out_folder
from specmoe.errors import InputError

PAPER = {
    "beta_miss": "9-206% (median 23% CUDA, 47% Metal)",
    "r_miss": "2-30% on OLMoE and DeepSeek-V2-Lite, 33-86% on gpt-oss and Qwen3",
    "crossover_within_one": "transferred 1 of 6 (CUDA), 2 of 8 (Metal); measured 6 of 6, 7 of 8",
}
COUNTER_EVENTS = "cycles,LLC-load-misses,LLC-store-misses"


def add_arguments(parser) -> None:
    parser.add_argument("--profiles", nargs="+", required=True, metavar="P",
                        help="profile.json files (or folders holding one), one per model")  # fmt: skip
    parser.add_argument("--forms", default="loglinear,structure", metavar="LIST",
                        help="forms to fit (default loglinear,structure)")  # fmt: skip
    parser.add_argument("--n-report", default="2,4,6,8", metavar="LIST",
                        help="pass sizes of the summary misses (default 2,4,6,8)")  # fmt: skip
    parser.add_argument("--no-counters", action="store_true",
                        help="do not probe perf for memory-traffic counters")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--out", default=None, metavar="DIR", help="write transfer.json here")
    parser.add_argument("--no-figures", action="store_true", help="with --out: JSON only")


def memory_counters() -> dict[str, Any]:
    """Whether a hardware counter of memory traffic is readable here: perf_event_paranoid, a
    CPU PMU in sysfs, ``perf`` on the PATH and what ``perf stat -e`` answers for LLC misses."""
    out: dict[str, Any] = {"events": COUNTER_EVENTS}
    try:
        out["perf_event_paranoid"] = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
    except (OSError, ValueError):
        out["perf_event_paranoid"] = None
    pmus = Path("/sys/bus/event_source/devices")
    out["pmus"] = sorted(p.name for p in pmus.iterdir()) if pmus.is_dir() else []
    out["cpu_pmu"] = any(p in out["pmus"] for p in ("cpu", "cpu_core", "cpu_atom"))
    perf = shutil.which("perf")
    out["perf"] = perf
    out["readable"] = False
    if perf:
        try:
            res = subprocess.run(
                [perf, "stat", "-x", ",", "-e", COUNTER_EVENTS, "true"],
                capture_output=True,
                text=True,
                timeout=20,
                env={**os.environ, "LC_ALL": "C"},
            )
            lines = [ln for ln in res.stderr.splitlines() if ln.count(",") >= 2]
            out["perf_stat"] = lines
            out["readable"] = bool(lines) and all(
                "not supported" not in ln and "not counted" not in ln for ln in lines
            )
        except (OSError, subprocess.SubprocessError) as exc:
            out["perf_stat"] = [f"{type(exc).__name__}: {exc}"]
    return out


def _profile_file(p: str) -> Path:
    path = Path(p)
    if path.is_dir():
        path = path / "profile.json"
    if not path.is_file():
        raise InputError(f"--profiles {p}: no profile.json there")
    return path


def run(args) -> int:
    with out_folder(args.out):
        return _run(args)


def _run(args) -> int:
    from specmoe._io import atomic_write_json, dumps_json, to_jsonable
    from specmoe.analysis.transfer import FORMS, hold_out, profile_points
    from specmoe.formats.profile import load_profile

    check_out_dir(args.out)
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    if not forms or any(f not in FORMS for f in forms):
        raise InputError(f"--forms {args.forms!r}: choose from {', '.join(FORMS)}")
    try:
        n_report = tuple(sorted({int(t) for t in args.n_report.split(",") if t.strip()}))
    except ValueError:
        raise InputError(f"--n-report {args.n_report!r}: expected integers") from None
    if not n_report or n_report[0] < 2:
        raise InputError(f"--n-report {args.n_report!r}: expected integers >= 2")
    models, files, devices = [], [], set()
    for p in args.profiles:
        f = _profile_file(p)
        prof = load_profile(f)  # validated
        import json

        d = json.loads(f.read_text())
        devices.add((prof.device_name, prof.dtype, (prof.extra or {}).get("clock")))
        models.append(profile_points(d, name=str(f)))
        files.append(str(f))
    if len(models) < 3:
        raise InputError("--profiles: need profiles of at least three models")
    if len({m["model"] for m in models}) != len(models):
        raise InputError("--profiles: a model appears twice")
    if len(devices) > 1:
        print(f"transfer: warning: profiles from several set-ups {sorted(devices)}",
              file=sys.stderr)  # fmt: skip
    results = {f: hold_out(models, form=f, n_report=n_report) for f in forms}
    rec = to_jsonable(
        {
            "schema": "specmoe.transfer/1",
            "profiles": files,
            "setups": [list(s) for s in sorted(devices, key=str)],
            "models": [
                {
                    "model": m["model"],
                    "expert_bytes": m["b"],
                    "top_k": m["m"],
                    "crossover_bench": m["crossover"],
                }
                for m in models
            ],
            "forms": results,
            "paper": PAPER,
            "memory_counters": None if args.no_counters else memory_counters(),
        }
    )
    if args.out:
        out = Path(args.out)
        atomic_write_json(out / "transfer.json", rec)
        if not args.no_figures:
            from specmoe.report.analysis_figures import write_transfer_figures

            for p in write_transfer_figures(rec, out):
                print(f"wrote {p}", file=sys.stderr)
        print(f"wrote {out / 'transfer.json'}", file=sys.stderr)
    if args.json:
        print(dumps_json(rec))
    else:
        print(_table(rec))
    return 0


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def _table(d: dict) -> str:
    lines = []
    for form, r in d["forms"].items():
        lines.append(
            f"{form}: β miss {_pct(r['beta_miss_min'])}-{_pct(r['beta_miss_max'])} (median "
            f"{_pct(r['beta_miss_median'])}); crossover within one: transferred "
            f"{r['crossover_transferred_within_one']} of {r['configurations']}, own "
            f"{r['crossover_own_within_one']} of {r['configurations']}"
        )
        for m in r["models"]:
            rm = r["r_miss_by_model"].get(m["held_out"], [None, None])
            lines.append(
                f"  {m['held_out']:<18} b {m['expert_bytes'] / 1e6:7.1f} MB  r miss "
                f"{_pct(rm[0])}-{_pct(rm[1])}  crossover bench {m['crossover_bench']}, own "
                f"{m['crossover_own']}, transferred {m['crossover_transferred']}"
            )
    lines.append(f"paper: β miss {d['paper']['beta_miss']}; {d['paper']['crossover_within_one']}")
    mc = d.get("memory_counters")
    if mc is not None:
        lines.append(
            f"memory-traffic counters: {'readable' if mc['readable'] else 'not readable'} "
            f"(perf {'at ' + mc['perf'] if mc['perf'] else 'absent'}, paranoid "
            f"{mc['perf_event_paranoid']}, CPU PMU {'present' if mc['cpu_pmu'] else 'absent'})"
        )
    return "\n".join(lines)
