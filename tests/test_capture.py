"""Routing capture on tiny random models of every supported family, checked against a numpy
recomputation of each router's rule from the hidden states it received."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specmoe.cli import main  # noqa: E402
from specmoe.engine import families  # noqa: E402
from specmoe.engine.capture import (  # noqa: E402
    RouterRecorder,
    capture_documents,
    capture_generation,
    capture_tokens,
    route_logits,
    rule_for,
)
from specmoe.engine.families import family_names, get_family  # noqa: E402
from specmoe.engine.models import (  # noqa: E402
    FAMILIES,
    load_model,
    load_tokenizer,
    moe_experts,
    moe_layers,
    spec_for,
)
from specmoe.errors import InputError  # noqa: E402
from specmoe.formats.trace import load_trace, open_trace  # noqa: E402

TEXT = (
    "def route(tokens):\n    # every token picks m of N experts\n    return [t for t in "
    "tokens if t]\n"
) * 2
TIE = 1e-4  # a selection this close to its boundary may flip between float32 and float64


# ------------------------------------------------------------------------------------------
# An independent reference: each family's rule in float64 numpy, from the router's input


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _topk(score, k):
    ids = np.argsort(-score, axis=-1, kind="stable")[:, :k]
    srt = -np.sort(-score, axis=-1)
    margin = srt[:, k - 1] - srt[:, k]
    return ids, margin


def _groups(choice, n_group, topk_group, *, top2):
    n, n_exp = choice.shape
    g = choice.reshape(n, n_group, n_exp // n_group)
    gs = np.sort(g, -1)[..., -2:].sum(-1) if top2 else g.max(-1)
    keep, gmargin = _topk(gs, topk_group)
    mask = np.zeros_like(gs, dtype=bool)
    np.put_along_axis(mask, keep, True, axis=1)
    masked = np.where(np.repeat(mask, n_exp // n_group, axis=1), choice, -np.inf)
    return masked, gmargin


def reference_route(h, router, config, model_type):
    """(ids [n, m], weights [n, m], margin [n]) from hidden states h [n, H], by hand."""
    W = router.weight.detach().double().numpy()
    z = h @ W.T
    if getattr(router, "bias", None) is not None:
        z = z + router.bias.detach().double().numpy()
    k = config.num_experts_per_tok
    if model_type in ("olmoe", "qwen2_moe", "qwen3_moe", "mixtral"):
        p = _softmax(z)
        ids, margin = _topk(p, k)
        w = np.take_along_axis(p, ids, 1)
        if model_type == "mixtral" or config.norm_topk_prob:
            w = w / w.sum(1, keepdims=True)
    elif model_type == "gpt_oss":
        ids, margin = _topk(z, k)
        w = _softmax(np.take_along_axis(z, ids, 1))
    elif model_type == "deepseek_v2":
        p = _softmax(z)
        masked, gmargin = _groups(p, config.n_group, config.topk_group, top2=False)
        ids, margin = _topk(masked, k)
        margin = np.minimum(margin, gmargin)
        w = np.take_along_axis(p, ids, 1) * config.routed_scaling_factor
    elif model_type == "deepseek_v3":
        s = 1.0 / (1.0 + np.exp(-z))
        c = s + router.e_score_correction_bias.detach().double().numpy()
        masked, gmargin = _groups(c, config.n_group, config.topk_group, top2=True)
        ids, margin = _topk(masked, k)
        margin = np.minimum(margin, gmargin)
        w = np.take_along_axis(s, ids, 1)
        if config.norm_topk_prob:
            w = w / w.sum(1, keepdims=True)
        w = w * config.routed_scaling_factor
    else:  # pragma: no cover
        raise AssertionError(model_type)
    return ids, w, margin


def _router_inputs(model, ids):
    """Run the model once, keeping what each router received: {layer: h [n, H] float64}."""
    seen, handles = {}, []
    for layer, router in moe_layers(model):

        def pre(module, args, layer=layer):
            seen[layer] = args[0].detach().reshape(-1, args[0].shape[-1]).double().numpy()

        handles.append(router.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return seen


def _assert_same_sets(got, ref, margin, what):
    """Equal id sets per token; a difference is allowed only at a float near-tie."""
    same = np.sort(got, -1) == np.sort(ref, -1)
    bad = ~same.all(-1)
    assert not (bad & (margin >= TIE)).any(), f"{what}: id sets differ at tokens {np.nonzero(bad)}"
    assert bad.mean() < 0.05, f"{what}: too many near-ties ({bad.sum()})"


# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_capture_matches_independent_recomputation(model_type, tiny_moe, byte_tok):
    model = tiny_moe(model_type, top_k=3)  # 3 > topk_group=2 groups: group limits bite
    ids = byte_tok(TEXT)["input_ids"]
    experts, weights = capture_tokens(model, ids)
    spec = spec_for(model)
    T, L, m = experts.shape
    assert (T, L, m) == (len(ids), spec.num_moe_layers, spec.top_k)
    assert experts.min() >= 0 and experts.max() < spec.num_experts
    assert (np.sort(experts, -1)[..., 1:] != np.sort(experts, -1)[..., :-1]).all()
    assert np.all(np.diff(weights, axis=-1) <= 0), "slots must be sorted by weight"
    seen = _router_inputs(model, ids)
    layers = [i for i, _ in moe_layers(model)]
    assert layers == list(spec.moe_layer_indices) == sorted(seen)
    for pos, (layer, router) in enumerate(moe_layers(model)):
        ref_ids, ref_w, margin = reference_route(seen[layer], router, model.config, model_type)
        _assert_same_sets(experts[:, pos], ref_ids, margin, f"{model_type} layer {layer}")
        ok = margin >= TIE
        # weights, aligned by expert id
        for t in np.nonzero(ok)[0][:40]:
            got = dict(zip(experts[t, pos].tolist(), weights[t, pos].tolist()))
            want = dict(zip(ref_ids[t].tolist(), ref_w[t].tolist()))
            assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
    # a routing capture that selected the same experts everywhere could not tell families apart
    assert len(np.unique(experts[:, 0, 0])) > 1


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_route_logits_agrees_with_each_router(model_type, tiny_moe):
    """The logits-only path (for routers that return no ids) reproduces the router's choice."""
    model = tiny_moe(model_type, top_k=3)
    rule = rule_for(model)
    gen = torch.Generator().manual_seed(1)
    for _, router in moe_layers(model):
        h = torch.randn(64, model.config.hidden_size, generator=gen)
        with torch.no_grad():
            logits, w_model, ids_model = router(h)
            ids, w = route_logits(
                logits, rule, correction_bias=getattr(router, "e_score_correction_bias", None)
            )
        assert torch.equal(ids.sort(-1).values, ids_model.sort(-1).values)
        order, order_model = ids.argsort(-1), ids_model.argsort(-1)
        torch.testing.assert_close(w.gather(1, order), w_model.float().gather(1, order_model))


