"""The embedded default: the bundled tiny OLMoE, its tokenizer, its corpus and its traces.

The corpus is the Python standard library's own source (see :mod:`specmoe.data.corpus`).
"""

from specmoe.data.corpus import (
    SPLITS,
    bundled_draft_dir,
    bundled_model_dir,
    bundled_trace_path,
    documents,
)

__all__ = ["SPLITS", "bundled_draft_dir", "bundled_model_dir", "bundled_trace_path", "documents"]
