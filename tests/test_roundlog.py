"""The round-log format: writer, reader, validation, per-round arithmetic, synthetic logs."""

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specmoe.errors import InputError
from specmoe.formats.roundlog import (
    COLUMNS,
    RoundLogWriter,
    leading_match,
    pass_stats,
    read_round_log,
    write_round_log,
)
from specmoe.oracle.synthetic import synthetic_round_log


def _round(rng, k, *, run="r", prompt="p0", rnd=0, layers=2, top_k=2, n_exp=8, acc=None):
    routing = np.stack(
        [
            np.stack([rng.choice(n_exp, top_k, replace=False) for _ in range(layers)])
            for _ in range(k + 1)
        ]
    )
    target = rng.integers(0, 100, k + 1)
    acc = int(rng.integers(0, k + 1)) if acc is None else acc
    draft = target[:k].copy()
    if acc < k:
        draft[acc] = (draft[acc] + 1) % 100
    return dict(
        run_id=run,
        prompt_id=prompt,
        round=rnd,
        k=k,
        accepted=acc,
        t_verify_ms=5.0 + k,
        t_draft_ms=0.5 * k,
        context_len=100 + rnd,
        routing=routing,
        draft_tokens=draft,
        target_tokens=target,
        category="code",
        kernel="slot",
        drafter="eagle",
    )


@pytest.fixture(scope="module")
def small_log():
    return synthetic_round_log(budgets=(0, 2, 4), n_prompts=4, tokens=30, seed=3)


# ---------------------------------------------------------------------------------------------
# per-round arithmetic against brute force


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 3), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_pass_stats_brute_force(p, layers, top_k, seed):
    rng = np.random.default_rng(seed)
    n_exp = top_k + int(rng.integers(0, 6))
    routing = np.stack(
        [
            np.stack([rng.choice(n_exp, top_k, replace=False) for _ in range(layers)])
            for _ in range(p)
        ]
    )
    u, e = pass_stats(routing, n_exp)
    want_u = np.mean([len(set(routing[:, layer].ravel())) for layer in range(layers)])
    want_e = max(max(Counter(routing[:, layer].ravel()).values()) for layer in range(layers))
    assert u == pytest.approx(want_u) and e == want_e


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 2), max_size=5), st.integers(0, 2)),
        min_size=1,
        max_size=6,
    )
)
def test_leading_match_brute_force(rounds):
    drafts, targets = [], []
    for draft, extra in rounds:
        drafts.append(np.array(draft, np.int32))
        targets.append(np.random.default_rng(extra).integers(0, 3, len(draft) + 1))
    d_off = np.concatenate([[0], np.cumsum([len(d) for d in drafts])])
    t_off = np.concatenate([[0], np.cumsum([len(t) for t in targets])])
    got = leading_match(np.concatenate(drafts), d_off, np.concatenate(targets), t_off)
    for g, d, t in zip(got, drafts, targets):
        n = 0
        while n < len(d) and d[n] == t[n]:
            n += 1
        assert g == n


# ---------------------------------------------------------------------------------------------
# writer and reader


def test_writer_round_trip_and_derived_columns(tmp_path):
    rng = np.random.default_rng(0)
    rounds = [_round(rng, k, rnd=i) for i, k in enumerate([0, 1, 3, 2, 3])]
    with RoundLogWriter(tmp_path / "run", flush_every=2) as w:
        for r in rounds:
            w.append(**r)
    parts = sorted((tmp_path / "run").glob("part-*.parquet"))
    assert len(parts) == 3  # 2 + 2 + 1 rounds
    log = read_round_log(tmp_path / "run")
    assert len(log) == 5
    for i, r in enumerate(rounds):
        assert log["pass_size"][i] == r["k"] + 1 and log["emitted"][i] == r["accepted"] + 1
        assert log["generation_id"][i] == "r/p0"
        np.testing.assert_array_equal(log.routing_of(i), r["routing"])
        np.testing.assert_array_equal(log.list_of("draft_tokens", i), r["draft_tokens"])
        u, e = pass_stats(r["routing"], 8)
        assert log["u_mean"][i] == pytest.approx(u) and log["e_max"][i] == e
    assert np.isnan(log["acceptance"]).all()  # optional column absent -> nulls


