"""HF MoE causal language models: load them offline, build tiny random ones, find their routers.

Legend for shapes: ``N`` experts, ``m`` experts per token, ``H`` hidden size, ``V`` vocabulary.

What each supported family is (its transformers classes, routing rule, where its router and
experts sit) is declared once, in :mod:`specmoe.engine.families`; this module applies those
facts. In transformers 5 every family has a router module (``mlp.gate`` or, for gpt-oss,
``mlp.router``) with an ``[N, H]`` weight whose forward returns ``(logits [n, N], weights
[n, m], ids [n, m])``; older releases used a plain ``nn.Linear`` gate that returns logits only,
which the capture handles too.

transformers is imported inside the functions only, so importing this module is cheap.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specmoe.engine.families import FAMILIES, family_of, get_family
from specmoe.errors import InputError
from specmoe.spec import ModelSpec

__all__ = [
    "FAMILIES",
    "byte_tokenizer",
    "check_device",
    "family_of",
    "from_pretrained",
    "load_model",
    "load_tokenizer",
    "model_label",
    "moe_experts",
    "moe_layers",
    "resolve_model_dir",
    "spec_for",
    "tiny_random_model",
]


# ------------------------------------------------------------------------------------------
# Loading


def resolve_model_dir(model: str | os.PathLike | None = "bundled") -> Path:
    """The directory of ``model``: a local path, or ``"bundled"``/None for the package's own."""
    if model is None or str(model) == "bundled":
        try:
            from specmoe.data import corpus
        except ImportError:
            raise InputError(
                "bundled: the bundled model is not installed (specmoe.data.corpus is "
                "missing); pass the path of a model directory",
                argument="model",
            ) from None
        path = Path(corpus.bundled_model_dir())
        if not (path / "config.json").is_file():
            raise InputError(
                f"bundled: no bundled model at {path}; pass the path of a model directory",
                argument="model",
            )
        return path
    path = Path(model)
    if not path.exists():
        raise InputError(f"{path}: no such model directory", argument="model")
    if not path.is_dir():
        raise InputError(f"{path}: not a directory (expected an HF model folder)", argument="model")
    if not (path / "config.json").is_file():
        raise InputError(f"{path}: no config.json in the model directory", argument="model")
    return path


def _read_config(path: Path, *, argument: str = "model") -> dict[str, Any]:
    from specmoe.formats._common import read_json_capped

    file = path / "config.json"
    cfg = read_json_capped(file, "model config", argument=argument)
    if not isinstance(cfg, dict):
        raise InputError(f"{file}: config must be a JSON object", argument=argument)
    return cfg


