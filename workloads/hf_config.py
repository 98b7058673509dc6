"""Build a :class:`~workloads.model.ModelSpec` from a Hugging Face ``config.json``.

Supported ``model_type`` values and the keys read (HF transformers naming):

* ``llama``, ``mistral``, ``qwen2``, ``qwen3``: dense decoder with gated (SwiGLU)
  FFN and RMSNorm — ``num_hidden_layers``, ``hidden_size``,
  ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
  ``intermediate_size``, ``vocab_size``, ``tie_word_embeddings``.
* ``mixtral``: plus ``num_local_experts``, ``num_experts_per_tok``; each expert
  is ``intermediate_size`` wide.
* ``qwen3_moe``: plus ``num_experts``, ``num_experts_per_tok``,
  ``moe_intermediate_size``, ``decoder_sparse_step``, ``mlp_only_layers`` (must
  be the first layers, if any).
* ``deepseek_v3`` and ``kimi_k2`` (Kimi K2 ships a DeepSeek-V3-style config):
  MLA (``q_lora_rank`` — null means no query compression — ``kv_lora_rank``,
  ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``) and MoE
  (``n_routed_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
  ``n_shared_experts``, ``first_k_dense_replace``, ``moe_layer_freq``;
  ``n_group``/``topk_group`` give node-limited routing), and
  ``num_nextn_predict_layers`` for the MTP depth.
* ``gpt2``: ``n_layer``, ``n_embd``, ``n_head``, ``n_inner`` (null = 4h),
  ``vocab_size``; LayerNorm, GELU, biases, tied embeddings.
* ``gpt_neox``: LayerNorm, GELU, biases, ``use_parallel_residual``.
* ``nemotron``: LayerNorm, squared-ReLU (non-gated) FFN, ``attention_bias``.

Whether the FFN is gated is a property of the architecture (``model_type``);
``hidden_act`` is checked against the activations that architecture allows.
A missing required key, an unknown ``model_type`` or an unsupported value raises
``ValueError`` whose message starts with ``hf_config.<key>:``.
"""

from __future__ import annotations

from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any

from workloads.enums import SCORE_FUNCTIONS
from workloads.errors import WorkloadError
from workloads.model import MLASpec, ModelSpec, MoESpec

_GATED_ACTS = ("silu", "swish")
_PLAIN_ACTS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "relu", "relu2")

# model_type -> (gated FFN?, norm, allowed hidden_act values, default tie_word_embeddings)
_FAMILIES: dict[str, tuple[bool, str, tuple[str, ...], bool]] = {
    "llama": (True, "rmsnorm", _GATED_ACTS, False),
    "mistral": (True, "rmsnorm", _GATED_ACTS, False),
    "mixtral": (True, "rmsnorm", _GATED_ACTS, False),
    "qwen2": (True, "rmsnorm", _GATED_ACTS, False),
    "qwen3": (True, "rmsnorm", _GATED_ACTS, False),
    "qwen3_moe": (True, "rmsnorm", _GATED_ACTS, False),
    "deepseek_v3": (True, "rmsnorm", _GATED_ACTS, False),
    "kimi_k2": (True, "rmsnorm", _GATED_ACTS, False),
    "gpt2": (False, "layernorm", _PLAIN_ACTS, True),
    "gpt_neox": (False, "layernorm", _PLAIN_ACTS, False),
    "nemotron": (False, "layernorm", _PLAIN_ACTS, False),
}
SUPPORTED_MODEL_TYPES = tuple(_FAMILIES)


