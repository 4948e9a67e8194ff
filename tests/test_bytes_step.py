"""Bytes (paper 002 Eqs. (2), (3), (11), (12)) and verify/step times (Eqs. (5)-(7), (22))."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specmoe.cost import bytes as cb
from specmoe.cost import step
from specmoe.errors import InputError
from specmoe.spec import get_preset

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def routing(draw, max_layers=4, max_n=6):
    """Exact reuse rho [L, n] (rho_l(1) = 0), layer bytes w [L] and m."""
    L = draw(st.integers(1, max_layers))
    n = draw(st.integers(2, max_n))
    frac = st.builds(F, st.integers(0, 20), st.just(20))
    rho = [[F(0)] + [draw(frac) for _ in range(n - 1)] for _ in range(L)]
    w = [draw(st.builds(F, st.integers(1, 50), st.integers(1, 7))) for _ in range(L)]
    m = draw(st.integers(1, 8))
    return rho, w, m


def test_uniform_routing_gives_moesd_union():
    N, m, n_max = 64, 8, 9
    q = 1 - F(m, N)
    rho = [[1 - q ** (n - 1) for n in range(1, n_max + 1)]]
    U = cb.union_from_reuse(rho, m)
    assert list(U[0]) == [N * (1 - q**n) for n in range(1, n_max + 1)]  # Huang et al. (2025)


@SETTINGS
@given(r=routing())
def test_identities_exact(r):
    rho, w, m = r
    U = cb.union_from_reuse(rho, m)  # Eq. (2)
    assert (cb.reuse_from_union(U, m) == np.asarray(rho, dtype=object)).all()
    n = np.arange(1, len(rho[0]) + 1)
    W = sum(w)
    E_slot = [m * int(k) * W for k in n]
    E_dedup = cb.union_bytes(w, U)
    ref = [sum(wl * Ul[j] for wl, Ul in zip(w, U)) for j in range(len(n))]
    assert list(E_dedup) == ref
    gap = cb.reuse_gap(w, rho, m)  # Eq. (3)
    assert [s - d for s, d in zip(E_slot, E_dedup)] == list(gap)
    assert all(g >= 0 for g in gap)
    assert list(cb.byte_share(w, U, m)) == [d / s for d, s in zip(E_dedup, E_slot)]
    for k in range(1, len(n)):  # Eqs. (11), (12)
        rb = cb.mean_reuse(w, rho, k)
        ref_rb = sum(wl * rl[j - 1] for wl, rl in zip(w, rho) for j in range(2, k + 2)) / (k * W)
        assert rb == ref_rb
        assert cb.dedup_bytes_from_mean_reuse(m, W, k, rb) == E_dedup[k]


def test_byte_factor_table6():
    U = [[F(8), F(12)], [F(8), F(14)]]
    w = [F(3), F(5)]
    assert list(cb.dedup_request_bytes(w, U, F(10, 9))) == [
        F(10, 9) * x for x in cb.union_bytes(w, U)
    ]
    assert list(cb.dedup_request_bytes(w, U, [1, 2])) == [3 * 8 + 2 * 5 * 8, 3 * 12 + 2 * 5 * 14]
    assert cb.BYTE_FACTORS[("llama.cpp CUDA", "gpt-oss MXFP4")] == F(500, 459)
    with pytest.raises(InputError, match="byte_factor"):
        cb.dedup_request_bytes(w, U, F(1, 2))


def test_input_errors():
    with pytest.raises(InputError, match="rho"):
        cb.union_from_reuse([1, 2], 8)
    with pytest.raises(InputError, match="w"):
        cb.union_bytes([1.0], np.ones((2, 3)))
    with pytest.raises(InputError, match="k"):
        cb.mean_reuse([1.0], np.zeros((1, 3)), 3)


def test_pass_bytes_of_a_spec():
    spec = get_preset("OLMoE-1B-7B-0125")
    L, m = spec.num_moe_layers, spec.top_k
    U = np.tile(np.array([8.0, 13.0, 17.0]), (L, 1))
    pb = cb.pass_bytes(spec, U, context=100)
    W = spec.total_expert_bytes
    assert np.allclose(pb.slot, m * np.arange(1, 4) * W, rtol=1e-15)
    assert np.allclose(pb.union, spec.expert_bytes * L * U[0], rtol=1e-15)
    assert np.allclose(pb.dense, spec.dense_bytes + spec.kv_bytes_per_token * (100 + np.arange(3)))
    assert np.allclose(pb.mean_reuse, [1 - 5 / 8, 1 - (5 + 4) / 16])
    with pytest.raises(InputError, match="layers"):
        cb.pass_bytes(spec, U[:2])


def test_layer_mean():
    arr = np.array([[8.0, 12.0], [8.0, 14.0]])
    same, note = cb.layer_mean(arr, 2)
    assert same is not None and np.array_equal(same, arr) and "2 trace layers" in note
    mapped, note = cb.layer_mean(arr, 5)
    assert mapped.shape == (5, 2) and np.all(mapped == [8.0, 13.0]) and "layer-mean" in note


@pytest.mark.skipif(
    not __import__("importlib").util.find_spec("specmoe.routing.stats"),
    reason="routing statistics module not available",
)
def test_identity_and_eq12_on_a_trace():
    from specmoe.formats.trace import RoutingTrace
    from specmoe.routing.stats import compute_stats

    rng = np.random.default_rng(3)
    T, L, N, m, n_max = 400, 3, 12, 3, 5
    # a sticky synthetic routing: each token keeps some of the previous token's experts
    experts = np.zeros((T, L, m), dtype=np.int64)
    for layer in range(L):
        cur = rng.choice(N, m, replace=False)
        for t in range(T):
            keep = cur[rng.random(m) < 0.5]
            rest = rng.permutation(np.setdiff1d(np.arange(N), keep))[: m - keep.size]
            cur = np.concatenate([keep, rest])
            experts[t, layer] = cur
    trace = RoutingTrace(experts=experts, doc_offsets=np.array([0, 150, T]), num_experts=N)
    stats = compute_stats(trace, max_n=n_max, aligned=True)
    # brute force over the same windows: starts with room for n_max tokens in each document
    X = np.zeros((L, n_max))
    count = 0
    for a, b in ((0, 150), (150, T)):
        for t in range(a, b - n_max + 1):
            count += 1
            for layer in range(L):
                seen: set[int] = set()
                for n in range(n_max):
                    seen |= set(experts[t + n, layer].tolist())
                    X[layer, n] += len(seen)
    X /= count
    assert np.allclose(stats.union, X, rtol=0, atol=1e-12)
    assert np.allclose(cb.union_from_reuse(stats.rho, m), stats.union, atol=1e-12)  # Eq. (2)
    w = np.array([1.0, 2.0, 3.0])
    W = w.sum()
    E = cb.union_bytes(w, stats.union)
    for k in range(1, n_max):  # Eq. (12)
        rb = cb.mean_reuse(w, stats.rho, k)
        assert cb.dedup_bytes_from_mean_reuse(m, W, k, rb) == pytest.approx(E[k], rel=1e-12)


# ------------------------------------------------------------------------------------------
# step time


def test_verify_time_eq5():
    tau = step.verify_time(
        dense_bytes=np.array([100.0, 110.0]),
        dense_bandwidth=10.0,
        expert_bytes=np.array([40.0, 60.0]),
        expert_bandwidth=[20.0, 30.0],
        t0=1.0,
        fixed_work=[0.5, 0.25],
    )
    assert tau.tolist() == [1 + 10 + 2 + 0.5, 1 + 11 + 2 + 0.25]
    with pytest.raises(InputError, match="expert_bandwidth"):
        step.verify_time(dense_bytes=1, dense_bandwidth=1, expert_bytes=1, expert_bandwidth=0)


pos = st.floats(0.1, 100.0)


@SETTINGS
@given(
    E=pos,
    bs=pos,
    bd=pos,
    share=st.floats(0.2, 1.0),
    D=pos,
    bD=pos,
    t0=st.floats(0, 5),
    phs=st.floats(0, 2),
    phd=st.floats(0, 2),
)
def test_saving_eq6_and_rule_eq7(E, bs, bd, share, D, bD, t0, phs, phd):
    Ed = share * E
    tau_s = step.verify_time(
        dense_bytes=D,
        dense_bandwidth=bD,
        expert_bytes=E,
        expert_bandwidth=bs,
        t0=t0,
        fixed_work=phs,
    )
    tau_d = step.verify_time(
        dense_bytes=D,
        dense_bandwidth=bD,
        expert_bytes=Ed,
        expert_bandwidth=bd,
        t0=t0,
        fixed_work=phd,
    )
    # Eq. (6): S(n) = E_slot/beta_slot (1 - u_bar/r) - (phi_dedup - phi_slot), the closed form
    # of tau_slot - tau_dedup when f_l = 1 (t0 and the dense reads cancel)
    S = E / bs * (1 - share / (bd / bs)) - (phd - phs)
    assert S == pytest.approx(tau_s - tau_d, rel=1e-9, abs=1e-9)
    S_eq = E / bs * (1 - share / (bd / bs))  # equal fixed work: Eq. (7) decides the sign
    if abs(share - bd / bs) > 1e-9:
        assert bool(S_eq > 0) == bool(step.dedup_faster(share, bd / bs))


@SETTINGS
@given(s=st.lists(st.floats(-3, 3), min_size=1, max_size=10))
def test_crossover_brute_force(s):
    n = len(s)
    ref = next((k for k in range(2, n + 1) if all(x > 0 for x in s[k - 1 :])), None)
    assert step.crossover(s) == ref


@SETTINGS
@given(s=st.lists(st.floats(-3, 3), min_size=1, max_size=10), seed=st.integers(0, 99))
def test_crossover_in_any_order_and_its_callers(s, seed):
    """The one crossover: pass sizes in any order give the same answer, and the benchmark's and
    the measured runs' crossovers are this one."""
    from specmoe.bench.fit import crossover as bench_crossover
    from specmoe.engine.measure import measured_crossover

    n = np.arange(1, len(s) + 1)
    perm = np.random.default_rng(seed).permutation(len(s))
    ref = step.crossover(s)
    assert step.crossover(np.asarray(s)[perm], n[perm]) == ref
    assert bench_crossover(n[perm].tolist(), np.asarray(s)[perm].tolist()) == ref
    assert (
        measured_crossover({int(k): float(v) for k, v in zip(n[perm], np.asarray(s)[perm])}) == ref
    )


