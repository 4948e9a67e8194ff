"""The speculation theory of paper 002 (Sections 3.2-3.4, Appendix B) against exact brute force."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction as F

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specmoe.cost import theory
from specmoe.cost.bytes import dedup_bytes_from_mean_reuse, mean_reuse
from specmoe.errors import InputError

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------------------------------------
# independent references: plain exact loops, no code shared with the module


def ref_G(a: F, k: int) -> F:
    return sum((a**s for s in range(k + 1)), F(0))


def ref_kstar(V, a: F) -> int:
    T = [ref_G(a, k) / F(v) for k, v in enumerate(V)]
    best = max(T)
    return min(k for k, t in enumerate(T) if t == best)


def pos_fraction(lo=1, hi=60):
    return st.builds(F, st.integers(lo, hi), st.integers(1, 12))


step_times = st.lists(pos_fraction(), min_size=2, max_size=6)
acceptances = st.builds(F, st.integers(0, 999), st.just(1000))


def neighbours(x: float, steps: int = 4) -> tuple[float, float]:
    lo, hi = x, x
    for _ in range(steps):
        lo, hi = math.nextafter(lo, -math.inf), math.nextafter(hi, math.inf)
    return lo, hi


# ------------------------------------------------------------------------------------------
# worked examples of the paper


def test_jump_example_appendix_b3():
    V = [1, 2, 2]  # alternating experts, one bandwidth (Appendix B.3)
    assert theory.best_draft_length(V, F(1, 2)) == 0
    assert theory.best_draft_length(V, F(9, 10)) == 2
    a1, a2 = theory.step_points(V)
    assert a1 == a2  # the staircase jumps from 0 to 2: length 1 is never best
    assert a1 == (math.sqrt(5) - 1) / 2  # a + a^2 = 1
    assert theory.crossing_acceptance(V, 1, 0) == 1.0  # T(1) > T(0) at no a
    for num in range(0, 1000, 7):
        assert theory.best_draft_length(V, F(num, 1000)) != 1
    assert [lvl[2] for lvl in theory.staircase(V).levels] == [0, 2]


def _pattern_reuse(pattern: str, n_max: int) -> list[F]:
    """rho(j), j = 1..n_max, of the stationary process repeating ``pattern`` at a uniform phase
    (m = 1): the share of windows whose last token's expert an earlier token selected."""
    p = len(pattern)
    rho = []
    for j in range(1, n_max + 1):
        hits = 0
        for t in range(p):
            window = [pattern[(t + s) % p] for s in range(j)]
            hits += window[-1] in window[:-1]
        rho.append(F(hits, p))
    return rho


def test_no_single_threshold_table_appendix_b2():
    a, m, W = F(13, 20), 1, 1
    r1 = theory.reuse_threshold_bytes(a, 1, m=m, W=W, D=0)
    r2 = theory.reuse_threshold_bytes(a, 2, m=m, W=W, D=0)
    assert (r1, r2) == (F(7, 20), F(371, 800))
    # the time form with one bandwidth and no fixed time gives the same (Eq. (B.16))
    for k, r in ((1, r1), (2, r2)):
        assert theory.reuse_threshold(a, k, m=m, W=W, tau1=F(1), bandwidth_k=1, bandwidth_1=1) == r
    table = {
        "01": (F(0), F(1, 2), 2),
        "00012": (F(2, 5), F(2, 5), 1),
        "00102": (F(1, 5), F(2, 5), None),
    }
    for pattern, (rb1, rb2, speedup_k) in table.items():
        rho = [_pattern_reuse(pattern, 3)]
        assert (mean_reuse([1], rho, 1), mean_reuse([1], rho, 2)) == (rb1, rb2)
        # byte cost V_dedup(k) = D + E_dedup(k+1) + kv(k) with Eq. (12)
        V = [1] + [dedup_bytes_from_mean_reuse(m, W, k, mean_reuse([1], rho, k)) for k in (1, 2)]
        faster = [k for k in (1, 2) if theory.speeds_up(V, a, k)]
        by_threshold = [k for k, (rb, r) in enumerate(((rb1, r1), (rb2, r2)), 1) if rb > r]
        assert faster == by_threshold == ([] if speedup_k is None else [speedup_k])
        assert (theory.best_draft_length(V, a) >= 1) == (speedup_k is not None)


