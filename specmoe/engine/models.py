"""HF MoE causal language models: load them offline, build tiny random ones, find their routers.

Legend for shapes: ``N`` experts, ``m`` experts per token, ``H`` hidden size, ``V`` vocabulary.

A small registry keyed by the config's ``model_type`` names each supported family, the
transformers class that holds it and the rule its router uses to pick m of N experts (the rules
themselves are implemented in :mod:`specmoe.engine.capture`). In transformers 5 every family
below has a router module (``mlp.gate`` or, for gpt-oss, ``mlp.router``) with an ``[N, H]``
weight whose forward returns ``(logits [n, N], weights [n, m], ids [n, m])``; older releases
used a plain ``nn.Linear`` gate that returns logits only, which the capture handles too.

transformers is imported inside the functions only, so importing this module is cheap.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specmoe.errors import InputError
from specmoe.spec import ModelSpec

__all__ = [
    "FAMILIES",
    "ModelFamily",
    "byte_tokenizer",
    "from_pretrained",
    "load_model",
    "load_tokenizer",
    "model_label",
    "moe_layers",
    "resolve_model_dir",
    "spec_for",
    "tiny_random_model",
]


@dataclass(frozen=True)
class ModelFamily:
    """One supported MoE family: the transformers class and its router's selection rule."""

    model_type: str
    class_name: str  # transformers CausalLM class
    config_class: str  # transformers config class
    rule: str  # selection rule, see specmoe.engine.capture.route_logits
    rule_text: str  # the rule in words


FAMILIES: dict[str, ModelFamily] = {
    f.model_type: f
    for f in (
        ModelFamily(
            "olmoe",
            "OlmoeForCausalLM",
            "OlmoeConfig",
            "softmax_topk",
            "softmax over N, top-m; weights renormalised to sum 1 iff norm_topk_prob",
        ),
        ModelFamily(
            "qwen2_moe",
            "Qwen2MoeForCausalLM",
            "Qwen2MoeConfig",
            "softmax_topk",
            "softmax over N, top-m; weights renormalised iff norm_topk_prob "
            "(the shared expert is dense and not recorded)",
        ),
        ModelFamily(
            "qwen3_moe",
            "Qwen3MoeForCausalLM",
            "Qwen3MoeConfig",
            "softmax_topk",
            "softmax over N, top-m; weights renormalised iff norm_topk_prob",
        ),
        ModelFamily(
            "mixtral",
            "MixtralForCausalLM",
            "MixtralConfig",
            "softmax_topk_norm",
            "softmax over N, top-m, renormalised (= top-m logits, then softmax over m)",
        ),
        ModelFamily(
            "gpt_oss",
            "GptOssForCausalLM",
            "GptOssConfig",
            "topk_softmax",
            "top-m of the biased logits, then softmax over the m",
        ),
        ModelFamily(
            "deepseek_v2",
            "DeepseekV2ForCausalLM",
            "DeepseekV2Config",
            "deepseek_v2",
            "softmax over N; greedy top-m, or group-limited greedy (keep the topk_group "
            "groups of highest max score, then top-m); weights × routed_scaling_factor",
        ),
        ModelFamily(
            "deepseek_v3",
            "DeepseekV3ForCausalLM",
            "DeepseekV3Config",
            "deepseek_v3",
            "sigmoid scores; choose with scores + e_score_correction_bias among the "
            "topk_group groups of highest top-2 sum; weights are the sigmoid scores, "
            "renormalised iff norm_topk_prob, × routed_scaling_factor",
        ),
    )
}

_ROUTER_NAME = re.compile(
    r"(?:^|\.)layers\.(\d+)\.(?:mlp|block_sparse_moe|feed_forward)\.(?:gate|router)$"
)


def _supported() -> str:
    return ", ".join(sorted(FAMILIES))


def family_of(config: Any) -> ModelFamily:
    """The registry entry for a config (object or dict); InputError lists the supported ones."""
    model_type = (
        config.get("model_type")
        if isinstance(config, dict)
        else getattr(config, "model_type", None)
    )
    if model_type not in FAMILIES:
        raise InputError(
            f"model_type {model_type!r} is not a supported MoE family (supported: {_supported()})"
        )
    return FAMILIES[model_type]


# ------------------------------------------------------------------------------------------
# Loading


