"""``specmoe bench``: benchmark expert kernels and fit their bandwidths (paper 002 Section 2).

Measures (:func:`specmoe.bench.run.benchmark`) and writes, in ``--out``: ``profile.json`` (the
:class:`~specmoe.formats.profile.BandwidthProfile` the cost model reads), ``timings.json`` (every
timed pass: ids, kernel times) and two figures. ``--from PROFILE`` re-reads a saved profile
instead of measuring (validated, and checked against ``--model``). ``--json`` prints the summary
on stdout and nothing else; progress goes to stderr.

The profile's ``implementations`` say what each kernel name really ran (the C or Triton code it
stands for, or the torch kernel it fell back to, and why); a fallback is also a warning line on
stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from specmoe._io import atomic_write_json, dumps_json
from specmoe.commands._common import check_at_most, check_out_dir, check_seed, out_folder
from specmoe.errors import InputError
from specmoe.formats.profile import BandwidthProfile, load_profile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="preset name or model/config path (required, except to refit a saved whole "
        "pass: --whole-pass --from PROFILE --fit FORM)",
    )
    parser.add_argument(
        "--trace",
        default=None,
        help="routing trace for recorded windows (default: the bundled fit trace)",
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--dtype",
        default=None,
        help="weight dtype: float32, bfloat16, float16, or q8_0 (llama.cpp's 8-bit blocks, "
        "1.0625 bytes per weight; cpu, the C kernels) (default: float32 on cpu, bfloat16 on cuda)",
    )
    parser.add_argument(
        "--kernels",
        default="per_slot,dedup",
        help="comma-separated kernel names, 'all' (every kernel on the device) "
        "or 'peers' (ours and transformers'); the first per-slot and the "
        "first dedup kernel fill the profile",
    )
    parser.add_argument("--quick", action="store_true", help="fewer passes (minutes on a CPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads (default: the count with the highest read ceiling)",
    )
    parser.add_argument(
        "--clock",
        default=None,
        choices=("wall", "cpu"),
        help="wall time, or the thread's CPU time (single-threaded CPU runs on a shared "
        "machine); default wall, and cpu with --whole-pass",
    )
    parser.add_argument("--reps", type=int, default=None, help="repetitions of each pass")
    parser.add_argument(
        "--windows", type=int, default=None, help="recorded windows per layer and n"
    )
    parser.add_argument("--layers", type=int, default=None, help="timed trace layers (at most)")
    parser.add_argument(
        "--n-max", type=int, default=None, help="largest pass size (default 9, at most 64)"
    )
    parser.add_argument(
        "--from",
        dest="from_profile",
        default=None,
        metavar="PROFILE",
        help="summarise a saved profile.json instead of measuring",
    )
    parser.add_argument(
        "--whole-pass",
        action="store_true",
        help="time every other operation of a verify pass alone (embedding, norms, "
        "projections, attention at each --depths, router, lm_head, the engine's overhead) and "
        "fit each; --model is then bundled, a model folder or PRESET-dummy (--layers: its "
        "decoder layers); with --from the field is added to that profile",
    )
    parser.add_argument(
        "--depths",
        default=None,
        help="--whole-pass: comma-separated KV-cache depths in tokens (default 512,2048; "
        "with --level-of, the profile's)",
    )
    parser.add_argument(
        "--engine",
        default="specmoe",
        choices=("specmoe", "llama.cpp"),
        help="llama.cpp: its verify passes (n = 1..--n-max at each --depths) timed by its "
        "llama-bench, --model exported to GGUF at --dtype (needs make llama-cpp)",
    )
    parser.add_argument(
        "--fit",
        default=None,
        choices=(
            "step1",
            "step1-depth",
            "step1-width",
            "pern-width",
            "linear",
            "plain",
            "switch",
            "pern",
            "pern-processes",
        ),
        help="--whole-pass: the form of each operation's fit in n. specmoe's engine: plain "
        "(default): one line in n; switch: each matrix product's time per row up to a switch "
        "point, then a line (a one-thread GEMM that reads the weights once a row for a few "
        "rows, then once a call), where that halves the fit's error; pern: switch, and every "
        "operation a fit of its own over the depths at every benchmarked n (the pass is not "
        "monotone in n where its GEMMs change path); pern-processes: pern on each op's median "
        "over the benchmark's --processes at every (n, d), ε their half-range. --engine llama.cpp: step1 "
        "(default): fitted on n >= 2 with a fit of its own at n = 1 (llama.cpp's matrix "
        "products take another path for one row); step1-depth: step1 with a time per token "
        "of context in the engine's overhead outside its graph; step1-width: step1-depth on "
        "the KV cells a pass reads (llama.cpp pads its cache view to 256 cells); pern-width: "
        "step1-width with a fit of its own over the depths at every benchmarked n (its kernels' "
        "tiles make the pass not monotone in n); linear: one fit over every n. "
        "With --from "
        "PROFILE (a whole-pass profile of that engine): refit its medians, measure nothing",
    )
    parser.add_argument(
        "--graph-reuse",
        action="store_true",
        help="--engine llama.cpp --whole-pass: time each un-profiled pass after an untimed pass "
        "of the same tokens, so that llama.cpp reuses its graph, as in speculative rounds of "
        "one draft length (default: after a pass of another size, which builds its graph)",
    )
    parser.add_argument(
        "--pass-train",
        type=int,
        default=None,
        metavar="M",
        help="--engine llama.cpp --whole-pass: time each un-profiled pass as the median of M "
        "passes in a row of the same size, each on the window one token after the one before "
        "(the first untimed), before any profiled pass, as the verification passes of "
        "speculative rounds at one draft length follow each other (at least 2; not with "
        "--graph-reuse)",
    )
    parser.add_argument(
        "--level-of",
        default=None,
        dest="level_of",
        metavar="PROFILE",
        help="--engine llama.cpp --whole-pass: time a saved llama.cpp whole-pass profile's "
        "passes again as its benchmark timed them (its n, trains, primed passes and KV type; "
        "its depths or those of --depths; --reps, default 6) and write it with "
        "whole_pass.level: at each depth today's pass times summed over the profile's, what "
        "a reused profile is off by now (level.json has every n)",
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        metavar="DIR_OR_GGUF",
        help="--engine llama.cpp: time the draft model's passes too, the same way (a model "
        "folder or name, exported at --dtype, or a .gguf file), for `specmoe plan --engine "
        "llama.cpp --llamacpp-profile`",
    )
    parser.add_argument(
        "--kv-type",
        default=None,
        choices=("f16", "q8_0"),
        help="--engine llama.cpp: the KV cache's type (default f16, llama.cpp's); q8_0: keys in "
        "q8_0, values in f16 (llama.cpp's -ctk q8_0: it quantizes V only with flash attention, "
        "off here). On an AVX-512 CPU without AVX512-FP16 and heads not a multiple of 64 wide, "
        "an f16 cache's one-token attention is ggml's scalar loop and a q8_0 one is not "
        "(results/cpu/llamacpp/kv-width/); the plan then prints -ctk q8_0",
    )
    parser.add_argument(
        "--no-output-rows",
        action="store_true",
        help="--engine llama.cpp: skip timing the target's passes with every row's logits "
        "against the last row's (llama-bench asks for the last row only, llama-server's "
        "verification for all k + 1); without them the plan leaves that time out",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="--whole-pass: measure in this many fresh processes, one after another, and keep "
        "the median process's (its engine-pass times the median over processes); one process's "
        "pass can sit far from another's on a machine whose memory regions read at different "
        "speeds (default 1: this process)",
    )
    parser.add_argument("--no-figures", action="store_true", help="write no figures in --out")
    parser.add_argument("--json", action="store_true", help="print the summary JSON on stdout")
    parser.add_argument("--out", default=None, help="directory for profile, timings, figures")


def _kernel_list(text: str, device: str) -> list[str]:
    from specmoe.kernels import KERNELS, kernel_names

    if text == "all":
        return [k for k in kernel_names(device) if k != "reference"]
    if text == "peers":
        return [
            k
            for k in ("per_slot", "dedup", "hf_batched_mm", "hf_grouped_mm", "hf_eager")
            if k in kernel_names(device)
        ]
    names = [k.strip() for k in text.split(",") if k.strip()]
    for k in names:
        if k not in KERNELS or k == "reference":
            raise InputError(
                f"--kernels: unknown {k!r} (choose from "
                f"{', '.join(x for x in KERNELS if x != 'reference')}, all, peers)"
            )
    return names


def summary(prof: BandwidthProfile) -> dict[str, Any]:
    """The machine-readable result of ``--json``."""
    ek = prof.extra.get("kernels", {})
    return {
        "model": prof.model_name,
        "device": prof.device,
        "device_name": prof.device_name,
        "dtype": prof.dtype,
        "ceiling_gbps": prof.ceiling_gbps,
        "peak_gflops": prof.peak_gflops,
        "n": prof.n,
        "beta_slot": prof.beta_slot,
        "beta_dedup": prof.beta_dedup,
        "r": prof.r,
        "u_bar": prof.u_bar,
        "reread_cost": prof.reread_cost,
        "epsilon": {**prof.epsilon, **{k: v["epsilon"] for k, v in ek.items()}},
        "crossover": prof.crossover,
        "fits": prof.fits,
        "kernels": {
            k: {
                "kind": v["kind"],
                "beta_gbps": v["beta_gbps"],
                "roofline_ratio": v["roofline_ratio"],
                "epsilon": v["epsilon"],
                "reread_cost": v["fit"].get("reread_cost"),
            }
            for k, v in ek.items()
        },
        "roles": prof.extra.get("roles"),
        "threads": prof.extra.get("threads"),
        "clock": prof.extra.get("clock"),
        "wall_s": prof.extra.get("wall_s"),
        "llc_bytes": prof.extra.get("llc_bytes"),
        "layers": prof.layers,
        "implementations": prof.implementations,
    }


def warn_fallbacks(prof: BandwidthProfile) -> None:
    """One stderr line per kernel that did not run its own implementation."""
    for name, why in prof.fallbacks.items():
        rec = prof.implementations[name]
        print(
            f"specmoe bench: warning: kernel {name!r} ran {rec.get('kernel', rec['ran'])} "
            f"({rec['ran']}), not its {rec['requested']} code: {why}; the profile's "
            f"numbers for {name!r} are those of {rec.get('kernel', rec['ran'])}",
            file=sys.stderr,
        )


def _print_table(prof: BandwidthProfile) -> None:
    print(
        f"{prof.model_name} on {prof.device_name} ({prof.device}, {prof.dtype}): ceiling "
        f"{prof.ceiling_gbps:.2f} GB/s, matmul peak "
        f"{prof.peak_gflops or float('nan'):.1f} GFLOP/s"
    )
    ek = prof.extra.get("kernels", {})
    names = list(ek)
    head = f"{'n':>3} {'β_slot':>8} {'β_dedup':>8} {'r':>6} {'ū':>6}"
    head += "".join(f" {('roof ' + k)[:14]:>14}" for k in names)
    print(head + "   (GB/s; roof = time / roofline bound)")
    for i, n in enumerate(prof.n):
        line = (
            f"{n:>3} {prof.beta_slot[i]:8.2f} {prof.beta_dedup[i]:8.2f} {prof.r[i]:6.3f} "
            f"{prof.u_bar[i]:6.3f}"
        )
        line += "".join(f" {ek[k]['roofline_ratio'][i]:14.2f}" for k in names)
        print(line)
    rc = "n/a" if prof.reread_cost is None else f"{prof.reread_cost:.2f}"
    eps = ", ".join(f"{k} {v['epsilon']:.3f}" for k, v in ek.items()) or str(prof.epsilon)
    print(
        f"re-read cost c_re/c_u {rc}; ε: {eps}; crossover "
        f"{prof.crossover if prof.crossover is not None else 'none'}"
    )
    if prof.implementations:
        ran = ", ".join(
            f"{k} {v['ran']}" + (f" (fell back from {v['requested']})" if v.get("fallback") else "")
            for k, v in prof.implementations.items()
        )
        print(f"implementations: {ran}")


MAX_N = 64  # the largest pass size a benchmark times
MAX_REPS = 10_000
MAX_PROCESSES = 64  # --whole-pass --processes


def _check_args(args: argparse.Namespace) -> None:
    check_seed(args.seed)
    # the low ends are Settings.for_run's and benchmark's own checks; these are resource limits
    check_at_most(args.n_max, "--n-max", MAX_N)
    check_at_most(args.reps, "--reps", MAX_REPS)
    check_at_most(args.windows, "--windows", MAX_REPS)
    check_at_most(args.threads, "--threads", 4096)
    if args.dtype is not None and not args.from_profile:
        from specmoe.kernels._contract import DTYPES

        q8 = str(args.dtype).lower() == "q8_0"
        if str(args.dtype).lower() not in DTYPES and not q8:
            raise InputError(
                f"--dtype: unknown {args.dtype!r} (choose from float32, bfloat16, float16, q8_0)"
            )
    check_out_dir(args.out)


MAX_DEPTH = 1 << 20


DEFAULT_DEPTHS = (512, 2048)


def parse_depths(text: str | None) -> list[int]:
    """``--depths`` as sorted distinct integers in 1..2^20 (None: the default 512, 2048);
    anything else one line."""
    if text is None:
        return list(DEFAULT_DEPTHS)
    parts = [p.strip() for p in str(text).split(",")]
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        raise InputError(f"--depths: {text!r} is not a comma-separated list of integers") from None
    if not vals or any(v < 1 or v > MAX_DEPTH for v in vals):
        raise InputError(f"--depths: every depth must lie in 1..{MAX_DEPTH}, got {text!r}")
    return sorted(set(vals))


def run(args: argparse.Namespace) -> int:
    """Hold --out against a second writer for the whole command (out_folder)."""
    if getattr(args, "processes", 1) != 1 and not getattr(args, "whole_pass", False):
        raise InputError("--processes: only with --whole-pass")
    if str(getattr(args, "dtype", None) or "").lower() == "q8_0" and (
        getattr(args, "whole_pass", False) or getattr(args, "engine", "specmoe") != "specmoe"
    ):
        raise InputError(
            "--dtype: q8_0 is timed by specmoe's expert benchmark only (not --whole-pass, "
            "not --engine llama.cpp, whose weights are the GGUF's)"
        )
    if getattr(args, "draft_model", None) is not None and args.engine != "llama.cpp":
        raise InputError("--draft-model: only with --engine llama.cpp")
    if getattr(args, "no_output_rows", False) and (
        args.engine != "llama.cpp" or getattr(args, "whole_pass", False)
    ):
        raise InputError("--no-output-rows: only with --engine llama.cpp (not --whole-pass)")
    if getattr(args, "kv_type", None) is not None and (
        args.engine != "llama.cpp" or getattr(args, "from_profile", None) is not None
    ):
        raise InputError("--kv-type: only with --engine llama.cpp, measuring (not --from)")
    fit = getattr(args, "fit", None)
    if fit is not None:
        if not getattr(args, "whole_pass", False):
            raise InputError("--fit: only with --whole-pass")
        from specmoe.bench.ops import FIT_FORMS

        if (fit in FIT_FORMS) != (args.engine == "specmoe"):
            mine = ", ".join(FIT_FORMS)
            raise InputError(
                f"--fit: {fit}: "
                + (f"a form of specmoe's engine ({mine})" if fit in FIT_FORMS else
                   f"a form of llama.cpp's whole pass; specmoe's engine's are {mine}")
            )  # fmt: skip
    if getattr(args, "graph_reuse", False) and not (
        args.engine == "llama.cpp"
        and getattr(args, "whole_pass", False)
        and getattr(args, "from_profile", None) is None
    ):
        raise InputError(
            "--graph-reuse: only with --engine llama.cpp --whole-pass, measuring (not --from)"
        )
    train = getattr(args, "pass_train", None)
    if train is not None:
        if not (
            args.engine == "llama.cpp"
            and getattr(args, "whole_pass", False)
            and getattr(args, "from_profile", None) is None
        ):
            raise InputError(
                "--pass-train: only with --engine llama.cpp --whole-pass, measuring (not --from)"
            )
        if train < 2 or train > 64:
            raise InputError(f"--pass-train: {train}: must be 2..64 passes")
        if getattr(args, "graph_reuse", False):
            raise InputError("--pass-train: not with --graph-reuse (a train's passes reuse it)")
    if getattr(args, "level_of", None) is not None:
        if not (args.engine == "llama.cpp" and getattr(args, "whole_pass", False)):
            raise InputError("--level-of: only with --engine llama.cpp --whole-pass")
        for flag, given in (
            ("--from", getattr(args, "from_profile", None) is not None),
            ("--fit", getattr(args, "fit", None) is not None),
            ("--pass-train", train is not None),
            ("--graph-reuse", getattr(args, "graph_reuse", False)),
            ("--kv-type", getattr(args, "kv_type", None) is not None),
        ):
            if given:
                raise InputError(f"--level-of: not with {flag} (the profile says how it timed)")
    refit = getattr(args, "whole_pass", False) and args.from_profile and fit is not None
    if args.model is None and not refit:
        raise InputError("--model: required (except with --whole-pass --from PROFILE --fit FORM)")
    with out_folder(args.out):
        if getattr(args, "engine", "specmoe") == "llama.cpp":
            from specmoe.commands._llamacpp import run_bench

            return run_bench(args)
        if getattr(args, "whole_pass", False):
            return _run_whole_pass(args)
        return _run(args)


def _print_ops(wp: dict[str, Any]) -> None:
    ns = wp["n"]
    print(f"{wp['model']}: {wp['layers']} layers, {wp['dtype']}, clock {wp['clock']}")
    for note in wp.get("notes", []):
        print(f"  {note}")
    for di, d in enumerate(wp["d"]):
        print(f"d = {d}: median ms per call; ε held-out relative error")
        print(f"{'op':>15} {'per':>6} {'ε':>6}" + "".join(f" {n:>7}" for n in ns))
        for name, op in wp["ops"].items():
            mark = "" if op["in_sum"] else "*"
            print(
                f"{name + mark:>15} {op['per']:>6} {op['eps']:6.3f}"
                + "".join(f" {v:7.3f}" for v in op["median_ms"][di])
            )
        print(f"{'layer':>15} {'':>6} {'':>6}" + "".join(f" {v:7.3f}" for v in wp["layer_ms"][di]))
        print(f"{'model':>15} {'':>6} {'':>6}" + "".join(f" {v:7.3f}" for v in wp["model_ms"][di]))
        if "pass_ms" in wp:
            row = "".join(f" {v:7.3f}" for v in wp["pass_ms"][di])
            print(f"{'engine pass':>15} {'':>6} {'':>6}" + row)
    print("* timed, not in the whole-pass sum (the expert fits give it)")


def _run_whole_pass(args: argparse.Namespace) -> int:
    check_seed(args.seed)
    check_at_most(args.n_max, "--n-max", MAX_N)
    check_at_most(args.reps, "--reps", MAX_REPS)
    if args.n_max is not None and args.n_max < 1:
        raise InputError(f"--n-max: must be >= 1, got {args.n_max}")
    if args.reps is not None and args.reps < 1:
        raise InputError(f"--reps: must be >= 1, got {args.reps}")
    depths = parse_depths(args.depths)
    check_out_dir(args.out)
    if args.from_profile and args.fit is not None and _whole_pass_file(args.from_profile):
        return _refit_whole_pass_file(args)
    base = load_profile(args.from_profile) if args.from_profile else None
    if base is not None and base.whole_pass is not None and args.fit is not None:
        return _refit_whole_pass(args, base)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device: cuda asked for, but torch sees no CUDA device")
        if args.clock == "cpu":
            raise InputError("--clock: cpu times one CPU thread; a CUDA pass is timed on wall")
        args.clock = "wall"
    args.clock = args.clock or "cpu"
    threads = args.threads or 1
    if args.clock == "cpu" and threads != 1:
        raise InputError("--threads: --clock cpu times one thread")
    check_at_most(args.processes, "--processes", MAX_PROCESSES)
    if args.processes < 1:
        raise InputError(f"--processes: must be >= 1, got {args.processes}")
    if args.fit == "pern-processes" and args.processes < 2:
        raise InputError("--fit: pern-processes takes the median over processes: measure with "
                         f"--processes K, K >= 2 (got {args.processes})")  # fmt: skip
    if args.processes > 1:
        wp = _whole_pass_in_processes(args, depths)
        return _write_whole_pass(args, wp, base, wall_s=wp["wall_s"])
    from specmoe.bench.ops import time_operations
    from specmoe.engine.runner import load_target

    try:
        net, _, label, _ = load_target(
            args.model, layers=args.layers, seed=args.seed, device=args.device
        )
    except InputError as exc:
        raise exc.as_flag("--model") if exc.argument == "spec" else exc from None
    res = time_operations(
        net,
        n_values=list(range(1, (args.n_max or 9) + 1)),
        depths=depths,
        dtype=args.dtype,
        reps=args.reps or 7,
        warmup=2,
        clock=args.clock,
        threads=threads,
        seed=args.seed,
        model_name=label,
    )
    wp = {**res.whole_pass, "wall_s": res.wall_s}
    return _write_whole_pass(args, wp, base, wall_s=res.wall_s)


def median_process(pass_ms: list[Any]) -> int:
    """The index of the median process: the one whose sum of log engine-pass times over every
    (depth, n) is the median of the processes' sums (the lower middle one of an even count)."""
    import numpy as np

    score = [float(np.sum(np.log(np.asarray(p, float)))) for p in pass_ms]
    order = sorted(range(len(score)), key=lambda i: (score[i], i))
    return order[(len(order) - 1) // 2]


def _whole_pass_in_processes(args: argparse.Namespace, depths: list[int]) -> dict[str, Any]:
    """``--processes K``: the whole-pass benchmark run K times, each in a fresh interpreter
    with this command's settings, the median process's ``whole_pass`` kept (every process's
    pass times recorded beside it under ``processes``)."""
    import subprocess
    import time

    child = ["bench", "--whole-pass", "--model", str(args.model), "--json", "--no-figures"]
    child += ["--depths", ",".join(str(d) for d in depths), "--device", args.device]
    child += ["--clock", args.clock or "cpu", "--seed", str(args.seed)]
    for flag, value in (("--layers", args.layers), ("--n-max", args.n_max),
                        ("--reps", args.reps), ("--threads", args.threads),
                        ("--dtype", args.dtype)):  # fmt: skip
        if value is not None:
            child += [flag, str(value)]
    code = "import sys; from specmoe.cli import main; sys.exit(main(sys.argv[1:]))"
    t0 = time.perf_counter()
    runs: list[dict[str, Any]] = []
    for i in range(args.processes):
        print(f"process {i + 1} of {args.processes}", file=sys.stderr, flush=True)
        proc = subprocess.run(
            [sys.executable, "-c", code, *child], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise InputError(f"--processes: process {i + 1} failed: {tail}")
        runs.append(json.loads(proc.stdout)["whole_pass"])
    pass_ms = [r["pass_ms"] for r in runs]
    chosen = median_process(pass_ms)
    wp = dict(runs[chosen])
    wp["processes"] = {
        "count": args.processes,
        "chosen": chosen,
        "rule": "the median process by the sum of log engine-pass times over (depth, n)",
        "pass_ms": pass_ms,
        "model_ms": [r["model_ms"] for r in runs],
        "layer_ms": [r["layer_ms"] for r in runs],
        # every process's medians of every op: the per-cell median over processes
        # (--fit pern-processes, specmoe.bench.ops.refit_pern_processes)
        "ops_median_ms": {op: [r["ops"][op]["median_ms"] for r in runs] for op in wp["ops"]},
    }
    wp["wall_s"] = time.perf_counter() - t0
    return wp


def write_refit(
    args: argparse.Namespace, prof: Any, new_wp: dict[str, Any], before: str, form: str
) -> int:
    """A refitted whole pass in ``prof`` (its source recording the refit: the profile it came
    from, the form before and after, the command) saved to ``--out``, and printed."""
    import dataclasses

    prof = dataclasses.replace(
        prof,
        whole_pass=new_wp,
        source={
            **prof.source,
            "refit": {"from": str(args.from_profile), "fit_form_before": before, "fit": form,
                      "command": "specmoe " + " ".join(sys.argv[1:])},
        },
    )  # fmt: skip
    files = [str(prof.save(Path(args.out) / "profile.json"))] if args.out else []
    return _print_refit(args, new_wp, files)


def _whole_pass_file(path: str) -> bool:
    """Whether ``path`` is a ``whole_pass.json`` (``{"whole_pass": ...}`` alone, as
    ``--whole-pass`` writes it without --from) rather than a profile."""
    from specmoe._io import read_json

    try:
        data = read_json(Path(path), "whole-pass file")
    except InputError:
        return False  # load_profile says what is wrong with it
    return isinstance(data, dict) and set(data) == {"whole_pass"}


def _refit_whole_pass_file(args: argparse.Namespace) -> int:
    """``--whole-pass --from whole_pass.json --fit FORM``: that file's whole pass refitted,
    written to ``--out``/whole_pass.json."""
    from specmoe._io import read_json
    from specmoe.bench.ops import REFITS
    from specmoe.formats.profile import whole_pass_from_dict

    wp = whole_pass_from_dict(read_json(Path(args.from_profile), "whole-pass file")["whole_pass"],
                              str(args.from_profile))  # fmt: skip
    if wp.get("engine") == "llama.cpp":
        raise InputError(
            f"{args.from_profile}: --fit {args.fit}: this whole pass is llama.cpp's",
            argument="--from",
        )
    new = REFITS[args.fit](wp)
    files = []
    if args.out:
        files.append(
            str(atomic_write_json(Path(args.out) / "whole_pass.json", {"whole_pass": new}))
        )
    return _print_refit(args, new, files)


def _print_refit(args: argparse.Namespace, new_wp: dict[str, Any], files: list[str]) -> int:
    if args.json:
        print(dumps_json({"whole_pass": new_wp, "files": files}))
        return 0
    _print_ops(new_wp)
    for name, op in new_wp["ops"].items():
        if op.get("switch") == "rows":
            plain, two = op["switch_rms"]
            print(
                f"{name}: {op['fit_low']['per_token_ms']:.3f} ms a row up to n = "
                f"{op['switch_n']}, then the line; fit error {plain:.3f} -> {two:.3f}, "
                f"held-out ε {op['eps']:.3f}"
            )
    if new_wp.get("fit_form") in ("pern", "pern-processes"):
        ns = ", ".join(str(v) for v in new_wp["n"])
        print(f"every operation: a fit of its own over the depths at n = {ns}; the form above "
              "at any other n")  # fmt: skip
    for f in files:
        print(f"wrote {f}")
    return 0


def _refit_whole_pass(args: argparse.Namespace, base: Any) -> int:
    """``--whole-pass --from PROFILE --fit FORM``: the saved whole pass of specmoe's engine
    with its matrix products refitted from their medians in FORM (:data:`specmoe.bench.ops.REFITS`);
    nothing is measured."""
    from specmoe.bench.ops import REFITS

    wp = base.whole_pass
    if wp.get("engine") == "llama.cpp":
        raise InputError(
            f"{args.from_profile}: --fit {args.fit}: this whole pass is llama.cpp's; "
            "refit it with --engine llama.cpp and one of its forms",
            argument="--from",
        )
    new = REFITS[args.fit](wp)
    return write_refit(args, base, new, wp.get("fit_form", "plain"), args.fit)


def _write_whole_pass(
    args: argparse.Namespace, wp: dict[str, Any], base: Any, *, wall_s: float
) -> int:
    if getattr(args, "fit", None) in ("switch", "pern", "pern-processes"):
        from specmoe.bench.ops import REFITS

        wp = REFITS[args.fit](wp)
    files = []
    if args.out:
        from specmoe.formats.profile import whole_pass_from_dict

        whole_pass_from_dict(wp, "whole_pass")
        out = Path(args.out)
        if base is not None:
            import dataclasses

            files.append(str(dataclasses.replace(base, whole_pass=wp).save(out / "profile.json")))
        else:
            files.append(str(atomic_write_json(out / "whole_pass.json", {"whole_pass": wp})))
    if args.json:
        print(dumps_json({"whole_pass": wp, "files": files}))
    else:
        _print_ops(wp)
        print(f"{wall_s:.1f} s")
        for f in files:
            print(f"wrote {f}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from specmoe.spec import resolve_spec

    _check_args(args)
    spec = resolve_spec(args.model)
    if args.from_profile:
        prof = load_profile(args.from_profile, spec=spec)
        records = None
    else:
        from specmoe.bench.run import Settings, benchmark
        from specmoe.kernels import KernelFallbackWarning

        dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
        try:
            settings = Settings.for_run(
                quick=args.quick,
                device=args.device,
                reps=args.reps,
                windows=args.windows,
                max_layers=args.layers,
                n_max=args.n_max,
            )
        except InputError as exc:
            raise exc.as_flag("--layers") if exc.argument == "max_layers" else exc from None
        with warnings.catch_warnings():  # said once, below, from the profile's record
            warnings.simplefilter("ignore", KernelFallbackWarning)
            res = benchmark(
                spec,
                trace=args.trace,
                device=args.device,
                dtype=dtype,
                quick=args.quick,
                seed=args.seed,
                progress=True,
                kernels=_kernel_list(args.kernels, args.device),
                threads=args.threads,
                clock=args.clock or "wall",
                settings=settings,
            )
        prof, records = res.profile, res.records
    warn_fallbacks(prof)
    files = []
    if args.out:
        out = Path(args.out)
        if not args.from_profile:
            files.append(str(prof.save(out / "profile.json")))
            files.append(
                str(
                    atomic_write_json(
                        out / "timings.json",
                        {
                            "model": prof.model_name,
                            "device": prof.device,
                            "dtype": prof.dtype,
                            "clock": prof.extra.get("clock"),
                            "expert_bytes": prof.extra.get("expert_bytes"),
                            "records": [r.to_dict() for r in records or []],
                        },
                    )
                )
            )
        if not args.no_figures:
            try:
                from specmoe.report.bench_figures import write_figures

                files.extend(str(p) for p in write_figures(prof, out))
            except ImportError as exc:  # matplotlib missing: the numbers still stand
                print(f"specmoe bench: no figures ({exc})", file=sys.stderr)
    if args.json:
        print(dumps_json({**summary(prof), "files": files}))
    else:
        _print_table(prof)
        for f in files:
            print(f"wrote {f}")
    return 0
