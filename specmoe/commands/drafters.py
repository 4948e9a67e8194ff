"""``specmoe drafters``: MoE against dense draft layers, train-free (paper 003 Section 9.3,
Appendix M). A design study: no drafter is trained and no acceptance is measured.

``specmoe drafters --model PRESET [--num-experts N] [--expert-width I] [--dense-width W]
[--stats TRACE|STATS] [--batch LIST] [--draft-layers 1,2,4] [--kernel dedup_torch]
[--anchor-ms X | --draft-vocab V] [--efficiency FILE [--routing ipf-uniform] [--acceptance a]]
[--profile PROFILE] [--tol 0.25] [--reps 3] [--warmup 1] [--clock cpu|wall] [--seed S]
[--json] [--out DIR]``

Times one dense and one MoE draft layer's feed-forward block at the model's shapes (dummy bf16
weights) at every batch size (:mod:`specmoe.bench.drafters`), the MoE layer's ids from
uniform-IPF routing carried from ``--stats``'s overlap to N = ``--num-experts``
(:func:`specmoe.routing.synth.uniform_moments`, paper 003 App. M.3's scaling), and prints the
draft cost of M.1 for a dense and an MoE drafter of each ``--draft-layers``
(:mod:`specmoe.analysis.drafters`), the batch up to which each layer stays bandwidth-bound,
the roofline batch (with ``--profile``: a ``specmoe bench`` profile of this machine for its
ceiling and matmul peak), the batch from which the MoE drafter is cheaper, and, with
``--efficiency`` (an ``efficiency.json`` of ``specmoe efficiency``, the target's step and
verify times on synthetic routing), the speedup of each drafter against batch size.

The anchor C_1 (one step of the one-layer dense drafter at batch 1) is ``--anchor-ms``, else
the measured batch-1 time of the dense layer scaled by the drafter's weight bytes over that
layer's: the layer, four h×h attention projections and an LM head of ``--draft-vocab`` rows
(EAGLE-3's 32000 by default), read at the layer's measured batch-1 bandwidth.
``--out DIR`` writes drafters.json and the figures.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from specmoe.commands._common import check_float, check_int, check_out_dir, check_seed, out_folder
from specmoe.errors import InputError

DEFAULT_BATCHES = "1,2,4,8,16,32,64,128,256,512,1024"
MAX_BATCH = 65536
KERNELS = ("dedup_torch", "dedup", "grouped_mm")


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="Qwen3-30B-A3B", metavar="PRESET|PATH",
                        help="the target whose shapes the draft layers take (default "
                        "Qwen3-30B-A3B)")  # fmt: skip
    parser.add_argument("--num-experts", type=int, default=None,
                        help="experts of the MoE draft layer (default the model's)")  # fmt: skip
    parser.add_argument("--expert-width", type=int, default=None,
                        help="expert width I (default the model's)")  # fmt: skip
    parser.add_argument("--dense-width", type=int, default=None,
                        help="width of the dense layer (default m·I: the MoE layer's active "
                        "width)")  # fmt: skip
    parser.add_argument("--stats", default=None, metavar="TRACE|STATS",
                        help="overlap statistics of the routing (default the bundled fit "
                        "trace)")  # fmt: skip
    parser.add_argument("--batch", default=DEFAULT_BATCHES, metavar="LIST",
                        help=f"batch sizes (default {DEFAULT_BATCHES})")  # fmt: skip
    parser.add_argument("--draft-layers", default="1,2,4", metavar="LIST",
                        help="draft layers L_d of each drafter (default 1,2,4)")  # fmt: skip
    parser.add_argument("--kernel", choices=KERNELS, default="dedup_torch",
                        help="kernel of both layers (default dedup_torch: torch GEMMs per "
                        "expert, the dense layer one GEMM chain)")  # fmt: skip
    parser.add_argument(
        "--anchor-ms",
        type=float,
        default=None,
        help="C_1: one step of the one-layer dense drafter at batch 1 (ms)",
    )
    parser.add_argument(
        "--draft-vocab",
        type=int,
        default=32000,
        help="LM-head rows of the default anchor (default 32000)",
    )
    parser.add_argument(
        "--efficiency",
        default=None,
        metavar="FILE",
        help="efficiency.json of specmoe efficiency: the target's times",
    )
    parser.add_argument(
        "--routing",
        default="ipf-uniform",
        help="routing of --efficiency's rows (default ipf-uniform)",
    )
    parser.add_argument(
        "--acceptance",
        type=float,
        default=0.7,
        help="acceptance rate a of the speedup (default 0.7)",
    )
    parser.add_argument(
        "--profile",
        default=None,
        metavar="PROFILE",
        help="a bench profile.json of this machine: ceiling and peak",
    )
    parser.add_argument("--tol", type=float, default=0.25,
                        help="bandwidth-bound while the time per byte stays within 1+tol of "
                        "the best at any smaller batch (default 0.25)")  # fmt: skip
    parser.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="rows of the routing table (default max(4096, 2 x max batch))",
    )
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed first (default 1)")
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="one thread timed by its CPU time (default), or wall",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--out", default=None, metavar="DIR", help="write drafters.json here")
    parser.add_argument("--no-figures", action="store_true", help="with --out: JSON only")


def _ints(text: str, flag: str, *, low: int, high: int) -> list[int]:
    try:
        vals = sorted({int(t) for t in str(text).split(",") if t.strip()})
    except ValueError:
        raise InputError(f"{flag} {text!r}: expected a comma list of integers") from None
    if not vals or vals[0] < low or vals[-1] > high:
        raise InputError(f"{flag} {text!r}: expected integers in {low}..{high}")
    return vals


def _moments(source: str | None):
    from specmoe.formats.trace import open_trace
    from specmoe.routing.ipf import fit_moments, load_moments

    if source is None:
        from specmoe.data.corpus import bundled_trace_path

        p = bundled_trace_path("fit")
        if not p.exists():
            raise InputError("--stats: the bundled fit trace is not installed; pass a trace")
        source, label = str(p), f"the bundled {p.name} trace"
    else:
        label = source
    if not Path(source).exists():
        raise InputError(f"--stats {source}: no such file or directory")
    mo = load_moments(source) if source.lower().endswith(".json") else None
    if mo is None:
        mo = fit_moments(open_trace(source), max_lag=8)
    mo.meta.setdefault("file", Path(source).name)
    return mo, label


def _efficiency(path: str, routing: str) -> dict[str, Any]:
    import json

    from specmoe.commands._common import check_small_file

    p = check_small_file(path, "--efficiency", limit=1 << 30)
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"--efficiency {path}: not a JSON file ({exc})") from None
    if not isinstance(d, dict) or not isinstance(d.get("rows"), list):
        raise InputError(f"--efficiency {path}: no 'rows' (not an efficiency.json)")
    need = ("routing", "batch", "k", "t_step_ms", "t_verify_ms")
    for r in d["rows"]:
        if not isinstance(r, dict) or any(k not in r for k in need):
            raise InputError(f"--efficiency {path}: a row lacks one of {', '.join(need)}")
    if not any(r["routing"] == routing for r in d["rows"]):
        names = sorted({str(r["routing"]) for r in d["rows"]})
        raise InputError(f"--routing {routing!r}: not in --efficiency (has {', '.join(names)})")
    return d


def _profile_rates(path: str) -> tuple[float, float]:
    from specmoe.formats.profile import load_profile

    p = Path(path)
    prof = load_profile(p / "profile.json" if p.is_dir() else p)
    if not prof.peak_gflops:
        raise InputError(f"--profile {path}: the profile has no matmul peak")
    return float(prof.ceiling_gbps), float(prof.peak_gflops)


def run(args) -> int:
    with out_folder(args.out):
        return _run(args)


def _run(args) -> int:
    from specmoe._io import atomic_write_json, dumps_json, to_jsonable
    from specmoe.analysis import drafters as D
    from specmoe.spec import resolve_spec

    batches = _ints(args.batch, "--batch", low=1, high=MAX_BATCH)
    layers = _ints(args.draft_layers, "--draft-layers", low=1, high=1024)
    check_int(args.num_experts, "--num-experts", low=2, high=1 << 16)
    check_int(args.expert_width, "--expert-width", low=1, high=1 << 20)
    check_int(args.dense_width, "--dense-width", low=1, high=1 << 22)
    check_int(args.draft_vocab, "--draft-vocab", low=0, high=1 << 24)
    check_int(args.reps, "--reps", low=1, high=10_000)
    check_int(args.warmup, "--warmup", low=0, high=10_000)
    check_int(args.tokens, "--tokens", low=1, high=10**7)
    check_float(args.acceptance, "--acceptance", low=0, high=1)
    check_float(args.tol, "--tol", low=0, high=100)
    if args.anchor_ms is not None:
        check_float(args.anchor_ms, "--anchor-ms", low=0, high=1e9)
    check_seed(args.seed)
    check_out_dir(args.out)
    try:
        spec = resolve_spec(args.model)
    except InputError as exc:
        raise InputError(f"--model {args.model!r}: {exc.message}") from None
    N = args.num_experts or spec.num_experts
    width = args.expert_width or spec.expert_intermediate
    dense_width = args.dense_width or spec.top_k * width
    if not spec.top_k < N:
        raise InputError(f"--num-experts {N}: must exceed m={spec.top_k}")
    eff = _efficiency(args.efficiency, args.routing) if args.efficiency else None
    rates = _profile_rates(args.profile) if args.profile else None
    mo, source = _moments(args.stats)
    tokens = args.tokens or max(4096, 2 * batches[-1])
    if tokens < batches[-1]:
        raise InputError(f"--tokens {tokens}: fewer rows than the largest --batch")
    say = lambda msg: print(f"drafters: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    say(f"uniform-IPF routing at N={N}, m={spec.top_k} from {source} ({tokens} tokens)")
    t0 = time.perf_counter()
    if mo.top_k == spec.top_k:
        from specmoe.routing.synth import synthesize

        trace = synthesize(mo, tokens, num_experts=N, variant="uniform", seed=args.seed)
    else:  # another m: the overlap carried as a share of m (specmoe.analysis.transfer)
        from specmoe.analysis.transfer import transfer_routing

        trace = transfer_routing(mo, num_experts=N, top_k=spec.top_k, tokens=tokens,
                                 seed=args.seed)  # fmt: skip
    import torch

    from specmoe.bench.drafters import time_draft_layers

    prev = torch.get_num_threads()
    if args.clock == "cpu":
        torch.set_num_threads(1)
    try:
        meas = time_draft_layers(
            hidden=spec.hidden_size,
            expert_width=width,
            num_experts=N,
            top_k=spec.top_k,
            dense_width=dense_width,
            routing=trace.experts,
            batches=batches,
            kernel=args.kernel,
            activation="swiglu",
            reps=args.reps,
            warmup=args.warmup,
            clock=args.clock,
            seed=args.seed,
            progress=say,
        )
    finally:
        torch.set_num_threads(prev)
    costs = D.layer_costs(meas["records"])
    h, q = spec.hidden_size, 2
    if args.anchor_ms is not None:
        anchor, anchor_rule = args.anchor_ms / 1e3, "--anchor-ms"
    else:
        extra = (4 * h * h + args.draft_vocab * h) * q
        anchor = costs["dense"]["median_s"][0] * (1 + extra / meas["dense_bytes"])
        anchor_rule = (
            f"the dense layer's batch-1 time x (layer + 4 h^2 attention + {args.draft_vocab}"
            "-row LM head bytes) / layer bytes"
        )
    rows = D.drafter_table(costs, anchor_s=anchor, layers=layers)
    bound = {
        k: D.bandwidth_bound_limit(
            costs[k]["batch"], costs[k]["median_s"], costs[k]["bytes"], tol=args.tol
        )
        for k in D.KINDS
    }
    if rates is not None:
        for k in D.KINDS:
            bound[k]["roofline_batch"] = D.roofline_batch(
                costs[k]["batch"], costs[k]["flops"], costs[k]["bytes"],
                ceiling_gbps=rates[0], peak_gflops=rates[1],
            )  # fmt: skip
    cheaper = {}
    for L in layers:
        d = next(r for r in rows if r["kind"] == "dense" and r["layers"] == L)
        m = next(r for r in rows if r["kind"] == "moe" and r["layers"] == L)
        cheaper[str(L)] = D.first_cheaper(d["cost_s"], m["cost_s"], d["batch"])
    speed = None
    if eff is not None:
        speed = D.speedup_table(eff["rows"], rows, routing=args.routing,
                                acceptance=args.acceptance)  # fmt: skip
    rec = to_jsonable(
        {
            "schema": "specmoe.drafters/1",
            "design_study": "synthetic: dummy weights, synthetic routing, no trained drafter, "
            "no measured acceptance",
            "model": spec.name,
            "hidden_size": h,
            "num_experts": N,
            "model_num_experts": spec.num_experts,
            "top_k": spec.top_k,
            "expert_width": width,
            "dense_width": dense_width,
            "activation_share": spec.top_k / N,
            "routing": {
                "source": source,
                "tokens": tokens,
                "variant": "uniform",
                "num_experts": N,
                "seed": args.seed,
            },
            "kernel": args.kernel,
            "dtype": meas["dtype"],
            "clock": args.clock,
            "reps": args.reps,
            "batches": batches,
            "draft_layers": layers,
            "anchor_ms": anchor * 1e3,
            "anchor_rule": anchor_rule,
            "bytes": {
                "dense_layer": meas["dense_bytes"],
                "expert": meas["expert_bytes"],
                "router": meas["router_bytes"],
            },
            "layers": {k: {kk: v for kk, v in costs[k].items()} for k in D.KINDS},
            "bandwidth_bound": bound,
            "drafters": rows,
            "moe_cheaper_from": cheaper,
            "efficiency": None
            if eff is None
            else {
                "file": str(args.efficiency),
                "model": eff.get("model"),
                "layers": eff.get("moe_layers"),
                "routing": args.routing,
                "acceptance": args.acceptance,
            },
            "speedup": speed,
            "machine": {"ceiling_gbps": rates[0], "peak_gflops": rates[1]} if rates else None,
            "pool": meas["pool"],
            "records": meas["records"],
            "elapsed_s": time.perf_counter() - t0,
            "command": "specmoe drafters " + " ".join(sys.argv[2:])
            if len(sys.argv) > 1 and sys.argv[1] == "drafters"
            else None,
        }
    )
    if args.out:
        out = Path(args.out)
        atomic_write_json(out / "drafters.json", rec)
        if not args.no_figures:
            from specmoe.report.analysis_figures import write_drafters_figures

            for p in write_drafters_figures(rec, out):
                say(f"wrote {p}")
        say(f"wrote {out / 'drafters.json'}")
    if args.json:
        print(dumps_json(rec))
    else:
        print(_table(rec))
    return 0


def _table(d: dict) -> str:
    lines = [
        f"{d['model']} draft layers (design study): N={d['num_experts']}, m={d['top_k']} "
        f"({d['activation_share']:.2%} active), expert width {d['expert_width']}, dense width "
        f"{d['dense_width']}; anchor C_1 = {d['anchor_ms']:.2f} ms"
    ]
    lay = d["layers"]
    lines.append(f"{'B':>6} {'dense ms':>9} {'moe ms':>9} {'U':>7}")
    for i, B in enumerate(lay["dense"]["batch"]):
        lines.append(
            f"{B:>6} {lay['dense']['median_s'][i] * 1e3:9.3f} {lay['moe']['median_s'][i] * 1e3:9.3f}"
            f" {lay['moe']['u'][i]:7.1f}"
        )
    for k, v in d["bandwidth_bound"].items():
        roof = f", roofline batch {v['roofline_batch']}" if "roofline_batch" in v else ""
        lines.append(
            f"{k}: bandwidth-bound up to B={v['last_bound']} (first beyond: {v['first_unbound']})"
            + roof
        )
    lines.append(
        "MoE drafter cheaper from B: "
        + ", ".join(f"L_d={k}: {v}" for k, v in d["moe_cheaper_from"].items())
    )
    return "\n".join(lines)
