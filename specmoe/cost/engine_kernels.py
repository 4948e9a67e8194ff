"""The expert kernel each serving engine runs on a pass of n tokens, as data read from its source.

``engine_rules.json`` (package data, next to this module) holds, per engine and device, the
engine's rule and the files of the release it was read from: vLLM's Triton fused MoE reads per
slot while n * top_k * 4 <= num_experts and groups by expert above (``fused_moe.py``), vLLM on
the CPU, SGLang and llama.cpp on the CPU group by expert at every n, llama.cpp on CUDA runs its
per-slot MMVQ kernel up to ``get_mmvq_mmid_max_batch`` tokens (``mmvq.cu``) and groups above.
:func:`engine_kernel` evaluates a rule at n = 1..n_max into one kernel name per pass size:
``per_slot`` (specmoe's per-slot kernel model) or ``dedup`` (a grouped kernel reads each routed
expert once: specmoe's deduplicating kernel model). A rule that needs a fact this data does not
hold (a GPU whose compute capability is unknown, unquantized llama.cpp experts on CUDA) gives
``kernel = None`` and a note saying what is missing; it is never guessed.

Legend: ``n`` pass sizes 1..n_max (tokens in the MoE layer's input at batch 1).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from specmoe.errors import InputError

__all__ = [
    "ENGINES",
    "EngineKernel",
    "compute_capability_of",
    "engine_kernel",
    "engine_rules",
    "parse_compute_capability",
]

ENGINES = ("vllm", "sglang", "llama.cpp")
RULES_FILE = "engine_rules.json"


@functools.cache
def engine_rules() -> dict[str, Any]:
    """The packaged rule data (``specmoe/cost/engine_rules.json``) as a dict."""
    text = resources.files("specmoe.cost").joinpath(RULES_FILE).read_text(encoding="utf-8")
    return json.loads(text)


@dataclass(frozen=True)
class EngineKernel:
    """One engine's expert kernel on one device: ``kernel`` [n_max] (``per_slot``/``dedup``
    per pass size n = 1..n_max), or None when the rule cannot be evaluated (``note`` says why);
    ``rule`` the rule in words, ``sources`` the files of ``release`` it was read from (each
    ``{"file", "where", "text"}``) and ``conditions`` when it holds."""

    engine: str
    name: str
    release: str
    device: str
    kernel_name: str
    rule: str
    sources: tuple[dict[str, str], ...]
    conditions: tuple[str, ...]
    kernel: tuple[str, ...] | None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "release": self.release,
            "device": self.device,
            "kernel_name": self.kernel_name,
            "rule": self.rule,
            "sources": [dict(s) for s in self.sources],
            "conditions": list(self.conditions),
            "kernel": None if self.kernel is None else list(self.kernel),
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, engine: str, d: dict[str, Any]) -> EngineKernel:
        return cls(
            engine=engine,
            name=d["name"],
            release=d["release"],
            device=d["device"],
            kernel_name=d["kernel_name"],
            rule=d["rule"],
            sources=tuple(dict(s) for s in d["sources"]),
            conditions=tuple(d["conditions"]),
            kernel=None if d["kernel"] is None else tuple(d["kernel"]),
            note=d.get("note"),
        )


def parse_compute_capability(text: Any, argument: str = "compute_capability") -> int:
    """``"9.0"`` (major.minor) as ggml's integer form 100 major + 10 minor (900)."""
    s = str(text).strip()
    parts = s.split(".")
    try:
        if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
            raise ValueError(s)
        major = int(parts[0])
        minor = int(parts[1]) if len(parts) == 2 else 0
    except ValueError:
        raise InputError(
            f"{s!r} is not a compute capability MAJOR.MINOR", argument=argument
        ) from None
    if not 1 <= major <= 20 or minor > 9:
        raise InputError(f"{s!r} is not a compute capability MAJOR.MINOR", argument=argument)
    return 100 * major + 10 * minor


