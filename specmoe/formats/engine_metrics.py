"""Speculative-decoding metrics as serving engines record them, read into
:class:`specmoe.oracle.acceptance.SpecRecord` (one per request, or one per server scrape).

Read against the engines' own serialising code (``docs/acceptance.md`` lists the files):

* vLLM 0.33.0, ``--per-request-spec-decode-metrics summary|detailed``: a response's
  ``metrics.speculative_decoding`` (``RequestSpecDecodeMetrics.to_dict``,
  ``vllm/v1/metrics/stats.py``): ``acceptance_histogram`` (length k + 1), ``num_spec_steps``,
  ``num_accepted_draft_tokens``, ``num_draft_tokens``, ``num_spec_tokens`` (k) and, at
  ``detailed``, ``per_step_accepted`` / ``per_step_drafted``; also that dict alone, or the
  dataclass's own fields (``dataclasses.asdict``: ``histogram``, ...) from ``LLM.generate``.
* vLLM Prometheus text (``vllm/v1/spec_decode/metrics.py``): ``vllm:spec_decode_num_drafts``,
  ``_num_draft_tokens``, ``_num_accepted_tokens`` and ``_num_accepted_tokens_per_pos``
  (label ``position``), each ``_total`` (prometheus_client's counter suffix), summed over the
  ``engine`` label.
* SGLang 0.5.23 ``meta_info`` (``TokenizerManager._calculate_spec_decoding_metrics``,
  ``sglang/srt/managers/tokenizer_manager.py``): ``spec_verify_ct``, ``spec_num_correct_drafts``,
  ``spec_num_proposed_drafts`` (= verify_ct x (``speculative_num_draft_tokens`` - 1)),
  ``spec_correct_drafts_histogram`` (index j: steps accepting j drafts; as long as the largest
  j); from ``/generate`` (``meta_info``), OpenAI endpoints with ``return_meta_info``
  (``choices[i].meta_info``) or ``return_spec_tokens_details`` (``sglext.spec_tokens_details``,
  one object, or a list for n > 1).
* llama.cpp (as vendored in llama-cpp-python 0.3.36): a response's ``timings.draft_n`` /
  ``draft_n_accepted`` (``server_slot_stats::to_json``, ``tools/server/server-common.cpp``; no
  step count), and ``/metrics`` (``server_task_result_metrics::to_metrics``,
  ``tools/server/server-task.cpp``): ``llamacpp:spec_decode_num_drafts_total`` (verification
  steps), ``_num_draft_tokens_total``, ``_num_accepted_tokens_total`` and
  ``llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="i"}``.

A file is JSON (one response or a list), JSON lines, a server-sent-event stream (``data:``
lines) or Prometheus text, told apart by its content. Streams repeat cumulative counts, so per
request id (``id``, or SGLang's ``meta_info.id``) the last record counts; llama.cpp's partial
chunks (``"stop": false``) are left out. Requests that carry no speculative counts (vLLM
``speculative_decoding: null``, SGLang ``spec_verify_ct`` 0, llama.cpp timings without
``draft_n``) are skipped and counted.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from specmoe.errors import InputError
from specmoe.oracle.acceptance import AcceptanceEstimate, SpecRecord

TEXT_LIMIT = 64 << 20  # bytes: the largest metrics file read
ENGINES = ("vllm", "sglang", "llama.cpp")


@dataclass(frozen=True)
class EngineMetrics:
    """The speculative records of one or more files of one engine."""

    engine: str  # vllm | sglang | llama.cpp
    source: str  # what was read, in words
    records: tuple[SpecRecord, ...]
    skipped: int  # requests without speculative counts
    files: tuple[str, ...]


# ------------------------------------------------------------------------------------------
# Reading and telling formats apart


def _read_text(path: str | os.PathLike) -> str:
    name = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(TEXT_LIMIT + 1)
    except FileNotFoundError:
        raise InputError(f"{name}: no such file", argument="path") from None
    except IsADirectoryError:
        raise InputError(f"{name}: is a directory, not a metrics file", argument="path") from None
    except OSError as exc:
        raise InputError(f"{name}: unreadable ({exc.strerror})", argument="path") from None
    if len(data) > TEXT_LIMIT:
        raise InputError(f"{name}: larger than the {TEXT_LIMIT >> 20} MiB limit", argument="path")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{name}: not text (not UTF-8)", argument="path") from None


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _json_values(text: str, name: str) -> list[Any] | None:
    """The JSON values of ``text``: one document, or one per line (JSON lines or ``data:``
    lines of a server-sent-event stream); None when it is not JSON at all."""
    from specmoe._io import parse_json

    head = text.lstrip()
    if head[:1] in "{[":
        try:
            return [parse_json(text, name)]
        except InputError:
            pass
    elif not head.startswith("data:"):
        return None
    values = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line.startswith("data:"):
            line = line[5:].strip()
            if line == "[DONE]":
                continue
        elif not line or line.startswith((":", "event:", "id:", "retry:")):
            continue
        if line[:1] not in "{[":
            if not values and n == 1:
                return None
            raise InputError(f"{name}: line {n} is not JSON", argument="path")
        values.append(parse_json(line, f"{name}: line {n}", argument="path"))
    return values


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _prometheus(text: str, name: str) -> dict[str, list[tuple[dict[str, str], str]]] | None:
    """Samples of Prometheus text exposition by metric name; None when ``text`` is not that."""
    out: dict[str, list[tuple[dict[str, str], str]]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is not None and not _is_number(m.group(3)):
            m = None
        if m is None:
            if not out:
                return None
            raise InputError(f"{name}: line {n} is not a Prometheus sample", argument="path")
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.setdefault(m.group(1), []).append((labels, m.group(3)))
    return out or None


# ------------------------------------------------------------------------------------------
# Checked numbers


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: expected a count, got {value!r:.40}", argument="path")
    if isinstance(value, float) and not (math.isfinite(value) and value == int(value)):
        raise InputError(f"{where}: expected a whole count, got {value!r}", argument="path")
    if value < 0:
        raise InputError(f"{where}: negative count {value!r}", argument="path")
    return int(value)


def _counts(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise InputError(f"{where}: expected a list of counts", argument="path")
    return tuple(_count(v, f"{where}[{i}]") for i, v in enumerate(value))


def _agree(a: int, b: int, what: str, where: str) -> None:
    if a != b:
        raise InputError(f"{where}: {what} disagree ({a} != {b})", argument="path")


# ------------------------------------------------------------------------------------------
# The engines' JSON records


def _vllm_record(d: dict, where: str) -> SpecRecord:
    """``RequestSpecDecodeMetrics.to_dict()`` (or its dataclass fields) of vLLM 0.33.0."""
    if not isinstance(d, dict):
        raise InputError(f"{where}: expected an object, got {type(d).__name__}", argument="path")
    k = _count(d.get("num_spec_tokens"), f"{where}.num_spec_tokens")
    if k < 1:
        raise InputError(f"{where}.num_spec_tokens: must be >= 1, got {k}", argument="path")
    hist_key = "acceptance_histogram" if "acceptance_histogram" in d else "histogram"
    hist = _counts(d.get(hist_key), f"{where}.{hist_key}")
    _agree(len(hist), k + 1, "histogram length and num_spec_tokens + 1", where)
    steps = sum(hist)
    accepted = sum(j * c for j, c in enumerate(hist))
    drafted = _count(d.get("num_draft_tokens"), f"{where}.num_draft_tokens")
    if "num_spec_steps" in d:
        _agree(_count(d["num_spec_steps"], where), steps, "num_spec_steps and histogram", where)
    if "num_accepted_draft_tokens" in d:
        _agree(
            _count(d["num_accepted_draft_tokens"], where),
            accepted,
            "num_accepted_draft_tokens and histogram",
            where,
        )
    step_d = step_a = None
    if d.get("per_step_accepted") is not None or d.get("per_step_drafted") is not None:
        step_a = _counts(d.get("per_step_accepted"), f"{where}.per_step_accepted")
        step_d = _counts(d.get("per_step_drafted"), f"{where}.per_step_drafted")
        _agree(len(step_a), steps, "per_step_accepted length and steps", where)
        _agree(len(step_d), steps, "per_step_drafted length and steps", where)
        _agree(sum(step_a), accepted, "per_step_accepted sum and accepted", where)
        _agree(sum(step_d), drafted, "per_step_drafted sum and num_draft_tokens", where)
        for i, (dd, aa) in enumerate(zip(step_d, step_a)):
            if aa > dd or dd > k:
                raise InputError(
                    f"{where}: step {i} accepted {aa} of {dd} drafts (k = {k})", argument="path"
                )
    return SpecRecord(
        steps, drafted, accepted, k, True, hist, None, step_d, step_a, drafted == k * steps, where
    )


def _sglang_record(d: dict, where: str) -> SpecRecord | None:
    """SGLang 0.5.23 meta_info's (or SpecTokensDetails') spec_* fields; None: no steps."""
    if not isinstance(d, dict):
        raise InputError(f"{where}: expected an object, got {type(d).__name__}", argument="path")
    steps = _count(d.get("spec_verify_ct", 0), f"{where}.spec_verify_ct")
    if steps == 0:
        return None
    hist = d.get("spec_correct_drafts_histogram") or None
    hist = None if hist is None else _counts(hist, f"{where}.spec_correct_drafts_histogram")
    if "spec_num_correct_drafts" in d:
        accepted = _count(d["spec_num_correct_drafts"], f"{where}.spec_num_correct_drafts")
    elif hist is not None:
        accepted = sum(j * c for j, c in enumerate(hist))
    else:
        raise InputError(f"{where}: has spec_verify_ct but no spec_num_correct_drafts")
    if hist is not None:
        _agree(sum(hist), steps, "spec_correct_drafts_histogram sum and spec_verify_ct", where)
        _agree(
            sum(j * c for j, c in enumerate(hist)),
            accepted,
            "spec_correct_drafts_histogram and spec_num_correct_drafts",
            where,
        )
    proposed = _count(d.get("spec_num_proposed_drafts", 0), f"{where}.spec_num_proposed_drafts")
    k = proposed // steps if proposed and proposed % steps == 0 else None
    return SpecRecord(steps, proposed, accepted, k, False, hist, None, None, None, True, where)


def _llama_record(t: dict, where: str) -> SpecRecord | None:
    if "draft_n" not in t:
        return None
    drafted = _count(t["draft_n"], f"{where}.draft_n")
    accepted = _count(t.get("draft_n_accepted"), f"{where}.draft_n_accepted")
    if accepted > drafted:
        raise InputError(f"{where}: draft_n_accepted > draft_n", argument="path")
    note = (
        "llama.cpp timings hold no step count: steps = draft_n / k, every draft k tokens long "
        "(the server's /metrics counts steps)"
    )
    return SpecRecord(None, drafted, accepted, None, True, label=where, notes=(note,))


def _from_object(obj: dict, where: str) -> list[tuple[str, Any, SpecRecord | None]]:
    """(engine, request key, record or None for "no speculative counts") found in one JSON
    object; [] when it is none of the engines' records (a stream chunk, say)."""
    rid = obj.get("id")
    metrics = obj.get("metrics")
    if isinstance(metrics, dict) and "speculative_decoding" in metrics:
        sd = metrics["speculative_decoding"]
        if sd is None:
            return [("vllm", rid, None)]
        return [("vllm", rid, _vllm_record(sd, f"{where}.metrics.speculative_decoding"))]
    if "num_spec_tokens" in obj and ("acceptance_histogram" in obj or "histogram" in obj):
        return [("vllm", rid, _vllm_record(obj, where))]
    sglext = obj.get("sglext")
    details = sglext.get("spec_tokens_details") if isinstance(sglext, dict) else None
    if details is not None:
        items = details if isinstance(details, list) else [details]
        return [
            ("sglang", (rid, i), _sglang_record(d, f"{where}.sglext.spec_tokens_details[{i}]"))
            for i, d in enumerate(items)
            if isinstance(d, dict)
        ]
    choices = obj.get("choices")
    if isinstance(choices, list) and any(
        isinstance(c, dict) and isinstance(c.get("meta_info"), dict) for c in choices
    ):
        return [
            (
                "sglang",
                (rid, c.get("index", i)),
                _sglang_record(c["meta_info"], f"{where}.choices[{i}].meta_info"),
            )
            for i, c in enumerate(choices)
            if isinstance(c, dict) and isinstance(c.get("meta_info"), dict)
        ]
    meta = obj.get("meta_info")
    if isinstance(meta, dict):
        return [("sglang", meta.get("id", rid), _sglang_record(meta, f"{where}.meta_info"))]
    if "spec_verify_ct" in obj:
        return [("sglang", rid, _sglang_record(obj, where))]
    timings = obj.get("timings")
    if isinstance(timings, dict) and obj.get("stop") is not False:
        return [("llama.cpp", rid, _llama_record(timings, f"{where}.timings"))]
    return []


