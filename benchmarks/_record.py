"""What the benchmarks of this folder share: their record written and printed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def run_fields(load_before: tuple[float, ...], t0: float) -> dict:
    """The machine's load average before (given) and after (now) a run started at
    ``time.time()`` = ``t0``, and its wall seconds: the fields every record ends with."""
    return {
        "load_before": list(load_before),
        "load_after": list(os.getloadavg()),
        "wall_s": time.time() - t0,
    }


def command_line(script: str, argv: list[str]) -> str:
    """The command that made a record, the user's home directory written ``~``: a record names
    no particular machine's paths."""
    from specmoe._io import home_as_tilde

    return " ".join(["python", script, *home_as_tilde(argv)])


def pass_fields(name: str, args) -> dict:
    """The fields every record of a one-thread llama.cpp pass benchmark starts with: its
    name, the GGUF's file name and size, the prompt depth, one thread on the CPU clock."""
    return {
        "benchmark": name,
        "gguf": Path(args.gguf).name,
        "gguf_bytes": Path(args.gguf).stat().st_size,
        "depth": args.depth,
        "threads": 1,
        "clock": "cpu",
    }


def emit(record: dict, out: str | None) -> None:
    """``record`` as indented JSON on stdout, and in the file ``out`` when given (its folder
    made)."""
    text = json.dumps(record, indent=1)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
    print(text)


def add_pass_args(ap, reps_help: str) -> None:
    """The options of a benchmark of llama.cpp passes on prompts: --gguf, --depth (prompt
    tokens), --reps and --out."""
    ap.add_argument("--gguf", required=True, help="the model's GGUF file")
    ap.add_argument("--depth", type=int, default=512, help="prompt tokens (default 512)")
    ap.add_argument("--reps", type=int, default=12, help=reps_help)
    ap.add_argument("--out", default=None, help="also write the record to this file")


def check_pass_args(ap, args) -> None:
    """``ap.error`` (exit 2, one line) for a --depth or --reps below 2 or a missing --gguf."""
    if args.depth < 2 or args.reps < 2:
        ap.error("--depth and --reps must be at least 2")
    if not Path(args.gguf).is_file():
        ap.error(f"--gguf: {args.gguf}: no such file")
