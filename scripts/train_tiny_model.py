"""Train the bundled tiny OLMoE from scratch on the stdlib corpus and export it in HF's layout.

Stages (each writes into ``--out``):

1. the tokenizer: byte-level BPE (``tokenizers``) trained on the *train* split, ``--vocab``
   entries including ``<|endoftext|>`` (id 0, the eos and document separator) and
   ``<|padding|>`` (id 1); saved as tokenizer.json + tokenizer_config.json;
2. the model: transformers' OLMoE architecture (64 experts, top-8, no renormalisation of the
   top-k weights, q/k RMSNorm over the full projection, RoPE) trained with :class:`TinyOlmoe`,
   a vectorised module of exactly the same math (tokens sorted by expert, one grouped matrix
   product per expert projection instead of HF's per-expert Python loop). Its parameter names
   are HF's, so the export is a ``load_state_dict`` into ``OlmoeForCausalLM`` and
   ``save_pretrained`` (bf16 safetensors);
3. the report: validation loss (nats/token), train loss, tokens seen, wall time, the routing's
   per-layer expert-usage entropy and next-token reuse rho(2), into ``--results``.

The loss is next-token cross-entropy plus ``router_aux_loss_coef`` (0.01, OLMoE's) times HF's
load-balancing loss (``load_balancing_loss_func``: N * sum_i f_i P_i over all layers' tokens)
plus OLMoE's router z-loss (coefficient 0.001, mean squared logsumexp of the router logits).

Usage: ``python scripts/train_tiny_model.py --steps 700 --seed 0 --out specmoe/data/tiny_olmoe``
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
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specmoe._io import atomic_write_json  # noqa: E402
from specmoe.data import corpus  # noqa: E402

EOS, PAD = "<|endoftext|>", "<|padding|>"


# ----------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(out: Path, *, vocab: int, model_max_length: int) -> None:
    """Byte-level BPE on the train split; saved so ``AutoTokenizer.from_pretrained`` loads it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[EOS, PAD],
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    docs = corpus.documents("train")
    tok.train_from_iterator((t for _, t in docs), trainer=trainer, length=len(docs))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, model_max_length=model_max_length
    )
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))


def load_tokenizer(out: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(out / "tokenizer.json"))


def pack(split: str, tok, eos_id: int) -> np.ndarray:
    """All documents of ``split`` tokenized and joined, each followed by eos: int32 [T]."""
    docs = corpus.documents(split)
    encs = tok.encode_batch([t for _, t in docs], add_special_tokens=False)
    parts = []
    for e in encs:
        parts.append(np.asarray(e.ids, dtype=np.int32))
        parts.append(np.asarray([eos_id], dtype=np.int32))
    return np.concatenate(parts)


# ----------------------------------------------------------------------------------------------
# the model: the math of transformers' OlmoeForCausalLM, vectorised, with HF's parameter names


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        h, nh = c["hidden_size"], c["num_attention_heads"]
        self.nh, self.hd = nh, h // nh
        self.q_proj = nn.Linear(h, h, bias=False)
        self.k_proj = nn.Linear(h, h, bias=False)
        self.v_proj = nn.Linear(h, h, bias=False)
        self.o_proj = nn.Linear(h, h, bias=False)
        self.q_norm = RMSNorm(h, c["rms_norm_eps"])
        self.k_norm = RMSNorm(h, c["rms_norm_eps"])

    def forward(self, x, cos, sin):  # x [B, S, H]; cos, sin [S, hd]
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x)).view(b, s, self.nh, self.hd).transpose(1, 2)
        k = self.k_norm(self.k_proj(x)).view(b, s, self.nh, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.nh, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.hd**-0.5)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


class Router(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(c["num_experts"], c["hidden_size"]))


