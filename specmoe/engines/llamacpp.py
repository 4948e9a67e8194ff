"""llama.cpp as an engine: its build, GGUF export, verify-pass timing and speculative runs.

llama.cpp is built by ``make llama-cpp`` (``scripts/build_llama_cpp.sh``) from the source that
the PyPI sdist of llama-cpp-python :data:`VERSION` vendors, into
``${SPECMOE_LLAMA_CPP_CACHE:-~/.cache/specmoe/llama.cpp}/<VERSION>/`` (``src/``, ``build/bin/``, and a
``BUILT`` stamp written last). Nothing here downloads or builds: a missing build is an
:class:`~specmoe.errors.InputError` saying ``make llama-cpp``.

- :func:`export_gguf`: llama.cpp's own ``convert_hf_to_gguf.py`` (with its vendored gguf-py),
  with :data:`PRE_TOKENIZERS` for BPE tokenizers whose pre-tokenizer hash it does not list.
- :func:`bench_verify`: ``llama-bench -p n -n 0 -d d``: one batch of n tokens on a KV cache of
  depth d, i.e. a verification pass of a draft of n - 1 tokens (its batch asks for the logits
  of the last position only; a verification pass needs all n).
- :func:`run_speculative`: ``llama-speculative-simple`` with a draft model, greedy, its debug
  log in JSON lines; :func:`parse_speculative_log` turns that log into rounds.
- :func:`write_round_log`: those rounds as a specmoe round log. llama.cpp's tools do not
  report routing; the routing columns (``routing``, ``u_mean``, ``e_max``) come from replaying
  the same passes (the same tokens at the same positions) in specmoe's own engine on the
  Hugging Face model the GGUF was exported from, and ``target_tokens`` is left out.

The parsers live in :mod:`specmoe.engines.llamacpp_logs` (no torch, tested on captured output).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specmoe._io import atomic_path
from specmoe.cost.llamacpp_plan import kv_flags  # the tools' KV cache flags
from specmoe.engines.llamacpp_logs import (
    PassTime,
    SpecRun,
    parse_bench_json,
    parse_speculative_log,
    parse_token_ids,
)
from specmoe.errors import InputError

__all__ = [
    "OUTTYPES",
    "PRE_TOKENIZERS",
    "TOOLS",
    "VERSION",
    "bench_decode",
    "bench_verify",
    "cache_root",
    "compile_shim",
    "cpu_flags",
    "export_gguf",
    "f16_dot_step",
    "greedy_text",
    "is_built",
    "kv_flags",
    "replay_routing",
    "require_built",
    "run_speculative",
    "scalar_attention_note",
    "tokenize",
    "tool",
    "write_round_log",
]

VERSION = "0.3.36"  # llama-cpp-python's sdist; its vendor/llama.cpp is ggml 0.25.3
TOOLS = (
    "llama-bench",
    "llama-speculative-simple",
    "llama-server",
    "llama-cli",
    "llama-simple",
    "llama-tokenize",
    "test-backend-ops",
)
OUTTYPES = ("bf16", "f32", "f16", "q8_0")
# chkhsh of convert_hf_to_gguf's probe text -> the llama.cpp pre-tokenizer with the same regex.
# cdb62948...: the bundled models' tokenizer (ByteLevel BPE, add_prefix_space false, GPT-2's
# split regex), which llama.cpp's list does not hold.
PRE_TOKENIZERS = {"cdb62948c9a28812be5af6f1a91ad969c5c21fa96dc8f77689b2c9c46f0f79b6": "gpt-2"}
_TIMEOUT_S = 1800


def cache_root() -> Path:
    """Where ``make llama-cpp`` builds :data:`VERSION`: ``$SPECMOE_LLAMA_CPP_CACHE/<VERSION>``
    (default ~/.cache/specmoe/llama.cpp)."""
    base = os.environ.get("SPECMOE_LLAMA_CPP_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "specmoe", "llama.cpp"
    )
    return Path(base) / VERSION


def is_built() -> bool:
    """The build stamp and every tool of :data:`TOOLS` are there."""
    root = cache_root()
    return (root / "BUILT").is_file() and all(
        os.access(root / "build" / "bin" / t, os.X_OK) for t in TOOLS
    )


def require_built() -> Path:
    """The cache root of a finished build, else one ``InputError`` line naming the fix."""
    if not is_built():
        raise InputError(
            f"llama.cpp {VERSION} is not built (looked in {cache_root()}): run `make llama-cpp`"
        )
    return cache_root()


def tool(name: str) -> Path:
    """The path of one of :data:`TOOLS`."""
    if name not in TOOLS:
        raise ValueError(f"tool: unknown {name!r} (choose from {', '.join(TOOLS)})")
    return require_built() / "build" / "bin" / name


def _run(
    cmd: list[str], *, what: str, timeout: float = _TIMEOUT_S, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        errors="replace",
        env=None if env is None else {**os.environ, **env},
    )
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"{what} exited with status {proc.returncode}: {tail}")
    return proc


def _model_file(path: str | os.PathLike, argument: str = "model") -> Path:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such GGUF file", argument=argument)
    return p


# ------------------------------------------------------------------------------------------
# export


def export_gguf(
    model_dir: str | os.PathLike, out: str | os.PathLike, *, outtype: str = "bf16"
) -> Path:
    """Convert the Hugging Face model in ``model_dir`` to GGUF at ``out`` (written atomically)
    with llama.cpp's converter, weights as ``outtype`` (:data:`OUTTYPES`)."""
    if outtype not in OUTTYPES:
        raise InputError(
            f"unknown {outtype!r} (choose from {', '.join(OUTTYPES)})", argument="outtype"
        )
    src = require_built() / "src"
    script = Path(__file__).with_name("_gguf_convert.py")
    with atomic_path(out, suffix=".gguf") as tmp:
        cmd = [sys.executable, str(script), str(src), json.dumps(PRE_TOKENIZERS), "--"]
        cmd += [str(model_dir), "--outfile", str(tmp), "--outtype", outtype]
        _run(cmd, what="convert_hf_to_gguf.py")
    return Path(out)


