"""One contract, every kernel backend, checked against the float64 reference.

Organised like scipy's ``test_lsq_linear`` mixins: ``ContractMixin`` holds the tests, and each
``Test*`` class binds it to one kernel on one device. CUDA classes skip without a GPU.

Tolerances (relative L2 error ‖y − y_ref‖ / ‖y_ref‖, the reference computed in float64 from the
same rounded inputs): float32 1e-5; float16 5e-3; bfloat16 3e-2 (kernels may round the
activation to the weight dtype between the two products, as transformers' do).
"""

from __future__ import annotations

import warnings
from typing import ClassVar

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specmoe.errors import InputError
from specmoe.kernels import KERNELS, get_kernel, kernel_kind, kernel_names, reference
from specmoe.kernels._contract import OAI_ALPHA, OAI_LIMIT, activate, from_gpt_oss_layout
from specmoe.kernels.selfcheck import PATTERNS, SHAPES, TOL, make_case, rel_err

HAS_CUDA = torch.cuda.is_available()
PEERS = {k for k, v in KERNELS.items() if v.peer}


class ContractMixin:
    kernel: str
    device: str = "cpu"
    dtypes = (torch.float32, torch.bfloat16, torch.float16)

    # PyTorch's grouped GEMM takes only some dtypes on some GPUs: there, a dtype it refuses is
    # a skip, not a failure of the contract.
    dtype_may_be_refused = False

    def fn(self):
        if self.kernel in PEERS:
            pytest.importorskip("transformers")
        f = get_kernel(self.kernel, self.device)
        if not self.dtype_may_be_refused:
            return f

        def guarded(*a, **k):
            try:
                return f(*a, **k)
            except (RuntimeError, NotImplementedError) as exc:
                pytest.skip(
                    f"{self.kernel} refuses this input on this device: "
                    f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                )

        return guarded

    @pytest.mark.parametrize("pattern", PATTERNS)
    @pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "n{}-m{}-N{}".format(*s))
    def test_matches_reference_fp32(self, shape, pattern):
        n, m, num = shape
        x, wgu, wd, ids, w, _ = make_case(n, m, num, pattern, torch.float32, device=self.device)
        y = self.fn()(x, wgu, wd, ids, w)
        assert y.shape == (n, x.shape[1]) and y.dtype == torch.float32
        assert y.device.type == self.device
        assert rel_err(y, reference.expert_op(x, wgu, wd, ids, w)) < TOL[torch.float32]

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
    @pytest.mark.parametrize(
        "shape",
        [(1, 8, 12), (3, 8, 16), (9, 4, 10), (16, 8, 24)],
        ids=lambda s: "n{}-m{}-N{}".format(*s),
    )
    def test_matches_reference_half(self, shape, dtype):
        if dtype not in self.dtypes:
            pytest.skip(f"{self.kernel} does not take {dtype}")
        n, m, num = shape
        x, wgu, wd, ids, w, _ = make_case(n, m, num, "random", dtype, device=self.device)
        y = self.fn()(x, wgu, wd, ids, w)
        assert y.dtype == dtype
        assert rel_err(y, reference.expert_op(x, wgu, wd, ids, w)) < TOL[dtype]

    @pytest.mark.parametrize("pattern", ["random", "same_set"])
    def test_oai_activation_with_biases(self, pattern):
        x, wgu, wd, ids, w, b = make_case(
            6, 4, 9, pattern, torch.float32, bias=True, device=self.device
        )
        x = x * 8  # reach both clamps of swiglu_oai
        y = self.fn()(x, wgu, wd, ids, w, activation="swiglu_oai", **b)
        ref = reference.expert_op(x, wgu, wd, ids, w, activation="swiglu_oai", **b)
        assert rel_err(y, ref) < TOL[torch.float32]

    def test_weights_and_order_of_slots(self):
        # Zero router weights remove a slot; permuting a token's slots changes nothing.
        x, wgu, wd, ids, w, _ = make_case(4, 3, 8, "random", torch.float32, device=self.device)
        f = self.fn()
        w0 = w.clone()
        w0[:, 2] = 0
        y0 = f(x, wgu, wd, ids, w0)
        y1 = f(x, wgu, wd, ids[:, :2].contiguous(), w[:, :2].contiguous())
        assert rel_err(y0, y1) < 1e-5
        p = torch.tensor([2, 0, 1])
        assert rel_err(f(x, wgu, wd, ids[:, p], w[:, p]), f(x, wgu, wd, ids, w)) < 1e-5

    def test_strided_expert_views(self):
        # Every other expert of a larger tensor: a view with a larger expert stride.
        x, wgu, wd, ids, w, _ = make_case(5, 3, 16, "random", torch.float32, device=self.device)
        wgu2, wd2 = wgu[::2], wd[::2]
        ids2 = ids % 8
        y = self.fn()(x, wgu2, wd2, ids2, w)
        assert rel_err(y, reference.expert_op(x, wgu2, wd2, ids2, w)) < TOL[torch.float32]

    @pytest.mark.parametrize("bad", [-1, 7])
    def test_ids_out_of_range(self, bad):
        x, wgu, wd, ids, w, _ = make_case(3, 2, 7, "random", torch.float32, device=self.device)
        ids[1, 1] = bad
        with pytest.raises(InputError, match=r"ids: expert id .* outside \[0, 7\)") as exc:
            self.fn()(x, wgu, wd, ids, w)
        assert "\n" not in str(exc.value)

    @pytest.mark.parametrize(
        "what",
        [
            "x",
            "w_down",
            "ids",
            "weights",
            "w_gate_up_odd",
            "dtype",
            "float_ids",
            "activation",
            "bias",
        ],
    )
    def test_bad_shapes_are_one_line_errors(self, what):
        x, wgu, wd, ids, w, _ = make_case(3, 2, 7, "random", torch.float32, device=self.device)
        kw = {}
        if what == "x":
            x = x[:, :-1]
        elif what == "w_down":
            wd = wd[:, :, :-1]
        elif what == "ids":
            ids = ids[:2]
        elif what == "weights":
            w = w[:, :1]
        elif what == "w_gate_up_odd":
            wgu = wgu[:, :-1]
        elif what == "dtype":
            wd = wd.double()
        elif what == "float_ids":
            ids = ids.float()
        elif what == "activation":
            kw["activation"] = "gelu"
        elif what == "bias":
            kw["b_down"] = torch.zeros(7, 5, device=self.device)
        with pytest.raises(InputError) as exc:
            self.fn()(x, wgu, wd, ids, w, **kw)
        msg = str(exc.value)
        assert "\n" not in msg and msg.split(":")[0] in {
            "x",
            "w_down",
            "ids",
            "weights",
            "w_gate_up",
            "w_gate_up/w_down",
            "activation",
            "b_down",
        }


