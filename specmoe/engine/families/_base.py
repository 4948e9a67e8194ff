"""What specmoe knows about one Hugging Face MoE family, as plain data (no torch here).

Legend for shapes: ``n`` tokens, ``N`` experts, ``m`` experts per token, ``H`` hidden size.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Family", "Routing"]

ORDERS = ("score_then_topk", "topk_then_softmax")
SCORES = ("softmax", "sigmoid")
RENORMALISE = ("never", "config")
GROUPS = ("none", "max", "top2")


@dataclass(frozen=True)
class Routing:
    """How a router picks m of N experts from its logits ``z [n, N]`` and weights them.

    ``order="score_then_topk"``: scores ``s = score(z)`` over the N experts (``softmax`` or
    ``sigmoid``); the m chosen are the top m of ``s`` (plus the router's correction bias when
    ``correction_bias`` names its attribute), searched only in the ``topk_group`` of ``n_group``
    expert groups of highest group score when the rule is grouped (group score: the ``max``
    of the group, or the sum of its ``top2``); the weights are ``s`` at the chosen ids, divided
    by their sum (plus ``renorm_eps``) when renormalised (``renormalise="config"``: iff the
    config's ``norm_topk_prob``), times the config's ``routed_scaling_factor`` when ``scaled``.

    ``order="topk_then_softmax"``: the m chosen are the top m of ``z`` (a router bias is in
    ``z``), weighted by the softmax over the m chosen logits. This equals softmax over N, top
    m, renormalised to sum 1.

    ``groups_if=(key, value)`` turns the group limit on only where ``config.<key> == value``
    (DeepSeek-V2's ``topk_method``); None: always, where ``groups`` is not ``"none"``.
    """

    order: str = "score_then_topk"
    score: str = "softmax"
    renormalise: str = "never"
    renorm_eps: float = 0.0
    groups: str = "none"
    groups_if: tuple[str, str] | None = None
    correction_bias: str | None = None  # router attribute added to the scores for the choice
    scaled: bool = False  # × config.routed_scaling_factor

    def __post_init__(self) -> None:
        for name, allowed in (
            ("order", ORDERS),
            ("score", SCORES),
            ("renormalise", RENORMALISE),
            ("groups", GROUPS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name}: {getattr(self, name)!r} is not one of {', '.join(allowed)}"
                )


@dataclass(frozen=True)
class Family:
    """One supported MoE family: its transformers classes, routing rule and module layout.

    A decoder layer ``layers.<i>`` is an MoE layer when its ``block`` (one of the names in
    ``blocks``) has a ``router`` child whose weight is ``[N, H]`` (a dense layer's MLP has none);
    the block's ``experts`` child is the fused experts module the kernel switch dispatches.
    The router's forward returns the tensors named by ``router_output``, in that order
    (transformers 5); a router that returns logits only goes through ``routing``.
    ``num_experts_key`` is the config key of N. ``activation`` and ``expert_bias`` are the
    expert MLP's (read by :func:`specmoe.spec.ModelSpec.from_hf_config` too).
    ``tiny_config(common, num_experts)`` gives the config keyword arguments of a tiny random
    model from the keys every family shares; ``tiny_dense_layers`` leading dense layers are
    added to its MoE layers.
    """

    model_types: tuple[str, ...]  # config model_type values it covers; the first is its name
    class_name: str  # transformers CausalLM class
    config_class: str  # transformers config class
    routing: Routing
    summary: str  # the routing rule in words
    tiny_config: Callable[[dict[str, Any], int], dict[str, Any]]
    blocks: tuple[str, ...] = ("mlp",)
    router: str = "gate"
    experts: str = "experts"
    router_output: tuple[str, ...] = ("logits", "weights", "ids")
    num_experts_key: str = "num_experts"
    activation: str = "swiglu"  # "swiglu" or "swiglu_oai" (gpt-oss's clamped variant)
    expert_bias: bool = False
    shared_experts: str = ""  # shared (dense) experts in words; they are not recorded
    tiny_dense_layers: int = 0

    @property
    def name(self) -> str:
        return self.model_types[0]

    @property
    def router_pattern(self) -> re.Pattern[str]:
        """The qualified module name of a router: group 1 is its decoder layer index."""
        blocks = "|".join(map(re.escape, self.blocks))
        return re.compile(rf"(?:^|\.)layers\.(\d+)\.(?:{blocks})\.{re.escape(self.router)}$")
