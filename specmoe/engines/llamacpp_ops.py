"""Every operation of a llama.cpp verification pass, from a per-node profile of its own graph.

Legend: ``n`` tokens of the pass, ``d`` tokens already in the KV cache, ``L`` decoder layers,
``m`` experts per token, ``U`` distinct experts of a layer's pass, ``M`` graph nodes of a pass.

:meth:`~specmoe.engines.llamacpp_pass.LlamaCppEngine.profile` computes each node of one pass
as its own graph and times it on the thread CPU clock. This module

* groups the nodes into specmoe's operations (:func:`classify`, :data:`GROUPS`): ``embed``
  (the embedding rows), ``norm`` (the layer's two RMSNorms, norm and weight), ``qkv`` (the
  q/k/v projections, the q/k norms), ``attention`` (RoPE, the KV cache writes and views,
  K·Q, softmax, V·P, the head merge), ``o_proj`` (the output projection), ``router`` (logits,
  softmax, top-m, gate weights), ``experts`` (the three MUL_MAT_ID, the activation, the
  weighting and the sum over slots), ``overhead`` (the residual adds), ``head`` (final norm
  and lm_head). Views, reshapes and permutes take the group of the node they view
  (their name is that node's with a suffix); ``norm-<l>`` (build_norm's RMS_NORM) the group of
  the node that scales it; an unnamed MUL_MAT after the attention the output projection; any
  other unnamed node the group of the node before it;
* subtracts the per-node launch overhead (:func:`launch_overhead`): computing a node alone
  costs a graph launch; the no-op nodes (VIEW, RESHAPE, PERMUTE, TRANSPOSE, NONE) compute
  nothing, so their median time in the same pass is the launch, removed from every node;
* ``engine_overhead`` = the un-profiled :meth:`forward` of the same tokens at the same depth
  minus the corrected sum of every node of the profiled pass: what one whole-graph decode
  costs beyond its nodes' work (the graph build that the first node's time also holds, the
  inputs, the logits' copy and argmax, the scheduler), signed;
* fits each operation with :mod:`specmoe.cost.ops_fit` (the terms of
  :data:`specmoe.bench.ops.OPS`, held-out ε on the n the fit did not see), as the profile's
  ``whole_pass``;
* fits the expert operation as the profile's kernel fit: llama.cpp's CPU MUL_MAT_ID groups
  rows by expert (a deduplicating kernel at every n), so the experts' time of each layer is
  fitted by Eq. (E.1) of paper 002 on the union U of that layer's experts for the same tokens
  (recorded in an untimed pass), β_dedup(n) = Σ U·b / Σ t. The per-slot entries are the same
  kernel's times on the per-slot definitions (Eq. (4), β_slot on requested bytes n·m·b): the
  same times, so the per-slot and dedup policies predict the same expert time and S(n) = 0;
  only dedup is a kernel llama.cpp runs.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specmoe.bench.ops import OPS
from specmoe.cost import ops_fit as OF
from specmoe.errors import InputError

NOOPS = frozenset({"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "NONE"})
LAYER_OPS = ("norm", "qkv", "attention", "o_proj", "router", "experts", "overhead")
MODEL_OPS = ("embed", "head")
GROUPS = ("embed", *LAYER_OPS, "head")

_SUFFIX = re.compile(r"\s+\([^()]*\)$")
_LAYER = re.compile(r"^(.*)-(\d+)$")
_CACHE = re.compile(r"^cache_[kv]_l(\d+)$")
_ROUTER = ("ffn_moe_logits", "ffn_moe_probs", "ffn_moe_argsort", "ffn_moe_topk",
           "ffn_moe_weights", "ffn_moe_group_topk")  # fmt: skip
_NAMES = {
    "embd": "embed", "inp_embd": "embed", "inp_tokens": "embed",
    "attn_norm": "norm", "ffn_norm": "norm",
    "Qcur": "qkv", "Kcur": "qkv", "Vcur": "qkv", "Qcur_normed": "qkv", "Kcur_normed": "qkv",
    "wqkv": "qkv",
    "kq": "attention", "kq_soft_max": "attention", "kqv": "attention", "kqv_out": "attention",
    "v_cont": "attention",
    "attn_out": "o_proj", "kqv_wo": "o_proj",
    "ffn_inp": "overhead", "l_out": "overhead",
    "result_norm": "head", "result_output": "head",
}  # fmt: skip


def base_name(name: str) -> tuple[str, int | None]:
    """(the name without its view suffixes and layer, the layer or None):
    ``"cache_v_l2 (reshaped) (view)"`` -> ``("cache_v", 2)``, ``"Qcur-3"`` -> ``("Qcur", 3)``."""
    s = name.strip()
    while True:
        t = _SUFFIX.sub("", s)
        if t == s:
            break
        s = t
    m = _CACHE.match(s)
    if m:
        return s[:7], int(m.group(1))
    m = _LAYER.match(s)
    if m:
        return m.group(1), int(m.group(2))
    return s, None


def _named_group(base: str, op: str) -> str | None:
    if op == "ROPE":
        return "attention"
    if base in ("cache_k", "cache_v") or base.startswith("kq_"):
        return "attention"
    if base.startswith("wqkv"):
        return "qkv"
    if base.startswith("ffn_moe_"):
        return "router" if base.startswith(_ROUTER) else "experts"
    return _NAMES.get(base)


def classify(nodes: Sequence[tuple[str, str]]) -> list[tuple[str, int | None]]:
    """(group, layer) of every (name, op) node of one pass in graph order (module docstring);
    ``layer`` None for the model's own nodes (embed, head). Every node gets exactly one."""
    n = len(nodes)
    out: list[tuple[str, int | None] | None] = [None] * n
    pending: list[int] = []  # build_norm's "norm" nodes: the group of the next named node
    prev: tuple[str, int | None] = ("embed", None)
    for i, (name, op) in enumerate(nodes):
        base, layer = base_name(name)
        if base == "norm":
            pending.append(i)
            continue
        group = _named_group(base, op)
        if group is None:  # unnamed (node_<k>) or unknown: by its neighbours
            group = "o_proj" if op == "MUL_MAT" and prev[0] == "attention" else prev[0]
            layer = prev[1] if layer is None else layer
        if group in MODEL_OPS:
            layer = None
        elif layer is None:
            layer = prev[1] if prev[1] is not None else 0
        out[i] = (group, layer)
        for j in pending:
            out[j] = (group, layer)
        pending = []
        prev = (group, layer)
    for j in pending:  # a trailing norm with nothing after it: the head's
        out[j] = ("head", None)
    return [x for x in out if x is not None]


