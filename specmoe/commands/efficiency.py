"""``specmoe efficiency``: target efficiency and the speedup of speculation against batch size
(paper 003 Sections 3-5, 8, 9; Figures 1-3 measured here).

``specmoe efficiency --model PRESET|PATH [--layers N] [--vocab V] [--routing LIST] [--stats
TRACE|STATS] [--batch 1,2,4,8,16,32] [--k 3,5,7] [--acceptance 0.7] [--draft-cost 0.05]
[--kernel dedup|per_slot] [--context 128] [--repeats 3] [--warmup 1] [--device cpu|cuda]
[--clock wall|cpu] [--seed S] [--json] [--out DIR]``

``--routing`` is a comma list of ``uniform`` (independent uniform routing), ``ipf-uniform``,
``ipf-skewed`` (IPF synthetic routing from ``--stats``) and recorded traces (paths). The
default is the three synthetic ones plus the bundled fit trace when it is installed. The
statistics default to the first trace of ``--routing``, else the bundled fit trace. Every
routing source must have the model's N and m, and the IPF statistics must cover lags up to
max K (a window of K+1 tokens); both are checked before the model is built.

Prints a table (or, with ``--json``, the result record only) on stdout; progress goes to
stderr. ``--out DIR`` writes ``efficiency.json`` (the record with every timed pass) and the
figures of :mod:`specmoe.report.efficiency_figures`, each file atomically.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from specmoe.commands._common import check_float, check_int, check_out_dir, check_seed, out_folder
from specmoe.errors import InputError

DEFAULT_BATCHES = "1,2,4,8,16,32"
DEFAULT_KS = "3,5,7"


def add_arguments(parser) -> None:
    parser.add_argument(
        "--model",
        default="OLMoE-1B-7B-0125",
        metavar="PRESET|PATH",
        help="a preset (dummy weights at its shapes) or a local model directory "
        "(default OLMoE-1B-7B-0125)",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=None,
        help="decoder layers of a preset's dummy model (default all)",
    )
    parser.add_argument(
        "--vocab",
        type=int,
        default=None,
        help="replace the LM head by one of V rows (default: the model's)",
    )
    parser.add_argument(
        "--routing",
        default=None,
        metavar="LIST",
        help="comma list of uniform, ipf-uniform, ipf-skewed and trace paths "
        "(default: the three synthetic ones and the bundled fit trace)",
    )
    parser.add_argument(
        "--stats",
        default=None,
        metavar="TRACE|STATS",
        help="statistics of the IPF routings: a trace or a STATS .json "
        "(default: the first trace of --routing, else the bundled one)",
    )
    parser.add_argument(
        "--batch",
        default=DEFAULT_BATCHES,
        metavar="LIST",
        help=f"batch sizes B (default {DEFAULT_BATCHES})",
    )
    parser.add_argument(
        "--k", default=DEFAULT_KS, metavar="LIST", help=f"draft lengths K (default {DEFAULT_KS})"
    )
    parser.add_argument(
        "--acceptance",
        type=float,
        default=0.7,
        help="acceptance rate a of the speedup model (default 0.7)",
    )
    parser.add_argument(
        "--draft-cost",
        type=float,
        default=0.05,
        help="cost of one draft token in one-token target steps at the same "
        "batch size (default 0.05)",
    )
    parser.add_argument(
        "--kernel",
        choices=("dedup", "per_slot"),
        default="dedup",
        help="expert kernel of every MoE layer (default dedup)",
    )
    parser.add_argument(
        "--context",
        type=int,
        default=128,
        help="tokens in each sequence's KV cache before a pass (default 128)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions (default 3)")
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed repetitions first (default 1)"
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=4096,
        help="rows of each synthetic routing table (default 4096)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time, or (CPU only) one thread timed by its CPU time, "
        "robust to other jobs on a shared machine (default wall)",
    )
    parser.add_argument(
        "--dense-dtype",
        default=None,
        help="dtype of the non-expert weights (default float32 on cpu, "
        "bfloat16 on cuda; experts stay bf16)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--json", action="store_true", help="print the JSON record on stdout")
    parser.add_argument("--out", default=None, metavar="DIR", help="write JSON and figures here")
    parser.add_argument("--no-figures", action="store_true", help="skip the figures")


def parse_ints(text: str, name: str, *, low: int) -> list[int]:
    """A comma list of integers >= low (sorted, distinct); InputError names the argument."""
    try:
        vals = sorted({int(t) for t in str(text).split(",") if t.strip()})
    except ValueError:
        raise InputError(f"{name} {text!r}: expected a comma list of integers") from None
    if not vals or vals[0] < low:
        raise InputError(f"{name} {text!r}: expected integers >= {low}")
    return vals


def _bundled_fit() -> Path | None:
    try:
        from specmoe.data.corpus import bundled_trace_path

        p = bundled_trace_path("fit")
    except Exception:  # the data package may not ship traces yet
        return None
    return p if p.exists() else None


def _moments(path: str) -> Any:
    from specmoe.formats.trace import open_trace
    from specmoe.routing.ipf import fit_moments, load_moments

    if Path(path).suffix.lower() == ".json":
        return load_moments(path)
    return fit_moments(open_trace(path), max_lag=8)


def routing_sources(args: Any, spec: Any, ks: list[int]) -> list[tuple[str, Any]]:
    """``[(name, source)]`` of ``--routing``: None for uniform, the statistics for the IPF
    routings, the loaded trace for a path. Every source is checked against the model (N, m)
    and, for the IPF ones, the largest window (max K + 1 tokens), before any model is built."""
    from specmoe.engine.efficiency import SYNTHETIC, check_shape
    from specmoe.formats.trace import load_trace

    fit = _bundled_fit()
    if args.routing is None:
        names = [*SYNTHETIC, str(fit)] if fit is not None else list(SYNTHETIC)
    else:
        names = [t.strip() for t in args.routing.split(",") if t.strip()]
    if not names:
        raise InputError("--routing: empty list")
    paths = [n for n in names if n not in SYNTHETIC]
    for p in paths:
        if not Path(p).exists():
            raise InputError(f"--routing {p}: neither {', '.join(SYNTHETIC)} nor an existing trace")
    window = max(ks) + 1
    moments = None
    if any(n.startswith("ipf-") for n in names):
        source = args.stats or (paths[0] if paths else (str(fit) if fit else None))
        if source is None:
            raise InputError(
                "--stats: the ipf routings need statistics (a trace or a STATS "
                ".json) and the bundled fit trace is not installed"
            )
        if not Path(source).exists():
            raise InputError(f"--stats {source}: no such file or directory")
        print(f"efficiency: statistics from {source}", file=sys.stderr, flush=True)
        moments = _moments(source)
        check_shape(f"--stats {source}", moments.num_experts, moments.top_k, spec)
        moments.check_window(window, name=f"--k {max(ks)} with --stats {source}")
        moments.meta.setdefault("file", Path(source).name)
    out: list[tuple[str, Any]] = []
    for n in names:
        if n == "uniform":
            out.append((n, None))
        elif n.startswith("ipf-"):
            out.append((n, moments))
        else:
            trace = load_trace(n)
            check_shape(f"--routing {n}", int(trace.num_experts), int(trace.top_k), spec)
            if trace.num_tokens < window:
                raise InputError(
                    f"--routing {n}: {trace.num_tokens} tokens, fewer than a "
                    f"window of K+1 = {window}"
                )
            label = "recorded" if fit is not None and Path(n) == fit else Path(n).stem
            out.append((label, trace))
    return out


def routing_tables(
    sources: list[tuple[str, Any]],
    spec: Any,
    num_layers: int,
    *,
    tokens: int,
    window: int,
    seed: int,
) -> list[Any]:
    """The routing table of every source for a model of ``num_layers`` MoE layers."""
    from specmoe.engine.efficiency import recorded_table, synthetic_table, uniform_table

    tables = []
    for i, (name, src) in enumerate(sources):
        if name == "uniform":
            tables.append(
                uniform_table(tokens, num_layers, spec.num_experts, spec.top_k, seed=seed + i)
            )
        elif name.startswith("ipf-"):
            print(
                f"efficiency: drawing {tokens} tokens of {name} routing",
                file=sys.stderr,
                flush=True,
            )
            tables.append(
                synthetic_table(
                    src,
                    spec,
                    num_layers,
                    tokens,
                    variant=name.removeprefix("ipf-"),
                    max_pass=window,
                    seed=seed + i,
                    source=src.meta.get("file", ""),
                )
            )
        else:
            tables.append(recorded_table(src, spec, num_layers, name=name, min_tokens=window))
    return tables


def _spec(args: Any) -> Any:
    from specmoe.spec import PRESET_CONFIGS, ModelSpec, resolve_spec

    name = (
        args.model.removesuffix("-dummy") if args.model.lower().endswith("-dummy") else args.model
    )
    if name.lower() in {k.lower() for k in PRESET_CONFIGS}:
        spec = resolve_spec(name)
        if args.layers is not None:
            if not 1 <= args.layers <= spec.num_hidden_layers:
                raise InputError(
                    f"--layers {args.layers}: must be in "
                    f"1..{spec.num_hidden_layers} for {spec.name}"
                )
            spec = spec.with_layers(min(args.layers, spec.num_moe_layers))
        return spec
    path = Path(args.model)
    if not path.exists():
        raise InputError(
            f"--model {args.model!r}: neither a preset "
            f"({', '.join(PRESET_CONFIGS)}) nor an existing path"
        )
    return ModelSpec.from_hf_config(path)


MAX_BATCH = 4096
MAX_K = 64
MAX_TOKENS = 10**7  # rows of one synthetic routing table


def validate(args: Any) -> tuple[list[int], list[int]]:
    batches = parse_ints(args.batch, "--batch", low=1)
    ks = parse_ints(args.k, "--k", low=1)
    check_int(batches[-1], "--batch", low=1, high=MAX_BATCH)
    check_int(ks[-1], "--k", low=1, high=MAX_K)
    check_float(args.acceptance, "--acceptance", low=0.0, high=1.0)
    check_float(args.draft_cost, "--draft-cost", low=0.0, high=1e6)
    check_int(args.context, "--context", low=1, high=1 << 20)
    check_int(args.repeats, "--repeats", low=1, high=10_000)
    check_int(args.tokens, "--tokens", low=1, high=MAX_TOKENS)
    check_int(args.warmup, "--warmup", low=0, high=10_000)
    check_int(args.layers, "--layers", low=1)
    check_int(args.vocab, "--vocab", low=1)
    check_seed(args.seed)
    if args.device not in ("cpu", "cuda") and not str(args.device).startswith("cuda:"):
        raise InputError(f"--device {args.device!r}: choose cpu or cuda")
    if args.clock == "cpu" and str(args.device) != "cpu":
        raise InputError(f"--clock cpu: times CPU runs only, not --device {args.device}")
    check_out_dir(args.out)
    return batches, ks


def run(args: Any) -> int:
    """Hold --out against a second writer for the whole command (out_folder)."""
    with out_folder(args.out):
        return _run(args)


def _run(args: Any) -> int:
    from specmoe._io import atomic_write_json, dumps_json
    from specmoe.cost.efficiency import summarise_efficiency
    from specmoe.engine.efficiency import build_model, measure_efficiency, model_bytes

    batches, ks = validate(args)
    spec = _spec(args)
    sources = routing_sources(args, spec, ks)
    if str(args.device).startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise InputError(f"--device {args.device}: CUDA is not available")
    dense_dtype = args.dense_dtype or ("bfloat16" if str(args.device).startswith("cuda") else None)
    t0 = time.perf_counter()
    print(
        f"efficiency: building {args.model}"
        + (f" with {args.layers} layers" if args.layers else ""),
        file=sys.stderr,
        flush=True,
    )
    model, dummy = build_model(
        args.model,
        layers=args.layers,
        vocab=args.vocab,
        device=args.device,
        dense_dtype=dense_dtype,
        seed=args.seed,
        context=args.context + max(ks) + 1,
    )
    nbytes = model_bytes(model)
    window = max(ks) + 1
    tables = routing_tables(
        sources,
        spec,
        len(nbytes.expert),
        window=window,
        seed=args.seed,
        tokens=max(args.tokens, 4 * max(batches) * window),
    )
    print(
        f"efficiency: built in {time.perf_counter() - t0:.0f} s; dense "
        f"{nbytes.dense / 1e6:.0f} MB ({nbytes.dense_dtype}), one expert "
        f"{nbytes.expert[0] / 1e6:.1f} MB ({nbytes.expert_dtype}), {len(nbytes.expert)} "
        f"MoE layers",
        file=sys.stderr,
        flush=True,
    )
    meas = measure_efficiency(
        model,
        tables,
        batches=batches,
        ks=ks,
        kernel=args.kernel,
        context=args.context,
        repeats=args.repeats,
        warmup=args.warmup,
        seed=args.seed,
        clock=args.clock,
        progress=lambda msg: print(f"efficiency: {msg}", file=sys.stderr, flush=True),
    )
    rows = summarise_efficiency(
        meas["records"],
        dense_bytes=nbytes.dense,
        expert_bytes=nbytes.expert,
        kv_bytes=meas["kv_bytes"],
        acceptance=args.acceptance,
        draft_cost=args.draft_cost,
    )
    import torch

    rec = {
        "model": args.model,
        "dummy_weights": dummy,
        "spec": spec.name,
        "num_experts": spec.num_experts,
        "top_k": spec.top_k,
        "moe_layers": len(nbytes.expert),
        "layers": args.layers,
        "vocab": args.vocab,
        "device": str(args.device),
        "device_name": (
            torch.cuda.get_device_name(0) if str(args.device).startswith("cuda") else "cpu"
        ),
        "threads": 1 if args.clock == "cpu" else torch.get_num_threads(),
        "clock": args.clock,
        "kernel": args.kernel,
        "context": args.context,
        "batches": batches,
        "ks": ks,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "seed": args.seed,
        "acceptance": args.acceptance,
        "draft_cost": args.draft_cost,
        "speedup_model": "G_a(K) t_step / (t_verify + K draft_cost t_step), "
        "G_a(K) = (1 - a^(K+1)) / (1 - a)",
        "bytes": {
            "dense": nbytes.dense,
            "expert": nbytes.expert,
            "expert_total": nbytes.expert_total,
            "dense_dtype": nbytes.dense_dtype,
            "expert_dtype": nbytes.expert_dtype,
            "kv": {str(b): v for b, v in meas["kv_bytes"].items()},
        },
        "routings": [{"name": t.name, "tokens": int(t.experts.shape[0]), **t.meta} for t in tables],
        "kernel_calls": meas["calls"],
        "rows": rows,
        "command": "specmoe efficiency " + " ".join(sys.argv[2:])
        if len(sys.argv) > 1 and sys.argv[1] == "efficiency"
        else None,
        "elapsed_s": time.perf_counter() - t0,
    }
    if args.out is not None:
        out = Path(args.out)
        atomic_write_json(out / "efficiency.json", {**rec, "records": meas["records"]})
        if not args.no_figures:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                print("efficiency: matplotlib missing, no figures", file=sys.stderr)
            else:
                from specmoe.report.efficiency_figures import write_figures

                for p in write_figures(rec, out):
                    print(f"efficiency: wrote {p}", file=sys.stderr)
    if args.json:
        print(dumps_json(rec))
    else:
        print(
            f"{'routing':>14} {'B':>3} {'K':>2} {'step ms':>9} {'verify ms':>10} "
            f"{'eff':>6} {'est':>6} {'gap':>6} {'k':>6} {'unique':>7} {'speedup':>7}"
        )
        for r in rows:
            print(
                f"{r['routing']:>14} {r['batch']:>3} {r['k']:>2} {r['t_step_ms']:>9.1f} "
                f"{r['t_verify_ms']:>10.1f} {r['efficiency']:>6.3f} {r['estimate']:>6.3f} "
                f"{r['gap']:>+6.3f} {r['k_active']:>6.1f} {r['unique']:>7.1f} "
                f"{r['speedup']:>7.2f}"
            )
    return 0
