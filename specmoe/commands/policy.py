"""``specmoe policy``: online draft-budget policies against the Oracle on held-out prompts.

``--runs DIR`` as for ``specmoe oracle``. ``--json`` prints one JSON object: ``policies`` maps
each policy's name to its ``speedup`` over plain decoding, ``share_of_oracle`` (speedup over
the Oracle's S_max on the same held-out generations), time, mean k and mean accepted; with
``oracle``, ``training`` (what the policies learned) and the split. ``--out DIR`` writes
policies.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specmoe._io import atomic_write_json, dumps_json
from specmoe.commands._common import (
    add_runs_argument,
    check_float,
    check_int,
    check_out_dir,
    check_seed,
    out_folder,
)

MAX_REPEATS = 1000


def add_arguments(parser) -> None:
    add_runs_argument(parser)
    parser.add_argument("--l-max", type=int, default=8, help="largest budget (default 8)")
    parser.add_argument(
        "--test-fraction", type=float, default=0.5, help="share of prompts held out (default 0.5)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="simulations per policy, averaged over unrecorded draws (default 3, at most 1000)",
    )
    parser.add_argument(
        "--decay",
        type=float,
        default=0.9,
        help="per-round decay of the online acceptance estimate (default 0.9)",
    )
    parser.add_argument("--seed", type=int, default=0, help="split and simulation seed")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--out", default=None, metavar="DIR", help="write policies.json to DIR")


def run(args) -> int:
    """Hold --out against a second writer for the whole command (out_folder)."""
    with out_folder(args.out):
        return _run(args)


def _run(args) -> int:
    from specmoe._io import to_jsonable
    from specmoe.oracle.analysis import load_runs
    from specmoe.oracle.evaluate import evaluate_policies

    check_int(args.repeats, "--repeats", low=1, high=MAX_REPEATS)
    check_float(args.decay, "--decay", low=0.0, high=1.0, closed="(]")
    check_int(args.l_max, "--l-max", low=1)
    check_seed(args.seed)
    check_out_dir(args.out)
    print(f"reading {args.runs}", file=sys.stderr, flush=True)
    log = load_runs(args.runs)
    d = to_jsonable(
        evaluate_policies(
            log,
            l_max=args.l_max,
            test_fraction=args.test_fraction,
            repeats=args.repeats,
            seed=args.seed,
            decay=args.decay,
            quiet=False,
        )
    )
    for w in d["warnings"]:  # as `specmoe oracle` says them
        print(f"specmoe policy: warning: {w}", file=sys.stderr, flush=True)
    if args.out:
        path = atomic_write_json(Path(args.out) / "policies.json", d)
        from specmoe.report.oracle_figures import plot_policies

        fig = plot_policies(d, Path(args.out) / "policies.png")
        print(f"wrote {path} and {fig.name}", file=sys.stderr)
    if args.json:
        print(dumps_json(d))
    else:
        print(
            f"held-out Oracle S_max {d['oracle']['s_max']:.3f} (L_max {d['l_max']}); "
            f"knowing only each generation's acceptance rate "
            f"{d['oracle_rate_only']['s_max']:.3f} (its budgets on the recorded outcomes "
            f"{d['oracle_rate_only']['speedup_on_recorded']:.3f})"
        )
        print(f"{'policy':<20} speedup  share of Oracle  mean k  mean accepted")
        for name, p in d["policies"].items():
            print(
                f"{name:<20} {p['speedup']:7.3f}  {p['share_of_oracle']:15.1%}  "
                f"{p['mean_k']:6.2f}  {p['mean_accepted']:13.2f}"
            )
    return 0
