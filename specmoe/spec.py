"""Model specs: the shapes and byte counts of an MoE model that the cost model needs.

A :class:`ModelSpec` holds N experts, m per token, the MoE layers, the expert shapes and the
bytes per weight; it derives the bytes of one expert ``w_l``, their sum ``W`` over the MoE
layers, the dense bytes ``D`` read once per pass whatever the routing, and the key-value bytes
per token (paper 002 Section 1, "Bytes").

Presets are plain HF-config dicts copied from each model's public ``config.json`` (the source is
named in each), read through the same tolerant :meth:`ModelSpec.from_hf_config` as a local
model's config.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specmoe.errors import InputError

# Bytes per weight. A block-quantised format counts its scales: q8_0 is 32 int8 weights and one
# fp16 scale per block (34 bytes per 32), q4_k_m llama.cpp's 4.5 bits, mxfp4 32 fp4 weights and
# one e8m0 scale per block (4.25 bits), int4 4-bit weights and one bf16 scale per group of 128
# (4.125 bits, the GPTQ/AWQ default group). fp8 (e4m3 or e5m2) has one scale per tensor or per
# output channel: 1 byte per weight (the scales are below 0.1% of it).
DTYPE_BYTES: dict[str, float] = {
    "float32": 4.0,
    "fp32": 4.0,
    "bfloat16": 2.0,
    "bf16": 2.0,
    "float16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "float8_e4m3fn": 1.0,
    "float8_e5m2": 1.0,
    "int8": 1.0,
    "q8_0": 34 / 32,
    "q4_k_m": 4.5 / 8,
    "mxfp4": 4.25 / 8,
    "int4": 4.125 / 8,
}


def dtype_bytes(dtype: str | float, *, argument: str = "dtype") -> float:
    """Bytes per weight of a dtype name (:data:`DTYPE_BYTES`, case-insensitive) or a number;
    an unknown name, or a number that is not finite and positive, is an ``InputError`` that
    lists the valid names and carries ``argument``."""
    if isinstance(dtype, str):
        bpw = DTYPE_BYTES.get(dtype.lower())
        if bpw is None:
            raise InputError(
                f"unknown dtype {dtype!r} (choose from {', '.join(DTYPE_BYTES)}, or give bytes "
                "per weight)",
                argument=argument,
            )
        return bpw
    if isinstance(dtype, bool) or not isinstance(dtype, int | float) or not 0 < dtype < 1e3:
        raise InputError(
            f"bytes per weight must be a finite positive number, got {dtype!r:.40}",
            argument=argument,
        )
    return float(dtype)


@dataclass(frozen=True)
class ModelSpec:
    """Shapes and bytes of one MoE model.

    Expert bytes (paper 002 Section 1): one expert of MoE layer l holds its gate, up and down
    projections, ``3·hidden·inter`` weights (plus biases where the model has them), so
    ``w_l = expert_params · bytes_per_weight`` and ``W = Σ_l w_l``. Dense bytes ``D`` count every
    weight read once per pass whatever the routing: attention, routers, shared experts, dense
    MLP layers and the LM head (plus one embedding row per token, neglected).
    """

    name: str
    num_experts: int  # N
    top_k: int  # m
    num_moe_layers: int  # L
    hidden_size: int
    expert_intermediate: int
    bytes_per_weight: float = 2.0
    dense_params: int = 0  # weights read once per pass
    kv_elements_per_token: int = 0
    activation: str = "swiglu"  # "swiglu" or "swiglu_oai" (gpt-oss's clamped variant)
    expert_bias: bool = False
    num_shared_experts: int = 0
    num_hidden_layers: int = 0  # all decoder layers (dense ones included)
    vocab_size: int = 0
    moe_layer_indices: tuple[int, ...] = ()
    source: str = ""
    # derived
    expert_params: int = field(init=False)

    def __post_init__(self) -> None:
        for fname in (
            "num_experts",
            "top_k",
            "num_moe_layers",
            "hidden_size",
            "expert_intermediate",
        ):
            v = getattr(self, fname)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(
                    f"model spec {self.name!r}: {fname} must be a positive integer, got {v!r}"
                )
        if not self.top_k < self.num_experts:
            raise InputError(
                f"model spec {self.name!r}: top_k={self.top_k} must be below "
                f"num_experts={self.num_experts}"
            )
        if not 0 < self.bytes_per_weight < 1e3:  # NaN and inf fail too
            raise InputError(f"model spec {self.name!r}: bytes_per_weight must be positive")
        if self.activation not in ("swiglu", "swiglu_oai"):
            raise InputError(
                f"model spec {self.name!r}: unknown activation "
                f"{self.activation!r} (choose swiglu or swiglu_oai)"
            )
        params = 3 * self.hidden_size * self.expert_intermediate
        if self.expert_bias:
            params += 2 * self.expert_intermediate + self.hidden_size
        object.__setattr__(self, "expert_params", params)
        if not self.moe_layer_indices:
            object.__setattr__(self, "moe_layer_indices", tuple(range(self.num_moe_layers)))
        if not self.num_hidden_layers:
            object.__setattr__(self, "num_hidden_layers", self.num_moe_layers)

    # bytes -------------------------------------------------------------------------------
    @property
    def expert_bytes(self) -> float:
        """w_l: bytes of one expert (equal in every MoE layer of the supported models)."""
        return self.expert_params * self.bytes_per_weight

    @property
    def layer_expert_bytes(self) -> list[float]:
        """[w_1, ..., w_L]."""
        return [self.expert_bytes] * self.num_moe_layers

    @property
    def total_expert_bytes(self) -> float:
        """W = Σ_l w_l."""
        return self.expert_bytes * self.num_moe_layers

    @property
    def dense_bytes(self) -> float:
        """D: bytes read once per pass whatever the routing."""
        return self.dense_params * self.bytes_per_weight

    @property
    def kv_bytes_per_token(self) -> float:
        return self.kv_elements_per_token * self.bytes_per_weight

    @property
    def q(self) -> float:
        """q = 1 − m/N, the uniform-routing miss probability."""
        return 1.0 - self.top_k / self.num_experts

    # variants ----------------------------------------------------------------------------
    def with_dtype(self, dtype: str | float) -> ModelSpec:
        """The same model stored at another precision (a dtype name or bytes per weight)."""
        return dataclasses.replace(self, bytes_per_weight=dtype_bytes(dtype))

    def with_layers(self, num_moe_layers: int) -> ModelSpec:
        """The first ``num_moe_layers`` MoE layers only (a CPU-sized copy of a preset)."""
        if not 1 <= num_moe_layers <= self.num_moe_layers:
            raise InputError(f"layers must be in 1..{self.num_moe_layers}, got {num_moe_layers}")
        frac = num_moe_layers / self.num_moe_layers
        return dataclasses.replace(
            self,
            num_moe_layers=num_moe_layers,
            moe_layer_indices=self.moe_layer_indices[:num_moe_layers],
            num_hidden_layers=max(1, round(self.num_hidden_layers * frac)),
            kv_elements_per_token=round(self.kv_elements_per_token * frac),
            name=f"{self.name}[{num_moe_layers} layers]",
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(
            expert_bytes=self.expert_bytes,
            total_expert_bytes=self.total_expert_bytes,
            dense_bytes=self.dense_bytes,
            kv_bytes_per_token=self.kv_bytes_per_token,
        )
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        kw = {k: v for k, v in d.items() if k in names}
        if "moe_layer_indices" in kw:
            kw["moe_layer_indices"] = tuple(kw["moe_layer_indices"])
        return cls(**kw)

    # HF configs --------------------------------------------------------------------------
    @classmethod
    def from_hf_config(
        cls,
        config: dict[str, Any] | str | os.PathLike,
        *,
        name: str | None = None,
        dtype: str | float | None = None,
        source: str = "",
    ) -> ModelSpec:
        """Build a spec from an HF ``config.json`` (a dict, the file, or its directory).

        Tolerant of the key names of OLMoE, Qwen2/3-MoE, Mixtral, gpt-oss and DeepSeek-V2/V3
        (and of other MoE configs that use them); the expert activation and biases are the
        family's (:mod:`specmoe.engine.families`).
        """
        if not isinstance(config, dict):
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            from specmoe.formats._common import read_json_capped

            config = read_json_capped(path, "HF config")
            if not isinstance(config, dict):
                raise InputError(f"{path}: config must be a JSON object")
            source = source or str(path)
        return _spec_from_config(config, name=name, dtype=dtype, source=source)


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


class _Fields:
    """Typed reads of an HF config's fields; a bad one is an ``InputError`` naming ``where``
    (the file, or the config's name) and the field."""

    def __init__(self, cfg: dict[str, Any], where: str):
        self.cfg, self.where = cfg, where

    def int(self, *keys: str, default: Any = None, low: int = 1) -> Any:
        for k in keys:
            v = self.cfg.get(k)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int) or not low <= v < 1 << 40:
                    kind = "a positive" if low == 1 else "a non-negative"
                    raise InputError(
                        f"{self.where}: config field {k!r} must be {kind} integer, got {v!r:.40}"
                    )
                return v
        return default

    def ints(self, key: str) -> list[int]:
        v = self.cfg.get(key) or []
        if not isinstance(v, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v
        ):
            raise InputError(
                f"{self.where}: config field {key!r} must be a list of layer indices, got {v!r:.40}"
            )
        return v


