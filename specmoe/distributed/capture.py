"""Teacher-forced capture on Ray: documents split over workers, one model replica each.

:func:`capture_on_ray` splits the documents not yet captured into ``workers`` contiguous parts
of about equal text, and runs one Ray task per part (``num_cpus`` and ``num_gpus`` each: with
a GPU per worker, Ray's ``CUDA_VISIBLE_DEVICES`` gives each replica its own). A task loads its
replica with ``load()`` and runs :func:`specmoe.engine.capture.capture_documents` into its own
staging folder ``out/.ray-parts/worker-NNN/``, whose shards are written atomically as they fill
(the same :class:`~specmoe.formats.shards.ShardWriter` as a capture in one process, with the
whole capture's header, so a staged shard is a shard of the whole).

When every task has finished, the staged shards are moved (an atomic rename each) into ``out``
as ``shard-NNNNN.npz`` after those already there, and one ``manifest.json`` is written for all
of them. A worker killed mid-capture keeps its finished shards: Ray retries its task
(``max_retries``), which skips the documents its staging folder holds; a rerun of a failed or
interrupted capture skips every document in ``out`` or in any staging folder. Nothing finished
is computed twice. The result: the shard directory a capture in one process writes, with the
same documents; each document's routing is that of the same model on the same tokens (equal
ids where the replicas compute as the single process does).

Greedy generation (:func:`generate_on_ray`) splits the prompts the same way: each task runs
:func:`specmoe.engine.capture.capture_generation` one prompt at a time (batch 1, as the single
process does, so each prompt's tokens and routing are the same) and writes each prompt's trace
atomically into the staging folder ``OUT.ray-parts/`` beside the output file, next to a
``run.json`` naming the prompts' digest and the settings. A retried task (a killed worker) or a
rerun skips every prompt already there; when all are there, they are joined in prompt order
into the one ``.npz`` a single process writes, and the staging folder is removed.

The driver never loads the model: ``load`` (a picklable callable returning ``(model,
tokenizer, label)``) runs on the workers.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specmoe.errors import InputError
from specmoe.formats.shards import MANIFEST, OPTIONS, SAME, ShardWriter, shard_header

__all__ = [
    "STAGING",
    "capture_on_ray",
    "capture_part",
    "generate_on_ray",
    "generate_part",
    "join_generations",
    "split_documents",
]

STAGING = ".ray-parts"


def split_documents(
    documents: Sequence[tuple[str, str]], parts: int
) -> list[list[tuple[str, str]]]:
    """At most ``parts`` contiguous, non-empty runs of ``documents`` of about equal text."""
    docs = list(documents)
    if not docs:
        return []
    parts = max(1, min(int(parts), len(docs)))
    sizes = [max(len(t), 1) for _, t in docs]
    total, out, cur, acc = sum(sizes), [], [], 0
    for i, (doc, size) in enumerate(zip(docs, sizes)):
        cur.append(doc)
        acc += size
        left_docs, left_parts = len(docs) - i - 1, parts - len(out) - 1
        if left_parts and (acc >= total * (len(out) + 1) / parts or left_docs == left_parts):
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def capture_part(
    load: Callable[[], tuple[Any, Any, str]],
    documents: Sequence[tuple[str, str]],
    stage: str,
    options: dict[str, Any],
) -> dict[str, Any]:
    """One worker's task: load a replica and capture ``documents`` into ``stage`` (resumable)."""
    from specmoe.engine.capture import capture_documents

    model, tokenizer, label = load()
    capture_documents(
        model,
        tokenizer,
        documents,
        stage,
        progress=False,
        model_name=label,
        **options,
    )
    return {"node": socket.gethostname(), "pid": os.getpid(), "documents": len(documents)}


def _shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("shard-*.npz")) if folder.is_dir() else []


def _stages(out: Path) -> list[Path]:
    root = out / STAGING
    return sorted(p for p in root.glob("worker-*") if p.is_dir()) if root.is_dir() else []


def _done(out: Path, digest: str, source: str) -> tuple[set[str], dict[str, Any] | None]:
    """Documents held by the shards in ``out`` and its staging folders; the header of one."""
    done: set[str] = set()
    header = None
    for path in [*_shards(out), *(p for s in _stages(out) for p in _shards(s))]:
        meta, _ = shard_header(path)
        for key, want in (("documents_sha256", digest), ("source", source)):
            if meta.get(key) != want:
                raise InputError(
                    f"{path}: holds a capture with {key}={meta.get(key)!r}, not {want!r}; "
                    "write to another directory, or overwrite this one",
                    argument="out",
                )
        done.update(meta.get("documents", []))
        if header is None:  # the whole capture's header: a shard's meta less its documents
            header = {k: v for k, v in meta.items() if k not in ("documents", "truncated")}
            missing = [k for k in (*SAME, *OPTIONS) if k not in header]
            if missing:
                raise InputError(f"{path}: not a capture shard (no {missing[0]!r})", argument="out")
    return done, header


