"""Routing statistics of a large shard directory: one process against Ray tasks on this machine.

Writes a synthetic shard directory (``--tokens``, default 10^7; the issue's 10^8 is
``--tokens 100000000``): sticky Markov routing of ``--layers`` layers (default 16), N = 64,
m = 8, in documents of 2000-4000 tokens: each slot of a token's set is redrawn with probability
1 − ``--keep`` from a skewed per-layer popularity, a draw already in the set being refused (the
process of ``benchmarks/stats_speed.py``). The writer (:func:`sticky_shards`) steps all the
documents of a group of shards at once, checks set membership on a 64-bit mask per document and
layer, and runs ``--writers`` processes (default 2), each writing its own shards atomically.
Then, each in its own child process, the same :func:`specmoe.routing.stats.compute_stats`
(max_n = 9, max_lag = 16, ``--bootstrap`` resamples) on the directory:

* ``single``: shards read and summed in this process, one at a time;
* ``ray``: a local Ray runtime of ``--ray-cpus`` CPUs (default 2), one task per shard
  (:class:`specmoe.distributed.ray_runtime.RayShardExecutor`); the per-document sums of the
  bootstrap are computed by the tasks and resampled on the driver.

Memory: ``--mem-limit`` (bytes, default 1 GiB) caps the private data of every process that
holds shard arrays (``RLIMIT_DATA``: heap and anonymous mappings, Ray's shared object store not
included): the single child, the Ray driver once the runtime is up, and each Ray worker (set by
its first task), so a run that held more than a bounded number of shards would fail with a
``MemoryError``. Measured for each: the wall time of the statistics (Ray's start-up timed
apart), the peak resident memory of the child itself (``ru_maxrss``), of each Ray worker (its
own ``ru_maxrss``, returned by the task) and of the child's whole process tree (driver, Ray's
raylet, GCS and workers; the sum of each process's RSS sampled every 50 ms, shared pages counted
once per process), against the bytes of expert ids in the directory (uncompressed) and on disk.
The two answers are checked to be equal (their JSON records, bootstrap intervals included). One
JSON record goes to stdout (and ``--out FILE``); progress to stderr. Timings on a machine that
other jobs share are noisy: the record carries the load.

    python benchmarks/stats_scale.py [--tokens 10000000] [--layers 16] [--shard-tokens 1048576]
        [--bootstrap 0] [--mem-limit BYTES] [--writers 2] [--no-compress]
        [--ray-cpus 2] [--dir DIR] [--keep-dir] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
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

import numpy as np  # noqa: E402

from specmoe._io import atomic_write_json, dumps_json  # noqa: E402
from specmoe.formats.trace import RoutingTrace, open_trace, save_trace  # noqa: E402

MAX_N, MAX_LAG = 9, 16


def log(msg: str) -> None:
    print(f"stats_scale: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
# the shard directory


def sticky_shards(
    *,
    sizes: list[int],
    layers: int,
    num_experts: int,
    top_k: int,
    keep: float,
    seed: int,
    doc_len: tuple[int, int] = (2000, 4000),
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Sticky Markov shards of ``sizes`` tokens each: [(experts [T, L, m] int16,
    doc_offsets [D+1])], every document of the group stepped at once.

    Per token, each slot s = 0..m−1 in turn is redrawn with probability 1 − ``keep`` from the
    layer's popularity (a Dirichlet(1.5) draw, sampled through a pool of 2^16 draws) and keeps
    its expert when the draw is already in the set (the set is a 64-bit mask: N ≤ 64). One
    float32 uniform per slot decides both the redraw and the pool index.
    """
    if num_experts > 64:
        raise ValueError(f"num_experts: the set mask holds 64 experts, got {num_experts}")
    rng = np.random.default_rng(seed)
    L, N, m = layers, num_experts, top_k
    per: list[list[int]] = []
    for size in sizes:
        lengths: list[int] = []
        while sum(lengths) < size:
            lengths.append(int(rng.integers(doc_len[0], doc_len[1] + 1)))
        lengths[-1] -= sum(lengths) - size
        if lengths[-1] < 1:
            lengths.pop()
        per.append(lengths)
    lens = np.array([x for p in per for x in p], dtype=np.int64)  # [D]
    off = np.concatenate([[0], np.cumsum(lens)])  # [D+1]
    D = lens.size
    pop = rng.dirichlet(np.full(N, 1.5), size=L)  # [L, N]
    P = 1 << 16
    pool = np.stack([rng.choice(N, size=P, p=pop[i]) for i in range(L)]).astype(np.uint64)
    flat_pool, lay = pool.ravel(), (np.arange(L) * P)[None, :]  # [L*P], [1, L]
    order = np.argsort(-lens, kind="stable")  # longest first: the live documents are a prefix
    lens_s, start = lens[order], off[:-1][order]
    cur = np.argsort(rng.random((D, L, N)), axis=-1)[..., :m].astype(np.uint64)  # [D, L, m]
    one = np.uint64(1)
    mask = np.bitwise_or.reduce(one << cur, axis=-1)  # [D, L]
    experts = np.empty((int(off[-1]), L, m), dtype=np.int16)
    keep32, scale = np.float32(keep), np.float32(P / (1 - keep))
    live = D
    for i in range(int(lens_s[0])):
        while lens_s[live - 1] <= i:
            live -= 1
        if i:
            u = rng.random((live, L, m), dtype=np.float32)
            idx = np.clip(((u - keep32) * scale).astype(np.int64), 0, P - 1)
            redraw = u >= keep32
            mk = mask[:live]
            for s in range(m):
                cand = flat_pool[lay + idx[..., s]]  # [live, L]
                cs = cur[:live, :, s]
                ok = redraw[..., s] & (((mk >> cand) & one) == 0)
                mk ^= ((one << cs) | (one << cand)) * ok
                np.copyto(cs, cand, where=ok)
        experts[start[:live] + i] = cur[:live]
    out, d0 = [], 0
    for p in per:
        d1 = d0 + len(p)
        out.append((experts[off[d0] : off[d1]], off[d0 : d1 + 1] - off[d0]))
        d0 = d1
    return out


