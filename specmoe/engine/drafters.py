"""Drafters: who proposes the k tokens of a verification pass.

Legend: ``k`` drafts of a round, ``V`` vocabulary size.

A drafter has a ``name``, :meth:`begin` (a new generation: its prompt and how many tokens it
will generate) and :meth:`propose` (``context`` = the prompt and every emitted token, the last
of which is the round's current token; returns up to k tokens and, optionally, its probability
of each). A drafter may propose fewer than k tokens (nothing to look up); the loop then
verifies what was proposed. Registry: :func:`make_drafter` by name (``oracle``, ``ngram``,
``draft-model``).

* :class:`OracleDrafter` (paper 002 Section 4 and Appendix D.2): proposes the target's own
  greedy continuation and corrupts each draft, independently with probability 1 - a, by a
  seeded draw; a corrupted draft is replaced by another token (uniform over the other V - 1),
  so a round accepts exactly the drafts before its first corrupted one and acceptance is
  geometric at rate a. The greedy continuation comes from ``reference(context, count)``
  (the engine's plain batch-one decoding), cached per prompt; when the emitted text leaves the
  cached continuation (the batched verify argmax differs from the batch-one greedy token, a
  near tie), it is recomputed from there (counted in ``recomputes``; such a round's cut is
  counted in ``mismatches``). It costs essentially nothing to propose.
* :class:`NgramDrafter`: prompt lookup. The longest suffix of the context (``max_ngram`` down
  to ``min_ngram`` tokens) that occurs earlier in the context; its latest earlier occurrence's
  continuation, up to k tokens.
* :class:`ModelDrafter`: a small causal LM (the bundled dense draft model by default) decoding
  greedily with its own KV cache, cropped to the longest prefix it shares with the context.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from specmoe.errors import InputError

__all__ = [
    "DRAFTERS",
    "Drafter",
    "ModelDrafter",
    "NgramDrafter",
    "OracleDrafter",
    "Proposal",
    "load_draft_model",
    "make_drafter",
]

DRAFTERS = ("oracle", "ngram", "draft-model")


@dataclass(frozen=True)
class Proposal:
    """Drafted tokens (at most k) and the drafter's probability of each (or None)."""

    tokens: list[int]
    confidence: list[float] | None = None


class Drafter(Protocol):
    name: str

    def begin(self, prompt: Sequence[int], max_new_tokens: int) -> None: ...

    def propose(self, context: Sequence[int], k: int) -> Proposal: ...


# ------------------------------------------------------------------------------------------
# Oracle draft


class OracleDrafter:
    """The target's greedy continuation, each draft corrupted with probability 1 - a."""

    name = "oracle"

    def __init__(
        self,
        reference: Callable[[Sequence[int], int], list[int]],
        *,
        acceptance: float | None,
        vocab_size: int,
        seed: int = 0,
        horizon: int = 16,
        cache: dict[tuple[int, ...], list[int]] | None = None,
    ):
        if acceptance is not None and not 0.0 <= acceptance <= 1.0:
            raise InputError(f"{acceptance}: must be in [0, 1]", argument="acceptance")
        if vocab_size < 2:
            raise InputError(f"must be at least 2, got {vocab_size}", argument="vocab_size")
        self.reference = reference
        self.acceptance = None if acceptance is None else float(acceptance)  # None: k = 0 only
        self.vocab_size = int(vocab_size)
        self.seed = int(seed)
        self.horizon = int(horizon)
        # prompt -> prompt + greedy continuation; pass one dict to drafters of several rates
        self._cache: dict[tuple[int, ...], list[int]] = {} if cache is None else cache
        self._ref: list[int] = []
        self._rng = np.random.default_rng(seed)
        self._end = 0
        self.recomputes = 0
        self.corrupted: list[bool] = []  # flags of the last proposal

    def begin(self, prompt: Sequence[int], max_new_tokens: int) -> None:
        key = tuple(int(t) for t in prompt)
        self._end = len(key) + int(max_new_tokens)
        if len(self._cache.get(key, ())) < self._end + self.horizon:
            self._cache[key] = list(key) + list(
                self.reference(key, int(max_new_tokens) + self.horizon)
            )
        self._ref = self._cache[key]
        self._rng = np.random.default_rng(
            [self.seed, zlib.crc32(np.asarray(key, np.int64).tobytes())]
        )

    def prepare(self, context: Sequence[int], k: int) -> None:
        """Make sure the cached greedy continuation covers ``context`` and k more tokens."""
        c = len(context)
        if len(self._ref) < c + k or list(self._ref[:c]) != list(context):
            self.recomputes += 1
            more = max(k, self._end - c + self.horizon)
            self._ref = list(context) + list(self.reference(list(context), more))

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        if k <= 0:
            self.corrupted = []
            return Proposal([])
        if self.acceptance is None:
            raise ValueError("OracleDrafter without an acceptance rate proposes no drafts")
        self.prepare(context, k)
        c, ref = len(context), self._ref
        true = ref[c : c + k]
        flags = self._rng.random(k) >= self.acceptance  # True: corrupt this draft
        shift = self._rng.integers(1, self.vocab_size, size=k)  # another token, uniformly
        tokens = [
            int((t + s) % self.vocab_size) if f else int(t) for t, f, s in zip(true, flags, shift)
        ]
        self.corrupted = [bool(f) for f in flags]
        return Proposal(tokens)  # no confidence: it would reveal the corruption flags


# ------------------------------------------------------------------------------------------
# Prompt lookup


