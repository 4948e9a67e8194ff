"""Shared fixtures: tiny random MoE models of every supported family, built offline; the
bundled target, and its f32 GGUF for the tests against llama.cpp."""

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


@pytest.fixture(scope="session")
def gguf(tmp_path_factory):
    """The bundled target as f32 GGUF, exported once a session by ``specmoe export`` (for the
    tests against llama.cpp; a module's own ``gguf`` fixture takes its place there)."""
    from specmoe.cli import main

    path = tmp_path_factory.mktemp("gguf") / "f32.gguf"
    argv = ["export", "--format", "gguf", "--model", "bundled", "--out", str(path)]
    assert main([*argv, "--outtype", "f32"]) == 0
    return path


@pytest.fixture(scope="module")
def target():
    """The bundled target model (float32 on the CPU) and its tokenizer, loaded once a module."""
    from specmoe.engine.models import load_model, load_tokenizer

    return load_model("bundled"), load_tokenizer("bundled")
