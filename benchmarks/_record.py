"""What the benchmarks of this folder share: their record written and printed."""

from __future__ import annotations

import json
from pathlib import Path


def emit(record: dict, out: str | None) -> None:
    """``record`` as indented JSON on stdout, and in the file ``out`` when given (its folder
    made)."""
    text = json.dumps(record, indent=1)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
    print(text)