# -------------------------------------------------------------------------------- CPU classes


class TestPerSlotCPU(ContractMixin):
    kernel = "per_slot"


class TestDedupCPU(ContractMixin):
    kernel = "dedup"


class TestPerSlotTorchCPU(ContractMixin):
    kernel = "per_slot_torch"


class TestDedupTorchCPU(ContractMixin):
    kernel = "dedup_torch"


class TestGroupedMMCPU(ContractMixin):
    kernel = "grouped_mm"


class TestHFBatchedMMCPU(ContractMixin):
    kernel = "hf_batched_mm"


class TestHFGroupedMMCPU(ContractMixin):
    kernel = "hf_grouped_mm"


class TestHFEagerCPU(ContractMixin):
    kernel = "hf_eager"


# ------------------------------------------------------------------------------- CUDA classes


class _CUDAContract(ContractMixin):
    """The contract on a CUDA GPU (subclasses inherit the markers; skipped without a GPU)."""

    pytestmark: ClassVar = [
        pytest.mark.cuda,
        pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU"),
    ]
    device = "cuda"


class TestPerSlotCUDA(_CUDAContract):
    kernel = "per_slot"


class TestDedupCUDA(_CUDAContract):
    kernel = "dedup"


class TestGroupedMMCUDA(_CUDAContract):
    kernel = "grouped_mm"
    dtype_may_be_refused = True


class TestHFBatchedMMCUDA(_CUDAContract):
    kernel = "hf_batched_mm"


class TestHFGroupedMMCUDA(_CUDAContract):
    kernel = "hf_grouped_mm"
    dtype_may_be_refused = True


class TestHFEagerCUDA(_CUDAContract):
    kernel = "hf_eager"


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_triton_kernels_did_not_fall_back():
    """On a GPU with Triton, per_slot and dedup must run their Triton kernels, not torch."""
    from specmoe.kernels import cuda

    if cuda.triton_module() is None:
        pytest.skip("Triton is not installed")
    x, wgu, wd, ids, w, _ = make_case(
        9, 8, 64, "random", torch.bfloat16, h=256, inter=128, device="cuda"
    )
    for name in ("per_slot", "dedup"):
        y = getattr(cuda, name)(x, wgu, wd, ids, w)
        assert name not in cuda._failed
        assert rel_err(y, reference.expert_op(x, wgu, wd, ids, w)) < TOL[torch.bfloat16]


# ------------------------------------------------------------------------ independent oracles


def test_reference_matches_transformers_olmoe_module():
    """Our swiglu layout is transformers' OLMoE experts module, run as transformers runs it."""
    from transformers import OlmoeConfig
    from transformers.models.olmoe.modeling_olmoe import OlmoeExperts

    cfg = OlmoeConfig(hidden_size=32, intermediate_size=24, num_experts=10, num_experts_per_tok=4)
    cfg._experts_implementation = "eager"
    mod = OlmoeExperts(cfg)
    x, wgu, wd, ids, w, _ = make_case(6, 4, 10, "random", torch.float32)
    with torch.no_grad():
        mod.gate_up_proj.copy_(wgu)
        mod.down_proj.copy_(wd)
        hf = mod(x, ids, w)
    assert rel_err(hf, reference.expert_op(x, wgu, wd, ids, w)) < 1e-6


