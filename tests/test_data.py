"""The embedded default: corpus split, documents, tokenizer and the bundled tiny OLMoE."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from specmoe.data import corpus
from specmoe.errors import InputError

REPO = Path(__file__).resolve().parents[1]
MODEL_DIR = corpus.bundled_model_dir()
HAS_MODEL = (MODEL_DIR / "model.safetensors").exists()
needs_model = pytest.mark.skipif(not HAS_MODEL, reason="bundled model not trained yet")


def _record() -> dict:
    return json.loads(corpus.split_path().read_text(encoding="utf-8"))


def _bucket(rel: str) -> int:  # the rule, written out independently of the module
    return int.from_bytes(hashlib.sha256(rel.encode()).digest(), "big") % 100


# ---- split ---------------------------------------------------------------------------------


def test_split_matches_the_hash_rule_and_is_disjoint():
    rec = _record()
    splits = rec["splits"]
    assert set(splits) == {"train", "fit", "validation"}
    seen: set[str] = set()
    for name, lo, hi in [("train", 0, 80), ("fit", 80, 90), ("validation", 90, 100)]:
        paths = splits[name]
        assert paths, name
        assert all(lo <= _bucket(p) < hi for p in paths), name
        # document order is the sha256 order
        digests = [hashlib.sha256(p.encode()).hexdigest() for p in paths]
        assert digests == sorted(digests)
        assert not seen.intersection(paths)
        seen.update(paths)
    assert all(p.endswith(".py") and not p.startswith("/") for p in seen)
    assert not any(
        {"test", "tests", "idle_test", "site-packages"}.intersection(p.split("/")) for p in seen
    )
    # about 80/10/10 (binomial spread at n ~ 700 is ~ 1.5 points)
    n = len(seen)
    assert abs(len(splits["train"]) / n - 0.8) < 0.06
    assert abs(len(splits["fit"]) / n - 0.1) < 0.05


@pytest.mark.skipif(
    ".".join(map(str, sys.version_info[:3])) != _record()["python_version"],
    reason="split.json was recorded on another python version",
)
def test_split_is_reproduced_from_this_stdlib():
    assert corpus.build_split()["splits"] == _record()["splits"]


def test_build_split_excludes_tests_site_packages_and_non_utf8(tmp_path):
    files = {
        "a.py": "x = 1\n",
        "pkg/b.py": "y = 2\n",
        "test/t.py": "z\n",
        "pkg/tests/u.py": "z\n",
        "site-packages/s.py": "z\n",
        "idlelib/idle_test/i.py": "z\n",
        "notes.txt": "z\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "latin.py").write_bytes("s = 'caf\xe9'\n".encode("latin-1"))
    rec = corpus.build_split(tmp_path)
    got = sorted(p for ps in rec["splits"].values() for p in ps)
    assert got == ["a.py", "pkg/b.py"]
    for name, ps in rec["splits"].items():
        for p in ps:
            assert corpus.split_of(p) == name


# ---- documents -----------------------------------------------------------------------------


def test_documents_are_the_stdlib_files_in_split_order():
    docs = corpus.documents("validation")
    root = Path(sysconfig.get_paths()["stdlib"])
    listed = _record()["splits"]["validation"]
    names = [n for n, _ in docs]
    assert names == [p for p in listed if (root / p).exists() and (root / p).stat().st_size]
    assert len(docs) >= 0.9 * len(listed)
    for name, text in docs[:10]:
        assert text == (root / name).read_text(encoding="utf-8")
        ast.parse(text)  # real Python source


def test_bad_split_names_the_valid_ones():
    with pytest.raises(InputError, match=r"^split: unknown split 'test' .*train, fit, validation"):
        corpus.documents("test")
    with pytest.raises(InputError, match=r"^split: 'train' has no bundled trace .*fit, validation"):
        corpus.bundled_trace_path("train")
    assert {ei.argument for ei in _errors(corpus.documents, "test")} == {"split"}
    for bad in (0, -3, 2.5):
        (err,) = _errors(corpus.documents, "fit", limit_tokens=bad)
        assert err.argument == "limit_tokens" and str(err).startswith("limit_tokens: ")


def _errors(fn, *args, **kw) -> list[InputError]:
    try:
        fn(*args, **kw)
    except InputError as exc:
        return [exc]
    return []


def test_missing_files_are_skipped_with_a_warning(tmp_path, monkeypatch, capsys):
    listed = _record()["splits"]["fit"]
    (tmp_path / listed[1]).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / listed[1]).write_text("only = 1\n")
    monkeypatch.setattr(corpus, "stdlib_root", lambda: tmp_path)
    docs = corpus.documents("fit")
    assert docs == [(listed[1], "only = 1\n")]
    err = capsys.readouterr().err
    assert f"{len(listed) - 1} of {len(listed)} fit documents" in err


def test_paths_live_in_the_package():
    pkg = Path(corpus.__file__).parent
    assert corpus.bundled_model_dir() == pkg / "tiny_olmoe"
    assert corpus.bundled_draft_dir() == pkg / "tiny_draft"
    assert corpus.bundled_trace_path("fit") == pkg / "traces" / "fit.npz"
    assert corpus.bundled_trace_path("validation") == pkg / "traces" / "validation.npz"


# ---- tokenizer -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODEL_DIR), local_files_only=True)


def test_tokenizer_round_trips_text(hf_tokenizer):
    assert hf_tokenizer.eos_token == "<|endoftext|>"
    assert hf_tokenizer.eos_token_id == 0 and hf_tokenizer.pad_token_id == 1
    assert len(hf_tokenizer) == 4096
    texts = [t for _, t in corpus.documents("validation")[:5]]
    texts.append("naïve café ✓ — 𝔘𝔫𝔦𝔠𝔬𝔡𝔢\ttabs\r\nand\x00bytes")
    for text in texts:
        ids = hf_tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        assert hf_tokenizer.decode(ids) == text
    # BPE compresses Python source well below one token per byte
    text = texts[0]
    assert len(hf_tokenizer(text)["input_ids"]) < 0.5 * len(text.encode())


def test_limit_tokens_cuts_at_the_limit(hf_tokenizer):
    docs = corpus.documents("fit", limit_tokens=3000)
    full = corpus.documents("fit")
    assert [n for n, _ in docs] == [n for n, _ in full[: len(docs)]]
    assert all(t == ft for (_, t), (_, ft) in zip(docs[:-1], full))
    assert full[len(docs) - 1][1].startswith(docs[-1][1])
    total = sum(len(hf_tokenizer(t, add_special_tokens=False)["input_ids"]) for _, t in docs)
    assert abs(total - 3000) <= 2


# ---- the bundled model ---------------------------------------------------------------------


@needs_model
def test_checkpoint_size_limit():
    size = (MODEL_DIR / "model.safetensors").stat().st_size
    assert size <= 25 * 10**6


@pytest.fixture(scope="module")
def hf_model():
    from transformers import OlmoeForCausalLM

    return OlmoeForCausalLM.from_pretrained(
        str(MODEL_DIR), local_files_only=True, dtype="float32"
    ).eval()


@needs_model
def test_bundled_model_loads_offline_and_is_olmoe(hf_model, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = json.loads((MODEL_DIR / "config.json").read_text())
    assert cfg["model_type"] == "olmoe"
    assert cfg["num_experts"] == 64 and cfg["num_experts_per_tok"] == 8
    assert cfg["norm_topk_prob"] is False
    assert cfg["max_position_embeddings"] >= 4096
    assert 0.0 < cfg["router_aux_loss_coef"]
    from specmoe.spec import ModelSpec

    spec = ModelSpec.from_hf_config(cfg)
    assert (spec.num_experts, spec.top_k) == (64, 8)


@needs_model
def test_bundled_model_beats_a_unigram_model_by_a_wide_margin(hf_model, hf_tokenizer):
    """Validation text costs the model far fewer nats/token than the token frequencies of the
    fit split (add-one smoothed) predict: it has learned context, not only frequencies."""
    import torch

    vocab = len(hf_tokenizer)
    counts = np.ones(vocab)
    for _, text in corpus.documents("fit"):
        ids = hf_tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        counts += np.bincount(ids, minlength=vocab)
    logp = np.log(counts / counts.sum())
    model_nats = unigram_nats = 0.0
    n = 0
    for _, text in corpus.documents("validation")[:8]:
        ids = hf_tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"][:1024]
        if len(ids) < 2:
            continue
        x = torch.tensor([ids])
        with torch.no_grad():
            out = hf_model(x, labels=x)
        assert torch.isfinite(out.logits).all()
        model_nats += out.loss.item() * (len(ids) - 1)
        unigram_nats += -logp[ids[1:]].sum()
        n += len(ids) - 1
    assert n > 3000
    assert model_nats / n < unigram_nats / n - 1.0, (model_nats / n, unigram_nats / n)


def _train_module():
    spec = importlib.util.spec_from_file_location(
        "train_tiny_model", REPO / "scripts" / "train_tiny_model.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@needs_model
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_exported_weights_reproduce_the_training_module(attn):
    """HF's OlmoeForCausalLM (its own expert loop and attention) against the vectorised module."""
    import torch
    from safetensors.torch import load_file
    from transformers import OlmoeForCausalLM

    mod = _train_module()
    cfg = json.loads((MODEL_DIR / "config.json").read_text())
    # HF's own per-expert loop ("eager"), not the grouped product the training module also uses
    hf = OlmoeForCausalLM.from_pretrained(
        str(MODEL_DIR),
        local_files_only=True,
        dtype=torch.float32,
        attn_implementation=attn,
        experts_implementation="eager",
    ).eval()
    # the file keeps OLMoE's per-expert tensor names; HF fuses them on load, as the module does
    stored = load_file(str(MODEL_DIR / "model.safetensors"))
    w = stored["model.layers.1.mlp.experts.5.up_proj.weight"].float()  # [I, H]
    fused = hf.model.layers[1].mlp.experts.gate_up_proj[5]  # [2I, H]: gate rows, then up rows
    assert torch.equal(fused[cfg["intermediate_size"] :], w)
    ours = mod.TinyOlmoe(cfg)
    missing, unexpected = ours.load_state_dict(hf.state_dict(), strict=False)
    assert not unexpected and not missing
    ours.eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, cfg["vocab_size"], (2, 96), generator=gen)
    with torch.no_grad():
        ref = hf(ids, output_router_logits=True)
        got, router_logits, router_ids = ours(ids)
    assert torch.allclose(got, ref.logits, atol=1e-4, rtol=0)
    for lg_ref, lg in zip(ref.router_logits, router_logits):
        assert torch.allclose(lg, lg_ref.reshape(lg.shape), atol=1e-4, rtol=0)
    # the aux loss of the training module is HF's load-balancing loss
    from transformers.models.olmoe.modeling_olmoe import load_balancing_loss_func

    want = load_balancing_loss_func(tuple(ref.router_logits), 64, 8)
    assert torch.allclose(mod.load_balancing_loss(router_logits, router_ids, 64), want, atol=1e-5)