def _flatten(values: list[Any]) -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = []
    stack = [(f"[{i}]" if len(values) > 1 else "", v) for i, v in enumerate(values)]
    stack.reverse()
    while stack:
        where, v = stack.pop()
        if isinstance(v, dict):
            out.append((where, v))
        elif isinstance(v, list):
            stack.extend(reversed([(f"{where}[{i}]", x) for i, x in enumerate(v)]))
    return out


def _from_json(values: list[Any], name: str) -> EngineMetrics:
    found: dict[Any, tuple[str, SpecRecord | None]] = {}
    engines: set[str] = set()
    for n, (where, obj) in enumerate(_flatten(values)):
        for engine, key, rec in _from_object(obj, f"{name}{where}"):
            engines.add(engine)
            rid = key[0] if isinstance(key, tuple) else key
            if rid is None:  # no request id: this object's own record
                key = ("#", n, key)
            found[(engine, repr(key))] = (engine, rec)
    if not engines:
        raise InputError(
            f"{name}: no speculative-decoding metrics in it (expected vLLM "
            "metrics.speculative_decoding, SGLang meta_info spec_verify_ct or llama.cpp "
            "timings.draft_n)",
            argument="path",
        )
    if len(engines) > 1:
        raise InputError(f"{name}: mixes engines ({', '.join(sorted(engines))})", argument="path")
    engine = engines.pop()
    records = tuple(r for _, r in found.values() if r is not None)
    skipped = sum(r is None for _, r in found.values())
    what = {
        "vllm": "vLLM per-request metrics",
        "sglang": "SGLang meta_info",
        "llama.cpp": "llama.cpp timings",
    }[engine]
    if engine == "vllm" and records and all(r.step_accepted is not None for r in records):
        what += " (detailed)"
    return EngineMetrics(engine, what, records, skipped, (name,))


