"""Expert weights in llama.cpp's q8_0 layout, for the C per-slot and deduplicating kernels.

Legend: ``N`` experts, ``rows`` output rows, ``cols`` input columns (a multiple of 32).

A q8_0 row of ``cols`` weights is ``cols / 32`` blocks of 34 bytes (ggml's ``block_q8_0``): an
fp16 scale ``d`` (little-endian) then 32 int8 values ``q``; the weight is ``w = d · q``, so a
weight costs 34/32 = 1.0625 bytes (:data:`BYTES_PER_WEIGHT`, the ``q8_0`` entry of
:data:`specmoe.spec.DTYPE_BYTES`). Quantisation is ggml's ``quantize_row_q8_0_ref``: per block
``d = max|x| / 127`` (float32), ``q = round(x · (1/d))`` rounded half away from zero (C's
``roundf``), ``d`` stored as fp16 (round to nearest even); an all-zero block has ``d = 0``.

:class:`Q8Weights` holds one weight tensor of the kernel contract (``w_gate_up`` [N, 2I, h] or
``w_down`` [N, h, I]) as its bytes, uint8 [N, rows, cols / 32 · 34]; :func:`quantize_q8_0`
makes it from float weights and :meth:`Q8Weights.dequantize` gives back ``d · q`` (exact in
float32: an int8 times an fp16 has at most 19 significant bits). The kernels compute the
contract's ``y`` with ``W`` the dequantised weights (:mod:`specmoe.kernels.cpu`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specmoe.errors import InputError

BLOCK = 32  # weights per block
BLOCK_BYTES = 34  # one fp16 scale and 32 int8
BYTES_PER_WEIGHT = BLOCK_BYTES / BLOCK


def row_bytes(cols: int, *, argument: str = "w") -> int:
    """Bytes of one q8_0 row of ``cols`` weights; ``cols`` not a multiple of 32 is an
    ``InputError`` naming ``argument``."""
    if cols < 1 or cols % BLOCK:
        raise InputError(
            f"q8_0 rows need a multiple of {BLOCK} columns, got {cols}", argument=argument
        )
    return cols // BLOCK * BLOCK_BYTES


@dataclass(frozen=True, eq=False)
class Q8Weights:
    """A [N, rows, cols] weight tensor in q8_0: ``blocks`` uint8 [N, rows, cols / 32 · 34]."""

    blocks: torch.Tensor
    cols: int

    def __post_init__(self) -> None:
        b = self.blocks
        if not isinstance(b, torch.Tensor) or b.dtype != torch.uint8 or b.ndim != 3:
            what = f"{b.dtype} {tuple(b.shape)}" if isinstance(b, torch.Tensor) else type(b)
            raise InputError(
                f"expected a uint8 [N, rows, bytes] tensor, got {what}", argument="blocks"
            )
        if b.shape[2] != row_bytes(self.cols, argument="cols"):
            raise InputError(
                f"{b.shape[2]} bytes per row, not the {row_bytes(self.cols)} of {self.cols} "
                "q8_0 weights",
                argument="blocks",
            )

    dtype = "q8_0"
    bytes_per_weight = BYTES_PER_WEIGHT

    @property
    def shape(self) -> tuple[int, int, int]:
        """The shape of the weights it stands for, [N, rows, cols]."""
        return (self.blocks.shape[0], self.blocks.shape[1], self.cols)

    @property
    def device(self) -> torch.device:
        return self.blocks.device

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    def expert_bytes(self) -> int:
        """Bytes of one expert's rows (what a kernel streams per expert)."""
        return self.blocks.shape[1] * self.blocks.shape[2]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``d · q`` as [N, rows, cols] of ``dtype`` (float32 exactly)."""
        return dequantize_q8_0(self.blocks, self.cols).to(dtype)


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    """C's ``roundf``: to nearest, ties away from zero (torch.round ties to even)."""
    t = torch.trunc(v)
    frac = v - t  # exact in float
    return torch.where(frac.abs() >= 0.5, t + torch.sign(v), t)


def quantize_q8_0(w: torch.Tensor) -> Q8Weights:
    """Float weights [N, rows, cols] (cols a multiple of 32) -> :class:`Q8Weights`, ggml's
    ``quantize_row_q8_0_ref`` byte for byte (see the module docstring)."""
    if not isinstance(w, torch.Tensor) or not w.dtype.is_floating_point or w.ndim != 3:
        what = f"{w.dtype} {tuple(w.shape)}" if isinstance(w, torch.Tensor) else type(w).__name__
        raise InputError(f"expected a floating [N, rows, cols] tensor, got {what}", argument="w")
    num, rows, cols = w.shape
    row_bytes(cols, argument="w")
    x = w.detach().to(torch.float32).reshape(num, rows, cols // BLOCK, BLOCK)
    amax = x.abs().amax(dim=-1, keepdim=True)
    d = amax / 127.0
    inv = torch.where(d > 0, 1.0 / torch.where(d > 0, d, 1.0), 0.0)
    q = _round_half_away(x * inv).clamp(-128, 127).to(torch.int8)
    dh = d.to(torch.float16).contiguous()
    out = torch.cat([dh.view(torch.uint8), q.view(torch.uint8)], dim=-1)  # [N, rows, nb, 34]
    return Q8Weights(out.reshape(num, rows, cols // BLOCK * BLOCK_BYTES).contiguous(), cols)


def dequantize_q8_0(blocks: torch.Tensor, cols: int) -> torch.Tensor:
    """q8_0 bytes [..., cols / 32 · 34] -> float32 [..., cols], ``d · q``."""
    nb = cols // BLOCK
    b = blocks.contiguous().reshape(*blocks.shape[:-1], nb, BLOCK_BYTES)
    d = b[..., :2].contiguous().view(torch.float16).to(torch.float32)  # [..., nb, 1]
    q = b[..., 2:].contiguous().view(torch.int8).to(torch.float32)  # [..., nb, 32]
    return (d * q).reshape(*blocks.shape[:-1], cols)
