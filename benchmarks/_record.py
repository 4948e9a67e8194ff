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


def emit(record: dict, out: str | None) -> None:
    """``record`` as indented JSON on stdout, and in the file ``out`` when given (its folder
    made)."""
    text = json.dumps(record, indent=1)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
    print(text)