def test_crossover_examples():
    assert step.crossover([0, -1, 2, 3]) == 3
    assert step.crossover([0, 1, -1, 2]) == 4
    assert step.crossover([5, 1, 1]) == 2
    assert step.crossover([0, -1, -2]) is None


def test_draft_and_step_times():
    h = step.linear_draft_time(0.459, 0.073, 3)
    assert h.tolist() == [0.0, 0.459 + 0.073, 2 * 0.459 + 0.073, 3 * 0.459 + 0.073]
    assert (
        step.step_times([1.0, 2.0, 3.0, 4.0], h).tolist()
        == (np.array([1.0, 2.0, 3.0, 4.0]) + h).tolist()
    )
    with pytest.raises(InputError, match="h"):
        step.step_times([1.0, 2.0], [0.0, -1.0])
    with pytest.raises(InputError, match="draft time"):
        step.linear_draft_time(-1, 0, 3)


def _profile(L=2, n_max=4, model=None):
    from specmoe.formats.profile import BandwidthProfile

    rng = np.random.default_rng(0)
    op_s = rng.uniform(1e-3, 2e-3, (L, n_max)).cumsum(axis=1)
    op_d = op_s * rng.uniform(0.8, 1.3, (L, n_max))
    return BandwidthProfile(
        model=model or {"name": "x"},
        device="cpu",
        dtype="float32",
        ceiling_gbps=10.0,
        n=list(range(1, n_max + 1)),
        beta_slot=[5.0] * n_max,
        beta_dedup=[4.0] * n_max,
        r=[0.8] * n_max,
        u_bar=[1.0] * n_max,
        reread_cost=None,
        epsilon={"per_slot": 0.05, "dedup": 0.1},
        crossover=None,
        fits={},
        op_time={
            "per_slot": {"predicted": op_s.tolist(), "measured": (op_s * 1.1).tolist()},
            "dedup": {"predicted": op_d.tolist(), "measured": (op_d * 0.9).tolist()},
        },
        layers=list(range(L)),
    )


