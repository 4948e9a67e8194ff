"""Hugging Face MoE families: one file each, behind one registry keyed by ``model_type``.

Legend for shapes: ``n`` tokens, ``N`` experts, ``m`` experts per token, ``H`` hidden size.

Each file declares one :class:`Family` (``FAMILY``): the transformers classes, the routing rule
(:class:`Routing`: softmax or sigmoid scores, top m then renormalise or not, group limits, a
correction bias, a routed scaling factor), where a decoder layer keeps its router and its
experts, what the router's forward returns, the config key of N, the expert activation and
biases, and a tiny random config for tests. The rest of specmoe reads these facts only here:
:mod:`specmoe.engine.models` (loading, router discovery, tiny models),
:mod:`specmoe.engine.capture` (routing capture), :mod:`specmoe.engine.switch` (the kernel
switch and forced routing) and :mod:`specmoe.spec` (activation and expert biases).

The family files and this registry import nothing heavy (torch is imported inside the
functions of :mod:`specmoe.engine.families._routing`), so :mod:`specmoe.spec` may read them without loading torch.

Adding a family (a checklist)
-----------------------------
1. A new file ``specmoe/engine/families/<model_type>.py`` defining ``FAMILY = Family(...)``:
   ``model_types``, ``class_name`` and ``config_class`` (the transformers classes),
   ``routing`` (a :class:`Routing`; compare its rule with the router's ``forward`` in
   ``transformers/models/<model_type>/modeling_<model_type>.py``), ``summary`` (the rule in
   words), ``tiny_config`` (the config of a tiny random model: experts, widths, and what
   else the config needs), and where they differ from the defaults ``blocks``, ``router``,
   ``experts``, ``router_output``, ``num_experts_key``, ``activation``, ``expert_bias``,
   ``shared_experts``, ``tiny_dense_layers``.
2. One registry line: its module name in ``_MODULES`` below.
3. Nothing else. ``tests/test_capture.py`` then checks that the file is registered, that a
   tiny model of the family captures its routing and runs under the kernel switch and forced
   routing, and compares its captured routing and its logits-only rule (:func:`route_logits`)
   with transformers' own router; ``tests/test_speculative.py`` checks causal routing on the
   engine for it.
"""

from __future__ import annotations

import importlib
from typing import Any

from specmoe.engine.families._base import Family, Routing
from specmoe.engine.families._routing import (
    RouterRule,
    parse_router_output,
    route_logits,
    rule_for,
)
from specmoe.errors import InputError

__all__ = [
    "FAMILIES",
    "Family",
    "RouterRule",
    "Routing",
    "family_names",
    "family_of",
    "get_family",
    "parse_router_output",
    "route_logits",
    "rule_for",
]

# The registry: one module of this package per family, in the order they are listed.
_MODULES = ("olmoe", "qwen2_moe", "qwen3_moe", "mixtral", "gpt_oss", "deepseek_v2", "deepseek_v3")


def _load() -> dict[str, Family]:
    found: dict[str, Family] = {}
    for name in _MODULES:
        family = importlib.import_module(f"{__name__}.{name}").FAMILY
        for model_type in family.model_types:
            if model_type in found:
                raise RuntimeError(f"model_type {model_type!r} is declared by two families")
            found[model_type] = family
    return found


FAMILIES: dict[str, Family] = _load()  # model_type -> family


def family_names() -> list[str]:
    """Every supported ``model_type``, sorted."""
    return sorted(FAMILIES)


def get_family(model_type: str) -> Family:
    """The family of a config's ``model_type``; an unknown name lists the supported ones."""
    family = FAMILIES.get(model_type)
    if family is None:
        raise InputError(
            f"{model_type!r} is not a supported MoE family "
            f"(supported: {', '.join(family_names())})",
            argument="model_type",
        )
    return family


def family_of(config: Any) -> Family:
    """The family of a config (an object or a dict with ``model_type``)."""
    model_type = (
        config.get("model_type")
        if isinstance(config, dict)
        else getattr(config, "model_type", None)
    )
    return get_family(model_type)