def test_factor_section_3_5():
    from specmoe.cost import bounds

    delta = bounds.delta_from_epsilon(F(1, 10))
    assert delta == F(1, 9)
    assert bounds.speedup_factor(delta) == F(5, 4)


# ------------------------------------------------------------------------------------------
# exact arithmetic and input checks


def test_exact_types_and_values():
    V = [F(3), F(4), F(9, 2)]
    assert theory.expected_tokens(F(1, 2), 2) == F(7, 4)
    assert theory.throughput(V, F(1, 2)) == [F(1, 3), F(3, 8), F(7, 18)]
    assert all(isinstance(t, F) for t in theory.throughput(V, F(1, 2)))
    assert all(isinstance(t, float) for t in theory.throughput([3.0, 4.0, 4.5], 0.5))
    assert theory.speedup(V, F(1, 2), 2) == F(7, 4) * 3 / F(9, 2)
    assert theory.first_threshold(V) == F(1, 3)
    assert theory.best_draft_length(V, F(1, 2)) == 2


@pytest.mark.parametrize(
    "bad, word",
    [
        (dict(V=[1, 2], a=1), "a"),
        (dict(V=[1, 2], a=-0.1), "a"),
        (dict(V=[1, 2], a=math.nan), "a"),
        (dict(V=[1], a=0.5), "k_max"),
        (dict(V=[1, 0], a=0.5), "V[1]"),
        (dict(V=[1, -2], a=0.5), "V[1]"),
        (dict(V=[1, math.inf], a=0.5), "V[1]"),
        (dict(V="12", a=0.5), "V"),
        (dict(V=[1, True], a=0.5), "V[1]"),
    ],
)
def test_bad_input_names_the_argument(bad, word):
    with pytest.raises(InputError, match=word.replace("[", r"\[").replace("]", r"\]")):
        theory.best_draft_length(bad["V"], bad["a"])


def test_bad_draft_length():
    with pytest.raises(InputError, match="k"):
        theory.speedup([1, 2], 0.5, 2)
    with pytest.raises(InputError, match="k"):
        theory.reuse_threshold(0.5, 0, m=1, W=1, tau1=1, bandwidth_k=1, bandwidth_1=1)


def test_float_ties_are_decided_exactly():
    # T(1) == T(0) exactly at a = 1/4 with V = (4, 5): the smallest maximiser is 0.
    assert theory.best_draft_length([4.0, 5.0], 0.25) == 0
    assert theory.best_draft_length([4.0, 5.0], math.nextafter(0.25, 1)) == 1
    assert theory.best_draft_length([F(4), F(5)], F(1, 4)) == 0


# ------------------------------------------------------------------------------------------
# invariants on random positive V


@SETTINGS
@given(V=step_times, a=acceptances, b=acceptances)
def test_kstar_is_smallest_maximiser_and_monotone(V, a, b):
    ka, kb = theory.best_draft_length(V, a), theory.best_draft_length(V, b)
    assert ka == ref_kstar(V, a)
    if a <= b:  # Eq. (B.28)
        assert ka <= kb
    # float inputs give the same exact answer
    assert theory.best_draft_length([float(v) for v in V], float(a)) == ref_kstar(
        [F(float(v)) for v in V], F(float(a))
    )


@SETTINGS
@given(V=step_times, a=acceptances)
def test_speedup_condition_eq8_and_a0(V, a):
    for k in range(1, len(V)):
        T = theory.throughput(V, a)
        assert theory.speeds_up(V, a, k) == (T[k] > T[0])
        assert theory.speedup(V, a, k) == T[k] / T[0]
    a0 = theory.first_threshold(V)
    T = theory.throughput(V, a)
    assert (T[1] > T[0]) == (a > a0)  # Eq. (B.4)
    if 0 <= a0 < 1:
        T0 = theory.throughput(V, a0)
        assert T0[1] == T0[0]
    assert (theory.best_draft_length(V, a) >= 1) == any(
        theory.speeds_up(V, a, k) for k in range(1, len(V))
    )  # Eq. (B.3)


