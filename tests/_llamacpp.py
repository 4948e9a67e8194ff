"""The skip rule of the tests against the llama.cpp build: skipped when llama.cpp is not built
(``make llama-cpp``); with SPECMOE_REQUIRE_LLAMACPP=1 a missing build fails them instead. (The
bundled target's f32 GGUF is conftest's ``gguf`` fixture.)"""

from __future__ import annotations

import os

import pytest

from specmoe.engines import llamacpp

REQUIRED = bool(os.environ.get("SPECMOE_REQUIRE_LLAMACPP"))
needs_llamacpp = pytest.mark.skipif(
    not llamacpp.is_built() and not REQUIRED,
    reason=f"llama.cpp {llamacpp.VERSION} is not built (make llama-cpp)",
)
