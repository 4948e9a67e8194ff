"""``specmoe plan``: verify times, crossover, staircase and speedup of one model on one machine.

Inputs: a model spec (``--model``, a preset or a path), routing (``--trace``, a routing trace
whose union U_l(n) the statistics module measures) and bandwidths (``--bandwidth``, a profile
written by ``specmoe bench``). With no arguments the embedded default runs: OLMoE-1B-7B-0125
shapes, the bundled model's fit trace, and a quick benchmark of this machine's CPU (cached under
the user cache folder, keyed by model, device, dtype and trace hash; ``--rebench`` re-runs it).

When the trace has fewer (or more) MoE layers than the spec, every spec layer takes the
layer-mean of the trace's union U_l(n) (said on stderr and in plan.json ``notes``).
Bytes are counted at the profile's dtype: a bandwidth is bytes over time at the dtype it was
measured at.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from specmoe.commands._common import check_out_dir, check_small_file, out_folder
from specmoe.errors import InputError

DEFAULT_MODEL = "OLMoE-1B-7B-0125"
DEFAULT_ACCEPTANCE = "0:0.95:0.05,0.98"
DEFAULT_EXPECTED = "0.7"
MAX_K = 64  # --k-max: passes of at most 65 tokens
MAX_ACCEPTANCE = 10_000  # values of an acceptance grid


def add_arguments(parser) -> None:
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"model preset or path to an HF config / spec JSON (default {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=None,
        metavar="N",
        help="keep the model's first N MoE layers (a CPU-sized copy of a "
        "preset, such as a dummy-weight run's model)",
    )
    parser.add_argument(
        "--trace",
        default=None,
        help="routing trace (.npz or shard folder); default: the bundled model's fit trace",
    )
    parser.add_argument(
        "--bandwidth",
        default=None,
        metavar="PROFILE",
        help="bandwidth profile JSON from `specmoe bench`; default: a quick "
        "benchmark on this machine (cached)",
    )
    parser.add_argument(
        "--draft-time",
        default=None,
        metavar="TABLE_OR_A,B",
        help="draft/host time per step h(k) in ms: a table file (JSON list, "
        "or lines 'k ms') or 'a,b' for h(k) = a k + b (h(0) = 0); "
        "default 0",
    )
    parser.add_argument(
        "--acceptance",
        default=DEFAULT_ACCEPTANCE,
        metavar="GRID",
        help="acceptance values: comma list of numbers or START:STOP:STEP "
        f"ranges (default {DEFAULT_ACCEPTANCE})",
    )
    parser.add_argument(
        "--expected-acceptance",
        default=DEFAULT_EXPECTED,
        metavar="A",
        help=f"acceptance for the engine settings (default {DEFAULT_EXPECTED})",
    )
    parser.add_argument(
        "--acceptance-from",
        default=None,
        metavar="FILE",
        help="the engine settings at the acceptance measured in FILE: `specmoe acceptance "
        "--out` JSON or an engine's metrics (vLLM, SGLang, llama.cpp; see specmoe "
        "acceptance); replaces --expected-acceptance",
    )
    parser.add_argument(
        "--k-max", type=int, default=8, help="largest draft length (default 8, at most 64)"
    )
    parser.add_argument(
        "--context",
        type=int,
        default=512,
        metavar="D",
        help="context depth in tokens for the key-value bytes (default 512)",
    )
    parser.add_argument(
        "--device", default="cpu", help="benchmark device when no --bandwidth (default cpu)"
    )
    parser.add_argument(
        "--dtype", default="float32", help="benchmark dtype when no --bandwidth (default float32)"
    )
    parser.add_argument(
        "--rebench", action="store_true", help="ignore a cached benchmark profile and measure again"
    )
    parser.add_argument(
        "--engine",
        dest="engines",
        action="append",
        default=None,
        metavar="NAME",
        help="engine whose settings to print: vllm, sglang, llama.cpp (repeat or comma list; "
        "default all three)",
    )
    parser.add_argument(
        "--drafter",
        default="ngram",
        choices=("ngram", "draft-model", "eagle", "eagle3"),
        help="drafter kind of the engine settings (default ngram: needs no draft model; "
        "draft-model, eagle and eagle3 need --draft-model)",
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        metavar="PATH",
        help="the draft model or EAGLE head the engines load (a folder or Hugging Face id; "
        "a .gguf file for llama.cpp)",
    )
    parser.add_argument(
        "--target-model",
        default=None,
        metavar="PATH",
        help="the model the engines serve (default: the preset's Hugging Face repository or "
        "the --model folder; llama.cpp needs a .gguf file)",
    )
    parser.add_argument(
        "--compute-capability",
        default=None,
        metavar="X.Y",
        help="the GPU's compute capability for the engines' CUDA kernel rules (default: "
        "from the profile's device name)",
    )
    parser.add_argument(
        "--gguf-type",
        default="Q4_K",
        metavar="TYPE",
        help="the ggml type of llama.cpp's expert weights, for its CUDA kernel rule (default Q4_K)",
    )
    parser.add_argument(
        "--llamacpp-profile",
        default=None,
        metavar="FILE",
        help="with --engine llama.cpp: plan from llama.cpp's own pass times, FILE the "
        "llamacpp_verify.json of `specmoe bench --engine llama.cpp --draft-model D` (target and "
        "draft-model passes); the speedup at each --acceptance, the best k and llama-server's "
        "flags (--target-model and --draft-model: the GGUF files; depth --context)",
    )
    parser.add_argument(
        "--llamacpp-statistic",
        default="median",
        choices=("median", "min", "mean"),
        help="with --llamacpp-profile: which of llama-bench's statistics over repetitions is a "
        "pass time (default median; min: the least disturbed on a shared machine)",
    )
    parser.add_argument(
        "--llamacpp-overhead",
        default=None,
        metavar="PLAIN_MS,ROUND_MS[,TOKEN_MS[,EMIT_MS]]",
        help="with --llamacpp-profile: the server's measured time beyond llama-bench's passes, "
        "ms per plain token, per speculative round, (optional) per drafted token and "
        "(optional) per emitted token: V(0) + PLAIN, V(k >= 1) + ROUND + k TOKEN + G_a(k) EMIT "
        "(default none: llama-bench's passes alone)",
    )
    parser.add_argument(
        "--llamacpp-last-row-only",
        action="store_true",
        help="with --llamacpp-profile: leave out the target's extra time for the logits of "
        "every row (the profile's output_rows), as llama-bench times it; by default V(k) holds "
        "it, as llama-server's verification asks for all k + 1 rows",
    )
    parser.add_argument(
        "--llamacpp-rows",
        default=None,
        choices=("median", "line"),
        help="with --llamacpp-profile: the target's extra time for every row's logits, r_T(n), "
        "as the profile's paired median at each n (median, the default) or a line in n fitted "
        "on n >= 2 (line: steadier where the medians are noisy)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON on stdout")
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="write plan.json and figures to DIR"
    )


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
# argument parsing


def _fraction(text: str, name: str) -> Fraction:
    try:
        return Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise InputError(f"{name}: {text.strip()!r} is not a number") from None


def parse_acceptance(text: str, name: str = "--acceptance") -> list[Fraction]:
    """Comma-separated numbers and START:STOP:STEP ranges (STOP included), as exact Fractions
    (decimal text is exact: 0.65 is 13/20). Each value must lie in [0, 1)."""
    values: list[Fraction] = []
    for item in text.split(","):
        if not item.strip():
            continue
        if ":" in item:
            parts = item.split(":")
            if len(parts) != 3:
                raise InputError(f"{name}: range {item!r} must be START:STOP:STEP")
            start, stop, step = (_fraction(p, name) for p in parts)
            if step <= 0:
                raise InputError(f"{name}: step of {item!r} must be positive")
            if stop >= start and (stop - start) / step + len(values) >= MAX_ACCEPTANCE:
                raise InputError(
                    f"{name}: range {item!r} has more than {MAX_ACCEPTANCE} values (the limit)"
                )
            x = start
            while x <= stop:
                values.append(x)
                x += step
        else:
            values.append(_fraction(item, name))
    if not values:
        raise InputError(f"{name}: no acceptance values in {text!r}")
    for a in values:
        if not 0 <= a < 1:
            raise InputError(f"{name}: {float(a):g} is outside [0, 1)")
    return sorted(set(values))


def parse_draft_time(text: str | None, k_max: int) -> tuple[np.ndarray, str]:
    """h(0..k_max) in ms from a table file or 'a,b' (h(k) = a k + b for k >= 1, h(0) = 0)."""
    from specmoe.cost.step import linear_draft_time

    if text is None:
        return np.zeros(k_max + 1), "no draft time given: h(k) = 0 (the theory's assumption)"
    path = Path(text)
    if not path.exists():
        parts = text.split(",")
        if len(parts) != 2:
            raise InputError(f"--draft-time: {text!r} is neither a file nor 'a,b'")
        try:
            a, b = float(parts[0]), float(parts[1])
        except ValueError:
            raise InputError(f"--draft-time: {text!r} is neither a file nor 'a,b'") from None
        if not (np.isfinite(a) and np.isfinite(b)) or a < 0 or b < 0:
            raise InputError(f"--draft-time: a and b must be non-negative, got {text!r}")
        return linear_draft_time(a, b, k_max), f"draft time h(k) = {a:g} k + {b:g} ms, h(0) = 0"
    check_small_file(path, "--draft-time", limit=1 << 20)
    try:
        raw = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--draft-time {path}: cannot read the draft-time table ({exc})") from None
    table: dict[int, float] = {}
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        data = None
    if data is not None:
        if isinstance(data, dict):
            data = data.get("h_ms", data.get("draft_ms"))
        if not isinstance(data, list):
            raise InputError(
                f"--draft-time {path}: a JSON draft-time table is a list of ms per k (or an object with 'h_ms')"
            )
        table = dict(enumerate(data))
    else:
        for line in raw.splitlines():
            line = line.split("#")[0].strip()
            if not line:
                continue
            cells = line.replace(",", " ").split()
            try:
                if len(cells) != 2:
                    raise ValueError(line)
                table[int(cells[0])] = float(cells[1])
            except ValueError:
                if not table and len(cells) == 2:
                    continue  # a header line
                raise InputError(
                    f"--draft-time {path}: draft-time line {line!r} is not 'k ms'"
                ) from None
    missing = [k for k in range(k_max + 1) if k not in table]
    if missing:
        raise InputError(
            f"--draft-time {path}: draft-time table lacks k = {missing[0]} (needs 0..{k_max})"
        )
    h = []
    for k in range(k_max + 1):
        v = table[k]
        if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v) or v < 0:
            raise InputError(
                f"--draft-time {path}: draft time at k = {k} must be a non-negative number of ms, got {v!r}"
            )
        h.append(float(v))
    return np.asarray(h), f"draft time h(k) from {path}"


# ------------------------------------------------------------------------------------------
# inputs: routing and bandwidths


def cache_dir() -> Path:
    """$SPECMOE_CACHE_DIR, else $XDG_CACHE_HOME/specmoe, else ~/.cache/specmoe."""
    if os.environ.get("SPECMOE_CACHE_DIR"):
        return Path(os.environ["SPECMOE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "specmoe"


def trace_hash(path: Path) -> str:
    h = hashlib.sha256()
    files = sorted(p for p in path.glob("*.npz")) if path.is_dir() else [path]
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


def _default_trace() -> Path:
    try:
        from specmoe.data.corpus import bundled_trace_path
    except ImportError:
        raise RuntimeError(
            "the bundled data (specmoe.data.corpus) is not available: pass --trace"
        ) from None
    path = bundled_trace_path("fit")
    if not path.exists():
        raise RuntimeError(
            f"the bundled fit trace {path.name} is missing from the package data: pass --trace"
        )
    return path


def routing_union(trace_path: Path, spec: Any, k_max: int) -> tuple[np.ndarray, dict, list[str]]:
    """U_l(n), n = 1..k_max+1, of the trace mapped onto the spec's MoE layers (Eq. (2) exact:
    aligned windows), a description of the trace and notes."""
    try:
        from specmoe.routing.stats import compute_stats
    except ImportError:
        raise RuntimeError(
            "the routing statistics module (specmoe.routing.stats) is not available"
        ) from None
    from specmoe.cost.bytes import layer_mean

    _err(f"plan: routing statistics of {trace_path} ...")
    stats = compute_stats(trace_path, max_n=k_max + 1, aligned=True, max_lag=1)
    if (stats.num_experts, stats.top_k) != (spec.num_experts, spec.top_k):
        raise InputError(
            f"--trace {trace_path}: routes N={stats.num_experts}, m={stats.top_k} "
            f"but model {spec.name!r} has N={spec.num_experts}, m={spec.top_k}"
        )
    union, note = layer_mean(np.asarray(stats.union, dtype=np.float64), spec.num_moe_layers)
    notes = [] if stats.num_layers == spec.num_moe_layers else [note]
    info = {
        "path": str(trace_path),
        "sha256_16": trace_hash(trace_path),
        "num_experts": stats.num_experts,
        "top_k": stats.top_k,
        "num_layers": stats.num_layers,
        "tokens": stats.tokens,
        "documents": stats.documents,
        "identity_error": stats.identity_error,
    }
    return union, info, notes


def cached_profile_path(spec: Any, device: str, dtype: str, thash: str) -> Path:
    """Where the quick benchmark of ``spec`` on ``device``/``dtype`` with the routing of the
    trace hashed ``thash`` is cached: keyed by all four."""
    key = hashlib.sha256(
        json.dumps(
            {"model": spec.to_dict(), "device": device, "dtype": dtype, "trace": thash},
            sort_keys=True,
        ).encode()
    ).hexdigest()[:16]
    return cache_dir() / "profiles" / f"{spec.name}-{device}-{dtype}-{key}.json"


def resolve_profile(args, spec: Any, trace_path: Path, thash: str) -> tuple[Any, dict]:
    """The bandwidth profile: --bandwidth, a cached one, or a quick benchmark (then cached)."""
    from specmoe.formats.profile import load_profile

    if args.bandwidth is not None:
        prof = load_profile(args.bandwidth, spec=spec)
        return prof, {"path": str(args.bandwidth), "cached": False}
    path = cached_profile_path(spec, args.device, args.dtype, thash)
    if path.exists() and not args.rebench:
        try:
            prof = load_profile(path, spec=spec)
        except InputError as exc:  # a stale or damaged cache: say which file and the way out
            raise InputError(
                f"the cached bandwidth profile {path} is unreadable ({exc}); "
                "rerun with --rebench to measure again (or delete the file)"
            ) from None
        _err(f"plan: bandwidth profile from the cache {path}")
        return prof, {"path": str(path), "cached": True}
    try:
        from specmoe.bench.run import run_benchmark
    except ImportError:
        raise RuntimeError(
            "the benchmark module (specmoe.bench.run) is not available: pass --bandwidth PROFILE"
        ) from None
    from specmoe.formats.trace import load_trace

    _err(
        f"plan: quick benchmark of the expert operation on {args.device} ({args.dtype}); "
        f"cached afterwards in {path.parent}"
    )
    prof = run_benchmark(
        spec.with_dtype(args.dtype),
        trace=load_trace(trace_path),
        device=args.device,
        dtype=args.dtype,
        quick=True,
        progress=True,
    )
    prof.save(path)
    return prof, {"path": str(path), "cached": False, "measured_now": True}


# ------------------------------------------------------------------------------------------
# the command


def engine_request(args) -> Any:
    """The engine settings' request from --engine, --drafter, --draft-model, --target-model,
    --compute-capability and --gguf-type."""
    from specmoe.cost.engine_kernels import ENGINES, parse_compute_capability
    from specmoe.cost.engine_settings import EngineRequest

    names: list[str] = []
    for item in getattr(args, "engines", None) or []:
        for name in item.split(","):
            name = name.strip().lower()
            if name in ("llamacpp", "llama-cpp", "llama_cpp"):
                name = "llama.cpp"
            if name and name not in names:
                names.append(name)
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise InputError(f"--engine: unknown engine {unknown[0]!r}; known: {', '.join(ENGINES)}")
    drafter = getattr(args, "drafter", "ngram")
    draft = getattr(args, "draft_model", None)
    if drafter != "ngram" and not draft:
        what = "an EAGLE head" if drafter.startswith("eagle") else "a draft model"
        raise InputError(
            f"--drafter {drafter} needs --draft-model PATH ({what}: a folder or Hugging Face "
            "id, a .gguf file for llama.cpp)"
        )
    cc = getattr(args, "compute_capability", None)
    if cc is not None:
        try:
            cc = parse_compute_capability(cc)
        except InputError as exc:
            raise exc.as_flag("--compute-capability") from None
    return EngineRequest(
        engines=tuple(names) or ENGINES,
        drafter=drafter,
        target_model=getattr(args, "target_model", None),
        draft_model=draft,
        compute_capability=cc,
        weight_type=str(getattr(args, "gguf_type", "Q4_K") or "Q4_K").upper(),
    )


def make_plan(args) -> tuple[Any, dict]:
    from specmoe.cost.plan import build_plan
    from specmoe.spec import DTYPE_BYTES, resolve_spec

    if args.k_max < 1:
        raise InputError(f"--k-max: must be at least 1, got {args.k_max}")
    if args.k_max > MAX_K:
        raise InputError(f"--k-max: must be at most {MAX_K}, got {args.k_max}")
    if args.context < 0:
        raise InputError(f"--context: must be non-negative, got {args.context}")
    acceptance = parse_acceptance(args.acceptance)
    expected = parse_acceptance(args.expected_acceptance, "--expected-acceptance")
    if len(expected) != 1:
        raise InputError("--expected-acceptance: give one value")
    measured_acceptance = None
    if getattr(args, "acceptance_from", None) is not None:
        from specmoe.formats.acceptance import load_acceptance

        try:
            measured_acceptance = load_acceptance(args.acceptance_from)
        except InputError as exc:
            raise InputError(exc.message, argument="acceptance_from") from None
        expected = [float(measured_acceptance.rate)]
        if expected[0] >= 1.0:  # no step rejected a draft; the theory needs a < 1: its limit
            expected = [float(np.nextafter(1.0, 0.0))]
    draft_ms, draft_note = parse_draft_time(args.draft_time, args.k_max)
    request = engine_request(args)
    spec = resolve_spec(args.model)
    if getattr(args, "layers", None) is not None:
        try:
            spec = spec.with_layers(args.layers)
        except InputError as exc:
            raise InputError(f"--layers: {exc}") from None
    trace_path = Path(args.trace) if args.trace is not None else _default_trace()
    if not trace_path.exists():
        raise InputError(f"--trace {trace_path}: no such trace file or folder")
    if args.bandwidth is not None:  # a given profile is checked before the routing pass
        prof, prof_info = resolve_profile(args, spec, trace_path, "")
    union, trace_info, notes = routing_union(trace_path, spec, args.k_max)
    if args.bandwidth is None:
        prof, prof_info = resolve_profile(args, spec, trace_path, trace_info["sha256_16"])
    bpw = DTYPE_BYTES.get(str(prof.dtype).lower())
    if bpw is None:
        raise InputError(f"bandwidth profile: unknown dtype {prof.dtype!r}")
    if bpw != spec.bytes_per_weight:
        notes.append(
            f"bytes counted at the profile's dtype {prof.dtype} "
            f"({bpw:g} bytes per weight), not the model's {spec.bytes_per_weight:g}"
        )
        spec = spec.with_dtype(prof.dtype)
    notes.append(draft_note)
    if measured_acceptance is not None:
        lo, hi = measured_acceptance.interval
        notes.append(
            f"expected acceptance {measured_acceptance.rate:.4f} (interval {lo:.4f} to {hi:.4f}"
            f"{'' if measured_acceptance.exact else ', a lower bound'}) measured in "
            f"{args.acceptance_from} ({measured_acceptance.source})"
        )
        if expected[0] != measured_acceptance.rate:
            notes.append(
                "no drafted token was rejected: planned at the largest acceptance below 1 "
                f"({expected[0]!r}), the limit of the theory's a < 1"
            )
    for note in notes:
        _err(f"plan: {note}")
    prof_info.update(device=prof.device, device_name=prof.device_name, dtype=prof.dtype)
    try:
        plan = build_plan(
            spec,
            union,
            prof,
            k_max=args.k_max,
            acceptance=acceptance,
            draft_ms=draft_ms,
            context=args.context,
            expected_acceptance=expected[0],
            notes=notes,
            sources={"trace": trace_info, "bandwidth": prof_info},
            engines=request,
        )
    except InputError as exc:
        if exc.argument == "draft_ms":  # build_plan's h(k), fed by --draft-time
            raise exc.as_flag("--draft-time") from None
        raise
    return plan, plan.to_dict()


def run(args) -> int:
    """Hold --out against a second writer for the whole command (out_folder)."""
    with out_folder(args.out):
        return _run(args)


def _run(args) -> int:
    from specmoe._io import atomic_write_json, atomic_write_text, dumps_json

    check_out_dir(args.out)
    if getattr(args, "llamacpp_profile", None) is not None:
        return _run_llamacpp(args)
    for flag in ("llamacpp_overhead", "llamacpp_last_row_only", "llamacpp_rows"):
        if getattr(args, flag, None) not in (None, False):
            raise InputError(f"--{flag.replace('_', '-')}: only with --llamacpp-profile")
    plan, data = make_plan(args)
    text = summary(plan)
    if args.out:
        out = Path(args.out)
        atomic_write_json(out / "plan.json", data)
        atomic_write_text(out / "summary.txt", text + "\n")
        from specmoe.report.plan_figures import write_plan_figures

        figs = write_plan_figures(plan, out)
        extra = _write_engine_files(plan, out)
        _err(
            f"plan: wrote {out / 'plan.json'}, {out / 'summary.txt'} and "
            f"{', '.join(p.name for p in [*figs, *extra])}"
        )
    if args.json:
        print(dumps_json(data))
    else:
        print(text)
    return 0


def make_llamacpp_plan(args) -> dict[str, Any]:
    """plan.json of ``--engine llama.cpp --llamacpp-profile FILE``: the plan from llama.cpp's
    own pass times alone (:func:`specmoe.cost.llamacpp_plan.llamacpp_plan`), no routing trace
    or bandwidth profile; ``engine.settings["llama.cpp"]`` holds it."""
    from specmoe.cost.llamacpp_plan import llamacpp_plan, load_llamacpp_profile

    names = {
        "llama.cpp" if n.strip().lower() in ("llamacpp", "llama-cpp", "llama_cpp") else n.strip()
        for item in (getattr(args, "engines", None) or [])
        for n in item.split(",")
        if n.strip()
    }
    if names != {"llama.cpp"}:
        raise InputError("--llamacpp-profile: only with --engine llama.cpp (and no other engine)")
    if getattr(args, "drafter", "ngram") not in ("ngram", "draft-model"):
        raise InputError(
            f"--drafter {args.drafter}: --llamacpp-profile plans the draft model (draft-model)"
        )
    if args.k_max < 1 or args.k_max > MAX_K:
        raise InputError(f"--k-max: must lie in 1..{MAX_K}, got {args.k_max}")
    acceptance = parse_acceptance(args.acceptance)
    try:
        stat = f"{getattr(args, 'llamacpp_statistic', 'median') or 'median'}_ms"
        rows_fit = getattr(args, "llamacpp_rows", "median") or "median"
        prof = load_llamacpp_profile(args.llamacpp_profile, statistic=stat, rows_fit=rows_fit)
    except InputError as exc:
        raise exc.as_flag("--llamacpp-profile") from None
    overhead: tuple[float, ...] = (0.0, 0.0)
    if getattr(args, "llamacpp_overhead", None) is not None:
        parts = str(args.llamacpp_overhead).split(",")
        try:
            overhead = tuple(float(x) for x in parts)
            if len(parts) not in (2, 3, 4) or not all(np.isfinite(x) and x >= 0 for x in overhead):
                raise ValueError
        except (ValueError, IndexError):
            raise InputError(
                f"--llamacpp-overhead: {args.llamacpp_overhead!r} is not two to four non-negative "
                "ms 'PLAIN_MS,ROUND_MS[,TOKEN_MS[,EMIT_MS]]'"
            ) from None
    notes = []
    top = min(len(prof.target.get(args.context, [0])), len(prof.draft.get(args.context, [0])))
    k_max = args.k_max
    if (
        prof.draft
        and args.context in prof.target
        and args.context in prof.draft
        and top - 1 < k_max
    ):
        notes.append(f"k_max {top - 1}: the profile times passes of up to {top} tokens")
        k_max = top - 1
    target = args.target_model or "TARGET.gguf"
    draft = args.draft_model or "DRAFT.gguf"
    if not args.target_model:
        notes.append("no --target-model: TARGET.gguf stands for the target's GGUF file")
    if not args.draft_model:
        notes.append("no --draft-model: DRAFT.gguf stands for the draft model's GGUF file")
    try:
        settings = llamacpp_plan(
            prof,
            acceptance,
            depth=args.context,
            k_max=k_max,
            target_model=target,
            draft_model=draft,
            overhead=overhead,
            rows=not getattr(args, "llamacpp_last_row_only", False),
        )
    except InputError as exc:
        flag = {"depth": "--context", "k_max": "--k-max", "overhead": "--llamacpp-overhead"}.get(
            exc.argument or ""
        )
        raise (exc.as_flag(flag) if flag else exc.as_flag("--llamacpp-profile")) from None
    return {
        "kind": "llama.cpp",
        "notes": notes,
        "acceptance": [float(a) for a in acceptance],
        "engine": {"drafter": "draft-model", "settings": {"llama.cpp": settings}},
    }


def llamacpp_summary(data: dict[str, Any]) -> str:
    """The terminal summary of :func:`make_llamacpp_plan`'s plan."""
    s = data["engine"]["settings"]["llama.cpp"]
    K = s["k_max"]
    lines = [
        f"specmoe plan --engine llama.cpp: pass times of {s['profile']} ({s['statistic']}), "
        f"depth {s['depth']}, {s['threads']} thread(s)",
        f"  {s['model']}",
        *(f"  note: {x}" for x in data.get("notes", [])),
        "",
        _row("draft length k", range(K + 1), "{:8d}"),
        _row("target tau_T(k+1) ms", s["step_parts_ms"]["target"]),
        *(
            [_row("target rows r_T(k+1) ms", s["step_parts_ms"]["target_rows"])]
            if any(s["step_parts_ms"].get("target_rows", []))
            else []
        ),
        _row("draft's k drafts ms", s["step_parts_ms"]["draft_tokens"]),
        _row("draft re-eval ms", s["step_parts_ms"]["draft_reeval"]),
        *(
            [_row("server overhead ms", s["step_parts_ms"]["overhead"])]
            if any(s["step_parts_ms"].get("overhead", []))
            else []
        ),
        _row("step V(k) ms", s["step_ms"]),
        *(
            [
                f"  + {emit:.3f} ms per emitted token: a round costs V'(k) + {emit:.3f} G_a(k) at "
                f"acceptance a (V'(k) = V(k), V'(0) = V(0) - {emit:.3f}; the step points are V''s)"
            ]
            if (emit := s.get("overhead_ms", {}).get("emitted_token", 0.0))
            else []
        ),
        _row("step points a_j", [None, *s["step_points"]], "{:8.4f}"),
        "",
    ]
    for p in s["plans"]:
        head = f"a = {p['acceptance']:g}: "
        if p["pays"]:
            lines.append(head + f"k* = {p['draft_length']}, predicted speedup {p['speedup']:.3f}")
        else:
            best_other = max(p["speedup_by_k"][1:])
            lines.append(
                head + f"speculation does not pay (best k > 0 gives {best_other:.3f}): "
                "plain decoding"
            )
        lines.append(f"    {p['shell']}")
    lines += [f"note: {n}" for n in s.get("notes", [])]
    return "\n".join(lines)