def check_device(device: str) -> str:
    """``device`` as torch names it; an unknown or unavailable device is an ``InputError``."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InputError(
            f"{device!r} is not a torch device (cpu, cuda, cuda:N, mps, ...)", argument="device"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"{device!r}: CUDA is not available on this machine", argument="device")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"{device!r}: MPS is not available on this machine", argument="device")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise InputError(f"{device!r}: specmoe runs on cpu, cuda or mps", argument="device")
    return str(device)


def load_model(
    model: str | os.PathLike | None = "bundled", *, dtype: str | None = None, device: str = "cpu"
) -> Any:
    """Load an MoE causal LM from a local directory, offline, in eval mode.

    ``dtype`` is a torch dtype name; by default float32 on CPU and the checkpoint's own
    dtype elsewhere.
    """
    import torch
    import transformers

    check_device(device)
    path = resolve_model_dir(model)
    cfg = _read_config(path)
    try:
        family = family_of(cfg)
        # every size field typed and checked, naming the file (ModelSpec's own parse)
        ModelSpec.from_hf_config(cfg, source=str(path / "config.json"))
    except InputError as exc:
        msg = exc.message if exc.message.startswith(str(path)) else f"{path / 'config.json'}: {exc}"
        raise InputError(msg, argument="model") from None
    cls = getattr(transformers, family.class_name)
    if dtype is None:
        torch_dtype: Any = torch.float32 if str(device).startswith("cpu") else "auto"
    else:
        torch_dtype = getattr(torch, dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise InputError(f"{dtype!r} is not a torch dtype name", argument="dtype")
    return from_pretrained(cls, path, dtype=torch_dtype, device=device, argument="model")


def from_pretrained(
    cls: Any, path: str | os.PathLike, *, dtype: Any, device: str, argument: str = "path"
) -> Any:
    """``cls.from_pretrained`` offline and from safetensors only, moved to ``device`` in eval
    mode. The checkpoint is checked first (:mod:`specmoe.engine.checkpoint`: a pickle-only
    folder, a truncated or corrupt file and bad config fields are refused, never unpickled);
    weights the checkpoint lacks, or non-finite ones, are refused after the load. Every failure
    is one ``InputError`` line naming the folder or file, as the caller's ``argument``."""
    import torch
    from huggingface_hub.errors import StrictDataclassError
    from safetensors import SafetensorError

    from specmoe.engine.checkpoint import check_checkpoint, check_config_fields

    path = Path(path)
    check_config_fields(
        _read_config(path, argument=argument), path / "config.json", argument=argument
    )
    check_checkpoint(path, argument=argument)
    try:
        net, info = cls.from_pretrained(
            path,
            local_files_only=True,
            dtype=dtype,
            use_safetensors=True,
            output_loading_info=True,
        )
    except (OSError, ValueError, TypeError, SafetensorError, StrictDataclassError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{path}: cannot load weights ({first})", argument=argument) from None
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise InputError(
            f"{path}: the checkpoint lacks {len(missing)} weights ({', '.join(missing[:3])}); "
            "they would be random",
            argument=argument,
        )
    for name, p in net.named_parameters():
        if p.is_floating_point() and not bool(torch.isfinite(p).all()):
            raise InputError(f"{path}: weight {name} holds NaN or inf", argument=argument)
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
            f"{path}: no usable tokenizer in the model directory "
            f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
            argument="model",
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

    A router is the family's router child (``gate``, or gpt-oss's ``router``) of a decoder
    layer's MoE block whose weight is ``[N, H]`` (a dense layer's MLP has none; Qwen2-MoE's
    ``shared_expert_gate`` is ``[1, H]`` and is not matched by name).
    """
    cfg = model.config
    family = family_of(cfg)
    n_exp = getattr(cfg, family.num_experts_key, None) or None
    pattern = family.router_pattern
    found = []
    for qual, module in model.named_modules():
        match = pattern.search(qual)
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


def moe_experts(model: Any) -> list[Any]:
    """The fused experts module of each MoE layer (its block's ``experts``), in layer order."""
    family = family_of(model.config)
    names = {id(mod): qual for qual, mod in model.named_modules()}
    out = []
    for _, router in moe_layers(model):
        block = model.get_submodule(names[id(router)].rsplit(".", 1)[0])
        experts = getattr(block, family.experts, None)
        if experts is None or not hasattr(experts, "gate_up_proj"):
            raise InputError(
                f"model {model.config.model_type!r}: MoE block "
                f"{type(block).__name__} has no fused experts module"
            )
        out.append(experts)
    return out


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


def _tiny_common(*, top_k: int, num_layers: int, hidden: int, vocab: int, context: int) -> dict:
    """The config keys every family's tiny model shares (each family adds its own)."""
    return dict(
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

    The family's ``tiny_config`` completes the shared keys; a family with a correction bias
    gets a non-zero one, which exercises its rule. DeepSeek families get one extra leading
    dense layer (``tiny_dense_layers=1``), so their MoE layer indices start at 1. The
    vocabulary covers :func:`byte_tokenizer`.
    """
    import torch
    import transformers

    family = get_family(model_type)
    if not 1 <= top_k < num_experts:
        raise InputError(
            f"must be in 1..num_experts-1={num_experts - 1}, got {top_k}", argument="top_k"
        )
    if vocab < _BYTE_VOCAB + 1:
        raise InputError(f"must be at least {_BYTE_VOCAB + 1}, got {vocab}", argument="vocab")
    common = _tiny_common(
        top_k=top_k,
        num_layers=num_layers + family.tiny_dense_layers,
        hidden=hidden,
        vocab=vocab,
        context=context,
    )
    config = getattr(transformers, family.config_class)(**family.tiny_config(common, num_experts))
    bias = family.routing.correction_bias
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = getattr(transformers, family.class_name)(config)
        if bias is not None:
            for _, router in moe_layers(net):
                getattr(router, bias).normal_(0.0, 0.05)
    net.config._name_or_path = f"tiny-{model_type}"
    net.eval()
    return net
