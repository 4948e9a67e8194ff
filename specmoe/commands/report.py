"""``specmoe report``: one HTML page of every result a folder holds."""

from __future__ import annotations

import sys

from specmoe.report.html import write_report


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

    out, figures, counts = write_report(args.dir, args.out, embed=not args.link)
    print(f"report: wrote {out} ({len(figures)} figures)", file=sys.stderr)
    if args.json:
        print(
            dumps_json({"report": str(out), "figures": [str(p) for p in figures], "found": counts})
        )
    return 0
