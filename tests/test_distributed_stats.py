"""Shard statistics as Ray tasks: the merged answer equals the single-process one, bit for bit.

Every count is an integer sum over whole documents, and every shard holds whole documents, so
each shard's sums are exact sufficient statistics; the ratios (means, ū, ρ̄, overlap) and the
bootstrap are computed once, on the driver, from the merged integer sums. The float tolerance
of the means is therefore zero: the tests compare the JSON records and arrays exactly.
References: the single-process path, the whole trace loaded into memory as one shard, and
per-window Python sets (:func:`window_union_counts`).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specmoe.cli import main
from specmoe.errors import InputError
from specmoe.formats.trace import RoutingTrace, load_trace, open_trace, save_trace
from specmoe.routing.ipf import fit_document_moments, fit_moments
from specmoe.routing.stats import compute_stats, window_union_counts
from specmoe.routing.windows import DocumentSums, document_sums, merge_sums, shard_sums

N, L, M = 24, 3, 4
# uneven shards: one of a single short document, one of many, one long document
SHARD_DOCS = [[40, 7, 93], [12], [5, 30, 30, 8, 61], [150], [19, 3, 44]]
ARRAYS = ("lengths", "reuse", "union", "windows", "overlap", "pairs", "expert_counts")


def sticky_shard(rng, lengths, *, name: str) -> RoutingTrace:
    """Routing that keeps a previous set with probability 0.6 (so reuse is far from uniform)."""
    T = int(sum(lengths))
    ex = np.empty((T, L, M), np.int64)
    for t in range(T):
        for layer in range(L):
            if t and rng.random() < 0.6:
                ex[t, layer] = ex[t - 1, layer]
            else:
                ex[t, layer] = rng.choice(N, M, replace=False)
    off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    docs = [f"{name}-doc{i}" for i in range(len(lengths))]
    return RoutingTrace(
        experts=ex, doc_offsets=off, num_experts=N, meta={"documents": docs, "model": "toy"}
    )


@pytest.fixture(scope="module")
def shards() -> list[RoutingTrace]:
    rng = np.random.default_rng(17)
    return [sticky_shard(rng, docs, name=f"s{i}") for i, docs in enumerate(SHARD_DOCS)]


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory, shards) -> Path:
    d = tmp_path_factory.mktemp("shards")
    for i, tr in enumerate(shards):
        save_trace(tr, d / f"shard-{i:05d}.npz")
    return d


@pytest.fixture(scope="module")
def executor(ray_runtime):
    from specmoe.distributed.ray_runtime import RayShardExecutor

    return RayShardExecutor()


def assert_sums_equal(a: DocumentSums, b: DocumentSums) -> None:
    for key in ARRAYS:
        x, y = getattr(a, key), getattr(b, key)
        assert x.dtype == y.dtype and np.array_equal(x, y), key
    if a.doc_expert_counts is None:
        assert b.doc_expert_counts is None
    else:
        assert np.array_equal(a.doc_expert_counts, b.doc_expert_counts)
    assert (a.num_experts, a.top_k, a.layers, a.max_n, a.max_lag, a.aligned) == (
        b.num_experts,
        b.top_k,
        b.layers,
        b.max_n,
        b.max_lag,
        b.aligned,
    )


def record(stats) -> str:
    return json.dumps(stats.to_dict(), sort_keys=True)


# ------------------------------------------------------------------------------------------
# the merge, without Ray


def test_shard_sums_merge_to_the_sums_of_the_whole_trace_in_memory(shard_dir, shards):
    whole = load_trace(shard_dir)  # one RoutingTrace: one shard
    for aligned in (False, True):
        ref = shard_sums(whole, max_n=6, max_lag=5, aligned=aligned, per_document_counts=True)
        parts = [
            shard_sums(tr, max_n=6, max_lag=5, aligned=aligned, per_document_counts=True)
            for tr in shards
        ]
        assert_sums_equal(merge_sums(parts), ref)
        streamed = document_sums(
            open_trace(shard_dir), max_n=6, max_lag=5, aligned=aligned, per_document_counts=True
        )
        assert_sums_equal(streamed, ref)
        # pooled: one row of totals per shard, added up; lengths stay per document
        pooled = merge_sums(
            [shard_sums(tr, max_n=6, max_lag=5, aligned=aligned, pooled=True) for tr in shards]
        )
        assert pooled.pooled and np.array_equal(pooled.lengths, ref.lengths)
        assert np.array_equal(pooled.expert_counts, ref.expert_counts)
        for key in ("reuse", "union", "windows", "overlap", "pairs"):
            want = getattr(ref, key).sum(axis=0, keepdims=True)
            assert np.array_equal(getattr(pooled, key), want), key


def test_merged_union_sums_equal_per_window_sets(shards):
    parts = [shard_sums(tr, max_n=5, max_lag=2) for tr in shards]
    merged = merge_sums(parts)
    for n in range(1, 6):
        ref = sum(
            window_union_counts(doc, n, num_experts=N).sum(axis=0, dtype=np.int64)
            for tr in shards
            for doc in tr.documents()
        )
        assert np.array_equal(merged.union.sum(axis=0)[:, n - 1], ref)


partitions = st.lists(st.integers(0, 3), min_size=len(SHARD_DOCS), max_size=len(SHARD_DOCS))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(labels=partitions, cuts=st.sets(st.integers(1, len(SHARD_DOCS) - 1)))
def test_merge_is_associative_over_random_partitions(shards, labels, cuts):
    parts = [shard_sums(tr, max_n=4, max_lag=3, per_document_counts=True) for tr in shards]
    flat = merge_sums(parts)
    # contiguous groups (shard order kept): merging the merged groups is the flat merge, exactly
    bounds = [0, *sorted(cuts), len(parts)]
    grouped = merge_sums([merge_sums(parts[a:b]) for a, b in itertools.pairwise(bounds)])
    assert_sums_equal(grouped, flat)
    # any grouping in any order: the pooled counts (every point estimate's inputs) agree
    groups = [[p for p, g in zip(parts, labels) if g == k] for k in sorted(set(labels))]
    shuffled = merge_sums([merge_sums(g) for g in reversed(groups)])
    for key in ("reuse", "union", "windows", "overlap", "pairs", "doc_expert_counts"):
        assert np.array_equal(getattr(shuffled, key).sum(axis=0), getattr(flat, key).sum(axis=0))
    assert np.array_equal(shuffled.expert_counts, flat.expert_counts)
    assert sorted(shuffled.lengths.tolist()) == sorted(flat.lengths.tolist())


def test_merge_refuses_parts_of_other_settings(shards):
    a = shard_sums(shards[0], max_n=4, max_lag=3)
    with pytest.raises(InputError, match=r"parts: part 1 has max_n=5 but part 0 has max_n=4"):
        merge_sums([a, shard_sums(shards[1], max_n=5, max_lag=3)])
    with pytest.raises(InputError, match="per_document_counts"):
        merge_sums([a, shard_sums(shards[1], max_n=4, max_lag=3, per_document_counts=True)])
    with pytest.raises(InputError, match="parts: no sums"):
        merge_sums([])
    with pytest.raises(InputError, match="parts: part 1 has pooled=True"):
        merge_sums([a, shard_sums(shards[1], max_n=4, max_lag=3, pooled=True)])
    with pytest.raises(InputError, match="pooled: pooled sums keep no per-document counts"):
        shard_sums(shards[0], max_n=4, max_lag=3, pooled=True, per_document_counts=True)


def test_a_document_may_not_span_shards(tmp_path, shards):
    """Shards hold whole documents: a document named in two shards is refused at opening,
    before any shard is summed (it would be counted twice, or cut at a shard edge)."""
    save_trace(shards[0], tmp_path / "shard-00000.npz")
    split = shards[1].meta | {"documents": [shards[0].meta["documents"][0]]}
    save_trace(
        RoutingTrace(
            experts=shards[1].experts, doc_offsets=shards[1].doc_offsets, num_experts=N, meta=split
        ),
        tmp_path / "shard-00001.npz",
    )
    with pytest.raises(InputError, match="is also in"):
        open_trace(tmp_path)


# ------------------------------------------------------------------------------------------
# on a local Ray runtime of 2 CPUs


def test_ray_sums_equal_single_process_bit_for_bit(shard_dir, executor):
    reader = open_trace(shard_dir)
    for kw in ({"max_n": 6, "max_lag": 5}, {"max_n": 3, "max_lag": 0, "aligned": True}):
        ref = document_sums(reader, per_document_counts=True, **kw)
        got = document_sums(reader, per_document_counts=True, executor=executor, **kw)
        assert_sums_equal(got, ref)
        ref = document_sums(reader, pooled=True, **kw)
        got = document_sums(reader, pooled=True, executor=executor, **kw)
        assert_sums_equal(got, ref)
        assert got.pooled and got.reuse.shape[0] == 1


def test_ray_stats_and_bootstrap_equal_single_process(shard_dir, executor):
    reader = open_trace(shard_dir)
    seen: list[tuple[int, int]] = []
    ref = compute_stats(reader, max_n=7, bootstrap=64, seed=3)
    got = compute_stats(
        reader,
        max_n=7,
        bootstrap=64,
        seed=3,
        executor=executor,
        progress=lambda d, t: seen.append((d, t)),
    )
    assert record(got) == record(ref)
    assert seen == [(i, len(SHARD_DOCS)) for i in range(1, len(SHARD_DOCS) + 1)]
    assert got.tokens == sum(map(sum, SHARD_DOCS))
    assert got.documents == sum(map(len, SHARD_DOCS))
    # the intervals are there and not degenerate, and the seed matters: equality is not vacuous
    iv = got.intervals
    assert iv is not None and iv.resamples == 64 and iv.seed == 3
    assert np.all(iv.u_bar.lo[1:] < iv.u_bar.hi[1:])  # ū(1) = 1 in every resample
    assert np.all(iv.rho_mean.lo[1:] < iv.rho_mean.hi[1:])
    other = compute_stats(reader, max_n=7, bootstrap=64, seed=4, executor=executor)
    assert record(other) != record(ref)
    assert record(other) == record(compute_stats(reader, max_n=7, bootstrap=64, seed=4))


class SpyExecutor:
    """The Ray executor, keeping what each task was asked for and what it returned."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def map_files(self, func, files, kwargs, progress=None):
        out = self.inner.map_files(func, files, kwargs, progress)
        self.calls.append((func.__name__, dict(kwargs), out))
        return out


