"""llama.cpp's n-gram self-speculation on the bundled target, and the llama.cpp plan scored on it.

Needs ``make llama-cpp``. Exports the bundled target to GGUF (bf16, as
``scripts/llamacpp_runs.py``) in a temporary folder, then:

1. ``specmoe bench --engine llama.cpp --model T.gguf --depths 512 --reps R``: llama-bench's pass
   of n = 1..9 tokens at depth 512, tau_T(n);
2. a calibration apart from the checked runs: llama-speculative-simple whose n-gram never matches
   (ngram-simple, size-n = size-m = 64: no round drafts) on the same prompts, each after a plain
   llama-bench decode of the same length: o_round, the median of its wall ms per round less the
   plain decode's ms per token (sampling and the tool's loop; llama-bench times passes alone),
   floored at 0;
3. for each k of ``--k`` (default 1..8), each of ``--num-prompts`` validation documents cut to
   ``--context`` tokens and ``--repeats`` repetitions: a plain decode of ``--tokens`` tokens after
   ``--context`` (``llama-bench -p 0 -n T -d C -r 1``) just before llama-speculative-simple
   ``--spec-type ngram-simple --spec-ngram-simple-size-n N --spec-ngram-simple-size-m k``
   (greedy, one thread, ``-fa off``): tokens/s as llama.cpp reports them (llama-bench's time of
   the T passes; llama-speculative-simple's "decoded M tokens in S seconds": wall time over the
   generated tokens), acceptance, rounds (= decoded - accepted), the paired speedup; and
   between the two the same tool with a lookup that never matches (size-n = size-m = 64): a
   second paired speedup, over plain decoding in llama-speculative-simple's own loop;
4. one debug-logged run per (k, prompt) (its rounds rebuilt, :mod:`specmoe.engines.llamacpp_ngram`;
   its time not used): each round's draft length k_r and accepted a_r;
5. the plan for a drafter of no cost (:func:`specmoe.cost.llamacpp_plan.step_times` with
   tau_D = 0): V(k) = tau_T(k + 1) + o, S(a, k) = G_a(k) V(0) / V(k) (paper 002 Eq. (9)) at each
   k's realised acceptance a_k = accepted / drafted, against the median paired speedup, three
   ways: ``passes`` (V(0) = tau_T(1), o = 0), ``passes_overhead`` (o = o_round) and
   ``decode_overhead`` (V(0) = the calibration's plain ms per token, o = o_round); beside each,
   the same at the realised tokens per round and what the round mix of step 4 gives (tokens over
   the sum of V(k_r)), to tell the acceptance model's miss from the step time's. llama-bench's
   statistics ``min_ms`` and ``median_ms`` both.

Writes ``--out`` (default ``results/cpu/llamacpp/ngram.json``).

Usage: ``python scripts/llamacpp_ngram_runs.py [--quick]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from specmoe._io import atomic_write_json  # noqa: E402
from specmoe.engines import llamacpp  # noqa: E402
from specmoe.errors import InputError  # noqa: E402

STATISTICS = ("min_ms", "median_ms")


def _ints(text: str) -> list[int]:
    if ".." in text:
        lo, hi = (int(x) for x in text.split(".."))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",") if x.strip()]


def _timed(cmd: list[str]) -> tuple[str, float]:
    """Run ``cmd``; its output and its CPU seconds (user + system, every thread: ``wait4``)."""
    with (
        tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as out,
        tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as err,
    ):
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        log = out.read() + err.read()  # as llamacpp's runs read it: stdout, then stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} exited {proc.returncode}: {log[-300:]}")
    return log, usage.ru_utime + usage.ru_stime


def _g(a: float, k: int) -> float:
    """G_a(k) = (1 - a^(k+1)) / (1 - a): expected tokens per round, i.i.d. acceptance a."""
    return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def _mix(draft_lengths: list[int], accepted: list[int], steps: list[float], v0: float) -> float:
    """The speedup of the logged rounds as they were: their tokens at ``v0`` a token over the
    sum of each round's ``steps[k_r]`` (a round that drafted nothing: ``steps[0]``)."""
    tokens = sum(a + 1 for a in accepted)
    return tokens * v0 / sum(steps[d] for d in draft_lengths)


