"""``specmoe plan --engine llama.cpp`` checked against llama-server's measured speedup.

Needs ``make llama-cpp``. For the bundled target (or, with ``--target lifted``, the bundled
model lifted to OLMoE-1B-7B's shapes and bytes in ``--lifted-layers`` layers: a target that is
memory-bound here, beside which the bundled draft costs little, so that the plan's k* is large)
and the bundled draft model, both exported to GGUF at ``--outtype`` (bf16 by default):

1. ``specmoe bench --engine llama.cpp --model T --draft-model D --depths D --reps R``: llama-bench's
   pass times of both models at n = 1..9;
2. ``specmoe plan --engine llama.cpp --llamacpp-profile ... --acceptance A``: the predicted
   speedup S(a, k), the best k*(a) and llama-server's flags at k*;
3. llama-server started with exactly the printed flags (plus ``--host/--port``, ``-c`` and
   ``-np 1``) and ``--spec-synth-rates a,a^2,...,a^k`` (synthetic acceptance: each draft accepted
   with probability a until the first rejection, :mod:`specmoe.engines.llamacpp_server`), at
   k*(a) and at k* - 1 and k* + 1 (k >= 1), against a plain server (the plan's k = 0 flags):
   ``--repeats`` greedy completions of ``--tokens`` tokens (``ignore_eos``) on each of
   ``--num-prompts`` validation documents (Python standard-library source) cut to ``--depth``
   tokens, plain and speculative alternating; each server holds the prompt in its cache first
   (a one-token completion, not counted), so a completion's cost is its generation.

The measured speedup (``--measure``): ``cpu``, the default, speculative over plain tokens per
CPU second of the server (every thread's ``/proc`` schedstat time, ns): on a machine shared with
other jobs a completion's wall time carries their time slices, its CPU time does not; ``wall``,
the median over the alternating pairs of the server's own tokens/s (``predicted_per_second``).
Both are recorded, and the plan from llama-bench's medians beside the plan from its fastest
repetitions (``--statistic``, default min: the least disturbed).

The plan's V(k) holds the target's extra time for the logits of all k + 1 rows (llama-bench's
pass asks for the last row's only; the bench times both in libllama, ``output_rows``), unless
``--last-row-only``; the plan from llama-bench's passes alone is scored beside it (``last_row``). The bench runs
again after the cells, and the plan from the mean of the two benches' pass times (and rows) is
scored too (``bracketed``: the passes bracket the cells as the calibration does; the cells are
picked by the first bench's plan). ``--rows-fit`` sets the plan's r_T(n) (``plan
--llamacpp-rows``): the paired median at each n (default) or a line in n over n >= 2; the other
form is scored beside it, from the first bench (``rows_<form>``) and bracketed
(``bracketed_rows_<form>``).

Before the checked cells, and again after them, a calibration measures the server's time beyond
llama-bench's passes (CPU ms per plain token minus V(0); CPU ms per round minus V(k) at k = 1
and k = 4 with acceptance 0.3 and 1.0, neither a checked value); the plans take the mean of the
two, which cancels a drift of the machine that is linear over the run (the plain server's cost
per token moved 12-35% between one calibration and the cells in plan-check-2). V(k) takes the
draft's two graph builds a round from its passes timed with every graph rebuilt
(:mod:`specmoe.cost.llamacpp_plan`). Two more plans add the calibration
(``--llamacpp-overhead``) and are scored beside the first: ``with_overhead``, the line
o_round + k o_token through the two cells at 0.3 (the first version), and ``with_emit``, the
second version, which adds a time per emitted token (the target's sampler runs over the whole
vocabulary at every position it checks) fitted to all four cells.

Beside each speedup it records what decomposes a miss: the server's tokens per round (against
G_a(k)) and its time per round (CPU and wall, against the plan's V(k)), and the plain server's
time per token against llama-bench's tau_T(1): what the server spends beyond llama-bench's passes. Writes
``<out>/plan_check.json``.

Usage: ``python scripts/llamacpp_plan_check.py [--out results/cpu/llamacpp] [--acceptance ...]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import numpy as np  # noqa: E402
from llamacpp_runs import _prompts  # noqa: E402

from specmoe._io import atomic_write_json  # noqa: E402
from specmoe.cli import main as specmoe  # noqa: E402
from specmoe.commands.plan import parse_acceptance  # noqa: E402
from specmoe.cost import theory  # noqa: E402
from specmoe.cost.llamacpp_plan import server_flags  # noqa: E402
from specmoe.engines import llamacpp  # noqa: E402
from specmoe.engines.llamacpp_server import synthetic_rates  # noqa: E402
from specmoe.errors import InputError  # noqa: E402

TOLERANCE = 0.10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """llama-server with ``argv`` (the plan's flags) on a free port, for several completions."""

    def __init__(self, argv: list[str], *, ctx: int) -> None:
        self.port = _free_port()
        self.cmd = [str(llamacpp.tool("llama-server")), *argv]
        self.cmd += ["--host", "127.0.0.1", "--port", str(self.port), "-c", str(ctx), "-np", "1"]
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while True:
            if self.proc.poll() is not None or time.time() > deadline:
                self.log.seek(0)
                tail = " | ".join(self.log.read().strip().splitlines()[-3:])
                self.close()
                raise RuntimeError(f"llama-server did not start: {tail}")
            try:
                with urllib.request.urlopen(self._url("/health"), timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)

    def _url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def cpu_ms(self) -> float:
        """The server's CPU time so far, every thread (``/proc/<pid>/task/*/schedstat``, ns)."""
        total = 0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass  # a thread that ended
        return total / 1e6

    def complete(self, prompt: str, n_predict: int, *, cache: bool = True) -> dict[str, Any]:
        """One greedy completion; with ``cache`` the prompt's cache from the previous request
        is reused, so that a repeated prompt costs one token's pass."""
        body = {
            "prompt": prompt,
            "n_predict": int(n_predict),
            "temperature": 0,
            "seed": 0,
            "cache_prompt": bool(cache),
            "ignore_eos": True,
        }
        c0 = self.cpu_ms()
        req = urllib.request.Request(
            self._url("/completion"),
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=600) as r:
            t = json.loads(r.read())["timings"]
        cpu = self.cpu_ms() - c0
        return {
            "cpu_ms": cpu,
            "prompt_n": int(t["prompt_n"]),
            "predicted_n": int(t["predicted_n"]),
            "predicted_ms": float(t["predicted_ms"]),
            "tokens_per_s": float(t["predicted_per_second"]),
            "draft_n": int(t.get("draft_n", 0)),
            "draft_n_accepted": int(t.get("draft_n_accepted", 0)),
        }

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _synthetic(flags: list[str], acceptance: float, k: int) -> list[str]:
    """Server ``flags`` whose drafts are accepted at the synthetic rates of a per-token
    ``acceptance`` and draft length ``k``."""
    rates = ",".join(f"{r:.9g}" for r in synthetic_rates(acceptance, k))
    return [*flags, "--spec-synth-rates", rates]


def _warm(plain: Server, spec: Server, text: str) -> None:
    """The prompt into each server's cache (not counted)."""
    plain.complete(text, 1)
    spec.complete(text, 1)


CALIBRATION_ACCEPTANCE = (0.3, 1.0)  # neither one of the checked acceptances
CALIBRATION_K = (1, 4)


def _calibrate(plain, s, target, draft, prompts, args, ctx) -> dict[str, Any]:
    """The server's time beyond llama-bench's passes, measured before and apart from the
    checked cells: plain CPU ms per token minus V(0), and CPU ms per round minus V(k) of
    servers at k = 1 and k = 4 with synthetic acceptance 0.3 and 1.0 (neither a checked value).

    Two overhead models from the same cells: ``line`` (the first version, from the cells at
    0.3 alone) o(k) = o_round + k o_token through its two points; ``emit`` (the second) adds a
    time per emitted token, o(k) = o_round + k o_token + g o_emit with g the measured tokens
    per round, a non-negative least-squares fit to the four cells (the server samples the
    target's whole vocabulary at each emitted token's position, a piece of work that grows
    with the acceptance, not with k)."""
    from scipy.optimize import nnls

    V = s["step_ms"]
    runs_p, cells = [], []
    for a in CALIBRATION_ACCEPTANCE:
        for k in CALIBRATION_K:
            flags = server_flags(
                k=k,
                target=str(target),
                draft=str(draft),
                threads=s["threads"],
                kv_type=s.get("kv_type", "f16"),
            )
            spec = Server(_synthetic(flags, a, k), ctx=ctx)
            runs_s = []
            try:
                for _, text in prompts:
                    _warm(plain, spec, text)
                    for _rep in range(args.repeats):
                        runs_p.append(plain.complete(text, args.tokens))
                        runs_s.append(spec.complete(text, args.tokens))
            finally:
                spec.close()
            rounds = sum(r["draft_n"] for r in runs_s) / k
            cpu_round = sum(r["cpu_ms"] for r in runs_s) / rounds
            cells.append({"acceptance": a, "k": k, "cpu_ms_per_round": cpu_round, "V_ms": V[k],
                          "excess_ms": cpu_round - V[k],
                          "tokens_per_round": sum(r["predicted_n"] for r in runs_s) / rounds,
                          "runs": runs_s})  # fmt: skip
    plain_ms = sum(r["cpu_ms"] for r in runs_p) / sum(r["predicted_n"] for r in runs_p)
    o_plain = max(0.0, plain_ms - V[0])
    first = [c for c in cells if c["acceptance"] == CALIBRATION_ACCEPTANCE[0]]
    (k1, e1), (k2, e2) = ((c["k"], c["excess_ms"]) for c in first)
    o_token = max(0.0, (e2 - e1) / (k2 - k1))
    o_round = max(0.0, e1 - k1 * o_token)
    A = np.array([[1.0, c["k"], c["tokens_per_round"]] for c in cells])
    b = np.array([c["excess_ms"] for c in cells])
    (r2, t2, e2_), resid = nnls(A, b)
    if e2_ > o_plain:  # a plain token holds its own emission: clamp, refit the other two
        e2_ = o_plain
        (r2, t2), resid = nnls(A[:, :2], b - A[:, 2] * e2_)
    return {
        "acceptance": list(CALIBRATION_ACCEPTANCE),
        "k": list(CALIBRATION_K),
        "plain_cpu_ms_per_token": plain_ms,
        "V0_ms": V[0],
        "cells": cells,
        "overhead_plain_ms": o_plain,
        "overhead_round_ms": o_round,
        "overhead_token_ms": o_token,
        "emit": {
            "overhead_round_ms": float(r2),
            "overhead_token_ms": float(t2),
            "overhead_emit_ms": float(e2_),
            "residual_ms": float(resid),
        },
        "plain_runs": runs_p,
    }


def _bracket(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The calibration of the plans: every overhead the mean of the one measured before the
    checked cells and the one measured after them; both kept whole."""
    keys = ("overhead_plain_ms", "overhead_round_ms", "overhead_token_ms")
    emit = {k: (before["emit"][k] + after["emit"][k]) / 2 for k in before["emit"]}
    emit["overhead_emit_ms"] = min(emit["overhead_emit_ms"], (before[keys[0]] + after[keys[0]]) / 2)
    return {
        **{k: (before[k] + after[k]) / 2 for k in keys},
        "plain_cpu_ms_per_token": (
            before["plain_cpu_ms_per_token"] + after["plain_cpu_ms_per_token"]
        )
        / 2,
        "emit": emit,
        "before": before,
        "after": after,
    }


def _mean_profile(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The llamacpp_verify.json whose every pass statistic (min, median, mean of the target's
    and the draft's passes, with graphs reused and rebuilt) and every row's extra time is the
    mean of ``before``'s and ``after``'s: llama-bench's passes bracketing the checked cells, as
    the calibration does. The two must hold the same depths and passes."""
    out = json.loads(json.dumps(before))

    def mean_rows(a: list, b: list, keys: tuple[str, ...], where: str) -> None:
        if [r["n"] for r in a] != [r["n"] for r in b]:
            raise ValueError(f"{where}: the two benches hold other passes")
        for ra, rb in zip(a, b, strict=True):
            for key in keys:
                ra[key] = (ra[key] + rb[key]) / 2

    stats = ("min_ms", "median_ms", "mean_ms")
    sections = [("verify", out["verify"], after["verify"])]
    if "draft" in out:
        for key in ("verify", "verify_rebuilt"):
            if key in out["draft"]:
                sections.append((f"draft.{key}", out["draft"][key], after["draft"][key]))
    for where, a, b in sections:
        if sorted(a) != sorted(b):
            raise ValueError(f"{where}: the two benches hold other depths")
        for d in a:
            mean_rows(a[d], b[d], stats, f"{where}[{d}]")
    if "output_rows" in out:
        a, b = out["output_rows"]["depths"], after["output_rows"]["depths"]
        if sorted(a) != sorted(b):
            raise ValueError("output_rows: the two benches hold other depths")
        for d in a:
            if [r["n"] for r in a[d]] != [r["n"] for r in b[d]]:
                raise ValueError(f"output_rows[{d}]: the two benches hold other passes")
            for ra, rb in zip(a[d], b[d], strict=True):
                ra["extra_ms"] = {
                    "median": (ra["extra_ms"]["median"] + rb["extra_ms"]["median"]) / 2
                }
    out["bracketed"] = True
    return out


def _scored(version: str, settings: dict[str, Any], a: float, k: int, measured: float) -> dict:
    """One plan version's speedup at (a, k), its k*(a) and its error against ``measured``."""
    plan = next(x for x in settings["plans"] if x["acceptance"] == a)
    predicted = float(plan["speedup_by_k"][k])
    return {
        f"predicted_speedup_{version}": predicted,
        f"plan_k_{version}": plan["draft_length"],
        f"relative_error_{version}": predicted / measured - 1,
        f"within_10pct_{version}": abs(predicted / measured - 1) <= TOLERANCE,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--out",
        default=str(ROOT / "results" / "cpu" / "llamacpp"),
        help="folder for plan_check.json (default: results/cpu/llamacpp)",
    )
    ap.add_argument(
        "--outtype", default="bf16", choices=("bf16", "f32"), help="the GGUFs' weight type"
    )
    ap.add_argument(
        "--acceptance",
        default="0.5,0.7,0.9,0.98",
        help="acceptance rates to check, in [0, 1) (as specmoe plan --acceptance; the servers' "
        "synthetic rate)",
    )
    ap.add_argument("--depth", type=int, default=512, help="the prompts' tokens (KV depth)")
    ap.add_argument("--reps", type=int, default=30, help="llama-bench repetitions")
    ap.add_argument("--k-max", type=int, default=8, help="the largest draft length planned")
    ap.add_argument("--num-prompts", type=int, default=3, help="validation prompts a cell")
    ap.add_argument("--repeats", type=int, default=3, help="completions per prompt and server")
    ap.add_argument("--tokens", type=int, default=256, help="tokens generated a completion")
    ap.add_argument(
        "--statistic",
        default="min",
        choices=("min", "median"),
        help="the plan's pass times: llama-bench's fastest repetition (min, the least disturbed "
        "on a shared machine) or the median; the other plan is recorded beside it",
    )
    ap.add_argument(
        "--measure",
        default="cpu",
        choices=("cpu", "wall"),
        help="the measured speedup scored: tokens per CPU second of each server (cpu) or the "
        "median over alternating pairs of the server's tokens/s (wall); both are recorded",
    )
    ap.add_argument(
        "--target",
        default="bundled",
        choices=("bundled", "lifted"),
        help="the target: the bundled model, or the bundled model lifted to OLMoE-1B-7B's "
        "shapes and bytes (specmoe lift, docs/lifted-model.md; memory-bound on a CPU, with "
        "the bundled draft nearly free beside it)",
    )
    ap.add_argument(
        "--lifted-layers", type=int, default=4, help="the lifted target's layers (>= 4)"
    )
    ap.add_argument(
        "--last-row-only",
        action="store_true",
        help="plan without the target's extra time for every row's logits (bench "
        "--no-output-rows, plan --llamacpp-last-row-only), as the checks before the fifth did; "
        "by default the plan holds it and the last-row plan is scored beside it",
    )
    ap.add_argument(
        "--rows-fit",
        default="median",
        choices=("median", "line"),
        help="the plan's r_T(n) (plan --llamacpp-rows): the paired median at each n, or a line "
        "in n on n >= 2; the plan picks the cells, and the other form is scored beside it "
        "(first bench and bracketed)",
    )
    ap.add_argument(
        "--kv-type",
        default="f16",
        choices=("f16", "q8_0"),
        help="the KV caches' type in the bench and so in every server (the plan's -ctk/-ctkd): "
        "f16, llama.cpp's default, or keys in q8_0 (results/cpu/llamacpp/kv-width/)",
    )
    args = ap.parse_args(argv)
    if args.last_row_only and args.rows_fit != "median":
        ap.error("--rows-fit: the rows' form needs the rows (not with --last-row-only)")
    if args.lifted_layers < 4:
        ap.error(f"--lifted-layers: {args.lifted_layers} is fewer than the bundled model's 4")
    for name in ("depth", "reps", "k_max", "num_prompts", "repeats", "tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}")
    try:  # the plan's own parser, so a value it would refuse is refused before the build
        parse_acceptance(args.acceptance)
    except InputError as e:
        ap.error(str(e))
    llamacpp.require_built()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0, load0 = time.time(), os.getloadavg()
    prompts = _prompts(args.num_prompts, args.depth)
    ctx = 2 * (args.depth + args.tokens + args.k_max + 64)
    with tempfile.TemporaryDirectory(prefix="specmoe-plan-check-") as tmp:
        target, draft = Path(tmp) / f"target-{args.outtype}.gguf", Path(tmp) / "draft.gguf"
        source = "bundled"
        if args.target == "lifted":  # the bundled model at OLMoE-1B-7B's shapes, same function
            source = str(Path(tmp) / "lifted")
            lift = ["lift", "--layers", str(args.lifted_layers), "--out", source]
            assert specmoe([*lift, "--dtype", "bf16" if args.outtype == "bf16" else "fp32"]) == 0
        for model, path in [(source, target), ("bundled-draft", draft)]:
            cmd = ["export", "--format", "gguf", "--model", model, "--out", str(path)]
            assert specmoe([*cmd, "--outtype", args.outtype]) == 0
        if args.target == "lifted":
            shutil.rmtree(source)  # the GGUF holds it; its safetensors are not needed
        bench_argv = ["bench", "--engine", "llama.cpp", "--model", str(target)]
        bench_argv += ["--draft-model", str(draft), "--depths", str(args.depth)]
        bench_argv += ["--reps", str(args.reps), "--out", str(Path(tmp) / "bench")]
        if args.last_row_only:
            bench_argv.append("--no-output-rows")
        if args.kv_type != "f16":  # the plan's flags then carry it (-ctk/-ctkd)
            bench_argv += ["--kv-type", args.kv_type]
        assert specmoe(bench_argv) == 0
        profile_path = Path(tmp) / "bench" / "llamacpp_verify.json"
        plan_argv = ["plan", "--engine", "llama.cpp", "--llamacpp-profile", str(profile_path)]
        plan_argv += ["--acceptance", args.acceptance, "--context", str(args.depth)]
        plan_argv += ["--k-max", str(args.k_max), "--target-model", str(target)]
        plan_argv += ["--draft-model", str(draft)]
        if args.last_row_only:
            plan_argv.append("--llamacpp-last-row-only")
        other_fit = "line" if args.rows_fit == "median" else "median"
        if not args.last_row_only:
            plan_argv += ["--llamacpp-rows", args.rows_fit]
        plans = {}
        for stat in ("min", "median"):
            argv_s = [*plan_argv, "--llamacpp-statistic", stat, "--out", str(Path(tmp) / stat)]
            assert specmoe(argv_s) == 0
            plans[stat] = json.loads((Path(tmp) / stat / "plan.json").read_text())
        plan = plans[args.statistic]
        # the plan without the rows (llama-bench's passes alone), scored beside it
        argv_l = [*plan_argv, "--llamacpp-statistic", args.statistic, "--llamacpp-last-row-only"]
        if not args.last_row_only:  # the rows' form is refused without the rows
            i = argv_l.index("--llamacpp-rows")
            del argv_l[i : i + 2]
        assert specmoe([*argv_l, "--out", str(Path(tmp) / "last_row")]) == 0
        plan_l = json.loads((Path(tmp) / "last_row" / "plan.json").read_text())
        s_l = plan_l["engine"]["settings"]["llama.cpp"]
        # the plan with the rows' other form (first bench), scored beside it
        plan_f = None
        if not args.last_row_only:
            argv_f = [*plan_argv, "--llamacpp-statistic", args.statistic]
            argv_f[argv_f.index("--llamacpp-rows") + 1] = other_fit
            assert specmoe([*argv_f, "--out", str(Path(tmp) / "rows_other")]) == 0
            plan_f = json.loads((Path(tmp) / "rows_other" / "plan.json").read_text())
        other = plans["median" if args.statistic == "min" else "min"]
        so = other["engine"]["settings"]["llama.cpp"]
        s = plan["engine"]["settings"]["llama.cpp"]
        V = s["step_ms"]
        tau_t = s["tau_target_ms"]
        k_max = s["k_max"]
        # V(k) without the draft's re-evaluation of the target's batch, for comparison
        parts = s["step_parts_ms"]
        V_noreeval = [tau_t[0]] + [tau_t[k] + parts["draft_tokens"][k] for k in range(1, k_max + 1)]
        plain_argv = server_flags(
            k=0,
            target=str(target),
            draft=None,
            threads=s["threads"],
            kv_type=s.get("kv_type", "f16"),
        )
        plain = Server(plain_argv, ctx=ctx)
        results, plain_runs = [], []
        try:
            cal_before = _calibrate(plain, s, target, draft, prompts, args, ctx)
            for p in s["plans"]:
                a, k_best = p["acceptance"], p["draft_length"]
                ks = sorted({k for k in (k_best - 1, k_best, k_best + 1) if 1 <= k <= k_max})
                for k in ks:
                    flags = (
                        p["command"][1:]
                        if k == k_best
                        else server_flags(
                            k=k,
                            target=str(target),
                            draft=str(draft),
                            threads=s["threads"],
                            kv_type=s.get("kv_type", "f16"),
                        )
                    )
                    flags = _synthetic(flags, a, k)
                    spec = Server(flags, ctx=ctx)
                    pairs = []
                    try:
                        for name, text in prompts:
                            _warm(plain, spec, text)
                            for rep in range(args.repeats):
                                tp = plain.complete(text, args.tokens)
                                ts = spec.complete(text, args.tokens)
                                plain_runs.append({"prompt": name, **tp})
                                pairs.append({"prompt": name, "rep": rep, "plain": tp, "spec": ts})
                    finally:
                        spec.close()
                    speedups = [
                        q["spec"]["tokens_per_s"] / q["plain"]["tokens_per_s"] for q in pairs
                    ]
                    paired = float(np.median(speedups))
                    cpu_spec = sum(q["spec"]["cpu_ms"] for q in pairs)
                    cpu_plain = sum(q["plain"]["cpu_ms"] for q in pairs)
                    n_spec = sum(q["spec"]["predicted_n"] for q in pairs)
                    n_plain = sum(q["plain"]["predicted_n"] for q in pairs)
                    cpu_speedup = (n_spec / cpu_spec) / (n_plain / cpu_plain)
                    measured = cpu_speedup if args.measure == "cpu" else paired
                    predicted = float(p["speedup_by_k"][k])
                    p_other = next(x for x in so["plans"] if x["acceptance"] == a)
                    drafted = sum(q["spec"]["draft_n"] for q in pairs)
                    accepted = sum(q["spec"]["draft_n_accepted"] for q in pairs)
                    rounds = drafted / k
                    emitted = sum(q["spec"]["predicted_n"] for q in pairs)
                    spec_ms = sum(q["spec"]["predicted_ms"] for q in pairs)
                    plain_ms = sum(q["plain"]["predicted_ms"] for q in pairs)
                    plain_n = sum(q["plain"]["predicted_n"] for q in pairs)
                    row = {
                        "acceptance": a,
                        "k": k,
                        "is_plan_k": k == k_best,
                        "predicted_speedup": predicted,
                        "predicted_speedup_without_reeval": float(theory.speedup(V_noreeval, a, k)),
                        "measured_speedup": measured,
                        "measured_speedup_cpu": cpu_speedup,
                        "measured_speedup_wall_paired_median": paired,
                        "measured_speedups": speedups,
                        "predicted_speedup_other_statistic": float(p_other["speedup_by_k"][k]),
                        "plan_k_other_statistic": p_other["draft_length"],
                        "relative_error": predicted / measured - 1,
                        "within_10pct": abs(predicted / measured - 1) <= TOLERANCE,
                        "server_flags": flags,
                        "acceptance_measured": accepted / drafted if drafted else None,
                        "tokens_per_round_measured": emitted / rounds if rounds else None,
                        "tokens_per_round_G": float(theory.expected_tokens(a, k)),
                        "ms_per_round_measured": spec_ms / rounds if rounds else None,
                        "cpu_ms_per_round": cpu_spec / rounds if rounds else None,
                        "plain_cpu_ms_per_token": cpu_plain / n_plain,
                        "ms_per_round_V": V[k],
                        "plain_ms_per_token_measured": plain_ms / plain_n,
                        "plain_ms_per_token_V0": V[0],
                        "pairs": pairs,
                    }
                    results.append(row)
            # the calibration again after the cells: its mean with the first cancels a drift
            # of the machine that is linear over the run
            # the cells so far, kept should the second calibration fail
            atomic_write_json(
                out / "plan_check.cells.json", json.loads(json.dumps(results).replace(tmp, "<tmp>"))
            )
            cal_after = _calibrate(plain, s, target, draft, prompts, args, ctx)
            # llama-bench's passes again after the cells: the bracketed plan takes the mean
            bench_after = list(bench_argv)
            bench_after[bench_after.index("--out") + 1] = str(Path(tmp) / "bench_after")
            assert specmoe(bench_after) == 0
            prof_after = json.loads(
                (Path(tmp) / "bench_after" / "llamacpp_verify.json").read_text()
            )
            prof_mean = _mean_profile(json.loads(profile_path.read_text()), prof_after)
            mean_path = Path(tmp) / "bench_mean" / "llamacpp_verify.json"
            atomic_write_json(mean_path, prof_mean)
            argv_b = [*plan_argv, "--llamacpp-statistic", args.statistic]
            argv_b[argv_b.index(str(profile_path))] = str(mean_path)
            assert specmoe([*argv_b, "--out", str(Path(tmp) / "bracketed")]) == 0
            plan_b = json.loads((Path(tmp) / "bracketed" / "plan.json").read_text())
            s_b = plan_b["engine"]["settings"]["llama.cpp"]
            plan_bf = None
            if plan_f is not None:  # bracketed, the rows' other form
                argv_bf = list(argv_b)
                argv_bf[argv_bf.index("--llamacpp-rows") + 1] = other_fit
                assert specmoe([*argv_bf, "--out", str(Path(tmp) / "bracketed_other")]) == 0
                plan_bf = json.loads((Path(tmp) / "bracketed_other" / "plan.json").read_text())
            calibration = _bracket(cal_before, cal_after)
            over = [calibration[f"overhead_{x}_ms"] for x in ("plain", "round", "token")]
            argv_o = [*plan_argv, "--llamacpp-statistic", args.statistic]
            argv_e = [*argv_o, "--llamacpp-overhead"]
            argv_o += ["--llamacpp-overhead", ",".join(f"{x:.6f}" for x in over)]
            assert specmoe([*argv_o, "--out", str(Path(tmp) / "overhead")]) == 0
            plan_o = json.loads((Path(tmp) / "overhead" / "plan.json").read_text())
            s_o = plan_o["engine"]["settings"]["llama.cpp"]
            em = calibration["emit"]
            over_e = [over[0], em["overhead_round_ms"], em["overhead_token_ms"]]
            argv_e.append(",".join(f"{x:.6f}" for x in [*over_e, em["overhead_emit_ms"]]))
            assert specmoe([*argv_e, "--out", str(Path(tmp) / "emit")]) == 0
            plan_e = json.loads((Path(tmp) / "emit" / "plan.json").read_text())
            s_e = plan_e["engine"]["settings"]["llama.cpp"]
            for row in results:
                a, k, measured = row["acceptance"], row["k"], row["measured_speedup"]
                row.update(_scored("with_overhead", s_o, a, k, measured))
                row.update(_scored("with_emit", s_e, a, k, measured))
                row.update(_scored("last_row", s_l, a, k, measured))
                row.update(_scored("bracketed", s_b, a, k, measured))
                if plan_f is not None:
                    s_f = plan_f["engine"]["settings"]["llama.cpp"]
                    s_bf = plan_bf["engine"]["settings"]["llama.cpp"]
                    row.update(_scored(f"rows_{other_fit}", s_f, a, k, measured))
                    row.update(_scored(f"bracketed_rows_{other_fit}", s_bf, a, k, measured))
                print(
                    f"a={a:g} k={k}{'*' if row['is_plan_k'] else ' '} predicted "
                    f"{row['predicted_speedup']:.3f} (last row only "
                    f"{row['predicted_speedup_last_row']:.3f}, bracketed "
                    f"{row['predicted_speedup_bracketed']:.3f}, with overhead "
                    f"{row['predicted_speedup_with_overhead']:.3f}, with emit "
                    f"{row['predicted_speedup_with_emit']:.3f}) measured {measured:.3f} (wall "
                    f"paired median {row['measured_speedup_wall_paired_median']:.3f}) "
                    f"({row['relative_error']:+.1%}); round {row['ms_per_round_measured']:.3f}"
                    f" ms (cpu {row['cpu_ms_per_round']:.3f}) vs V {V[k]:.3f}; plain cpu "
                    f"{row['plain_cpu_ms_per_token']:.3f} vs V0 {V[0]:.3f}; tokens/round "
                    f"{row['tokens_per_round_measured']:.2f} vs G {row['tokens_per_round_G']:.2f}",
                    file=sys.stderr,
                )
        finally:
            plain.close()
        profile = json.loads(profile_path.read_text())
        shown_plan = json.loads(json.dumps(plan).replace(tmp, "<tmp>"))
    atomic_write_json(
        out / "plan_check.json",
        {
            "llama_cpp": llamacpp.VERSION,
            "command": "python scripts/llamacpp_plan_check.py " + " ".join(argv or sys.argv[1:]),
            "target": args.target,
            "lifted_layers": args.lifted_layers if args.target == "lifted" else None,
            "weights": args.outtype,
            "depth": args.depth,
            "tokens": args.tokens,
            "prompts": [name for name, _ in prompts],
            "repeats": args.repeats,
            "tolerance": TOLERANCE,
            "bench": {
                "command": "specmoe " + " ".join(bench_argv).replace(tmp, "<tmp>"),
                "profile": json.loads(json.dumps(profile).replace(tmp, "<tmp>")),
                "profile_after": json.loads(json.dumps(prof_after).replace(tmp, "<tmp>")),
            },
            "statistic": args.statistic,
            "measure": args.measure,
            "plan": {
                "command": "specmoe "
                + " ".join(plan_argv).replace(tmp, "<tmp>")
                + f" --llamacpp-statistic {args.statistic}",
                "plan": shown_plan,
                "plan_other_statistic": json.loads(json.dumps(other).replace(tmp, "<tmp>")),
                "output_rows": bool(s.get("output_rows")),
                "plan_last_row": json.loads(json.dumps(plan_l).replace(tmp, "<tmp>")),
                "plan_bracketed": json.loads(json.dumps(plan_b).replace(tmp, "<tmp>")),
                "rows_fit": None if args.last_row_only else args.rows_fit,
                f"plan_rows_{other_fit}": json.loads(json.dumps(plan_f).replace(tmp, "<tmp>")),
                f"plan_bracketed_rows_{other_fit}": json.loads(
                    json.dumps(plan_bf).replace(tmp, "<tmp>")
                ),
                "plan_with_overhead": json.loads(json.dumps(plan_o).replace(tmp, "<tmp>")),
                "plan_with_overhead_command": "specmoe " + " ".join(argv_o).replace(tmp, "<tmp>"),
                "plan_with_emit": json.loads(json.dumps(plan_e).replace(tmp, "<tmp>")),
                "plan_with_emit_command": "specmoe " + " ".join(argv_e).replace(tmp, "<tmp>"),
            },
            "calibration": calibration,
            "plain_runs": plain_runs,
            "results": json.loads(json.dumps(results).replace(tmp, "<tmp>")),
            "load_before": load0,
            "load_after": os.getloadavg(),
            "wall_s": time.time() - t0,
        },
    )
    (out / "plan_check.cells.json").unlink(missing_ok=True)
    print(f"wrote {out / 'plan_check.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
