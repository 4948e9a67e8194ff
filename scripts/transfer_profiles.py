"""Bandwidth profiles of every preset that fits this machine, for ``specmoe transfer``.

For each preset: one layer of uniform-IPF routing at its N and m carried from the bundled fit
trace's layer-mean overlap (:func:`specmoe.analysis.transfer.transfer_routing`, written to
``OUT/<preset>/routing.npz``), then ``specmoe bench`` at the preset's real shapes with dummy
bf16 weights, one thread timed by its CPU time, one timed layer, at ``nice -n 19`` (the
machine may be shared), one preset at a time::

    python scripts/transfer_profiles.py [--out results/cpu/bench-transfer] [--presets A,B]
        [--windows 4] [--reps 3] [--tokens 2048] [--seed 0] [--device cpu|cuda]

A preset whose profile.json already exists is skipped (delete it to measure again).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

PRESETS = ["OLMoE-1B-7B-0125", "Qwen3-30B-A3B", "gpt-oss-20b", "DeepSeek-V2-Lite", "Mixtral-8x7B"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/cpu/bench-transfer")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: wall clock, no thread limit (the CPU run times one thread)",
    )
    args = ap.parse_args()

    from specmoe.analysis.transfer import transfer_routing
    from specmoe.data.corpus import bundled_trace_path
    from specmoe.formats.trace import load_trace, save_trace
    from specmoe.routing.ipf import fit_moments
    from specmoe.spec import resolve_spec

    fit = bundled_trace_path("fit")
    moments = fit_moments(load_trace(fit), max_lag=8)
    moments.meta.setdefault("file", fit.name)
    for name in [p.strip() for p in args.presets.split(",") if p.strip()]:
        spec = resolve_spec(name)
        folder = Path(args.out) / name
        if (folder / "profile.json").exists():
            print(f"{name}: profile exists, skipped", file=sys.stderr)
            continue
        folder.mkdir(parents=True, exist_ok=True)
        trace = transfer_routing(
            moments,
            num_experts=spec.num_experts,
            top_k=spec.top_k,
            tokens=args.tokens,
            seed=args.seed,
        )
        save_trace(trace, folder / "routing.npz")
        where = (["--clock", "cpu", "--threads", "1"] if args.device == "cpu"
                 else ["--device", "cuda", "--clock", "wall"])  # fmt: skip
        cmd = [
            "nice", "-n", "19", sys.executable, "-m", "specmoe.cli", "bench", "--model", name,
            "--dtype", "bfloat16", *where, "--layers", "1",
            "--windows", str(args.windows), "--reps", str(args.reps), "--seed", str(args.seed),
            "--trace", str(folder / "routing.npz"), "--out", str(folder),
        ]  # fmt: skip
        print(" ".join(cmd), file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        with open(folder / "bench.log", "w") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
        print(f"{name}: rc {rc} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        if rc != 0:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
