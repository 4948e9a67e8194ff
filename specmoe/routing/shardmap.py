"""One function applied to every shard of a trace, in one process or by an executor.

The statistics of a shard directory are sums over whole documents, and every shard holds whole
documents (:mod:`specmoe.formats.trace`), so each shard yields its own exact sufficient
statistics and the trace's are their merge. :func:`map_shards` applies a per-shard function
``func(trace, **kwargs)`` to each shard and returns the results in shard order:

* without an executor, in this process, reading one shard at a time
  (:meth:`TraceReader.iter_shards`);
* with an executor (an object with ``map_files(func, files, kwargs, progress) -> list``, e.g.
  :class:`specmoe.distributed.RayShardExecutor`), each call ``func(load_trace(file), **kwargs)``
  runs wherever the executor puts it; each worker holds one shard at a time.

The per-shard functions and the merges are the same in both cases, so the answers are too.
An in-memory :class:`RoutingTrace` is one shard, computed here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from specmoe.formats.trace import RoutingTrace, TraceReader, load_trace

__all__ = ["ShardExecutor", "map_shards", "run_on_file"]


class ShardExecutor(Protocol):
    """Runs ``run_on_file(func, file, kwargs)`` for every file; returns the results in order."""

    def map_files(
        self,
        func: Callable[..., Any],
        files: Sequence[Path],
        kwargs: dict[str, Any],
        progress: Callable[[int, int], None] | None = None,
    ) -> list[Any]: ...


def run_on_file(func: Callable[..., Any], file: str | Path, kwargs: dict[str, Any]) -> Any:
    """``func(trace, **kwargs)`` on the shard ``file``, read and validated here (a worker's task)."""
    return func(load_trace(file), **kwargs)


def map_shards(
    src: RoutingTrace | TraceReader,
    func: Callable[..., Any],
    *,
    executor: ShardExecutor | None = None,
    progress: Callable[[int, int], None] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """``[func(shard, **kwargs) for shard in src]`` in shard order; ``progress(done, total)``
    after each shard."""
    if isinstance(src, RoutingTrace):
        out = [func(src, **kwargs)]
        if progress is not None:
            progress(1, 1)
        return out
    if executor is not None:
        return list(executor.map_files(func, list(src.files), kwargs, progress))
    total = len(src.files)
    out = []
    for i, tr in enumerate(src.iter_shards()):
        out.append(func(tr, **kwargs))
        if progress is not None:
            progress(i + 1, total)
    return out
