"""``specmoe oracle``: the offline Oracle bound, Delta space and the cost regression of runs.

``--runs DIR`` holds round logs (Parquet files or part directories, read recursively as one
log) at several budgets, with the counterfactual columns in the rounds at the largest one.
``--json`` prints one JSON object on stdout: ``l_max``, ``s_max``, ``mean_k``,
``mean_accepted``, ``cap_rate`` (lists over L_max = 1..l_max), ``delta_space`` (quadrant counts,
boundary slope, the DP's marginal value of a token), ``cost_model``, ``counterfactual`` and
``regression`` (Tables A2-A7 of paper 000 and the draft-time model). ``--out DIR`` writes
oracle.json and the figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specmoe._io import atomic_write_json, dumps_json
from specmoe.commands._common import (
    add_runs_argument,
    check_int,
    check_out_dir,
    check_seed,
    out_folder,
)

MAX_BOOT = 100_000


def add_arguments(parser) -> None:
    add_runs_argument(parser)
    parser.add_argument(
        "--l-max",
        type=int,
        default=8,
        help="largest budget to bound (default 8, at most the recorded one)",
    )
    parser.add_argument(
        "--cost",
        choices=("model", "measured"),
        default="model",
        help="the Oracle's cost: per-budget fits at each pass's experts "
        "(model, default) or the median measured time per budget",
    )
    parser.add_argument(
        "--acceptance",
        choices=("counterfactual", "geometric"),
        default="counterfactual",
        help="recorded matches (default) or each generation's geometric rate",
    )
    parser.add_argument(
        "--n-boot",
        type=int,
        default=999,
        help="bootstrap resamples by generation (default 999; 0: none; at most 100000)",
    )
    parser.add_argument(
        "--no-regression",
        action="store_true",
        help="skip the robustness tables (the per-budget fits still run)",
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="write oracle.json and figures to DIR"
    )
    parser.add_argument("--no-figures", action="store_true", help="with --out: JSON only")


def _table(d: dict) -> str:
    lines = ["L_max  S_max   mean k  mean accepted  capped"]
    for row in zip(d["l_max"], d["s_max"], d["mean_k"], d["mean_accepted"], d["cap_rate"]):
        lines.append("{:>5}  {:6.3f}  {:6.3f}  {:13.3f}  {:6.1%}".format(*row))
    ds = d["delta_space"]
    q = ds["quadrants"]
    lines.append(
        f"Delta space ({ds['points']} rejected candidates): I {q['I']}, II {q['II']}, "
        f"III {q['III']}, IV {q['IV']}, on axes {q['axes']}"
    )
    lam = ds["marginal_value"].get("median")
    lines.append(
        f"boundary slope {ds['slope']:.4g} ms/token (interval "
        f"{ds['slope_interval'][0]}..{ds['slope_interval'][1]}, "
        f"{ds['violations']} below); DP marginal value of a token: median "
        f"{lam if lam is None else f'{lam:.4g}'} ms"
    )
    reg = d.get("regression")
    if reg:
        lines.append("K   alpha ms/expert   c 1e-3 ms/token   beta0 ms     N     R2   OOS MAPE")

        def num(v, fmt, scale=1.0):
            return "—" if v is None else format(v * scale, fmt)

        for f in reg["by_k"]:
            lines.append(
                f"{f['k']:<3} {num(f['alpha'], '.4f')} ({num(f['se_alpha'], '.4f')})  "
                f"{num(f['c'], '.3f', 1e3)} ({num(f['se_c'], '.3f', 1e3)})     "
                f"{num(f['beta0'], '.3f')}  {f['n']:>6}  {num(f['r2'], '.4f')}  "
                f"{num(f['oos_mape'], '.2%')}"
            )
    return "\n".join(lines)


def run(args) -> int:
    """Hold --out against a second writer for the whole command (out_folder)."""
    with out_folder(args.out):
        return _run(args)


def _run(args) -> int:
    from specmoe._io import to_jsonable
    from specmoe.oracle.analysis import load_runs, oracle_analysis

    check_int(args.n_boot, "--n-boot", low=0, high=MAX_BOOT)
    check_seed(args.seed)
    check_out_dir(args.out)
    print(f"reading {args.runs}", file=sys.stderr, flush=True)
    log = load_runs(args.runs)
    result = oracle_analysis(
        log,
        l_max=args.l_max,
        cost=args.cost,
        acceptance=args.acceptance,
        n_boot=args.n_boot,
        seed=args.seed,
        tables=not args.no_regression,
        quiet=False,
    )
    d = to_jsonable(result.to_json())
    for w in result.warnings:
        print(f"specmoe oracle: warning: {w}", file=sys.stderr, flush=True)
    if args.out:
        out = Path(args.out)
        atomic_write_json(out / "oracle.json", d)
        if not args.no_figures:
            from specmoe.report.oracle_figures import write_oracle_figures

            for p in write_oracle_figures(log, result, out):
                print(f"wrote {p}", file=sys.stderr)
        print(f"wrote {out / 'oracle.json'}", file=sys.stderr)
    if args.json:
        print(dumps_json(d))
    else:
        print(_table(d))
    return 0