class _Config:
    """Typed access to a config mapping with errors that name the key."""

    def __init__(self, data: Mapping[str, Any]):
        self.data = data

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def int(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise WorkloadError("missing required key", field=f"hf_config.{key}")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise WorkloadError(f"must be an integer >= {minimum}, got {value!r}", field=f"hf_config.{key}")
        return value

    def choice(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.data.get(key, default)
        if value is None:
            return default
        if value not in allowed:
            raise WorkloadError(f"must be one of {', '.join(allowed)}, got {value!r}", field=f"hf_config.{key}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise WorkloadError(f"must be true or false, got {value!r}", field=f"hf_config.{key}")
        return value


def _load(path_or_dict: str | PathLike | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(path_or_dict, Mapping):
        return path_or_dict
    from stepsim_fileio import load_json, read_text

    path = Path(path_or_dict)
    # At most 16 MiB (a config.json is a few kB); binary or non-JSON input is refused naming the
    # file (an InputFileError; the scenario reports it as model.hf_config: FILE: ...).
    data = load_json(read_text(path, what="Hugging Face config.json"), str(path))
    if not isinstance(data, dict):
        raise WorkloadError(f"{path} must hold a JSON object, got {type(data).__name__}", field="hf_config")
    return data


def model_from_hf_config(path_or_dict: str | PathLike | Mapping[str, Any], name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` (a path, or the
    parsed mapping). ``name`` defaults to the config's ``_name_or_path`` or its
    ``model_type``."""
    raw = _load(path_or_dict)
    c = _Config(raw)
    model_type, gated, norm, tie_default = _family(raw)
    if model_type == "gpt2":
        layers, hidden, heads = c.int("n_layer"), c.int("n_embd"), c.int("n_head")
        ffn_hidden = c.int("n_inner", default=4 * hidden)
    else:
        layers, hidden, heads = c.int("num_hidden_layers"), c.int("hidden_size"), c.int("num_attention_heads")
        ffn_hidden = c.int("intermediate_size")
    vocab = c.int("vocab_size")
    kv_heads = c.int("num_key_value_heads", default=heads)
    head_dim = c.int("head_dim", default=hidden // heads)

    bias = False
    if model_type in ("gpt2", "gpt_neox"):
        bias = True
    elif model_type == "nemotron":
        bias = c.bool("attention_bias", False) or c.bool("mlp_bias", False)

    attention, moe, mtp_depth = _attention_moe_mtp(model_type, c, raw, ffn_hidden)
    if attention is not None:
        head_dim = attention.v_head_dim

    return ModelSpec(
        name=name or raw.get("_name_or_path") or model_type,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden=ffn_hidden,
        ffn="swiglu" if gated else "gelu",
        vocab=vocab,
        tied_embeddings=c.bool("tie_word_embeddings", tie_default),
        parallel_block=model_type == "gpt_neox" and c.bool("use_parallel_residual", True),
        attention=attention,
        moe=moe,
        mtp_depth=mtp_depth,
        norm=norm,
        bias=bias,
        source="Hugging Face config.json" if isinstance(path_or_dict, Mapping) else f"Hugging Face {path_or_dict}",
    )


def _leading_dense_layers(mlp_only_layers: list) -> int:
    """Qwen3-MoE's ``mlp_only_layers`` as a count of leading dense layers (the
    only pattern :class:`MoESpec` expresses)."""
    if not isinstance(mlp_only_layers, list) or not all(isinstance(i, int) for i in mlp_only_layers):
        raise WorkloadError(
            f"must be a list of layer indices, got {mlp_only_layers!r}", field="hf_config.mlp_only_layers"
        )
    if sorted(mlp_only_layers) != list(range(len(mlp_only_layers))):
        raise WorkloadError(
            f"only leading dense layers (0, 1, ...) are supported, got {mlp_only_layers}",
            field="hf_config.mlp_only_layers",
        )
    return len(mlp_only_layers)


def _family(raw: Mapping[str, Any]) -> tuple[str, bool, str, bool]:
    """The config's model type, checked against the supported families, with its family's gated FFN,
    norm and tied-embedding default; the activation function is checked against the family's."""
    model_type = raw.get("model_type")
    if model_type is None:
        raise WorkloadError("missing required key", field="hf_config.model_type")
    if model_type not in _FAMILIES:
        raise WorkloadError(
            f"unsupported {model_type!r}; allowed: {', '.join(SUPPORTED_MODEL_TYPES)}", field="hf_config.model_type"
        )
    gated, norm, acts, tie_default = _FAMILIES[model_type]
    act_key = "activation_function" if model_type == "gpt2" else "hidden_act"
    act = raw.get(act_key, acts[0])
    if act not in acts:
        raise WorkloadError(
            f"{act!r} is not supported for {model_type}; allowed: {', '.join(acts)}", field=f"hf_config.{act_key}"
        )
    return model_type, gated, norm, tie_default


def _attention_moe_mtp(
    model_type: str, c: _Config, raw: Mapping[str, Any], ffn_hidden: int
) -> tuple[MLASpec | None, MoESpec | None, int]:
    """The MLA attention (None: standard attention), the MoE block (None: dense) and the MTP depth of
    a config of ``model_type``."""
    attention = None
    moe = None
    mtp_depth = 0
    if model_type in ("deepseek_v3", "kimi_k2"):
        attention = MLASpec(
            q_lora_rank=c.int("q_lora_rank", default=0, minimum=0),
            kv_lora_rank=c.int("kv_lora_rank"),
            qk_rope_head_dim=c.int("qk_rope_head_dim"),
            qk_nope_head_dim=c.int("qk_nope_head_dim"),
            v_head_dim=c.int("v_head_dim"),
        )
        mtp_depth = c.int("num_nextn_predict_layers", default=0, minimum=0)
        if c.has("n_routed_experts"):
            n_group, topk_group = c.int("n_group", default=1), c.int("topk_group", default=1)
            moe = MoESpec(
                experts=c.int("n_routed_experts"),
                top_k=c.int("num_experts_per_tok"),
                expert_ffn_hidden=c.int("moe_intermediate_size"),
                shared_experts=c.int("n_shared_experts", default=0, minimum=0),
                dense_layers=c.int("first_k_dense_replace", default=0, minimum=0),
                layer_freq=c.int("moe_layer_freq", default=1),
                # Group-limited routing (DeepSeek-V3 §2.1.2: experts grouped by
                # node, each token sent to at most topk_group groups).
                max_nodes_per_token=topk_group if n_group > 1 else None,
                score_function=c.choice("scoring_func", SCORE_FUNCTIONS, "softmax"),
            )
    elif model_type == "mixtral":
        moe = MoESpec(
            experts=c.int("num_local_experts"),
            top_k=c.int("num_experts_per_tok"),
            expert_ffn_hidden=ffn_hidden,
        )
    elif model_type == "qwen3_moe":
        dense_layers = _leading_dense_layers(raw.get("mlp_only_layers") or [])
        moe = MoESpec(
            experts=c.int("num_experts"),
            top_k=c.int("num_experts_per_tok"),
            expert_ffn_hidden=c.int("moe_intermediate_size"),
            dense_layers=dense_layers,
            layer_freq=c.int("decoder_sparse_step", default=1),
        )
    return attention, moe, mtp_depth
