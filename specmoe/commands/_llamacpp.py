"""``specmoe bench --engine llama.cpp``: llama.cpp's verify passes timed by its own llama-bench.

One pass of n = 1..``--n-max`` tokens on a KV cache of each ``--depths`` (``llama-bench -p
1,...,N -n 0 -d D -r REPS -t THREADS -fa off``), for ``--model`` exported to GGUF at
``--dtype`` (bf16 by default; f32, f16, q8_0) by llama.cpp's converter, or a ``.gguf`` file as
it is. Then (unless ``--no-output-rows``) the target's passes with every row's logits against
the last row's, in libllama (:mod:`specmoe.engines.llamacpp_rows`): llama-bench asks for the
last row's logits only, llama-server's verification for all k + 1 rows. ``--out`` gets
``llamacpp_verify.json``; ``--json`` prints the same on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import Any

from specmoe.errors import InputError

_DTYPE_ALIASES = {"bfloat16": "bf16", "float32": "f32", "float16": "f16"}


def _outtype(args: argparse.Namespace) -> str | None:
    """The GGUF weight type of --dtype; None for a .gguf --model (its own types)."""
    from specmoe.engines import llamacpp

    if str(args.model).endswith(".gguf"):
        if not Path(args.model).is_file():
            raise InputError(f"--model: {args.model}: no such GGUF file")
        return None
    outtype = _DTYPE_ALIASES.get(str(args.dtype), args.dtype) if args.dtype else "bf16"
    if outtype not in llamacpp.OUTTYPES:
        raise InputError(
            f"--dtype: unknown {args.dtype!r} for llama.cpp "
            f"(choose from {', '.join(llamacpp.OUTTYPES)})"
        )
    return outtype


def _gguf_of(
    args: argparse.Namespace, outtype: str | None, tmp: str, *, model: str | None = None
) -> tuple[Path, str]:
    """``model`` (default --model) as a GGUF file: itself when it is one, else exported at
    ``outtype`` (bf16 when --model was a .gguf file) into ``tmp``."""
    from specmoe.engine.models import resolve_model_dir
    from specmoe.engines import llamacpp

    name = args.model if model is None else model
    if str(name).endswith(".gguf"):
        return Path(name), "as exported"
    outtype = outtype or "bf16"
    model_dir = resolve_model_dir(name)
    print(f"bench: exporting {model_dir} to GGUF ({outtype})", file=sys.stderr)
    stem = "model" if model is None else "draft"
    return llamacpp.export_gguf(
        model_dir, Path(tmp) / f"{stem}-{outtype}.gguf", outtype=outtype
    ), outtype


def _verify_rows(
    gguf: Path,
    depths: list[int],
    n_max: int,
    reps: int,
    threads: int,
    what: str,
    *,
    graph_reuse: bool = True,
    kv_type: str = "f16",
):
    from specmoe.engines import llamacpp

    verify: dict[str, list[dict[str, Any]]] = {}
    for d in depths:
        how = "" if graph_reuse else ", every graph rebuilt"
        print(f"bench: llama-bench {what} n=1..{n_max} at depth {d}{how}", file=sys.stderr)
        times = llamacpp.bench_verify(
            gguf,
            n_values=tuple(range(1, n_max + 1)),
            depth=d,
            repeats=reps,
            threads=threads,
            graph_reuse=graph_reuse,
            kv_type=kv_type,
        )
        verify[str(d)] = [
            {
                "n": t.n_prompt,
                "median_ms": t.median_ms,
                "mean_ms": t.mean_ms,
                "min_ms": min(t.samples_ms),
                "samples_ms": list(t.samples_ms),
            }
            for t in times
        ]
    return verify


def head_dim(gguf: Path) -> int:
    """The width of one attention head of a GGUF model, from its metadata through libllama:
    ``<arch>.attention.key_length``, else the embedding length over the heads."""
    from specmoe.engines.llamacpp_pass import LlamaCppEngine

    with LlamaCppEngine(gguf, n_ctx=16) as eng:
        arch = eng.meta("general.architecture")
        key = eng.meta(f"{arch}.attention.key_length")
        if key is not None:
            return int(float(key))
        h, heads = eng.meta(f"{arch}.embedding_length"), eng.meta(f"{arch}.attention.head_count")
        if h is None or heads is None:
            raise InputError(f"{gguf}: no {arch}.embedding_length or head_count in the GGUF")
        return int(float(h)) // int(float(heads))


def _attention_notes(gguf: Path, kv: str) -> list[str]:
    """What the user of this CPU should know of the KV cache's type (printed and recorded):
    with an f16 cache, :func:`specmoe.engines.llamacpp.scalar_attention_note`."""
    from specmoe.engines import llamacpp

    if kv != "f16":
        return []
    note = llamacpp.scalar_attention_note(head_dim(gguf), llamacpp.cpu_flags())
    return [note] if note else []


def run_bench(args: argparse.Namespace) -> int:
    if getattr(args, "whole_pass", False):
        return run_whole_pass(args)
    from specmoe._io import atomic_write_json, dumps_json
    from specmoe.commands._common import check_at_most, check_int, check_out_dir
    from specmoe.commands.bench import MAX_N, MAX_REPS, parse_depths
    from specmoe.engines import llamacpp

    check_out_dir(args.out)
    depths = parse_depths(args.depths)
    n_max = 9 if args.n_max is None else args.n_max
    reps = 50 if args.reps is None else args.reps
    threads = 1 if args.threads is None else args.threads
    check_int(n_max, "--n-max", low=1, high=MAX_N)
    check_int(reps, "--reps", low=1, high=MAX_REPS)
    check_at_most(threads, "--threads", 4096)
    check_int(threads, "--threads", low=1)
    outtype = _outtype(args)
    kv = getattr(args, "kv_type", None) or "f16"
    draft_name = getattr(args, "draft_model", None)
    if draft_name is not None and str(draft_name).endswith(".gguf"):
        if not Path(draft_name).is_file():
            raise InputError(f"--draft-model: {draft_name}: no such GGUF file")
    llamacpp.require_built()
    draft = None
    with tempfile.TemporaryDirectory(prefix="specmoe-gguf-") as tmp:
        if draft_name is not None:  # exported first: a bad folder fails before any timing
            draft_gguf, draft_dtype = _gguf_of(args, outtype, tmp, model=str(draft_name))
        gguf, dtype = _gguf_of(args, outtype, tmp)
        verify = _verify_rows(gguf, depths, n_max, reps, threads, "target", kv_type=kv)
        notes = _attention_notes(gguf, kv)
        extra = None
        if not getattr(args, "no_output_rows", False):
            from specmoe.engines.llamacpp_rows import output_rows

            extra = output_rows(gguf, depths, n_max, threads=threads, kv_type=kv)
        if draft_name is not None:
            draft = {
                "model": str(draft_name),
                "dtype": draft_dtype,
                "verify": _verify_rows(
                    draft_gguf, depths, n_max, reps, threads, "draft", kv_type=kv
                ),
                # the draft context alternates 1 and k + 1 tokens: two graph builds a round
                "verify_rebuilt": _verify_rows(
                    draft_gguf,
                    depths,
                    n_max,
                    reps,
                    threads,
                    "draft",
                    graph_reuse=False,
                    kv_type=kv,
                ),
            }
    result = {
        "engine": "llama.cpp",
        "llama_cpp": llamacpp.VERSION,
        "model": str(args.model),
        "dtype": dtype,
        "threads": threads,
        "flash_attn": False,
        "kv_type": kv,
        "reps": reps,
        "verify": verify,
        **({"output_rows": extra} if extra is not None else {}),
        **({"draft": draft} if draft is not None else {}),
        **({"notes": notes} if notes else {}),
    }
    files = []
    if args.out:
        files.append(str(atomic_write_json(Path(args.out) / "llamacpp_verify.json", result)))
    if args.json:
        print(dumps_json({**result, "files": files}))
        return 0
    print(
        f"llama.cpp {llamacpp.VERSION} verify pass, {dtype}, KV cache {kv}, {threads} thread(s), "
        "median ms"
    )
    print("depth " + " ".join(f"{'n=' + str(n):>7}" for n in range(1, n_max + 1)))
    for d, rows in verify.items():
        print(f"{d:>5} " + " ".join(f"{r['median_ms']:7.3f}" for r in rows))
    for note in notes:
        print(f"note: {note}")
    if extra is not None:
        print("extra ms of every row's logits over the last row's (llama-server's verification)")
        for d, rr in extra["depths"].items():
            print(f"{d:>5} " + " ".join(f"{r['extra_ms']['median']:7.3f}" for r in rr))
    if draft is not None:
        print(f"draft model {draft['model']} ({draft['dtype']}), median ms")
        for d, rows in draft["verify"].items():
            print(f"{d:>5} " + " ".join(f"{r['median_ms']:7.3f}" for r in rows))
    for f in files:
        print(f"wrote {f}")
    return 0


def _refit_whole_pass(args: argparse.Namespace, form: str) -> int:
    """``--from PROFILE --fit FORM``: the saved llama.cpp whole-pass profile with its ops
    refitted from their medians (:func:`specmoe.engines.llamacpp_ops.refit`); nothing is
    measured, and the profile's source records the refit."""
    from specmoe.engines.llamacpp_ops import refit
    from specmoe.formats.profile import load_profile

    prof = load_profile(args.from_profile)
    wp = prof.whole_pass
    if wp is None or wp.get("engine") != "llama.cpp":
        raise InputError(
            f"{args.from_profile}: --fit refits a llama.cpp whole-pass profile "
            "(`specmoe bench --engine llama.cpp --whole-pass`); this one has none",
            argument="--from",
        )
    from specmoe.commands.bench import write_refit

    return write_refit(args, prof, refit(wp, form), wp.get("fit_form", "linear"), form)