# ------------------------------------------------------------------------------------------
# Prometheus text

_PROM = {
    "vllm": ("vllm:", "vLLM Prometheus counters"),
    "llama.cpp": ("llamacpp:", "llama.cpp /metrics counters"),
}


def _prom_value(text: str, where: str, engine: str) -> tuple[int, bool]:
    """A counter's value and whether its printing rounded it (llama.cpp prints a double with
    six significant digits, ``1.23457e+06``)."""
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{where}: not a number: {text!r:.40}", argument="path") from None
    rounded = engine == "llama.cpp" and "e" in text.lower() and value >= 1e6
    if not math.isfinite(value) or value != int(value):
        raise InputError(f"{where}: expected a whole count, got {text}", argument="path")
    return _count(value, where), rounded


def _prom_counters(samples: dict, name: str) -> tuple[str, dict[str, Any], list[str]]:
    engine = next(
        (e for e, (p, _) in _PROM.items() if any(k.startswith(p + "spec_decode") for k in samples)),
        None,
    )
    if engine is None:
        if any(k.startswith("sglang:spec") for k in samples):
            raise InputError(
                f"{name}: SGLang's /metrics holds windowed averages, not counts; give the "
                "responses' meta_info",
                argument="path",
            )
        raise InputError(
            f"{name}: Prometheus text without speculative-decoding counters "
            "(vllm:spec_decode_* or llamacpp:spec_decode_*)",
            argument="path",
        )
    prefix = _PROM[engine][0] + "spec_decode_"
    models = {
        lab.get("model_name")
        for key, rows in samples.items()
        if key.startswith(prefix)
        for lab, _ in rows
        if "model_name" in lab
    }
    if len(models) > 1:
        raise InputError(f"{name}: counters of several models ({', '.join(sorted(models))})")
    notes: list[str] = []
    out: dict[str, Any] = {}
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        rows = samples.get(f"{prefix}{key}_total")
        if not rows:
            raise InputError(f"{name}: no {prefix}{key}_total", argument="path")
        total = 0
        for _lab, text in rows:
            v, rounded = _prom_value(text, f"{name}: {prefix}{key}_total", engine)
            total += v
            if rounded:
                notes.append(f"{prefix}{key}_total printed rounded ({text})")
        out[key] = total
    per_pos: dict[int, int] = {}
    for lab, text in samples.get(f"{prefix}num_accepted_tokens_per_pos_total", []):
        where = f"{name}: {prefix}num_accepted_tokens_per_pos_total"
        pos = lab.get("position", "")
        if not pos.isdigit():
            raise InputError(f"{where}: position label {pos!r:.20} is not a number")
        per_pos[int(pos)] = per_pos.get(int(pos), 0) + _prom_value(text, where, engine)[0]
    out["per_pos"] = per_pos
    return engine, out, notes


