"""``specmoe bench --engine llama.cpp``: llama.cpp's verify passes timed by its own llama-bench.

One pass of n = 1..``--n-max`` tokens on a KV cache of each ``--depths`` (``llama-bench -p
1,...,N -n 0 -d D -r REPS -t THREADS -fa off``), for ``--model`` exported to GGUF at
``--dtype`` (bf16 by default; f32, f16, q8_0) by llama.cpp's converter, or a ``.gguf`` file as
it is. ``--out`` gets ``llamacpp_verify.json``; ``--json`` prints the same on stdout.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from specmoe.errors import InputError

_DTYPE_ALIASES = {"bfloat16": "bf16", "float32": "f32", "float16": "f16"}


def _outtype(args: argparse.Namespace) -> str | None:
    """The GGUF weight type of --dtype; None for a .gguf --model (its own types)."""
    from specmoe.engines import llamacpp

    if str(args.model).endswith(".gguf"):
        if not Path(args.model).is_file():
            raise InputError(f"--model: {args.model}: no such GGUF file")
        return None
    outtype = _DTYPE_ALIASES.get(str(args.dtype), args.dtype) if args.dtype else "bf16"
    if outtype not in llamacpp.OUTTYPES:
        raise InputError(
            f"--dtype: unknown {args.dtype!r} for llama.cpp "
            f"(choose from {', '.join(llamacpp.OUTTYPES)})"
        )
    return outtype


def _gguf_of(args: argparse.Namespace, outtype: str | None, tmp: str) -> tuple[Path, str]:
    from specmoe.engine.models import resolve_model_dir
    from specmoe.engines import llamacpp

    if outtype is None:
        return Path(args.model), "as exported"
    model_dir = resolve_model_dir(args.model)
    print(f"bench: exporting {model_dir} to GGUF ({outtype})", file=sys.stderr)
    return llamacpp.export_gguf(
        model_dir, Path(tmp) / f"model-{outtype}.gguf", outtype=outtype
    ), outtype


def run_bench(args: argparse.Namespace) -> int:
    from specmoe._io import atomic_write_json, dumps_json
    from specmoe.commands._common import check_at_most, check_int, check_out_dir
    from specmoe.commands.bench import MAX_N, MAX_REPS, parse_depths
    from specmoe.engines import llamacpp

    check_out_dir(args.out)
    depths = parse_depths(args.depths)
    n_max = 9 if args.n_max is None else args.n_max
    reps = 50 if args.reps is None else args.reps
    threads = 1 if args.threads is None else args.threads
    check_int(n_max, "--n-max", low=1, high=MAX_N)
    check_int(reps, "--reps", low=1, high=MAX_REPS)
    check_at_most(threads, "--threads", 4096)
    check_int(threads, "--threads", low=1)
    outtype = _outtype(args)
    llamacpp.require_built()
    with tempfile.TemporaryDirectory(prefix="specmoe-gguf-") as tmp:
        gguf, dtype = _gguf_of(args, outtype, tmp)
        verify: dict[str, list[dict[str, Any]]] = {}
        for d in depths:
            print(f"bench: llama-bench n=1..{n_max} at depth {d}", file=sys.stderr)
            times = llamacpp.bench_verify(
                gguf, n_values=tuple(range(1, n_max + 1)), depth=d, repeats=reps, threads=threads
            )
            verify[str(d)] = [
                {
                    "n": t.n_prompt,
                    "median_ms": t.median_ms,
                    "mean_ms": t.mean_ms,
                    "min_ms": min(t.samples_ms),
                    "samples_ms": list(t.samples_ms),
                }
                for t in times
            ]
    result = {
        "engine": "llama.cpp",
        "llama_cpp": llamacpp.VERSION,
        "model": str(args.model),
        "dtype": dtype,
        "threads": threads,
        "flash_attn": False,
        "reps": reps,
        "verify": verify,
    }
    files = []
    if args.out:
        files.append(str(atomic_write_json(Path(args.out) / "llamacpp_verify.json", result)))
    if args.json:
        print(dumps_json({**result, "files": files}))
        return 0
    print(f"llama.cpp {llamacpp.VERSION} verify pass, {dtype}, {threads} thread(s), median ms")
    print("depth " + " ".join(f"{'n=' + str(n):>7}" for n in range(1, n_max + 1)))
    for d, rows in verify.items():
        print(f"{d:>5} " + " ".join(f"{r['median_ms']:7.3f}" for r in rows))
    for f in files:
        print(f"wrote {f}")
    return 0
