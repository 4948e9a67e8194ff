"""The campaign of docs/runs-protocol-llamacpp.md: the whole-pass campaign's verify sweeps and
oracle throughput runs on llama.cpp (:class:`specmoe.engines.llamacpp_pass.LlamaCppEngine`),
scored against the prediction committed before them.

The pieces are those of ``scripts/whole_pass_campaign.py`` (the protocol's units and their
order, the committed-prediction check, the skip-or-run rule, the aggregation into the
``specmoe validate`` runs format), with one kernel setting: llama.cpp's CPU MUL_MAT_ID groups a
pass's rows by expert, so every verify unit times the dedup setting alone and ``verify.json``
holds ``"on"`` only.

Writes, under ``--out`` (default ``results/cpu/llamacpp/whole-pass``):

``runs_campaign.json``             command, machine, design, engine settings, the GGUF files
                                   (size, SHA-256 of their first 64 MiB, the RMSNorm epsilon
                                   llama.cpp reads), the SHA-256 of every committed prediction
                                   (field ``predictions``), every unit's status, load and
                                   available memory at its start and end
``<config>/units/<unit>.json``     the raw output of each finished unit (resumable)
``<config>/rounds/<unit>/...``     round logs of the throughput units (Parquet; Ū is NaN: the
                                   timed passes do not record routing)
``<config>/verify.json``, ``<config>/throughput.json``, ``<config>/tables.json``
                                   as ``scripts/whole_pass_campaign.py`` writes them

Configurations: ``llamacpp-bundled`` (``--bundled-gguf``, the bundled model exported by
``specmoe export --format gguf --outtype f32``) and ``llamacpp-lifted`` (``--lifted-gguf``, the
lift ``specmoe lift --layers 4 --dtype bf16`` exported as bf16). Prompts: validation documents
of the bundled corpus tokenized by the bundled tokenizer (llama.cpp tokenizes them identically:
results/cpu/llamacpp/README.md), the first with at least d + 256 tokens, cut to d.

The prompt's KV cache is filled once per unit and cropped back to the prompt between the
generations of a throughput unit (:class:`PromptCache`), as the protocol says; no prefill is
timed. Rerunning the same command skips finished units; an unfinished unit is rerun from its
start with its partial round logs deleted. ``--budget MIN`` starts no unit after MIN minutes.
``--quick`` runs a seconds-long subset of the bundled configuration into
``out/llamacpp-whole-pass-quick`` (no prediction needed).

Usage: ``python scripts/llamacpp_campaign.py [--configs llamacpp-bundled,llamacpp-lifted]
[--bundled-gguf F] [--lifted-gguf F] [--budget MIN] [--quick]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from measure_runs import skip_unit  # noqa: E402
from whole_pass_campaign import (  # noqa: E402
    ACCEPTANCE,  # noqa: F401 (the grid of its runs files)
    KS,  # noqa: F401
    NS,
    Models,
    Unit,
    add_campaign_args,
    add_run_args,
    aggregate,
    check_prediction,
    check_processor,
    design_of,
    finish_unit,
    open_record,
    oracle_generations,
    parse_design,
    record_qualifying,
    start_unit,
    too_few_prompts,
    units_of,
)

from specmoe._io import atomic_write_json, read_json  # noqa: E402

PROTOCOL = "docs/runs-protocol-llamacpp.md"
CLOCK = "cpu"
THREADS = 1
KV_TYPE = "f16"  # llama.cpp's default; a prediction benchmarked on another sets its own
N_CTX = 4096  # d = 2048 + 256 generated + the drafts of the last round fit
SETTINGS = (("dedup", "on"),)  # the one kernel setting and its key in the runs format
EPS_KEY = "olmoe.attention.layer_norm_rms_epsilon"
CACHE = Path.home() / ".cache" / "specmoe"
DEFAULT_GGUF = {
    "bundled": CACHE / "gguf" / "bundled-f32.gguf",
    "lifted": CACHE / "lifted" / "OLMoE-1B-7B-0125-4L-bf16.gguf",
}
LIFTED_MODEL = CACHE / "lifted" / "OLMoE-1B-7B-0125-4L-bf16"  # the lift's checkpoint


@dataclass(frozen=True)
class Config:
    """One configuration of the protocol; the fields ``units_of`` and ``aggregate`` read
    (name, depths, verify, throughput) are those of ``whole_pass_campaign.Config``.
    ``throughput_at``: another throughput design at some depths (the same repeats)."""

    name: str
    gguf: str  # bundled | lifted: which --*-gguf file
    label: str  # the runs files' model; the committed plan's model name replaces it
    depths: tuple[int, ...]
    verify: tuple[int, int]  # prompts, recorded repeats (one warm-up more)
    throughput: tuple[int, int, int]  # prompts, repeats, tokens
    throughput_at: tuple[tuple[int, tuple[int, int, int]], ...] = ()

    def at(self, depth: int) -> Config:
        """The configuration at one depth, with that depth's throughput design."""
        thr = dict(self.throughput_at).get(depth, self.throughput)
        if thr[1] != self.throughput[1]:
            raise ValueError(f"{self.name}: every depth needs the same throughput repeats")
        return dataclasses.replace(self, depths=(depth,), throughput=thr, throughput_at=())


