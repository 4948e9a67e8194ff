"""Routing statistics of a large shard directory: one process against Ray tasks on this machine.

Writes a synthetic shard directory (``--tokens``, default 10^7; the issue's 10^8 is
``--tokens 100000000``, about 26 GB of expert ids at the default shape, written shard by shard):
sticky Markov routing of 16 layers, N = 64, m = 8 in documents of 2000-4000 tokens (the
generator of ``benchmarks/stats_speed.py``, one shard of ``--shard-tokens`` at a time, so the
generator holds one shard). Then, each in its own child process, the same
:func:`specmoe.routing.stats.compute_stats` (max_n = 9, max_lag = 16) on the directory:

* ``single``: shards read and summed in this process, one at a time;
* ``ray``: a local Ray runtime of ``--ray-cpus`` CPUs (default 2), one task per shard
  (:class:`specmoe.distributed.ray_runtime.RayShardExecutor`).

For each: the wall time of the statistics (Ray's start-up timed apart), the peak resident memory
of the child itself (``ru_maxrss``), of each Ray worker (its own ``ru_maxrss``, returned by the
task) and of the child's whole process tree (driver, Ray's raylet, GCS and workers; the sum of
each process's RSS sampled every 50 ms, shared pages counted once per process), against the
bytes of expert ids in the directory (uncompressed) and on disk. The two answers are checked to
be equal (their JSON records). One JSON record goes to stdout (and ``--out FILE``); progress to
stderr. Timings on a machine that other jobs share are noisy: the record carries the load.

    python benchmarks/stats_scale.py [--tokens 10000000] [--shard-tokens 1048576]
        [--ray-cpus 2] [--dir DIR] [--keep-dir] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

from specmoe._io import atomic_write_json, dumps_json  # noqa: E402
from specmoe.formats.trace import RoutingTrace, open_trace, save_trace  # noqa: E402

MAX_N, MAX_LAG = 9, 16


def log(msg: str) -> None:
    print(f"stats_scale: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
# the shard directory


def write_shards(folder: Path, args) -> dict:
    from stats_speed import sticky_trace

    folder.mkdir(parents=True, exist_ok=True)
    done, i, t0 = 0, 0, time.perf_counter()
    while done < args.tokens:
        n = min(args.shard_tokens, args.tokens - done)
        tr = sticky_trace(
            tokens=n,
            layers=args.layers,
            num_experts=args.experts,
            top_k=args.top_k,
            keep=args.keep,
            seed=args.seed + i,
        )
        names = [f"s{i}-d{d}" for d in range(tr.num_documents)]
        tr = RoutingTrace(
            experts=tr.experts,
            doc_offsets=tr.doc_offsets,
            num_experts=tr.num_experts,
            meta={"source": "stats_scale synthetic", "documents": names},
        )
        save_trace(tr, folder / f"shard-{i:05d}.npz", compress=not args.no_compress)
        done += n
        i += 1
        log(f"wrote shard {i} ({done}/{args.tokens} tokens)")
    files = sorted(folder.glob("shard-*.npz"))
    return {
        "shards": len(files),
        "tokens": args.tokens,
        "ids_bytes": args.tokens * args.layers * args.top_k * 2,  # int16 ids
        "disk_bytes": sum(f.stat().st_size for f in files),
        "write_s": time.perf_counter() - t0,
    }


# ------------------------------------------------------------------------------------------
# the child: one mode, timed


class _PeakExecutor:
    """The Ray executor, with each task also returning its worker's pid and peak RSS."""

    def __init__(self):
        from specmoe.distributed.ray_runtime import RayShardExecutor

        self.inner = RayShardExecutor()
        self.workers: dict[int, int] = {}

    def map_files(self, func, files, kwargs, progress=None):
        out = self.inner.map_files(_with_peak, files, {"func": func, **kwargs}, progress)
        results = []
        for res, pid, peak in out:
            self.workers[pid] = max(self.workers.get(pid, 0), peak)
            results.append(res)
        return results


