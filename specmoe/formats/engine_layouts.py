"""Where vLLM and SGLang put routed experts in what they return: responses, streams, folders.

Every layout is read into :class:`Request` records (one document each: the payloads to join
along tokens, the dtype the record names for raw ids, the start offset it records) and
:class:`Skipped` records (requests that carry no routing: aborted before a forward pass,
answered without it, or empty). Payloads stay undecoded here (nested lists, a base64 string,
an array); :mod:`specmoe.formats.engine_import` decodes them.

Fields read, by engine (each checked against the engine's serving code, see
``docs/trace-format.md``):

- vLLM <= 0.21, OpenAI server: ``prompt_routed_experts`` (response) joined with each
  ``choices[i].routed_experts`` (nested lists);
- vLLM 0.33, OpenAI server and ``/inference/v1/generate``: ``choices[i].routed_experts``, a
  base64 ``.npy`` covering the whole sequence; streams carry it on a choice's final chunk
  (earlier chunks hold ``null``); the response names the request ``id`` or ``request_id``;
- SGLang ``/generate``: ``meta_info.routed_experts`` (and ``meta_info.routed_experts_dtype``
  on SGLang main); streams carry it on the final chunk of the request;
- SGLang OpenAI endpoints: ``sglext.routed_experts`` at the response level (streams: a chunk
  with ``choices: []``), or ``choices[i].meta_info.routed_experts`` with ``return_meta_info``;
  older servers: ``choices[i].sgl_ext.routed_experts``.

A record ``{"request": {...}, "response": {...}}`` gives the request body beside the response:
its ``routed_experts_prompt_start`` (vLLM; also under ``sampling_params``) or
``routed_experts_start_len`` (SGLang) is the position of row 0 in the request's sequence.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specmoe.errors import InputError
from specmoe.formats._common import read_npy, sniff

__all__ = ["Request", "Skipped", "collect"]

RESPONSE_KEYS = frozenset(
    {"choices", "meta_info", "routed_experts", "prompt_routed_experts", "sglext", "request_id"}
)
START_KEYS = ("routed_experts_start_len", "routed_experts_prompt_start")  # SGLang, vLLM
DTYPE_KEY = "routed_experts_dtype"  # SGLang main
JSON_SUFFIXES = (".json", ".jsonl", ".ndjson", ".sse")
LINE_SUFFIXES = (".jsonl", ".ndjson", ".sse")
_SSE_FIELDS = ("event", "id", "retry")


@dataclass(frozen=True)
class Request:
    """One request's routing: ``parts`` joined along tokens (a prompt's, then a choice's)."""

    name: str
    parts: tuple[Any, ...]
    dtype: Any = None  # the dtype the record names for raw base64 ids (None: not named)
    start: int | None = None  # the start offset the record gives (None: not given)


@dataclass(frozen=True)
class Skipped:
    name: str
    reason: str


# ------------------------------------------------------------------------------------------
# one response or chunk -> slots of its request group


@dataclass
class _Group:
    """Everything seen of one request (one response, or every chunk of one stream)."""

    name: str
    full: list[tuple[Any, Any]] = field(default_factory=list)  # response-level (payload, dtype)
    prompt: Any = None  # vLLM <= 0.21 prompt_routed_experts
    choices: dict[int, list[tuple[Any, Any]]] = field(default_factory=dict)
    seen: list[int] = field(default_factory=list)  # choice indices in order of appearance
    null: bool = False  # a routed_experts field was present and null
    aborted: set = field(default_factory=set)  # choice indices (None: the response) aborted
    start: int | None = None
    error: str | None = None  # the error event that ended its stream


def _name_of(value: Any) -> str | None:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _is_abort(reason: Any) -> bool:
    if isinstance(reason, dict):  # SGLang meta_info: {"type": "abort", "message": ...}
        reason = reason.get("type")
    return isinstance(reason, str) and reason.lower() == "abort"


def _start_of(*sources: Any, label: str) -> int | None:
    """The first start offset found in ``sources`` (dicts: a request body or a response)."""
    for src in sources:
        src = _dict(src)
        for where in (src, _dict(src.get("sampling_params")), _dict(src.get("extra_body"))):
            for key in START_KEYS:
                if key in where and where[key] is not None:
                    v = where[key]
                    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                        raise InputError(
                            f"{label}: {key} must be a non-negative integer, got {v!r:.40}"
                        )
                    return int(v)
    return None


