"""A/B of builds of the C expert kernels: the same calls on each build, alternated, paired.

Each variant is the kernel source compiled with this processor's native flag set (the package's
own build here, e.g. the Zen 4 set) plus extra flags (``name=-DSM_DP_RB1=8``; a later ``-D`` of
the same macro wins), another
copy of the source module (``name=@path/to/_csrc.py``, e.g. an older revision from
``git show REV:specmoe/kernels/_csrc.py``), or the same source with its bf16 dot-product path
switched off (``name=nodp``: the widening path in the same machine code). For each n, each mode (per-slot, dedup) and each
repetition, every variant runs the same passes in turn (the order reversed on odd repetitions),
each call on experts drawn afresh from a weight pool three times the last-level cache (a call on
the experts the previous variant just read would find them in the cache), each timing beside a
read of the same chunk of a probe buffer (chunks of one buffer can read at very different
speeds: they are compared only with themselves). Printed per variant: the median of
time / (bytes / ceiling), the median β and ceiling, and the median of β / β of the first
variant over the paired calls (``vs``), the figure to decide by.

    python benchmarks/kernel_ab.py --variants "dp=,rb8=-DSM_DP_RB1=8" [--dtype bfloat16|float32|q8_0]
        [--n 1,3,5,9] [--modes per_slot,dedup] [--reps 6] [--threads 1] [--routing sticky|shared]
        [--json OUT]

``--routing sticky`` (the default) keeps each expert of the previous token with probability
0.363; ``shared`` sends all n tokens to the same M experts (every group n tokens: the case of
many tokens on one expert).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from specmoe.bench.machine import huge_pages, last_level_cache_bytes
from specmoe.errors import InputError
from specmoe.kernels import _cbuild
from specmoe.kernels._contract import torch_dtype

H, INTER, M, NUM = 2048, 1024, 8, 64  # OLMoE-1B-7B's expert shapes, 64 experts, top-8
MODES = {"per_slot": 0, "dedup": 1}
PROG = "kernel_ab"
WT = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, "q8_0": 3}
Q8_BYTES = 34 / 32  # q8_0: one fp16 scale and 32 int8 per 32 weights


def _source(spec: str) -> tuple[str, tuple[str, ...]]:
    if spec == "nodp":
        return _cbuild.SOURCE, ()
    if spec.startswith("@"):
        path = Path(spec[1:])
        if not path.is_file():
            raise InputError(f"no file {path}", argument="variants")
        mod_spec = importlib.util.spec_from_file_location("_csrc_variant", path)
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
        return mod.SOURCE, ()
    return _cbuild.SOURCE, tuple(spec.split())


def _base_flags() -> tuple[str, ...]:
    """The native flag set of this processor (:func:`specmoe.kernels._cbuild.flag_sets`: the
    shipped build's, e.g. the Zen 4 set): a variant's flags are added to these, so ``base=``
    is the kernel the package builds here."""
    for f in _cbuild.flag_sets():
        if "-march=native" in f:
            return tuple(f)
    return ("-O3", "-march=native", "-fopenmp")


def build_variants(text: str, tmp: Path) -> dict[str, _Lib]:
    base = _base_flags()
    libs = {}
    cc = _cbuild.find_compiler()
    if cc is None:
        raise InputError("no C compiler found (set CC)", argument="variants")
    for item in text.split(","):
        name, sep, spec = item.partition("=")
        if not sep or not name:
            raise InputError(
                f"expected name=flags or name=@file, got {item!r}", argument="variants"
            )
        src, extra = _source(spec)
        flags = (*base, *extra)
        target = tmp / f"{name}.so"
        err = _cbuild._compile(cc, flags, target, src)
        if err:
            raise InputError(f"{name}: did not compile: {err.splitlines()[0]}", argument="variants")
        libs[name] = _Lib(ctypes.CDLL(str(target)), flags)
        if spec == "nodp":  # the same binary with the bf16 dot-product path switched off
            lib = libs[name].lib
            if not hasattr(lib, "specmoe_set_bf16dp") or not lib.specmoe_has_bf16dp():
                raise InputError(
                    f"{name}: this build has no bf16 path to switch off", argument="variants"
                )
            lib.specmoe_set_bf16dp(0)
            libs[name].flags = (*flags, "(bf16 path off)")
    return libs


class _Lib:
    """A variant's library: only the two routines timed (an older source may lack the rest)."""

    def __init__(self, lib: ctypes.CDLL, flags: tuple[str, ...]):
        p, i, ll, fl = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_float
        f = lib.specmoe_expert_op
        f.argtypes = [p, i, i, p, p, i, i, ll, ll, ll, ll, p, p, p, p, i, ll, i, i, fl, fl, i, p]
        f.restype = ctypes.c_int
        lib.specmoe_read.argtypes = [p, ll, i]
        lib.specmoe_read.restype = ctypes.c_double
        self.lib, self.flags = lib, flags


def _ids(n: int, g: torch.Generator, keep: float = 0.363) -> torch.Tensor:
    """A sticky pass: each expert of the previous token kept with probability ``keep``."""
    ids = torch.zeros(n, M, dtype=torch.int64)
    prev = torch.randperm(NUM, generator=g)[:M].tolist()
    for t in range(n):
        cur = [e for e in prev if float(torch.rand(1, generator=g)) < keep]
        for e in torch.randperm(NUM, generator=g).tolist():
            if len(cur) == M:
                break
            if e not in cur:
                cur.append(e)
        ids[t] = torch.tensor(cur)
        prev = cur
    return ids


def _shared_ids(n: int, g: torch.Generator) -> torch.Tensor:
    """Every token on the same M experts."""
    return torch.randperm(NUM, generator=g)[:M].repeat(n, 1)


ROUTING = {"sticky": _ids, "shared": _shared_ids}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--n", default="1,3,5,9")
    ap.add_argument("--modes", default="per_slot,dedup")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--routing", default="sticky")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    try:
        dtype = "q8_0" if a.dtype == "q8_0" else torch_dtype(a.dtype)
        ns = _ints(a.n, "--n")
        bad = [x for x in a.modes.split(",") if x not in MODES]
        if bad:
            raise InputError(
                f"unknown mode {bad[0]!r} (choose from per_slot, dedup)", argument="--modes"
            )
        modes = [MODES[x] for x in a.modes.split(",")]
        if a.routing not in ROUTING:
            raise InputError(
                f"unknown routing {a.routing!r} (choose from {', '.join(sorted(ROUTING))})",
                argument="--routing",
            )
        if a.reps < 1 or a.threads < 1:
            raise InputError("--reps and --threads must be positive")
        with tempfile.TemporaryDirectory(prefix="specmoe-ab-") as tmp:
            libs = build_variants(a.variants, Path(tmp))
            return _run(a, libs, dtype, ns, modes)
    except InputError as exc:
        shown = str(exc.as_flag("--variants") if exc.argument == "variants" else exc)
        if shown.startswith("dtype: "):
            shown = "--dtype: " + shown.removeprefix("dtype: ")
        print(f"{PROG}: error: {shown}", file=sys.stderr)
        return 2


def _ints(text: str, flag: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise InputError(
            f"expected positive integers separated by commas, got {text!r}", argument=flag
        )
    return out


def _run(a, libs, dtype, ns, modes) -> int:
    th = a.threads
    clk = time.thread_time if th == 1 else time.perf_counter
    q8 = dtype == "q8_0"
    eb = 3 * H * INTER * (Q8_BYTES if q8 else torch.empty(0, dtype=dtype).element_size())
    llc = last_level_cache_bytes() or (256 << 20)
    pool = max(NUM, int(3 * llc // eb) + 1)
    if q8:  # llama.cpp's q8_0 blocks, quantised expert by expert
        from specmoe.kernels.q8 import quantize_q8_0

        wgu = torch.cat([quantize_q8_0(torch.randn(1, 2 * INTER, H) * 0.02).blocks
                         for _ in range(pool)])  # fmt: skip
        wd = torch.cat([quantize_q8_0(torch.randn(1, H, INTER) * 0.02).blocks for _ in range(pool)])
    else:
        wgu = torch.empty(pool, 2 * INTER, H, dtype=dtype)
        wd = torch.empty(pool, H, INTER, dtype=dtype)
        for e in range(pool):
            wgu[e] = torch.randn(2 * INTER, H) * 0.02
            wd[e] = torch.randn(H, INTER) * 0.02
    probe = torch.empty(64 << 20, dtype=torch.float32).uniform_(-1, 1)
    chunk, nchunks = 8 << 20, 8
    g = torch.Generator().manual_seed(1)
    names = list(libs)
    res: dict = {}
    round_no = 0
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    for n in ns:
        cases = [ROUTING[a.routing](n, g) for _ in range(3)]
        x = torch.randn(n, H)
        x = (x if q8 else x.to(dtype).float()).contiguous()
        w = torch.rand(n, M).contiguous()
        y = torch.zeros(n, H)
        for mode in modes:
            cell = res.setdefault(f"{['per_slot', 'dedup'][mode]}/n={n}", {k: [] for k in names})
            for rep in range(a.reps):
                for ids in cases:
                    u = len(set(ids.flatten().tolist()))
                    nbytes = (n * M if mode == 0 else u) * eb
                    part = probe[(round_no % nchunks) * chunk :][:chunk]
                    round_no += 1
                    for name in names if rep % 2 == 0 else names[::-1]:
                        lib = libs[name].lib
                        idm = torch.randperm(pool)[:NUM][ids].contiguous()
                        t0 = clk()
                        lib.specmoe_read(part.data_ptr(), chunk, th)
                        t1 = clk()
                        y.zero_()
                        rc = lib.specmoe_expert_op(
                            x.data_ptr(), n, H, wgu.data_ptr(), wd.data_ptr(), WT[dtype],
                            INTER, wgu.stride(0), wgu.stride(1), wd.stride(0), wd.stride(1),
                            None, None, idm.data_ptr(), w.data_ptr(), M, pool, mode, 0,
                            1.702, 7.0, th, y.data_ptr(),
                        )  # fmt: skip
                        t2 = clk()
                        if rc != 0:
                            raise RuntimeError(f"{name}: expert op returned {rc}")
                        ceil = chunk * 4 / (t1 - t0) / 1e9
                        beta = nbytes / (t2 - t1) / 1e9
                        cell[name].append((ceil / beta, beta, ceil))
    out = {
        "dtype": "q8_0" if q8 else str(dtype).removeprefix("torch."),
        "threads": th,
        "routing": a.routing,
        "clock": "thread" if th == 1 else "wall",
        "pool_experts": pool,
        "variants": {k: " ".join(v.flags) for k, v in libs.items()},
        "loadavg_before": load0,
        "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
        "huge_pages": huge_pages(),
        "cells": {},
    }
    print(f"{out['dtype']} threads={th} load {load0} -> {out['loadavg_after']}")
    for key, cell in res.items():
        first = cell[names[0]]
        row = {}
        for name in names:
            v = cell[name]
            row[name] = {
                "ratio": statistics.median(r for r, _, _ in v),
                "beta_gbps": statistics.median(b for _, b, _ in v),
                "ceiling_gbps": statistics.median(c for _, _, c in v),
                "vs_first": statistics.median(b1 / b0 for (_, b0, _), (_, b1, _) in zip(first, v)),
            }
        out["cells"][key] = row
        print(
            f"{key:14s} "
            + "  ".join(
                f"{k}: ratio {r['ratio']:.3f} beta {r['beta_gbps']:5.1f} "
                f"ceil {r['ceiling_gbps']:5.1f} vs {r['vs_first']:.3f}"
                for k, r in row.items()
            )
        )
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
