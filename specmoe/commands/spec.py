"""``specmoe spec``: show a model spec (a preset or a Hugging Face config) and its bytes."""

from __future__ import annotations

from specmoe.spec import PRESET_CONFIGS, get_preset, resolve_spec


def add_arguments(parser) -> None:
    parser.add_argument("model", nargs="?", help="preset name or path (default: list presets)")
    parser.add_argument(
        "--dtype",
        default=None,
        help="weight precision: bf16, fp32, fp8, int8, int4, q8_0, q4_k_m, mxfp4, ... "
        "(scales included; see specmoe.spec.DTYPE_BYTES)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON on stdout")


def run(args) -> int:
    from specmoe._io import dumps_json

    if args.model is None:
        specs = [get_preset(n, dtype=args.dtype) for n in PRESET_CONFIGS]
    else:
        specs = [resolve_spec(args.model, dtype=args.dtype)]
    if args.json:
        print(
            dumps_json([s.to_dict() for s in specs] if args.model is None else specs[0].to_dict())
        )
        return 0
    for s in specs:
        print(
            f"{s.name}: N={s.num_experts} m={s.top_k} L={s.num_moe_layers} "
            f"hidden={s.hidden_size} inter={s.expert_intermediate} "
            f"w={s.expert_bytes / 1e6:.2f} MB W={s.total_expert_bytes / 1e9:.3f} GB "
            f"D={s.dense_bytes / 1e9:.3f} GB kv/token={s.kv_bytes_per_token / 1e3:.1f} kB"
        )
    return 0
