"""A kernel switch on every MoE layer, forced routing, and dummy-weight models at preset shapes.

Legend for shapes: ``n`` tokens of one forward call, ``L`` MoE layers, ``m`` slots, ``N``
experts, ``h`` hidden size, ``I`` expert width, ``T`` rows of a forcing table.

**Kernel switch** (paper 002 Section 4 and Appendix E: "one switch that sends small
verification passes to its deduplicating expert kernel"). transformers 5 dispatches every MoE
experts module through ``config._experts_implementation`` (``transformers.integrations.moe``).
:class:`KernelSwitch` registers one implementation, ``"specmoe"``, that picks a kernel of
:mod:`specmoe.kernels` per call from the pass size n (the rows of the call; batch one):

``per_slot``   the per-slot kernel at 1 <= n <= ``max_pass`` ("deduplication off");
``dedup``      the per-slot kernel at n = 1, the deduplicating kernel at 2 <= n <= ``max_pass``
               ("deduplication on"; a one-token pass runs the same kernel either way);
``auto``       the deduplicating kernel from the crossover pass size c on (c <= n <=
               ``max_pass``), the per-slot kernel below it (c given as ``crossover`` or read
               from a plan's ``crossover``; no crossover: per-slot everywhere).

Calls with n > ``max_pass`` (the prefill) run the implementation the model had before the
switch (transformers' ``grouped_mm`` or eager loop), the same under every setting, so both
settings start their passes from the same KV cache. ``prefill="skip"`` instead returns zero
expert output on those calls: only for dummy weights, whose prefill exists to fill the KV cache
to the context depth.

Weight layouts: OLMoE, Qwen-MoE, Mixtral and DeepSeek store ``gate_up_proj [N, 2I, h]`` and
``down_proj [N, h, I]``, the kernels' own layout, used in place. gpt-oss's transposed,
interleaved tensors are converted once (:func:`specmoe.kernels._contract.from_gpt_oss_layout`)
and cached. Expert weights in another dtype than the activations (a dummy model's bf16 experts
beside fp32 dense layers) get the activations cast to the weights' dtype and the output cast
back.

**Forced routing** (paper 003 Section 8: real kernels, dummy weights, routing from elsewhere).
:class:`ForcedRouting` hooks every router (before any other hook) and replaces its ids by rows
of a table ``[T, L, m]`` (a recorded or synthetic trace): the token at absolute position p takes
row ``p mod T``, MoE layer j takes the table's layer ``j mod L_table``. The router weights of
the forced ids are what the family's rule gives those experts from the router's own logits
(:func:`forced_weights`, the same :func:`specmoe.engine.families.route_logits` that captures
routing): softmax over N gathered at the ids (renormalised iff ``norm_topk_prob``) for
OLMoE/Qwen, softmax over the m forced logits for Mixtral and gpt-oss, DeepSeek's scores times
its scaling. The router still runs, so its cost stays in the pass.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from specmoe.engine.families import route_logits, rule_for
from specmoe.engine.models import family_of, moe_experts, moe_layers
from specmoe.errors import InputError

__all__ = [
    "IMPLEMENTATION",
    "KERNEL_SETTINGS",
    "ForcedRouting",
    "KernelPolicy",
    "KernelSwitch",
    "crossover_from_plan",
    "dummy_model",
    "forced_weights",
    "parse_dummy",
]

IMPLEMENTATION = "specmoe"
KERNEL_SETTINGS = ("per_slot", "dedup", "auto")
_OWNER = "_specmoe_switch"


# ------------------------------------------------------------------------------------------
# Which kernel runs a pass of n tokens


@dataclass(frozen=True)
class KernelPolicy:
    """The kernel setting: ``per_slot``, ``dedup`` or ``auto`` (dedup from ``crossover``)."""

    setting: str = "per_slot"
    crossover: int | None = None
    max_pass: int = 16

    def __post_init__(self) -> None:
        if self.setting not in KERNEL_SETTINGS:
            raise InputError(
                f"{self.setting!r} is unknown (choose from {', '.join(KERNEL_SETTINGS)})",
                argument="setting",
            )
        if self.crossover is not None and (
            isinstance(self.crossover, bool) or int(self.crossover) < 1
        ):
            raise InputError(
                f"must be a positive pass size, got {self.crossover!r}", argument="crossover"
            )
        if self.max_pass < 1:
            raise InputError(f"must be positive, got {self.max_pass}", argument="max_pass")

    def kernel_for(self, n: int) -> str:
        """``per_slot``, ``dedup`` or ``prefill`` for a call of n tokens."""
        if n > self.max_pass:
            return "prefill"
        if self.setting == "per_slot":
            return "per_slot"
        start = 2 if self.setting == "dedup" else self.crossover
        return "dedup" if start is not None and n >= max(start, 2) else "per_slot"

    @property
    def label(self) -> str:
        if self.setting == "auto":
            return f"auto@{self.crossover}" if self.crossover is not None else "auto@none"
        return self.setting


def crossover_from_plan(plan: str | os.PathLike) -> int | None:
    """The ``crossover`` of the plan.json ``plan`` (the file or its folder, written by
    ``specmoe plan``); None where the plan has none. Errors name the argument ``plan``."""
    from specmoe.cost.plan import read_plan

    c = read_plan(plan, fields=("crossover",))["crossover"]  # its errors name ``plan``
    if c is None:
        return None
    if isinstance(c, bool) or not isinstance(c, int | float) or int(c) != c or c < 1:
        raise InputError(f"{plan}: crossover {c!r} is not a positive pass size", argument="plan")
    return int(c)


# ------------------------------------------------------------------------------------------
# The switch


def _register() -> None:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

    if IMPLEMENTATION not in ALL_EXPERTS_FUNCTIONS:
        ExpertsInterface.register(IMPLEMENTATION, _switched_forward)


def _original_forward(module: Any) -> Any:
    fwd = type(module).forward
    return getattr(fwd, "__wrapped__", fwd)


def _switched_forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    switch = getattr(self, _OWNER, None)
    if switch is None:  # a module of a model without an installed switch
        return _original_forward(self)(self, hidden_states, top_k_index, top_k_weights)
    return switch._forward(self, hidden_states, top_k_index, top_k_weights)


class KernelSwitch:
    """The kernel switch on every MoE layer of ``model``; a context manager.

    ``policy`` may be changed between forward calls (:meth:`set_policy`). ``calls`` counts the
    layer calls each kernel ran (``per_slot``, ``dedup``, ``prefill``).
    """

    def __init__(self, model: Any, policy: KernelPolicy | None = None, *, prefill: str = "model"):
        if prefill not in ("model", "skip"):
            raise InputError(f"prefill: {prefill!r} must be 'model' or 'skip'")
        self.model = model
        self.policy = policy or KernelPolicy()
        self.prefill = prefill
        self.experts = moe_experts(model)
        self.calls: Counter[str] = Counter()
        self._previous: str | None = None
        self._layouts: dict[int, tuple[Any, ...]] = {}
        self._activation = self._check_activation(model.config)

    @staticmethod
    def _check_activation(cfg: Any) -> str:
        """The kernels' activation for the family's experts (``Family.activation``)."""
        if family_of(cfg).activation == "swiglu_oai":
            from specmoe.kernels._contract import OAI_ALPHA, OAI_LIMIT

            alpha = float(getattr(cfg, "swiglu_alpha", OAI_ALPHA) or OAI_ALPHA)
            limit = float(getattr(cfg, "swiglu_limit", OAI_LIMIT) or OAI_LIMIT)
            if abs(alpha - OAI_ALPHA) > 1e-6 or abs(limit - OAI_LIMIT) > 1e-6:
                raise InputError(
                    f"{cfg.model_type} swiglu_alpha={alpha}, swiglu_limit={limit}: the "
                    f"kernels implement {OAI_ALPHA} and {OAI_LIMIT} only"
                )
            return "swiglu_oai"
        act = str(getattr(cfg, "hidden_act", "silu"))
        if act not in ("silu", "swish"):
            raise InputError(
                f"model hidden_act {act!r}: the expert kernels implement SwiGLU (silu) only"
            )
        return "swiglu"

    def set_policy(self, policy: KernelPolicy) -> None:
        self.policy = policy

    def install(self) -> KernelSwitch:
        if self._previous is not None:
            return self
        _register()
        for ex in self.experts:
            if getattr(ex, "has_post_expert_norm", False):
                raise InputError(f"{type(ex).__name__}: a post-expert norm is not supported")
            owner = getattr(ex, _OWNER, None)
            if owner is not None and owner is not self:
                raise RuntimeError("another KernelSwitch is installed on this model")
            setattr(ex, _OWNER, self)
        cfg = self.model.config
        self._previous = cfg._experts_implementation or "eager"
        if self._previous == IMPLEMENTATION:
            self._previous = "eager"
        cfg._experts_implementation = IMPLEMENTATION
        for ex in self.experts:  # the experts' own config, should it be another object
            if getattr(ex, "config", cfg) is not cfg:
                ex.config._experts_implementation = IMPLEMENTATION
        return self

    def remove(self) -> None:
        if self._previous is None:
            return
        for ex in self.experts:
            if getattr(ex, _OWNER, None) is self:
                delattr(ex, _OWNER)
            if getattr(ex, "config", None) is not None:
                ex.config._experts_implementation = self._previous
        self.model.config._experts_implementation = self._previous
        self._previous = None
        self._layouts.clear()

    def __enter__(self) -> KernelSwitch:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    # -- the dispatch ---------------------------------------------------------------------
    def _weights(self, ex: Any) -> tuple[Any, Any, Any, Any]:
        """``(w_gate_up [N, 2I, h], w_down [N, h, I], b_gate_up, b_down)`` in kernel layout."""
        if not getattr(ex, "is_transposed", False) and getattr(ex, "is_concatenated", True):
            b = getattr(ex, "has_bias", False)
            return (
                ex.gate_up_proj,
                ex.down_proj,
                ex.gate_up_proj_bias if b else None,
                ex.down_proj_bias if b else None,
            )
        key = id(ex)
        version = (ex.gate_up_proj._version, ex.down_proj._version, ex.gate_up_proj.data_ptr())
        cached = self._layouts.get(key)
        if cached is None or cached[0] != version:
            from specmoe.kernels._contract import from_gpt_oss_layout

            if getattr(ex, "is_concatenated", True):
                raise InputError(
                    f"{type(ex).__name__}: transposed concatenated experts are not supported"
                )
            w_gu, w_d, b_gu = from_gpt_oss_layout(
                ex.gate_up_proj.detach(),
                ex.down_proj.detach(),
                getattr(ex, "gate_up_proj_bias", None),
            )
            b_d = getattr(ex, "down_proj_bias", None)
            cached = (version, w_gu, w_d, b_gu, None if b_d is None else b_d.detach())
            self._layouts[key] = cached
        return cached[1:]

    def _forward(self, ex: Any, x: Any, ids: Any, weights: Any) -> Any:
        import torch

        n = int(x.shape[0])
        name = self.policy.kernel_for(n)
        self.calls[name] += 1
        if name == "prefill":
            if self.prefill == "skip":
                return torch.zeros_like(x)
            from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

            fn = (
                ALL_EXPERTS_FUNCTIONS[self._previous]
                if self._previous in ALL_EXPERTS_FUNCTIONS
                else _original_forward(ex)
            )
            return fn(ex, x, ids, weights)
        from specmoe.kernels import get_kernel

        w_gu, w_d, b_gu, b_d = self._weights(ex)
        kernel = get_kernel(name, x.device.type)
        xin = x if x.dtype == w_gu.dtype else x.to(w_gu.dtype)
        bgu = None if b_gu is None else b_gu.to(w_gu.dtype)
        bd = None if b_d is None else b_d.to(w_gu.dtype)
        y = kernel(
            xin,
            w_gu,
            w_d,
            ids,
            weights,
            activation=self._activation,
            b_gate_up=bgu,
            b_down=bd,
            check=False,
        )
        return y.to(x.dtype)


# ------------------------------------------------------------------------------------------
# Forced routing


def forced_weights(logits: Any, ids: Any, rule: Any, *, correction_bias: Any = None) -> Any:
    """Router weights ``[n, m]`` of forced ``ids`` ``[n, m]`` under a family's rule.

    The weights the rule gives those experts had it chosen them from these logits ``[n, N]``:
    :func:`specmoe.engine.families.route_logits` with the ids given.
    """
    return route_logits(logits, rule, correction_bias=correction_bias, ids=ids)[1]


class ForcedRouting:
    """Replace every router's chosen ids by rows of ``table`` ``[T, L_table, m]``.

    A call of n tokens whose first token sits at absolute position ``position`` takes rows
    ``(offset + position + 0..n-1) mod T``; after the last MoE layer's call ``position``
    advances by n, so plain decoding needs no bookkeeping. An engine that crops its KV cache
    sets ``position`` to the cache length before each forward call. ``offset`` is the row of
    position 0 (:meth:`use_document` sets it to a document's first row). Batch one only.
    """

    def __init__(
        self,
        model: Any,
        table: np.ndarray,
        *,
        doc_offsets: Any = None,
        documents: list[str] | None = None,
        name: str = "forced routing",
    ):
        table = np.asarray(table)
        if table.ndim != 3 or table.shape[0] < 1 or table.shape[1] < 1:
            raise InputError(f"{name}: expected expert ids [T, L, m], got shape {table.shape}")
        if not np.issubdtype(table.dtype, np.integer):
            raise InputError(f"{name}: expert ids must be integers, got {table.dtype}")
        self.model = model
        self.name = name
        self.routers = moe_layers(model)
        self.rule = rule_for(model)
        n_exp = int(self.routers[0][1].weight.shape[0])
        if table.shape[2] != self.rule.top_k:
            raise InputError(
                f"{name}: {table.shape[2]} experts per token, the model routes "
                f"to m={self.rule.top_k}"
            )
        if table.min() < 0 or table.max() >= n_exp:
            raise InputError(
                f"{name}: expert ids outside [0, {n_exp}) of the model (max {int(table.max())})"
            )
        self.table = table.astype(np.int64)  # [T, L_table, m]
        self.doc_offsets = (
            np.array([0, len(table)], dtype=np.int64)
            if doc_offsets is None
            else np.asarray(doc_offsets, dtype=np.int64)
        )
        self.documents = list(documents or [])
        self.offset = 0
        self.position = 0
        self._handles: list[Any] = []
        self._last = len(self.routers) - 1

    @classmethod
    def from_trace(cls, model: Any, trace: Any) -> ForcedRouting:
        """Force a :class:`specmoe.formats.trace.RoutingTrace`'s routing."""
        return cls(
            model,
            np.asarray(trace.experts),
            doc_offsets=trace.doc_offsets,
            documents=list(trace.meta.get("documents") or []),
            name=trace.name,
        )

    def use_document(self, document: int | str) -> int:
        """Start position 0 at a document's first row (by name, else index mod D); the rows
        run on through the following documents and wrap around. Returns the index."""
        if isinstance(document, str):
            if document not in self.documents:
                raise InputError(f"{self.name}: no document named {document!r}")
            d = self.documents.index(document)
        else:
            d = int(document) % (len(self.doc_offsets) - 1)
        self.offset = int(self.doc_offsets[d])
        self.position = 0
        return d

    def rows(self, n: int) -> np.ndarray:
        """The forced ids ``[n, L_table, m]`` of the next call of n tokens."""
        idx = (self.offset + self.position + np.arange(n)) % self.table.shape[0]
        return self.table[idx]

    def _hook(self, pos: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> Any:
            import torch

            layout = self.rule.family.router_output  # e.g. (logits, weights, ids)
            if not isinstance(output, tuple) or len(output) != len(layout):
                raise RuntimeError(
                    f"router {type(module).__name__} does not return "
                    f"({', '.join(layout)}); forced routing needs transformers 5"
                )
            named = dict(zip(layout, output))
            logits, weights, ids = named["logits"], named["weights"], named["ids"]
            n = int(ids.reshape(-1, ids.shape[-1]).shape[0])
            forced = self.rows(n)[:, pos % self.table.shape[1]]  # [n, m]
            new_ids = torch.as_tensor(forced, device=ids.device).to(ids.dtype).reshape(ids.shape)
            new_w = forced_weights(
                logits,
                new_ids.reshape(n, -1),
                self.rule,
                correction_bias=self.rule.correction_bias(module),
            )
            if pos == self._last:
                self.position += n
            named.update(weights=new_w.to(weights.dtype).reshape(weights.shape), ids=new_ids)
            return tuple(named[key] for key in layout)

        return hook

    def install(self) -> ForcedRouting:
        if not self._handles:
            for pos, (_, module) in enumerate(self.routers):
                self._handles.append(module.register_forward_hook(self._hook(pos), prepend=True))
        return self

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> ForcedRouting:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.remove()


# ------------------------------------------------------------------------------------------
# Dummy-weight models at a preset's shapes


def parse_dummy(model: str) -> str | None:
    """The preset name of a ``model`` named ``PRESET-dummy`` (case-insensitive), else None."""
    from specmoe.spec import PRESET_CONFIGS

    if not model.lower().endswith("-dummy"):
        return None
    base = model[: -len("-dummy")].lower()
    names = {k.lower(): k for k in PRESET_CONFIGS}
    if base not in names:
        raise InputError(
            f"{model}: no preset {model[: -len('-dummy')]!r} (choose from "
            f"{', '.join(k + '-dummy' for k in PRESET_CONFIGS)})",
            argument="model",
        )
    return names[base]


def dummy_model(
    preset: str,
    *,
    layers: int | None = None,
    expert_dtype: str = "bfloat16",
    seed: int = 0,
    std: float = 0.02,
    context: int = 4096,
) -> Any:
    """A model of ``preset``'s transformers class and shapes with seeded random weights.

    ``layers`` decoder layers (default all). Expert weights are stored in ``expert_dtype``
    (the checkpoint's bf16 by default: real expert bytes), every other weight in float32 (on a
    CPU without bf16 matrix units a bf16 GEMM is two orders of magnitude slower than fp32).
    Weights are N(0, std²), norms 1, biases 0; the routers are random too, and their choice is
    meant to be replaced by :class:`ForcedRouting`.
    """
    import torch
    import transformers
    from transformers.initialization import no_init_weights

    from specmoe.spec import PRESET_CONFIGS

    key = parse_dummy(preset if preset.lower().endswith("-dummy") else preset + "-dummy")
    cfg = {
        k: v for k, v in PRESET_CONFIGS[key].items() if not k.startswith("_") and k != "torch_dtype"
    }
    family = family_of(cfg)
    if layers is not None:
        if layers < 1 or layers > int(cfg["num_hidden_layers"]):
            raise InputError(
                f"must be in 1..{cfg['num_hidden_layers']} for {key}, got {layers}",
                argument="layers",
            )
        cfg["num_hidden_layers"] = int(layers)
    cfg.setdefault("max_position_embeddings", context)
    cfg["max_position_embeddings"] = max(int(cfg["max_position_embeddings"]), context)
    cfg.pop("model_type")
    config = getattr(transformers, family.config_class)(**cfg)
    config._name_or_path = f"{key}-dummy"
    wdt = getattr(torch, expert_dtype)
    gen = torch.Generator().manual_seed(seed)
    with no_init_weights():  # parameters allocated, not written: no memory touched yet
        net = getattr(transformers, family.class_name)(config)
    experts = {id(e) for e in moe_experts(net)}
    with torch.no_grad():
        for module in net.modules():
            is_experts = id(module) in experts
            is_norm = "norm" in type(module).__name__.lower()
            for pname, p in list(module.named_parameters(recurse=False)):
                q = torch.empty(p.shape, dtype=wdt) if is_experts else p
                if is_norm and pname == "weight":
                    q.fill_(1.0)
                elif "bias" in pname:
                    q.zero_()
                else:
                    q.normal_(0.0, std, generator=gen)
                if is_experts:
                    setattr(module, pname, torch.nn.Parameter(q, requires_grad=False))
    net.requires_grad_(False)
    net.eval()
    return net
