"""A Ray runtime for the shard statistics: start a local one or join a cluster, and run the
per-shard functions of :func:`specmoe.routing.shardmap.map_shards` as Ray tasks.

Ray is optional (``pip install 'specmoe[ray]'``) and imported only inside these functions.

:func:`ray_session` starts a local runtime (``address=None``: ``num_cpus`` = this machine's
cores unless given) or connects to a running cluster (``address``: ``"auto"``, ``host:port`` or
``ray://host:port``), and shuts down only what it started. :class:`RayShardExecutor` submits one
task per shard file; each task reads and validates its shard on the worker (the driver ships a
file name, not the arrays), so a worker holds one shard at a time, and the results come back in
shard order. On a cluster every node must see the shard files at the same path (a shared file
system) and have the same specmoe installed.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from specmoe.errors import InputError

__all__ = ["RayShardExecutor", "import_ray", "ray_session"]

INSTALL_HINT = "pip install 'specmoe[ray]'"


def import_ray(argument: str = "ray"):
    """The ``ray`` module, or an ``InputError`` naming ``argument`` that says how to install it."""
    try:
        import ray
    except ImportError:
        raise InputError(
            f"needs Ray, which is not installed ({INSTALL_HINT})", argument=argument
        ) from None
    return ray


@contextlib.contextmanager
def ray_session(
    address: str | None = None, *, num_cpus: int | None = None, argument: str = "address"
) -> Iterator[dict[str, Any]]:
    """``with ray_session(...) as info:`` a Ray runtime for the block.

    Already initialised (a caller's own ``ray.init``): used as it is and left running.
    ``address`` None: a local runtime of ``num_cpus`` CPUs (default ``os.cpu_count()``), no
    dashboard, worker output kept off the driver's stdout; shut down at the end. Else: join the
    cluster at ``address`` (``num_cpus`` must then be None) and disconnect at the end. ``info``
    holds ``address``, ``started`` and the cluster's ``cpus`` and ``gpus``.
    """
    ray = import_ray(argument)
    if num_cpus is not None and (
        isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 1
    ):
        raise InputError(f"must be an integer >= 1, got {num_cpus!r}", argument="num_cpus")
    started = False
    if not ray.is_initialized():
        if address is None:
            ray.init(
                num_cpus=num_cpus or os.cpu_count() or 1,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        else:
            if num_cpus is not None:
                raise InputError(
                    "a cluster's CPUs are the cluster's own: give num_cpus only for a local "
                    "runtime",
                    argument="num_cpus",
                )
            _probe(address, argument)
            try:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise InputError(
                    f"cannot join the Ray cluster at {address!r} ({exc})", argument=argument
                ) from None
        started = True
    res = ray.cluster_resources()
    info = {
        "address": address or "local",
        "started": started,
        "cpus": float(res.get("CPU", 0.0)),
        "gpus": float(res.get("GPU", 0.0)),
    }
    try:
        yield info
    finally:
        if started:
            ray.shutdown()


def _probe(address: str, argument: str, *, timeout: float = 5.0) -> None:
    """A ``host:port`` (or ``ray://host:port``) that accepts no connection is an ``InputError``
    now, not a wait of minutes inside ``ray.init``; other forms (``auto``) are Ray's to read."""
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout).close()
    except OSError as exc:
        raise InputError(
            f"no Ray cluster answers at {address!r} ({exc.strerror or exc})", argument=argument
        ) from None


_REMOTE: dict[str, Any] = {}  # remote functions, made once per process


def _unwrap(ray, exc: Exception) -> Exception:
    """A task's ``InputError`` (bad shard) as it was raised, not wrapped in Ray's error."""
    cause = getattr(exc, "cause", None)
    if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(cause, InputError):
        return InputError(cause.message, argument=cause.argument)
    return exc


class RayShardExecutor:
    """Runs ``run_on_file(func, file, kwargs)`` as one Ray task per shard file
    (``num_cpus`` per task, default 1); results in shard order, ``progress(done, total)`` as
    tasks finish. Needs a Ray runtime (:func:`ray_session`)."""

    def __init__(self, *, num_cpus: float = 1.0, max_retries: int = 3):
        self.num_cpus = float(num_cpus)
        self.max_retries = int(max_retries)

    def map_files(
        self,
        func: Callable[..., Any],
        files: Sequence[Path],
        kwargs: dict[str, Any],
        progress: Callable[[int, int], None] | None = None,
    ) -> list[Any]:
        ray = import_ray()
        from specmoe.routing.shardmap import run_on_file

        if "run_on_file" not in _REMOTE:
            _REMOTE["run_on_file"] = ray.remote(run_on_file)
        task = _REMOTE["run_on_file"].options(num_cpus=self.num_cpus, max_retries=self.max_retries)
        kw = ray.put(kwargs)
        refs = [task.remote(func, str(f), kw) for f in files]
        where = {ref: i for i, ref in enumerate(refs)}
        out: list[Any] = [None] * len(refs)
        pending, done = list(refs), 0
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for ref in ready:
                    try:
                        out[where[ref]] = ray.get(ref)
                    except Exception as exc:
                        raise _unwrap(ray, exc) from None
                    done += 1
                    if progress is not None:
                        progress(done, len(refs))
        finally:
            for ref in pending:  # a failed shard: stop the rest
                ray.cancel(ref)
        return out