# ------------------------------------------------------------------------------------------
# timing


# llama-context.cpp reads it once per context: every decode builds and allocates its graph
GRAPH_REUSE_OFF = {"LLAMA_GRAPH_REUSE_DISABLE": "1"}


def f16_dot_step(cpu_flags: set[str] | frozenset[str]) -> int | None:
    """The elements a SIMD step of ggml's f16 dot product takes on a CPU with ``cpu_flags``
    (``/proc/cpuinfo``'s names), as this llama.cpp builds it with ``GGML_NATIVE``
    (``ggml/src/ggml-cpu/simd-mappings.h``, ``GGML_F16_DOT_STEP``): 64 with AVX-512
    (``GGML_F16_STEP`` 64, or with AVX512-FP16 ``GGML_F32_STEP`` 64), 32 with AVX or AVX2
    (``GGML_F16_STEP`` 32); None where this table does not know the CPU (other ISAs)."""
    if "avx512f" in cpu_flags:
        return 64
    if "avx" in cpu_flags or "avx2" in cpu_flags:
        return 32
    return None


def scalar_attention_note(head_dim: int, cpu_flags: set[str] | frozenset[str]) -> str | None:
    """A line for the user when llama.cpp's one-token attention over an f16 KV cache runs
    ggml's scalar loop on this CPU: without flash attention a one-token K·Q goes to
    ``ggml_vec_dot_f16`` (``llamafile_sgemm`` takes two or more columns), whose SIMD loop steps
    :func:`f16_dot_step` elements and leaves the rest of each head (``head_dim`` modulo the
    step) to a scalar loop of table lookups and dependent double-precision adds. None when the
    head has no remainder or the CPU is not known. Keys in q8_0 (``-ctk q8_0``) take ggml's
    q8_0 dot product, SIMD in blocks of 32 (results/cpu/llamacpp/kv-width/)."""
    step = f16_dot_step(cpu_flags)
    if step is None or head_dim % step == 0:
        return None
    rest = head_dim % step
    return (
        f"llama.cpp's one-token attention over an f16 KV cache runs ggml's scalar loop on "
        f"{rest} of each head's {head_dim} elements on this CPU (its f16 dot product steps "
        f"{step}): keys in q8_0 (--kv-type q8_0 here, -ctk q8_0 in llama.cpp) avoid it"
    )


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first processor's flags in ``cpuinfo`` (empty where it cannot be read)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _bench(
    model: Path,
    args: list[str],
    *,
    threads: int,
    repeats: int,
    graph_reuse: bool = True,
    kv_type: str = "f16",
) -> list[PassTime]:
    cmd = [str(tool("llama-bench")), "-m", str(model), "-t", str(threads), "-r", str(repeats)]
    cmd += ["-fa", "off", *kv_flags(kv_type, bench=True), "-o", "json", *args]
    env = None if graph_reuse else GRAPH_REUSE_OFF
    times = parse_bench_json(_run(cmd, what="llama-bench", env=env).stdout)
    bad = [t for t in times if t.type_k != kv_type or t.type_v != "f16"]  # V: f16 (kv_flags)
    if bad:
        raise InputError(
            f"llama-bench ran a KV cache of {bad[0].type_k}/{bad[0].type_v}, asked for "
            f"{kv_type} keys and f16 values"
        )
    return times


