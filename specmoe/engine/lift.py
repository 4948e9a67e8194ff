"""A small OLMoE model lifted to a larger model's shapes, computing the same function.

Legend for shapes: ``V`` vocabulary, ``d``/``D`` hidden size of the source/target, ``H``/``Hn``
heads, ``h``/``hn`` head dimension, ``I``/``In`` expert intermediate size, ``N`` experts.

The lifted model has the target's bytes in every layer (its experts are read in full by any
engine) and the source's outputs. The construction, one rule per tensor:

- Residual stream: the source's ``d`` dimensions are the target's first ``d``; every weight
  that writes into the residual stream (embeddings, ``o_proj`` rows, expert ``down_proj``
  rows) is zero outside them, so the other ``D - d`` dimensions stay exactly zero.
- RMSNorm over a vector with the same entries and zeros elsewhere: with ``r = d/D``,
  ``mean_D(x²) = r·mean_d(x²)``, so ``w'·x/sqrt(r·ms + ε') = w·x/sqrt(ms + ε)`` when
  ``ε' = r·ε`` and ``w' = sqrt(r)·w``. OLMoE's ``q_norm``/``k_norm`` normalise the whole
  projection (``H·h = d`` entries, lifted to ``Hn·hn = D``): the same ``r``, so one
  ``rms_norm_eps`` serves every norm of the lifted config.
- Heads: source head ``i`` is target head ``i`` (the extra heads have zero q/k/v rows and zero
  ``o_proj`` columns); head dimension ``j`` is target dimension ``s·j`` with ``s = hn/h``.
  RoPE (rotate_half pairs ``j`` with ``j + h/2``) keeps its pairs, since ``s·(j + h/2) =
  s·j + hn/2``, and its frequencies, since ``θ^(-2(s·j)/hn) = θ^(-2j/h)``.
- Attention scale: ``1/sqrt(hn)`` instead of ``1/sqrt(h)``, compensated by ``sqrt(s)`` in the
  ``q_norm`` weight (after the norm, on the query side only).
- Experts: gate/up rows and down columns beyond ``I`` are zero (``silu(0)·0 = 0``); the router
  is the source's (N experts unchanged), zero on the padded input columns.
- Extra layers ``l >= L_src``: ``o_proj`` and ``down_proj`` are zero, so the layer adds
  exactly zero to the residual stream; everything else copies source layer ``l mod L_src``
  (its norms, attention projections and router, and gate/up tiled over all ``In`` rows, real
  bytes). Its routing is then that source router applied to the source model's *final*
  residual stream (the input of the final norm) through that layer's post-attention norm:
  :func:`extra_layer_source` names the layer.

In float32 every scale is applied exactly up to one rounding; in bfloat16 the scales are exact
when ``sqrt(r)`` and ``sqrt(r·s)`` are powers of two (OLMoE-1B-7B from the bundled model:
``r = 1/16``, ``s = 4``: 1/4 and 1/2). What is not bit-exact is the order of floating-point
sums over the wider dimensions (the zeros add nothing, the grouping of the other terms may
change), so logits agree to rounding and routing on all but near-tied pairs.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specmoe.errors import InputError

__all__ = [
    "DEFAULT_PRESET",
    "DTYPES",
    "LiftPlan",
    "LiftResult",
    "LiftShapes",
    "cache_root",
    "checkpoint_layer_bytes",
    "extra_layer_source",
    "lift_checkpoint",
    "plan_lift",
    "preset_layer_bytes",
    "target_shapes",
]

DEFAULT_PRESET = "OLMoE-1B-7B-0125"
DTYPES = ("bf16", "fp32")
_TORCH_DTYPE = {"bf16": "bfloat16", "fp32": "float32"}
_WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def cache_root() -> Path:
    """Where lifted models are kept: ``$SPECMOE_LIFTED_CACHE`` (default
    ~/.cache/specmoe/lifted)."""
    base = os.environ.get("SPECMOE_LIFTED_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "specmoe", "lifted"
    )
    return Path(base)


@dataclass(frozen=True)
class LiftShapes:
    """The shapes a model is lifted to (or lifted from)."""

    hidden: int  # d
    heads: int  # H (key-value heads equal: no grouped-query attention)
    head_dim: int  # h, with heads * head_dim == hidden (OLMoE's q_norm spans the hidden size)
    intermediate: int  # I, one expert's
    layers: int  # L

    def check(self, where: str) -> None:
        """Positive sizes and ``heads * head_dim == hidden``; an ``InputError`` names the
        field as its argument (``where``: whose shapes, in the message)."""
        for name, v in asdict(self).items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"{where}: must be a positive integer, got {v!r}", argument=name)
        if self.heads * self.head_dim != self.hidden:
            raise InputError(
                f"{where}: heads x head_dim = {self.heads} x {self.head_dim} must equal hidden "
                f"{self.hidden} (OLMoE's q_norm spans the hidden size)",
                argument="heads",
            )


def target_shapes(preset: str = DEFAULT_PRESET, *, layers: int | None = None) -> LiftShapes:
    """A preset's shapes (:data:`specmoe.spec.PRESET_CONFIGS`), with ``layers`` decoder layers
    (default the preset's)."""
    from specmoe.spec import PRESET_CONFIGS, get_preset

    spec = get_preset(preset)  # an unknown name lists the valid ones
    cfg = PRESET_CONFIGS[spec.name]
    if cfg.get("model_type") != "olmoe":
        raise InputError(
            f"{spec.name!r} is a {cfg.get('model_type')} model; lifting builds OLMoE models "
            "(choose OLMoE-1B-7B-0125)",
            argument="preset",
        )
    heads = int(cfg["num_attention_heads"])
    n = spec.num_hidden_layers if layers is None else layers
    return LiftShapes(
        spec.hidden_size, heads, spec.hidden_size // heads, spec.expert_intermediate, n
    )


def extra_layer_source(layer: int, source_layers: int) -> int:
    """The source layer whose norms, attention, router and gate/up an extra layer copies."""
    return layer % source_layers


@dataclass(frozen=True)
class LiftPlan:
    """The source and target shapes and the scales that make the lift exact (module docstring)."""

    source: LiftShapes
    target: LiftShapes
    num_experts: int
    eps_source: float
    eps_target: float  # r * eps
    norm_scale: float  # sqrt(r), r = d / D
    q_norm_scale: float  # sqrt(r) * sqrt(s): the attention scale's compensation
    head_stride: int  # s = hn / h: source head dimension j is target dimension s * j
    bf16_exact_scales: bool  # both scales powers of two

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _source_shapes(cfg: dict[str, Any], where: str) -> tuple[LiftShapes, int, float]:
    if cfg.get("model_type") != "olmoe":
        raise InputError(
            f"{where}: model_type {cfg.get('model_type')!r}, lifting takes OLMoE models",
            argument="source",
        )
    try:
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        kv = int(cfg.get("num_key_value_heads") or heads)
        shapes = LiftShapes(
            hidden,
            heads,
            hidden // heads,
            int(cfg["intermediate_size"]),
            int(cfg["num_hidden_layers"]),
        )
        experts, eps = int(cfg["num_experts"]), float(cfg.get("rms_norm_eps", 1e-5))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{where}: config lacks or mistypes {exc}", argument="source") from None
    try:
        shapes.check(where)
    except InputError as exc:
        raise InputError(exc.message, argument="source") from None
    if kv != heads:
        raise InputError(
            f"{where}: {kv} key-value heads for {heads} heads; lifting takes models without "
            "grouped-query attention",
            argument="source",
        )
    if cfg.get("clip_qkv") is not None:
        raise InputError(
            f"{where}: clip_qkv is set, which the lift does not preserve", argument="source"
        )
    if cfg.get("attention_bias"):
        raise InputError(f"{where}: attention biases are not supported", argument="source")
    return shapes, experts, eps


def _pow2(x: float) -> bool:
    m, _ = math.frexp(x)
    return m == 0.5


def plan_lift(
    source_config: dict[str, Any], target: LiftShapes, *, where: str = "source"
) -> LiftPlan:
    """Check that ``target`` can hold the source exactly and derive the scales; a target
    smaller than the source in any shape, or a head dimension that is not a multiple of the
    source's, is an ``InputError`` whose argument is the target's field (``hidden``,
    ``heads``, ``head_dim``, ``intermediate``, ``layers``)."""
    src, experts, eps = _source_shapes(source_config, where)
    target.check("target")
    for name in ("hidden", "heads", "head_dim", "intermediate", "layers"):
        a, b = getattr(src, name), getattr(target, name)
        if b < a:
            raise InputError(f"target {b} is below the source's {a}", argument=name)
    if target.head_dim % src.head_dim:
        raise InputError(
            f"target {target.head_dim} is not a multiple of the source's {src.head_dim} "
            "(RoPE pairs are kept by placing dimension j at s*j)",
            argument="head_dim",
        )
    r = src.hidden / target.hidden
    s = target.head_dim // src.head_dim
    norm_scale = math.sqrt(r)
    q_scale = math.sqrt(r) * math.sqrt(s)
    return LiftPlan(
        source=src,
        target=target,
        num_experts=experts,
        eps_source=eps,
        eps_target=eps * r,
        norm_scale=norm_scale,
        q_norm_scale=q_scale,
        head_stride=s,
        bf16_exact_scales=_pow2(norm_scale) and _pow2(q_scale),
    )


# ------------------------------------------------------------------------------------------
# Tensors


def _head_index(plan: LiftPlan) -> Any:
    """[H*h] target positions of the source's q/k/v entries: head i, dim j -> i*hn + s*j."""
    import torch

    h, hn, s = plan.source.head_dim, plan.target.head_dim, plan.head_stride
    return torch.tensor([i * hn + s * j for i in range(plan.source.heads) for j in range(h)])


def _pad(t: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """``t`` (computed in float32, rounded once to ``dtype``) in the corner of zeros ``shape``."""
    import torch

    out = torch.zeros(shape, dtype=dtype)
    out[tuple(slice(0, n) for n in t.shape)] = t.float()
    return out


def _layer_tensors(
    plan: LiftPlan, layer: int, get: Callable[[str], Any], *, extra: bool, dtype: Any
) -> Iterator[tuple[str, Any]]:
    """The target tensors of decoder layer ``layer`` (as ``dtype``) from source layer ``get``;
    every value is computed in float32 and rounded once."""
    import torch

    src, tgt = plan.source, plan.target
    d, dn = src.hidden, tgt.hidden
    idx = _head_index(plan)
    p = f"model.layers.{layer}."
    for name in ("input_layernorm", "post_attention_layernorm"):
        yield (
            p + f"{name}.weight",
            _pad(get(f"{name}.weight").float() * plan.norm_scale, (dn,), dtype),
        )
    for proj in ("q_proj", "k_proj", "v_proj"):
        w = torch.zeros(dn, dn, dtype=dtype)  # [Hn*hn, D]
        w[idx, :d] = get(f"self_attn.{proj}.weight").float().to(dtype)
        yield p + f"self_attn.{proj}.weight", w
    o = torch.zeros(dn, dn, dtype=dtype)  # [D, Hn*hn]
    if not extra:
        o[:d, idx] = get("self_attn.o_proj.weight").float().to(dtype)
    yield p + "self_attn.o_proj.weight", o
    for norm, scale in (("q_norm", plan.q_norm_scale), ("k_norm", plan.norm_scale)):
        w = torch.zeros(dn, dtype=dtype)
        w[idx] = (get(f"self_attn.{norm}.weight").float() * scale).to(dtype)
        yield p + f"self_attn.{norm}.weight", w
    yield p + "mlp.gate.weight", _pad(get("mlp.gate.weight"), (plan.num_experts, dn), dtype)
    i_src, i_tgt = src.intermediate, tgt.intermediate
    rows = torch.arange(i_tgt) % i_src  # extra layers: every row a real one
    for e in range(plan.num_experts):
        q = f"mlp.experts.{e}."
        for proj in ("gate_proj", "up_proj"):
            w = get(q + f"{proj}.weight").float()  # [I, d]
            yield p + q + f"{proj}.weight", _pad(w[rows] if extra else w, (i_tgt, dn), dtype)
        down = torch.zeros(dn, i_tgt, dtype=dtype)  # [D, In]
        if not extra:
            down[:d, :i_src] = get(q + "down_proj.weight").float()
        yield p + q + "down_proj.weight", down


# ------------------------------------------------------------------------------------------
# Checkpoint


@dataclass(frozen=True)
class LiftResult:
    """What :func:`lift_checkpoint` wrote."""

    out: Path
    plan: LiftPlan
    dtype: str
    files: tuple[str, ...]
    layer_bytes: tuple[dict[str, int], ...]  # per decoder layer, checkpoint_layer_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "plan": self.plan.to_dict(),
            "dtype": self.dtype,
            "files": list(self.files),
            "layer_bytes": [dict(b) for b in self.layer_bytes],
        }


def _read_source(source: Path) -> tuple[dict[str, Any], Callable[[str], Any]]:
    from safetensors import safe_open

    from specmoe.engine.checkpoint import safetensors_files

    cfg_file = source / "config.json"
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{cfg_file}: cannot read the config ({exc})", argument="source") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{cfg_file}: config must be a JSON object", argument="source")
    files = safetensors_files(source, argument="source")
    where: dict[str, Any] = {}
    for f in files:
        h = safe_open(str(f), "pt")
        for k in h.keys():
            where[k] = h

    def get(name: str) -> Any:
        h = where.get(name)
        if h is None:
            raise InputError(f"{source}: the checkpoint lacks {name}", argument="source")
        return h.get_tensor(name)

    return cfg, get


