"""Cross-engine routing check: transformers against llama.cpp on the same weights and tokens.

    python scripts/cross_engine_routing.py [--model bundled|DIR] [--gguf FILE ...]
                                           [--outtype f32,bf16] [--tokens 5000] [--window 1024]
                                           [--batch 64] [--threads 1] [--kv-type f16,f32]
                                           [--out FILE]

The first ``--tokens`` tokens of the bundled corpus's validation split (stdlib source files,
tokenized by the model's own tokenizer; llama.cpp's tokens of the same documents are compared
with them) are teacher-forced through transformers (float32, RouterRecorder) and llama.cpp (its
eval callback on ``ffn_moe_topk-<l>``), in windows of ``--window`` tokens from position 0. For
each GGUF: the share of (token, layer) pairs whose top-k expert sets agree (target >= 99%), and
the near ties among the pairs that disagree (:mod:`specmoe.engines.routing_check`). Without
``--gguf`` the model is exported to a temporary GGUF per ``--outtype`` by ``specmoe export``.
Each GGUF runs with llama.cpp's KV cache in float16 (its default, what it serves with) and in
float32 (which leaves the weights' type as the only difference in storage).
Prints the JSON record; ``--out`` writes it too. Needs ``make llama-cpp``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from specmoe._io import atomic_path
    from specmoe.errors import InputError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bundled", help="HF checkpoint directory or 'bundled'")
    ap.add_argument("--gguf", nargs="+", default=None, help="GGUF exports of --model")
    ap.add_argument(
        "--outtype", default="f32,bf16", help="without --gguf: export these (default f32,bf16)"
    )
    ap.add_argument("--tokens", type=int, default=5000, help="tokens compared (default 5000)")
    ap.add_argument("--window", type=int, default=1024, help="tokens per window (default 1024)")
    ap.add_argument("--batch", type=int, default=64, help="llama.cpp ubatch (default 64)")
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads (default 1)")
    ap.add_argument(
        "--kv-type",
        default="f16,f32",
        help="llama.cpp's KV cache type(s): f16 (its default), f32 (default both)",
    )
    ap.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=FLOAT",
        help="GGUF float metadata replaced at load (llama.cpp's --override-kv KEY=float:V); "
        "each GGUF runs as exported and with these",
    )
    ap.add_argument(
        "--layerwise",
        action="store_true",
        help="transformers: bfloat16 weights cast to float32 one layer at a time (less memory)",
    )
    ap.add_argument("--name", default=None, help="the model's name in the record")
    ap.add_argument("--out", default=None, help="write the JSON record here")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _run(args, atomic_path)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, atomic_path) -> int:
    from specmoe.engine.models import load_tokenizer, resolve_model_dir
    from specmoe.engines import llamacpp
    from specmoe.engines.llamacpp_routing import KV_TYPES
    from specmoe.engines.routing_check import cross_engine_check, transformers_reference
    from specmoe.errors import InputError

    llamacpp.require_built()
    model_dir = resolve_model_dir(args.model)
    name = args.name or (args.model if args.model == "bundled" else Path(model_dir).name)
    for g in args.gguf or []:
        if not os.path.isfile(g):
            raise InputError(f"{g}: no such GGUF file", argument="--gguf")
    for kv in args.kv_type.split(","):
        if kv.strip() not in KV_TYPES:
            raise InputError(
                f"unknown {kv!r} (choose from {', '.join(KV_TYPES)})", argument="--kv-type"
            )
    kv_types = [x.strip() for x in args.kv_type.split(",") if x.strip()]
    overrides: dict[str, float] = {}
    for item in args.override:
        key, _, val = item.partition("=")
        try:
            overrides[key.strip()] = float(val)
        except ValueError:
            raise InputError(f"{item!r}: not KEY=FLOAT", argument="--override") from None
        if not key.strip():
            raise InputError(f"{item!r}: not KEY=FLOAT", argument="--override")
    variants = [None, overrides] if overrides else [None]
    t0 = time.time()
    tok = load_tokenizer(str(model_dir))
    print(f"transformers: {args.tokens} tokens of {name}", file=sys.stderr)
    # the model is loaded there and released before llama.cpp loads its copy
    ref = transformers_reference(
        model_dir,
        tokens=args.tokens,
        window=args.window,
        tokenizer=tok,
        model_name=name,
        layerwise=args.layerwise,
    )
    checks = []
    with tempfile.TemporaryDirectory(prefix="specmoe-routing-check-") as tmp:
        if args.gguf:
            ggufs = [(Path(g).name, Path(g)) for g in args.gguf]
        else:
            ggufs = []
            for ot in [x.strip() for x in args.outtype.split(",") if x.strip()]:
                path = Path(tmp) / f"{name}-{ot}.gguf"
                print(f"exporting {name} as {ot} GGUF", file=sys.stderr)
                llamacpp.export_gguf(model_dir, path, outtype=ot)
                ggufs.append((f"specmoe export --format gguf --outtype {ot}", path))
        runs = [(g, kv, o) for g in ggufs for o in variants for kv in kv_types]
        for (label, path), kv, over in runs:
            rec = cross_engine_check(
                ref,
                path,
                tokenizer=tok,
                batch=args.batch,
                threads=args.threads,
                kv_type=kv,
                overrides=over,
            )
            rec["gguf"] = label
            rec["gguf_bytes"] = path.stat().st_size
            checks.append(rec)
            a = rec["agreement"]
            print(
                f"{name} {label} (KV {kv}{', ' + str(over) if over else ''}): set agreement "
                f"{a['set_agreement']:.5f} over "
                f"{a['pairs']} pairs, {a['disagreements']['count']} disagreements "
                f"({a['disagreements']['gap_within_bf16_ulp']} within a bf16 ulp)",
                file=sys.stderr,
            )
    out = {
        "what": "cross-engine routing check: transformers against llama.cpp, teacher-forced",
        "command": "python scripts/cross_engine_routing.py " + " ".join(args.argv),
        "llama_cpp": llamacpp.VERSION,
        "machine": platform.machine(),
        "wall_s": round(time.time() - t0, 1),
        "checks": checks,
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        with atomic_path(args.out) as tmp_out:
            Path(tmp_out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