@SETTINGS
@given(V=step_times)
def test_step_points_against_brute_force(V):
    pts = theory.step_points(V)
    assert pts == sorted(pts)
    assert all(0.0 <= p <= 1.0 for p in pts)
    Vf = [F(v) for v in V]
    for j, p in enumerate(pts, 1):
        lo, hi = neighbours(p)
        if p < 1.0 and hi < 1.0:  # just above a_j: k* >= j
            assert ref_kstar(Vf, F(hi)) >= j
        if p > 0.0:  # just below a_j: k* < j
            assert ref_kstar(Vf, F(max(lo, 0.0))) < j
        if p == 1.0:  # never reached
            assert ref_kstar(Vf, F(math.nextafter(1.0, 0.0))) < j
    # between step points k* is constant: the number of step points below a
    edges = sorted(set([0.0, *pts, 1.0]))
    for lo_e, hi_e in itertools.pairwise(edges):
        if hi_e - lo_e < 1e-9:
            continue
        level = sum(1 for p in pts if p <= lo_e)
        for t in (F(1, 3), F(1, 2), F(7, 9)):
            a = F(lo_e) + (F(hi_e) - F(lo_e)) * t
            assert ref_kstar(Vf, a) == level
    # each alpha_{k,i} separates the set {T(k) > T(i)} exactly
    for k in range(1, len(V)):
        for i in range(k):
            al = theory.crossing_acceptance(V, k, i)
            lo, hi = neighbours(al)
            Tk = lambda x, k=k: ref_G(x, k) / Vf[k]  # noqa: E731
            Ti = lambda x, i=i: ref_G(x, i) / Vf[i]  # noqa: E731
            if al < 1.0 and hi < 1.0:
                assert Tk(F(hi)) > Ti(F(hi))
            if al > 0.0:
                assert not Tk(F(lo)) > Ti(F(lo))


@st.composite
def convex_V(draw):
    V0 = draw(pos_fraction())
    incs = sorted(
        draw(st.lists(st.builds(F, st.integers(0, 40), st.integers(1, 8)), min_size=1, max_size=6))
    )
    V = [V0]
    for c in incs:
        V.append(V[-1] + c)
    return V


@SETTINGS
@given(V=convex_V(), a=acceptances)
def test_convex_form_agrees_with_max_min(V, a):
    assert theory.step_points_convex(V) == theory.step_points(V)  # Eq. (10)/(B.36) = (B.31)
    k = ref_kstar(V, a)
    for j in range(1, len(V)):
        assert theory.convex_reaches(V, a, j) == (k >= j)
    c1 = V[1] - V[0]
    assert theory.step_points_convex(V)[0] == float(min(c1 / V[0], F(1)))


def test_convex_form_rejects_non_convex():
    with pytest.raises(InputError, match="increments"):
        theory.step_points_convex([1, 3, 4])


# ------------------------------------------------------------------------------------------
# deduplicating engines (Section 3.4, Appendix B.2)

dedup_setup = st.fixed_dictionaries(
    {
        "m": st.integers(1, 8),
        "W": pos_fraction(1, 20),
        "D": st.builds(F, st.integers(0, 40)),
        "kv": st.builds(F, st.integers(0, 5)),
        "t0": st.builds(F, st.integers(0, 5), st.just(4)),
        "beta_D": pos_fraction(1, 20),
        "beta1": pos_fraction(1, 20),
        "B": st.lists(pos_fraction(1, 20), min_size=3, max_size=3),
        "phi1": st.builds(F, st.integers(0, 5), st.just(3)),
        "phi": st.lists(st.builds(F, st.integers(0, 5), st.just(3)), min_size=3, max_size=3),
        "a": acceptances,
    }
)


def _time_model(s, rho_bar):
    """V(k) by Eq. (B.10) with the union bytes of Eq. (12) (k_max = len(rho_bar))."""
    m, W = s["m"], s["W"]
    Dn = lambda n: s["D"] + s["kv"] * (n - 1)  # noqa: E731
    V = [s["t0"] + Dn(1) / s["beta_D"] + m * W / s["beta1"] + s["phi1"]]
    for k, rb in enumerate(rho_bar, 1):
        E = dedup_bytes_from_mean_reuse(m, W, k, rb)
        V.append(s["t0"] + Dn(k + 1) / s["beta_D"] + E / s["B"][k - 1] + s["phi"][k - 1])
    return V


