"""Does the whole-pass benchmark's own context slow the engine pass it times? In one process:
the engine's verify pass timed back to back, then ``specmoe.bench.ops.time_operations`` (the
benchmark of ``specmoe bench --whole-pass``, every operation alone in turn with its cache
flushes), then the pass back to back again, each the median over its repetitions on the
thread CPU clock, one thread, the same expert kernel. Repeat in fresh processes to see the
processes' level beside it.

    python benchmarks/pass_in_context.py --model Qwen3-30B-A3B-dummy --layers 4 \\
        --kernel per_slot --depth 512 --n 1,2,3,4,5 > context.json

Prints JSON: the back-to-back medians before and after, and the benchmark's own ``pass_ms``
and ``model_ms``, per n, in ms.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _positive_ints(text: str, flag: str) -> list[int]:
    try:
        v = [int(x) for x in text.split(",")]
    except ValueError:
        v = [0]
    if min(v) < 1:
        raise ValueError(f"{flag}: positive integers, comma-separated, got {text!r}")
    return v


def back_to_back(net, kernel: str, depth: int, ns: list[int], reps: int, seed: int) -> dict:
    """The engine pass at each n, ``reps`` times in a row after 2 warm-ups, on a cache of
    ``depth`` random entries (cropped back after each pass): {n: median ms}."""
    import numpy as np
    import torch

    from specmoe.engine.capture import RouterRecorder
    from specmoe.engine.speculative import crop_cache, new_cache
    from specmoe.engine.switch import KernelPolicy, KernelSwitch

    cfg = net.config
    attn = net.model.layers[0].self_attn
    wdt = next(attn.parameters()).dtype
    kvh = cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    switch = KernelSwitch(net, KernelPolicy(kernel)).install()
    rec = RouterRecorder(net).install()
    out = {}
    try:
        with torch.inference_mode():
            kv = new_cache(net)
            for i in range(len(net.model.layers)):
                k, v = (torch.randn(1, kvh, depth, hd, generator=gen).to(wdt) for _ in "kv")
                kv.update(k, v, i)
            for n in ns:
                ids = torch.from_numpy(rng.integers(0, cfg.vocab_size, (1, n)))
                ts = []
                for rep in range(-2, reps):
                    t0 = time.thread_time()
                    logits = net(input_ids=ids, past_key_values=kv, use_cache=True).logits[0]
                    torch.topk(logits.float(), 2, dim=-1).indices[:, 0].tolist()
                    rec.pop()
                    dt = (time.thread_time() - t0) * 1e3
                    crop_cache(kv, depth)
                    rec.clear()
                    if rep >= 0:
                        ts.append(dt)
                out[str(n)] = float(np.median(ts))
    finally:
        rec.remove()
        switch.remove()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bundled", help="bundled, PRESET-dummy or a local path")
    ap.add_argument("--layers", type=int, default=None, help="layers of a PRESET-dummy model")
    ap.add_argument("--kernel", default="per_slot", choices=("per_slot", "dedup"))
    ap.add_argument("--depth", type=int, default=512, help="tokens in the cache before a pass")
    ap.add_argument("--n", default="1,2,3,4,5", help="tokens a pass (at least 5 values)")
    ap.add_argument("--reps", type=int, default=15, help="back-to-back passes at each n")
    ap.add_argument("--bench-reps", type=int, default=9, help="the benchmark's repetitions")
    args = ap.parse_args(argv)
    try:
        ns = _positive_ints(args.n, "--n")
        if len(ns) < 5:
            raise ValueError(f"--n: the benchmark fits over n: give at least 5, got {args.n!r}")
        for flag, v in (("--depth", args.depth), ("--reps", args.reps),
                        ("--bench-reps", args.bench_reps)):  # fmt: skip
            if v < 1:
                raise ValueError(f"{flag}: must be >= 1, got {v}")
    except ValueError as exc:
        print(f"pass_in_context: {exc}", file=sys.stderr)
        return 2
    import torch

    from specmoe.bench.ops import time_operations
    from specmoe.engine.runner import load_target
    from specmoe.errors import InputError

    torch.set_num_threads(1)
    try:
        net, _, label, _ = load_target(args.model, layers=args.layers)
    except InputError as exc:
        print(f"pass_in_context: --model: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    before = back_to_back(net, args.kernel, args.depth, ns, args.reps, seed=0)
    res = time_operations(net, n_values=ns, depths=[args.depth], reps=args.bench_reps,
                          kernel=args.kernel, ceiling=False, progress=False)  # fmt: skip
    after = back_to_back(net, args.kernel, args.depth, ns, args.reps, seed=1)
    wp = res.whole_pass
    print(json.dumps({
        "model": label, "kernel": args.kernel, "depth": args.depth, "n": ns,
        "clock": "thread CPU", "threads": 1, "reps": args.reps, "bench_reps": args.bench_reps,
        "back_to_back_before_ms": before,
        "bench_pass_ms": dict(zip(map(str, ns), wp["pass_ms"][0], strict=True)),
        "bench_model_ms": dict(zip(map(str, ns), wp["model_ms"][0], strict=True)),
        "back_to_back_after_ms": after,
        "wall_s": time.perf_counter() - t0,
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