def bench_verify(
    model: str | os.PathLike,
    *,
    n_values: tuple[int, ...] = tuple(range(1, 10)),
    depth: int = 0,
    repeats: int = 50,
    threads: int = 1,
    graph_reuse: bool = True,
    kv_type: str = "f16",
) -> list[PassTime]:
    """The time of one pass of n tokens on a KV cache of ``depth`` tokens, for each n of
    ``n_values`` (``llama-bench -p n,... -n 0 -d depth -fa off``; flash attention, llama.cpp's
    default, is several times slower on a CPU), the cache in ``kv_type`` (:func:`kv_flags`).

    llama-bench repeats each n, so from its second repetition on a pass reuses the graph the
    one before it built (``llama_context::process_ubatch``: same token and output counts, same
    KV width). A decode whose size differs from the one before it builds and allocates its
    graph anew; ``graph_reuse=False`` (``LLAMA_GRAPH_REUSE_DISABLE=1``) times such passes."""
    if not n_values or min(n_values) < 1:
        raise InputError(f"need pass sizes >= 1, got {list(n_values)}", argument="n_values")
    if depth < 0:
        raise InputError(f"must be >= 0, got {depth}", argument="depth")
    p = ",".join(str(int(n)) for n in n_values)
    args = ["-p", p, "-n", "0", "-d", str(int(depth))]
    return _bench(
        _model_file(model),
        args,
        threads=threads,
        repeats=repeats,
        graph_reuse=graph_reuse,
        kv_type=kv_type,
    )


def bench_decode(
    model: str | os.PathLike,
    *,
    tokens: int = 128,
    depth: int = 0,
    repeats: int = 5,
    threads: int = 1,
) -> PassTime:
    """Plain decoding: ``tokens`` one-token passes after ``depth`` (``llama-bench -p 0 -n``)."""
    args = ["-p", "0", "-n", str(int(tokens)), "-d", str(int(depth))]
    (res,) = _bench(_model_file(model), args, threads=threads, repeats=repeats)
    return res


# ------------------------------------------------------------------------------------------
# tokens and speculative runs


