"""Split a whole-model verify pass into the expert operation and everything else, on the engine.

    python scripts/engine_expert_time.py [--model bundled|dummy] [--depth 512] [--reps 3]
                                         [--profile PROFILE] [--out FILE]

The runs protocol's verify pass (docs/runs-protocol.md: the prompt's last token and the first
n - 1 tokens of the target's greedy continuation, from the same KV cache) is timed at n = 1..9
with the per-slot and the deduplicating kernel, and inside it the time of every call of the
kernel switch's expert operation (the thread's CPU time, one torch and one kernel thread).
Prints and writes JSON: per kernel and n, the median whole pass, the median summed expert
operation over the MoE layers, and their difference (the time outside the expert operation);
with ``--profile`` also the bandwidth profile's predicted and measured operation times summed
over the layers, the times Eq. (22) adds up. The first repetition is a warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("SPECMOE_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        choices=("bundled", "dummy"),
        default="dummy",
        help="the bundled model, or the 4-layer dummy OLMoE of the protocol",
    )
    ap.add_argument("--depth", type=int, default=512, help="context tokens (default 512)")
    ap.add_argument("--reps", type=int, default=3, help="recorded repetitions (default 3)")
    ap.add_argument("--profile", default=None, help="bandwidth profile to compare with")
    ap.add_argument("--out", default=None, help="write the JSON here")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.depth < 2:
        ap.error("--reps must be >= 1 and --depth >= 2")

    import measure_runs as mr
    import numpy as np
    import torch

    from specmoe._io import atomic_write_json
    from specmoe.engine import switch as sw
    from specmoe.engine.speculative import Engine, crop_cache, new_cache
    from specmoe.kernels import cpu

    torch.set_num_threads(1)
    cpu.set_num_threads(1)
    spent: dict[int, list[float]] = {}
    forward = sw.KernelSwitch._forward

    def timed(self, ex, x, ids, weights):
        t = time.thread_time()
        y = forward(self, ex, x, ids, weights)
        spent.setdefault(int(x.shape[0]), []).append(time.thread_time() - t)
        return y

    sw.KernelSwitch._forward = timed
    models = mr.Models({"layers": 4, "docs": 9, "min_tokens": 2048}, 0)
    m = models.get(args.model)
    name, ids = models.prompts(m["tokenizer"])[0]
    ids = ids[: args.depth]
    if m["forced"] is not None:
        m["forced"].use_document(name)
    out: dict = {
        "model": m["label"],
        "prompt": name,
        "depth": args.depth,
        "reps": args.reps,
        "clock": "cpu",
        "n": list(range(1, 10)),
        "kernels": {},
    }
    cont = None
    for setting in ("per_slot", "dedup"):
        eng = Engine(
            m["model"],
            policy=sw.KernelPolicy(setting),
            forced=m["forced"],
            prefill=m["prefill"],
            clock="cpu",
        )
        try:
            kv = new_cache(m["model"])
            eng.prefill(kv, ids[:-1])
            base = kv.get_seq_length()
            if cont is None:
                cont = eng.greedy(ids, 8)
            rows: dict[int, list[tuple[float, float]]] = {}
            for rep in range(args.reps + 1):
                for n in range(1, 10):
                    spent.clear()
                    crop_cache(kv, base)
                    v = eng.forward(kv, [ids[-1], *cont[: n - 1]])
                    if rep:
                        rows.setdefault(n, []).append((v.t_ms, 1e3 * sum(spent.get(n, []))))
        finally:
            eng.close()
        whole = [float(np.median([a for a, _ in rows[n]])) for n in range(1, 10)]
        expert = [float(np.median([b for _, b in rows[n]])) for n in range(1, 10)]
        out["kernels"][setting] = {
            "verify_ms": whole,
            "expert_ms": expert,
            "outside_ms": [a - b for a, b in zip(whole, expert, strict=True)],
        }
    if args.profile:
        from specmoe.formats.profile import load_profile

        prof = load_profile(args.profile)
        idx = [prof.n.index(n) for n in range(1, 10)]
        layers = len(m["model"].model.layers)
        out["profile"] = {"path": args.profile, "layers": layers}
        for p in ("per_slot", "dedup"):
            for src in ("predicted", "measured"):
                op = np.asarray(prof.op_time[p][src], float)
                tot = op.sum(0) if op.shape[0] == layers else op.mean(0) * layers
                out["profile"][f"{p}_{src}_ms"] = (tot[idx] * 1e3).tolist()
    text = json.dumps(out, indent=2)
    if args.out:
        atomic_write_json(Path(args.out), out)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
