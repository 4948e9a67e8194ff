"""Target efficiency against batch size, measured with forced routing (paper 003 Sections 3-5, 8).

Legend for shapes: ``B`` sequences of a batch, ``s`` tokens per sequence in one pass, ``T`` rows
of a routing table, ``L`` MoE layers, ``m`` experts per token, ``N`` experts.

Method (paper 003 Section 8: real kernels, dummy weights, routing from elsewhere):

1. **Model.** A preset name builds the preset's transformers class at its shapes with seeded
   random weights (:func:`specmoe.engine.switch.dummy_model`; ``layers`` decoder layers, experts
   in bf16, the rest in float32 on a CPU and bf16 on a GPU); a path loads that model.
   ``vocab`` may replace the LM head by one of fewer rows, so that a model cut to fewer layers
   keeps the full model's ratio of LM-head to layer bytes. Every MoE layer runs one kernel of
   :mod:`specmoe.kernels` through the kernel switch: ``dedup`` (each distinct expert of the
   pass streamed once; a one-row pass runs the per-slot kernel, the same either way) or
   ``per_slot``.
2. **Routing.** Every router's choice is replaced by rows of a table [T, L, m]
   (:class:`BatchForcedRouting`): sequence b of a batch takes the window of rows starting at
   its own ``starts[b]``, so the B sequences route like B different places of the trace and a
   verification pass's layer reads the union of their experts. Tables: ``uniform`` (every token
   m distinct experts uniformly, independently), ``ipf-uniform`` and ``ipf-skewed`` (synthetic
   routing of :func:`specmoe.routing.synth.synthesize` from fitted statistics) and recorded
   traces; a table with another layer count is mapped by relative depth.
3. **Passes.** For each B a KV cache is filled to ``context`` tokens per sequence (the experts'
   output skipped: the weights are dummies and the cache exists for its length). Each
   repetition draws B window starts (each window inside one document where possible), then
   times, in an order that reverses every repetition, the one-token step (B rows) and the
   verification pass of K+1 tokens per sequence (B·(K+1) rows) for every K, each from the same
   cache (cropped back after the pass) and followed by the argmax of every row's logits. The
   distinct experts of each pass per layer come from the table (:func:`specmoe.cost.efficiency.
   batch_unique`), so the estimate of Section 5 uses exactly the experts the kernel read.
4. **Summary** (:func:`specmoe.cost.efficiency.summarise_efficiency`): medians over repetitions,
   target efficiency, the activated-expert-bytes estimate from the model's own bytes and the
   gap, and the speedup under an acceptance model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specmoe.cost.efficiency import batch_unique, choose_starts, layer_map, window_rows
from specmoe.engine.switch import ForcedRouting, KernelPolicy, KernelSwitch
from specmoe.errors import InputError

__all__ = [
    "BatchForcedRouting",
    "ModelBytes",
    "RoutingTable",
    "build_model",
    "cache_bytes",
    "measure_efficiency",
    "model_bytes",
    "recorded_table",
    "synthetic_table",
    "uniform_table",
]

SYNTHETIC = ("uniform", "ipf-uniform", "ipf-skewed")


# ------------------------------------------------------------------------------------------
# Routing tables


@dataclass(frozen=True, eq=False)
class RoutingTable:
    """Expert ids [T, L, m] of one routing source, its documents [D+1] and a label."""

    name: str
    experts: np.ndarray
    doc_offsets: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)


def uniform_table(
    tokens: int, num_layers: int, num_experts: int, top_k: int, *, seed: int = 0
) -> RoutingTable:
    """Uniform random routing: every token and layer m distinct experts drawn uniformly."""
    rng = np.random.default_rng(seed)
    keys = rng.random((tokens, num_layers, num_experts))
    ids = np.argpartition(keys, top_k - 1, axis=2)[:, :, :top_k].astype(np.int64)
    return RoutingTable(
        "uniform", ids, np.array([0, tokens]), {"source": "uniform random routing", "seed": seed}
    )


def check_shape(name: str, num_experts: int, top_k: int, spec: Any) -> None:
    """InputError unless a routing source's N and m are the model's."""
    if num_experts != spec.num_experts or top_k != spec.top_k:
        raise InputError(
            f"{name}: routing of N={num_experts}, m={top_k} does not fit the "
            f"model {spec.name} (N={spec.num_experts}, m={spec.top_k})"
        )


def recorded_table(
    trace: Any, spec: Any, num_layers: int, *, name: str, min_tokens: int
) -> RoutingTable:
    """A recorded trace's routing, its layers mapped onto ``num_layers`` by relative depth."""
    check_shape(name, int(trace.num_experts), int(trace.top_k), spec)
    if trace.num_tokens < min_tokens:
        raise InputError(f"{name}: {trace.num_tokens} tokens, fewer than a window of {min_tokens}")
    lmap = layer_map(num_layers, trace.num_layers)
    ids = np.asarray(trace.experts)[:, lmap].astype(np.int64)
    return RoutingTable(
        name,
        ids,
        np.asarray(trace.doc_offsets, dtype=np.int64),
        {
            "source": str(trace.meta.get("source", name)),
            "layer_map": lmap.tolist(),
            "documents": int(trace.num_documents),
        },
    )