def test_reference_matches_transformers_gpt_oss_module():
    """swiglu_oai and the layout conversion agree with transformers' GptOssExperts."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    cfg = GptOssConfig(
        hidden_size=32, intermediate_size=24, num_local_experts=10, num_experts_per_tok=4
    )
    cfg._experts_implementation = "eager"
    mod = GptOssExperts(cfg)
    assert (mod.alpha, mod.limit) == (OAI_ALPHA, OAI_LIMIT)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    x = torch.randn(6, 32, generator=g) * 4
    ids = torch.stack([torch.randperm(10, generator=g)[:4] for _ in range(6)])
    w = torch.rand(6, 4, generator=g)
    with torch.no_grad():
        hf = mod(x, ids, w)
        wgu, wd, bgu = from_gpt_oss_layout(mod.gate_up_proj, mod.down_proj, mod.gate_up_proj_bias)
        ours = reference.expert_op(
            x, wgu, wd, ids, w, activation="swiglu_oai", b_gate_up=bgu, b_down=mod.down_proj_bias
        )
    assert rel_err(hf, ours) < 1e-6


def test_activation_formulas_by_hand():
    g = torch.tensor([-3.0, 0.5, 9.0])
    u = torch.tensor([2.0, -8.0, 1.0])
    gu = torch.cat([g, u])
    silu = g / (1 + torch.exp(-g))
    assert torch.allclose(activate(gu, "swiglu"), silu * u)
    gc = torch.tensor([-3.0, 0.5, 7.0])
    uc = torch.tensor([2.0, -7.0, 1.0])
    want = (uc + 1) * gc / (1 + torch.exp(-1.702 * gc))
    assert torch.allclose(activate(gu, "swiglu_oai"), want)


# ------------------------------------------------------------------------------- C specifics


def _equal_across_threads(cpu, x, wgu, wd, ids, w):
    """Both C kernels' outputs at 1, 2 and 3 threads, asserted bitwise equal; returns them."""
    try:
        outs = {}
        for k in (1, 2, 3):
            cpu.set_num_threads(k)
            outs[k] = (cpu.per_slot(x, wgu, wd, ids, w), cpu.dedup(x, wgu, wd, ids, w))
    finally:
        cpu.set_num_threads(None)
    for k in (2, 3):
        assert torch.equal(outs[1][0], outs[k][0]) and torch.equal(outs[1][1], outs[k][1])
    return outs


def test_c_kernels_are_bitwise_deterministic_across_threads():
    """Rows are split between threads, so each output is summed in one fixed order."""
    from specmoe.kernels import cpu

    if not cpu.c_available():
        pytest.skip("no C compiler")
    # 3·h·I·4 bytes = 1.5 MiB per expert: above the size from which the C kernel threads.
    x, wgu, wd, ids, w, _ = make_case(9, 8, 20, "duplicates", torch.float32, h=512, inter=256)
    _equal_across_threads(cpu, x, wgu, wd, ids, w)


@pytest.mark.parametrize("h,inter", [(35, 19), (8, 4), (64, 3)])
def test_c_kernels_odd_widths(h, inter):
    """Widths that are not multiples of the 8-lane vectors or the 4-row blocks."""
    from specmoe.kernels import cpu

    x, wgu, wd, ids, w, _ = make_case(7, 3, 9, "duplicates", torch.float32, h=h, inter=inter)
    ref = reference.expert_op(x, wgu, wd, ids, w)
    for f in (cpu.per_slot, cpu.dedup):
        assert rel_err(f(x, wgu, wd, ids, w), ref) < 1e-5


@given(
    n=st.integers(1, 12),
    m=st.integers(1, 3),
    pattern=st.sampled_from(["same_set", "duplicates", "random"]),
    h=st.integers(1, 70),
    inter=st.integers(1, 40),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=60, deadline=None)
def test_c_kernels_every_row_and_token_block(n, m, pattern, h, inter, dtype, seed):
    """Row counts that leave any remainder after the far-apart row blocks (4, 3 or 2 rows q
    apart) and 1..12 tokens per expert (every token block, the split into blocks of at most
    six): each output row is its own row's product, checked against the float64 reference."""
    from specmoe.kernels import cpu

    if not cpu.c_available():
        pytest.skip("no C compiler")
    num = max(m, 2)
    x, wgu, wd, ids, w, _ = make_case(n, m, num, pattern, dtype, h=h, inter=inter, seed=seed)
    ref = reference.expert_op(x, wgu, wd, ids, w)
    if dtype == torch.bfloat16:  # the AVX-512 BF16 path (the default where the build has one)
        on = cpu.set_bf16_dot(True)  # reads the setting: True where the path is in use
        cpu.set_bf16_dot(on)
        if on:  # its reference rounds the activation to bf16, as the path does; without it a
            # near-cancelling small output (h = 1) misses the unrounded reference by > 3%
            ref = _bf16_rounded_activation_reference(x, wgu, wd, ids, w)
    for f in (cpu.per_slot, cpu.dedup):
        assert rel_err(f(x, wgu, wd, ids, w), ref) < TOL[dtype]


