"""The round log: one row per verification round of a speculative run.

Legend for shapes: ``R`` rounds, ``P`` pass size (k + 1 positions), ``L`` MoE layers, ``m`` slots
(experts per token), ``N`` experts per layer.

On disk a round log is Parquet: a file, or a directory of part files (``part-000000.parquet``,
...) read back in sorted path order as one table. :class:`RoundLogWriter` appends rounds and
writes each batch of rounds as a new part, atomically. A directory of runs (one sub-directory
per run) reads as one log.

Finished and unfinished generations: each part the writer makes carries, in its Parquet
key-value metadata (key ``specmoe.roundlog``, JSON), ``open``: the generations of its rows not
yet ended when it was written, and ``ended``: the generations that ended with it, each with
what the writer was told of it (``tokens``: the tokens it emitted, ``rounds``: its rounds, ...).
A reader keeps a generation that some part ended and leaves out the rows of one that parts
list as open and none ended (an interrupted generation, however it stopped). A part without
that key (older logs, other producers) holds finished generations.

Columns (:data:`COLUMNS`; the Arrow type, then whether a reader requires it):

``run_id`` string · ``prompt_id`` string · ``generation_id`` string (run and prompt, unique per
generation) · ``category`` string, null allowed · ``round`` int32, 0, 1, ... within the
generation · ``k`` int16, the drafts the round verified · ``budget`` int16, the draft budget
the run asked the drafter for (null allowed: then the budget is k); k <= budget, smaller when the
drafter proposed fewer (a prompt-lookup drafter with a short match, the token limit near the
end of a generation) · ``pass_size`` int16, k + 1 · ``accepted`` int16, drafts accepted, 0..k · ``emitted`` int16, accepted + 1 · ``t_verify_ms`` float64, the target's
verification pass T_T · ``t_draft_ms`` float64, the drafting time T_D (null: not timed) ·
``context_len`` int32, L, the tokens in context before the pass · ``u_mean`` float64, Ū_r, the
distinct experts of the pass averaged over MoE layers · ``e_max`` int32, the largest number of
the pass's tokens that one expert receives, over layers · ``kernel`` string · ``drafter``
string · ``acceptance`` float64, the target acceptance a of an oracle drafter (else null) ·
``kv_usage`` float64, KV-cache occupancy in [0, 1] (null allowed) · ``num_layers`` int16 (L) ·
``top_k`` int16 (m) · ``num_experts`` int32 (N).

Counterfactual columns (needed by the Oracle, optional elsewhere):

``routing`` list<int16>: the expert ids of the P verified positions, flattened ``[P, L, m]``
(position 0 is the round's current token, positions 1..k its drafts) · ``draft_tokens``
list<int32>, the k proposed tokens · ``target_tokens`` list<int32>, the k + 1 tokens the target
emits at the pass positions (greedy: its argmax; sampled: the accepted drafts, then its
correction or bonus token; later entries are informational) · ``draft_confidence``
list<float32>, the drafter's probability of each proposed token (optional).

Checked on read (:func:`validate`, each failure one line naming the file, its row and the
column): the keys (generation, round) are unique and each generation's rounds are 0, 1, ...
with none missing; an ended generation has the rounds and tokens its part records; counts and
times are finite and in range (``t_verify_ms`` in (0, 1e6], ``t_draft_ms`` in [0, 1e6],
``u_mean`` in [0, min(P·m, N)], ``e_max`` in 1..P, ``acceptance`` and ``kv_usage`` in [0, 1]);
routing ids lie in [0, N) with no id twice among a token's m slots. And ``accepted`` is the
leading-match length of ``draft_tokens`` against
``target_tokens``. So for any budget k' <= k the round would have accepted
``min(accepted, k')`` drafts, and its pass of k' + 1 tokens would have needed the union of the
experts of routing positions 0..k'.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specmoe._io import atomic_path
from specmoe.errors import InputError
from specmoe.formats.roundlog_checks import validate

__all__ = [
    "COLUMNS",
    "COUNTERFACTUAL",
    "Part",
    "RoundLog",
    "RoundLogWriter",
    "leading_match",
    "pass_stats",
    "read_parts",
    "read_round_log",
    "round_columns",
    "validate",
    "write_round_log",
]

# name -> (Arrow type, required by every reader)
COLUMNS: dict[str, tuple[str, bool]] = {
    "run_id": ("string", True),
    "prompt_id": ("string", True),
    "generation_id": ("string", True),
    "category": ("string", False),
    "round": ("int32", True),
    "k": ("int16", True),
    "budget": ("int16", False),
    "pass_size": ("int16", True),
    "accepted": ("int16", True),
    "emitted": ("int16", True),
    "t_verify_ms": ("float64", True),
    "t_draft_ms": ("float64", False),
    "context_len": ("int32", True),
    "u_mean": ("float64", True),
    "e_max": ("int32", False),
    "kernel": ("string", False),
    "drafter": ("string", False),
    "acceptance": ("float64", False),
    "kv_usage": ("float64", False),
    "num_layers": ("int16", False),
    "top_k": ("int16", False),
    "num_experts": ("int32", False),
    "routing": ("list<int16>", False),
    "draft_tokens": ("list<int32>", False),
    "target_tokens": ("list<int32>", False),
    "draft_confidence": ("list<float32>", False),
}
COUNTERFACTUAL = ("routing", "draft_tokens", "target_tokens", "num_layers", "top_k")
META_KEY = b"specmoe.roundlog"  # a part's generations: open and ended (JSON)
_SLICE_RUNS = 1024  # RoundLog.select copies list values run by run below this many runs


def _arrow_type(spec: str):
    import pyarrow as pa

    if spec.startswith("list<"):
        return pa.list_(_arrow_type(spec[5:-1]))
    return {
        "string": pa.string(),
        "int16": pa.int16(),
        "int32": pa.int32(),
        "float32": pa.float32(),
        "float64": pa.float64(),
    }[spec]


def arrow_schema(names: list[str] | None = None):
    """The canonical Arrow schema (of ``names``, default every column)."""
    import pyarrow as pa

    names = list(COLUMNS) if names is None else names
    return pa.schema([pa.field(n, _arrow_type(COLUMNS[n][0])) for n in names])


# ---------------------------------------------------------------------------------------------
# per-round arithmetic


def pass_stats(
    routing: np.ndarray, num_experts: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Ū and E_max of passes: ``routing`` [..., P, L, m] -> (u_mean [...], e_max [...]).

    Ū is the number of distinct experts among the P·m slots of a layer, averaged over layers;
    E_max is the largest count of the pass's tokens routed to one expert, over layers. A pass
    whose routing holds a negative id (-1: not recorded, as an engine that does not record
    routing fills it) has Ū NaN and E_max -1.
    """
    r = np.asarray(routing)
    *batch, p, n_layers, m = r.shape
    unrecorded = (r.reshape(-1, p * n_layers * m) < 0).any(-1)  # [B]
    if unrecorded.any():
        r = np.where(r < 0, 0, r)
    n = int(num_experts if num_experts is not None else (r.max(initial=-1) + 1))
    if unrecorded.any():
        n = max(n, 1)
    r = np.moveaxis(r.reshape(-1, p, n_layers, m), 2, 1).reshape(-1, p * m)  # [B·L, P·m]
    flat = (np.arange(r.shape[0])[:, None] * n + r).ravel()
    counts = np.bincount(flat, minlength=r.shape[0] * n).reshape(-1, n_layers, n)  # [B, L, N]
    u = (counts > 0).sum(-1).mean(-1)
    e = counts.max(axis=(-1, -2))
    if unrecorded.any():
        u, e = u.astype(np.float64), e.astype(np.int64)
        u[unrecorded], e[unrecorded] = np.nan, -1
    return u.reshape(batch), e.reshape(batch)


