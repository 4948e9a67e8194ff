"""``specmoe acceptance FILE...``: the acceptance rate a, measured by a serving engine.

Reads what vLLM, SGLang or llama.cpp recorded about its speculative steps (per-request
response metrics, JSON lines of them, or the server's Prometheus text; ``docs/acceptance.md``)
and estimates a with an interval, the per-position rates, a test of the geometric model and,
where steps were recorded in order, the after-accept / after-reject rates. Prints a summary, or
with ``--json`` the estimate on stdout; ``--out FILE`` writes it as the small JSON that
``specmoe.formats.acceptance.load_acceptance`` reads back.
"""

from __future__ import annotations

import math
import sys

from specmoe.commands._common import check_float, check_int, check_out_file

MAX_DRAFT_LENGTH = 1024


def add_arguments(parser) -> None:
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="engine metrics: JSON, JSON lines or Prometheus text of one engine",
    )
    parser.add_argument(
        "--draft-length",
        type=int,
        default=None,
        metavar="K",
        help="tokens every step drafted, where the engine does not say (llama.cpp timings), "
        "or the depth of an SGLang draft tree",
    )
    parser.add_argument(
        "--since",
        default=None,
        metavar="FILE",
        help="an earlier Prometheus scrape of the same server: count only what came after it",
    )
    parser.add_argument(
        "--confidence", type=float, default=0.95, help="interval level (default 0.95)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON on stdout")
    parser.add_argument(
        "--out", default=None, metavar="FILE", help="write the estimate as JSON to FILE"
    )


def _f(x: float | None, spec: str = ".3f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _iv(iv) -> str:
    return "—" if iv is None else f"{_f(iv[0])}–{_f(iv[1])}"


def summary(est) -> str:
    """A readable text summary of an :class:`AcceptanceEstimate`."""
    pct = f"{est.confidence * 100:g}%"
    skipped = f", {est.skipped} without speculative counts skipped" if est.skipped else ""
    lines = [
        f"{est.source}: {est.requests} record(s){skipped}; {est.steps} verification steps, "
        f"{est.drafted} draft tokens, {est.accepted} accepted (k = {est.k})"
    ]
    how = (
        f"geometric MLE from {est.accepted} accepted and {est.rejections} rejections"
        if est.method == "geometric-mle"
        else f"truncated-geometric mean length {est.mean_accepted:.4f} per step"
    )
    bound = "" if est.exact else " (a lower bound)"
    lines.append(f"acceptance a = {_f(est.rate, '.4f')}{bound} ({pct} {_iv(est.interval)}), {how}")
    if est.interval_requests is not None:
        lines.append(f"  {pct} interval with requests as the units: {_iv(est.interval_requests)}")
    lines.append(
        f"mean accepted drafts per step {est.mean_accepted:.3f} "
        f"({est.mean_accepted + 1:.3f} tokens with the target's own)"
    )
    if est.per_position:
        cells = [
            f"{p.position}: {_f(p.rate)}{'' if p.exact else '≥'} ({_iv(p.interval)}, n={p.trials})"
            for p in est.per_position
        ]
        lines.append("per position: " + "; ".join(cells))
    t = est.geometric_test
    if t is not None:
        verdict = "rates differ by position" if t.p_value < 0.05 else "consistent with one rate"
        lines.append(
            f"geometric test: LR chi2 = {t.statistic:.2f}, df {t.df}, p = {t.p_value:.3g} "
            f"({verdict})"
        )
    m = est.markov
    if m is not None:
        lines.append(
            f"Markov: after a full acceptance {_f(m.after_accept)} ({_iv(m.after_accept_interval)}, "
            f"{m.after_accept_steps} steps), after a rejection {_f(m.after_reject)} "
            f"({_iv(m.after_reject_interval)}, {m.after_reject_steps} steps); equal rates "
            f"p = {_f(m.p_value, '.3g')}"
        )
    lines.extend(f"note: {n}" for n in est.notes)
    return "\n".join(lines)


def run(args) -> int:
    from specmoe._io import atomic_write_json, dumps_json
    from specmoe.errors import InputError
    from specmoe.formats.acceptance import acceptance_to_json
    from specmoe.formats.engine_metrics import estimate_from_files

    check_int(args.draft_length, "--draft-length", low=1, high=MAX_DRAFT_LENGTH)
    check_float(args.confidence, "--confidence", low=0.0, high=1.0, closed="()")
    check_out_file(args.out)
    try:
        est = estimate_from_files(
            args.files, k=args.draft_length, confidence=args.confidence, since=args.since
        )
    except InputError as exc:
        if exc.argument == "k":
            raise exc.as_flag("--draft-length") from None
        if exc.argument == "since":
            raise exc.as_flag("--since") from None
        raise InputError(exc.message) from None
    payload = acceptance_to_json(est)
    if args.out is not None:
        atomic_write_json(args.out, payload)
        print(f"acceptance: wrote {args.out}", file=sys.stderr)
    if args.json:
        print(dumps_json(payload))
    else:
        print(summary(est))
    return 0