def _threshold(s, V, k):
    return theory.reuse_threshold(
        s["a"],
        k,
        m=s["m"],
        W=s["W"],
        tau1=V[0],
        bandwidth_k=s["B"][k - 1],
        bandwidth_1=s["beta1"],
        dense_growth_bytes=s["kv"] * k,
        dense_bandwidth=s["beta_D"],
        fixed_work_growth=s["phi"][k - 1] - s["phi1"],
    )


rho_bars = st.lists(st.builds(F, st.integers(0, 100), st.just(100)), min_size=3, max_size=3)


@SETTINGS
@given(s=dedup_setup, rho_bar=rho_bars)
def test_reuse_threshold_decides_speedup_eq14(s, rho_bar):
    V = _time_model(s, rho_bar)
    for k in (1, 2, 3):
        thr = _threshold(s, V, k)
        assert isinstance(thr, F)
        assert (rho_bar[k - 1] > thr) == theory.speeds_up(V, s["a"], k)  # Eq. (B.14)
        E = dedup_bytes_from_mean_reuse(s["m"], s["W"], k, rho_bar[k - 1])
        assert theory.dedup_speedup(
            s["a"],
            k,
            tau1=V[0],
            dedup_bytes=E,
            m=s["m"],
            W=s["W"],
            bandwidth_k=s["B"][k - 1],
            bandwidth_1=s["beta1"],
            dense_growth_bytes=s["kv"] * k,
            dense_bandwidth=s["beta_D"],
            fixed_work_growth=s["phi"][k - 1] - s["phi1"],
        ) == theory.speedup(V, s["a"], k)
        # the threshold falls as a grows (Eq. (B.19))
        if s["a"] < F(999, 1000):
            b = (s["a"] + 1) / 2
            assert _threshold({**s, "a": b}, V, k) < thr


@SETTINGS
@given(s=dedup_setup, rho_bar=rho_bars, more=rho_bars)
def test_more_reuse_never_removes_a_speedup(s, rho_bar, more):
    rho2 = [max(x, y) for x, y in zip(rho_bar, more)]  # rho_bar <= rho2 everywhere
    V1, V2 = _time_model(s, rho_bar), _time_model(s, rho2)
    assert V2[0] == V1[0] and all(v2 <= v1 for v1, v2 in zip(V1, V2))  # Eq. (B.15), (B.20)
    if theory.best_draft_length(V1, s["a"]) >= 1:
        assert theory.best_draft_length(V2, s["a"]) >= 1
    for k in (1, 2, 3):
        assert theory.speedup(V2, s["a"], k) >= theory.speedup(V1, s["a"], k)


@SETTINGS
@given(
    m=st.integers(1, 8),
    W=pos_fraction(),
    D=st.builds(F, st.integers(0, 30)),
    kv=st.lists(st.builds(F, st.integers(0, 9)), min_size=4, max_size=4),
    a=acceptances,
    k=st.integers(1, 3),
)
def test_byte_form_is_the_one_bandwidth_case(m, W, D, kv, a, k):
    kv = sorted(kv)
    beta = F(7, 3)
    t = theory.reuse_threshold(
        a,
        k,
        m=m,
        W=W,
        tau1=(D + kv[0] + m * W) / beta,
        bandwidth_k=beta,
        bandwidth_1=beta,
        dense_growth_bytes=kv[k] - kv[0],
        dense_bandwidth=beta,
    )
    assert t == theory.reuse_threshold_bytes(a, k, m=m, W=W, D=D, kv=kv)  # Eq. (16)
    if a > 0:  # falls as D grows (Eq. (B.19))
        assert theory.reuse_threshold_bytes(
            a, k, m=m, W=W, D=D + 1, kv=kv
        ) < theory.reuse_threshold_bytes(a, k, m=m, W=W, D=D, kv=kv)


def test_staircase_levels_read_off():
    V = [F(10), F(11), F(12), F(14)]
    stc = theory.staircase(V)
    for num in range(0, 1000, 13):
        a = F(num, 1000)
        if all(abs(float(a) - p) > 1e-9 for p in stc.step_points):
            assert stc.best(float(a)) == ref_kstar(V, a)
