"""CPU expert kernels: per-slot and deduplicating, in C (compiled on first use) and in torch.

Legend: ``n`` tokens, ``m`` slots, ``N`` experts, ``h`` hidden, ``I`` expert width.

``per_slot`` and ``dedup`` run the C routine of :mod:`specmoe.kernels._csrc` on the tensors'
data pointers (no copy of the weights). Per-slot streams one expert per slot (n·m·b requested
bytes, paper 002 Section 1); dedup streams each distinct expert once and applies every weight
row to all of its tokens while the row is in registers (U·b bytes). bfloat16 weights on a
processor with AVX-512 BF16 run ``vdpbf16ps`` on bfloat16 activations (the intermediate
activation rounded to bfloat16, as transformers' bf16 experts do; :func:`set_bf16_dot` turns
it off). Weights in llama.cpp's q8_0 layout (:class:`~specmoe.kernels.q8.Q8Weights`, 1.0625
bytes per weight, both ``w_gate_up`` and ``w_down``) are dequantised on the fly to fp32 inside
the register blocks (sign-extending load, conversion, one multiply by the block's scale, FMA
against fp32 activations): ``y`` is the contract's with ``W`` the dequantised weights, to fp32
rounding (:data:`specmoe.kernels.selfcheck.TOL` ``["q8_0"]``); the activations are not
quantised (unlike ggml's q8_0 × q8_0 dot). :func:`set_q8_activations` ``("int16")`` switches to
int16 activation blocks and integer products instead (``benchmarks/kernel_q8.py`` times both;
results/cpu/kernels/q8_0.md). Where the C kernel cannot
take a call (no C compiler, weights of another dtype than float32/bfloat16/float16/q8_0, a strided
last dimension, tensors off the CPU: :func:`c_reason`) the call runs the pure-torch kernel
below instead, with a :class:`~specmoe.kernels.KernelFallbackWarning` naming the reason
(:mod:`specmoe.kernels._fallback`).

``per_slot_torch`` multiplies each (token, slot) by a view of its expert (``F.linear`` on one
row: a GEMV). ``dedup_torch`` groups the pass by expert and runs ``F.linear`` on each group's
rows; it is the straightforward deduplicating kernel, and on this kind of CPU it is the slow
one the paper describes (a small-row matrix product moves far fewer bytes per second than a
one-row product), which is why the C kernel exists.

Threads: the C kernels use :func:`num_threads` threads (``$SPECMOE_NUM_THREADS``, else
``torch.get_num_threads()``), split by output rows: each output has a single writer and is
summed in one fixed order, so the result is bitwise the same for any thread count.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from specmoe.errors import InputError
from specmoe.kernels import _cbuild
from specmoe.kernels._contract import OAI_ALPHA, OAI_LIMIT, activate, check_inputs
from specmoe.kernels._fallback import KernelImpl, impl_of, run_fallback
from specmoe.kernels.q8 import Q8Weights, quantize_q8_0

__all__ = ["Q8Weights", "dedup", "per_slot", "quantize_q8_0"]

_WT_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, "q8_0": 3}
_threads: int | None = None


def num_threads() -> int:
    """Threads the C kernels use."""
    if _threads is not None:
        return _threads
    env = os.environ.get("SPECMOE_NUM_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, torch.get_num_threads())


def set_num_threads(k: int | None) -> None:
    """Set the C kernels' thread count (None: back to the default)."""
    global _threads
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise InputError(f"threads: must be a positive integer, got {k!r}")
    _threads = k


def set_bf16_dot(on: bool) -> bool:
    """Use or not the C kernels' AVX-512 BF16 path for bfloat16 weights (vdpbf16ps on bf16
    activations; without it bf16 weights are widened to fp32, the path of processors without
    AVX-512 BF16). The default is on (``$SPECMOE_BF16_DOT=0|1`` decides instead:
    :func:`specmoe.kernels._cbuild.bf16_dot_default`). Returns the previous
    setting; a no-op returning False when the build has no such path. Set it between calls,
    not during one."""
    return _set_path("bf16dp", on)


def set_f32_zmm(on: bool) -> bool:
    """Use or not the C kernels' AVX-512F path for float32 weights (16-lane register blocks;
    without it fp32 weights take the AVX2 blocks). Built where it was measured ahead
    (:func:`specmoe.kernels._cbuild.flag_sets`), and on by default there. Returns the previous
    setting; a no-op returning False when the build has no such path. Set it between calls,
    not during one."""
    return _set_path("f32z", on)


def _set_path(name: str, on: bool) -> bool:
    """Switch the build's path ``name`` (``bf16dp``, ``f32z``) on or off: the previous
    setting, or False (a no-op) where the build has no such path."""
    lib = _cbuild.load()
    if lib is None or not getattr(lib, name):
        return False
    return bool(getattr(lib.lib, f"specmoe_set_{name}")(1 if on else 0))


