"""Routing recorded inside llama.cpp (specmoe.engines.llamacpp_routing) on the bundled model,
against transformers' own routing of the same tokens.

Skipped when llama.cpp is not built (``make llama-cpp``); with SPECMOE_REQUIRE_LLAMACPP=1 a
missing build fails these tests instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _llamacpp import needs_llamacpp

from specmoe.errors import InputError

pytestmark = needs_llamacpp

ROOT = Path(__file__).resolve().parents[1]
STDLIB_FILE = "textwrap.py"  # a stdlib source file (as in test_llamacpp_engine)
N = 640


@pytest.fixture(scope="module")
def ids(target):
    from specmoe.data.corpus import stdlib_root

    _, tok = target
    text = (stdlib_root() / STDLIB_FILE).read_text(encoding="utf-8")
    out = tok.encode(text, add_special_tokens=False)[:N]
    assert len(out) == N
    return out


@pytest.fixture(scope="module")
def recorded(gguf, ids):
    from specmoe.engines.llamacpp_routing import record_routing

    return record_routing(gguf, ids, batch=64, probs=True)


def test_experts_equal_transformers_on_99_percent_of_pairs(recorded, target, ids):
    from specmoe.engine.capture import capture_tokens
    from specmoe.engines.routing_check import agreement, top_gaps

    model, _ = target
    ref, _ = capture_tokens(model, ids, max_context=N)  # one window: the same positions
    # transformers' full router probabilities, for the near-tie test
    probs = _transformers_probs(model, ids)
    a = agreement(ref, recorded.experts, probs, recorded.probs)
    assert a.pairs == N * 4
    assert a.set_agreement >= 0.99, a
    # float32 weights in both engines: any disagreement is a near tie in transformers' own
    # probabilities (its m-th and (m+1)-th expert within 1e-3), and a swap at the boundary
    d = a.disagreements
    assert d["gap_below_0.001"] == d["count"] and d["boundary_swaps"] == d["count"]
    # and the two engines' router probabilities are the same numbers to float32 rounding
    assert a.probs_abs_diff["p99"] < 1e-4
    pm, gap = top_gaps(probs, 8)
    assert (gap > 0).all() and (pm > 0).all()


def _transformers_probs(model, ids):
    import torch

    from specmoe.engine.models import moe_layers

    out = []
    hooks = [
        m.register_forward_hook(lambda mod, a, o: out.append(o[0].double().softmax(-1)))
        for _, m in moe_layers(model)
    ]
    try:
        with torch.inference_mode():
            model.base_model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(out, dim=1).numpy()  # [T, L, N]


def test_shapes_and_llamacpps_own_order(recorded):
    e, p = recorded.experts, recorded.probs
    assert e.shape == (N, 4, 8) and p.shape == (N, 4, 64)
    assert recorded.layers == (0, 1, 2, 3)
    assert e.min() >= 0 and e.max() < 64
    assert all(len(set(row)) == 8 for row in e.reshape(-1, 8).tolist())
    assert np.allclose(p.sum(-1), 1.0, atol=1e-5)  # the softmax over the experts
    # its ids are the top 8 of its own probabilities, highest first
    chosen = np.take_along_axis(p, e, -1)
    assert (np.diff(chosen, axis=-1) <= 0).all()
    rest = p.copy()
    np.put_along_axis(rest, e, -1.0, -1)
    assert (chosen[..., -1] >= rest.max(-1)).all()


def test_batch_size_does_not_change_the_positions(gguf, ids, recorded):
    from specmoe.engines.llamacpp_routing import LlamaRouting

    n = 200
    with LlamaRouting(gguf, n_ctx=N, batch=1) as one:
        e1 = one.record(ids[:n]).experts
    with LlamaRouting(gguf, n_ctx=N, batch=7) as seven:  # ubatches across odd boundaries
        e7 = seven.record(ids[:n]).experts
        again = seven.record(ids[:n]).experts  # a second sequence: the cache starts empty
    ref = recorded.experts[:n]
    # the same top-m sets at every position: a batch of one takes ggml's one-row matrix path,
    # whose rounding may swap two near-tied experts' order (0.1% of pairs on an AVX2 machine),
    # never the set
    assert (np.sort(e1, -1) == np.sort(ref, -1)).all()
    assert (e1 == ref).all(-1).mean() >= 0.99
    assert (e7 == ref).all()
    assert (again == e7).all()


def test_a_prefix_is_routed_as_the_start_of_the_whole(gguf, ids, recorded):
    """Positions are in order: causal attention makes the first t tokens route the same
    whether or not more follow; a shifted sequence does not."""
    from specmoe.engines.llamacpp_routing import LlamaRouting

    with LlamaRouting(gguf, n_ctx=N, batch=64) as rec:
        head = rec.record(ids[:100]).experts
        shifted = rec.record(ids[1:101]).experts
    assert (head == recorded.experts[:100]).all()
    assert (shifted != recorded.experts[1:101]).any()


def test_tokenize_equals_transformers(gguf, target):
    from specmoe.data.corpus import stdlib_root
    from specmoe.engines.llamacpp_routing import LlamaRouting

    _, tok = target
    text = (stdlib_root() / STDLIB_FILE).read_text(encoding="utf-8")
    with LlamaRouting(gguf, n_ctx=64) as rec:
        assert rec.tokenize(text) == tok.encode(text, add_special_tokens=False)


def test_bad_inputs_are_one_error(gguf, tmp_path):
    from specmoe.engines.llamacpp_routing import LlamaRouting, record_routing

    with pytest.raises(InputError, match="no such GGUF file"):
        record_routing(tmp_path / "missing.gguf", [1, 2, 3])
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(InputError, match="could not load"):
        record_routing(junk, [1, 2, 3])
    with LlamaRouting(gguf, n_ctx=16, batch=4) as rec:
        with pytest.raises(InputError, match="empty"):
            rec.record([])
        with pytest.raises(InputError, match="exceed the context"):
            rec.record(list(range(rec.n_ctx + 1)))
        with pytest.raises(InputError, match="outside the vocabulary"):
            rec.record([1, 2, rec.n_vocab])
        assert rec.record([1, 2, 3]).experts.shape == (3, 4, 8)  # still usable after errors
    with pytest.raises(InputError, match="batch"):
        LlamaRouting(gguf, batch=0)


def test_script_missing_gguf_exits_2_with_one_line(tmp_path):
    missing = tmp_path / "missing.gguf"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cross_engine_routing.py"), "--gguf", str(missing)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing.gguf" in lines[0] and "no such GGUF file" in lines[0]
    assert proc.stdout == ""


def test_capture_into_shards_matches_the_transformers_capture(gguf, target, tmp_path):
    """The same documents, windows (context 96, overlap 24: several windows a document) and
    shard format as specmoe.engine.capture.capture_documents, routing from llama.cpp."""
    from specmoe.data.corpus import stdlib_root
    from specmoe.engine.capture import capture_documents
    from specmoe.engines.llamacpp_routing import capture_documents_gguf
    from specmoe.formats.trace import open_trace

    model, tok = target
    text = (stdlib_root() / STDLIB_FILE).read_text(encoding="utf-8")
    docs = [("a", text[:1500]), ("b", text[3000:4200])]
    opts = {"max_context": 96, "overlap": 24, "shard_tokens": 300, "progress": False}
    capture_documents(model, tok, docs, tmp_path / "hf", model_name="bundled", **opts)
    out = capture_documents_gguf(gguf, tok, docs, tmp_path / "ll", model_name="bundled", **opts)
    hf, ll = open_trace(tmp_path / "hf").load(), open_trace(out).load()
    assert (hf.doc_offsets == ll.doc_offsets).all() and hf.num_tokens > 300
    same = (np.sort(hf.experts, -1) == np.sort(ll.experts, -1)).all(-1)
    assert same.mean() >= 0.99
    # the weights: the router's probabilities of the chosen experts, highest first
    # (equal to float32 rounding on 99% of them, as the probabilities are above)
    d = np.abs(np.sort(hf.weights[same], -1) - np.sort(ll.weights[same], -1))
    assert np.quantile(d, 0.99) < 1e-4
    assert (np.diff(ll.weights, axis=-1) <= 0).all()
    shards = sorted((tmp_path / "ll").glob("shard-*.npz"))
    # a rerun finds every document done and writes nothing new
    capture_documents_gguf(gguf, tok, docs, tmp_path / "ll", model_name="bundled", **opts)
    assert sorted((tmp_path / "ll").glob("shard-*.npz")) == shards
    # a transformers capture folder is not resumed by llama.cpp (the engines do not mix)
    with pytest.raises(InputError, match="capture"):
        capture_documents_gguf(gguf, tok, docs, tmp_path / "hf", model_name="bundled", **opts)


def test_cross_engine_check_on_both_kv_cache_types(gguf, target):
    """The check the script runs, small: corpus tokens, windows, tokenization, both KV types.
    A float32 KV cache removes llama.cpp's float16 rounding of keys and values: its router
    probabilities are closer to transformers' (float32 throughout)."""
    from specmoe.engines.routing_check import cross_engine_check, transformers_reference

    model, tok = target
    ref = transformers_reference(
        "bundled", tokens=600, window=256, model=model, tokenizer=tok, model_name="bundled"
    )
    assert ref.experts.shape == (600, 4, 8) and len(ref.windows) >= 3
    out = {
        kv: cross_engine_check(ref, gguf, tokenizer=tok, batch=32, kv_type=kv)
        for kv in ("f16", "f32")
    }
    for rec in out.values():
        assert rec["tokens"] == 600 and rec["layers"] == [0, 1, 2, 3]
        t = rec["tokenization"]
        assert t["documents_equal"] == t["documents"] >= 1 and t["first_difference"] is None
        assert rec["agreement"]["set_agreement"] >= 0.99 and rec["agreement"]["passed"]
    p16 = out["f16"]["agreement"]["probs_abs_diff"]["p99"]
    p32 = out["f32"]["agreement"]["probs_abs_diff"]["p99"]
    assert p32 < 1e-6 < p16  # float32 rounding, against float16 keys and values
    assert out["f32"]["agreement"]["set_agreement"] >= 0.999