def _bf16_rounded_activation_reference(x, wgu, wd, ids, w):
    """The float64 reference with the one rounding the bf16 dot-product path adds: the
    intermediate activation rounded to bfloat16 before the down projection."""
    d = torch.float64
    xd, gud, dd = x.to(d), wgu.to(d), wd.to(d)
    y = torch.zeros(x.shape[0], x.shape[1], dtype=d)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            a = activate(gud[e] @ xd[t], "swiglu").to(torch.bfloat16).to(d)
            y[t] += float(w[t, j]) * (dd[e] @ a)
    return y.to(x.dtype)


def _path_on(attr: str, setter: str, what: str):
    """The cpu module with the build's path ``attr`` switched on (restored after), or a skip."""
    from specmoe.kernels import _cbuild, cpu

    lib = _cbuild.load()
    if lib is None or not getattr(lib, attr):
        pytest.skip(f"the C kernels have no {what} path in this build")
    prev = getattr(cpu, setter)(True)
    yield cpu
    getattr(cpu, setter)(prev)


@pytest.fixture
def bf16_dot():
    """The C kernels' AVX-512 BF16 path, or a skip where the build has none."""
    yield from _path_on("bf16dp", "set_bf16_dot", "AVX-512 BF16")


@pytest.mark.parametrize("h,inter", [(64, 32), (37, 19), (100, 70), (256, 96)])
def test_c_bf16_dot_path_tokens_1_to_9(bf16_dot, h, inter):
    """vdpbf16ps on bf16 activations: every group size 1..9 (all tokens on one expert set),
    widths with and without a tail of the 32-element steps. It matches the reference within
    the contract's bf16 tolerance, and the reference with the activation rounded to bf16 far
    closer (the only rounding it adds); the widening path (forced) matches the unrounded one."""
    cpu = bf16_dot
    for n in range(1, 10):
        x, wgu, wd, ids, w, _ = make_case(
            n, 3, 5, "same_set", torch.bfloat16, h=h, inter=inter, seed=n
        )
        ref = reference.expert_op(x, wgu, wd, ids, w)
        ref16 = _bf16_rounded_activation_reference(x, wgu, wd, ids, w)
        for f in (cpu.per_slot, cpu.dedup):
            cpu.set_bf16_dot(True)
            y = f(x, wgu, wd, ids, w)
            assert y.dtype == torch.bfloat16
            assert rel_err(y, ref) < TOL[torch.bfloat16]
            assert rel_err(y, ref16) < 1e-3
            cpu.set_bf16_dot(False)
            y_wide = f(x, wgu, wd, ids, w)
            assert rel_err(y_wide, ref) < 1e-3
            assert rel_err(y_wide, ref) < rel_err(y, ref)  # the switch changed the path


def test_c_bf16_dot_path_many_tokens_per_expert(bf16_dot):
    """Groups above the 9-token register block (split into blocks of at most 9)."""
    cpu = bf16_dot
    for n in (10, 17, 19):
        x, wgu, wd, ids, w, _ = make_case(n, 2, 3, "same_set", torch.bfloat16, h=48, inter=40)
        ref16 = _bf16_rounded_activation_reference(x, wgu, wd, ids, w)
        assert rel_err(cpu.dedup(x, wgu, wd, ids, w), ref16) < 1e-3


@pytest.mark.parametrize("h,inter", [(2720, 100), (100, 2720), (4096, 64)])
def test_c_bf16_dot_path_row_chunks_and_token_passes(bf16_dot, h, inter):
    """Past six tokens on one expert the bf16 path takes the rows in L2-sized chunks (48, 48
    and 4 gate rows for h = 2720; 48-row chunks of the down projection for I = 2720; 24-row
    chunks for h = 4096) and each chunk in passes of at most six tokens. A pass changes which
    register block computes a row, not the order of any sum, so with one expert per token the
    deduplicating kernel (7-13 tokens on the expert: chunks and passes) equals the per-slot
    kernel (one token per group: neither) bit for bit, and both match the reference."""
    cpu = bf16_dot
    for n in (7, 9, 13):
        x, wgu, wd, ids, w, _ = make_case(n, 1, 2, "same_set", torch.bfloat16, h=h, inter=inter)
        assert int(ids.unique().numel()) == 1
        y_dedup, y_slot = cpu.dedup(x, wgu, wd, ids, w), cpu.per_slot(x, wgu, wd, ids, w)
        assert torch.equal(y_dedup, y_slot)
        ref16 = _bf16_rounded_activation_reference(x, wgu, wd, ids, w)
        assert rel_err(y_dedup, ref16) < 1e-3


@pytest.fixture
def f32_zmm():
    """The C kernels' AVX-512F fp32 path, or a skip where the build has none."""
    yield from _path_on("f32z", "set_f32_zmm", "AVX-512F fp32")


