"""Helpers shared by the trace importers: the model spec and the number of experts N."""

from __future__ import annotations

from typing import Any

from specmoe.errors import InputError


def model_spec(model: str | None) -> Any:
    if model is None:
        return None
    from specmoe.spec import resolve_spec

    return resolve_spec(model)


def resolve_num_experts(given: int | None, spec: Any, found: Any, *, name: str) -> int:
    """N from --num-experts, the model spec and the file; they must agree."""
    cands = {
        k: v
        for k, v in (
            ("--num-experts", given),
            ("--model", getattr(spec, "num_experts", None)),
            ("the file's meta", found),
        )
        if v is not None
    }
    if not cands:
        raise InputError(
            f"{name}: the number of experts is unknown; give --num-experts N or --model SPEC"
        )
    for k, v in cands.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(
                f"{name}: number of experts ({k}) must be a positive integer, got {v!r:.40}"
            )
    if len(set(cands.values())) > 1:
        raise InputError(
            f"{name}: number of experts disagrees: "
            + ", ".join(f"{k} says {v}" for k, v in cands.items())
        )
    return next(iter(cands.values()))
