"""``specmoe stats TRACE``: reuse, union and overlap statistics of a routing trace.

Prints a summary (layer-mean ρ(n) and U(n) against uniform routing, ū(n), overlap at a few
lags against its baselines), or with ``--json`` the whole :class:`RoutingStats` on stdout;
``--out DIR`` writes ``stats.json`` and figures. Progress goes to stderr. ``--ray [ADDRESS]``
computes each shard's sums as a Ray task (a local runtime, or the cluster at ADDRESS) with the
same result (:mod:`specmoe.commands._ray`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from specmoe.commands._common import check_int, check_out_dir, check_seed, out_folder
from specmoe.commands._ray import add_ray_arguments, shard_executor
from specmoe.errors import InputError


def add_arguments(parser) -> None:
    parser.add_argument("trace", help="routing trace: a .npz file or a directory of shards")
    parser.add_argument(
        "--max-n",
        type=int,
        default=9,
        help="longest window of consecutive tokens (default 9, at most 4096)",
    )
    parser.add_argument(
        "--max-lag",
        type=int,
        default=None,
        help="longest overlap lag (default 16, or the longest document − 1; at most 4096)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="model spec (preset, HF config or spec JSON): weights ū(n) and "
        "ρ̄_k by expert bytes and must match the trace's N and m",
    )
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=0,
        metavar="B",
        help="document resamples for 95%% intervals (paper: 2000; default 0; at most 100000)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    parser.add_argument(
        "--aligned",
        action="store_true",
        help="use the same window starts for every n (Eq. (2) holds exactly)",
    )
    add_ray_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON on stdout")
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="write stats.json and figures to DIR"
    )


MAX_WINDOW = 4096  # --max-n and --max-lag: far beyond any document the statistics need
MAX_BOOTSTRAP = 100_000  # resamples (the paper uses 2000)


def _check_args(args) -> None:
    check_int(args.max_n, "--max-n", low=1, high=MAX_WINDOW)
    check_int(args.max_lag, "--max-lag", low=1, high=MAX_WINDOW)
    check_int(args.bootstrap, "--bootstrap", low=0, high=MAX_BOOTSTRAP)
    check_seed(args.seed)
    check_out_dir(args.out)


def _fmt(x, spec: str = ".3f") -> str:
    return "—" if x is None or x != x else format(float(x), spec)


def summary(stats, *, name: str = "trace") -> str:
    """A readable text summary of :class:`RoutingStats`."""
    iv = stats.intervals
    lines = [
        f"{name}: N={stats.num_experts} m={stats.top_k} L={stats.num_layers} "
        f"tokens={stats.tokens} documents={stats.documents}",
        f"{'n':>3} {'rho_mean':>20} {'uniform':>8} {'union_mean':>20} {'uniform':>8} {'u_bar':>7}",
    ]
    for k in range(stats.max_n):
        rho = _fmt(stats.rho_mean[k])
        uni = _fmt(stats.union_mean[k], ".2f")
        if iv is not None:
            rho += f" [{_fmt(iv.rho_mean.lo[k])},{_fmt(iv.rho_mean.hi[k])}]"
            uni += f" [{_fmt(iv.union_mean.lo[k], '.1f')},{_fmt(iv.union_mean.hi[k], '.1f')}]"
        lines.append(
            f"{k + 1:>3} {rho:>20} {_fmt(stats.uniform_rho[k]):>8} {uni:>20} "
            f"{_fmt(stats.uniform_union[k], '.2f'):>8} {_fmt(stats.u_bar[k]):>7}"
        )
    dec = stats.decomposition
    if stats.max_lag:
        ind = float(stats.overlap_independent[:, 0].mean())
        lines.append(
            f"overlap (layer mean): independence baseline {ind:.3f}, "
            f"uniform {stats.overlap_uniform:.3f}"
        )
        lines.append(f"{'lag':>3} {'overlap':>20} {'x indep':>8} {'temporal share':>15}")
        for j in sorted({1, 2, 3, 4, 8, 16} & set(range(1, stats.max_lag + 1))):
            ov = _fmt(stats.overlap_mean[j - 1])
            if iv is not None:
                ov += f" [{_fmt(iv.overlap_mean.lo[j - 1])},{_fmt(iv.overlap_mean.hi[j - 1])}]"
            lines.append(
                f"{j:>3} {ov:>20} {_fmt(dec.mean_ratio[j - 1], '.2f'):>8} "
                f"{_fmt(dec.mean_temporal_share[j - 1], '.1%'):>15}"
            )
    lines.append(
        f"identity |U − mΣ(1−ρ)|: max {stats.identity_error:.3g} "
        f"(window edges allow {stats.identity_bound:.3g})"
    )
    if iv is not None:
        lines.append(
            f"intervals: {iv.level:.0%} percentile, {iv.resamples} document "
            f"resamples, seed {iv.seed}"
        )
    return "\n".join(lines)


def run(args) -> int:
    """Hold --out against a second writer for the whole command (out_folder)."""
    with out_folder(args.out):
        return _run(args)


def _run(args) -> int:
    from specmoe._io import atomic_write_json, dumps_json
    from specmoe.formats.trace import open_trace
    from specmoe.routing.stats import compute_stats

    _check_args(args)
    spec = None
    if args.model is not None:
        from specmoe.spec import resolve_spec

        spec = resolve_spec(args.model)
    reader = open_trace(args.trace)
    total = len(reader.files)

    def progress(done: int, of: int) -> None:
        if of > 1:
            print(f"stats: shard {done}/{of}", file=sys.stderr, flush=True)

    if total > 1 or args.bootstrap:
        print(
            f"stats: {args.trace} ({total} shard{'s' * (total > 1)})"
            + (f", {args.bootstrap} resamples" if args.bootstrap else ""),
            file=sys.stderr,
            flush=True,
        )
    try:
        with shard_executor(args, "stats") as executor:
            stats = compute_stats(
                reader,
                max_n=args.max_n,
                max_lag=args.max_lag,
                spec=spec,
                bootstrap=args.bootstrap,
                seed=args.seed,
                aligned=args.aligned,
                progress=progress,
                executor=executor,
            )
    except InputError as exc:  # the model spec is compute_stats' ``spec``
        if exc.argument != "spec":
            raise
        raise exc.as_flag("--model") from None
    record = {
        "trace": str(args.trace),
        "model": spec.name if spec is not None else None,
        **stats.to_dict(),
    }
    if args.out is not None:
        from specmoe.report.routing_figures import write_stats_figures

        out = Path(args.out)
        atomic_write_json(out / "stats.json", record)
        paths = write_stats_figures(stats, out, title=Path(args.trace).name)
        print(f"stats: wrote {out / 'stats.json'} and {len(paths)} figures", file=sys.stderr)
    if args.json:
        print(dumps_json(record))
    else:
        print(summary(stats, name=str(args.trace)))
    return 0