def compute_capability_of(device_name: str | None) -> int | None:
    """The compute capability (ggml's integer form) of an NVIDIA GPU by its name, from the
    table in the rule data (the longest matching name wins); None when it is not tabled."""
    if not device_name:
        return None
    names = engine_rules()["nvidia_compute_capability"]["names"]
    hits = [k for k in names if k.lower() in device_name.lower()]
    if not hits:
        return None
    return parse_compute_capability(names[max(hits, key=len)])


def _slots_per_expert(rule: dict, n_max: int, num_experts: int, top_k: int) -> tuple[str, ...]:
    f = int(rule["factor"])
    return tuple(
        "per_slot" if n * top_k * f <= num_experts else "dedup" for n in range(1, n_max + 1)
    )


def _mmvq_limit(rule: dict, cc: int, weight_type: str) -> int:
    """get_mmvq_mmid_max_batch(type, cc) of ggml-cuda/mmvq.cu for an NVIDIA GPU."""
    for arch in rule["nvidia"]:
        if cc in arch.get("also_cc", []) or cc >= int(arch["min_cc"]):
            return int(arch["table"].get(weight_type, rule["max_batch"]))
    return int(rule["max_batch"])  # pragma: no cover - the last entry has min_cc 0


def engine_kernel(
    engine: str,
    device: str,
    n_max: int,
    *,
    num_experts: int,
    top_k: int,
    compute_capability: int | None = None,
    weight_type: str | None = None,
) -> EngineKernel:
    """The kernel ``engine`` runs at n = 1..``n_max`` on ``device`` (``cpu`` or ``cuda``) for
    a model with ``num_experts`` routed experts and ``top_k`` of them per token.

    ``compute_capability`` (100 major + 10 minor) and ``weight_type`` (a ggml type name such as
    ``Q4_K``) feed llama.cpp's CUDA rule; without them (or for an unquantized type there) the
    kernel is None and ``note`` names the missing fact.
    """
    rules = engine_rules()["engines"]
    if engine not in rules:
        raise InputError(f"unknown engine {engine!r}; known: {', '.join(rules)}", argument="engine")
    e = rules[engine]
    dev = "cuda" if str(device).lower().startswith("cuda") else str(device).lower()
    if dev not in e["devices"]:
        return EngineKernel(
            engine=engine,
            name=e["name"],
            release=e["release"],
            device=dev,
            kernel_name="",
            rule="",
            sources=(),
            conditions=(),
            kernel=None,
            note=f"no {e['name']} kernel rule tabled for device {device!r} "
            f"(tabled: {', '.join(e['devices'])})",
        )
    d = e["devices"][dev]
    rule = d["rule"]
    kernel: tuple[str, ...] | None
    note = None
    kind = rule["kind"]
    if kind == "grouped":
        kernel = tuple("dedup" for _ in range(n_max))
    elif kind == "slots_per_expert":
        kernel = _slots_per_expert(rule, n_max, int(num_experts), int(top_k))
    elif kind == "mmvq_max_batch":
        wt = (weight_type or "").upper()
        if compute_capability is None:
            kernel, note = (
                None,
                (
                    "the GPU's compute capability is unknown (not in the table of GPU names): "
                    "pass --compute-capability"
                ),
            )
        elif wt not in rule["quantized_types"]:
            kernel, note = (
                None,
                (
                    f"weight type {weight_type!r} is not a quantized ggml type: llama.cpp's "
                    "unquantized MUL_MAT_ID path on CUDA (MMF, cuBLAS) is not tabled"
                ),
            )
        else:
            limit = _mmvq_limit(rule, int(compute_capability), wt)
            kernel = tuple("per_slot" if n <= limit else "dedup" for n in range(1, n_max + 1))
            note = f"MMVQ up to n = {limit} for {wt} at compute capability {compute_capability / 100:.1f}"
    else:  # pragma: no cover - the packaged data holds only the kinds above
        raise InputError(f"unknown rule kind {kind!r} in {RULES_FILE}", argument="engine")
    return EngineKernel(
        engine=engine,
        name=e["name"],
        release=e["release"],
        device=dev,
        kernel_name=d["kernel"],
        rule=d["text"],
        sources=tuple(dict(s) for s in d["sources"]),
        conditions=tuple(d["conditions"]),
        kernel=kernel,
        note=note,
    )