def _from_prometheus(samples: dict, name: str, since: dict | None) -> EngineMetrics:
    engine, c, notes = _prom_counters(samples, name)
    if since is not None:
        engine0, c0, _ = since["counters"]
        if engine0 != engine:
            raise InputError(f"{name}: the earlier scrape is of {engine0}, this of {engine}")
        for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            if c[key] < c0[key]:
                raise InputError(
                    f"{name}: {key} went down since the earlier scrape (server restarted?)",
                    argument="since",
                )
            c[key] -= c0[key]
        for pos, v in c0["per_pos"].items():
            c["per_pos"][pos] = c["per_pos"].get(pos, 0) - v
            if c["per_pos"][pos] < 0:
                raise InputError(f"{name}: per-position counts went down", argument="since")
    per_pos = None
    k = None
    if c["per_pos"]:
        k = max(c["per_pos"]) + 1
        per_pos = tuple(c["per_pos"].get(i, 0) for i in range(k))
        if any(b > a for a, b in itertools.pairwise(per_pos)) or per_pos[0] > c["num_drafts"]:
            raise InputError(
                f"{name}: accepted-per-position counts must not rise with position nor exceed "
                "the drafts",
                argument="path",
            )
        if not notes:
            _agree(sum(per_pos), c["num_accepted_tokens"], "per-position sum and accepted", name)
    steps, drafted = c["num_drafts"], c["num_draft_tokens"]
    accepted = sum(per_pos) if per_pos is not None else c["num_accepted_tokens"]
    full = None
    if k is not None:
        full = drafted == k * steps or (bool(notes) and abs(drafted - k * steps) <= 1e-5 * drafted)
    rec = SpecRecord(
        steps, drafted, accepted, k, True, None, per_pos, None, None, full, name, tuple(notes)
    )
    what = _PROM[engine][1] + (" (since the earlier scrape)" if since is not None else "")
    return EngineMetrics(engine, what, (rec,), 0, (name,))


