"""``specmoe synth``: a synthetic routing trace from fitted statistics (paper 003 Section 8).

``specmoe synth --from TRACE|STATS --tokens N [--model SPEC] [--seed S] --out FILE [--json]``
fits popularity and lagged co-activation on a trace (or reads a STATS .json), draws a stationary
synthetic trace (:func:`specmoe.routing.synth.synthesize`) of N tokens and writes it to FILE
(.npz). ``--model`` takes N, m and the layer count from a model spec (N and m must match the
statistics). ``--json`` prints a summary with the fidelity checks (popularity correlation,
overlap difference per lag, union error per n) on stdout. Progress goes to stderr.
``--ray [ADDRESS]`` fits the moments of a shard directory as Ray tasks, with the same result.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specmoe.commands._common import check_at_most, check_int, check_out_file, check_seed
from specmoe.commands._ray import add_ray_arguments, shard_executor
from specmoe.errors import InputError

MAX_TOKENS = 10**9
MAX_WINDOW = 64  # the chain's IPF has 2^window patterns: far less is ever solvable

# arguments of synthesize() that a flag of another name feeds (the rest share their names)
_FLAG_OF = {
    "num_tokens": "--tokens",
    "num_experts": "--model",
    "top_k": "--model",
    "num_layers": "--model",
}


def add_arguments(parser) -> None:
    parser.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="TRACE|STATS",
        help="a trace (.npz or shard directory) or a STATS .json file",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        required=True,
        help="tokens to generate (at most 10^9, and tokens x layers x m at most 5e8)",
    )
    parser.add_argument(
        "--model",
        default=None,
        metavar="SPEC",
        help="model spec (preset, HF config or spec JSON) giving N, m, layers",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=None,
        metavar="N",
        help="with --model: keep its first N MoE layers (a CPU-sized copy, as plan --layers)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--out", required=True, metavar="FILE", help="synthetic trace (.npz)")
    parser.add_argument(
        "--variant",
        choices=("uniform", "skewed"),
        default="skewed",
        help="expert probabilities: uniform, or measured popularity (default)",
    )
    parser.add_argument(
        "--bins", type=int, default=8, help="popularity bins sharing a lag correlation (default 8)"
    )
    parser.add_argument(
        "--window",
        type=int,
        default=None,
        help="window w of the pattern chain (default: max lag + 1, at most 9)",
    )
    parser.add_argument(
        "--max-lag", type=int, default=8, help="lags to fit when --from is a trace (default 8)"
    )
    parser.add_argument(
        "--doc-tokens",
        type=int,
        default=None,
        help="split the output into documents of this many tokens",
    )
    parser.add_argument(
        "--save-stats",
        default=None,
        metavar="FILE",
        help="also write the fitted statistics as a STATS .json",
    )
    parser.add_argument(
        "--no-check", action="store_true", help="skip the fidelity checks (faster on long traces)"
    )
    add_ray_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON on stdout")


def run(args) -> int:
    from specmoe._io import dumps_json
    from specmoe.formats.trace import open_trace, save_trace
    from specmoe.routing.ipf import fit_moments, load_moments, save_moments
    from specmoe.routing.synth import synth_fidelity, synthesize

    check_int(args.tokens, "--tokens", low=1, high=MAX_TOKENS)
    check_int(args.bins, "--bins", low=1)
    # the low ends of --window and --max-lag are synthesize's and fit_moments' own checks
    check_at_most(args.window, "--window", MAX_WINDOW)
    check_at_most(args.max_lag, "--max-lag", MAX_WINDOW - 1)
    check_int(args.doc_tokens, "--doc-tokens", low=1)
    check_seed(args.seed)
    check_out_file(args.out)
    check_out_file(args.save_stats, "--save-stats")
    spec = None
    if args.model is not None:
        from specmoe.spec import resolve_spec

        spec = resolve_spec(args.model)
        if args.layers is not None:
            try:
                spec = spec.with_layers(args.layers)
            except (InputError, ValueError) as exc:
                raise InputError(f"{exc}", argument="layers") from None
    elif args.layers is not None:
        raise InputError(
            "needs --model (the spec whose first N MoE layers are kept)", argument="layers"
        )
    print(f"synth: statistics from {args.source}", file=sys.stderr, flush=True)
    if Path(args.source).suffix.lower() == ".json":
        moments = load_moments(args.source)
    else:
        with shard_executor(args, "synth") as executor:
            moments = fit_moments(open_trace(args.source), max_lag=args.max_lag, executor=executor)
    if args.save_stats:
        save_moments(moments, args.save_stats)
    print(f"synth: drawing {args.tokens} tokens", file=sys.stderr, flush=True)
    try:
        trace = synthesize(
            moments,
            args.tokens,
            seed=args.seed,
            variant=args.variant,
            bins=args.bins,
            window=args.window,
            doc_tokens=args.doc_tokens,
            num_experts=None if spec is None else spec.num_experts,
            top_k=None if spec is None else spec.top_k,
            num_layers=None if spec is None else spec.num_moe_layers,
        )
    except InputError as exc:
        flag = _FLAG_OF.get(exc.argument or "")
        if flag is None:
            raise
        raise exc.as_flag(flag) from None
    if spec is not None:
        trace.meta["model"] = spec.name
        trace.meta["layers"] = list(spec.moe_layer_indices)
    save_trace(trace, args.out)
    rec = {
        "out": str(args.out),
        "source": str(args.source),
        "tokens": trace.num_tokens,
        "num_experts": trace.num_experts,
        "top_k": trace.top_k,
        "num_layers": trace.num_layers,
        "seed": args.seed,
        "variant": args.variant,
        "model": None if spec is None else spec.name,
        "synthetic": trace.meta["synthetic"],
        "fidelity": None,
    }
    if not args.no_check and trace.num_layers == moments.num_layers:
        if trace.num_experts != moments.num_experts:  # against the targets it was drawn to
            from specmoe.routing.synth import uniform_moments

            moments = uniform_moments(moments, trace.num_experts)
        f = synth_fidelity(moments, trace)
        rec["fidelity"] = f
        r_min = f["popularity_r_min"]
        pop = "uniform popularity" if r_min is None else f"popularity r >= {r_min:.4f}"
        msg = f"synth: {pop}, overlap within {f['overlap_max_abs_diff']:.4f}"
        if "union_max_abs_rel_err" in f:
            msg += f", union within {f['union_max_abs_rel_err']:.2%}"
        print(msg, file=sys.stderr)
    print(f"synth: wrote {args.out}", file=sys.stderr)
    if args.json:
        print(dumps_json(rec))
    else:
        print(
            f"{args.out}: {trace.num_tokens} tokens, N={trace.num_experts} "
            f"m={trace.top_k} L={trace.num_layers}"
        )
    return 0