def _run_llamacpp(args) -> int:
    from specmoe._io import atomic_write_json, atomic_write_text, dumps_json

    data = make_llamacpp_plan(args)
    text = llamacpp_summary(data)
    if args.out:
        out = Path(args.out)
        atomic_write_json(out / "plan.json", data)
        atomic_write_text(out / "summary.txt", text + "\n")
        _err(f"plan: wrote {out / 'plan.json'} and {out / 'summary.txt'}")
    print(dumps_json(data) if args.json else text)
    return 0


def _write_engine_files(plan: Any, out: Path) -> list[Path]:
    """The files the engine settings refer to (SGLang's adaptive config), written into --out."""
    from specmoe._io import atomic_write_json

    written = []
    eng = plan.engine
    dyn = ((eng.settings.get("sglang") or {}).get("dynamic") or {}) if eng else {}
    if dyn.get("available") and dyn.get("file"):
        path = out / dyn["file"]
        atomic_write_json(path, dyn["config"])
        written.append(path)
    return written


# ------------------------------------------------------------------------------------------
# the terminal summary


def _row(label: str, values, fmt: str | None = None, width: int = 24) -> str:
    """One table row; without ``fmt``, fixed-point with 4 significant digits of the largest
    finite value (an infinite one, e.g. a bound whose error reaches 1, prints as inf)."""
    values = list(values)
    if fmt is None:
        big = max((abs(v) for v in values if v is not None and np.isfinite(v)), default=0.0)
        dec = 3 if big == 0 else min(5, max(0, 3 - int(np.floor(np.log10(big)))))
        fmt = f"{{:8.{dec}f}}"
    cells = [(" " * 8 if v is None else fmt.format(v)) for v in values]
    return f"{label:<{width}}" + " ".join(cells)