@pytest.mark.parametrize("h,inter", [(64, 32), (37, 19), (100, 70), (2048, 48)])
def test_c_f32_zmm_path_matches_the_avx2_blocks_and_the_reference(f32_zmm, h, inter):
    """The 16-lane fp32 blocks (1-13 tokens on one expert set: every block of 1-9 tokens and
    the split above 9; widths with and without a masked tail) match the float64 reference to
    fp32 rounding, as the AVX2 blocks (forced) do; the switch changes the path (sums of 16
    lanes and of 8 round differently somewhere)."""
    cpu = f32_zmm
    differs = False
    for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 13):
        x, wgu, wd, ids, w, _ = make_case(n, 2, 4, "same_set", torch.float32, h=h, inter=inter)
        ref = reference.expert_op(x, wgu, wd, ids, w)
        for f in (cpu.per_slot, cpu.dedup):
            cpu.set_f32_zmm(True)
            y = f(x, wgu, wd, ids, w)
            cpu.set_f32_zmm(False)
            y_avx2 = f(x, wgu, wd, ids, w)
            assert rel_err(y, ref) < 1e-5 and rel_err(y_avx2, ref) < 1e-5
            differs = differs or not torch.equal(y, y_avx2)
    assert differs


@pytest.mark.parametrize("h,inter", [(64, 32), (37, 19), (2048, 48)])
def test_c_f32_zmm_blocks_of_many_tokens_sum_as_one_token_blocks(f32_zmm, h, inter):
    """A block of 2-9 tokens sums its accumulators with a transposing tree (sm_hsum16) where a
    one-token block reduces each on its own (_mm512_reduce_add_ps); the tree adds every
    vector's lanes in the same order, so with one expert per token the deduplicating kernel
    (all n tokens in one group) equals the per-slot kernel (one token per group) bit for bit."""
    cpu = f32_zmm
    for n in range(2, 10):
        x, wgu, wd, ids, w, _ = make_case(n, 1, 2, "same_set", torch.float32, h=h, inter=inter)
        assert int(ids.unique().numel()) == 1
        y_dedup, y_slot = cpu.dedup(x, wgu, wd, ids, w), cpu.per_slot(x, wgu, wd, ids, w)
        assert torch.equal(y_dedup, y_slot)
        assert rel_err(y_dedup, reference.expert_op(x, wgu, wd, ids, w)) < 1e-5


def test_c_bf16_dot_path_is_bitwise_deterministic_across_threads(bf16_dot):
    cpu = bf16_dot
    # 3·h·I·2 bytes = 1.5 MiB per expert: above the size from which the C kernel threads.
    x, wgu, wd, ids, w, _ = make_case(9, 8, 12, "duplicates", torch.bfloat16, h=512, inter=512)
    outs = _equal_across_threads(cpu, x, wgu, wd, ids, w)
    assert rel_err(outs[1][1], reference.expert_op(x, wgu, wd, ids, w)) < TOL[torch.bfloat16]


def test_c_build_reports_avx512_bf16_as_the_processor_has_it():
    """-march=native builds the BF16 path exactly where /proc/cpuinfo lists avx512_bf16."""
    from specmoe.kernels import _cbuild

    lib = _cbuild.load()
    if lib is None:
        pytest.skip("no C compiler")
    try:
        flags = open("/proc/cpuinfo").read().split()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    if "-march=native" not in lib.flags:
        assert not lib.bf16dp
    else:
        assert lib.bf16dp == ("avx512_bf16" in flags and "avx512bw" in flags)
    assert _cbuild.build().status()["avx512_bf16"] == lib.bf16dp


def test_c_build_key_includes_the_instruction_set(monkeypatch, tmp_path):
    """A processor of the same name with other instruction-set flags gets another build (not
    one compiled for extensions it lacks): the signature holds the flags line."""
    from specmoe.kernels import _cbuild

    block = "processor\t: {i}\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512f{extra}\n\n"
    sigs = []
    for extra in ("", " avx512_bf16"):
        f = tmp_path / f"cpuinfo{len(sigs)}"
        f.write_text(block.format(i=0, extra=extra) + block.format(i=1, extra=" other"))
        sigs.append(_cbuild._cpu_signature(str(f)))
    assert sigs[0] != sigs[1] and "Some CPU" in sigs[0] and "other" not in sigs[0]
    assert "avx512_bf16" in sigs[1]
    keys = []
    for sig in sigs:
        monkeypatch.setattr(_cbuild, "_cpu_signature", lambda sig=sig: sig)
        keys.append(_cbuild.build_key("cc", "v1", ("-O3", "-march=native")))
    assert keys[0] != keys[1]


@pytest.fixture
def fresh_fallbacks(monkeypatch):
    """Fallback warnings as in a fresh process (each is said once per process)."""
    from specmoe.kernels import _fallback

    monkeypatch.setattr(_fallback, "_warned", set())


@pytest.fixture
def no_compiler(monkeypatch, fresh_fallbacks):
    """A machine without a C compiler: the C kernels are rebuilt (and fail) on first use."""
    from specmoe.kernels import _cbuild

    monkeypatch.setattr(_cbuild, "find_compiler", lambda: None)
    _cbuild.build.cache_clear()
    yield
    _cbuild.build.cache_clear()


def _fallback_warnings(record):
    from specmoe.kernels import KernelFallbackWarning

    return [str(w.message) for w in record if issubclass(w.category, KernelFallbackWarning)]