def _expert_mlp(model_type: str) -> tuple[str, bool]:
    """``(activation, expert_bias)`` of a family's experts; SwiGLU without biases for a
    model_type that specmoe has no family file for.

    The facts are the family's (:mod:`specmoe.engine.families`, plain data that imports
    neither torch nor transformers).
    """
    from specmoe.engine.families import FAMILIES

    family = FAMILIES.get(model_type)
    return ("swiglu", False) if family is None else (family.activation, family.expert_bias)


def _spec_from_config(
    cfg: dict[str, Any], *, name: str | None, dtype: str | float | None, source: str
) -> ModelSpec:
    label = name or cfg.get("_name_or_path") or cfg.get("model_type") or "model"
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers
        cfg = {**cfg["text_config"], **{k: v for k, v in cfg.items() if k != "text_config"}}
    where = source or f"config {label!r}"
    f = _Fields(cfg, where)
    n_exp = f.int("num_experts", "n_routed_experts", "num_local_experts")
    top_k = f.int("num_experts_per_tok", "num_experts_per_token", "moe_top_k", "top_k")
    hidden = f.int("hidden_size", "d_model")
    n_layers = f.int("num_hidden_layers", "num_layers", "n_layer")
    inter = f.int("moe_intermediate_size", "expert_intermediate_size", "intermediate_size")
    missing = [
        k
        for k, v in (
            ("num_experts", n_exp),
            ("num_experts_per_tok", top_k),
            ("hidden_size", hidden),
            ("num_hidden_layers", n_layers),
            ("intermediate_size", inter),
        )
        if v is None
    ]
    if missing:
        raise InputError(f"{where}: not an MoE config, missing {', '.join(missing)}")
    if not top_k < n_exp:
        raise InputError(
            f"{where}: config field 'num_experts_per_tok' ({top_k}) must be below the number "
            f"of experts ({n_exp})"
        )
    model_type = str(cfg.get("model_type", ""))
    dense_inter = f.int("intermediate_size", default=inter)
    # Which decoder layers are MoE.
    first_dense = f.int("first_k_dense_replace", default=0, low=0)
    step = f.int("decoder_sparse_step", "moe_layer_freq", default=1, low=0) or 1
    mlp_only = set(f.ints("mlp_only_layers"))
    moe_idx = tuple(
        i for i in range(n_layers) if i >= first_dense and (i + 1) % step == 0 and i not in mlp_only
    )
    if not moe_idx:
        raise InputError(f"{where}: no MoE layers")
    heads = f.int("num_attention_heads", "n_head", default=1)
    kv_heads = f.int("num_key_value_heads", default=heads)
    head_dim = f.int("head_dim", default=max(1, hidden // heads))
    vocab = f.int("vocab_size", default=0, low=0)
    # Attention weights per layer.
    if cfg.get("kv_lora_rank"):  # DeepSeek multi-head latent attention
        rope = f.int("qk_rope_head_dim", default=64)
        nope = f.int("qk_nope_head_dim", default=128)
        v_dim = f.int("v_head_dim", default=128)
        kv_rank = f.int("kv_lora_rank")
        q_rank = f.int("q_lora_rank")
        q_out = heads * (nope + rope)
        q_params = hidden * q_out if not q_rank else hidden * q_rank + q_rank * q_out
        attn = (
            q_params
            + hidden * (kv_rank + rope)
            + kv_rank * heads * (nope + v_dim)
            + heads * v_dim * hidden
        )
        kv_per_token = n_layers * (kv_rank + rope)
    else:
        attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
        kv_per_token = n_layers * 2 * kv_heads * head_dim
    n_shared = f.int("n_shared_experts", "num_shared_experts", default=0, low=0)
    shared_inter = f.int("shared_expert_intermediate_size", low=0)
    shared_params = 0
    if shared_inter:  # Qwen2-MoE: one shared expert of its own width
        shared_params = 3 * hidden * shared_inter
        n_shared = max(n_shared, 1)
    elif n_shared:
        shared_params = n_shared * 3 * hidden * inter
    router = hidden * n_exp
    n_dense_layers = n_layers - len(moe_idx)
    dense = (
        n_layers * attn
        + len(moe_idx) * (router + shared_params)
        + n_dense_layers * 3 * hidden * dense_inter
        + vocab * hidden
    )  # LM head (tied or not, it is read once per pass)
    activation, expert_bias = _expert_mlp(model_type)
    if dtype is not None:
        bpw = dtype_bytes(dtype)
    else:
        key = next((k for k in ("torch_dtype", "dtype") if cfg.get(k) is not None), None)
        stored = "bfloat16" if key is None or cfg[key] == "auto" else cfg[key]
        if not isinstance(stored, str) or stored.lower() not in DTYPE_BYTES:
            raise InputError(
                f"{where}: config field {key!r} is {stored!r:.40}, not a known dtype "
                f"(choose from {', '.join(DTYPE_BYTES)})"
            )
        bpw = DTYPE_BYTES[stored.lower()]
    return ModelSpec(
        name=str(label),
        num_experts=n_exp,
        top_k=top_k,
        num_moe_layers=len(moe_idx),
        hidden_size=hidden,
        expert_intermediate=inter,
        bytes_per_weight=bpw,
        dense_params=int(dense),
        kv_elements_per_token=int(kv_per_token),
        activation=activation,
        expert_bias=expert_bias,
        num_shared_experts=n_shared,
        num_hidden_layers=n_layers,
        vocab_size=vocab,
        moe_layer_indices=moe_idx,
        source=source,
    )


# ------------------------------------------------------------------------------------------
# Presets: the MoE fields of each model's public config.json on its model page.

_HF = "config.json of the Hugging Face repository "
PRESET_CONFIGS: dict[str, dict[str, Any]] = {
    "OLMoE-1B-7B-0125": {
        "_source": _HF + "allenai/OLMoE-1B-7B-0125",
        "model_type": "olmoe",
        "hidden_size": 2048,
        "intermediate_size": 1024,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "vocab_size": 50304,
        "torch_dtype": "bfloat16",
    },
    "Qwen3-30B-A3B": {
        "_source": _HF + "Qwen/Qwen3-30B-A3B",
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "moe_intermediate_size": 768,
        "intermediate_size": 6144,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": 151936,
        "torch_dtype": "bfloat16",
    },
    "gpt-oss-20b": {
        "_source": _HF + "openai/gpt-oss-20b",
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": 24,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "num_local_experts": 32,
        "num_experts_per_tok": 4,
        "vocab_size": 201088,
        "torch_dtype": "bfloat16",
    },
    "DeepSeek-V2-Lite": {
        "_source": _HF + "deepseek-ai/DeepSeek-V2-Lite",
        "model_type": "deepseek_v2",
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "moe_intermediate_size": 1408,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_experts_per_tok": 6,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "vocab_size": 102400,
        "torch_dtype": "bfloat16",
    },
    "Mixtral-8x7B": {
        "_source": _HF + "mistralai/Mixtral-8x7B-v0.1",
        "model_type": "mixtral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 32000,
        "torch_dtype": "bfloat16",
    },
    "Qwen3-235B-A22B": {
        "_source": _HF + "Qwen/Qwen3-235B-A22B",
        "model_type": "qwen3_moe",
        "hidden_size": 4096,
        "moe_intermediate_size": 1536,
        "intermediate_size": 12288,
        "num_hidden_layers": 94,
        "num_attention_heads": 64,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": 151936,
        "torch_dtype": "bfloat16",
    },
}


def preset_names() -> list[str]:
    return list(PRESET_CONFIGS)


def get_preset(name: str, *, dtype: str | float | None = None) -> ModelSpec:
    """A preset spec by name (case-insensitive); an unknown name lists the valid ones."""
    lookup = {k.lower(): k for k in PRESET_CONFIGS}
    key = lookup.get(name.lower())
    if key is None:
        raise InputError(f"unknown model preset {name!r} (choose from {', '.join(PRESET_CONFIGS)})")
    cfg = PRESET_CONFIGS[key]
    return ModelSpec.from_hf_config(cfg, name=key, dtype=dtype, source=cfg["_source"])


def resolve_spec(model: str | os.PathLike, *, dtype: str | float | None = None) -> ModelSpec:
    """A preset name, a model directory with config.json, a config.json, or a spec JSON."""
    text = os.fspath(model)
    if text.lower() in {k.lower() for k in PRESET_CONFIGS}:
        return get_preset(text, dtype=dtype)
    path = Path(text)
    if not path.exists():
        raise InputError(
            f"{text!r}: neither a preset ({', '.join(PRESET_CONFIGS)}) nor an existing path",
            argument="model",
        )
    if path.is_file() and path.suffix == ".json":
        from specmoe.formats._common import read_json_capped

        data = read_json_capped(path, "model spec", argument="model")
        if isinstance(data, dict) and "expert_intermediate" in data:  # a saved ModelSpec
            spec = ModelSpec.from_dict(data)
            return spec.with_dtype(dtype) if dtype is not None else spec
    return ModelSpec.from_hf_config(path, dtype=dtype)