def test_whole_model_verify_time_eq22():
    prof = _profile()
    op_s = np.asarray(prof.op_time["per_slot"]["predicted"])
    op_d = np.asarray(prof.op_time["dedup"]["predicted"])
    tau1 = 0.02
    got = step.whole_model_verify_time(prof, "dedup", tau1)
    ref = [tau1 + sum(op_d[layer, n] - op_s[layer, 0] for layer in range(2)) for n in range(4)]
    ref[0] = tau1  # one-token passes run the per-slot kernel either way
    assert got == pytest.approx(ref, rel=1e-14)
    slot = step.whole_model_verify_time(prof, "per_slot", tau1)
    assert slot[0] == tau1
    scaled = step.whole_model_verify_time(prof, "dedup", tau1, num_layers=16)
    assert scaled == pytest.approx([tau1 + 8 * (r - tau1) for r in ref], rel=1e-12)
    meas = step.whole_model_verify_time(prof, "per_slot", tau1, source="measured")
    assert meas == pytest.approx(tau1 + 1.1 * (slot - tau1), rel=1e-12)
    with pytest.raises(InputError, match="kernel"):
        step.whole_model_verify_time(prof, "tiled", tau1)


def test_verify_model_policies():
    spec = get_preset("OLMoE-1B-7B-0125")
    U = np.tile(np.array([8.0, 12.0, 15.0, 17.0]), (spec.num_moe_layers, 1))
    pb = cb.pass_bytes(spec, U)
    bw = step.profile_bandwidths(_profile(), 4)
    vm = step.verify_model(
        pb, beta_slot=bw["beta_slot"], beta_dedup=bw["beta_dedup"], beta_dense=bw["beta_dense"]
    )
    assert vm.tau["dedup"][0] == vm.tau["per_slot"][0] and vm.saving[0] == 0
    assert np.array_equal(vm.tau["best"], np.minimum(vm.tau["per_slot"], vm.tau["dedup"]))
    for p in step.POLICIES:
        assert np.allclose(vm.memory[p], vm.dense_time + vm.expert[p], rtol=1e-15)
    eq6 = pb.slot / bw["beta_slot"] * (1 - pb.u_bar / vm.r)  # Eq. (6) with f_l = 1, phi = 0
    assert np.allclose(vm.saving[1:], eq6[1:], rtol=1e-12)
    assert vm.crossover == step.crossover(vm.saving)
    with pytest.raises(InputError, match=r"covers pass sizes 1\.\.4") as exc:
        step.profile_bandwidths(_profile(), 5)
    assert exc.value.argument == "n_max"
