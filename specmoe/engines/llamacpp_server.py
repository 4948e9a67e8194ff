"""llama.cpp's server for what only it offers: synthetic acceptance (``--spec-synth-rates``).

``llama-server`` (built by ``make llama-cpp``) is started on a free local port for one
completion and stopped. With ``--spec-synth-rates P1,...,Pk`` it verifies each round's k
drafts and then accepts draft i at random with probability P_i / P_(i-1) instead of by match
with the target (``server_sample_and_accept_synth`` in ``tools/server/server-context.cpp``):
the engine-side counterpart of specmoe's oracle drafter. With an acceptance a per token,
P_i = a^i: the drafts of a round are accepted as independent draws of rate a until the first
rejection. Its output text is not the model's (llama.cpp says so); its timings are the
engine's own: ``predicted_per_second``, ``draft_n``, ``draft_n_accepted``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass

from specmoe.engines.llamacpp import _model_file, tool
from specmoe.errors import InputError

__all__ = ["ServerTimings", "serve_completion", "synthetic_rates", "synthetic_run"]


@dataclass(frozen=True)
class ServerTimings:
    """A completion's timings as llama-server reports them (``timings`` of /completion)."""

    prompt_n: int
    predicted_n: int
    predicted_ms: float
    tokens_per_s: float
    draft_n: int
    draft_n_accepted: int

    @property
    def acceptance(self) -> float:
        return self.draft_n_accepted / self.draft_n if self.draft_n else float("nan")


def synthetic_rates(acceptance: float, k: int) -> list[float]:
    """``--spec-synth-rates`` for acceptance ``a`` per draft, ``k`` drafts: [a, a^2, ..., a^k]
    (llama.cpp's rates are unconditional per position, non-increasing)."""
    if not 0.0 <= acceptance <= 1.0:
        raise InputError(f"must be in [0, 1], got {acceptance}", argument="acceptance")
    if k < 1:
        raise InputError(f"must be >= 1, got {k}", argument="k")
    return [acceptance ** (i + 1) for i in range(k)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_completion(
    target: str | os.PathLike,
    prompt: str,
    *,
    n_predict: int,
    server_args: tuple[str, ...] = (),
    threads: int = 1,
    ctx_size: int = 4096,
    seed: int = 0,
    timeout_s: float = 300,
) -> ServerTimings:
    """Start llama-server on ``target`` (plus ``server_args``), ask one greedy completion of
    ``n_predict`` tokens after ``prompt`` (no prompt cache), stop it; its timings."""
    port = _free_port()
    cmd = [str(tool("llama-server")), "-m", str(_model_file(target, "target")), *server_args]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "-c", str(int(ctx_size)), "-np", "1"]
    cmd += ["-t", str(int(threads)), "-fa", "off", "--no-warmup"]
    body = {
        "prompt": prompt,
        "n_predict": int(n_predict),
        "temperature": 0,
        "seed": int(seed),
        "cache_prompt": False,
        "ignore_eos": True,
    }
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + timeout_s
            while True:
                if proc.poll() is not None or time.time() > deadline:
                    log.seek(0)
                    tail = " | ".join(log.read().strip().splitlines()[-3:])
                    raise RuntimeError(f"llama-server did not become ready: {tail}")
                try:
                    with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.2)
            req = urllib.request.Request(
                f"{base}/completion",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                t = json.loads(r.read())["timings"]
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return ServerTimings(
        prompt_n=int(t["prompt_n"]),
        predicted_n=int(t["predicted_n"]),
        predicted_ms=float(t["predicted_ms"]),
        tokens_per_s=float(t["predicted_per_second"]),
        draft_n=int(t.get("draft_n", 0)),
        draft_n_accepted=int(t.get("draft_n_accepted", 0)),
    )


def synthetic_run(
    target: str | os.PathLike,
    draft: str | os.PathLike,
    prompt: str,
    *,
    k: int,
    acceptance: float,
    n_predict: int,
    threads: int = 1,
    seed: int = 0,
) -> ServerTimings:
    """One completion with the draft model proposing ``k`` tokens a round and llama.cpp's
    synthetic acceptance at rate ``acceptance`` per draft (:func:`synthetic_rates`)."""
    rates = ",".join(f"{r:.9g}" for r in synthetic_rates(acceptance, k))
    args = ("-md", str(_model_file(draft, "draft")), "--spec-type", "draft-simple")
    args += ("--spec-draft-n-max", str(int(k)), "--spec-draft-n-min", "0")
    args += ("--spec-draft-p-min", "0", "-td", str(int(threads)), "--spec-synth-rates", rates)
    return serve_completion(
        target, prompt, n_predict=n_predict, server_args=args, threads=threads, seed=seed
    )
