"""``specmoe capture``: record the experts a model routes each token to.

Three sources of tokens: the bundled corpus (``--corpus stdlib --split fit``, the default), text
files (``--text FILE...``, one document each) or greedy generation (``--generate N --prompts
FILE``, one prompt per line or a JSON list of strings). Teacher-forced captures go to a shard
directory (resumable: rerun the same command after an interruption); an ``--out`` ending in
``.npz`` is written as one file instead. ``--model random:TYPE`` captures a tiny randomly
initialised model of a supported family (seeded by ``--seed``), for demos. ``--ray
[ADDRESS]`` splits the documents over Ray workers, one model replica each (a GPU each with
``--device cuda``), each writing its own shards; one manifest at the end, resumable in the same
way (:mod:`specmoe.distributed.capture`); with ``--generate`` it splits the prompts, each
prompt's trace kept as it finishes, joined into the one ``.npz`` at the end. ``--engine
llama.cpp --gguf FILE`` records the routing inside llama.cpp instead (its eval callback,
:mod:`specmoe.engines.llamacpp_routing`), teacher-forced on the same tokens (``--model``'s
tokenizer) into the same shard format.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from specmoe.commands._common import (
    check_at_most,
    check_out_dir,
    check_out_file,
    check_seed,
    out_folder,
)
from specmoe.commands._ray import add_ray_arguments, ray_runtime
from specmoe.errors import InputError

_SPLITS = ("train", "fit", "validation")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="bundled",
        help="HF model directory, 'bundled' (default) or 'random:MODEL_TYPE'",
    )
    src = parser.add_argument_group("tokens to capture (default: --corpus stdlib --split fit)")
    src.add_argument("--corpus", default=None, help="bundled corpus name (only 'stdlib')")
    src.add_argument("--split", default="fit", help="corpus split: train, fit or validation")
    src.add_argument("--text", nargs="+", metavar="FILE", help="text files, one document each")
    src.add_argument(
        "--generate", type=int, metavar="N", help="greedy-generate N tokens per prompt"
    )
    src.add_argument(
        "--prompts",
        metavar="FILE",
        help="prompts for --generate: one per line, or a JSON list of strings",
    )
    src.add_argument(
        "--include-prompt",
        action="store_true",
        help="with --generate, record the prompt's routing too",
    )
    parser.add_argument("--tokens", type=int, metavar="N", help="capture at most N tokens")
    parser.add_argument(
        "--out",
        help="shard directory, or a .npz file (default: "
        "capture-MODEL/ or capture-MODEL-generation.npz)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="discard the shards already in --out (a capture with other options) and start again",
    )
    parser.add_argument("--max-context", type=int, help="longest window per forward pass")
    parser.add_argument("--overlap", type=int, help="context tokens re-fed between windows")
    parser.add_argument(
        "--shard-tokens", type=int, default=1 << 16, help="tokens per shard (default 65536)"
    )
    parser.add_argument(
        "--engine",
        choices=("transformers", "llama.cpp"),
        default="transformers",
        help="where routing is recorded: transformers (default) or llama.cpp (needs --gguf)",
    )
    parser.add_argument(
        "--gguf", metavar="FILE", help="with --engine llama.cpp: the GGUF export of --model"
    )
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--dtype", default=None, help="torch dtype (default float32 on cpu)")
    parser.add_argument("--seed", type=int, default=0, help="seed (random models)")
    add_ray_arguments(parser, "capture the documents")
    parser.add_argument(
        "--ray-workers",
        type=int,
        default=None,
        metavar="K",
        help="with --ray: model replicas, one document share each (default: one per CPU, or "
        "per GPU with --device cuda, of the Ray runtime)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _load(args: argparse.Namespace) -> tuple[Any, Any, str]:
    from specmoe.engine import models

    spec = str(args.model)
    if spec.startswith("random:"):
        model_type = spec.split(":", 1)[1]
        try:
            net = models.tiny_random_model(model_type, seed=args.seed)
        except InputError as exc:
            raise exc.as_flag(f"--model {spec}") from None
        net.to(models.check_device(args.device))
        return net, models.byte_tokenizer(), f"random-{model_type}"
    path = models.resolve_model_dir(spec)
    net = models.load_model(path, dtype=args.dtype, device=args.device)
    return net, models.load_tokenizer(path), path.name


def _label(args: argparse.Namespace) -> str:
    """The model's label (as :func:`_load` gives it) without loading the model."""
    from specmoe.engine import models

    spec = str(args.model)
    if spec.startswith("random:"):
        return f"random-{spec.split(':', 1)[1]}"
    return models.resolve_model_dir(spec).name


