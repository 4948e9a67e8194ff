"""How much does a llama.cpp verification pass move from one process to the next, and does
the page size of its memory move it? llama-bench in fresh processes, alternating settings.

The bundled model's passes at 2048 cached tokens fall in two groups from one visit to the next
(results/cpu/llamacpp/kv-width/README.md: repetition medians 1.5-1.7 ms and 2.2-3.0 ms), and
the campaigns' runs read 10-22% above the benchmark's passes there
(results/cpu/llamacpp/whole-pass/README.md, rounds 13-14), where 25 MiB of weights and a KV
cache of 2-2.5 MiB share a 32 MiB last-level cache. One cause that would act per process is
where a process's pages land in that cache: with 4 KiB pages the cache sets a buffer maps to
follow its physical pages, which differ from process to process; with 2 MiB pages (transparent
huge pages) every set index bit of a 32 MiB, 16-way cache lies inside one page, so the
placement follows the virtual addresses and is the same in every process.

Each process is ``llama-bench -m GGUF -p NS -n 0 -d DEPTH -r REPS -t 1 -fa off`` (the KV
cache's keys ``--kv-type``, ``--load-mode none`` by default so that the weights are
anonymous memory too); the processes alternate between the ``--thp-modes`` (written to
``/sys/kernel/mm/transparent_hugepage/enabled`` before each process, which needs root; the mode
found is restored at the end, also on an error), in the order A B B A A B ... so that neither
mode always goes first; with ``--cpus``, each process is pinned to one of those CPUs, every
(mode, CPU) pair a setting of its own in the same alternation. While a process runs, its
``AnonHugePages`` (``/proc/PID/smaps_rollup``) is sampled, and the largest value is recorded:
whether the mode took effect. Prints one JSON
record: per mode and n, every process's median, their median, and the spread (largest over
smallest process median); the load average before and after.

    python benchmarks/llamacpp_process_spread.py --gguf MODEL.gguf [--depth 2048]
        [--ns 1,2,4,8] [--reps 20] [--processes 8] [--thp-modes madvise,always]
        [--cpus 0,1] [--load-mode none] [--kv-type f16] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # its sibling modules, when loaded from a file
    sys.path.insert(0, str(HERE))

from _record import command_line  # noqa: E402

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MODES = ("always", "madvise", "never")


def thp_mode(path: Path = THP) -> str | None:
    """The selected transparent-huge-page mode (the bracketed word), or None if unreadable."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def order(modes: list[str], processes: int) -> list[str]:
    """The setting of each process: rounds of every setting, A B ..., then ... B A, and so
    on (with one setting, that setting every time)."""
    if len(modes) == 1:
        return list(modes) * processes
    out: list = []
    i = 0
    while len(out) < processes:
        out.extend(list(modes) if i % 2 == 0 else list(reversed(modes)))
        i += 1
    return out[:processes]


