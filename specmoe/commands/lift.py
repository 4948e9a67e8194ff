"""``specmoe lift``: the bundled OLMoE model (or another small OLMoE) lifted to a preset's
shapes, computing the same function (:mod:`specmoe.engine.lift`).

The lifted checkpoint has the preset's bytes in every layer and the source's outputs: greedy
tokens and routing equal to the source's, up to floating-point summation order. Layers beyond
the source's add exactly zero and route like a source layer applied to the final residual.
``--hidden``/``--heads``/``--head-dim``/``--intermediate`` override the preset's shapes (small
lifts for tests). Written atomically into ``--out`` (default: a folder under
``$SPECMOE_LIFTED_CACHE``, ~/.cache/specmoe/lifted), which must be absent or empty.
"""

from __future__ import annotations

_SHAPE_FLAGS = ("hidden", "heads", "head_dim", "intermediate")


def add_arguments(parser) -> None:
    parser.add_argument(
        "--model", default="bundled", help="OLMoE model folder, or 'bundled' (default)"
    )
    parser.add_argument(
        "--preset", default="OLMoE-1B-7B-0125", help="target shapes (default OLMoE-1B-7B-0125)"
    )
    parser.add_argument(
        "--layers", type=int, default=None, help="decoder layers (default: the preset's)"
    )
    parser.add_argument("--hidden", type=int, default=None, help="override the hidden size")
    parser.add_argument("--heads", type=int, default=None, help="override the attention heads")
    parser.add_argument(
        "--head-dim", type=int, default=None, help="override the head dimension (hidden / heads)"
    )
    parser.add_argument(
        "--intermediate", type=int, default=None, help="override one expert's intermediate size"
    )
    parser.add_argument("--dtype", default="bf16", help="weight type: bf16 (default) or fp32")
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="folder to write (absent or empty)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON on stdout")


def _shapes(args):
    from specmoe.engine.lift import LiftShapes, target_shapes
    from specmoe.errors import InputError

    base = target_shapes(args.preset, layers=args.layers)
    over = {k: getattr(args, k) for k in _SHAPE_FLAGS if getattr(args, k) is not None}
    if "hidden" in over or "heads" in over:  # head_dim follows unless given
        hidden = over.get("hidden", base.hidden)
        heads = over.get("heads", base.heads)
        if "head_dim" not in over:
            if hidden % heads:
                raise InputError(f"--heads: {heads} does not divide the hidden size {hidden}")
            over["head_dim"] = hidden // heads
    fields = {**base.__dict__, **over}
    return LiftShapes(**fields)


def run(args) -> int:
    import sys

    from specmoe._io import dumps_json
    from specmoe.commands._common import check_out_dir
    from specmoe.engine import lift
    from specmoe.engine.models import resolve_model_dir
    from specmoe.errors import InputError

    if args.dtype not in lift.DTYPES:
        raise InputError(f"--dtype: unknown {args.dtype!r} (choose from {', '.join(lift.DTYPES)})")
    for k in ("layers", *_SHAPE_FLAGS):
        v = getattr(args, k)
        if v is not None and v < 1:
            raise InputError(f"--{k.replace('_', '-')}: must be a positive integer, got {v}")
    source = resolve_model_dir(args.model)
    target = _shapes(args)
    out = args.out
    if out is None:
        out = lift.cache_root() / f"{args.preset}-{target.layers}L-{args.dtype}"
        if any(getattr(args, k) is not None for k in _SHAPE_FLAGS):
            t = target
            out = out.with_name(f"{out.name}-h{t.hidden}-a{t.heads}x{t.head_dim}-i{t.intermediate}")
    check_out_dir(out)
    try:
        result = lift.lift_checkpoint(
            source,
            out,
            target=target,
            dtype=args.dtype,
            progress=lambda msg: print(f"lift: {msg}", file=sys.stderr, flush=True),
        )
    except InputError as exc:
        if exc.argument == "source":
            raise InputError(f"--model: {exc.message}") from None
        raise
    preset = lift.preset_layer_bytes(args.preset, dtype=args.dtype)
    rows = []
    for i, b in enumerate(result.layer_bytes):
        dense = b["attention"] + b["router"]
        rows.append(
            {
                "layer": i,
                **b,
                "preset_experts": preset["experts"],
                "preset_attention_router": preset["attention_router"],
                "experts_equal": b["experts"] == preset["experts"],
                "attention_router_equal": dense == preset["attention_router"],
            }
        )
    summary = {**result.to_dict(), "preset": args.preset, "layers": rows}
    if args.json:
        print(dumps_json(summary))
        return 0
    t, p = result.plan.target, result.plan
    print(
        f"{result.out}: hidden {t.hidden}, {t.heads} heads x {t.head_dim}, "
        f"{p.num_experts} experts x {t.intermediate}, {t.layers} layers, {args.dtype} "
        f"(eps {p.eps_target:.4g}, norm scale {p.norm_scale:.4g}, q_norm scale "
        f"{p.q_norm_scale:.4g}, head dim j -> {p.head_stride}j)"
    )
    print(f"per-layer bytes against {args.preset}'s (experts | attention + router | norms):")
    for r in rows:
        dense = r["attention"] + r["router"]
        mark = "=" if r["experts_equal"] and r["attention_router_equal"] else "!="
        print(
            f"  layer {r['layer']:2d}: {r['experts']:,} | {dense:,} | {r['norms']:,} "
            f"{mark} preset {r['preset_experts']:,.0f} | {r['preset_attention_router']:,.0f}"
        )
    return 0
