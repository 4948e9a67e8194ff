"""The uniform variant carried to another expert count (paper 003 Appendix M.3's scaling)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from specmoe.errors import InputError
from specmoe.routing.ipf import ExpertMoments, fit_moments
from specmoe.routing.synth import synthesize, uniform_moments


def _moments(N=16, m=2, L=2, J=2, seed=0):
    rng = np.random.default_rng(seed)
    pop = rng.dirichlet(np.ones(N), size=L) * m
    pop = np.minimum(pop, 0.9)
    pop *= m / pop.sum(axis=1, keepdims=True)
    co = pop[:, None, :] * rng.uniform(0.2, 0.8, size=(L, J, N))
    return ExpertMoments(num_experts=N, top_k=m, popularity=pop, coactivation=co)


def test_uniform_moments_keep_every_layer_overlap_exactly():
    src = _moments()
    out = uniform_moments(src, 40)
    assert out.num_experts == 40 and out.top_k == src.top_k
    assert np.allclose(out.popularity, src.top_k / 40)
    # sum over experts of c_e(j) is the overlap times m: the source's, at every layer and lag
    assert np.allclose(
        out.coactivation.sum(axis=2), src.coactivation.sum(axis=2), rtol=0, atol=1e-12
    )
    assert np.allclose(out.overlap, src.overlap, atol=1e-12)


def test_uniform_moments_need_more_experts_than_m():
    with pytest.raises(InputError) as e:
        uniform_moments(_moments(m=2), 2)
    assert e.value.argument == "num_experts"


def test_synthesis_at_another_n_draws_m_distinct_experts_with_the_source_overlap():
    from specmoe.data import corpus
    from specmoe.formats.trace import load_trace

    src = fit_moments(load_trace(corpus.bundled_trace_path("validation")), max_lag=4)
    N2 = 2 * src.num_experts
    tr = synthesize(src, 6000, num_experts=N2, variant="uniform", window=3, seed=1)
    e = tr.experts
    assert tr.num_experts == N2 and e.shape == (6000, src.num_layers, src.top_k)
    assert e.min() >= 0 and e.max() < N2
    srt = np.sort(e, axis=2)
    assert not (srt[..., 1:] == srt[..., :-1]).any()  # m distinct experts a token
    # lag-1 overlap of the synthetic trace against the source's, layer by layer (brute force)
    for layer in range(src.num_layers):
        a = e[:-1, layer]
        b = e[1:, layer]
        shared = np.array([len(set(x) & set(y)) for x, y in zip(a, b)]) / src.top_k
        assert abs(shared.mean() - src.overlap[layer, 0]) < 0.03


def test_skewed_refuses_another_n():
    src = _moments()
    with pytest.raises(InputError) as e:
        synthesize(src, 10, num_experts=32, variant="skewed")
    assert e.value.argument == "num_experts" and "uniform" in e.value.message


def test_cli_layers_needs_a_model(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", "import sys; from specmoe.cli import main; sys.exit(main(sys.argv[1:]))", "synth", "--from", "x.npz", "--layers", "4",
         "--tokens", "10", "--out", str(tmp_path / "o.npz")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--layers" in r.stderr
