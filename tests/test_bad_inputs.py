"""Every subcommand through one table of bad inputs: exit 2, one error line naming the argument
or file, no traceback, nothing written under ``--out``.

Each case must fail in input checking, before any long computation. Commands that print
progress on stderr may print it before the error: for them the LAST line is the error (and no
line is a traceback); argparse's own errors come after its usage lines. Cases whose input would
be read without limit (``/dev/zero``, a sparse 8 GiB file) run in a child process with a memory
and time limit, so a missing guard fails the case instead of the machine.

Files are generated once per session (``bad`` fixture): truncated, bit-flipped, wrong JSON
types, NaN/inf values, huge, deeply nested, a pickle named .npz, a directory named .json.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specmoe.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIT = ROOT / "specmoe" / "data" / "traces" / "fit.npz"
TINY = ROOT / "specmoe" / "data" / "tiny_olmoe" / "config.json"
TINY_DIR = TINY.parent
PROFILE = ROOT / "results" / "cpu" / "bench" / "profile.json"  # the tiny model's shapes
PLAN = ROOT / "results" / "cpu" / "plan" / "plan.json"
RUNS = ROOT / "results" / "cpu" / "bundled-policy" / "rounds" / "ngram"
HUGE = str(10**14)
# numpy's repr of an array: "array(" or space-separated numbers in brackets ("[0.1 0.2")
NUMPY_REPR = re.compile(r"array\(|\[\s*-?\d[\d.e+-]*\s+-?\d")

# ------------------------------------------------------------------------------------------
# generated files


def _stats(base: dict, **change) -> dict:
    return {**json.loads(json.dumps(base)), **change}


@pytest.fixture(scope="session")
def bad(tmp_path_factory) -> dict[str, str]:
    from specmoe.formats.trace import open_trace
    from specmoe.routing.ipf import fit_moments, save_moments

    d = tmp_path_factory.mktemp("bad")
    raw = FIT.read_bytes()
    f: dict[str, Path] = {}

    def put(name: str, data: bytes | str) -> None:
        p = d / name
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        f[name.split(".")[0]] = p

    put("trunc.npz", raw[: len(raw) // 3])
    flipped = bytearray(raw)
    mid = len(raw) // 2
    flipped[mid : mid + 64] = bytes(b ^ 0xFF for b in flipped[mid : mid + 64])
    put("flip.npz", bytes(flipped))
    put("pickled.npz", pickle.dumps({"experts": np.arange(8)}))
    put("text.npz", "not a trace at all\n")
    put("nested.json", "[" * 200_000 + "]" * 200_000)
    put("empty.json", "")
    put("file.txt", "an existing file\n")
    huge = d / "huge.json"
    with open(huge, "wb") as fh:
        fh.truncate(8 << 30)  # sparse: 8 GiB of zeros on disk in no time
    f["huge"] = huge
    (d / "folder.json").mkdir()
    f["folder"] = d / "folder.json"

    stats_path = save_moments(fit_moments(open_trace(FIT), max_lag=8), d / "stats.json")
    f["stats"] = stats_path
    good = json.loads(stats_path.read_text())
    zero = _stats(good)
    zero["popularity"] = [[0.0] * 64 for _ in good["popularity"]]
    nan = _stats(good)
    nan["popularity"][0][0] = float("nan")
    inf = _stats(good)
    inf["coactivation"][0][0][0] = float("inf")
    for name, obj in {
        "stats_sum8": _stats(good, top_k=2),  # popularities sum to 8
        "stats_zero": zero,
        "stats_types": _stats(good, num_experts="sixty-four"),
        "stats_poptype": _stats(good, popularity="high"),
        "stats_nan": nan,
        "stats_inf": inf,
        "stats_list": [1, 2, 3],
    }.items():
        put(f"{name}.json", json.dumps(obj))  # json writes NaN / Infinity literals

    prof = json.loads(PROFILE.read_text())
    put("profile_types.json", json.dumps({**prof, "beta_slot": "fast"}))
    put("profile_nan.json", json.dumps({**prof, "ceiling_gbps": float("nan")}))
    cfg = json.loads(TINY.read_text())
    for name, change in {
        "cfg_types": {"hidden_size": "big"},
        "cfg_neg": {"hidden_size": -128},
        "cfg_topk": {"num_experts_per_tok": 65},
    }.items():
        (d / name).mkdir()
        (d / name / "config.json").write_text(json.dumps({**cfg, **change}))
        f[name] = d / name
    plan = json.loads(PLAN.read_text())
    put("plan_types.json", json.dumps({**plan, "n": "one to nine", "k_max": [8]}))
    for name, content in {"runs_text": b"not parquet", "runs_trunc": None}.items():
        (d / name).mkdir()
        if content is None:
            part = next(RUNS.rglob("*.parquet"))
            content = part.read_bytes()[:200]
        (d / name / "part-0.parquet").write_bytes(content)
        f[name] = d / name
    (d / "runs_nested").mkdir()  # a measured-runs folder whose JSON is nested too deep
    for name in ("verify.json", "throughput.json"):
        (d / "runs_nested" / name).write_text("[" * 200_000 + "]" * 200_000)
    f["runs_nested"] = d / "runs_nested"
    (d / "run_nested").mkdir()  # a run folder whose run.json is nested too deep
    (d / "run_nested" / "run.json").write_text("[" * 200_000 + "]" * 200_000)
    f["run_nested"] = d / "run_nested"
    (d / "runs_empty").mkdir()
    f["runs_empty"] = d / "runs_empty"
    f.update(fit=FIT, tiny=TINY, tiny_dir=TINY_DIR, profile=PROFILE, plan=PLAN, runs=RUNS)
    return {k: str(v) for k, v in f.items()}


# ------------------------------------------------------------------------------------------
# the table: (id, argv, words the error line must hold, marks)

SLOW = pytest.mark.slow
CHILD = "child"  # run in a child process with memory and time limits

# every case may use {out} (a fresh path that must stay empty) and {<name>} of the bad files
CASES: list[tuple[str, str, tuple[str, ...], tuple]] = [
    # --- stats
    ("stats-max-n-0", "stats {fit} --max-n 0 --out {out}", ("--max-n",), ()),
    ("stats-max-n-neg", "stats {fit} --max-n -3 --out {out}", ("--max-n",), ()),
    ("stats-max-n-huge", f"stats {{fit}} --max-n {HUGE} --out {{out}}", ("--max-n",), ()),
    ("stats-max-lag-0", "stats {fit} --max-lag 0 --out {out}", ("--max-lag",), ()),
    ("stats-max-lag-huge", f"stats {{fit}} --max-lag {HUGE} --out {{out}}", ("--max-lag",), ()),
    ("stats-bootstrap-neg", "stats {fit} --bootstrap -1 --out {out}", ("--bootstrap",), ()),
    (
        "stats-bootstrap-huge",
        f"stats {{fit}} --bootstrap {HUGE} --out {{out}}",
        ("--bootstrap",),
        (),
    ),
    ("stats-seed-neg", "stats {fit} --bootstrap 2 --seed -1 --out {out}", ("--seed",), ()),
    ("stats-trunc", "stats {trunc} --out {out}", ("trunc.npz",), ()),
    ("stats-flip", "stats {flip} --out {out}", ("flip.npz",), ()),
    ("stats-pickle", "stats {pickled} --out {out}", ("pickled.npz",), ()),
    ("stats-text-npz", "stats {text} --out {out}", ("text.npz",), ()),
    ("stats-missing", "stats {out}/nothing.npz", ("nothing.npz",), ()),
    ("stats-out-file", "stats {fit} --out {file}", ("--out", "file.txt"), ()),
    ("stats-out-proc", "stats {fit} --out /proc/x", ("--out", "/proc/x"), ()),
    (
        "stats-model-nested",
        "stats {fit} --model {nested} --out {out}",
        ("nested.json",),
        (),
    ),
    (
        "stats-model-devzero",
        "stats {fit} --model /dev/zero --out {out}",
        ("/dev/zero",),
        (CHILD,),
    ),
    # --- ipf
    ("ipf-max-n-1", "ipf {fit} --max-n 1 --out {out}", ("--max-n",), ()),
    ("ipf-max-n-16", "ipf {fit} --max-n 16 --out {out}", ("--max-n", "16"), ()),
    ("ipf-max-n-huge", f"ipf {{fit}} --max-n {HUGE} --out {{out}}", ("--max-n",), ()),
    ("ipf-bins-0", "ipf {fit} --bins 0 --out {out}", ("--bins",), ()),
    ("ipf-tol-nan", "ipf {fit} --tol nan --out {out}", ("--tol",), ()),
    ("ipf-tol-inf", "ipf {fit} --tol inf --out {out}", ("--tol",), ()),
    ("ipf-tol-neg", "ipf {fit} --tol -1 --out {out}", ("--tol",), ()),
    ("ipf-max-iter-0", "ipf {fit} --max-iter 0 --out {out}", ("--max-iter",), ()),
    ("ipf-stats-sum8", "ipf {stats_sum8} --out {out}", ("stats_sum8.json", "popularity"), ()),
    ("ipf-stats-zero", "ipf {stats_zero} --out {out}", ("stats_zero.json", "popularity"), ()),
    ("ipf-stats-types", "ipf {stats_types} --out {out}", ("stats_types.json", "num_experts"), ()),
    (
        "ipf-stats-poptype",
        "ipf {stats_poptype} --out {out}",
        ("stats_poptype.json", "popularity"),
        (),
    ),
    ("ipf-stats-nan", "ipf {stats_nan} --out {out}", ("stats_nan.json", "popularity"), ()),
    ("ipf-stats-inf", "ipf {stats_inf} --out {out}", ("stats_inf.json", "coactivation"), ()),
    ("ipf-stats-list", "ipf {stats_list} --out {out}", ("stats_list.json",), ()),
    ("ipf-stats-empty", "ipf {empty} --out {out}", ("empty.json",), ()),
    ("ipf-stats-nested", "ipf {nested} --out {out}", ("nested.json",), ()),
    ("ipf-stats-folder", "ipf {folder} --out {out}", ("folder.json",), ()),
    ("ipf-stats-missing", "ipf {out}/none.json --out {out}", ("none.json",), ()),
    ("ipf-stats-huge", "ipf {huge} --out {out}", ("huge.json",), (CHILD,)),
    (
        "ipf-validate-trunc",
        "ipf {fit} --validate {trunc} --out {out}",
        ("trunc.npz",),
        (),
    ),
    ("ipf-out-file", "ipf {fit} --out {file}", ("--out", "file.txt"), ()),
    ("ipf-out-proc", "ipf {fit} --out /proc/x", ("--out", "/proc/x"), ()),
    # --- synth
    ("synth-tokens-0", "synth --from {stats} --tokens 0 --out {out}/s.npz", ("--tokens",), ()),
    ("synth-tokens-neg", "synth --from {stats} --tokens -5 --out {out}/s.npz", ("--tokens",), ()),
    (
        "synth-tokens-huge",
        f"synth --from {{stats}} --tokens {HUGE} --out {{out}}/s.npz",
        ("--tokens",),
        (),
    ),
    (
        "synth-seed-neg",
        "synth --from {stats} --tokens 10 --seed -1 --out {out}/s.npz",
        ("--seed",),
        (),
    ),
    (
        "synth-bins-0",
        "synth --from {stats} --tokens 10 --bins 0 --out {out}/s.npz",
        ("--bins",),
        (),
    ),
    (
        "synth-window-0",
        "synth --from {stats} --tokens 10 --window 0 --out {out}/s.npz",
        ("--window",),
        (),
    ),
    (
        "synth-window-huge",
        f"synth --from {{stats}} --tokens 10 --window {HUGE} --out {{out}}/s.npz",
        ("--window",),
        (),
    ),
    (
        "synth-max-lag-0",
        "synth --from {fit} --tokens 10 --max-lag 0 --out {out}/s.npz",
        ("--max-lag",),
        (),
    ),
    (
        "synth-doc-tokens-0",
        "synth --from {stats} --tokens 10 --doc-tokens 0 --out {out}/s.npz",
        ("--doc-tokens",),
        (),
    ),
    (
        "synth-sum8",
        "synth --from {stats_sum8} --tokens 10 --out {out}/s.npz",
        ("stats_sum8.json", "popularity"),
        (),
    ),
    (
        "synth-zero",
        "synth --from {stats_zero} --tokens 10 --out {out}/s.npz",
        ("stats_zero.json", "popularity"),
        (),
    ),
    (
        "synth-types",
        "synth --from {stats_types} --tokens 10 --out {out}/s.npz",
        ("stats_types.json", "num_experts"),
        (),
    ),
    (
        "synth-nan",
        "synth --from {stats_nan} --tokens 10 --out {out}/s.npz",
        ("stats_nan.json",),
        (),
    ),
    ("synth-nested", "synth --from {nested} --tokens 10 --out {out}/s.npz", ("nested.json",), ()),
    ("synth-folder", "synth --from {folder} --tokens 10 --out {out}/s.npz", ("folder.json",), ()),
    (
        "synth-pickle",
        "synth --from {pickled} --tokens 10 --out {out}/s.npz",
        ("pickled.npz",),
        (),
    ),
    (
        "synth-trunc",
        "synth --from {trunc} --tokens 10 --out {out}/s.npz",
        ("trunc.npz",),
        (),
    ),
    (
        "synth-out-proc",
        "synth --from {stats} --tokens 10 --out /proc/x/s.npz",
        ("--out", "/proc/x"),
        (),
    ),
    (
        "synth-out-dir",
        "synth --from {stats} --tokens 10 --out {folder}",
        ("--out", "folder.json"),
        (),
    ),
    (
        "synth-save-stats-proc",
        "synth --from {stats} --tokens 10 --save-stats /proc/x.json --out {out}/s.npz",
        ("--save-stats", "/proc/x.json"),
        (),
    ),
    # --- bench
    ("bench-device-tpu", "bench --model {tiny} --device tpu --out {out}", ("--device", "tpu"), ()),
    ("bench-layers-0", "bench --model {tiny} --layers 0 --out {out}", ("--layers",), ()),
    ("bench-reps-0", "bench --model {tiny} --reps 0 --out {out}", ("--reps",), ()),
    ("bench-windows-0", "bench --model {tiny} --windows 0 --out {out}", ("--windows",), ()),
    ("bench-n-max-0", "bench --model {tiny} --n-max 0 --out {out}", ("--n-max",), ()),
    ("bench-n-max-huge", f"bench --model {{tiny}} --n-max {HUGE} --out {{out}}", ("--n-max",), ()),
    ("bench-threads-0", "bench --model {tiny} --threads 0 --out {out}", ("--threads",), ()),
    ("bench-seed-neg", "bench --model {tiny} --seed -1 --out {out}", ("--seed",), ()),
    ("bench-dtype", "bench --model {tiny} --dtype garbage --out {out}", ("--dtype", "garbage"), ()),
    ("bench-kernels", "bench --model {tiny} --kernels nope --out {out}", ("--kernels", "nope"), ()),
    ("bench-trace-trunc", "bench --model {tiny} --trace {trunc} --out {out}", ("trunc.npz",), ()),
    ("bench-out-file", "bench --model {tiny} --out {file}", ("--out", "file.txt"), ()),
    ("bench-out-proc", "bench --model {tiny} --out /proc/x", ("--out", "/proc/x"), ()),
    (
        "bench-from-types",
        "bench --model {tiny} --from {profile_types} --out {out}",
        ("profile_types.json",),
        (),
    ),
    (
        "bench-from-nested",
        "bench --model {tiny} --from {nested} --out {out}",
        ("nested.json",),
        (),
    ),
    # --- plan (a given --bandwidth: no benchmark runs)
    (
        "plan-k-max-0",
        "plan --model {tiny} --bandwidth {profile} --k-max 0 --out {out}",
        ("--k-max",),
        (),
    ),
    (
        "plan-k-max-huge",
        f"plan --model {{tiny}} --bandwidth {{profile}} --k-max {HUGE} --out {{out}}",
        ("--k-max",),
        (),
    ),
    (
        "plan-context-neg",
        "plan --model {tiny} --bandwidth {profile} --context -1 --out {out}",
        ("--context",),
        (),
    ),
    (
        "plan-acceptance-nan",
        "plan --model {tiny} --bandwidth {profile} --acceptance nan --out {out}",
        ("--acceptance",),
        (),
    ),
    (
        "plan-acceptance-big",
        "plan --model {tiny} --bandwidth {profile} --acceptance 1.5 --out {out}",
        ("--acceptance",),
        (),
    ),
    (
        "plan-acceptance-grid-huge",
        "plan --model {tiny} --bandwidth {profile} --acceptance 0:0.9:0.0000000001 --out {out}",
        ("--acceptance",),
        (),
    ),
    (
        "plan-expected-inf",
        "plan --model {tiny} --bandwidth {profile} --expected-acceptance inf --out {out}",
        ("--expected-acceptance",),
        (),
    ),
    (
        "plan-draft-time-nan",
        "plan --model {tiny} --bandwidth {profile} --draft-time nan,nan --out {out}",
        ("--draft-time",),
        (),
    ),
    (
        "plan-draft-time-folder",
        "plan --model {tiny} --bandwidth {profile} --draft-time {folder} --out {out}",
        ("--draft-time", "folder.json"),
        (),
    ),
    (
        "plan-draft-time-devzero",
        "plan --model {tiny} --bandwidth {profile} --draft-time /dev/zero --out {out}",
        ("--draft-time", "/dev/zero"),
        (CHILD,),
    ),
    (
        "plan-draft-time-huge",
        "plan --model {tiny} --bandwidth {profile} --draft-time {huge} --out {out}",
        ("--draft-time", "huge.json"),
        (CHILD,),
    ),
    ("plan-device-tpu", "plan --model {tiny} --device tpu --out {out}", ("--device", "tpu"), ()),
    ("plan-dtype", "plan --model {tiny} --dtype garbage --out {out}", ("--dtype", "garbage"), ()),
    (
        "plan-trace-trunc",
        "plan --model {tiny} --bandwidth {profile} --trace {trunc} --out {out}",
        ("trunc.npz",),
        (),
    ),
    (
        "plan-trace-pickle",
        "plan --model {tiny} --bandwidth {profile} --trace {pickled} --out {out}",
        ("pickled.npz",),
        (),
    ),
    (
        "plan-bandwidth-types",
        "plan --model {tiny} --bandwidth {profile_types} --out {out}",
        ("profile_types.json",),
        (),
    ),
    (
        "plan-bandwidth-nan",
        "plan --model {tiny} --bandwidth {profile_nan} --out {out}",
        ("profile_nan.json",),
        (),
    ),
    (
        "plan-bandwidth-nested",
        "plan --model {tiny} --bandwidth {nested} --out {out}",
        ("nested.json",),
        (),
    ),
    (
        "plan-bandwidth-devzero",
        "plan --model {tiny} --bandwidth /dev/zero --out {out}",
        ("/dev/zero",),
        (CHILD,),
    ),
    (
        "plan-out-file",
        "plan --model {tiny} --bandwidth {profile} --out {file}",
        ("--out", "file.txt"),
        (),
    ),
    (
        "plan-out-proc",
        "plan --model {tiny} --bandwidth {profile} --out /proc/x",
        ("--out", "/proc/x"),
        (),
    ),
    (
        "plan-model-types",
        "plan --model {cfg_types} --bandwidth {profile} --out {out}",
        ("hidden_size",),
        (),
    ),
    # --- oracle
    ("oracle-l-max-0", "oracle --runs {runs} --l-max 0 --out {out}", ("--l-max",), ()),
    ("oracle-l-max-neg", "oracle --runs {runs} --l-max -1 --out {out}", ("--l-max",), ()),
    ("oracle-n-boot-neg", "oracle --runs {runs} --n-boot -1 --out {out}", ("--n-boot",), ()),
    (
        "oracle-n-boot-huge",
        f"oracle --runs {{runs}} --n-boot {HUGE} --out {{out}}",
        ("--n-boot",),
        (),
    ),
    ("oracle-seed-neg", "oracle --runs {runs} --seed -1 --out {out}", ("--seed",), ()),
    ("oracle-runs-missing", "oracle --runs {out}/none --out {out}", ("none",), ()),
    ("oracle-runs-empty", "oracle --runs {runs_empty} --out {out}", ("runs_empty",), ()),
    (
        "oracle-runs-text",
        "oracle --runs {runs_text} --out {out}",
        ("part-0.parquet",),
        (),
    ),
    (
        "oracle-runs-trunc",
        "oracle --runs {runs_trunc} --out {out}",
        ("part-0.parquet",),
        (),
    ),
    ("oracle-out-file", "oracle --runs {runs} --out {file}", ("--out", "file.txt"), ()),
    ("oracle-out-proc", "oracle --runs {runs} --out /proc/x", ("--out", "/proc/x"), ()),
    # --- policy
    ("policy-l-max-0", "policy --runs {runs} --l-max 0 --out {out}", ("--l-max",), ()),
    (
        "policy-test-fraction-nan",
        "policy --runs {runs} --test-fraction nan --out {out}",
        ("--test-fraction",),
        (),
    ),
    (
        "policy-test-fraction-big",
        "policy --runs {runs} --test-fraction 1.5 --out {out}",
        ("--test-fraction",),
        (),
    ),
    ("policy-repeats-0", "policy --runs {runs} --repeats 0 --out {out}", ("--repeats",), ()),
    (
        "policy-repeats-huge",
        f"policy --runs {{runs}} --repeats {HUGE} --out {{out}}",
        ("--repeats",),
        (),
    ),
    ("policy-decay-nan", "policy --runs {runs} --decay nan --out {out}", ("--decay",), ()),
    ("policy-seed-neg", "policy --runs {runs} --seed -1 --out {out}", ("--seed",), ()),
    ("policy-runs-empty", "policy --runs {runs_empty} --out {out}", ("runs_empty",), ()),
    ("policy-out-file", "policy --runs {runs} --out {file}", ("--out", "file.txt"), ()),
    ("policy-out-proc", "policy --runs {runs} --out /proc/x", ("--out", "/proc/x"), ()),
    # --- report
    ("report-dir-missing", "report {out}/none --out {out}/r.html", ("none",), ()),
    ("report-dir-file", "report {file} --out {out}/r.html", ("file.txt", "is not a folder"), ()),
    ("report-out-proc", "report {runs_empty} --out /proc/x/r.html", ("--out", "/proc/x"), ()),
    ("report-out-dir", "report {runs_empty} --out {folder}", ("--out", "folder.json"), ()),
    # --- campaign
    ("campaign-missing", "campaign {out}/nothing.json --out {out}", ("nothing.json",), ()),
    ("campaign-empty", "campaign {empty} --out {out}", ("empty.json",), ()),
    ("campaign-nested", "campaign {nested} --out {out}", ("nested.json",), ()),
    ("campaign-list", "campaign {stats_list} --out {out}", ("stats_list.json", "units"), ()),
    ("campaign-folder", "campaign {folder} --out {out}", ("folder.json",), ()),
    ("campaign-out-file", "campaign {stats_list} --out {file}", ("file.txt",), ()),
    # --- acceptance
    ("acc-empty", "acceptance {empty} --out {out}", ("empty.json", "empty"), ()),
    ("acc-text", "acceptance {file}", ("file.txt", "not an engine metrics file"), ()),
    ("acc-nested", "acceptance {nested} --out {out}", ("nested.json",), ()),
    ("acc-folder", "acceptance {folder} --out {out}", ("folder.json", "directory"), ()),
    ("acc-plan", "acceptance {plan} --out {out}", ("plan.json", "no speculative"), ()),
    ("acc-huge", "acceptance {huge} --out {out}", ("huge.json", "limit"), (CHILD,)),
    ("acc-devzero", "acceptance /dev/zero --out {out}", ("/dev/zero",), (CHILD,)),
    ("acc-k-0", "acceptance {plan} --draft-length 0 --out {out}", ("--draft-length",), ()),
    ("acc-conf", "acceptance {plan} --confidence 1 --out {out}", ("--confidence",), ()),
    ("acc-out-dir", "acceptance {plan} --out {folder}", ("--out", "folder.json"), ()),
    # --- efficiency (checked before any model is built)
    ("eff-batch-0", "efficiency --model {tiny_dir} --batch 0 --out {out}", ("--batch",), ()),
    ("eff-k-0", "efficiency --model {tiny_dir} --k 0 --out {out}", ("--k",), ()),
    (
        "eff-acceptance-nan",
        "efficiency --model {tiny_dir} --acceptance nan --out {out}",
        ("--acceptance",),
        (),
    ),
    (
        "eff-draft-cost-inf",
        "efficiency --model {tiny_dir} --draft-cost inf --out {out}",
        ("--draft-cost",),
        (),
    ),
    (
        "eff-tokens-huge",
        f"efficiency --model {{tiny}} --tokens {HUGE} --out {{out}}",
        ("--tokens",),
        (),
    ),
    (
        "eff-batch-huge",
        f"efficiency --model {{tiny}} --batch {HUGE} --out {{out}}",
        ("--batch",),
        (),
    ),
    (
        "eff-device-tpu",
        "efficiency --model {tiny_dir} --device tpu --out {out}",
        ("--device", "tpu"),
        (),
    ),
    ("eff-seed-neg", "efficiency --model {tiny_dir} --seed -1 --out {out}", ("--seed",), ()),
    (
        "eff-layers-0",
        "efficiency --model OLMoE-1B-7B-0125 --layers 0 --out {out}",
        ("--layers",),
        (),
    ),
    (
        "eff-stats-sum8",
        "efficiency --model {tiny_dir} --routing ipf-skewed --stats {stats_sum8} --out {out}",
        ("stats_sum8.json", "popularity"),
        (),
    ),
    (
        "eff-routing-missing",
        "efficiency --model {tiny_dir} --routing {out}/none.npz --out {out}",
        ("none.npz",),
        (),
    ),
    ("eff-out-file", "efficiency --model {tiny_dir} --out {file}", ("--out", "file.txt"), ()),
    ("eff-out-proc", "efficiency --model {tiny_dir} --out /proc/x", ("--out", "/proc/x"), ()),
    # --- spec
    ("spec-missing", "spec no-such-model", ("no-such-model",), ()),
    ("spec-dtype", "spec {tiny} --dtype garbage", ("--dtype", "garbage"), ()),
    ("spec-dtype-fp7", "spec {tiny} --dtype fp7", ("--dtype", "fp7"), ()),
    ("spec-cfg-types", "spec {cfg_types}", ("hidden_size",), ()),
    ("spec-cfg-neg", "spec {cfg_neg}", ("hidden_size",), ()),
    ("spec-cfg-topk", "spec {cfg_topk}", ("num_experts_per_tok",), ()),
    ("spec-nested", "spec {nested}", ("nested.json",), ()),
    ("spec-devzero", "spec /dev/zero", ("/dev/zero",), (CHILD,)),
    # --- convert
    ("convert-trunc", "convert {trunc} {out}/t.npz", ("trunc.npz",), ()),
    ("convert-pickle", "convert {pickled} {out}/t.npz", ("pickled.npz",), ()),
    ("convert-out-proc", "convert {fit} /proc/x/t.npz", ("/proc/x",), ()),
    ("convert-out-dir", "convert {fit} {folder}", ("folder.json",), ()),
    # --- validate
    (
        "validate-plan-types",
        "validate --plan {plan_types} --runs {runs} --out {out}",
        ("plan_types.json",),
        (),
    ),
    (
        "validate-plan-nested",
        "validate --plan {nested} --runs {runs} --out {out}",
        ("nested.json",),
        (),
    ),
    (
        "validate-plan-devzero",
        "validate --plan /dev/zero --runs {runs} --out {out}",
        ("--plan", "/dev/zero"),
        (CHILD,),
    ),
    (
        "validate-plan-huge",
        "validate --plan {huge} --runs {runs} --out {out}",
        ("--plan", "huge.json", "MiB"),
        (CHILD,),
    ),
    (
        "validate-runs-nested",
        "validate --plan {plan} --runs {runs_nested} --out {out}",
        ("verify.json", "nested"),
        (),
    ),
    (
        "validate-runs-missing",
        "validate --plan {plan} --runs {out}/none --out {out}",
        ("none",),
        (),
    ),
    (
        "validate-out-file",
        "validate --plan {plan} --runs {runs} --out {file}",
        ("--out", "file.txt"),
        (),
    ),
    (
        "validate-out-proc",
        "validate --plan {plan} --runs {runs} --out /proc/x",
        ("--out", "/proc/x"),
        (),
    ),
    # --- capture and run (checked before a model loads)
    ("capture-tokens-0", "capture --model bundled --tokens 0 --out {out}", ("--tokens",), ()),
    (
        "capture-tokens-huge",
        f"capture --model bundled --tokens {HUGE} --out {{out}}",
        ("--tokens",),
        (SLOW,),
    ),
    (
        "capture-seed-neg",
        "capture --model bundled --tokens 8 --seed -1 --out {out}",
        ("--seed",),
        (),
    ),
    (
        "capture-device-tpu",
        "capture --model bundled --tokens 8 --device tpu --out {out}",
        ("--device", "tpu"),
        (),
    ),
    (
        "capture-out-file",
        "capture --model bundled --tokens 8 --out {file}",
        ("--out", "file.txt"),
        (),
    ),
    (
        "capture-out-proc",
        "capture --model bundled --tokens 8 --out /proc/x",
        ("--out", "/proc/x"),
        (),
    ),
    ("run-tokens-0", "run --model bundled --tokens 0 --out {out}", ("--tokens",), ()),
    (
        "run-tokens-huge",
        f"run --model bundled --tokens {HUGE} --out {{out}}",
        ("--tokens",),
        (),
    ),
    ("run-seed-neg", "run --model bundled --seed -1 --out {out}", ("--seed",), ()),
    (
        "run-device-tpu",
        "run --model bundled --device tpu --out {out}",
        ("--device", "tpu"),
        (),
    ),
    ("run-k-big", "run --model bundled --k 99 --out {out}", ("--k",), ()),
    (
        "run-acceptance-nan",
        "run --model bundled --acceptance nan --out {out}",
        ("--acceptance",),
        (),
    ),
    ("run-out-file", "run --model bundled --out {file}", ("--out", "file.txt"), ()),
    (
        "run-manifest-nested",
        "run --model bundled --out {run_nested}",
        ("--out", "run.json", "nested"),
        (),
    ),
    ("run-out-proc", "run --model bundled --out /proc/x", ("--out", "/proc/x"), ()),
    # --- inertia, stops
    ("inertia-runs-missing", "inertia --runs {out}/none --out {out}", ("none",), ()),
    ("inertia-runs-text", "inertia --runs {runs_text} --out {out}", ("part-0.parquet",), ()),
    ("inertia-max-step-0", "inertia --runs {runs} --max-step 0 --out {out}", ("--max-step",), ()),
    ("inertia-n-boot-neg", "inertia --runs {runs} --n-boot -1 --out {out}", ("--n-boot",), ()),
    (
        "inertia-conf-nan",
        "inertia --runs {runs} --confidence nan --out {out}",
        ("--confidence",),
        (),
    ),
    ("inertia-out-file", "inertia --runs {runs} --out {file}", ("--out", "file.txt"), ()),
    ("stops-runs-missing", "stops --runs {out}/none --out {out}", ("none",), ()),
    ("stops-runs-empty", "stops --runs {runs_empty} --out {out}", ("runs_empty",), ()),
    ("stops-l-max-0", "stops --runs {runs} --l-max 0 --out {out}", ("--l-max",), ()),
    ("stops-seed-neg", "stops --runs {runs} --seed -1 --out {out}", ("--seed",), ()),
    ("stops-out-proc", "stops --runs {runs} --out /proc/x", ("--out", "/proc/x"), ()),
    # --- drafters, transfer
    ("drafters-batch-0", "drafters --batch 0 --out {out}", ("--batch",), ()),
    ("drafters-layers-text", "drafters --draft-layers one --out {out}", ("--draft-layers",), ()),
    ("drafters-tol-nan", "drafters --tol nan --out {out}", ("--tol",), ()),
    ("drafters-model-missing", "drafters --model {out}/none --out {out}", ("--model",), ()),
    ("drafters-experts-1", "drafters --num-experts 1 --out {out}", ("--num-experts",), ()),
    (
        "drafters-efficiency-missing",
        "drafters --efficiency {out}/none.json --out {out}",
        ("--efficiency",),
        (),
    ),
    ("drafters-efficiency-text", "drafters --efficiency {file} --out {out}", ("--efficiency",), ()),
    ("drafters-out-proc", "drafters --out /proc/x", ("--out", "/proc/x"), ()),
    ("transfer-profiles-missing", "transfer --profiles {out}/none --out {out}", ("none",), ()),
    ("transfer-one-model", "transfer --profiles {profile} --out {out}", ("--profiles",), ()),
    (
        "transfer-forms",
        "transfer --profiles {profile} --forms cubic --out {out}",
        ("--forms", "cubic"),
        (),
    ),
    ("transfer-profile-text", "transfer --profiles {file} --out {out}", ("file.txt",), ()),
    ("transfer-out-proc", "transfer --profiles {profile} --out /proc/x", ("--out", "/proc/x"), ()),
    # --- export
    ("export-outtype", "export --out {out}/m.gguf --outtype q4", ("--outtype", "q4"), ()),
    ("export-out-proc", "export --out /proc/x/m.gguf", ("--out", "/proc/x"), ()),
    ("export-out-dir", "export --out {folder}", ("--out", "folder.json"), ()),
    ("export-model-file", "export --model {file} --out {out}/m.gguf", ("file.txt",), ()),
    # --- lift
    ("lift-layers-below", "lift --layers 2 --out {out}", ("--layers", "2"), ()),
    ("lift-layers-0", "lift --layers 0 --out {out}", ("--layers",), ()),
    ("lift-hidden-below", "lift --hidden 64 --out {out}", ("--hidden", "64"), ()),
    ("lift-dtype", "lift --dtype fp8 --out {out}", ("--dtype", "fp8"), ()),
    ("lift-heads", "lift --heads 3 --out {out}", ("--heads", "3"), ()),
    ("lift-preset", "lift --preset nope --out {out}", ("nope",), ()),
    ("lift-model-file", "lift --model {file} --out {out}", ("file.txt",), ()),
]


def _params():
    for cid, argv, words, marks in CASES:
        pmarks = [m for m in marks if m is not CHILD]
        yield pytest.param(argv, words, CHILD in marks, id=cid, marks=pmarks)


class _TooLong(BaseException):
    """Raised by the alarm: a case that computes instead of failing its input check."""


def _alarm(signum, frame):
    raise _TooLong("the case ran past 30 s: the bad input was not refused up front")


def _invoke(argv: list[str], capsys) -> tuple[int, str, str]:
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(30)
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse rejects a value itself
        rc = exc.code if isinstance(exc.code, int) else 1
    except _TooLong as exc:
        rc = -1
        print(exc, file=sys.stderr)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _invoke_child(argv: list[str], env: dict) -> tuple[int, str, str]:
    limit = 3 << 30  # 3 GiB of address space: a read without limit fails, it cannot run away
    code = (
        f"import resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); "
        "from specmoe.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, *argv],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return -1, "", "timed out after 60 s\n"
    return proc.returncode, proc.stdout, proc.stderr


def check_error(verb: str, rc: int, out: str, err: str, words: tuple[str, ...]) -> str:
    """Assert exit 2, no traceback, and the last stderr line is the error naming ``words``;
    any earlier lines are the verb's progress or argparse's usage. Returns the error line."""
    lines = err.strip().splitlines()
    assert rc == 2, f"exit {rc}, stderr:\n{err[-2000:]}"
    assert "Traceback" not in err, err[-2000:]
    assert lines, "nothing on stderr"
    last = lines[-1]
    assert last.startswith(f"specmoe {verb}: error: "), f"last line {last!r}"
    errors = [ln for ln in lines if ln.startswith("specmoe ") and ": error:" in ln]
    assert errors == [last], f"more than one error line: {errors}"
    for word in words:
        assert word in last, f"{word!r} not named in {last!r}"
    assert not NUMPY_REPR.search(last), f"a numpy array printed into the error: {last!r}"
    assert len(last) < 600, f"an error line of {len(last)} characters"
    assert out == "", f"stdout not empty: {out[:200]!r}"
    return last


@pytest.mark.parametrize(("argv", "words", "child"), list(_params()))
def test_bad_input_is_one_line_exit_2(argv, words, child, bad, tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECMOE_CACHE_DIR", str(cache))
    out = tmp_path / "out"
    names = {**bad, "out": str(out), "file": bad["file"]}
    args = [a.format(**names) for a in argv.split()]
    file_before = Path(bad["file"]).read_bytes()
    if child:
        env = {**os.environ, "SPECMOE_CACHE_DIR": str(cache)}
        rc, so, se = _invoke_child(args, env)
    else:
        rc, so, se = _invoke(args, capsys)
    check_error(args[0], rc, so, se, words)
    # nothing written: the fresh --out stays absent (or an empty folder), the existing file
    # given as --out is unchanged, and no benchmark profile was cached
    if out.exists():
        assert out.is_dir() and not any(out.iterdir()), sorted(out.rglob("*"))
    assert Path(bad["file"]).read_bytes() == file_before
    assert not cache.exists() or not any(cache.rglob("*.json"))


def test_every_command_has_cases():
    from specmoe.cli import COMMANDS

    verbs = {argv.split()[0] for _, argv, _, _ in CASES}
    assert verbs == set(COMMANDS), set(COMMANDS) ^ verbs


def test_check_error_rejects_what_the_contract_forbids():
    ok = "specmoe ipf: error: --max-n: must be >= 2, got 1"
    check_error("ipf", 2, "", "ipf: fitting\n" + ok + "\n", ("--max-n",))
    for rc, err, words in [
        (1, ok, ()),  # exit 1
        (2, "Traceback (most recent call last):\n" + ok, ()),
        (2, ok + "\nspecmoe ipf: error: again", ()),  # the error is not the last line
        (2, "specmoe ipf: error: one\n" + ok, ()),  # two error lines
        (2, ok, ("--bins",)),  # the argument is not named
        (2, "specmoe ipf: error: popularity [0.25 0.5  0.25] is bad", ()),  # a numpy array
        (2, "specmoe ipf: error: x " + "y" * 700, ()),  # a line too long to read
    ]:
        with pytest.raises(AssertionError):
            check_error("ipf", rc, "", err, words)


def test_fixture_files_are_what_they_claim(bad):
    assert Path(bad["trunc"]).stat().st_size < FIT.stat().st_size
    assert Path(bad["huge"]).stat().st_size == 8 << 30
    assert json.loads(Path(bad["stats_sum8"]).read_text())["top_k"] == 2
    pop = np.asarray(json.loads(Path(bad["stats"]).read_text())["popularity"])
    assert np.allclose(pop.sum(axis=1), 8)  # the good file: sums to its top_k


def test_read_json_has_a_size_and_depth_limit(bad, tmp_path):
    """specmoe._io.read_json (every JSON the commands read) stops at its stated limit, on a
    device too, and says over-deep nesting in one line; the formats' reader is the same
    function with a smaller limit."""
    from specmoe import _io
    from specmoe.errors import InputError
    from specmoe.formats._common import JSON_LIMIT, read_json_capped

    assert _io.JSON_LIMIT == 64 << 20 and JSON_LIMIT == 16 << 20
    for path, limit, words in [
        ("/dev/zero", None, ("/dev/zero", "larger than the limit of 64 MiB")),
        (bad["huge"], 1 << 20, ("huge.json", "limit of 1 MiB")),
        (bad["nested"], None, ("nested.json", "nested deeper than the limit of 100 levels")),
        (bad["folder"], None, ("folder.json", "is a directory")),
    ]:
        with pytest.raises(InputError) as ei:
            _io.read_json(path, "plan file", argument="plan", limit=limit)
        assert ei.value.argument == "plan" and "\n" not in str(ei.value)
        assert all(w in str(ei.value) for w in words), str(ei.value)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100 + "]" * 100)  # exactly the limit: accepted
    assert _io.read_json(deep) == read_json_capped(deep)
    deep.write_text("[" * 101 + "]" * 101)
    with pytest.raises(InputError, match="nested deeper"):
        read_json_capped(deep)
    with pytest.raises(InputError, match="limit of 16 MiB"):
        read_json_capped("/dev/zero")


def test_report_names_an_unreadable_json_and_goes_on(bad, tmp_path, capsys):
    """A results folder with a stats.json nested too deep: the report is written and says
    why that file could not be read (it used to end in a RecursionError, exit 1)."""
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "stats.json").write_text(Path(bad["nested"]).read_text())
    rc = main(["report", str(folder), "--out", str(tmp_path / "r.html")])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    page = (tmp_path / "r.html").read_text()
    assert "nested deeper than the limit" in page
