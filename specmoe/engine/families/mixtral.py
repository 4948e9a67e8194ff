"""Mixtral (``MixtralForCausalLM``): top m of the logits, softmax over the m (equal to softmax
over N, top m, renormalised)."""

from __future__ import annotations

from typing import Any

from specmoe.engine.families._base import Family, Routing


def tiny_config(common: dict[str, Any], num_experts: int) -> dict[str, Any]:
    return {**common, "num_local_experts": num_experts}


FAMILY = Family(
    model_types=("mixtral",),
    class_name="MixtralForCausalLM",
    config_class="MixtralConfig",
    routing=Routing(order="topk_then_softmax"),
    summary="softmax over N, top-m, renormalised (= top-m logits, then softmax over m)",
    tiny_config=tiny_config,
    blocks=("mlp", "block_sparse_moe"),
    num_experts_key="num_local_experts",
)
