"""Routing capture: the m experts (and their router weights) each token selects in each MoE layer.

Legend for shapes: ``T`` tokens, ``L`` MoE layers, ``m`` slots, ``N`` experts, ``n`` tokens of
one forward call, ``C`` the context window of one call.

A trace is the recorded expert sets ``S_{l,t}`` of one token sequence (paper 002, Section 1);
here they are recorded by forward hooks on each MoE layer's router module
(:class:`RouterRecorder`). A router that returns its selected ids is taken at its word; one that
returns only logits ``[n, N]`` goes through its family's own selection rule
(:func:`specmoe.engine.families.route_logits`, each family's rule declared in its file under
:mod:`specmoe.engine.families`; ``RouterRule``, ``rule_for`` and ``route_logits`` are
re-exported here). Slots are stored highest weight first.

Teacher-forced capture (:func:`capture_documents`) runs each document through the model in
windows of at most C tokens. A document longer than C is cut into windows that overlap by
``overlap`` tokens: the overlap tokens are fed again as context and not recorded again, so every
token is recorded exactly once, with at least ``min(t, overlap)`` tokens of context before it
(all of them while ``t < C``). Generation capture (:func:`capture_generation`) decodes greedily
with the KV cache and records each generated token when it is fed back.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.engine.families import RouterRule, parse_router_output, route_logits, rule_for
from specmoe.engine.models import model_label, moe_layers
from specmoe.errors import InputError
from specmoe.formats.shards import ShardWriter
from specmoe.formats.trace import RoutingTrace

__all__ = [
    "RouterRecorder",
    "RouterRule",
    "capture_documents",
    "capture_generation",
    "capture_tokens",
    "documents_digest",
    "route_logits",
    "rule_for",
]


# ------------------------------------------------------------------------------------------
# Hooks


class RouterRecorder:
    """Forward hooks on every MoE router of ``model``; a context manager.

    Each router call appends its ``(ids, weights)`` (kept on the model's device until
    :meth:`pop`). Tokens are in the order the router sees them: batch-major, then position.
    """

    def __init__(self, model: Any):
        self.model = model
        self.routers = moe_layers(model)  # [(layer index, module)]
        self.layers = [i for i, _ in self.routers]
        self.rule = rule_for(model)
        self.num_experts = int(self.routers[0][1].weight.shape[0])
        self._calls: list[list[tuple[Any, Any]]] = [[] for _ in self.routers]
        self._handles: list[Any] = []
        self.enabled = True

    def install(self) -> RouterRecorder:
        if not self._handles:
            for pos, (_, module) in enumerate(self.routers):
                self._handles.append(module.register_forward_hook(self._hook(pos)))
        return self

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> RouterRecorder:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.remove()
        self.clear()

    def _hook(self, pos: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            if self.enabled:
                ids, w = parse_router_output(output, module, self.rule)
                self._calls[pos].append((ids.detach(), None if w is None else w.detach()))

        return hook

    def clear(self) -> None:
        self._calls = [[] for _ in self.routers]

    def pop(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Everything recorded since the last pop: ``experts [n, L, m]``, ``weights [n, L, m]``.

        Slots are sorted by weight, highest first. ``weights`` is None when a router gave none.
        """
        import torch

        calls, self._calls = self._calls, [[] for _ in self.routers]
        counts = {sum(int(i.shape[0]) for i, _ in c) for c in calls}
        if len(counts) != 1 or 0 in counts:
            raise RuntimeError(
                f"router hooks saw unequal or no token counts {sorted(counts)} "
                "over the MoE layers (does a fused MoE kernel bypass a router?)"
            )
        ids = np.stack([torch.cat([i for i, _ in c]).cpu().numpy() for c in calls], axis=1)
        if any(w is None for c in calls for _, w in c):
            return ids.astype(np.int64), None
        w = np.stack([torch.cat([w for _, w in c]).float().cpu().numpy() for c in calls], axis=1)
        order = np.argsort(-w, axis=-1, kind="stable")
        return (
            np.take_along_axis(ids, order, -1).astype(np.int64),
            np.take_along_axis(w, order, -1).astype(np.float32),
        )