def test_capture_command_with_the_llamacpp_engine(gguf, tmp_path, capsys):
    from specmoe.cli import main
    from specmoe.formats.trace import open_trace

    out = tmp_path / "cap"
    argv = ["capture", "--engine", "llama.cpp", "--gguf", str(gguf), "--split", "validation"]
    assert main([*argv, "--tokens", "300", "--max-context", "128", "--out", str(out)]) == 0
    t = open_trace(out).load()
    assert t.num_tokens == 300 and t.experts.shape[1:] == (4, 8)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["capture"] == "teacher_forced:llama.cpp"
    capsys.readouterr()
    bad = [
        (["capture", "--engine", "llama.cpp", "--out", str(tmp_path / "x")], "needs --gguf"),
        (["capture", "--gguf", str(gguf), "--out", str(tmp_path / "x")], "only used with"),
        ([*argv[:4], str(tmp_path / "no.gguf"), "--out", str(tmp_path / "x")], "no such GGUF"),
    ]
    for args, words in bad:
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0]


def test_metadata_overrides_reach_the_model(gguf, ids, recorded):
    """A float override replaces the file's value at load (llama.cpp's --override-kv): the
    file's own epsilon routes as the file does, a very large one does not."""
    from specmoe.engines.llamacpp_routing import LlamaRouting

    key = "olmoe.attention.layer_norm_rms_epsilon"
    with LlamaRouting(gguf, n_ctx=N, batch=64) as rec:
        assert float(rec.meta(key)) == pytest.approx(1e-5)
    with LlamaRouting(gguf, n_ctx=N, batch=64, overrides={key: 1e-5}) as rec:
        same = rec.record(ids[:128]).experts
    with LlamaRouting(gguf, n_ctx=N, batch=64, overrides={key: 10.0}) as rec:
        other = rec.record(ids[:128]).experts
    assert (same == recorded.experts[:128]).all()
    assert (other != recorded.experts[:128]).any(-1).mean() > 0.5
