"""Qwen3-MoE (``Qwen3MoeForCausalLM``): softmax over N, top m, renormalised iff
``norm_topk_prob``."""

from __future__ import annotations

from typing import Any

from specmoe.engine.families._base import Family, Routing


def tiny_config(common: dict[str, Any], num_experts: int) -> dict[str, Any]:
    return {
        **common,
        "num_experts": num_experts,
        "moe_intermediate_size": common["hidden_size"],
        "norm_topk_prob": True,
    }


FAMILY = Family(
    model_types=("qwen3_moe",),
    class_name="Qwen3MoeForCausalLM",
    config_class="Qwen3MoeConfig",
    routing=Routing(score="softmax", renormalise="config"),
    summary="softmax over N, top-m; weights renormalised iff norm_topk_prob",
    tiny_config=tiny_config,
)
