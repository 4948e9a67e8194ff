"""Compile the C expert kernels on first use and load them with ctypes.

The source (:mod:`specmoe.kernels._csrc`) needs no torch headers: it takes raw data pointers,
so it compiles in about a second with the system C compiler (``$CC``, else ``cc``, ``gcc`` or
``clang``). The shared object goes to a per-user cache directory (``$SPECMOE_CACHE_DIR``, else
``$XDG_CACHE_HOME/specmoe``, else ``~/.cache/specmoe``), under a name hashed from the source,
the compiler, its flags and the processor, so a changed source or machine gets a fresh build.
The file is written under a temporary name and renamed, so concurrent first uses are safe.

``$SPECMOE_KERNEL_SOURCE`` names a C file built instead of the package's source: an earlier
version of the kernels, kept so that runs scored against a committed benchmark use the kernels
that benchmark timed (``scripts/whole_pass_campaign.py`` sets it from a prediction's
``kernels.c``). An unreadable file is an input error, never a silent fallback.

Flags are tried from the fastest down: ``-O3 -march=native -fopenmp``, then without OpenMP,
then without ``-march=native``. If nothing compiles, :func:`load` returns ``None``,
:func:`build` says why, and the kernels fall back to their pure-torch path with a
:class:`~specmoe.kernels.KernelFallbackWarning` that names the reason.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from specmoe.errors import InputError
from specmoe.kernels._csrc import SOURCE

_FLAG_SETS: tuple[tuple[str, ...], ...] = (
    ("-O3", "-march=native", "-fopenmp"),
    ("-O3", "-march=native"),
    ("-O3", "-fopenmp"),
    ("-O3",),
)
_LOCK = threading.Lock()


def cache_dir() -> Path:
    """The per-user directory for compiled kernels."""
    env = os.environ.get("SPECMOE_CACHE_DIR")
    if env:
        return Path(env) / "kernels"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "specmoe" / "kernels"


def find_compiler() -> str | None:
    """The C compiler to use, or None."""
    cc = os.environ.get("CC")
    if cc and shutil.which(cc.split()[0]):
        return cc
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return name
    return None


def _cpu_signature(path: str = "/proc/cpuinfo") -> str:
    """The processor's name and its instruction-set flags (the first processor's), so that a
    build with ``-march=native`` is never reused on a processor with other extensions (one
    without AVX-512 BF16, say)."""
    keys = ("model name", "flags", "Features", "isa", "cpu model")
    found: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key = line.split(":", 1)[0].strip()
                if key in keys and key not in found:
                    found[key] = line.strip()
                if not line.strip() and found:
                    break  # the end of the first processor's block
    except OSError:
        pass
    if found:
        return "\n".join(found[k] for k in keys if k in found)
    return platform.processor() or platform.machine()


def _compiler_version(cc: str) -> str:
    try:
        out = subprocess.run(
            [*cc.split(), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        return out.stdout.splitlines()[0] if out.stdout else ""
    except (OSError, subprocess.SubprocessError):
        return ""


SOURCE_ENV = "SPECMOE_KERNEL_SOURCE"
ABI = 1  # the calling convention CLib sets up (the C source's specmoe_abi)


@cache
def source() -> str:
    """The C source that is built: the package's, or the file ``$SPECMOE_KERNEL_SOURCE`` names."""
    path = os.environ.get(SOURCE_ENV)
    if not path:
        return SOURCE
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise InputError(
            f"{path}: ${SOURCE_ENV} names an unreadable kernel source ({why})"
        ) from None


