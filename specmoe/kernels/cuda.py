"""CUDA expert kernels: Triton per-slot and dedup kernels, torch baselines, ``torch._grouped_mm``.

Legend: ``n`` tokens, ``m`` slots, ``N`` experts, ``h`` hidden, ``I`` expert width.

* ``per_slot``: the Triton slot GEMV of :mod:`specmoe.kernels.triton_kernels` (n·m·b bytes).
* ``dedup``: the Triton grouped small-row kernel (U·b bytes).
* ``grouped_mm``: slots sorted by expert, then ``torch.nn.functional.grouped_mm`` (or
  ``torch._grouped_mm``) with per-expert offsets, the dedup baseline of PyTorch on Hopper bf16
  (it also runs on CPUs with torch >= 2.9).

Without Triton (it is imported only when a Triton kernel first runs), for a strided weight
tensor, or once a Triton kernel has failed to compile, ``per_slot`` and ``dedup`` run the torch
kernels of :mod:`specmoe.kernels.cpu` (``per_slot_torch``, ``dedup_torch``, which run on any
device) instead, with a :class:`~specmoe.kernels.KernelFallbackWarning` naming the reason
(:func:`triton_reason`; :mod:`specmoe.kernels._fallback`).
"""

from __future__ import annotations

from functools import cache

import torch

from specmoe.kernels import cpu
from specmoe.kernels._contract import activate, check_inputs
from specmoe.kernels._fallback import KernelImpl, impl_of, run_fallback

_triton_error: str | None = None  # why the Triton kernels could not be imported
_failed: dict[str, str] = {}  # Triton kernel -> why its first call failed


@cache
def triton_module():
    """The Triton kernels module, or None when Triton is missing or unusable."""
    global _triton_error
    try:
        from specmoe.kernels import triton_kernels
    except Exception as exc:  # ImportError, or a Triton that fails on import
        _triton_error = f"Triton unavailable ({type(exc).__name__}: {_first_line(exc)})"
        return None
    return triton_kernels


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0]


def triton_status() -> dict:
    """Triton on this machine: imported (with its version) or why not, and the Triton kernels
    whose first call failed."""
    mod = triton_module()
    version = None
    if mod is not None:
        import triton

        version = getattr(triton, "__version__", None)
    return {
        "status": "ok" if mod is not None else "unavailable",
        "version": version,
        "error": _triton_error,
        "failed": dict(_failed),
    }


def triton_reason(name: str, *, device: str, strided: bool) -> str | None:
    """Why the Triton kernel ``name`` cannot take a call on ``device`` (``strided``: a weight
    tensor's last dimension is not contiguous); None when it can."""
    if device != "cuda":
        return f"the tensors are on {device}; the Triton kernel runs on CUDA"
    if triton_module() is None:
        return _triton_error or "Triton unavailable"
    if name in _failed:
        return _failed[name]
    if strided:
        return (
            "a weight tensor's last dimension is strided; the Triton kernel reads it contiguously"
        )
    return None


def implementation_of(
    name: str, *, device: str = "cuda", dtype: torch.dtype | None = None, strided: bool = False
) -> KernelImpl:
    """The implementation the Triton kernel ``name`` (per_slot or dedup) runs for such inputs
    (``dtype`` does not change it)."""
    reason = triton_reason(name, device=device, strided=strided)
    return impl_of(name, device, requested="triton", reason=reason, triton=triton_status())


def _run_triton(
    name: str, fallback, x, w_gate_up, w_down, ids, weights, activation, b_gate_up, b_down, check
):
    check_inputs(
        x,
        w_gate_up,
        w_down,
        ids,
        weights,
        activation=activation,
        b_gate_up=b_gate_up,
        b_down=b_down,
        check_ids=check,
    )
    device, strided = x.device.type, w_gate_up.stride(2) != 1 or w_down.stride(2) != 1
    if triton_reason(name, device=device, strided=strided) is None:
        try:
            return getattr(triton_module(), name)(
                x, w_gate_up, w_down, ids, weights, activation, b_gate_up, b_down
            )
        except Exception as exc:  # a Triton compile error on an untested GPU or version
            _failed[name] = (
                f"the Triton {name} kernel failed ({type(exc).__name__}: {_first_line(exc)})"
            )
    impl = implementation_of(name, device=device, strided=strided)
    opts = {"activation": activation, "b_gate_up": b_gate_up, "b_down": b_down}
    return run_fallback(impl, fallback, x, w_gate_up, w_down, ids, weights, **opts, check=False)


def per_slot(
    x,
    w_gate_up,
    w_down,
    ids,
    weights,
    *,
    activation="swiglu",
    b_gate_up=None,
    b_down=None,
    check=True,
):
    """Per-slot Triton kernel: one GEMV chain per (token, slot), n·m·b requested bytes."""
    return _run_triton(
        "per_slot",
        cpu.per_slot_torch,
        x,
        w_gate_up,
        w_down,
        ids,
        weights,
        activation,
        b_gate_up,
        b_down,
        check,
    )


def dedup(
    x,
    w_gate_up,
    w_down,
    ids,
    weights,
    *,
    activation="swiglu",
    b_gate_up=None,
    b_down=None,
    check=True,
):
    """Grouped small-row Triton kernel: each distinct expert read once, U·b bytes."""
    return _run_triton(
        "dedup",
        cpu.dedup_torch,
        x,
        w_gate_up,
        w_down,
        ids,
        weights,
        activation,
        b_gate_up,
        b_down,
        check,
    )


def _grouped_mm_fn():
    return getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def grouped_mm_available(device: str) -> bool:
    return _grouped_mm_fn() is not None and (device != "cuda" or torch.cuda.is_available())


def grouped_mm(
    x,
    w_gate_up,
    w_down,
    ids,
    weights,
    *,
    activation="swiglu",
    b_gate_up=None,
    b_down=None,
    check=True,
):
    """Dedup with PyTorch's grouped GEMM: rows sorted by expert, offsets per expert.

    Every expert of the tensor takes part through the offsets (empty groups are skipped by the
    kernel), so the bytes read are those of the experts the pass names: U·b.
    """
    n, m, num, h, _ = check_inputs(
        x,
        w_gate_up,
        w_down,
        ids,
        weights,
        activation=activation,
        b_gate_up=b_gate_up,
        b_down=b_down,
        check_ids=check,
    )
    fn = _grouped_mm_fn()
    if fn is None:
        raise RuntimeError("grouped_mm: this torch has no grouped_mm")
    flat = ids.reshape(-1).to(torch.int64)
    sorted_ids, perm = torch.sort(flat, stable=True)
    counts = torch.zeros(num, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, sorted_ids, torch.ones_like(sorted_ids, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    xs = x[perm // m]  # [nm, h], rows grouped by expert
    gu = fn(xs, w_gate_up.transpose(1, 2), offs=offs)  # [nm, 2I]
    if b_gate_up is not None:
        gu = gu + b_gate_up[sorted_ids]
    a = activate(gu, activation).to(x.dtype)
    out = fn(a, w_down.transpose(1, 2), offs=offs).float()  # [nm, h]
    if b_down is not None:
        out = out + b_down[sorted_ids].float()
    out = out * weights.reshape(-1)[perm].float()[:, None]
    slots = torch.empty_like(out)
    slots[perm] = out
    return slots.view(n, m, h).sum(dim=1).to(x.dtype)