def tokenize(
    model: str | os.PathLike, text: str, *, tmp_dir: str | os.PathLike | None = None
) -> list[int]:
    """llama.cpp's tokens of ``text`` (``llama-tokenize --ids``; no BOS the vocabulary does
    not ask for), read from a file so that any text goes through unchanged."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".txt", dir=tmp_dir, encoding="utf-8") as f:
        f.write(text)
        f.flush()
        cmd = [str(tool("llama-tokenize")), "-m", str(_model_file(model)), "-f", f.name]
        cmd += ["--ids", "--no-escape", "--log-disable"]
        return parse_token_ids(_run(cmd, what="llama-tokenize").stdout)


def greedy_text(model: str | os.PathLike, prompt: str, *, n_tokens: int) -> str:
    """Plain greedy decoding in llama.cpp (``llama-simple``): what it prints, the prompt's
    pieces and then the ``n_tokens`` generated (fewer at an end-of-generation token)."""
    cmd = [str(tool("llama-simple")), "-m", str(_model_file(model)), "-n", str(int(n_tokens))]
    out = _run([*cmd, prompt], what="llama-simple").stdout
    return out[:-1] if out.endswith("\n") else out


def speculative_command(
    target: str | os.PathLike,
    draft: str | os.PathLike,
    prompt_file: str | os.PathLike,
    *,
    k: int,
    n_predict: int,
    threads: int = 1,
    ctx_size: int = 4096,
    rounds: bool = True,
) -> list[str]:
    """The ``llama-speculative-simple`` command of :func:`run_speculative` (greedy, a draft of
    exactly k tokens each round: n-min 0, p-min 0; the log as timed JSON lines, at debug
    verbosity with ``rounds``: the rounds' lines, which slow the run several times)."""
    cmd = [str(tool("llama-speculative-simple")), "-m", str(target), "-md", str(draft)]
    cmd += ["-f", str(prompt_file), "-n", str(int(n_predict)), "-c", str(int(ctx_size))]
    cmd += ["--spec-type", "draft-simple", "--spec-draft-n-max", str(int(k))]
    cmd += ["--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-t", str(int(threads))]
    cmd += ["-td", str(int(threads)), "-fa", "off", "--temp", "0", "--no-escape", "--seed", "0"]
    cmd += ["-lv", "5" if rounds else "3", "--log-timestamps", "--log-jsonl", "--log-colors", "off"]
    return cmd


def run_speculative(
    target: str | os.PathLike,
    draft: str | os.PathLike,
    prompt: str,
    *,
    k: int,
    n_predict: int,
    threads: int = 1,
    ctx_size: int = 4096,
    rounds: bool = True,
    log_path: str | os.PathLike | None = None,
) -> SpecRun:
    """One greedy speculative generation of about ``n_predict`` tokens after ``prompt``, the
    draft model proposing ``k`` tokens a round; its rounds parsed from llama.cpp's own log
    (kept at ``log_path`` when given). ``rounds=False``: the summary only, from a run at the
    default verbosity (for throughput: debug logging slows the run several times)."""
    import tempfile

    if k < 1:
        raise InputError(f"must be >= 1, got {k}", argument="k")
    _model_file(target, "target"), _model_file(draft, "draft")
    with tempfile.TemporaryDirectory(prefix="specmoe-llamacpp-") as tmp:
        pf = Path(tmp) / "prompt.txt"
        pf.write_text(prompt + "\n", encoding="utf-8")  # -f drops one trailing newline
        cmd = speculative_command(
            target,
            draft,
            pf,
            k=k,
            n_predict=n_predict,
            threads=threads,
            ctx_size=ctx_size,
            rounds=rounds,
        )
        return _speculative_run(
            cmd, lambda log: parse_speculative_log(log, rounds=rounds), log_path=log_path
        )


def _speculative_run(
    cmd: list[str],
    parse: Callable[[str], SpecRun],
    *,
    log_path: str | os.PathLike | None = None,
    retry_if: Callable[[InputError], bool] | None = None,
) -> SpecRun:
    """``llama-speculative-simple``'s run ``cmd``, its log (stdout and stderr together) read by
    ``parse`` and kept at ``log_path`` when given. A log ``parse`` cannot read (from a run that
    exited 0; with ``retry_if``, one whose error it accepts) is kept in a temporary file, said,
    and the command run once more; a second such log is a RuntimeError."""
    for attempt in (1, 2):
        proc = _run(cmd, what="llama-speculative-simple")
        log = proc.stdout + proc.stderr
        try:
            run = parse(log)
            break
        except InputError as exc:
            if retry_if is not None and not retry_if(exc):
                raise
            fd, kept = tempfile.mkstemp(prefix="specmoe-llamacpp-log-", suffix=".jsonl")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(log)
            if attempt == 2:
                raise RuntimeError(f"llama-speculative-simple: {exc} (its log: {kept})") from None
            print(
                f"warning: llama-speculative-simple: {exc} (its log: {kept}); running it again",
                file=sys.stderr,
            )
    if log_path is not None:
        with atomic_path(log_path) as tmp_log:
            tmp_log.write_text(log, encoding="utf-8")
    return run


# ------------------------------------------------------------------------------------------
# round logs


def replay_routing(model: Any, prompt_ids: list[int], run: SpecRun) -> list[Any]:
    """Each round's pass replayed in specmoe's engine (the same tokens at the same positions,
    teacher-forced): a :class:`specmoe.engine.speculative.Verified` per round, routing [P, L, m].

    ``model`` is the Hugging Face model the GGUF was exported from. The cache after a round
    keeps the round's accepted tokens, as llama.cpp's does."""
    from specmoe.engine.speculative import Engine, crop_cache, new_cache

    if not prompt_ids:
        raise InputError("prompt: no tokens", argument="prompt_ids")
    out = []
    with Engine(model) as eng:
        kv = new_cache(model)
        eng.prefill(kv, prompt_ids[:-1])
        current, ctx = prompt_ids[-1], len(prompt_ids) - 1
        for r in run.rounds:
            if r.context_len != ctx:
                raise ValueError(
                    f"replay_routing: round {r.index} at context {r.context_len}, expected {ctx}"
                )
            out.append(eng.forward(kv, [current, *r.draft_tokens]))
            ctx += r.accepted + 1
            crop_cache(kv, ctx)
            current = r.last_token
    return out


def write_round_log(
    run: SpecRun,
    directory: str | os.PathLike,
    *,
    model: Any,
    prompt_ids: list[int],
    run_id: str,
    prompt_id: str,
    budget: int,
    flush: bool = True,
    drafter: str = "draft-simple",
) -> Path:
    """Append ``run``'s rounds to the round log in ``directory`` as one finished generation.

    From llama.cpp: k, accepted, the draft tokens, the context length, t_verify_ms (from the
    log line after drafting to the round's ``accepted`` line: the target's pass, the draft
    model's pass over the same batch, and sampling) and t_draft_ms (from the previous round's
    end to that line; null in round 0). Routing, u_mean and e_max: :func:`replay_routing`.
    ``drafter``: llama.cpp's ``--spec-type`` of the run (n-gram runs:
    :mod:`specmoe.engines.llamacpp_ngram`)."""
    from specmoe.formats.roundlog import RoundLogWriter

    passes = replay_routing(model, prompt_ids, run)
    cfg = model.config
    defaults = {
        "run_id": run_id,
        "prompt_id": prompt_id,
        "kernel": "llama.cpp",
        "drafter": drafter,
        "budget": int(budget),
        "num_experts": int(getattr(cfg, "num_experts", 0) or passes[0].routing.max() + 1),
    }
    writer = RoundLogWriter(directory, flush_every=None, defaults=defaults)
    for r, v in zip(run.rounds, passes, strict=True):
        row = {
            "round": r.index,
            "k": r.k,
            "accepted": r.accepted,
            "t_verify_ms": r.t_verify_ms,
            "context_len": r.context_len,
            "routing": v.routing,
            "draft_tokens": list(r.draft_tokens),
        }
        if r.t_draft_ms == r.t_draft_ms:  # not NaN
            row["t_draft_ms"] = r.t_draft_ms
        writer.append(**row)
    gid = f"{run_id}/{prompt_id}"
    writer.end_generation(gid, tokens=run.n_predict, rounds=len(run.rounds))
    path = writer.flush() if flush else None
    return Path(path) if path is not None else Path(directory)


# ------------------------------------------------------------------------------------------
# C shims against the build (the routing recorder, the MUL_MAT_ID harness)

_SHIM_LOCK = threading.Lock()


def compile_shim(source: str, *, name: str, libs: list[str], what: str) -> Path:
    """``source`` compiled into a shared library against this build's headers (llama and
    ggml) and ``libs`` (``["llama", "ggml-base", "ggml"]``), on first use, into
    ``<cache>/specmoe-<name>/<name>_<version>_<key>.so`` where the key hashes the llama.cpp
    version, the source, the compiler and the build's folder; written atomically, so a second
    process finds it whole or not at all. ``InputError`` when llama.cpp is not built,
    ``RuntimeError`` (naming ``what``) when there is no compiler or the source does not compile.
    """
    from specmoe.kernels._cbuild import find_compiler

    root = require_built()
    with _SHIM_LOCK:
        cc = find_compiler()
        if cc is None:
            raise RuntimeError(f"{what}: no C compiler found (set CC)")
        lib_dir = root / "build" / "bin"
        key = hashlib.sha256("\0".join([VERSION, source, cc, str(root)]).encode()).hexdigest()
        target = root / f"specmoe-{name}" / f"{name}_{VERSION}_{key[:16]}.so"
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        inc = [root / "src" / "include", root / "src" / "ggml" / "include"]
        with tempfile.TemporaryDirectory(prefix=f"specmoe-{name}-cc-") as tmp:
            src, out = Path(tmp) / f"{name}.c", Path(tmp) / f"{name}.so"
            src.write_text(source, encoding="utf-8")
            cmd = [*cc.split(), "-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-shared"]
            cmd += ["-fPIC", str(src), "-o", str(out), *(f"-I{d}" for d in inc)]
            cmd += [f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}", *(f"-l{lib}" for lib in libs)]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
            if res.returncode != 0 or not out.is_file():
                tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
                raise RuntimeError(f"{what}: did not compile: {tail}")
            fd, part = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
            os.close(fd)
            Path(part).write_bytes(out.read_bytes())
            os.replace(part, target)
        return target
