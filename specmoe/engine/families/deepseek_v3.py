"""DeepSeek-V3 (``DeepseekV3ForCausalLM``): sigmoid scores; the choice adds the correction bias
and keeps the ``topk_group`` groups of highest top-2 sum; weights are the scores, renormalised
iff ``norm_topk_prob``, × scaling."""

from __future__ import annotations

from typing import Any

from specmoe.engine.families._base import Family, Routing
from specmoe.engine.families.deepseek_v2 import tiny_mla_config


def tiny_config(common: dict[str, Any], num_experts: int) -> dict[str, Any]:
    return {**tiny_mla_config(common, num_experts), "norm_topk_prob": True}


FAMILY = Family(
    model_types=("deepseek_v3",),
    class_name="DeepseekV3ForCausalLM",
    config_class="DeepseekV3Config",
    routing=Routing(
        score="sigmoid",
        renormalise="config",
        renorm_eps=1e-20,
        groups="top2",
        correction_bias="e_score_correction_bias",
        scaled=True,
    ),
    summary="sigmoid scores; choose with scores + e_score_correction_bias among the "
    "topk_group groups of highest top-2 sum; weights are the sigmoid scores, "
    "renormalised iff norm_topk_prob, × routed_scaling_factor",
    tiny_config=tiny_config,
    num_experts_key="n_routed_experts",
    shared_experts="mlp.shared_experts: n_shared_experts dense experts; the first "
    "first_k_dense_replace decoder layers are dense",
    tiny_dense_layers=1,
)