def resolve_model_dir(model: str | os.PathLike | None = "bundled") -> Path:
    """The directory of ``model``: a local path, or ``"bundled"``/None for the package's own."""
    if model is None or str(model) == "bundled":
        try:
            from specmoe.data import corpus
        except ImportError:
            raise InputError(
                "--model bundled: the bundled model is not installed "
                "(specmoe.data.corpus is missing); pass --model PATH"
            ) from None
        path = Path(corpus.bundled_model_dir())
        if not (path / "config.json").is_file():
            raise InputError(f"--model bundled: no bundled model at {path}; pass --model PATH")
        return path
    path = Path(model)
    if not path.exists():
        raise InputError(f"--model {path}: no such model directory")
    if not path.is_dir():
        raise InputError(f"--model {path}: not a directory (expected an HF model folder)")
    if not (path / "config.json").is_file():
        raise InputError(f"--model {path}: no config.json in the model directory")
    return path


def _read_config(path: Path) -> dict[str, Any]:
    import json

    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path / 'config.json'}: not a readable JSON config ({exc})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path / 'config.json'}: config must be a JSON object")
    return cfg


def load_model(
    model: str | os.PathLike | None = "bundled", *, dtype: str | None = None, device: str = "cpu"
) -> Any:
    """Load an MoE causal LM from a local directory, offline, in eval mode.

    ``dtype`` is a torch dtype name; by default float32 on CPU and the checkpoint's own
    dtype elsewhere.
    """
    import torch
    import transformers

    path = resolve_model_dir(model)
    family = family_of(_read_config(path))
    cls = getattr(transformers, family.class_name)
    if dtype is None:
        torch_dtype: Any = torch.float32 if str(device).startswith("cpu") else "auto"
    else:
        torch_dtype = getattr(torch, dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise InputError(f"--dtype {dtype!r}: not a torch dtype name")
    return from_pretrained(cls, path, dtype=torch_dtype, device=device, option="--model")


def from_pretrained(
    cls: Any, path: str | os.PathLike, *, dtype: Any, device: str, option: str
) -> Any:
    """``cls.from_pretrained`` offline, moved to ``device`` in eval mode; a load failure is
    one ``InputError`` line naming ``option`` and the folder."""
    try:
        net = cls.from_pretrained(path, local_files_only=True, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise InputError(
            f"{option} {path}: cannot load weights "
            f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        ) from None
    net.to(device)
    net.eval()
    return net


def load_tokenizer(model: str | os.PathLike | None = "bundled") -> Any:
    """The tokenizer stored beside a local model, offline."""
    from transformers import AutoTokenizer

    path = resolve_model_dir(model)
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InputError(
            f"--model {path}: no usable tokenizer in the model directory "
            f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        ) from None


def model_label(model: Any) -> str:
    """A short name for a loaded model: its directory name, or its model_type."""
    name = getattr(model.config, "_name_or_path", "") or ""
    return Path(name).name if name else str(model.config.model_type)


def spec_for(model: Any, *, name: str | None = None) -> ModelSpec:
    """The :class:`ModelSpec` of a loaded model, from its HF config."""
    return ModelSpec.from_hf_config(model.config.to_dict(), name=name or model_label(model))


def moe_layers(model: Any) -> list[tuple[int, Any]]:
    """``[(decoder layer index, router module)]`` of every MoE layer, in layer order.

    A router is the ``gate``/``router`` child of a decoder layer's MoE block whose weight is
    ``[N, H]`` (a dense layer's MLP has none; Qwen2-MoE's ``shared_expert_gate`` is ``[1, H]``
    and is not matched by name).
    """
    cfg = model.config
    n_exp = next(
        (
            getattr(cfg, k)
            for k in ("num_experts", "n_routed_experts", "num_local_experts")
            if getattr(cfg, k, None)
        ),
        None,
    )
    found = []
    for qual, module in model.named_modules():
        match = _ROUTER_NAME.search(qual)
        weight = getattr(module, "weight", None)
        if match is None or weight is None or weight.ndim != 2:
            continue
        if n_exp is not None and weight.shape[0] != n_exp:
            continue
        found.append((int(match.group(1)), module))
    found.sort(key=lambda x: x[0])
    if not found:
        raise InputError(f"model {model_label(model)!r}: no MoE router modules found")
    return found


# ------------------------------------------------------------------------------------------
# Tiny random models and a byte-level tokenizer (offline, for tests and demos)

_BYTE_VOCAB = 256
EOS_TOKEN = "<|endoftext|>"


def byte_tokenizer() -> Any:
    """A byte-level tokenizer: one token per UTF-8 byte (ids 0..255) and ``<|endoftext|>``=256.

    Built in memory, so tiny random models have a tokenizer without any download.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # ByteLevel maps byte b to a printable character; order ids by byte value.
    byte_chars = _bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(_BYTE_VOCAB)}
    assert set(vocab) == set(alphabet)
    vocab[EOS_TOKEN] = _BYTE_VOCAB
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what ByteLevel uses)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _tiny_config_kwargs(
    model_type: str,
    *,
    num_experts: int,
    top_k: int,
    num_layers: int,
    hidden: int,
    vocab: int,
    context: int,
) -> dict[str, Any]:
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        intermediate_size=2 * hidden,
        max_position_embeddings=context,
        num_experts_per_tok=top_k,
        initializer_range=0.2,
        tie_word_embeddings=False,
        eos_token_id=_BYTE_VOCAB,
        pad_token_id=_BYTE_VOCAB,
        bos_token_id=None,
    )
    if model_type == "olmoe":
        return {**common, "num_experts": num_experts, "norm_topk_prob": False}
    if model_type == "qwen2_moe":
        return {
            **common,
            "num_experts": num_experts,
            "moe_intermediate_size": hidden,
            "shared_expert_intermediate_size": hidden,
            "norm_topk_prob": False,
        }
    if model_type == "qwen3_moe":
        return {
            **common,
            "num_experts": num_experts,
            "moe_intermediate_size": hidden,
            "norm_topk_prob": True,
        }
    if model_type == "mixtral":
        return {**common, "num_local_experts": num_experts}
    if model_type == "gpt_oss":
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
                "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)
            ],
        }
    deepseek = dict(
        common,
        n_routed_experts=num_experts,
        moe_intermediate_size=hidden,
        n_shared_experts=1,
        first_k_dense_replace=1,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        n_group=4 if num_experts % 4 == 0 else 1,
        topk_group=2 if num_experts % 4 == 0 else 1,
        routed_scaling_factor=1.5,
    )
    deepseek["num_key_value_heads"] = 4
    deepseek.pop("head_dim")
    if model_type == "deepseek_v2":
        return {**deepseek, "topk_method": "group_limited_greedy"}
    if model_type == "deepseek_v3":
        return {**deepseek, "norm_topk_prob": True}
    raise InputError(
        f"model_type {model_type!r} is not a supported MoE family (supported: {_supported()})"
    )


def tiny_random_model(
    model_type: str,
    *,
    seed: int = 0,
    num_experts: int = 8,
    top_k: int = 2,
    num_layers: int = 2,
    hidden: int = 32,
    vocab: int = 257,
    context: int = 256,
) -> Any:
    """A randomly initialised tiny model of a supported family (float32, eval mode, offline).

    DeepSeek families get one extra leading dense layer (``first_k_dense_replace=1``), so their
    MoE layer indices start at 1. The vocabulary covers :func:`byte_tokenizer`.
    """
    import torch
    import transformers

    family = FAMILIES.get(model_type)
    if family is None:
        raise InputError(
            f"model_type {model_type!r} is not a supported MoE family (supported: {_supported()})"
        )
    if not 1 <= top_k < num_experts:
        raise InputError(f"top_k={top_k} must be in 1..num_experts-1={num_experts - 1}")
    if vocab < _BYTE_VOCAB + 1:
        raise InputError(f"vocab={vocab} must be at least {_BYTE_VOCAB + 1}")
    kwargs = _tiny_config_kwargs(
        model_type,
        num_experts=num_experts,
        top_k=top_k,
        num_layers=num_layers + model_type.startswith("deepseek"),
        hidden=hidden,
        vocab=vocab,
        context=context,
    )
    config = getattr(transformers, family.config_class)(**kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = getattr(transformers, family.class_name)(config)
        if model_type == "deepseek_v3":  # a non-zero correction bias exercises its rule
            for _, router in moe_layers(net):
                router.e_score_correction_bias.normal_(0.0, 0.05)
    net.config._name_or_path = f"tiny-{model_type}"
    net.eval()
    return net
