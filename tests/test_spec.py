"""ModelSpec: presets against the models' published parameter counts, HF config parsing."""

import json

import pytest

from specmoe.errors import InputError
from specmoe.spec import ModelSpec, get_preset, preset_names, resolve_spec

# Total parameters published on each model's card (billions).
PUBLISHED_TOTAL_B = {
    "OLMoE-1B-7B-0125": 6.92,
    "Qwen3-30B-A3B": 30.5,
    "gpt-oss-20b": 20.9,
    "DeepSeek-V2-Lite": 15.7,
    "Mixtral-8x7B": 46.7,
    "Qwen3-235B-A22B": 235.0,
}


def total_params(s: ModelSpec) -> int:
    # experts + weights read once per pass + the input embedding (read a row at a time)
    return (
        s.num_moe_layers * s.num_experts * s.expert_params
        + s.dense_params
        + s.vocab_size * s.hidden_size
    )


@pytest.mark.parametrize("name", list(PUBLISHED_TOTAL_B))
def test_preset_totals_match_published_counts(name):
    s = get_preset(name)
    assert total_params(s) / 1e9 == pytest.approx(PUBLISHED_TOTAL_B[name], rel=0.01)
    assert s.source.startswith("config.json")


def test_olmoe_bytes_exact():
    s = get_preset("olmoe-1b-7b-0125")  # case-insensitive
    assert (s.num_experts, s.top_k, s.num_moe_layers) == (64, 8, 16)
    assert s.expert_bytes == 3 * 2048 * 1024 * 2
    assert s.total_expert_bytes == 16 * s.expert_bytes
    assert s.kv_bytes_per_token == 2 * 16 * 16 * 128 * 2
    assert s.with_dtype("fp32").expert_bytes == 2 * s.expert_bytes
    assert s.q == pytest.approx(1 - 8 / 64)


def test_deepseek_moe_layers_and_shared_experts():
    s = get_preset("DeepSeek-V2-Lite")
    assert s.num_moe_layers == 26 and s.moe_layer_indices[0] == 1
    assert s.num_shared_experts == 2 and s.top_k == 6


def test_gpt_oss_activation_and_bias():
    s = get_preset("gpt-oss-20b")
    assert s.activation == "swiglu_oai" and s.expert_bias
    assert s.expert_params == 3 * 2880 * 2880 + 2 * 2880 + 2880


def test_presets_listed():
    assert set(preset_names()) == set(PUBLISHED_TOTAL_B)


def test_unknown_preset_lists_valid_names():
    with pytest.raises(InputError, match="OLMoE-1B-7B-0125"):
        get_preset("gpt-5")


def test_from_hf_config_file_and_dir(tmp_path):
    cfg = {
        "model_type": "qwen2_moe",
        "hidden_size": 64,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "decoder_sparse_step": 2,
        "vocab_size": 100,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    s = resolve_spec(tmp_path)
    assert s.moe_layer_indices == (1, 3)
    assert s.num_shared_experts == 1
    # dense: attention (4 layers) + per MoE layer (router + shared expert) + dense MLPs + head
    attn = 4 * 64 * 64
    dense = 4 * attn + 2 * (64 * 16 + 3 * 64 * 96) + 2 * 3 * 64 * 32 + 100 * 64
    assert s.dense_params == dense
    assert ModelSpec.from_hf_config(tmp_path / "config.json") == s


def test_spec_json_round_trip(tmp_path):
    s = get_preset("Qwen3-30B-A3B")
    p = tmp_path / "spec.json"
    p.write_text(json.dumps(s.to_dict()))
    assert resolve_spec(p) == s


@pytest.mark.parametrize(
    "bad",
    [
        {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 2},
        {
            "num_experts": 4,
            "num_experts_per_tok": 4,
            "hidden_size": 8,
            "num_hidden_layers": 1,
            "intermediate_size": 8,
        },
    ],
)
def test_bad_configs_are_input_errors(bad):
    with pytest.raises(InputError):
        ModelSpec.from_hf_config(bad)


def test_bad_paths(tmp_path):
    with pytest.raises(InputError, match="neither a preset"):
        resolve_spec(tmp_path / "missing")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="not a readable JSON"):
        resolve_spec(tmp_path)


