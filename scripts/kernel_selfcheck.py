"""Every kernel against the float64 reference on one device: the kernel contract without pytest.

    python scripts/kernel_selfcheck.py [--device cpu|cuda] [--kernels a,b] [--json]

Runs :func:`specmoe.kernels.selfcheck.check` for each kernel (default: every registered kernel
with an implementation on the device but ``reference``), says each kernel's outcome on stderr
and, with ``--json``, prints every case's result (kernel, case, tol, error, ok, note) on stdout.
Exit status 0 when every case is within tolerance, 1 otherwise, 2 for bad input (no CUDA
device, an unknown kernel). ``scripts/gpu_check.sh`` runs it where pytest is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the source tree, installed or not

PROG = "kernel_selfcheck"
FLAGS = {"device": "--device", "kernels": "--kernels"}


def main(argv: list[str] | None = None) -> int:
    from specmoe.errors import InputError
    from specmoe.kernels.selfcheck import check, kernels_to_check, summary_line

    ap = argparse.ArgumentParser(
        prog=PROG, description="every kernel against the float64 reference"
    )
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--kernels", default=None, help="comma-separated (default: all)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    try:
        names = kernels_to_check(
            args.device, None if args.kernels is None else args.kernels.split(",")
        )
    except InputError as exc:
        shown = exc.as_flag(FLAGS[exc.argument]) if exc.argument in FLAGS else exc
        print(f"{PROG}: error: {shown}", file=sys.stderr)
        return 2
    results = []
    for k in names:
        res = check(k, args.device)
        results += res
        print(summary_line(k, args.device, res), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
