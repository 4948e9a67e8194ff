"""The acceptance estimate on disk (format ``specmoe.acceptance``, version 1): what
``specmoe acceptance --out FILE`` writes, and :func:`load_acceptance`, the one reader a plan
calls (``specmoe plan --acceptance-from FILE``): that JSON, or any engine metrics file
(``specmoe.formats.engine_metrics``), estimated on the spot.

The JSON is :class:`specmoe.oracle.acceptance.AcceptanceEstimate` field by field (tuples as
lists, NaN as null) under ``"format": "specmoe.acceptance"`` and ``"version": 1``;
``docs/acceptance.md`` shows one.
"""

from __future__ import annotations

import os
from typing import Any

from specmoe.errors import InputError
from specmoe.oracle.acceptance import AcceptanceEstimate

ACCEPTANCE_FORMAT = "specmoe.acceptance"  # the "format" of the JSON the command writes


def acceptance_to_json(est: AcceptanceEstimate) -> dict[str, Any]:
    """The estimate as the JSON ``specmoe acceptance --out`` writes (format
    ``specmoe.acceptance``, version 1)."""
    from specmoe._io import to_jsonable

    return {"format": ACCEPTANCE_FORMAT, "version": 1, **to_jsonable(est)}


def acceptance_from_json(obj: Any, name: str) -> AcceptanceEstimate:
    """:func:`acceptance_to_json`'s output back as an :class:`AcceptanceEstimate`."""
    from specmoe.oracle.acceptance import GeometricTest, PositionRate

    if not isinstance(obj, dict) or obj.get("format") != ACCEPTANCE_FORMAT:
        raise InputError(f"{name}: not a {ACCEPTANCE_FORMAT} file", argument="path")
    if obj.get("version") != 1:
        raise InputError(f"{name}: unknown version {obj.get('version')!r:.20}", argument="path")
    try:
        rate = float(obj["rate"])
        lo, hi = (float(x) for x in obj["interval"])
        if not (0.0 <= lo <= rate <= hi <= 1.0):
            raise ValueError(f"rate {rate} outside [0, 1] or its interval [{lo}, {hi}]")

        def pair(v):
            return None if v is None else (float(v[0]), float(v[1]))

        gt = obj.get("geometric_test")
        mk = obj.get("markov")
        return AcceptanceEstimate(
            rate=rate,
            interval=(lo, hi),
            method=str(obj["method"]),
            exact=bool(obj["exact"]),
            k=None if obj.get("k") is None else int(obj["k"]),
            steps=int(obj["steps"]),
            drafted=int(obj["drafted"]),
            accepted=int(obj["accepted"]),
            rejections=None if obj.get("rejections") is None else int(obj["rejections"]),
            mean_accepted=float(obj["mean_accepted"]),
            per_position=tuple(
                PositionRate(
                    int(p["position"]),
                    int(p["trials"]),
                    int(p["accepted"]),
                    float("nan") if p["rate"] is None else float(p["rate"]),
                    pair([float("nan") if x is None else x for x in p["interval"]]),
                    bool(p.get("exact", True)),
                )
                for p in obj.get("per_position") or ()
            ),
            geometric_test=None
            if gt is None
            else GeometricTest(float(gt["statistic"]), int(gt["df"]), float(gt["p_value"])),
            markov=None if mk is None else _markov_from_json(mk),
            interval_requests=pair(obj.get("interval_requests")),
            requests=int(obj["requests"]),
            confidence=float(obj["confidence"]),
            source=str(obj.get("source", "")),
            engine=str(obj.get("engine", "")),
            files=tuple(map(str, obj.get("files") or ())),
            skipped=int(obj.get("skipped", 0)),
            notes=tuple(map(str, obj.get("notes") or ())),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            f"{name}: malformed {ACCEPTANCE_FORMAT} file ({exc})", argument="path"
        ) from None


def _markov_from_json(mk: dict) -> Any:
    from specmoe.oracle.acceptance import MarkovRates

    def num(v):
        return float("nan") if v is None else float(v)

    return MarkovRates(
        num(mk["after_accept"]),
        tuple(num(x) for x in mk["after_accept_interval"]),
        int(mk["after_accept_steps"]),
        num(mk["after_reject"]),
        tuple(num(x) for x in mk["after_reject_interval"]),
        int(mk["after_reject_steps"]),
        num(mk["statistic"]),
        num(mk["p_value"]),
    )


def load_acceptance(
    path: str | os.PathLike, *, k: int | None = None, confidence: float = 0.95
) -> AcceptanceEstimate:
    """The measured acceptance of ``path``, for a plan to use (``specmoe plan
    --acceptance-from FILE``).

    ``path`` is either the JSON ``specmoe acceptance --out FILE`` wrote (format
    ``specmoe.acceptance``: returned as written) or any engine metrics file this module reads
    (estimated here with ``k`` and ``confidence``, as ``specmoe acceptance FILE`` would).

    Contract: ``rate`` is a in [0, 1] (per-draft-token acceptance, the a of G_a(k) = sum a^i,
    ``specmoe.cost.theory.expected_tokens``); ``interval`` = (low, high) at ``confidence``
    with low <= rate <= high; ``exact`` False means ``rate`` is a lower bound;
    ``per_position`` the conditional rates a_1..a_k where the engine counted positions;
    ``geometric_test`` (p-value small: per-position rates differ, the one-rate model is off);
    ``markov`` the after-accept / after-reject rates where steps were recorded in order;
    ``source``, ``engine`` and ``files`` say what was read. Bad input raises one
    ``InputError`` line naming the file (argument ``path``, or ``k`` for the draft length)."""
    from specmoe.formats.engine_metrics import _read_text

    name = os.fspath(path)
    text = _read_text(path)
    head = text.lstrip()[:1]
    if head == "{" and ACCEPTANCE_FORMAT in text[:4096]:
        from specmoe._io import parse_json

        obj = parse_json(text, name, argument="path")
        if isinstance(obj, dict) and obj.get("format") == ACCEPTANCE_FORMAT:
            return acceptance_from_json(obj, name)
    from specmoe.formats.engine_metrics import estimate_from_files

    return estimate_from_files([path], k=k, confidence=confidence)
