"""The kernel contract as a standalone check: every kernel against ``reference`` on a device.

:func:`check` runs the cases of ``tests/test_kernels.py`` (pass sizes 1..16, slots 1..8,
repetition patterns, float32 / bfloat16 / float16, gpt-oss's activation with biases) for one
kernel, where pytest is not installed, e.g. on a bare GPU machine; :func:`kernels_to_check`
names the kernels of a device and :func:`summary_line` says one kernel's outcome. The command
line is ``scripts/kernel_selfcheck.py [--device cuda] [--kernels a,b] [--json]`` (exit status 0
when every case is within tolerance, 1 otherwise, 2 for bad input), run by
``scripts/gpu_check.sh``.

Tolerances (relative L2 error against the float64 reference on the same rounded inputs):
float32 1e-5, float16 5e-3, bfloat16 3e-2 (kernels may round the activation to the weight
dtype between the two products, as transformers' do). ``q8_0`` (the C kernels' llama.cpp q8_0
weights, :mod:`specmoe.kernels.q8`, with float32 activations): 1e-5 against the reference on
the *dequantised* weights, since the kernels dequantise exactly and keep the activations in
float32; the quantisation error itself (against the float weights before quantisation, about
1e-2 on these cases) is not part of the tolerance, :func:`check` reports it as
``quantization_error``. ``q8_0_i16`` (the C kernels' optional int16 activation blocks,
:func:`specmoe.kernels.cpu.set_q8_activations`): 2e-4 on the same reference (each activation
rounded to 2^-16 of its block's largest; about 5e-5 measured).
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Sequence

import torch

from specmoe.errors import InputError

TOL = {
    torch.float32: 1e-5,
    torch.float16: 5e-3,
    torch.bfloat16: 3e-2,
    "q8_0": 1e-5,
    "q8_0_i16": 2e-4,  # q8_0 with int16 activation blocks (cpu.set_q8_activations("int16"))
}
# q8_0 rows are whole 32-weight blocks: h and I multiples of 32
Q8_SHAPES = [(1, 1, 4), (1, 8, 12), (2, 3, 7), (5, 2, 6), (9, 4, 10), (16, 8, 24)]
Q8_KERNELS = ("per_slot", "dedup")  # the kernels with a q8_0 path (CPU)
SHAPES = [(1, 1, 4), (1, 8, 12), (2, 3, 7), (5, 2, 6), (9, 4, 10), (16, 8, 24), (16, 1, 3)]
HALF_SHAPES = [(1, 8, 12), (3, 8, 16), (9, 4, 10), (16, 8, 24)]
PATTERNS = ["random", "same_set", "all_one", "no_repeats", "duplicates"]


def make_ids(n: int, m: int, num: int, pattern: str, g: torch.Generator) -> torch.Tensor:
    """[n, m] expert ids following ``pattern``."""
    if pattern == "random":  # distinct within each token, as a router's
        return torch.stack([torch.randperm(num, generator=g)[:m] for _ in range(n)])
    if pattern == "same_set":  # every token names the same m experts: U = m
        s = torch.randperm(num, generator=g)[:m]
        return torch.stack([s[torch.randperm(m, generator=g)] for _ in range(n)])
    if pattern == "all_one":  # every slot on one expert (repeats within tokens too)
        return torch.full((n, m), int(torch.randint(num, (1,), generator=g)))
    if pattern == "no_repeats":  # U = min(nm, N): as few repeats as N allows
        k = n * m
        return (torch.randperm(max(num, k), generator=g)[:k] % num).reshape(n, m)
    if pattern == "duplicates":  # drawn with replacement, repeats within tokens allowed
        return torch.randint(num, (n, m), generator=g)
    raise ValueError(f"pattern: unknown {pattern!r}")


def make_case(n, m, num, pattern, dtype, *, h=32, inter=24, seed=0, bias=False, device="cpu"):
    """(x, w_gate_up, w_down, ids, weights, biases) of one contract case."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g)
    wgu = torch.randn(num, 2 * inter, h, generator=g) / h**0.5
    wd = torch.randn(num, h, inter, generator=g) / inter**0.5
    ids = make_ids(n, m, num, pattern, g)
    w = torch.rand(n, m, generator=g)
    bgu = torch.randn(num, 2 * inter, generator=g) * 0.5 if bias else None
    bd = torch.randn(num, h, generator=g) * 0.5 if bias else None

    def cast(t):
        return None if t is None else t.to(device, dtype)

    return (
        cast(x),
        cast(wgu),
        cast(wd),
        ids.to(device),
        w.to(device),
        {"b_gate_up": cast(bgu), "b_down": cast(bd)},
    )


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """‖y − ref‖ / ‖ref‖ in float64 on the CPU."""
    yd, rd = y.detach().double().cpu(), ref.detach().double().cpu()
    return float((yd - rd).norm() / rd.norm())


