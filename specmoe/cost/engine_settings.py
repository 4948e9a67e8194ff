"""Settings that start vLLM, SGLang and llama.cpp speculating at a planned draft length.

:func:`engine_settings` gives, for one engine and one drafter kind, the whole command line at a
fixed draft length k (the engine's own k* at the expected acceptance, from the kernel it really
runs) and, beside it, the plan's staircase k*(a) in the engine's own dynamic form where the
engine has one, each a plain dict (plan.json's ``engine.settings``). The option names, methods
and rules are those of the releases named in ``engine_rules.json``, read from their source:

- vLLM 0.33.0: ``--speculative-config`` JSON, the fields of ``SpeculativeConfig``
  (``vllm/config/speculative.py``; unknown keys are refused, ``extra="forbid"``). A config
  without ``method`` and ``model`` defaults to ``draft_model`` and fails ("num_speculative_tokens
  was provided but without speculative model"), so every config names its method. Dynamic form:
  ``num_speculative_tokens_per_batch_size`` ``[[start, end, k], ...]`` (inclusive batch-size
  ranges, ``vllm/v1/spec_decode/dynamic/utils.py``): keyed by batch size, not acceptance.
- SGLang 0.5.23: ``--speculative-algorithm`` (``NGRAM``, ``STANDALONE``, ``EAGLE``, ``EAGLE3``)
  with ``--speculative-draft-model-path`` (``sglang/srt/arg_groups/fields/spec.py``, rules in
  ``speculative_hook.py``). Dynamic form: ``--speculative-adaptive`` with a config file of
  ``candidate_steps`` per batch size, EAGLE/EAGLE3 with top-k 1 only
  (``sglang/srt/speculative/adaptive_spec_params.py``).
- llama.cpp (llama-cpp-python 0.3.36): ``--spec-type`` (default ``none``: a draft model alone does
  not speculate), ``--spec-draft-model``, ``--spec-draft-n-max/-n-min/-p-min``,
  ``--spec-ngram-mod-n-max/-n-min`` (``common/arg.cpp``; ``--draft-max``/``--draft-min`` abort
  start-up there). Dynamic form: drafting stops at the first draft token whose probability is
  below p-min, and drafts shorter than n-min are dropped (``common/speculative.cpp``).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specmoe.cost.engine_kernels import ENGINES
from specmoe.errors import InputError

__all__ = [
    "DRAFTERS",
    "EngineRequest",
    "engine_settings",
    "staircase_levels",
    "target_model_for",
]

DRAFTERS = ("ngram", "draft-model", "eagle", "eagle3")
VLLM_METHOD = {"ngram": "ngram", "draft-model": "draft_model", "eagle": "eagle", "eagle3": "eagle3"}
SGLANG_ALGORITHM = {
    "ngram": "NGRAM",
    "draft-model": "STANDALONE",
    "eagle": "EAGLE",
    "eagle3": "EAGLE3",
}
LLAMA_SPEC_TYPE = {"ngram": "ngram-mod", "draft-model": "draft-simple", "eagle3": "draft-eagle3"}
VLLM_NGRAM_WINDOW = (5, 5)  # vLLM's own prompt_lookup_min/max when neither is given
SGLANG_ADAPTIVE_FILE = "sglang_adaptive.json"


HF_SOURCE = "config.json of the Hugging Face repository "
GGUF_PLACEHOLDER = "MODEL.gguf"


@dataclass(frozen=True)
class EngineRequest:
    """What the engine settings are for: the ``engines`` to print, the ``drafter`` kind, the
    model each engine serves (``target_model``; None: from the spec) and the draft model or
    EAGLE head (``draft_model``), plus the facts the kernel rules need on CUDA:
    ``compute_capability`` (100 major + 10 minor; None: from the profile's device name) and
    ``weight_type`` (the GGUF expert type llama.cpp runs, a ggml type name)."""

    engines: tuple[str, ...] = ENGINES
    drafter: str = "ngram"
    target_model: str | None = None
    draft_model: str | None = None
    compute_capability: int | None = None
    weight_type: str = "Q4_K"

    def __post_init__(self) -> None:
        for e in self.engines:
            if e not in ENGINES:
                raise InputError(
                    f"unknown engine {e!r}; known: {', '.join(ENGINES)}", argument="engines"
                )
        if self.drafter not in DRAFTERS:
            raise InputError(
                f"unknown drafter {self.drafter!r}; known: {', '.join(DRAFTERS)}",
                argument="drafter",
            )
        if self.drafter != "ngram" and not self.draft_model:
            what = "an EAGLE head" if self.drafter.startswith("eagle") else "a draft model"
            raise InputError(
                f"drafter {self.drafter!r} needs {what} (its folder or Hugging Face id; a GGUF "
                "file for llama.cpp)",
                argument="draft_model",
            )


def target_model_for(engine: str, spec: dict[str, Any], given: str | None) -> tuple[str, list[str]]:
    """The model ``engine`` loads and what the user must still supply: ``given`` when set, else
    the spec's Hugging Face repository (a preset) or its local folder for vLLM and SGLang, and a
    placeholder GGUF file name for llama.cpp (which loads GGUF files only)."""
    needs: list[str] = []
    if given:
        if engine == "llama.cpp" and not given.lower().endswith(".gguf"):
            needs.append(f"llama.cpp loads GGUF files: {given} is not one")
        return given, needs
    if engine == "llama.cpp":
        return GGUF_PLACEHOLDER, [f"a GGUF file of the target model in place of {GGUF_PLACEHOLDER}"]
    source = str(spec.get("source") or "")
    if source.startswith(HF_SOURCE):
        return source[len(HF_SOURCE) :].strip(), needs
    if source.endswith("config.json"):
        return str(Path(source).parent), needs
    return "MODEL", ["the target model's folder or Hugging Face id in place of MODEL"]


def staircase_levels(staircase: Sequence[Any]) -> list[int]:
    """The draft lengths k the staircase k*(a) takes (Levels or ``{"k": ...}`` dicts), sorted."""
    ks = {int(lv["k"] if isinstance(lv, dict) else lv.k) for lv in staircase}
    return sorted(ks)


def _cmd(argv: Sequence[Any]) -> tuple[list[str], str]:
    args = [str(a) for a in argv]
    return args, shlex.join(args)


def _vllm(
    k: int, drafter: str, target: str, draft: str | None, force_triton: bool
) -> dict[str, Any]:
    base = ["vllm", "serve", target]
    extra = ["--moe-backend", "triton"] if force_triton else []
    notes = []
    if force_triton:
        notes.append(
            "--moe-backend triton: the Triton fused MoE whose rule the plan predicts for "
            "(vLLM prefers FlashInfer's grouped kernels off Hopper when FlashInfer is installed)"
        )
    if k == 0:
        argv, shell = _cmd(base + extra)
        return {"speculative_config": None, "command": argv, "shell": shell, "notes": notes}
    cfg: dict[str, Any] = {"method": VLLM_METHOD[drafter], "num_speculative_tokens": k}
    if drafter == "ngram":
        cfg["prompt_lookup_max"], cfg["prompt_lookup_min"] = (
            VLLM_NGRAM_WINDOW[1],
            VLLM_NGRAM_WINDOW[0],
        )
        notes.append(
            "prompt_lookup_max/min 5/5 are vLLM's own defaults (the n-gram window; tune to the text)"
        )
    else:
        cfg["model"] = draft
    argv, shell = _cmd([*base, "--speculative-config", json.dumps(cfg), *extra])
    dyn_cfg = dict(cfg, num_speculative_tokens_per_batch_size=[[1, 1, k]])
    dargv, dshell = _cmd([*base, "--speculative-config", json.dumps(dyn_cfg), *extra])
    return {
        "speculative_config": cfg,
        "command": argv,
        "shell": shell,
        "dynamic": {
            "knob": "num_speculative_tokens_per_batch_size",
            "available": True,
            "value": [[1, 1, k]],
            "speculative_config": dyn_cfg,
            "command": dargv,
            "shell": dshell,
            "note": (
                "vLLM's dynamic form is keyed by batch size, not by acceptance: each entry "
                "[start, end, k] covers an inclusive batch-size range. The plan predicts batch 1, "
                f"so its entry is [1, 1, {k}]; vLLM carries the last k on to every larger batch "
                "(build_dynamic_sd_schedule_lookup), so until rows for larger batches are added "
                "this equals the fixed setting. No vLLM option follows the acceptance staircase."
            ),
        },
        "notes": notes,
    }


def _sglang(
    k: int, drafter: str, target: str, draft: str | None, device: str, levels: list[int]
) -> dict[str, Any]:
    base = ["python", "-m", "sglang.launch_server", "--model-path", target]
    dev = ["--device", "cpu"] if device == "cpu" else []
    algo = SGLANG_ALGORITHM[drafter]
    if k == 0:
        argv, shell = _cmd(base + dev)
        return {"algorithm": None, "command": argv, "shell": shell, "notes": []}
    notes = []
    if drafter == "ngram":
        spec = [
            "--speculative-algorithm", algo,
            "--speculative-num-draft-tokens", k + 1,
            "--speculative-ngram-max-bfs-breadth", 1,
            "--speculative-ngram-min-bfs-breadth", 1,
        ]  # fmt: skip
        notes.append(
            "NGRAM verifies --speculative-num-draft-tokens tokens per request (the last accepted "
            f"token and {k} draft{'s' * (k != 1)}); a BFS breadth of 1 keeps the draft a chain, "
            "as planned"
        )
    else:
        spec = [
            "--speculative-algorithm", algo,
            "--speculative-draft-model-path", draft,
            "--speculative-num-steps", k,
            "--speculative-eagle-topk", 1,
            "--speculative-num-draft-tokens", k + 1,
        ]  # fmt: skip
    argv, shell = _cmd(base + spec + dev)
    out: dict[str, Any] = {"algorithm": algo, "command": argv, "shell": shell, "notes": notes}
    if drafter in ("eagle", "eagle3"):
        config = {"1": {"candidate_steps": levels}}
        dargv, dshell = _cmd(
            base
            + spec
            + ["--speculative-adaptive", "--speculative-adaptive-config", SGLANG_ADAPTIVE_FILE]
            + dev
        )
        out["dynamic"] = {
            "knob": "--speculative-adaptive",
            "available": True,
            "file": SGLANG_ADAPTIVE_FILE,
            "config": config,
            "command": dargv,
            "shell": dshell,
            "note": (
                f"save the config as {SGLANG_ADAPTIVE_FILE}: candidate_steps are the draft "
                "lengths of the plan's staircase (0 = no drafting); one batch-size key, so it "
                "serves every batch size. SGLang moves between them on its own rule (an EMA of "
                "the accepted drafts against step - 0.5, plus hysteresis), not at the plan's "
                "step points; the start value --speculative-num-steps must be a candidate."
            ),
        }
    else:
        out["dynamic"] = {
            "knob": "--speculative-adaptive",
            "available": False,
            "note": (
                "SGLang's --speculative-adaptive serves EAGLE and EAGLE3 with "
                "--speculative-eagle-topk 1 only (adaptive_unsupported_reason) and turns itself "
                f"off for {algo}"
            ),
        }
    return out


def _llama(
    k: int,
    drafter: str,
    target: str,
    draft: str | None,
    levels: list[int],
    a1: float | None,
) -> dict[str, Any]:
    base = ["llama-server", "-m", target]
    if k == 0:
        argv, shell = _cmd(base)
        return {"spec_type": None, "command": argv, "shell": shell, "notes": []}
    if drafter not in LLAMA_SPEC_TYPE:
        return {
            "spec_type": None,
            "command": None,
            "shell": None,
            "notes": [
                "llama.cpp has no EAGLE-1 drafter: its speculative types (common/speculative.cpp) "
                "take EAGLE-3 heads as draft-eagle3 (--drafter eagle3)"
            ],
            "dynamic": {"knob": None, "available": False, "note": "no EAGLE-1 drafter"},
        }
    st = LLAMA_SPEC_TYPE[drafter]
    positive = [x for x in levels if x > 0]
    k_min = min(positive) if positive else k
    k_top = max(positive) if positive else k
    if drafter == "ngram":
        spec = ["--spec-type", st, "--spec-ngram-mod-n-max", k, "--spec-ngram-mod-n-min", k_min]
        argv, shell = _cmd(base + spec)
        return {
            "spec_type": st,
            "command": argv,
            "shell": shell,
            "notes": [
                f"--spec-ngram-mod-n-min {k_min}: llama.cpp drops n-gram drafts shorter than "
                "this (its default 48 would drop every draft this short)"
            ],
            "dynamic": {
                "knob": None,
                "available": False,
                "note": (
                    "llama.cpp has no acceptance knob for n-gram drafts: their length follows "
                    "the match, up to --spec-ngram-mod-n-max; drafts shorter than "
                    f"--spec-ngram-mod-n-min (here {k_min}, the shortest draft the staircase "
                    "picks) are dropped"
                ),
            },
        }
    dm = ["--spec-draft-model", draft]
    fixed = ["--spec-draft-n-max", k, "--spec-draft-n-min", 0, "--spec-draft-p-min", 0]
    argv, shell = _cmd([*base, "--spec-type", st, *dm, *fixed])
    p_min = 0.0 if a1 is None or a1 >= 1 else round(float(a1), 4)
    dyn = ["--spec-draft-n-max", k_top, "--spec-draft-n-min", k_min, "--spec-draft-p-min", p_min]
    dargv, dshell = _cmd([*base, "--spec-type", st, *dm, *dyn])
    return {
        "spec_type": st,
        "command": argv,
        "shell": shell,
        "notes": ["p-min 0 and n-min 0: every round drafts the full n-max tokens"],
        "dynamic": {
            "knob": "--spec-draft-n-max/--spec-draft-n-min/--spec-draft-p-min",
            "available": True,
            "value": {"n_max": k_top, "n_min": k_min, "p_min": p_min},
            "command": dargv,
            "shell": dshell,
            "note": (
                f"n-max {k_top} and n-min {k_min}: the longest and shortest draft the staircase "
                f"picks; p-min {p_min:g} = a_1, the acceptance below which no draft pays. "
                "llama.cpp stops drafting at the first token whose draft probability is below "
                "p-min: one threshold, not the staircase's one per length, and exact only for a "
                "draft whose probabilities are its acceptance rates"
            ),
        },
    }


def engine_settings(
    engine: str,
    *,
    k: int,
    drafter: str = "ngram",
    target_model: str,
    draft_model: str | None = None,
    device: str = "cpu",
    staircase: Sequence[Any] = (),
    step_points: Sequence[float] = (),
    force_triton: bool = False,
) -> dict[str, Any]:
    """The settings of ``engine`` (``vllm``, ``sglang``, ``llama.cpp``) that draft ``k`` tokens
    per round with ``drafter`` (one of :data:`DRAFTERS`), serving ``target_model``;
    ``draft_model`` is the draft model or EAGLE head (required unless ``drafter`` is ngram).
    ``staircase``/``step_points`` (the engine's own policy plan) give the dynamic forms.
    k = 0 gives the plain command (speculation off)."""
    if drafter not in DRAFTERS:
        raise InputError(
            f"unknown drafter {drafter!r}; known: {', '.join(DRAFTERS)}", argument="drafter"
        )
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise InputError(f"must be an integer >= 0, got {k!r}", argument="k")
    if drafter != "ngram" and not draft_model:
        what = "an EAGLE head" if drafter.startswith("eagle") else "a draft model"
        raise InputError(f"drafter {drafter!r} needs {what}", argument="draft_model")
    levels = staircase_levels(staircase) if staircase else [0, k]
    a1 = float(step_points[0]) if len(step_points) else None
    if engine == "vllm":
        out = _vllm(k, drafter, target_model, draft_model, force_triton)
    elif engine == "sglang":
        out = _sglang(k, drafter, target_model, draft_model, device, levels)
    elif engine == "llama.cpp":
        out = _llama(k, drafter, target_model, draft_model, levels, a1)
    else:
        raise InputError(
            f"unknown engine {engine!r}; known: vllm, sglang, llama.cpp", argument="engine"
        )
    out = {"drafter": drafter, "draft_length": k, **out}
    if k == 0:
        out["notes"] = [*out.get("notes", []), "plain decoding is fastest: speculation off"]
        out.setdefault("dynamic", {"knob": None, "available": False, "note": "speculation off"})
    return out