def load_replica(*, model: str, device: str, dtype: str | None, seed: int) -> tuple:
    """``(model, tokenizer, label)`` on a Ray worker, as :func:`_load` gives them here."""
    import torch

    torch.manual_seed(seed)
    return _load(argparse.Namespace(model=model, device=device, dtype=dtype, seed=seed))


def _read_text(path: str, arg: str) -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{arg} {p}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{arg} {p}: is a directory, not a text file") from None
    except UnicodeDecodeError:
        raise InputError(f"{arg} {p}: not UTF-8 text") from None
    except OSError as exc:
        raise InputError(f"{arg} {p}: unreadable ({exc.strerror})") from None


def read_prompts(path: str) -> list[str]:
    """Prompts from ``--prompts FILE``: one per non-empty line, or a JSON list of strings."""
    text = _read_text(path, "--prompts")
    if path.endswith(".json"):
        try:
            prompts = json.loads(text)
        except ValueError as exc:
            raise InputError(f"--prompts {path}: not valid JSON ({exc})") from None
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise InputError(f"--prompts {path}: must be a JSON list of strings")
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise InputError(f"--prompts {path}: holds no prompts")
    return prompts


def _corpus_documents(args: argparse.Namespace, tokenizer: Any) -> list[tuple[str, str]]:
    name = args.corpus or "stdlib"
    if name != "stdlib":
        raise InputError(f"--corpus {name!r}: unknown corpus (choose from stdlib)")
    if args.split not in _SPLITS:
        raise InputError(
            f"--split {args.split!r}: unknown split (choose from {', '.join(_SPLITS)})"
        )
    try:
        corpus = importlib.import_module("specmoe.data.corpus")
    except ImportError:
        raise InputError(
            "--corpus stdlib: the bundled corpus module specmoe.data.corpus is "
            "not installed; pass --text FILE instead"
        ) from None
    # Whole documents: the capture itself stops at --tokens and records the document it cut.
    return corpus.documents(args.split)


MAX_TOKENS = 10**9  # --tokens, --shard-tokens: a billion routed tokens is far past any capture
MAX_GENERATE = 1 << 20  # --generate, --max-context: longer than any model's positions