def test_training_module_matches_hf_from_random_init_with_renormalised_topk():
    """The same equality on a fresh random model, covering norm_topk_prob=True and GQA-free
    widths, without the bundled checkpoint."""
    import argparse

    import torch
    from transformers import OlmoeConfig, OlmoeForCausalLM

    mod = _train_module()
    a = argparse.Namespace(
        hidden=32, intermediate=16, layers=2, heads=4, max_positions=256, aux_coef=0.01
    )
    cfg = mod.make_config(a, 97, 0, 1)
    cfg["norm_topk_prob"] = True
    torch.manual_seed(1)
    ours = mod.TinyOlmoe(cfg)
    ours.init_weights(0.2)
    hf = OlmoeForCausalLM(OlmoeConfig(**cfg, experts_implementation="eager")).eval()
    hf.load_state_dict(ours.state_dict(), strict=False)
    ours.eval()
    ids = torch.randint(0, 97, (3, 40))
    with torch.no_grad():
        got = ours(ids)[0]
        ref = hf(ids).logits
    assert torch.allclose(got, ref, atol=1e-4, rtol=0)


@needs_model
def test_reported_routing_is_not_degenerate():
    res = json.loads((REPO / "results" / "tiny_model_train.json").read_text())
    r = res["routing_on_validation"]
    assert np.all(np.asarray(r["entropy_nats"]) > 0.8 * np.log(64))
    assert r["rho2_layer_mean"] > 0.125
    assert res["checkpoint_bytes"] == (MODEL_DIR / "model.safetensors").stat().st_size


