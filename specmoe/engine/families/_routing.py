"""Each family's routing rule applied to router logits, and the reading of a router's output.

Legend for shapes: ``n`` tokens, ``N`` experts, ``m`` experts per token, ``G`` expert groups.

:func:`route_logits` is the one implementation of every :class:`~._base.Routing`: it picks the
m experts of each token (capture of a router that returns logits only) or, given forced ids,
computes the weights the rule gives them (forced routing). torch is imported inside the
functions, so importing this module is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specmoe.engine.families._base import Family, Routing

__all__ = ["RouterRule", "parse_router_output", "route_logits", "rule_for"]


@dataclass(frozen=True)
class RouterRule:
    """A family's :class:`Routing` with the numbers of one model's config filled in."""

    family: Family
    top_k: int  # m
    renormalise: bool = False  # divide the m weights by their sum
    grouped: bool = False  # the group limit is on
    n_group: int = 1
    topk_group: int = 1
    scaling: float = 1.0  # routed_scaling_factor (1 where the family is not scaled)

    @property
    def routing(self) -> Routing:
        return self.family.routing

    def correction_bias(self, router: Any) -> Any:
        """The router's correction bias ``[N]`` where the family has one, else None."""
        attr = self.routing.correction_bias
        return None if attr is None else getattr(router, attr, None)


def rule_for(model_or_config: Any) -> RouterRule:
    """The selection rule of a loaded model (or of its config), read from the config."""
    from specmoe.engine.families import family_of

    cfg = getattr(model_or_config, "config", model_or_config)
    family = family_of(cfg)
    r = family.routing
    gate = r.groups_if
    grouped = r.groups != "none" and (gate is None or getattr(cfg, gate[0], None) == gate[1])
    return RouterRule(
        family=family,
        top_k=int(cfg.num_experts_per_tok),
        renormalise=r.renormalise == "config" and bool(getattr(cfg, "norm_topk_prob", False)),
        grouped=grouped,
        n_group=int(getattr(cfg, "n_group", None) or 1),
        topk_group=int(getattr(cfg, "topk_group", None) or 1),
        scaling=float(getattr(cfg, "routed_scaling_factor", None) or 1.0) if r.scaled else 1.0,
    )


def _group_mask(choice: Any, rule: RouterRule) -> Any:
    """Keep the ``topk_group`` of ``n_group`` expert groups; the others' scores set to -inf."""
    import torch

    n, n_exp = choice.shape
    grouped = choice.view(n, rule.n_group, n_exp // rule.n_group)  # [n, G, N/G]
    if rule.routing.groups == "top2":
        gscore = grouped.topk(2, dim=-1).values.sum(-1)
    else:
        gscore = grouped.max(-1).values
    keep = torch.zeros_like(gscore, dtype=torch.bool)
    keep.scatter_(1, gscore.topk(rule.topk_group, dim=-1).indices, True)
    keep = keep.unsqueeze(-1).expand_as(grouped).reshape(n, n_exp)
    return choice.masked_fill(~keep, float("-inf"))


def route_logits(
    logits: Any, rule: RouterRule, *, correction_bias: Any = None, ids: Any = None
) -> tuple[Any, Any]:
    """A family's rule on router logits ``[n, N]``: ``(ids [n, m], weights [n, m])``.

    Without ``ids`` the rule chooses them; with forced ``ids [n, m]`` it only weights them, as
    it would had it chosen them (the correction bias plays no part in weights). The rules
    (:class:`~specmoe.engine.families._base.Routing`):

    ``score_then_topk``    s = softmax(z) or sigmoid(z); ids = top-m of s (+ correction bias),
                           within the kept groups when grouped; w = s[ids], / Σ w iff
                           renormalised, × scaling (OLMoE, Qwen2/3-MoE, DeepSeek-V2/V3).
    ``topk_then_softmax``  ids = top-m of z; w = softmax(z[ids]) (Mixtral, gpt-oss).
    """
    import torch

    z = logits.reshape(-1, logits.shape[-1]).float()
    r = rule.routing
    if r.order == "topk_then_softmax":
        ids = z.topk(rule.top_k, dim=-1).indices if ids is None else ids.long()
        return ids, torch.softmax(z.gather(1, ids), dim=-1)
    s = torch.softmax(z, dim=-1) if r.score == "softmax" else torch.sigmoid(z)
    if ids is None:
        biased = correction_bias is not None and r.correction_bias is not None
        choice = s + correction_bias.float() if biased else s
        if rule.grouped:
            choice = _group_mask(choice, rule)
        ids = choice.topk(rule.top_k, dim=-1).indices
    else:
        ids = ids.long()
    w = s.gather(1, ids)
    if rule.renormalise:
        total = w.sum(-1, keepdim=True)
        w = w / (total + r.renorm_eps if r.renorm_eps else total)
    if r.scaled:
        w = w * rule.scaling
    return ids, w


def parse_router_output(output: Any, module: Any, rule: RouterRule) -> tuple[Any, Any]:
    """``(ids [n, m], weights [n, m] or None)`` from whatever a router's forward returned.

    The family's own layout (``Family.router_output``) is read by name; any other output is
    searched: integer ids ``[.., m]`` with the floats of the same size as their weights (or
    scores scattered over N, as older gpt-oss returned), else logits ``[n, N]`` through
    :func:`route_logits`.
    """
    import torch

    k = rule.top_k
    layout = rule.family.router_output
    if isinstance(output, tuple) and len(output) == len(layout):
        named = dict(zip(layout, output))
        ids, w = named.get("ids"), named.get("weights")
        if (
            torch.is_tensor(ids)
            and not ids.is_floating_point()
            and ids.shape[-1] == k
            and torch.is_tensor(w)
            and w.is_floating_point()
            and w.numel() == ids.numel()
        ):
            return ids.reshape(-1, k), w.reshape(-1, k)
    tensors = [
        t for t in (output if isinstance(output, tuple | list) else (output,)) if torch.is_tensor(t)
    ]
    ids = next((t for t in tensors if not t.is_floating_point() and t.shape[-1] == k), None)
    if ids is not None:  # the router says which experts it chose
        ids = ids.reshape(-1, k)
        same = [t for t in tensors if t.is_floating_point() and t.numel() == ids.numel()]
        if same:
            return ids, same[-1].reshape(-1, k)
        n_exp = module.weight.shape[0]
        dense = [t for t in tensors[1:] if t.is_floating_point() and t.shape[-1] == n_exp]
        if dense:  # per-expert scores scattered over N (older gpt-oss)
            return ids, dense[-1].reshape(-1, n_exp).gather(1, ids)
        return ids, None
    logits = next((t for t in tensors if t.is_floating_point()), None)
    if logits is None or logits.shape[-1] != module.weight.shape[0]:
        raise RuntimeError(
            f"router {type(module).__name__} returned neither expert ids nor [n, N] logits"
        )
    return route_logits(logits, rule, correction_bias=rule.correction_bias(module))
