"""The canonical routing trace: round trips, shards, views, and every validation rule."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specmoe.errors import InputError
from specmoe.formats import trace as trace_mod
from specmoe.formats.trace import RoutingTrace, load_trace, open_trace, save_trace


def random_experts(rng, t, layers, m, n):
    """[t, layers, m] distinct ids per token and layer (the first m of a random permutation)."""
    return rng.random((t, layers, n)).argsort(axis=-1)[..., :m]


def make_trace(rng, lengths=(3, 5, 2), n_layers=3, m=2, n=8, *, weights=None, **meta):
    t = sum(lengths)
    w = None if weights is None else rng.random((t, n_layers, m)).astype(weights)
    return RoutingTrace(
        experts=random_experts(rng, t, n_layers, m, n),
        doc_offsets=np.concatenate([[0], np.cumsum(lengths)]),
        num_experts=n,
        weights=w,
        meta=meta,
    )


def write_npz(path, **arrays):
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def good_arrays(rng, **over):
    arrays = {
        "experts": random_experts(rng, 6, 2, 2, 8).astype(np.int16),
        "doc_offsets": np.array([0, 4, 6]),
        "meta": np.array(json.dumps({"num_experts": 8})),
    }
    arrays.update(over)
    return {k: v for k, v in arrays.items() if v is not None}


def assert_one_line_error(path, exc_info, *needles):
    msg = str(exc_info.value)
    assert type(exc_info.value) is InputError
    assert msg.startswith(str(path)), msg
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


# ------------------------------------------------------------------------------------------
# round trips


@pytest.mark.parametrize("weights", [None, "float32", "float16", "float64"])
@pytest.mark.parametrize("compress", [True, False])
def test_round_trip_is_exact(tmp_path, weights, compress):
    rng = np.random.default_rng(1)
    tr = make_trace(
        rng,
        weights=weights,
        model="olmoe",
        source="capture",
        documents=["a", "b", "c"],
        layers=[1, 4, 7],
        extra={"k": [1, 2]},
    )
    path = save_trace(tr, tmp_path / "t.npz", compress=compress)
    back = load_trace(path)
    np.testing.assert_array_equal(back.experts, tr.experts)
    assert back.experts.dtype == np.int16
    np.testing.assert_array_equal(back.doc_offsets, [0, 3, 8, 10])
    assert back.doc_offsets.dtype == np.int64
    if weights is None:
        assert back.weights is None
    else:
        assert back.weights.dtype == np.dtype(weights)
        np.testing.assert_array_equal(back.weights, tr.weights)
    assert back.meta == {
        "model": "olmoe",
        "source": "capture",
        "documents": ["a", "b", "c"],
        "layers": [1, 4, 7],
        "extra": {"k": [1, 2]},
        "num_experts": 8,
    }
    assert back.layers == [1, 4, 7]
    assert (back.num_tokens, back.num_layers, back.top_k, back.num_documents) == (10, 3, 2, 3)
    assert [d.shape[0] for d in back.documents()] == [3, 5, 2]


def test_compressed_file_is_smaller_and_wide_ids_use_int32(tmp_path):
    rng = np.random.default_rng(2)
    tr = make_trace(rng, lengths=(400,), n=8)
    a = save_trace(tr, tmp_path / "a.npz", compress=True).stat().st_size
    b = save_trace(tr, tmp_path / "b.npz", compress=False).stat().st_size
    assert a < b
    wide = RoutingTrace(
        experts=np.array([[[40000, 3]]]), doc_offsets=np.array([0, 1]), num_experts=40001
    )
    back = load_trace(save_trace(wide, tmp_path / "w.npz"))
    assert back.experts.dtype == np.int32 and back.experts[0, 0, 0] == 40000


def test_numpy_values_in_meta_are_saved_as_json(tmp_path):
    rng = np.random.default_rng(3)
    tr = make_trace(rng, n_layers=2, model="m", layers_np=np.arange(2), seed=np.int64(4))
    back = load_trace(save_trace(tr, tmp_path / "t.npz"))
    assert back.meta["layers_np"] == [0, 1] and back.meta["seed"] == 4


# ------------------------------------------------------------------------------------------
# shard directories


def save_shards(tmp_path, rng, count=3):
    shards = [
        make_trace(rng, lengths=(2 + i, 3), documents=[f"s{i}a", f"s{i}b"]) for i in range(count)
    ]
    d = tmp_path / "shards"
    for i, s in enumerate(shards):
        save_trace(s, d / f"part-{i:03d}.npz")
    return d, shards


def test_shard_directory_reads_as_one_trace(tmp_path):
    rng = np.random.default_rng(4)
    d, shards = save_shards(tmp_path, rng)
    (d / "notes.txt").write_text("ignored")
    (d / ".part-999.npz.tmp").write_bytes(b"half a file")
    tr = load_trace(d)
    np.testing.assert_array_equal(tr.experts, np.concatenate([s.experts for s in shards]))
    lengths = [n for s in shards for n in np.diff(s.doc_offsets)]
    np.testing.assert_array_equal(tr.doc_offsets, np.concatenate([[0], np.cumsum(lengths)]))
    assert tr.meta["documents"] == ["s0a", "s0b", "s1a", "s1b", "s2a", "s2b"]
    reader = open_trace(d)
    assert (reader.num_experts, reader.num_layers, reader.top_k) == (8, 3, 2)
    assert [p.name for p in reader.files] == ["part-000.npz", "part-001.npz", "part-002.npz"]


def test_longest_document_reads_the_offsets_of_every_shard(tmp_path):
    rng = np.random.default_rng(6)
    d, shards = save_shards(tmp_path, rng)
    want = max(int(np.diff(s.doc_offsets).max()) for s in shards)
    assert open_trace(d).longest_document() == want
    reader = open_trace(d)
    reader.files[-1].write_bytes(b"not an npz")  # a corrupt shard: unknown, not an exception
    assert reader.longest_document() is None


def test_iter_shards_is_lazy(tmp_path):
    rng = np.random.default_rng(5)
    d, shards = save_shards(tmp_path, rng)
    reader = open_trace(d)
    (d / "part-002.npz").write_bytes(b"corrupted after opening")
    it = reader.iter_shards()
    for want in shards[:2]:  # the first shards arrive before the broken one is read
        np.testing.assert_array_equal(next(it).experts, want.experts)
    with pytest.raises(InputError) as ei:
        next(it)
    assert_one_line_error(d / "part-002.npz", ei)


def test_empty_and_missing_paths(tmp_path):
    with pytest.raises(InputError) as ei:
        open_trace(tmp_path)
    assert_one_line_error(tmp_path, ei, "no .npz")
    with pytest.raises(InputError) as ei:
        open_trace(tmp_path / "nope.npz")
    assert_one_line_error(tmp_path / "nope.npz", ei, "no such")


@pytest.mark.parametrize("change", ["N", "L", "m", "layers"])
def test_mismatched_shards(tmp_path, change):
    rng = np.random.default_rng(6)
    d = tmp_path / "d"
    save_trace(make_trace(rng), d / "a.npz")
    kw = {"N": {"n": 9}, "L": {"n_layers": 2}, "m": {"m": 3}, "layers": {}}[change]
    meta = {"layers": [0, 1, 5]} if change == "layers" else {}
    save_trace(make_trace(rng, **kw, **meta), d / "b.npz")
    with pytest.raises(InputError) as ei:
        load_trace(d)
    assert_one_line_error(d, ei, "mismatched shards", "b.npz")


# ------------------------------------------------------------------------------------------
# views


def test_select_documents_matches_a_loop():
    rng = np.random.default_rng(7)
    tr = make_trace(rng, lengths=(3, 1, 4, 2), weights="float32", documents=["a", "b", "c", "d"])
    index = [2, 0, 2, 3]
    sub = tr.select_documents(index)
    docs = list(tr.documents())
    np.testing.assert_array_equal(sub.experts, np.concatenate([docs[i] for i in index]))
    off = tr.doc_offsets
    np.testing.assert_array_equal(
        sub.weights, np.concatenate([tr.weights[off[i] : off[i + 1]] for i in index])
    )
    np.testing.assert_array_equal(sub.doc_offsets, [0, 4, 7, 11, 13])
    assert sub.meta["documents"] == ["c", "a", "c", "d"]
    for bad in ([4], [-1], [[0]], [0.5]):
        with pytest.raises(InputError, match="document index"):
            tr.select_documents(bad)
    with pytest.raises(InputError, match="empty trace"):
        tr.select_documents([])


def test_select_layers():
    rng = np.random.default_rng(8)
    base = make_trace(rng, n_layers=4, weights="float32")
    tr = RoutingTrace(
        experts=base.experts,
        doc_offsets=base.doc_offsets,
        num_experts=8,
        weights=base.weights,
        meta={"layers": [3, 5, 7, 9]},
    )
    sub = tr.select_layers([2, 0])
    for j, i in enumerate([2, 0]):
        np.testing.assert_array_equal(sub.experts[:, j], tr.experts[:, i])
        np.testing.assert_array_equal(sub.weights[:, j], tr.weights[:, i])
    assert sub.layers == [7, 3]
    np.testing.assert_array_equal(sub.doc_offsets, tr.doc_offsets)
    for bad in ([4], [1, 1], []):
        with pytest.raises(InputError, match="layers must be distinct"):
            tr.select_layers(bad)


def test_concatenate():
    rng = np.random.default_rng(9)
    a = make_trace(rng, lengths=(2, 3), weights="float32", documents=["a", "b"])
    b = make_trace(rng, lengths=(4,), weights="float32", documents=["c"])
    c = RoutingTrace.concatenate([a, b])
    np.testing.assert_array_equal(c.experts, np.concatenate([a.experts, b.experts]))
    np.testing.assert_array_equal(c.weights, np.concatenate([a.weights, b.weights]))
    np.testing.assert_array_equal(c.doc_offsets, [0, 2, 5, 9])
    assert c.meta["documents"] == ["a", "b", "c"]
    nameless = make_trace(rng, lengths=(1,))
    d = RoutingTrace.concatenate([a, nameless])
    assert d.weights is None and "documents" not in d.meta and d.num_documents == 3
    with pytest.raises(InputError, match="no traces"):
        RoutingTrace.concatenate([])
    with pytest.raises(InputError, match="mismatched"):
        RoutingTrace.concatenate([a, make_trace(rng, m=3)])


# ------------------------------------------------------------------------------------------
# validation: every rule gives one line naming the file

rng0 = np.random.default_rng(10)
_ok = good_arrays(rng0)["experts"]
_dup = _ok.copy()
_dup[3, 1] = [5, 5]
_meta = lambda **kw: np.array(json.dumps({"num_experts": 8, **kw}))  # noqa: E731

BAD_CASES = {
    "experts rank 2": ({"experts": _ok[:, 0]}, "[T, L, m]"),
    "experts rank 4": ({"experts": _ok[..., None]}, "[T, L, m]"),
    "experts float": ({"experts": _ok.astype(np.float32)}, "integers"),
    "experts bool": ({"experts": _ok > 3}, "integers"),
    "experts 0-d": ({"experts": np.array(3)}, "[T, L, m]"),
    "id too large": ({"experts": np.where(_ok == 0, 8, _ok)}, "outside [0, 8)"),
    "id negative": ({"experts": np.where(_ok == 0, -1, _ok)}, "outside [0, 8)"),
    "repeated id": ({"experts": _dup}, "token 3 repeats an expert id"),
    "offsets start": ({"doc_offsets": np.array([1, 4, 6])}, "start at 0"),
    "offsets flat": ({"doc_offsets": np.array([0, 4, 4, 6])}, "increase strictly"),
    "offsets wrap": ({"doc_offsets": np.array([0, 7, 6], dtype=np.uint64)}, "increase strictly"),
    "offsets end": ({"doc_offsets": np.array([0, 4, 5])}, "not at T=6"),
    "offsets short": ({"doc_offsets": np.array([0])}, "D >= 1"),
    "offsets 2-d": ({"doc_offsets": np.array([[0, 6]])}, "1-d"),
    "offsets float": ({"doc_offsets": np.array([0.0, 6.0])}, "integers"),
    "empty T": ({"experts": _ok[:0], "doc_offsets": np.array([0, 0])}, "empty trace"),
    "empty L": ({"experts": _ok[:, :0]}, "empty trace"),
    "N too small": ({"meta": _meta(num_experts=2)}, "must exceed"),
    "N float": ({"meta": _meta(num_experts=8.0)}, "integer"),
    "N bool": ({"meta": _meta(num_experts=True)}, "integer"),
    "N string": ({"meta": _meta(num_experts="8")}, "integer"),
    "N huge": ({"meta": _meta(num_experts=1 << 40)}, "implausibly large"),
    "missing experts": ({"experts": None}, "missing array 'experts'"),
    "missing offsets": ({"doc_offsets": None}, "missing array 'doc_offsets'"),
    "missing meta": ({"meta": None}, "missing array 'meta'"),
    "meta not JSON": ({"meta": np.array("{num_experts: 8")}, "JSON object"),
    "meta a list": ({"meta": np.array("[8]")}, "JSON object"),
    "meta 1-d": ({"meta": np.array(["{}"])}, "JSON object"),
    "meta bytes": ({"meta": np.array(b'{"num_experts": 8}')}, "JSON object"),
    "meta number": ({"meta": np.array(8)}, "JSON object"),
    "meta deep": ({"meta": np.array("[" * 100_000)}, "JSON object"),
    "meta lacks N": ({"meta": np.array("{}")}, "lacks num_experts"),
    "layers short": ({"meta": _meta(layers=[0])}, "meta 'layers'"),
    "layers not list": ({"meta": _meta(layers=2)}, "meta 'layers'"),
    "layers repeat": ({"meta": _meta(layers=[1, 1])}, "meta 'layers'"),
    "layers negative": ({"meta": _meta(layers=[-1, 0])}, "meta 'layers'"),
    "documents short": ({"meta": _meta(documents=["a"])}, "meta 'documents'"),
    "documents nested": ({"meta": _meta(documents=[["a"], "b"])}, "meta 'documents'"),
    "weights shape": ({"weights": np.ones((6, 2, 3))}, "does not match"),
    "weights ints": ({"weights": np.ones((6, 2, 2), dtype=np.int32)}, "floating"),
    "weights nan": ({"weights": np.full((6, 2, 2), np.nan)}, "NaN"),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_each_validation_rule_names_the_file(tmp_path, case):
    over, needle = BAD_CASES[case]
    path = write_npz(tmp_path / "bad.npz", **good_arrays(np.random.default_rng(10), **over))
    with pytest.raises(InputError) as ei:
        load_trace(path)
    assert_one_line_error(path, ei, needle)


def test_the_good_arrays_load(tmp_path):
    """The fixture the bad cases mutate is itself valid (each case breaks one rule)."""
    path = write_npz(tmp_path / "good.npz", **good_arrays(np.random.default_rng(10)))
    assert load_trace(path).num_tokens == 6


@pytest.mark.parametrize("content", ["text", "empty", "npy", "truncated", "zip-garbage"])
def test_unreadable_files(tmp_path, content):
    path = tmp_path / "bad.npz"
    good = write_npz(tmp_path / "good.npz", **good_arrays(np.random.default_rng(11)))
    if content == "text":
        path.write_text("experts,doc_offsets\n1,2\n")
    elif content == "empty":
        path.write_bytes(b"")
    elif content == "npy":
        with open(path, "wb") as fh:
            np.save(fh, np.zeros((2, 2, 2), dtype=np.int16))
    elif content == "truncated":
        path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    else:
        path.write_bytes(b"PK\x03\x04" + bytes(200))
    with pytest.raises(InputError) as ei:
        load_trace(path)
    assert_one_line_error(path, ei)


# ------------------------------------------------------------------------------------------
# atomic writes


class Interrupted(BaseException):
    pass


def test_interrupted_save_leaves_no_file(tmp_path, monkeypatch):
    rng = np.random.default_rng(12)
    tr = make_trace(rng)
    target = tmp_path / "t.npz"

    def half_write(fh, **arrays):
        fh.write(b"PK\x03\x04 half of a zip")
        raise Interrupted

    monkeypatch.setattr(trace_mod.np, "savez_compressed", half_write)
    with pytest.raises(Interrupted):
        save_trace(tr, target)
    assert list(tmp_path.iterdir()) == []  # neither the target nor a temporary file
    monkeypatch.undo()
    save_trace(tr, target)
    before = target.read_bytes()
    monkeypatch.setattr(trace_mod.np, "savez_compressed", half_write)
    with pytest.raises(Interrupted):
        save_trace(make_trace(rng), target)
    assert target.read_bytes() == before  # the old file is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["t.npz"]