# ------------------------------------------------------------------------------------------
# The family registry: one file per family, each with a tiny model that captures and runs


def test_every_family_file_is_registered():
    import importlib
    import pkgutil

    files = {m.name for m in pkgutil.iter_modules(families.__path__) if not m.name.startswith("_")}
    registered = {f.name for f in FAMILIES.values()}
    assert files == registered, "a family file without its registry line, or the reverse"
    for name in files:
        family = importlib.import_module(f"specmoe.engine.families.{name}").FAMILY
        assert all(FAMILIES[t] is family for t in family.model_types)
    assert sorted(FAMILIES) == family_names() and len(FAMILIES) >= 7
    with pytest.raises(InputError, match=r"'llama' is not a supported .*olmoe.*qwen3_moe") as e:
        get_family("llama")
    assert e.value.argument == "model_type"


@pytest.mark.parametrize("model_type", family_names())
def test_every_family_has_a_tiny_model_that_captures_and_runs(model_type, tiny_moe, byte_tok):
    """A tiny model of every registered family: its routers and experts are found, its routing
    is captured, and the kernel switch and forced routing run on it."""
    from specmoe.engine.switch import ForcedRouting, KernelPolicy, KernelSwitch

    model = tiny_moe(model_type)
    family = get_family(model_type)
    assert type(model).__name__ == family.class_name
    spec = spec_for(model)
    routers, experts = moe_layers(model), moe_experts(model)
    assert len(routers) == len(experts) == spec.num_moe_layers >= 1
    assert spec.activation == family.activation and spec.expert_bias == family.expert_bias
    ids = byte_tok(TEXT)["input_ids"][:24]
    captured, weights = capture_tokens(model, ids)
    assert captured.shape == (len(ids), spec.num_moe_layers, spec.top_k)
    assert weights is not None and np.all(weights > 0)
    x = torch.tensor([ids])
    with torch.inference_mode():
        ref = model(x).logits
        with KernelSwitch(model, KernelPolicy("dedup", max_pass=32)) as sw:
            got = model(x).logits
        assert sw.calls["dedup"] == len(routers)
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)
        table = np.roll(captured, 1, axis=-1)[::-1].copy()  # other experts than its own
        with ForcedRouting(model, table), RouterRecorder(model) as rec:
            model(x)
            forced, _ = rec.pop()
    assert np.array_equal(np.sort(forced, -1), np.sort(table, -1))


