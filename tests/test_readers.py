"""Readers that cannot be lied to: a table of generated bad files (truncated, bit-flipped, wrong
types, NaN/inf, huge, nested, pickle) for every on-disk input of traces, shard directories,
Parquet, bandwidth profiles, model specs and model checkpoints.

Each case goes through the library (one ``InputError`` naming the file and the field) and
through :func:`specmoe.cli.main` (exit 2, one stderr line naming the file, nothing written
under the output path).
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from specmoe.cli import main
from specmoe.errors import InputError
from specmoe.formats.profile import load_profile
from specmoe.formats.trace import RoutingTrace, load_trace, save_trace
from specmoe.spec import resolve_spec

N, L, M = 8, 3, 2


def _trace(seed: int = 0, *, docs: tuple[str, ...] = ("a", "b", "c"), model: str = "toy"):
    rng = np.random.default_rng(seed)
    t = 10 * len(docs)
    experts = np.stack([rng.permutation(N)[:M] for _ in range(t * L)]).reshape(t, L, M)
    weights = rng.random((t, L, M)).astype(np.float32)
    return RoutingTrace(
        experts=experts,
        doc_offsets=np.arange(0, t + 1, 10),
        num_experts=N,
        weights=weights,
        meta={"model": model, "documents": list(docs), "layers": [1, 2, 3]},
    )


def _members(tr: RoutingTrace, **change) -> dict[str, np.ndarray]:
    arrays = {
        "experts": tr.experts.astype(np.int16),
        "doc_offsets": tr.doc_offsets,
        "weights": tr.weights,
        "meta": np.array(json.dumps(tr.meta)),
    }
    arrays.update(change)
    return {k: v for k, v in arrays.items() if v is not None}


def _npz(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    with open(path, "wb") as fh:
        np.savez_compressed(fh, **arrays)
    return path


def _meta(**change) -> np.ndarray:
    meta = dict(_trace().meta, num_experts=N)
    meta.update(change)
    return np.array(json.dumps(meta))


def _flip_member(path: Path, member: str) -> Path:
    """Flip one byte in the middle of a zip member's compressed data."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(member)
    data = bytearray(path.read_bytes())
    local = info.header_offset
    name_len = int.from_bytes(data[local + 26 : local + 28], "little")
    extra_len = int.from_bytes(data[local + 28 : local + 30], "little")
    data[local + 30 + name_len + extra_len + info.compress_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def _huge_member(path: Path) -> Path:
    """A .npz whose ``experts`` header claims 10^12 tokens but holds a few bytes."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "<i2", "fortran_order": False, "shape": (10**12, L, M)}
    )
    buf.write(b"\0" * 64)
    tr = _trace()
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("experts.npy", buf.getvalue())
        for key, arr in _members(tr, experts=None, weights=None).items():
            b = io.BytesIO()
            np.save(b, arr)
            z.writestr(f"{key}.npy", b.getvalue())
    return path


def _bad_experts(fill: Callable[[np.ndarray], None]) -> np.ndarray:
    e = _trace().experts.astype(np.int16)
    fill(e)
    return e


def _set(arr, idx, value):
    arr[idx] = value


# (case id, maker(tmp) -> path, words the one-line error must hold besides the path)
TRACE_CASES: list[tuple[str, Callable[[Path], Path], tuple[str, ...]]] = [
    ("text-named-npz", lambda d: _write(d / "t.npz", "hello, not a trace\n"), ("not a",)),
    ("pickle-named-npz", lambda d: _write_bytes(d / "p.npz", pickle.dumps({"a": 1})), ("not a",)),
    ("npy-named-npz", lambda d: _save_npy(d / "one.npz"), (".npy",)),
    ("empty-file", lambda d: _write(d / "e.npz", ""), ("empty",)),
    ("truncated", lambda d: _truncate(_npz(d / "tr.npz", _members(_trace()))), ("truncated",)),
    (
        "bit-flipped",
        lambda d: _flip_member(_npz(d / "f.npz", _members(_trace())), "experts.npy"),
        ("experts",),
    ),
    ("huge-header", lambda d: _huge_member(d / "h.npz"), ("experts", "declares")),
    (
        "object-array",
        lambda d: _npz(
            d / "o.npz", _members(_trace(), experts=np.array([{"x": 1}, None], dtype=object))
        ),
        ("experts", "pickle"),
    ),
    (
        "id-out-of-range",
        lambda d: _npz(
            d / "r.npz", _members(_trace(), experts=_bad_experts(lambda e: _set(e, (4, 1, 0), N)))
        ),
        ("expert id 8",),
    ),
    (
        "id-negative",
        lambda d: _npz(
            d / "n.npz", _members(_trace(), experts=_bad_experts(lambda e: _set(e, (0, 0, 1), -1)))
        ),
        ("expert id -1",),
    ),
    (
        "id-repeated",
        lambda d: _npz(
            d / "rep.npz",
            _members(_trace(), experts=_bad_experts(lambda e: _set(e, (3, 2, slice(None)), 5))),
        ),
        ("repeats",),
    ),
    (
        "weights-nan",
        lambda d: _npz(d / "wn.npz", _members(_trace(), weights=_nan_weights(np.nan))),
        ("weights",),
    ),
    (
        "weights-inf",
        lambda d: _npz(d / "wi.npz", _members(_trace(), weights=_nan_weights(np.inf))),
        ("weights",),
    ),
    (
        "experts-float",
        lambda d: _npz(d / "ef.npz", _members(_trace(), experts=_trace().experts.astype(float))),
        ("experts",),
    ),
    (
        "num-experts-string",
        lambda d: _npz(d / "ns.npz", _members(_trace(), meta=_meta(num_experts="8"))),
        ("num_experts",),
    ),
    (
        "num-experts-huge",
        lambda d: _npz(d / "nh.npz", _members(_trace(), meta=_meta(num_experts=10**40))),
        ("num_experts",),
    ),
    (
        "layers-wrong-type",
        lambda d: _npz(d / "lw.npz", _members(_trace(), meta=_meta(layers="1,2,3"))),
        ("layers",),
    ),
    (
        "meta-not-json",
        lambda d: _npz(d / "mj.npz", _members(_trace(), meta=np.array("{not json"))),
        ("meta",),
    ),
    (
        "meta-nested",
        lambda d: _npz(
            d / "mn.npz",
            _members(_trace(), meta=np.array('{"x": ' + "[" * 50000 + "]" * 50000 + "}")),
        ),
        ("meta", "nested"),
    ),
    (
        "offsets-decreasing",
        lambda d: _npz(d / "od.npz", _members(_trace(), doc_offsets=np.array([0, 20, 10, 30]))),
        ("doc_offsets",),
    ),
    (
        "meta-missing",
        lambda d: _npz(d / "mm.npz", _members(_trace(), meta=None)),
        ("meta",),
    ),
]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _save_npy(path: Path) -> Path:
    with open(path, "wb") as fh:
        np.save(fh, np.zeros(3))
    return path


def _truncate(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    return path


def _nan_weights(value: float) -> np.ndarray:
    w = _trace().weights.copy()
    w[7, 1, 0] = value
    return w


# Shard directories: every shard reads alone, the directory lies.
def _shards(d: Path, *traces: RoutingTrace) -> Path:
    d.mkdir()
    for i, tr in enumerate(traces):
        save_trace(tr, d / f"shard-{i:05d}.npz")
    return d


def _with_manifest(d: Path, shards: list[str]) -> Path:
    (d / "manifest.json").write_text(
        json.dumps({"shards": [{"file": f, "documents": 3, "tokens": 30} for f in shards]})
    )
    return d


SHARD_CASES: list[tuple[str, Callable[[Path], Path], tuple[str, ...]]] = [
    (
        "shards-disagree-n",
        lambda d: _shards(
            d / "sn",
            _trace(docs=("a", "b", "c")),
            RoutingTrace(
                experts=_trace(1).experts,
                doc_offsets=np.arange(0, 31, 10),
                num_experts=16,
                meta={"model": "toy", "documents": ["d", "e", "f"], "layers": [1, 2, 3]},
            ),
        ),
        ("shard-00001.npz", "N=16"),
    ),
    (
        "shards-disagree-layers",
        lambda d: _shards(
            d / "sl",
            _trace(docs=("a", "b", "c")),
            _trace(1, docs=("d", "e", "f"))
            .select_layers([0, 1, 2])
            .__class__(
                experts=_trace(1).experts,
                doc_offsets=np.arange(0, 31, 10),
                num_experts=N,
                meta={"model": "toy", "documents": ["d", "e", "f"], "layers": [0, 1, 2]},
            ),
        ),
        ("shard-00001.npz", "layers"),
    ),
    (
        "shards-disagree-model",
        lambda d: _shards(
            d / "sm", _trace(docs=("a", "b", "c")), _trace(1, docs=("d", "e", "f"), model="other")
        ),
        ("shard-00001.npz", "model"),
    ),
    (
        "document-in-two-shards",
        lambda d: _shards(d / "sd", _trace(docs=("a", "b", "c")), _trace(1, docs=("d", "b", "e"))),
        ("shard-00001.npz", "'b'", "shard-00000.npz"),
    ),
    (
        "shard-copied",
        lambda d: _copy_shard(_shards(d / "sc", _trace(docs=("a", "b", "c")))),
        ("shard-00000", "copy"),
    ),
    (
        "manifest-lists-missing-shard",
        lambda d: _with_manifest(
            _shards(d / "mf", _trace(docs=("a", "b", "c"))), ["shard-00000.npz", "shard-00001.npz"]
        ),
        ("manifest.json", "shard-00001.npz"),
    ),
    (
        "text-shard",
        lambda d: _text_shard(_shards(d / "ts", _trace(docs=("a", "b", "c")))),
        ("shard-00001.npz", "not a"),
    ),
]


def _copy_shard(d: Path) -> Path:
    tr = load_trace(d / "shard-00000.npz")
    meta = {k: v for k, v in tr.meta.items() if k != "documents"}  # unnamed: content decides
    save_trace(
        RoutingTrace(experts=tr.experts, doc_offsets=tr.doc_offsets, num_experts=N, meta=meta),
        d / "shard-00000.npz",
    )
    shutil.copy(d / "shard-00000.npz", d / "shard-00000-copy.npz")
    return d


def _text_shard(d: Path) -> Path:
    (d / "shard-00001.npz").write_text("not a shard\n")
    return d


def _ids(cases):
    return [c[0] for c in cases]


@pytest.mark.parametrize("case", TRACE_CASES + SHARD_CASES, ids=_ids(TRACE_CASES + SHARD_CASES))
def test_bad_trace_library(case, tmp_path):
    _, make, words = case
    path = make(tmp_path)
    with pytest.raises(InputError) as info:
        load_trace(path)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1 and str(path) in msg, msg
    assert "allow_pickle" not in msg and "array([" not in msg, msg
    for w in words:
        assert w in msg, (w, msg)


def _one_line(capsys, argv: list[str]) -> str:
    rc = main(argv)
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, (rc, cap.err)
    assert cap.out == ""
    return lines[0]


@pytest.mark.parametrize("case", TRACE_CASES + SHARD_CASES, ids=_ids(TRACE_CASES + SHARD_CASES))
def test_bad_trace_cli(case, tmp_path, capsys):
    _, make, words = case
    path = make(tmp_path)
    out = tmp_path / "out"
    line = _one_line(capsys, ["stats", str(path), "--out", str(out)])
    assert str(path) in line and "allow_pickle" not in line, line
    assert words[0] in line, line
    assert not out.exists()
    dst = tmp_path / "out.parquet"
    line = _one_line(capsys, ["convert", str(path), str(dst)])
    assert str(path) in line and words[0] in line, line
    assert not dst.exists()


# ------------------------------------------------------------------------------------------
# Parquet


def _parquet_cases():
    pytest.importorskip("pyarrow")


def _pq(d: Path, tr: RoutingTrace | None = None, name: str = "t.parquet") -> Path:
    from specmoe.formats.parquet import save_parquet

    return save_parquet(tr or _trace(), d / name)


def _pq_edit(d: Path, name: str, edit: Callable) -> Path:
    import pyarrow.parquet as pq

    path = _pq(d, name=name)
    table = edit(pq.read_table(path))
    pq.write_table(table, path)
    return path


def _pq_meta(table, **change):
    md = dict(table.schema.metadata)
    meta = json.loads(md[b"specmoe.meta"])
    meta.update(change)
    md[b"specmoe.meta"] = json.dumps(meta).encode()
    return table.replace_schema_metadata(md)


def _pq_column(table, col: str, fn: Callable):
    import pyarrow as pa

    i = table.column_names.index(col)
    values = table.column(col).to_pylist()
    fn(values)
    return table.set_column(i, col, pa.array(values, type=table.schema.field(col).type))


PARQUET_CASES: list[tuple[str, Callable[[Path], Path], tuple[str, ...]]] = [
    ("pq-text", lambda d: _write(d / "x.parquet", "no\n"), ("not a",)),
    ("pq-truncated", lambda d: _truncate(_pq(d, name="tr.parquet")), ("not a readable",)),
    ("pq-bit-flipped", lambda d: _flip_middle(_pq(d, name="f.parquet")), ("Parquet",)),
    (
        "pq-id-out-of-range",
        lambda d: _pq_edit(
            d, "r.parquet", lambda t: _pq_column(t, "layer_2", lambda v: v.__setitem__(3, [0, N]))
        ),
        ("expert id 8",),
    ),
    (
        "pq-id-repeated",
        lambda d: _pq_edit(
            d, "rp.parquet", lambda t: _pq_column(t, "layer_1", lambda v: v.__setitem__(0, [4, 4]))
        ),
        ("repeats",),
    ),
    (
        "pq-weights-nan",
        lambda d: _pq_edit(
            d,
            "wn.parquet",
            lambda t: _pq_column(t, "weights_1", lambda v: v.__setitem__(2, [float("nan"), 0.1])),
        ),
        ("weights",),
    ),
    (
        "pq-num-experts-string",
        lambda d: _pq_edit(d, "ns.parquet", lambda t: _pq_meta(t, num_experts="8")),
        ("number of experts",),
    ),
    (
        "pq-meta-nested",
        lambda d: _pq_edit(
            d, "mn.parquet", lambda t: _pq_meta(t, deep=json.loads("[" * 900 + "]" * 900))
        ),
        ("nested",),
    ),
]


def _flip_middle(path: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("case", PARQUET_CASES, ids=_ids(PARQUET_CASES))
def test_bad_parquet(case, tmp_path, capsys):
    pytest.importorskip("pyarrow")
    from specmoe.formats.parquet import load_parquet

    _, make, words = case
    path = make(tmp_path)
    with pytest.raises(InputError) as info:
        load_parquet(path)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1 and str(path) in msg, msg
    for w in words:
        assert w in msg, (w, msg)
    dst = tmp_path / "out.npz"
    line = _one_line(capsys, ["convert", str(path), str(dst)])
    assert str(path) in line and words[0] in line, line
    assert not dst.exists()


# ------------------------------------------------------------------------------------------
# Bandwidth profiles


def _profile_dict(tmp: Path) -> dict:
    sys.path.insert(0, str(Path(__file__).parent))
    from _synthetic_runs import write_profile

    return json.loads(write_profile(tmp / "good.json").read_text())


def _edit(path: str, value):
    def edit(d):
        *head, last = path.split(".")
        node = d
        for key in head:
            node = node[int(key)] if key.isdigit() else node[key]
        node[int(last) if last.isdigit() else last] = value

    return edit


PROFILE_CASES: list[tuple[str, Callable[[dict], None] | str, tuple[str, ...]]] = [
    ("fits-string", _edit("fits.per_slot", "fast"), ("fits.per_slot",)),
    ("fit-constant-string", _edit("fits.dedup.t_op", "1e-5"), ("fits.dedup",)),
    ("op-time-list", _edit("op_time.per_slot", [1.0]), ("op_time.per_slot",)),
    ("op-time-row-string", _edit("op_time.dedup.measured.0", "slow"), ("op_time.dedup.measured",)),
    ("layers-string", _edit("layers", "0,1,2,3"), ("layers",)),
    ("layers-bool", _edit("layers.0", True), ("layers",)),
    ("beta-nan", _edit("beta_slot.2", float("nan")), ("beta_slot[2]",)),
    ("u-bar-inf", _edit("u_bar.0", float("inf")), ("u_bar[0]",)),
    ("ceiling-string", _edit("ceiling_gbps", "20"), ("ceiling_gbps",)),
    ("source-string", _edit("source", "bench"), ("source",)),
    ("extra-list", _edit("extra", [1]), ("extra",)),
    ("peak-string", _edit("peak_gflops", "fast"), ("peak_gflops",)),
    ("peak-inf", _edit("peak_gflops", float("inf")), ("peak_gflops",)),
    ("n-bool", _edit("n.0", True), ("n",)),
    ("crossover-bool", _edit("crossover", True), ("crossover",)),
    ("model-string", _edit("model", "tiny-moe"), ("model",)),
    ("model-field-string", _edit("model.num_experts", "8"), ("model.num_experts",)),
    ("epsilon-string", _edit("epsilon.dedup", "0.1"), ("epsilon",)),
    ("device-number", _edit("device", 5), ("device",)),
    ("dtype-list", _edit("dtype", ["float32"]), ("dtype",)),
    ("implementations-string", _edit("implementations", "c"), ("implementations",)),
    ("truncated-json", "truncate", ("not a readable JSON",)),
    ("nested-json", "nested", ("nested",)),
    ("huge-json", "huge", ("larger than",)),
    ("not-an-object", "list", ("JSON object",)),
]


def _profile_file(tmp: Path, edit) -> Path:
    d = _profile_dict(tmp)
    path = tmp / "bad.json"
    if edit == "truncate":
        text = json.dumps(d)
        path.write_text(text[: len(text) // 2])
    elif edit == "nested":
        path.write_text(
            f'{{"schema": "{d["schema"]}", "extra": ' + "[" * 100000 + "]" * 100000 + "}"
        )
    elif edit == "huge":
        path.write_text(json.dumps(d) + " " * (17 << 20))
    elif edit == "list":
        path.write_text("[1, 2]")
    else:
        edit(d)
        path.write_text(json.dumps(d))
    return path


@pytest.mark.parametrize("case", PROFILE_CASES, ids=_ids(PROFILE_CASES))
def test_bad_profile(case, tmp_path, capsys):
    _, edit, words = case
    path = _profile_file(tmp_path, edit)
    with pytest.raises(InputError) as info:
        load_profile(path)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1 and str(path) in msg, msg
    for w in words:
        assert w in msg, (w, msg)
    spec = tmp_path / "spec.json"
    sys.path.insert(0, str(Path(__file__).parent))
    from _synthetic_runs import spec as synthetic_spec

    spec.write_text(json.dumps(synthetic_spec().to_dict()))
    out = tmp_path / "out"
    line = _one_line(
        capsys, ["bench", "--model", str(spec), "--from", str(path), "--out", str(out)]
    )
    assert str(path) in line and words[0] in line, line
    assert not out.exists()


def _cli_subprocess(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """A command in a child process (a regression that reads without limit must not hang us)."""
    return subprocess.run(
        [sys.executable, "-m", "specmoe.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
@pytest.mark.parametrize(
    "argv",
    [
        ["spec", "/dev/zero"],
        ["bench", "--model", "OLMoE-1B-7B-0125", "--from", "/dev/zero"],
    ],
    ids=["spec", "bench-profile"],
)
def test_dev_zero_reads_are_capped(argv):
    res = _cli_subprocess(argv)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-500:]
    assert "/dev/zero" in lines[0] and "larger than" in lines[0]


# ------------------------------------------------------------------------------------------
# Model specs and HF configs


def _config(tmp: Path, **change) -> Path:
    from specmoe.spec import PRESET_CONFIGS

    cfg = {k: v for k, v in PRESET_CONFIGS["OLMoE-1B-7B-0125"].items() if k != "_source"}
    cfg.update(change)
    d = tmp / "cfg"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d / "config.json"


CONFIG_CASES: list[tuple[str, dict, tuple[str, ...]]] = [
    ("top-k-above-n", {"num_experts_per_tok": 65}, ("num_experts_per_tok",)),
    ("hidden-negative", {"hidden_size": -2048}, ("hidden_size",)),
    ("hidden-string", {"hidden_size": "2048"}, ("hidden_size",)),
    ("experts-float", {"num_experts": 64.5}, ("num_experts",)),
    ("layers-list", {"num_hidden_layers": [16]}, ("num_hidden_layers",)),
    ("heads-zero", {"num_attention_heads": 0}, ("num_attention_heads",)),
    ("inter-bool", {"intermediate_size": True}, ("intermediate_size",)),
    ("vocab-string", {"vocab_size": "big"}, ("vocab_size",)),
    ("mlp-only-string", {"mlp_only_layers": "0"}, ("mlp_only_layers",)),
    ("dtype-unknown", {"torch_dtype": "float7"}, ("torch_dtype",)),
]


@pytest.mark.parametrize("case", CONFIG_CASES, ids=_ids(CONFIG_CASES))
def test_bad_hf_config(case, tmp_path, capsys):
    _, change, words = case
    path = _config(tmp_path, **change)
    with pytest.raises(InputError) as info:
        resolve_spec(path)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1 and str(path) in msg, msg
    for w in words:
        assert w in msg, (w, msg)
    line = _one_line(capsys, ["spec", str(path)])
    assert str(path) in line and words[0] in line, line


def test_nested_and_huge_spec_json(tmp_path, capsys):
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100000 + "]" * 100000)
    huge = tmp_path / "huge.json"
    huge.write_text("{}" + " " * (17 << 20))
    for path, word in ((nested, "nested"), (huge, "larger than")):
        with pytest.raises(InputError, match=word):
            resolve_spec(path)
        line = _one_line(capsys, ["spec", str(path)])
        assert str(path) in line and word in line


# ------------------------------------------------------------------------------------------
# Model checkpoints: safetensors only, headers checked, config fields checked


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    from specmoe.engine.models import byte_tokenizer, tiny_random_model

    d = tmp_path_factory.mktemp("tiny") / "olmoe"
    tiny_random_model("olmoe").save_pretrained(d)
    byte_tokenizer().save_pretrained(d)
    return d


def _clone(src: Path, dst: Path, *, weights: bool = True, **config) -> Path:
    shutil.copytree(src, dst)
    if not weights:
        (dst / "model.safetensors").unlink()
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _pickle_only(src: Path, dst: Path) -> Path:
    from safetensors.torch import load_file

    state = load_file(src / "model.safetensors")
    _clone(src, dst, weights=False)
    torch.save(state, dst / "pytorch_model.bin")
    return dst


def _st_edit(src: Path, dst: Path, edit: Callable[[bytearray], bytearray]) -> Path:
    _clone(src, dst)
    f = dst / "model.safetensors"
    f.write_bytes(bytes(edit(bytearray(f.read_bytes()))))
    return dst


def _flip(data: bytearray, at: int) -> bytearray:
    data[at] ^= 0xFF
    return data


CHECKPOINT_CASES: list[tuple[str, Callable[[Path, Path], Path], tuple[str, ...]]] = [
    ("pickle-only", _pickle_only, ("pytorch_model.bin", "safe_serialization=True")),
    ("no-weights", lambda s, d: _clone(s, d, weights=False), ("safetensors",)),
    (
        "st-truncated",
        lambda s, d: _st_edit(s, d, lambda b: b[: len(b) // 2]),
        ("model.safetensors", "truncated"),
    ),
    (
        "st-header-length-flipped",
        lambda s, d: _st_edit(s, d, lambda b: _flip(b, 3)),
        ("model.safetensors", "header"),
    ),
    (
        "st-header-json-flipped",
        lambda s, d: _st_edit(s, d, lambda b: _flip(b, 20)),
        ("model.safetensors", "header"),
    ),
    ("st-empty", lambda s, d: _st_edit(s, d, lambda b: bytearray()), ("model.safetensors",)),
    (
        "top-k-above-n",
        lambda s, d: _clone(s, d, num_experts_per_tok=9),
        ("config.json", "num_experts_per_tok"),
    ),
    ("hidden-negative", lambda s, d: _clone(s, d, hidden_size=-32), ("config.json", "hidden_size")),
    ("hidden-string", lambda s, d: _clone(s, d, hidden_size="32"), ("config.json", "hidden_size")),
    ("experts-float", lambda s, d: _clone(s, d, num_experts=8.5), ("config.json", "num_experts")),
    (
        "layers-list",
        lambda s, d: _clone(s, d, num_hidden_layers=[2]),
        ("config.json", "num_hidden_layers"),
    ),
]


@pytest.mark.parametrize("case", CHECKPOINT_CASES, ids=_ids(CHECKPOINT_CASES))
def test_bad_checkpoint(case, saved_model, tmp_path, capsys):
    from specmoe.engine.models import load_model

    _, make, words = case
    folder = make(saved_model, tmp_path / "m")
    with pytest.raises(InputError) as info:
        load_model(folder)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1 and str(folder) in msg, msg
    for w in words:
        assert w in msg, (w, msg)
    out = tmp_path / "out"
    line = _one_line(
        capsys, ["capture", "--model", str(folder), "--tokens", "8", "--quiet", "--out", str(out)]
    )
    assert str(folder) in line and words[0] in line, line
    assert not out.exists()


def test_pickle_checkpoint_is_never_unpickled(saved_model, tmp_path, monkeypatch):
    """A pickle-only folder is refused before anything opens the pickle."""
    from specmoe.engine.models import load_model

    folder = _pickle_only(saved_model, tmp_path / "m")
    calls = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(a) or {})
    monkeypatch.setattr(pickle, "load", lambda *a, **k: calls.append(a) or {})
    with pytest.raises(InputError, match="never unpickles"):
        load_model(folder)
    assert calls == []


def test_draft_model_safetensors_only(saved_model, tmp_path):
    from specmoe.engine.drafters import load_draft_model

    folder = _pickle_only(saved_model, tmp_path / "d")
    with pytest.raises(InputError, match=r"pytorch_model\.bin") as info:
        load_draft_model(folder)
    assert info.value.argument == "path" and str(folder) in str(info.value)
    truncated = _st_edit(saved_model, tmp_path / "t", lambda b: b[: len(b) // 2])
    with pytest.raises(InputError, match="truncated"):
        load_draft_model(truncated)
    assert load_draft_model(saved_model) is not None  # the good folder still loads


def test_loaders_ask_transformers_for_safetensors(saved_model, monkeypatch):
    import transformers

    from specmoe.engine.models import load_model

    seen = {}
    real = transformers.OlmoeForCausalLM.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        seen.update(kwargs)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.OlmoeForCausalLM, "from_pretrained", classmethod(spy))
    load_model(saved_model)
    assert seen.get("use_safetensors") is True and seen.get("local_files_only") is True


def test_device_names_are_checked(saved_model, capsys):
    from specmoe.engine.models import load_model

    with pytest.raises(InputError) as info:
        load_model(saved_model, device="tpu")
    assert info.value.argument == "device"
    line = _one_line(capsys, ["capture", "--model", str(saved_model), "--device", "tpu"])
    assert "--device" in line and "tpu" in line


def test_case_counts():
    """The table's size, reported with the change (cases tried, each an exit 2 with one line)."""
    tried = (
        len(TRACE_CASES)
        + len(SHARD_CASES)
        + len(PARQUET_CASES)
        + len(PROFILE_CASES)
        + len(CONFIG_CASES)
        + len(CHECKPOINT_CASES)
    )
    assert tried >= 80