def test_falls_back_to_torch_without_compiler(no_compiler):
    from specmoe.kernels import KernelFallbackWarning, cpu, implementation, watch_fallbacks

    x, wgu, wd, ids, w, _ = make_case(4, 3, 8, "random", torch.float32)
    with watch_fallbacks() as fell:
        with pytest.warns(KernelFallbackWarning, match="dedup_torch .*no C compiler found"):
            y = cpu.dedup(x, wgu, wd, ids, w)
        with warnings.catch_warnings(record=True) as again:
            warnings.simplefilter("always")
            cpu.dedup(x, wgu, wd, ids, w)  # the same kernel and reason: said once
    assert _fallback_warnings(again) == []
    assert rel_err(y, reference.expert_op(x, wgu, wd, ids, w)) < 1e-5
    impl = implementation("dedup", "cpu")
    assert fell == {"dedup": impl}
    assert (impl.requested, impl.ran, impl.kernel) == ("c", "torch", "dedup_torch")
    assert impl.fallback == "no C compiler found (set CC)"
    assert impl.compiler["status"] == "unavailable" and impl.compiler["cc"] is None
    with pytest.warns(KernelFallbackWarning, match="per_slot_torch"):  # another kernel: said
        cpu.per_slot(x, wgu, wd, ids, w)


@pytest.mark.parametrize("what", ["float64", "strided"])
def test_an_input_the_c_kernel_cannot_take_falls_back_with_a_warning(what, fresh_fallbacks):
    from specmoe.kernels import KernelFallbackWarning, cpu, implementation, watch_fallbacks

    if not cpu.c_available():
        pytest.skip("no C compiler")
    dtype = torch.float64 if what == "float64" else torch.float32
    x, wgu, wd, ids, w, _ = make_case(5, 3, 9, "duplicates", dtype)
    if what == "strided":  # the same values, the last dimension strided
        wgu = wgu.transpose(1, 2).contiguous().transpose(1, 2)
    need = "float64" if what == "float64" else "strided"
    with watch_fallbacks() as fell, pytest.warns(KernelFallbackWarning, match=need):
        y = cpu.per_slot(x, wgu, wd, ids, w)
    assert rel_err(y, reference.expert_op(x, wgu, wd, ids, w)) < TOL[torch.float32]
    impl = implementation("per_slot", "cpu", dtype=dtype, strided=what == "strided")
    assert fell["per_slot"] == impl and impl.kernel == "per_slot_torch" and need in impl.fallback
    assert impl.compiler["status"] == "ok"


def test_usable_inputs_run_the_c_kernel_and_say_nothing(fresh_fallbacks):
    from specmoe.kernels import cpu, implementation, watch_fallbacks

    if not cpu.c_available():
        pytest.skip("no C compiler")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x, wgu, wd, ids, w, _ = make_case(5, 3, 9, "random", dtype)
        with watch_fallbacks() as fell, warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            cpu.dedup(x, wgu, wd, ids, w)
            cpu.per_slot(x, wgu, wd, ids, w)
        assert fell == {} and _fallback_warnings(rec) == []
        impl = implementation("dedup", "cpu", dtype=dtype)
        assert (impl.ran, impl.kernel, impl.fallback) == ("c", "dedup", None)
        assert impl.compiler["status"] == "ok" and impl.compiler["flags"].startswith("-O3")
    # the torch kernels and the peers run their own code wherever they are asked to
    assert implementation("dedup_torch", "cpu", dtype=torch.float64).fallback is None
    assert implementation("hf_eager", "cpu").ran == "transformers"


def test_cuda_kernels_without_triton_or_a_gpu_say_what_ran(fresh_fallbacks):
    from specmoe.kernels import KernelFallbackWarning, cuda, implementation

    x, wgu, wd, ids, w, _ = make_case(4, 3, 8, "random", torch.float32)  # CPU tensors
    with pytest.warns(KernelFallbackWarning, match="dedup_torch .*runs on CUDA"):
        y = cuda.dedup(x, wgu, wd, ids, w)
    assert rel_err(y, reference.expert_op(x, wgu, wd, ids, w)) < 1e-5
    impl = implementation("dedup", "cuda")
    assert impl.requested == "triton" and impl.triton["status"] in ("ok", "unavailable")
    if cuda.triton_module() is None:
        assert impl.ran == "torch" and impl.fallback.startswith("Triton unavailable")


def test_build_goes_to_the_cache_dir_and_a_bad_compiler_is_said(monkeypatch, tmp_path):
    from specmoe.kernels import _cbuild

    monkeypatch.setenv("SPECMOE_CACHE_DIR", str(tmp_path))
    _cbuild.build.cache_clear()
    try:
        if _cbuild.find_compiler() is None:
            pytest.skip("no C compiler")
        lib = _cbuild.load()
        assert lib is not None and lib.path.parent == tmp_path / "kernels"
        assert lib.path.exists() and _cbuild.build().status()["status"] == "ok"
        _cbuild.build.cache_clear()
        monkeypatch.setenv("CC", "false")  # a 'compiler' that always fails
        monkeypatch.setenv("SPECMOE_CACHE_DIR", str(tmp_path / "other"))
        assert _cbuild.load() is None
        status = _cbuild.build().status()
        assert status["status"] == "unavailable" and status["cc"] == "false"
        assert "did not compile with false" in status["error"]
    finally:
        _cbuild.build.cache_clear()


