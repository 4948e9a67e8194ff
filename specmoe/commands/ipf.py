"""``specmoe ipf TRACE``: predict unique experts U_l(n) by maximum-entropy IPF (paper 003 §6.3).

Fits popularity and lagged co-activation on TRACE (a trace, or a STATS file written by
``specmoe synth --save-stats`` or ``ipf --out``), predicts U_l(n) for n = 2..max-n and compares
it with the union measured on ``--validate TRACE2`` (default: TRACE itself) and with the two
independence baselines. By default (``--pool documents``) each fit document gets its own laws
and the prediction is their window-weighted mean; ``--pool trace`` fits one law to the whole
fit trace, as paper 003 does (:func:`specmoe.routing.ipf.predict_union`; on the bundled traces
the first stays within 2% at every n, the second within 4%). ``--json`` prints the result on
stdout; ``--out DIR`` writes ``ipf.json``, the fitted ``stats.json`` and ``ipf_union.png``.
Progress goes to stderr. ``--ray [ADDRESS]`` fits the moments shard by shard as Ray tasks with
the same result (:mod:`specmoe.commands._ray`).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.commands._common import check_float, check_int, check_out_dir, out_folder
from specmoe.commands._ray import add_ray_arguments, shard_executor
from specmoe.errors import InputError


def add_arguments(parser) -> None:
    parser.add_argument(
        "trace", help="fit data: a trace (.npz or shard directory) or a STATS .json file"
    )
    parser.add_argument(
        "--validate",
        default=None,
        metavar="TRACE2",
        help="trace to score the prediction on (default: the fit trace)",
    )
    parser.add_argument(
        "--variant",
        choices=("uniform", "skewed"),
        default="skewed",
        help="uniform expert probabilities, or popularity bins (default)",
    )
    parser.add_argument(
        "--bins",
        type=int,
        default=8,
        help="popularity bins per layer for --variant skewed (default 8)",
    )
    parser.add_argument(
        "--pool",
        choices=("trace", "documents"),
        default=None,
        help="documents: a mixture of per-document laws weighted by their "
        "windows (default for a trace); trace: one law for the whole "
        "fit data (paper 003; the only choice for a STATS file)",
    )
    parser.add_argument(
        "--max-n",
        type=int,
        default=9,
        help="longest window (default 9); refused beyond 4e8 cell updates per IPF sweep or "
        "2 GiB of tables (laws x 2^n x n(n-1)/2: on the bundled trace n <= 12)",
    )
    parser.add_argument(
        "--tol",
        type=float,
        default=1e-10,
        help="IPF tolerance on every pairwise cell (default 1e-10)",
    )
    parser.add_argument("--max-iter", type=int, default=5000, help="most IPF sweeps (default 5000)")
    add_ray_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON on stdout")
    parser.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="write ipf.json, stats.json and ipf_union.png to DIR",
    )


@contextmanager
def _max_lag_is_max_n():
    """The statistics are fitted at lags 1..max_n-1: their ``max_lag`` is ``--max-n``."""
    try:
        yield
    except InputError as exc:
        if exc.argument != "max_lag":
            raise
        raise exc.as_flag("--max-n") from None


def _rel(pred: np.ndarray, emp: np.ndarray | None) -> np.ndarray | None:
    return None if emp is None else (pred - emp) / emp


def build_result(
    moments,
    pred,
    *,
    empirical: np.ndarray | None,
    fit_name: str,
    validate_name: str | None,
    tol: float,
    max_iter: int,
) -> dict[str, Any]:
    """The JSON record of one prediction (means are over layers, per n)."""
    emp_mean = None if empirical is None else empirical.mean(axis=0)
    pop = pred.popularity_baseline
    rel = _rel(pred.mean_predicted, emp_mean)
    rec: dict[str, Any] = {
        "fit": {"source": fit_name, "tokens": moments.tokens},
        "validate": None if validate_name is None else {"source": validate_name},
        "num_experts": moments.num_experts,
        "top_k": moments.top_k,
        "num_layers": moments.num_layers,
        "layers": moments.meta.get("layers"),
        "variant": pred.variant,
        "bins": pred.bins,
        "pooling": pred.pooling,
        "tol": tol,
        "max_iter": max_iter,
        "n": pred.n.tolist(),
        "predicted_union": pred.mean_predicted,
        "empirical_union": emp_mean,
        "relative_error": rel,
        "max_abs_relative_error": None if rel is None else float(np.abs(rel).max()),
        "per_layer": {
            "predicted": pred.predicted,
            "empirical": empirical,
            "status": pred.status.tolist(),
            "max_violation": pred.max_violation,
        },
        "converged": pred.converged,
        "clipped_targets": pred.clipped,
        "iterations": pred.iterations,
        "baselines": {
            "uniform_independent": pred.uniform_baseline,
            "popularity_independent": pop.mean(axis=0),
            "popularity_independent_per_layer": pop,
            "uniform_independent_relative_error": _rel(pred.uniform_baseline, emp_mean),
            "popularity_independent_relative_error": _rel(pop.mean(axis=0), emp_mean),
        },
    }
    return rec


def summary(rec: dict[str, Any]) -> str:
    lines = [
        f"ipf ({rec['variant']}, bins={rec['bins']}, pool={rec['pooling']}): "
        f"N={rec['num_experts']} "
        f"m={rec['top_k']} L={rec['num_layers']}, fit on {rec['fit']['source']}"
        + (f", scored on {rec['validate']['source']}" if rec["validate"] else ""),
        f"{'n':>3} {'IPF':>8} {'measured':>9} {'error':>8} {'indep':>8} {'uniform':>8}",
    ]
    emp = rec["empirical_union"]
    for i, n in enumerate(rec["n"]):
        e = "—" if emp is None else f"{emp[i]:9.3f}"
        r = "—" if emp is None else f"{rec['relative_error'][i]:+8.2%}"
        lines.append(
            f"{n:>3} {rec['predicted_union'][i]:8.3f} {e:>9} {r:>8} "
            f"{rec['baselines']['popularity_independent'][i]:8.3f} "
            f"{rec['baselines']['uniform_independent'][i]:8.3f}"
        )
    if rec["converged"]:
        lines.append("IPF converged everywhere")
    else:
        st = np.asarray(rec["per_layer"]["status"])
        worst = np.nanmax(np.asarray(rec["per_layer"]["max_violation"], dtype=float))
        lines.append(
            f"IPF did not converge in {int((st != 'converged').sum())} of {st.size} "
            f"(layer, n) cells; largest pairwise-cell violation {worst:.2g} "
            f"(see per_layer.status)"
        )
    return "\n".join(lines)


def run(args) -> int:
    """Hold --out against a second writer for the whole command (out_folder)."""
    with out_folder(args.out):
        return _run(args)


def _run(args) -> int:
    from specmoe._io import atomic_write_json, dumps_json, to_jsonable
    from specmoe.formats.trace import open_trace
    from specmoe.routing.ipf import (
        check_ipf_cost,
        fit_document_moments,
        fit_moments,
        load_moments,
        predict_union,
        save_moments,
    )
    from specmoe.routing.stats import compute_stats

    check_int(args.max_n, "--max-n", low=2)
    check_int(args.bins, "--bins", low=1)
    check_float(args.tol, "--tol", low=0.0, high=1.0, closed="(]")
    check_int(args.max_iter, "--max-iter", low=1)
    check_out_dir(args.out)
    fit_reader = moments = None
    if Path(args.trace).suffix.lower() == ".json":
        if args.pool == "documents":
            raise InputError(
                f"--pool documents needs a trace, not the statistics file {args.trace}"
            )
        args.pool = "trace"
        moments = load_moments(args.trace)
        moments.check_window(args.max_n, name="max_n")
        want = (moments.num_experts, moments.top_k, moments.num_layers)
    else:
        fit_reader = open_trace(args.trace)
        args.pool = args.pool or "documents"
        want = (fit_reader.num_experts, fit_reader.top_k, fit_reader.num_layers)
    if args.variant == "skewed" and args.bins > want[0]:
        raise InputError(f"--bins {args.bins} exceeds the N={want[0]} experts")
    # the fewest laws IPF solves (one pooled law per layer and bin): refuse before any fit
    # (windows longer than every document are refused by the fit itself, naming the documents)
    longest = None if fit_reader is None else fit_reader.longest_document()
    if longest is None or args.max_n - 1 < longest:
        check_ipf_cost(want[2] * (1 if args.variant == "uniform" else args.bins), args.max_n)
    reader = None
    if args.validate is not None:
        reader = open_trace(args.validate)
        have = (reader.num_experts, reader.top_k, reader.num_layers)
        if have != want:
            raise InputError(
                f"--validate {args.validate}: N, m, L = {have} but the fit data have {want}"
            )
    with shard_executor(args, "ipf") as executor:
        if moments is None:
            print(f"ipf: fitting statistics on {args.trace}", file=sys.stderr, flush=True)
            with _max_lag_is_max_n():
                moments = fit_moments(fit_reader, max_lag=args.max_n - 1, executor=executor)
        empirical = None
        if reader is not None:
            print(f"ipf: measuring the union on {args.validate}", file=sys.stderr, flush=True)
            empirical = compute_stats(reader, max_n=args.max_n, max_lag=1, executor=executor).union[
                :, 1:
            ]
        elif moments.union is not None and moments.union.shape[1] >= args.max_n:
            empirical = moments.union[:, 1 : args.max_n]
        source = moments
        if args.pool == "documents":
            with _max_lag_is_max_n():
                source = fit_document_moments(fit_reader, max_lag=args.max_n - 1, executor=executor)
            print(
                f"ipf: {len(source)} documents of more than {args.max_n - 1} tokens",
                file=sys.stderr,
                flush=True,
            )
    print(f"ipf: solving {args.variant} IPF for n = 2..{args.max_n}", file=sys.stderr, flush=True)
    pred = predict_union(
        source,
        max_n=args.max_n,
        variant=args.variant,
        bins=args.bins,
        tol=args.tol,
        max_iter=args.max_iter,
    )
    rec = to_jsonable(
        build_result(
            moments,
            pred,
            empirical=empirical,
            fit_name=args.trace,
            validate_name=args.validate,
            tol=args.tol,
            max_iter=args.max_iter,
        )
    )
    if args.out is not None:
        from specmoe.report.ipf_figures import plot_union_file

        out = Path(args.out)
        atomic_write_json(out / "ipf.json", rec)
        save_moments(moments, out / "stats.json")
        plot_union_file(rec, out / "ipf_union.png", title=Path(args.trace).name)
        print(
            f"ipf: wrote {out / 'ipf.json'}, {out / 'stats.json'}, {out / 'ipf_union.png'}",
            file=sys.stderr,
        )
    if args.json:
        print(dumps_json(rec))
    else:
        print(summary(rec))
    return 0