class Experts(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        n, h, i = c["num_experts"], c["hidden_size"], c["intermediate_size"]
        self.gate_up_proj = nn.Parameter(torch.empty(n, 2 * i, h))  # [N, 2I, H]
        self.down_proj = nn.Parameter(torch.empty(n, h, i))  # [N, H, I]


def _grouped(x, w, counts, offs):
    """rows of x (sorted by expert) times w[e]^T for their expert e: [R, in] -> [R, out]."""
    if hasattr(F, "grouped_mm"):
        return F.grouped_mm(x, w.transpose(1, 2), offs=offs)
    parts = torch.split(x, counts)
    return torch.cat([p @ w[e].T for e, p in enumerate(parts)])


class SparseMoe(nn.Module):
    """Top-k softmax routing (no renormalisation unless norm_topk_prob) and SwiGLU experts."""

    def __init__(self, c: dict):
        super().__init__()
        self.gate = Router(c)
        self.experts = Experts(c)
        self.k, self.n = c["num_experts_per_tok"], c["num_experts"]
        self.norm_topk = c["norm_topk_prob"]

    def forward(self, x):  # x [T, H] -> [T, H], router logits [T, N], top-k ids [T, k]
        logits = F.linear(x, self.gate.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        topv, topi = torch.topk(probs, self.k, dim=-1)
        if self.norm_topk:
            topv = topv / topv.sum(-1, keepdim=True)
        topv = topv.to(x.dtype)
        flat = topi.reshape(-1)  # [T*k]
        order = torch.argsort(flat, stable=True)
        tok = order // self.k
        counts_t = torch.bincount(flat, minlength=self.n)
        offs = torch.cumsum(counts_t, 0).to(torch.int32)
        counts = counts_t.tolist()
        xs = x[tok]  # [T*k, H], grouped by expert
        gu = _grouped(xs, self.experts.gate_up_proj, counts, offs)
        g, u = gu.chunk(2, dim=-1)
        y = _grouped(F.silu(g) * u, self.experts.down_proj, counts, offs)
        y = y * topv.reshape(-1)[order, None]
        out = torch.zeros_like(x).index_add_(0, tok, y)
        return out, logits, topi


class Layer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = SparseMoe(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        b, s, h = x.shape
        m, logits, topi = self.mlp(self.post_attention_layernorm(x).reshape(-1, h))
        return x + m.view(b, s, h), logits, topi


class TinyOlmoe(nn.Module):
    """OlmoeForCausalLM's forward pass (attention by SDPA) with the same parameter names."""

    def __init__(self, c: dict):
        super().__init__()
        self.c = c
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.model.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.model.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        hd = c["hidden_size"] // c["num_attention_heads"]
        theta = c["rope_parameters"]["rope_theta"]
        inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float) / hd))
        self.register_buffer("inv_freq", inv, persistent=False)

    def init_weights(self, std: float) -> None:
        """HF's init: every linear, embedding, expert and router weight N(0, std); norms 1."""
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, ids):  # ids [B, S] -> logits [B, S, V], router logits and ids per layer
        s = ids.shape[1]
        freqs = torch.arange(s, dtype=torch.float)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.model.embed_tokens(ids)
        router_logits, router_ids = [], []
        for layer in self.model.layers:
            x, lg, ti = layer(x, cos, sin)
            router_logits.append(lg)
            router_ids.append(ti)
        return self.lm_head(self.model.norm(x)), router_logits, router_ids


def load_balancing_loss(router_logits, router_ids, num_experts: int) -> torch.Tensor:
    """HF's ``load_balancing_loss_func`` (no mask): N * sum_i f_i P_i over all layers' rows."""
    counts = torch.zeros(num_experts)
    probs = torch.zeros(num_experts)
    rows = 0
    for lg, ti in zip(router_logits, router_ids):
        counts = counts + torch.bincount(ti.reshape(-1), minlength=num_experts).float()
        probs = probs + torch.softmax(lg.float(), dim=-1).sum(0)
        rows += lg.shape[0]
    return num_experts * torch.sum((counts / rows) * (probs / rows))


def z_loss(router_logits) -> torch.Tensor:
    return torch.stack(
        [torch.logsumexp(lg.float(), -1).pow(2).mean() for lg in router_logits]
    ).mean()


# ----------------------------------------------------------------------------------------------
# routing statistics


# ----------------------------------------------------------------------------------------------
# training


def make_config(a: argparse.Namespace, vocab_size: int, eos_id: int, pad_id: int) -> dict:
    return {
        "vocab_size": vocab_size,
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.heads,
        "hidden_act": "silu",
        "max_position_embeddings": a.max_positions,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-5,
        "pad_token_id": pad_id,
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_bias": False,
        "clip_qkv": None,
        "num_experts_per_tok": 8,
        "num_experts": 64,
        "router_aux_loss_coef": a.aux_coef,
        "norm_topk_prob": False,
    }


def lr_at(step: int, a: argparse.Namespace) -> float:
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