def set_q8_portable(on: bool) -> bool:
    """Run q8_0 weights through the C kernels' portable loop (True; the path of processors
    without AVX2) or their vector register blocks (False, the default). Returns the previous
    setting; False when the C kernels are not loaded. Set it between calls, not during one."""
    lib = _cbuild.load()
    if lib is None:
        return False
    return bool(lib.lib.specmoe_set_q8_portable(1 if on else 0))


def set_q8_activations(kind: str) -> str:
    """The activations q8_0 weights are multiplied with: ``"float32"`` (the default: the
    weights dequantised to fp32, within ``TOL["q8_0"]`` of the contract on the dequantised
    weights) or ``"int16"`` (each 32-element block of x and of the intermediate activation
    rounded to int16 with its own scale, integer products with ``vpmaddwd``, AVX2 builds
    only; within ``TOL["q8_0_i16"]``). Returns the previous kind; ``"float32"`` and no change
    when the C kernels are not loaded. Set it between calls, not during one."""
    if kind not in ("float32", "int16"):
        raise InputError(f"must be float32 or int16, got {kind!r}", argument="kind")
    lib = _cbuild.load()
    if lib is None:
        return "float32"
    prev = lib.lib.specmoe_set_q8_mode(1 if kind == "int16" and lib.avx2 else 0)
    return "int16" if prev else "float32"


def c_available() -> bool:
    return _cbuild.load() is not None


def c_status() -> dict:
    """The C compiler and build status (:meth:`specmoe.kernels._cbuild.Build.status`)."""
    return _cbuild.build().status()


def c_reason(*, device: str, dtype: torch.dtype | str, strided: bool) -> str | None:
    """Why the C kernels cannot take a call on ``device`` with weights of ``dtype`` (a torch
    dtype, or ``"q8_0"``; ``strided``: a weight tensor's last dimension is not contiguous);
    None when they can."""
    if _cbuild.load() is None:
        return _cbuild.build().error or "the C kernels are not loaded"
    if device != "cpu":
        return f"the tensors are on {device}; the C kernel runs on the CPU"
    if dtype not in _WT_CODE:
        return (
            f"weights are {str(dtype).removeprefix('torch.')}; the C kernel takes "
            "float32, bfloat16, float16 and q8_0"
        )
    if strided:
        return "a weight tensor's last dimension is strided; the C kernel reads it contiguously"
    return None


def implementation_of(
    name: str,
    *,
    device: str = "cpu",
    dtype: torch.dtype | str = torch.float32,
    strided: bool = False,
) -> KernelImpl:
    """The implementation the C kernel ``name`` (per_slot or dedup) runs for such inputs."""
    reason = c_reason(device=device, dtype=dtype, strided=strided)
    return impl_of(name, device, requested="c", reason=reason, compiler=c_status())


# --------------------------------------------------------------------------------------------
# C kernels


def _c_expert_op(
    mode: int,
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    activation: str,
    b_gate_up: torch.Tensor | None,
    b_down: torch.Tensor | None,
    check: bool,
) -> torch.Tensor:
    q8 = _q8_pair(x, w_gate_up, w_down)
    n, m, num, h, inter = check_inputs(
        x,
        _stand_in(x, w_gate_up) if q8 else w_gate_up,
        _stand_in(x, w_down) if q8 else w_down,
        ids,
        weights,
        activation=activation,
        b_gate_up=b_gate_up,
        b_down=b_down,
        check_ids=False,
    )
    name = "per_slot" if mode == 0 else "dedup"
    tgu = w_gate_up.blocks if q8 else w_gate_up
    tdn = w_down.blocks if q8 else w_down
    wtype = "q8_0" if q8 else w_gate_up.dtype
    strided = tgu.stride(2) != 1 or tdn.stride(2) != 1
    if c_reason(device=x.device.type, dtype=wtype, strided=strided) is not None:
        impl = implementation_of(name, device=x.device.type, dtype=wtype, strided=strided)
        fallback = per_slot_torch if mode == 0 else dedup_torch
        opts = {"activation": activation, "b_gate_up": b_gate_up, "b_down": b_down}
        if q8:  # the torch kernels take the dequantised weights, in x's dtype
            w_gate_up, w_down = w_gate_up.dequantize(x.dtype), w_down.dequantize(x.dtype)
        return run_fallback(impl, fallback, x, w_gate_up, w_down, ids, weights, **opts, check=check)
    lib = _cbuild.load()
    xf = x.detach().to(torch.float32).contiguous()  # [n, h]
    idc = ids.detach().to(torch.int64).contiguous()  # [n, m]
    wf = weights.detach().to(torch.float32).contiguous()  # [n, m]
    bgu = None if b_gate_up is None else b_gate_up.detach().to(torch.float32).contiguous()
    bd = None if b_down is None else b_down.detach().to(torch.float32).contiguous()
    y = torch.zeros(n, h, dtype=torch.float32)
    rc = lib.lib.specmoe_expert_op(
        xf.data_ptr(),
        n,
        h,
        tgu.data_ptr(),
        tdn.data_ptr(),
        _WT_CODE[wtype],
        inter,
        tgu.stride(0),
        tgu.stride(1),
        tdn.stride(0),
        tdn.stride(1),
        None if bgu is None else bgu.data_ptr(),
        None if bd is None else bd.data_ptr(),
        idc.data_ptr(),
        wf.data_ptr(),
        m,
        num,
        mode,
        0 if activation == "swiglu" else 1,
        OAI_ALPHA,
        OAI_LIMIT,
        num_threads(),
        y.data_ptr(),
    )
    if rc == -1:
        lo, hi = int(idc.min()), int(idc.max())
        raise InputError(f"ids: expert id {lo if lo < 0 else hi} outside [0, {num})")
    if rc == -3:  # not reached: Q8Weights holds whole 32-weight blocks
        raise InputError(f"w_gate_up/w_down: q8_0 rows need h={h} and I={inter} multiples of 32")
    if rc != 0:
        raise MemoryError(f"expert kernel: allocation failed (code {rc})")
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def _q8_pair(x, w_gate_up, w_down) -> bool:
    """True when both weight tensors are :class:`Q8Weights`; one of them alone is an error."""
    a, b = isinstance(w_gate_up, Q8Weights), isinstance(w_down, Q8Weights)
    if a != b:
        which = "w_down" if a else "w_gate_up"
        raise InputError(f"{which}: q8_0 weights need both w_gate_up and w_down in q8_0")
    if a and isinstance(x, torch.Tensor) and not x.dtype.is_floating_point:
        raise InputError(f"x: must be floating, got dtype {x.dtype}")
    return a


