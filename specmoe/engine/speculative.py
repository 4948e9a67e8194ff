"""The speculative loop: draft k tokens, verify them in one pass, crop the KV cache, log a round.

Legend for shapes: ``n`` = k + 1 tokens of a verification pass, ``L`` MoE layers, ``m`` slots,
``V`` vocabulary.

Greedy speculative decoding at batch one (Leviathan et al., 2023; paper 002 Section 1). The KV
cache holds every token of the context but the current one. A round:

1. the budget (an int, or a policy's ``choose(RoundState)``, :mod:`specmoe.oracle.policies`),
   logged as ``budget``; k is the budget capped so the round cannot emit more than the tokens
   still to generate;
2. the drafter proposes up to k tokens d_1..d_k (timed: T_D); k becomes the number it
   proposed (a prompt-lookup drafter may propose fewer), the ``k`` of the round log. A policy
   that reads the drafter's confidences chooses after drafting; a drafter that drafts one
   token at a time (``propose(..., stop=)``, the draft model) stops as soon as the policy,
   given the confidences so far, would not verify the last draft;
3. one pass of the target on ``[current, d_1..d_k]`` at positions ``C..C+k`` (C the cache length,
   the round's context length L) gives the target's tokens t_0..t_k = argmax of each row
   (timed: T_T, forward pass and argmax, synchronised);
4. accepted = the leading run of d_{j+1} = t_j; the round emits t_0..t_accepted
   (accepted + 1 tokens); the cache is cropped to C + 1 + accepted entries
   (``DynamicCache.crop``), the new current token is t_accepted.

Generation runs to a fixed number of tokens and does not stop at an end-of-sequence token (the
fixed-length runs of paper 002 Appendix D.2); the last rounds' budgets are capped so the
emitted tokens add up to exactly that number. Every emitted token is the target's greedy token
given the emitted tokens before it, so the output equals plain greedy decoding (up to argmax near-ties between a batched pass and a
one-token pass). Each round's routing ``[n, L, m]`` is recorded by router hooks
(:class:`specmoe.engine.capture.RouterRecorder`) after the timing stops, and written with the
round to a round log (:mod:`specmoe.formats.roundlog`).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from specmoe.engine.switch import ForcedRouting, KernelPolicy, KernelSwitch
from specmoe.errors import InputError

__all__ = [
    "Engine",
    "Generation",
    "Round",
    "Verified",
    "cache_kwarg",
    "crop_cache",
    "new_cache",
    "realised_acceptance",
    "speculative_generate",
]


@cache
def _cache_kwarg_of(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwarg(model: Any) -> str:
    """The forward keyword of the KV cache: ``cache`` (transformers >= 5.2x) or
    ``past_key_values``."""
    return _cache_kwarg_of(type(model))


def new_cache(model: Any) -> Any:
    """An empty ``DynamicCache`` whose sliding-window layers keep their past, so it can be
    cropped back after a rejection; a model with its own ``new_cache()`` (another engine's,
    e.g. :class:`specmoe.engines.llamacpp_pass.LlamaCppEngine`'s) makes its own."""
    if hasattr(model, "new_cache"):
        return model.new_cache()
    from transformers import DynamicCache

    kv = DynamicCache(config=model.config)
    for layer in getattr(kv, "layers", []):
        if hasattr(layer, "activate_past_recording"):
            layer.activate_past_recording()
    return kv


def crop_cache(kv: Any, length: int) -> None:
    """Crop ``kv`` to its first ``length`` tokens (always called, so sliding-window layers trim
    back to their window)."""
    remove = int(kv.get_seq_length()) - int(length)
    if remove < 0:
        raise ValueError(f"crop_cache: cache holds {kv.get_seq_length()} tokens, not {length}")
    kv.crop(-remove)


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Verified:
    """One forward pass: the target's tokens [n], routing [n, L, m], its time in ms on the
    engine's clock (and on the wall clock), and the top-2 logit margin of each row [n] (for
    near-tie analysis)."""

    tokens: list[int]
    routing: np.ndarray
    t_ms: float
    margin: np.ndarray
    kernel: str
    wall_ms: float = float("nan")


class Engine:
    """An MoE model with a kernel switch, router recording and, optionally, forced routing.

    ``clock``: ``wall`` (``perf_counter``) or ``cpu`` (``thread_time``: the CPU time of the
    calling thread, which leaves out the time the thread waits for a core while other jobs run;
    only for CPU models run on one thread, where every part of a pass runs in that thread).
    ``close()`` (or ``with``) removes every hook and restores the model's experts
    implementation.
    """

    def __init__(
        self,
        model: Any,
        *,
        policy: KernelPolicy | None = None,
        forced: ForcedRouting | None = None,
        prefill: str = "model",
        clock: str = "wall",
    ):
        import torch

        from specmoe.engine.capture import RouterRecorder

        self.model = model
        self.device = next(model.parameters()).device
        if clock not in ("wall", "cpu"):
            raise InputError(f"unknown {clock!r} (choose wall or cpu)", argument="clock")
        if clock == "cpu" and self.device.type != "cpu":
            raise InputError(
                f"cpu: the model is on {self.device}, not the CPU (use the wall clock)",
                argument="clock",
            )
        self.clock = clock
        self.now = time.perf_counter if clock == "wall" else time.thread_time
        self.switch = KernelSwitch(model, policy, prefill=prefill).install()
        self.recorder = RouterRecorder(model).install()
        self.forced = forced.install() if forced is not None else None
        self.num_experts = self.recorder.num_experts
        self.top_k = self.recorder.rule.top_k
        self.num_layers = len(self.recorder.layers)
        self.vocab_size = int(model.config.vocab_size)
        self._kw = cache_kwarg(model)
        self._torch = torch

    @property
    def policy(self) -> KernelPolicy:
        return self.switch.policy

    def set_policy(self, policy: KernelPolicy) -> None:
        self.switch.set_policy(policy)

    def close(self) -> None:
        if self.forced is not None:
            self.forced.remove()
        self.recorder.remove()
        self.switch.remove()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- passes ----------------------------------------------------------------------------
    def _call(self, kv: Any, tokens: Sequence[int], *, keep: int) -> Any:
        torch = self._torch
        ids = torch.as_tensor([list(tokens)], dtype=torch.long, device=self.device)
        if self.forced is not None:
            self.forced.position = int(kv.get_seq_length())
        with torch.inference_mode():
            return self.model(
                input_ids=ids, use_cache=True, logits_to_keep=keep, **{self._kw: kv}
            ).logits[0]

    def prefill(self, kv: Any, tokens: Sequence[int]) -> None:
        """Feed ``tokens`` into ``kv`` (their routing is discarded)."""
        if len(tokens):
            self._call(kv, tokens, keep=1)
        self.recorder.clear()

    def forward(self, kv: Any, tokens: Sequence[int]) -> Verified:
        """One timed pass of ``tokens`` after the cache: the target's argmax of each row."""
        torch = self._torch
        if not len(tokens):
            raise ValueError("forward: no tokens")
        self.recorder.clear()
        kernel = self.switch.policy.kernel_for(len(tokens))
        _sync(self.device)
        w0, t0 = time.perf_counter(), self.now()
        logits = self._call(kv, tokens, keep=0)  # [n, V]
        top = torch.topk(logits.float(), 2, dim=-1)
        target = top.indices[:, 0].tolist()
        _sync(self.device)
        t_ms, wall_ms = (self.now() - t0) * 1e3, (time.perf_counter() - w0) * 1e3
        routing, _ = self.recorder.pop()  # [n, L, m]
        margin = (top.values[:, 0] - top.values[:, 1]).cpu().numpy()
        return Verified(target, routing, t_ms, margin, kernel, wall_ms)

    def greedy(self, prompt: Sequence[int], count: int) -> list[int]:
        """Plain greedy decoding (one-token passes): the next ``count`` tokens after ``prompt``."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise InputError("prompt: empty")
        kv = new_cache(self.model)
        self.prefill(kv, prompt[:-1])
        out, current = [], prompt[-1]
        for _ in range(int(count)):
            current = self.forward(kv, [current]).tokens[0]
            out.append(current)
        return out


# ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Round:
    """One verification round of a speculative generation (step 1-4 of the module docstring).

    Fields are named as the round-log columns they are written to
    (:mod:`specmoe.formats.roundlog`); the derived columns are properties.
    """

    round: int  # index within the generation: 0, 1, ...
    k: int  # drafts verified (<= budget)
    budget: int  # the draft budget asked for
    accepted: int  # leading drafts equal to the target's tokens, 0..k
    t_verify_ms: float  # T_T: the target's verification pass
    t_draft_ms: float  # T_D: drafting
    context_len: int  # L: tokens in the KV cache before the pass
    u_mean: float  # Ū: distinct experts of the pass, averaged over MoE layers
    e_max: int  # the most tokens of the pass one expert receives, over layers
    kernel: str  # the expert kernel of the pass
    drafter: str | None
    num_experts: int  # N
    routing: np.ndarray  # [n, L, m] int16 expert ids of the pass
    draft_tokens: tuple[int, ...]  # [k] d_1..d_k
    target_tokens: tuple[int, ...]  # [n] t_0..t_k, the target's argmax of each row
    acceptance: float | None = None  # the target acceptance of an oracle drafter
    draft_confidence: tuple[float, ...] | None = None  # [k] the drafter's probabilities

    @property
    def pass_size(self) -> int:
        return self.k + 1

    @property
    def emitted(self) -> int:
        return self.accepted + 1

    @property
    def tokens(self) -> tuple[int, ...]:
        """The tokens the round emits: t_0..t_accepted."""
        return self.target_tokens[: self.accepted + 1]

    @property
    def num_layers(self) -> int:
        return int(self.routing.shape[1])

    @property
    def top_k(self) -> int:
        return int(self.routing.shape[2])


@dataclass
class Generation:
    """The outcome of one speculative generation."""

    tokens: list[int]  # the emitted tokens, in order
    rounds: list[Round] = field(default_factory=list)
    decode_ms: float = 0.0  # drafting + verification + loop, no logging
    decode_wall_ms: float = 0.0  # the same on the wall clock
    prefill_ms: float = 0.0
    mismatches: int = 0  # oracle rounds cut at an uncorrupted draft

    @property
    def tokens_per_s(self) -> float:
        return 1e3 * len(self.tokens) / self.decode_ms if self.decode_ms > 0 else float("nan")

    @property
    def drafted(self) -> int:
        return int(sum(r.k for r in self.rounds))

    @property
    def accepted(self) -> int:
        return int(sum(r.accepted for r in self.rounds))

    @property
    def realised_acceptance(self) -> float:
        """:func:`realised_acceptance` of the rounds."""
        return realised_acceptance([r.k for r in self.rounds], [r.accepted for r in self.rounds])


def realised_acceptance(k: Sequence[int], accepted: Sequence[int]) -> float:
    """The geometric rate's maximum-likelihood estimate from rounds' (k, accepted), [R] each.

    A round with k drafts accepts j < k with probability a^j (1 - a) and all k with a^k, so
    â = Σ accepted / (Σ accepted + #rounds with accepted < k); NaN without drafts.
    """
    k_, acc_ = np.asarray(k, dtype=np.int64), np.asarray(accepted, dtype=np.int64)
    acc, fails = int(acc_.sum()), int((acc_ < k_).sum())
    return acc / (acc + fails) if acc + fails else float("nan")


def _takes_stop(drafter: Any) -> bool:
    """Whether the drafter's ``propose`` accepts ``stop=`` (drafting one token at a time)."""
    try:
        return "stop" in inspect.signature(drafter.propose).parameters
    except (TypeError, ValueError):
        return False


def _choose(budget: Any, state: Any) -> int:
    if isinstance(budget, int | np.integer):
        return int(budget)
    return int(budget.choose(state))


def speculative_generate(
    engine: Engine,
    prompt: Sequence[int],
    drafter: Any,
    *,
    budget: Any,
    max_new_tokens: int,
    max_k: int = 16,
    writer: Any = None,
    row: dict[str, Any] | None = None,
    progress: Any = None,
) -> Generation:
    """Generate ``max_new_tokens`` tokens after ``prompt`` by speculative decoding.

    ``budget``: an int k, or a policy object with ``choose(RoundState) -> k`` (a policy with
    ``use_confidence`` gets the drafter's probabilities of ``max_k`` drafts first). ``writer``:
    a :class:`specmoe.formats.roundlog.RoundLogWriter` that receives one row per round, each with the
    fields of ``row`` (run_id, prompt_id, ...). ``progress``: anything with ``update(n)``.
    """
    from specmoe.formats.roundlog import pass_stats
    from specmoe.oracle.policies import RoundState

    prompt = [int(t) for t in prompt]
    if len(prompt) < 1:
        raise InputError("prompt: empty")
    if max_new_tokens < 1:
        raise InputError(
            f"must be a positive integer, got {max_new_tokens}", argument="max_new_tokens"
        )
    if isinstance(budget, int | np.integer) and not 0 <= int(budget) <= max_k:
        raise InputError(f"{budget}: must be in 0..{max_k}", argument="budget")
    base = dict(row or {})
    kv = new_cache(engine.model)
    now = engine.now
    t0 = time.perf_counter()
    engine.prefill(kv, prompt[:-1])
    gen = Generation(tokens=[], prefill_ms=(time.perf_counter() - t0) * 1e3)
    drafter.begin(prompt, max_new_tokens)
    context, current = list(prompt), prompt[-1]
    history: list[tuple[int, int]] = []
    use_conf = bool(getattr(budget, "use_confidence", False))
    prepare = getattr(drafter, "prepare", None)
    while len(gen.tokens) < max_new_tokens:
        remaining = max_new_tokens - len(gen.tokens)
        start, wall = now(), time.perf_counter()
        state = RoundState(
            position=len(gen.tokens), context_len=int(kv.get_seq_length()), history=tuple(history)
        )
        k_cap = min(max_k, remaining - 1)
        chosen = max_k if use_conf else max(0, min(_choose(budget, state), max_k))
        k = min(chosen, k_cap)
        excluded = excluded_wall = 0.0
        if prepare is not None and k > 0:  # untimed: e.g. the oracle's reference decoding
            t_p, w_p = now(), time.perf_counter()
            prepare(context, k)
            excluded, excluded_wall = now() - t_p, time.perf_counter() - w_p
        t_d = now()
        if use_conf and _takes_stop(drafter):

            def stop(conf, state=state):  # the policy would not verify the last draft
                seen = RoundState(state.position, state.context_len, state.history, conf)
                return _choose(budget, seen) < len(conf)

            prop = drafter.propose(context, k, stop=stop)
        else:
            prop = drafter.propose(context, k)
        t_draft = now() - t_d
        if use_conf:
            state = RoundState(state.position, state.context_len, state.history, prop.confidence)
            chosen = max(0, min(_choose(budget, state), max_k))
            k = min(chosen, k_cap)
        drafts = [int(t) for t in prop.tokens[:k]]
        conf = None if prop.confidence is None else [float(c) for c in prop.confidence[:k]]
        k = len(drafts)
        ctx_len = int(kv.get_seq_length())
        ver = engine.forward(kv, [current, *drafts])
        acc = 0
        while acc < k and drafts[acc] == ver.tokens[acc]:
            acc += 1
        emitted = ver.tokens[: acc + 1]
        crop_cache(kv, ctx_len + 1 + acc)
        flags = getattr(drafter, "corrupted", None)
        if flags is not None and acc < k and not flags[acc]:
            gen.mismatches += 1
        gen.tokens.extend(emitted)
        context.extend(emitted)
        current = emitted[-1]
        history.append((k, acc))
        gen.decode_ms += (now() - start - excluded) * 1e3
        gen.decode_wall_ms += (time.perf_counter() - wall - excluded_wall) * 1e3
        u, e = pass_stats(ver.routing, engine.num_experts)
        rnd = Round(
            round=len(history) - 1,
            k=k,
            budget=chosen,
            accepted=acc,
            t_verify_ms=ver.t_ms,
            t_draft_ms=t_draft * 1e3,
            context_len=ctx_len,
            u_mean=float(u),
            e_max=int(e),
            kernel=ver.kernel,
            drafter=getattr(drafter, "name", None),
            num_experts=engine.num_experts,
            routing=ver.routing.astype(np.int16),
            draft_tokens=tuple(drafts),
            target_tokens=tuple(ver.tokens),
            acceptance=(
                None if getattr(drafter, "acceptance", None) is None else float(drafter.acceptance)
            ),
            draft_confidence=None if conf is None else tuple(conf),
        )
        gen.rounds.append(rnd)
        if writer is not None:
            writer.append_round(rnd, **base)
        if progress is not None:
            progress.update(len(emitted))
    return gen