class _OldStyle(torch.nn.Module):
    """A model whose routers are plain ``nn.Linear`` gates returning logits only."""

    def __init__(self, config, hidden=16, layers=2):
        super().__init__()
        self.config = config
        self.layers = torch.nn.ModuleList()
        for _ in range(layers):
            block = torch.nn.Module()
            block.mlp = torch.nn.Module()
            block.mlp.gate = torch.nn.Linear(hidden, config.num_local_experts, bias=False)
            self.layers.append(block)

    def forward(self, h):
        for block in self.layers:
            block.mlp.gate(h)
            h = torch.tanh(h + 0.1)


@pytest.mark.parametrize("model_type", ["mixtral", "olmoe", "deepseek_v2"])
def test_logits_only_router_goes_through_the_family_rule(model_type):
    from types import SimpleNamespace

    config = SimpleNamespace(
        model_type=model_type,
        num_experts_per_tok=3,
        num_local_experts=8,
        norm_topk_prob=True,
        n_group=4,
        topk_group=2,
        topk_method="group_limited_greedy",
        routed_scaling_factor=2.0,
    )
    torch.manual_seed(0)
    model = _OldStyle(config)
    h = torch.randn(50, 16)
    with RouterRecorder(model) as rec, torch.no_grad():
        model(h)
        experts, weights = rec.pop()
    x = h.double().numpy()
    for pos, (_, gate) in enumerate(moe_layers(model)):
        ref_ids, ref_w, margin = reference_route(x, gate, config, model_type)
        _assert_same_sets(experts[:, pos], ref_ids, margin, f"old-style {model_type}")
        np.testing.assert_allclose(weights[:, pos], -np.sort(-ref_w, -1), rtol=1e-4)
        x = np.tanh(x + 0.1)


def test_routing_is_causal_and_windows_are_bookkept(tiny_moe, byte_tok):
    model = tiny_moe("qwen3_moe")
    ids = byte_tok(TEXT)["input_ids"][:120]
    full, _ = capture_tokens(model, ids)
    prefix, _ = capture_tokens(model, ids[:40])
    assert np.array_equal(np.sort(prefix, -1), np.sort(full[:40], -1))  # no peeking ahead
    ctx, ov = 48, 12  # windows [0, 48), [36, 84) recording 48..83, [72, 120) recording 84..119
    win, _ = capture_tokens(model, ids, max_context=ctx, overlap=ov)
    assert win.shape == full.shape
    assert np.array_equal(np.sort(win[:ctx], -1), np.sort(full[:ctx], -1))
    second, _ = capture_tokens(model, ids[ctx - ov : 2 * ctx - ov])
    assert np.array_equal(np.sort(win[ctx : 2 * ctx - ov], -1), np.sort(second[ov:], -1))
    assert not np.array_equal(win, full)  # the windows' shorter context does change routing


def _docs():
    return [
        ("a.py", TEXT),
        ("b.py", "x = 1\n"),
        ("empty.py", ""),
        ("c.py", TEXT[::-1] * 2),
        ("d.py", "print('moe')\n" * 5),
        ("e.py", TEXT[:50]),
    ]


def test_documents_boundaries_counts_and_shards(tiny_moe, byte_tok, tmp_path):
    model = tiny_moe("olmoe")
    out = capture_documents(
        model,
        byte_tok,
        _docs(),
        tmp_path / "cap",
        shard_tokens=150,
        max_context=128,
        overlap=32,
        progress=False,
        source="test",
    )
    tr = load_trace(out)
    kept = [(n, t) for n, t in _docs() if t]
    assert tr.meta["documents"] == [n for n, _ in kept]
    assert np.diff(tr.doc_offsets).tolist() == [len(byte_tok(t)["input_ids"]) for _, t in kept]
    assert tr.layers == list(spec_for(model).moe_layer_indices) and tr.weights is not None
    for (name, text), d in zip(kept, tr.documents()):  # each document as if captured alone
        alone, _ = capture_tokens(model, byte_tok(text)["input_ids"], max_context=128, overlap=32)
        assert np.array_equal(d, alone), name
    reader = open_trace(out)
    assert len(reader.files) > 1
    names = [n for sh in reader.iter_shards() for n in sh.meta["documents"]]
    assert names == tr.meta["documents"]  # whole documents per shard, none repeated
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokens"] == tr.num_tokens and manifest["documents"] == tr.num_documents