def launch_overhead(nodes: Sequence[tuple[str, float]]) -> float:
    """The per-node launch time of a profiled pass (ms): the median time of its no-op nodes
    ((op, ms) pairs; ops in :data:`NOOPS`), which compute nothing; 0 without any."""
    t = [ms for op, ms in nodes if op in NOOPS]
    return float(np.median(t)) if t else 0.0


@dataclass(frozen=True)
class GroupedPass:
    """One profiled pass grouped: ``ms[group]`` corrected ms summed over the pass, ``layer_ms``
    [L] the corrected experts' time of each layer, ``count[group]`` nodes, ``launch_ms``."""

    ms: dict[str, float]
    experts_layer_ms: np.ndarray
    count: dict[str, int]
    launch_ms: float
    raw_ms: float

    @property
    def corrected_ms(self) -> float:
        return float(sum(self.ms.values()))


def group_pass(
    nodes: Sequence[tuple[str, str, float]], num_layers: int, launch_ms: float | None = None
) -> GroupedPass:
    """Group (name, op, ms) nodes of one pass (:func:`classify`) with ``launch_ms`` (default
    :func:`launch_overhead` of the pass) subtracted from every node."""
    if not nodes:
        raise InputError("no nodes", argument="nodes")
    launch = launch_overhead([(op, ms) for _, op, ms in nodes]) if launch_ms is None else launch_ms
    groups = classify([(a, b) for a, b, _ in nodes])
    ms = dict.fromkeys(GROUPS, 0.0)
    count = dict.fromkeys(GROUPS, 0)
    exp_layer = np.zeros(num_layers)
    for (g, layer), (_, _, t) in zip(groups, nodes, strict=True):
        ms[g] += t - launch
        count[g] += 1
        if g == "experts" and layer is not None and 0 <= layer < num_layers:
            exp_layer[layer] += t - launch
    raw = float(sum(t for _, _, t in nodes))
    return GroupedPass(ms, exp_layer, count, float(launch), raw)


# ------------------------------------------------------------------------------------------
# the model's shapes, from the GGUF's metadata


_FILE_TYPES = {0: ("float32", 4), 1: ("float16", 2), 32: ("bfloat16", 2)}
# bytes an element of K and of V for each KV cache type of llamacpp_shim.KV_TYPES: q8_0 stores
# 32 int8 values and one f16 scale a block (34 bytes), its values stay f16
KV_ELEMENT_BYTES = {"f16": (2.0, 2.0), "f32": (4.0, 4.0), "q8_0": (34 / 32, 2.0)}


