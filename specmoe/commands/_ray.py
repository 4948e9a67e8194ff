"""``--ray [ADDRESS]`` and ``--ray-cpus N``: the commands that read a shard directory run its
per-shard statistics as Ray tasks (:mod:`specmoe.distributed.ray_runtime`).

``--ray`` alone starts a local Ray runtime with this machine's cores (``--ray-cpus`` fewer);
``--ray ADDRESS`` (``auto``, ``host:port``, ``ray://host:port``) joins a running cluster. Put
``--ray`` after the trace argument (or write ``--ray=ADDRESS``), else argparse takes the trace
for the address. Without ``--ray`` the shards are read in this process, one at a time; the
results are the same either way.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from specmoe.commands._common import check_int
from specmoe.errors import InputError

LOCAL = "local"


def add_ray_arguments(parser, what: str = "compute the shards' statistics") -> None:
    """``--ray [ADDRESS]`` and ``--ray-cpus N``; ``what`` says what runs as Ray tasks."""
    parser.add_argument(
        "--ray",
        nargs="?",
        const=LOCAL,
        default=None,
        metavar="ADDRESS",
        help=f"{what} as Ray tasks: a local runtime (no ADDRESS) or the cluster at ADDRESS "
        "(needs pip install 'specmoe[ray]')",
    )
    parser.add_argument(
        "--ray-cpus",
        type=int,
        default=None,
        metavar="N",
        help="CPUs of the local Ray runtime (default: this machine's cores)",
    )


@contextlib.contextmanager
def ray_runtime(args, verb: str) -> Iterator[dict | None]:
    """``with ray_runtime(args, "stats") as info:`` None without ``--ray``; else the runtime's
    description (:func:`~specmoe.distributed.ray_runtime.ray_session`), held for the block."""
    ray_arg, cpus = getattr(args, "ray", None), getattr(args, "ray_cpus", None)
    if ray_arg is None:
        if cpus is not None:
            raise InputError("--ray-cpus: needs --ray (a local Ray runtime)")
        yield None
        return
    check_int(cpus, "--ray-cpus", low=1)
    address = None if ray_arg == LOCAL else ray_arg
    if address is not None and cpus is not None:
        raise InputError("--ray-cpus: only for a local runtime (a cluster has its own CPUs)")
    from specmoe.distributed.ray_runtime import ray_session

    with contextlib.ExitStack() as stack:
        try:
            info = stack.enter_context(ray_session(address, num_cpus=cpus, argument="ray"))
        except InputError as exc:
            raise exc.as_flag("--ray-cpus" if exc.argument == "num_cpus" else "--ray") from None
        print(
            f"{verb}: Ray runtime {info['address']} with {info['cpus']:g} CPUs"
            + (f", {info['gpus']:g} GPUs" if info["gpus"] else ""),
            file=sys.stderr,
            flush=True,
        )
        yield info


@contextlib.contextmanager
def shard_executor(args, verb: str) -> Iterator[object | None]:
    """``with shard_executor(args, "stats") as executor:`` None without ``--ray``; else a
    :class:`~specmoe.distributed.ray_runtime.RayShardExecutor` on a runtime held for the block."""
    with ray_runtime(args, verb) as info:
        if info is None:
            yield None
            return
        from specmoe.distributed.ray_runtime import RayShardExecutor

        yield RayShardExecutor()
