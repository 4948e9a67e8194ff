"""q8_0 weights in the C per-slot and deduplicating kernels (specmoe.kernels.q8, .cpu).

The layout against an independent numpy implementation of ggml's ``quantize_row_q8_0_ref``
(always) and against ggml's own quantisation (bit-equal bytes; skipped when llama.cpp is not
built); both kernels against the float64 reference on the dequantised weights, within
``TOL["q8_0"]``, for n = 1..9, odd expert counts and repeated ids, on the vector and the
portable loops; dedup equal to per-slot for random ids (hypothesis); bad inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specmoe.errors import InputError
from specmoe.kernels import reference
from specmoe.kernels.q8 import BYTES_PER_WEIGHT, Q8Weights, dequantize_q8_0, quantize_q8_0
from specmoe.kernels.selfcheck import PATTERNS, TOL, make_case, rel_err

cpu = pytest.importorskip("specmoe.kernels.cpu")
needs_c = pytest.mark.skipif(not cpu.c_available(), reason="no C compiler")


def _np_q8_0(w: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_0_ref in numpy: per 32 weights d = amax / 127 (float32),
    q = roundf(x * (1 / d)) (half away from zero), then the fp16 d and the 32 int8 bytes."""
    x = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (x * inv[:, None]).astype(np.float32)
    q = (np.sign(v) * np.floor(np.abs(v) + np.float64(0.5))).astype(np.int8)  # float64: exact
    out = np.concatenate([d.astype("<f2").view(np.uint8).reshape(-1, 2), q.view(np.uint8)], 1)
    return out.reshape(*w.shape[:-1], w.shape[-1] // 32 * 34)


def _weights(num, rows, cols, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(num, rows, cols, generator=g)
    w[0, 0, :32] = 0.0  # an all-zero block: d = 0
    w[0, 1, :32] = torch.arange(32) - 15.5  # halves at the scale's ties
    return w


def test_layout_matches_numpy_reference_of_ggml_rounding():
    w = _weights(3, 5, 96)
    q = quantize_q8_0(w)
    assert q.blocks.dtype == torch.uint8 and tuple(q.blocks.shape) == (3, 5, 3 * 34)
    assert np.array_equal(q.blocks.numpy(), _np_q8_0(w.numpy()))
    # a block's layout: the fp16 d first (little-endian), then the 32 int8
    blk = q.blocks[0, 2, :34].numpy()
    x = w[0, 2, :32].numpy()
    d = np.float32(np.abs(x).max() / np.float32(127))
    assert blk[:2].view("<f2")[0] == np.float16(d)
    v = x.astype(np.float64) * np.float64(np.float32(1) / d)
    assert blk[2:].view(np.int8).tolist() == np.trunc(v + np.copysign(0.5, v)).astype(int).tolist()
    assert np.abs(blk[2:].view(np.int8).astype(int)).max() == 127
    assert q.blocks[0, 0, :34].eq(0).all()  # the zero block: d = 0 and every q = 0


def test_round_half_away_from_zero_and_dequantize():
    # x / d = k + 1/2 exactly: roundf goes away from zero, torch.round would go to even
    x = torch.zeros(1, 1, 32)
    x[0, 0, 0] = 127.0
    x[0, 0, 1:6] = torch.tensor([0.5, 1.5, -2.5, -0.5, 126.5])
    q = quantize_q8_0(x)
    qi = q.blocks[0, 0, 2:].view(torch.int8)
    assert qi[:6].tolist() == [127, 1, 2, -3, -1, 127]
    dq = q.dequantize()
    assert torch.equal(dq, dequantize_q8_0(q.blocks, 32))
    assert torch.equal(dq[0, 0, :6], torch.tensor([127.0, 1.0, 2.0, -3.0, -1.0, 127.0]))
    w = _weights(2, 4, 64)
    err = (quantize_q8_0(w).dequantize() - w).abs()
    amax = w.reshape(2, 4, 2, 32).abs().amax(-1, keepdim=True)
    # half a step, plus the fp16 rounding of d (relative 2^-11) on up to 127 steps
    bound = amax / 127 * (0.5 + 127 * 2.0**-11) * 1.001 + 1e-7
    assert (err.reshape(2, 4, 2, 32) <= bound).all()


def test_bytes_per_weight_is_the_spec_and_ggml_figure():
    from specmoe.spec import dtype_bytes

    q = quantize_q8_0(_weights(2, 3, 64))
    assert BYTES_PER_WEIGHT == dtype_bytes("q8_0") == 34 / 32
    assert q.nbytes == 2 * 3 * 64 * 34 // 32 and q.expert_bytes() == 3 * 64 * 34 // 32


def test_layout_bit_equal_to_ggml_quantize():
    from specmoe.engines import ggml_mmid, llamacpp

    if not llamacpp.is_built():
        pytest.skip(f"llama.cpp {llamacpp.VERSION} is not built (make llama-cpp)")
    w = _weights(4, 6, 128, seed=3)
    ours = quantize_q8_0(w).blocks.numpy()
    theirs = ggml_mmid.quantize(w.numpy(), "q8_0")
    assert np.array_equal(ours, theirs)
    assert np.array_equal(
        quantize_q8_0(w).dequantize().numpy(), ggml_mmid.dequantize(theirs, "q8_0", 128)
    )


@pytest.fixture(params=["vector", "portable", "int16"])
def q8_loop(request):
    """The q8_0 paths: fp32 register blocks, the portable loop, int16 activation blocks."""
    if not cpu.c_available():
        pytest.skip("no C compiler")
    if request.param == "int16" and not cpu.c_status()["avx2"]:
        pytest.skip("int16 activation blocks need AVX2")
    prev = cpu.set_q8_portable(request.param == "portable")
    prev_act = cpu.set_q8_activations("int16" if request.param == "int16" else "float32")
    yield request.param
    cpu.set_q8_portable(prev)
    cpu.set_q8_activations(prev_act)


def _q8_case(n, m, num, pattern, h=64, inter=96, seed=0):
    x, wgu, wd, ids, w, _ = make_case(
        n, m, num, pattern, torch.float32, h=h, inter=inter, seed=seed
    )
    qgu, qd = quantize_q8_0(wgu), quantize_q8_0(wd)
    ref = reference.expert_op(x, qgu.dequantize(), qd.dequantize(), ids, w)
    return x, qgu, qd, ids, w, ref, (wgu, wd)


@pytest.mark.parametrize("kernel", ["per_slot", "dedup"])
@pytest.mark.parametrize("n", range(1, 10))
def test_kernels_match_reference_on_dequantized_weights(q8_loop, kernel, n):
    fn = getattr(cpu, kernel)
    for m, num, pattern in ((8, 64, "random"), (3, 7, "duplicates"), (5, 5, "all_one")):
        x, qgu, qd, ids, w, ref, _ = _q8_case(n, m, num, pattern, seed=n)
        y = fn(x, qgu, qd, ids, w)
        assert y.dtype == torch.float32 and y.shape == x.shape
        tol = TOL["q8_0_i16"] if q8_loop == "int16" else TOL["q8_0"]
        err = rel_err(y, ref)
        assert err < tol, (kernel, n, m, num, pattern)
        if q8_loop == "int16":  # the int16 rounding is there: not the fp32 path by mistake
            assert err > TOL["q8_0"]


@needs_c
@pytest.mark.parametrize("pattern", PATTERNS)
def test_patterns_and_quantization_error_reported_apart(pattern):
    x, qgu, qd, ids, w, ref, (wgu, wd) = _q8_case(9, 4, 11, pattern, h=128, inter=64)
    for fn in (cpu.per_slot, cpu.dedup):
        y = fn(x, qgu, qd, ids, w)
        assert rel_err(y, ref) < TOL["q8_0"]
        # against the weights before quantisation: the q8_0 error, far above TOL, below 3%
        q_err = rel_err(y, reference.expert_op(x, wgu, wd, ids, w))
        assert 10 * TOL["q8_0"] < q_err < 3e-2


@needs_c
def test_bf16_activations_and_biases():
    x, wgu, wd, ids, w, b = make_case(
        4, 3, 5, "duplicates", torch.float32, h=64, inter=32, bias=True
    )
    qgu, qd = quantize_q8_0(wgu), quantize_q8_0(wd)
    xb = x.bfloat16()
    for act in ("swiglu", "swiglu_oai"):
        ref = reference.expert_op(
            xb.float(), qgu.dequantize(), qd.dequantize(), ids, w, activation=act, **b
        )
        y = cpu.dedup(xb, qgu, qd, ids, w, activation=act, **b)
        assert y.dtype == torch.bfloat16
        assert rel_err(y, ref) < 1e-2  # the output rounded to bf16
        y32 = cpu.per_slot(x, qgu, qd, ids, w, activation=act, **b)
        assert (
            rel_err(
                y32,
                reference.expert_op(
                    x, qgu.dequantize(), qd.dequantize(), ids, w, activation=act, **b
                ),
            )
            < TOL["q8_0"]
        )


@needs_c
def test_threads_bitwise_equal_and_portable_close():
    # 3·h·I·1.0625 bytes = 1.6 MiB per expert: above the size from which the kernel threads
    x, qgu, qd, ids, w, ref, _ = _q8_case(9, 8, 20, "duplicates", h=1024, inter=512)
    outs = {}
    try:
        for k in (1, 2, 3):
            cpu.set_num_threads(k)
            outs[k] = (cpu.per_slot(x, qgu, qd, ids, w), cpu.dedup(x, qgu, qd, ids, w))
    finally:
        cpu.set_num_threads(None)
    for k in (2, 3):
        assert torch.equal(outs[1][0], outs[k][0]) and torch.equal(outs[1][1], outs[k][1])
    assert rel_err(outs[1][0], ref) < TOL["q8_0"] and rel_err(outs[1][1], ref) < TOL["q8_0"]


@needs_c
@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 12),
    m=st.integers(1, 6),
    num=st.integers(1, 9),
    seed=st.integers(0, 2**16),
    h=st.sampled_from([32, 64, 96, 160]),
    inter=st.sampled_from([32, 48 * 2, 80 * 2]),
)
def test_dedup_equals_per_slot_for_random_ids(n, m, num, seed, h, inter):
    """Random ids, and row counts (2·inter gate/up rows, h down rows) that leave every
    remainder after the far-apart blocks of 4, 3 and 2 rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g)
    qgu = quantize_q8_0(torch.randn(num, 2 * inter, h, generator=g))
    qd = quantize_q8_0(torch.randn(num, h, inter, generator=g))
    ids = torch.randint(num, (n, m), generator=g)  # repeats within and across tokens
    w = torch.rand(n, m, generator=g)
    ys, yd = cpu.per_slot(x, qgu, qd, ids, w), cpu.dedup(x, qgu, qd, ids, w)
    ref = reference.expert_op(x, qgu.dequantize(), qd.dequantize(), ids, w)
    assert rel_err(yd, ys) < 2 * TOL["q8_0"]
    assert rel_err(ys, ref) < TOL["q8_0"] and rel_err(yd, ref) < TOL["q8_0"]


def test_set_q8_activations_names_its_argument():
    with pytest.raises(InputError, match=r"^kind: must be float32 or int16, got 'int8'$"):
        cpu.set_q8_activations("int8")


def test_implementation_reports_q8_0():
    impl = cpu.implementation_of("dedup", dtype="q8_0")
    if cpu.c_available():
        assert impl.ran == "c" and impl.fallback is None
        assert "q8_0" in cpu.c_reason(device="cpu", dtype="q4_0", strided=False)
        assert "q8_0" in cpu.c_reason(device="cpu", dtype=torch.float64, strided=False)
        assert "strided" in cpu.c_reason(device="cpu", dtype="q8_0", strided=True)


def test_falls_back_to_torch_on_dequantized_weights(monkeypatch):
    from specmoe.kernels import KernelFallbackWarning, _cbuild, _fallback

    monkeypatch.setattr(_fallback, "_warned", set())
    monkeypatch.setattr(_cbuild, "find_compiler", lambda: None)
    _cbuild.build.cache_clear()
    try:
        x, qgu, qd, ids, w, ref, _ = _q8_case(3, 2, 5, "duplicates", h=32, inter=32)
        with pytest.warns(KernelFallbackWarning, match="dedup_torch"):
            y = cpu.dedup(x, qgu, qd, ids, w)
        assert rel_err(y, ref) < TOL["q8_0"]
    finally:
        _cbuild.build.cache_clear()


def test_bad_inputs_are_one_line_input_errors():
    with pytest.raises(InputError, match=r"^w: q8_0 rows need a multiple of 32 columns, got 40$"):
        quantize_q8_0(torch.randn(2, 3, 40))
    with pytest.raises(InputError, match=r"^w: expected a floating \[N, rows, cols\]"):
        quantize_q8_0(torch.randn(3, 64))
    with pytest.raises(InputError, match=r"^w: expected a floating"):
        quantize_q8_0(torch.zeros(1, 2, 32, dtype=torch.int32))
    with pytest.raises(InputError, match=r"^blocks: 33 bytes per row"):
        Q8Weights(torch.zeros(1, 2, 33, dtype=torch.uint8), 32)
    with pytest.raises(InputError, match=r"^cols: q8_0 rows need a multiple of 32"):
        Q8Weights(torch.zeros(1, 2, 34, dtype=torch.uint8), 31)
    with pytest.raises(InputError, match=r"^blocks: expected a uint8"):
        Q8Weights(torch.zeros(1, 2, 34, dtype=torch.int8), 32)
    x, qgu, qd, ids, w, _, (wgu, wd) = _q8_case(2, 2, 4, "random", h=64, inter=32)
    with pytest.raises(InputError, match=r"^w_down: q8_0 weights need both"):
        cpu.dedup(x, qgu, wd, ids, w)
    with pytest.raises(InputError, match=r"^w_gate_up: q8_0 weights need both"):
        cpu.per_slot(x, wgu, qd, ids, w)
    with pytest.raises(InputError, match=r"^w_down: expected \[N, h, I\]"):
        cpu.per_slot(x, qgu, quantize_q8_0(torch.randn(4, 64, 64)), ids, w)
    with pytest.raises(InputError, match=r"^w_gate_up: expected \[N, 2I, h=32\]"):
        cpu.per_slot(x[:, :32], qgu, qd, ids, w)
    if cpu.c_available():
        with pytest.raises(InputError, match=r"^ids: expert id 4 outside \[0, 4\)"):
            cpu.dedup(x, qgu, qd, torch.full_like(ids, 4), w)


def _kernel_q8_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_q8.py"
    spec = importlib.util.spec_from_file_location("kernel_q8", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    ("argv", "flag"),
    [(["--n", "0"], "--n"), (["--n", "a,b"], "--n"), (["--threads", "2"], "--threads")],
)
def test_kernel_q8_benchmark_bad_input_is_one_line_exit_2(argv, flag, capsys):
    assert _kernel_q8_script().main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kernel_q8.py: {flag}:") and "\n" not in err