def _write_group(job: tuple) -> int:
    """Write the shards ``first..first+count−1`` of one group (a writer process's task)."""
    folder, first, sizes, args = job
    parts = sticky_shards(
        sizes=sizes,
        layers=args["layers"],
        num_experts=args["experts"],
        top_k=args["top_k"],
        keep=args["keep"],
        seed=args["seed"] * 1_000_003 + first,
    )
    for j, (ex, off) in enumerate(parts):
        i = first + j
        tr = RoutingTrace(
            experts=ex,
            doc_offsets=off,
            num_experts=args["experts"],
            meta={
                "source": "stats_scale synthetic",
                "documents": [f"s{i}-d{d}" for d in range(off.size - 1)],
            },
        )
        save_trace(tr, Path(folder) / f"shard-{i:05d}.npz", compress=args["compress"])
    return len(sizes)


def write_shards(folder: Path, args) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    sizes = [args.shard_tokens] * (args.tokens // args.shard_tokens)
    if args.tokens % args.shard_tokens:
        sizes.append(args.tokens % args.shard_tokens)
    n_shards = len(sizes)
    conf = {
        "layers": args.layers,
        "experts": args.experts,
        "top_k": args.top_k,
        "keep": args.keep,
        "seed": args.seed,
        "compress": not args.no_compress,
    }
    g = max(1, args.group)
    jobs = [(str(folder), a, sizes[a : a + g], conf) for a in range(0, n_shards, g)]
    t0, done = time.perf_counter(), 0
    with multiprocessing.get_context("spawn").Pool(max(1, args.writers)) as pool:
        for count in pool.imap_unordered(_write_group, jobs):
            done += count
            log(f"wrote {done}/{n_shards} shards")
    files = sorted(folder.glob("shard-*.npz"))
    return {
        "shards": len(files),
        "tokens": args.tokens,
        "ids_bytes": args.tokens * args.layers * args.top_k * 2,  # int16 ids
        "disk_bytes": sum(f.stat().st_size for f in files),
        "compressed": not args.no_compress,
        "writers": args.writers,
        "write_s": time.perf_counter() - t0,
    }


# ------------------------------------------------------------------------------------------
# the child: one mode, timed


class _PeakExecutor:
    """The Ray executor, with each task also returning its worker's pid and peak RSS."""

    def __init__(self, mem_limit: int):
        from specmoe.distributed.ray_runtime import RayShardExecutor

        self.inner = RayShardExecutor()
        self.mem_limit = mem_limit
        self.workers: dict[int, int] = {}
        self.limits: dict[int, int] = {}

    def map_files(self, func, files, kwargs, progress=None):
        kw = {"func": func, "mem_limit": self.mem_limit, **kwargs}
        out = self.inner.map_files(_with_peak, files, kw, progress)
        results = []
        for res, pid, peak, limit in out:
            self.workers[pid] = max(self.workers.get(pid, 0), peak)
            self.limits[pid] = limit
            results.append(res)
        return results


def limit_data(limit: int) -> int:
    """Cap this process's private data (``RLIMIT_DATA``) at ``limit`` bytes; the cap in force."""
    if limit > 0 and resource.getrlimit(resource.RLIMIT_DATA)[0] != limit:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return resource.getrlimit(resource.RLIMIT_DATA)[0]


def _with_peak(trace, *, func, mem_limit, **kwargs):
    limit = limit_data(mem_limit)  # the worker's first task sets it: the shard read follows
    res = func(trace, **kwargs)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return res, os.getpid(), peak, limit


def child(args) -> int:
    from specmoe.routing.stats import compute_stats

    rec: dict = {"mode": args.child}
    reader = open_trace(args.dir)
    if args.child == "single":
        rec["driver_data_limit_bytes"] = limit_data(args.mem_limit)
        t0 = time.perf_counter()
        stats = compute_stats(reader, max_n=MAX_N, max_lag=MAX_LAG, bootstrap=args.bootstrap)
        rec["stats_s"] = time.perf_counter() - t0
    else:
        from specmoe.distributed.ray_runtime import ray_session

        t0 = time.perf_counter()
        with ray_session(None, num_cpus=args.ray_cpus) as info:
            rec["ray_start_s"] = time.perf_counter() - t0
            rec["ray_cpus"] = info["cpus"]
            rec["driver_data_limit_bytes"] = limit_data(args.mem_limit)  # Ray's own are up
            ex = _PeakExecutor(args.mem_limit)
            t1 = time.perf_counter()
            stats = compute_stats(
                reader, max_n=MAX_N, max_lag=MAX_LAG, bootstrap=args.bootstrap, executor=ex
            )
            rec["stats_s"] = time.perf_counter() - t1
            rec["worker_peak_rss_bytes"] = sorted(ex.workers.values())
            rec["worker_data_limit_bytes"] = sorted(set(ex.limits.values()))
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
    cmd += ["--mem-limit", str(args.mem_limit)]
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
    ap.add_argument(
        "--mem-limit",
        type=int,
        default=1 << 30,
        help="RLIMIT_DATA of each process holding shards, bytes (0: none)",
    )
    ap.add_argument("--writers", type=int, default=2, help="processes writing the shards")
    ap.add_argument("--group", type=int, default=4, help="shards a writer steps at once")
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
            "mem_limit_bytes": args.mem_limit,
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
