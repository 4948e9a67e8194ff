"""``specmoe stops``: where the offline Oracle stops (paper 000 Appendix B).

``--runs DIR`` (repeatable) as for ``specmoe oracle``: round logs at several budgets with the
counterfactual columns at the largest, pooled and split by drafter. For every drafter: the
Oracle of ``specmoe oracle`` (cost model (4) with its expert term α_k·Ū) and the same Oracle
with the expert term removed; at each state the Oracle visits, the new experts the next token
brings (experts not yet used in the pass) where the pass stops against where it continues,
and at the first draft mismatch against the position before it; boundary types of the code
(newline, indentation change, string/comment start, identifier/punctuation, decoded with the
model's tokenizer); the positions where k*+1 becomes cheaper without the expert term
(Figure B4) and the share of positions where the two Oracles differ; response-clustered
bootstrap intervals; example fragments (B1/B6). ``--json`` prints the result; ``--out DIR``
writes stops.json and the figures (B3-B5).
"""

from __future__ import annotations

import sys
from pathlib import Path

from specmoe._io import atomic_write_json, dumps_json
from specmoe.commands._common import check_float, check_int, check_out_dir, check_seed, out_folder
from specmoe.commands.inertia import add_runs, by_drafter, read_runs

MAX_BOOT = 100_000


def add_arguments(parser) -> None:
    add_runs(parser, "several budgets, routing and tokens at the largest")
    parser.add_argument(
        "--l-max", type=int, default=8, help="the Oracle's largest budget (default 8)"
    )
    parser.add_argument(
        "--model",
        default="bundled",
        help="the model folder whose tokenizer decodes the tokens (default: bundled)",
    )
    parser.add_argument(
        "--n-boot",
        type=int,
        default=2000,
        help="bootstrap resamples of responses (default 2000; 0: none; at most 100000)",
    )
    parser.add_argument(
        "--confidence", type=float, default=0.95, help="interval level (default 0.95)"
    )
    parser.add_argument(
        "--examples", type=int, default=12, help="example fragments per table (default 12)"
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="write stops.json and figures to DIR"
    )
    parser.add_argument("--no-figures", action="store_true", help="with --out: JSON only")


def _num(x, spec=".3f"):
    return "–" if x is None else format(x, spec)


def _iv(r):
    iv = r.get("interval")
    return "" if not iv else f" [{iv[0]:.3f}, {iv[1]:.3f}]"


def _table(d: dict) -> str:
    lines = []
    for r in d["drafters"]:
        ne = r["new_experts"]
        lines.append(
            f"{r['drafter']}: {r['responses']} responses, {r['positions']} positions, "
            f"{r['visited_states']} states the Oracle visits (L_max {r['l_max']})"
        )
        lines.append(
            f"  new experts of the next token: stop {_num(ne['stop']['mean'])}{_iv(ne['stop'])}"
            f", continue {_num(ne['continue']['mean'])}{_iv(ne['continue'])}"
        )
        mm = r["mismatch"]
        lines.append(
            f"  first mismatch {_num(mm['first_mismatch_where_before_exists']['mean'])}, "
            f"position before {_num(mm['before_mismatch']['mean'])}; difference "
            f"{_num(mm['mismatch_minus_before']['difference'])}{_iv(mm['mismatch_minus_before'])}"
        )
        et = r["expert_term"]["no_expert_term"]
        lines.append(
            f"  without the expert term: choices differ at "
            f"{_num(et['differ_share_visited']['mean'], '.1%')} of visited states "
            f"({_num(et['differ_share_all_positions'], '.1%')} of all positions); k*+1 cheaper "
            f"at {et['k_plus_1_cheaper_states']} of {et['visited_states']} states"
        )
        ks = r["k_star"]["full"]
        lines.append(
            f"  k* = 1: {_num(ks['k1']['mean'], '.1%')}, k* >= 4: {_num(ks['k_ge4']['mean'], '.1%')}, "
            f"mean k* {_num(ks['mean_k']['mean'])}"
        )
        for b in r["new_experts_by_boundary"]:
            lines.append(
                f"    {b['type']:<15} new experts {_num(b['all']['mean'])}{_iv(b['all'])}  "
                f"stop share {_num(b['stop_share']['mean'], '.1%')}"
            )
    return "\n".join(lines)


def run(args) -> int:
    with out_folder(args.out):
        return _run(args)


def _run(args) -> int:
    from specmoe._io import to_jsonable
    from specmoe.analysis.oracle_stops import stops_analysis
    from specmoe.engine.models import load_tokenizer
    from specmoe.errors import InputError

    check_int(args.l_max, "--l-max", low=1, high=64)
    check_int(args.n_boot, "--n-boot", low=0, high=MAX_BOOT)
    check_int(args.examples, "--examples", low=0, high=1000)
    check_float(args.confidence, "--confidence", low=0, high=1, closed="()")
    check_seed(args.seed)
    check_out_dir(args.out)
    log = read_runs(args.runs)
    print(f"loading the tokenizer of {args.model}", file=sys.stderr, flush=True)
    tok = load_tokenizer(args.model)
    pieces = [tok.decode([i]) for i in range(len(tok))]
    out = []
    for drafter, sub in by_drafter(log):
        if drafter == "unknown" or len(sub.budgets) < 2:
            print(f"skipping drafter {drafter}: fewer than two budgets", file=sys.stderr)
            continue

        def say(msg, drafter=drafter):
            print(f"{drafter}: {msg}", file=sys.stderr, flush=True)

        try:
            res = stops_analysis(
                sub,
                pieces,
                l_max=args.l_max,
                n_boot=args.n_boot,
                seed=args.seed,
                confidence=args.confidence,
                examples=args.examples,
                progress=say,
            )
        except InputError as exc:
            raise InputError(f"--runs: drafter {drafter}: {exc}") from None
        out.append({"drafter": drafter, **res})
    if not out:
        raise InputError("--runs: no drafter with rounds at two or more budgets")
    d = to_jsonable(
        {
            "schema": "specmoe.stops/1",
            "runs": [str(p) for p in args.runs],
            "n_boot": args.n_boot,
            "confidence": args.confidence,
            "seed": args.seed,
            "tokenizer": str(args.model),
            "drafters": out,
        }
    )
    if args.out:
        folder = Path(args.out)
        atomic_write_json(folder / "stops.json", d)
        if not args.no_figures:
            from specmoe.report.analysis_figures import write_stops_figures

            for p in write_stops_figures(d, folder):
                print(f"wrote {p}", file=sys.stderr)
        print(f"wrote {folder / 'stops.json'}", file=sys.stderr)
    if args.json:
        print(dumps_json(d))
    else:
        print(_table(d))
    return 0
