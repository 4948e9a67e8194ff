"""Expert kernels: the expert operation of one MoE layer, one contract, every backend.

The contract (:mod:`specmoe.kernels._contract`)::

    y = kernel(x [n, h], w_gate_up [N, 2I, h], w_down [N, h, I], ids [n, m], weights [n, m],
               *, activation="swiglu", b_gate_up=None, b_down=None, check=True)   # [n, h]

Kernels by name (an unknown name lists the valid ones)::

    reference       float64 loops, the test oracle                          cpu, cuda
    per_slot        per-slot: C GEMV (cpu), Triton slot GEMV (cuda)         n·m·b bytes
    dedup           dedup: C fused row loop (cpu), Triton grouped (cuda)    U·b bytes
    per_slot_torch  per-slot F.linear per slot                              n·m·b
    dedup_torch     dedup F.linear per expert group                         U·b
    grouped_mm      dedup through torch grouped_mm                          U·b
    hf_batched_mm   transformers' batched_mm (per-slot peer)                n·m·b
    hf_grouped_mm   transformers' grouped_mm (dedup peer)                   U·b
    hf_eager        transformers' eager loop (dedup peer)                   U·b

Where ``per_slot`` or ``dedup`` cannot run its C (cpu) or Triton (cuda) code for a call, it runs
``per_slot_torch`` or ``dedup_torch`` instead and says so: a :class:`KernelFallbackWarning`
(once per kernel, device and reason) and an entry in every active :func:`watch_fallbacks`.
:func:`implementation` tells beforehand which implementation a name runs for given inputs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specmoe.errors import InputError
from specmoe.kernels._contract import ACTIVATIONS, check_inputs, torch_dtype
from specmoe.kernels._fallback import FALLBACK, KernelFallbackWarning, KernelImpl
from specmoe.kernels._fallback import watch as watch_fallbacks

__all__ = [
    "ACTIVATIONS",
    "KERNELS",
    "KernelFallbackWarning",
    "KernelImpl",
    "KernelInfo",
    "check_inputs",
    "get_kernel",
    "implementation",
    "kernel_kind",
    "kernel_names",
    "torch_dtype",
    "watch_fallbacks",
]


@dataclass(frozen=True)
class KernelInfo:
    name: str
    kind: str  # "per_slot", "dedup" or "reference": which bytes it requests
    impl: dict[str, str]  # device -> "module:function"
    description: str
    peer: bool = False  # transformers' code, measured beside ours


_K = "specmoe.kernels."
KERNELS: dict[str, KernelInfo] = {
    k.name: k
    for k in (
        KernelInfo(
            "reference",
            "reference",
            {"cpu": _K + "reference:expert_op", "cuda": _K + "reference:expert_op"},
            "float64 loops over tokens and slots (the test oracle)",
        ),
        KernelInfo(
            "per_slot",
            "per_slot",
            {"cpu": _K + "cpu:per_slot", "cuda": _K + "cuda:per_slot"},
            "one GEMV chain per (token, slot) on a view of its expert",
        ),
        KernelInfo(
            "dedup",
            "dedup",
            {"cpu": _K + "cpu:dedup", "cuda": _K + "cuda:dedup"},
            "each distinct expert streamed once, applied to all its tokens",
        ),
        KernelInfo(
            "per_slot_torch",
            "per_slot",
            {"cpu": _K + "cpu:per_slot_torch", "cuda": _K + "cpu:per_slot_torch"},
            "F.linear of one row per (token, slot)",
        ),
        KernelInfo(
            "dedup_torch",
            "dedup",
            {"cpu": _K + "cpu:dedup_torch", "cuda": _K + "cpu:dedup_torch"},
            "F.linear on each expert's rows",
        ),
        KernelInfo(
            "grouped_mm",
            "dedup",
            {"cpu": _K + "cuda:grouped_mm", "cuda": _K + "cuda:grouped_mm"},
            "rows sorted by expert through torch grouped_mm",
        ),
        KernelInfo(
            "hf_batched_mm",
            "per_slot",
            {"cpu": _K + "peers:hf_batched_mm", "cuda": _K + "peers:hf_batched_mm"},
            "transformers' batched_mm experts implementation",
            peer=True,
        ),
        KernelInfo(
            "hf_grouped_mm",
            "dedup",
            {"cpu": _K + "peers:hf_grouped_mm", "cuda": _K + "peers:hf_grouped_mm"},
            "transformers' grouped_mm experts implementation",
            peer=True,
        ),
        KernelInfo(
            "hf_eager",
            "dedup",
            {"cpu": _K + "peers:hf_eager", "cuda": _K + "peers:hf_eager"},
            "transformers' eager experts loop",
            peer=True,
        ),
    )
}


def kernel_names(device: str | None = None, *, peers: bool = True) -> list[str]:
    """Registered kernel names (those with an implementation on ``device`` when given)."""
    return [
        k
        for k, info in KERNELS.items()
        if (device is None or device in info.impl) and (peers or not info.peer)
    ]


def _info(name: str) -> KernelInfo:
    info = KERNELS.get(name)
    if info is None:
        raise InputError(f"kernel: unknown {name!r} (choose from {', '.join(KERNELS)})")
    return info


def kernel_kind(name: str) -> str:
    """ "per_slot", "dedup" or "reference": the bytes the kernel requests."""
    return _info(name).kind


def get_kernel(name: str, device: str = "cpu") -> Callable:
    """The kernel function ``name`` on ``device``; unknown names list the valid ones."""
    info = _info(name)
    if device not in info.impl:
        raise InputError(
            f"kernel {name!r}: no implementation on {device!r} (it has {', '.join(info.impl)})"
        )
    module, attr = info.impl[device].split(":")
    return getattr(importlib.import_module(module), attr)


def implementation(
    name: str,
    device: str = "cpu",
    *,
    dtype: str | torch.dtype = torch.float32,
    strided: bool = False,
) -> KernelImpl:
    """The implementation kernel ``name`` runs on ``device`` for weights of ``dtype``
    (``strided``: a weight tensor's last dimension is not contiguous), and why, when it is not
    the one the name stands for. With the C compiler status (cpu) or Triton's (cuda) for the
    kernels that need them."""
    info = _info(name)
    get_kernel(name, device)  # the same error for a device without an implementation
    module, attr = info.impl[device].split(":")
    mod = importlib.import_module(module)
    if attr in FALLBACK and hasattr(mod, "implementation_of"):  # a C or Triton kernel
        dt = dtype if str(dtype).lower() == "q8_0" else torch_dtype(dtype)
        return mod.implementation_of(attr, device=device, dtype=dt, strided=strided)
    code = "transformers" if info.peer else "torch"
    return KernelImpl(name, device, requested=code, ran=code, kernel=name)
