"""llama.cpp on the bundled models: verify-pass times and speculative throughput on this CPU.

Needs ``make llama-cpp``. Exports the bundled target (each ``--outtypes``) and the bundled draft
(bf16) to GGUF with ``specmoe export`` in a temporary folder, then writes under ``--out``
(default ``results/cpu/llamacpp``):

``llamacpp_verify.json``      llama-bench: one pass of n = 1..9 tokens on a KV cache of each ``--depths``
                     (``-p 1,...,9 -n 0 -d D -r R -t 1 -fa off``), per weight type: every
                     repetition's time, median and mean (ms)
``llamacpp_throughput.json``  per weight type: plain decoding (llama-bench ``-p 0 -n T -d C``, C the
                     prompt length; before and after, and once just before each speculative
                     run for a paired speedup) and draft-model speculative decoding
                     (llama-speculative-simple, greedy, k = 1..8 drafts a round) on
                     ``--num-prompts`` validation documents of C tokens, ``--repeats`` runs
                     each: tokens/s as llama.cpp reports it, accepted and drafted tokens
``rounds/<type>/k=<k>/``   round logs of one logged run per (type, k, prompt): rounds from
                     llama.cpp's debug log (which slows that run; its throughput is not used),
                     routing replayed in specmoe's engine
``runs.json``        the command, llama.cpp version, machine load before and after

With ``--synthetic`` it writes only ``synthetic.json`` (bf16, with its own command and load):
llama-server with the draft model at k = 1..8 and llama.cpp's synthetic acceptance at 11 rates
a = 0.2..0.98 (``--spec-synth-rates a,a^2,...,a^k``), on the same prompts, against the same
server without a draft: tokens/s as the server reports them, drafted and accepted tokens.

Usage: ``python scripts/llamacpp_runs.py [--out DIR] [--quick]``
"""

from __future__ import annotations

import argparse
import os
import platform
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


def _ints(text: str) -> list[int]:
    if ".." in text:
        lo, hi = (int(x) for x in text.split(".."))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",") if x.strip()]


def _prompts(count: int, context: int) -> list[tuple[str, str]]:
    """The first ``count`` validation documents with at least ``context`` tokens, cut to
    ``context`` tokens of the bundled tokenizer and decoded back to text."""
    from specmoe.data import corpus
    from specmoe.engine.models import load_tokenizer

    tok = load_tokenizer("bundled")
    out = []
    for name, text in corpus.documents("validation"):
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) >= context:
            out.append((name, tok.decode(ids[:context])))
        if len(out) == count:
            return out
    raise SystemExit(f"only {len(out)} validation documents have {context} tokens")