@dataclass(frozen=True)
class Dims:
    """A GGUF MoE model's shapes (llama.cpp's metadata) and weight element size ``es``."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    top_k: int
    inter: int
    vocab: int
    dtype: str
    es: int
    kv_es: float  # bytes an element of the KV cache, the mean of K's and V's

    @classmethod
    def of(cls, engine: Any, kv_type: str = "f16") -> Dims:
        arch = engine.meta("general.architecture")

        def num(key: str, default: int | None = None) -> int:
            v = engine.meta(f"{arch}.{key}")
            if v is None:
                if default is None:
                    raise InputError(f"{engine.path}: no {arch}.{key} in the GGUF", argument="gguf")
                return default
            return int(float(v))

        ft = int(float(engine.meta("general.file_type") or -1))
        if ft not in _FILE_TYPES:
            raise InputError(
                f"{engine.path}: weight type {ft} (general.file_type); the expert fit needs "
                "f32, f16 or bf16 weights",
                argument="gguf",
            )
        dtype, es = _FILE_TYPES[ft]
        h, heads = num("embedding_length"), num("attention.head_count")
        return cls(
            name=str(engine.meta("general.name") or arch),
            layers=num("block_count"),
            hidden=h,
            heads=heads,
            kv_heads=num("attention.head_count_kv", heads),
            head_dim=num("attention.key_length", h // heads),
            experts=num("expert_count"),
            top_k=num("expert_used_count"),
            inter=num("expert_feed_forward_length", num("feed_forward_length", 0) or None),
            vocab=int(engine.vocab_size),
            dtype=dtype,
            es=es,
            kv_es=sum(KV_ELEMENT_BYTES[kv_type]) / 2,
        )

    def shape(self, op: str) -> dict[str, float]:
        """Bytes and flops coefficients of ``op`` (as :class:`specmoe.bench.ops._Shapes`; the
        KV cache's element size is the cache's type)."""
        h, es, q, k = (
            self.hidden,
            self.es,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
        )
        return {
            "embed": {"bytes_n": 2.0 * h * es},
            "norm": {"bytes0": h * es, "bytes_n": 2.0 * h * es},
            "qkv": {"bytes0": h * (q + 2 * k) * es, "flops_n": 2.0 * h * (q + 2 * k)},
            "attention": {"bytes_nd": 2.0 * 2 * k * self.kv_es, "flops_nd": 4.0 * q},
            "o_proj": {"bytes0": q * h * es, "flops_n": 2.0 * q * h},
            "router": {"bytes0": self.experts * h * es, "flops_n": 2.0 * self.experts * h},
            "head": {"bytes0": self.vocab * h * es, "flops_n": 2.0 * self.vocab * h},
        }.get(op, {})

    @property
    def expert_bytes(self) -> float:
        return 3.0 * self.hidden * self.inter * self.es

    def spec_dict(self, source: str) -> dict[str, Any]:
        from specmoe.spec import ModelSpec

        q, k = self.heads * self.head_dim, self.kv_heads * self.head_dim
        dense = self.layers * (self.hidden * (2 * q + 2 * k) + self.experts * self.hidden)
        spec = ModelSpec(
            name=self.name,
            num_experts=self.experts,
            top_k=self.top_k,
            num_moe_layers=self.layers,
            hidden_size=self.hidden,
            expert_intermediate=self.inter,
            bytes_per_weight=float(self.es),
            dense_params=int(dense + self.vocab * self.hidden),
            kv_elements_per_token=int(2 * k * self.layers),
            num_hidden_layers=self.layers,
            vocab_size=self.vocab,
            source=source,
        )
        return spec.to_dict()


# ------------------------------------------------------------------------------------------
# the benchmark


@dataclass
class _Records:
    """Every timed cell: ``ms[op]`` [D, N, R] per call, ``fwd``/``prof`` [D, N, R] the
    un-profiled pass and the corrected node sum, ``experts`` [D, N, R, L] per layer (ms) and
    ``union`` [D, N, R, L] its U, ``launch`` [D, N, R]."""

    shape: tuple[int, int, int]
    layers: int
    ms: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        z = np.zeros(self.shape)
        for k in (*GROUPS, "engine_overhead", "fwd", "prof", "raw", "launch", "scale"):
            self.ms[k] = z.copy()
        self.experts = np.zeros((*self.shape, self.layers))
        self.union = np.zeros((*self.shape, self.layers))
        self.count: dict[str, int] = {}


def _per_call(g: GroupedPass, num_layers: int) -> dict[str, float]:
    """Per-call ms of each op: model ops once, layer ops per layer (norm per norm, two a
    layer)."""
    out = {}
    for op in GROUPS:
        div = 1 if op in MODEL_OPS else num_layers * (2 if op == "norm" else 1)
        out[op] = g.ms[op] / div
    return out


def time_llamacpp_operations(
    engine: Any,
    tokens: Sequence[int],
    *,
    n_values: Sequence[int],
    depths: Sequence[int],
    reps: int = 7,
    warmup: int = 1,
    progress: bool = True,
    prime: bool = False,
    train: int = 0,
) -> tuple[_Records, Dims]:
    """Profile a llama.cpp engine's verify passes (module docstring): for each depth d
    (ascending) the cache is ``tokens[:d]``; each repetition runs every n in a rotated order,
    and for each, in this order, an un-profiled :meth:`forward` (so that it follows a pass of
    another n, as a verify pass does in specmoe's verify-time runs and in speculative decoding),
    a :meth:`profile` and an untimed pass recording the routing, all of the same n tokens of ``tokens`` after
    the prefix (a different window each repetition), cropping back to d after each.
    ``prime``: the un-profiled forward follows an untimed one of the same window, so that it is
    a pass after one of its own size (llama.cpp reuses that graph), as in speculative rounds of
    one draft length; otherwise it follows a pass of another n and builds its graph.

    ``train`` (>= 2; 0: off, the cell above): each repetition first times, for every n in the
    rotated order, ``train`` passes of n tokens in a row, each on the window one token after
    the one before (cropped back to d between), and records the median of all but the first
    as the cell's un-profiled pass; the profiled and routing passes of every n follow after
    all of them, on each train's first window. So each timed pass follows a pass of its own
    size on other tokens, as the verification passes of speculative rounds at one draft length
    do, and never a profiled or routing pass (which cost the passes after them up to 35% on
    the bundled model: results/cpu/llamacpp/round-passes/). The profiled pass, whose nodes
    run one by one, then only apportions the trained pass: each op's time and each layer's
    expert time is the profiled one times ``scale`` = trained pass / corrected profiled sum
    (``ms["scale"]``), so the ops sum to the trained pass and ``engine_overhead`` is 0."""
    from specmoe.engine.speculative import crop_cache, new_cache

    ns, ds = _ints("n_values", n_values, 1), _ints("depths", depths, 1)
    for name, v, low in (("reps", reps, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise InputError(f"must be an integer >= {low}, got {v!r}", argument=name)
    if isinstance(train, bool) or not isinstance(train, int) or train < 0 or train == 1:
        raise InputError(f"must be 0 (off) or an integer >= 2, got {train!r}", argument="train")
    if train and prime:
        raise InputError("train: a train's passes already follow passes of their size")
    span = max(train, 1) - 1  # a train's windows run this many tokens past its first
    tail = len(tokens) - ds[-1] - span
    if tail < ns[-1]:
        raise InputError(
            f"{len(tokens)} tokens: need the deepest depth {ds[-1]} plus {ns[-1] + span}",
            argument="tokens",
        )
    if engine.clock != "cpu" or engine.threads != 1:
        raise InputError("the per-node times are one thread's CPU time", argument="engine")
    say: Callable[[str], None] = (
        (lambda s: print(s, file=sys.stderr, flush=True)) if progress else (lambda s: None)
    )
    dims = Dims.of(engine, engine.kv_type)
    L = dims.layers
    rec = _Records((len(ds), len(ns), reps), L)
    kv = new_cache(engine.model)
    have = 0
    for di, d in enumerate(ds):
        engine.prefill(kv, list(tokens[have:d]))
        have = d
        for rep in range(-warmup, reps):
            r = max(rep, 0)
            order = [(j + r) % len(ns) for j in range(len(ns))]
            starts = {ni: d + (r * 7 + ni) % (tail - ns[ni] + 1) for ni in order}
            trained = {}
            if train:
                for ni in order:
                    ts = []
                    for i in range(train):  # the first untimed: it may build the graph
                        s = starts[ni] + i
                        ts.append(engine.forward(kv, [int(t) for t in tokens[s : s + ns[ni]]]).t_ms)
                        crop_cache(kv, d)
                    trained[ni] = float(np.median(ts[1:]))
            for ni in order:
                n = ns[ni]
                s = starts[ni]
                window = [int(t) for t in tokens[s : s + n]]
                if train:
                    t_fwd = trained[ni]
                else:
                    if prime:  # untimed: the timed pass then follows a pass of its own size
                        engine.forward(kv, window)
                        crop_cache(kv, d)
                    t_fwd = engine.forward(kv, window).t_ms  # else after a pass of another n
                    crop_cache(kv, d)
                prof = engine.profile(kv, window)
                crop_cache(kv, d)
                engine.record_routing = True  # untimed: the experts of the same tokens
                try:
                    routing = np.asarray(engine.forward(kv, window).routing)  # [n, L, m]
                finally:
                    engine.record_routing = False
                crop_cache(kv, d)
                if rep < 0:
                    continue
                g = group_pass([(x.name, x.op, x.ms) for x in prof.nodes], L)
                cell = (di, ni, r)
                # with trains the profiled pass only apportions the trained pass among the ops
                f = t_fwd / g.corrected_ms if train and g.corrected_ms > 0 else 1.0
                for op, v in _per_call(g, L).items():
                    rec.ms[op][cell] = f * v
                rec.ms["fwd"][cell] = t_fwd
                rec.ms["prof"][cell] = g.corrected_ms
                rec.ms["raw"][cell] = g.raw_ms
                rec.ms["launch"][cell] = g.launch_ms
                rec.ms["scale"][cell] = f
                rec.ms["engine_overhead"][cell] = t_fwd - f * g.corrected_ms
                rec.experts[cell] = f * g.experts_layer_ms
                rec.union[cell] = [np.unique(routing[:, li]).size for li in range(L)]
                rec.count = g.count
        say(f"d={d}: n=1 pass {np.median(rec.ms['fwd'][di, 0]):.3f} ms")
    return rec, dims


def _ints(name: str, values: Sequence[int], low: int) -> list[int]:
    vals = list(values)
    if not vals or any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in vals):
        raise InputError(f"must be integers >= {low}, got {vals!r}", argument=name)
    return sorted(set(vals))


# ------------------------------------------------------------------------------------------
# fits


def summarize(rec: _Records, dims: Dims, *, n_values: Sequence[int], depths: Sequence[int]):
    """The profile's ``whole_pass`` from the records: per op medians, spread and fits
    (:func:`specmoe.cost.ops_fit.fit_op`, the terms of :data:`specmoe.bench.ops.OPS`, ε on
    the held-out n of :func:`~specmoe.cost.ops_fit.held_out_split`)."""
    ns, ds = list(n_values), list(depths)
    fit_n, held_n = OF.held_out_split(ns)
    nn_, dd_ = np.meshgrid(np.asarray(ns, float), np.asarray(ds, float))
    med = {k: np.median(v, axis=2) for k, v in rec.ms.items()}
    layer_ms = sum((2 if op == "norm" else 1) * med[op] for op in LAYER_OPS)
    wholes = {"layer": layer_ms, "pass": med["fwd"]}
    ops: dict[str, Any] = {}
    for op in (*GROUPS, "engine_overhead"):
        per, in_sum, terms = OPS[op]
        t = rec.ms[op]
        m = med[op]
        shape = dims.shape(op)
        feats = OF.op_features({"shape": shape}, nn_, dd_)
        feats = {k: np.broadcast_to(np.asarray(v, float), nn_.shape) for k, v in feats.items()}
        fsel = np.isin(nn_, fit_n)
        hsel = ~fsel if held_n else fsel
        signed = op in ("overhead", "engine_overhead") or bool(np.any(m[fsel] <= 0))
        fit = OF.fit_op(terms, {k: v[fsel] for k, v in feats.items()}, m[fsel], signed=signed)
        eps_of = ("layer" if per == "layer" else "pass") if signed else op
        err_ms = None
        if signed:  # a difference of times: its error over the whole it is part of
            absd = np.abs(fit.predict({k: v[hsel] for k, v in feats.items()}) - m[hsel])
            errs = absd / wholes[eps_of][hsel]
            err_ms = float(np.median(absd))
        else:
            errs = OF.relative_errors(fit, {k: v[hsel] for k, v in feats.items()}, m[hsel])
        ops[op] = {
            "per": per,
            "count": 2 if op == "norm" else 1,
            "in_sum": in_sum,
            "terms": list(terms),
            "shape": shape,
            "fit": fit.fit,
            "eps": float(min(np.median(errs), 0.999)),
            "eps_max": float(np.max(errs)),
            "eps_of": eps_of,
            "err_ms": err_ms,
            "fit_n": list(fit_n),
            "held_n": list(held_n),
            "n": ns,
            "d": ds,
            "nodes": rec.count.get(op),
            "median_ms": m.tolist(),
            "p10_ms": np.percentile(t, 10, axis=2).tolist(),
            "p90_ms": np.percentile(t, 90, axis=2).tolist(),
        }
    launch = rec.ms["launch"]
    return {
        "ops": ops,
        "layer_ms": layer_ms.tolist(),
        "model_ms": med["prof"].tolist(),
        "pass_ms": med["fwd"].tolist(),
        "profiled_raw_ms": med["raw"].tolist(),
        "profile_scale": med["scale"].tolist(),
        "overhead_ms_per_layer": med["overhead"].tolist(),
        "launch_ms": {
            "median": float(np.median(launch)),
            "p10": float(np.percentile(launch, 10)),
            "p90": float(np.percentile(launch, 90)),
            "per_cell": med["launch"].tolist(),
            "how": "per profiled pass, the median time of its no-op nodes "
            f"({', '.join(sorted(NOOPS))}), subtracted from each of its nodes",
        },
        "n": ns,
        "d": ds,
    }


FIT_FORMS = ("linear", "step1", "step1-depth", "step1-width", "pern-width")
# the ops whose fits take the depth term in the step1-depth and step1-width forms (versions 3, 4)
DEPTH_OPS = ("engine_overhead",)
# llama.cpp's KV view padding (llama_kv_cache::get_n_kv: max(n_pad, 256)), the step1-width form's
KV_PAD = 256


def refit(whole_pass: Mapping[str, Any], form: str = "step1") -> dict[str, Any]:
    """A stored ``whole_pass`` with every op refitted in ``form`` from its medians (the fits
    use only the medians over repetitions, so this is the fit the benchmark itself makes).

    ``linear``: one fit over every n (fitted on n = 1, 3, 4, 6, 7 for n = 1..9), as
    :func:`summarize`. ``step1``: llama.cpp's matrix products take another path for one row
    than for two or more: ``llamafile_sgemm`` (``ggml-cpu/llamafile/sgemm.cpp``) returns
    false for n < 2 ("only enable sgemm for prompt processing"), so one row goes through
    ggml's ``vec_dot`` loop and two or more through tinyBLAS. That is a step from n = 1 to
    n = 2 in every MUL_MAT of the pass (measured in its per-node profile:
    results/cpu/llamacpp/whole-pass/README.md), which no term linear in n follows; the op's fit is made on n >= 2 alone (held out: every third of them from
    the second, and the largest, :func:`~specmoe.cost.ops_fit.held_out_split`), and n = 1 gets
    a fit of its own over the depths (``fit_n1``, ``terms_n1``: ``t0`` and the terms that
    vary with d at n = 1), scored leaving one depth out. ``eps`` is the median of both held-out
    errors; ``eps_n1`` the one-row fit's alone.

    ``step1-depth`` (version 3, docs/runs-protocol-llamacpp.md, round 3): ``step1`` with a
    ``depth`` term (a time per token of context, :data:`specmoe.cost.ops_fit.TERMS`) in the
    ops of :data:`DEPTH_OPS`, in both of its fits. ``engine_overhead`` (the decode minus its
    graph's nodes) had a fixed time and a per-token time only, and its median at n = 1 grew
    with the depth (0.13 ms at d = 256 to 0.36 ms at d = 2048 in the round-1 benchmark): the
    part of a decode outside the graph's nodes that sets the KV cache up for the pass (its
    views and the attention mask over every cell of the cache) grows with the cache.

    ``step1-width`` (version 4, round 4): ``step1-depth`` on the KV cells a pass reads
    instead of the cache's length (``kv_pad`` = :data:`KV_PAD` in the result,
    :func:`specmoe.cost.ops_fit.kv_width`). llama.cpp attends over the used cells padded to
    256 (``llama_kv_cache::get_n_kv``), masked or not, and fills the mask over the same cells:
    a pass of one token after 511 reads 512 cells, after 512 it reads 768. Measured on the
    AVX-512 EPYC (bundled f32 GGUF, per-node profile, 15 alternating repetitions): one-token
    attention 0.243 ms a layer after 511 tokens against 0.292 after 512, the pass 1.46 against
    1.68 ms. The benchmark's depths (multiples of 256) read d + 256 cells at every n; the
    verify runs' passes after depth - 1 tokens read depth cells at n = 1.

    ``pern-width`` (version 9): ``step1-width``, and besides it a fit of its own at every
    benchmarked n over the depths (``fits_n``: per n, ``terms`` (``t0`` and the terms that
    vary with the KV width at that n, at most one fewer than the depths) and ``fit``), which
    :func:`specmoe.cost.ops_fit.op_time` takes at those n; the ``step1-width`` fits stay for
    any other n. ``eps`` is the median of the per-n fits' errors, each scored leaving one depth
    out. What it follows that a line in n does not: in a one-thread pass on a Zen 4 core the f16
    K·Q product (tinyBLAS for n >= 2) is not monotone in n, by a growing margin as the cache
    grows: its ``kq`` nodes over 4 layers after 2047 tokens took 0.92 and 0.93 ms at n = 3
    and 4 against 0.45 at n = 5, and 1.26 ms at n = 8 against 0.82 at n = 9
    (results/cpu/llamacpp/kv-width/); the pass follows it at long contexts."""
    if form not in FIT_FORMS:
        raise InputError(f"must be one of {', '.join(FIT_FORMS)}, got {form!r}", argument="fit")
    ns, ds = [int(v) for v in whole_pass["n"]], [int(v) for v in whole_pass["d"]]
    nn_, dd_ = np.meshgrid(np.asarray(ns, float), np.asarray(ds, float))
    wholes = {
        "layer": np.asarray(whole_pass["layer_ms"], float),
        "pass": np.asarray(whole_pass["pass_ms"], float),
    }
    step = form in ("step1", "step1-depth", "step1-width", "pern-width")
    pern = form == "pern-width"
    pad = KV_PAD if form in ("step1-width", "pern-width") else None
    rows = [v for v in ns if v >= 2] if step else ns
    fit_n, held_n = OF.held_out_split(rows)
    ops: dict[str, Any] = {}
    for name, op in whole_pass["ops"].items():
        m = np.asarray(op["median_ms"], float)
        terms = tuple(t for t in op["terms"] if t != "depth")  # the form decides the depth term
        if form in ("step1-depth", "step1-width", "pern-width") and name in DEPTH_OPS:
            terms += ("depth",)
        feats = OF.op_features({"shape": op["shape"]}, nn_, dd_, pad)
        feats = {k: np.broadcast_to(np.asarray(v, float), nn_.shape) for k, v in feats.items()}
        fsel = np.isin(nn_, fit_n)
        hsel = np.isin(nn_, held_n) if held_n else fsel
        signed = name in ("overhead", "engine_overhead") or bool(np.any(m[fsel] <= 0))
        eps_of = op.get("eps_of", name)

        def errors(fit, sel, m=m, feats=feats, signed=signed, eps_of=eps_of):
            pred = fit.predict({k: v[sel] for k, v in feats.items()})
            absd = np.abs(pred - m[sel])
            return (absd / wholes[eps_of][sel], absd) if signed else (absd / m[sel], absd)

        fit = OF.fit_op(terms, {k: v[fsel] for k, v in feats.items()}, m[fsel], signed=signed)
        errs, absd = errors(fit, hsel)
        entry = {
            **op,
            "terms": list(terms),
            "fit": fit.fit,
            "fit_n": list(fit_n),
            "held_n": list(held_n),
        }
        for k in ("fit_n1", "terms_n1", "eps_n1", "fits_n"):
            entry.pop(k, None)
        if step and 1 in ns:
            fit1, t1, e1, a1 = OF.fit_over_depths(nn_ == 1, terms, feats, m, signed, errors)
            errs, absd = np.concatenate([errs, e1]), np.concatenate([absd, a1])
            entry.update(fit_n1=fit1.fit, terms_n1=list(t1), eps_n1=float(np.median(e1)))
        if pern:  # a fit of its own at every n, over the depths, scored leaving one out
            fits_n, en, an = {}, [], []
            for v in ns:
                fv, tv, ev, av = OF.fit_over_depths(nn_ == v, terms, feats, m, signed, errors)
                fits_n[str(v)] = {"terms": list(tv), "fit": fv.fit}
                en += ev
                an += av
            errs, absd = np.asarray(en), np.asarray(an)
            entry["fits_n"] = fits_n
        entry["eps"] = float(min(np.median(errs), 0.999))
        entry["eps_max"] = float(np.max(errs))
        entry["err_ms"] = float(np.median(absd)) if signed else None
        ops[name] = entry
    out = {**whole_pass, "ops": ops, "fit_form": form}
    out.pop("kv_pad", None)
    return out if pad is None else {**out, "kv_pad": pad}


def expert_fit(rec: _Records, dims: Dims, *, n_values: Sequence[int]) -> dict[str, Any]:
    """The profile's expert-kernel fields from the experts' time of every layer of every
    profiled pass and its union U (module docstring): Eq. (E.1) (dedup) and Eq. (4)
    (per-slot, the same kernel's times), fitted on the fit n of
    :func:`~specmoe.cost.ops_fit.held_out_split` and scored on the held-out n (ε: the median
    relative error); β, r, ū by :func:`specmoe.bench.fit.bandwidths`; ``op_time`` [L][n]
    (seconds) the fit at each layer's mean U and the measured median."""
    from specmoe.bench import fit as F

    ns = list(n_values)
    m, b, L = dims.top_k, dims.expert_bytes, dims.layers
    D, N, R = rec.shape
    nn = np.broadcast_to(np.asarray(ns, float)[None, :, None, None], (D, N, R, L))
    n_all, u_all = nn.ravel(), rec.union.ravel()
    t_all = rec.experts.ravel() / 1e3  # s
    if np.any(t_all <= 0):
        raise InputError("a layer's experts' corrected time is not positive", argument="records")
    fit_n, held_n = OF.held_out_split(ns)
    fsel = np.isin(n_all, fit_n)
    hsel = np.isin(n_all, held_n) if held_n else fsel
    fits, eps = {}, {}
    for kind in ("per_slot", "dedup"):
        f = F.fit_time(kind, n_all[fsel], u_all[fsel], t_all[fsel], m=m, b=b)
        fits[kind] = f
        errs = F.relative_errors(f, n_all[hsel], u_all[hsel], t_all[hsel], m=m, b=b)
        eps[kind] = float(min(np.median(errs), 0.999))
    bw = F.bandwidths(ns, n_all, u_all, t_all, t_all, m=m, b=b)
    op_time: dict[str, dict[str, list[list[float]]]] = {}
    for kind, f in fits.items():
        pred, meas = [], []
        for li in range(L):
            u_mean = rec.union[..., li].mean(axis=(0, 2))  # [N]
            p = f.predict(np.asarray(ns, float), u_mean, m, b)
            pred.append(np.maximum(p, 1e-12).tolist())
            meas.append((np.median(rec.experts[..., li], axis=(0, 2)) / 1e3).tolist())
        op_time[kind] = {"predicted": pred, "measured": meas}
    return {
        "n": ns,
        "beta_slot": [v / 1e9 for v in bw["beta_slot"]],
        "beta_dedup": [v / 1e9 for v in bw["beta_dedup"]],
        "r": bw["r"],
        "u_bar": bw["u_bar"],
        "reread_cost": fits["per_slot"].reread_cost,
        "epsilon": eps,
        "crossover": None,
        "fits": {k: dict(f.coef) for k, f in fits.items()},
        "op_time": op_time,
        "layers": list(range(L)),
    }


def _time_gguf(gguf, tokens, ns, ds, reps, warmup, progress, prime, train, kv_type):
    """:func:`time_llamacpp_operations` on a one-thread engine of ``gguf`` whose context holds
    the deepest depth, the largest pass and a train's extra windows."""
    from specmoe.engines.llamacpp_pass import LlamaCppEngine

    n_ctx = ds[-1] + ns[-1] + max(train - 1, 0) + 16
    with LlamaCppEngine(gguf, n_ctx=n_ctx, threads=1, kv_type=kv_type, clock="cpu") as engine:
        return time_llamacpp_operations(
            engine, tokens, n_values=ns, depths=ds, reps=reps, warmup=warmup, progress=progress,
            prime=prime, train=train,
        )  # fmt: skip


def benchmark_profile(
    gguf: Any,
    tokens: Sequence[int],
    *,
    n_values: Sequence[int],
    depths: Sequence[int],
    reps: int = 7,
    warmup: int = 1,
    kv_type: str = "f16",
    ceiling: bool = True,
    source: dict[str, Any] | None = None,
    progress: bool = True,
    fit: str = "step1",
    prime: bool = False,
    train: int = 0,
) -> Any:
    """The whole benchmark of one GGUF: a :class:`~specmoe.formats.profile.BandwidthProfile`
    whose kernel fields are llama.cpp's MUL_MAT_ID fit and whose ``whole_pass`` is every other
    operation's (module docstring)."""
    from specmoe.bench.machine import last_level_cache_bytes, measure_ceiling
    from specmoe.engines import llamacpp
    from specmoe.formats.profile import BandwidthProfile

    t_start = time.perf_counter()
    ns, ds = _ints("n_values", n_values, 1), _ints("depths", depths, 1)
    notes = []
    gbps, method = None, None
    if ceiling:
        c = measure_ceiling("cpu", clock="cpu", threads=[1])
        gbps, method = float(c.gbps), c.method
        notes.append(f"read ceiling {c.gbps:.2f} GB/s ({c.method})")
    rec, dims = _time_gguf(gguf, tokens, ns, ds, reps, warmup, progress, prime, train, kv_type)
    wp = refit(summarize(rec, dims, n_values=ns, depths=ds), fit)
    exp = expert_fit(rec, dims, n_values=ns)
    llc = last_level_cache_bytes("cpu")
    weight_bytes = int(__import__("os").path.getsize(gguf))
    launch = wp["launch_ms"]
    notes += [
        f"per-node launch overhead {launch['median'] * 1e3:.2f} us (10-90%: "
        f"{launch['p10'] * 1e3:.2f}-{launch['p90'] * 1e3:.2f}), {launch['how']}",
        "engine_overhead: the un-profiled decode of the same tokens minus the corrected sum "
        "of every node of the profiled one (the graph build, held in the first node's time "
        "too, the inputs, the logits' copy and argmax); embed is that first node",
        "experts: llama.cpp's CPU MUL_MAT_ID groups rows by expert (deduplicating at every n); "
        "fitted by Eq. (E.1) on the union of the same tokens' recorded experts; the per-slot "
        "entries are the same kernel's times on the per-slot definitions (Eq. (4)), not a "
        "kernel llama.cpp has: only dedup is scored",
        f"weights {weight_bytes / 2**20:.1f} MiB, last-level cache "
        f"{'unknown' if llc is None else f'{llc / 2**20:.0f} MiB'}: timed as the engine runs "
        "them (no flush)",
    ]
    wall = time.perf_counter() - t_start
    wp.update(
        model=dims.name, layers=dims.layers, dtype=dims.dtype, clock="cpu", cold=False,
        notes=notes, weight_bytes=weight_bytes, llc_bytes=llc, reps=reps, warmup=warmup,
        attention=f"llama.cpp's non-flash attention (K·Q, softmax, V·P) on a {kv_type} KV cache",
        engine="llama.cpp", llama_cpp=llamacpp.VERSION, kv_type=kv_type, wall_s=wall,
        primed=bool(prime), train=int(train),
    )  # fmt: skip
    impl = {
        k: {"device": "cpu", "requested": "ggml", "ran": "ggml", "kernel": "dedup",
            "fallback": None, "engine": "llama.cpp", "op": "MUL_MAT_ID",
            "note": None if k == "dedup" else "the dedup kernel's times on the per-slot fit"}
        for k in ("per_slot", "dedup")
    }  # fmt: skip
    return BandwidthProfile(
        model=dims.spec_dict(str(gguf)),
        device="cpu",
        dtype=dims.dtype,
        ceiling_gbps=gbps if gbps is not None else float("nan"),
        n=exp["n"],
        beta_slot=exp["beta_slot"],
        beta_dedup=exp["beta_dedup"],
        r=exp["r"],
        u_bar=exp["u_bar"],
        reread_cost=exp["reread_cost"],
        epsilon=exp["epsilon"],
        crossover=None,
        fits=exp["fits"],
        op_time=exp["op_time"],
        layers=exp["layers"],
        device_name=_cpu_name(),
        implementations=impl,
        source=dict(source or {}),
        whole_pass=wp,
        extra={"engine": "llama.cpp", "ceiling_method": method, "threads": 1, "clock": "cpu",
               "expert_bytes": dims.expert_bytes, "wall_s": wall, "notes": notes[2:3]},
    )  # fmt: skip


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


# ------------------------------------------------------------------------------------------
# the level of a saved profile today

LEVEL_TOLERANCE = 0.10  # the verify rule's (rules-llamacpp.json): a level beyond it misses it


def pass_level(then_ms: Sequence[float], now_ms: Sequence[float]) -> dict[str, Any]:
    """Today's passes of one depth against a profile's: ``level`` = Σ_n now(n) / Σ_n then(n)
    (the ratio ``scripts/llamacpp_level.py`` takes of a probe, r_u), and each n's own ratio.
    A whole-pass prediction carries its benchmark's level (results/cpu/llamacpp/whole-pass/,
    rounds 15-16: the same file and procedure 6-20% slower a few hours later on one core)."""
    then, now = np.asarray(then_ms, float), np.asarray(now_ms, float)
    if then.shape != now.shape or then.ndim != 1 or then.size == 0:
        raise InputError(f"need one time per n on both sides, got {then.shape} and {now.shape}")
    if (
        not (np.all(np.isfinite(then)) and np.all(np.isfinite(now)))
        or min(then.min(), now.min()) <= 0
    ):
        raise InputError("pass times must be finite and positive")
    return {"level": float(now.sum() / then.sum()), "ratio": (now / then).tolist()}


def level_of_profile(
    gguf: Any,
    tokens: Sequence[int],
    whole_pass: Mapping[str, Any],
    *,
    depths: Sequence[int],
    reps: int = 6,
    warmup: int = 1,
    progress: bool = True,
) -> dict[str, Any]:
    """Time a saved llama.cpp whole-pass profile's passes again, as its benchmark timed them:
    the same n, the given ``depths`` (a subset of its own), its trains (``train``), primed
    passes (``primed``) and KV cache type (``kv_type``), on ``tokens`` (the benchmark's
    prompt), ``reps`` repetitions (the median kept, as ``pass_ms`` is). Per depth
    :func:`pass_level` against the profile's ``pass_ms``; no per-node profile is fitted."""

    ds_prof, ns = [int(d) for d in whole_pass["d"]], [int(n) for n in whole_pass["n"]]
    ds = _ints("depths", depths, 1)
    missing = [d for d in ds if d not in ds_prof]
    if missing:
        raise InputError(
            f"the profile has the depths {ds_prof}, not {missing[0]}", argument="depths"
        )
    train = int(whole_pass.get("train") or 0)
    prime = bool(whole_pass.get("primed", False))
    kv_type = str(whole_pass.get("kv_type") or "f16")
    t0 = time.perf_counter()
    rec, _ = _time_gguf(gguf, tokens, ns, ds, reps, warmup, progress, prime, train, kv_type)
    now = np.median(rec.ms["fwd"], axis=2)
    out: dict[str, Any] = {"n": ns, "depths": {}}
    for i, d in enumerate(ds):
        then = whole_pass["pass_ms"][ds_prof.index(d)]
        out["depths"][str(d)] = {
            **pass_level(then, now[i]),
            "then_ms": [float(x) for x in then],
            "now_ms": now[i].tolist(),
        }
    out.update(reps=reps, train=train, primed=prime, kv_type=kv_type,
               wall_s=time.perf_counter() - t0)  # fmt: skip
    return out
