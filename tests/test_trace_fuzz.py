"""Fuzzing the .npz trace reader: malformed files give one-line InputErrors, valid ones load exactly.

Every generated file is judged by ``reference_verdict``, an independent, plain-Python restatement
of the format's invariants; ``load_trace`` must agree with it: no wrong answer, no other exception.
"""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from specmoe.errors import InputError
from specmoe.formats.trace import RoutingTrace, load_trace, save_trace

FAST = settings(
    max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
SLOW = settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KEYS = ("experts", "doc_offsets", "meta", "weights")
DTYPES = [
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint64",
    "float16",
    "float32",
    "float64",
    "bool",
    "complex64",
    "<U6",
    "|S4",
]


# ------------------------------------------------------------------------------------------
# the reference: the invariants of docs/trace-format.md, restated without numpy shortcuts


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def reference_verdict(arrays: dict) -> bool:
    """True iff ``arrays`` (what was written to the .npz) form a valid trace."""
    if any(k not in arrays for k in ("experts", "doc_offsets", "meta")):
        return False
    e, off, meta_raw = arrays["experts"], arrays["doc_offsets"], arrays["meta"]
    if meta_raw.ndim != 0 or meta_raw.dtype.kind != "U":
        return False
    try:
        meta = json.loads(str(meta_raw))
    except (ValueError, RecursionError):
        return False
    if not isinstance(meta, dict) or not _is_int(meta.get("num_experts")):
        return False
    n = meta["num_experts"]
    if e.ndim != 3 or e.dtype.kind not in "iu" or 0 in e.shape:
        return False
    t, n_layers, m = e.shape
    if not m < n <= 2**30:
        return False
    rows = e.reshape(-1, m).tolist()
    if any(not 0 <= x < n for row in rows for x in row):
        return False
    if any(len(set(row)) != m for row in rows):
        return False
    if off.ndim != 1 or off.dtype.kind not in "iu" or off.size < 2:
        return False
    o = off.tolist()
    if o[0] != 0 or o[-1] != t or any(b <= a for a, b in itertools.pairwise(o)):
        return False
    if "weights" in arrays:
        w = arrays["weights"]
        if (
            w.shape != e.shape
            or w.dtype.kind != "f"
            or not all(np.isfinite(float(x)) for x in w.ravel().tolist())
        ):
            return False
    layers = meta.get("layers", list(range(n_layers)))
    if (
        not isinstance(layers, list)
        or len(layers) != n_layers
        or not all(_is_int(x) and x >= 0 for x in layers)
        or len(set(layers)) != n_layers
    ):
        return False
    if "documents" in meta:
        docs = meta["documents"]
        if (
            not isinstance(docs, list)
            or len(docs) != len(o) - 1
            or not all(isinstance(d, str) or _is_int(d) for d in docs)
        ):
            return False
    return True


# ------------------------------------------------------------------------------------------
# strategies


@st.composite
def valid_arrays(draw):
    n = draw(st.integers(2, 12))
    m = draw(st.integers(1, min(4, n - 1)))
    n_layers = draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    t = sum(lengths)
    perm = draw(st.lists(st.permutations(range(n)), min_size=t * n_layers, max_size=t * n_layers))
    dtype = draw(st.sampled_from(["int8", "int16", "int32", "int64", "uint8", "uint64"]))
    experts = np.array([p[:m] for p in perm], dtype=dtype).reshape(t, n_layers, m)
    meta: dict = {"num_experts": n}
    if draw(st.booleans()):
        meta["layers"] = draw(
            st.lists(st.integers(0, 60), min_size=n_layers, max_size=n_layers, unique=True)
        )
    if draw(st.booleans()):
        meta["documents"] = draw(
            st.lists(
                st.text(max_size=5) | st.integers(0, 9),
                min_size=len(lengths),
                max_size=len(lengths),
            )
        )
    if draw(st.booleans()):
        meta["model"] = draw(st.text(max_size=8))
    arrays = {
        "experts": experts,
        "doc_offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(
            draw(st.sampled_from(["int64", "int32", "uint64", "uint16"]))
        ),
        "meta": np.array(json.dumps(meta)),
    }
    if draw(st.booleans()):
        arrays["weights"] = draw(
            hnp.arrays(
                st.sampled_from(["float16", "float32", "float64"]),
                experts.shape,
                elements={"min_value": -1.0, "max_value": 1.0},
            )
        )
    return arrays