class _Reader:
    """Groups the responses and chunks of one file by request."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.groups: list[_Group] = []
        self.by_name: dict[str, int] = {}
        self.errors: list[Skipped] = []

    def group(self, name: str | None, fallback: str) -> _Group:
        if name is None:  # unnamed: a request of its own
            self.groups.append(_Group(fallback))
            return self.groups[-1]
        if name not in self.by_name:
            self.by_name[name] = len(self.groups)
            self.groups.append(_Group(name))
        return self.groups[self.by_name[name]]

    def fresh(self, name: str) -> _Group:
        """A second complete response under a name already used: a request of its own."""
        self.by_name[name] = len(self.groups)
        self.groups.append(_Group(name))
        return self.groups[-1]

    def value(self, value: Any, pos: str, *, request: Any = None) -> None:
        label = f"{self.label}: {pos}"
        if isinstance(value, dict) and not (RESPONSE_KEYS & value.keys()) and "response" in value:
            resp = value["response"]
            for i, v in enumerate(resp if isinstance(resp, list) else [resp]):
                self.value(
                    v,
                    pos if not isinstance(resp, list) else f"{pos}/{i}",
                    request=value.get("request"),
                )
            return
        if isinstance(value, dict) and RESPONSE_KEYS & value.keys():
            self.response(value, pos, request=request)
            return
        if isinstance(value, dict) and "error" in value:  # an error event ends a stream
            err = value["error"]
            msg = _dict(err).get("message", err) if err is not None else value.get("message")
            reason = f"error: {str(msg)[:80]}".splitlines()[0]
            last = self.groups[-1] if self.groups else None
            if last is not None and not (last.full or any(last.choices.values())):
                last.error = reason  # the request whose chunks came just before
            else:
                self.errors.append(Skipped(pos, reason))
            return
        if isinstance(value, list | str):
            g = self.group(None, pos)
            g.full.append((value, None))
            g.start = _start_of(request, label=label)
            return
        raise InputError(
            f"{label}: expected nested lists, a base64 string or an engine response, "
            f"got {type(value).__name__}"
        )

    def response(self, obj: dict, pos: str, *, request: Any = None) -> None:
        label = f"{self.label}: {pos}"
        info, ext = _dict(obj.get("meta_info")), _dict(obj.get("sglext"))
        name = (
            _name_of(obj.get("id")) or _name_of(obj.get("request_id")) or _name_of(info.get("id"))
        )
        null = False

        def take(src: dict, *fallbacks: dict) -> tuple[Any, Any] | None:
            nonlocal null
            if "routed_experts" not in src:
                return None
            if src["routed_experts"] is None:
                null = True
                return None
            dtype = next(
                (d.get(DTYPE_KEY) for d in (src, *fallbacks) if d.get(DTYPE_KEY) is not None),
                None,
            )
            return src["routed_experts"], dtype

        top = (obj, info, ext)
        # one routing, in one of three places: sglext, meta_info, the response itself
        full = [p for src in (ext, info, obj) if (p := take(src, *top)) is not None][:1]
        choices = obj.get("choices")
        if choices is not None and not isinstance(choices, list):
            raise InputError(f"{label}: 'choices' is not a list")
        seen: list[int] = []
        aborted: set = {None} if _is_abort(info.get("finish_reason")) else set()
        slots: list[tuple[int, tuple[Any, Any]]] = []
        for i, ch in enumerate(choices or []):
            if not isinstance(ch, dict):
                raise InputError(f"{label}: choice {i} is not an object")
            idx = ch.get("index", i)
            idx = idx if isinstance(idx, int) and not isinstance(idx, bool) else i
            seen.append(idx)
            cinfo, cext = _dict(ch.get("meta_info")), _dict(ch.get("sgl_ext"))
            if _is_abort(ch.get("finish_reason")) or _is_abort(cinfo.get("finish_reason")):
                aborted.add(idx)
            for src in (ch, cext, cinfo):
                if (p := take(src, ch, cext, cinfo, *top)) is not None:
                    slots.append((idx, p))
                    break
        start = _start_of(request, obj, info, ext, label=label)

        g = self.group(name, pos)
        if name is not None and (
            (full and g.full) or any(g.choices.get(idx) for idx, _ in slots)
        ):  # the same id answered twice: two requests
            g = self.fresh(name)
        g.seen.extend(idx for idx in dict.fromkeys(seen) if idx not in g.seen)
        g.aborted |= aborted
        g.null |= null
        for idx, p in slots:
            g.choices.setdefault(idx, []).append(p)
        g.full.extend(full)
        if obj.get("prompt_routed_experts") is not None:
            g.prompt = obj["prompt_routed_experts"]
        if start is not None:
            g.start = start

    def resolve(self) -> tuple[list[Request], list[Skipped]]:
        reqs: list[Request] = []
        skipped: list[Skipped] = []
        for g in self.groups:
            several = len(g.seen) > 1
            if any(g.choices.values()):
                for idx in sorted(set(g.seen) | set(g.choices)):
                    name = f"{g.name}/{idx}" if several else g.name
                    got = g.choices.get(idx)
                    if got:
                        prompt = () if g.prompt is None else (g.prompt,)
                        for payload, dtype in got:
                            reqs.append(Request(name, (*prompt, payload), dtype, g.start))
                    else:
                        skipped.append(Skipped(name, _reason(g, idx)))
            elif g.full:
                for payload, dtype in g.full:
                    reqs.append(Request(g.name, (payload,), dtype, g.start))
            elif several:
                skipped.extend(Skipped(f"{g.name}/{i}", _reason(g, i)) for i in g.seen)
            else:
                skipped.append(Skipped(g.name, _reason(g, g.seen[0] if g.seen else None)))
        return reqs, skipped + self.errors


def _reason(g: _Group, idx: int | None) -> str:
    if g.error is not None:
        return g.error
    if idx in g.aborted or None in g.aborted:
        return "aborted"
    if g.null:
        return "routed_experts null"
    if g.prompt is not None:
        return "prompt routing only"
    return "no 'routed_experts'"


# ------------------------------------------------------------------------------------------
# files: JSON, JSON lines or SSE, .npy, folders


def _natural_key(p: Path) -> list[Any]:
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", p.name)]


def load_npy(path: Path) -> Any:
    kind = sniff(path)
    if kind == "zip":
        raise InputError(f"{path}: a .npz archive, not one .npy array per request")
    if kind != "npy":
        raise InputError(f"{path}: not a .npy array (no .npy signature)")
    with open(path, "rb") as fh:
        return read_npy(fh, path.stat().st_size, str(path))


def _loads(text: str, label: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(
            f"{label}: not readable JSON ({type(exc).__name__}: {exc})".splitlines()[0]
        ) from None


def stream_values(text: str, label: str) -> list[Any]:
    """The JSON values of a JSON-lines text or a saved server-sent-event stream: ``data:``
    prefixes stripped (or absent), ``event:``/``id:``/``retry:`` lines, comments, blank lines
    and the closing ``[DONE]`` skipped."""
    values = []
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith(":"):
            continue
        head, sep, rest = s.partition(":")
        if sep and head == "data":
            s = rest.strip()
        elif sep and head in _SSE_FIELDS:
            continue
        if not s or s == "[DONE]":
            continue
        values.append(_loads(s, f"{label}: line {lineno}"))
    return values


def _int_depth(value: Any) -> int:
    """How deep lists nest above the first int (0 when the first leaf is not an int)."""
    depth = 0
    while isinstance(value, list) and value:
        value, depth = value[0], depth + 1
    return depth if isinstance(value, int) and not isinstance(value, bool) else 0


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise InputError(f"{path}: not a regular file (a device or pipe has no end to read to)")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(
            f"{path}: not readable JSON ({type(exc).__name__}: {exc})".splitlines()[0]
        ) from None


def _looks_like_lines(text: str) -> bool:
    head = text.lstrip()[:6]
    return head.startswith(("data:", "event:", "id:", ":"))


def collect_file(path: Path, *, prefix: str = "") -> tuple[list[Request], list[Skipped], int]:
    """Requests, skipped requests and the number of values read from one file. Requests named
    by their position get ``prefix`` (a folder's file stem and ``/``)."""
    if path.suffix == ".npy":
        return [Request(path.stem, (load_npy(path),))], [], 1
    text = _read_text(path)
    label = str(path)
    lines = path.suffix in LINE_SUFFIXES or _looks_like_lines(text)
    if not lines:
        try:
            top: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            if not exc.msg.startswith("Extra data"):  # several values: JSON lines
                raise InputError(f"{label}: not readable JSON ({exc})".splitlines()[0]) from None
            lines = True
        except (ValueError, RecursionError) as exc:
            raise InputError(
                f"{label}: not readable JSON ({type(exc).__name__}: {exc})".splitlines()[0]
            ) from None
    reader = _Reader(label)
    if lines:
        values = stream_values(text, label)
        for i, v in enumerate(values):
            reader.value(v, f"{prefix}{i}")
        reqs, skipped = reader.resolve()
        return reqs, skipped, len(values)
    stem = path.stem
    if isinstance(top, dict) and not (RESPONSE_KEYS & top.keys()) and "response" not in top:
        items = [(str(k), v) for k, v in top.items()]  # keyed by request id
    elif isinstance(top, list) and _int_depth(top) in (1, 3):
        items = [(stem, top)]  # one request: [len, layers, top_k] or flattened
    elif isinstance(top, list):
        items = [(f"{prefix}{i}", v) for i, v in enumerate(top)]
    else:
        items = [(stem, top)]
    for pos, v in items:
        reader.value(v, pos)
    reqs, skipped = reader.resolve()
    return reqs, skipped, len(items)


def collect(path: Path) -> tuple[list[Request], list[Skipped]]:
    """Every request of ``path`` (a file, or a folder of ``.npy``, JSON, JSON-lines and SSE
    files read in natural name order: ``r2`` before ``r10``), in order, and those skipped."""
    if path.is_dir():
        files = sorted(
            (
                p
                for p in path.iterdir()
                if not p.name.startswith(".")
                and p.is_file()
                and p.suffix in (".npy", *JSON_SUFFIXES)
            ),
            key=_natural_key,
        )
        if not files:
            raise InputError(
                f"{path}: directory holds no .npy, .json, .jsonl or .sse files "
                "(one request or stream each)"
            )
        reqs: list[Request] = []
        skipped: list[Skipped] = []
        for p in files:
            r, s, _ = collect_file(p, prefix=f"{p.stem}/")
            reqs.extend(r)
            skipped.extend(s)
        return reqs, skipped
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    reqs, skipped, n = collect_file(path)
    if n == 0:
        raise InputError(f"{path}: holds no requests")
    return reqs, skipped