def _whole_pass_lines(wp: Any, n: Any, acc: Any) -> list[str]:
    """The summary's section of the whole-pass prediction (a :class:`WholePassPlan`)."""
    pol = wp.policies
    lines = [
        f"whole-pass prediction: every operation's fit at depth {wp.context} on "
        f"{wp.num_layers} layers plus the expert operation; combined error up to "
        f"{wp.epsilon_max:.3f}" + ("" if wp.delta is None else f" (delta = {wp.delta:.3f})"),
        _row("  other ops ms", wp.ops_ms),
        _row("  verify ms, per-slot", pol["per_slot"].verify_ms),
        _row("  verify ms, dedup", pol["dedup"].verify_ms),
        _row("  bound (17) +/-, best", pol["best"].verify_band_ms),
        _row("  step points, best", pol["best"].step_points, "{:8.4f}"),
    ]
    if acc:
        lines.append(_row("  k*(a), best", pol["best"].best_k, "{:8d}"))
        sp = pol["best"].speedup
        i = int(np.argmax(sp))
        lines.append(f"  best speedup on the grid {sp[i]:.3f} at a = {acc[i]:g}")
    return lines


KERNEL_CELL = {"per_slot": "per-slot", "dedup": "grouped"}


def _engine_kernel_lines(engine_kernels: dict, n: Any) -> list[str]:
    """The kernel each engine runs per pass size, and its step points and k* under it."""
    device = next(iter(engine_kernels.values())).kernel.device
    lines = [
        f"kernel each engine runs on {device} (its rule read from its source; "
        "docs/engine-settings.md); grouped = the deduplicating kernel's bytes",
        _row("tokens per pass n", n, "{:8d}"),
    ]
    for ep in engine_kernels.values():
        ek = ep.kernel
        if ek.kernel is None:
            lines.append(f"  {ek.name:<22}unknown: {ek.note}")
        else:
            lines.append(_row(f"  {ek.name}", [KERNEL_CELL[x] for x in ek.kernel], "{:>8}"))
    for ep in engine_kernels.values():
        if ep.policy is not None:
            lines.append(_row(f"  step points, {ep.kernel.name}", ep.policy.step_points, "{:8.4f}"))
    return lines