@torch.no_grad()
def evaluate(
    model: TinyOlmoe,
    data: np.ndarray,
    seq: int,
    *,
    max_windows: int | None = None,
    eos_id: int,
    batch: int = 4,
):
    """Mean next-token loss (nats/token) over consecutive windows of ``seq`` targets.

    Returns (loss, tokens, routing stats over the windows, pairs crossing an eos excluded).
    """
    model.eval()
    n = (len(data) - 1) // seq
    if max_windows is not None:
        n = min(n, max_windows)
    tot, cnt = 0.0, 0
    layer_ids: list[list[np.ndarray]] = [[] for _ in model.model.layers]
    for b0 in range(0, n, batch):
        starts = range(b0 * seq, min(n, b0 + batch) * seq, seq)
        x = torch.from_numpy(np.stack([data[s : s + seq] for s in starts]).astype(np.int64))
        y = torch.from_numpy(np.stack([data[s + 1 : s + seq + 1] for s in starts]).astype(np.int64))
        logits, _, ids = model(x)
        tot += F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"
        ).item()
        cnt += y.numel()
        for li, ti in enumerate(ids):
            layer_ids[li].append(ti.view(x.shape[0], seq, -1).numpy())
    model.train()
    stats = None
    if layer_ids[0]:
        # rho(2) over consecutive pairs inside one window and one document
        allx = np.concatenate(
            [
                np.stack(
                    [data[s : s + seq] for s in range(b0 * seq, min(n, b0 + batch) * seq, seq)]
                )
                for b0 in range(0, n, batch)
            ]
        )  # [W, S]
        keep = allx[:, :-1] != eos_id  # the earlier token of a pair is not a separator
        nexp = model.c["num_experts"]
        ent, rho, unused, rare = [], [], [], []
        for arrs in layer_ids:
            ids = np.concatenate(arrs)  # [W, S, k]
            p = np.bincount(ids.reshape(-1), minlength=nexp) / ids.size
            nz = p[p > 0]
            ent.append(float(-(nz * np.log(nz)).sum()))
            unused.append(int((p == 0).sum()))
            rare.append(int((p < 0.1 / nexp).sum()))
            shared = (ids[:, 1:, :, None] == ids[:, :-1, None, :]).any(-1).sum(-1)  # [W, S-1]
            rho.append(float(shared[keep].sum() / (keep.sum() * ids.shape[-1])))
        stats = {
            "entropy_nats": ent,
            "entropy_max_nats": math.log(nexp),
            "rho2": rho,
            "rho2_layer_mean": float(np.mean(rho)),
            "rho2_uniform": model.c["num_experts_per_tok"] / nexp,
            "unused_experts": unused,
            "experts_below_tenth_of_uniform": rare,
        }
    return tot / max(cnt, 1), cnt, stats


