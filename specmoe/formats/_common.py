"""Helpers shared by the trace importers: the model spec and the number of experts N."""

from __future__ import annotations

from typing import Any

from specmoe.errors import InputError


def model_spec(model: str | None) -> Any:
    if model is None:
        return None
    from specmoe.spec import resolve_spec

    return resolve_spec(model)


def resolve_num_experts(num_experts: int | None, spec: Any, found: Any, *, name: str) -> int:
    """N from the importer's ``num_experts`` argument, its model spec (argument ``model``) and
    the file (``found``, None when the file does not say); they must agree. ``name`` labels the
    file in errors, which name the argument at fault (``num_experts`` or ``model``)."""
    sources = {"given": "num_experts", "the model spec": "model", "the file's meta": None}
    cands = {
        k: v
        for k, v in zip(sources, (num_experts, getattr(spec, "num_experts", None), found))
        if v is not None
    }
    if not cands:
        raise InputError(
            f"{name}: the number of experts is unknown; give it, or a model spec",
            argument="num_experts",
        )
    for k, v in cands.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(
                f"{name}: number of experts ({k}) must be a positive integer, got {v!r:.40}",
                argument=sources[k],
            )
    if len(set(cands.values())) > 1:
        raise InputError(
            f"{name}: number of experts disagrees: "
            + ", ".join(f"{k} {v}" for k, v in cands.items()),
            argument="num_experts" if "given" in cands else "model",
        )
    return next(iter(cands.values()))
