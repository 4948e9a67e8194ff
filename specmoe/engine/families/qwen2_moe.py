"""Qwen2-MoE (``Qwen2MoeForCausalLM``): softmax over N, top m, renormalised iff
``norm_topk_prob``; one dense shared expert beside the routed ones."""

from __future__ import annotations

from typing import Any

from specmoe.engine.families._base import Family, Routing


def tiny_config(common: dict[str, Any], num_experts: int) -> dict[str, Any]:
    hidden = common["hidden_size"]
    return {
        **common,
        "num_experts": num_experts,
        "moe_intermediate_size": hidden,
        "shared_expert_intermediate_size": hidden,
        "norm_topk_prob": False,
    }


FAMILY = Family(
    model_types=("qwen2_moe",),
    class_name="Qwen2MoeForCausalLM",
    config_class="Qwen2MoeConfig",
    routing=Routing(score="softmax", renormalise="config"),
    summary="softmax over N, top-m; weights renormalised iff norm_topk_prob "
    "(the shared expert is dense and not recorded)",
    tiny_config=tiny_config,
    shared_experts="mlp.shared_expert of shared_expert_intermediate_size, scaled by the "
    "sigmoid of mlp.shared_expert_gate ([1, H], not a router)",
)
