"""gpt-oss (``GptOssForCausalLM``): top m of the biased logits, softmax over the m; clamped
SwiGLU experts with biases, stored transposed and interleaved."""

from __future__ import annotations

from typing import Any

from specmoe.engine.families._base import Family, Routing


def tiny_config(common: dict[str, Any], num_experts: int) -> dict[str, Any]:
    layers, context = common["num_hidden_layers"], common["max_position_embeddings"]
    return {
        **common,
        "num_local_experts": num_experts,
        "sliding_window": 16,
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "rope_theta": 1.5e5,
            "original_max_position_embeddings": context // 4,
        },
        "layer_types": [
            "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
        ],
    }


FAMILY = Family(
    model_types=("gpt_oss",),
    class_name="GptOssForCausalLM",
    config_class="GptOssConfig",
    routing=Routing(order="topk_then_softmax"),
    summary="top-m of the biased logits, then softmax over the m",
    tiny_config=tiny_config,
    router="router",
    num_experts_key="num_local_experts",
    activation="swiglu_oai",
    expert_bias=True,
)