def run_whole_pass(args: argparse.Namespace) -> int:
    """``specmoe bench --engine llama.cpp --whole-pass``: every operation of llama.cpp's verify
    pass from per-node profiles of its own graph (:mod:`specmoe.engines.llamacpp_ops`), on a
    validation document of the bundled corpus (bundled tokenizer) at each --depths and
    n = 1..--n-max; ``--out`` gets ``profile.json`` (the expert fit of llama.cpp's MUL_MAT_ID
    and the ``whole_pass`` field, read by ``specmoe plan``)."""
    from specmoe._io import dumps_json
    from specmoe.commands._common import check_int, check_out_dir
    from specmoe.commands.bench import MAX_N, MAX_REPS, _print_ops, parse_depths
    from specmoe.engine.models import load_tokenizer
    from specmoe.engine.runner import validation_prompts
    from specmoe.engines import llamacpp
    from specmoe.engines.llamacpp_ops import benchmark_profile

    check_out_dir(args.out)
    if getattr(args, "level_of", None) is not None:
        return _level_of(args)
    form = getattr(args, "fit", None) or "step1"
    if getattr(args, "from_profile", None):
        return _refit_whole_pass(args, form)
    depths = parse_depths(args.depths)
    n_max = 9 if args.n_max is None else args.n_max
    reps = 7 if args.reps is None else args.reps
    check_int(n_max, "--n-max", low=1, high=MAX_N)
    check_int(reps, "--reps", low=1, high=MAX_REPS)
    if args.threads not in (None, 1):
        raise InputError("--threads: the per-node profile is one thread's CPU time (1)")
    if args.clock not in (None, "cpu"):
        raise InputError("--clock: the per-node profile is timed on the thread CPU clock (cpu)")
    if getattr(args, "processes", 1) != 1:
        raise InputError("--processes: not with --engine llama.cpp")
    if args.device != "cpu":
        raise InputError(f"--device {args.device!r}: this llama.cpp build runs on the CPU only")
    outtype = _outtype(args)
    llamacpp.require_built()
    tok = load_tokenizer("bundled")
    ((doc, ids),) = validation_prompts(tok, count=1, context=depths[-1] + 256)
    source = {
        "command": "specmoe " + " ".join(sys.argv[1:]),
        "prompt": doc,
        "engine": "llama.cpp",
        "llama_cpp": llamacpp.VERSION,
    }
    with tempfile.TemporaryDirectory(prefix="specmoe-gguf-") as tmp:
        gguf, _ = _gguf_of(args, outtype, tmp)
        prof = benchmark_profile(
            gguf, ids, n_values=list(range(1, n_max + 1)), depths=depths, reps=reps,
            source={**source, "gguf": str(args.model)}, fit=form,
            prime=bool(getattr(args, "graph_reuse", False)),
            train=int(getattr(args, "pass_train", None) or 0),
            kv_type=getattr(args, "kv_type", None) or "f16",
        )  # fmt: skip
    files = []
    if args.out:
        files.append(str(prof.save(Path(args.out) / "profile.json")))
    wp = prof.whole_pass
    if args.json:
        print(dumps_json({"whole_pass": wp, "files": files}))
        return 0
    _print_ops(wp)
    print(
        "experts (MUL_MAT_ID, Eq. (E.1)): beta_dedup "
        + " ".join(f"{v:.2f}" for v in prof.beta_dedup)
        + f" GB/s, epsilon {prof.epsilon['dedup']:.3f}"
    )
    print(f"{wp['wall_s']:.1f} s")
    for f in files:
        print(f"wrote {f}")
    return 0


