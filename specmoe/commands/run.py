"""``specmoe run``: real speculative decoding on an MoE model, one round-log row per round.

Models: a local HF directory, ``bundled`` (the package's tiny OLMoE), ``PRESET-dummy`` (a
preset's transformers class and shapes with dummy weights, routed by a forced trace: paper 003
Section 8; ``--layers`` keeps the first N decoder layers) or ``random:TYPE`` (a tiny random
model, for demos). Prompts default to validation-split documents of the bundled corpus with at
least ``--context`` tokens, truncated to ``--context`` tokens (paper 002 Section 4).

Grids: ``--k`` takes ``4``, ``0..8`` or ``0,2,4``; ``--acceptance`` (oracle drafter only)
``0.8``, ``0.5,0.9`` or ``LO..HI:COUNT`` (evenly spaced, e.g. ``0.2..0.98:11``). Every (k, a)
pair runs on every prompt, ``--repeats`` times; k = 0 (plain decoding) runs once per
repetition, with a null acceptance. Run ids are ``key=value`` lists (model, drafter, k, a
(exact: ``0.800``, ``0.8004``), kernel, depth, rep); ``--out DIR`` gets ``run.json`` (every
option that changes the result, and the grid), ``rounds/<run>/part-*.parquet`` (one part per
finished generation) and ``summary.json``.

Resuming (:mod:`specmoe.engine.runner`): a rerun of the same command into the same ``--out``
skips the finished generations and runs the unfinished one from scratch (an interrupted
generation is never written as finished). A folder that holds another run's work is refused:
with other options (model, drafter, kernel, tokens, seed, context, clock, ...) only
``--overwrite`` (start the folder anew) goes on; with the same options and another grid (k,
acceptance, repeats, prompts) ``--resume`` keeps the finished generations that match and runs
the rest. One writer at a time: a second ``specmoe run`` on a folder in use exits 2.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from specmoe.commands._common import check_out_dir, check_seed
from specmoe.engine.runner import (
    K_MAX,
    acceptance_label,
    file_prompts,
    forced_from,
    load_target,
    run_grid,
    validation_prompts,
)
from specmoe.errors import InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="bundled",
        help="HF model directory, 'bundled', 'PRESET-dummy' or 'random:TYPE'",
    )
    parser.add_argument("--drafter", default="oracle", help="oracle, ngram or draft-model")
    parser.add_argument(
        "--draft-model",
        metavar="PATH",
        help="draft model directory (default: the bundled draft model)",
    )
    parser.add_argument("--k", default="4", help="draft budgets: 4, 0..8 or 0,2,4")
    parser.add_argument(
        "--acceptance",
        default=None,
        help="oracle acceptance grid: 0.8, 0.5,0.9 or 0.2..0.98:11 (default 0.8)",
    )
    parser.add_argument("--kernel", default="dedup", help="per_slot, dedup or auto")
    parser.add_argument("--crossover", type=int, help="auto: dedup from this pass size on")
    parser.add_argument("--plan", metavar="PLAN", help="auto: the crossover of a plan.json")
    parser.add_argument(
        "--forced-trace",
        metavar="TRACE",
        help="force routing from a trace (.npz or shard directory, or "
        "bundled:fit / bundled:validation); dummy models default to "
        "bundled:validation",
    )
    parser.add_argument("--layers", type=int, help="decoder layers of a PRESET-dummy model")
    parser.add_argument(
        "--prompts", metavar="FILE", help="prompts: one per line, or a JSON list of strings"
    )
    parser.add_argument(
        "--num-prompts",
        type=int,
        default=3,
        help="validation documents to use as prompts (default 3)",
    )
    parser.add_argument(
        "--prompt-offset",
        type=int,
        default=0,
        help="skip this many eligible validation documents (held-out sets)",
    )
    parser.add_argument(
        "--context", type=int, default=512, help="prompt tokens before decoding (default 512)"
    )
    parser.add_argument(
        "--tokens", type=int, default=256, help="tokens to generate per prompt (default 256)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="repetitions of each run")
    parser.add_argument("--seed", type=int, default=0, help="seed (oracle draws, dummy weights)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--threads", type=int, help="torch and kernel threads")
    parser.add_argument(
        "--clock",
        default="wall",
        help="wall (default) or cpu: time passes by the CPU time of the one "
        "thread that runs them (with --threads 1, on the CPU)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary JSON on stdout")
    parser.add_argument(
        "--out",
        help="directory for run.json, round logs and summary.json; a rerun of the same "
        "command skips finished generations and redoes an interrupted one; a folder "
        "holding another run's work needs --resume or --overwrite",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="--out holds a run with the same options and another grid (--k, --acceptance, "
        "--repeats, prompts): keep its finished generations, run the rest",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="--out holds another run's work: delete its run.json, rounds/ and summary.json "
        "and start anew",
    )
    parser.add_argument(
        "--engine",
        default="specmoe",
        choices=("specmoe", "llama.cpp"),
        help="llama.cpp: its llama-speculative-simple with --drafter draft-model or ngram, the "
        "models exported to GGUF (bf16), rounds from its log (needs make llama-cpp)",
    )
    parser.add_argument(
        "--spec-type",
        help="--engine llama.cpp --drafter ngram: llama.cpp's n-gram drafter, ngram-simple "
        "(default), ngram-map-k, ngram-map-k4v, ngram-mod or ngram-cache (k = 8 only)",
    )
    parser.add_argument(
        "--ngram-size-n",
        type=int,
        help="--engine llama.cpp --drafter ngram: tokens of the n-gram looked up (default 1; "
        "at most k for ngram-simple and ngram-map-*; ngram-mod's n-match)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


# ------------------------------------------------------------------------------------------
# argument parsing


def parse_k(text: str) -> list[int]:
    """``4`` | ``0..8`` | ``0,2,4`` -> sorted distinct budgets in 0..K_MAX."""
    t = str(text).strip()
    try:
        if ".." in t:
            lo, hi = (int(x) for x in t.split(".."))
            ks = list(range(lo, hi + 1))
        else:
            ks = [int(x) for x in t.split(",")]
    except ValueError:
        raise InputError(f"--k {text!r}: expected 4, 0..8 or 0,2,4") from None
    if not ks:
        raise InputError(f"--k {text!r}: empty range")
    bad = [k for k in ks if not 0 <= k <= K_MAX]
    if bad:
        raise InputError(f"--k {bad[0]}: must be in 0..{K_MAX}")
    return sorted(set(ks))


def parse_grid(text: str) -> list[float]:
    """``0.8`` | ``0.5,0.9`` | ``LO..HI:COUNT`` -> acceptance values in [0, 1]."""
    import numpy as np

    t = str(text).strip()
    m = re.fullmatch(r"([0-9.eE+-]+)\.\.([0-9.eE+-]+):(\d+)", t)
    try:
        if m:
            count = int(m.group(3))
            if count < 1:
                raise ValueError
            vals = [
                float(round(v, 6)) for v in np.linspace(float(m.group(1)), float(m.group(2)), count)
            ]
        else:
            vals = [float(x) for x in t.split(",")]
    except ValueError:
        raise InputError(f"--acceptance {text!r}: expected 0.8, 0.5,0.9 or 0.2..0.98:11") from None
    bad = [a for a in vals if not 0.0 <= a <= 1.0]
    if bad:
        raise InputError(f"--acceptance {bad[0]}: must be in [0, 1]")
    return vals


def _check(args: argparse.Namespace) -> None:
    for dest in ("spec_type", "ngram_size_n"):
        if getattr(args, dest, None) is not None:
            raise InputError(f"--{dest.replace('_', '-')} applies to --engine llama.cpp only")
    for flag in ("tokens", "context", "repeats", "num_prompts", "threads", "layers"):
        v = getattr(args, flag, None)
        if v is not None and v < 1:
            raise InputError(f"--{flag.replace('_', '-')} must be a positive integer, got {v}")
    if args.context < 2:
        raise InputError(f"--context must be at least 2, got {args.context}")
    if args.prompt_offset < 0:
        raise InputError(f"--prompt-offset must be >= 0, got {args.prompt_offset}")
    from specmoe.engine.drafters import DRAFTERS
    from specmoe.engine.switch import KERNEL_SETTINGS

    if args.drafter not in DRAFTERS:
        raise InputError(f"--drafter {args.drafter!r}: unknown (choose from {', '.join(DRAFTERS)})")
    if args.kernel not in KERNEL_SETTINGS:
        raise InputError(
            f"--kernel {args.kernel!r}: unknown (choose from {', '.join(KERNEL_SETTINGS)})"
        )
    if args.acceptance is not None and args.drafter != "oracle":
        raise InputError("--acceptance applies to --drafter oracle only")
    if args.draft_model is not None and args.drafter != "draft-model":
        raise InputError("--draft-model applies to --drafter draft-model only")
    if args.crossover is not None and args.plan is not None:
        raise InputError("--crossover and --plan exclude each other")
    if args.kernel == "auto" and args.crossover is None and args.plan is None:
        raise InputError("--kernel auto needs --crossover N or --plan PLAN")
    if args.kernel != "auto" and (args.crossover is not None or args.plan is not None):
        raise InputError("--crossover/--plan apply to --kernel auto only")
    if args.clock not in ("wall", "cpu"):
        raise InputError(f"--clock {args.clock!r}: choose wall or cpu")
    if args.clock == "cpu" and args.threads != 1:
        raise InputError("--clock cpu needs --threads 1 (the CPU time of one thread)")
    if args.crossover is not None and args.crossover < 1:
        raise InputError(f"--crossover must be a positive pass size, got {args.crossover}")


def _flagged(exc: InputError, **flags: str) -> InputError:
    """``exc`` naming the flag of its library argument, where the two names differ (the
    dispatcher maps an argument named as a flag's dest by itself)."""
    return exc.as_flag(flags[exc.argument]) if exc.argument in flags else exc


# ------------------------------------------------------------------------------------------


# the options of the manifest (run.json) and the flags that set them
_OPTION_FLAGS = {
    "model": "--model",
    "model_label": "--model",
    "layers": "--layers",
    "drafter": "--drafter",
    "draft_model": "--draft-model",
    "kernel": "--kernel",
    "crossover": "--crossover/--plan",
    "forced_trace": "--forced-trace",
    "context": "--context",
    "tokens": "--tokens",
    "seed": "--seed",
    "device": "--device",
    "threads": "--threads",
    "clock": "--clock",
}
_GRID_FLAGS = {
    "k": "--k",
    "acceptance": "--acceptance",
    "repeats": "--repeats",
    "prompts": "the prompts (--prompts, --num-prompts, --prompt-offset)",
}


def _shown(v: object) -> str:
    import json

    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_out(out: Path, options: dict, grid: dict, *, resume: bool, overwrite: bool) -> None:
    """Refuse a folder holding another run's work (unless --overwrite, or --resume when only
    the grid differs); only the keys given are compared (before the model loads, those the
    flags give alone; after, all)."""
    from specmoe.engine.runner import differing, holds_work, read_manifest

    if overwrite or not holds_work(out):
        return
    old = read_manifest(out)
    if old is None:
        raise InputError(
            f"--out {out}: holds a round log or summary.json without {'run.json'} (an older "
            "run's or another program's work); --overwrite starts the folder anew"
        )
    opts = differing(old["options"], options)
    if opts:
        what = "; ".join(
            f"{_OPTION_FLAGS.get(k, k)} {_shown(old['options'][k])} there, {_shown(options[k])} now"
            for k in opts
        )
        raise InputError(
            f"--out {out}: holds a run with other options ({what}); --overwrite starts the "
            "folder anew"
        )
    if resume:
        return
    grids = differing(old["grid"], grid)
    if grids:
        what = "; ".join(
            _GRID_FLAGS[k]
            if k == "prompts"
            else f"{_GRID_FLAGS.get(k, k)} {_shown(old['grid'][k])} there, {_shown(grid[k])} now"
            for k in grids
        )
        raise InputError(
            f"--out {out}: holds a run of another grid ({what} differ); --resume keeps its "
            "finished generations and runs the rest, --overwrite starts the folder anew"
        )


def run(args: argparse.Namespace) -> int:
    import contextlib

    from specmoe._io import out_lock

    if getattr(args, "engine", "specmoe") == "llama.cpp":
        from specmoe.commands._llamacpp import run_spec

        return run_spec(args)
    _check(args)
    if args.resume and args.overwrite:
        raise InputError("--resume and --overwrite exclude each other")
    check_seed(args.seed)
    out = check_out_dir(args.out) if args.out else None
    with out_lock(out) if out is not None else contextlib.nullcontext():
        return _run(args, out)


def _run(args: argparse.Namespace, out: Path | None) -> int:
    import torch

    from specmoe._io import atomic_write_json, dumps_json
    from specmoe.engine.runner import clear_run, prompt_digest, write_manifest
    from specmoe.engine.speculative import Engine
    from specmoe.engine.switch import KernelPolicy, crossover_from_plan

    ks = parse_k(args.k)
    accs = parse_grid(args.acceptance if args.acceptance is not None else "0.8")
    crossover = crossover_from_plan(args.plan) if args.plan else args.crossover
    policy = KernelPolicy(args.kernel, crossover=crossover, max_pass=K_MAX + 1)
    options = {
        "model": args.model,
        "drafter": args.drafter,
        "draft_model": args.draft_model,
        "kernel": policy.label,
        "crossover": crossover,
        "forced_trace": args.forced_trace,
        "context": args.context,
        "tokens": args.tokens,
        "seed": args.seed,
        "device": args.device,
        "threads": args.threads,
        "clock": args.clock,
    }
    grid = {
        "k": ks,
        "acceptance": accs if args.drafter == "oracle" else None,
        "repeats": args.repeats,
    }
    if out is not None:  # before the model loads: what the flags give alone
        early = {k: v for k, v in options.items() if k != "forced_trace" or v is not None}
        _check_out(out, early, grid, resume=args.resume, overwrite=args.overwrite)
    if args.threads:
        from specmoe.kernels import cpu

        torch.set_num_threads(args.threads)
        cpu.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    draft = None
    if args.drafter == "draft-model":
        from specmoe.engine.drafters import load_draft_model

        try:
            draft = load_draft_model(args.draft_model, device=args.device)
        except InputError as exc:
            raise _flagged(exc, path="--draft-model") from None
    model, tokenizer, label, dummy = load_target(
        args.model,
        device=args.device,
        layers=args.layers,
        seed=args.seed,
        context=args.context + args.tokens + 32,
    )
    limit = int(getattr(model.config, "max_position_embeddings", 0) or 0)
    if limit and args.context + args.tokens + K_MAX > limit:
        raise InputError(
            f"--context {args.context} + --tokens {args.tokens}: longer than the "
            f"model's {limit} positions"
        )
    trace_spec = args.forced_trace
    if trace_spec is None and dummy:
        from specmoe.data import corpus

        if corpus.bundled_trace_path("validation").exists():
            trace_spec = "bundled:validation"
        else:
            print(
                "specmoe run: note: no bundled trace; the dummy model routes by its random routers",
                file=sys.stderr,
            )
    forced = forced_from(trace_spec, model)
    prompts = (
        file_prompts(args.prompts, tokenizer, context=args.context)
        if args.prompts
        else validation_prompts(
            tokenizer, count=args.num_prompts, context=args.context, offset=args.prompt_offset
        )
    )
    options.update(
        model_label=label, layers=model.config.num_hidden_layers, forced_trace=trace_spec
    )
    grid["prompts"] = [[p, prompt_digest(ids)] for p, ids in prompts]
    if out is not None:
        _check_out(out, options, grid, resume=args.resume, overwrite=args.overwrite)
        if args.overwrite:
            clear_run(out)
        write_manifest(out, options=options, grid=grid)
    engine = Engine(
        model, policy=policy, forced=forced, prefill="skip" if dummy else "model", clock=args.clock
    )
    try:
        gens = run_grid(
            engine,
            prompts,
            drafter=args.drafter,
            ks=ks,
            accs=accs if args.drafter == "oracle" else None,
            tokens=args.tokens,
            label=label,
            out=out,
            seed=args.seed,
            repeats=args.repeats,
            draft_model=draft,
            forced=forced,
            progress=not args.quiet,
            depth=args.context,
            identity=options,
        )
    except InputError as exc:
        raise _flagged(exc, max_new_tokens="--tokens", budget="--k", name="--drafter") from None
    finally:
        engine.close()
    summary = {
        "model": label,
        "drafter": args.drafter,
        "kernel": policy.label,
        "clock": args.clock,
        "crossover": crossover,
        "forced_trace": trace_spec,
        "layers": model.config.num_hidden_layers,
        "context": args.context,
        "tokens": args.tokens,
        "seed": args.seed,
        "repeats": args.repeats,
        "prompts": [p for p, _ in prompts],
        "k": ks,
        "acceptance": accs if args.drafter == "oracle" else None,
        "generations": gens,
        "out": None if out is None else str(out),
    }
    if out is not None:
        atomic_write_json(out / "summary.json", summary)
    if args.json:
        print(dumps_json(summary))
    else:
        for g in gens:
            a = "" if g["acceptance"] is None else f" a={acceptance_label(g['acceptance'])}"
            real = (
                ""
                if g["k"] == 0 or g["drafted"] == 0
                else f", realised acceptance {g['realised_acceptance']:.3f}"
            )
            print(
                f"{g['prompt_id']}: k={g['k']}{a} {g['tokens']} tokens in {g['rounds']} "
                f"rounds, {g['tokens_per_s']:.1f} tok/s{real}"
            )
    return 0


if __name__ == "__main__":  # pragma: no cover
    from specmoe.cli import main

    sys.exit(main(["run", *sys.argv[1:]]))
