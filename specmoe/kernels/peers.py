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

One peer is not transformers': ``ggml`` (:func:`ggml`), llama.cpp's CPU ``MUL_MAT_ID`` expert
FFN through :mod:`specmoe.engines.ggml_mmid`, registered by :func:`register_ggml` for the
processes that time it (it needs the llama.cpp build).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
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


# ggml's CPU MUL_MAT_ID (llama.cpp's expert FFN graph), behind the same contract.
_GGML_TYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}
_GGML_CACHE: dict[tuple, Any] = {}
_GGML_CACHE_MAX = 32


def ggml(
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
    """ggml's CPU ``MUL_MAT_ID`` expert FFN (:mod:`specmoe.engines.ggml_mmid`), dedup: each
    selected expert read once, rows grouped by expert. SwiGLU without biases, float32 or
    bfloat16 weights used in place (no copy), on ``torch.get_num_threads()`` ggml threads; x
    enters as float32 (ggml converts it to the weights' dot-product type itself). A graph is
    kept per weights, shapes and thread count (up to 32), so a timed call runs the graph only.
    Needs the llama.cpp build (``make llama-cpp``)."""
    n, m, _, h, inter = check_inputs(
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
    if activation != "swiglu" or b_gate_up is not None or b_down is not None:
        raise NotImplementedError("ggml: the harness runs SwiGLU experts without biases only")
    wtype = _GGML_TYPES.get(w_gate_up.dtype)
    if wtype is None or w_down.dtype != w_gate_up.dtype:
        raise NotImplementedError(f"ggml: no {w_gate_up.dtype} weights (float32 or bfloat16)")
    if x.device.type != "cpu" or not (w_gate_up.is_contiguous() and w_down.is_contiguous()):
        raise NotImplementedError("ggml: contiguous CPU tensors only")
    from specmoe.engines import ggml_mmid

    threads = torch.get_num_threads()
    num = w_gate_up.shape[0]
    key = (w_gate_up.data_ptr(), w_down.data_ptr(), tuple(w_gate_up.shape), wtype, n, m, threads)
    har = _GGML_CACHE.get(key)
    if har is None:
        if len(_GGML_CACHE) >= _GGML_CACHE_MAX:
            _GGML_CACHE.pop(next(iter(_GGML_CACHE))).close()
        har = ggml_mmid.Harness(
            wtype,
            w_gate_up,
            w_down,
            experts=num,
            hidden=h,
            inter=inter,
            top_k=m,
            n=n,
            threads=threads,
        )
        _GGML_CACHE[key] = har
    idn = ids.detach().to("cpu").numpy()
    if check:
        idn = ggml_mmid.check_ids(idn, num, m)
    else:
        idn = np.ascontiguousarray(idn, dtype=np.int32)
    y, _ = har.run(x.detach().float().numpy(), idn, weights.detach().float().numpy(), checked=True)
    return torch.from_numpy(y).to(x.dtype)


def ggml_clear() -> None:
    """Drop the kept ggml graphs (and with them their references to the weights)."""
    while _GGML_CACHE:
        _GGML_CACHE.popitem()[1].close()


def register_ggml() -> None:
    """Add ``ggml`` (this module's :func:`ggml`, a dedup peer) to
    :data:`specmoe.kernels.KERNELS` for this process, so the benchmark can time it by name. It
    is not registered by default: it needs the llama.cpp build, which the kernels' contract
    and self-check do not assume."""
    from specmoe.kernels import KERNELS, KernelInfo

    KERNELS.setdefault(
        "ggml",
        KernelInfo(
            "ggml",
            "dedup",
            {"cpu": "specmoe.kernels.peers:ggml"},
            "ggml's CPU MUL_MAT_ID (llama.cpp's expert FFN graph)",
            peer=True,
        ),
    )
