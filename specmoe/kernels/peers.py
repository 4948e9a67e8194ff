"""transformers' own experts implementations, wrapped behind this package's kernel contract.

transformers 5.x routes an MoE experts module's forward through an experts-implementation
switch (``transformers.integrations.moe``: ``config._experts_implementation`` in
``{"eager", "batched_mm", "grouped_mm", ...}``). The functions take the module as ``self``
and read ``gate_up_proj`` [N, 2I, h], ``down_proj`` [N, h, I], ``act_fn`` and a few flags, the
same layout as this package's (:mod:`specmoe.kernels._contract`). So each peer runs
transformers' code unchanged on a small stand-in module that holds views of our tensors:

* ``hf_batched_mm`` (per-slot): ``batched_mm_experts_forward`` gathers ``W[expert_ids]`` for
  every slot (a copy of n·m experts) and multiplies with ``torch.bmm``.
* ``hf_grouped_mm`` (dedup): ``grouped_mm_experts_forward`` sorts slots by expert and calls
  ``grouped_mm`` (or transformers' per-expert ``torch.mm`` fallback).
* ``hf_eager`` (dedup): the eager loop over the experts that the pass hits (``OlmoeExperts``'s
  original forward; for the ``swiglu_oai`` activation, ``GptOssExperts``'s, on transposed
  views).

transformers is imported only when a peer runs.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from specmoe.errors import InputError
from specmoe.kernels._contract import activate, check_inputs


class _Experts:
    """The attributes transformers' experts functions read from their module."""

    def __init__(
        self,
        w_gate_up: torch.Tensor,
        w_down: torch.Tensor,
        activation: str,
        b_gate_up: torch.Tensor | None,
        b_down: torch.Tensor | None,
    ):
        self.num_experts = w_gate_up.shape[0]
        self.gate_up_proj = w_gate_up
        self.down_proj = w_down
        self.gate_up_proj_bias = b_gate_up
        self.down_proj_bias = b_down
        self.has_gate = True
        self.has_bias = b_gate_up is not None or b_down is not None
        if self.has_bias:  # transformers adds both biases when has_bias
            if self.gate_up_proj_bias is None:
                self.gate_up_proj_bias = w_gate_up.new_zeros(w_gate_up.shape[:2])
            if self.down_proj_bias is None:
                self.down_proj_bias = w_down.new_zeros(w_down.shape[:2])
        self.has_post_expert_norm = False
        self.is_transposed = False
        self.is_concatenated = True
        self._is_expert_parallel = False
        self.activation = activation
        self.act_fn = torch.nn.functional.silu

    def _apply_gate(self, gate_up_out: torch.Tensor) -> torch.Tensor:
        return activate(gate_up_out, self.activation)


@cache
def _hf() -> Any:
    try:
        from transformers.integrations import moe
    except Exception as exc:
        raise InputError(
            f"kernel: the transformers peers need transformers 5.x with "
            f"integrations.moe ({type(exc).__name__})"
        ) from None
    return moe


def _hf_forward(fn: str, x, w_gate_up, w_down, ids, weights, activation, b_gate_up, b_down, check):
    """Check the inputs, wrap the weights as a transformers experts module and call
    ``transformers.integrations.moe.<fn>``."""
    check_inputs(
        x,
        w_gate_up,
        w_down,
        ids,
        weights,
        activation=activation,
        b_gate_up=b_gate_up,
        b_down=b_down,
        check_ids=check,
    )
    mod = _Experts(w_gate_up, w_down, activation, b_gate_up, b_down)
    return getattr(_hf(), fn)(mod, x, ids.long(), weights.to(x.dtype))


def hf_batched_mm(
    x,
    w_gate_up,
    w_down,
    ids,
    weights,
    *,
    activation="swiglu",
    b_gate_up=None,
    b_down=None,
    check=True,
):
    """transformers' ``batched_mm`` experts implementation (per-slot, gathers W[ids])."""
    return _hf_forward(
        "batched_mm_experts_forward",
        x,
        w_gate_up,
        w_down,
        ids,
        weights,
        activation,
        b_gate_up,
        b_down,
        check,
    )


def hf_grouped_mm(
    x,
    w_gate_up,
    w_down,
    ids,
    weights,
    *,
    activation="swiglu",
    b_gate_up=None,
    b_down=None,
    check=True,
):
    """transformers' ``grouped_mm`` experts implementation (dedup)."""
    return _hf_forward(
        "grouped_mm_experts_forward",
        x,
        w_gate_up,
        w_down,
        ids,
        weights,
        activation,
        b_gate_up,
        b_down,
        check,
    )


def hf_eager(
    x,
    w_gate_up,
    w_down,
    ids,
    weights,
    *,
    activation="swiglu",
    b_gate_up=None,
    b_down=None,
    check=True,
):
    """transformers' eager experts loop (dedup: one pass per expert hit)."""
    check_inputs(
        x,
        w_gate_up,
        w_down,
        ids,
        weights,
        activation=activation,
        b_gate_up=b_gate_up,
        b_down=b_down,
        check_ids=check,
    )
    if activation == "swiglu" and b_gate_up is None and b_down is None:
        from transformers.models.olmoe.modeling_olmoe import OlmoeExperts

        mod = _Experts(w_gate_up, w_down, activation, None, None)
        fwd = getattr(OlmoeExperts.forward, "__wrapped__", OlmoeExperts.forward)
        return fwd(mod, x, ids.long(), weights.to(x.dtype))
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    # gpt-oss's eager loop: x @ gate_up_proj[e] with gate_up_proj [N, h, 2I] (a transposed
    # view of ours) and our concatenated-halves gate through _apply_gate.
    mod = _Experts(w_gate_up.transpose(1, 2), w_down.transpose(1, 2), activation, b_gate_up, b_down)
    fwd = getattr(GptOssExperts.forward, "__wrapped__", GptOssExperts.forward)
    return fwd(mod, x, ids.long(), weights.to(x.dtype))