def test_the_bootstrap_sums_per_document_on_the_workers(shard_dir, executor):
    """With the bootstrap, each task returns its shard's per-document rows (expert counts, window
    and pair sums); the driver only stacks them and resamples. Without it, pooled totals."""
    reader = open_trace(shard_dir)
    spy = SpyExecutor(executor)
    compute_stats(reader, max_n=5, bootstrap=16, seed=1, executor=spy)
    ((name, kw, parts),) = spy.calls
    assert name == "shard_sums" and kw["per_document_counts"] and not kw["pooled"]
    for part, docs in zip(parts, SHARD_DOCS):
        assert part.doc_expert_counts.shape == (len(docs), L, N)
        assert part.reuse.shape[0] == part.windows.shape[0] == len(docs)
        assert part.doc_expert_counts.sum() == sum(docs) * L * M
    spy.calls.clear()
    compute_stats(reader, max_n=5, executor=spy)
    ((_, kw, parts),) = spy.calls
    assert kw["pooled"] and not kw["per_document_counts"]
    assert all(p.doc_expert_counts is None and p.reuse.shape[0] == 1 for p in parts)


def test_ray_ipf_moments_equal_single_process(shard_dir, executor):
    reader = open_trace(shard_dir)
    ref, got = fit_moments(reader, max_lag=4), fit_moments(reader, max_lag=4, executor=executor)
    for key in ("popularity", "coactivation", "union"):
        assert np.array_equal(getattr(got, key), getattr(ref, key)), key
    assert got.tokens == ref.tokens and got.meta == ref.meta
    docs_ref = fit_document_moments(reader, max_lag=4)
    docs_got = fit_document_moments(reader, max_lag=4, executor=executor)
    assert [d.meta for d in docs_got] == [d.meta for d in docs_ref]
    for a, b in zip(docs_got, docs_ref):
        assert np.array_equal(a.coactivation, b.coactivation)
        assert np.array_equal(a.popularity, b.popularity)


