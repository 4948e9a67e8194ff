"""Which implementation a kernel name runs, and a warning whenever it runs another one.

A kernel name stands for one implementation per device (``dedup`` on the CPU is the C kernel
of :mod:`specmoe.kernels.cpu`, on CUDA the Triton kernel of :mod:`specmoe.kernels.cuda`). When
that implementation cannot take a call (no C compiler, a dtype or stride the C kernel does not
take, Triton missing or failing), the kernel runs a torch kernel instead. That is never silent:

* the call emits a :class:`KernelFallbackWarning`, once per (kernel, device, reason) in a
  process;
* every active :func:`watch` records the :class:`KernelImpl` of the call, so a benchmark can
  write what it really timed (``specmoe bench`` puts it in the profile's ``implementations``);
* :func:`specmoe.kernels.implementation` answers, before any call, which implementation a
  name will run for given inputs.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["KernelFallbackWarning", "KernelImpl", "fell_back", "watch"]


class KernelFallbackWarning(RuntimeWarning):
    """A kernel ran another implementation than the one its name stands for."""


@dataclass(frozen=True)
class KernelImpl:
    """The implementation kernel ``name`` runs on ``device``.

    ``requested``: the implementation the name stands for there (``c``, ``triton``, ``torch``,
    ``transformers``); ``ran``: the one that runs, and ``kernel`` the registered kernel whose
    code that is (``dedup_torch`` when ``dedup`` fell back); ``fallback``: why it is not the
    requested one (None: it is). ``compiler`` (CPU) and ``triton`` (CUDA): the build status
    of the C kernels and of Triton on this machine, None where they play no part.
    """

    name: str
    device: str
    requested: str
    ran: str
    kernel: str
    fallback: str | None = None
    compiler: dict[str, Any] | None = None
    triton: dict[str, Any] | None = None

    @property
    def fell_back(self) -> bool:
        return self.fallback is not None

    def to_dict(self) -> dict[str, Any]:
        """The JSON record of a bandwidth profile's ``implementations`` (without ``name``)."""
        d = asdict(self)
        del d["name"]
        return d

    def describe(self) -> str:
        """One line: what ran, and why when it is not what the name asks for."""
        if not self.fell_back:
            return f"{self.name} on {self.device}: {self.ran}"
        return (
            f"{self.name} on {self.device} ran {self.kernel} ({self.ran}), not its "
            f"{self.requested} code: {self.fallback}"
        )


_warned: set[tuple[str, str, str]] = set()
_watchers: list[dict[str, KernelImpl]] = []


def fell_back(impl: KernelImpl, *, stacklevel: int = 3) -> None:
    """Report a call of ``impl.name`` that runs ``impl.kernel`` instead: a warning (once per
    kernel, device and reason) and an entry in every active :func:`watch`."""
    for seen in _watchers:
        seen.setdefault(impl.name, impl)
    key = (impl.name, impl.device, str(impl.fallback))
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(
        f"specmoe: kernel {impl.describe()}", KernelFallbackWarning, stacklevel=stacklevel
    )


@contextmanager
def watch() -> Iterator[dict[str, KernelImpl]]:
    """Collect the fallbacks of the kernel calls in the block: kernel name -> the
    :class:`KernelImpl` of its first call that fell back (names that never fell back are
    absent)."""
    seen: dict[str, KernelImpl] = {}
    _watchers.append(seen)
    try:
        yield seen
    finally:
        _watchers.remove(seen)


# C or Triton kernel -> the torch kernel of the same bytes it falls back to
FALLBACK = {"per_slot": "per_slot_torch", "dedup": "dedup_torch"}


def impl_of(
    name: str, device: str, *, requested: str, reason: str | None, **status: Any
) -> KernelImpl:
    """The record of kernel ``name`` asking for ``requested`` code: that code when ``reason``
    is None, else the torch kernel of :data:`FALLBACK` (``status``: ``compiler``/``triton``)."""
    return KernelImpl(
        name,
        device,
        requested=requested,
        ran=requested if reason is None else "torch",
        kernel=name if reason is None else FALLBACK[name],
        fallback=reason,
        **status,
    )


def run_fallback(impl: KernelImpl, fallback, x, w_gate_up, w_down, ids, weights, **options):
    """Warn that ``impl`` fell back (at the caller of the public kernel), then run the torch
    kernel ``fallback`` on the same inputs and contract options."""
    fell_back(impl, stacklevel=5)
    return fallback(x, w_gate_up, w_down, ids, weights, **options)