def synthetic_table(
    moments: Any,
    spec: Any,
    num_layers: int,
    tokens: int,
    *,
    variant: str,
    max_pass: int,
    seed: int = 0,
    source: str = "statistics",
) -> RoutingTable:
    """IPF synthetic routing (``uniform`` or ``skewed`` expert probabilities) of ``tokens``
    tokens; its windows of ``max_pass`` tokens must lie within the statistics' lags."""
    from specmoe.routing.synth import synthesize

    check_shape(f"statistics {source}", moments.num_experts, moments.top_k, spec)
    moments.check_window(max_pass, name="max_pass")
    tr = synthesize(
        moments,
        tokens,
        num_layers=num_layers,
        num_experts=spec.num_experts,
        top_k=spec.top_k,
        variant=variant,
        seed=seed,
    )
    return RoutingTable(
        f"ipf-{variant}",
        np.asarray(tr.experts).astype(np.int64),
        np.asarray(tr.doc_offsets, dtype=np.int64),
        {
            "source": f"synthetic ({variant} IPF) from {source}",
            "synthetic": tr.meta.get("synthetic"),
        },
    )


# ------------------------------------------------------------------------------------------
# Forced routing for a batch


class BatchForcedRouting(ForcedRouting):
    """:class:`ForcedRouting` for B sequences of s tokens: the token i of sequence b takes table
    row ``(starts[b] + position + i) mod T``.

    A router sees a batch's rows batch-major (an MoE block flattens [B, s, h] to [B·s, h]), so a
    call of n rows is B sequences of n / B tokens. Set the windows with :meth:`set_windows`
    before every forward call (the inherited hook advances ``position`` by n, not s).
    """

    def __init__(self, model: Any, table: np.ndarray, *, name: str = "forced routing"):
        super().__init__(model, table, name=name)
        self.starts = np.zeros(1, dtype=np.int64)

    def set_windows(self, starts: Sequence[int] | np.ndarray, position: int = 0) -> None:
        self.starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        self.position = int(position)

    def rows(self, n: int) -> np.ndarray:
        """The forced ids [n, L_table, m] of a call of n = B·s rows."""
        b = len(self.starts)
        if n % b:
            raise RuntimeError(
                f"{self.name}: a call of {n} rows is not {b} sequences of equal length"
            )
        idx = window_rows(self.starts, self.position, n // b, self.table.shape[0])
        return self.table[idx.reshape(-1)]


# ------------------------------------------------------------------------------------------
# The model and its bytes


def build_model(
    model: str,
    *,
    layers: int | None = None,
    vocab: int | None = None,
    device: str = "cpu",
    dense_dtype: str | None = None,
    seed: int = 0,
    context: int = 4096,
) -> tuple[Any, bool]:
    """(model, is_dummy): a preset's dummy-weight model or a local model, on ``device``."""
    import torch

    from specmoe.engine.models import load_model
    from specmoe.engine.switch import dummy_model
    from specmoe.spec import PRESET_CONFIGS

    presets = {k.lower() for k in PRESET_CONFIGS}
    dummy = model.lower() in presets or model.lower().removesuffix("-dummy") in presets
    if dummy:
        net = dummy_model(model, layers=layers, seed=seed, context=context)
    else:
        if layers is not None:
            raise InputError("applies to a preset's dummy-weight model only", argument="layers")
        net = load_model(model, device="cpu")
    if vocab is not None:
        head = net.get_output_embeddings()
        if vocab < 2 or vocab > head.weight.shape[0]:
            raise InputError(
                f"must lie in 2..{head.weight.shape[0]}, got {vocab}", argument="vocab"
            )
        gen = torch.Generator().manual_seed(seed + 1)
        new = torch.nn.Linear(head.in_features, vocab, bias=False, dtype=head.weight.dtype)
        with torch.no_grad():
            new.weight.normal_(0.0, 0.02, generator=gen)
        new.requires_grad_(False)
        net.set_output_embeddings(new)
        net.config.vocab_size = vocab
    if dense_dtype is not None:
        dt = getattr(torch, dense_dtype, None)
        if not isinstance(dt, torch.dtype):
            raise InputError(f"{dense_dtype!r} is not a torch dtype name", argument="dense_dtype")
        experts = {id(p) for e in _experts(net) for p in e.parameters()}
        for p in net.parameters():
            if id(p) not in experts and p.is_floating_point():
                p.data = p.data.to(dt)
    net.to(device)
    net.eval()
    return net, dummy


@dataclass(frozen=True)
class ModelBytes:
    """Bytes of the weights a pass reads: ``dense`` once per pass (every weight but the
    experts and the input embedding, which a pass reads one row per token), ``expert`` [L]
    per expert of each MoE layer."""

    dense: float
    expert: list[float]
    expert_total: float
    dense_dtype: str
    expert_dtype: str


def _experts(model: Any) -> list[Any]:
    return KernelSwitch(model).experts  # the experts module of each MoE layer


def model_bytes(model: Any) -> ModelBytes:
    experts = _experts(model)
    seen: set[int] = set()
    per_layer, dtypes = [], set()
    for ex in experts:
        tot = 0
        for p in ex.parameters():
            seen.add(p.data_ptr())
            tot += p.numel() * p.element_size()
            dtypes.add(str(p.dtype).removeprefix("torch."))
        per_layer.append(tot / int(ex.gate_up_proj.shape[0]))
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight.data_ptr() == emb.data_ptr()
    if not tied:
        seen.add(emb.data_ptr())
    dense, ddt = 0, set()
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        dense += p.numel() * p.element_size()
        ddt.add(str(p.dtype).removeprefix("torch."))
    total = sum(w * int(ex.gate_up_proj.shape[0]) for w, ex in zip(per_layer, experts))
    return ModelBytes(
        float(dense), per_layer, float(total), ",".join(sorted(ddt)), ",".join(sorted(dtypes))
    )


def cache_bytes(kv: Any) -> float:
    """Bytes of the keys and values a KV cache holds (what one pass's attention reads)."""
    total = 0
    for layer in getattr(kv, "layers", []):
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if t is not None and hasattr(t, "numel"):
                total += t.numel() * t.element_size()
    return float(total)


# ------------------------------------------------------------------------------------------
# The measurement


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize(device)


def measure_efficiency(
    model: Any,
    tables: Sequence[RoutingTable],
    *,
    batches: Sequence[int],
    ks: Sequence[int],
    kernel: str = "dedup",
    context: int = 128,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    clock: str = "wall",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Time one-token steps and verification passes for every table, B and K (module docstring).

    ``clock``: ``wall`` (``time.perf_counter``, synchronised on CUDA) or ``cpu`` (CPU only: one
    thread for torch and the expert kernels, timed by the thread's CPU time
    ``time.thread_time``, which leaves out the time the thread waited for a core on a shared
    machine; memory stalls still count). Every record keeps both clocks.

    Returns ``{"records": [...], "kv_bytes": {B: bytes}, "calls": {...}}``; a record holds
    routing, batch, k (None for the step), repetition, rows, t_ms (the chosen clock), t_wall_ms,
    t_cpu_ms and unique ([L] distinct experts per layer).
    """
    import torch

    if kernel not in ("dedup", "per_slot"):
        raise InputError(f"choose dedup or per_slot, got {kernel!r}", argument="kernel")
    if clock not in ("wall", "cpu"):
        raise InputError(f"choose wall or cpu, got {clock!r}", argument="clock")
    device = next(model.parameters()).device
    if clock == "cpu" and device.type != "cpu":
        raise InputError(f"cpu times CPU runs only, the model is on {device}", argument="clock")
    if repeats < 1 or warmup < 0 or context < 1:
        raise InputError(
            f"repeats >= 1, warmup >= 0 and context >= 1, got {repeats}, {warmup}, {context}"
        )
    if clock == "wall":
        return _measure(
            model,
            tables,
            batches=batches,
            ks=ks,
            kernel=kernel,
            context=context,
            repeats=repeats,
            warmup=warmup,
            seed=seed,
            cpu_clock=False,
            progress=progress,
        )
    from specmoe.kernels import cpu as cpu_kernels

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cpu_kernels.set_num_threads(1)
    try:
        return _measure(
            model,
            tables,
            batches=batches,
            ks=ks,
            kernel=kernel,
            context=context,
            repeats=repeats,
            warmup=warmup,
            seed=seed,
            cpu_clock=True,
            progress=progress,
        )
    finally:
        torch.set_num_threads(threads)
        cpu_kernels.set_num_threads(None)


def _measure(
    model: Any,
    tables: Sequence[RoutingTable],
    *,
    batches: Sequence[int],
    ks: Sequence[int],
    kernel: str,
    context: int,
    repeats: int,
    warmup: int,
    seed: int,
    cpu_clock: bool,
    progress: Callable[[str], None] | None,
) -> dict[str, Any]:
    import torch

    from specmoe.engine.speculative import cache_kwarg, crop_cache, new_cache

    device = next(model.parameters()).device
    batches, ks = sorted({int(b) for b in batches}), sorted({int(k) for k in ks})
    vocab = int(model.get_output_embeddings().weight.shape[0])
    kw = cache_kwarg(model)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    max_rows = max(batches) * (max(ks) + 1)
    measure = KernelPolicy(kernel, max_pass=max_rows)
    prefill = KernelPolicy(kernel, max_pass=1)  # every prefill call is skipped
    switch = KernelSwitch(model, prefill, prefill="skip").install()
    records: list[dict[str, Any]] = []
    kv_bytes: dict[int, float] = {}
    passes = [None, *ks]
    try:
        for table in tables:
            forced = BatchForcedRouting(model, table.experts, name=table.name).install()
            try:
                for b in batches:
                    kv = new_cache(model)
                    switch.set_policy(prefill)
                    forced.set_windows(np.zeros(b, dtype=np.int64))
                    ids = torch.randint(0, vocab, (b, context), generator=gen).to(device)
                    with torch.inference_mode():
                        model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: kv})
                    kv_bytes[b] = cache_bytes(kv)
                    switch.set_policy(measure)
                    for rep in range(warmup + repeats):
                        starts = choose_starts(table.doc_offsets, b, max(ks) + 1, rng)
                        order = passes if rep % 2 == 0 else passes[::-1]
                        for k in order:
                            s = 1 if k is None else k + 1
                            forced.set_windows(starts)
                            x = torch.randint(0, vocab, (b, s), generator=gen).to(device)
                            _sync(device)
                            c0, t0 = time.thread_time(), time.perf_counter()
                            with torch.inference_mode():
                                out = model(input_ids=x, use_cache=True, **{kw: kv})
                                out.logits.argmax(-1)
                            _sync(device)
                            t_wall = (time.perf_counter() - t0) * 1e3
                            t_cpu = (time.thread_time() - c0) * 1e3
                            crop_cache(kv, context)
                            if rep < warmup:
                                continue
                            rows = window_rows(starts, 0, s, table.experts.shape[0])
                            records.append(
                                {
                                    "routing": table.name,
                                    "batch": b,
                                    "k": k,
                                    "repetition": rep - warmup,
                                    "rows": b * s,
                                    "t_ms": t_cpu if cpu_clock else t_wall,
                                    "t_wall_ms": t_wall,
                                    "t_cpu_ms": t_cpu,
                                    "unique": batch_unique(table.experts, rows).tolist(),
                                }
                            )
                    if progress is not None:
                        last = [
                            r for r in records if r["routing"] == table.name and r["batch"] == b
                        ]
                        med = {
                            k: np.median([r["t_ms"] for r in last if r["k"] == k]) for k in passes
                        }
                        progress(
                            f"{table.name} B={b}: step {med[None]:.1f} ms, "
                            + ", ".join(f"K={k} {med[k]:.1f} ms" for k in ks)
                        )
                    del kv
            finally:
                forced.remove()
    finally:
        switch.remove()
    return {"records": records, "kv_bytes": kv_bytes, "calls": dict(switch.calls)}