def test_a_bad_shard_reads_the_same_error_on_ray(tmp_path, shards, executor):
    for i, tr in enumerate(shards[:2]):
        save_trace(tr, tmp_path / f"shard-{i:05d}.npz")
    bad = tmp_path / "shard-00001.npz"
    with np.load(bad) as z:
        arrays = dict(z)
    arrays["experts"] = arrays["experts"].copy()
    arrays["experts"][3, 0, 0] = N + 5  # an id out of range: only a full read sees it
    np.savez_compressed(bad, **arrays)
    reader = open_trace(tmp_path)
    with pytest.raises(InputError) as ref:
        compute_stats(reader, max_n=3)
    with pytest.raises(InputError) as got:
        compute_stats(reader, max_n=3, executor=executor)
    assert str(got.value) == str(ref.value) and "outside [0, 24)" in str(ref.value)


# ------------------------------------------------------------------------------------------
# the CLI


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_stats_ray_output_equals_plain(shard_dir, ray_runtime, capsys, tmp_path):
    base = [str(shard_dir), "--max-n", "6", "--bootstrap", "40", "--json"]
    code, plain, _ = run_cli(capsys, "stats", *base)
    assert code == 0
    code, ray_out, err = run_cli(capsys, "stats", *base, "--ray")
    assert code == 0 and ray_out == plain
    assert "Ray runtime" in err
    code, text_plain, _ = run_cli(capsys, "stats", str(shard_dir))
    code2, text_ray, _ = run_cli(capsys, "stats", str(shard_dir), "--ray=auto")
    assert (code, code2) == (0, 0) and text_ray == text_plain