def export(model: TinyOlmoe, cfg: dict, out: Path, dtype: str) -> None:
    from transformers import OlmoeConfig, OlmoeForCausalLM

    hf_cfg = OlmoeConfig(**cfg)
    hf = OlmoeForCausalLM(hf_cfg)
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    missing = [k for k in missing if not k.endswith("inv_freq")]
    if missing or unexpected:
        raise RuntimeError(f"export: missing {missing}, unexpected {unexpected}")
    hf = hf.to(getattr(torch, dtype))
    hf.config.dtype = dtype
    hf.save_pretrained(str(out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "specmoe" / "data" / "tiny_olmoe")
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "tiny_model_train.json")
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--z-loss", type=float, default=0.001)
    ap.add_argument(
        "--aux-coef", type=float, default=0.01, help="router_aux_loss_coef (OLMoE: 0.01)"
    )
    ap.add_argument(
        "--final-eval-windows",
        type=int,
        default=None,
        help="evaluate on the first N windows only (default: the whole split)",
    )
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--max-positions", type=int, default=4096)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--retrain-tokenizer", action="store_true")
    ap.add_argument("--no-export", action="store_true", help="train and report only")
    a = ap.parse_args(argv)

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    t_start = time.time()
    log = lambda msg: print(f"[{time.time() - t_start:7.1f}s] {msg}", file=sys.stderr, flush=True)  # noqa: E731

    if a.retrain_tokenizer or not (a.out / "tokenizer.json").exists():
        log("training the tokenizer")
        train_tokenizer(a.out, vocab=a.vocab, model_max_length=a.max_positions)
    tok = load_tokenizer(a.out)
    eos_id, pad_id = tok.token_to_id(EOS), tok.token_to_id(PAD)
    train = pack("train", tok, eos_id)
    val = pack("validation", tok, eos_id)
    log(f"tokens: train {len(train)}, validation {len(val)}, vocab {tok.get_vocab_size()}")

    cfg = make_config(a, tok.get_vocab_size(), eos_id, pad_id)
    model = TinyOlmoe(cfg)
    model.init_weights(cfg["initializer_range"])
    n_params = sum(p.numel() for p in model.parameters())
    log(f"parameters: {n_params}")
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": a.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=a.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    history = []
    ema = None
    t_train = time.time()
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        starts = rng.integers(0, len(train) - a.seq_len - 1, size=a.batch)
        x = torch.from_numpy(np.stack([train[s : s + a.seq_len] for s in starts]).astype(np.int64))
        y = torch.from_numpy(
            np.stack([train[s + 1 : s + a.seq_len + 1] for s in starts]).astype(np.int64)
        )
        logits, rl, ri = model(x)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        aux = load_balancing_loss(rl, ri, cfg["num_experts"])
        zl = z_loss(rl)
        loss = ce + cfg["router_aux_loss_coef"] * aux + a.z_loss * zl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = ce.item() if ema is None else 0.95 * ema + 0.05 * ce.item()
        if step % a.log_every == 0 or step == a.steps - 1:
            el = time.time() - t_train
            log(
                f"step {step} ce {ce.item():.3f} (ema {ema:.3f}) aux {aux.item():.3f} "
                f"z {zl.item():.2f} gnorm {gn.item():.2f} lr {lr_at(step, a):.2e} "
                f"tok/s {(step + 1) * a.batch * a.seq_len / el:.0f}"
            )
            history.append(
                {
                    "step": step,
                    "train_ce": ce.item(),
                    "train_ce_ema": ema,
                    "aux": aux.item(),
                    "z": zl.item(),
                    "elapsed_s": el,
                }
            )
        if a.eval_every and step and step % a.eval_every == 0:
            vl, _, st = evaluate(model, val, a.seq_len, max_windows=32, eos_id=eos_id)
            log(
                f"step {step} validation (first 32 windows) {vl:.3f}, rho2 "
                f"{st['rho2_layer_mean']:.3f}, unused experts {st['unused_experts']}, below "
                f"a tenth of uniform {st['experts_below_tenth_of_uniform']}"
            )
            history[-1]["validation_ce_subset"] = vl
    train_wall = time.time() - t_train
    log("evaluating on the whole validation split")
    vloss, vtok, stats = evaluate(model, val, 1024, eos_id=eos_id, max_windows=a.final_eval_windows)
    log(f"validation {vloss:.4f} nats/token over {vtok} tokens; routing {stats}")
    vloss2k, vtok2k, _ = evaluate(model, val, 2048, max_windows=40, eos_id=eos_id)
    log(f"validation at 2048-token windows: {vloss2k:.4f} nats/token over {vtok2k} tokens")
    if not a.no_export:
        export(model, cfg, a.out, a.dtype)
    size = (a.out / "model.safetensors").stat().st_size if not a.no_export else None
    result = {
        "model": "tiny OLMoE (OlmoeForCausalLM)",
        "config": cfg,
        "parameters": n_params,
        "active_parameters_per_token": n_params
        - cfg["num_hidden_layers"]
        * (cfg["num_experts"] - cfg["num_experts_per_tok"])
        * 3
        * cfg["hidden_size"]
        * cfg["intermediate_size"],
        "checkpoint_dtype": a.dtype,
        "checkpoint_bytes": size,
        "tokenizer": {
            "kind": "byte-level BPE",
            "vocab_size": tok.get_vocab_size(),
            "eos": EOS,
            "pad": PAD,
        },
        "corpus": {"train_tokens": len(train), "validation_tokens": len(val)},
        "training": {
            "steps": a.steps,
            "seed": a.seed,
            "batch": a.batch,
            "seq_len": a.seq_len,
            "lr": a.lr,
            "warmup": a.warmup,
            "schedule": "linear warmup, cosine to 0.1x",
            "weight_decay": a.weight_decay,
            "optimizer": "AdamW(0.9, 0.95)",
            "grad_clip": 1.0,
            "router_aux_loss_coef": cfg["router_aux_loss_coef"],
            "router_z_loss_coef": a.z_loss,
            "tokens_seen": a.steps * a.batch * a.seq_len,
        },
        "train_loss_final_ema": ema,
        "validation_loss_nats_per_token": vloss,
        "validation_eval": {
            "tokens": vtok,
            "window": 1024,
            "how": "consecutive non-overlapping windows of the packed split",
        },
        "validation_loss_2048_windows": {
            "loss": vloss2k,
            "tokens": vtok2k,
            "how": "the first 40 windows of 2048 tokens",
        },
        "routing_on_validation": stats,
        "wall_time_s": {"training": train_wall, "total": time.time() - t_start},
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "command": "python scripts/train_tiny_model.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "history": history,
    }
    atomic_write_json(a.results, result)
    log(f"wrote {a.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
