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