def test_writer_keeps_flushed_rounds_when_interrupted_marked_unfinished(tmp_path):
    from specmoe.formats.roundlog import read_parts

    rng = np.random.default_rng(1)
    with pytest.raises(RuntimeError), RoundLogWriter(tmp_path, flush_every=3) as w:
        for i in range(4):
            w.append(**_round(rng, 2, rnd=i))
        raise RuntimeError("engine crashed")
    # the context manager flushed the 4th round on the way out, its generation still open
    parts = read_parts(tmp_path)
    assert [p.path.name for p in parts] == ["part-000000.parquet", "part-000001.parquet"]
    assert all(p.open == ("r/p0",) and not p.ended for p in parts)
    (tmp_path / ".part-000009.parquet.tmp").write_bytes(b"half a file")  # ignored
    with pytest.raises(InputError, match="1 unfinished generation"):
        read_round_log(tmp_path)
    w2 = RoundLogWriter(tmp_path)  # a writer in the same folder continues the part numbering
    w2.append(**_round(rng, 2, prompt="p1", rnd=0))
    assert w2.flush().name == "part-000002.parquet"
    log = read_round_log(tmp_path)
    assert list(log["generation_id"]) == ["r/p1"]  # the unfinished one stays left out


def test_writer_rejects_unknown_and_missing_columns(tmp_path):
    w = RoundLogWriter(tmp_path)
    with pytest.raises(ValueError, match="unknown column"):
        w.append(**_round(np.random.default_rng(0), 1), bogus=1)
    with pytest.raises(ValueError, match="missing column"):
        w.append(run_id="r", prompt_id="p", k=1, accepted=0)


def test_synthetic_log_round_trip(tmp_path, small_log):
    write_round_log(small_log, tmp_path / "log.parquet")
    back = read_round_log(tmp_path / "log.parquet")
    assert set(back.data) == set(small_log.data)
    for c, v in small_log.data.items():
        if v.dtype == object:
            assert list(back[c]) == list(v), c
        else:
            np.testing.assert_allclose(back[c].astype(float), v.astype(float), err_msg=c)
    for c, (vals, off) in small_log.lists.items():
        np.testing.assert_array_equal(back.lists[c][0], vals)
        np.testing.assert_array_equal(back.lists[c][1], off)


@pytest.mark.parametrize("slice_runs", [0, 1024])  # fancy indexing, then slices per run
def test_select_matches_per_round_lists(small_log, monkeypatch, slice_runs):
    import specmoe.formats.roundlog as rl

    monkeypatch.setattr(rl, "_SLICE_RUNS", slice_runs)
    for idx in (np.array([5, 0, 17, 3, 4, 5]), np.arange(10, 40), np.arange(len(small_log))[::3]):
        sub = small_log.select(idx)
        for j, i in enumerate(idx):
            for c in small_log.lists:
                np.testing.assert_array_equal(sub.list_of(c, j), small_log.list_of(c, i))
            assert sub["generation_id"][j] == small_log["generation_id"][i]
    assert len(small_log.select(np.zeros(len(small_log), bool))) == 0


def test_synthetic_log_is_consistent(small_log):
    log = small_log
    for r in range(0, len(log), 7):
        u, e = pass_stats(log.routing_of(r), 64)
        assert log["u_mean"][r] == pytest.approx(u) and log["e_max"][r] == e
    assert set(np.unique(log["k"])) == {0, 2, 4}
    # rounds of a generation advance the context by the tokens emitted
    for g in np.unique(log["generation_id"]):
        sel = np.flatnonzero(log["generation_id"] == g)
        ctx, em = log["context_len"][sel], log["emitted"][sel]
        np.testing.assert_array_equal(np.diff(ctx), em[:-1])
        np.testing.assert_array_equal(log["round"][sel], np.arange(len(sel)))


