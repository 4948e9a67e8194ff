"""The whole-pass prediction against measured verify passes on a CUDA device, at full shapes.

For one preset (dummy weights, bf16 experts, the preset's own layer count unless ``--layers``):
the per-operation benchmark of every operation of a verify pass on the GPU (``specmoe bench
--whole-pass --device cuda``, added to the expert profile ``--profile`` when given), the plan
(``specmoe plan``) and, after both are written, the engine's measured verify passes at n = 1..9
with both kernel settings on prompts of the bundled validation split, routing forced from
``--trace``. Writes under ``--out``: profile.json (or whole_pass.json), plan/, verify.json
(records and per-n medians) and compare.json (predicted and measured tau(n), the relative
error at every n). Used by scripts/gpu_check.sh; on a machine without CUDA it exits 2.

Usage: ``python scripts/gpu_whole_pass.py --model OLMoE-1B-7B-0125 --profile P --out DIR``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="OLMoE-1B-7B-0125", help="preset (dummy weights)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: all)")
    ap.add_argument(
        "--profile", type=Path, default=None, help="expert profile (bench --device cuda)"
    )
    ap.add_argument("--trace", default="bundled:validation", help="forced routing")
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reps", type=int, default=9, help="repetitions of each operation")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    import numpy as np
    import torch

    if not torch.cuda.is_available():
        print("gpu_whole_pass: error: --device: torch sees no CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    spec = f"{args.model}-dummy"
    cli = [sys.executable, "-c", "import sys; from specmoe.cli import main; sys.exit(main())"]
    layer_args = ["--layers", str(args.layers)] if args.layers else []
    bench = [*cli, "bench", "--model", spec, *layer_args, "--whole-pass", "--device", "cuda"]
    bench += ["--depths", str(args.depth), "--reps", str(args.reps), "--out", str(args.out)]
    if args.profile is not None and args.profile.is_file():
        bench += ["--from", str(args.profile)]
    subprocess.run(bench, check=True)
    prediction = {}
    prof = args.out / "profile.json"
    if prof.is_file():  # a plan needs the expert fits: only with --profile
        plan = [*cli, "plan", "--model", args.model, *layer_args, "--bandwidth", str(prof)]
        plan += ["--context", str(args.depth), "--out", str(args.out / "plan")]
        if not args.trace.startswith("bundled:"):
            plan += ["--trace", args.trace]
        subprocess.run(plan, check=True)
        wp = json.loads((args.out / "plan" / "plan.json").read_text()).get("whole_pass") or {}
        prediction = {k: wp.get("verify_ms", {}).get(k) for k in ("per_slot", "dedup")}
    # the measured side, after the prediction is written
    from specmoe.engine.measure import verify_passes
    from specmoe.engine.runner import forced_from, load_target, validation_prompts
    from specmoe.engine.speculative import Engine
    from specmoe.engine.switch import KernelPolicy

    net, tok, label, _ = load_target(spec, layers=args.layers, device="cuda")
    forced = forced_from(args.trace, net)
    docs = validation_prompts(tok, count=args.prompts, context=args.depth + 1)
    eng = Engine(net, policy=KernelPolicy("dedup"), forced=forced, prefill="skip", clock="wall")

    def point(pid: str) -> None:
        forced.use_document(pid if pid in forced.documents else [d for d, _ in docs].index(pid))

    try:
        res = verify_passes(eng, docs, repeats=args.repeats, warmup=1, on_prompt=point)
    finally:
        eng.close()
    rec = res["records"]
    measured = {
        s: [float(np.median([r["t_ms"] for r in rec if r["setting"] == s and r["n"] == n]))
            for n in range(1, 10)]
        for s in ("per_slot", "dedup")
    }  # fmt: skip
    (args.out / "verify.json").write_text(
        json.dumps({"model": label, **res, "median_ms": measured})
    )
    compare = {
        "model": label,
        "depth": args.depth,
        "measured_ms": measured,
        "predicted_ms": prediction,
    }
    if all(prediction.get(s) for s in measured):
        compare["relative_error"] = {
            s: [abs(p - m) / m for p, m in zip(prediction[s][:9], measured[s])] for s in measured
        }
    (args.out / "compare.json").write_text(json.dumps(compare, indent=1))
    print(json.dumps(compare))
    return 0


if __name__ == "__main__":
    sys.exit(main())
