"""Check a lifted model (``specmoe lift``) against the bundled model, in transformers and llama.cpp.

    python scripts/lift_check.py --lifted DIR --stage hf --out results/cpu/lifted/lift_check.json
    python scripts/lift_check.py --lifted DIR --stage llamacpp --gguf FILE \\
        --out results/cpu/lifted/lift_check.json

``--stage hf`` (transformers): greedy tokens on ``--prompts`` stdlib prompts (the first
``--prompt-chars`` characters of validation-split documents, ``--greedy`` tokens each) from
the bundled model and the lifted one, each computed in bfloat16 and in float32 (the lifted
model's float32 one decoder layer at a time, :func:`specmoe.engine.lift_check.float32_by_layer`);
teacher-forced routing over the first ``--tokens`` tokens of the validation split (one
window), the lifted model's source layers against the bundled model's and its extra layers
against the brute-force expectation, per layer and dtype; the bundled model's own bf16-against-
fp32 routing agreement (the noise floor of bf16); the bytes of every layer against the preset's.

``--stage llamacpp``: the GGUF export of ``--lifted`` by ``specmoe export`` (unless ``--gguf``
exists), llama.cpp's greedy text on the same prompts against the bundled model's float32 greedy
tokens, and llama-bench verify passes at n = 1 and 9, depth ``--depth``,
one thread, flash attention off. Each stage adds its section to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _prompts(tok, n: int, chars: int) -> list[str]:
    from specmoe.data.corpus import documents

    docs = [t for _, t in documents("validation") if len(t) >= chars]
    return [d[:chars] for d in docs[:n]]


def _greedy(model, ids, n):
    from specmoe.engine.speculative import Engine

    with Engine(model) as eng:
        return eng.greedy(ids, n)


def stage_hf(args) -> dict:
    import numpy as np

    from specmoe.data.corpus import documents
    from specmoe.engine import lift
    from specmoe.engine.lift_check import (
        extra_layer_routing,
        final_residual,
        float32_by_layer,
        routing_agreement,
        teacher_forced,
    )
    from specmoe.engine.models import load_model, load_tokenizer

    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:6.0f}s] {msg}", file=sys.stderr, flush=True)

    tok = load_tokenizer("bundled")
    docs = documents("validation", limit_tokens=args.tokens)
    ids = [t for _, d in docs for t in tok.encode(d, add_special_tokens=False)][: args.tokens]
    prompts = _prompts(tok, args.prompts, args.prompt_chars)
    p_ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    src = {"fp32": load_model("bundled"), "bf16": load_model("bundled", dtype="bfloat16")}
    ref = {k: teacher_forced(m, ids) for k, m in src.items()}
    resid = {k: final_residual(m, ids) for k, m in src.items()}
    greedy_src = {k: [_greedy(m, p, args.greedy) for p in p_ids] for k, m in src.items()}
    log("bundled model done")
    lifted = load_model(args.lifted, dtype="bfloat16")
    n_layers = len(lifted.model.layers)
    n_src = len(src["fp32"].model.layers)
    extra = list(range(n_src, n_layers))
    log(f"lifted model loaded: {n_layers} layers")
    out: dict = {"tokens_teacher_forced": len(ids), "prompts": [], "routing": {}, "greedy": {}}

    def check(dtype: str) -> None:
        got = teacher_forced(lifted, ids)
        expect = extra_layer_routing(src[dtype], resid[dtype], extra) if extra else None
        src_agree = routing_agreement(got[:, :n_src], ref[dtype])
        row = {
            "source_layers_per_layer": src_agree.tolist(),
            "source_layers": float(src_agree.mean()),
        }
        if extra:
            ex = routing_agreement(got[:, n_src:], expect)
            row.update(extra_layers_per_layer=ex.tolist(), extra_layers=float(ex.mean()))
            row["all_pairs"] = float(np.concatenate([src_agree, ex]).mean())
        out["routing"][dtype] = row
        log(f"routing {dtype}: {row}")
        lifted_greedy = [_greedy(lifted, p, args.greedy) for p in p_ids]
        out["greedy"][dtype] = {
            "equal_per_prompt": [a == b for a, b in zip(lifted_greedy, greedy_src[dtype])],
            "lifted": lifted_greedy,
            "bundled": greedy_src[dtype],
        }
        log(f"greedy {dtype}: {out['greedy'][dtype]['equal_per_prompt']}")

    check("bf16")
    with float32_by_layer(lifted):
        check("fp32")
    noise = routing_agreement(ref["bf16"], ref["fp32"])
    out["routing"]["bundled_bf16_vs_fp32"] = {
        "per_layer": noise.tolist(),
        "mean": float(noise.mean()),
    }
    out["greedy"]["bundled_bf16_equals_fp32"] = [
        a == b for a, b in zip(greedy_src["bf16"], greedy_src["fp32"])
    ]
    for p, i, g in zip(prompts, p_ids, greedy_src["fp32"]):
        out["prompts"].append({"text": p, "ids": i, "expected_text": tok.decode(i + g)})
    rows = lift.checkpoint_layer_bytes(args.lifted)
    preset = lift.preset_layer_bytes()
    out["bytes"] = {
        "preset": preset,
        "per_layer": rows,
        "experts_equal_preset": all(r["experts"] == preset["experts"] for r in rows),
        "attention_router_equal_preset": all(
            r["attention"] + r["router"] == preset["attention_router"] for r in rows
        ),
    }
    log("done")
    return out


def _llamacpp_routing(args, gguf: Path) -> dict:
    """llama.cpp's teacher-forced routing of the hf stage's tokens (one sequence from position
    0, its eval callback) against the bundled model's float32 routing (source layers) and the
    brute-force expectation (extra layers)."""
    import numpy as np

    from specmoe.data.corpus import documents
    from specmoe.engine.lift_check import (
        extra_layer_routing,
        final_residual,
        routing_agreement,
        teacher_forced,
    )
    from specmoe.engine.models import load_model, load_tokenizer
    from specmoe.engines.llamacpp_routing import record_routing

    tok = load_tokenizer("bundled")
    docs = documents("validation", limit_tokens=args.tokens)
    ids = [t for _, d in docs for t in tok.encode(d, add_special_tokens=False)][: args.tokens]
    src = load_model("bundled")
    ref = teacher_forced(src, ids)
    n_src = ref.shape[1]
    t = time.time()
    rec = record_routing(gguf, ids, batch=64, threads=args.threads)
    got = rec.experts
    extra = list(range(n_src, got.shape[1]))
    src_agree = routing_agreement(got[:, :n_src], ref)
    row = {
        "tokens": len(ids),
        "kv_type": "f16",
        "record_s": time.time() - t,
        "source_layers_per_layer": src_agree.tolist(),
        "source_layers": float(src_agree.mean()),
    }
    if extra:
        expect = extra_layer_routing(src, final_residual(src, ids), extra)
        ex = routing_agreement(got[:, n_src:], expect)
        row.update(extra_layers_per_layer=ex.tolist(), extra_layers=float(ex.mean()))
        row["all_pairs"] = float(np.concatenate([src_agree, ex]).mean())
    return row


def _expected(args) -> list[dict]:
    """The prompts and the bundled model's float32 greedy text after each (prompt + tokens)."""
    from specmoe.engine.models import load_model, load_tokenizer

    tok = load_tokenizer("bundled")
    model = load_model("bundled")
    out = []
    for p in _prompts(tok, args.prompts, args.prompt_chars):
        ids = tok.encode(p, add_special_tokens=False)
        out.append({"text": p, "expected_text": tok.decode(ids + _greedy(model, ids, args.greedy))})
    return out