def _compile(cc: str, flags: tuple[str, ...], target: Path, text: str | None = None) -> str | None:
    """Compile ``text`` (default :func:`source`) into ``target`` (atomically); return None or
    the compiler's error."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="specmoe-cc-") as tmp:
        src = Path(tmp) / "expert_op.c"
        src.write_text(source() if text is None else text, encoding="utf-8")
        out = Path(tmp) / "expert_op.so"
        cmd = [*cc.split(), *flags, "-shared", "-fPIC", "-std=c99", str(src), "-o", str(out), "-lm"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            return str(exc)
        if res.returncode != 0 or not out.exists():
            return (res.stderr or res.stdout or "compiler failed").strip()
        fd, part = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        os.close(fd)
        shutil.copyfile(out, part)
        os.replace(part, target)
    return None


class CLib:
    """The loaded library and how it was built."""

    def __init__(self, lib: ctypes.CDLL, path: Path, flags: tuple[str, ...]):
        self.lib = lib
        self.path = path
        self.flags = flags
        abi = int(lib.specmoe_abi()) if hasattr(lib, "specmoe_abi") else 1
        if abi != ABI:  # an older or newer source (a pinned one): its calls would not match
            raise _LoadError(f"its calling convention is version {abi}, this loader's {ABI}")
        self.openmp = bool(lib.specmoe_has_openmp())
        self.avx2 = bool(lib.specmoe_has_avx2())
        self.bf16dp = bool(lib.specmoe_has_bf16dp())
        # the AVX-512F fp32 path (absent from older, pinned sources)
        self.f32z = bool(lib.specmoe_has_f32z()) if hasattr(lib, "specmoe_has_f32z") else False
        if self.f32z:
            lib.specmoe_set_f32z.argtypes = [ctypes.c_int]
            lib.specmoe_set_f32z.restype = ctypes.c_int
        lib.specmoe_set_bf16dp.argtypes = [ctypes.c_int]
        lib.specmoe_set_bf16dp.restype = ctypes.c_int
        self.bf16_dot_default = self.bf16dp and bf16_dot_default()
        if self.bf16dp:
            lib.specmoe_set_bf16dp(1 if self.bf16_dot_default else 0)
        lib.specmoe_set_q8_portable.argtypes = [ctypes.c_int]
        lib.specmoe_set_q8_portable.restype = ctypes.c_int
        lib.specmoe_set_q8_mode.argtypes = [ctypes.c_int]
        lib.specmoe_set_q8_mode.restype = ctypes.c_int
        f = lib.specmoe_expert_op
        p, i, ll, fl = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_float
        f.argtypes = [p, i, i, p, p, i, i, ll, ll, ll, ll, p, p, p, p, i, ll, i, i, fl, fl, i, p]
        f.restype = ctypes.c_int
        r = lib.specmoe_read
        r.argtypes = [p, ll, i]
        r.restype = ctypes.c_double


class _LoadError(Exception):
    """A built library this loader cannot call."""


def _try_load(path: Path, flags: tuple[str, ...]) -> CLib | None:
    try:
        return CLib(ctypes.CDLL(str(path)), path, flags)
    except (OSError, AttributeError, _LoadError) as exc:  # AttributeError: a missing symbol
        _LOAD_ERRORS[str(path)] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None


_LOAD_ERRORS: dict[str, str] = {}


@dataclass(frozen=True)
class Build:
    """The outcome of building the C kernels: the library, or why there is none."""

    lib: CLib | None
    compiler: str | None = None
    version: str = ""
    error: str | None = None  # why there is no library (None when there is one)

    def status(self) -> dict[str, Any]:
        """The compiler status a bandwidth profile records."""
        lib = self.lib
        return {
            "status": "ok" if lib is not None else "unavailable",
            "cc": self.compiler,
            "version": self.version,
            "flags": None if lib is None else " ".join(lib.flags),
            "openmp": None if lib is None else lib.openmp,
            "avx2": None if lib is None else lib.avx2,
            "avx512_bf16": None if lib is None else lib.bf16dp,
            "bf16_dot": None if lib is None else lib.bf16_dot_default,
            "avx512_f32": None if lib is None else lib.f32z,
            "source_sha256": source_sha256(),
            "error": self.error,
        }


BF16_DOT_ENV = "SPECMOE_BF16_DOT"


def _cpu_fields(cpuinfo: str) -> tuple[str | None, str | None, set[str]]:
    """Vendor, family and flags of the first processor in ``cpuinfo`` (None, None, {} when
    unreadable)."""
    vendor = family = None
    flags: set[str] = set()
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    break  # the first processor's block
                key, _, value = (part.strip() for part in line.partition(":"))
                if key == "vendor_id":
                    vendor = value
                elif key == "cpu family":
                    family = value
                elif key == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    return vendor, family, flags


DP_HINT_T2 = "-DSM_DP_HINT=_MM_HINT_T2"
PF_HINT_T2 = "-DSM_PF_HINT=_MM_HINT_T2"
F32_ZMM = "-DSM_F32Z=1"
FAR_ROWS = "-DSM_ZFAR=1"
READ_PF = "-DSM_READ_PF=4096"
ZEN4_FLAGS = (DP_HINT_T2, PF_HINT_T2, F32_ZMM, FAR_ROWS, READ_PF)
PF1_OFF = "-DSM_PF1=0"
READ_ZMM4 = ("-DSM_READ_PF=-1", "-DSM_READ_STREAMS=4")
WEIGHTS_PINNED = "-DSM_WPIN=1"
HEAD_PF1 = "-DSM_PFHEAD=1"
ZEN5_FLAGS = (F32_ZMM, *READ_ZMM4, PF1_OFF, HEAD_PF1, WEIGHTS_PINNED)


def flag_sets(cpuinfo: str = "/proc/cpuinfo") -> tuple[tuple[str, ...], ...]:
    """The compiler flag sets tried in turn. On AMD family 25 with AVX-512 BF16 (Zen 4) the
    native sets add ``-DSM_DP_HINT=_MM_HINT_T2`` and ``-DSM_PF_HINT=_MM_HINT_T2``: the bf16
    dot-product path's and the AVX2 blocks' prefetch of the next block's rows into L2 rather
    than L1, which took the first from 27-45% below the widening path to 4-25% above it, and
    the second 5-33% ahead in fp32, on a quiet Zen 4 (``results/cpu/kernels/
    ab-2026-12-03-amd-avx512/``), and ``-DSM_F32Z=1``: fp32 weights on 16-lane AVX-512F
    register blocks instead of the AVX2 ones, 5-29% ahead on the recorded-like routing and
    11-39% with many tokens on one expert there (``results/cpu/kernels/many-tokens/``), and
    ``-DSM_ZFAR=1``: the AVX-512 blocks of 1-4 tokens on far-apart rows (8 for 1-2 tokens, 4
    for 3-4: ``SM_FAR34``), each a stream prefetching its row 8 KiB ahead (with 8 and 6 rows,
    bf16 11-21% faster, fp32 6-16%), and ``-DSM_READ_PF=4096``:
    the read ceiling's eight streams prefetch 4 KiB ahead too (median 29-30 GB/s where the plain
    streams read 20-24 and the kernels with their prefetches already read more).
    On AMD family 26 with AVX-512 BF16 (Zen 5) they add ``-DSM_F32Z=1`` (fp32 per-slot
    5-12% faster there, dedup 0-5%), ``-DSM_PF1=0``: the one-token AVX-512 blocks leave the
    prefetching to the hardware (bf16 and fp32 5-10% faster; the blocks of more tokens keep
    their prefetch, which still pays there), and ``-DSM_PFHEAD=1``: as it starts, such a block
    asks for the first line of each row of the next block, which starts each row's stream
    (bf16 and fp32 per-slot 7-13% faster, dedup 4-13%), and
    ``-DSM_READ_PF=-1 -DSM_READ_STREAMS=4``: the
    read ceiling's streams are four, on 16-lane loads with no software prefetch (39.5-39.8
    GB/s, where eight plain streams read 31-34, eight prefetching ones 34-38, and the fp32
    kernels 37-40), and ``-DSM_WPIN=1``: the blocks of 2-9 tokens keep each weight vector in a
    register for all their tokens instead of loading it once per token (dedup 1-5% faster at
    n = 5-9, 2-18% with every token on the same experts). The two L2 hints and the far rows
    measured 0-7% slower or within noise there
    (``results/cpu/kernels/ab-2026-12-04-zen5/``).
    Elsewhere (an Intel Xeon measured the path ahead with the
    L1 hint; a processor without AVX-512 BF16 does not build the path) the sets are as they
    were, so a build's flags there do not change."""
    vendor, family, flags = _cpu_fields(cpuinfo)
    if not (vendor == "AuthenticAMD" and "avx512_bf16" in flags):
        return _FLAG_SETS
    extra = {"25": ZEN4_FLAGS, "26": ZEN5_FLAGS}.get(family)
    if extra is None:
        return _FLAG_SETS
    return tuple((*f, *extra) if "-march=native" in f else f for f in _FLAG_SETS)