def test_max_tokens_cuts_the_last_document(tiny_moe, byte_tok, tmp_path):
    model = tiny_moe("olmoe")
    out = capture_documents(
        model, byte_tok, _docs(), tmp_path / "cap", max_tokens=200, progress=False
    )
    tr = load_trace(out)
    assert tr.num_tokens == 200
    assert tr.meta["truncated"] == [tr.meta["documents"][-1]]


class _Boom(RuntimeError):
    pass


def test_resume_after_interruption_loses_and_repeats_nothing(tiny_moe, byte_tok, tmp_path):
    model = tiny_moe("mixtral")
    kw = dict(shard_tokens=100, max_context=128, progress=False)
    clean = load_trace(capture_documents(model, byte_tok, _docs(), tmp_path / "clean", **kw))

    calls = {"n": 0}

    def fail_on_fourth(module, args):
        calls["n"] += 1
        if calls["n"] == 4:
            raise _Boom("simulated failure")

    handle = model.base_model.layers[0].register_forward_pre_hook(fail_on_fourth)
    try:
        with pytest.raises(_Boom):
            capture_documents(model, byte_tok, _docs(), tmp_path / "cap", **kw)
    finally:
        handle.remove()
    partial = load_trace(tmp_path / "cap")
    assert 0 < partial.num_documents < clean.num_documents
    resumed = load_trace(capture_documents(model, byte_tok, _docs(), tmp_path / "cap", **kw))
    assert resumed.meta["documents"] == clean.meta["documents"]
    assert np.array_equal(resumed.doc_offsets, clean.doc_offsets)
    assert np.array_equal(resumed.experts, clean.experts)
    np.testing.assert_array_equal(resumed.weights, clean.weights)
    # a rerun of a finished capture adds nothing
    again = load_trace(capture_documents(model, byte_tok, _docs(), tmp_path / "cap", **kw))
    assert again.num_tokens == clean.num_tokens
    # another model cannot resume into this directory
    with pytest.raises(InputError, match="another directory") as info:
        capture_documents(
            tiny_moe("olmoe", num_experts=16), byte_tok, _docs(), tmp_path / "cap", **kw
        )
    assert info.value.argument == "out"


@pytest.mark.parametrize("model_type", ["olmoe", "gpt_oss", "deepseek_v2"])
def test_generation_matches_teacher_forcing(model_type, tiny_moe, byte_tok):
    model = tiny_moe(model_type)
    prompts = ["def f(x):", "import numpy as np\n"]
    n_new = 12
    tr = capture_generation(
        model,
        byte_tok,
        prompts,
        max_new_tokens=n_new,
        include_prompt=True,
        stop_at_eos=False,
        progress=False,
    )
    lens = [len(byte_tok(p)["input_ids"]) + n_new for p in prompts]
    assert np.diff(tr.doc_offsets).tolist() == lens
    for seq, doc, (a, b) in zip(
        tr.meta["token_ids"], tr.documents(), zip(tr.doc_offsets[:-1], tr.doc_offsets[1:])
    ):
        forced, fw = capture_tokens(model, seq)
        assert np.array_equal(np.sort(doc, -1), np.sort(forced, -1))
        np.testing.assert_allclose(np.sort(tr.weights[a:b], -1), np.sort(fw, -1), atol=1e-5)
    gen_only = capture_generation(
        model, byte_tok, prompts, max_new_tokens=n_new, stop_at_eos=False, progress=False
    )
    assert np.diff(gen_only.doc_offsets).tolist() == [n_new, n_new]
    assert np.array_equal(gen_only.experts[:n_new], tr.experts[lens[0] - n_new : lens[0]])


def test_greedy_tokens_match_transformers_generate(tiny_moe, byte_tok):
    model = tiny_moe("qwen2_moe")
    prompt = byte_tok("class Router:")["input_ids"]
    tr = capture_generation(
        model, byte_tok, ["class Router:"], max_new_tokens=10, stop_at_eos=False, progress=False
    )
    with torch.no_grad():
        ref = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=10,
            do_sample=False,
            min_new_tokens=10,
            pad_token_id=byte_tok.eos_token_id,
        )
    assert tr.meta["token_ids"][0] == ref[0, len(prompt) :].tolist()


