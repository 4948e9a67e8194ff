"""The kernel switch, forced routing and dummy-weight models (specmoe.engine.switch)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specmoe.engine.capture import RouterRecorder, route_logits, rule_for  # noqa: E402
from specmoe.engine.families import family_names  # noqa: E402
from specmoe.engine.models import moe_layers, tiny_random_model  # noqa: E402
from specmoe.engine.speculative import Engine, crop_cache, new_cache  # noqa: E402
from specmoe.engine.switch import (  # noqa: E402
    ForcedRouting,
    KernelPolicy,
    KernelSwitch,
    crossover_from_plan,
    forced_weights,
    parse_dummy,
)
from specmoe.errors import InputError  # noqa: E402

FAMILIES = ["olmoe", "qwen2_moe", "mixtral", "gpt_oss", "deepseek_v3"]


@pytest.fixture(scope="module")
def prompt():
    g = torch.Generator().manual_seed(5)
    return torch.randint(0, 256, (40,), generator=g).tolist()


# ------------------------------------------------------------------------------------------
# which kernel runs a pass


@pytest.mark.parametrize(
    "setting,crossover,expected",
    [
        ("per_slot", None, ["per_slot"] * 9),
        ("dedup", None, ["per_slot"] + ["dedup"] * 8),
        ("auto", 5, ["per_slot"] * 4 + ["dedup"] * 5),
        ("auto", 1, ["per_slot"] + ["dedup"] * 8),  # a one-token pass never deduplicates
        ("auto", None, ["per_slot"] * 9),
    ],
)
def test_kernel_for_pass_sizes(setting, crossover, expected):
    pol = KernelPolicy(setting, crossover=crossover, max_pass=9)
    assert [pol.kernel_for(n) for n in range(1, 10)] == expected
    assert pol.kernel_for(10) == "prefill"


def test_policy_rejects_bad_values():
    """The library names its own arguments; the run command maps them to its flags."""
    with pytest.raises(InputError, match="'fast' is unknown") as info:
        KernelPolicy("fast")
    assert info.value.argument == "setting"
    with pytest.raises(InputError, match="positive pass size") as info:
        KernelPolicy("auto", crossover=0)
    assert info.value.argument == "crossover"
    with pytest.raises(InputError, match="no preset") as info:
        parse_dummy("Nope-dummy")
    assert info.value.argument == "model"


def test_crossover_from_plan(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps({"crossover": 6, "k_star": []}))
    assert crossover_from_plan(tmp_path / "plan.json") == 6
    assert crossover_from_plan(tmp_path) == 6
    (tmp_path / "none.json").write_text(json.dumps({"crossover": None}))
    assert crossover_from_plan(tmp_path / "none.json") is None
    (tmp_path / "bad.json").write_text(json.dumps({"other": 1}))
    with pytest.raises(InputError, match="crossover"):
        crossover_from_plan(tmp_path / "bad.json")
    with pytest.raises(InputError, match="no such plan file"):
        crossover_from_plan(tmp_path / "missing.json")


def test_crossover_from_plan_errors_name_its_argument(tmp_path, capsys):
    from specmoe.cli import main

    (tmp_path / "zero.json").write_text(json.dumps({"crossover": 0}))
    for name in ("zero.json", "missing.json"):
        with pytest.raises(InputError) as info:
            crossover_from_plan(tmp_path / name)
        assert info.value.argument == "plan" and "--" not in str(info.value)
    # specmoe run shows it as its --plan flag, on one line, exit 2
    assert main(["run", "--kernel", "auto", "--plan", str(tmp_path / "zero.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"specmoe run: error: --plan: {tmp_path / 'zero.json'}: crossover 0 is not a positive "
        "pass size"
    ]


# ------------------------------------------------------------------------------------------
# the switch computes what transformers' own experts implementation computes


@pytest.mark.parametrize("model_type", FAMILIES)
def test_switch_matches_transformers_experts(model_type, prompt):
    net = tiny_random_model(model_type, seed=3)
    ids = torch.tensor([prompt[:12]])
    with torch.inference_mode():
        ref = net(ids).logits  # transformers' default implementation
        before = net.config._experts_implementation
        with KernelSwitch(net, KernelPolicy("per_slot", max_pass=16)) as sw:
            a = net(ids).logits
            sw.set_policy(KernelPolicy("dedup", max_pass=16))
            b = net(ids).logits
            assert sw.calls["per_slot"] == len(moe_layers(net))
            assert sw.calls["dedup"] == len(moe_layers(net))
        assert net.config._experts_implementation == before
        c = net(ids).logits
    assert torch.allclose(a, ref, atol=2e-5, rtol=1e-4)
    assert torch.allclose(b, ref, atol=2e-5, rtol=1e-4)
    assert torch.equal(c, ref)


@pytest.mark.parametrize("model_type", ["olmoe", "gpt_oss"])
def test_per_slot_and_dedup_give_the_same_greedy_tokens(model_type, prompt):
    """Both settings decode the same tokens; a divergence is allowed only at a near tie."""
    net = tiny_random_model(model_type, seed=11)
    runs = {}
    for setting in ("per_slot", "dedup"):
        with Engine(net, policy=KernelPolicy(setting)) as eng:
            runs[setting] = eng.greedy(prompt, 24)
    a, b = runs["per_slot"], runs["dedup"]
    if a != b:  # locate the first difference and require a near tie there
        j = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        with Engine(net, policy=KernelPolicy("per_slot")) as eng:
            kv = new_cache(net)
            eng.prefill(kv, prompt + a[:j])
            v = eng.forward(kv, [a[j - 1] if j else prompt[-1]])
        assert v.margin[0] < 1e-4
    # a batched verify pass with both kernels: the argmax rows agree
    with Engine(net, policy=KernelPolicy("per_slot")) as eng:
        kv = new_cache(net)
        eng.prefill(kv, prompt[:-1])
        rows = {}
        for setting in ("per_slot", "dedup"):
            eng.set_policy(KernelPolicy(setting))
            rows[setting] = eng.forward(kv, [prompt[-1], *a[:8]])
            assert rows[setting].kernel == setting
            crop_cache(kv, len(prompt) - 1)
    same = np.array(rows["per_slot"].tokens) == np.array(rows["dedup"].tokens)
    assert same.all() or (rows["per_slot"].margin[~same] < 1e-4).all()


def test_switch_rejects_a_second_switch(prompt):
    net = tiny_random_model("olmoe", seed=0)
    with KernelSwitch(net), pytest.raises(RuntimeError, match="another KernelSwitch"):
        KernelSwitch(net).install()


def test_prefill_skip_zeroes_the_experts_only_on_long_calls():
    net = tiny_random_model("olmoe", seed=0)
    sw = KernelSwitch(net, KernelPolicy("per_slot", max_pass=4), prefill="skip").install()
    ex = sw.experts[0]
    x = torch.randn(6, net.config.hidden_size)
    ids = torch.tensor([[0, 1]] * 6)
    w = torch.full((6, 2), 0.5)
    assert torch.equal(ex(x, ids, w), torch.zeros_like(x))
    assert ex(x[:3], ids[:3], w[:3]).abs().sum() > 0
    sw.remove()


# ------------------------------------------------------------------------------------------
# forced routing


def _random_table(rows, layers, n_exp, m, seed):
    rng = np.random.default_rng(seed)
    return np.stack(
        [
            np.stack([rng.choice(n_exp, m, replace=False) for _ in range(layers)])
            for _ in range(rows)
        ]
    )


@pytest.mark.parametrize("model_type", ["olmoe", "mixtral", "deepseek_v3"])
def test_forced_routing_is_what_the_recorder_sees(model_type, prompt):
    net = tiny_random_model(model_type, seed=2)
    n_layers = len(moe_layers(net))
    rule = rule_for(net)
    n_exp = int(moe_layers(net)[0][1].weight.shape[0])
    table = _random_table(50, n_layers, n_exp, rule.top_k, seed=1)
    forced = ForcedRouting(net, table).install()
    with RouterRecorder(net) as rec, torch.inference_mode():
        net(torch.tensor([prompt[:20]]))
        got, w = rec.pop()  # [20, L, m], by weight
    forced.remove()
    assert np.array_equal(np.sort(got, -1), np.sort(table[:20], -1))
    assert forced.position == 20
    assert np.all(w > 0)


def test_forced_routing_of_the_routers_own_choice_changes_nothing(prompt):
    """Forcing the ids a router would pick anyway gives the router's own weights and logits."""
    net = tiny_random_model("qwen3_moe", seed=4)  # norm_topk_prob=True
    ids = torch.tensor([prompt[:16]])
    with RouterRecorder(net) as rec, torch.inference_mode():
        ref = net(ids).logits
        own, _ = rec.pop()
    with ForcedRouting(net, own), torch.inference_mode():
        got = net(ids).logits
    assert torch.allclose(got, ref, atol=1e-6)