def _level_of(args: argparse.Namespace) -> int:
    """``specmoe bench --engine llama.cpp --whole-pass --level-of PROFILE``: the profile's
    passes timed again as its benchmark timed them
    (:func:`specmoe.engines.llamacpp_ops.level_of_profile`); ``--out`` gets ``level.json``
    (every depth's n, then and now) and ``profile.json``, the profile with
    ``whole_pass.level`` (which ``specmoe validate`` applies to its whole-pass version)."""
    import hashlib
    import os

    from specmoe._io import atomic_write_json, dumps_json, home_as_tilde
    from specmoe.commands._common import check_int
    from specmoe.commands.bench import MAX_REPS, parse_depths
    from specmoe.engine.models import load_tokenizer
    from specmoe.engine.runner import validation_prompts
    from specmoe.engines import llamacpp
    from specmoe.engines.llamacpp_ops import LEVEL_TOLERANCE, level_of_profile
    from specmoe.formats.profile import load_profile

    path = Path(args.level_of)
    prof = load_profile(path, argument="level-of")
    wp = prof.whole_pass
    if wp is None or wp.get("engine") != "llama.cpp":
        raise InputError(f"--level-of: {path}: not a llama.cpp whole-pass profile")
    ds_prof = [int(d) for d in wp["d"]]
    depths = ds_prof if args.depths is None else parse_depths(args.depths)
    bad = [d for d in depths if d not in ds_prof]
    if bad:
        raise InputError(f"--depths: {path} has the depths {ds_prof}, not {bad[0]}")
    reps = 6 if args.reps is None else args.reps
    check_int(reps, "--reps", low=1, high=MAX_REPS)
    if args.n_max is not None:
        raise InputError("--n-max: not with --level-of (the profile's n are timed)")
    outtype = _outtype(args)
    llamacpp.require_built()
    ((_, ids),) = validation_prompts(load_tokenizer("bundled"), count=1, context=ds_prof[-1] + 256)
    with tempfile.TemporaryDirectory(prefix="specmoe-gguf-") as tmp:
        gguf, _ = _gguf_of(args, outtype, tmp)
        size, want = os.path.getsize(gguf), wp.get("weight_bytes")
        if want is not None and int(want) != size:
            raise InputError(
                f"--model: {args.model} is not the model {path} timed "
                f"({size} bytes of weights, the profile's {want})"
            )
        res = level_of_profile(gguf, ids, wp, depths=depths, reps=reps)
    levels = {d: v["level"] for d, v in res["depths"].items()}
    far = {d: x for d, x in levels.items() if abs(x - 1) > LEVEL_TOLERANCE}
    verdict = (
        f"beyond {LEVEL_TOLERANCE:.0%} at d = {', '.join(far)}: the profile's pass times are "
        "off by that much on this machine now; benchmark again before planning from it"
        if far
        else f"within {LEVEL_TOLERANCE:.0%} at every depth: the profile's level holds"
    )
    record = {
        "profile": home_as_tilde([str(path)])[0],
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "command": " ".join(["specmoe", *home_as_tilde(sys.argv[1:])]),
        "levels": levels,
        "tolerance": LEVEL_TOLERANCE,
        "verdict": verdict,
        **res,
    }
    files = []
    if args.out:
        out = Path(args.out)
        new_wp = {
            **wp,
            "level": levels,
            "level_how": "sum over n of the passes timed again over the profile's pass_ms "
            "(specmoe bench --engine llama.cpp --whole-pass --level-of)",
            "level_base": {"profile": record["profile"], "sha256": record["sha256"]},
        }
        files.append(str(atomic_write_json(out / "level.json", record)))
        files.append(str(dataclasses.replace(prof, whole_pass=new_wp).save(out / "profile.json")))
    if args.json:
        print(dumps_json({**record, "files": files}))
        return 0
    for d, v in res["depths"].items():
        print(f"d = {d}: level {v['level']:.3f} (today's passes over {path.name}'s)")
        print("  n      " + " ".join(f"{n:>8}" for n in res["n"]))
        print("  then ms" + " ".join(f"{x:8.3f}" for x in v["then_ms"]))
        print("  now ms " + " ".join(f"{x:8.3f}" for x in v["now_ms"]))
        print("  ratio  " + " ".join(f"{x:8.3f}" for x in v["ratio"]))
    print(verdict)
    print(f"{res['wall_s']:.1f} s")
    for f in files:
        print(f"wrote {f}")
    return 0


