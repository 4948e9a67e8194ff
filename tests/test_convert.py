"""Imports (vLLM, SGLang, Parquet) and exports (Parquet, .npz) of routing traces."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specmoe.cli import main
from specmoe.commands import convert
from specmoe.errors import InputError
from specmoe.formats import parquet as parquet_mod
from specmoe.formats.engine_import import import_routed_experts
from specmoe.formats.parquet import load_parquet, save_parquet
from specmoe.formats.trace import RoutingTrace, load_trace, open_trace, save_trace
from specmoe.spec import ModelSpec


def ids(rng, t, r, m, n):
    """[t, r, m] distinct ids per token and layer."""
    return rng.random((t, r, n)).argsort(axis=-1)[..., :m]


def make_trace(rng, lengths=(3, 4, 2), n_layers=3, m=2, n=8, *, weights=None, **meta):
    t = sum(lengths)
    return RoutingTrace(
        experts=ids(rng, t, n_layers, m, n),
        doc_offsets=np.concatenate([[0], np.cumsum(lengths)]),
        num_experts=n,
        weights=None if weights is None else rng.random((t, n_layers, m)).astype(weights),
        meta=meta,
    )


def b64_npy(arr):
    buf = io.BytesIO()
    np.save(buf, arr)
    return base64.b64encode(buf.getvalue()).decode()


def b64_raw(arr, dtype="int32"):
    return base64.b64encode(np.ascontiguousarray(arr, dtype=dtype).tobytes()).decode()


def one_line(exc_info, path, *needles, argument=None):
    """One line naming ``path``; with ``argument``, the error names that function argument and
    no command-line flag."""
    msg = str(exc_info.value)
    assert type(exc_info.value) is InputError and "\n" not in msg, msg
    assert str(path) in msg, msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    if argument is not None:
        assert exc_info.value.argument == argument, (exc_info.value.argument, msg)
        assert msg.startswith(f"{argument}: ") and " --" not in msg, msg


def assert_same_trace(a: RoutingTrace, b: RoutingTrace):
    np.testing.assert_array_equal(a.experts, b.experts)
    np.testing.assert_array_equal(a.doc_offsets, b.doc_offsets)
    assert a.num_experts == b.num_experts
    if a.weights is None:
        assert b.weights is None
    else:
        assert a.weights.dtype == b.weights.dtype
        np.testing.assert_array_equal(a.weights, b.weights)
    assert a.meta == b.meta


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def tiny_spec(tmp_path):
    """4 decoder layers, MoE in layers 1 and 3, N=8, m=2, saved as a spec JSON."""
    spec = ModelSpec(
        name="tiny",
        num_experts=8,
        top_k=2,
        num_moe_layers=2,
        hidden_size=4,
        expert_intermediate=4,
        num_hidden_layers=4,
        moe_layer_indices=(1, 3),
    )
    path = tmp_path / "tiny-spec.json"
    path.write_text(json.dumps(spec.to_dict()))
    return str(path)


# ------------------------------------------------------------------------------------------
# vLLM


def test_vllm_one_npy_file(tmp_path, rng):
    rec = ids(rng, 7, 3, 2, 8).astype(np.int16)
    np.save(tmp_path / "req.npy", rec)
    tr = import_routed_experts(tmp_path / "req.npy", engine="vllm", num_experts=8)
    np.testing.assert_array_equal(tr.experts, rec)
    assert tr.experts.dtype == np.int16
    np.testing.assert_array_equal(tr.doc_offsets, [0, 7])
    assert tr.meta["documents"] == ["req"] and tr.meta["source"] == "vllm"
    assert tr.layers == [0, 1, 2]


def test_vllm_directory_is_one_document_per_request_in_natural_order(tmp_path, rng):
    recs = {f"req{i}": ids(rng, 2 + i, 2, 3, 10) for i in (10, 2, 1)}
    for name, rec in recs.items():
        np.save(tmp_path / f"{name}.npy", rec.astype(np.int16))
    (tmp_path / "notes.txt").write_text("ignored")
    tr = import_routed_experts(tmp_path, engine="vllm", num_experts=10)
    order = ["req1", "req2", "req10"]
    assert tr.meta["documents"] == order
    np.testing.assert_array_equal(tr.experts, np.concatenate([recs[k] for k in order]))
    np.testing.assert_array_equal(tr.doc_offsets, [0, 3, 7, 19])


@pytest.mark.parametrize("layout", ["list", "dict", "single", "jsonl"])
def test_vllm_json_layouts(tmp_path, rng, layout):
    recs = [ids(rng, t, 2, 2, 6) for t in (3, 1, 4)]
    path = tmp_path / ("r.jsonl" if layout == "jsonl" else "r.json")
    if layout == "list":
        path.write_text(json.dumps([r.tolist() for r in recs]))
        names = ["0", "1", "2"]
    elif layout == "dict":
        path.write_text(
            json.dumps({"b": recs[0].tolist(), "a": recs[1].tolist(), "c": recs[2].tolist()})
        )
        names = ["b", "a", "c"]
    elif layout == "single":
        recs = recs[:1]
        path.write_text(json.dumps(recs[0].tolist()))
        names = ["r"]
    else:
        path.write_text("\n".join(json.dumps(r.tolist()) for r in recs) + "\n")
        names = ["0", "1", "2"]
    tr = import_routed_experts(path, engine="vllm", num_experts=6)
    assert tr.meta["documents"] == names
    np.testing.assert_array_equal(tr.experts, np.concatenate(recs))
    np.testing.assert_array_equal(tr.doc_offsets, np.r_[0, np.cumsum([len(r) for r in recs])])


def test_vllm_openai_response_joins_prompt_and_each_choice(tmp_path, rng):
    prompt, g0, g1 = ids(rng, 5, 2, 2, 8), ids(rng, 3, 2, 2, 8), ids(rng, 2, 2, 2, 8)
    resp = {
        "id": "cmpl-7",
        "prompt_routed_experts": prompt.tolist(),
        "choices": [
            {"index": 0, "text": "x", "routed_experts": g0.tolist()},
            {"index": 1, "text": "y", "routed_experts": b64_npy(g1)},
        ],
    }
    path = tmp_path / "resp.json"
    path.write_text(json.dumps(resp))
    tr = import_routed_experts(path, engine="vllm", num_experts=8)
    assert tr.meta["documents"] == ["cmpl-7/0", "cmpl-7/1"]
    np.testing.assert_array_equal(tr.experts, np.concatenate([prompt, g0, prompt, g1]))
    np.testing.assert_array_equal(tr.doc_offsets, [0, 8, 15])


# ------------------------------------------------------------------------------------------
# SGLang


def test_sglang_generate_responses_base64_flattened(tmp_path, rng):
    recs = [ids(rng, t, 3, 2, 16) for t in (4, 6)]
    resps = [
        {"text": "a", "meta_info": {"id": "q0", "routed_experts": b64_raw(recs[0])}},
        {
            "text": "b",
            "meta_info": {
                "id": "q1",
                "routed_experts_dtype": "uint8",
                "routed_experts": b64_raw(recs[1], "uint8"),
            },
        },
    ]
    path = tmp_path / "gen.json"
    path.write_text(json.dumps(resps))
    tr = import_routed_experts(path, engine="sglang", num_experts=16, layers=3, top_k=2)
    assert tr.meta["documents"] == ["q0", "q1"] and tr.meta["source"] == "sglang"
    np.testing.assert_array_equal(tr.experts, np.concatenate(recs))
    with pytest.raises(InputError) as ei:  # a flattened record needs its shape
        import_routed_experts(path, engine="sglang", num_experts=16, top_k=2)
    one_line(ei, path, "need layers and top_k", argument="layers")
    with pytest.raises(InputError) as ei:  # a wrong shape does not split evenly
        import_routed_experts(path, engine="sglang", num_experts=16, layers=5, top_k=2)
    one_line(ei, path, "whole number", "layers=5, top_k=2", argument="layers")


def test_sglang_openai_choices_sgl_ext(tmp_path, rng):
    rec = ids(rng, 5, 2, 4, 32)
    resp = {"id": "chat-1", "choices": [{"index": 0, "sgl_ext": {"routed_experts": b64_raw(rec)}}]}
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(resp))
    tr = import_routed_experts(path, engine="sglang", num_experts=32, layers=2, top_k=4)
    assert tr.meta["documents"] == ["chat-1"]
    np.testing.assert_array_equal(tr.experts, rec)


@pytest.mark.parametrize("shape", ["1d", "2d"])
def test_sglang_flattened_npy(tmp_path, rng, shape):
    rec = ids(rng, 6, 3, 2, 8)
    flat = rec.reshape(-1) if shape == "1d" else rec.reshape(6, 6)
    np.save(tmp_path / "r.npy", flat.astype(np.int32))
    kw = {"layers": 3, "top_k": 2} if shape == "1d" else {"top_k": 2}
    tr = import_routed_experts(tmp_path / "r.npy", engine="sglang", num_experts=8, **kw)
    np.testing.assert_array_equal(tr.experts, rec)


# ------------------------------------------------------------------------------------------
# layers, model specs, N


def test_model_spec_keeps_moe_layers_of_a_full_record(tmp_path, rng, tiny_spec):
    moe = ids(rng, 5, 2, 2, 8)
    full = np.zeros((5, 4, 2), dtype=np.int32)  # dense layers 0 and 2 zero-filled
    full[:, [1, 3]] = moe
    np.save(tmp_path / "full.npy", full)
    tr = import_routed_experts(tmp_path / "full.npy", engine="vllm", model=tiny_spec)
    np.testing.assert_array_equal(tr.experts, moe)
    assert tr.layers == [1, 3] and tr.num_experts == 8 and tr.meta["model"] == "tiny"
    np.save(tmp_path / "moe.npy", moe)
    tr = import_routed_experts(tmp_path / "moe.npy", engine="vllm", model=tiny_spec)
    assert tr.layers == [1, 3]
    np.save(tmp_path / "three.npy", full[:, :3])
    with pytest.raises(InputError) as ei:
        import_routed_experts(tmp_path / "three.npy", engine="vllm", model=tiny_spec)
    one_line(ei, tmp_path / "three.npy", "records 3 layers")
    np.save(tmp_path / "m3.npy", ids(rng, 5, 2, 3, 8))
    with pytest.raises(InputError) as ei:
        import_routed_experts(tmp_path / "m3.npy", engine="vllm", model=tiny_spec)
    one_line(ei, tmp_path / "m3.npy", "routes 2")
    with pytest.raises(InputError) as ei:
        import_routed_experts(tmp_path / "moe.npy", engine="vllm", model=tiny_spec, num_experts=9)
    one_line(
        ei, tmp_path / "moe.npy", "disagrees: given 9, the model spec 8", argument="num_experts"
    )


def test_placeholder_layers_dropped_without_a_spec(tmp_path, rng):
    moe = ids(rng, 6, 2, 2, 8)
    rec = np.empty((6, 4, 2), dtype=np.int32)
    rec[:, 0] = -1  # SGLang-style placeholder
    rec[:, 2] = 0  # a zero-filled dense layer (ids repeat: cannot be routing)
    rec[:, [1, 3]] = moe
    np.save(tmp_path / "r.npy", rec)
    tr = import_routed_experts(tmp_path / "r.npy", engine="sglang", num_experts=8)
    np.testing.assert_array_equal(tr.experts, moe)
    assert tr.layers == [1, 3]
    single = np.zeros((4, 2, 1), dtype=np.int32)  # m = 1: every token to expert 0 is routing
    np.save(tmp_path / "s.npy", single)
    tr = import_routed_experts(tmp_path / "s.npy", engine="vllm", num_experts=4)
    assert tr.layers == [0, 1]
    rec[2, 1, 0] = -1  # a stray -1 inside a real layer is an error, not a placeholder
    np.save(tmp_path / "bad.npy", rec)
    with pytest.raises(InputError) as ei:
        import_routed_experts(tmp_path / "bad.npy", engine="sglang", num_experts=8)
    one_line(ei, tmp_path / "bad.npy", "expert id -1 outside [0, 8)")


def test_num_experts_is_required_and_checked(tmp_path, rng):
    rec = ids(rng, 3, 2, 2, 8)
    np.save(tmp_path / "r.npy", rec)
    with pytest.raises(InputError) as ei:
        import_routed_experts(tmp_path / "r.npy", engine="vllm")
    one_line(ei, tmp_path / "r.npy", "number of experts is unknown", argument="num_experts")
    with pytest.raises(InputError) as ei:
        import_routed_experts(tmp_path / "r.npy", engine="vllm", num_experts=int(rec.max()))
    one_line(ei, tmp_path / "r.npy", "outside")


def _bad_inputs(rng):
    good = ids(rng, 3, 2, 2, 8)
    dup = good.copy()
    dup[1, 0] = [4, 4]
    return {
        "repeat.json": (json.dumps([dup.tolist()]), "repeats an expert id"),
        "ragged.json": (json.dumps([[[[1, 2]], [[1]]]]), "ragged"),
        "float.json": (json.dumps([[[[1.5, 2.0]]]]), "integers"),
        "bool.json": (json.dumps([[[[True, False]]]]), "integers"),
        "strings.json": (json.dumps({"a": 5}), "expected nested lists"),
        "base64.json": (json.dumps(["not base64!"]), "not base64"),
        "bytes.json": (json.dumps([base64.b64encode(b"abc").decode()]), "whole number"),
        "dtype.json": (
            json.dumps(
                [
                    {
                        "meta_info": {
                            "routed_experts": b64_raw(good),
                            "routed_experts_dtype": "float32",
                        }
                    }
                ]
            ),
            "not an integer type",
        ),
        "dtype2.json": (
            json.dumps(
                [
                    {
                        "meta_info": {
                            "routed_experts": b64_raw(good),
                            "routed_experts_dtype": "nonsense",
                        }
                    }
                ]
            ),
            "not an integer type",
        ),
        "shapes.json": (json.dumps([good.tolist(), good[:, :1].tolist()]), "disagrees"),
        "missing.json": (json.dumps([{"meta_info": {"id": "x"}}]), "no 'routed_experts'"),
        "nochoice.json": (json.dumps({"choices": [{"text": "x"}]}), "no 'routed_experts'"),
        "empty.json": (json.dumps([[]]), "no tokens"),
        "none.json": (json.dumps([]), "no requests"),
        "broken.json": ("[[[1, 2]", "not readable JSON"),
        "deep.json": ("[" * 100_000, "not readable JSON"),
        "big.json": (json.dumps([[[[2**70, 1]]]]), "integers"),
    }


@pytest.mark.parametrize("case", list(_bad_inputs(np.random.default_rng(0))))
def test_bad_engine_inputs_give_one_line_errors(tmp_path, case):
    text, needle = _bad_inputs(np.random.default_rng(0))[case]
    path = tmp_path / case
    path.write_text(text)
    with pytest.raises(InputError) as ei:
        import_routed_experts(path, engine="vllm", num_experts=8, layers=2, top_k=2)
    one_line(ei, path, needle)


def test_bad_npy_inputs(tmp_path):
    (tmp_path / "junk.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(InputError) as ei:
        import_routed_experts(tmp_path / "junk.npy", engine="vllm", num_experts=8)
    one_line(ei, tmp_path / "junk.npy", "not a readable .npy")
    np.savez(tmp_path / "z.npy", a=np.zeros(3))  # an archive under a .npy name
    (tmp_path / "z.npy.npz").rename(tmp_path / "z.npy")
    with pytest.raises(InputError) as ei:
        import_routed_experts(tmp_path / "z.npy", engine="vllm", num_experts=8)
    one_line(ei, tmp_path / "z.npy", ".npz archive")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError) as ei:
        import_routed_experts(empty, engine="sglang", num_experts=8)
    one_line(ei, empty, "no .npy")


# ------------------------------------------------------------------------------------------
# Parquet


@pytest.mark.parametrize("weights", [None, "float16", "float32", "float64"])
@pytest.mark.parametrize("names", [True, False])
@pytest.mark.parametrize("n", [8, 40_000])
def test_parquet_round_trip_is_exact(tmp_path, rng, weights, names, n):
    meta = {"layers": [1, 5, 9], "model": "m", "source": "capture"}
    if names:
        meta["documents"] = ["first", "second", "third"]
    tr = make_trace(rng, n=n, weights=weights, **meta)
    path = save_parquet(tr, tmp_path / "t.parquet")
    back = load_parquet(path)
    assert back.experts.dtype == (np.int16 if n < 32768 else np.int32)
    assert_same_trace(tr, back)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    n_layers=st.integers(1, 3),
    m=st.integers(1, 3),
    seed=st.integers(0, 99),
)
def test_parquet_round_trip_property(tmp_path_factory, lengths, n_layers, m, seed):
    tr = make_trace(
        np.random.default_rng(seed),
        lengths=lengths,
        n_layers=n_layers,
        m=m,
        weights="float32",
        documents=[f"d{i}" for i in range(len(lengths))],
    )
    path = tmp_path_factory.mktemp("pq") / "t.parquet"
    assert_same_trace(tr, load_parquet(save_parquet(tr, path)))


def test_parquet_schema_is_one_row_per_token(tmp_path, rng):
    tr = make_trace(rng, weights="float32", layers=[2, 4, 6], documents=["a", "b", "c"])
    path = save_parquet(tr, tmp_path / "t.parquet")
    table = pq.read_table(path)
    assert table.column_names == [
        "doc",
        "doc_name",
        "pos",
        "layer_2",
        "layer_4",
        "layer_6",
        "weights_2",
        "weights_4",
        "weights_6",
    ]
    assert table.schema.field("doc").type == pa.int32()
    assert table.schema.field("pos").type == pa.int32()
    assert table.schema.field("layer_4").type == pa.list_(pa.int16())
    rows = table.to_pylist()
    starts = [0, 3, 7]
    for t, row in enumerate(rows):  # independent of the reader: compare row by row
        d = max(i for i, s in enumerate(starts) if s <= t)
        assert (row["doc"], row["doc_name"], row["pos"]) == (d, "abc"[d], t - starts[d])
        for j, li in enumerate([2, 4, 6]):
            assert row[f"layer_{li}"] == tr.experts[t, j].tolist()
            assert row[f"weights_{li}"] == tr.weights[t, j].tolist()
    meta = json.loads(table.schema.metadata[b"specmoe.meta"])
    assert meta["num_experts"] == 8 and meta["layers"] == [2, 4, 6]


def test_parquet_rows_in_any_order(tmp_path, rng):
    tr = make_trace(rng, lengths=(4, 1, 5), documents=["x", "y", "z"])
    path = save_parquet(tr, tmp_path / "t.parquet")
    table = pq.read_table(path)
    shuffled = table.take(pa.array(rng.permutation(table.num_rows)))
    pq.write_table(shuffled, tmp_path / "s.parquet")
    assert_same_trace(tr, load_parquet(tmp_path / "s.parquet"))


def test_parquet_written_elsewhere_needs_n(tmp_path, rng):
    """A file made by another tool: fixed-size lists of int32, no specmoe metadata."""
    e = ids(rng, 5, 2, 3, 12)
    table = pa.table(
        {
            "doc": pa.array([7, 7, 9, 9, 9], pa.int64()),
            "pos": pa.array([0, 1, 0, 1, 2]),
            "layer_0": pa.FixedSizeListArray.from_arrays(pa.array(e[:, 0].ravel(), pa.int32()), 3),
            "layer_1": pa.FixedSizeListArray.from_arrays(pa.array(e[:, 1].ravel(), pa.int32()), 3),
        }
    )
    pq.write_table(table, tmp_path / "o.parquet")
    with pytest.raises(InputError) as ei:
        load_parquet(tmp_path / "o.parquet")
    one_line(ei, tmp_path / "o.parquet", "number of experts is unknown", argument="num_experts")
    tr = load_parquet(tmp_path / "o.parquet", num_experts=12)
    np.testing.assert_array_equal(tr.experts, e)
    np.testing.assert_array_equal(tr.doc_offsets, [0, 2, 5])
    assert tr.layers == [0, 1] and "documents" not in tr.meta


def _parquet_variants(rng, tmp_path):
    tr = make_trace(rng, weights="float32")
    base = pq.read_table(save_parquet(tr, tmp_path / "base.parquet"))

    def with_col(name, arr):
        return base.set_column(base.column_names.index(name), name, arr)

    lists = base.column("layer_1").to_pylist()
    null_row = [None if i == 3 else v for i, v in enumerate(lists)]
    short_row = [v[:1] if i == 2 else v for i, v in enumerate(lists)]
    pos = base.column("pos").to_pylist()
    return {
        "no doc": (base.drop_columns(["doc"]), "missing column 'doc'"),
        "no layers": (base.select(["doc", "pos"]), "no layer_<i>"),
        "pos gap": (
            with_col("pos", pa.array([p + (p > 1) for p in pos], pa.int32())),
            "each position",
        ),
        "pos repeat": (with_col("pos", pa.array([0] * len(pos), pa.int32())), "each position"),
        "null list": (with_col("layer_1", pa.array(null_row, pa.list_(pa.int16()))), "non-null"),
        "short list": (with_col("layer_1", pa.array(short_row, pa.list_(pa.int16()))), "non-null"),
        "float ids": (with_col("layer_1", pa.array(lists, pa.list_(pa.float32()))), "not integers"),
        "flat ids": (
            with_col("layer_1", pa.array([v[0] for v in lists], pa.int16())),
            "list column",
        ),
        "float doc": (with_col("doc", pa.array([0.0] * len(pos))), "integers"),
        "weights": (base.drop_columns(["weights_2"]), "weights_<i>"),
        "bad meta": (base.replace_schema_metadata({b"specmoe.meta": b"{oops"}), "JSON object"),
        "big id": (
            with_col("layer_0", pa.array([[9, 1]] * len(pos), pa.list_(pa.int16()))),
            "outside [0, 8)",
        ),
        "empty": (base.slice(0, 0), "empty"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "no doc",
        "no layers",
        "pos gap",
        "pos repeat",
        "null list",
        "short list",
        "float ids",
        "flat ids",
        "float doc",
        "weights",
        "bad meta",
        "big id",
        "empty",
    ],
)
def test_bad_parquet_gives_one_line_errors(tmp_path, rng, case):
    table, needle = _parquet_variants(rng, tmp_path)[case]
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    with pytest.raises(InputError) as ei:
        load_parquet(path)
    one_line(ei, path, needle)


def test_not_a_parquet_file(tmp_path):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"PAR1 but not really")
    with pytest.raises(InputError) as ei:
        load_parquet(path)
    one_line(ei, path, "not a readable Parquet")


def test_shard_directory_streams_to_parquet(tmp_path, rng):
    d = tmp_path / "shards"
    for i in range(3):
        save_trace(
            make_trace(rng, lengths=(2, i + 1), documents=[f"{i}a", f"{i}b"]), d / f"p{i}.npz"
        )
    path = save_parquet(open_trace(d), tmp_path / "all.parquet")
    assert pq.ParquetFile(path).num_row_groups == 3  # one shard at a time
    assert_same_trace(load_trace(d), load_parquet(path))


def test_interrupted_parquet_write_leaves_no_file(tmp_path, rng, monkeypatch):
    class Interrupted(BaseException):
        pass

    def boom(self, table, *a, **k):
        raise Interrupted

    monkeypatch.setattr(pq.ParquetWriter, "write_table", boom)
    with pytest.raises(Interrupted):
        save_parquet(make_trace(rng), tmp_path / "t.parquet")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------
# the `specmoe convert` command


def test_cli_npz_parquet_npz_round_trip(tmp_path, rng, capsys):
    tr = make_trace(rng, weights="float32", documents=["a", "b", "c"], layers=[0, 2, 4])
    save_trace(tr, tmp_path / "t.npz")
    assert main(["convert", str(tmp_path / "t.npz"), str(tmp_path / "t.parquet"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)  # stdout is the JSON and nothing else
    assert out["from"] == "npz" and out["to"] == "parquet"
    assert (
        out["num_tokens"],
        out["num_documents"],
        out["num_layers"],
        out["top_k"],
        out["num_experts"],
        out["layers"],
    ) == (9, 3, 3, 2, 8, [0, 2, 4])
    assert main(["convert", str(tmp_path / "t.parquet"), str(tmp_path / "u.npz"), "--json"]) == 0
    json.loads(capsys.readouterr().out)
    assert_same_trace(tr, load_trace(tmp_path / "u.npz"))


def test_cli_engine_import(tmp_path, rng, capsys, tiny_spec):
    d = tmp_path / "reqs"
    d.mkdir()
    rec = np.full((4, 4, 2), -1, dtype=np.int16)
    rec[:, [1, 3]] = ids(rng, 4, 2, 2, 8)
    np.save(d / "0.npy", rec)
    out = tmp_path / "t.npz"
    assert (
        main(["convert", str(d), str(out), "--from", "vllm", "--num-experts", "8", "--json"]) == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert res["dropped_layers"] == [0, 2] and res["layers"] == [1, 3]
    np.testing.assert_array_equal(load_trace(out).experts, rec[:, [1, 3]])
    assert (
        main(
            ["convert", str(d), str(tmp_path / "m.parquet"), "--from", "vllm", "--model", tiny_spec]
        )
        == 0
    )
    assert "tokens" in capsys.readouterr().out
    assert load_parquet(tmp_path / "m.parquet").meta["model"] == "tiny"


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["IN.json", "OUT.npz"], "--from"),
        (["IN.npz", "OUT.csv"], "--to"),
        (["DIR", "OUT.npz"], "--from vllm"),
        (["IN.npy", "OUT.npz", "--from", "vllm"], "--num-experts"),
        (["IN.npz", "IN.npz"], "input itself"),
        (["IN.npy", "OUT.npz", "--from", "vllm", "--num-experts", "0"], "positive"),
    ],
)
def test_cli_errors_exit_2_with_one_line(tmp_path, rng, capsys, argv, needle):
    save_trace(make_trace(rng), tmp_path / "IN.npz")
    np.save(tmp_path / "IN.npy", ids(rng, 3, 2, 2, 8))
    (tmp_path / "IN.json").write_text("[]")
    (tmp_path / "DIR").mkdir()
    files = {"IN.json", "IN.npz", "IN.npy", "DIR", "OUT.npz", "OUT.csv"}
    args = [str(tmp_path / a) if a in files else a for a in argv]
    assert main(["convert", *args]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], cap.err
    assert not (tmp_path / "OUT.npz").exists()


@pytest.mark.parametrize(
    "extra,flag,needle",
    [
        ([], "--num-experts", "number of experts is unknown"),
        (["--num-experts", "9", "--model", "OLMoE-1B-7B-0125"], "--num-experts", "disagrees"),
        (["--num-experts", "64"], "--layers", "need layers and top_k"),
        (["--num-experts", "64", "--layers", "16"], "--top-k", "need layers and top_k"),
        (["--num-experts", "64", "--layers", "16", "--top-k", "8"], "--layers", "whole number"),
        (["--model", "OLMoE-1B-7B-0125"], "--model", "(from the model spec)"),
    ],
)
def test_cli_names_the_flag_of_the_bad_argument(tmp_path, rng, capsys, extra, flag, needle):
    """The importer names its argument (num_experts, layers, top_k, model); the command shows
    the flag that fed it, on one line."""
    flat = ids(rng, 3, 16, 8, 64).reshape(-1)
    flat = np.concatenate([flat, flat[:5]])  # 389 ids: no whole number of [16, 8] tokens
    path = tmp_path / "gen.json"
    path.write_text(json.dumps({"meta_info": {"id": "g", "routed_experts": b64_raw(flat)}}))
    out = tmp_path / "o.npz"
    assert main(["convert", str(path), str(out), "--from", "sglang", *extra]) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert cap.out == "" and len(lines) == 1, cap.err
    assert lines[0].startswith(f"specmoe convert: error: {flag}: {path}"), lines[0]
    assert needle in lines[0] and not out.exists()
    argument = flag[2:].replace("-", "_")
    with pytest.raises(InputError) as ei:  # the library names the argument
        kw = dict(zip(extra[::2], extra[1::2]))
        import_routed_experts(
            path,
            engine="sglang",
            num_experts=int(kw["--num-experts"]) if "--num-experts" in kw else None,
            model=kw.get("--model"),
            layers=int(kw["--layers"]) if "--layers" in kw else None,
            top_k=int(kw["--top-k"]) if "--top-k" in kw else None,
        )
    one_line(ei, path, needle, argument=argument)


def test_module_registers_the_verb():
    from specmoe.cli import COMMANDS, command_module

    assert "convert" in COMMANDS and command_module("convert") == convert.__name__
    assert callable(convert.add_arguments) and callable(convert.run)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-2, 9)
    | st.floats(allow_nan=False)
    | st.text(max_size=6)
    | st.sampled_from(["AAEAAg==", "k05VTVBZ", "////"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "id",
                    "choices",
                    "meta_info",
                    "routed_experts",
                    "sgl_ext",
                    "prompt_routed_experts",
                    "routed_experts_dtype",
                    "x",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    value=json_values,
    engine=st.sampled_from(["vllm", "sglang"]),
    shape=st.sampled_from([(None, None), (2, 1), (1, 2)]),
)
def test_random_json_never_escapes_as_another_exception(tmp_path_factory, value, engine, shape):
    path = tmp_path_factory.mktemp("js") / "r.json"
    path.write_text(json.dumps(value))
    try:
        tr = import_routed_experts(
            path, engine=engine, num_experts=10, layers=shape[0], top_k=shape[1]
        )
    except InputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path)), str(exc)
        return
    assert tr.num_tokens >= 1 and tr.num_experts == 10


@pytest.fixture(scope="module")
def parquet_bytes(tmp_path_factory):
    rng = np.random.default_rng(3)
    tr = make_trace(rng, weights="float32", documents=["a", "b", "c"])
    path = save_parquet(tr, tmp_path_factory.mktemp("pqd") / "g.parquet")
    return tr, path.read_bytes()


@settings(max_examples=80, deadline=None, derandomize=True)
@given(data=st.data(), damage=st.sampled_from(["flip", "truncate"]))
def test_damaged_parquet_never_gives_a_wrong_answer(tmp_path_factory, parquet_bytes, data, damage):
    """Page checksums guard the data: a damaged file is refused or loads unchanged."""
    tr, raw0 = parquet_bytes
    raw = bytearray(raw0)
    if damage == "flip":
        for _ in range(data.draw(st.integers(1, 3))):
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    else:
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    path = tmp_path_factory.mktemp("pqf") / "f.parquet"
    path.write_bytes(bytes(raw))
    try:
        back = load_parquet(path)
    except InputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path))
        return
    assert_same_trace(tr, back)


def test_large_shards_split_into_row_groups(tmp_path, rng, monkeypatch):
    monkeypatch.setattr(parquet_mod, "_ROWS_PER_GROUP", 4)
    tr = make_trace(rng, lengths=(3, 6, 2), weights="float16", documents=["a", "b", "c"])
    path = save_parquet(tr, tmp_path / "t.parquet")
    assert pq.ParquetFile(path).num_row_groups == 3  # 11 tokens in groups of 4
    assert_same_trace(tr, load_parquet(path))


def test_preset_with_leading_dense_layer(tmp_path, rng):
    """DeepSeek-V2-Lite: 27 decoder layers, the first dense; a full record keeps 1..26."""
    full = np.full((3, 27, 6), -1, dtype=np.int32)
    full[:, 1:] = ids(rng, 3, 26, 6, 64)
    np.save(tmp_path / "r.npy", full)
    tr = import_routed_experts(tmp_path / "r.npy", engine="vllm", model="DeepSeek-V2-Lite")
    assert tr.layers == list(range(1, 27)) and tr.num_experts == 64
    np.testing.assert_array_equal(tr.experts, full[:, 1:])


def test_flattened_record_shape_from_an_unambiguous_model(tmp_path, rng):
    rec = ids(rng, 3, 16, 8, 64)
    path = tmp_path / "gen.json"
    path.write_text(json.dumps({"meta_info": {"id": "g", "routed_experts": b64_raw(rec)}}))
    tr = import_routed_experts(path, engine="sglang", model="OLMoE-1B-7B-0125")
    np.testing.assert_array_equal(tr.experts, rec)
    with pytest.raises(InputError) as ei:  # 27 decoder layers, 26 MoE: the arguments must say
        import_routed_experts(path, engine="sglang", model="DeepSeek-V2-Lite")
    one_line(ei, path, "need layers and top_k", argument="layers")