@pytest.mark.parametrize("model_type", family_names())
def test_forced_weights_of_the_rules_own_choice_are_its_weights(model_type):
    """forced_weights is route_logits with the ids given: on the ids the rule picks itself it
    gives the rule's weights bit for bit (a correction bias steers the choice only)."""
    net = tiny_random_model(model_type, seed=1, top_k=3)
    rule = rule_for(net)
    gen = torch.Generator().manual_seed(2)
    for _, router in moe_layers(net):
        bias = rule.correction_bias(router)
        z = torch.randn(32, router.weight.shape[0], generator=gen)
        ids, w = route_logits(z, rule, correction_bias=bias)
        assert torch.equal(forced_weights(z, ids, rule, correction_bias=bias), w)
        if bias is not None:  # the bias changes the choice, not the weights of given ids
            assert not torch.equal(route_logits(z, rule)[0], ids)
            assert torch.equal(forced_weights(z, ids, rule), w)


def test_forced_weights_follow_the_rule():
    net = tiny_random_model("olmoe", seed=0)  # softmax over N, no renormalisation
    rule = rule_for(net)
    z = torch.randn(5, 8)
    ids, w = route_logits(z, rule)
    assert torch.allclose(forced_weights(z, ids, rule), w)
    other = torch.tensor([[7, 6]] * 5)
    assert torch.allclose(forced_weights(z, other, rule), torch.softmax(z, -1)[:, [7, 6]])