def test_synthetic_acceptance_matches_its_rate():
    log = synthetic_round_log(
        budgets=(1,), n_prompts=40, tokens=200, burst=0.0, categories={"x": 0.6}, seed=5
    )
    # at K = 1 a round accepts its one draft with probability a: binomial, 4 sigma
    acc = log["accepted"]
    assert abs(acc.mean() - 0.6) < 4 * np.sqrt(0.24 / len(acc))


# ---------------------------------------------------------------------------------------------
# reader errors: one line, naming the file


def _one_line(exc):
    assert "\n" not in str(exc)
    return str(exc)


def _table(rounds):
    cols = {c: [r.get(c) for r in rounds] for c in rounds[0]}
    return pa.table(cols)


def test_reader_errors(tmp_path):
    with pytest.raises(InputError) as e:
        read_round_log(tmp_path / "nope")
    assert "no such file" in _one_line(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no round-log parts"):
        read_round_log(tmp_path / "empty")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(InputError) as e:
        read_round_log(bad)
    assert "bad.parquet" in _one_line(e.value) and "Parquet" in str(e.value)
    pq.write_table(pa.table({"run_id": ["a"], "k": [1]}), tmp_path / "few.parquet")
    with pytest.raises(InputError) as e:
        read_round_log(tmp_path / "few.parquet")
    assert "few.parquet" in _one_line(e.value) and "t_verify_ms" in str(e.value)


def test_reader_rejects_empty_and_mistyped(tmp_path):
    schema = pa.schema(
        [
            pa.field(c, pa.string() if t == "string" else pa.float64())
            for c, (t, req) in COLUMNS.items()
            if req
        ]
    )
    pq.write_table(schema.empty_table(), tmp_path / "zero.parquet")
    with pytest.raises(InputError) as e:
        read_round_log(tmp_path / "zero.parquet")
    assert "empty round log" in _one_line(e.value)
    rng = np.random.default_rng(0)
    w = RoundLogWriter(tmp_path / "typed")
    w.append(**_round(rng, 2))
    w.flush()
    t = pq.read_table(tmp_path / "typed" / "part-000000.parquet")
    t = t.set_column(t.column_names.index("k"), "k", pa.array(["two"]))
    pq.write_table(t, tmp_path / "typed" / "part-000000.parquet")
    with pytest.raises(InputError) as e:
        read_round_log(tmp_path / "typed")
    assert "'k'" in _one_line(e.value) and "int16" in str(e.value)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(accepted=3, k=2), "accepted outside 0..k"),
        (dict(emitted=5), "emitted != accepted + 1"),
        (dict(pass_size=7), "pass_size != k + 1"),
        (dict(t_verify_ms=-1.0), "t_verify_ms not positive"),
        (dict(accepted=0), "leading match"),
    ],
)
def test_reader_checks_invariants(tmp_path, change, message):
    rng = np.random.default_rng(2)
    r = _round(rng, 2, acc=2)
    r.update(change)
    w = RoundLogWriter(tmp_path)
    w.append(**r)
    w.flush()
    with pytest.raises(InputError) as e:
        read_round_log(tmp_path)
    assert message in _one_line(e.value) and "'r/p0'" in str(e.value)


# ---------------------------------------------------------------------------------------------
# readers that cannot be lied to: keys, ranges, unfinished and truncated generations


def _gen_log(tmp_path, rounds=4, *, run="r", prompt="p0", **change):
    rng = np.random.default_rng(7)
    w = RoundLogWriter(tmp_path)
    for i in range(rounds):
        r = _round(rng, 2, run=run, prompt=prompt, rnd=i, acc=2)
        r["context_len"] = 100 + 3 * i
        if i == rounds - 1:
            r.update(change)
        w.append(**r)
    w.close()
    return tmp_path


def _refused(path, *needles):
    with pytest.raises(InputError) as e:
        read_round_log(path)
    msg = _one_line(e.value)
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def test_a_doubled_log_is_refused_naming_the_copy_the_row_and_the_field(tmp_path):
    import shutil

    log = _gen_log(tmp_path / "log")
    shutil.copy(log / "part-000000.parquet", log / "part-000001.parquet")
    _refused(log, "part-000001.parquet", "row 0", "round", "'r/p0'", "duplicate")