def _merge(out: Path, header: dict[str, Any], shard_tokens: int) -> ShardWriter:
    """Move every staged shard into ``out`` after the shards there; write one manifest."""
    taken = [int(p.name[6:11]) for p in _shards(out) if p.name[6:11].isdigit()]
    nxt = 1 + max(taken, default=-1)
    for stage in _stages(out):
        for path in _shards(stage):
            os.replace(path, out / f"shard-{nxt:05d}.npz")
            nxt += 1
        shutil.rmtree(stage, ignore_errors=True)
    shutil.rmtree(out / STAGING, ignore_errors=True)
    writer = ShardWriter(out, header, shard_tokens=shard_tokens)  # checks every shard's header
    writer.flush()
    return writer


def capture_on_ray(
    load: Callable[[], tuple[Any, Any, str]],
    documents: Sequence[tuple[str, str]],
    out_dir: str | os.PathLike,
    *,
    workers: int,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    max_context: int | None = None,
    overlap: int | None = None,
    shard_tokens: int = 1 << 16,
    source: str = "",
    overwrite: bool = False,
    max_retries: int = 3,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Capture ``documents`` ``[(name, text)]`` into the shard directory ``out_dir`` with
    ``workers`` Ray tasks (see the module docstring); returns the manifest. Needs a Ray
    runtime (:func:`~specmoe.distributed.ray_runtime.ray_session`). ``progress(info)`` as
    each part finishes."""
    from specmoe.distributed.ray_runtime import import_ray
    from specmoe.engine.capture import documents_digest

    ray = import_ray("ray")
    names = [str(n) for n, _ in documents]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InputError(f"names must be unique (repeated {dup!r})", argument="documents")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InputError(f"must be an integer >= 1, got {workers!r}", argument="workers")
    if shard_tokens < 1:
        raise InputError(f"must be a positive integer, got {shard_tokens}", argument="shard_tokens")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory", argument="out")
    out.mkdir(parents=True, exist_ok=True)
    if overwrite:  # only what a capture writes; anything else in ``out`` stays
        for path in [*_shards(out), out / MANIFEST]:
            path.unlink(missing_ok=True)
        shutil.rmtree(out / STAGING, ignore_errors=True)
    digest = documents_digest(documents)
    done, _ = _done(out, digest, source)
    todo = [(str(n), t) for n, t in documents if str(n) not in done]
    options = {
        "max_context": max_context,
        "overlap": overlap,
        "shard_tokens": shard_tokens,
        "source": source,
        "documents_sha256": digest,
    }
    parts = split_documents(todo, workers)
    busy = {p.name for p in _stages(out)}
    stages, k = [], 0
    for _ in parts:  # a fresh staging folder per part: a part never meets another's shards
        while f"worker-{k:03d}" in busy:
            k += 1
        stages.append(out / STAGING / f"worker-{k:03d}")
        k += 1
    task = ray.remote(capture_part).options(
        num_cpus=num_cpus, num_gpus=num_gpus, max_retries=max_retries
    )
    refs = {
        task.remote(load, part, str(stage), options): i
        for i, (part, stage) in enumerate(zip(parts, stages))
    }
    errors = [f"part {i}: {type(e).__name__}: {e}" for i, e in _run_parts(ray, refs, progress)]
    _, header = _done(out, digest, source)
    if header is None:
        raise InputError("nothing to capture (every document is empty)", argument="documents")
    writer = _merge(out, header, shard_tokens)
    if errors:
        raise RuntimeError(
            f"{len(errors)} of {len(parts)} capture parts failed ({errors[0]}); "
            "their finished documents are kept: rerun to capture the rest"
        )
    return {
        **header,
        "shards": writer.shards,
        "tokens": writer.tokens,
        "documents": sum(s["documents"] for s in writer.shards),
        "parts": len(parts),
    }


def _run_parts(ray: Any, refs: dict[Any, int], progress: Any) -> list[tuple[int, Exception]]:
    """Wait for every part's task (``refs``: task -> part index) to end, a failure never stopping
    the others (so their finished work is kept); ``progress({"part": i, **info})`` as each one
    ends well. Returns (part index, cause) of each failed part, in the order they ended."""
    errors: list[tuple[int, Exception]] = []
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            try:
                info = ray.get(ref)
            except Exception as exc:
                errors.append((refs[ref], getattr(exc, "cause", None) or exc))
                continue
            if progress is not None:
                progress({"part": refs[ref], **info})
    return errors


# ------------------------------------------------------------------------------------------
# greedy generation


def _prompt_file(stage: Path, index: int) -> Path:
    return stage / f"prompt-{index:06d}.npz"


def generate_part(
    load: Callable[[], tuple[Any, Any, str]],
    prompts: Sequence[tuple[int, str]],
    stage: str,
    options: dict[str, Any],
) -> dict[str, Any]:
    """One worker's task: load a replica and generate from each ``(index, prompt)`` whose trace
    is not yet in ``stage``, writing ``prompt-INDEX.npz`` atomically after each."""
    from specmoe.engine.capture import capture_generation
    from specmoe.formats.trace import save_trace

    model, tokenizer, label = load()
    made = 0
    for index, prompt in prompts:
        path = _prompt_file(Path(stage), index)
        if path.exists():
            continue
        try:
            trace = capture_generation(
                model, tokenizer, [prompt], progress=False, model_name=label, **options
            )
        except InputError as exc:  # the error names the prompt by its place in the whole list
            msg = exc.message
            if msg.startswith("prompt 0 "):
                msg = f"prompt {index} " + msg.removeprefix("prompt 0 ")
            raise InputError(msg, argument=exc.argument) from None
        save_trace(trace, path)
        made += 1
    return {"node": socket.gethostname(), "pid": os.getpid(), "documents": len(prompts)}


def join_generations(traces: Sequence[Any]):
    """One trace of the one-prompt generation traces ``traces``, in order: the trace
    :func:`~specmoe.engine.capture.capture_generation` gives for all the prompts at once."""
    import numpy as np

    from specmoe.formats.trace import RoutingTrace

    first = traces[0]
    meta = {k: v for k, v in first.meta.items() if k not in ("num_experts", "documents")}
    meta["documents"] = [f"prompt-{i:04d}" for i in range(len(traces))]
    meta["prompt_tokens"] = [n for t in traces for n in t.meta["prompt_tokens"]]
    meta["token_ids"] = [ids for t in traces for ids in t.meta["token_ids"]]
    lengths = [t.num_tokens for t in traces]
    weights = [t.weights for t in traces]
    return RoutingTrace(
        experts=np.concatenate([t.experts for t in traces]),
        doc_offsets=np.concatenate([[0], np.cumsum(lengths)]),
        num_experts=first.num_experts,
        weights=None if any(w is None for w in weights) else np.concatenate(weights),
        meta=meta,
        name=f"generation of {meta.get('model')}",
    )


def _generation_run(prompts: Sequence[str], options: dict[str, Any], label: str) -> dict:
    h = hashlib.sha256()
    for p in prompts:
        b = p.encode("utf-8")
        h.update(len(b).to_bytes(8, "little") + b)
    return {"prompts_sha256": h.hexdigest(), "prompts": len(prompts), "model": label, **options}


def generate_on_ray(
    load: Callable[[], tuple[Any, Any, str]],
    prompts: Sequence[str],
    out: str | os.PathLike,
    *,
    max_new_tokens: int,
    workers: int,
    include_prompt: bool = False,
    label: str = "",
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    overwrite: bool = False,
    max_retries: int = 3,
    progress: Callable[[dict[str, Any]], None] | None = None,
):
    """Greedy generation from ``prompts`` with ``workers`` Ray tasks, written to the ``.npz``
    file ``out`` (see the module docstring); returns the trace. ``label`` names the model in
    ``run.json`` (a staging folder of another model or settings is refused). Needs a Ray
    runtime."""
    from specmoe.distributed.ray_runtime import import_ray
    from specmoe.formats.trace import load_trace, save_trace

    ray = import_ray("ray")
    if not prompts:
        raise InputError("no prompts given", argument="prompts")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InputError(f"must be an integer >= 1, got {workers!r}", argument="workers")
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or max_new_tokens < 1
    ):
        raise InputError(
            f"must be a positive integer, got {max_new_tokens!r}", argument="max_new_tokens"
        )
    out = Path(out)
    stage = out.with_name(out.name + STAGING)
    options = {"max_new_tokens": int(max_new_tokens), "include_prompt": bool(include_prompt)}
    run = _generation_run(prompts, options, label)
    if overwrite:
        shutil.rmtree(stage, ignore_errors=True)
    run_file = stage / "run.json"
    if run_file.exists():
        try:
            held = json.loads(run_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            held = None
        if held != run:
            diff = next((k for k in run if not isinstance(held, dict) or held.get(k) != run[k]), "")
            raise InputError(
                f"{stage}: holds a generation with other {diff or 'settings'}; "
                "write to another file, or overwrite this one",
                argument="out",
            )
    else:
        from specmoe._io import atomic_write_json

        stage.mkdir(parents=True, exist_ok=True)
        atomic_write_json(run_file, run)
    todo = [(i, p) for i, p in enumerate(prompts) if not _prompt_file(stage, i).exists()]
    parts = split_documents(todo, workers)
    task = ray.remote(generate_part).options(
        num_cpus=num_cpus, num_gpus=num_gpus, max_retries=max_retries
    )
    refs = {task.remote(load, part, str(stage), options): i for i, part in enumerate(parts)}
    errors = [e for _, e in _run_parts(ray, refs, progress)]
    bad = next((e for e in errors if isinstance(e, InputError)), None)
    if bad is not None:
        raise InputError(bad.message, argument=bad.argument)
    if errors:
        raise RuntimeError(
            f"{len(errors)} of {len(parts)} generation parts failed "
            f"({type(errors[0]).__name__}: {errors[0]}); their finished prompts are kept in "
            f"{stage}: rerun to generate the rest"
        )
    trace = join_generations([load_trace(_prompt_file(stage, i)) for i in range(len(prompts))])
    save_trace(trace, out)
    shutil.rmtree(stage, ignore_errors=True)
    return trace
