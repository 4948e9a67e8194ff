"""The one contract every expert kernel meets: shapes, layout, activation and input checks.

Legend: ``n`` tokens of the pass, ``m`` slots per token, ``N`` experts in the weight tensors,
``h`` hidden size, ``I`` expert width (intermediate size).

``expert_op(x, w_gate_up, w_down, ids, weights, *, activation="swiglu", b_gate_up=None,
b_down=None, check=True) -> y``::

    x          [n, h]       token activations
    w_gate_up  [N, 2I, h]   rows 0..I-1 the gate projection, rows I..2I-1 the up projection
                            (the concatenated-halves, out-by-in layout of transformers'
                            OLMoE/Qwen3-MoE ``gate_up_proj``; gpt-oss's interleaved, transposed
                            checkpoint is converted to it by :func:`from_gpt_oss_layout`)
    w_down     [N, h, I]    down projection (out-by-in)
    ids        [n, m]       expert of each slot, integers in [0, N)
    weights    [n, m]       router weight of each slot
    b_gate_up  [N, 2I]      optional biases (gpt-oss), b_down [N, h]
    y          [n, h]       y_t = Σ_j weights[t,j] · (W_down[e] a_tj + b_down[e]),
                            a_tj = act(W_gate[e] x_t + b_gate[e], W_up[e] x_t + b_up[e]),
                            e = ids[t, j]

Activations: ``swiglu`` is ``silu(g) · u``; ``swiglu_oai`` is gpt-oss's clamped variant, read
from transformers' ``GptOssExperts._apply_gate``: ``g = min(g, limit)``,
``u = clamp(u, -limit, limit)``, ``(u + 1) · g · sigmoid(alpha · g)`` with alpha = 1.702 and
limit = 7.0 (the ``swiglu_alpha`` and ``swiglu_limit`` defaults of ``GptOssConfig``).

Requested bytes (paper 002 Section 1): a per-slot kernel requests one expert per slot,
``n·m·b`` bytes; a deduplicating kernel requests each distinct expert once, ``U·b``.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from specmoe.errors import InputError

ACTIVATIONS = ("swiglu", "swiglu_oai")
OAI_ALPHA = 1.702
OAI_LIMIT = 7.0
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


class ExpertOp(Protocol):
    def __call__(
        self,
        x: torch.Tensor,
        w_gate_up: torch.Tensor,
        w_down: torch.Tensor,
        ids: torch.Tensor,
        weights: torch.Tensor,
        *,
        activation: str = "swiglu",
        b_gate_up: torch.Tensor | None = None,
        b_down: torch.Tensor | None = None,
        check: bool = True,
    ) -> torch.Tensor: ...


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """A torch dtype from its name (``float32``, ``bf16``, ...); an unknown name is an error."""
    if isinstance(name, torch.dtype):
        return name
    key = str(name).lower()
    if key not in DTYPES:
        raise InputError(f"dtype: unknown {name!r} (choose from float32, bfloat16, float16)")
    return DTYPES[key]


def activate(gu: torch.Tensor, activation: str) -> torch.Tensor:
    """[.., 2I] gate and up halves -> [.., I] activation (see the module docstring)."""
    inter = gu.shape[-1] // 2
    g, u = gu[..., :inter], gu[..., inter:]
    if activation == "swiglu":
        return torch.nn.functional.silu(g) * u
    g = g.clamp(max=OAI_LIMIT)
    u = u.clamp(min=-OAI_LIMIT, max=OAI_LIMIT)
    return (u + 1) * (g * torch.sigmoid(OAI_ALPHA * g))


def _shape(t: Any) -> Any:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def check_inputs(
    x: Any,
    w_gate_up: Any,
    w_down: Any,
    ids: Any,
    weights: Any,
    *,
    activation: str = "swiglu",
    b_gate_up: Any = None,
    b_down: Any = None,
    check_ids: bool = True,
) -> tuple[int, int, int, int, int]:
    """Validate the contract; return (n, m, N, h, I). Each problem is a one-line InputError."""
    named = {"x": x, "w_gate_up": w_gate_up, "w_down": w_down, "ids": ids, "weights": weights}
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name}: expected a torch tensor, got {type(t).__name__}")
    if activation not in ACTIVATIONS:
        raise InputError(
            f"activation: unknown {activation!r} (choose from {', '.join(ACTIVATIONS)})"
        )
    if x.ndim != 2:
        raise InputError(f"x: expected [n, h], got shape {_shape(x)}")
    n, h = x.shape
    if w_gate_up.ndim != 3 or w_gate_up.shape[2] != h or w_gate_up.shape[1] % 2:
        raise InputError(f"w_gate_up: expected [N, 2I, h={h}], got shape {_shape(w_gate_up)}")
    num, two_i, _ = w_gate_up.shape
    inter = two_i // 2
    if tuple(w_down.shape) != (num, h, inter):
        raise InputError(
            f"w_down: expected [N, h, I] = {(num, h, inter)} to match w_gate_up "
            f"and x, got shape {_shape(w_down)}"
        )
    if ids.ndim != 2 or ids.shape[0] != n:
        raise InputError(f"ids: expected [n={n}, m], got shape {_shape(ids)}")
    m = ids.shape[1]
    if n < 1 or m < 1 or h < 1 or inter < 1 or num < 1:
        raise InputError(f"x/ids: empty pass (n={n}, m={m}, h={h}, I={inter}, N={num})")
    if tuple(weights.shape) != (n, m):
        raise InputError(
            f"weights: expected [n, m] = {(n, m)} like ids, got shape {_shape(weights)}"
        )
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise InputError(f"ids: expert ids must be integers, got dtype {ids.dtype}")
    if not weights.dtype.is_floating_point:
        raise InputError(f"weights: must be floating, got dtype {weights.dtype}")
    if not x.dtype.is_floating_point:
        raise InputError(f"x: must be floating, got dtype {x.dtype}")
    if w_gate_up.dtype != x.dtype or w_down.dtype != x.dtype:
        raise InputError(
            f"w_gate_up/w_down: dtypes {w_gate_up.dtype}/{w_down.dtype} differ from x's {x.dtype}"
        )
    devices = {t.device for t in named.values()}
    if len(devices) != 1:
        raise InputError(
            f"x/w_gate_up/w_down/ids/weights: tensors on different devices "
            f"({', '.join(sorted(map(str, devices)))})"
        )
    for name, b, want in (("b_gate_up", b_gate_up, (num, two_i)), ("b_down", b_down, (num, h))):
        if b is None:
            continue
        if not isinstance(b, torch.Tensor) or tuple(b.shape) != want:
            raise InputError(f"{name}: expected shape {want}, got {_shape(b)}")
        if b.device != x.device:
            raise InputError(f"{name}: on {b.device}, not on {x.device} like x")
    if check_ids:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= num:
            bad = lo if lo < 0 else hi
            raise InputError(f"ids: expert id {bad} outside [0, {num})")
    return n, m, num, h, inter


def from_gpt_oss_layout(
    gate_up_proj: torch.Tensor, down_proj: torch.Tensor, gate_up_bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """transformers' gpt-oss expert tensors -> this contract's layout (a copy).

    gpt-oss stores ``gate_up_proj`` [N, h, 2I] with gate and up interleaved along the last
    axis (gate = [..., ::2], up = [..., 1::2]) and ``down_proj`` [N, I, h].
    """
    gate, up = gate_up_proj[..., ::2], gate_up_proj[..., 1::2]  # [N, h, I] each
    w_gu = torch.cat([gate, up], dim=-1).transpose(1, 2).contiguous()  # [N, 2I, h]
    w_d = down_proj.transpose(1, 2).contiguous()  # [N, h, I]
    b = None
    if gate_up_bias is not None:
        b = torch.cat([gate_up_bias[..., ::2], gate_up_bias[..., 1::2]], dim=-1).contiguous()
    return w_gu, w_d, b