CONFIGS = {
    "llamacpp-bundled": Config(
        "llamacpp-bundled", "bundled", "tiny_olmoe", (512, 2048), (32, 4), (8, 2, 128)
    ),
    "llamacpp-lifted": Config(
        "llamacpp-lifted", "lifted", "OLMoE-1B-7B-0125-4L-bf16", (512, 2048), (8, 3), (3, 1, 24),
        throughput_at=((2048, (2, 1, 16)),),
    ),
}  # fmt: skip
QUICK = {
    "llamacpp-bundled": Config("llamacpp-bundled", "bundled", "tiny_olmoe", (64,), (2, 1), (2, 1, 8)),
}  # fmt: skip


def units_of_config(cfg: Config, *, interleave: bool = False) -> list[Unit]:
    """The protocol's units in run order (``whole_pass_campaign.units_of`` depth by depth,
    each with its own throughput design). ``interleave``: at each depth the verify units are
    spread evenly among the throughput units (:func:`interleave_verify`) instead of all
    running first."""
    out: list[Unit] = []
    for d in cfg.depths:
        units = units_of(cfg.at(d))
        out += interleave_verify(units) if interleave else units
    return out


def interleave_verify(units: Sequence[Unit]) -> list[Unit]:
    """One depth's units with its V verify units spread evenly among its T throughput units:
    verify unit i (in its own order) runs right before throughput unit floor(i * T / V), so
    each stretch of the campaign holds both kinds and the two measured sides share the
    machine's level (round 11 found the verify units' first minutes 9-25% slower than the
    throughput units' next 26 on one core: results/cpu/llamacpp/round-passes/). Each kind
    keeps its own order; with no throughput unit the order is unchanged."""
    verify = [u for u in units if u.kind == "verify"]
    rest = [u for u in units if u.kind != "verify"]
    if not verify or not rest:
        return list(units)
    at: dict[int, list[Unit]] = {}
    for i, u in enumerate(verify):
        at.setdefault(i * len(rest) // len(verify), []).append(u)
    out: list[Unit] = []
    for j, u in enumerate(rest):
        out += at.get(j, [])
        out.append(u)
    return out


def _have(cfg: Config, models: Models) -> dict[int, tuple[int, int]]:
    """depth -> (verify prompts, throughput prompts) that qualify."""
    return {
        d: (
            len(models.prompts(d, cfg.verify[0])),
            len(models.prompts(d, cfg.at(d).throughput[0])),
        )
        for d in cfg.depths
    }


# ------------------------------------------------------------------------------------------
# the engine


class PromptCache:
    """A :class:`~specmoe.engines.llamacpp_pass.LlamaCppEngine` whose prompt stays in its KV
    cache between generations: ``new_cache`` hands back one cache of the timed context, and
    ``prefill`` of the prompt already there crops the cache back to it instead of decoding it
    again (any other prefill clears the cache first). The cached positions hold what a fresh
    prefill of the same tokens computes; only the prefill's time, never timed, is saved.
    Everything else is the engine's."""

    def __init__(self, engine: Any):
        self._engine = engine
        self._kv: Any = None
        self._prefix: tuple[int, ...] | None = None
        self.model = self  # what specmoe.engine.speculative.new_cache is given

    def new_cache(self) -> Any:
        if self._kv is None:
            self._kv = self._engine.model.new_cache()
        return self._kv

    def prefill(self, kv: Any, tokens: Sequence[int]) -> None:
        from specmoe.engine.speculative import crop_cache

        toks = tuple(int(t) for t in tokens)
        if toks and toks == self._prefix and kv.get_seq_length() >= len(toks):
            crop_cache(kv, len(toks))
            return
        crop_cache(kv, 0)
        self._prefix = None
        self._engine.prefill(kv, toks)
        self._prefix = toks

    @property
    def record_routing(self) -> bool:  # set on the engine (the routing pass of a probe)
        return self._engine.record_routing

    @record_routing.setter
    def record_routing(self, value: bool) -> None:
        self._engine.record_routing = value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def _gguf_record(path: Path) -> dict[str, Any]:
    """Size and the SHA-256 of the first 64 MiB of a GGUF file (its header and metadata, and
    the first tensors): enough to tell two exports apart, quick on a 3 GB file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(64 << 20))
    shown = str(path)
    home = str(Path.home())
    if shown.startswith(home + "/"):  # the record names no machine's home directory
        shown = "~" + shown[len(home) :]
    return {"path": shown, "bytes": path.stat().st_size, "sha256_first_64MiB": h.hexdigest()}


def gguf_eps(path: Path) -> float | None:
    """The RMSNorm epsilon stored in a GGUF file, read by llama.cpp's own gguf-py (the
    vendored copy, in a subprocess); libllama's metadata text rounds it to six decimals.
    None when the file has no such key or cannot be read."""
    from specmoe.engines import llamacpp

    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from gguf import GGUFReader;"
        "f = GGUFReader(sys.argv[2]).fields.get(sys.argv[3]);"
        "print('' if f is None else repr(float(f.contents())))"
    )
    src = llamacpp.cache_root() / "src" / "gguf-py"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(src), str(path), EPS_KEY], capture_output=True, text=True
    )
    try:
        return float(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else None
    except ValueError:
        return None


def _checkpoint_eps(model_dir: Path) -> float | None:
    try:
        return float(json.loads((model_dir / "config.json").read_text())["rms_norm_eps"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def open_engine(
    cfg: Config, gguf: Path, *, lifted_model: Path | None, kv_type: str = KV_TYPE
) -> tuple[Any, dict]:
    """The configuration's engine (one thread, flash attention off, the KV cache in
    ``kv_type``, thread CPU clock) and what the record says of it. The lifted GGUF gets the checkpoint's RMSNorm
    epsilon as an override only when the file holds another value (``specmoe export`` writes
    the checkpoint's)."""
    from specmoe.engines.llamacpp_pass import LlamaCppEngine

    info: dict[str, Any] = {"gguf": _gguf_record(gguf), "threads": THREADS, "kv_type": kv_type}
    info.update(n_ctx=N_CTX, clock=CLOCK, flash_attention=False, kernel="dedup")
    overrides: dict[str, float] = {}
    file_eps = gguf_eps(gguf)
    info["rms_norm_eps_in_gguf"] = file_eps
    want = _checkpoint_eps(lifted_model) if cfg.gguf == "lifted" and lifted_model else None
    info["rms_norm_eps_of_checkpoint"] = want
    if want is not None and (file_eps is None or abs(file_eps - want) > 1e-3 * want):
        overrides = {EPS_KEY: want}  # float32 in the file: equal to 1e-3 counts as the same
    info["overrides"] = overrides
    engine = LlamaCppEngine(
        gguf, n_ctx=N_CTX, threads=THREADS, kv_type=kv_type, clock=CLOCK, overrides=overrides
    )
    return PromptCache(engine), info


# ------------------------------------------------------------------------------------------
# units


def run_unit(
    unit: Unit,
    cfg: Config,
    engine: Any,
    models: Models,
    folder: Path,
    *,
    seed: int,
    prime: bool = False,
    train: int = 0,
) -> dict:
    """One unit on ``engine``: a verify sweep (the dedup setting alone) or one prompt's
    repeat of every (k, a) with the oracle draft, as ``whole_pass_campaign.run_unit``.
    ``prime``: each timed verify pass follows an untimed pass of its own tokens
    (``verify_passes(prime=True)``: llama.cpp reuses the graph, as in speculative rounds).
    ``train``: each timed verify pass the median of a train of passes of its size
    (``verify_passes(train=...)``)."""
    from specmoe.engine.measure import verify_passes

    count = cfg.verify[0] if unit.kind == "verify" else cfg.throughput[0]
    pid, ids = models.prompts(unit.depth, count)[unit.prompt]
    cpu0 = time.process_time()
    if unit.kind == "verify":
        out = verify_passes(
            engine,
            [(pid, ids)],
            settings=tuple(s for s, _ in SETTINGS),
            n_values=NS,
            repeats=cfg.verify[1],
            warmup=1,
            prime=prime,
            train=train,
        )
    else:
        gens = oracle_generations(
            engine, unit, (pid, ids), folder, cfg, cfg.label, seed, extra={"engine": "llama.cpp"}
        )
        out = {"generations": gens}
    out.update(
        prompt_id=pid,
        prompt_index=unit.prompt,
        repeat=unit.repeat,
        cpu_s=time.process_time() - cpu0,
    )
    return out


def redesign(
    table: dict[str, Config], names: Sequence[str], depths: str | None, design: str | None
) -> dict[str, Config]:
    """The named configurations with only ``depths`` (comma-separated, each one of the
    configuration's) and the throughput ``design`` ("P,R,T", positive integers) at every depth;
    a ValueError naming the flag when either is not that."""
    out = {}
    ds = thr = None
    if depths is not None:
        try:
            ds = tuple(int(x) for x in depths.split(","))
        except ValueError:
            raise ValueError(
                f"--depths: {depths!r} is not a comma-separated list of depths"
            ) from None
    if design is not None:
        thr = parse_design(design)
    for c in names:
        cfg = table[c]
        if ds is not None:
            bad = [d for d in ds if d not in cfg.depths]
            if bad:
                raise ValueError(f"--depths: {c} has the depths {list(cfg.depths)}, not {bad[0]}")
            cfg = dataclasses.replace(
                cfg, depths=ds, throughput_at=tuple(x for x in cfg.throughput_at if x[0] in ds)
            )
        if thr is not None:
            cfg = dataclasses.replace(cfg, throughput=thr, throughput_at=())
        out[c] = cfg
    return out


def level_probe(engine: Any, tokens: Sequence[int], depth: int) -> dict[str, Any]:
    """One cell of the whole-pass benchmark (:func:`specmoe.engines.llamacpp_ops.
    time_llamacpp_operations`: one repetition of every n at ``depth``, its cache the first
    ``depth`` of ``tokens``, each un-profiled pass after an untimed one of its own window), run
    just before a unit: the benchmark's own kind of pass, measured beside the runs (protocol,
    round 7). ``ms[n - 1]`` is that pass's time; the committed profile's ``pass_ms`` at the same
    depth is its reference (``scripts/llamacpp_level.py``). The cache is the one the runs use
    (a :class:`PromptCache`'s): the next prefill of a prompt decodes it afresh."""
    from specmoe.engines.llamacpp_ops import time_llamacpp_operations

    cpu0, t0 = time.process_time(), time.perf_counter()
    rec, _ = time_llamacpp_operations(
        engine, tokens, n_values=NS, depths=[depth], reps=1, warmup=0, progress=False, prime=True
    )
    return {
        "depth": depth,
        "n": list(NS),
        "ms": [float(x) for x in rec.ms["fwd"][0, :, 0]],
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.perf_counter() - t0,
    }


def probe_tokens(depths: Sequence[int]) -> list[int]:
    """The whole-pass benchmark's prompt (``specmoe bench --engine llama.cpp --whole-pass``:
    the first validation document with the deepest depth + 256 tokens) for a probe at
    ``depths``."""
    from specmoe.engine.models import load_tokenizer
    from specmoe.engine.runner import validation_prompts

    ((_, ids),) = validation_prompts(load_tokenizer("bundled"), count=1, context=max(depths) + 256)
    return [int(t) for t in ids]


# ------------------------------------------------------------------------------------------


def prediction_kv_type(cfg: str, folder: Path) -> str:
    """The KV cache type configuration ``cfg``'s prediction (in ``folder``) was benchmarked
    with (its profile's ``whole_pass.kv_type``; llama.cpp's default f16 where it says none):
    the units run the engine as the prediction timed it."""
    path = Path(folder) / cfg / "profile.json"
    try:
        wp = json.loads(path.read_text()).get("whole_pass") or {}
    except (OSError, ValueError, AttributeError):
        return KV_TYPE
    return str(wp.get("kv_type") or KV_TYPE)


def check_llamacpp_machine(cfg: str, folder: Path) -> str | None:
    """An error line when this processor or this llama.cpp is not the one configuration
    ``cfg``'s prediction (in ``folder``) was benchmarked on: the processor
    (:func:`whole_pass_campaign.check_processor`: its name, and its identity where the
    prediction records ``machine.json``) and the llama.cpp version of the profile."""
    from specmoe.engines import llamacpp

    path = Path(folder).resolve() / cfg / "profile.json"
    prof, err = check_processor(cfg, folder)
    if err:
        return err
    want = (prof.get("whole_pass") or {}).get("llama_cpp")
    if want and want != llamacpp.VERSION:
        return (
            f"{path}: {cfg}'s prediction benchmarked llama.cpp {want}; this is "
            f"{llamacpp.VERSION} (its units run only with the prediction's engine)"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_campaign_args(ap, "results/cpu/llamacpp/whole-pass", CONFIGS)
    ap.add_argument("--bundled-gguf", type=Path, default=DEFAULT_GGUF["bundled"])
    ap.add_argument("--lifted-gguf", type=Path, default=DEFAULT_GGUF["lifted"])
    ap.add_argument(
        "--lifted-model",
        type=Path,
        default=LIFTED_MODEL,
        help="the lift's checkpoint folder (its config.json's rms_norm_eps is checked against "
        "the GGUF's)",
    )
    ap.add_argument(
        "--verify-train",
        type=int,
        default=0,
        metavar="M",
        help="time each verify pass as the median of the last M - 1 of M passes of its size "
        "in a row on windows one token apart, as speculative rounds of one draft length make "
        "them (at least 2; not with --verify-graph-reuse); recorded in the design, and a "
        "folder's units are all run one way",
    )
    ap.add_argument(
        "--verify-graph-reuse",
        action="store_true",
        help="time each verify pass after an untimed pass of its own tokens, so that llama.cpp "
        "reuses its graph as speculative rounds of one draft length do (protocol, round 6); "
        "recorded in the design, and a folder's units are all run one way",
    )
    ap.add_argument(
        "--interleave-verify",
        action="store_true",
        help="at each depth, spread the verify units evenly among the throughput units "
        "instead of running them all first, so that both measured sides share the machine's "
        "level; recorded in the design, and a folder's units are all run one way",
    )
    ap.add_argument(
        "--level-probe",
        action="store_true",
        help="before each unit, one cell of the whole-pass benchmark at the unit's depth (its "
        "passes after one of their own size), recorded in the unit as level_probe (protocol, "
        "round 7: the benchmark's level beside the runs)",
    )
    ap.add_argument(
        "--depths",
        default=None,
        help="comma-separated: run only these of the configurations' depths (protocol, round 8)",
    )
    ap.add_argument(
        "--throughput-design",
        default=None,
        metavar="P,R,T",
        help="the throughput design at every depth run: prompts, repeats, tokens (protocol, "
        "round 8), instead of the configuration's",
    )
    ap.add_argument(
        "--aggregate-only",
        action="store_true",
        help="rewrite the named configurations' verify.json, throughput.json and tables.json "
        "from their finished units (e.g. after the runs format gained a field) and stop: no "
        "unit runs, the campaign record is not touched",
    )
    add_run_args(ap)
    args = ap.parse_args(argv)
    if args.verify_train and (args.verify_train < 2 or args.verify_graph_reuse):
        print(
            f"llamacpp_campaign: error: --verify-train: {args.verify_train}: must be at least 2, "
            "and not with --verify-graph-reuse",
            file=sys.stderr,
        )
        return 2
    table = QUICK if args.quick else CONFIGS
    names = list(QUICK) if args.quick else [c for c in args.configs.split(",") if c]
    bad = [c for c in names if c not in table]
    if bad:
        print(f"llamacpp_campaign: error: --configs: unknown {bad[0]!r}", file=sys.stderr)
        return 2
    try:
        table = {**table, **redesign(table, names, args.depths, args.throughput_design)}
    except ValueError as e:
        print(f"llamacpp_campaign: error: {e}", file=sys.stderr)
        return 2
    ggufs = {"bundled": args.bundled_gguf, "lifted": args.lifted_gguf}
    for c in names:
        path = ggufs[table[c].gguf]
        if not path.is_file():
            flag = f"--{table[c].gguf}-gguf"
            print(f"llamacpp_campaign: error: {flag}: {path}: no such file", file=sys.stderr)
            return 2
    out = args.out or ROOT / (
        "out/llamacpp-whole-pass-quick" if args.quick else "results/cpu/llamacpp/whole-pass"
    )
    record_path = out / "runs_campaign.json"
    if args.aggregate_only:
        models = Models({}, args.seed)  # prompts only: the bundled tokenizer
        for c in names:
            if not (out / c / "units").is_dir():
                print(f"llamacpp_campaign: error: --out: {out / c}: has no units", file=sys.stderr)
                return 2
            _aggregate(out / c, table[c], _have(table[c], models))
            print(f"{out / c}: runs files rewritten from its units", file=sys.stderr)
        return 0
    if record_path.exists():  # one way of timing the verify passes per folder
        before = read_json(record_path, "campaign record").get("design", {})
        for c in names:
            if c in before and any(
                before[c].get(k) is not None and before[c][k] != want
                for k, want in (
                    ("depths", list(table[c].depths)),
                    (
                        "throughput_at_depth",
                        {str(d): list(table[c].at(d).throughput) for d in table[c].depths},
                    ),
                )
            ):
                print(
                    f"llamacpp_campaign: error: --depths/--throughput-design: {record_path}: "
                    f"{c}'s units were run with another design",
                    file=sys.stderr,
                )
                return 2
            for key, flag, now in (
                ("verify_primed", "--verify-graph-reuse", args.verify_graph_reuse),
                ("level_probe", "--level-probe", args.level_probe),
                ("verify_train", "--verify-train", args.verify_train),
                ("verify_interleaved", "--interleave-verify", args.interleave_verify),
            ):
                was = before.get(c, {}).get(key, False) if c in before else None
                if was is not None and was != now:  # (a missing key: False, == 0)
                    how = "without it" if not was else "with it" if was is True else f"with {was}"
                    print(
                        f"llamacpp_campaign: error: {flag}: {record_path}: "
                        f"{c}'s units were run {how}",
                        file=sys.stderr,
                    )
                    return 2
    record = open_record(
        record_path,
        args,
        protocol=PROTOCOL,
        design={
            c: {
                **design_of(
                    table[c],
                    throughput_at_depth={
                        str(d): list(table[c].at(d).throughput) for d in table[c].depths
                    },
                ),
                "kernel_settings": [s for s, _ in SETTINGS],
                "verify_primed": args.verify_graph_reuse,
                "level_probe": args.level_probe,
                "verify_train": args.verify_train,
                "verify_interleaved": args.interleave_verify,
            }
            for c in names
        },
        command="python scripts/llamacpp_campaign.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        names=names,
    )
    out.mkdir(parents=True, exist_ok=True)
    if not args.quick:  # every named configuration's prediction, before any of its units
        for c in names:
            err = check_prediction(record, c, args.predictions)
            for extra in args.also_predictions:
                err = err or check_prediction(record, c, extra, also=True)
            err = err or check_llamacpp_machine(c, args.predictions)
            if err:
                print(f"llamacpp_campaign: error: {err}", file=sys.stderr)
                return 2
            # the runs files name the model as the committed plan does (specmoe validate
            # matches the two)
            name = _plan_model(args.predictions / c / "plan.json")
            if name:
                table = {**table, c: dataclasses.replace(table[c], label=name)}
        record["labels"] = {c: table[c].label for c in names}
    atomic_write_json(record_path, record)
    status = record.setdefault("units", {})
    models = Models({}, args.seed)  # prompts only: the bundled tokenizer
    start = time.perf_counter()
    for c in names:
        cfg, folder = table[c], out / c
        have = _have(cfg, models)
        record_qualifying(record, c, have)
        engine = None
        probe_ids = probe_tokens(cfg.depths) if args.level_probe else None
        try:
            for unit in units_of_config(cfg, interleave=args.interleave_verify):
                key = f"{c}/{unit.name}"
                done = folder / "units" / f"{unit.name}.json"
                if skip_unit(status, key, done, start, args.budget):
                    continue
                if too_few_prompts(status, key, unit, have):
                    continue
                if engine is None:
                    kv = KV_TYPE if args.quick else prediction_kv_type(c, args.predictions)
                    engine, info = open_engine(
                        cfg, ggufs[cfg.gguf], lifted_model=args.lifted_model, kv_type=kv
                    )
                    record.setdefault("engines", {})[c] = info
                probe = level_probe(engine, probe_ids, unit.depth) if probe_ids else None
                info, t0 = start_unit(record, record_path, key)
                result = run_unit(
                    unit, cfg.at(unit.depth), engine, models, folder, seed=args.seed,
                    prime=args.verify_graph_reuse, train=args.verify_train,
                )  # fmt: skip
                if probe is not None:
                    result["level_probe"] = probe
                finish_unit(result, unit, t0, done, info)
                _aggregate(folder, cfg, have)
                atomic_write_json(record_path, record)
                print(f"{key}: {result['wall_s']:.1f} s", file=sys.stderr, flush=True)
        finally:
            if engine is not None:
                engine.close()
        if (folder / "units").exists():
            _aggregate(folder, cfg, have)
    record["elapsed_min_last_invocation"] = (time.perf_counter() - start) / 60
    atomic_write_json(record_path, record)
    return 0


def _plan_model(plan: Path) -> str | None:
    """The model name of a committed plan (None when it has none)."""
    try:
        name = json.loads(plan.read_text())["model"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return name if isinstance(name, str) and name else None


def _aggregate(folder: Path, cfg: Config, have: dict[int, tuple[int, int]]) -> None:
    """``whole_pass_campaign.aggregate`` with the dedup setting alone (it reads the
    throughput repeats, the same at every depth, from ``cfg``; the prompts from ``have``)."""
    aggregate(folder, cfg.label, cfg, have, settings=SETTINGS, engine="llama.cpp")


if __name__ == "__main__":
    sys.exit(main())
