"""Capture shard directories (``shard-NNNNN.npz`` + ``manifest.json``): the writer, which
:func:`specmoe.formats.trace.open_trace` reads back as one trace.

Whole documents are buffered and written as atomic ``.npz`` shards; a rerun reads the shards
already there, so a capture resumes without recomputing finished documents.
:func:`check_shard_headers` is the reader's consistency check of a directory, run on the
shards' small members before any is read whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from specmoe._io import atomic_write_json
from specmoe.errors import InputError
from specmoe.formats._common import parse_json, read_json_capped, read_members
from specmoe.formats.trace import RoutingTrace, save_trace

__all__ = [
    "MANIFEST",
    "OPTIONS",
    "SAME",
    "SHARD",
    "ShardWriter",
    "check_shard_headers",
    "shard_header",
]


SHARD = "shard-{:05d}.npz"


MANIFEST = "manifest.json"


SAME = ("model", "num_experts", "top_k", "layers")  # a resumed capture must agree on these
# ... and on every option that changes which documents are captured or how many tokens each:
OPTIONS = ("source", "capture", "max_context", "overlap", "max_tokens", "documents_sha256")
_ABSENT = object()


class ShardWriter:
    """Whole documents, buffered and written as atomic ``.npz`` shards, plus the manifest.

    Opening reads the shards already in ``out`` (their names and sizes only), so a rerun knows
    which documents are done; a shard of another model is an InputError.
    """

    def __init__(
        self, out: Path, header: dict[str, Any], *, shard_tokens: int, overwrite: bool = False
    ):
        if out.exists() and not out.is_dir():
            raise InputError(f"{out}: exists and is not a directory", argument="out")
        self.out, self.header, self.shard_tokens = out, header, shard_tokens
        self.shards: list[dict[str, Any]] = []
        self.done: set[str] = set()
        self.tokens = 0
        if overwrite:  # only the files this writer makes; anything else in ``out`` stays
            for path in [*out.glob("shard-*.npz"), out / MANIFEST]:
                path.unlink(missing_ok=True)
        for path in sorted(out.glob("shard-*.npz")):
            meta, offsets = shard_header(path)
            for key in (*SAME, *OPTIONS):
                theirs = meta.get(key, _ABSENT)
                if theirs != header.get(key):
                    held = "does not record " + key if theirs is _ABSENT else f"{key}={theirs!r}"
                    raise InputError(
                        f"{path}: holds a capture that {held}, not {key}={header.get(key)!r}; "
                        "write to another directory, or overwrite this one",
                        argument="out",
                    )
            self.done.update(meta.get("documents", []))
            self.tokens += int(offsets[-1])
            self.shards.append(
                {"file": path.name, "documents": len(offsets) - 1, "tokens": int(offsets[-1])}
            )
        self._next = 1 + max((int(s["file"][6:11]) for s in self.shards), default=-1)
        self._pending: list[tuple[str, np.ndarray, np.ndarray | None, bool]] = []

    def add(
        self, name: str, experts: np.ndarray, weights: np.ndarray | None, *, truncated: bool
    ) -> None:
        self._pending.append((name, experts, weights, truncated))
        if sum(len(p[1]) for p in self._pending) >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            docs, parts = self._pending, [p[1] for p in self._pending]
            self._pending = []
            wts = None if any(p[2] is None for p in docs) else np.concatenate([p[2] for p in docs])
            meta = {
                **self.header,
                "documents": [p[0] for p in docs],
                "truncated": [p[0] for p in docs if p[3]],
            }
            file = SHARD.format(self._next)
            trace = RoutingTrace(
                experts=np.concatenate(parts),
                weights=wts,
                num_experts=self.header["num_experts"],
                doc_offsets=np.concatenate([[0], np.cumsum([len(e) for e in parts])]),
                meta=meta,
                name=str(self.out / file),
            )
            save_trace(trace, self.out / file)
            self._next += 1
            self.shards.append({"file": file, "documents": len(docs), "tokens": trace.num_tokens})
            self.done.update(meta["documents"])
            self.tokens += trace.num_tokens
        if self.shards:
            atomic_write_json(
                self.out / MANIFEST,
                {
                    **self.header,
                    "shards": self.shards,
                    "tokens": self.tokens,
                    "documents": sum(s["documents"] for s in self.shards),
                },
            )


def shard_header(path: Path) -> tuple[dict[str, Any], np.ndarray]:
    """``(meta, doc_offsets)`` of a capture shard, read without its expert arrays."""
    try:
        arrays = read_members(path, ("meta", "doc_offsets"))
        if set(arrays) != {"meta", "doc_offsets"}:
            raise InputError(f"{path}: not a capture shard (no 'meta' or 'doc_offsets')")
        meta = parse_json(str(arrays["meta"]), f"{path}: 'meta'")
        offsets = np.asarray(arrays["doc_offsets"])
        if not isinstance(meta, dict) or offsets.ndim != 1 or offsets.size < 2:
            raise InputError(f"{path}: not a capture shard ('meta' or 'doc_offsets' malformed)")
    except InputError as exc:
        raise InputError(
            f"{exc}; remove it to capture its documents again", argument="out"
        ) from None
    return meta, offsets


def check_shard_headers(folder: Path, files: list[Path]) -> None:
    """Before any shard is read whole, from their small members and the zip directory: the
    shards agree on N, L, m, layers and model; no document is in two shards (it would be
    counted twice; unnamed shards: no two with the same expert ids, by CRC-32 and size); each
    holds as many tokens as ``manifest.json`` lists for it, and every shard it lists exists."""
    listed = _manifest_shards(folder)
    names: dict[Any, str] = {}
    contents: dict[tuple, str] = {}
    first: tuple | None = None
    for path in files:
        h = read_members(path, ("meta", "doc_offsets"), headers=("experts",))
        if set(h) != {"meta", "doc_offsets", "experts"}:
            raise InputError(f"{path}: missing array among 'experts', 'doc_offsets', 'meta'")
        meta = parse_json(str(h["meta"]), f"{path}: 'meta'")
        shape, _, crc = h["experts"]
        off = h["doc_offsets"]
        if not isinstance(meta, dict) or len(shape) != 3 or off.ndim != 1 or off.size < 2:
            raise InputError(f"{path}: 'meta', 'experts' or 'doc_offsets' is malformed")
        key = (
            meta.get("num_experts"),
            shape[1],
            shape[2],
            meta.get("layers", list(range(shape[1]))),
            meta.get("model"),
        )
        if first is None:
            first = (path, key)
        elif key[:4] != first[1][:4] or (
            None not in (key[4], first[1][4]) and key[4] != first[1][4]
        ):
            (p0, k0) = first
            what = next(
                f"{label}={a!r} but {p0} has {label}={b!r}"
                for label, a, b in zip(("N", "L", "m", "layers", "model"), key, k0)
                if a != b
            )
            raise InputError(f"{folder}: mismatched shards: {path} has {what}")
        if "documents" in meta and isinstance(meta["documents"], list):
            for doc in meta["documents"]:
                if isinstance(doc, list | dict):
                    break  # validation of the shard says what is wrong
                if doc in names:
                    raise InputError(
                        f"{path}: document {doc!r} is also in {names[doc]}; a document may be "
                        "in one shard only (it would be counted twice): remove the copy"
                    )
                names[doc] = str(path)
        else:
            content = (crc, shape, int(off[-1]) if off.size else 0)
            if content in contents:
                raise InputError(
                    f"{path}: holds the same routing as {contents[content]} (a copy of a "
                    "shard would be counted twice): remove the copy"
                )
            contents[content] = str(path)
        tokens = listed.get(path.name)
        if tokens is not None and off.size and tokens != int(off[-1]):
            raise InputError(
                f"{path}: holds {int(off[-1])} tokens but {folder / 'manifest.json'} lists "
                f"{tokens} for it"
            )


def _manifest_shards(folder: Path) -> dict[str, int | None]:
    """``{shard file: tokens}`` listed by a shard directory's ``manifest.json`` (none: {});
    a listed shard that is missing is an ``InputError``."""
    path = folder / "manifest.json"
    if not path.is_file():
        return {}
    d = read_json_capped(path, "capture manifest")
    shards = d.get("shards", []) if isinstance(d, dict) else None
    if not isinstance(shards, list) or not all(
        isinstance(s, dict) and isinstance(s.get("file"), str) for s in shards
    ):
        raise InputError(f"{path}: 'shards' must be a list of objects with a 'file' name")
    out: dict[str, int | None] = {}
    for s in shards:
        if not (folder / s["file"]).is_file():
            raise InputError(
                f"{path}: lists {s['file']} but the directory lacks it (a lost shard: rerun "
                "the capture into this directory to redo its documents)"
            )
        tokens = s.get("tokens")
        out[s["file"]] = (
            tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None
        )
    return out