def test_load_model_round_trip_and_errors(tiny_moe, byte_tok, tmp_path):
    model = tiny_moe("qwen3_moe")
    model.save_pretrained(tmp_path / "m")
    byte_tok.save_pretrained(tmp_path / "m")
    loaded, tok = load_model(tmp_path / "m"), load_tokenizer(tmp_path / "m")
    ids = tok(TEXT)["input_ids"]
    assert ids == byte_tok(TEXT)["input_ids"]
    assert np.array_equal(capture_tokens(loaded, ids)[0], capture_tokens(model, ids)[0])
    with pytest.raises(InputError, match="no such model directory"):
        load_model(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"no config\.json"):
        load_model(tmp_path / "empty")
    (tmp_path / "dense").mkdir()
    (tmp_path / "dense" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(InputError, match=r"supported: .*olmoe.*qwen3_moe"):
        load_model(tmp_path / "dense")


# ------------------------------------------------------------------------------------------
# CLI


def _one_line_error(capsys, argv):
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1, cap.err
    return lines[0]


def test_cli_bad_input_exit_2_one_line(capsys, tmp_path):
    assert "--model" in _one_line_error(capsys, ["capture", "--model", str(tmp_path / "no")])
    (tmp_path / "dense").mkdir()
    (tmp_path / "dense" / "config.json").write_text('{"model_type": "llama"}')
    assert "supported" in _one_line_error(capsys, ["capture", "--model", str(tmp_path / "dense")])
    assert "llama" in _one_line_error(capsys, ["capture", "--model", "random:llama", "--quiet"])
    missing = str(tmp_path / "missing.txt")
    assert missing in _one_line_error(
        capsys, ["capture", "--model", "random:olmoe", "--text", missing]
    )
    assert "--prompts" in _one_line_error(
        capsys, ["capture", "--model", "random:olmoe", "--generate", "4"]
    )
    assert "--tokens" in _one_line_error(
        capsys, ["capture", "--model", "random:olmoe", "--tokens", "0"]
    )
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9")
    assert "UTF-8" in _one_line_error(
        capsys, ["capture", "--model", "random:olmoe", "--text", str(bad)]
    )


def test_cli_shows_library_errors_as_their_flags(capsys, tmp_path, tiny_moe, byte_tok):
    """The library names its arguments (model, dtype); ``specmoe capture`` shows the flags."""
    tiny_moe("olmoe").save_pretrained(tmp_path / "m")
    byte_tok.save_pretrained(tmp_path / "m")
    capsys.readouterr()  # the save's progress lines
    with pytest.raises(InputError) as info:
        load_model(tmp_path / "m", dtype="float7")
    assert info.value.argument == "dtype" and "--" not in str(info.value)
    line = _one_line_error(capsys, ["capture", "--model", str(tmp_path / "m"), "--dtype", "float7"])
    assert "error: --dtype: 'float7' is not a torch dtype name" in line
    with pytest.raises(InputError) as info:
        load_model(tmp_path / "nowhere")
    assert info.value.argument == "model" and "--" not in str(info.value)
    line = _one_line_error(capsys, ["capture", "--model", str(tmp_path / "nowhere")])
    assert f"error: --model: {tmp_path / 'nowhere'}: no such model directory" in line


def test_cli_json_summary_matches_trace(capsys, tmp_path):
    text = tmp_path / "doc.txt"
    text.write_text(TEXT)
    out = tmp_path / "cap"
    assert (
        main(
            [
                "capture",
                "--model",
                "random:olmoe",
                "--text",
                str(text),
                "--json",
                "--quiet",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    tr = load_trace(out)
    assert (
        summary["tokens"],
        summary["documents"],
        summary["num_experts"],
        summary["top_k"],
        summary["layers"],
    ) == (tr.num_tokens, 1, tr.num_experts, tr.top_k, tr.layers)
    prompts = tmp_path / "p.txt"
    prompts.write_text("def f():\n\nclass A:\n")
    assert (
        main(
            [
                "capture",
                "--model",
                "random:mixtral",
                "--generate",
                "5",
                "--prompts",
                str(prompts),
                "--json",
                "--quiet",
                "--out",
                str(tmp_path / "g.npz"),
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    tr = load_trace(tmp_path / "g.npz")
    assert summary["documents"] == 2 == tr.num_documents
    assert summary["tokens"] == tr.num_tokens <= 10


def _bundled_dir() -> Path | None:
    try:
        from specmoe.data.corpus import bundled_model_dir
    except ImportError:
        return None
    path = Path(bundled_model_dir())
    return path if (path / "model.safetensors").is_file() else None


@pytest.mark.skipif(_bundled_dir() is None, reason="the bundled model is not built")
def test_capture_on_bundled_model(tmp_path):
    model, tok = load_model("bundled"), load_tokenizer("bundled")
    out = capture_documents(model, tok, [("doc", TEXT)], tmp_path / "cap", progress=False)
    tr = load_trace(out)
    spec = spec_for(model)
    assert (tr.num_experts, tr.top_k, tr.num_layers) == (
        spec.num_experts,
        spec.top_k,
        spec.num_moe_layers,
    )
    assert tr.num_tokens == len(tok(TEXT)["input_ids"])
    seen = _router_inputs(model, tok(TEXT)["input_ids"])
    for pos, (layer, router) in enumerate(moe_layers(model)):
        ref_ids, _, margin = reference_route(seen[layer], router, model.config, "olmoe")
        _assert_same_sets(tr.experts[:, pos], ref_ids, margin, f"bundled layer {layer}")


# ------------------------------------------------------------------------------------------
# Resuming only what was asked for


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"max_tokens": 150}, "max_tokens"),
        ({"source": "stdlib:validation"}, "source"),
        ({"overlap": 16}, "overlap"),
        ({"max_context": 64}, "max_context"),
        ({"documents": "other"}, "documents_sha256"),
    ],
)
def test_resume_with_other_options_is_refused(change, key, tiny_moe, byte_tok, tmp_path):
    model = tiny_moe("olmoe")
    kw = dict(shard_tokens=80, max_context=128, progress=False, source="stdlib:fit")
    kw["max_tokens"] = 100
    capture_documents(model, byte_tok, _docs(), tmp_path / "cap", **kw)
    before = sorted(p.name for p in (tmp_path / "cap").iterdir())
    docs = _docs()
    if change.get("documents") == "other":
        docs = [*docs[:-1], ("e.py", "other text\n")]
    kw.update({k: v for k, v in change.items() if k != "documents"})
    with pytest.raises(InputError, match=f"{key}=.*another directory") as info:
        capture_documents(model, byte_tok, docs, tmp_path / "cap", **kw)
    assert info.value.argument == "out" and str(tmp_path / "cap") in str(info.value)
    assert sorted(p.name for p in (tmp_path / "cap").iterdir()) == before
    # overwrite discards the old capture and captures again with the new options
    capture_documents(model, byte_tok, docs, tmp_path / "cap", overwrite=True, **kw)
    tr = load_trace(tmp_path / "cap")
    assert tr.meta[key] != tr.meta.get("never") and tr.meta["source"] == kw["source"]
    assert tr.num_tokens == kw["max_tokens"]


def test_cli_resume_with_other_tokens_or_split_exits_2(capsys, tmp_path):
    out = tmp_path / "cap"
    base = ["capture", "--model", "random:olmoe", "--quiet", "--out", str(out)]
    assert main([*base, "--tokens", "40", "--split", "fit"]) == 0
    capsys.readouterr()
    before = sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir())
    for extra in (
        ["--tokens", "80", "--split", "fit"],
        ["--tokens", "40", "--split", "validation"],
    ):
        line = _one_line_error(capsys, [*base, *extra])
        assert line.startswith("specmoe capture: error: --out: ") and str(out) in line
        assert "--overwrite" in line
        assert sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir()) == before
    assert main([*base, "--tokens", "80", "--split", "validation", "--overwrite"]) == 0
    tr = load_trace(out)
    assert tr.num_tokens == 80 and tr.meta["source"] == "stdlib:validation"


def test_cli_records_the_document_it_cut(capsys, tmp_path):
    """``--tokens`` on the corpus cuts one document, and the trace says which."""
    out = tmp_path / "cap"
    argv = ["capture", "--model", "random:olmoe", "--quiet", "--tokens", "3000"]
    assert main([*argv, "--shard-tokens", "1000", "--out", str(out)]) == 0
    tr = load_trace(out)
    assert tr.num_tokens == 3000 and tr.num_documents == 2
    assert tr.meta["truncated"] == [tr.meta["documents"][-1]]
    assert len(open_trace(out).files) > 1  # the cut document is not in the first shard
    assert main([*argv, "--out", str(tmp_path / "one.npz")]) == 0
    assert load_trace(tmp_path / "one.npz").meta["truncated"] == tr.meta["truncated"]