def _engine_lines(eng: Any, n: Any) -> list[str]:
    """The engine settings at the expected acceptance: per engine its k* under its own kernel
    and the command lines (fixed, and the dynamic form where the engine has one)."""
    st = eng.settings
    lines = [
        f"engine settings at expected acceptance {eng.expected_acceptance:g}, drafter "
        f"{eng.drafter or 'ngram'} (each engine at its own k*, under the kernel it runs):"
    ]
    if eng.drafter is None:  # an older plan.json: the per-policy k* alone
        lines[0] = f"engine settings at expected acceptance {eng.expected_acceptance:g}:"
    for name in ("vllm", "sglang", "llama.cpp"):
        s = st.get(name)
        if not s:
            continue
        if "draft_length" not in s:  # a plan.json written before the engines' own settings
            lines.append(
                "  settings of an older specmoe plan, which today's engines refuse (no vLLM "
                "method, llama.cpp's removed --draft-max): run specmoe plan again"
            )
            break
        k = s["draft_length"]
        if name in eng.speedup:
            head = f"k* = {k}, predicted speedup {eng.speedup[name]:.3f}"
        else:
            head = f"k* = {k} (its kernel rule is unknown here)"
        lines.append(f"  {s['name']} ({s['release'].split(' (')[0]}): {head}")
        lines.append(f"    {s['shell']}" if s.get("shell") else "    no command: see the note")
        dyn = s.get("dynamic") or {}
        if dyn.get("available") and dyn.get("shell"):
            lines.append(f"    dynamic ({dyn['knob']}): {dyn['shell']}")
            if dyn.get("file"):
                lines.append(f"      {dyn['file']}: {json.dumps(dyn['config'])}")
        if dyn.get("note"):
            lines.append(
                f"    {'dynamic' if dyn.get('available') else 'no dynamic form'}: {dyn['note']}"
            )
        lines += [f"    note: {x}" for x in s.get("notes", [])]
        lines += [f"    needs: {x}" for x in s.get("needs", [])]
    if "best" in eng.draft_length:
        dd = st.get("dedup_from_pass_size")
        where = (
            f"per-slot below n = {dd}, deduplicating from it"
            if dd is not None
            else f"per-slot at every n up to {n[-1]}"
        )
        lines.append(
            f"  faster kernel per pass (best, {where}): k* = {eng.draft_length['best']}, "
            f"predicted speedup {eng.speedup['best']:.3f}: a kernel switch the engine would "
            "need; no engine has one"
        )
    return lines