# ------------------------------------------------------------------------------------------
# specmoe run --engine llama.cpp

_RUN_UNSUPPORTED = {
    "acceptance": "--acceptance",
    "forced_trace": "--forced-trace",
    "layers": "--layers",
    "plan": "--plan",
    "crossover": "--crossover",
    "resume": "--resume",
}


def _check_run(args: argparse.Namespace) -> None:
    from specmoe.commands._common import check_int

    if args.drafter not in ("draft-model", "ngram"):
        raise InputError(
            f"--drafter {args.drafter!r}: --engine llama.cpp runs --drafter draft-model "
            "(llama.cpp's draft-simple with the draft model) or ngram (its n-gram lookup)"
        )
    if args.drafter == "ngram":
        from specmoe.engines.llamacpp_ngram import SPEC_TYPES

        if args.draft_model is not None:
            raise InputError(
                "--draft-model applies to --drafter draft-model only (--drafter ngram drafts "
                "from the generation's own tokens)"
            )
        spec_type = args.spec_type or "ngram-simple"
        if spec_type not in SPEC_TYPES:
            raise InputError(f"--spec-type {spec_type!r}: choose from {', '.join(SPEC_TYPES)}")
        if args.ngram_size_n is not None:
            check_int(args.ngram_size_n, "--ngram-size-n", low=1, high=1024)
    elif args.spec_type not in (None, "draft-simple") or args.ngram_size_n is not None:
        flag = "--spec-type" if args.spec_type not in (None, "draft-simple") else "--ngram-size-n"
        raise InputError(f"{flag} applies to --drafter ngram only (draft-model: draft-simple)")
    for dest, flag in _RUN_UNSUPPORTED.items():
        if getattr(args, dest, None) not in (None, False):
            raise InputError(f"{flag} does not apply to --engine llama.cpp")
    if args.clock != "wall":
        raise InputError("--clock: llama.cpp reports wall time only (--clock wall)")
    if args.device != "cpu":
        raise InputError(f"--device {args.device!r}: this llama.cpp build runs on the CPU only")
    for flag in ("tokens", "context", "repeats", "num_prompts"):
        check_int(getattr(args, flag), f"--{flag.replace('_', '-')}", low=1)
    check_int(args.threads, "--threads", low=1, high=4096)
    check_int(args.tokens, "--tokens", low=1, high=1 << 16)