# ------------------------------------------------------------------------------------------
# Teacher-forced capture


def _context(model: Any, max_context: int | None) -> int:
    limit = int(getattr(model.config, "max_position_embeddings", 0) or 4096)
    c = min(limit, 4096) if max_context is None else int(max_context)
    if not 2 <= c <= limit:
        raise InputError(
            f"must be in 2..{limit} (the model's context), got {c}", argument="max_context"
        )
    return c


def capture_tokens(
    model: Any,
    token_ids: Sequence[int],
    *,
    max_context: int | None = None,
    overlap: int | None = None,
    recorder: RouterRecorder | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Teacher-forced routing of one token sequence: ``experts [T, L, m]``, ``weights``.

    Windows of at most C = ``max_context`` tokens; consecutive windows overlap by ``overlap``
    tokens (default C // 4), fed as context only (see the module docstring).
    """
    import torch

    c = _context(model, max_context)
    ov = c // 4 if overlap is None else int(overlap)
    if not 0 <= ov < c:
        raise InputError(f"must be in 0..{c - 1} (below max_context), got {ov}", argument="overlap")
    ids = torch.as_tensor(list(token_ids), dtype=torch.long)
    if ids.numel() == 0:
        raise InputError("empty sequence", argument="token_ids")
    device = next(model.parameters()).device
    own = recorder is None
    rec = RouterRecorder(model).install() if own else recorder
    base = model.base_model
    parts, wparts = [], []
    try:
        start = 0
        while start < ids.numel():
            ctx = 0 if start == 0 else min(ov, start)
            end = min(ids.numel(), start - ctx + c)
            with torch.inference_mode():
                base(input_ids=ids[start - ctx : end][None].to(device), use_cache=False)
            e, w = rec.pop()
            parts.append(e[ctx:])
            wparts.append(None if w is None else w[ctx:])
            start = end
    finally:
        if own:
            rec.remove()
    experts = np.concatenate(parts)
    weights = None if any(w is None for w in wparts) else np.concatenate(wparts)
    return experts, weights


def _encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids with the tokenizer's default special tokens (a long text is not an error)."""
    if hasattr(tokenizer, "model_max_length"):  # a transformers tokenizer
        return list(tokenizer(text, verbose=False)["input_ids"])
    return (
        list(tokenizer(text)["input_ids"]) if callable(tokenizer) else list(tokenizer.encode(text))
    )


def _progress(total: int, *, enabled: bool, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=total, unit="tok", desc=desc, file=sys.stderr, disable=not enabled, dynamic_ncols=True
    )


def check_capture_args(documents: Sequence[tuple[str, str]], max_tokens, shard_tokens) -> None:
    """The checks every capture makes before it reads a document: unique names, a positive
    ``max_tokens`` (or None) and ``shard_tokens``; an ``InputError`` naming the argument."""
    names = [str(n) for n, _ in documents]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InputError(f"names must be unique (repeated {dup!r})", argument="documents")
    if max_tokens is not None and max_tokens < 1:
        raise InputError(f"must be a positive integer, got {max_tokens}", argument="max_tokens")
    if shard_tokens < 1:
        raise InputError(f"must be a positive integer, got {shard_tokens}", argument="shard_tokens")


def documents_digest(documents: Sequence[tuple[str, str]]) -> str:
    """sha256 over the documents' names and texts, in order (recorded in every shard)."""
    digest = hashlib.sha256()
    for n, t in documents:
        digest.update(hashlib.sha256(str(n).encode()).digest())
        digest.update(hashlib.sha256(str(t).encode()).digest())
    return digest.hexdigest()


def capture_documents(
    model: Any,
    tokenizer: Any,
    documents: Sequence[tuple[str, str]],
    out_dir: str | Path,
    *,
    max_tokens: int | None = None,
    max_context: int | None = None,
    overlap: int | None = None,
    shard_tokens: int = 1 << 16,
    progress: bool = True,
    source: str = "",
    model_name: str | None = None,
    overwrite: bool = False,
    documents_sha256: str | None = None,
) -> Path:
    """Teacher-forced capture of ``documents`` ``[(name, text)]`` into shards under ``out_dir``.

    Each shard ``shard-NNNNN.npz`` holds whole documents (about ``shard_tokens`` tokens) and is
    written atomically as soon as it is full; ``manifest.json`` summarises them. A rerun into the
    same directory skips the documents its shards already hold, so an interrupted capture keeps
    every finished shard and resumes (documents are known by name, which must be unique).
    ``max_tokens`` caps the tokens of the whole capture (resumed ones included); the document
    at the cap is cut short and listed in the shard's ``meta["truncated"]``. Returns
    ``out_dir``, which :func:`specmoe.formats.trace.open_trace` reads as one trace.

    Every shard records what decides its contents (the model and its shapes, ``source``,
    ``max_context``, ``overlap``, ``max_tokens`` and the sha256 of the documents, names and
    texts); a rerun that differs in any of them is an ``InputError`` naming ``out_dir``
    (argument ``out``) unless ``overwrite`` discards the shards already there.
    ``documents_sha256``: the digest to record instead (a part of a larger capture records the
    whole capture's, :func:`documents_digest`, so that its shards join the whole's).
    """
    check_capture_args(documents, max_tokens, shard_tokens)
    out = Path(out_dir)
    rec = RouterRecorder(model)
    label = model_name or model_label(model)
    context = _context(model, max_context)
    ov = context // 4 if overlap is None else int(overlap)
    if not 0 <= ov < context:
        raise InputError(
            f"must be in 0..{context - 1} (below max_context), got {ov}", argument="overlap"
        )
    header = {
        "model": label,
        "model_type": str(model.config.model_type),
        "num_experts": rec.num_experts,
        "top_k": rec.rule.top_k,
        "layers": rec.layers,
        "source": source,
        "capture": "teacher_forced",
        "max_context": context,
        "overlap": ov,
        "max_tokens": max_tokens,
        "documents_sha256": documents_sha256 or documents_digest(documents),
    }
    writer = ShardWriter(out, header, shard_tokens=shard_tokens, overwrite=overwrite)
    todo = [(str(n), t) for n, t in documents if str(n) not in writer.done]
    budget = None if max_tokens is None else max(0, max_tokens - writer.tokens)
    if budget is None:  # all of it: tokenize first, so the progress bar knows the total
        encoded: Any = [(n, _encode(tokenizer, t)) for n, t in todo]
        total = sum(len(ids) for _, ids in encoded)
    else:  # a budget: tokenize lazily, stop at the cap
        encoded, total = ((n, _encode(tokenizer, t)) for n, t in todo), budget
    bar = _progress(total, enabled=progress, desc=f"capture {label}")
    try:
        with rec:
            for name, ids in encoded:
                if budget is not None and budget <= 0:
                    break
                if not ids:
                    continue
                cut = budget is not None and len(ids) > budget
                if cut:
                    ids = ids[:budget]
                e, w = capture_tokens(model, ids, max_context=context, overlap=ov, recorder=rec)
                writer.add(name, e, w, truncated=cut)
                if budget is not None:
                    budget -= len(ids)
                bar.update(len(ids))
    finally:  # keep every whole document captured so far, also on an interruption
        writer.flush()
        bar.close()
    if not writer.shards:
        raise InputError("nothing to capture (every document is empty)", argument="documents")
    return out


# ------------------------------------------------------------------------------------------
# Generation capture


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    found: set[int] = set()
    for src in (
        getattr(tokenizer, "eos_token_id", None),
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
        getattr(model.config, "eos_token_id", None),
    ):
        if isinstance(src, int):
            found.add(src)
        elif isinstance(src, list | tuple):
            found.update(int(x) for x in src)
    return found


def capture_generation(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    include_prompt: bool = False,
    stop_at_eos: bool = True,
    progress: bool = True,
    model_name: str | None = None,
) -> RoutingTrace:
    """Greedy decoding with the KV cache, one document per prompt.

    Each generated token's routing is recorded when it is fed back (so the last generated token
    gets one more forward pass); with ``include_prompt`` the prompt's routing comes first.
    ``meta["token_ids"]`` holds each document's recorded tokens, so a teacher-forced capture of
    the same sequence can be compared with it.
    """
    import torch

    if max_new_tokens < 1:
        raise InputError(
            f"must be a positive integer, got {max_new_tokens}", argument="max_new_tokens"
        )
    if not prompts:
        raise InputError("no prompts given", argument="prompts")
    limit = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
    cache_kw = (
        "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    )
    eos = _eos_ids(model, tokenizer) if stop_at_eos else set()
    device = next(model.parameters()).device
    encoded = [_encode(tokenizer, p) for p in prompts]
    for i, ids in enumerate(encoded):
        if not ids:
            raise InputError(f"prompt {i} is empty after tokenization", argument="prompts")
        if len(ids) + max_new_tokens > limit:
            raise InputError(
                f"prompt {i} ({len(ids)} tokens) plus {max_new_tokens} "
                f"new tokens exceeds the model's context of {limit}",
                argument="prompts",
            )
    label = model_name or model_label(model)
    bar = _progress(len(prompts) * max_new_tokens, enabled=progress, desc=f"generate {label}")
    rec = RouterRecorder(model)
    experts, weights, lengths, token_ids, prompt_lens = [], [], [], [], []
    try:
        with rec, torch.inference_mode():
            for ids in encoded:
                out = model(
                    input_ids=torch.tensor([ids], device=device), use_cache=True, logits_to_keep=1
                )
                e_prompt, w_prompt = rec.pop()
                e_parts = [e_prompt] if include_prompt else []
                w_parts = [w_prompt] if include_prompt else []
                gen: list[int] = []
                while len(gen) < max_new_tokens:
                    nxt = int(out.logits[0, -1].argmax())
                    gen.append(nxt)
                    cache = (
                        out.cache
                        if getattr(out, "cache", None) is not None
                        else out.past_key_values
                    )
                    out = model(
                        input_ids=torch.tensor([[nxt]], device=device),
                        use_cache=True,
                        **{cache_kw: cache},
                    )
                    e, w = rec.pop()
                    e_parts.append(e)
                    w_parts.append(w)
                    bar.update(1)
                    if nxt in eos:
                        break
                experts.append(np.concatenate(e_parts))
                weights.append(None if any(w is None for w in w_parts) else np.concatenate(w_parts))
                lengths.append(len(experts[-1]))
                token_ids.append((ids if include_prompt else []) + gen)
                prompt_lens.append(len(ids))
    finally:
        bar.close()
    meta = {
        "model": label,
        "model_type": str(model.config.model_type),
        "layers": rec.layers,
        "top_k": rec.rule.top_k,
        "source": "generation",
        "capture": "greedy_generation",
        "documents": [f"prompt-{i:04d}" for i in range(len(prompts))],
        "include_prompt": include_prompt,
        "prompt_tokens": prompt_lens,
        "token_ids": token_ids,
    }
    return RoutingTrace(
        experts=np.concatenate(experts),
        doc_offsets=np.concatenate([[0], np.cumsum(lengths)]),
        num_experts=rec.num_experts,
        weights=None if any(w is None for w in weights) else np.concatenate(weights),
        meta=meta,
        name=f"generation of {label}",
    )