def test_with_layers():
    s = get_preset("OLMoE-1B-7B-0125").with_layers(4)
    assert s.num_moe_layers == 4 and s.total_expert_bytes == 4 * s.expert_bytes
    with pytest.raises(InputError):
        s.with_layers(5)


def test_spec_reads_family_facts_without_torch():
    """``specmoe.spec`` stays numpy-only: importing it loads no family, and building specs of
    every preset (and so reading the families' plain-data facts) loads neither torch nor
    transformers."""
    import subprocess
    import sys

    code = (
        "import sys, json\n"
        "import specmoe.spec as s\n"
        "before = 'specmoe.engine' in sys.modules\n"
        "acts = {n: [s.get_preset(n).activation, s.get_preset(n).expert_bias] "
        "for n in s.PRESET_CONFIGS}\n"
        "print(json.dumps([before, acts, sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('torch', 'transformers', 'matplotlib'))]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    before, acts, heavy = json.loads(out.strip().splitlines()[-1])
    assert before is False and heavy == []
    assert acts["gpt-oss-20b"] == ["swiglu_oai", True]
    assert acts["Mixtral-8x7B"] == ["swiglu", False]


def test_unknown_model_type_gets_plain_swiglu():
    cfg = {
        "model_type": "some_new_moe",
        "hidden_size": 8,
        "intermediate_size": 8,
        "num_hidden_layers": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
    }
    s = ModelSpec.from_hf_config(cfg)
    assert (s.activation, s.expert_bias) == ("swiglu", False)
    assert s.expert_params == 3 * 8 * 8


@pytest.mark.parametrize(
    ("dtype", "bytes_per_weight"),
    [("fp8", 1.0), ("FP8", 1.0), ("float8_e4m3fn", 1.0), ("int4", 4.125 / 8), ("bf16", 2.0)],
)
def test_dtypes_count_their_own_bytes(dtype, bytes_per_weight, capsys):
    s = get_preset("OLMoE-1B-7B-0125", dtype=dtype)
    assert s.bytes_per_weight == bytes_per_weight
    assert s.expert_bytes == s.expert_params * bytes_per_weight
    assert resolve_spec("OLMoE-1B-7B-0125", dtype=dtype).bytes_per_weight == bytes_per_weight
    assert get_preset("OLMoE-1B-7B-0125").with_dtype(dtype).bytes_per_weight == bytes_per_weight
    from specmoe.cli import main

    assert main(["spec", "OLMoE-1B-7B-0125", "--dtype", dtype, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes_per_weight"] == bytes_per_weight


@pytest.mark.parametrize("dtype", ["garbage", "fp7", "", "int3"])
def test_unknown_dtype_lists_the_valid_names(dtype, capsys):
    for call in (
        lambda: get_preset("OLMoE-1B-7B-0125", dtype=dtype),
        lambda: get_preset("OLMoE-1B-7B-0125").with_dtype(dtype),
    ):
        with pytest.raises(InputError, match=r"choose from .*fp8.*int4") as info:
            call()
        assert info.value.argument == "dtype"
    from specmoe.cli import main

    for argv in (["spec", "OLMoE-1B-7B-0125", "--dtype", dtype], ["spec", "--dtype", dtype]):
        assert main(argv) == 2
        cap = capsys.readouterr()
        lines = cap.err.strip().splitlines()
        assert cap.out == "" and len(lines) == 1
        assert lines[0].startswith(f"specmoe spec: error: --dtype: unknown dtype {dtype!r}")
        assert "fp8" in lines[0] and "int4" in lines[0]


@pytest.mark.parametrize("bpw", [0, -1.0, float("nan"), float("inf"), True])
def test_bytes_per_weight_must_be_finite_positive(bpw):
    with pytest.raises(InputError):
        get_preset("OLMoE-1B-7B-0125").with_dtype(bpw)