def random_array(dtype: str):
    kind = np.dtype(dtype).kind
    if kind in "iu":
        lo = 0 if kind == "u" else -2
        elements = st.integers(lo, 12)
    elif kind in "fc":
        elements = st.sampled_from([0.0, 1.0, 2.0, 7.0, np.nan, np.inf, -1.0])
    else:
        elements = None
    return hnp.arrays(
        dtype, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4), elements=elements
    )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 40)
    | st.floats(allow_nan=False)
    | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["num_experts", "layers", "documents", "model", "x"]), inner, max_size=4
        )
    ),
    max_leaves=12,
)
meta_text = st.one_of(
    st.text(max_size=30),
    json_values.map(json.dumps),
    st.builds(
        lambda d: json.dumps({"num_experts": 8, **d}),
        st.dictionaries(
            st.sampled_from(["layers", "documents", "num_experts"]), json_values, max_size=2
        ),
    ),
    st.integers(1, 3000).map(lambda k: "[" * k + "]" * (k % 3)),
)


@st.composite
def malformed_arrays(draw):
    """A valid trace with some keys dropped or replaced by random arrays, random meta text or
    meta fields, random offsets, or a few ids overwritten (most of these are invalid)."""
    arrays = draw(valid_arrays())
    actions = ["drop", "random", "meta", "meta-field", "offsets", "ids"]
    for action in draw(st.lists(st.sampled_from(actions), min_size=1, max_size=3)):
        key = draw(st.sampled_from((*KEYS, "extra")))
        if action == "drop":
            arrays.pop(key, None)
        elif action == "random":
            arrays[key] = draw(random_array(draw(st.sampled_from(DTYPES))))
        elif action == "meta":
            arrays["meta"] = np.array(draw(meta_text))
        elif action == "meta-field" and "meta" in arrays:
            try:
                meta = json.loads(str(arrays["meta"]))
            except (ValueError, RecursionError):
                meta = None
            if isinstance(meta, dict):
                field = draw(st.sampled_from(["layers", "documents", "num_experts"]))
                meta[field] = draw(json_values)
                arrays["meta"] = np.array(json.dumps(meta))
        elif action == "offsets" and "experts" in arrays:
            t = arrays["experts"].shape[0] if arrays["experts"].ndim else 1
            values = draw(st.lists(st.integers(0, t + 1), min_size=0, max_size=5))
            dtype = draw(st.sampled_from(["int64", "uint64", "uint8", "int8"]))
            arrays["doc_offsets"] = np.array(values, dtype=dtype)
        elif action == "ids" and "experts" in arrays and arrays["experts"].size:
            e = arrays["experts"].copy()
            flat = e.reshape(-1)
            lo = -2 if e.dtype.kind == "i" else 0
            for _ in range(draw(st.integers(1, 3))):
                flat[draw(st.integers(0, flat.size - 1))] = draw(st.integers(lo, 14))
            arrays["experts"] = e
    return arrays


# ------------------------------------------------------------------------------------------
# properties


def write_npz(path: Path, arrays: dict, compress: bool) -> None:
    with open(path, "wb") as fh:
        (np.savez_compressed if compress else np.savez)(fh, **arrays)


def expected_meta(arrays: dict) -> dict:
    meta = json.loads(str(arrays["meta"]))
    meta.setdefault("layers", list(range(arrays["experts"].shape[1])))
    return meta


