"""llama.cpp's n-gram self-speculation: ``llama-speculative-simple --spec-type ngram-*``, no draft
model, drafts looked up in the generation's own token history.

How k reaches llama.cpp (``common/speculative.cpp`` of llama.cpp as vendored by llama-cpp-python
0.3.36): ``--spec-draft-n-max`` bounds the draft-model types only; an n-gram type's draft length
is its own m-gram size (``--spec-ngram-simple-size-m``, ``--spec-ngram-map-k-size-m``,
``--spec-ngram-map-k4v-size-m``, ``--spec-ngram-mod-n-max``; ngram-cache drafts 8, fixed), so
:func:`ngram_flags` sets that to k. ngram-simple (``common_ngram_simple_draft`` in
``common/ngram-map.cpp``) finds the latest earlier occurrence of the last ``size_n`` tokens and
drafts the up to k tokens that followed it, and drafts nothing unless at least ``size_n`` follow
(so ``size_n <= k``); llama.cpp's default size_n is 12, here 1 by default.

A round drafts at most k tokens, fewer or none (no match): its pass is then of 1..k+1 tokens.

Round logs: the debug log (``-lv 5``) has an ``accepted a/k draft tokens`` line per round for
every type, but names the drafted tokens for none of them (the draft-model path logs its
candidates). For ngram-simple the tokens follow from its ``found matching pattern at pos P,
length N, draft length D`` line: the draft is ``history[P + N : P + N + k]``, the history being
the prompt less its last token and then every emitted token; :func:`parse_ngram_log` rebuilds it
round by round and checks it against the log's history sizes and ``n_past``. The other types'
debug lines give no tokens: their runs give the summary only (:data:`ROUND_LOG_TYPES`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from pathlib import Path

from specmoe.engines.llamacpp_logs import (
    _ACC,
    _CLEAR,
    _IMPL,
    _SUMMARY,
    SpecRound,
    SpecRun,
    _entries,
    _round_times,
    _run_of,
    _summary_of,
)
from specmoe.errors import InputError

__all__ = [
    "ROUND_LOG_TYPES",
    "SPEC_TYPES",
    "generated_text",
    "ngram_command",
    "ngram_flags",
    "parse_ngram_log",
    "run_ngram",
    "timed_rounds",
]

SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
ROUND_LOG_TYPES = ("ngram-simple",)
CACHE_DRAFT = 8  # ngram-cache's fixed draft length (create_state_ngram_cache)

_MATCH = re.compile(
    r"common_ngram_simple_draft: #tokens = (\d+): found matching pattern at pos (\d+), "
    r"length (\d+), draft length (\d+)"
)


def ngram_flags(spec_type: str, *, k: int, size_n: int = 1) -> list[str]:
    """The ``--spec-type`` flags that draft at most ``k`` tokens a round, looking up n-grams of
    ``size_n`` tokens (ngram-mod: its n-match; ngram-cache: neither, it drafts 8)."""
    if spec_type not in SPEC_TYPES:
        raise InputError(
            f"unknown {spec_type!r} (choose from {', '.join(SPEC_TYPES)})", argument="--spec-type"
        )
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InputError(f"must be >= 1 for an n-gram drafter, got {k}", argument="--k")
    if isinstance(size_n, bool) or not isinstance(size_n, int) or size_n < 1:
        raise InputError(f"must be >= 1, got {size_n}", argument="--ngram-size-n")
    flags = ["--spec-type", spec_type]
    if spec_type == "ngram-cache":
        if k != CACHE_DRAFT:
            raise InputError(
                f"{k}: ngram-cache drafts {CACHE_DRAFT} tokens a round, fixed in llama.cpp",
                argument="--k",
            )
        return flags
    if spec_type in ("ngram-simple", "ngram-map-k", "ngram-map-k4v"):
        if size_n > k:
            raise InputError(
                f"{size_n} > k = {k}: {spec_type} drafts only where >= size_n tokens follow a "
                "match, so it would draft nothing",
                argument="--ngram-size-n",
            )
        return [*flags, f"--spec-{spec_type}-size-n", str(size_n), f"--spec-{spec_type}-size-m",
                str(k)]  # fmt: skip
    # ngram-mod: drafts of n-min..n-max tokens, matched on n-match tokens
    return [*flags, "--spec-ngram-mod-n-max", str(k), "--spec-ngram-mod-n-min", "1",
            "--spec-ngram-mod-n-match", str(size_n)]  # fmt: skip


def ngram_command(
    target: str | os.PathLike,
    prompt_file: str | os.PathLike,
    *,
    k: int,
    n_predict: int,
    spec_type: str = "ngram-simple",
    size_n: int = 1,
    threads: int = 1,
    ctx_size: int = 4096,
    rounds: bool = True,
) -> list[str]:
    """``llama-speculative-simple`` with an n-gram drafter (no ``-md``), greedy, the log as timed
    JSON lines (debug verbosity with ``rounds``)."""
    from specmoe.engines.llamacpp import tool

    cmd = [str(tool("llama-speculative-simple")), "-m", str(target)]
    cmd += ["-f", str(prompt_file), "-n", str(int(n_predict)), "-c", str(int(ctx_size))]
    cmd += ngram_flags(spec_type, k=k, size_n=size_n)
    cmd += ["-t", str(int(threads)), "-fa", "off", "--temp", "0", "--no-escape", "--seed", "0"]
    cmd += ["-lv", "5" if rounds else "3", "--log-timestamps", "--log-jsonl", "--log-colors", "off"]
    return cmd


def generated_text(text: str) -> str:
    """What ``llama-speculative-simple`` printed of the generation: its plain (``none``-level)
    log lines after a blank line and the prompt's ``encoded`` pieces, one line a token, less the
    blank line after the generation. Any verbosity."""
    entries = _entries(text)
    n_input = None
    pieces: list[str] = []
    for _, level, msg in entries:
        if level == "none":
            pieces.append(msg)
        elif m := _SUMMARY["n_input"].match(msg):
            n_input = int(m.group(1))
            break
    if n_input is None:
        raise InputError("llama-speculative-simple log: no 'encoded' line (did it finish?)")
    gen = pieces[1 + n_input :]
    if gen and gen[-1] == "\n\n":
        gen.pop()
    return "".join(gen)


def parse_ngram_log(text: str, *, prompt_ids: list[int] | None = None) -> SpecRun:
    """The rounds and summary of an ngram-simple ``llama-speculative-simple -lv 5
    --log-timestamps --log-jsonl`` log; ``prompt_ids`` (llama.cpp's tokens of the prompt, e.g.
    :func:`specmoe.engines.llamacpp.tokenize`) rebuild each round's draft tokens (module
    docstring). Without them: the summary and the generated text only, no rounds.

    t_verify_ms: from the ``called impl`` line (the previous round's ``clear kv cache`` line
    where the round drafted nothing) to the round's ``accepted`` line; t_draft_ms: from the
    previous round's end to the ``called impl`` line (the lookup; NaN in round 0 and where the
    round drafted nothing)."""
    entries = _entries(text)
    if not entries:
        raise InputError("llama-speculative-simple log: no JSON log lines (run with --log-jsonl)")
    summary = _summary_of(entries)
    gen_text = generated_text(text)
    if prompt_ids is None:
        return _run_of(summary, (), gen_text)
    n_input = int(summary["n_input"][0])
    if len(prompt_ids) != n_input:
        raise InputError(
            f"llama-speculative-simple log: {n_input} prompt tokens encoded, "
            f"{len(prompt_ids)} given",
            argument="prompt_ids",
        )
    return _run_of(summary, _rounds(entries, list(prompt_ids)), gen_text)


def _rounds(entries: list[tuple[float, str, str]], prompt_ids: list[int]) -> tuple[SpecRound, ...]:
    hist, last = prompt_ids[:-1], prompt_ids[-1]
    rounds: list[SpecRound] = []
    match: tuple[int, int, int] | None = None  # (pos, length, draft length)
    impl: tuple[float, int] | None = None  # (time, gen)
    prev_end: float | None = None

    def bad(msg: str) -> InputError:
        return InputError(f"llama-speculative-simple log: round {len(rounds)}: {msg}")

    for t, level, msg in entries:
        if level == "none":
            continue
        if _SUMMARY["n_input"].match(msg):
            break
        if m := _MATCH.search(msg):
            if int(m.group(1)) != len(hist):
                raise bad(f"lookup over {m.group(1)} tokens, the history holds {len(hist)}")
            match = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
        elif m := _IMPL.search(msg):
            if m.group(1) != "ngram-simple":
                raise bad(f"drafted by {m.group(1)}, not ngram-simple")
            if int(m.group(2)) != len(hist):
                raise bad(f"history of {m.group(2)} tokens, rebuilt {len(hist)}")
            impl = (t, int(m.group(3)))
        elif m := _ACC.match(msg):
            a, k, tok = int(m.group(1)), int(m.group(2)), int(m.group(3))
            gen = impl[1] if impl is not None else 0
            if gen != k or not 0 <= a <= k or (k and match is None):
                raise bad(f"{a}/{k} drafts accepted, {gen} reported drafted (run with -lv 5)")
            if k:
                pos, length, dlen = match
                if dlen < k or pos + length + k > len(hist):
                    raise bad(f"a draft of {k} from pos {pos} past the history")
                draft = tuple(hist[pos + length : pos + length + k])
            else:
                draft = ()
            times = _round_times(t, impl, prev_end)
            rounds.append(SpecRound(len(rounds), k, a, draft, tok, len(hist), *times))
            for nxt in (*draft[:a], tok):
                hist.append(last)
                last = nxt
            match, impl = None, None
        elif m := _CLEAR.match(msg):
            prev_end = t
            if int(m.group(1)) != len(hist):
                raise InputError(
                    f"llama-speculative-simple log: round {len(rounds) - 1} ends at n_past "
                    f"{m.group(1)}, the rebuilt history holds {len(hist)}"
                )
    if not rounds:
        raise InputError("llama-speculative-simple log: no rounds (run with -lv 5)")
    return tuple(rounds)


def run_ngram(
    target: str | os.PathLike,
    prompt: str,
    *,
    k: int,
    n_predict: int,
    spec_type: str = "ngram-simple",
    size_n: int = 1,
    threads: int = 1,
    ctx_size: int = 4096,
    prompt_ids: list[int] | None = None,
    log_path: str | os.PathLike | None = None,
) -> SpecRun:
    """One greedy n-gram speculative generation of about ``n_predict`` tokens after ``prompt``.

    With ``prompt_ids`` (ngram-simple only): at debug verbosity, its rounds rebuilt from the log
    (the debug log slows the run; its throughput is not the engine's). Without: at the default
    verbosity, the summary and the generated text (``rounds`` empty). ``log_path`` keeps the log.
    """
    from specmoe.engines.llamacpp import _model_file, _speculative_run

    rounds = prompt_ids is not None
    if rounds and spec_type not in ROUND_LOG_TYPES:
        raise InputError(
            f"{spec_type}: llama.cpp's log does not name its drafts; rounds are read for "
            f"{', '.join(ROUND_LOG_TYPES)} only",
            argument="--spec-type",
        )
    _model_file(target, "target")
    with tempfile.TemporaryDirectory(prefix="specmoe-llamacpp-") as tmp:
        pf = Path(tmp) / "prompt.txt"
        pf.write_text(prompt + "\n", encoding="utf-8")  # -f drops one trailing newline
        cmd = ngram_command(
            target, pf, k=k, n_predict=n_predict, spec_type=spec_type, size_n=size_n,
            threads=threads, ctx_size=ctx_size, rounds=rounds,
        )  # fmt: skip
        # retried: a log without its summary from a run that exited 0 (seen now and then on a
        # busy machine, as with the draft-model runs)
        return _speculative_run(
            cmd,
            lambda log: parse_ngram_log(log, prompt_ids=prompt_ids),
            log_path=log_path,
            retry_if=lambda exc: "no summary line" in str(exc),
        )


def timed_rounds(run: SpecRun, prompt_ids: list[int]) -> tuple[SpecRun, list[int]]:
    """``run`` less its first round when the log gives that round no start (round 0 drafted
    nothing: no line between the prompt's pass and its ``accepted`` line), its token moved into
    the prompt: the rest, renumbered from 0, and the prompt they follow. A round log needs every
    round's time; nothing is filled in."""
    if not run.rounds or run.rounds[0].t_verify_ms == run.rounds[0].t_verify_ms:
        return run, list(prompt_ids)
    first = run.rounds[0]
    if first.k:
        raise ValueError("timed_rounds: a drafting round without a start time")
    rest = tuple(dataclasses.replace(r, index=i) for i, r in enumerate(run.rounds[1:]))
    shorter = dataclasses.replace(run, rounds=rest, n_predict=run.n_predict - 1)
    return shorter, [*prompt_ids, first.last_token]
