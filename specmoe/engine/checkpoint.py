"""Model checkpoints on disk: safetensors only, their headers checked before transformers reads
them, and the config's size fields typed.

A pickle checkpoint (``pytorch_model.bin``, ``*.pt``, ...) can run code when it is loaded;
specmoe never opens one. A folder that holds only pickles is refused with the one-time
conversion to do where the file is trusted. A safetensors file is an 8-byte little-endian
header length, a JSON header ``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` and
the tensors' bytes, which the header's offsets must cover exactly: a truncated file, or a flip
in the header, is found here and named. (safetensors has no checksum: a flip inside tensor data
changes a weight silently unless it makes one non-finite, which the loader checks.)

Imports neither torch nor transformers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from specmoe.errors import InputError

__all__ = ["check_checkpoint", "check_config_fields", "check_safetensors", "safetensors_files"]

PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")
_HEADER_LIMIT = 100 << 20  # bytes: safetensors' own bound on a header
# Bytes per element of the byte-sized safetensors dtypes (sub-byte ones are not sized here).
_ST_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
# Size fields of a causal LM config: positive integers where present.
SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
)


def _is_size(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v < 1 << 40


def check_config_fields(cfg: dict[str, Any], file: Path, *, argument: str) -> None:
    """The size fields of ``cfg`` (read from ``file``) are positive integers, and m < N."""
    for key in SIZE_FIELDS:
        v = cfg.get(key)
        if v is not None and not _is_size(v):
            raise InputError(
                f"{file}: config field {key!r} must be a positive integer, got {v!r:.40}",
                argument=argument,
            )
    n = next(
        (cfg[k] for k in ("num_experts", "num_local_experts", "n_routed_experts") if cfg.get(k)),
        None,
    )
    m = cfg.get("num_experts_per_tok")
    if n is not None and m is not None and not m < n:
        raise InputError(
            f"{file}: config field 'num_experts_per_tok' ({m}) must be below the number of "
            f"experts ({n})",
            argument=argument,
        )


def safetensors_files(folder: Path, *, argument: str) -> list[Path]:
    """The safetensors files of a model folder (those its index lists, when it has one).

    A folder without any is refused: with pickles only, with the conversion that makes them
    safetensors."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        from specmoe.formats._common import read_json_capped

        d = read_json_capped(index, "safetensors index", argument=argument)
        wmap = d.get("weight_map") if isinstance(d, dict) else None
        if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
            raise InputError(
                f"{index}: 'weight_map' must map tensor names to file names", argument=argument
            )
        files = [folder / name for name in sorted(set(wmap.values()))]
        for f in files:
            if f.resolve().parent != folder.resolve() or not f.is_file():
                raise InputError(
                    f"{index}: lists {f.name}, which the folder lacks", argument=argument
                )
        return files
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted({p.name for pat in PICKLE_PATTERNS for p in folder.glob(pat)})
    if pickles:
        raise InputError(
            f"{folder}: holds only pickle checkpoints ({', '.join(pickles[:3])}); specmoe loads "
            "safetensors only and never unpickles a file: convert it once, where you trust it, "
            "with transformers (AutoModelForCausalLM.from_pretrained(FOLDER)"
            ".save_pretrained(FOLDER, safe_serialization=True))",
            argument=argument,
        )
    raise InputError(
        f"{folder}: no model.safetensors (specmoe loads safetensors weights only)",
        argument=argument,
    )


def check_safetensors(file: Path, *, argument: str) -> None:
    """The header of one safetensors file: a JSON object whose tensors' offsets lie inside the
    file, match their shapes and dtypes and cover the data exactly."""

    def bad(what: str) -> InputError:
        return InputError(f"{file}: {what}", argument=argument)

    size = file.stat().st_size
    with open(file, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise bad(f"{size} bytes, shorter than a safetensors header (empty or truncated)")
        n = int.from_bytes(head, "little")
        if n > min(size - 8, _HEADER_LIMIT):
            raise bad(f"header length {n} exceeds the file of {size} bytes (a corrupt header)")
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise bad(f"header is not JSON ({type(exc).__name__}: {exc})".splitlines()[0]) from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    data = size - 8 - n
    end = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        what = f"header entry {name!r:.60}"
        if not isinstance(t, dict):
            raise bad(f"{what} is not an object")
        dtype, shape, off = t.get("dtype"), t.get("shape"), t.get("data_offsets")
        if not isinstance(dtype, str):
            raise bad(f"{what}: dtype {dtype!r:.40} is not a name")
        if not isinstance(shape, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape
        ):
            raise bad(f"{what}: shape {shape!r:.40} is not a list of sizes")
        if (
            not isinstance(off, list)
            or len(off) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in off)
            or not 0 <= off[0] <= off[1]
        ):
            raise bad(f"{what}: data_offsets {off!r:.40} are not [begin, end]")
        if off[1] > data:
            raise bad(
                f"{what} ends at byte {off[1]} of a data section of {data} bytes: the file is "
                "truncated"
            )
        if dtype in _ST_BYTES and off[1] - off[0] != math.prod(shape) * _ST_BYTES[dtype]:
            raise bad(f"{what}: {off[1] - off[0]} bytes for shape {shape} of {dtype}")
        end = max(end, off[1])
    if end != data:
        raise bad(f"its tensors cover {end} of {data} data bytes (truncated or corrupt)")


def check_checkpoint(folder: Path, *, argument: str) -> list[Path]:
    """Every safetensors file of ``folder``, its header checked; see the module docstring."""
    files = safetensors_files(folder, argument=argument)
    for f in files:
        check_safetensors(f, argument=argument)
    return files