def check_against_reference(path: Path, arrays: dict) -> None:
    ok = reference_verdict(arrays)
    try:
        tr = load_trace(path)
    except InputError as exc:
        msg = str(exc)
        assert msg.startswith(str(path)) and "\n" not in msg, msg
        assert not ok, f"a valid trace was refused: {msg}"
        return
    assert ok, "an invalid trace was accepted"
    assert tr.experts.dtype == arrays["experts"].dtype
    np.testing.assert_array_equal(tr.experts, arrays["experts"])
    np.testing.assert_array_equal(tr.doc_offsets, arrays["doc_offsets"].astype(np.int64))
    if "weights" in arrays:
        assert tr.weights.dtype == arrays["weights"].dtype
        np.testing.assert_array_equal(tr.weights, arrays["weights"])
    else:
        assert tr.weights is None
    assert tr.meta == expected_meta(arrays)


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@FAST
@given(arrays=valid_arrays(), compress=st.booleans())
def test_valid_files_load_exactly(workdir, arrays, compress):
    path = workdir / "valid.npz"
    write_npz(path, arrays, compress)
    assert reference_verdict(arrays)
    check_against_reference(path, arrays)
    again = workdir / "again.npz"  # and through save_trace, the canonical writer
    save_trace(load_trace(path), again, compress=compress)
    back = load_trace(again)
    np.testing.assert_array_equal(back.experts, arrays["experts"])
    assert back.meta == expected_meta(arrays)


def _malformed(arrays, compress, workdir):
    path = workdir / "fuzz.npz"
    write_npz(path, arrays, compress)
    check_against_reference(path, arrays)


@FAST
@given(arrays=malformed_arrays(), compress=st.booleans())
def test_malformed_arrays_never_give_a_wrong_answer(workdir, arrays, compress):
    _malformed(arrays, compress, workdir)


@pytest.mark.slow
@SLOW
@given(arrays=malformed_arrays(), compress=st.booleans())
def test_malformed_arrays_many(workdir, arrays, compress):
    _malformed(arrays, compress, workdir)


def _damaged(arrays, compress, damage, data, workdir):
    path = workdir / "damaged.npz"
    write_npz(path, arrays, compress)
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif damage == "flip":
        for _ in range(data.draw(st.integers(1, 3))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= data.draw(st.integers(1, 255))
    else:
        raw = bytearray(data.draw(st.binary(max_size=300)))
        if data.draw(st.booleans()):
            raw[:0] = b"PK\x03\x04"
    path.write_bytes(bytes(raw))
    try:
        tr = load_trace(path)
    except InputError as exc:
        msg = str(exc)
        assert msg.startswith(str(path)) and "\n" not in msg, msg
        return
    # a damaged file may still load only if the damage missed every byte that matters
    assert damage == "flip"
    np.testing.assert_array_equal(tr.experts, arrays["experts"])
    np.testing.assert_array_equal(tr.doc_offsets, arrays["doc_offsets"].astype(np.int64))
    assert tr.meta == expected_meta(arrays)


@FAST
@given(
    arrays=valid_arrays(),
    compress=st.booleans(),
    damage=st.sampled_from(["truncate", "flip", "random"]),
    data=st.data(),
)
def test_damaged_files_give_one_line_errors(workdir, arrays, compress, damage, data):
    _damaged(arrays, compress, damage, data, workdir)


@pytest.mark.slow
@SLOW
@given(
    arrays=valid_arrays(),
    compress=st.booleans(),
    damage=st.sampled_from(["truncate", "flip", "random"]),
    data=st.data(),
)
def test_damaged_files_many(workdir, arrays, compress, damage, data):
    _damaged(arrays, compress, damage, data, workdir)


def test_reference_rejects_what_it_should():
    """The reference itself can say no (so the properties above can fail)."""
    good = {
        "experts": np.array([[[0, 1]]]),
        "doc_offsets": np.array([0, 1]),
        "meta": np.array('{"num_experts": 3}'),
    }
    assert reference_verdict(good)
    assert not reference_verdict({**good, "experts": np.array([[[1, 1]]])})
    assert not reference_verdict({**good, "doc_offsets": np.array([0, 2], dtype=np.uint8)})
    assert not reference_verdict({**good, "meta": np.array('{"num_experts": 2}')})
    assert not reference_verdict({**good, "weights": np.array([[[np.nan, 1.0]]])})
    assert isinstance(
        RoutingTrace(experts=good["experts"], doc_offsets=good["doc_offsets"], num_experts=3),
        RoutingTrace,
    )
