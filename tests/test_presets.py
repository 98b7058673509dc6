"""Model presets and Hugging Face config import."""

import json
from pathlib import Path

import pytest

from workloads.counts import model_flops_per_token
from workloads.errors import WorkloadError
from workloads.hf_config import SUPPORTED_MODEL_TYPES, model_from_hf_config
from workloads.model import ModelSpec
from workloads.parameters import active_parameter_count, parameter_count
from workloads.presets import MODEL_PRESETS, get_model

DATA = Path(__file__).parent / "data"

REQUIRED = {
    "gpt3-175b",
    "megatron-1t",
    "llama3-8b",
    "llama3-70b",
    "llama3-405b",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "deepseek-v3",
    "kimi-k2",
    "qwen3-235b-a22b",
    "nemotron-4-340b",
    "grok-1",
    "korthikanti-22b",
    "korthikanti-530b",
    "megatron-gpt-1.7b",
    "megatron-gpt-529.6b",
}


def test_presets_present_named_and_sourced():
    assert set(MODEL_PRESETS) >= REQUIRED
    for name, m in MODEL_PRESETS.items():
        assert isinstance(m, ModelSpec) and m.name == name
        assert m.source, name
        assert get_model(name) is m


def test_unknown_preset_message():
    with pytest.raises(ValueError) as err:
        get_model("gpt-5")
    msg = str(err.value)
    assert msg.startswith("model: unknown preset 'gpt-5'; allowed: ")
    assert "deepseek-v3" in msg and "llama3-8b" in msg


def test_deepseek_v3_preset_shape():
    m = get_model("deepseek-v3")
    assert (m.layers, m.hidden, m.heads, m.vocab, m.mtp_depth) == (61, 7168, 128, 129280, 1)
    assert (m.moe.experts, m.moe.top_k, m.moe.shared_experts, m.moe.expert_ffn_hidden) == (256, 8, 1, 2048)
    assert (m.moe.dense_layers, m.ffn_hidden, m.moe.max_nodes_per_token, m.moe_layers) == (3, 18432, 4, 58)
    k = get_model("kimi-k2")
    assert (k.heads, k.moe.experts, k.moe.dense_layers, k.vocab, k.mtp_depth) == (64, 384, 1, 163840, 0)


def same_counts(a, b):
    assert parameter_count(a) == parameter_count(b)
    assert active_parameter_count(a) == active_parameter_count(b)
    assert model_flops_per_token(a, 4096) == model_flops_per_token(b, 4096)


@pytest.mark.parametrize(
    "fixture,preset", [("deepseek_v3_config.json", "deepseek-v3"), ("llama3_8b_config.json", "llama3-8b")]
)
def test_hf_fixtures_match_presets(fixture, preset):
    m = model_from_hf_config(DATA / fixture)
    p = get_model(preset)
    same_counts(m, p)
    assert m.name == preset
    assert m.with_(source="") == p.with_(source="")
    assert model_from_hf_config(DATA / fixture, name="x").name == "x"


def config(name):
    return json.loads((DATA / name).read_text())


def test_kimi_k2_config_dict():
    c = config("deepseek_v3_config.json")
    c.update(
        model_type="kimi_k2",
        num_attention_heads=64,
        num_key_value_heads=64,
        n_routed_experts=384,
        first_k_dense_replace=1,
        vocab_size=163840,
        n_group=1,
        topk_group=1,
        num_nextn_predict_layers=0,
    )
    same_counts(model_from_hf_config(c), get_model("kimi-k2"))
    assert model_from_hf_config(c).moe.max_nodes_per_token is None


def test_other_families():
    mixtral = {
        "model_type": "mixtral",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }
    same_counts(model_from_hf_config(mixtral), get_model("mixtral-8x7b"))
    qwen = {
        "model_type": "qwen3_moe",
        "num_hidden_layers": 94,
        "hidden_size": 4096,
        "num_attention_heads": 64,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 12288,
        "moe_intermediate_size": 1536,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": 151936,
        "tie_word_embeddings": False,
    }
    same_counts(model_from_hf_config(qwen), get_model("qwen3-235b-a22b"))
    gpt2 = {
        "model_type": "gpt2",
        "n_layer": 96,
        "n_embd": 12288,
        "n_head": 96,
        "n_inner": None,
        "vocab_size": 50257,
        "activation_function": "gelu_new",
    }
    same_counts(model_from_hf_config(gpt2), get_model("gpt3-175b"))
    neox = {
        "model_type": "gpt_neox",
        "num_hidden_layers": 44,
        "hidden_size": 6144,
        "num_attention_heads": 64,
        "intermediate_size": 24576,
        "vocab_size": 50432,
        "hidden_act": "gelu",
        "use_parallel_residual": True,
    }
    m = model_from_hf_config(neox)
    assert m.parallel_block and m.bias and m.ffn == "gelu" and not m.tied_embeddings
    assert parameter_count(m) == pytest.approx(20.55e9, rel=0.01)  # GPT-NeoX-20B (Black et al. 2022: 20.55B)
    nemo = {
        "model_type": "nemotron",
        "num_hidden_layers": 96,
        "hidden_size": 18432,
        "num_attention_heads": 96,
        "num_key_value_heads": 8,
        "intermediate_size": 73728,
        "vocab_size": 256000,
        "hidden_act": "relu2",
        "tie_word_embeddings": False,
    }
    same_counts(model_from_hf_config(nemo), get_model("nemotron-4-340b"))
    dense_first = dict(qwen, mlp_only_layers=[0, 1])
    assert model_from_hf_config(dense_first).moe.dense_layers == 2


@pytest.mark.parametrize(
    "drop", ["hidden_size", "num_hidden_layers", "vocab_size", "kv_lora_rank", "moe_intermediate_size", "model_type"]
)
def test_missing_key_is_named(drop):
    c = config("deepseek_v3_config.json")
    del c[drop]
    with pytest.raises(ValueError, match=f"hf_config.{drop}: missing required key"):
        model_from_hf_config(c)


def test_bad_values_are_named(tmp_path):
    with pytest.raises(ValueError, match="hf_config.model_type: unsupported 'bert'"):
        model_from_hf_config({"model_type": "bert"})
    c = config("llama3_8b_config.json")
    with pytest.raises(ValueError, match="hf_config.hidden_act"):
        model_from_hf_config(dict(c, hidden_act="gelu"))
    with pytest.raises(ValueError, match="hf_config.hidden_size: must be an integer"):
        model_from_hf_config(dict(c, hidden_size="4096"))
    with pytest.raises(ValueError, match="hf_config.tie_word_embeddings"):
        model_from_hf_config(dict(c, tie_word_embeddings="no"))
    with pytest.raises(ValueError, match="hf_config.mlp_only_layers"):
        model_from_hf_config(
            {**config("deepseek_v3_config.json"), "model_type": "qwen3_moe", "num_experts": 8, "mlp_only_layers": [3]}
        )
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        model_from_hf_config(bad)
    assert set(SUPPORTED_MODEL_TYPES) >= {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "deepseek_v3",
        "kimi_k2",
        "gpt2",
        "gpt_neox",
        "nemotron",
    }


def test_hf_scoring_func_sets_the_router_score_function():
    c = config("deepseek_v3_config.json")
    assert model_from_hf_config(c).moe.score_function == "sigmoid"
    c["scoring_func"] = "softmax"
    assert model_from_hf_config(c).moe.score_function == "softmax"
    c["scoring_func"] = "sqrtsoftplus"
    with pytest.raises(WorkloadError, match="hf_config.scoring_func"):
        model_from_hf_config(c)