def _with_peak(trace, *, func, **kwargs):
    res = func(trace, **kwargs)
    return res, os.getpid(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(args) -> int:
    from specmoe.routing.stats import compute_stats

    rec: dict = {"mode": args.child}
    reader = open_trace(args.dir)
    if args.child == "single":
        t0 = time.perf_counter()
        stats = compute_stats(reader, max_n=MAX_N, max_lag=MAX_LAG, bootstrap=args.bootstrap)
        rec["stats_s"] = time.perf_counter() - t0
    else:
        from specmoe.distributed.ray_runtime import ray_session

        t0 = time.perf_counter()
        with ray_session(None, num_cpus=args.ray_cpus) as info:
            rec["ray_start_s"] = time.perf_counter() - t0
            rec["ray_cpus"] = info["cpus"]
            ex = _PeakExecutor()
            t1 = time.perf_counter()
            stats = compute_stats(
                reader, max_n=MAX_N, max_lag=MAX_LAG, bootstrap=args.bootstrap, executor=ex
            )
            rec["stats_s"] = time.perf_counter() - t1
            rec["worker_peak_rss_bytes"] = sorted(ex.workers.values())
    rec["driver_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rec["u_bar_9"] = float(stats.u_bar[-1])
    atomic_write_json(args.result, rec)
    Path(args.result).with_suffix(".stats.json").write_text(json.dumps(stats.to_dict()))
    return 0


# ------------------------------------------------------------------------------------------
# the parent: memory of the child's process tree


def _tree_rss(root: int) -> int:
    kids: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/status") as fh:
                line = next((x for x in fh if x.startswith("VmRSS:")), None)
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
        rss[int(d)] = int(line.split()[1]) * 1024 if line else 0
    total, stack = 0, [root]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        stack.extend(kids.get(p, []))
    return total


def run_child(mode: str, args, work: Path) -> dict:
    result = work / f"{mode}.json"
    cmd = [
        sys.executable,
        __file__,
        "--child",
        mode,
        "--dir",
        str(args.dir),
        "--result",
        str(result),
    ]
    cmd += ["--ray-cpus", str(args.ray_cpus), "--bootstrap", str(args.bootstrap)]
    env = dict(os.environ, RAY_DEDUP_LOGS="0")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env)
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            stop.wait(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    code = proc.wait()
    stop.set()
    th.join()
    if code != 0:
        raise SystemExit(f"stats_scale: the {mode} child failed (exit {code})")
    rec = json.loads(result.read_text())
    rec["wall_s"] = time.perf_counter() - t0
    rec["tree_peak_rss_bytes"] = peak[0]
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=10**7)
    ap.add_argument("--shard-tokens", type=int, default=1 << 20)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--keep", type=float, default=0.7, help="per-expert keep probability")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bootstrap", type=int, default=0)
    ap.add_argument("--ray-cpus", type=int, default=2)
    ap.add_argument("--dir", default=None, help="shard directory (default: a temporary one)")
    ap.add_argument("--keep-dir", action="store_true", help="keep the shard directory")
    ap.add_argument("--reuse-dir", action="store_true", help="use the shards already in --dir")
    ap.add_argument("--no-compress", action="store_true", help="write uncompressed shards")
    ap.add_argument("--out", default=None, metavar="FILE")
    ap.add_argument("--child", choices=("single", "ray"), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="stats-scale-"))
    given_dir = args.dir
    args.dir = Path(args.dir) if args.dir else work / "shards"
    try:
        if args.reuse_dir:
            from specmoe.formats._common import read_members

            files = sorted(args.dir.glob("shard-*.npz"))
            tokens = sum(int(read_members(f, ("doc_offsets",))["doc_offsets"][-1]) for f in files)
            args.tokens = tokens
            data = {
                "shards": len(files),
                "tokens": tokens,
                "ids_bytes": tokens * args.layers * args.top_k * 2,
                "disk_bytes": sum(f.stat().st_size for f in files),
                "reused": True,
            }
        else:
            data = write_shards(args.dir, args)
        log(f"{data['shards']} shards, {data['disk_bytes'] / 2**20:.0f} MiB on disk")
        runs = {}
        for mode in ("single", "ray"):
            log(f"{mode}: computing")
            runs[mode] = run_child(mode, args, work)
            log(f"{mode}: {runs[mode]['stats_s']:.1f} s")
        a = json.loads((work / "single.stats.json").read_text())
        b = json.loads((work / "ray.stats.json").read_text())
        rec = {
            "benchmark": "stats_scale",
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "load_before": load_before,
            },
            "trace": {
                "tokens": args.tokens,
                "layers": args.layers,
                "num_experts": args.experts,
                "top_k": args.top_k,
                "shard_tokens": args.shard_tokens,
                **data,
            },
            "max_n": MAX_N,
            "max_lag": MAX_LAG,
            "bootstrap": args.bootstrap,
            "single": runs["single"],
            "ray": runs["ray"],
            "speedup_stats": runs["single"]["stats_s"] / runs["ray"]["stats_s"],
            "speedup_wall": runs["single"]["wall_s"] / runs["ray"]["wall_s"],
            "equal": a == b,
            "load_after": os.getloadavg(),
        }
        print(dumps_json(rec))
        if args.out:
            atomic_write_json(args.out, rec)
        return 0 if rec["equal"] else 1
    finally:  # a --dir of the caller's is never removed
        if args.keep_dir and given_dir is None:
            log(f"kept {args.dir}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