def _stand_in(x, w: Q8Weights) -> torch.Tensor:
    """A zero-stride tensor of w's logical shape, x's dtype and w's device, for the contract's
    shape checks (no memory)."""
    dt = x.dtype if isinstance(x, torch.Tensor) else torch.float32
    return torch.zeros((), dtype=dt, device=w.device).expand(w.shape)


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
    """Per-slot kernel (C): one GEMV chain per (token, slot), n·m·b requested bytes. Weights:
    float32/bfloat16/float16 tensors of x's dtype, or both :class:`Q8Weights` (x floating)."""
    return _c_expert_op(0, x, w_gate_up, w_down, ids, weights, activation, b_gate_up, b_down, check)


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
    """Deduplicating kernel (C): each distinct expert streamed once per pass, U·b bytes.
    Weights as :func:`per_slot`'s."""
    return _c_expert_op(1, x, w_gate_up, w_down, ids, weights, activation, b_gate_up, b_down, check)


# --------------------------------------------------------------------------------------------
# Pure-torch kernels (fallbacks and measured alternatives)


def per_slot_torch(
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
    """Per-slot kernel in torch: ``F.linear`` of one row with a view ``W[e]`` per slot."""
    n, m, _, h, _ = check_inputs(
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
    acc = torch.float32 if x.dtype != torch.float64 else torch.float64
    y = torch.zeros(n, h, dtype=acc, device=x.device)
    idl = ids.tolist()
    wts = weights.to(acc)
    for t in range(n):
        xt = x[t : t + 1]  # [1, h]
        for j in range(m):
            e = idl[t][j]
            gu = F.linear(xt, w_gate_up[e], None if b_gate_up is None else b_gate_up[e])
            out = F.linear(
                activate(gu, activation), w_down[e], None if b_down is None else b_down[e]
            )  # [1, h]
            y[t] += wts[t, j] * out[0].to(acc)
    return y.to(x.dtype)


def group_by_expert(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    """Slots grouped by expert: (order [nm] slot indices sorted by expert (stable),
    token of each sorted slot [nm], distinct experts [U], group sizes [U])."""
    flat = ids.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
    return order, order // ids.shape[1], experts.tolist(), counts.tolist()


def dedup_torch(
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
    """Deduplicating kernel in torch: ``F.linear`` on each expert's rows, then a scatter-add."""
    n, _, _, h, _ = check_inputs(
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
    acc = torch.float32 if x.dtype != torch.float64 else torch.float64
    order, tok, experts, counts = group_by_expert(ids)
    wflat = weights.reshape(-1)[order].to(acc)
    y = torch.zeros(n, h, dtype=acc, device=x.device)
    start = 0
    for e, k in zip(experts, counts):
        rows = tok[start : start + k]
        gu = F.linear(x[rows], w_gate_up[e], None if b_gate_up is None else b_gate_up[e])
        out = F.linear(
            activate(gu, activation), w_down[e], None if b_down is None else b_down[e]
        )  # [k, h]
        y.index_add_(0, rows, out.to(acc) * wflat[start : start + k, None])
        start += k
    return y.to(x.dtype)