def bf16_dot_default() -> bool:
    """Whether bfloat16 weights take the AVX-512 BF16 dot-product path where the build has
    one: ``$SPECMOE_BF16_DOT`` (``1`` or ``0``) when set, else yes. An unknown value of the
    variable is an ``InputError`` naming it."""
    env = os.environ.get(BF16_DOT_ENV, "").strip()
    if env in ("0", "1"):
        return env == "1"
    if env not in ("", "auto"):
        raise InputError(f"${BF16_DOT_ENV}: {env!r} is not 0, 1 or auto")
    return True


def source_sha256() -> str:
    """The first 16 hex digits of the kernels' C source's SHA-256: which kernels a profile
    measured, so that runs scored against it can be checked to use the same ones."""
    return hashlib.sha256(source().encode()).hexdigest()[:16]


def build_key(cc: str, version: str, flags: tuple[str, ...]) -> str:
    """The cache key of a build: the source, the compiler, its flags and the processor (its
    name and instruction-set flags, :func:`_cpu_signature`)."""
    parts = [source(), cc, version, " ".join(flags), platform.machine(), _cpu_signature()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


@cache
def build() -> Build:
    """Build (once per source, compiler and machine) and load the kernels, or say why not."""
    with _LOCK:
        if os.environ.get("SPECMOE_NO_CKERNELS"):
            return Build(None, error="the C kernels are disabled by SPECMOE_NO_CKERNELS")
        cc = find_compiler()
        if cc is None:
            return Build(None, error="no C compiler found (set CC)")
        version = _compiler_version(cc)
        errors = []
        for flags in flag_sets():
            target = cache_dir() / f"expert_op_{build_key(cc, version, flags)}.so"
            if target.exists():
                lib = _try_load(target, flags)
                if lib is not None:
                    return Build(lib, cc, version)
            try:
                err = _compile(cc, flags, target)
            except OSError as exc:  # unwritable cache directory
                err = str(exc)
            if err is None:
                lib = _try_load(target, flags)
                if lib is not None:
                    return Build(lib, cc, version)
                err = f"built but could not be loaded: {_LOAD_ERRORS.get(str(target), '')}"
                if os.environ.get(SOURCE_ENV):  # a pinned source: say so, do not fall back
                    raise InputError(
                        f"{os.environ[SOURCE_ENV]}: ${SOURCE_ENV}: the kernels it builds "
                        f"cannot be called here ({_LOAD_ERRORS.get(str(target), 'not loaded')})"
                    )
            errors.append(f"{' '.join(flags)}: {err.splitlines()[0] if err else ''}")
        if os.environ.get(SOURCE_ENV):  # a pinned source that does not build: no fallback
            raise InputError(
                f"{os.environ[SOURCE_ENV]}: ${SOURCE_ENV}: did not compile with {cc} "
                f"({errors[0] if errors else 'no flags'})"
            )
        return Build(
            None, cc, version, f"the C kernels did not compile with {cc} ({'; '.join(errors)})"
        )


def load() -> CLib | None:
    """The C kernels (built on first use), or None: then :func:`build` says why."""
    return build().lib
