"""``specmoe report``: one HTML page of every result a folder holds."""

from __future__ import annotations

import sys

from specmoe.commands._common import check_out_file
from specmoe.report.html import write_report

# what makes each kind of result, shown on the page where a kind is missing
MADE_BY = {
    "validation": "specmoe validate --plan PLAN --runs DIR --out DIR",
    "plan": "specmoe plan --out DIR",
    "profile": "specmoe bench --out DIR",
    "routing": "specmoe stats TRACE --out DIR",
    "runs": "scripts/measure_runs.py",
    "oracle": "specmoe oracle --runs DIR --out DIR",
    "policies": "specmoe policy --runs DIR --out DIR",
    "inertia": "specmoe inertia --runs DIR --out DIR",
    "stops": "specmoe stops --runs DIR --out DIR",
    "drafters": "specmoe drafters --out DIR",
    "transfer": "specmoe transfer --profiles P P P --out DIR",
    "llamacpp": "python scripts/llamacpp_runs.py (after make llama-cpp)",
    "rounds": "specmoe run --out DIR",
}


def add_arguments(parser) -> None:
    parser.add_argument("dir", metavar="DIR", help="results folder to report on")
    parser.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="the HTML page to write (default DIR/report.html); figures go "
        "to FILE's folder under <name>_files/",
    )
    parser.add_argument(
        "--link", action="store_true", help="reference the figure files instead of embedding them"
    )
    parser.add_argument(
        "--json", action="store_true", help="print what was written as JSON on stdout"
    )


def run(args) -> int:
    from specmoe._io import dumps_json

    check_out_file(args.out)
    out, figures, counts = write_report(args.dir, args.out, embed=not args.link, made_by=MADE_BY)
    print(f"report: wrote {out} ({len(figures)} figures)", file=sys.stderr)
    if args.json:
        print(
            dumps_json({"report": str(out), "figures": [str(p) for p in figures], "found": counts})
        )
    return 0