def _profile(verify_json: Path, statistic: str, depth: int) -> Any:
    """The target's passes as a llama.cpp plan profile with a draft of no cost (tau_D = 0)."""
    from specmoe.cost.llamacpp_plan import LlamaCppProfile, load_llamacpp_profile

    p = load_llamacpp_profile(verify_json, statistic=statistic)
    zero = {d: [0.0] * len(v) for d, v in p.target.items()}
    return LlamaCppProfile(p.path, p.statistic, p.target, zero, p.threads, p.meta)


def _step_times(profile: Any, depth: int, k_max: int, o_round: float) -> list[float]:
    from specmoe.cost.llamacpp_plan import step_times

    V, _ = step_times(profile, depth, k_max, reevaluate=False, overhead=(0.0, o_round))
    return V


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "results" / "cpu" / "llamacpp" / "ngram.json"))
    ap.add_argument("--k", default="1..8")
    ap.add_argument("--size-n", type=int, default=1, help="ngram-simple's lookup length")
    ap.add_argument("--num-prompts", type=int, default=3)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reps", type=int, default=50, help="llama-bench repetitions per pass size")
    ap.add_argument("--quick", action="store_true", help="a subset into out/llamacpp-ngram-quick")
    args = ap.parse_args(argv)
    if args.quick:
        args.out = str(ROOT / "out" / "llamacpp-ngram-quick" / "ngram.json")
        args.k, args.num_prompts, args.tokens, args.repeats, args.reps = "1,4", 1, 64, 1, 5
    llamacpp.require_built()
    sys.path.insert(0, str(ROOT / "scripts"))
    from llamacpp_runs import _prompts

    from specmoe.cli import main as specmoe
    from specmoe.engines.llamacpp_ngram import ngram_command, parse_ngram_log

    t0, load0 = time.time(), os.getloadavg()
    ks = _ints(args.k)
    depth = args.context
    prompts = _prompts(args.num_prompts, args.context)
    commands: list[str] = []
    with tempfile.TemporaryDirectory(prefix="specmoe-gguf-") as tmp:
        gguf = Path(tmp) / "bundled-bf16.gguf"
        export = ["export", "--model", "bundled", "--outtype", "bf16", "--out", str(gguf)]
        assert specmoe(export) == 0
        commands.append("specmoe " + " ".join(export).replace(tmp, "TMP"))
        bench = ["bench", "--engine", "llama.cpp", "--model", str(gguf), "--depths", str(depth)]
        bench += ["--n-max", str(max(ks) + 1), "--reps", str(args.reps), "--out", tmp]
        print("ngram: llama-bench passes", file=sys.stderr)
        assert specmoe(bench) == 0
        commands.append("specmoe " + " ".join(bench).replace(tmp, "TMP"))
        verify_json = Path(tmp) / "llamacpp_verify.json"
        verify = json.loads(verify_json.read_text())["verify"][str(depth)]
        profiles = {s: _profile(verify_json, s, depth) for s in STATISTICS}

        unreadable: list[str] = []

        def spec(text: str, *, k: int, size_n: int, n_predict: int, rounds: bool = False):
            """One run: (SpecRun, CPU s); rounds rebuilt at debug verbosity with ``rounds``."""
            ids = llamacpp.tokenize(gguf, text) if rounds else None
            for attempt in (1, 2):
                with tempfile.TemporaryDirectory(prefix="specmoe-ngram-") as t2:
                    pf = Path(t2) / "prompt.txt"
                    pf.write_text(text + "\n", encoding="utf-8")  # -f drops one newline
                    cmd = ngram_command(gguf, pf, k=k, n_predict=n_predict, size_n=size_n,
                                        rounds=rounds)  # fmt: skip
                    log, cpu = _timed(cmd)
                try:
                    return parse_ngram_log(log, prompt_ids=ids), cpu
                except InputError as exc:  # a log without its summary from a run that exited 0
                    if attempt == 2:
                        raise
                    unreadable.append(str(exc))
                    print(f"warning: {exc}; running it again", file=sys.stderr)

        # the CPU time of loading, the prompt's pass and one token, per prompt (fewest of 3):
        # a run's CPU time over its generated tokens is its own less this
        ref = {}
        for name, text in prompts:
            got = [spec(text, k=64, size_n=64, n_predict=1) for _ in range(3)]
            ref[name] = (min(c for _, c in got), got[0][0].n_predict)

        def cpu_ms_per_token(name: str, run: Any, cpu: float) -> float:
            c0, n0 = ref[name]
            return (cpu - c0) * 1e3 / (run.n_predict - n0)

        # calibration: rounds that never draft (no 64-gram repeats in these prompts), each
        # after a plain decode of the same length
        calib = []
        for name, text in prompts:
            plain = llamacpp.bench_decode(gguf, tokens=args.tokens, depth=args.context, repeats=1)
            run, cpu = spec(text, k=64, size_n=64, n_predict=args.tokens)
            if run.n_drafted:
                raise SystemExit(f"calibration: {name}: a 64-gram repeats; it drafted")
            ms_round = run.decode_s * 1e3 / (run.n_predict - run.n_accept)
            calib.append(
                {
                    "prompt": name,
                    "n_predict": run.n_predict,
                    "decode_s": run.decode_s,
                    "ms_per_round": ms_round,
                    "cpu_ms_per_round": cpu_ms_per_token(name, run, cpu),
                    "plain_ms_per_token": plain.median_ms / plain.n_gen,
                    "excess_ms": ms_round - plain.median_ms / plain.n_gen,
                }
            )
        o_round = max(0.0, float(np.median([c["excess_ms"] for c in calib])))
        plain_ms = float(np.median([c["plain_ms_per_token"] for c in calib]))
        tool_cpu_ms = float(np.median([c["cpu_ms_per_round"] for c in calib]))

        rows: list[dict[str, Any]] = []
        for k in ks:
            for name, text in prompts:
                runs = []
                for _ in range(args.repeats):
                    base = llamacpp.bench_decode(
                        gguf, tokens=args.tokens, depth=args.context, repeats=1
                    )
                    # the same tool with a lookup that never matches: its rounds never draft
                    nod, nod_cpu = spec(text, k=64, size_n=64, n_predict=args.tokens)
                    run, cpu = spec(text, k=k, size_n=args.size_n, n_predict=args.tokens)
                    cpu_ms, nod_cpu_ms = (cpu_ms_per_token(name, run, cpu),
                                          cpu_ms_per_token(name, nod, nod_cpu))  # fmt: skip
                    runs.append(
                        {
                            "plain_tokens_per_s": base.tokens_per_s,
                            "tokens_per_s": run.tokens_per_s,
                            "paired_speedup": run.tokens_per_s / base.tokens_per_s,
                            "nodraft_tokens_per_s": nod.tokens_per_s,
                            "nodraft_drafted": nod.n_drafted,
                            "paired_speedup_nodraft": run.tokens_per_s / nod.tokens_per_s,
                            "cpu_ms_per_token": cpu_ms,
                            "nodraft_cpu_ms_per_token": nod_cpu_ms,
                            "cpu_speedup_nodraft": nod_cpu_ms / cpu_ms,
                            "n_predict": run.n_predict,
                            "n_accept": run.n_accept,
                            "n_drafted": run.n_drafted,
                            "rounds": run.n_predict - run.n_accept,
                            "decode_s": run.decode_s,
                        }
                    )
                logged, _ = spec(text, k=k, size_n=args.size_n, n_predict=args.tokens, rounds=True)
                rows.append(
                    {
                        "k": k,
                        "prompt": name,
                        "runs": runs,
                        "logged": {
                            "n_predict": logged.n_predict,
                            "n_accept": logged.n_accept,
                            "draft_lengths": [r.k for r in logged.rounds],
                            "accepted": [r.accepted for r in logged.rounds],
                        },
                    }
                )
                med = {key: np.median([r[key] for r in runs])
                       for key in ("paired_speedup", "paired_speedup_nodraft",
                                   "cpu_speedup_nodraft")}  # fmt: skip
                print(
                    f"ngram k={k} {name}: paired {med['paired_speedup']:.2f}, over no-draft "
                    f"{med['paired_speedup_nodraft']:.2f} (CPU {med['cpu_speedup_nodraft']:.2f})",
                    file=sys.stderr,
                )
        example = ngram_command(gguf, "PROMPT.txt", k=ks[-1], n_predict=args.tokens,
                                size_n=args.size_n, rounds=False)  # fmt: skip
        commands.append(" ".join([Path(example[0]).name, *example[1:]]).replace(tmp, "TMP"))
    result = score(rows, ks, profiles, verify, depth, o_round, plain_ms, tool_cpu_ms)
    result.update(
        {
            "command": "python scripts/llamacpp_ngram_runs.py " + " ".join(argv or sys.argv[1:]),
            "commands": commands,
            "llama_cpp": llamacpp.VERSION,
            "weights": "bf16",
            "options": {**vars(args), "out": _shown(Path(args.out))},
            "calibration": {
                "what": "llama-speculative-simple, ngram-simple size-n = size-m = 64 (no round "
                "drafts), each after a plain llama-bench decode of the same length: o_round = "
                "median over prompts of (its wall ms per round - the plain ms per token)",
                "runs": calib,
                "o_round_ms": o_round,
                "plain_ms_per_token": plain_ms,
                "tool_cpu_ms_per_round": tool_cpu_ms,
                "cpu_reference": {n: {"cpu_s": c, "n_predict": m} for n, (c, m) in ref.items()},
            },
            "runs": rows,
            "runs_rerun_for_an_unreadable_log": unreadable,
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_before": load0,
            "load_after": os.getloadavg(),
            "wall_s": time.time() - t0,
        }
    )
    atomic_write_json(Path(args.out), result)
    for s, tab in result["table"].items():
        print(f"{s}: k a_k wall cpu | predicted (error): passes, +o, decode+o, tool_cpu | T/G")
        for r in tab:
            cells = " ".join(
                f"{r[v]['predicted']:.3f} ({r[v]['error']:+.0%})"
                for v in ("passes", "passes_overhead", "decode_overhead", "tool_cpu")
            )
            print(
                f"  {r['k']} {r['acceptance']:.3f} {r['measured_speedup']:.3f} "
                f"{r['measured_cpu_speedup_nodraft']:.3f} | {cells} | "
                f"{r['tokens_per_round'] / r['g_a_k']:.2f}"
            )
    return 0


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def score(
    rows: list[dict[str, Any]],
    ks: list[int],
    profiles: dict[str, Any],
    verify: list[dict[str, Any]],
    depth: int,
    o_round: float,
    plain_ms: float,
    tool_cpu_ms: float,
) -> dict[str, Any]:
    """Per k: realised acceptance, tokens per round against G_{a_k}(k), the median paired
    speedup, and per statistic of llama-bench's repetitions the plan's prediction with and
    without the overhead, its error, and the round mix's prediction."""
    k_max = max(ks)
    table: dict[str, list[dict[str, Any]]] = {}
    per_k = {}
    for k in ks:
        sel = [r for r in rows if r["k"] == k]
        runs = [x for r in sel for x in r["runs"]]
        acc = sum(x["n_accept"] for x in runs) / max(1, sum(x["n_drafted"] for x in runs))
        logged_k = [d for r in sel for d in r["logged"]["draft_lengths"]]
        logged_a = [a for r in sel for a in r["logged"]["accepted"]]
        per_k[k] = {
            "acceptance": acc,
            "measured_speedup": float(np.median([x["paired_speedup"] for x in runs])),
            "paired_speedups": [x["paired_speedup"] for x in runs],
            "measured_speedup_nodraft": float(
                np.median([x["paired_speedup_nodraft"] for x in runs])
            ),
            "measured_cpu_speedup_nodraft": float(
                np.median([x["cpu_speedup_nodraft"] for x in runs])
            ),
            "tokens_per_round": sum(x["n_predict"] for x in runs) / sum(x["rounds"] for x in runs),
            "g_a_k": _g(acc, k),
            "mean_draft_length": sum(x["n_drafted"] for x in runs) / sum(x["rounds"] for x in runs),
            "logged_rounds": len(logged_k),
            "logged_round_lengths": {
                str(j): logged_k.count(j) for j in range(k + 1) if logged_k.count(j)
            },
            "logged_full_rounds_accepted_all": sum(
                1 for d, a in zip(logged_k, logged_a, strict=True) if d == k and a == k
            ),
            "logged_tokens": sum(a + 1 for a in logged_a),
            "_mix": (logged_k, logged_a),
        }
    for s, prof in profiles.items():
        tau = _step_times(prof, depth, k_max, 0.0)  # tau_T(k + 1)
        o_cpu = max(0.0, tool_cpu_ms - tau[0])
        variants = {  # V(0), o per round, the measured speedup it is scored against
            "passes": (tau[0], 0.0, "measured_speedup"),
            "passes_overhead": (tau[0], o_round, "measured_speedup"),
            "decode_overhead": (plain_ms, o_round, "measured_speedup"),
            "tool_cpu": (tau[0] + o_cpu, o_cpu, "measured_cpu_speedup_nodraft"),
        }
        tab = []
        for k in ks:
            m = per_k[k]
            logged_k, logged_a = m["_mix"]
            row = {"k": k, **{key: v for key, v in m.items() if not key.startswith("_")}}
            for name, (v0, o, against) in variants.items():
                steps = [tau[0] + o] + [tau[j] + o for j in range(1, k_max + 1)]
                pred = m["g_a_k"] * v0 / steps[k]
                meas = m[against]
                row[name] = {
                    "V0_ms": v0,
                    "o_ms": o,
                    "Vk_ms": steps[k],
                    "against": against,
                    "predicted": pred,
                    "error": pred / meas - 1,
                    "within_10pct": bool(abs(pred / meas - 1) <= 0.10),
                    "predicted_at_tokens_per_round": m["tokens_per_round"] * v0 / steps[k],
                    "predicted_round_mix": _mix(logged_k, logged_a, steps, v0),
                }
            tab.append(row)
        table[s] = tab
    return {
        "depth": depth,
        "tau_target_ms": {s: profiles[s].target[depth] for s in profiles},
        "verify": verify,
        "o_round_ms": o_round,
        "plain_ms_per_token": plain_ms,
        "tool_cpu_ms_per_round": tool_cpu_ms,
        "model": "S = G_a(k) V(0)/V(k) at the realised acceptance a_k, V(k) = tau_T(k+1) + o; "
        "passes: V(0) = tau_T(1), o = 0; passes_overhead: V(0) = tau_T(1), o = o_round (wall); "
        "decode_overhead: V(0) = llama-bench's plain ms per token (-n), o = o_round; these "
        "against the wall speedup over llama-bench's plain decode. tool_cpu: o = the no-draft "
        "tool's CPU ms per round - tau_T(1), V(0) = tau_T(1) + o, against the CPU speedup over "
        "the no-draft tool. Round mix: logged tokens x V(0) / sum over logged rounds of "
        "V(k_r), a round of k_r = 0 drafts costing tau_T(1) + o",
        "table": table,
    }


if __name__ == "__main__":
    sys.exit(main())