def _anon_huge_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def run_process(cmd: list[str], cpu: int | None = None) -> tuple[str, int | None]:
    """Run one llama-bench process (on CPU ``cpu`` alone if given); its stdout and the largest
    AnonHugePages (KiB) seen."""
    pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pin
    )
    peak = None
    while proc.poll() is None:
        kib = _anon_huge_kib(proc.pid)
        if kib is not None:
            peak = kib if peak is None else max(peak, kib)
        time.sleep(0.05)
    out, err = proc.communicate()
    if proc.returncode != 0:
        tail = (err or "").strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"llamacpp_process_spread: llama-bench failed: {tail[0]}")
    return out, peak


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="the model's GGUF file")
    ap.add_argument("--depth", type=int, default=2048, help="cached tokens (default 2048)")
    ap.add_argument("--ns", default="1,2,4,8", help="pass sizes (default 1,2,4,8)")
    ap.add_argument("--reps", type=int, default=20, help="llama-bench -r (default 20)")
    ap.add_argument("--processes", type=int, default=8, help="processes in all (default 8)")
    ap.add_argument(
        "--thp-modes",
        default=None,
        help="comma-separated transparent-huge-page modes to alternate (always, madvise, "
        "never; needs root); default: the mode found, unchanged",
    )
    ap.add_argument(
        "--cpus",
        default=None,
        help="comma-separated CPU numbers to alternate the processes over (each process pinned "
        "to one); default: not pinned",
    )
    ap.add_argument(
        "--load-mode",
        choices=("none", "mmap", "auto"),
        default="none",
        help="llama-bench --load-mode: none (default) reads the weights into anonymous memory",
    )
    ap.add_argument("--kv-type", default="f16", help="the KV cache's keys (f16 or q8_0)")
    ap.add_argument("--out", type=Path, default=None, help="also write the record here")
    a = ap.parse_args(argv)

    from specmoe.cost.llamacpp_plan import KV_TYPES, kv_flags
    from specmoe.engines.llamacpp import tool
    from specmoe.engines.llamacpp_logs import parse_bench_json

    if not Path(a.gguf).is_file():
        ap.error(f"--gguf: {a.gguf}: no such file")
    if a.kv_type not in KV_TYPES:
        ap.error(f"--kv-type: {a.kv_type!r} is not one of {', '.join(KV_TYPES)}")
    try:
        ns = [int(x) for x in a.ns.split(",")]
    except ValueError:
        ap.error(f"--ns: {a.ns!r} is not a comma-separated list of integers")
    if not ns or min(ns) < 1 or a.depth < 0 or a.reps < 1 or a.processes < 1:
        ap.error("--ns, --depth, --reps and --processes must be positive (--depth >= 0)")
    found = thp_mode()
    modes = [m.strip() for m in a.thp_modes.split(",")] if a.thp_modes else [found or "unknown"]
    if a.thp_modes:
        bad = [m for m in modes if m not in MODES]
        if bad:
            ap.error(f"--thp-modes: {bad[0]!r} is not one of {', '.join(MODES)}")
        if found is None or not os.access(THP, os.W_OK):
            ap.error(f"--thp-modes: {THP} is not writable here (needs root)")
    cpus: list[int | None] = [None]
    if a.cpus:
        try:
            cpus = [int(c) for c in a.cpus.split(",")]
        except ValueError:
            ap.error(f"--cpus: {a.cpus!r} is not a comma-separated list of CPU numbers")
        bad_cpu = [c for c in cpus if c not in os.sched_getaffinity(0)]
        if bad_cpu:
            ap.error(f"--cpus: CPU {bad_cpu[0]} is not one this process may run on")
    settings = [(m, c) for m in modes for c in cpus]
    cmd = [str(tool("llama-bench")), "-m", str(a.gguf), "-t", "1", "-r", str(a.reps)]
    cmd += [
        "-fa",
        "off",
        *kv_flags(a.kv_type, bench=True),
        "--load-mode",
        a.load_mode,
        "-o",
        "json",
    ]
    cmd += ["-p", ",".join(map(str, ns)), "-n", "0", "-d", str(a.depth)]

    load_before = os.getloadavg()
    procs = []
    try:
        for i, (mode, cpu) in enumerate(order(settings, a.processes)):
            if a.thp_modes:
                THP.write_text(mode)
            out, huge = run_process(cmd, cpu) if cpu is not None else run_process(cmd)
            times = parse_bench_json(out)
            med = {t.n_prompt: float(np.median(t.samples_ms)) for t in times}
            key = mode if cpu is None else f"{mode}/cpu{cpu}"
            procs.append(
                {
                    "process": i,
                    "thp": mode,
                    "cpu": cpu,
                    "setting": key,
                    "anon_huge_kib_max": huge,
                    "median_ms": med,
                }
            )
            print(
                f"process {i + 1} of {a.processes} ({key}): "
                + " ".join(f"n={n} {med[n]:.3f}" for n in ns),
                file=sys.stderr,
                flush=True,
            )
    finally:
        if a.thp_modes and found:
            THP.write_text(found)
    summary = {}
    for mode in dict.fromkeys(p["setting"] for p in procs):
        mine = [p for p in procs if p["setting"] == mode]
        per_n = {}
        for n in ns:
            xs = [p["median_ms"][n] for p in mine]
            per_n[str(n)] = {
                "process_medians_ms": xs,
                "median_ms": float(np.median(xs)),
                "spread": max(xs) / min(xs),
            }
        summary[mode] = per_n
    record = {
        "benchmark": "llamacpp_process_spread",
        "command": command_line(
            "benchmarks/llamacpp_process_spread.py", sys.argv[1:] if argv is None else argv
        ),
        "gguf": Path(a.gguf).name,
        "depth": a.depth,
        "ns": ns,
        "reps": a.reps,
        "load_mode": a.load_mode,
        "kv_type": a.kv_type,
        "thp_mode_found": found,
        "cpus": a.cpus,
        "processes": procs,
        "summary": summary,
        "loadavg_before": list(load_before),
        "loadavg_after": list(os.getloadavg()),
    }
    text = json.dumps(record, indent=1)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
