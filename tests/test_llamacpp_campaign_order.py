"""scripts/llamacpp_campaign.py --interleave-verify: the order of a depth's units with its
verify units spread among its throughput units, against an exact reference (a merge by
rational position), on the protocol's own designs. Pure ordering: no llama.cpp needed."""

from __future__ import annotations

from fractions import Fraction

import pytest
from _scripts import load_script
from hypothesis import given, settings
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def lc():
    return load_script("llamacpp_campaign")


def _units(lc, v: int, t: int):
    ver = [lc.Unit("c", f"verify-d8-p{p:02d}", "verify", 8, p) for p in range(v)]
    thr = [lc.Unit("c", f"oracle-d8-r0-p{p:03d}", "oracle", 8, p, 0) for p in range(t)]
    return ver + thr, ver, thr


def _reference(ver, thr):
    """Verify unit i at the rational position i * T / V, throughput unit j at j + 1 (before
    a verify unit at the same position): verify i precedes throughput j exactly when
    floor(i * T / V) <= j."""
    if not ver or not thr:
        return [*ver, *thr]
    keyed = [(Fraction(i * len(thr), len(ver)), 1, u) for i, u in enumerate(ver)]
    keyed += [(Fraction(j + 1), 0, u) for j, u in enumerate(thr)]
    return [u for _, _, u in sorted(keyed, key=lambda k: (k[0], k[1]))]


@settings(max_examples=200, deadline=None)
@given(v=st.integers(0, 40), t=st.integers(0, 200))
def test_interleaving_matches_the_exact_merge_and_keeps_each_kind_s_order(lc, v, t):
    units, ver, thr = _units(lc, v, t)
    got = lc.interleave_verify(units)
    assert got == _reference(ver, thr)
    assert [u for u in got if u.kind == "verify"] == ver
    assert [u for u in got if u.kind != "verify"] == thr
    if v and t:
        assert got[0] == ver[0]
        # between two verify units (and after the last) at most ceil(T / V) throughput units
        gaps, run = [], 0
        for u in got[1:]:
            if u.kind == "verify":
                gaps.append(run)
                run = 0
            else:
                run += 1
        gaps.append(run)
        assert max(gaps) <= -(-t // v) and (v > t or min(gaps) >= t // v)


def test_the_protocol_s_design_interleaved_depth_by_depth(lc):
    """Round 11's d = 512 design (verify 32 x 4, throughput 31 x 4 x 128) and 16 x 4 x 128 at
    d = 2048 (a configuration's depths share their repeats): the same units as the plain
    order, each depth's units together and first a verify unit, no stretch of more than four
    (d = 512: 124 over 32) or two (d = 2048: 64 over 32) throughput units without one."""
    cfg = lc.dataclasses.replace(
        lc.CONFIGS["llamacpp-bundled"],
        throughput=(31, 4, 128),
        throughput_at=((2048, (16, 4, 128)),),
    )
    plain = lc.units_of_config(cfg)
    mixed = lc.units_of_config(cfg, interleave=True)
    assert sorted(u.name for u in mixed) == sorted(u.name for u in plain)
    assert [u.depth for u in mixed] == sorted(u.depth for u in mixed)
    for d, most in ((512, 4), (2048, 2)):
        at = [u for u in mixed if u.depth == d]
        assert at[0].kind == "verify"
        run = longest = 0
        for u in at:
            run = run + 1 if u.kind != "verify" else 0
            longest = max(longest, run)
        assert longest == most
    assert lc.units_of_config(cfg, interleave=False) == plain