def test_cli_ipf_and_synth_ray_output_equals_plain(shard_dir, ray_runtime, capsys, tmp_path):
    base = ["ipf", str(shard_dir), "--max-n", "4", "--bins", "2", "--json"]
    assert run_cli(capsys, *base)[:2] == run_cli(capsys, *base, "--ray")[:2]
    outs = []
    for extra in ([], ["--ray"]):
        out = tmp_path / f"syn{len(extra)}.npz"
        stats = tmp_path / f"syn{len(extra)}.json"
        argv = ["synth", "--from", str(shard_dir), "--tokens", "200", "--max-lag", "3"]
        argv += ["--out", str(out), "--save-stats", str(stats), "--json", *extra]
        code, text, _ = run_cli(capsys, *argv)
        assert code == 0
        rec = json.loads(text)
        rec.pop("out")
        outs.append((rec, stats.read_text(), load_trace(out).experts))
    assert outs[0][0] == outs[1][0] and outs[0][1] == outs[1][1]
    assert np.array_equal(outs[0][2], outs[1][2])


def test_cli_ray_flag_errors(shard_dir, capsys, monkeypatch):
    code, _, err = run_cli(capsys, "stats", str(shard_dir), "--ray-cpus", "2")
    assert code == 2 and "--ray-cpus: needs --ray" in err
    code, _, err = run_cli(capsys, "stats", str(shard_dir), "--ray", "--ray-cpus", "0")
    assert code == 2 and "--ray-cpus: must be >= 1, got 0" in err
    code, _, err = run_cli(capsys, "stats", str(shard_dir), "--ray=10.0.0.1:1", "--ray-cpus", "2")
    assert code == 2 and "--ray-cpus: only for a local runtime" in err
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # Ray not installed
    code, _, err = run_cli(capsys, "stats", str(shard_dir), "--ray")
    assert code == 2 and "--ray: needs Ray, which is not installed" in err
    assert "specmoe[ray]" in err


def test_an_address_that_answers_nothing_is_refused_at_once():
    from specmoe.distributed.ray_runtime import _probe

    with pytest.raises(InputError, match=r"ray: no Ray cluster answers at '127.0.0.1:1'"):
        _probe("127.0.0.1:1", "ray")
    _probe("auto", "ray")  # not host:port: Ray's to read


@pytest.mark.slow
def test_cli_stats_ray_starts_its_own_local_runtime(shard_dir, tmp_path):
    """A fresh process: --ray starts a local runtime of --ray-cpus CPUs and shuts it down;
    stdout holds the JSON record alone, the same as without --ray."""
    import subprocess
    import sys

    pytest.importorskip("ray")
    code = "import sys; from specmoe.cli import main; sys.exit(main())"
    base = [sys.executable, "-c", code, "stats", str(shard_dir), "--bootstrap", "20", "--json"]
    plain = subprocess.run(base, capture_output=True, text=True, check=True)
    ray = subprocess.run([*base, "--ray", "--ray-cpus", "1"], capture_output=True, text=True)
    assert ray.returncode == 0, ray.stderr[-2000:]
    assert ray.stdout == plain.stdout
    assert "Ray runtime local with 1 CPUs" in ray.stderr
