"""Parsers of llama.cpp's output (llama.cpp as vendored by llama-cpp-python 0.3.36, ggml 0.25.3):
``llama-bench -o json``, ``llama-tokenize --ids`` and ``llama-speculative-simple``'s debug log
in JSON lines (``-lv 5 --log-timestamps --log-jsonl``). Pure functions on text; numpy only.

A speculative round in that log (``examples/speculative-simple/speculative-simple.cpp`` and
``common/speculative.cpp``), each line ``{"type":"log","time":<us>,"level":...,"msg":...}``:

- ``spec        draft:  - seq_id 0, draft candidate   0, pos   i:  <id> (<p>) '<piece>'``: the
  draft model's top candidates at draft position i; candidate 0 is the drafted token;
- ``spec common_specu: called impl draft-simple, hist size = H, call_count = C, gen = k``: the
  draft of k tokens is ready (absent when the round drafts nothing);
- ``accepted a/k draft tokens, the last target token is: (<id>)``: the target verified the
  round's k + 1 positions and accepted a drafts; <id> is its token after them;
- ``clear kv cache from any extra tokens, n_past = N``: the round is over, N tokens in context.

Summary lines: ``encoded N tokens``, ``decoded M tokens in S seconds``, ``n_predict``,
``n_drafted``, ``n_accept``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import numpy as np

from specmoe.errors import InputError

__all__ = [
    "PassTime",
    "SpecRound",
    "SpecRun",
    "parse_bench_json",
    "parse_speculative_log",
    "parse_token_ids",
]


@dataclass(frozen=True)
class PassTime:
    """One ``llama-bench`` test: ``n_prompt`` tokens in one batch (a pass of n tokens), or
    ``n_gen`` one-token passes, after a KV cache of ``depth`` tokens; ``samples_ms`` [r], the
    time of each repetition (of all ``n_gen`` passes for a generation test); ``type_k`` and
    ``type_v``, the KV cache's types as llama-bench reports them (lower case)."""

    n_prompt: int
    n_gen: int
    depth: int
    samples_ms: tuple[float, ...]
    threads: int
    flash_attn: bool
    model_type: str
    model_size: int
    type_k: str = "f16"
    type_v: str = "f16"

    @property
    def median_ms(self) -> float:
        return float(np.median(self.samples_ms))

    @property
    def mean_ms(self) -> float:
        return float(np.mean(self.samples_ms))

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second at the median repetition."""
        return (self.n_prompt + self.n_gen) / self.median_ms * 1e3


def parse_bench_json(text: str) -> list[PassTime]:
    """The tests of ``llama-bench -o json`` output."""
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"llama-bench output: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(rows, list):
        raise InputError("llama-bench output: expected a JSON list of tests")
    out = []
    for i, r in enumerate(rows):
        try:
            samples = tuple(float(s) / 1e6 for s in r["samples_ns"])
            out.append(
                PassTime(
                    n_prompt=int(r["n_prompt"]),
                    n_gen=int(r["n_gen"]),
                    depth=int(r["n_depth"]),
                    samples_ms=samples,
                    threads=int(r["n_threads"]),
                    flash_attn=bool(r["flash_attn"]) and r["flash_attn"] != -1,
                    model_type=str(r["model_type"]),
                    model_size=int(r["model_size"]),
                    type_k=str(r.get("type_k", "f16")).lower(),
                    type_v=str(r.get("type_v", "f16")).lower(),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(
                f"llama-bench output: test {i}: bad or missing field ({exc})"
            ) from None
        if not samples:
            raise InputError(f"llama-bench output: test {i}: no samples")
    return out


def parse_token_ids(text: str) -> list[int]:
    """``llama-tokenize --ids`` output: one Python-style list ``[1, 2, 3]``."""
    m = re.search(r"\[([0-9,\s-]*)\]", text)
    if m is None:
        raise InputError("llama-tokenize output: no list of token ids")
    body = m.group(1).strip()
    return [int(t) for t in body.split(",")] if body else []


@dataclass(frozen=True)
class SpecRound:
    """One verification round: ``k`` drafts verified (``draft_tokens``), ``accepted`` of them,
    ``last_token`` the target's token after them; ``context_len`` tokens in context before the
    pass; times in ms (``t_draft_ms`` NaN where the log has no start for the round)."""

    index: int
    k: int
    accepted: int
    draft_tokens: tuple[int, ...]
    last_token: int
    context_len: int
    t_draft_ms: float
    t_verify_ms: float


@dataclass(frozen=True)
class SpecRun:
    """A ``llama-speculative-simple`` run: its rounds and summary counts (``n_input`` prompt
    tokens, ``n_predict`` tokens decoded, ``n_drafted`` and ``n_accept`` drafts), ``decode_s``
    the decoding time llama.cpp reports, and ``text`` what it printed of the generation."""

    rounds: tuple[SpecRound, ...]
    n_input: int
    n_predict: int
    n_drafted: int
    n_accept: int
    decode_s: float
    text: str

    @property
    def tokens_per_s(self) -> float:
        return self.n_predict / self.decode_s if self.decode_s > 0 else math.nan


_CAND = re.compile(r"draft candidate\s+0, pos\s+(\d+):\s+(-?\d+) \(")
_IMPL = re.compile(r"called impl (\S+), hist size = (\d+), call_count = \d+, gen = (\d+)")
_ACC = re.compile(r"^accepted (\d+)/(\d+) draft tokens, the last target token is: \((-?\d+)\)")
_CLEAR = re.compile(r"^clear kv cache from any extra tokens, n_past = (\d+)")
_SUMMARY = {
    "n_input": re.compile(r"^encoded\s+(\d+) tokens in"),
    "decoded": re.compile(r"^decoded\s+(\d+) tokens in\s+([0-9.]+) seconds"),
    "n_predict": re.compile(r"^n_predict = (\d+)"),
    "n_drafted": re.compile(r"^n_drafted = (\d+)"),
    "n_accept": re.compile(r"^n_accept\s+= (\d+)"),
}


def _entries(text: str) -> list[tuple[float, str, str]]:
    """(time in ms, level, message) of every JSON log line; other lines are skipped."""
    out = []
    for line in text.split("\n"):  # not splitlines: a piece may hold U+2028 or U+0085
        if not line.startswith('{"type":"log"'):
            continue
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        out.append((float(e.get("time", 0)) / 1e3, str(e.get("level", "")), str(e.get("msg", ""))))
    return out


def _summary_of(entries: list[tuple[float, str, str]]) -> dict[str, tuple[str, ...]]:
    """The groups of each summary line of ``llama-speculative-simple``'s log (its first match,
    at a level other than ``none``); a log lacking one is an InputError."""
    summary: dict[str, tuple[str, ...]] = {}
    for _, level, msg in entries:
        for key, rx in _SUMMARY.items():
            if level != "none" and (m := rx.match(msg)):
                summary.setdefault(key, m.groups())
    missing = [k for k in _SUMMARY if k not in summary]
    if missing:
        raise InputError(
            f"llama-speculative-simple log: no summary line {', '.join(missing)} (did it finish?)"
        )
    return summary


def parse_speculative_log(text: str, *, rounds: bool = True) -> SpecRun:
    """The rounds and summary of a ``llama-speculative-simple -lv 5 --log-timestamps
    --log-jsonl`` log (stdout and stderr together).

    t_verify_ms: from the ``called impl`` line (the draft is ready; the previous round's
    ``clear kv cache`` line when the round drafted nothing) to the round's ``accepted`` line:
    the target's pass of k + 1 tokens, the draft model's pass over the same batch, and
    sampling. t_draft_ms: from the previous round's ``clear kv cache`` line to ``called impl``
    (NaN in round 0). The context before round 0 is the prompt less its last token
    (``encoded`` - 1); each round's ``n_past`` is checked against the counts.

    ``rounds=False``: the summary only (a log at the default verbosity, whose run was not
    slowed by debug logging); ``rounds`` is then empty."""
    entries = _entries(text)
    if not entries:
        raise InputError("llama-speculative-simple log: no JSON log lines (run with --log-jsonl)")
    summary = _summary_of(entries)
    if not rounds:
        return _run_of(summary, (), "")
    return _run_of(summary, *_rounds(entries, int(summary["n_input"][0]) - 1))


def _round_times(
    t: float, impl: tuple[float, int] | None, prev_end: float | None
) -> tuple[float, float]:
    """(t_draft_ms, t_verify_ms) of a round whose ``accepted`` line came at ``t``: its lookup
    from the previous round's end ``prev_end`` to its ``called impl`` line ``impl`` (time,
    drafts), its verification from then (from ``prev_end`` where it drafted nothing) to ``t``;
    NaN where a start is missing."""
    start = impl[0] if impl is not None else prev_end
    t_draft = impl[0] - prev_end if impl is not None and prev_end is not None else math.nan
    return t_draft, t - start if start is not None else math.nan


def _rounds(entries: list[tuple[float, str, str]], ctx: int) -> tuple[tuple[SpecRound, ...], str]:
    rounds: list[SpecRound] = []
    cands: dict[int, int] = {}
    impl: tuple[float, int] | None = None  # (time, gen)
    prev_end: float | None = None
    pieces: list[str] = []
    in_loop = False
    for t, level, msg in entries:
        if level == "none":
            if in_loop:
                pieces.append(msg)
            continue
        if _SUMMARY["n_input"].match(msg):
            break
        if m := _CAND.search(msg):
            in_loop = True
            cands.setdefault(int(m.group(1)), int(m.group(2)))
        elif m := _IMPL.search(msg):
            in_loop = True
            impl = (t, int(m.group(3)))
        elif m := _ACC.match(msg):
            in_loop = True
            a, k, last = int(m.group(1)), int(m.group(2)), int(m.group(3))
            gen = impl[1] if impl is not None else 0
            if gen != k or any(i not in cands for i in range(k)) or not 0 <= a <= k:
                raise InputError(
                    f"llama-speculative-simple log: round {len(rounds)}: {a}/{k} drafts "
                    f"accepted, {gen} reported drafted, {len(cands)} logged (run with -lv 5)"
                )
            draft = tuple(cands[i] for i in range(k))
            times = _round_times(t, impl, prev_end)
            rounds.append(SpecRound(len(rounds), k, a, draft, last, ctx, *times))
            ctx += a + 1
            cands, impl = {}, None
        elif m := _CLEAR.match(msg):
            prev_end = t
            if int(m.group(1)) != ctx:
                raise InputError(
                    f"llama-speculative-simple log: round {len(rounds) - 1} ends at n_past "
                    f"{m.group(1)}, its counts give {ctx}"
                )
    if not rounds:
        raise InputError("llama-speculative-simple log: no rounds (run with -lv 5)")
    if pieces:
        pieces.pop()  # the blank line the tool prints after the generation
    return tuple(rounds), "".join(pieces)


def _run_of(
    summary: dict[str, tuple[str, ...]], rounds: tuple[SpecRound, ...], text: str
) -> SpecRun:
    return SpecRun(
        rounds=rounds,
        n_input=int(summary["n_input"][0]),
        n_predict=int(summary["n_predict"][0]),
        n_drafted=int(summary["n_drafted"][0]),
        n_accept=int(summary["n_accept"][0]),
        decode_s=float(summary["decoded"][1]),
        text=text,
    )
