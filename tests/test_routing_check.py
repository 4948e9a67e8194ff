"""The cross-engine routing comparison's arithmetic (specmoe.engines.routing_check), on
constructed recordings whose answers are known by hand. No llama.cpp needed."""

from __future__ import annotations

import numpy as np
import pytest

from specmoe.engines.routing_check import agreement, bf16_ulp, top_gaps


def _probs(rng, t, nl, n):
    x = rng.random((t, nl, n))
    return x / x.sum(-1, keepdims=True)


def _topk(p, m):
    return np.argsort(-p, axis=-1, kind="stable")[..., :m]


def test_bf16_ulp_is_the_spacing_of_bfloat16_numbers():
    import torch

    for p in [0.5, 0.3, 0.0625, 0.01, 1e-3, 0.7, 0.999]:
        lo = torch.tensor(p).bfloat16()  # a bfloat16 number
        hi = (lo.view(torch.int16) + 1).view(torch.bfloat16)  # the next one above it
        assert float(bf16_ulp(np.array(lo.item()))) == float(hi.item()) - float(lo.item())


def test_top_gaps_against_a_full_sort():
    rng = np.random.default_rng(0)
    p = _probs(rng, 50, 3, 16)
    pm, gap = top_gaps(p, 4)
    s = -np.sort(-p, axis=-1)
    assert np.allclose(pm, s[..., 3]) and np.allclose(gap, s[..., 3] - s[..., 4])
    with pytest.raises(ValueError, match="m must be"):
        top_gaps(p, 16)


def test_identical_recordings_agree_everywhere():
    rng = np.random.default_rng(1)
    p = _probs(rng, 40, 2, 8)
    e = _topk(p, 3)
    a = agreement(e, e.copy(), p, p)
    assert a.set_agreement == 1.0 and a.ordered_agreement == 1.0 and a.passed
    assert a.disagreements["count"] == 0 and a.disagreements["experts_differing"] == {}
    assert a.per_layer == [1.0, 1.0]
    assert a.probs_abs_diff == {"max": 0.0, "p99": 0.0}
    assert a.all_pairs["count"] == 80


def test_order_only_differences_are_set_agreement():
    rng = np.random.default_rng(2)
    p = _probs(rng, 10, 1, 8)
    e = _topk(p, 3)
    flipped = e[..., ::-1].copy()
    a = agreement(e, flipped, p)
    assert a.set_agreement == 1.0 and a.ordered_agreement == 0.0


def test_swaps_are_counted_and_classified():
    # two layers, 8 experts, top-2; token 0 layer 1: a near tie between the 2nd and 3rd expert
    p = np.full((4, 2, 8), 0.0)
    base = np.array([0.40, 0.20, 0.15, 0.10, 0.06, 0.04, 0.03, 0.02])
    p[:] = base
    p[0, 1] = [0.40, 0.15, 0.1498, 0.10, 0.06, 0.04, 0.05, 0.0502]  # p_(2) - p_(3) = 2e-4
    ref = _topk(p, 2)
    other = ref.copy()
    other[0, 1] = [0, 2]  # the boundary swap: 2nd replaced by 3rd
    other[3, 0] = [5, 6]  # two experts differ, not a boundary swap
    a = agreement(ref, other, p)
    assert a.pairs == 8
    assert a.set_agreement == pytest.approx(6 / 8)
    assert a.per_layer == [0.75, 0.75]
    d = a.disagreements
    assert d["count"] == 2
    assert d["boundary_swaps"] == 1
    assert d["experts_differing"] == {1: 1, 2: 1}
    # gaps: 2e-4 (near tie) and 0.20 - 0.15 = 0.05
    assert d["gap_below_0.001"] == 1 and d["gap_below_0.0001"] == 0
    assert d["gap_max"] == pytest.approx(0.05)
    # one bf16 ulp at 0.15 is 2^-10 ~ 9.8e-4 > 2e-4: the near tie is within it
    assert d["gap_within_bf16_ulp"] == 1
    assert not a.passed


def test_shapes_must_match():
    p = np.full((3, 2, 8), 1 / 8)
    with pytest.raises(ValueError, match="shapes"):
        agreement(np.zeros((3, 2, 2), int), np.zeros((3, 2, 3), int), p)
    with pytest.raises(ValueError, match="ref_probs"):
        agreement(np.zeros((3, 2, 2), int), np.zeros((3, 2, 2), int), p[:2])


def test_layerwise_float32_reference_equals_the_float32_model():
    """A bfloat16 checkpoint cast to float32 one layer at a time computes the float32 model's
    numbers exactly (the bundled checkpoint is stored in bfloat16)."""
    from specmoe.engine.models import load_tokenizer
    from specmoe.engines.routing_check import transformers_reference

    tok = load_tokenizer("bundled")
    a = transformers_reference("bundled", tokens=300, window=128, tokenizer=tok)
    b = transformers_reference("bundled", tokens=300, window=128, tokenizer=tok, layerwise=True)
    assert a.dtype == "float32" and "per layer" in b.dtype
    assert a.experts.shape == (300, 4, 8) and len(a.windows) == len(b.windows) >= 3
    assert (a.experts == b.experts).all()
    assert np.array_equal(a.probs, b.probs)