def _prompt_texts(args: argparse.Namespace, tokenizer: object) -> list[tuple[str, str]]:
    """(name, text): --prompts as they are, else validation documents cut to --context
    tokens of the bundled tokenizer, decoded back to text (llama.cpp tokenizes the text)."""
    from specmoe.engine.runner import validation_prompts

    if args.prompts:
        from specmoe.commands.capture import read_prompts

        return [(f"prompt-{i:03d}", s) for i, s in enumerate(read_prompts(args.prompts))]
    docs = validation_prompts(
        tokenizer, count=args.num_prompts, context=args.context, offset=args.prompt_offset
    )
    return [(name, tokenizer.decode(ids)) for name, ids in docs]


def run_spec(args: argparse.Namespace) -> int:
    """``specmoe run --engine llama.cpp``: llama-speculative-simple with the draft model
    (``--drafter draft-model``) or an n-gram lookup of the generation's own tokens (``--drafter
    ngram``, ``--spec-type`` ngram-simple by default, :mod:`specmoe.engines.llamacpp_ngram`) at
    each k of --k (k = 0: plain decoding timed by llama-bench), each prompt and repetition.

    Each generation runs twice: at llama.cpp's default verbosity for its throughput, and with
    the debug log that gives its rounds (which slows it) for the round log
    ``rounds/<run id>/part-*.parquet``, routing replayed in specmoe's engine. ``summary.json``
    holds the throughputs, ``run.json`` the options and grid. A folder holding a run is
    refused unless --overwrite. n-gram runs keep the generated text in each run's row; their
    round logs are written for ngram-simple only (the other types' logs name no drafts)."""
    import numpy as np

    from specmoe._io import atomic_write_json, dumps_json, out_lock
    from specmoe.commands._common import check_out_dir, check_seed
    from specmoe.commands.run import parse_k
    from specmoe.engine.models import load_model, load_tokenizer, resolve_model_dir
    from specmoe.engine.runner import clear_run, holds_work, run_id, write_manifest
    from specmoe.engines import llamacpp

    _check_run(args)
    check_seed(args.seed)
    ks = parse_k(args.k)
    ngram = args.drafter == "ngram"
    spec_type = (args.spec_type or "ngram-simple") if ngram else "draft-simple"
    size_n = args.ngram_size_n or 1
    if ngram:
        from specmoe.engines.llamacpp_ngram import (
            ROUND_LOG_TYPES,
            ngram_flags,
            run_ngram,
            timed_rounds,
        )

        for k in ks:  # the flags' checks (k against ngram-cache's 8, size-n against k) first
            if k > 0:
                ngram_flags(spec_type, k=k, size_n=size_n)
    out = check_out_dir(args.out) if args.out else None
    model_dir = resolve_model_dir(args.model)
    draft_dir = None
    if not ngram:
        from specmoe.data import corpus

        draft_dir = resolve_model_dir(args.draft_model or corpus.bundled_draft_dir())
    if out is not None and holds_work(out) and not args.overwrite:
        raise InputError(f"--out {out}: holds a run's work; --overwrite starts the folder anew")
    llamacpp.require_built()
    threads = args.threads or 1
    with out_lock(out) if out is not None else _null(), tempfile.TemporaryDirectory() as tmp:
        if out is not None and args.overwrite:
            clear_run(out)
        tokenizer = load_tokenizer(model_dir)
        prompts = _prompt_texts(args, tokenizer)
        model = load_model(model_dir)
        what = "the target" if ngram else "the target and the draft"
        print(f"run: exporting {what} to GGUF (bf16)", file=sys.stderr)
        target = llamacpp.export_gguf(model_dir, Path(tmp) / "target.gguf", outtype="bf16")
        draft = None
        if not ngram:
            draft = llamacpp.export_gguf(draft_dir, Path(tmp) / "draft.gguf", outtype="bf16")
        # round logs where llama.cpp's log names the drafts (n-gram: ngram-simple only)
        log_rounds = out is not None and (not ngram or spec_type in ROUND_LOG_TYPES)
        if out is not None and not log_rounds:
            print(
                f"run: no round logs for {spec_type}: llama.cpp's debug log does not name its "
                "drafted tokens (summary.json only)",
                file=sys.stderr,
            )
        options = {
            "engine": "llama.cpp",
            "llama_cpp": llamacpp.VERSION,
            "model": str(args.model),
            "draft_model": None if draft_dir is None else str(draft_dir),
            "drafter": args.drafter,
            "spec_type": spec_type,
            **({"ngram_size_n": size_n} if ngram else {}),
            "dtype": "bf16",
            "context": args.context,
            "tokens": args.tokens,
            "threads": threads,
        }
        grid = {"k": ks, "repeats": args.repeats, "prompts": [p for p, _ in prompts]}
        if out is not None:
            write_manifest(out, options=options, grid=grid)
        rows = []
        plain = None
        for k in ks:
            for name, text in prompts:
                for rep in range(args.repeats):
                    if k == 0:
                        if plain is None:
                            plain = llamacpp.bench_decode(
                                target, tokens=args.tokens, depth=args.context, threads=threads
                            )
                        continue
                    rid = run_id(
                        engine="llama.cpp", model=args.model, drafter=args.drafter, k=k, rep=rep
                    )
                    if ngram:
                        fast = run_ngram(
                            target, text, k=k, n_predict=args.tokens, spec_type=spec_type,
                            size_n=size_n, threads=threads,
                        )  # fmt: skip
                    else:
                        fast = llamacpp.run_speculative(
                            target,
                            draft,
                            text,
                            k=k,
                            n_predict=args.tokens,
                            threads=threads,
                            rounds=False,
                        )
                    row = {
                        "run_id": rid,
                        "prompt": name,
                        "k": k,
                        "rep": rep,
                        "tokens_per_s": fast.tokens_per_s,
                        "n_predict": fast.n_predict,
                        "n_accept": fast.n_accept,
                        "n_drafted": fast.n_drafted,
                        **({"text": fast.text} if ngram else {}),
                    }
                    if log_rounds:
                        prompt_ids = llamacpp.tokenize(target, text)
                        if ngram:
                            logged = run_ngram(
                                target, text, k=k, n_predict=args.tokens, spec_type=spec_type,
                                size_n=size_n, threads=threads, prompt_ids=prompt_ids,
                            )  # fmt: skip
                            logged, prompt_ids = timed_rounds(logged, prompt_ids)
                        else:
                            logged = llamacpp.run_speculative(
                                target, draft, text, k=k, n_predict=args.tokens, threads=threads
                            )
                        llamacpp.write_round_log(
                            logged,
                            out / "rounds" / rid.replace("/", "_"),
                            model=model,
                            prompt_ids=prompt_ids,
                            run_id=rid,
                            prompt_id=name,
                            budget=k,
                            drafter=spec_type,
                        )
                        row["logged_rounds"] = len(logged.rounds)
                        row["logged_tokens"] = logged.n_predict
                    rows.append(row)
                    print(
                        f"run: k={k} {name} rep {rep}: {fast.tokens_per_s:.0f} tok/s, "
                        f"{fast.n_accept}/{fast.n_drafted} drafts accepted",
                        file=sys.stderr,
                    )
        by_k = {}
        for k in sorted({r["k"] for r in rows}):
            sel = [r for r in rows if r["k"] == k]
            by_k[str(k)] = {
                "median_tokens_per_s": float(np.median([r["tokens_per_s"] for r in sel])),
                "acceptance": sum(r["n_accept"] for r in sel)
                / max(1, sum(r["n_drafted"] for r in sel)),
            }
        summary = {
            **options,
            "plain_tokens_per_s": plain.tokens_per_s if plain is not None else None,
            "by_k": by_k,
            "runs": rows,
        }
        if out is not None:
            atomic_write_json(out / "summary.json", summary)
    if args.json:
        print(dumps_json(summary))
    else:
        if plain is not None:
            print(f"plain decoding: {plain.tokens_per_s:.0f} tok/s (llama-bench)")
        for k, v in by_k.items():
            print(f"k={k}: {v['median_tokens_per_s']:.0f} tok/s, acceptance {v['acceptance']:.3f}")
    return 0


def _null():
    import contextlib

    return contextlib.nullcontext()