class NgramDrafter:
    """Prompt-lookup drafting from the context's own earlier n-grams."""

    name = "ngram"

    def __init__(self, *, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise InputError(
                f"ngram sizes: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}"
            )
        self.max_ngram, self.min_ngram = int(max_ngram), int(min_ngram)

    def begin(self, prompt: Sequence[int], max_new_tokens: int) -> None:
        pass

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        if k <= 0:
            return Proposal([])
        ctx = np.asarray(context, dtype=np.int64)
        size = len(ctx)
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            pattern = ctx[size - n :]
            hay = ctx[: size - 1]  # an occurrence must end before the suffix does
            if len(hay) < n:
                continue
            win = np.lib.stride_tricks.sliding_window_view(hay, n)
            hits = np.flatnonzero((win == pattern).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n  # the latest occurrence's continuation
                return Proposal([int(t) for t in ctx[start : start + k]])
        return Proposal([])


# ------------------------------------------------------------------------------------------
# A draft model


def load_draft_model(
    path: str | Path | None = None, *, device: str = "cpu", dtype: str | None = None
) -> Any:
    """A causal LM from a local directory (default: the bundled draft model), eval mode, from
    safetensors only (:func:`specmoe.engine.models.from_pretrained`)."""
    import torch
    from transformers import AutoModelForCausalLM

    if path is None:
        from specmoe.data import corpus

        path = corpus.bundled_draft_dir()
        if not (Path(path) / "config.json").is_file():
            raise InputError(
                f"no bundled draft model at {path} (pass the folder of one)", argument="path"
            )
    path = Path(path)
    if not (path / "config.json").is_file():
        raise InputError(f"{path}: no config.json (expected an HF model folder)", argument="path")
    from specmoe.engine.models import check_device, from_pretrained

    check_device(device)
    torch_dtype = torch.float32 if dtype is None else getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise InputError(f"{dtype!r} is not a torch dtype name", argument="dtype")
    return from_pretrained(
        AutoModelForCausalLM, path, dtype=torch_dtype, device=device, argument="path"
    )


class ModelDrafter:
    """Greedy drafting by a small causal LM with its own KV cache."""

    name = "draft-model"

    def __init__(self, model: Any, *, target_vocab: int | None = None):
        self.model = model
        vocab = int(model.config.vocab_size)
        if target_vocab is not None and vocab > target_vocab:
            raise InputError(
                f"draft model vocabulary {vocab} exceeds the target's "
                f"{target_vocab}: they must share a tokenizer"
            )
        self.device = next(model.parameters()).device
        self._cache: Any = None
        self._ids: list[int] = []  # the tokens whose keys and values are in the cache

    def begin(self, prompt: Sequence[int], max_new_tokens: int) -> None:
        from transformers import DynamicCache

        self._cache = DynamicCache(config=self.model.config)
        self._ids = []

    def _feed(self, tokens: Sequence[int]) -> Any:
        import torch

        ids = torch.as_tensor([list(tokens)], dtype=torch.long, device=self.device)
        from specmoe.engine.speculative import cache_kwarg

        out = self.model(
            input_ids=ids,
            use_cache=True,
            logits_to_keep=1,
            **{cache_kwarg(self.model): self._cache},
        )
        self._ids.extend(int(t) for t in tokens)
        return out.logits[0, -1].float()

    def propose(
        self, context: Sequence[int], k: int, *, stop: Callable[[list[float]], bool] | None = None
    ) -> Proposal:
        """Up to k greedy drafts and their probabilities. ``stop(confidences so far)`` is asked
        after each draft; True ends the proposal there (a confidence policy that will not
        verify the last draft need not pay for more)."""
        import torch

        if k <= 0:
            return Proposal([], [])
        if self._cache is None:
            self.begin(context, 0)
        ctx = [int(t) for t in context]
        common = 0
        for a, b in zip(self._ids, ctx):
            if a != b:
                break
            common += 1
        common = min(common, len(ctx) - 1)  # feed at least the current token
        drop = len(self._ids) - common
        if drop > 0:
            self._cache.crop(-drop)
            del self._ids[common:]
        tokens, conf = [], []
        with torch.inference_mode():
            logits = self._feed(ctx[common:])
            for i in range(k):
                p = torch.softmax(logits, -1)
                t = int(torch.argmax(logits))
                tokens.append(t)
                conf.append(float(p[t]))
                if stop is not None and i + 1 < k and stop(list(conf)):
                    break
                if i + 1 < k:
                    logits = self._feed([t])
        return Proposal(tokens, conf)


# ------------------------------------------------------------------------------------------
# Registry


def make_drafter(
    name: str,
    *,
    reference: Callable[[Sequence[int], int], list[int]] | None = None,
    acceptance: float | None = None,
    vocab_size: int | None = None,
    seed: int = 0,
    draft_model: Any = None,
    draft_path: str | Path | None = None,
    device: str = "cpu",
) -> Any:
    """A drafter by name; an unknown name lists the valid ones."""
    if name == "oracle":
        if reference is None or acceptance is None or vocab_size is None:
            raise InputError(
                "oracle needs the target's reference decoding, an acceptance and the "
                "vocabulary size (reference, acceptance, vocab_size)",
                argument="name",
            )
        return OracleDrafter(reference, acceptance=acceptance, vocab_size=vocab_size, seed=seed)
    if name == "ngram":
        return NgramDrafter()
    if name == "draft-model":
        net = (
            draft_model if draft_model is not None else load_draft_model(draft_path, device=device)
        )
        return ModelDrafter(net, target_vocab=vocab_size)
    raise InputError(f"unknown {name!r} (choose from {', '.join(DRAFTERS)})", argument="name")
