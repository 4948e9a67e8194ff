"""OLMoE (``OlmoeForCausalLM``): softmax over N, top m, renormalised iff ``norm_topk_prob``."""

from __future__ import annotations

from typing import Any

from specmoe.engine.families._base import Family, Routing


def tiny_config(common: dict[str, Any], num_experts: int) -> dict[str, Any]:
    return {**common, "num_experts": num_experts, "norm_topk_prob": False}


FAMILY = Family(
    model_types=("olmoe",),
    class_name="OlmoeForCausalLM",
    config_class="OlmoeConfig",
    routing=Routing(score="softmax", renormalise="config"),
    summary="softmax over N, top-m; weights renormalised to sum 1 iff norm_topk_prob",
    tiny_config=tiny_config,
)