def leading_match(
    draft: np.ndarray, d_off: np.ndarray, target: np.ndarray, t_off: np.ndarray
) -> np.ndarray:
    """Per round, how many leading drafts equal the target's tokens, [R] (at most k)."""
    k = np.diff(d_off)
    rows = np.repeat(np.arange(len(k)), k)
    idx = np.arange(len(draft)) - np.repeat(d_off[:-1], k)
    ok = idx < (t_off[1:] - t_off[:-1])[rows]
    mism = ~ok
    mism[ok] = draft[ok] != target[(t_off[:-1][rows] + idx)[ok]]
    out = k.astype(np.int64).copy()
    first_rows, first = np.unique(rows[mism], return_index=True)
    out[first_rows] = idx[mism][first]
    return out


# ---------------------------------------------------------------------------------------------
# the in-memory log


@dataclass(frozen=True, eq=False)
class RoundLog:
    """Rounds as numpy arrays (validated by :func:`read_round_log`).

    ``data``: scalar columns, [R] each: integer columns int64; optional numeric columns float64
    with NaN for null; string columns object arrays with None for null.
    ``lists``: list columns as (values, offsets int64 [R+1]); a null list has length 0.
    ``parts``: ``(file, first row)`` of each part read, in row order (errors name the file and
    the row in it). ``ended``: generation id -> what its part records of it (``tokens``,
    ``rounds``, ...; only generations written with :meth:`RoundLogWriter.end_generation`).
    """

    data: dict[str, np.ndarray]
    lists: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    name: str = "round log"
    parts: tuple[tuple[str, int], ...] = ()
    ended: dict[str, dict[str, Any]] = field(default_factory=dict)

    def where(self, row: int) -> str:
        """``FILE: row N`` of a row (the log's name and the row when the parts are unknown)."""
        starts = [s for _, s in self.parts]
        if not starts:
            return f"{self.name}: row {row}"
        i = int(np.searchsorted(starts, row, side="right")) - 1
        return f"{self.parts[i][0]}: row {row - self.parts[i][1]}"

    @property
    def num_rounds(self) -> int:
        return len(self.data["k"])

    def __len__(self) -> int:
        return self.num_rounds

    def __getitem__(self, column: str) -> np.ndarray:
        return self.data[column]

    def has(self, column: str) -> bool:
        """Whether ``column`` is present with at least one non-null value."""
        if column in self.lists:
            return bool(len(self.lists[column][0]))
        v = self.data.get(column)
        if v is None:
            return False
        return bool(np.any(v != None) if v.dtype == object else np.any(~np.isnan(v)))  # noqa: E711

    def codes(self, column: str) -> tuple[np.ndarray, np.ndarray]:
        """(int codes [R], unique labels) of a string column; null is its own label ''."""
        v = np.array(["" if x is None else str(x) for x in self.data[column]], dtype=object)
        labels, codes = np.unique(v.astype(str), return_inverse=True)
        return codes.astype(np.int64), labels

    @property
    def budgets(self) -> np.ndarray:
        return np.unique(self.data["k"])

    def list_of(self, column: str, r: int) -> np.ndarray:
        values, off = self.lists[column]
        return values[off[r] : off[r + 1]]

    def routing_of(self, r: int) -> np.ndarray:
        """The routing of round r, [P, L, m]."""
        return self.list_of("routing", r).reshape(
            int(self.data["pass_size"][r]),
            int(self.data["num_layers"][r]),
            int(self.data["top_k"][r]),
        )

    def select(self, mask: np.ndarray) -> RoundLog:
        """The rounds where ``mask`` (bool [R] or indices) holds, in order."""
        idx = np.flatnonzero(mask) if np.asarray(mask).dtype == bool else np.asarray(mask)
        idx = idx.astype(np.int64)
        data = {c: v[idx] for c, v in self.data.items()}
        # runs of consecutive rounds are copied as slices, so selecting whole runs is cheap
        breaks = np.flatnonzero(np.diff(idx) != 1) + 1
        first = np.split(idx, breaks)
        lists = {}
        for c, (values, off) in self.lists.items():
            lengths = (off[1:] - off[:-1])[idx]
            new_off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            if len(first) <= _SLICE_RUNS:
                parts = [values[off[run[0]] : off[run[-1] + 1]] for run in first if len(run)]
                vals = np.concatenate(parts) if parts else values[:0]
            else:
                starts = off[:-1][idx]
                vals = values[np.repeat(starts - new_off[:-1], lengths) + np.arange(new_off[-1])]
            lists[c] = (vals, new_off)
        return RoundLog(data, lists, self.name)

    def to_arrow(self):
        import pyarrow as pa

        arrays, names = [], []
        for c, (spec, _) in COLUMNS.items():
            if c in self.lists:
                values, off = self.lists[c]
                vals = pa.array(values, type=_arrow_type(spec[5:-1]))
                arrays.append(pa.ListArray.from_arrays(pa.array(off, type=pa.int32()), vals))
            elif c in self.data:
                v = self.data[c]
                if spec == "string":
                    arrays.append(pa.array(list(v), type=pa.string()))
                else:
                    mask = np.isnan(v) if v.dtype.kind == "f" else None
                    if spec.startswith("int") and mask is not None:
                        v = np.where(mask, 0, v)
                    arrays.append(pa.array(v, mask=mask).cast(_arrow_type(spec)))
            else:
                continue
            names.append(c)
        return pa.Table.from_arrays(arrays, schema=arrow_schema(names))


