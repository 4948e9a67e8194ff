"""The writer of capture shard directories (``shard-NNNNN.npz`` + ``manifest.json``), which
:func:`specmoe.formats.trace.open_trace` reads back as one trace.

Whole documents are buffered and written as atomic ``.npz`` shards; a rerun reads the shards
already there, so a capture resumes without recomputing finished documents.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from specmoe._io import atomic_write_json
from specmoe.errors import InputError
from specmoe.formats.trace import RoutingTrace, save_trace

__all__ = ["MANIFEST", "SHARD", "ShardWriter", "shard_header"]


SHARD = "shard-{:05d}.npz"


MANIFEST = "manifest.json"


SAME = ("model", "num_experts", "top_k", "layers")  # a resumed capture must agree on these


class ShardWriter:
    """Whole documents, buffered and written as atomic ``.npz`` shards, plus the manifest.

    Opening reads the shards already in ``out`` (their names and sizes only), so a rerun knows
    which documents are done; a shard of another model is an InputError.
    """

    def __init__(self, out: Path, header: dict[str, Any], *, shard_tokens: int):
        if out.exists() and not out.is_dir():
            raise InputError(f"{out}: exists and is not a directory", argument="out")
        self.out, self.header, self.shard_tokens = out, header, shard_tokens
        self.shards: list[dict[str, Any]] = []
        self.done: set[str] = set()
        self.tokens = 0
        for path in sorted(out.glob("shard-*.npz")):
            meta, offsets = shard_header(path)
            for key in SAME:
                if meta.get(key) != header[key]:
                    raise InputError(
                        f"{path}: holds a capture with {key}={meta.get(key)!r}, "
                        f"not {header[key]!r}; write to another directory",
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
    try:
        with np.load(path, allow_pickle=False) as z:
            return json.loads(str(z["meta"])), np.asarray(z["doc_offsets"])
    except Exception as exc:
        raise InputError(
            f"{path}: unreadable capture shard ({type(exc).__name__}); "
            "remove it to capture its documents again"
        ) from None
