"""``specmoe export``: a model in another engine's format.

``--format gguf``: llama.cpp's GGUF, written by llama.cpp's own ``convert_hf_to_gguf.py`` from
the source ``make llama-cpp`` built (and its gguf-py), with the bundled tokenizer's BPE
pre-tokenizer named (``gpt-2``: llama.cpp's converter does not list its hash). Weights as
``--outtype`` (bf16, f32, f16, q8_0). Without a llama.cpp build: exit 2, naming
``make llama-cpp``.
"""

from __future__ import annotations

from specmoe.commands._common import check_out_file

FORMATS = ("gguf",)


def add_arguments(parser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="gguf", help="output format")
    parser.add_argument(
        "--model",
        default="bundled",
        help="Hugging Face model folder, or 'bundled' (the bundled OLMoE), or 'bundled-draft'",
    )
    parser.add_argument("--out", required=True, metavar="FILE", help="the file to write")
    parser.add_argument(
        "--outtype", default="bf16", help="weight type: bf16, f32, f16, q8_0 (default bf16)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON on stdout")


def run(args) -> int:
    import sys

    from specmoe._io import dumps_json
    from specmoe.engine.models import resolve_model_dir
    from specmoe.engines import llamacpp
    from specmoe.errors import InputError

    out = check_out_file(args.out)
    if args.outtype not in llamacpp.OUTTYPES:
        raise InputError(
            f"--outtype: unknown {args.outtype!r} (choose from {', '.join(llamacpp.OUTTYPES)})"
        )
    if args.model == "bundled-draft":
        from specmoe.data import corpus

        model_dir = resolve_model_dir(corpus.bundled_draft_dir())
    else:
        model_dir = resolve_model_dir(args.model)
    llamacpp.require_built()
    print(f"export: {model_dir} -> {out} ({args.format}, {args.outtype})", file=sys.stderr)
    path = llamacpp.export_gguf(model_dir, out, outtype=args.outtype)
    result = {
        "format": args.format,
        "outtype": args.outtype,
        "model": str(model_dir),
        "out": str(path),
        "bytes": path.stat().st_size,
        "llama_cpp": llamacpp.VERSION,
    }
    if args.json:
        print(dumps_json(result))
    else:
        print(f"{path}: {result['bytes']} bytes (llama.cpp {llamacpp.VERSION} converter)")
    return 0