def _shown_path(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (no machine's paths in
    committed results)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _pass(t: Any) -> dict[str, Any]:
    return {
        "n": t.n_prompt or t.n_gen,
        "depth": t.depth,
        "median_ms": t.median_ms,
        "mean_ms": t.mean_ms,
        "min_ms": min(t.samples_ms),
        "samples_ms": list(t.samples_ms),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "results" / "cpu" / "llamacpp"))
    ap.add_argument("--outtypes", default="bf16,f32")
    ap.add_argument("--depths", default="512,2048")
    ap.add_argument("--reps", type=int, default=50, help="llama-bench repetitions")
    ap.add_argument("--k", default="1..8", help="draft lengths")
    ap.add_argument("--num-prompts", type=int, default=3)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3, help="throughput runs per (k, prompt)")
    ap.add_argument("--synthetic", action="store_true", help="only the synthetic-acceptance grid")
    ap.add_argument(
        "--quick", action="store_true", help="a minute's subset into out/llamacpp-quick"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.out = str(ROOT / "out" / "llamacpp-quick")
        args.reps, args.k, args.num_prompts, args.tokens, args.repeats = 5, "1,4", 1, 64, 1
        args.depths = "512"
    llamacpp.require_built()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.synthetic:
        return synthetic(args, out, argv)
    from specmoe.cli import main as specmoe
    from specmoe.engine.models import load_model

    t0, load0 = time.time(), os.getloadavg()
    types = [t for t in args.outtypes.split(",") if t]
    depths, ks = _ints(args.depths), _ints(args.k)
    prompts = _prompts(args.num_prompts, args.context)
    model = load_model("bundled")
    verify: dict[str, Any] = {}
    throughput: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="specmoe-gguf-") as tmp:
        draft = Path(tmp) / "draft-bf16.gguf"
        assert specmoe(["export", "--model", "bundled-draft", "--out", str(draft)]) == 0
        for ty in types:
            gguf = Path(tmp) / f"bundled-{ty}.gguf"
            assert (
                specmoe(["export", "--model", "bundled", "--outtype", ty, "--out", str(gguf)]) == 0
            )
            print(f"{ty}: verify passes", file=sys.stderr)
            verify[ty] = {
                str(d): [
                    _pass(t)
                    for t in llamacpp.bench_verify(
                        gguf, n_values=tuple(range(1, 10)), depth=d, repeats=args.reps
                    )
                ]
                for d in depths
            }

            def plain_decode(gguf: Path = gguf) -> Any:
                return llamacpp.bench_decode(
                    gguf, tokens=args.tokens, depth=args.context, repeats=max(args.repeats, 3)
                )

            # plain decoding before and after the speculative runs (the machine is shared)
            plain_runs = [plain_decode()]
            plain_tps = plain_runs[0].tokens_per_s
            rows = []
            for k in ks:
                for pi, (name, text) in enumerate(prompts):
                    tps, acc, dr, pred, paired = [], [], [], [], []
                    for _ in range(args.repeats):
                        # a plain decode of the same length just before: a paired speedup
                        # that a slow drift of the machine's load cancels from
                        base = llamacpp.bench_decode(
                            gguf, tokens=args.tokens, depth=args.context, repeats=1
                        )
                        run = llamacpp.run_speculative(
                            gguf, draft, text, k=k, n_predict=args.tokens, rounds=False
                        )
                        tps.append(run.tokens_per_s)
                        paired.append(run.tokens_per_s / base.tokens_per_s)
                        acc.append(run.n_accept)
                        dr.append(run.n_drafted)
                        pred.append(run.n_predict)
                    logged = llamacpp.run_speculative(gguf, draft, text, k=k, n_predict=args.tokens)
                    ids = llamacpp.tokenize(gguf, text)
                    llamacpp.write_round_log(
                        logged,
                        out / "rounds" / ty / f"k={k}",
                        model=model,
                        prompt_ids=ids,
                        run_id=f"llama.cpp/{ty}/draft-model/k={k}",
                        prompt_id=name,
                        budget=k,
                    )
                    rows.append(
                        {
                            "k": k,
                            "prompt": name,
                            "prompt_tokens": logged.n_input,
                            "tokens_per_s": tps,
                            "median_tokens_per_s": float(np.median(tps)),
                            "max_tokens_per_s": float(np.max(tps)),
                            "n_predict": pred,
                            "n_accept": acc,
                            "n_drafted": dr,
                            "acceptance": float(np.sum(acc) / np.sum(dr)),
                            "speedup_vs_plain_before": float(np.median(tps)) / plain_tps,
                            "paired_speedups": paired,
                            "median_paired_speedup": float(np.median(paired)),
                        }
                    )
                    print(
                        f"{ty} k={k} {pi}: {np.median(tps):.0f} tok/s "
                        f"(plain {plain_tps:.0f}), acceptance {rows[-1]['acceptance']:.2f}",
                        file=sys.stderr,
                    )
            plain_runs.append(plain_decode())
            throughput[ty] = {
                "plain": [{**_pass(p), "tokens_per_s": p.tokens_per_s} for p in plain_runs],
                "draft_model": rows,
            }
    atomic_write_json(
        out / "llamacpp_verify.json", {"llama_cpp": llamacpp.VERSION, "verify": verify}
    )
    atomic_write_json(
        out / "llamacpp_throughput.json", {"llama_cpp": llamacpp.VERSION, "throughput": throughput}
    )
    atomic_write_json(
        out / "runs.json",
        {
            "command": "python scripts/llamacpp_runs.py " + " ".join(argv or sys.argv[1:]),
            "options": {**vars(args), "out": _shown_path(out)},
            "llama_cpp": llamacpp.VERSION,
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_before": load0,
            "load_after": os.getloadavg(),
            "wall_s": time.time() - t0,
        },
    )
    return 0


def synthetic(args: argparse.Namespace, out: Path, argv: list[str] | None) -> int:
    """The synthetic-acceptance grid into ``out/synthetic.json``."""
    from specmoe.cli import main as specmoe
    from specmoe.engines.llamacpp_server import serve_completion, synthetic_run

    t0, load0 = time.time(), os.getloadavg()
    ks = _ints(args.k)
    rates = [float(x) for x in np.linspace(0.2, 0.98, 11)]
    prompts = _prompts(args.num_prompts, args.context)
    rows, plain = [], []
    with tempfile.TemporaryDirectory(prefix="specmoe-gguf-") as tmp:
        draft, gguf = Path(tmp) / "draft-bf16.gguf", Path(tmp) / "bundled-bf16.gguf"
        assert specmoe(["export", "--model", "bundled-draft", "--out", str(draft)]) == 0
        assert specmoe(["export", "--model", "bundled", "--out", str(gguf)]) == 0
        for name, text in prompts:
            t = serve_completion(gguf, text, n_predict=args.tokens)
            plain.append({"prompt": name, "when": "before", "tokens_per_s": t.tokens_per_s})
        for k in ks:
            for a in rates:
                for name, text in prompts:
                    t = synthetic_run(gguf, draft, text, k=k, acceptance=a, n_predict=args.tokens)
                    rows.append(
                        {
                            "k": k,
                            "acceptance": a,
                            "prompt": name,
                            "tokens_per_s": t.tokens_per_s,
                            "predicted_n": t.predicted_n,
                            "draft_n": t.draft_n,
                            "draft_n_accepted": t.draft_n_accepted,
                        }
                    )
                print(
                    f"synthetic k={k} a={a:.3f}: {rows[-1]['tokens_per_s']:.0f} tok/s",
                    file=sys.stderr,
                )
        for name, text in prompts:
            t = serve_completion(gguf, text, n_predict=args.tokens)
            plain.append({"prompt": name, "when": "after", "tokens_per_s": t.tokens_per_s})
    atomic_write_json(
        out / "synthetic.json",
        {
            "llama_cpp": llamacpp.VERSION,
            "command": "python scripts/llamacpp_runs.py " + " ".join(argv or sys.argv[1:]),
            "weights": "bf16",
            "tokens": args.tokens,
            "plain": plain,
            "synthetic": rows,
            "load_before": load0,
            "load_after": os.getloadavg(),
            "wall_s": time.time() - t0,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