def _check(args: argparse.Namespace) -> None:
    for flag in ("tokens", "generate", "max_context", "shard_tokens"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise InputError(f"--{flag.replace('_', '-')} must be a positive integer, got {v}")
    check_at_most(args.tokens, "--tokens", MAX_TOKENS)
    check_at_most(args.shard_tokens, "--shard-tokens", MAX_TOKENS)
    check_at_most(args.generate, "--generate", MAX_GENERATE)
    check_at_most(args.max_context, "--max-context", MAX_GENERATE)
    if args.overlap is not None and args.overlap < 0:
        raise InputError(f"--overlap must be a non-negative integer, got {args.overlap}")
    check_seed(args.seed)
    if args.out is not None:  # a .npz file, or a folder (a generation goes to DIR/generation.npz)
        out = Path(args.out)
        if out.suffix == ".npz":
            check_out_file(out)
            check_out_dir(out.with_name(out.name + ".parts"))  # the shards, merged at the end
        else:
            check_out_dir(out)
    if args.ray is not None and args.tokens is not None:
        raise InputError("--ray: captures whole documents; --tokens needs one process")
    if args.ray_workers is not None and (args.ray is None or args.ray_workers < 1):
        raise InputError("--ray-workers: needs --ray and must be >= 1")
    if args.engine == "llama.cpp":
        if not args.gguf:
            raise InputError("--engine llama.cpp needs --gguf FILE (specmoe export --format gguf)")
        if not Path(args.gguf).is_file():
            raise InputError(f"--gguf {args.gguf}: no such GGUF file")
        if args.generate is not None or args.ray is not None:
            flag = "--generate" if args.generate is not None else "--ray"
            raise InputError(f"--engine llama.cpp: teacher-forced in one process only, not {flag}")
    elif args.gguf:
        raise InputError("--gguf is only used with --engine llama.cpp")
    if args.generate is not None and not args.prompts:
        raise InputError("--generate needs --prompts FILE")
    if args.prompts and args.generate is None:
        raise InputError("--prompts is only used with --generate N")
    chosen = [
        f
        for f, on in (
            ("--corpus", args.corpus),
            ("--text", args.text),
            ("--generate", args.generate is not None),
        )
        if on
    ]
    if len(chosen) > 1:
        raise InputError(f"{chosen[0]} and {chosen[1]} exclude each other: choose one source")


def run(args: argparse.Namespace) -> int:
    import torch

    _check(args)
    texts = [(p, _read_text(p, "--text")) for p in args.text] if args.text else None
    prompts = read_prompts(args.prompts) if args.generate is not None else None
    torch.manual_seed(args.seed)
    if args.engine == "llama.cpp":  # the model's tokenizer only: llama.cpp holds the weights
        from specmoe.engine import models

        model, label = None, _label(args)
        tokenizer = models.load_tokenizer(models.resolve_model_dir(str(args.model)))
    elif args.ray is None:
        model, tokenizer, label = _load(args)
    else:  # the replicas load on the Ray workers
        model = tokenizer = None
        label = _label(args)
    progress = not args.quiet
    if prompts is not None:
        summary = _generate(args, model, tokenizer, label, prompts, progress=progress)
    else:
        docs = texts if texts is not None else _corpus_documents(args, tokenizer)
        source = "text files" if texts is not None else f"stdlib:{args.split}"
        summary = _documents(args, model, tokenizer, label, docs, source=source, progress=progress)
    if args.json:
        from specmoe._io import dumps_json

        print(dumps_json(summary))
    else:
        print(
            f"captured {summary['tokens']} tokens in {summary['documents']} documents, "
            f"{summary['num_layers']} MoE layers, N={summary['num_experts']}, "
            f"m={summary['top_k']} -> {summary['out']}"
        )
    return 0


def _summary(
    trace_meta: dict[str, Any], *, out: Path, tokens: int, documents: int, mode: str
) -> dict[str, Any]:
    layers = list(trace_meta["layers"])
    return {
        "out": str(out),
        "mode": mode,
        "model": trace_meta.get("model"),
        "model_type": trace_meta.get("model_type"),
        "tokens": tokens,
        "documents": documents,
        "layers": layers,
        "num_layers": len(layers),
        "num_experts": trace_meta["num_experts"],
        "top_k": trace_meta["top_k"],
    }


def _generate(
    args: argparse.Namespace,
    model: Any,
    tokenizer: Any,
    label: str,
    prompts: list[str],
    *,
    progress: bool,
) -> dict[str, Any]:
    from specmoe.engine.capture import capture_generation
    from specmoe.formats.trace import save_trace

    out = Path(args.out or f"capture-{label}-generation.npz")
    if out.suffix != ".npz":
        out = out / "generation.npz"
    if args.ray is not None:  # writes ``out`` itself
        trace = _generate_on_ray(args, label, prompts, out)
    else:
        trace = capture_generation(
            model,
            tokenizer,
            prompts,
            max_new_tokens=args.generate,
            include_prompt=args.include_prompt,
            progress=progress,
            model_name=label,
        )
        save_trace(trace, out)
    return _summary(
        trace.meta,
        out=out,
        tokens=trace.num_tokens,
        documents=trace.num_documents,
        mode="generation",
    )


def _documents(
    args: argparse.Namespace,
    model: Any,
    tokenizer: Any,
    label: str,
    docs: list[tuple[str, str]],
    *,
    source: str,
    progress: bool,
) -> dict[str, Any]:

    if not docs:
        raise InputError(f"{source}: no documents to capture")
    out = Path(args.out or f"capture-{label}")
    single = out.suffix == ".npz"
    shard_dir = out.with_name(out.name + ".parts") if single else out
    with out_folder(shard_dir):
        return _capture(args, model, tokenizer, label, docs, out, shard_dir, source, progress)


def _capture(
    args: argparse.Namespace,
    model: Any,
    tokenizer: Any,
    label: str,
    docs: list[tuple[str, str]],
    out: Path,
    shard_dir: Path,
    source: str,
    progress: bool,
) -> dict[str, Any]:
    from specmoe.engine.capture import capture_documents
    from specmoe.formats.trace import RoutingTrace, open_trace, save_trace

    single = out.suffix == ".npz"
    try:
        if args.ray is not None:
            _capture_on_ray(args, docs, shard_dir, source)
        else:
            kw = dict(
                max_tokens=args.tokens,
                max_context=args.max_context,
                overlap=args.overlap,
                shard_tokens=args.shard_tokens,
                progress=progress,
                source=source,
                model_name=label,
                overwrite=args.overwrite,
            )
            if args.engine == "llama.cpp":
                from specmoe.engines.llamacpp_routing import capture_documents_gguf

                capture_documents_gguf(args.gguf, tokenizer, docs, shard_dir, **kw)
            else:
                capture_documents(model, tokenizer, docs, shard_dir, **kw)
    except InputError as exc:
        if exc.argument == "out" and "overwrite" in exc.message:
            raise InputError(f"{exc.message} (--overwrite)", argument="out") from None
        raise
    manifest = json.loads((shard_dir / "manifest.json").read_text(encoding="utf-8"))
    if single:
        shards = list(open_trace(shard_dir).iter_shards())
        trace = RoutingTrace.concatenate(shards, name=str(out))
        trace.meta["truncated"] = [n for s in shards for n in s.meta.get("truncated", [])]
        save_trace(trace, out)
        shutil.rmtree(shard_dir)
    return _summary(
        manifest,
        out=out,
        tokens=manifest["tokens"],
        documents=manifest["documents"],
        mode="teacher_forced",
    )


def _replicas(args: argparse.Namespace, info: dict) -> tuple[int, Any]:
    """(workers, load): one replica per CPU or GPU of the runtime unless ``--ray-workers``."""
    import functools

    cuda = str(args.device).startswith("cuda")
    have = info["gpus"] if cuda else info["cpus"]
    if have < 1:
        raise InputError(f"--device {args.device}: the Ray runtime has no GPU")
    load = functools.partial(
        load_replica, model=args.model, device=args.device, dtype=args.dtype, seed=args.seed
    )
    return args.ray_workers or max(1, int(have)), load


def _part_done(args: argparse.Namespace, what: str):
    def progress(part: dict[str, Any]) -> None:
        if not args.quiet:
            print(
                f"capture: part {part['part']} ({part['documents']} {what}) done on {part['node']}",
                file=sys.stderr,
                flush=True,
            )

    return progress


def _generate_on_ray(args: argparse.Namespace, label: str, prompts: list[str], out: Path):
    """The prompts over Ray workers, a replica each (:func:`generate_on_ray`)."""
    from specmoe.distributed.capture import generate_on_ray

    with ray_runtime(args, "capture") as info:
        workers, load = _replicas(args, info)
        try:
            return generate_on_ray(
                load,
                prompts,
                out,
                max_new_tokens=args.generate,
                workers=workers,
                include_prompt=args.include_prompt,
                label=label,
                num_cpus=1,
                num_gpus=1 if str(args.device).startswith("cuda") else 0,
                overwrite=args.overwrite,
                progress=_part_done(args, "prompts"),
            )
        except InputError as exc:
            if exc.argument == "out":
                raise InputError(f"{exc.message} (--overwrite)", argument="out") from None
            if exc.argument == "prompts":
                raise InputError(f"--prompts {args.prompts}: {exc.message}") from None
            raise


def _capture_on_ray(
    args: argparse.Namespace, docs: list[tuple[str, str]], shard_dir: Path, source: str
) -> None:
    """The documents over Ray workers, a replica each (:mod:`specmoe.distributed.capture`)."""
    from specmoe.distributed.capture import capture_on_ray

    with ray_runtime(args, "capture") as info:
        workers, load = _replicas(args, info)
        capture_on_ray(
            load,
            docs,
            shard_dir,
            workers=workers,
            num_cpus=1,
            num_gpus=1 if str(args.device).startswith("cuda") else 0,
            max_context=args.max_context,
            overlap=args.overlap,
            shard_tokens=args.shard_tokens,
            source=source,
            overwrite=args.overwrite,
            progress=_part_done(args, "documents"),
        )


if __name__ == "__main__":  # pragma: no cover
    from specmoe.cli import main

    sys.exit(main(["capture", *sys.argv[1:]]))