def cases(kernel: str | None = None, device: str = "cpu"):
    """(label, n, m, N, pattern, dtype, activation, bias) of every check of ``kernel`` on
    ``device`` (the q8_0 cases only for the kernels of :data:`Q8_KERNELS` on the CPU; every
    case when ``kernel`` is None)."""
    for n, m, num in SHAPES:
        for p in PATTERNS:
            yield (f"n{n}-m{m}-N{num}-{p}-fp32", n, m, num, p, torch.float32, "swiglu", False)
    for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        for n, m, num in HALF_SHAPES:
            yield (f"n{n}-m{m}-N{num}-random-{name}", n, m, num, "random", dt, "swiglu", False)
    for p in ("random", "same_set"):
        yield (f"n6-m4-N9-{p}-oai-bias", 6, 4, 9, p, torch.float32, "swiglu_oai", True)
    if kernel is not None and (kernel not in Q8_KERNELS or device != "cpu"):
        return
    for n, m, num in Q8_SHAPES:
        for p in ("random", "duplicates"):
            yield (f"n{n}-m{m}-N{num}-{p}-q8_0", n, m, num, p, "q8_0", "swiglu", False)


def check(kernel: str, device: str) -> list[dict]:
    """Run every case for one kernel; each result has label, error, tolerance, ok, note."""
    from specmoe.kernels import get_kernel, reference
    from specmoe.kernels.q8 import quantize_q8_0

    fn = get_kernel(kernel, device)
    out = []
    for label, n, m, num, pattern, dtype, act, bias in cases(kernel, device):
        q8 = dtype == "q8_0"
        x, wgu, wd, ids, w, b = make_case(
            n,
            m,
            num,
            pattern,
            torch.float32 if q8 else dtype,
            bias=bias,
            device=device,
            **({"h": 64, "inter": 32} if q8 else {}),
        )
        if act == "swiglu_oai":
            x = x * 8
        rec = {"kernel": kernel, "case": label, "tol": TOL[dtype]}
        try:
            if q8:  # the kernel on q8_0 weights, the reference on their dequantised values
                qgu, qd = quantize_q8_0(wgu), quantize_q8_0(wd)
                y = fn(x, qgu, qd, ids, w, activation=act, **b)
                ref = reference.expert_op(
                    x, qgu.dequantize(), qd.dequantize(), ids, w, activation=act, **b
                )
                rec["quantization_error"] = rel_err(
                    y, reference.expert_op(x, wgu, wd, ids, w, activation=act, **b)
                )
            else:
                y = fn(x, wgu, wd, ids, w, activation=act, **b)
                ref = reference.expert_op(x, wgu, wd, ids, w, activation=act, **b)
            want = x.dtype if q8 else dtype
            ok_shape = tuple(y.shape) == tuple(x.shape) and y.dtype == want
            err = rel_err(y, ref)
            rec.update(
                error=err,
                ok=bool(ok_shape and err < TOL[dtype]),
                note="" if ok_shape else f"shape/dtype {tuple(y.shape)} {y.dtype}",
            )
        except Exception as exc:
            rec.update(
                error=None,
                ok=False,
                note=f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}",
                trace=traceback.format_exc(limit=3),
            )
        out.append(rec)
    return out


def kernels_to_check(device: str = "cpu", kernels: Sequence[str] | None = None) -> list[str]:
    """The kernels to check on ``device``: ``kernels`` (each with an implementation there) or,
    when None, every registered one but ``reference``. No CUDA device for ``device="cuda"``, or
    a kernel without an implementation on ``device``, is an ``InputError``."""
    from specmoe.kernels import kernel_names

    if device not in ("cpu", "cuda"):
        raise InputError(f"must be cpu or cuda, got {device!r}", argument="device")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("no CUDA device", argument="device")
    have = kernel_names(device)
    if kernels is None:
        return [k for k in have if k != "reference"]
    names = [k for k in kernels if k]
    bad = [k for k in names if k not in have]
    if bad or not names:
        what = f"no kernel {bad[0]!r} on {device}" if bad else "names no kernel"
        raise InputError(f"{what} (choose from {', '.join(have)})", argument="kernels")
    return names


def summary_line(kernel: str, device: str, results: list[dict]) -> str:
    """One kernel's outcome from :func:`check`: how many cases are within tolerance, the
    largest error, and the first five failures (one line each, indented)."""
    bad = [r for r in results if not r["ok"]]
    worst = max((r["error"] for r in results if r["error"] is not None), default=math.nan)
    return (
        f"{kernel:>16} on {device}: {len(results) - len(bad)}/{len(results)} within tolerance, "
        f"largest error {worst:.2e}"
        + "".join(f"\n    FAIL {r['case']}: {r['note'] or r['error']}" for r in bad[:5])
    )
