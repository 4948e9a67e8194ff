"""Train the bundled tiny dense draft model (LlamaForCausalLM) for the bundled tiny OLMoE.

Same corpus (the stdlib train split) and the same tokenizer as the target, so its tokens are
the target's tokens. Plain next-token cross-entropy, AdamW, linear warmup and cosine decay,
seeded. Reports its validation loss (nats/token, consecutive 1024-token windows of the packed
validation split) and its greedy next-token agreement with the target on the same windows
(the share of positions where both argmaxes agree) into ``--results``.

Usage: ``python scripts/train_tiny_draft.py --steps 600 --seed 0``
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_tiny_model as tm

from specmoe._io import atomic_write_json
from specmoe.data import corpus


def make_config(a: argparse.Namespace, vocab: int, eos_id: int, pad_id: int) -> dict:
    return {
        "vocab_size": vocab,
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.heads,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
    }


@torch.no_grad()
def evaluate(draft, target, data: np.ndarray, seq: int, *, batch: int = 4):
    """(draft loss nats/token, greedy agreement with target or None, tokens)."""
    draft.eval()
    n = (len(data) - 1) // seq
    tot, cnt, agree = 0.0, 0, 0
    for b0 in range(0, n, batch):
        starts = range(b0 * seq, min(n, b0 + batch) * seq, seq)
        x = torch.from_numpy(np.stack([data[s : s + seq] for s in starts]).astype(np.int64))
        y = torch.from_numpy(np.stack([data[s + 1 : s + seq + 1] for s in starts]).astype(np.int64))
        lg = draft(x).logits.float()
        tot += F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1), reduction="sum").item()
        cnt += y.numel()
        if target is not None:
            agree += (target(x).logits.argmax(-1) == lg.argmax(-1)).sum().item()
    draft.train()
    return tot / cnt, (agree / cnt if target is not None else None), cnt


def main(argv: list[str] | None = None) -> int:
    from transformers import LlamaConfig, LlamaForCausalLM, OlmoeForCausalLM

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=tm.ROOT / "specmoe" / "data" / "tiny_draft")
    ap.add_argument("--target", type=Path, default=corpus.bundled_model_dir())
    ap.add_argument("--results", type=Path, default=tm.ROOT / "results" / "tiny_draft_train.json")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="float32")
    ap.add_argument("--log-every", type=int, default=25)
    a = ap.parse_args(argv)

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    t0 = time.time()
    log = lambda m: print(f"[{time.time() - t0:7.1f}s] {m}", file=sys.stderr, flush=True)  # noqa: E731

    tok = tm.load_tokenizer(a.target)
    eos_id, pad_id = tok.token_to_id(tm.EOS), tok.token_to_id(tm.PAD)
    train, val = tm.pack("train", tok, eos_id), tm.pack("validation", tok, eos_id)
    cfg = make_config(a, tok.get_vocab_size(), eos_id, pad_id)
    model = LlamaForCausalLM(LlamaConfig(**cfg, attn_implementation="sdpa"))
    n_params = sum(p.numel() for p in model.parameters())
    log(f"draft parameters: {n_params}")
    named = list(model.named_parameters())
    decay = [p for n, p in named if p.ndim >= 2 and "embed" not in n]
    rest = [p for n, p in named if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": a.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=a.lr,
        betas=(0.9, 0.95),
    )
    ema, history, t_train = None, [], time.time()
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = tm.lr_at(step, a)
        starts = rng.integers(0, len(train) - a.seq_len - 1, size=a.batch)
        x = torch.from_numpy(np.stack([train[s : s + a.seq_len] for s in starts]).astype(np.int64))
        y = torch.from_numpy(
            np.stack([train[s + 1 : s + a.seq_len + 1] for s in starts]).astype(np.int64)
        )
        lg = model(x).logits
        loss = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % a.log_every == 0 or step == a.steps - 1:
            el = time.time() - t_train
            log(
                f"step {step} ce {loss.item():.3f} (ema {ema:.3f}) "
                f"tok/s {(step + 1) * a.batch * a.seq_len / el:.0f}"
            )
            history.append(
                {"step": step, "train_ce": loss.item(), "train_ce_ema": ema, "elapsed_s": el}
            )
    train_wall = time.time() - t_train
    target = OlmoeForCausalLM.from_pretrained(
        str(a.target), local_files_only=True, dtype=torch.float32
    ).eval()
    log("evaluating draft loss and greedy agreement with the target")
    vloss, agree, vtok = evaluate(model, target, val, 1024)
    tloss, _, _ = evaluate(target, None, val, 1024)
    log(f"draft validation {vloss:.4f} nats/token, target {tloss:.4f}, agreement {agree:.4f}")
    model = model.to(getattr(torch, a.dtype))
    model.config.dtype = a.dtype
    model.save_pretrained(str(a.out))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (a.out / name).write_bytes((a.target / name).read_bytes())
    result = {
        "model": "tiny dense draft (LlamaForCausalLM)",
        "config": cfg,
        "parameters": n_params,
        "checkpoint_dtype": a.dtype,
        "checkpoint_bytes": (a.out / "model.safetensors").stat().st_size,
        "training": {
            "steps": a.steps,
            "seed": a.seed,
            "batch": a.batch,
            "seq_len": a.seq_len,
            "lr": a.lr,
            "warmup": a.warmup,
            "weight_decay": a.weight_decay,
            "tokens_seen": a.steps * a.batch * a.seq_len,
        },
        "train_loss_final_ema": ema,
        "validation_loss_nats_per_token": vloss,
        "target_validation_loss_nats_per_token": tloss,
        "greedy_agreement_with_target": agree,
        "validation_eval": {
            "tokens": vtok,
            "window": 1024,
            "how": "consecutive non-overlapping windows of the packed split; "
            "target in float32 through transformers",
        },
        "wall_time_s": {"training": train_wall, "total": time.time() - t0},
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "command": "python scripts/train_tiny_draft.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "history": history,
    }
    atomic_write_json(a.results, result)
    log(f"wrote {a.results}")
    return 0 if math.isfinite(vloss) else 1


if __name__ == "__main__":
    raise SystemExit(main())