def stage_llamacpp(args) -> dict:
    from specmoe.engines import llamacpp

    gguf = Path(args.gguf)
    out: dict = {"gguf": gguf.name, "llama_cpp": llamacpp.VERSION}
    if not gguf.is_file():
        t = time.time()
        cmd = [sys.executable, "-m", "specmoe.cli", "export", "--format", "gguf"]
        cmd += ["--model", str(args.lifted), "--out", str(gguf), "--outtype", "bf16"]
        subprocess.run(cmd, check=True, cwd=ROOT)
        out["export_s"] = time.time() - t
    out["gguf_bytes"] = gguf.stat().st_size
    eq = []
    for p in _expected(args):
        text = llamacpp.greedy_text(gguf, p["text"], n_tokens=args.greedy)
        eq.append(text == p["expected_text"])
        print(f"llama.cpp greedy equal: {eq[-1]}", file=sys.stderr, flush=True)
    out["greedy_equal_bundled_fp32_per_prompt"] = eq
    out["routing"] = _llamacpp_routing(args, gguf)
    print(json.dumps(out["routing"]), file=sys.stderr, flush=True)
    t = time.time()
    passes = llamacpp.bench_verify(
        gguf, n_values=(1, 9), depth=args.depth, repeats=args.repeats, threads=1
    )
    out["bench"] = {
        "depth": args.depth,
        "threads": 1,
        "flash_attn": False,
        "repeats": args.repeats,
        "wall_s": time.time() - t,
        "passes": [
            {"n": r.n_prompt, "median_ms": r.median_ms, "samples_ms": list(r.samples_ms)}
            for r in passes
        ],
    }
    print(json.dumps(out["bench"]), file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    from specmoe._io import atomic_write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lifted", required=True, type=Path, help="the lifted model's folder")
    ap.add_argument("--stage", choices=("hf", "llamacpp"), required=True)
    ap.add_argument("--gguf", type=Path, help="GGUF file of --lifted (exported if absent)")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--prompt-chars", type=int, default=600)
    ap.add_argument("--greedy", type=int, default=32)
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="threads of the routing record")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    if args.stage == "llamacpp" and args.gguf is None:
        ap.error("--stage llamacpp needs --gguf")
    section = stage_hf(args) if args.stage == "hf" else stage_llamacpp(args)
    record = json.loads(args.out.read_text()) if args.out.is_file() else {}  # read last
    record["transformers" if args.stage == "hf" else "llama_cpp"] = section
    lift_info = json.loads((args.lifted / "lift.json").read_text())
    record.update(
        model=args.lifted.name,
        plan=lift_info["plan"],
        dtype=lift_info["dtype"],
        machine={"platform": platform.platform(), "processor": platform.processor()},
    )
    atomic_write_json(args.out, record)
    print(json.dumps({k: v for k, v in record.items() if k != "plan"}, default=str)[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
