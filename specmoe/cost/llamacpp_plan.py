"""llama.cpp's speedup from llama.cpp's own pass times, and the llama-server flags at the best k.

Input: the ``llamacpp_verify.json`` of ``specmoe bench --engine llama.cpp --draft-model D``:
llama-bench's time of one pass of n = 1..N tokens at each KV-cache depth, for the target
(``verify``) and the draft model (``draft.verify``). At depth d, with tau_T(n) and tau_D(n)
those pass times, one round of llama-server's draft-simple speculation with k drafts costs

    V(k) = tau_T(k + 1) + tau_D(k + 1) + k tau_D(1),   V(0) = tau_T(1),

the target's verification pass of k + 1 tokens (paper 002 Section 3.1, V(k) = tau(k + 1) + h(k)),
the draft model drafting its k tokens one at a time (``draft`` of ``draft-simple`` in
``common/speculative.cpp``: a one-token pass on the last token, then one per draft but the last)
and the draft model re-evaluating the target's batch (``common_speculative_process`` after every
target decode in ``tools/server/server-context.cpp``, "always re-evaluate for simplicity").

Graph builds. llama.cpp reuses a decode's graph when the decode before it on the same context
had the same token and output counts (``llama_context::process_ubatch``, ``can_reuse``), and
llama-bench, which repeats each n, times passes that reuse. In the server the target always
decodes k + 1 tokens and a plain server 1, so those reuse too; the draft context alternates its
one-token drafts with the k + 1 tokens of the re-evaluation, so it builds two graphs a round:
its first one-token pass and the re-evaluation. Where the profile holds the draft's passes
with every graph built anew (``draft.verify_rebuilt``, llama-bench under
``LLAMA_GRAPH_REUSE_DISABLE=1``, tau_D^b), those two passes are taken from it:

    V(k) = tau_T(k + 1) + tau_D^b(k + 1) + tau_D^b(1) + (k - 1) tau_D(1).
Output rows. llama-bench's pass asks for the logits of its last row only; the server's
verification of k drafts asks for all k + 1 (each is sampled), so its lm_head multiplies k + 1
rows. Where the profile holds ``output_rows`` (the paired extra time of every row's logits
over the last row's in libllama, :mod:`specmoe.engines.llamacpp_rows`), V(k >= 1) adds it:
r_T(k + 1), 0 at k = 0 (a plain token is one row, as llama-bench's).

No other per-round time (sampling, the server's bookkeeping) is in V(k) unless given: llama-bench
does not time it; ``overhead`` adds what was measured on the server, o_plain per plain token
to V(0) and o_round + k o_token per speculative round to V(k >= 1). The speedup at acceptance a is Eq. (9) of paper 002,

    S(a, k) = G_a(k) V(0) / V(k),   G_a(k) = (1 - a^(k+1)) / (1 - a),

(:func:`specmoe.cost.theory.speedup`) and k*(a) its smallest maximiser over k = 0..k_max
(:func:`specmoe.cost.theory.best_draft_length`); S(a, 0) = 1.

A fourth overhead, o_emit ms per emitted token, is work the server does once per token it
emits (the target's sampler over the whole vocabulary at each position it checks, one more
than the drafts accepted,
the piece and stop-string bookkeeping): a round emitting G_a(k) tokens on average costs
V(k) + o_emit G_a(k), so the step time depends on a. A plain token pays it too (it is inside
o_plain), so with V'(0) = V(0) - o_emit and V'(k) = V(k) for k >= 1,

    T_a(k) = G_a(k) / (V'(k) + o_emit G_a(k)),   1 / T_a(k) = V'(k) / G_a(k) + o_emit,

and k*(a), the staircase and the step points are those of V' (the added constant does not
move an argmin), while S(a, k) = T_a(k) / T_a(0) = G_a(k) V(0) / (V'(k) + o_emit G_a(k)).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.cost import theory
from specmoe.errors import InputError

__all__ = [
    "BENCH_KV_TYPES",
    "KV_TYPES",
    "ROWS_FITS",
    "STATISTICS",
    "LlamaCppProfile",
    "extra_ms",
    "kv_flags",
    "llamacpp_plan",
    "load_llamacpp_profile",
    "server_flags",
    "step_times",
]

STATISTICS = ("median_ms", "min_ms", "mean_ms")
# the KV cache types of specmoe's llama.cpp engine (specmoe.engines.llamacpp_shim.KV_TYPES:
# f16, llama.cpp's default; f32; keys in q8_0, values f16), and those llama-bench takes: its
# -ctk/-ctv know no f32 (its ggml_type_from_name), the server's do
KV_TYPES = ("f16", "f32", "q8_0")
BENCH_KV_TYPES = ("f16", "q8_0")
ROWS_FITS = ("median", "line")
MAX_PROFILE_BYTES = 64 << 20


@dataclass(frozen=True)
class LlamaCppProfile:
    """Pass times in ms at each depth: ``target[d][n-1]`` = tau_T(n), ``draft[d][n-1]`` = tau_D(n)
    (``draft`` empty when the profile holds no draft model), plus what they were measured with."""

    path: str
    statistic: str
    target: dict[int, list[float]]
    draft: dict[int, list[float]]
    threads: int
    meta: dict[str, Any]
    # tau_D(n) with the graph built anew for the pass (``draft.verify_rebuilt``; empty in
    # profiles written before it)
    draft_rebuilt: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    # r_T(n): the target's extra ms with every row's logits over the last row's at n = 1..N
    # (``output_rows``; empty in profiles written before it, or with --no-output-rows)
    rows: dict[int, list[float]] = dataclasses.field(default_factory=dict)

    def depths(self) -> list[int]:
        return sorted(self.target)


def _bad(path: str, msg: str) -> InputError:
    return InputError(f"{path}: {msg}")


def _times(section: Any, path: str, where: str, statistic: str) -> dict[int, list[float]]:
    if not isinstance(section, dict) or not section:
        raise _bad(path, f"{where} is not an object of depths")
    out: dict[int, list[float]] = {}
    for key, rows in section.items():
        try:
            d = int(key)
        except (TypeError, ValueError):
            raise _bad(path, f"{where}: depth {key!r} is not an integer") from None
        if d < 0 or not isinstance(rows, list) or not rows:
            raise _bad(path, f"{where}[{key}] is not a non-empty list of passes")
        by_n: dict[int, float] = {}
        for row in rows:
            n = row.get("n") if isinstance(row, dict) else None
            v = row.get(statistic) if isinstance(row, dict) else None
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise _bad(path, f"{where}[{key}]: a pass without a pass size n >= 1")
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not math.isfinite(v)
                or v <= 0
            ):
                raise _bad(path, f"{where}[{key}] n={n}: {statistic} is not a positive number")
            by_n[n] = float(v)
        top = max(by_n)
        missing = [n for n in range(1, top + 1) if n not in by_n]
        if missing:
            raise _bad(path, f"{where}[{key}]: no pass of n = {missing[0]} (needs 1..{top})")
        out[d] = [by_n[n] for n in range(1, top + 1)]
    return out


def extra_ms(rows: Sequence[dict[str, Any]], fit: str = "median") -> list[float]:
    """The extra ms at n = 1..N from the rows of
    :func:`specmoe.engines.llamacpp_rows.summarize` (n = 1..N, each once): 0 at n = 1,
    where both variants ask for the same row, and elsewhere, by ``fit``:

    ``median``: the measured median at each n, clamped at 0 (more rows are more work; a
    negative median is noise).

    ``line``: r(n) = c0 + c1 n, fitted by least squares on the medians at n = 2..N, clamped
    at 0. What the extra rows cost is the last layer's work on the rows the last-row pass
    drops before its FFN (``inp_out_ids``), the lm_head on n rows instead of one, and the
    copy of n rows of logits: each grows by the same amount a row, so a line in n; the
    intercept is free because the one-row lm_head goes through ggml's ``vec_dot`` loop and
    n >= 2 rows through tinyBLAS (``llamafile_sgemm`` refuses fewer than two), a step no
    line through n = 1 follows. A paired median of a few blocks moves by several ms from
    one bench to the next at a pass size (results/cpu/llamacpp/README.md, the seventh plan
    check); the line takes all of them at once. Needs n = 2, 3 at least; with N = 2 the
    line is the one median."""
    if fit not in ROWS_FITS:
        raise ValueError(f"fit must be one of {', '.join(ROWS_FITS)}, got {fit!r}")
    by_n = {int(r["n"]): float(r["extra_ms"]["median"]) for r in rows}
    top = max(by_n, default=0)
    if sorted(by_n) != list(range(1, top + 1)):
        raise ValueError(f"rows must hold n = 1..N once each, got n = {sorted(by_n)}")
    if fit == "line" and top >= 3:
        ns = np.arange(2, top + 1, dtype=float)
        c1, c0 = np.polyfit(ns, [by_n[int(n)] for n in ns], 1)
        return [0.0] + [max(0.0, float(c0 + c1 * n)) for n in range(2, top + 1)]
    return [0.0 if n == 1 else max(0.0, by_n[n]) for n in range(1, top + 1)]


def _rows(
    section: Any, path: str, target: dict[int, list[float]], fit: str = "median"
) -> dict[int, list[float]]:
    """r_T(n) per depth from ``output_rows`` (:func:`extra_ms` in ``fit``); {} when absent."""
    if section is None:
        return {}
    depths = section.get("depths") if isinstance(section, dict) else None
    if not isinstance(depths, dict):
        raise _bad(path, "output_rows has no object of depths")
    out: dict[int, list[float]] = {}
    for key, rows in depths.items():
        try:
            d = int(key)
            vals = [float(r["extra_ms"]["median"]) for r in rows]
            if not all(math.isfinite(v) for v in vals):
                raise ValueError("a median that is not finite")
            out[d] = extra_ms(rows, fit)
        except (TypeError, ValueError, KeyError) as exc:
            why = str(exc) if isinstance(exc, ValueError) else "a row without extra_ms.median"
            raise _bad(path, f"output_rows[{key}]: {why}") from None
        if d not in target or len(out[d]) != len(target[d]):
            raise _bad(path, f"output_rows[{key}] has not the passes of verify")
    return out


def load_llamacpp_profile(
    path: str | os.PathLike, *, statistic: str = "median_ms", rows_fit: str = "median"
) -> LlamaCppProfile:
    """Read ``llamacpp_verify.json`` (``specmoe bench --engine llama.cpp``); any fault is one
    ``InputError`` line naming the file. ``rows_fit``: how r_T(n) follows from the measured
    ``output_rows`` (:func:`extra_ms`)."""
    if statistic not in STATISTICS:
        raise InputError(
            f"unknown {statistic!r} (choose from {', '.join(STATISTICS)})", argument="statistic"
        )
    if rows_fit not in ROWS_FITS:
        raise InputError(
            f"unknown {rows_fit!r} (choose from {', '.join(ROWS_FITS)})", argument="rows_fit"
        )
    p = Path(path)
    name = str(path)
    if not p.exists():
        raise _bad(name, "no such file")
    if not p.is_file():
        raise _bad(name, "not a regular file")
    if p.stat().st_size > MAX_PROFILE_BYTES:
        raise _bad(name, f"more than {MAX_PROFILE_BYTES >> 20} MiB: not a llama.cpp profile")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _bad(name, f"not readable JSON ({str(exc).splitlines()[0][:80]})") from None
    if not isinstance(data, dict) or data.get("engine") != "llama.cpp":
        raise _bad(name, "not a llama.cpp profile (no \"engine\": \"llama.cpp\"; written by "
                   "`specmoe bench --engine llama.cpp`)")  # fmt: skip
    target = _times(data.get("verify"), name, "verify", statistic)
    draft: dict[int, list[float]] = {}
    rebuilt: dict[int, list[float]] = {}
    if data.get("draft") is not None:
        dsec = data["draft"]
        if not isinstance(dsec, dict):
            raise _bad(name, "draft is not an object")
        draft = _times(dsec.get("verify"), name, "draft.verify", statistic)
        if dsec.get("verify_rebuilt") is not None:
            rebuilt = _times(dsec["verify_rebuilt"], name, "draft.verify_rebuilt", statistic)
            bad = [d for d in rebuilt if d not in draft or len(rebuilt[d]) != len(draft[d])]
            if bad:
                raise _bad(name, f"draft.verify_rebuilt[{bad[0]}] has not the passes of "
                           "draft.verify")  # fmt: skip
    rows = _rows(data.get("output_rows"), name, target, rows_fit)
    threads = data.get("threads", 1)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise _bad(name, f"threads {threads!r} is not a positive integer")
    meta = {k: data.get(k) for k in ("llama_cpp", "model", "dtype", "reps", "flash_attn")}
    meta["rows_fit"] = rows_fit
    kv = data.get("kv_type", "f16")  # profiles written before it: llama.cpp's default
    if kv not in BENCH_KV_TYPES:
        raise _bad(name, f"kv_type {kv!r} is not {' or '.join(BENCH_KV_TYPES)}")
    meta["kv_type"] = kv
    notes = data.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise _bad(name, "notes is not a list of lines")
    meta["notes"] = notes
    if isinstance(data.get("draft"), dict):
        meta["draft_model"] = data["draft"].get("model")
        meta["draft_dtype"] = data["draft"].get("dtype")
    return LlamaCppProfile(name, statistic, target, draft, threads, meta, rebuilt, rows)


def step_times(
    profile: LlamaCppProfile,
    depth: int,
    k_max: int,
    *,
    reevaluate: bool = True,
    overhead: tuple[float, ...] = (0.0, 0.0),
    rebuilt: bool = True,
    rows: bool = True,
) -> tuple[list[float], dict[str, list[float]]]:
    """V(0..k_max) in ms at ``depth`` (module docstring) and its parts: ``target`` tau_T(k+1),
    ``draft_tokens`` k tau_D(1), ``draft_reeval`` tau_D(k+1) (0 at k = 0, and everywhere
    without ``reevaluate``), with tau_D^b for the round's two graph builds where the profile
    has them and ``rebuilt`` (``draft_tokens`` tau_D^b(1) + (k-1) tau_D(1), ``draft_reeval``
    tau_D^b(k+1)), and ``overhead``: the server's time beyond llama-bench's passes,
    ``overhead[0]`` ms per plain token (k = 0), ``overhead[1]`` ms per speculative round
    (k >= 1) and ``overhead[2]`` (optional) ms per drafted token, as measured on the server
    (default none): o(k) = overhead[1] + k overhead[2]. ``overhead[3]`` (optional, ms per
    emitted token) is not in V: it depends on the acceptance (:func:`llamacpp_plan`).
    ``target_rows`` r_T(k + 1) at k >= 1 (0 at k = 0, and everywhere without ``rows`` or
    where the profile has no ``output_rows`` at ``depth``): the target's verification asks
    for the logits of all k + 1 rows, llama-bench's pass for the last row's only."""
    vals = [float(x) for x in overhead]
    if len(vals) not in (2, 3, 4) or not all(math.isfinite(x) and x >= 0 for x in vals):
        raise InputError(
            f"must be two to four non-negative ms, got {overhead!r}", argument="overhead"
        )
    o_plain, o_round, o_token = (*vals, 0.0)[:3]
    if len(vals) == 4 and vals[3] > o_plain:
        raise InputError(
            f"the per-emitted-token ms {vals[3]} exceeds the per-plain-token ms {o_plain} that "
            "holds it",
            argument="overhead",
        )
    if depth not in profile.target:
        have = ", ".join(map(str, profile.depths()))
        raise InputError(f"{profile.path} has no passes at depth {depth} (it has {have})",
                         argument="depth")  # fmt: skip
    if not profile.draft:
        raise InputError(
            f"{profile.path} holds no draft-model passes: run `specmoe bench --engine llama.cpp "
            "--draft-model D` to time the draft model too",
            argument="profile",
        )
    if depth not in profile.draft:
        raise InputError(f"{profile.path} has no draft-model passes at depth {depth}",
                         argument="depth")  # fmt: skip
    tt, td = profile.target[depth], profile.draft[depth]
    if k_max < 0 or k_max + 1 > min(len(tt), len(td) if reevaluate else len(tt)):
        top = min(len(tt), len(td)) - 1
        raise InputError(f"must lie in 0..{top} (passes of up to {top + 1} tokens timed), "
                         f"got {k_max}", argument="k_max")  # fmt: skip
    # the draft context's two graph builds a round (module docstring): its first one-token
    # pass after the re-evaluation, and the re-evaluation of k + 1 tokens after one-token ones
    tb = profile.draft_rebuilt.get(depth, td) if rebuilt else td
    rt = profile.rows.get(depth, [0.0] * len(tt)) if rows else [0.0] * len(tt)
    parts = {
        "target": [tt[k] for k in range(k_max + 1)],
        "target_rows": [rt[k] if k else 0.0 for k in range(k_max + 1)],
        "draft_tokens": [tb[0] + (k - 1) * td[0] if k else 0.0 for k in range(k_max + 1)],
        "draft_reeval": [tb[k] if (k and reevaluate) else 0.0 for k in range(k_max + 1)],
        "overhead": [o_round + k * o_token if k else o_plain for k in range(k_max + 1)],
    }
    V = [sum(p[k] for p in parts.values()) for k in range(k_max + 1)]
    return V, parts


def kv_flags(kv_type: str, *, draft: bool = False, bench: bool = False) -> list[str]:
    """The command-line flags of a KV cache in ``kv_type`` (:data:`KV_TYPES`): none
    for llama.cpp's default f16; ``-ctk q8_0`` for keys in q8_0 (values stay f16: llama.cpp
    quantizes V only with flash attention, off here); ``-ctk f32 -ctv f32`` for float32.
    ``draft``: also the draft model's cache (llama-server's ``-ctkd``/``-ctvd``). ``bench``:
    for llama-bench, which takes no f32 cache (an ``InputError``)."""
    if kv_type not in KV_TYPES:
        raise InputError(
            f"unknown {kv_type!r} (choose from {', '.join(KV_TYPES)})", argument="kv_type"
        )
    if bench and kv_type not in BENCH_KV_TYPES:
        raise InputError(
            f"{kv_type!r}: llama-bench takes a KV cache in {' or '.join(BENCH_KV_TYPES)} only",
            argument="kv_type",
        )
    k, v = {"f16": (None, None), "q8_0": ("q8_0", None), "f32": ("f32", "f32")}[kv_type]
    flags = []
    for flag, t in (("-ctk", k), ("-ctv", v)):
        if t is not None:
            flags += [flag, t] + ([flag + "d", t] if draft else [])
    return flags


def server_flags(
    *, k: int, target: str, draft: str | None, threads: int = 1, kv_type: str = "f16"
) -> list[str]:
    """llama-server's arguments (after the program) drafting ``k`` tokens a round with the
    draft model (draft-simple, every round exactly k drafts: n-min 0, p-min 0), or plain
    decoding at k = 0; ``threads`` for the target, its batches and the draft (``-td`` and
    ``-tb`` default to ``-t`` in ``common/arg.cpp``); flash attention off, as llama-bench timed;
    the KV caches (the target's, and the draft's when drafting) in ``kv_type``, as llama-bench
    timed them (:func:`kv_flags`: ``-ctk q8_0 -ctkd q8_0``)."""
    argv = ["-m", str(target)]
    if k > 0:
        if not draft:
            raise InputError("k > 0 needs a draft model", argument="draft")
        argv += ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(k)]
        argv += ["--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
    return [*argv, "-t", str(int(threads)), "-fa", "off", *kv_flags(kv_type, draft=k > 0)]


def llamacpp_plan(
    profile: LlamaCppProfile,
    acceptance: list[Any],
    *,
    depth: int,
    k_max: int,
    target_model: str,
    draft_model: str | None,
    overhead: tuple[float, ...] = (0.0, 0.0),
    rows: bool = True,
) -> dict[str, Any]:
    """The plan (plan.json's ``engine.settings["llama.cpp"]``): V(k), the staircase k*(a)
    (:func:`specmoe.cost.theory.staircase`), and per acceptance a: S(a, k) at every k, k*(a),
    its speedup and llama-server's command line at k*(a). ``rows``: V(k) holds r_T(k + 1)
    where the profile has it (:func:`step_times`)."""
    V, parts = step_times(profile, depth, k_max, overhead=overhead, rows=rows)
    with_rows = bool(rows and profile.rows.get(depth))
    o_emit = float(overhead[3]) if len(overhead) > 3 else 0.0
    Vp = [V[0] - o_emit, *V[1:]]  # V'(k) of the module docstring: k* and the staircase
    stairs = theory.staircase(Vp)
    rows = []
    for a in acceptance:
        k_best = theory.best_draft_length(Vp, a)
        sp = [
            float(theory.expected_tokens(float(a), k)) * V[0]
            / (Vp[k] + o_emit * float(theory.expected_tokens(float(a), k)))
            for k in range(k_max + 1)
        ]  # fmt: skip
        argv = server_flags(
            k=k_best,
            target=target_model,
            draft=draft_model,
            threads=profile.threads,
            kv_type=profile.meta.get("kv_type", "f16"),
        )
        rows.append(
            {
                "acceptance": float(a),
                "draft_length": k_best,
                "speedup": sp[k_best],
                "speedup_by_k": sp,
                "pays": k_best > 0,
                "command": ["llama-server", *argv],
                "shell": shlex.join(["llama-server", *argv]),
            }
        )
    return {
        "name": "llama.cpp",
        "engine": "llama.cpp",
        "llama_cpp": profile.meta.get("llama_cpp"),
        "drafter": "draft-model",
        "spec_type": "draft-simple",
        "profile": profile.path,
        "statistic": profile.statistic,
        "depth": depth,
        "threads": profile.threads,
        "kv_type": profile.meta.get("kv_type", "f16"),
        "notes": list(profile.meta.get("notes", [])),
        "k_max": k_max,
        "step_ms": V,
        "step_parts_ms": parts,
        "tau_target_ms": profile.target[depth],
        "tau_draft_ms": profile.draft[depth],
        "step_points": stairs.step_points,
        "staircase": [{"a_from": lo, "a_to": hi, "k": k} for lo, hi, k in stairs.levels],
        "graph_builds": bool(profile.draft_rebuilt.get(depth)),
        "output_rows": with_rows,
        "output_rows_fit": profile.meta.get("rows_fit", "median") if with_rows else None,
        "model": (
            "V(k) = tau_T(k+1) + tau_D^b(k+1) + tau_D^b(1) + (k-1) tau_D(1) (tau_D^b: the draft's "
            "passes with the graph built anew)"
            if profile.draft_rebuilt.get(depth)
            else "V(k) = tau_T(k+1) + tau_D(k+1) + k tau_D(1)"
        )
        + (" + r_T(k+1) (the target's logits of every row)" if with_rows else "")
        + " + o_round + k o_token, V(0) = tau_T(1) + o_plain; S(a, k) = G_a(k) V(0) / (V'(k) + "
        "o_emit G_a(k)), V'(0) = V(0) - o_emit, V'(k) = V(k) (paper 002 Eq. (9) with a "
        "per-emitted-token time)",
        "overhead_ms": {
            "plain_token": float(overhead[0]),
            "round": float(overhead[1]),
            "drafted_token": float(overhead[2]) if len(overhead) > 2 else 0.0,
            "emitted_token": o_emit,
        },
        "plans": rows,
    }
