"""The bandwidth profile: what the expert-operation benchmark measured and fitted.

``specmoe bench`` writes it (JSON); the cost model (``specmoe plan``) and the validation read it.
numpy only, so the cost model can read a profile without torch.

Units are SI: seconds, bytes, bytes per second (bandwidths in the JSON are GB/s, 1 GB = 1e9 B).
Legend: ``n`` pass sizes 1..n_max, ``L`` timed layers (the trace's MoE layers), kernels
``per_slot`` and ``dedup``.

Fields (paper 002 Section 2, Appendix E):

``model``           the ModelSpec (``ModelSpec.to_dict()``) whose shapes were timed
``device``          "cpu" or "cuda"; ``device_name`` the processor or GPU name; ``dtype``
``ceiling_gbps``    measured read bandwidth of a buffer much larger than the last-level cache
``peak_gflops``     the roofline's arithmetic peak (``bench.machine.roofline_peak_flops``), or None
``n``               [n_max] pass sizes
``beta_slot``       [n_max] per-slot effective bandwidth on requested bytes n·m·b (GB/s), over
                    recorded windows (times summed over layers and windows, like Table 1)
``beta_dedup``      [n_max] dedup effective bandwidth on union bytes U·b (GB/s)
``r``               [n_max] beta_dedup / beta_slot
``u_bar``           [n_max] E_dedup(n)/E_slot(n) on the recorded windows
``reread_cost``     c_re / c_u of the per-slot fit Eq. (4) (median over layers)
``epsilon``         {"per_slot": ε, "dedup": ε}: median relative error of each fit on recorded
                    windows it did not see (paper 002 Section 4)
``crossover``       first n from which dedup stays faster on recorded windows, or None
``fits``            {"per_slot": {"t_op", "c_u", "c_re"}, "dedup": {"t_op", "c_g", "c_t"}}:
                    Eq. (4) and Eq. (E.1) constants in seconds, s/byte and s/token
``op_time``         {"per_slot": {"predicted": [L][n_max], "measured": [L][n_max]}, "dedup": ...}:
                    one layer's expert-operation time (s): the fit evaluated at the union bytes
                    of recorded windows of layer l (mean over windows), and the measured median
                    time over the same windows (the "measured-time version" of Eq. (22))
``layers``          [L] the trace's MoE layer indices behind ``op_time``
``implementations`` {kernel name: {"device", "requested", "ran", "kernel", "fallback",
                    "compiler", "triton"}} for every timed kernel: the implementation the name
                    stands for (``c``, ``triton``, ``torch``, ``transformers``), the one that
                    really ran and the registered kernel whose code that is (``dedup_torch``
                    when ``dedup`` fell back), why it fell back (null: it did not), and the C
                    compiler (cpu) or Triton (cuda) status; ``{}`` in profiles written before
                    the field existed (nothing is known then)
``source``          what produced it (command, trace path, date)
``whole_pass``      optional (null in profiles written before it existed): every other operation
                    of a verify pass, timed alone (``specmoe bench --whole-pass``,
                    :mod:`specmoe.bench.ops`): ``{"model", "layers", "dtype", "clock", "n", "d",
                    "ops": {op: {"per": "layer"|"model", "count", "in_sum", "terms", "shape",
                    "fit": {"t0_ms", "bytes_gbps", "gflops", "per_token_ms"[, "per_depth_ms"]}, "eps",
                    "n", "d",
                    "median_ms": [d][n], "p10_ms", "p90_ms"}}, "overhead_ms_per_layer": [d][n]
                    [, "kv_pad": P][, "level": {"<depth>": s}]}``;
                    :func:`specmoe.cost.ops_fit.whole_pass_time` sums it (with ``kv_pad``, an
                    engine's KV view padding, on the cells a pass reads:
                    :func:`specmoe.cost.ops_fit.kv_width`); ``level`` (positive factors by the
                    runs' depth): the benchmark's passes measured beside the runs over the
                    profile's own (``scripts/llamacpp_level.py``), applied by
                    :func:`specmoe.validate.whole_pass.whole_pass_version`
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specmoe._io import atomic_write_json, to_jsonable
from specmoe.errors import InputError
from specmoe.formats._common import read_json_capped

SCHEMA = "specmoe.bandwidth_profile/1"
KERNELS = ("per_slot", "dedup")


@dataclass(frozen=True)
class BandwidthProfile:
    model: dict[str, Any]
    device: str
    dtype: str
    ceiling_gbps: float
    n: list[int]
    beta_slot: list[float]
    beta_dedup: list[float]
    r: list[float]
    u_bar: list[float]
    reread_cost: float | None
    epsilon: dict[str, float]
    crossover: int | None
    fits: dict[str, dict[str, float]]
    op_time: dict[str, dict[str, list[list[float]]]]
    layers: list[int]
    device_name: str = ""
    peak_gflops: float | None = None
    implementations: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    whole_pass: dict[str, Any] | None = None

    @property
    def model_name(self) -> str:
        return str(self.model.get("name", ""))

    @property
    def fallbacks(self) -> dict[str, str]:
        """Kernel name -> why it ran another implementation than its own, for those that did."""
        return {
            k: str(v["fallback"])
            for k, v in self.implementations.items()
            if v.get("fallback") is not None
        }

    def to_dict(self) -> dict[str, Any]:
        d = to_jsonable(self)
        d["schema"] = SCHEMA
        return d

    def save(self, path: str | os.PathLike) -> Path:
        return atomic_write_json(path, self.to_dict())


def _finite_list(name: str, path: str, values: Any, length: int | None = None) -> list[float]:
    if not isinstance(values, list):
        raise InputError(f"{path}: {name} must be a list, got {type(values).__name__}")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, list):
            out.append(_finite_list(f"{name}[{i}]", path, v))
            continue
        try:
            ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        except OverflowError:  # an integer beyond any float
            ok = False
        if not ok:
            raise InputError(f"{path}: {name}[{i}] is {v!r:.40}, not a finite number")
        out.append(float(v))
    if length is not None and len(out) != length:
        raise InputError(f"{path}: {name} has {len(out)} entries, expected {length}")
    return out


def _is_int(v: Any, low: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _kernel_objects(name: str, path: str, value: Any) -> dict[str, dict[str, Any]]:
    """``value`` as ``{"per_slot": {...}, "dedup": {...}}``; anything else names the field."""
    if not isinstance(value, dict) or not set(KERNELS) <= set(value):
        raise InputError(f"{path}: {name} must be an object giving per_slot and dedup")
    for p in KERNELS:
        if not isinstance(value[p], dict):
            raise InputError(f"{path}: {name}.{p} must be an object, got {type(value[p]).__name__}")
    return value


def _implementations(value: Any, path: str) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict):
        raise InputError(f"{path}: implementations must be an object, got {type(value).__name__}")
    out = {}
    for name, rec in value.items():
        if not isinstance(rec, dict):
            raise InputError(f"{path}: implementations.{name} must be an object")
        for key in ("requested", "ran"):
            if not isinstance(rec.get(key), str):
                raise InputError(f"{path}: implementations.{name}.{key} must be a string")
        fb = rec.get("fallback")
        if fb is not None and not isinstance(fb, str):
            raise InputError(f"{path}: implementations.{name}.fallback must be a string or null")
        out[str(name)] = dict(rec)
    return out


WHOLE_PASS_PER = ("layer", "model")
WHOLE_PASS_TERMS = ("t0", "bytes", "flops", "tokens", "depth")


def whole_pass_from_dict(wp: Any, path: str = "profile") -> dict[str, Any]:
    """Validate the ``whole_pass`` field; every problem is one line naming ``path`` and the key."""
    if not isinstance(wp, dict):
        raise InputError(f"{path}: whole_pass must be an object, got {type(wp).__name__}")
    for key in ("model", "dtype", "clock"):
        if not isinstance(wp.get(key), str):
            raise InputError(f"{path}: whole_pass.{key} must be a string")
    if not _is_int(wp.get("layers"), 1):
        raise InputError(f"{path}: whole_pass.layers must be a positive integer")
    ns, ds = wp.get("n"), wp.get("d")
    if not isinstance(ns, list) or not ns or not all(_is_int(x, 1) for x in ns):
        raise InputError(f"{path}: whole_pass.n must be a non-empty list of positive integers")
    if not isinstance(ds, list) or not ds or not all(_is_int(x, 0) for x in ds):
        raise InputError(f"{path}: whole_pass.d must be a non-empty list of depths (integers)")
    ops = wp.get("ops")
    if not isinstance(ops, dict) or not ops:
        raise InputError(f"{path}: whole_pass.ops must be a non-empty object")
    for name, op in ops.items():
        where = f"whole_pass.ops.{name}"
        if not isinstance(op, dict):
            raise InputError(f"{path}: {where} must be an object")
        if op.get("per") not in WHOLE_PASS_PER:
            raise InputError(f"{path}: {where}.per must be 'layer' or 'model'")
        if not _is_int(op.get("count", 1), 0) or not isinstance(op.get("in_sum", True), bool):
            raise InputError(f"{path}: {where}: count must be an integer >= 0, in_sum a boolean")
        terms = op.get("terms")
        if (
            not isinstance(terms, list)
            or not terms
            or any(t not in WHOLE_PASS_TERMS for t in terms)
        ):
            raise InputError(f"{path}: {where}.terms must list terms of {WHOLE_PASS_TERMS}")
        fit, shape = op.get("fit"), op.get("shape", {})
        if not isinstance(fit, dict) or not isinstance(shape, dict):
            raise InputError(f"{path}: {where}.fit and .shape must be objects")
        _finite_list(f"{where}.fit", path, [v for v in fit.values() if v is not None])
        _finite_list(f"{where}.shape", path, list(shape.values()))
        if op.get("fit_n1") is not None:  # a one-row fit (llama.cpp's step1 form)
            t1, f1 = op.get("terms_n1"), op["fit_n1"]
            if not isinstance(t1, list) or not t1 or any(t not in WHOLE_PASS_TERMS for t in t1):
                raise InputError(f"{path}: {where}.terms_n1 must list terms of {WHOLE_PASS_TERMS}")
            if not isinstance(f1, dict):
                raise InputError(f"{path}: {where}.fit_n1 must be an object")
            _finite_list(f"{where}.fit_n1", path, [v for v in f1.values() if v is not None])
        if op.get("fits_n") is not None:  # fits of their own per n (the pern forms)
            fn = op["fits_n"]
            if not isinstance(fn, dict) or not fn:
                raise InputError(f"{path}: {where}.fits_n must be a non-empty object of n: fit")
            for key, e in fn.items():
                w = f"{where}.fits_n[{key!r}]"
                if not (isinstance(key, str) and key.isdigit() and int(key) >= 1):
                    raise InputError(f"{path}: {w}: the key is not a pass size n >= 1")
                if not isinstance(e, dict) or not isinstance(e.get("fit"), dict):
                    raise InputError(f"{path}: {w} must be an object with terms and fit")
                t = e.get("terms")
                if not isinstance(t, list) or not t or any(x not in WHOLE_PASS_TERMS for x in t):
                    raise InputError(f"{path}: {w}.terms must list terms of {WHOLE_PASS_TERMS}")
                _finite_list(f"{w}.fit", path, [v for v in e["fit"].values() if v is not None])
        (eps,) = _finite_list(f"{where}.eps", path, [op.get("eps")])
        if eps < 0:
            raise InputError(f"{path}: {where}.eps must be >= 0, got {eps}")
        if op.get("err_ms") is not None:
            _finite_list(f"{where}.err_ms", path, [op["err_ms"]])
        for key in ("median_ms", "p10_ms", "p90_ms"):
            rows = _finite_list(f"{where}.{key}", path, op.get(key), len(ds))
            if any(not isinstance(r, list) or len(r) != len(ns) for r in rows):
                raise InputError(f"{path}: {where}.{key} must be [{len(ds)} depths][{len(ns)} n]")
    pad = wp.get("kv_pad")
    if pad is not None and not _is_int(pad, 1):
        raise InputError(f"{path}: whole_pass.kv_pad must be a positive integer, got {pad!r}")
    ov = wp.get("overhead_ms_per_layer")
    if ov is not None:
        _finite_list("whole_pass.overhead_ms_per_layer", path, ov, len(ds))
    level = wp.get("level")
    if level is not None:
        if not isinstance(level, dict) or not level:
            raise InputError(f"{path}: whole_pass.level must be an object of depth: factor")
        for k, v in level.items():
            if not (isinstance(k, str) and k.isdigit() and int(k) >= 1):
                raise InputError(f"{path}: whole_pass.level: {k!r} is not a depth (tokens)")
            (x,) = _finite_list(f"whole_pass.level[{k}]", path, [v])
            if x <= 0:
                raise InputError(f"{path}: whole_pass.level[{k}] must be > 0, got {x}")
    return dict(wp)


def profile_from_dict(d: dict[str, Any], *, path: str = "profile") -> BandwidthProfile:
    """Validate a profile dict; every problem is a one-line ``InputError`` naming ``path``."""
    if not isinstance(d, dict):
        raise InputError(f"{path}: a bandwidth profile must be a JSON object")
    if d.get("schema") != SCHEMA:
        raise InputError(
            f"{path}: not a bandwidth profile (schema {d.get('schema')!r}, expected {SCHEMA!r})"
        )
    required = (
        "model",
        "device",
        "dtype",
        "ceiling_gbps",
        "n",
        "beta_slot",
        "beta_dedup",
        "r",
        "u_bar",
        "epsilon",
        "fits",
        "op_time",
        "layers",
    )
    missing = [k for k in required if k not in d]
    if missing:
        raise InputError(f"{path}: missing {', '.join(missing)}")
    model = d["model"]
    if not isinstance(model, dict) or not isinstance(model.get("name"), str):
        raise InputError(f"{path}: model must be a ModelSpec object with a name")
    for key in ("num_experts", "top_k", "hidden_size", "expert_intermediate"):
        if key in model and not _is_int(model[key], 1):
            raise InputError(
                f"{path}: model.{key} must be a positive integer, got {model[key]!r:.40}"
            )
    for key in ("device", "dtype", "device_name"):
        if key in d and not isinstance(d[key], str):
            raise InputError(f"{path}: {key} must be a string, got {type(d[key]).__name__}")
    for key in ("source", "extra"):
        if key in d and not isinstance(d[key], dict):
            raise InputError(f"{path}: {key} must be an object, got {type(d[key]).__name__}")
    n = d["n"]
    if not isinstance(n, list) or not n or not all(_is_int(x, 1) for x in n):
        raise InputError(f"{path}: n must be a non-empty list of positive integers")
    k = len(n)
    (ceiling,) = _finite_list("ceiling_gbps", path, [d["ceiling_gbps"]])
    if ceiling <= 0:
        raise InputError(f"{path}: ceiling_gbps must be positive, got {ceiling}")
    lists = {
        name: _finite_list(name, path, d[name], k)
        for name in ("beta_slot", "beta_dedup", "r", "u_bar")
    }
    for name in ("beta_slot", "beta_dedup"):
        if any(v <= 0 for v in lists[name]):
            raise InputError(f"{path}: {name} must be positive at every n")
    eps = d["epsilon"]
    if not isinstance(eps, dict) or set(eps) != set(KERNELS):
        raise InputError(f"{path}: epsilon must give per_slot and dedup")
    eps = dict(zip(KERNELS, _finite_list("epsilon", path, [eps[p] for p in KERNELS])))
    if any(not 0 <= v < 1 for v in eps.values()):
        raise InputError(f"{path}: epsilon must lie in [0, 1), got {eps}")
    fits = _kernel_objects("fits", path, d["fits"])
    fits = {
        p: dict(zip(fits[p], _finite_list(f"fits.{p}", path, list(fits[p].values()))))
        for p in KERNELS
    }
    op = _kernel_objects("op_time", path, d["op_time"])
    layers = d["layers"]
    if not isinstance(layers, list) or not layers or not all(_is_int(x, 0) for x in layers):
        raise InputError(f"{path}: layers must be a non-empty list of layer indices (integers)")
    op_time = {}
    for p in KERNELS:
        op_time[p] = {}
        for which in ("predicted", "measured"):
            rows = _finite_list(f"op_time.{p}.{which}", path, op[p].get(which), len(layers))
            for i, row in enumerate(rows):
                if not isinstance(row, list) or len(row) != k:
                    raise InputError(f"{path}: op_time.{p}.{which}[{i}] must have {k} entries")
                if any(v <= 0 for v in row):
                    raise InputError(f"{path}: op_time.{p}.{which}[{i}] has a non-positive time")
            op_time[p][which] = rows
    cross = d.get("crossover")
    if cross is not None and (not _is_int(cross, 1) or cross not in n):
        raise InputError(f"{path}: crossover {cross!r} is not one of n")
    rc = d.get("reread_cost")
    if rc is not None:
        (rc,) = _finite_list("reread_cost", path, [rc])
    peak = d.get("peak_gflops")
    if peak is not None:
        (peak,) = _finite_list("peak_gflops", path, [peak])
        if peak <= 0:
            raise InputError(f"{path}: peak_gflops must be positive, got {peak}")
    return BandwidthProfile(
        model=model,
        device=str(d["device"]),
        dtype=str(d["dtype"]),
        ceiling_gbps=ceiling,
        n=list(n),
        **lists,
        reread_cost=rc,
        epsilon=eps,
        crossover=cross,
        fits=fits,
        op_time=op_time,
        layers=list(layers),
        device_name=str(d.get("device_name", "")),
        peak_gflops=peak,
        implementations=_implementations(d.get("implementations", {}), path),
        source=dict(d.get("source", {})),
        extra=dict(d.get("extra", {})),
        whole_pass=None
        if d.get("whole_pass") is None
        else whole_pass_from_dict(d["whole_pass"], path),
    )


def load_profile(
    path: str | os.PathLike, *, spec: Any = None, argument: str | None = None
) -> BandwidthProfile:
    """Read and validate a profile; with ``spec``, check that it was measured for that model.

    Every problem is one ``InputError`` line naming the file and the field (a file over the
    16 MiB JSON limit or nested deeper than 100 levels included); ``argument`` (the caller's
    argument that gave ``path``) is carried by read errors.

    A profile matches a spec when N, m, hidden size and expert width agree (the timed shapes).
    """
    path = Path(path)
    d = read_json_capped(path, "bandwidth profile", argument=argument)
    prof = profile_from_dict(d, path=str(path))
    if spec is not None:
        check_profile_matches(prof, spec, path=str(path))
    return prof


def check_profile_matches(prof: BandwidthProfile, spec: Any, *, path: str = "profile") -> None:
    keys = ("num_experts", "top_k", "hidden_size", "expert_intermediate")
    theirs = tuple(prof.model.get(k) for k in keys)
    ours = tuple(getattr(spec, k) for k in keys)
    if theirs != ours:
        raise InputError(
            f"{path}: profile is for model {prof.model_name!r} "
            f"(N, m, hidden, inter = {theirs}), not {spec.name!r} {ours}"
        )
