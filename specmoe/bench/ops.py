"""Every operation of a verification pass, timed alone at the model's real shapes and depth.

Legend: ``n`` tokens of the pass, ``d`` tokens already in the KV cache, ``h`` hidden size,
``H``/``K`` query/key-value heads of width ``hd``, ``V`` vocabulary, ``N`` experts, ``m`` per
token, ``L`` decoder layers.

:func:`time_operations` takes a loaded HF MoE model (the engine's, with the kernel switch the
engine runs installed on its experts) and, for every (n, d), times on random activations of the
model's own dtype, with the model's own modules and weights:

* ``embed``      the input embedding lookup of n ids (per model);
* ``norm``       one RMSNorm of the layer (``input_layernorm``; counted twice a layer);
* ``qkv``        q/k/v projections (and q/k norms where the family has them);
* ``attention``  rotary embedding, the DynamicCache update of n keys and values onto a cache
                 of depth d (the engine's cache), and the model's own attention function
                 (``config._attn_implementation``, torch SDPA by default) with the causal mask
                 the model itself builds for that pass (captured from a real forward);
* ``o_proj``     the output projection; ``router`` the MoE block's router (logits, top-m);
* ``experts``    the experts module at random distinct ids (the engine's kernel through the
                 kernel switch): timed so that the overhead below is the framework's alone,
                 and not summed by :func:`specmoe.cost.ops_fit.whole_pass_time` (the caller
                 adds the expert fits of the expert benchmark, Eq. (4)/(E.1));
* ``shared_mlp`` the shared expert(s) where the family has them; ``dense_mlp`` the MLP of the
                 dense leading layers (per model, counted once per dense layer);
* ``head``       final norm + lm_head over all n rows (per model);
* ``overhead``   the decoder layer's whole forward (the same captured arguments) minus the sum
                 of its parts: residual adds, reshapes, the MoE block's glue, Python dispatch;
* ``model_overhead``  the whole model forward minus embed, head and L times the layer: the mask
                 and rotary tables, the cache bookkeeping, the model's own loop;
* ``engine_overhead``  the engine's whole pass (:meth:`specmoe.engine.speculative.Engine.forward`:
                 the model forward, the argmax of every row and the routing record) minus the
                 model forward. The engine's router recorder is installed for the whole timing
                 (cleared after every call), so the router and layer times carry its hooks as
                 the engine's passes do.

Methods (as the expert benchmark, :mod:`specmoe.bench.run`): the machine's read ceiling first;
when the model's weights exceed the last-level cache, a buffer of twice the cache is read
before every timed call (flush, untimed), so every call reads its weights (and the KV cache)
from memory; a model that fits in the cache is timed warm, as the engine runs it, and the
result says so. ``warmup`` untimed calls per op and shape, then ``reps`` repetitions in which
the ops alternate round-robin, starting from a different op each repetition. Medians and the
10-90% spread; the clock is the thread's CPU time by default (one thread). On CUDA (a model
loaded on the GPU) every timed call is bracketed by device synchronisations on the wall
clock, activations and the KV cache live on the device, and the cold flush reads a device
buffer of twice the L2 cache.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specmoe.bench.machine import last_level_cache_bytes, measure_ceiling
from specmoe.bench.timing import CLOCKS
from specmoe.cost import ops_fit as OF
from specmoe.errors import InputError

# op -> (per, count attribute, in the whole-pass sum, fit terms)
OPS: dict[str, tuple[str, bool, tuple[str, ...]]] = {
    "embed": ("model", True, ("t0", "bytes")),
    "norm": ("layer", True, ("t0", "bytes")),
    "qkv": ("layer", True, ("t0", "flops")),
    "attention": ("layer", True, ("t0", "bytes", "flops")),
    "o_proj": ("layer", True, ("t0", "flops")),
    "router": ("layer", True, ("t0", "flops")),
    "experts": ("layer", False, ("t0", "tokens")),
    "shared_mlp": ("layer", True, ("t0", "flops")),
    "dense_mlp": ("model", True, ("t0", "flops")),
    "head": ("model", True, ("t0", "flops")),
    "overhead": ("layer", True, ("t0", "tokens")),
    "model_overhead": ("model", True, ("t0", "tokens")),
    "engine_overhead": ("model", True, ("t0", "tokens")),
}


# the fit forms of specmoe's engine's whole pass (``specmoe bench --whole-pass --fit``)
FIT_FORMS = ("plain", "switch", "pern", "pern-processes")
# the matrix products a one-thread GEMM may compute row by row up to a switch (the switch form)
SWITCH_OPS = tuple(k for k, (_, _, terms) in OPS.items() if terms == ("t0", "flops"))


@dataclass(frozen=True)
class OpsResult:
    """What :func:`time_operations` measured: ``whole_pass`` is the profile field."""

    whole_pass: dict[str, Any]
    wall_s: float
    cold: bool
    notes: list[str] = field(default_factory=list)


def _nbytes(*mods: Any) -> int:
    return sum(p.numel() * p.element_size() for m in mods if m is not None for p in m.parameters())


def _moe_parts(net: Any) -> tuple[int, Any, Any, Any, list[int]]:
    """(index of the first MoE layer, its router, experts, shared expert, dense layer indices)."""
    from specmoe.engine.models import moe_experts, moe_layers

    routers = moe_layers(net)
    experts = moe_experts(net)
    li, router = routers[0]
    block = net.model.layers[li].mlp
    shared = getattr(block, "shared_expert", None) or getattr(block, "shared_experts", None)
    moe_idx = {i for i, _ in routers}
    dense = [i for i in range(len(net.model.layers)) if i not in moe_idx]
    return li, router, experts[0], shared, dense


def _norm_apply(norm: Any, x: torch.Tensor) -> torch.Tensor:
    """A q/k norm on a projection output [1, n, w]: over the whole width or per head."""
    w = norm.weight.shape[0]
    return norm(x if x.shape[-1] == w else x.reshape(*x.shape[:-1], -1, w))


def _flush_fn(nbytes: int, device: torch.device | None = None) -> Callable[[], None]:
    """A call that reads ``nbytes`` of another buffer (untimed), evicting the cache."""
    if device is not None and device.type == "cuda":
        gbuf = torch.empty(max(nbytes, 1 << 20) // 4, dtype=torch.float32, device=device)
        gbuf.uniform_(-1, 1)

        def flush() -> None:
            gbuf.sum()
            torch.cuda.synchronize(device)

        return flush
    from specmoe.kernels import _cbuild

    buf = torch.empty(max(nbytes, 1 << 20) // 4, dtype=torch.float32).uniform_(-1, 1)
    lib = _cbuild.load()
    if lib is not None:
        return lambda: lib.lib.specmoe_read(buf.data_ptr(), buf.numel(), 1)
    return lambda: float(buf.sum())


class _Shapes:
    """Per-op byte and flop coefficients of the model (see :func:`specmoe.cost.ops_fit`)."""

    def __init__(self, net: Any, attn: Any, router: Any, shared: Any, dense_mlp: Any):
        cfg = net.config
        self.h = int(cfg.hidden_size)
        self.hd = int(attn.head_dim)
        self.hq = int(cfg.num_attention_heads)
        self.kv = int(cfg.num_key_value_heads)
        self.es = next(attn.parameters()).element_size()
        self.vocab = int(net.get_output_embeddings().weight.shape[0])
        self.n_exp = int(router.weight.shape[0])
        self.shared_i = 0 if shared is None else _nbytes(shared) // (3 * self.h * self.es)
        self.dense_i = 0 if dense_mlp is None else _nbytes(dense_mlp) // (3 * self.h * self.es)

    def of(self, op: str) -> dict[str, float]:
        h, es, q, k = self.h, self.es, self.hq * self.hd, self.kv * self.hd
        if op == "embed":
            return {"bytes_n": 2.0 * h * es}
        if op == "norm":
            return {"bytes0": h * es, "bytes_n": 2.0 * h * es}
        if op == "qkv":
            return {"bytes0": h * (q + 2 * k) * es, "flops_n": 2.0 * h * (q + 2 * k)}
        if op == "attention":  # the cache is read (and copied by the update), q·K and P·V
            return {"bytes_nd": 2.0 * 2 * k * es, "flops_nd": 4.0 * self.hq * self.hd}
        if op == "o_proj":
            return {"bytes0": q * h * es, "flops_n": 2.0 * q * h}
        if op == "router":
            return {"bytes0": self.n_exp * h * es, "flops_n": 2.0 * self.n_exp * h}
        if op == "shared_mlp":
            return {"flops_n": 6.0 * h * self.shared_i}
        if op == "dense_mlp":
            return {"flops_n": 6.0 * h * self.dense_i}
        if op == "head":
            return {"bytes0": self.vocab * h * es, "flops_n": 2.0 * self.vocab * h}
        return {}


def _check_list(name: str, values: Sequence[int], low: int) -> list[int]:
    vals = list(values)
    if not vals or any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in vals):
        raise InputError(f"must be integers >= {low}, got {vals!r}", argument=name)
    return sorted(set(vals))


def time_operations(
    model: Any,
    *,
    n_values: Sequence[int],
    depths: Sequence[int],
    dtype: str | None = None,
    reps: int = 7,
    warmup: int = 2,
    clock: str = "cpu",
    threads: int = 1,
    seed: int = 0,
    model_name: str | None = None,
    progress: bool = True,
    ceiling: bool = True,
    kernel: str | None = "per_slot",
) -> OpsResult:
    """Time and fit every operation of a verify pass of ``model`` (see the module docstring).

    ``dtype`` is recorded only: activations take each op's weight dtype (the model's own);
    None records the dense weights' dtype. ``kernel``: the expert kernel the engine's kernel
    switch runs during the timing (installed here and removed after; None: the model as it is).
    Returns the result whose ``whole_pass`` is the profile's field."""
    from specmoe.engine.speculative import crop_cache, new_cache

    t_start = time.perf_counter()
    n_values = _check_list("n_values", n_values, 1)
    depths = _check_list("depths", depths, 1)
    for name, v, low in (("reps", reps, 1), ("warmup", warmup, 0), ("threads", threads, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise InputError(f"must be an integer >= {low}, got {v!r}", argument=name)
    if clock not in CLOCKS:
        raise InputError(f"unknown {clock!r} (choose from {', '.join(CLOCKS)})", argument="clock")
    if clock == "cpu" and threads != 1:
        raise InputError("cpu: the thread's CPU time measures one thread only", argument="clock")
    on_cuda = next(model.parameters()).device.type == "cuda"
    if on_cuda and clock == "cpu":
        raise InputError("cpu: a CUDA model is timed on the wall clock", argument="clock")
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if progress else (lambda s: None)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        from specmoe.kernels import cpu as kcpu

        kcpu.set_num_threads(threads)
    except ImportError:  # pragma: no cover - the C kernels are optional
        kcpu = None
    switch = None
    if kernel is not None:
        from specmoe.engine.switch import KernelPolicy, KernelSwitch

        switch = KernelSwitch(model, KernelPolicy(kernel)).install()
    from specmoe.engine.capture import RouterRecorder

    recorder = RouterRecorder(model).install()  # the engine's hooks, as in its passes
    try:
        return _time(
            model, n_values, depths, dtype, reps, warmup, clock, seed, model_name, say,
            ceiling, t_start, new_cache, crop_cache, recorder,
        )  # fmt: skip
    finally:
        recorder.remove()
        if switch is not None:
            switch.remove()
        torch.set_num_threads(prev_threads)
        if kcpu is not None:
            kcpu.set_num_threads(None)


def _time(
    net, n_values, depths, dtype, reps, warmup, clock, seed, model_name, say, ceiling,
    t_start, new_cache, crop_cache, recorder,
) -> OpsResult:  # fmt: skip
    inner = net.model
    cfg = net.config
    L = len(inner.layers)
    li, router, experts, shared, dense = _moe_parts(net)
    layer = inner.layers[li]
    attn = layer.self_attn
    dense_mlp = inner.layers[dense[0]].mlp if dense else None
    shapes = _Shapes(net, attn, router, shared, dense_mlp)
    fam = sys.modules[type(attn).__module__]
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    impl = getattr(cfg, "_attn_implementation", "eager") or "eager"
    attn_fn = fam.eager_attention_forward if impl == "eager" else ALL_ATTENTION_FUNCTIONS[impl]
    wdt = next(attn.parameters()).dtype
    dev = next(attn.parameters()).device
    dtype = dtype or str(wdt).removeprefix("torch.")
    llc = last_level_cache_bytes(dev.type)
    weight_bytes = _nbytes(net)
    cold = llc is None or weight_bytes > llc
    notes = []
    if ceiling:
        c = measure_ceiling(
            dev.type, clock=clock, threads=[1] if clock == "cpu" and dev.type == "cpu" else None
        )
        say(f"ceiling {c.gbps:.2f} GB/s ({c.method})")
        notes.append(f"read ceiling {c.gbps:.2f} GB/s ({c.method})")
    llc_txt = "unknown" if llc is None else f"{llc / 2**20:.0f} MiB"
    if cold:
        flush = _flush_fn(2 * (llc or 128 << 20), dev)
        notes.append(
            f"weights {weight_bytes / 2**20:.1f} MiB exceed the last-level cache ({llc_txt}): "
            f"a {2 * (llc or 128 << 20) / 2**20:.0f} MiB buffer is read before every timed call"
        )
    else:
        flush = None
        notes.append(
            f"weights {weight_bytes / 2**20:.2f} MiB fit in the last-level cache ({llc_txt}): "
            "timed warm, as the engine runs them"
        )
    say(notes[-1])
    cuda = dev.type == "cuda"
    if cuda:  # every timed call is bracketed by synchronisations: the wall time of the call

        def timer() -> float:
            torch.cuda.synchronize(dev)
            return time.perf_counter()
    else:
        timer = time.thread_time if clock == "cpu" else time.perf_counter
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)

    def rand(*shape, dt=wdt):
        return torch.randn(*shape, generator=gen).to(device=dev, dtype=dt)

    names = ["embed", "norm", "qkv", "attention", "o_proj", "router", "experts"]
    names += ["shared_mlp"] if shared is not None else []
    names += ["dense_mlp"] if dense_mlp is not None else []
    names += ["head", "layer", "model", "pass"]
    times = {k: np.zeros((len(depths), len(n_values), reps)) for k in names}
    kv = new_cache(net)
    hq, kvh, hd = shapes.hq, shapes.kv, shapes.hd
    n_exp, top_k = shapes.n_exp, int(router.top_k) if hasattr(router, "top_k") else 1

    def one_shape(di: int, d: int, ni: int, n: int) -> None:
        ids = torch.from_numpy(rng.integers(0, cfg.vocab_size, (1, n))).to(dev)
        captured: dict[str, Any] = {}

        def grab(mod, args, kwargs, captured=captured):
            captured.setdefault("args", args)
            captured.setdefault("kwargs", dict(kwargs))

        hook = layer.register_forward_pre_hook(grab, with_kwargs=True)
        net(input_ids=ids, past_key_values=kv, use_cache=True)
        hook.remove()
        crop_cache(kv, d)
        kw = captured["kwargs"]
        mask = kw.get("attention_mask")
        cos, sin = kw["position_embeddings"]
        x = rand(1, n, shapes.h)
        x2 = x.reshape(n, shapes.h)
        q4, k4, v4 = rand(1, hq, n, hd), rand(1, kvh, n, hd), rand(1, kvh, n, hd)
        eid = torch.from_numpy(
            np.argsort(rng.random((n, n_exp)), axis=1)[:, :top_k].astype(np.int64)
        ).to(dev)
        ew = torch.softmax(rand(n, top_k), dim=-1).to(wdt)
        layer_kw = {k: v for k, v in kw.items() if k != "hidden_states"}
        layer_kw.update({"cache": kv} if "cache" in layer_kw else {"past_key_values": kv})

        def engine_pass():  # Engine.forward: the pass, every row's argmax, the routing record
            logits = net(input_ids=ids, past_key_values=kv, use_cache=True).logits[0]
            torch.topk(logits.float(), 2, dim=-1).indices[:, 0].tolist()
            recorder.pop()

        def qkv_call():
            q, k, _ = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
            if hasattr(attn, "q_norm"):
                _norm_apply(attn.q_norm, q), _norm_apply(attn.k_norm, k)

        def attn_call():
            q, k = fam.apply_rotary_pos_emb(q4, k4, cos, sin)
            k, v = kv.update(k, v4, attn.layer_idx)
            attn_fn(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling,
                    sliding_window=getattr(cfg, "sliding_window", None))  # fmt: skip

        calls: dict[str, Callable[[], Any]] = {
            "embed": lambda: inner.embed_tokens(ids),
            "norm": lambda: layer.input_layernorm(x),
            "qkv": qkv_call,
            "attention": attn_call,
            "o_proj": lambda: attn.o_proj(rand_o),
            "router": lambda: router(x2),
            "experts": lambda: experts(x2, eid, ew),
            "shared_mlp": lambda: shared(x2),
            "dense_mlp": lambda: dense_mlp(x),
            "head": lambda: net.lm_head(inner.norm(x)),
            "layer": lambda: layer(x, **layer_kw),
            "model": lambda: net(input_ids=ids, past_key_values=kv, use_cache=True),
            "pass": engine_pass,
        }
        rand_o = rand(1, n, hq * hd)
        grows = {"attention", "layer", "model", "pass"}  # calls that add n tokens to a cache
        for rep in range(-warmup, reps):
            for j in range(len(names)):
                op = names[(j + max(rep, 0)) % len(names)]
                if flush is not None:
                    flush()
                t0 = timer()
                calls[op]()
                dt = timer() - t0
                recorder.clear()
                if op in ("model", "pass"):
                    crop_cache(kv, d)
                elif op in grows:  # only the timed layer's cache grew
                    kv.layers[li].crop(-n)
                if rep >= 0:
                    times[op][di, ni, rep] = dt * 1e3
        say(f"d={d} n={n}: layer {np.median(times['layer'][di, ni]):.3f} ms")

    with torch.inference_mode():
        for di, d in enumerate(depths):
            crop_cache(kv, 0) if kv.get_seq_length() else None
            for i in range(L):  # the cache's content is irrelevant, its length is not
                kv.update(rand(1, kvh, d, hd), rand(1, kvh, d, hd), i)
            for ni, n in enumerate(n_values):
                one_shape(di, d, ni, n)
    wp = summarize_ops(
        times, names, shapes, n_values=n_values, depths=depths, num_layers=L,
        dense_layers=len(dense),
    )  # fmt: skip
    wp.update(
        model=model_name or str(getattr(cfg, "_name_or_path", "") or cfg.model_type),
        layers=L, dtype=dtype, clock=clock, cold=cold, notes=notes,
        weight_bytes=weight_bytes, llc_bytes=llc, reps=reps, warmup=warmup,
        attention=f"the model's own {impl} attention function after a DynamicCache update",
    )  # fmt: skip
    return OpsResult(wp, time.perf_counter() - t_start, cold, notes)


def summarize_ops(
    times: dict[str, np.ndarray],
    names: Sequence[str],
    shapes: Any,
    *,
    n_values: Sequence[int],
    depths: Sequence[int],
    num_layers: int,
    dense_layers: int = 0,
) -> dict[str, Any]:
    """Medians, spread, overheads and fits from ``times[op]`` [depths, n, reps] in ms."""
    med = {k: np.median(v, axis=2) for k, v in times.items()}
    wholes = ("layer", "model", "pass", "embed", "head", "dense_mlp")
    parts = [k for k in names if k not in wholes]
    counted = {k: (2 if k == "norm" else 1) for k in parts}
    layer_sum = sum(counted[k] * times[k] for k in parts)
    derived = {"overhead": times["layer"] - layer_sum}
    model_parts = times["embed"] + times["head"] + num_layers * times["layer"]
    if "dense_mlp" in times:
        model_parts = model_parts + dense_layers * times["dense_mlp"]
    derived["model_overhead"] = times["model"] - model_parts
    if "pass" in times:
        derived["engine_overhead"] = times["pass"] - times["model"]
    fit_n, held_n = OF.held_out_split(n_values)
    nn_, dd_ = np.meshgrid(np.asarray(n_values, float), np.asarray(depths, float))
    ops: dict[str, Any] = {}
    for op in [k for k in names if k not in ("layer", "model", "pass")] + list(derived):
        t = times[op] if op in times else derived[op]
        per, in_sum, terms = OPS[op]
        shape = shapes.of(op)
        feats = OF.op_features({"shape": shape}, nn_, dd_)
        feats = {k: np.broadcast_to(np.asarray(v, float), nn_.shape) for k, v in feats.items()}
        m = np.median(t, axis=2)
        fsel = np.isin(nn_, fit_n)
        hsel = ~fsel if held_n else fsel
        signed = op in derived
        fit = OF.fit_op(terms, {k: v[fsel] for k, v in feats.items()}, m[fsel], signed=signed)
        err_ms = None
        if signed:  # a difference: its error over the whole it is part of
            whole = med[{"overhead": "layer", "engine_overhead": "pass"}.get(op, "model")]
            absd = np.abs(fit.predict({k: v[hsel] for k, v in feats.items()}) - m[hsel])
            errs = absd / whole[hsel]
            err_ms = float(np.median(absd))
        else:
            errs = OF.relative_errors(fit, {k: v[hsel] for k, v in feats.items()}, m[hsel])
        ops[op] = {
            "per": per,
            "count": 2 if op == "norm" else (dense_layers if op == "dense_mlp" else 1),
            "in_sum": in_sum,
            "terms": list(terms),
            "shape": shape,
            "fit": fit.fit,
            "eps": float(min(np.median(errs), 0.999)),
            "eps_max": float(np.max(errs)),
            "eps_of": {"overhead": "layer", "engine_overhead": "pass"}.get(op, "model")
            if signed
            else op,
            "err_ms": err_ms,
            "fit_n": list(fit_n),
            "held_n": list(held_n),
            "n": list(n_values),
            "d": list(depths),
            "median_ms": m.tolist(),
            "p10_ms": np.percentile(t, 10, axis=2).tolist(),
            "p90_ms": np.percentile(t, 90, axis=2).tolist(),
        }
    return {
        "ops": ops,
        "layer_ms": med["layer"].tolist(),
        "model_ms": med["model"].tolist(),
        **({"pass_ms": med["pass"].tolist()} if "pass" in med else {}),
        "overhead_ms_per_layer": np.median(derived["overhead"], axis=2).tolist(),
        "n": list(n_values),
        "d": list(depths),
    }


def _stored_rows(op: dict[str, Any]):
    """A stored op's rows: (n, features, medians, fit rows, held-out rows), [depths, n] each."""
    nn_, dd_ = np.meshgrid(np.asarray(op["n"], float), np.asarray(op["d"], float))
    feats = OF.op_features({"shape": op.get("shape", {})}, nn_, dd_)
    feats = {k: np.broadcast_to(np.asarray(v, float), nn_.shape) for k, v in feats.items()}
    fsel = np.isin(nn_, op["fit_n"])
    return nn_, feats, np.asarray(op["median_ms"], float), fsel, ~fsel if op["held_n"] else fsel


def refit_switch(whole_pass: dict[str, Any]) -> dict[str, Any]:
    """A stored ``whole_pass`` with its matrix products (:data:`SWITCH_OPS`) refitted in the
    two-path form (:func:`specmoe.cost.ops_fit.fit_switch`) from their stored medians, on the
    same fit n; ε again from the held-out n. An op whose one-line fit is as good keeps it (its
    ``switch`` says ``none``); every other op, the medians and the overheads are unchanged.

    Measured here, the reason for the form: PyTorch's one-thread float32 ``linear`` over a
    151,936 × 2048 head takes 63.5, 124.2 and 187.1 ms for 1-3 rows and 204-250 ms for 4-9
    (``results/cpu/whole-pass``, qwen3-dummy-4L): a matrix-vector product per row up to three
    rows, then one blocked product; a line in n misses both paths."""
    plain = refit_plain(whole_pass)  # the one-line fits, whatever form came in
    ops = plain["ops"]
    for name, op in ops.items():
        if name not in SWITCH_OPS:
            continue
        nn_, feats, m, fsel, hsel = _stored_rows(op)
        sw = OF.fit_switch(op["terms"], {k: v[fsel] for k, v in feats.items()}, m[fsel], nn_[fsel])
        if sw is None:
            op["switch"] = "none"
            continue
        pred = sw.predict(nn_[hsel], {k: v[hsel] for k, v in feats.items()})
        errs = np.abs(pred - m[hsel]) / m[hsel]
        op.update(
            switch="rows",
            switch_n=sw.switch_n,
            terms_low=list(sw.low.terms),
            fit_low=sw.low.fit,
            fit=sw.high.fit,
            eps=float(min(np.median(errs), 0.999)),
            eps_max=float(np.max(errs)),
            switch_rms=[sw.rms_plain, sw.rms],
        )
    return {**plain, "ops": ops, "fit_form": "switch"}


def refit_plain(whole_pass: dict[str, Any]) -> dict[str, Any]:
    """A stored ``whole_pass`` with its matrix products (:data:`SWITCH_OPS`) refitted as one
    line in n from their stored medians (:func:`summarize_ops`'s fit, on the same fit n, ε
    from the held-out n): the inverse of :func:`refit_switch` and :func:`refit_pern` (whose
    per-n fits it drops, with every op's errors as they were before them)."""
    ops: dict[str, Any] = {}
    for name, op in whole_pass["ops"].items():
        op = dict(op)
        ops[name] = op
        op.pop("fits_n", None)  # from refit_pern, with the errors it replaced
        op.update(op.pop("eps_line", {}))
        if name not in SWITCH_OPS:
            continue
        for key in ("switch", "switch_n", "terms_low", "fit_low", "switch_rms"):
            op.pop(key, None)
        _, feats, m, fsel, hsel = _stored_rows(op)
        fit = OF.fit_op(op["terms"], {k: v[fsel] for k, v in feats.items()}, m[fsel])
        errs = OF.relative_errors(fit, {k: v[hsel] for k, v in feats.items()}, m[hsel])
        op.update(fit=fit.fit, eps=float(min(np.median(errs), 0.999)), eps_max=float(np.max(errs)))
    return {**whole_pass, "ops": ops, "fit_form": "plain"}


def refit_pern(whole_pass: dict[str, Any]) -> dict[str, Any]:
    """A stored ``whole_pass`` with every op given a fit of its own at every benchmarked n
    (``fits_n``, which :func:`specmoe.cost.ops_fit.op_time` takes at those n), on top of the
    two-path form (:func:`refit_switch`) that stays for any other n.

    At each n the fit runs over the depths. With three or more
    (:func:`specmoe.cost.ops_fit.fit_over_depths`): ``t0`` and the terms that vary with the
    depth, at most one fewer than the depths, each depth's error scored leaving it out. With
    one or two, through them: the op's median at one depth; at two, ``t0`` and the first of
    its terms that varies with the depth (the ``depth`` itself for an op with none), so an
    op is met at both where the line through them has non-negative coefficients (the fits
    are non-negative but for the overheads: one that falls with the depth gets the constant
    nearest both); each cell's error the half-width of its 10-90% spread over the
    repetitions (over the whole it is part of, for an overhead). ``eps`` is the median of
    those errors over every n, ``eps_max`` their largest. Every op, the overheads and the
    attention included.

    What it follows that a form in n does not (``results/cpu/whole-pass``, qwen3-dummy-4L,
    rounds 1-3 on a Zen 4 core): the one-thread float32 head is lower at n = 8 than at 7
    (229.9 against 245.0 ms), and so is the engine's pass (390.7 against 404.2 ms in round 3's
    runs); with one depth the attention's fit in n and d has nothing to hold its depth term
    (held-out ε 0.999, +35 ms over four layers at n = 8)."""
    base = refit_switch(whole_pass)
    ns, ds = [int(v) for v in base["n"]], [int(v) for v in base["d"]]
    nn_, dd_ = np.meshgrid(np.asarray(ns, float), np.asarray(ds, float))
    wholes = {k: np.asarray(base[f"{k}_ms"], float) for k in ("layer", "model", "pass")
              if f"{k}_ms" in base}  # fmt: skip
    ops: dict[str, Any] = {}
    for name, op in base["ops"].items():
        op = dict(op)
        m = np.asarray(op["median_ms"], float)
        feats = OF.op_features({"shape": op.get("shape", {})}, nn_, dd_)
        feats = {k: np.broadcast_to(np.asarray(v, float), nn_.shape) for k, v in feats.items()}
        signed = op.get("err_ms") is not None or bool(np.any(m <= 0))
        whole = wholes.get(op.get("eps_of", name)) if signed else None
        if signed and whole is None:
            raise InputError(f"whole_pass: the op {name!r} is a difference with no whole "
                             f"({op.get('eps_of')!r}) to score it against", argument="whole_pass")  # fmt: skip
        ref = whole if signed else m

        def errors(fit, sel, m=m, feats=feats, ref=ref):
            absd = np.abs(fit.predict({k: v[sel] for k, v in feats.items()}) - m[sel])
            return absd / np.abs(ref[sel]), absd

        half = (np.asarray(op["p90_ms"], float) - np.asarray(op["p10_ms"], float)) / 2
        fits_n: dict[str, Any] = {}
        errs: list[float] = []
        absd: list[float] = []
        for v in ns:
            at = nn_ == v
            if len(ds) >= 3:
                fv, tv, ev, av = OF.fit_over_depths(at, op["terms"], feats, m, signed, errors)
            else:  # one or two depths: through them, with the repetitions' spread
                tv = ["t0"] + [t for t in op["terms"] if t in ("bytes", "flops", "depth")
                               and np.ptp(feats[t][at]) > 0]  # fmt: skip
                if len(tv) == 1 and np.ptp(feats["depth"][at]) > 0:
                    tv.append("depth")
                tv = tv[: int(at.sum())]
                fv = OF.fit_op(tv, {k: x[at] for k, x in feats.items()}, m[at], signed=signed)
                ev = (half[at] / np.abs(ref[at])).tolist()
                av = half[at].tolist()
            fits_n[str(v)] = {"terms": list(tv), "fit": fv.fit}
            errs += ev
            absd += av
        op.update(
            fits_n=fits_n,
            eps_line={k: op[k] for k in ("eps", "eps_max", "err_ms") if k in op},
            eps=float(min(np.median(errs), 0.999)),
            eps_max=float(np.max(errs)),
        )
        if signed:
            op["err_ms"] = float(np.median(absd))
        ops[name] = op
    return {**base, "ops": ops, "fit_form": "pern"}


def refit_pern_processes(whole_pass: dict[str, Any]) -> dict[str, Any]:
    """:func:`refit_pern` on the median over the benchmark's processes of every op's median at
    every (n, d) (``processes.ops_median_ms``, which ``specmoe bench --whole-pass --processes
    K`` records), instead of the one process kept: each cell's own median process, so that one
    process's move at one n does not become the prediction. The spread an op's ε is taken
    from (one or two depths) is the processes' range at that cell (its half-range over the
    median), the layer, model and engine-pass times the median over processes too. The kept
    process's own medians, spreads and whole-pass times stay in ``processes.kept``
    (:func:`kept_process` puts them back; its medians alone in ``processes.kept_median_ms``).

    Why (``results/cpu/whole-pass``, qwen3-dummy-4L round 4): the benchmarks of two sessions
    read the lm_head at n = 5 19% apart (279.4 against 234.6 ms) where the repetitions of one
    process spread 6%; the per-n form followed whichever the kept process read."""
    whole_pass = kept_process(whole_pass)  # again from the process it kept, if refitted
    proc = whole_pass.get("processes") or {}
    per = proc.get("ops_median_ms")
    if not isinstance(per, dict) or not per:
        raise InputError(
            "whole_pass: --fit pern-processes needs every process's medians "
            "(processes.ops_median_ms): measure with --whole-pass --processes K, K >= 2",
            argument="--fit",
        )
    ops: dict[str, Any] = {}
    for name, op in whole_pass["ops"].items():
        op = dict(op)
        if name in per:
            m = np.asarray(per[name], float)  # [processes, depths, n]
            op.update(median_ms=np.median(m, axis=0).tolist(), p10_ms=m.min(axis=0).tolist(),
                      p90_ms=m.max(axis=0).tolist())  # fmt: skip
        ops[name] = op
    wholes = {k: np.median(np.asarray(proc[k], float), axis=0).tolist()
              for k in ("layer_ms", "model_ms", "pass_ms") if proc.get(k)}  # fmt: skip
    kept = {name: {k: whole_pass["ops"][name][k] for k in _KEPT_OP if k in whole_pass["ops"][name]}
            for name in per}  # fmt: skip
    kept_wholes = {k: whole_pass[k] for k in wholes if k in whole_pass}
    out = refit_pern({**whole_pass, **wholes, "ops": ops})
    out["processes"] = {
        **proc,
        "kept_median_ms": {name: v["median_ms"] for name, v in kept.items()},
        "kept": {"ops": kept, **kept_wholes},
    }
    return {**out, "fit_form": "pern-processes"}


_KEPT_OP = ("median_ms", "p10_ms", "p90_ms")


def kept_process(whole_pass: dict[str, Any]) -> dict[str, Any]:
    """``whole_pass`` as the process its benchmark kept measured it: a whole pass refitted by
    :func:`refit_pern_processes` carries the per-cell medians over the processes in its ops
    and the kept process's own medians, spreads and whole-pass times in ``processes.kept``,
    which this puts back (any other whole pass is returned as it is). Every refit starts
    here, so that ``--fit pern`` of a ``pern-processes`` profile is the median process's
    per-n form, not the per-cell medians under another name."""
    proc = whole_pass.get("processes") or {}
    if "kept" not in proc:
        if "kept_median_ms" in proc:
            raise InputError("whole_pass: refitted on the processes' medians without the kept "
                             "process's spreads (processes.kept); refit the profile it came "
                             "from", argument="--from")  # fmt: skip
        return whole_pass
    kept = proc["kept"]
    ops = {name: {**op, **kept["ops"].get(name, {})} for name, op in whole_pass["ops"].items()}
    rest = {k: v for k, v in proc.items() if k not in ("kept", "kept_median_ms")}
    wholes = {k: v for k, v in kept.items() if k != "ops"}
    return {**whole_pass, **wholes, "ops": ops, "processes": rest}


def _from_kept(fn):
    def refit(whole_pass: dict[str, Any]) -> dict[str, Any]:
        return fn(kept_process(whole_pass))

    refit.__doc__, refit.__name__ = fn.__doc__, fn.__name__
    return refit


REFITS = {
    "plain": _from_kept(refit_plain),
    "switch": _from_kept(refit_switch),
    "pern": _from_kept(refit_pern),
    "pern-processes": refit_pern_processes,
}