def _config(cfg: dict[str, Any], plan: LiftPlan, dtype: str) -> dict[str, Any]:
    t = plan.target
    out = dict(cfg)
    out.update(
        hidden_size=t.hidden,
        num_attention_heads=t.heads,
        num_key_value_heads=t.heads,
        intermediate_size=t.intermediate,
        num_hidden_layers=t.layers,
        rms_norm_eps=plan.eps_target,
    )
    out.pop("head_dim", None)  # OLMoE derives it: hidden // heads
    key = "dtype" if "dtype" in cfg or "torch_dtype" not in cfg else "torch_dtype"
    out[key] = _TORCH_DTYPE[dtype]
    return out


def _empty_or_absent(out: Path, argument: str) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"{out}: exists and is not an empty folder", argument=argument)


def lift_checkpoint(
    source: str | os.PathLike,
    out: str | os.PathLike,
    *,
    target: LiftShapes | None = None,
    dtype: str = "bf16",
    progress: Callable[[str], None] | None = None,
) -> LiftResult:
    """Write the lifted Hugging Face checkpoint of the OLMoE model in ``source`` at ``out``.

    ``target`` defaults to :data:`DEFAULT_PRESET`'s shapes (:func:`target_shapes`); weights are
    stored as ``dtype`` (:data:`DTYPES`), one safetensors file per decoder layer plus one for
    the embeddings, final norm and LM head, with an index. Tokenizer and generation files are
    copied. Everything is written into a temporary folder beside ``out`` that is renamed onto
    ``out`` last (``out`` must be absent or an empty folder).
    """
    import torch
    from safetensors.torch import save_file

    if dtype not in DTYPES:
        raise InputError(f"unknown {dtype!r} (choose from {', '.join(DTYPES)})", argument="dtype")
    src_dir, out = Path(source), Path(out)
    if not (src_dir / "config.json").is_file():
        raise InputError(f"{src_dir}: no config.json (not a model folder)", argument="source")
    _empty_or_absent(out, "out")
    cfg, get = _read_source(src_dir)
    plan = plan_lift(cfg, target or target_shapes(), where=str(src_dir / "config.json"))
    tdtype = getattr(torch, _TORCH_DTYPE[dtype])
    say = progress or (lambda _msg: None)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        n = plan.target.layers
        names = [f"model-{i + 1:05d}-of-{n + 1:05d}.safetensors" for i in range(n + 1)]
        weight_map: dict[str, str] = {}
        total = 0

        def write(fname: str, tensors: Iterator[tuple[str, Any]]) -> None:
            nonlocal total
            kept = {k: v.contiguous() for k, v in tensors}
            save_file(kept, str(tmp / fname), metadata={"format": "pt"})
            for k, v in kept.items():
                weight_map[k] = fname
                total += v.numel() * v.element_size()

        d = plan.target.hidden

        def outer() -> Iterator[tuple[str, Any]]:
            emb = get("model.embed_tokens.weight")
            yield "model.embed_tokens.weight", _pad(emb, (emb.shape[0], d), tdtype)
            yield (
                "model.norm.weight",
                _pad(get("model.norm.weight").float() * plan.norm_scale, (d,), tdtype),
            )
            head = get("lm_head.weight")
            yield "lm_head.weight", _pad(head, (head.shape[0], d), tdtype)

        write(names[0], outer())
        for layer in range(n):
            extra = layer >= plan.source.layers
            src_layer = extra_layer_source(layer, plan.source.layers)
            say(
                f"layer {layer + 1}/{n}"
                + (f" (extra, copies layer {src_layer}'s router)" if extra else "")
            )

            def get_layer(name: str, _l: int = src_layer) -> Any:
                return get(f"model.layers.{_l}.{name}")

            write(
                names[layer + 1], _layer_tensors(plan, layer, get_layer, extra=extra, dtype=tdtype)
            )
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(_config(cfg, plan, dtype), indent=2) + "\n")
        for f in sorted(src_dir.iterdir()):
            if f.is_file() and f.name != "config.json" and not f.name.endswith(_WEIGHT_FILES):
                if f.name != "model.safetensors.index.json":
                    shutil.copy2(f, tmp / f.name)
        record = {"source": str(src_dir), "dtype": dtype, "plan": plan.to_dict()}
        (tmp / "lift.json").write_text(json.dumps(record, indent=2) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        for f in tmp.iterdir():  # mkdtemp's 0700 and the writers' modes: the usual ones
            f.chmod(0o666 & ~umask)
        tmp.chmod(0o777 & ~umask)
        _empty_or_absent(out, "out")
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    files = tuple(sorted(p.name for p in out.iterdir()))
    return LiftResult(out, plan, dtype, files, tuple(checkpoint_layer_bytes(out)))


# ------------------------------------------------------------------------------------------
# Bytes


def _group(name: str) -> tuple[int, str] | None:
    parts = name.split(".")
    if len(parts) < 4 or parts[:2] != ["model", "layers"]:
        return None
    rest = ".".join(parts[3:])
    if rest.startswith("mlp.experts."):
        kind = "experts"
    elif rest.startswith("mlp.gate."):
        kind = "router"
    elif rest.endswith("norm.weight"):
        kind = "norms"
    else:
        kind = "attention"
    return int(parts[2]), kind


def checkpoint_layer_bytes(folder: str | os.PathLike) -> list[dict[str, int]]:
    """Bytes of each decoder layer's weights, read from the safetensors headers of ``folder``:
    ``experts`` (all N experts' gate, up and down), ``attention`` (q, k, v, o projections),
    ``router``, ``norms`` (the four RMSNorm weights)."""
    from specmoe.engine.checkpoint import safetensors_files

    per: dict[int, dict[str, int]] = {}
    for f in safetensors_files(Path(folder), argument="folder"):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for name, info in header.items():
            g = _group(name) if name != "__metadata__" else None
            if g is None:
                continue
            lo, hi = info["data_offsets"]
            row = per.setdefault(g[0], {"experts": 0, "attention": 0, "router": 0, "norms": 0})
            row[g[1]] += int(hi) - int(lo)
    return [per[i] for i in sorted(per)]


def preset_layer_bytes(preset: str = DEFAULT_PRESET, *, dtype: str = "bf16") -> dict[str, float]:
    """One MoE layer's bytes by the project's accounting (:class:`specmoe.spec.ModelSpec`):
    ``experts`` = N·w_l, and ``attention_router`` = the per-layer share of the dense bytes D
    without the LM head (all of a preset's layers are MoE layers; norms are not counted)."""
    from specmoe.spec import get_preset

    spec = get_preset(preset, dtype=dtype)
    if spec.num_moe_layers != spec.num_hidden_layers or spec.num_shared_experts:
        raise InputError(f"{preset!r}: per-layer bytes need all-MoE layers", argument="preset")
    per_layer = (spec.dense_params - spec.vocab_size * spec.hidden_size) / spec.num_hidden_layers
    return {
        "experts": spec.num_experts * spec.expert_bytes,
        "attention_router": per_layer * spec.bytes_per_weight,
    }
