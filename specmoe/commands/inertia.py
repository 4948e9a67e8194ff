"""``specmoe inertia``: routing inertia of rejected drafts (paper 003 Sections 6.1, 9.4 and
Appendix H) from round logs recorded with routing.

``--runs DIR`` (repeatable) holds round logs (Parquet files or part directories, read
recursively); their rounds are pooled and split by drafter. For every drafter: the overlap of each
verified draft's experts with position j - s (s = 1..--max-step), for accepted drafts, first
rejections (predecessor accepted) and the cascade after a rejection, per layer and layer mean;
Δ = accepted - rejected, Cohen's d, the overlap of the two distributions (2Φ(-|d|/2) and the
empirical one), prompt-clustered bootstrap intervals, per-layer differences (Figure 8), the
anchor overlap with position 0 (Figure 9), slices by prompt category (the stdlib document's
top-level package) and the AUC of overlap alone as an early-rejection score, in and out of
sample. ``--json`` prints the result; ``--out DIR`` writes inertia.json and the figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specmoe._io import atomic_write_json, dumps_json
from specmoe.commands._common import check_float, check_int, check_out_dir, check_seed, out_folder

MAX_BOOT = 100_000
PAPER = {
    "source": "paper 003 Section 6.1, Section 9.4, Appendix H.3 (Qwen3-235B, K = 3)",
    "step1_first_rejection": 0.488,
    "step1_accepted": 0.447,
    "distribution_overlap": 0.85,
    "mean_difference_over_sd": "3-7x smaller than the per-sample standard deviation",
    "layers_abs_delta_over_0.05_step3": "71 of 94, all negative",
    "cascade_minus_first_rejection_pp": "1-5",
}


def add_runs(parser, what: str) -> None:
    parser.add_argument(
        "--runs",
        action="append",
        required=True,
        metavar="DIR",
        help=f"round logs with routing and tokens ({what}); repeat to pool several folders",
    )


def read_runs(paths: list[str]):
    """The round logs of every ``--runs`` as one log."""
    from specmoe.analysis.oracle_stops import concat_logs
    from specmoe.formats.roundlog import read_round_log

    logs = []
    for p in paths:
        print(f"reading {p}", file=sys.stderr, flush=True)
        logs.append(read_round_log(p))
    return concat_logs(logs)


def by_drafter(log):
    """[(drafter, its rounds)], drafters in sorted order."""
    codes, labels = log.codes("drafter")
    return [(str(lab) or "unknown", log.select(codes == i)) for i, lab in enumerate(labels)]


def add_arguments(parser) -> None:
    add_runs(parser, "a Parquet file or a directory of them")
    parser.add_argument(
        "--max-step", type=int, default=4, help="largest step s between positions (default 4)"
    )
    parser.add_argument(
        "--n-boot",
        type=int,
        default=2000,
        help="bootstrap resamples of prompts (default 2000; 0: none; at most 100000)",
    )
    parser.add_argument(
        "--confidence", type=float, default=0.95, help="interval level (default 0.95)"
    )
    parser.add_argument(
        "--splits",
        type=int,
        default=20,
        help="random halvings of the prompts for the out-of-sample AUC (default 20)",
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap and split seed (default 0)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="write inertia.json and figures to DIR"
    )
    parser.add_argument("--no-figures", action="store_true", help="with --out: JSON only")


def _table(d: dict) -> str:
    lines = []
    for r in d["drafters"]:
        lines.append(
            f"{r['drafter']}: {r['prompts']} prompts, {r['rounds']} drafted rounds; "
            f"baselines uniform {r['baselines']['uniform']:.3f}, "
            f"independence {r['baselines']['independence']:.3f}"
        )
        lines.append(
            "step  accepted  first rej.  cascade   Δ(acc-first) [interval]     d      "
            "OVL normal  OVL empirical  AUC  AUC oos"
        )
        for s, c in zip(r["steps"], r["classifier"]):
            k = s["kinds"]
            f = s["vs_accepted"]["first_rejection"] or {}

            def m(x):
                return "   –  " if x is None else f"{x:.4f}"

            iv = f.get("delta_interval")
            ivs = "" if not iv else f"[{iv[0]:+.4f}, {iv[1]:+.4f}]"
            lines.append(
                f"{s['step']:>4}  {m(k['accepted']['mean'])}    {m(k['first_rejection']['mean'])}"
                f"      {m(k['cascade']['mean'])}   {f.get('delta', float('nan')):+.4f} "
                f"{ivs:<22} {f.get('d', float('nan')):+.3f}   "
                f"{f.get('overlap_normal', float('nan')):.3f}       "
                f"{f.get('overlap_empirical', float('nan')):.3f}        "
                + ("–" if c is None else f"{c['auc']:.3f}  {c['oos_threshold_auc']:.3f}")
            )
    return "\n".join(lines)


def run(args) -> int:
    with out_folder(args.out):
        return _run(args)


def _run(args) -> int:
    from specmoe._io import to_jsonable
    from specmoe.analysis.inertia import baselines, inertia_analysis, pairs_from_log

    check_int(args.max_step, "--max-step", low=1, high=64)
    check_int(args.n_boot, "--n-boot", low=0, high=MAX_BOOT)
    check_int(args.splits, "--splits", low=1, high=10_000)
    check_float(args.confidence, "--confidence", low=0, high=1, closed="()")
    check_seed(args.seed)
    check_out_dir(args.out)
    log = read_runs(args.runs)
    out = []
    for drafter, sub in by_drafter(log):
        if not (sub["k"] >= 1).any():
            print(f"skipping drafter {drafter}: no drafted rounds", file=sys.stderr)
            continue
        if not sub.has("routing"):
            from specmoe.errors import InputError

            raise InputError(f"--runs: drafter {drafter}: rounds recorded without routing")
        print(f"{drafter}: overlap of {int((sub['k'] >= 1).sum())} rounds", file=sys.stderr)
        pairs = pairs_from_log(sub, max_step=args.max_step)
        anchor = pairs_from_log(sub, anchor=True, clusters=pairs.clusters)
        print(f"{drafter}: statistics, {args.n_boot} bootstrap resamples", file=sys.stderr)
        res = inertia_analysis(
            pairs,
            anchor,
            max_step=args.max_step,
            n_boot=args.n_boot,
            seed=args.seed,
            confidence=args.confidence,
            splits=args.splits,
        )
        out.append(
            {
                "drafter": drafter,
                "rounds": int((sub["k"] >= 1).sum()),
                "num_layers": int(pairs.shared.shape[1]),
                "top_k": pairs.top_k,
                "num_experts": pairs.num_experts,
                "baselines": baselines(sub),
                **res,
            }
        )
    if not out:
        from specmoe.errors import InputError

        raise InputError("--runs: no drafted rounds (k >= 1) in any drafter's round logs")
    d = to_jsonable(
        {
            "schema": "specmoe.inertia/1",
            "runs": [str(p) for p in args.runs],
            "max_step": args.max_step,
            "n_boot": args.n_boot,
            "confidence": args.confidence,
            "seed": args.seed,
            "sign": "delta and d are accepted minus rejected: negative means the rejected "
            "drafts share more experts with their predecessor (routing inertia)",
            "paper": PAPER,
            "drafters": out,
        }
    )
    if args.out:
        folder = Path(args.out)
        atomic_write_json(folder / "inertia.json", d)
        if not args.no_figures:
            from specmoe.report.analysis_figures import write_inertia_figures

            for p in write_inertia_figures(d, folder):
                print(f"wrote {p}", file=sys.stderr)
        print(f"wrote {folder / 'inertia.json'}", file=sys.stderr)
    if args.json:
        print(dumps_json(d))
    else:
        print(_table(d))
    return 0