# ------------------------------------------------------------------------------------------
# Public functions


def read_engine_metrics(
    path: str | os.PathLike, *, since: str | os.PathLike | None = None
) -> EngineMetrics:
    """The speculative records in one engine metrics file (the formats of the module
    docstring). ``since``: an earlier Prometheus scrape of the same server, subtracted from
    this one (counters are cumulative since the server started). Bad input is one
    ``InputError`` line naming the file."""
    name = os.fspath(path)
    text = _read_text(path)
    if not text.strip():
        raise InputError(f"{name}: empty file", argument="path")
    values = _json_values(text, name)
    if values is not None:
        if since is not None:
            raise InputError(f"{name}: an earlier scrape applies to Prometheus text only")
        return _from_json(values, name)
    samples = _prometheus(text, name)
    if samples is None:
        raise InputError(
            f"{name}: not an engine metrics file (expected JSON, JSON lines or Prometheus text "
            "from vLLM, SGLang or llama.cpp)",
            argument="path",
        )
    base = None
    if since is not None:
        sname = os.fspath(since)
        s_samples = _prometheus(_read_text(since), sname)
        if s_samples is None:
            raise InputError(f"{sname}: not Prometheus text", argument="since")
        base = {"counters": _prom_counters(s_samples, sname)}
    return _from_prometheus(samples, name, base)


