"""Checks of a lifted model (:mod:`specmoe.engine.lift`) against its source, in transformers.

Legend for shapes: ``T`` tokens, ``L`` layers, ``m`` slots, ``d`` the source's hidden size.

- :func:`routing_agreement`: the share of (token, layer) pairs whose expert *sets* are equal
  (slot order aside), per layer.
- :func:`extra_layer_routing`: the brute-force expectation of an extra layer's routing, in the
  source model's own space: the source's final residual stream (the input of its final norm)
  through the post-attention norm and router of source layer ``l mod L_src``, top-m of the
  router's softmax.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from specmoe.engine.lift import extra_layer_source

__all__ = [
    "extra_layer_routing",
    "final_residual",
    "float32_by_layer",
    "routing_agreement",
    "teacher_forced",
]


@contextlib.contextmanager
def float32_by_layer(model: Any) -> Iterator[Any]:
    """Run a model stored in bfloat16 in float32 while holding one decoder layer in float32 at
    a time: the embeddings, final norm and LM head are cast once, each decoder layer just
    before its forward and back after it (bf16 -> fp32 -> bf16 is lossless). The memory of a
    float32 model without holding one: the same function as loading it in float32."""
    import torch

    low = next(model.parameters()).dtype
    outer = [model.model.embed_tokens, model.model.norm, model.lm_head]

    def up(m: Any, _args: Any) -> None:  # a pre-hook that returns None keeps the inputs
        m.to(torch.float32)

    def down(m: Any, _args: Any, _out: Any) -> None:
        m.to(low)

    handles = []
    for block in model.model.layers:
        handles.append(block.register_forward_pre_hook(up))
        handles.append(block.register_forward_hook(down))
    for m in outer:
        m.to(torch.float32)
    model.config.dtype = torch.float32
    try:
        yield model
    finally:
        for h in handles:
            h.remove()
        for m in outer:
            m.to(low)
        model.config.dtype = low


def teacher_forced(model: Any, token_ids: Sequence[int]) -> np.ndarray:
    """``experts [T, L, m]`` of one teacher-forced pass over ``token_ids`` (one window)."""
    from specmoe.engine.capture import capture_tokens

    experts, _ = capture_tokens(model, token_ids, max_context=max(2, len(token_ids)))
    return experts


def final_residual(model: Any, token_ids: Sequence[int]) -> Any:
    """``[T, d]`` the residual stream after the last decoder layer (the final norm's input),
    in the model's dtype."""
    import torch

    seen: list[Any] = []
    handle = model.model.norm.register_forward_hook(lambda _m, args, _o: seen.append(args[0]))
    try:
        with torch.inference_mode():
            ids = torch.as_tensor(list(token_ids), dtype=torch.long)[None]
            model.model(input_ids=ids, use_cache=False)
    finally:
        handle.remove()
    return seen[-1][0]


def extra_layer_routing(source: Any, residual: Any, layers: Sequence[int]) -> np.ndarray:
    """``experts [T, len(layers), m]``: what lifted layers ``layers`` (each >= the source's
    layer count) route to, by brute force in the source model: source layer ``l mod L_src``'s
    post-attention norm and router on ``residual`` ([T, d], :func:`final_residual`)."""
    import torch

    from specmoe.engine.families import parse_router_output, rule_for

    n_src = len(source.model.layers)
    rule = rule_for(source)
    out = []
    with torch.inference_mode():
        for layer in layers:
            if layer < n_src:
                raise ValueError(f"layers: {layer} is a source layer (below {n_src})")
            block = source.model.layers[extra_layer_source(layer, n_src)]
            x = block.post_attention_layernorm(residual)
            ids, _ = parse_router_output(block.mlp.gate(x), block.mlp.gate, rule)
            out.append(ids.cpu().numpy())
    return np.stack(out, axis=1).astype(np.int64)


def routing_agreement(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[L]`` the share of tokens whose expert sets agree in each layer (``a``, ``b``:
    ``[T, L, m]``)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim != 3:
        raise ValueError(f"a, b: need equal [T, L, m] shapes, got {a.shape} and {b.shape}")
    return (np.sort(a, axis=-1) == np.sort(b, axis=-1)).all(axis=-1).mean(axis=0)
