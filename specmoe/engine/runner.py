"""The speculative-run harness behind ``specmoe run`` and the runs campaign: load a target,
build prompts, force routing from a trace, run a grid of (prompt, k, acceptance) generations
into a round log, resumably.

A run folder ``out`` holds ``run.json`` (the manifest: every option that changes the result,
and the grid), ``rounds/<run id>/part-*.parquet`` (one part per finished generation, recording
its unit key, tokens, rounds and summary in the part's metadata) and ``summary.json``. A
generation is a unit: its key hashes the manifest's options, k, the acceptance (exactly), the
repetition and the prompt's token ids. :func:`run_grid` skips a generation whose part is there
with the same key, deletes the parts of unfinished ones and runs them again from scratch.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specmoe.errors import InputError


def load_target(
    spec: str, *, device: str = "cpu", layers: int | None = None, seed: int = 0, context: int = 4096
) -> tuple[Any, Any, str, bool]:
    """``(model, tokenizer, label, dummy)`` for a model ``spec``: a local HF directory,
    ``bundled``, ``PRESET-dummy`` or ``random:TYPE``."""
    from specmoe.engine import models
    from specmoe.engine.switch import dummy_model, parse_dummy

    preset = parse_dummy(spec)
    if preset is None and layers is not None:
        raise InputError("applies to PRESET-dummy models only", argument="layers")
    if preset is not None:
        net = dummy_model(preset, layers=layers, seed=seed, context=context)
        net.to(device)
        tok = models.load_tokenizer("bundled")
        n = net.config.num_hidden_layers
        return net, tok, f"{preset}-dummy-{n}L", True
    if spec.startswith("random:"):
        net = models.tiny_random_model(
            spec.split(":", 1)[1], seed=seed, context=max(256, context + 64)
        )
        net.to(device)
        return net, models.byte_tokenizer(), f"random-{spec.split(':', 1)[1]}", False
    path = models.resolve_model_dir(spec)
    net = models.load_model(path, device=device)
    return net, models.load_tokenizer(path), path.name, False


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def validation_prompts(
    tokenizer: Any, *, count: int, context: int, offset: int = 0
) -> list[tuple[str, list[int]]]:
    """The first ``count`` validation documents (after ``offset``) with at least ``context``
    tokens, truncated to ``context`` tokens: ``[(document name, token ids)]``."""
    from specmoe.data import corpus

    out, skipped = [], 0
    for name, text in corpus.documents("validation"):
        ids = encode(tokenizer, text)
        if len(ids) < context:
            continue
        if skipped < offset:
            skipped += 1
            continue
        out.append((name, ids[:context]))
        if len(out) == count:
            break
    if len(out) < count:
        raise InputError(
            f"only {len(out)} validation documents have {context} tokens (after skipping "
            f"{offset}), {count} needed",
            argument="context",
        )
    return out


def file_prompts(path: str, tokenizer: Any, *, context: int) -> list[tuple[str, list[int]]]:
    from specmoe.commands.capture import read_prompts

    items = read_prompts(path)
    out = []
    for i, s in enumerate(items):
        ids = encode(tokenizer, s)[-context:]
        if not ids:
            raise InputError(f"{path}: prompt {i + 1} encodes to no tokens", argument="prompts")
        out.append((f"prompt-{i:03d}", ids))
    return out


def forced_from(spec: str | None, model: Any) -> Any:
    """A :class:`ForcedRouting` from a trace ``spec`` (a path, or ``bundled:NAME``; None: no
    forcing)."""
    from specmoe.engine.switch import ForcedRouting
    from specmoe.formats.trace import load_trace

    if spec is None:
        return None
    if spec.startswith("bundled:"):
        from specmoe.data import corpus

        path = corpus.bundled_trace_path(spec.split(":", 1)[1])
    else:
        path = Path(spec)
    if not Path(path).exists():
        raise InputError(f"{spec}: no such trace ({path})", argument="forced_trace")
    return ForcedRouting.from_trace(model, load_trace(path))


def run_id(**fields: Any) -> str:
    return ",".join(f"{k}={v}" for k, v in fields.items())


def acceptance_label(a: float | None) -> str:
    """The acceptance in a run id: ``none``, three decimals where they are exact (``0.800``,
    the ids of every committed run), else the shortest exact repr (``0.8004``)."""
    if a is None:
        return "none"
    short = f"{a:.3f}"
    return short if float(short) == float(a) else repr(float(a))


def prompt_digest(ids: list[int]) -> str:
    """sha256 of a prompt's token ids (int64, little-endian)."""
    import numpy as np

    return hashlib.sha256(np.asarray(ids, dtype="<i8").tobytes()).hexdigest()