def _from_arrow(table, name: str, parts=(), ended=None) -> RoundLog:
    import pyarrow.compute as pc

    data, lists = {}, {}
    for c in table.column_names:
        spec, required = COLUMNS[c]
        col = table.column(c).combine_chunks()
        if spec == "string":
            data[c] = np.array(col.to_pylist(), dtype=object)
        elif spec.startswith("list"):
            lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False)
            values = pc.list_flatten(col).to_numpy(zero_copy_only=False)
            lists[c] = (values, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        elif required and spec.startswith("int"):
            if col.null_count:
                row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
                where = RoundLog({}, {}, name, tuple(parts)).where(row)
                raise InputError(f"{where}: {c}: {col.null_count} null value(s)")
            data[c] = col.to_numpy(zero_copy_only=False).astype(np.int64)
        else:
            data[c] = pc.cast(col, "float64").to_numpy(zero_copy_only=False).astype(np.float64)
    return RoundLog(data, lists, name, tuple(parts), dict(ended or {}))


# ---------------------------------------------------------------------------------------------
# reading


def _parts(path: Path) -> list[Path]:
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_file():
        return [path]
    parts = sorted(p for p in path.rglob("*.parquet") if not p.name.startswith("."))
    if not parts:
        raise InputError(f"{path}: no round-log parts (*.parquet) found")
    return parts


@dataclass(frozen=True)
class Part:
    """A part file's generations, from its metadata: ``open`` (not ended when it was
    written), ``ended`` (id -> what was recorded of it); ``marked``: the part has the
    metadata (False: an older part, all of whose generations count as finished)."""

    path: Path
    open: tuple[str, ...] = ()
    ended: dict[str, dict[str, Any]] = field(default_factory=dict)
    marked: bool = False


def _part_meta(path: Path, metadata: Mapping[bytes, bytes] | None) -> Part:
    raw = (metadata or {}).get(META_KEY)
    if raw is None:
        return Part(path)
    try:
        meta = json.loads(raw)
        opened = tuple(str(g) for g in meta.get("open", []))
        ended = {str(g): dict(v) for g, v in dict(meta.get("ended", {})).items()}
    except (ValueError, TypeError, AttributeError, RecursionError):
        raise InputError(f"{path}: unreadable {META_KEY.decode()} metadata") from None
    return Part(path, opened, ended, True)


def read_parts(path: str | os.PathLike) -> list[Part]:
    """The parts of a round log (a file or a directory, recursively) and their generations,
    read from the metadata alone."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = []
    for p in _parts(Path(path)):
        try:
            out.append(_part_meta(p, pq.read_schema(p).metadata))
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(
                f"{p}: not a readable Parquet file ({str(exc).splitlines()[0]})"
            ) from None
    return out


def _read_part(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(
            f"{path}: not a readable Parquet file ({str(exc).splitlines()[0]})"
        ) from None
    part = _part_meta(path, table.schema.metadata)
    names = [c for c in table.column_names if c in COLUMNS]
    missing = [c for c, (_, req) in COLUMNS.items() if req and c not in names]
    if missing:
        raise InputError(f"{path}: missing round-log column(s) {', '.join(missing)}")
    cols = []
    for c in names:
        want = _arrow_type(COLUMNS[c][0])
        try:
            cols.append(table.column(c).cast(want))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise InputError(
                f"{path}: column {c!r} has type {table.column(c).type}, expected {COLUMNS[c][0]}"
            ) from None
    return pa.Table.from_arrays(cols, schema=arrow_schema(names)), part


def read_round_log(path: str | os.PathLike, *, check: bool = True) -> RoundLog:
    """Read a round log (a Parquet file or a directory of parts, recursively) and validate it.

    Every column of :data:`COLUMNS` is present in the result (an optional column absent from
    every part is all null). The rows of unfinished generations (open in a part, ended in
    none) are left out. Raises ``InputError`` naming the file for a missing or mistyped
    column, an empty log, or rounds that break the invariants (see :func:`validate`).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    path = Path(path)
    read = [_read_part(p) for p in _parts(path)]
    ended = {g: {**v, "file": str(pt.path)} for _, pt in read for g, v in pt.ended.items()}
    unfinished = {g for _, pt in read for g in pt.open} - set(ended)
    names = list(COLUMNS)  # a column absent from every part reads as all null
    full, parts, start = [], [], 0
    for t, pt in read:
        if unfinished and pt.marked:
            t = t.filter(
                pc.invert(
                    pc.is_in(t.column("generation_id"), pa.array(sorted(unfinished), pa.string()))
                )
            )
        cols = [
            t.column(c) if c in t.column_names else pa.nulls(t.num_rows, _arrow_type(COLUMNS[c][0]))
            for c in names
        ]
        full.append(pa.Table.from_arrays(cols, schema=arrow_schema(names)))
        parts.append((str(pt.path), start))
        start += t.num_rows
    table = pa.concat_tables(full)
    if table.num_rows == 0:
        left = f"; {len(unfinished)} unfinished generation(s) left out" if unfinished else ""
        raise InputError(f"{path}: empty round log (no rounds{left})")
    log = _from_arrow(table, str(path), parts, ended)
    if check:
        validate(log)
    return log


def write_round_log(log: RoundLog, path: str | os.PathLike) -> Path:
    """Write ``log`` as one Parquet file, atomically."""
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(log.to_arrow(), tmp)
    return Path(path)


# ---------------------------------------------------------------------------------------------
# writing, round by round


def round_columns(round_: Any) -> dict[str, Any]:
    """The round-log columns of a round result: its dataclass fields that are not None
    (tuples of tokens or confidences become list columns as they are)."""
    if not is_dataclass(round_):
        raise TypeError(f"round_columns: expected a dataclass, got {type(round_).__name__}")
    out = {}
    for f in fields(round_):
        v = getattr(round_, f.name)
        if v is not None:
            out[f.name] = v
    unknown = sorted(set(out) - set(COLUMNS))
    if unknown:
        raise ValueError(f"round_columns: fields that are no column: {', '.join(unknown)}")
    return out


class RoundLogWriter:
    """Append rounds; every ``flush_every`` rounds (None: only on :meth:`flush`) the buffered
    rounds become a new part file ``part-NNNNNN.parquet`` in ``directory``, written atomically
    (numbered on from the parts already there).

    ``append`` takes the columns by name. Derived columns may be left out: ``pass_size``
    (k + 1), ``emitted`` (accepted + 1), ``generation_id`` (``run_id/prompt_id``), and with a
    ``routing`` array of shape [P, L, m]: ``num_layers``, ``top_k``, ``u_mean``, ``e_max``.

    A generation is finished when :meth:`end_generation` says so, or at an explicit
    :meth:`flush` (also :meth:`close`, and the end of a ``with`` block without an exception).
    The parts written on the way (every ``flush_every`` rounds, or on leaving a ``with`` block
    by an exception) list it as open, and a reader leaves the rows of a generation that no part
    ended out: a writer stopped by an exception, a signal or a power cut never leaves an
    unfinished generation that reads as finished.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        flush_every: int | None = 256,
        defaults: Mapping[str, Any] | None = None,
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.flush_every = None if flush_every is None else int(flush_every)
        self.defaults = dict(defaults or {})
        self._rows: list[dict[str, Any]] = []
        self._open: dict[str, None] = {}  # generations with rows and no end, in order
        self._ended: dict[str, dict[str, Any]] = {}  # ended since the last flush
        done = [
            int(p.stem.split("-")[1])
            for p in self.directory.glob("part-*.parquet")
            if p.stem.split("-")[1].isdigit()
        ]
        self._next = max(done, default=-1) + 1
        self.rounds_written = 0

    def append(self, **fields: Any) -> None:
        row = {**self.defaults, **fields}
        unknown = sorted(set(row) - set(COLUMNS))
        if unknown:
            raise ValueError(f"RoundLogWriter.append: unknown column(s) {', '.join(unknown)}")
        row.setdefault("pass_size", int(row["k"]) + 1)
        row.setdefault("emitted", int(row["accepted"]) + 1)
        row.setdefault("generation_id", f"{row['run_id']}/{row['prompt_id']}")
        routing = row.get("routing")
        if routing is not None and np.ndim(routing) == 3:
            routing = np.asarray(routing)
            row.setdefault("num_layers", routing.shape[1])
            row.setdefault("top_k", routing.shape[2])
            if "u_mean" not in row or "e_max" not in row:
                u, e = pass_stats(routing)
                row.setdefault("u_mean", float(u))
                row.setdefault("e_max", int(e))
            row["routing"] = routing.ravel()
        missing = [c for c, (_, req) in COLUMNS.items() if req and c not in row]
        if missing:
            raise ValueError(f"RoundLogWriter.append: missing column(s) {', '.join(missing)}")
        self._rows.append(row)
        self._open.setdefault(str(row["generation_id"]), None)
        if self.flush_every is not None and len(self._rows) >= self.flush_every:
            self.flush(finished=False)

    def append_round(self, round_: Any, **columns: Any) -> None:
        """Append a round result: a dataclass whose fields are named as columns
        (:class:`specmoe.engine.speculative.Round`), plus ``columns`` (run_id, prompt_id, ...).

        This is the one conversion of a round to a row: every field, except those left at
        None, which stay out of the row (a column no round of a part has is absent from it, and
        reads as null); the derived columns follow as in :meth:`append`.
        """
        self.append(**{**columns, **round_columns(round_)})

    def end_generation(self, generation_id: str, **info: Any) -> None:
        """Mark ``generation_id`` finished; the next part written records it with ``info``
        (JSON values: ``tokens`` and ``rounds``, which a reader checks, and anything else a
        caller wants back from :func:`read_parts`)."""
        gid = str(generation_id)
        self._open.pop(gid, None)
        self._ended[gid] = json.loads(json.dumps(_jsonable(info)))

    def flush(self, *, finished: bool = True) -> Path | None:
        """Write the buffered rounds as a new part, recording the generations ended since the
        last part; return its path (None if there was nothing to write). ``finished``: every
        open generation ends here (False: they stay open)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if finished:
            for gid in list(self._open):
                self.end_generation(gid)
        if not self._rows and not self._ended:
            return None
        names = [c for c in COLUMNS if any(c in r for r in self._rows)] or [
            c for c, (_, req) in COLUMNS.items() if req
        ]
        cols = []
        for c in names:
            vals = [r.get(c) for r in self._rows]
            if COLUMNS[c][0].startswith("list"):
                vals = [None if v is None else np.asarray(v).tolist() for v in vals]
            cols.append(pa.array(vals, type=_arrow_type(COLUMNS[c][0])))
        in_part = {str(r["generation_id"]) for r in self._rows}
        meta = {
            "open": [g for g in self._open if g in in_part],
            "ended": self._ended,
        }
        schema = arrow_schema(names).with_metadata({META_KEY: json.dumps(meta).encode()})
        table = pa.Table.from_arrays(cols, schema=schema)
        path = self.directory / f"part-{self._next:06d}.parquet"
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp)
        self._next += 1
        self.rounds_written += len(self._rows)
        self._rows = []
        self._ended = {}
        return path

    close = flush

    def __enter__(self) -> RoundLogWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # after an exception the open generations stay open: rows kept, marked unfinished
        self.flush(finished=exc_type is None)


def _jsonable(obj: Any) -> Any:
    from specmoe._io import to_jsonable

    return to_jsonable(obj)