def read_engine_metrics_files(
    paths: Sequence[str | os.PathLike], *, since: str | os.PathLike | None = None
) -> EngineMetrics:
    """:func:`read_engine_metrics` of every file, pooled; they must be of one engine."""
    parts = [read_engine_metrics(p, since=since) for p in paths]
    if not parts:
        raise InputError("no metrics files", argument="paths")
    engines = {p.engine for p in parts}
    if len(engines) > 1:
        raise InputError(f"the files are of different engines ({', '.join(sorted(engines))})")
    sources = sorted({p.source for p in parts})
    return EngineMetrics(
        parts[0].engine,
        "; ".join(sources),
        tuple(r for p in parts for r in p.records),
        sum(p.skipped for p in parts),
        tuple(f for p in parts for f in p.files),
    )


def estimate_from_files(
    paths: Sequence[str | os.PathLike],
    *,
    k: int | None = None,
    confidence: float = 0.95,
    since: str | os.PathLike | None = None,
) -> AcceptanceEstimate:
    """The acceptance estimate of engine metrics files (:func:`read_engine_metrics_files`,
    then :func:`specmoe.oracle.acceptance.estimate_acceptance`)."""
    from specmoe.oracle.acceptance import estimate_acceptance

    m = read_engine_metrics_files(paths, since=since)
    if not m.records:
        raise InputError(
            f"{', '.join(m.files)}: {m.skipped} requests, none with speculative counts",
            argument="paths",
        )
    try:
        est = estimate_acceptance(m.records, k=k, confidence=confidence)
    except InputError as exc:
        if exc.argument == "k":
            raise
        raise InputError(f"{', '.join(m.files)}: {exc.message}", argument="paths") from None
    notes = list(est.notes)
    if k is None and any(not r.k_exact for r in m.records):
        notes.append(
            f"SGLang counts speculative_num_draft_tokens - 1 = {est.k} drafts a step: the draft "
            "length with --speculative-eagle-topk 1 only (for a tree give its depth)"
        )
    return replace(
        est, source=m.source, engine=m.engine, files=m.files, skipped=m.skipped, notes=tuple(notes)
    )