def unit_key(**fields: Any) -> str:
    """The key of one generation: a hash of everything that makes its rounds."""
    from specmoe._io import to_jsonable

    text = json.dumps(to_jsonable(fields), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


# ------------------------------------------------------------------------------------------
# the run folder: manifest, what it holds, starting anew

MANIFEST = "run.json"
MANIFEST_FORMAT = "specmoe-run/1"


def read_manifest(out: Path) -> dict[str, Any] | None:
    """The manifest of the run folder ``out`` (None: there is none)."""
    from specmoe._io import read_json

    path = Path(out) / MANIFEST
    if not path.exists():
        return None
    m = read_json(path, "run manifest", argument="out")
    if not isinstance(m, dict) or m.get("format") != MANIFEST_FORMAT:
        raise InputError(f"{path}: not a {MANIFEST_FORMAT} manifest", argument="out")
    if not isinstance(m.get("options"), dict) or not isinstance(m.get("grid"), dict):
        raise InputError(f"{path}: a manifest needs options and grid objects", argument="out")
    return m


def write_manifest(out: Path, *, options: Mapping[str, Any], grid: Mapping[str, Any]) -> Path:
    from specmoe._io import atomic_write_json

    m = {"format": MANIFEST_FORMAT, "options": dict(options), "grid": dict(grid)}
    return atomic_write_json(Path(out) / MANIFEST, m)


def holds_work(out: Path) -> bool:
    """Whether ``out`` holds a run's results (a manifest, summary.json or a round-log part)."""
    out = Path(out)
    if (out / MANIFEST).exists() or (out / "summary.json").exists():
        return True
    rounds = out / "rounds"
    return rounds.is_dir() and any(rounds.rglob("*.parquet"))


def differing(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The keys present in both whose values differ (compared as JSON)."""
    from specmoe._io import to_jsonable

    return [k for k in new if k in old and to_jsonable(old[k]) != to_jsonable(new[k])]


def clear_run(out: Path) -> None:
    """Remove what a run writes in ``out``: ``rounds/``, ``summary.json``, the manifest."""
    out = Path(out)
    if (out / "rounds").exists():
        shutil.rmtree(out / "rounds")
    for name in ("summary.json", MANIFEST):
        (out / name).unlink(missing_ok=True)


def finished_generations(directory: Path) -> dict[str, dict[str, Any]]:
    """The finished generations of one run's round-log folder (id -> what its part records);
    parts holding only unfinished generations, and temporaries of killed writes, are deleted."""
    from specmoe.formats.roundlog import read_parts

    directory = Path(directory)
    if not directory.is_dir():
        return {}
    for tmp in directory.glob(".part-*.tmp"):
        tmp.unlink(missing_ok=True)
    if not any(directory.glob("*.parquet")):
        return {}
    parts = read_parts(directory)
    done: dict[str, dict[str, Any]] = {}
    for p in parts:
        if not p.marked:
            raise InputError(
                f"{p.path}: a round-log part without generation records (an older run's "
                "work); start the folder anew",
                argument="out",
            )
        done.update(p.ended)
    for p in parts:
        if not (set(p.open) | set(p.ended)) & set(done):
            p.path.unlink()
    return done


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", name.replace(",", "__"))


def run_grid(
    engine: Any,
    prompts: list[tuple[str, list[int]]],
    *,
    drafter: str,
    ks: list[int],
    accs: list[float] | None,
    tokens: int,
    label: str,
    out: Path | None,
    seed: int = 0,
    repeats: int = 1,
    rep_offset: int = 0,
    draft_model: Any = None,
    forced: Any = None,
    progress: bool = True,
    extra: dict[str, Any] | None = None,
    depth: int | None = None,
    identity: Mapping[str, Any] | None = None,
    shuffle_seed: int | None = None,
    seed_by_acceptance: bool = False,
) -> list[dict[str, Any]]:
    """Run every (k, a, repetition) on every prompt; one summary dict per generation.

    ``shuffle_seed``: run the (k, a) combinations of each repetition in an order shuffled by a
    generator seeded by (shuffle_seed, repetition), so that no draft length is always timed
    early or late (None: in order). ``seed_by_acceptance``: the oracle's corruption flags are
    drawn from a generator seeded by (seed, repetition, acceptance) and the prompt's tokens
    (docs/runs-protocol-whole-pass.md); otherwise by seed + 7919 * repetition and the prompt's
    tokens, as the earlier runs were.

    With ``out``, each run's rounds go to ``out/rounds/<run id>/`` (a part file per
    generation, written when it finishes). A generation already finished there with the same
    unit key (``identity``: the options that make the run, hashed with k, a, the repetition,
    the tokens, the seed and the prompt's ids) is skipped, its summary read back from its
    part; one finished with another key is an error in ``out``; unfinished ones run again.
    """
    from tqdm.auto import tqdm

    from specmoe.engine.drafters import OracleDrafter, make_drafter
    from specmoe.engine.speculative import speculative_generate
    from specmoe.formats.roundlog import RoundLogWriter

    combos: list[tuple[int, float | None]] = []
    for k in ks:
        if drafter == "oracle" and k > 0:
            combos += [(k, a) for a in (accs or [0.8])]
        else:
            combos.append((k, None))
    total = len(combos) * repeats * len(prompts) * tokens
    bar = tqdm(
        total=total,
        unit="tok",
        desc=f"run {label}",
        file=sys.stderr,
        disable=not progress,
        dynamic_ncols=True,
    )
    refs: dict[tuple[int, ...], list[int]] = {}  # the oracle's greedy continuations, shared
    model_drafter = None
    results = []
    kernel = engine.policy.label
    digests = [prompt_digest(ids) for _, ids in prompts]
    try:
        for rep in range(rep_offset, rep_offset + repeats):
            order = list(combos)
            if shuffle_seed is not None:
                import numpy as np

                np.random.default_rng([int(shuffle_seed), rep]).shuffle(order)
            for k, a in order:
                if drafter == "oracle":
                    d = OracleDrafter(
                        engine.greedy,
                        acceptance=a,
                        vocab_size=engine.vocab_size,
                        seed=_oracle_seed(seed, rep, a)
                        if seed_by_acceptance
                        else seed + 7919 * rep,
                        cache=refs,
                    )
                elif drafter == "draft-model":
                    model_drafter = model_drafter or make_drafter(
                        "draft-model", draft_model=draft_model, vocab_size=engine.vocab_size
                    )
                    d = model_drafter
                else:
                    d = make_drafter(drafter)
                rid = run_id(
                    model=label,
                    drafter=drafter,
                    k=k,
                    a=acceptance_label(a),
                    kernel=kernel,
                    depth=depth or len(prompts[0][1]),
                    clock=engine.clock,
                    rep=rep,
                    **(extra or {}),
                )
                folder = None if out is None else out / "rounds" / _safe(rid)
                done = {} if folder is None else finished_generations(folder)
                writer = None
                for (pid, ids), digest in zip(prompts, digests, strict=True):
                    gid = f"{rid}/{pid}"
                    key = unit_key(
                        options=dict(identity or {}),
                        run_id=rid,
                        acceptance=a,
                        tokens=tokens,
                        seed=seed,
                        prompt=[pid, digest],
                    )
                    if gid in done:
                        if done[gid].get("unit") != key or "summary" not in done[gid]:
                            raise InputError(
                                f"{folder}: generation {gid!r} was made with other options "
                                "or another prompt",
                                argument="out",
                            )
                        results.append(done[gid]["summary"])
                        bar.update(tokens)
                        continue
                    if folder is not None and writer is None:
                        writer = RoundLogWriter(folder, flush_every=None, defaults={"run_id": rid})
                    if forced is not None:
                        forced.use_document(
                            pid if pid in forced.documents else prompts.index((pid, ids))
                        )
                    gen = speculative_generate(
                        engine,
                        ids,
                        d,
                        budget=k,
                        max_new_tokens=tokens,
                        max_k=K_MAX,
                        writer=writer,
                        row={"run_id": rid, "prompt_id": pid},
                        progress=bar,
                    )
                    summary = generation_summary(
                        gen, rid, pid, k, a, drafter, kernel, rep, len(ids)
                    )
                    if writer is not None:  # the part of a finished generation, and only then
                        writer.end_generation(
                            gid,
                            unit=key,
                            tokens=len(gen.tokens),
                            rounds=len(gen.rounds),
                            summary=summary,
                        )
                        writer.flush()
                    results.append(summary)
                    if progress:
                        bar.set_postfix_str(f"k={k} a={a}")
    finally:
        bar.close()
    return results


K_MAX = 15  # the switch covers passes up to 16 tokens


def _oracle_seed(seed: int, rep: int, a: float | None) -> int:
    """One integer from (seed, repetition, acceptance in millionths); the oracle drafter mixes
    in the prompt's tokens itself."""
    import numpy as np

    micro = -1 if a is None else round(float(a) * 1e6)
    return int(np.random.SeedSequence([int(seed), int(rep), micro + 1]).generate_state(1)[0])


def generation_summary(
    gen: Any,
    rid: str,
    pid: str,
    k: int,
    a: float | None,
    drafter: str,
    kernel: str,
    rep: int,
    depth: int,
) -> dict[str, Any]:
    """One generation's record of the runs summary (``summary.json``'s ``generations``)."""
    import numpy as np

    tv = [r.t_verify_ms for r in gen.rounds]
    td = [r.t_draft_ms for r in gen.rounds]
    return {
        "run_id": rid,
        "prompt_id": pid,
        "k": k,
        "acceptance": a,
        "drafter": drafter,
        "kernel": kernel,
        "rep": rep,
        "depth": depth,
        "tokens": len(gen.tokens),
        "rounds": len(gen.rounds),
        "drafted": gen.drafted,
        "accepted": gen.accepted,
        "decode_ms": gen.decode_ms,
        "decode_wall_ms": gen.decode_wall_ms,
        "prefill_ms": gen.prefill_ms,
        "tokens_per_s": gen.tokens_per_s,
        "tokens_per_s_wall": 1e3 * len(gen.tokens) / gen.decode_wall_ms,
        "tokens_per_round": len(gen.tokens) / max(1, len(gen.rounds)),
        "realised_acceptance": gen.realised_acceptance,
        "mismatches": gen.mismatches,
        "sum_t_verify_ms": float(np.sum(tv)),
        "sum_t_draft_ms": float(np.sum(td)),
        "median_t_verify_ms": float(np.median(tv)),
        "median_t_draft_ms": float(np.median(td)),
    }
