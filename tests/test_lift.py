"""The lifted model (specmoe.engine.lift): the bundled OLMoE at wider shapes computes the same
function. Small targets keep it fast: hidden 512 (residual 128 -> 512, r = 1/4), 8 heads x 64
(head dim j -> 2j) in float32 and 4 heads x 128 (j -> 4j, every scale a power of two) in
bfloat16, experts 64 x 128, 6 layers (two extra).

References: the bundled model itself (logits, greedy tokens, routing recorded by the same
RouterRecorder), float64 numpy for the norm algebra, transformers' own RoPE for the head
placement, a brute-force router pass in the bundled model's space for the extra layers, and
the byte formula for the per-layer bytes.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specmoe.cli import main
from specmoe.engine import lift
from specmoe.errors import InputError

torch = pytest.importorskip("torch")

SMALL32 = lift.LiftShapes(hidden=512, heads=8, head_dim=64, intermediate=128, layers=6)
SMALL16 = lift.LiftShapes(hidden=512, heads=4, head_dim=128, intermediate=128, layers=6)
N_TOKENS = 600


def _source_config() -> dict:
    from specmoe.engine.models import resolve_model_dir

    return json.loads((resolve_model_dir("bundled") / "config.json").read_text())


@pytest.fixture(scope="module")
def lifted32(tmp_path_factory):
    """The fp32 lift, written by the command."""
    out = tmp_path_factory.mktemp("lift") / "fp32"
    t = SMALL32
    argv = ["lift", "--hidden", str(t.hidden), "--heads", str(t.heads)]
    argv += ["--intermediate", str(t.intermediate), "--layers", str(t.layers)]
    assert main([*argv, "--dtype", "fp32", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def lifted16(tmp_path_factory):
    from specmoe.engine.models import resolve_model_dir

    out = tmp_path_factory.mktemp("lift") / "bf16"
    lift.lift_checkpoint(resolve_model_dir("bundled"), out, target=SMALL16, dtype="bf16")
    return out


@pytest.fixture(scope="module")
def source():
    from specmoe.engine.models import load_model, load_tokenizer

    return load_model("bundled"), load_tokenizer("bundled")  # float32


@pytest.fixture(scope="module")
def tokens(source):
    from specmoe.data.corpus import documents

    _, tok = source
    docs = documents("validation", limit_tokens=N_TOKENS)
    ids = [t for _, d in docs for t in tok.encode(d, add_special_tokens=False)]
    return ids[:N_TOKENS]


# ------------------------------------------------------------------------------------------
# the algebra, against float64 references


@settings(max_examples=60, deadline=None)
@given(
    d=st.sampled_from([4, 32, 128]),
    factor=st.sampled_from([1, 2, 4, 16]),
    eps=st.floats(1e-8, 1e-2),
    seed=st.integers(0, 2**31 - 1),
    scale=st.floats(1e-3, 1e3),
)
def test_rmsnorm_with_rescaled_weight_and_eps_is_the_same_norm(d, factor, eps, seed, scale):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal(d) * scale, rng.standard_normal(d)
    cfg = {**_source_config(), "hidden_size": d, "rms_norm_eps": eps}
    cfg.update(num_attention_heads=1, num_key_value_heads=1)
    cfg["intermediate_size"] = 1
    tgt = lift.LiftShapes(d * factor, 1, d * factor, 1, cfg["num_hidden_layers"])
    plan = lift.plan_lift(cfg, tgt)
    ref = w * x / np.sqrt(np.mean(x**2) + eps)
    xn = np.zeros(d * factor)
    xn[:d] = x
    got = plan.norm_scale * w * xn[:d] / np.sqrt(np.mean(xn**2) + plan.eps_target)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-300)
    assert plan.eps_target == pytest.approx(eps / factor, rel=1e-15)


@pytest.mark.parametrize("stride", [1, 2, 4])
def test_head_dim_at_s_j_keeps_rope_pairs_frequencies_and_the_attention_scale(stride):
    from transformers import OlmoeConfig
    from transformers.models.olmoe.modeling_olmoe import OlmoeRotaryEmbedding, apply_rotary_pos_emb

    h, heads = 32, 4
    rope = {}
    for hd in (h, h * stride):
        cfg = OlmoeConfig(hidden_size=hd * heads, num_attention_heads=heads)
        rope[hd] = OlmoeRotaryEmbedding(cfg)
    g = torch.Generator().manual_seed(stride)
    q, k = torch.randn(1, heads, 50, h, generator=g), torch.randn(1, heads, 50, h, generator=g)
    pos = torch.arange(0, 2000, 40)[None]
    cos, sin = rope[h](q, pos)
    q0, k0 = apply_rotary_pos_emb(q, k, cos, sin)
    hn = h * stride
    place = torch.arange(h) * stride
    qn, kn = torch.zeros(1, heads, 50, hn), torch.zeros(1, heads, 50, hn)
    qn[..., place], kn[..., place] = q, k
    cos, sin = rope[hn](qn, pos)
    q1, k1 = apply_rotary_pos_emb(qn, kn, cos, sin)
    torch.testing.assert_close(q1[..., place], q0, rtol=1e-5, atol=1e-5)
    others = [i for i in range(hn) if i % stride]
    assert not others or float(q1[..., others].abs().max()) == 0.0
    # scores: 1/sqrt(h) in the source; 1/sqrt(hn) with q scaled by sqrt(s) in the target
    s0 = q0 @ k0.transpose(-1, -2) / math.sqrt(h)
    s1 = (q1 * math.sqrt(stride)) @ k1.transpose(-1, -2) / math.sqrt(hn)
    torch.testing.assert_close(s1, s0, rtol=1e-5, atol=1e-4)


def test_plan_of_the_preset_has_power_of_two_scales():
    plan = lift.plan_lift(_source_config(), lift.target_shapes())
    t = plan.target
    assert (t.hidden, t.heads, t.head_dim, t.intermediate, t.layers) == (2048, 16, 128, 1024, 16)
    assert plan.norm_scale == 0.25 and plan.q_norm_scale == 0.5 and plan.head_stride == 4
    assert plan.eps_target == 1e-5 / 16 and plan.bf16_exact_scales


@pytest.mark.parametrize(
    ("shapes", "argument"),
    [
        ((64, 2, 32, 64, 4), "hidden"),
        ((256, 2, 128, 64, 4), "heads"),
        ((192, 4, 48, 64, 4), "head_dim"),  # not a multiple of 32
        ((256, 4, 64, 32, 4), "intermediate"),
        ((256, 4, 64, 64, 3), "layers"),
        ((256, 4, 32, 64, 4), "heads"),  # 4 x 32 != 256
    ],
)
def test_a_target_that_cannot_hold_the_source_is_refused(shapes, argument):
    with pytest.raises(InputError) as exc:
        lift.plan_lift(_source_config(), lift.LiftShapes(*shapes))
    assert exc.value.argument == argument


# ------------------------------------------------------------------------------------------
# the lifted checkpoints


def _weights(folder):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_padding_writes_nothing_outside_the_residual_dims_and_extra_layers_add_zero(lifted32):
    w = _weights(lifted32)
    d, n_src = 128, 4
    assert float(w["model.embed_tokens.weight"][:, d:].abs().max()) == 0.0
    assert float(w["lm_head.weight"][:, d:].abs().max()) == 0.0
    for layer in range(SMALL32.layers):
        p = f"model.layers.{layer}."
        o = w[p + "self_attn.o_proj.weight"]
        downs = [w[p + f"mlp.experts.{e}.down_proj.weight"] for e in range(64)]
        assert float(o[d:].abs().max()) == 0.0
        assert max(float(x[d:].abs().max()) for x in downs) == 0.0
        gate = w[p + "mlp.experts.5.gate_proj.weight"]
        if layer >= n_src:  # adds exactly zero, but every gate/up row is a real one
            assert float(o.abs().max()) == 0.0 and max(float(x.abs().max()) for x in downs) == 0
            assert bool((gate.abs().sum(dim=1) > 0).all())
            src = w[f"model.layers.{layer % n_src}.mlp.gate.weight"]
            assert torch.equal(w[p + "mlp.gate.weight"], src)
        else:
            assert float(gate[64:].abs().max()) == 0.0


def test_fp32_lift_gives_the_bundled_logits_and_greedy_tokens(lifted32, source, tokens):
    from specmoe.engine.models import load_model
    from specmoe.engine.speculative import Engine

    model, _ = source
    lifted = load_model(lifted32)
    ids = torch.tensor([tokens])
    with torch.inference_mode():
        ref, got = model(ids).logits, lifted(ids).logits
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-3)
    assert bool((got.argmax(-1) == ref.argmax(-1)).all())
    with Engine(model) as a, Engine(lifted) as b:
        assert b.greedy(tokens[:300], 24) == a.greedy(tokens[:300], 24)


def test_routing_agrees_and_extra_layers_route_as_the_brute_force_says(lifted32, source, tokens):
    from specmoe.engine.lift_check import (
        extra_layer_routing,
        final_residual,
        routing_agreement,
        teacher_forced,
    )
    from specmoe.engine.models import load_model

    model, _ = source
    lifted = load_model(lifted32)
    ref, got = teacher_forced(model, tokens), teacher_forced(lifted, tokens)
    assert got.shape == (len(tokens), SMALL32.layers, 8)
    assert routing_agreement(got[:, :4], ref).min() >= 0.99
    expect = extra_layer_routing(model, final_residual(model, tokens), [4, 5])
    assert routing_agreement(got[:, 4:], expect).min() >= 0.99
    # the expectation is not trivially the trained layers' own routing
    assert routing_agreement(expect, ref[:, :2]).max() < 0.5


def test_bf16_lift_is_the_same_function_in_float32_and_within_bf16_noise_in_bf16(
    lifted16, source, tokens
):
    from specmoe.engine.lift_check import float32_by_layer, routing_agreement, teacher_forced
    from specmoe.engine.models import load_model
    from specmoe.engine.speculative import Engine

    model, _ = source
    lifted = load_model(lifted16, dtype="bfloat16")
    ref = teacher_forced(model, tokens)
    with float32_by_layer(lifted):
        assert routing_agreement(teacher_forced(lifted, tokens)[:, :4], ref).min() >= 0.99
        with Engine(model) as a, Engine(lifted) as b:
            assert b.greedy(tokens[:300], 16) == a.greedy(tokens[:300], 16)
    # computing in bf16, the lift moves routing no more than bf16 itself moves the source's
    source16 = load_model("bundled", dtype="bfloat16")
    noise = routing_agreement(teacher_forced(source16, tokens), ref)
    moved = routing_agreement(
        teacher_forced(lifted, tokens)[:, :4], teacher_forced(source16, tokens)
    )
    assert moved.mean() >= noise.mean() - 0.02


def test_bytes_per_layer_are_the_shapes_bytes(lifted32, lifted16):
    for folder, t, bpw in ((lifted32, SMALL32, 4), (lifted16, SMALL16, 2)):
        rows = lift.checkpoint_layer_bytes(folder)
        assert len(rows) == t.layers
        d, i = t.hidden, t.intermediate
        for r in rows:
            assert r == {
                "experts": 64 * 3 * d * i * bpw,
                "attention": 4 * d * d * bpw,
                "router": 64 * d * bpw,
                "norms": 4 * d * bpw,
            }


def test_preset_layer_bytes_are_olmoe_1b_7b_s():
    b = lift.preset_layer_bytes()
    assert b["experts"] == 64 * 3 * 2048 * 1024 * 2 == 805_306_368
    assert b["attention_router"] == (4 * 2048 * 2048 + 64 * 2048) * 2


def test_the_command_prints_bytes_and_json(lifted32, tmp_path, capsys):
    argv = ["lift", "--hidden", "256", "--heads", "4", "--intermediate", "64", "--layers", "5"]
    assert main([*argv, "--out", str(tmp_path / "a"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["layers"]) == 5 and out["plan"]["head_stride"] == 2
    assert out["layers"][0]["experts"] == 64 * 3 * 256 * 64 * 2
    assert out["layers"][0]["experts_equal"] is False  # not the preset's shapes
    assert (tmp_path / "a" / "tokenizer.json").is_file()


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--hidden", "64", "--heads", "2"], "--hidden"),
        (["--layers", "2"], "--layers"),
        (["--heads", "3"], "--heads"),
        (["--head-dim", "48", "--heads", "4", "--hidden", "192"], "--head-dim"),
        (["--dtype", "fp16"], "--dtype"),
        (["--model", "no/such/dir"], "--model"),
        (["--preset", "Mixtral-8x7B"], "--preset"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(extra, flag, tmp_path, capsys):
    assert main(["lift", "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and flag in err
    assert not (tmp_path / "o").exists()


def test_a_nonempty_out_is_refused_and_a_failed_lift_leaves_nothing(tmp_path, monkeypatch, capsys):
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep")
    argv = ["lift", "--hidden", "256", "--heads", "4", "--intermediate", "64", "--layers", "4"]
    assert main([*argv, "--out", str(full)]) == 2
    assert "--out" in capsys.readouterr().err and (full / "x").read_text() == "keep"

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(lift, "_config", boom)
    assert main([*argv, "--out", str(tmp_path / "new")]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]