@pytest.mark.parametrize(
    "change, needles",
    [
        (dict(u_mean=1e300), ("u_mean",)),
        (dict(u_mean=float("inf")), ("u_mean",)),
        (dict(t_verify_ms=1e300), ("t_verify_ms",)),
        (dict(t_verify_ms=float("inf")), ("t_verify_ms",)),
        (dict(t_draft_ms=float("inf")), ("t_draft_ms",)),
        (dict(t_draft_ms=-1.0), ("t_draft_ms",)),
        (dict(acceptance=1.5), ("acceptance",)),
        (dict(kv_usage=2.0), ("kv_usage",)),
        (dict(e_max=9), ("e_max",)),
        (dict(context_len=-5), ("context_len",)),
    ],
)
def test_reader_refuses_out_of_range_values(tmp_path, change, needles):
    _refused(_gen_log(tmp_path / "log", **change), "part-000000.parquet", "row 3", *needles)


def _routing(value_at):
    r = np.tile(np.arange(2, dtype=np.int64), (3, 2, 1))  # [P=3, L=2, m=2] ids 0, 1
    for idx, v in value_at.items():
        r[idx] = v
    return r


@pytest.mark.parametrize(
    "routing, what",
    [
        (_routing({(1, 0, 1): 8}), "outside [0, 8)"),
        (_routing({(2, 1, 0): -1}), "outside [0, 8)"),
        (_routing({(0, 1, 1): 0}), "repeated"),
    ],
)
def test_reader_refuses_bad_routing_ids(tmp_path, routing, what):
    _refused(
        _gen_log(tmp_path / "log", routing=routing, num_experts=8, u_mean=2.0, e_max=3),
        "part-000000.parquet",
        "row 3",
        "routing",
        what,
    )


def test_reader_refuses_a_generation_with_a_missing_round(tmp_path):
    log = _gen_log(tmp_path / "log")
    t = pq.read_table(log / "part-000000.parquet")
    pq.write_table(t.filter(pa.array([True, False, True, True])), log / "part-000000.parquet")
    _refused(log, "part-000000.parquet", "row 1", "round", "'r/p0'")


def test_an_unfinished_generation_is_not_read_as_finished(tmp_path):
    rng = np.random.default_rng(1)
    with pytest.raises(RuntimeError), RoundLogWriter(tmp_path, flush_every=3) as w:
        for i in range(4):
            w.append(**_round(rng, 2, prompt="done", rnd=i))
        w.end_generation("r/done")
        for i in range(5):
            w.append(**_round(rng, 2, prompt="cut", rnd=i))
        raise RuntimeError("engine crashed")
    log = read_round_log(tmp_path)
    assert set(log["generation_id"]) == {"r/done"} and len(log) == 4
    # a hard stop (no exit handler at all) leaves the same: only the ended generation
    w = RoundLogWriter(tmp_path / "hard", flush_every=2)
    for i in range(3):
        w.append(**_round(rng, 2, prompt="done", rnd=i))
    w.end_generation("r/done")
    for i in range(5):
        w.append(**_round(rng, 2, prompt="cut", rnd=i))  # flushed in part, never ended
    assert set(read_round_log(tmp_path / "hard")["generation_id"]) == {"r/done"}


def test_a_truncated_generation_is_refused(tmp_path):
    rng = np.random.default_rng(3)
    w = RoundLogWriter(tmp_path / "log")
    for i in range(4):
        w.append(**_round(rng, 2, rnd=i, acc=2))
    w.end_generation("r/p0", tokens=12, rounds=4)
    w.flush()
    assert len(read_round_log(tmp_path / "log")) == 4
    t = pq.read_table(tmp_path / "log" / "part-000000.parquet")
    pq.write_table(t.slice(0, 3), tmp_path / "log" / "part-000000.parquet")  # metadata kept
    _refused(tmp_path / "log", "part-000000.parquet", "'r/p0'", "truncated")