def summary(plan: Any) -> str:
    """A short readable summary of a :class:`~specmoe.cost.plan.Plan` (or its plan.json dict)."""
    from specmoe.cost.plan import Plan

    pl = plan if isinstance(plan, Plan) else Plan.from_dict(plan)
    src = pl.sources
    bw = src.get("bandwidth", {})
    tr = src.get("trace", {})
    eps = pl.epsilon
    pol = pl.policies
    lines = [
        f"specmoe plan: {pl.model['name']} ({bw.get('dtype', '?')}), bandwidths measured on "
        f"{bw.get('device', '?')} {bw.get('device_name', '')}".rstrip(),
        f"  routing: {Path(tr.get('path', '?')).name} ({tr.get('num_layers', '?')} MoE layers, "
        f"{tr.get('tokens', '?')} tokens); context {pl.context}; k_max {pl.k_max}",
        f"  bandwidth error eps = {eps.used:.3f} (per-slot {eps.per_slot:.3f}, dedup "
        f"{eps.dedup:.3f})"
        + ("" if pl.delta is None else f"; step-time error delta = {pl.delta:.3f}"),
    ]
    lines += [f"  note: {n}" for n in pl.notes]
    n = pl.n
    eq22 = pl.verify_ms_eq22
    lines += [
        "",
        _row("tokens per pass n", n, "{:8d}"),
        _row("verify ms, per-slot", pol["per_slot"].verify_ms),
        _row("verify ms, dedup", pol["dedup"].verify_ms),
        *(
            [
                _row("  Eq. (22), per-slot", eq22["per_slot"]),
                _row("  Eq. (22), dedup", eq22["dedup"]),
            ]
            if eq22
            else []
        ),
        _row("saving ms S(n)", pl.saving.ms),
        _row("  bound (18) +/-", pl.saving.band_ms),
        _row("byte share u_bar(n)", pl.bytes.u_bar, "{:8.3f}"),
        _row("bandwidth ratio r(n)", pl.r, "{:8.3f}"),
    ]
    cross = pl.crossover
    robust = [nn for nn, ok in zip(n, pl.saving.kernel_decision_robust) if ok]
    if cross is None:
        lines.append(
            f"crossover: none up to n = {n[-1]}: the per-slot kernel is as fast or "
            f"faster at the longest passes"
        )
    else:
        lines.append(
            f"crossover: the deduplicating kernel is faster from n = {cross}"
            + (
                f" (the sign is certain under eps by Eq. (19) at n = {', '.join(map(str, robust))})"
                if robust
                else " (not certain under eps by Eq. (19) at any n)"
            )
        )
    lines += ["", "staircase: best draft length k*(a) (policy: the faster kernel per pass)"]
    for lvl in pol["best"].staircase:
        lines.append(f"  a in ({lvl.a_from:.4f}, {lvl.a_to:.4f})  k* = {lvl.k}")
    K = pl.k_max
    names = ("per_slot", "dedup", "best")
    lines += [
        _row("step points a_j", range(1, K + 1), "{:8d}"),
        *(_row(f"  {p}", pol[p].step_points, "{:8.4f}") for p in names),
        _row("a0 = V(1)/V(0) - 1", [pol[p].a0 for p in names], "{:8.4f}")
        + "   (per-slot, dedup, best)",
    ]
    acc = pl.acceptance
    lines.append("")
    for p in names:
        a1 = pol[p].step_points[0]
        sp = pol[p].speedup
        i = int(np.argmax(sp))
        bound = pol[p].speedup_bound[i]
        head = (
            f"{p:<9} speculation never pays (a_1 = 1)"
            if a1 >= 1.0
            else f"{p:<9} speculation pays for a > {a1:.4f} (a_1)"
        )
        tail = (
            ""
            if sp[i] <= 1.0
            else f"; best speedup on the grid {sp[i]:.3f} at a = {acc[i]:g}"
            + ("" if bound is None else f" (bound (21): {bound[0]:.3f} to {bound[1]:.3f})")
        )
        lines.append(head + tail)
    if pl.engine_kernels:
        lines += ["", *_engine_kernel_lines(pl.engine_kernels, n)]
    if pl.engine:
        lines += ["", *_engine_lines(pl.engine, n)]
    if pl.whole_pass is not None:
        lines += ["", *_whole_pass_lines(pl.whole_pass, n, acc)]
    return "\n".join(lines)
