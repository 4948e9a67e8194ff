"""Shared fixtures: tiny random MoE models of every supported family, built offline."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def _tiny(model_type: str, seed: int = 0, **kwargs):
    from specmoe.engine.models import tiny_random_model

    return tiny_random_model(model_type, seed=seed, **kwargs)


@pytest.fixture(scope="session")
def tiny_moe():
    """``tiny_moe(model_type, seed=0, **kwargs)``: a cached tiny random model (do not mutate)."""
    pytest.importorskip("transformers")
    return _tiny


@pytest.fixture(scope="session")
def byte_tok():
    """The in-memory byte-level tokenizer the tiny models' vocabulary covers."""
    pytest.importorskip("transformers")
    from specmoe.engine.models import byte_tokenizer

    return byte_tokenizer()


@pytest.fixture(scope="module")
def ray_runtime(request):
    """A local Ray runtime with 2 CPUs for one test module (skipped without Ray). The module's
    own functions go to the workers by value: a test module is not importable on a worker."""
    ray = pytest.importorskip("ray")
    mod = request.module
    ray.cloudpickle.register_pickle_by_value(mod)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(mod)