# ---- the bundled traces --------------------------------------------------------------------

HAS_TRACES = all(corpus.bundled_trace_path(s).exists() for s in ("fit", "validation"))


@pytest.mark.skipif(not (HAS_TRACES and HAS_MODEL), reason="bundled traces not recorded yet")
@pytest.mark.parametrize("split", ["fit", "validation"])
def test_bundled_traces_are_canonical_and_of_their_split(split):
    from specmoe.formats.trace import load_trace

    tr = load_trace(corpus.bundled_trace_path(split))
    cfg = json.loads((MODEL_DIR / "config.json").read_text())
    assert tr.num_tokens >= 100_000
    assert (tr.num_experts, tr.top_k) == (cfg["num_experts"], cfg["num_experts_per_tok"])
    assert tr.num_layers == cfg["num_hidden_layers"]
    assert tr.meta["model"] == MODEL_DIR.name and split in tr.meta["source"]
    names = tr.meta["documents"]
    assert len(names) == tr.num_documents
    docs = [n for n, _ in corpus.documents(split)]  # non-empty files, in split order
    assert names == docs[: len(names)]


@pytest.mark.skipif(not (HAS_TRACES and HAS_MODEL), reason="bundled traces not recorded yet")
def test_bundled_fit_trace_is_the_routing_of_the_bundled_model(hf_model, hf_tokenizer):
    """Re-route the first fit document with the bundled model: the same experts, slot by slot."""
    import torch

    from specmoe.formats.trace import load_trace

    tr = load_trace(corpus.bundled_trace_path("fit"))
    name, text = corpus.documents("fit")[0]
    assert name == tr.meta["documents"][0]
    ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    want = tr.experts[: tr.doc_offsets[1]]  # [t, L, m]
    assert len(ids) == len(want) <= hf_model.config.max_position_embeddings
    with torch.no_grad():
        out = hf_model(torch.tensor([ids]), output_router_logits=True)
    for li, logits in enumerate(out.router_logits):  # [t, N] per layer
        top = torch.topk(torch.softmax(logits.float(), -1), 8, dim=-1).indices.numpy()
        agree = np.mean(np.sort(top, -1) == np.sort(want[:, li], -1))
        assert agree > 0.999, (li, agree)  # float ties aside, the same expert sets