# ---------------------------------------------------------------------------------- registry


def test_registry_unknown_name_lists_valid_ones():
    with pytest.raises(InputError, match="choose from reference, per_slot, dedup"):
        get_kernel("fast")
    assert kernel_kind("hf_batched_mm") == "per_slot"
    assert kernel_kind("grouped_mm") == "dedup"
    assert set(kernel_names("cpu")) == set(KERNELS)
    assert "hf_eager" not in kernel_names(peers=False)


# ------------------------------------------------------------------------------------------
# the standalone self-check (scripts/kernel_selfcheck.py over specmoe.kernels.selfcheck)


def _selfcheck_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "kernel_selfcheck.py"
    spec = importlib.util.spec_from_file_location("kernel_selfcheck", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_selfcheck_kernels_to_check_name_their_argument():
    from specmoe.kernels.selfcheck import kernels_to_check

    every = kernels_to_check("cpu")
    assert "reference" not in every and {"per_slot", "dedup"} <= set(every)
    assert kernels_to_check("cpu", ["dedup", ""]) == ["dedup"]
    with pytest.raises(InputError) as exc:
        kernels_to_check("cpu", ["nope"])
    assert exc.value.argument == "kernels" and "'nope'" in str(exc.value)
    assert "--" not in str(exc.value)
    with pytest.raises(InputError) as exc:
        kernels_to_check("cpu", [""])
    assert exc.value.argument == "kernels"
    with pytest.raises(InputError) as exc:
        kernels_to_check("tpu")
    assert exc.value.argument == "device"
    if not HAS_CUDA:
        with pytest.raises(InputError, match="no CUDA device") as exc:
            kernels_to_check("cuda")
        assert exc.value.argument == "device"


def test_selfcheck_summary_line_counts_and_lists_failures():
    from specmoe.kernels.selfcheck import summary_line

    res = [
        {"case": "a", "error": 1e-7, "ok": True, "note": ""},
        {"case": "b", "error": 2e-3, "ok": False, "note": ""},
        {"case": "c", "error": None, "ok": False, "note": "RuntimeError: boom"},
    ]
    first, *fails = summary_line("dedup", "cpu", res).splitlines()
    assert first == "           dedup on cpu: 1/3 within tolerance, largest error 2.00e-03"
    assert fails == ["    FAIL b: 0.002", "    FAIL c: RuntimeError: boom"]


def test_selfcheck_script_checks_a_kernel_and_prints_json(capsys):
    import json

    from specmoe.kernels.selfcheck import cases

    rc = _selfcheck_script().main(["--kernels", "reference", "--json"])
    cap = capsys.readouterr()
    assert rc == 0
    results = json.loads(cap.out)
    assert {r["kernel"] for r in results} == {"reference"} and all(r["ok"] for r in results)
    assert [r["case"] for r in results] == [c[0] for c in cases("reference", "cpu")]
    assert not any("q8_0" in r["case"] for r in results)  # q8_0: the C kernels' cases only
    assert sum("q8_0" in c[0] for c in cases("dedup", "cpu")) == 12
    assert cap.err.strip().startswith("reference on cpu: ")


@pytest.mark.parametrize(
    ("argv", "flag"),
    [(["--kernels", "nope"], "--kernels"), (["--kernels", ","], "--kernels")]
    + ([] if HAS_CUDA else [(["--device", "cuda"], "--device")]),
)
def test_selfcheck_script_bad_input_is_one_line_exit_2(argv, flag, capsys):
    rc = _selfcheck_script().main(argv)
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert rc == 2 and cap.out == "" and len(err) == 1
    assert err[0].startswith(f"kernel_selfcheck: error: {flag}: ")


def _kernel_ab_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_ab.py"
    spec = importlib.util.spec_from_file_location("kernel_ab", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--variants", "novalue"], "--variants"),
        (["--variants", "a=@/nonexistent/_csrc.py"], "--variants"),
        (["--variants", "a=", "--n", "0"], "--n"),
        (["--variants", "a=", "--n", "x"], "--n"),
        (["--variants", "a=", "--modes", "both"], "--modes"),
        (["--variants", "a=", "--dtype", "int4"], "--dtype"),
        (["--variants", "a=", "--routing", "zipf"], "--routing"),
    ],
)
def test_kernel_ab_bad_input_is_one_line_exit_2(argv, flag, capsys):
    rc = _kernel_ab_script().main(argv)
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert rc == 2 and cap.out == "" and len(err) == 1
    assert err[0].startswith(f"kernel_ab: error: {flag}: ")


def _run_err(code, env, path):
    import subprocess
    import sys

    env = {**env, "SPECMOE_KERNEL_SOURCE": str(path)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    ).stderr