def test_forced_routing_follows_positions_through_a_crop(prompt):
    net = tiny_random_model("olmoe", seed=6)
    table = _random_table(64, 2, 8, 2, seed=3)
    with Engine(net, forced=ForcedRouting(net, table)) as eng:
        kv = new_cache(net)
        eng.prefill(kv, prompt[:10])
        v = eng.forward(kv, prompt[10:14])  # positions 10..13
        assert np.array_equal(np.sort(v.routing, -1), np.sort(table[10:14], -1))
        crop_cache(kv, 11)
        v = eng.forward(kv, prompt[11:13])  # positions 11..12 again
        assert np.array_equal(np.sort(v.routing, -1), np.sort(table[11:13], -1))


def test_forced_routing_documents_and_errors():
    net = tiny_random_model("olmoe", seed=0)
    table = _random_table(30, 2, 8, 2, seed=0)
    fr = ForcedRouting(net, table, doc_offsets=[0, 10, 30], documents=["a.py", "b.py"])
    assert fr.use_document("b.py") == 1 and fr.offset == 10
    assert np.array_equal(fr.rows(25), table[(10 + np.arange(25)) % 30])
    with pytest.raises(InputError, match="no document"):
        fr.use_document("c.py")
    with pytest.raises(InputError, match="m=2"):
        ForcedRouting(net, table[:, :, :1])
    with pytest.raises(InputError, match="outside"):
        ForcedRouting(net, table + 8)


def test_run_shows_library_errors_as_their_flags(capsys):
    """parse_dummy and dummy_model name their arguments; ``specmoe run`` shows its flags."""
    from specmoe.cli import main

    assert main(["run", "--model", "Nope-dummy", "--tokens", "4"]) == 2
    assert "error: --model: Nope-dummy: no preset 'Nope'" in capsys.readouterr().err
    assert main(["run", "--model", "OLMoE-1B-7B-0125-dummy", "--layers", "99"]) == 2
    assert "error: --layers: must be in 1..16" in capsys.readouterr().err


def test_parse_dummy():
    assert parse_dummy("OLMoE-1B-7B-0125-dummy") == "OLMoE-1B-7B-0125"
    assert parse_dummy("olmoe-1b-7b-0125-DUMMY") == "OLMoE-1B-7B-0125"
    assert parse_dummy("bundled") is None
    with pytest.raises(InputError, match="no preset"):
        parse_dummy("Nope-dummy")


@pytest.mark.slow
def test_dummy_olmoe_at_preset_shapes_runs_forced_routing():
    """One decoder layer of OLMoE-1B-7B: bf16 experts at the preset's shapes, fp32 elsewhere."""
    from specmoe.engine.switch import dummy_model
    from specmoe.spec import PRESET_CONFIGS

    cfg = PRESET_CONFIGS["OLMoE-1B-7B-0125"]
    net = dummy_model("OLMoE-1B-7B-0125", layers=1, seed=0)
    ex = net.model.layers[0].mlp.experts
    assert tuple(ex.gate_up_proj.shape) == (64, 2 * cfg["intermediate_size"], cfg["hidden_size"])
    assert ex.gate_up_proj.dtype == torch.bfloat16
    assert net.lm_head.weight.dtype == torch.float32
    assert net.lm_head.weight.shape[0] == cfg["vocab_size"]
    table = _random_table(40, 1, 64, 8, seed=9)
    with Engine(net, forced=ForcedRouting(net, table), prefill="skip") as eng:
        kv = new_cache(net)
        eng.prefill(kv, list(range(20)))
        v = eng.forward(kv, [20, 21, 22])
        assert eng.switch.calls["prefill"] == 1
    assert np.array_equal(np.sort(v.routing, -1), np.sort(table[20:23], -1))
    assert len(v.tokens) == 3 and np.isfinite(v.margin).all()
