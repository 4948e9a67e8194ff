"""The verification passes of speculative rounds against the verify sweep's passes of the same
size, interleaved on one llama.cpp engine (one thread, thread-CPU clock).

The campaigns score the prediction of a speculative round against the verify sweep's τ(n) and
the throughput of real generations; when the two disagree about the cost of a round at one
draft length, this says which pass differs and under which condition. A repetition runs, in
an order rotated from one repetition to the next, on one prompt of ``--depth`` tokens:

- ``sweep``: :func:`specmoe.engine.measure.verify_passes` with ``prime`` (each timed pass of n
  tokens follows an untimed one of the same tokens, llama.cpp's graph reused; the window is
  the prompt's last token and its greedy continuation; the cache ``depth - 1`` tokens);
- ``repeat``: the same window timed ``--repeat`` times in a row at the same depth (cropped
  back between), as ``llama-bench -r`` repeats a batch; the median of all but the first;
- ``train``: for each n, ``--repeat`` passes of n tokens in a row at the same depth, each on
  the next window of the prompt's greedy continuation (the window moved by one token, so
  each pass follows one of its own size on other tokens, as a generation's rounds at one
  draft length do); all but the first;
- ``benchmark``: one cell of the whole-pass benchmark
  (:func:`specmoe.engines.llamacpp_ops.time_llamacpp_operations` with ``prime``: its
  un-profiled pass of each n, after an untimed one of the same window);
- ``benchmark-train``: the same cell with ``train = --repeat`` (``specmoe bench --pass-train``:
  each n's un-profiled pass the median of a train, before the cell's profiled passes);
- ``cell``, ``cell-profile``, ``cell-routing``: the benchmark's cell taken apart, the same
  windows and order: its primed pass alone, then with the profiled pass after it, then with
  the routing pass after it (``benchmark`` has both);
- ``gen-k<k>-a<a>``: :func:`specmoe.engine.speculative.speculative_generate` with the oracle
  drafter (the target's greedy continuation, each draft replaced with probability 1 - a by a
  token drawn uniformly from the vocabulary) at fixed k for ``--tokens`` tokens: the time of
  each round's verification pass of k + 1 tokens (the first round of a generation left out:
  it builds the graph), as the campaigns' throughput units make them;
- ``fixed-k<k>-a<a>``: the same rounds' windows (current token and drafts, right or wrong
  as the generation drew them) replayed at the prompt's depth, each after the one before as
  in the generation, so that the depth's growth and the tokens' content are told apart.

With ``--settle``, also: after each of several passes that differ from a one-token pass (the
prefill, one pass of 2 or 9 tokens, a greedy decode in the scratch context, a profiled pass),
``--repeat`` one-token passes in a row, and their median time by position (``settle``): how
many passes the one-token pass takes to come back to its settled time.

Prints one JSON record: for every variant and n, the median pass (ms) pooled over
repetitions, the median over repetitions of each repetition's median over the sweep's of the
same repetition, and its 10th/90th percentiles.

    python benchmarks/llamacpp_round_passes.py --gguf MODEL.gguf [--depth 512] [--reps 12]
        [--ks 1,2,3] [--acceptance 0.668,1.0] [--tokens 64] [--repeat 12] [--settle] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # its sibling modules, when loaded from a file
    sys.path.insert(0, str(HERE))

from _record import add_pass_args, check_pass_args, emit, pass_fields, run_fields  # noqa: E402

from specmoe.engines import llamacpp  # noqa: E402


def _floats(text: str, what: str, ap) -> list[float]:
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        ap.error(f"{what}: {text!r} is not a comma-separated list of numbers")
    if not vals:
        ap.error(f"{what}: empty")
    return vals


def sweep(eng, prompt: list[int], ns: list[int]) -> dict[int, list[float]]:
    from specmoe.engine.measure import verify_passes

    res = verify_passes(
        eng, [("p", prompt)], settings=("dedup",), n_values=ns, repeats=1, warmup=0, prime=True
    )
    return {x["n"]: [x["t_ms"]] for x in res["records"]}


def repeat(eng, prompt: list[int], ns: list[int], times: int) -> dict[int, list[float]]:
    """Each n's window timed ``times`` times in a row at the prompt's depth; all but the first."""
    from specmoe.engine.speculative import crop_cache, new_cache

    kv = new_cache(eng.model)
    eng.prefill(kv, prompt[:-1])
    ctx = len(prompt) - 1
    cont = eng.greedy(prompt, max(ns) - 1)
    out: dict[int, list[float]] = {}
    for n in ns:
        window = [prompt[-1], *cont[: n - 1]]
        ts = []
        for _ in range(times):
            ts.append(eng.forward(kv, window).t_ms)
            crop_cache(kv, ctx)
        out[n] = ts[1:]
    return out


def train(eng, prompt: list[int], ns: list[int], times: int, cont: list[int]):
    """Each n: ``times`` passes in a row at the prompt's depth, the window moved by one token
    of the greedy continuation ``cont`` each time; all but the first."""
    from specmoe.engine.speculative import crop_cache, new_cache

    kv = new_cache(eng.model)
    eng.prefill(kv, prompt[:-1])
    ctx = len(prompt) - 1
    seq = [prompt[-1], *cont]
    out: dict[int, list[float]] = {}
    for n in ns:
        ts = []
        for i in range(times):
            ts.append(eng.forward(kv, seq[i : i + n]).t_ms)
            crop_cache(kv, ctx)
        out[n] = ts[1:]
    return out


def benchmark(eng, prompt: list[int], ns: list[int], cont: list[int], train: int = 0):
    """One cell of the whole-pass benchmark: primed (``train`` 0) or with trains."""
    from specmoe.engines.llamacpp_ops import time_llamacpp_operations

    d = len(prompt)
    rec, _ = time_llamacpp_operations(
        eng, [*prompt, *cont], n_values=ns, depths=[d], reps=1, warmup=0, progress=False,
        prime=not train, train=train,
    )  # fmt: skip
    return {n: [float(rec.ms["fwd"][0, i, 0])] for i, n in enumerate(ns)}


def cell(eng, prompt, ns, cont, rep: int, profile: bool, routing: bool):
    """The whole-pass benchmark's cell (``time_llamacpp_operations``, one repetition, its
    windows and rotated order) with its profiled and routing passes each on or off."""
    from specmoe.engine.speculative import crop_cache, new_cache

    tokens = [*prompt, *cont]
    d = len(prompt)
    tail = len(tokens) - d
    kv = new_cache(eng.model)
    eng.prefill(kv, prompt)
    out: dict[int, list[float]] = {}
    for j in range(len(ns)):
        ni = (j + rep) % len(ns)
        n = ns[ni]
        s = d + (rep * 7 + ni) % (tail - n + 1)
        window = tokens[s : s + n]
        eng.forward(kv, window)
        crop_cache(kv, d)
        out[n] = [eng.forward(kv, window).t_ms]
        crop_cache(kv, d)
        if profile:
            eng.profile(kv, window)
            crop_cache(kv, d)
        if routing:
            eng.record_routing = True
            try:
                eng.forward(kv, window)
            finally:
                eng.record_routing = False
            crop_cache(kv, d)
    return out


def generation(eng, prompt, k: int, a: float, tokens: int, seed: int, refs: dict):
    """The rounds of one oracle generation at fixed k: [(window, accepted, t_ms)]."""
    from specmoe.engine.drafters import OracleDrafter
    from specmoe.engine.speculative import speculative_generate

    d = OracleDrafter(eng.greedy, acceptance=a, vocab_size=eng.vocab_size, seed=seed, cache=refs)
    gen = speculative_generate(eng, prompt, d, budget=k, max_new_tokens=tokens)
    return [(r.k, r.accepted, r.t_verify_ms, r.draft_tokens) for r in gen.rounds], gen.tokens


def replay(eng, prompt: list[int], rounds, emitted: list[int]) -> dict[int, list[float]]:
    """The generation's windows again, each at the prompt's depth after the one before."""
    from specmoe.engine.speculative import crop_cache, new_cache

    kv = new_cache(eng.model)
    eng.prefill(kv, prompt[:-1])
    ctx = len(prompt) - 1
    out: dict[int, list[float]] = {}
    current, pos = prompt[-1], 0
    for i, (k, acc, _, drafts) in enumerate(rounds):
        t = eng.forward(kv, [current, *drafts]).t_ms
        crop_cache(kv, ctx)
        if i > 0:
            out.setdefault(k + 1, []).append(t)
        pos += acc + 1
        current = emitted[pos - 1]
    return out


def measure(eng, docs, args) -> dict[str, list[dict[int, list[float]]]]:
    ns = sorted({1, 2, 3, 4, *[k + 1 for k in args.ks]})
    cells = ["cell", "cell-profile", "cell-routing"]
    names = ["sweep", "repeat", "train", "benchmark", "benchmark-train", *cells, "gen-k0"]
    for k in args.ks:
        for a in args.acceptance:
            names += [f"gen-k{k}-a{a:g}", f"fixed-k{k}-a{a:g}"]
    out: dict[str, list[dict[int, list[float]]]] = {v: [] for v in names}
    for r in range(args.reps):
        _, toks = docs[r % len(docs)]
        prompt = [int(t) for t in toks[: args.depth]]
        refs: dict = {}
        cont = eng.greedy(prompt, 2 * args.repeat + 2 * max(ns) + 8)
        kinds = ["sweep", "repeat", "train", "benchmark", "benchmark-train", *cells, "gen-k0"]
        kinds += [(k, a) for k in args.ks for a in args.acceptance]
        shift = r % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
            if kind == "sweep":
                out["sweep"].append(sweep(eng, prompt, ns))
            elif kind == "repeat":
                out["repeat"].append(repeat(eng, prompt, ns, args.repeat))
            elif kind == "train":
                out["train"].append(train(eng, prompt, ns, args.repeat, cont))
            elif kind == "benchmark":
                out["benchmark"].append(benchmark(eng, prompt, ns, cont))
            elif kind == "benchmark-train":
                out[kind].append(benchmark(eng, prompt, ns, cont, args.repeat))
            elif kind in cells:
                prof, rout = kind == "cell-profile", kind == "cell-routing"
                out[kind].append(cell(eng, prompt, ns, cont, r, prof, rout))
            elif kind == "gen-k0":
                rounds, _ = generation(eng, prompt, 0, 1.0, args.tokens, 1000 * r, refs)
                out["gen-k0"].append({1: [t for i, (_, _, t, _) in enumerate(rounds) if i > 0]})
            else:
                k, a = kind
                rounds, emitted = generation(eng, prompt, k, a, args.tokens, 1000 * r + k, refs)
                by_n: dict[int, list[float]] = {}
                for i, (kk, _, t, _) in enumerate(rounds):
                    if i > 0:
                        by_n.setdefault(kk + 1, []).append(t)
                out[f"gen-k{k}-a{a:g}"].append(by_n)
                out[f"fixed-k{k}-a{a:g}"].append(replay(eng, prompt, rounds, emitted))
        print(f"repetition {r + 1}/{args.reps}", file=sys.stderr, flush=True)
    return out


SETTLE_AFTER = ("prefill", "n=2", "n=9", "scratch greedy", "profile", "settled")


def settle(eng, prompt: list[int], times: int) -> dict[str, list[float]]:
    """One-token passes in a row at the prompt's depth after each kind of other pass
    (:data:`SETTLE_AFTER`; ``settled``: right after the previous row), by position."""
    from specmoe.engine.speculative import crop_cache, new_cache

    cont = eng.greedy(prompt, times + 9)
    seq = [prompt[-1], *cont]
    kv = new_cache(eng.model)
    ctx = len(prompt) - 1
    out: dict[str, list[float]] = {}
    for kind in SETTLE_AFTER:
        if kind == "prefill":
            eng.prefill(kv, prompt[:-1])
        elif kind in ("n=2", "n=9"):
            eng.forward(kv, seq[: int(kind[2:])])
            crop_cache(kv, ctx)
        elif kind == "scratch greedy":
            eng.greedy(prompt[:64], 2)
        elif kind == "profile":
            eng.profile(kv, seq[:1])
            crop_cache(kv, ctx)
        row = []
        for i in range(times):
            row.append(eng.forward(kv, seq[i : i + 1]).t_ms)
            crop_cache(kv, ctx)
        out[kind] = row
    return out


def summarize(times: dict[str, list[dict[int, list[float]]]]) -> dict:
    """Per variant and n: pooled median, and the paired per-repetition ratio to the sweep."""
    res: dict = {}
    sw = times["sweep"]
    for name, reps in times.items():
        row: dict = {}
        ns = sorted({n for rep in reps for n in rep})
        for n in ns:
            pooled = [t for rep in reps for t in rep.get(n, [])]
            ratios = [
                float(np.median(rep[n])) / s[n][0]
                for rep, s in zip(reps, sw, strict=True)
                if rep.get(n) and n in s
            ]
            row[str(n)] = {
                "passes": len(pooled),
                "median_ms": float(np.median(pooled)),
                "over_sweep": None
                if not ratios
                else {
                    "median": float(np.median(ratios)),
                    "p10": float(np.percentile(ratios, 10)),
                    "p90": float(np.percentile(ratios, 90)),
                },
            }
        res[name] = row
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_pass_args(ap, "repetitions (default 12)")
    ap.add_argument("--ks", default="1,2", help="draft lengths of the generations (default 1,2)")
    ap.add_argument(
        "--acceptance", default="0.668,1.0", help="oracle acceptance rates (default 0.668,1.0)"
    )
    ap.add_argument("--tokens", type=int, default=64, help="tokens a generation (default 64)")
    ap.add_argument("--repeat", type=int, default=12, help="passes in a row, `repeat` (12)")
    ap.add_argument(
        "--settle", action="store_true", help="also the one-token passes after other passes"
    )
    ap.add_argument(
        "--n-ctx", type=int, default=4096, help="the context's size (default 4096, the campaigns')"
    )
    args = ap.parse_args(argv)
    check_pass_args(ap, args)
    ks = _floats(args.ks, "--ks", ap)
    if any(k != int(k) or not 1 <= k <= 8 for k in ks):
        ap.error(f"--ks: {args.ks!r}: draft lengths must be whole numbers in 1..8")
    args.ks = [int(k) for k in ks]
    args.acceptance = _floats(args.acceptance, "--acceptance", ap)
    if any(not 0.0 <= a <= 1.0 for a in args.acceptance):
        ap.error(f"--acceptance: {args.acceptance}: rates must be in [0, 1]")
    if args.tokens < 8 or args.repeat < 2:
        ap.error("--tokens must be at least 8 and --repeat at least 2")
    if args.n_ctx < args.depth + args.tokens + 16:
        ap.error(f"--n-ctx: {args.n_ctx} does not hold --depth + --tokens + 16 tokens")
    llamacpp.require_built()
    from specmoe.engine.models import load_tokenizer
    from specmoe.engine.runner import validation_prompts
    from specmoe.engines.llamacpp_pass import LlamaCppEngine

    tok = load_tokenizer("bundled")
    docs = validation_prompts(tok, count=8, context=args.depth + 256)
    load0, t0 = os.getloadavg(), time.time()
    with LlamaCppEngine(args.gguf, n_ctx=args.n_ctx, threads=1, clock="cpu") as eng:
        times = measure(eng, docs, args)
        settled = None
        if args.settle:
            rows = [settle(eng, [int(t) for t in docs[r % len(docs)][1][: args.depth]],
                           args.repeat) for r in range(args.reps)]  # fmt: skip
            settled = {
                k: np.median([row[k] for row in rows], axis=0).tolist() for k in SETTLE_AFTER
            }
    record = {
        **pass_fields("llamacpp_round_passes", args),
        "ks": args.ks,
        "acceptance": args.acceptance,
        "tokens": args.tokens,
        "repeat": args.repeat,
        "n_ctx": args.n_ctx,
        "reps": args.reps,
        "variants": summarize(times),
        "settle": settled,
        "samples_ms": {
            name: [{str(n): v for n, v in rep.items()} for rep in reps]
            for name, reps in times.items()
        },
        **run_fields(load0, t0),
    }
    emit(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
