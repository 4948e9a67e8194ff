"""Cross-engine routing check: the same weights route the same experts in transformers and in
llama.cpp, teacher-forced on the same tokens.

Legend for shapes: ``T`` tokens, ``L`` MoE layers, ``m`` experts per token, ``N`` experts.

For each (token, layer) pair the two engines' top-m expert *sets* are compared
(:func:`agreement`). Where they differ, the pair is a near tie when, in transformers' router
probabilities p (softmax over N, float64 from its float32 logits), the gap between the m-th and
the (m+1)-th largest, ``p_(m) - p_(m+1)``, is small: below 1e-4, below 1e-3, or within one
bfloat16 ulp of ``p_(m)`` (``2^(floor(log2 p_(m)) - 7)``: a difference that rounding the
router's input or weights to bfloat16 can reverse). The same gaps over all pairs say how often
the model is that close to a tie anywhere.

:func:`transformers_reference` runs transformers once: the token sequence is cut into windows
of at most ``window`` tokens, each decoded from position 0 without a cache
(:class:`specmoe.engine.capture.RouterRecorder`, the routers' logits hooked beside it).
:func:`cross_engine_check` feeds the same windows to llama.cpp, each from position 0 on an empty
KV cache (:class:`specmoe.engines.llamacpp_routing.LlamaRouting`; the cache float16 as
llama.cpp serves, or float32), compares, and compares llama.cpp's tokens of each document with
transformers' tokenizer's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from specmoe.errors import InputError

__all__ = [
    "TARGET",
    "Agreement",
    "Reference",
    "agreement",
    "bf16_ulp",
    "cross_engine_check",
    "stdlib_tokens",
    "top_gaps",
    "transformers_reference",
]

TARGET = 0.99  # the target: set agreement on >= 99% of (token, layer) pairs
_GAP_LIMITS = (1e-4, 1e-3)


def bf16_ulp(p: np.ndarray) -> np.ndarray:
    """One bfloat16 ulp at ``p`` > 0: ``2^(floor(log2 p) - 7)`` (8 significant bits)."""
    p = np.asarray(p, dtype=np.float64)
    return np.exp2(np.floor(np.log2(np.maximum(p, np.finfo(np.float64).tiny))) - 7)


def top_gaps(probs: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """``(p_(m), p_(m) - p_(m+1))`` per row of ``probs [..., N]``: the m-th largest
    probability and its gap to the next."""
    if not 1 <= m < probs.shape[-1]:
        raise ValueError(f"top_gaps: m must be in 1..{probs.shape[-1] - 1}, got {m}")
    part = -np.partition(-np.asarray(probs, dtype=np.float64), (m - 1, m), axis=-1)
    return part[..., m - 1], part[..., m - 1] - part[..., m]


def _gap_summary(gap: np.ndarray, pm: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {"count": int(gap.size)}
    for lim in _GAP_LIMITS:
        out[f"gap_below_{lim:g}"] = int((gap < lim).sum())
    out["gap_within_bf16_ulp"] = int((gap <= bf16_ulp(pm)).sum())
    if gap.size:
        out["gap_median"] = float(np.median(gap))
        out["gap_max"] = float(gap.max())
    return out


@dataclass(frozen=True)
class Agreement:
    """The comparison of two recordings of the same (token, layer) pairs.

    ``set_agreement``: the share of pairs whose expert sets are equal; ``ordered_agreement``:
    equal in order too; ``per_layer``: set agreement per layer; ``disagreements``: the pairs
    that differ, with transformers' gap summary (``gap_below_*``, ``gap_within_bf16_ulp``),
    ``boundary_swaps`` (llama.cpp's set is transformers' with its m-th expert replaced by its
    (m+1)-th) and ``experts_differing`` (how many experts of the m differ: count of pairs);
    ``all_pairs``: the same gap summary over every pair; ``probs_abs_diff``: max and 99th
    percentile of |p_transformers - p_llama.cpp| when both gave probabilities."""

    pairs: int
    set_agreement: float
    ordered_agreement: float
    per_layer: list[float]
    disagreements: dict[str, Any]
    all_pairs: dict[str, Any]
    probs_abs_diff: dict[str, float] | None = None
    target: float = TARGET
    passed: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "passed", bool(self.set_agreement >= self.target))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def agreement(
    ref_experts: np.ndarray,
    experts: np.ndarray,
    ref_probs: np.ndarray,
    probs: np.ndarray | None = None,
) -> Agreement:
    """Compare ``experts [T, L, m]`` with the reference ``ref_experts [T, L, m]`` whose router
    probabilities are ``ref_probs [T, L, N]`` (and ``probs``, the other engine's, if any)."""
    ref_experts, experts = np.asarray(ref_experts), np.asarray(experts)
    if ref_experts.shape != experts.shape or ref_experts.ndim != 3:
        raise ValueError(
            f"agreement: experts {experts.shape} and ref_experts {ref_experts.shape} must be "
            "equal [T, L, m] shapes"
        )
    t, nl, m = ref_experts.shape
    if ref_probs.shape[:2] != (t, nl):
        raise ValueError(f"agreement: ref_probs {ref_probs.shape} is not [{t}, {nl}, N]")
    a, b = np.sort(ref_experts, -1), np.sort(experts, -1)
    same = (a == b).all(-1)  # [T, L]
    ordered = (ref_experts == experts).all(-1)
    pm, gap = top_gaps(ref_probs, m)
    bad = ~same
    # experts differing: m minus the size of the intersection
    inter = np.array([len(np.intersect1d(x, y)) for x, y in zip(a[bad], b[bad])], dtype=np.int64)
    hist = {int(d): int(c) for d, c in zip(*np.unique(m - inter, return_counts=True))}
    # the reference's (m+1)-th expert for the boundary-swap test
    order = np.argsort(-ref_probs[bad].astype(np.float64), axis=-1, kind="stable")
    swapped = np.concatenate([order[:, : m - 1], order[:, m : m + 1]], axis=-1)
    boundary = int((np.sort(swapped, -1) == b[bad]).all(-1).sum()) if bad.any() else 0
    dis = _gap_summary(gap[bad], pm[bad])
    dis.update(boundary_swaps=boundary, experts_differing=hist)
    diff = None
    if probs is not None:
        d = np.abs(np.asarray(probs, dtype=np.float64) - ref_probs)
        diff = {"max": float(d.max()), "p99": float(np.quantile(d, 0.99))}
    return Agreement(
        pairs=int(t * nl),
        set_agreement=float(same.mean()),
        ordered_agreement=float(ordered.mean()),
        per_layer=[float(x) for x in same.mean(0)],
        disagreements=dis,
        all_pairs=_gap_summary(gap.ravel(), pm.ravel()),
        probs_abs_diff=diff,
    )


# ------------------------------------------------------------------------------------------
# both engines


def _transformers_routing(model: Any, windows: Sequence[Sequence[int]]) -> tuple[Any, Any]:
    """``experts [T, L, m]`` (transformers' own choice) and ``probs [T, L, N]`` (softmax of
    its routers' logits) over the windows, each from position 0."""
    import torch

    from specmoe.engine.capture import RouterRecorder

    rec = RouterRecorder(model)
    layout = rec.rule.family.router_output
    n_exp = rec.num_experts
    logits: list[list[Any]] = [[] for _ in rec.routers]

    def hook(pos: int) -> Any:
        def f(module: Any, args: Any, output: Any) -> None:
            outs = output if isinstance(output, tuple) else (output,)
            t = None
            if "logits" in layout and len(outs) == len(layout):
                t = outs[layout.index("logits")]
            if t is None or not torch.is_tensor(t) or t.shape[-1] != n_exp:
                t = next(
                    x
                    for x in outs
                    if torch.is_tensor(x) and x.is_floating_point() and x.shape[-1] == n_exp
                )
            logits[pos].append(t.detach().reshape(-1, n_exp).double().softmax(-1).cpu())

        return f

    handles = [mod.register_forward_hook(hook(i)) for i, (_, mod) in enumerate(rec.routers)]
    device = next(model.parameters()).device
    experts = []
    try:
        with rec, torch.inference_mode():
            for w in windows:
                model.base_model(input_ids=torch.tensor([list(w)], device=device), use_cache=False)
                e, _ = rec.pop()
                experts.append(e)
    finally:
        for h in handles:
            h.remove()
    probs = np.stack([torch.cat(p).numpy() for p in logits], axis=1)
    return np.concatenate(experts), probs


def stdlib_tokens(tokenizer: Any, n_tokens: int, *, split: str = "validation") -> list[list[int]]:
    """The first ``n_tokens`` of the bundled corpus's ``split`` (stdlib source files) by
    ``tokenizer`` (no special tokens), one list per document; the last one cut."""
    from specmoe.data.corpus import documents

    out, total = [], 0
    for name, text in documents(split):
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        if not ids:
            continue
        ids = ids[: n_tokens - total]
        out.append((name, text, ids))
        total += len(ids)
        if total >= n_tokens:
            break
    if total < n_tokens:
        raise InputError(f"the {split} split holds only {total} tokens", argument="tokens")
    return out


@dataclass(frozen=True)
class Reference:
    """Transformers' routing of the check's tokens: ``experts [T, L, m]``, ``probs [T, L, N]``,
    the ``windows`` they were fed in and the ``docs`` ``[(name, text, ids)]`` they came from."""

    model: str
    dtype: str
    split: str
    window: int
    docs: list[tuple[str, str, list[int]]]
    windows: list[list[int]]
    experts: np.ndarray
    probs: np.ndarray


def _layerwise_float32(model: Any) -> list[Any]:
    """Run a bfloat16-loaded ``model`` in float32 one decoder layer at a time: the layers
    outside the decoder stack in float32 for good (the rotary embedding rebuilt from the
    config, so that its frequencies are float32's), each decoder layer cast to float32 just
    before its forward and back to bfloat16 after. bfloat16 to float32 is exact, so this is
    the float32 model of a bfloat16 checkpoint in about half its memory. Returns the hooks."""
    import torch

    base = model.base_model
    layers = base.layers
    for name, child in base.named_children():
        if child is layers:
            continue
        if name == "rotary_emb":
            setattr(base, name, type(child)(config=model.config))
        else:
            child.float()

    def up(module: Any, args: Any) -> None:
        module.float()

    def down(module: Any, args: Any, output: Any) -> None:
        module.to(torch.bfloat16)

    hooks = []
    for layer in layers:
        hooks += [layer.register_forward_pre_hook(up), layer.register_forward_hook(down)]
    return hooks


def transformers_reference(
    model_dir: str | os.PathLike,
    *,
    tokens: int = 5000,
    window: int = 1024,
    split: str = "validation",
    model: Any = None,
    tokenizer: Any = None,
    model_name: str | None = None,
    layerwise: bool = False,
) -> Reference:
    """Teacher-force the first ``tokens`` tokens of the corpus ``split`` (by the model's own
    tokenizer) through transformers (the checkpoint ``model_dir``, float32 on the CPU unless
    ``model`` is given), in windows of at most ``window`` tokens from position 0. A model
    loaded here is released before returning (llama.cpp loads its own copy next).
    ``layerwise``: load it in bfloat16 and compute in float32 one layer at a time (for a
    bfloat16 checkpoint too large for float32 in memory: the same numbers)."""
    from specmoe.engine.models import load_model, load_tokenizer

    if tokens < 1:
        raise InputError(f"must be >= 1, got {tokens}", argument="tokens")
    if window < 2:
        raise InputError(f"must be >= 2, got {window}", argument="window")
    tokenizer = load_tokenizer(str(model_dir)) if tokenizer is None else tokenizer
    docs = stdlib_tokens(tokenizer, tokens, split=split)
    windows = [ids[s : s + window] for _, _, ids in docs for s in range(0, len(ids), window)]
    own = model is None
    if own and layerwise:
        model = load_model(str(model_dir), dtype="bfloat16")
        _layerwise_float32(model)
        dtype = "float32 (bfloat16 weights cast per layer)"
    else:
        model = load_model(str(model_dir)) if own else model
        dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    experts, probs = _transformers_routing(model, windows)
    if own:
        import gc

        del model
        gc.collect()
    return Reference(
        model=model_name or os.path.basename(os.path.normpath(str(model_dir))),
        dtype=dtype,
        split=split,
        window=int(window),
        docs=docs,
        windows=windows,
        experts=experts,
        probs=probs,
    )


def cross_engine_check(
    ref: Reference,
    gguf: str | os.PathLike,
    *,
    tokenizer: Any,
    batch: int = 64,
    threads: int = 1,
    kv_type: str = "f16",
    overrides: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Teacher-force the reference's windows through llama.cpp (``gguf``, exported from the
    reference's model; its KV cache in ``kv_type``; ``overrides``: GGUF float metadata
    replaced at load, as :class:`~specmoe.engines.llamacpp_routing.LlamaRouting` takes them)
    and compare the routing
    (:func:`agreement`); check that llama.cpp tokenizes each document as ``tokenizer`` does.
    Returns a JSON-ready record: the agreement, the tokenization check and what was run."""
    from specmoe.engines.llamacpp_routing import LlamaRouting

    if not os.path.isfile(gguf):
        raise InputError(f"{gguf}: no such GGUF file", argument="gguf")
    tok_equal, tok_first_diff, doc_tokens = 0, None, 0
    opts = {"batch": batch, "threads": threads, "kv_type": kv_type, "overrides": overrides}
    with LlamaRouting(gguf, n_ctx=ref.window, **opts) as rec:
        for name, text, _ids in ref.docs:
            full = list(tokenizer.encode(text, add_special_tokens=False))
            doc_tokens += len(full)
            lt = rec.tokenize(text)
            if lt == full:
                tok_equal += 1
            elif tok_first_diff is None:
                i = next(
                    (j for j, (x, y) in enumerate(zip(lt, full)) if x != y), min(len(lt), len(full))
                )
                tok_first_diff = {"document": name, "position": i}
        parts = [rec.record(w, probs=True) for w in ref.windows]
        layers = parts[0].layers
    e = np.concatenate([p.experts for p in parts])
    p = np.concatenate([p.probs for p in parts])
    if e.shape != ref.experts.shape:
        raise RuntimeError(
            f"routing check: llama.cpp recorded {e.shape}, transformers {ref.experts.shape} "
            "([T, L, m]; a layer count that differs?)"
        )
    agr = agreement(ref.experts, e, ref.probs, p)
    return {
        "model": ref.model,
        "gguf": os.path.basename(str(gguf)),
        "kv_cache": kv_type,
        "metadata_overrides": dict(overrides or {}),
        "tokens": int(e.shape[0]),
        "layers": list(layers),
        "top_k": int(e.shape[2]),
        "num_experts": int(p.shape[2]),
        "window": ref.window,
        "windows": len(ref.windows),
        "batch": int(batch),
        "threads": int(threads),
        "split": ref.split,
        "documents": [n for n, _, _ in ref.docs],
        "transformers_dtype": ref.dtype,
        "tokenization": {
            "documents": len(ref.docs),
            "documents_equal": tok_equal,
            "tokens": int(doc_tokens),
            "first_difference": tok_first_diff,
        },
        "agreement": agr.to_dict(),
        "gap_definition": "transformers' p_(m) - p_(m+1), float64 softmax of its float32 logits",
        "bf16_ulp_definition": "2^(floor(log2 p_(m)) - 7)",
    }
