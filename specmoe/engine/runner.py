"""The speculative-run harness behind ``specmoe run`` and the runs campaign: load a target,
build prompts, force routing from a trace, run a grid of (prompt, k, acceptance) generations
into a round log.
"""

from __future__ import annotations

import re
import sys
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
) -> list[dict[str, Any]]:
    """Run every (k, a, repetition) on every prompt; one summary dict per generation.

    With ``out``, each run's rounds go to ``out/rounds/<run id>/`` (a part file per prompt).
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
    try:
        for rep in range(rep_offset, rep_offset + repeats):
            for k, a in combos:
                if drafter == "oracle":
                    d = OracleDrafter(
                        engine.greedy,
                        acceptance=a,
                        vocab_size=engine.vocab_size,
                        seed=seed + 7919 * rep,
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
                    a="none" if a is None else f"{a:.3f}",
                    kernel=kernel,
                    depth=depth or len(prompts[0][1]),
                    clock=engine.clock,
                    rep=rep,
                    **(extra or {}),
                )
                writer = (
                    RoundLogWriter(
                        out / "rounds" / _safe(rid), flush_every=64, defaults={"run_id": rid}
                    )
                    if out is not None
                    else None
                )
                try:
                    for pid, ids in prompts:
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
                        if writer is not None:
                            writer.flush()
                        results.append(
                            generation_summary(gen, rid, pid, k, a, drafter, kernel, rep, len(ids))
                        )
                        if progress:
                            bar.set_postfix_str(f"k={k} a={a}")
                finally:
                    if writer is not None:
                        writer.flush()
    finally:
        bar.close()
    return results


K_MAX = 15  # the switch covers passes up to 16 tokens


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