# ---- the bundled draft model ---------------------------------------------------------------

DRAFT_DIR = corpus.bundled_draft_dir()
needs_draft = pytest.mark.skipif(
    not (DRAFT_DIR / "model.safetensors").exists() or not HAS_MODEL,
    reason="bundled draft model not trained yet",
)


@needs_draft
def test_draft_is_small_dense_and_shares_the_target_tokenizer():
    assert (DRAFT_DIR / "model.safetensors").stat().st_size <= 5 * 10**6
    cfg = json.loads((DRAFT_DIR / "config.json").read_text())
    assert "num_experts" not in cfg and cfg["vocab_size"] == 4096
    assert (DRAFT_DIR / "tokenizer.json").read_bytes() == (
        MODEL_DIR / "tokenizer.json"
    ).read_bytes()


@needs_draft
def test_draft_agrees_with_the_target_on_validation_text(hf_model, hf_tokenizer):
    """Greedy next-token agreement on validation text, far above chance (1/4096)."""
    import torch
    from transformers import AutoModelForCausalLM

    draft = AutoModelForCausalLM.from_pretrained(
        str(DRAFT_DIR), local_files_only=True, dtype=torch.float32
    ).eval()
    text = corpus.documents("validation")[3][1]
    ids = torch.tensor(
        [hf_tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"][:512]]
    )
    with torch.no_grad():
        agree = (draft(ids).logits.argmax(-1) == hf_model(ids).logits.argmax(-1)).float().mean()
    assert agree.item() > 0.3
    res = json.loads((REPO / "results" / "tiny_draft_train.json").read_text())
    assert res["checkpoint_bytes"] == (DRAFT_DIR / "model.safetensors").stat().st_size
    assert 0.3 < res["greedy_agreement_with_target"] < 1.0