def test_a_pinned_kernel_source_is_built_and_named_in_the_profile(tmp_path):
    """$SPECMOE_KERNEL_SOURCE builds the named file instead of the package's source (its hash is
    the one a profile records); an unreadable file is a one-line input error."""
    import hashlib
    import os
    import subprocess
    import sys

    from specmoe.kernels import _cbuild
    from specmoe.kernels._csrc import SOURCE

    if _cbuild.build().lib is None:
        pytest.skip("no C compiler here")
    pinned = tmp_path / "kernels.c"
    pinned.write_text(SOURCE + "\n/* an earlier version */\n")
    code = (
        "from specmoe.kernels import _cbuild; b = _cbuild.build(); "
        "print(b.lib is not None, b.status()['source_sha256'])"
    )
    env = {**os.environ, "SPECMOE_KERNEL_SOURCE": str(pinned),
           "SPECMOE_CACHE_DIR": str(tmp_path / "cache")}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    want = hashlib.sha256(pinned.read_text().encode()).hexdigest()[:16]
    assert out.stdout.split() == ["True", want]
    assert want != _cbuild.source_sha256()  # the package's own source, in this process
    env["SPECMOE_KERNEL_SOURCE"] = str(tmp_path / "missing.c")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "missing.c: $SPECMOE_KERNEL_SOURCE" in out.stderr
    # a source of another calling convention, or one that does not compile, is an error
    # naming the file, never a silent fallback to the torch path
    for name, text in [
        (
            "abi2.c",
            SOURCE.replace(
                "int specmoe_abi(void) { return 1; }", "int specmoe_abi(void) { return 2; }"
            ),
        ),
        ("broken.c", SOURCE + "\nthis is not C;\n"),
    ]:
        (tmp_path / name).write_text(text)
        env["SPECMOE_KERNEL_SOURCE"] = str(tmp_path / name)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.returncode != 0 and f"{name}: $SPECMOE_KERNEL_SOURCE" in out.stderr, name
    assert "calling convention is version 2" in _run_err(code, env, tmp_path / "abi2.c")


def test_bf16_dot_default_and_the_amd_flag_sets(tmp_path, monkeypatch):
    """The AVX-512 BF16 path is on by default, $SPECMOE_BF16_DOT=0/1 decides instead and any
    other value is refused naming it; the native flag sets gain the L2 prefetch hint and the
    AVX-512F fp32 path on AMD family 25 with AVX-512 BF16 only (an AVX2-only EPYC and an
    Intel Xeon keep their flags)."""
    from specmoe.errors import InputError
    from specmoe.kernels._cbuild import (
        _FLAG_SETS,
        BF16_DOT_ENV,
        DP_HINT_T2,
        PF_HINT_T2,
        ZEN4_FLAGS,
        ZEN5_FLAGS,
        bf16_dot_default,
        flag_sets,
    )

    def info(vendor, family, flags):
        p = tmp_path / f"{vendor}-{family}-{len(flags)}"
        p.write_text(
            f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\n"
            f"flags\t\t: {' '.join(flags)}\n\n"
        )
        return str(p)

    zen4 = flag_sets(info("AuthenticAMD", "25", ["avx2", "avx512f", "avx512_bf16"]))
    hints = ZEN4_FLAGS
    assert DP_HINT_T2 in hints and PF_HINT_T2 in hints
    assert all(all(h in f for h in hints) == ("-march=native" in f) for f in zen4)
    assert [tuple(x for x in f if x not in hints) for f in zen4] == list(_FLAG_SETS)
    zen5 = flag_sets(info("AuthenticAMD", "26", ["avx2", "avx512f", "avx512_bf16"]))
    assert DP_HINT_T2 not in ZEN5_FLAGS and PF_HINT_T2 not in ZEN5_FLAGS
    assert "-DSM_PF1=0" in ZEN5_FLAGS and "-DSM_PF1=0" not in ZEN4_FLAGS
    assert "-DSM_READ_STREAMS=4" in ZEN5_FLAGS and "-DSM_READ_PF=4096" not in ZEN5_FLAGS
    assert "-DSM_WPIN=1" in ZEN5_FLAGS and "-DSM_WPIN=1" not in ZEN4_FLAGS
    assert "-DSM_PFHEAD=1" in ZEN5_FLAGS and "-DSM_PFHEAD=1" not in ZEN4_FLAGS
    assert all(all(h in f for h in ZEN5_FLAGS) == ("-march=native" in f) for f in zen5)
    assert not any(h in f for f in zen5 for h in set(ZEN4_FLAGS) - set(ZEN5_FLAGS))
    assert [tuple(x for x in f if x not in ZEN5_FLAGS) for f in zen5] == list(_FLAG_SETS)
    for other in (
        info("AuthenticAMD", "25", ["avx2", "fma"]),
        info("AuthenticAMD", "26", ["avx2", "fma"]),
        info("AuthenticAMD", "27", ["avx2", "avx512f", "avx512_bf16"]),
        info("GenuineIntel", "6", ["avx2", "avx512f", "avx512_bf16"]),
        str(tmp_path / "missing"),
    ):
        assert flag_sets(other) == _FLAG_SETS
    monkeypatch.delenv(BF16_DOT_ENV, raising=False)
    assert bf16_dot_default() is True
    for value, want in (("1", True), ("0", False), ("auto", True)):
        monkeypatch.setenv(BF16_DOT_ENV, value)
        assert bf16_dot_default() is want
    monkeypatch.setenv(BF16_DOT_ENV, "yes")
    with pytest.raises(InputError, match=BF16_DOT_ENV):
        bf16_dot_default()
