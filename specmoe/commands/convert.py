"""``specmoe convert``: import/export routing traces (vLLM, SGLang, Parquet, ``.npz``)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from specmoe.commands._common import check_out_file
from specmoe.errors import InputError
from specmoe.formats._common import model_spec, resolve_num_experts
from specmoe.formats.engine_import import (
    IDS_DTYPES,
    SkippedRequestsWarning,
    import_routed_experts,
    skipped_summary,
)
from specmoe.formats.parquet import load_parquet, write_parquet
from specmoe.formats.trace import RoutingTrace, TraceReader, open_trace, save_trace

FORMATS_IN = ("npz", "vllm", "sglang", "parquet")
FORMATS_OUT = ("npz", "parquet")


_SUFFIX_IN = {".npz": "npz", ".parquet": "parquet", ".pq": "parquet"}


_SUFFIX_OUT = {".npz": "npz", ".parquet": "parquet", ".pq": "parquet"}


def _infer_in(path: Path) -> str:
    if path.is_dir():
        if any(path.glob("*.npz")):
            return "npz"
        raise InputError(
            f"{path}: cannot tell the input format of this directory; give "
            f"--from vllm or --from sglang for engine requests (.npy, JSON, JSON lines)"
        )
    fmt = _SUFFIX_IN.get(path.suffix.lower())
    if fmt is None:
        raise InputError(
            f"{path}: cannot tell the input format from suffix "
            f"{path.suffix or '(none)'!r}; give --from ({', '.join(FORMATS_IN)})"
        )
    return fmt


def _infer_out(path: Path) -> str:
    fmt = _SUFFIX_OUT.get(path.suffix.lower())
    if fmt is None:
        raise InputError(
            f"{path}: cannot tell the output format from suffix "
            f"{path.suffix or '(none)'!r}; give --to ({', '.join(FORMATS_OUT)})"
        )
    return fmt


def add_arguments(parser) -> None:
    parser.add_argument("input", metavar="IN", help="trace file or directory to read")
    parser.add_argument("output", metavar="OUT", help="file to write (.npz or .parquet)")
    parser.add_argument(
        "--from",
        dest="src",
        choices=FORMATS_IN,
        default=None,
        help="input format (default: from the suffix)",
    )
    parser.add_argument(
        "--to",
        dest="dst",
        choices=FORMATS_OUT,
        default=None,
        help="output format (default: from the suffix)",
    )
    parser.add_argument(
        "--num-experts",
        type=int,
        default=None,
        metavar="N",
        help="experts per MoE layer (ids are checked against [0, N))",
    )
    parser.add_argument(
        "--model",
        default=None,
        metavar="SPEC",
        help="model preset, HF config or spec JSON (gives N, m, MoE layers)",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=None,
        metavar="R",
        help="layers per token in a flattened engine record",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        default=None,
        metavar="K",
        help="experts per token in a flattened engine record",
    )
    parser.add_argument(
        "--start",
        type=int,
        default=None,
        metavar="S",
        help="position of row 0 in each request's sequence where the file does not say "
        "(the request's routed_experts_prompt_start in vLLM, routed_experts_start_len in "
        "SGLang; default 0)",
    )
    parser.add_argument(
        "--ids-dtype",
        choices=IDS_DTYPES,
        default=None,
        help="dtype of raw base64 ids where the response names none (SGLang with "
        "SGLANG_ROUTED_EXPERTS_DTYPE set; default int32)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args) -> int:
    from specmoe._io import dumps_json

    src, dst = Path(args.input), Path(args.output)
    for flag, v in (
        ("--num-experts", args.num_experts),
        ("--layers", args.layers),
        ("--top-k", args.top_k),
    ):
        if v is not None and v < 1:
            raise InputError(f"{flag} must be a positive integer, got {v}")
    if args.start is not None and args.start < 0:
        raise InputError(f"--start must be a non-negative integer, got {args.start}")
    fmt_in = args.src or _infer_in(src)
    fmt_out = args.dst or _infer_out(dst)
    check_out_file(dst, "OUT")  # before anything is read: OUT can be written
    if src.exists() and dst.exists() and src.resolve() == dst.resolve():
        raise InputError(f"{dst}: OUT is the input itself; write to another path")
    trace: RoutingTrace | TraceReader
    if fmt_in == "npz":
        trace = open_trace(src)
        spec = model_spec(args.model)
        resolve_num_experts(args.num_experts, spec, trace.num_experts, name=str(src))
        if spec is not None and spec.top_k != trace.top_k:
            raise InputError(
                f"{src}: holds {trace.top_k} experts per token but model "
                f"{spec.name} routes {spec.top_k}"
            )
    elif fmt_in == "parquet":
        trace = load_parquet(src, num_experts=args.num_experts, model=args.model)
    else:
        with warnings.catch_warnings():  # said once below, from the trace's record
            warnings.simplefilter("ignore", SkippedRequestsWarning)
            trace = import_routed_experts(
                src,
                engine=fmt_in,
                num_experts=args.num_experts,
                model=args.model,
                layers=args.layers,
                top_k=args.top_k,
                start=args.start,
                ids_dtype=args.ids_dtype,
            )
        skipped = trace.meta.get("skipped", [])
        if skipped:
            total = trace.num_documents + len(skipped)
            line = skipped_summary(src, skipped, total)
            print(f"specmoe convert: warning: {line}", file=sys.stderr, flush=True)
    if fmt_out == "npz":
        head = trace if isinstance(trace, RoutingTrace) else trace.load()
        save_trace(head, dst)
        tokens, docs = head.num_tokens, head.num_documents
    else:
        head, tokens, docs = write_parquet(trace, dst)
    result = {
        "input": str(src),
        "from": fmt_in,
        "output": str(dst),
        "to": fmt_out,
        "num_experts": head.num_experts,
        "num_layers": head.num_layers,
        "top_k": head.top_k,
        "layers": head.layers,
        "num_tokens": tokens,
        "num_documents": docs,
        "with_weights": head.weights is not None,
    }
    if "engine_layers" in head.meta:
        result["dropped_layers"] = sorted(set(range(head.meta["engine_layers"])) - set(head.layers))
        result["skipped_requests"] = head.meta.get("skipped", [])
    if args.json:
        print(dumps_json(result))
    else:
        print(
            f"{src} ({fmt_in}) -> {dst} ({fmt_out}): {tokens} tokens in {docs} "
            f"document{'s' * (docs != 1)}, "
            f"L={head.num_layers}, m={head.top_k}, N={head.num_experts}"
        )
    return 0
