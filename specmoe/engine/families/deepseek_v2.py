"""DeepSeek-V2 (``DeepseekV2ForCausalLM``): softmax over N; greedy top m, or group-limited
greedy (the ``topk_group`` groups of highest max score, then top m); weights × scaling."""

from __future__ import annotations

from typing import Any

from specmoe.engine.families._base import Family, Routing


def tiny_mla_config(common: dict[str, Any], num_experts: int) -> dict[str, Any]:
    """A tiny DeepSeek config: multi-head latent attention, one shared expert, layer 0 dense."""
    grouped = num_experts % 4 == 0
    cfg = dict(
        common,
        n_routed_experts=num_experts,
        moe_intermediate_size=common["hidden_size"],
        n_shared_experts=1,
        first_k_dense_replace=1,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        n_group=4 if grouped else 1,
        topk_group=2 if grouped else 1,
        routed_scaling_factor=1.5,
    )
    cfg["num_key_value_heads"] = 4
    cfg.pop("head_dim")
    return cfg


def tiny_config(common: dict[str, Any], num_experts: int) -> dict[str, Any]:
    return {**tiny_mla_config(common, num_experts), "topk_method": "group_limited_greedy"}


FAMILY = Family(
    model_types=("deepseek_v2",),
    class_name="DeepseekV2ForCausalLM",
    config_class="DeepseekV2Config",
    routing=Routing(
        score="softmax",
        groups="max",
        groups_if=("topk_method", "group_limited_greedy"),
        scaled=True,
    ),
    summary="softmax over N; greedy top-m, or group-limited greedy (keep the topk_group "
    "groups of highest max score, then top-m); weights × routed_scaling_factor",
    tiny_config=tiny_config,
    num_experts_key="n_routed_experts",
    shared_experts="mlp.shared_experts: n_shared_experts dense experts; the first "
    "first_k_dense_replace decoder layers are dense",
    tiny_dense_layers=1,
)
