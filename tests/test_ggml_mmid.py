"""ggml's CPU MUL_MAT_ID harness (specmoe.engines.ggml_mmid) and the ``ggml`` peer kernel:
the same numbers as the float64 reference and as specmoe's own kernels, q8_0 within its
quantization error, exact byte accounting, and one-line errors for bad input.

Skipped when llama.cpp is not built (``make llama-cpp``) unless SPECMOE_REQUIRE_LLAMACPP=1.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from specmoe.engines import ggml_mmid, llamacpp
from specmoe.errors import InputError
from specmoe.kernels import get_kernel, reference
from specmoe.kernels.selfcheck import PATTERNS, SHAPES, TOL, make_case, rel_err

REQUIRED = bool(os.environ.get("SPECMOE_REQUIRE_LLAMACPP"))
needs_build = pytest.mark.skipif(
    not llamacpp.is_built() and not REQUIRED,
    reason=f"llama.cpp {llamacpp.VERSION} is not built (make llama-cpp)",
)


def test_missing_build_is_one_input_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMOE_LLAMA_CPP_CACHE", str(tmp_path))
    ggml_mmid.build.cache_clear()
    try:
        with pytest.raises(InputError, match="make llama-cpp"):
            ggml_mmid.build()
    finally:
        ggml_mmid.build.cache_clear()


def test_row_sizes_and_bytes_exact():
    # q8_0: 34 bytes per 32 weights; d = 64, m = 32: a gate or up expert is 32 rows of 68 B,
    # a down expert 64 rows of 34 B.
    assert ggml_mmid.row_size("q8_0", 64) == 68
    assert ggml_mmid.row_size("bf16", 64) == 128
    assert ggml_mmid.row_size("f32", 24) == 96
    assert ggml_mmid.weight_bytes("q8_0", 64, 32) == {
        "gate": 2176,
        "up": 2176,
        "down": 2176,
        "ffn": 6528,
    }
    ids = np.array([[0, 1], [1, 2], [2, 0]])  # U = 3 of 6 slots
    assert ggml_mmid.op_bytes(ids, "q8_0", 64, 32) == 3 * 6528
    assert ggml_mmid.op_bytes(ids, "bf16", 2048, 1024, "down") == 3 * 2048 * 1024 * 2
    # OLMoE-1B-7B: one expert's FFN in q8_0 is 3 · 2048 · 1024 · 34/32 bytes.
    assert ggml_mmid.weight_bytes("q8_0", 2048, 1024)["ffn"] == 3 * 2048 * 1024 * 34 // 32


def test_bad_shapes_and_names_are_value_errors():
    with pytest.raises(ValueError, match="wtype"):
        ggml_mmid.row_size("q4_0", 64)
    with pytest.raises(ValueError, match="multiple of q8_0's block of 32"):
        ggml_mmid.row_size("q8_0", 48)
    with pytest.raises(ValueError, match="op"):
        ggml_mmid.op_bytes(np.zeros((1, 1), int), "f32", 4, 4, op="all")
    with pytest.raises(ValueError, match=r"ids: experts must lie in \[0, 4\)"):
        ggml_mmid.check_ids(np.array([[0, 4]]), 4)
    with pytest.raises(ValueError, match="ids: need a 2-d"):
        ggml_mmid.check_ids(np.array([0, 1]), 4)
    with pytest.raises(ValueError, match="ids: 2 slots per token, expected top_k = 3"):
        ggml_mmid.check_ids(np.array([[0, 1]]), 4, 3)


def _case(n, k, num, d=64, m=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    wgu = (rng.standard_normal((num, 2 * m, d)) / d**0.5).astype(np.float32)
    wd = (rng.standard_normal((num, d, m)) / m**0.5).astype(np.float32)
    ids = np.stack([rng.permutation(num)[:k] for _ in range(n)])
    w = rng.random((n, k)).astype(np.float32)
    return x, wgu, wd, ids, w


def _ref(x, wgu, wd, ids, w):
    t = torch.from_numpy
    return reference.expert_op(t(x), t(wgu), t(wd), t(ids), t(w)).double().numpy()


def _rel(y, ref):
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


@needs_build
@pytest.mark.parametrize("n,k,num", [(1, 1, 2), (1, 4, 8), (3, 2, 5), (9, 8, 16), (17, 3, 6)])
def test_ffn_f32_matches_reference(n, k, num):
    x, wgu, wd, ids, w = _case(n, k, num)
    y = ggml_mmid.ffn(x, wgu, wd, ids, w, wtype="f32", inter=32)
    assert y.shape == (n, 64)
    assert _rel(y, _ref(x, wgu, wd, ids, w)) < 1e-5


@needs_build
@pytest.mark.parametrize("threads", [1, 2])
def test_ffn_bf16_matches_reference(threads):
    x, wgu, wd, ids, w = _case(9, 8, 16, seed=1)
    bgu, bd = torch.from_numpy(wgu).bfloat16(), torch.from_numpy(wd).bfloat16()
    y = ggml_mmid.ffn(x, bgu, bd, ids, w, wtype="bf16", inter=32, threads=threads)
    # against the reference on the bf16 weights: what is left is ggml's rounding of x and of
    # the activations to bf16 (2^-9 relative each)
    ref = _ref(x, bgu.float().numpy(), bd.float().numpy(), ids, w)
    assert _rel(y, ref) < 1e-2
    # and the weights' own bf16 rounding against the f32 reference, within the kernels' TOL
    assert _rel(y, _ref(x, wgu, wd, ids, w)) < TOL[torch.bfloat16]


@needs_build
def test_q8_0_within_its_quantization_error():
    x, wgu, wd, ids, w = _case(5, 4, 8, d=128, m=64, seed=2)
    qgu, qd = ggml_mmid.quantize(wgu), ggml_mmid.quantize(wd)
    assert qgu.shape == (8, 128, 4 * 34) and qd.shape == (8, 128, 2 * 34)
    # the q8_0 bound per block of 32: |w - w~| <= amax(block) / 127 (half a step of the
    # scale amax/127, plus the scale's own fp16 rounding)
    dq = ggml_mmid.dequantize(qgu, "q8_0", 128)
    amax = np.abs(wgu.reshape(8, 128, 4, 32)).max(-1, keepdims=True)
    err = np.abs(dq - wgu).reshape(8, 128, 4, 32)
    assert (err <= amax / 127 + 1e-12).all()
    assert err.max() > 0  # it is quantized, not copied
    y = ggml_mmid.ffn(x, qgu, qd, ids, w, wtype="q8_0", inter=64)
    dd = ggml_mmid.dequantize(qd, "q8_0", 64)
    # on the dequantized weights, what is left is ggml's q8_0 rounding of x and of a
    assert _rel(y, _ref(x, dq, dd, ids, w)) < 2e-2
    assert _rel(y, _ref(x, wgu, wd, ids, w)) < 3e-2


@needs_build
def test_each_mul_mat_id_alone():
    x, wgu, wd, ids, _ = _case(3, 2, 5)
    kw = {"experts": 5, "hidden": 64, "inter": 32, "top_k": 2, "n": 3}
    gate, _ = ggml_mmid.Harness("f32", wgu, wd, op="gate", **kw).run(x, ids)
    up, _ = ggml_mmid.Harness("f32", wgu, wd, op="up", **kw).run(x, ids)
    a = np.random.default_rng(3).standard_normal((3, 2, 32)).astype(np.float32)
    down, _ = ggml_mmid.Harness("f32", wgu, wd, op="down", **kw).run(a, ids)
    for t in range(3):
        for j in range(2):
            e = ids[t, j]
            np.testing.assert_allclose(gate[t, j], wgu[e, :32] @ x[t], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(up[t, j], wgu[e, 32:] @ x[t], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(down[t, j], wd[e] @ a[t, j], rtol=1e-5, atol=1e-5)


@needs_build
def test_harness_rejects_bad_input():
    x, wgu, wd, ids, w = _case(2, 2, 4)
    kw = {"experts": 4, "hidden": 64, "inter": 32, "top_k": 2, "n": 2}
    with pytest.raises(ValueError, match=r"w_gate_up: .* bytes, the shapes need"):
        ggml_mmid.Harness("f32", wgu[:3], wd, **kw)
    with pytest.raises(ValueError, match="w_down: must be a C-contiguous"):
        ggml_mmid.Harness("f32", wgu, wd.transpose(0, 2, 1), **kw)
    with pytest.raises(ValueError, match="top_k: 5 exceeds experts = 4"):
        ggml_mmid.Harness("f32", wgu, wd, **{**kw, "top_k": 5})
    with pytest.raises(ValueError, match="threads: must be a positive integer"):
        ggml_mmid.Harness("f32", wgu, wd, **{**kw, "threads": 0})
    h = ggml_mmid.Harness("f32", wgu, wd, threads=2, **kw)
    with pytest.raises(ValueError, match=r"ids: experts must lie in \[0, 4\)"):
        h.run(x, np.array([[0, 1], [2, 9]]), w)
    with pytest.raises(ValueError, match="inp: shape"):
        h.run(x[:1], ids, w)
    with pytest.raises(ValueError, match="weights: the FFN needs"):
        h.run(x, ids)
    with pytest.raises(ValueError, match="clock: thread CPU time measures one thread"):
        h.run(x, ids, w, clock="cpu")
    with pytest.raises(ValueError, match="ids: every pass must have the same"):
        ggml_mmid.time_mul_mat_id(
            experts=4, hidden=64, inter=32, top_k=2, ids=[ids, ids[:1]], wtype="f32"
        )


@needs_build
def test_time_mul_mat_id_record():
    ids = [np.array([[0, 1], [1, 2]]), np.array([[3, 0], [0, 3]])]
    res = ggml_mmid.time_mul_mat_id(
        experts=4,
        hidden=64,
        inter=32,
        top_k=2,
        ids=ids,
        wtype="q8_0",
        reps=2,
        warmup=1,
        flush="none",
        ceiling=False,
        clock="cpu",
    )
    assert res["u"] == [3, 2] and res["pool_slots"] == 4
    assert res["ops"]["ffn"]["bytes"] == [3 * 6528, 2 * 6528]
    assert res["ops"]["down"]["bytes"] == [3 * 2176, 2 * 2176]
    for v in res["ops"].values():
        assert [len(t) for t in v["times_s"]] == [2, 2]
        assert all(t > 0 for row in v["times_s"] for t in row)


@needs_build
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_peer_equals_reference_and_specmoe_kernels(dtype, pattern):
    """The ``ggml`` peer and specmoe's per_slot and dedup kernels compute the same numbers:
    each within the contract's tolerance of the float64 reference."""
    from specmoe.kernels.peers import ggml

    for n, m, num in SHAPES:
        x, wgu, wd, ids, w, _ = make_case(n, m, num, pattern, torch.float32)
        x, wgu, wd, w = x.to(dtype), wgu.to(dtype), wd.to(dtype), w.to(dtype)
        ref = reference.expert_op(x, wgu, wd, ids, w)
        y = ggml(x, wgu, wd, ids, w)
        assert y.dtype == dtype and y.shape == ref.shape
        assert rel_err(y, ref) < TOL[dtype], (n, m, num)
        for k in ("per_slot", "dedup"):
            ours = get_kernel(k, "cpu")(x, wgu, wd, ids, w)
            assert rel_err(ours, ref) < TOL[dtype], (k, n, m, num)
            assert rel_err(y, ours) < 2 * TOL[dtype], (k, n, m, num)


@needs_build
def test_peer_refuses_what_it_cannot_run():
    from specmoe.kernels.peers import ggml

    x, wgu, wd, ids, w, biases = make_case(2, 2, 4, "random", torch.float32, bias=True)
    with pytest.raises(NotImplementedError, match="without biases"):
        ggml(x, wgu, wd, ids, w, **biases)
    with pytest.raises(NotImplementedError, match="float32 or bfloat16"):
        ggml(x.half(), wgu.half(), wd.half(), ids, w.half())
    with pytest.raises(InputError):
        ggml(x, wgu, wd, ids + 10, w)


def test_roofline_q8_0_is_ggml_alone(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_roofline.py"
    spec = importlib.util.spec_from_file_location("kernel_roofline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--dtype", "q8_0", "--kernels", "per_slot,ggml"]) == 2
    assert "only --kernels ggml has a q8_0 path" in capsys.readouterr().err


@needs_build
def test_vec_dot_probe():
    assert ggml_mmid.vec_dot_ns("bf16", rows=4, cols=64, tokens=2, reps=2) > 0
    with pytest.raises(ValueError, match="multiple of q8_0's block"):
        ggml_mmid.vec_dot_ns("q8_0", rows=4, cols=48)
