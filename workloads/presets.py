"""Model presets: published architectures, each with its source.

Numbers come from the papers cited beside each entry; where a paper leaves a
size out (vocabulary padding, dense FFN width) the model's released Hugging Face
``config.json`` fills it in, and the comment says so. ``tests/test_presets.py``
checks every preset's parameter count against the published total.
"""

from __future__ import annotations

from workloads.errors import WorkloadError
from workloads.model import MLASpec, ModelSpec, MoESpec

_NARAYANAN = "Narayanan et al. 2021, arXiv 2104.04473, Table 1 (V = 51,200, s = 2048, FFN 4h)"
_KORTHIKANTI = "Korthikanti et al. 2022, arXiv 2205.05198, Table 3 (V = 51,200, s = 2048, FFN 4h)"


def _gpt(name: str, layers: int, hidden: int, heads: int, source: str, vocab: int = 51200) -> ModelSpec:
    """A GPT-2/3-style model: LayerNorm, GELU FFN of 4h, linear biases, tied
    embeddings (Radford et al. 2019; Brown et al. 2020, arXiv 2005.14165 §2.1)."""
    return ModelSpec(
        name=name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        ffn_hidden=4 * hidden,
        vocab=vocab,
        ffn="gelu",
        norm="layernorm",
        bias=True,
        tied_embeddings=True,
        source=source,
    )


# Narayanan et al. Table 1 weak-scaling rows: (params in B as printed, heads, hidden, layers).
_NARAYANAN_ROWS = (
    ("1.7", 24, 2304, 24),
    ("3.6", 32, 3072, 30),
    ("7.5", 32, 4096, 36),
    ("18.4", 48, 6144, 40),
    ("39.1", 64, 8192, 48),
    ("76.1", 80, 10240, 60),
    ("145.6", 96, 12288, 80),
    ("310.1", 128, 16384, 96),
    ("529.6", 128, 20480, 105),
)

_DSV3_MLA = MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)

MODEL_PRESETS: dict[str, ModelSpec] = {
    **{
        f"megatron-gpt-{p}b": _gpt(f"megatron-gpt-{p}b", layers, hidden, heads, _NARAYANAN)
        for p, heads, hidden, layers in _NARAYANAN_ROWS
    },
    # Narayanan et al. Table 1, last row: 1008.0B, 160 heads, h = 25600, 128 layers.
    "megatron-1t": _gpt("megatron-1t", 128, 25600, 160, _NARAYANAN),
    # Brown et al. 2020 (arXiv 2005.14165) Table 2.1: 96 layers, d_model 12288,
    # 96 heads of 128; GPT-2 BPE vocabulary of 50,257 (§2.1 / Radford et al. 2019).
    "gpt3-175b": _gpt("gpt3-175b", 96, 12288, 96, "Brown et al. 2020, arXiv 2005.14165, Table 2.1", vocab=50257),
    # Korthikanti et al. Table 3: 22B (64 heads, h 6144, 48 layers) and 530B
    # (128 heads, h 20480, 105 layers); the 175B and 1T rows are gpt3-175b-shaped
    # and megatron-1t.
    "korthikanti-22b": _gpt("korthikanti-22b", 48, 6144, 64, _KORTHIKANTI),
    "korthikanti-530b": _gpt("korthikanti-530b", 105, 20480, 128, _KORTHIKANTI),
    # Llama 3 (Dubey et al. 2024, arXiv 2407.21783) Table 3: layers, model dim,
    # FFN dim, heads, 8 KV heads; vocabulary 128K (128,256 in the released
    # config), RMSNorm, SwiGLU, untied output.
    "llama3-8b": ModelSpec(
        name="llama3-8b",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn_hidden=14336,
        vocab=128256,
        source="Dubey et al. 2024, arXiv 2407.21783, Table 3; vocab from the HF config",
    ),
    "llama3-70b": ModelSpec(
        name="llama3-70b",
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        ffn_hidden=28672,
        vocab=128256,
        source="Dubey et al. 2024, arXiv 2407.21783, Table 3; vocab from the HF config",
    ),
    "llama3-405b": ModelSpec(
        name="llama3-405b",
        layers=126,
        hidden=16384,
        heads=128,
        kv_heads=8,
        ffn_hidden=53248,
        vocab=128256,
        source="Dubey et al. 2024, arXiv 2407.21783, Table 3; vocab from the HF config",
    ),
    # Jiang et al. 2024 (arXiv 2401.04088) Table 1: dim 4096, 32 layers, head_dim
    # 128, hidden_dim 14336, 32 heads, 8 KV heads, vocab 32000, 8 experts, top-2.
    "mixtral-8x7b": ModelSpec(
        name="mixtral-8x7b",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn_hidden=14336,
        vocab=32000,
        moe=MoESpec(experts=8, top_k=2, expert_ffn_hidden=14336),
        source="Jiang et al. 2024, arXiv 2401.04088, Table 1",
    ),
    # Mistral AI release of Mixtral 8x22B (HF config mistralai/Mixtral-8x22B-v0.1):
    # hidden 6144, 56 layers, 48 heads, 8 KV heads, FFN 16384, 8 experts, top-2.
    # Vocab 32768 (the v3 tokenizer of the instruct release; a 32000-entry base
    # vocab changes the total by 0.007%).
    "mixtral-8x22b": ModelSpec(
        name="mixtral-8x22b",
        layers=56,
        hidden=6144,
        heads=48,
        kv_heads=8,
        ffn_hidden=16384,
        vocab=32768,
        moe=MoESpec(experts=8, top_k=2, expert_ffn_hidden=16384),
        source="Mistral AI, Mixtral 8x22B HF config (141B total / 39B active announced)",
    ),
    # DeepSeek-V3 (arXiv 2412.19437) §4.2: 61 layers, hidden 7168, MLA with 128
    # heads of 128, d_c = 512, d'_c = 1536, RoPE dim 64; first 3 layers dense
    # (FFN 18,432 per the HF config), then 1 shared + 256 routed experts of 2048,
    # top-8, at most 4 nodes per token; MTP depth 1; vocab 129,280 (HF config).
    "deepseek-v3": ModelSpec(
        name="deepseek-v3",
        layers=61,
        hidden=7168,
        heads=128,
        head_dim=128,
        ffn_hidden=18432,
        vocab=129280,
        attention=_DSV3_MLA,
        moe=MoESpec(
            experts=256,
            top_k=8,
            expert_ffn_hidden=2048,
            shared_experts=1,
            dense_layers=3,
            max_nodes_per_token=4,
            score_function="sigmoid",  # §2.1.2: "we use the sigmoid function to compute the affinity scores"
        ),
        mtp_depth=1,
        source="DeepSeek-AI 2024, arXiv 2412.19437, §4.2; dense FFN and vocab from the HF config",
    ),
    # Kimi K2 (Moonshot AI, arXiv 2507.20534) §2: DeepSeek-V3 architecture with 64
    # heads, 384 routed experts (top-8, 1 shared, no expert grouping), 1 dense
    # layer; vocab 163,840 and dense FFN 18,432 from the HF config
    # (moonshotai/Kimi-K2-Instruct); no MTP module in the release.
    "kimi-k2": ModelSpec(
        name="kimi-k2",
        layers=61,
        hidden=7168,
        heads=64,
        head_dim=128,
        ffn_hidden=18432,
        vocab=163840,
        attention=_DSV3_MLA,
        # sigmoid scores: the HF config's scoring_func (DeepSeek-V3's router)
        moe=MoESpec(
            experts=384, top_k=8, expert_ffn_hidden=2048, shared_experts=1, dense_layers=1, score_function="sigmoid"
        ),
        source="Moonshot AI 2025, arXiv 2507.20534; vocab and dense FFN from the HF config",
    ),
    # Qwen3 technical report (arXiv 2505.09388) Table 2: 94 layers, 64 Q / 4 KV
    # heads, 128 experts, 8 activated; HF config Qwen/Qwen3-235B-A22B: hidden
    # 4096, head_dim 128, moe_intermediate_size 1536, vocab 151,936, untied.
    "qwen3-235b-a22b": ModelSpec(
        name="qwen3-235b-a22b",
        layers=94,
        hidden=4096,
        heads=64,
        kv_heads=4,
        head_dim=128,
        ffn_hidden=12288,
        vocab=151936,
        moe=MoESpec(experts=128, top_k=8, expert_ffn_hidden=1536),
        source="Qwen Team 2025, arXiv 2505.09388, Table 2; sizes from the HF config",
    ),
    # Qwen3 technical report (arXiv 2505.09388) Table 2: Qwen3-30B-A3B, 48 layers,
    # 32 Q / 4 KV heads, 128 experts, 8 activated, every layer MoE; HF config
    # Qwen/Qwen3-30B-A3B: hidden 2048, head_dim 128, moe_intermediate_size 768,
    # intermediate_size 6144 (no dense layer uses it), vocab 151,936, untied.
    "qwen3-30b-a3b": ModelSpec(
        name="qwen3-30b-a3b",
        layers=48,
        hidden=2048,
        heads=32,
        kv_heads=4,
        head_dim=128,
        ffn_hidden=6144,
        vocab=151936,
        moe=MoESpec(experts=128, top_k=8, expert_ffn_hidden=768),
        source="Qwen Team 2025, arXiv 2505.09388, Table 2; sizes from the HF config",
    ),
    # Nemotron-4 340B (NVIDIA 2024, arXiv 2406.11704) Table 1: 96 layers, hidden
    # 18432, 96 heads, 8 KV heads, vocab 256,000; squared-ReLU FFN of 73,728 (a
    # non-gated 2-matrix FFN, modelled as ffn='gelu'), no biases, untied.
    "nemotron-4-340b": ModelSpec(
        name="nemotron-4-340b",
        layers=96,
        hidden=18432,
        heads=96,
        kv_heads=8,
        ffn_hidden=73728,
        vocab=256000,
        ffn="gelu",
        norm="layernorm",
        source="NVIDIA 2024, arXiv 2406.11704, Table 1",
    ),
    # Grok-1 (xAI open release, github.com/xai-org/grok-1, run.py / model.py):
    # 64 layers, embedding 6144 (48 query heads x 128), 8 KV heads, widening
    # factor 8 -> gated FFN of int(8*6144)*2//3 = 32768, 8 experts, top-2, vocab
    # 131,072, output projection tied to the input embedding. 314B announced.
    "grok-1": ModelSpec(
        name="grok-1",
        layers=64,
        hidden=6144,
        heads=48,
        kv_heads=8,
        head_dim=128,
        ffn_hidden=32768,
        vocab=131072,
        tied_embeddings=True,
        moe=MoESpec(experts=8, top_k=2, expert_ffn_hidden=32768),
        source="xAI 2024, github.com/xai-org/grok-1 (run.py model config)",
    ),
}


def get_model(name: str) -> ModelSpec:
    """The preset called ``name``.

    Raises ``ValueError`` (``model: unknown preset 'X'; allowed: ...``) for an
    unknown name."""
    try:
        return MODEL_PRESETS[name]
    except (KeyError, TypeError):
        allowed = ", ".join(sorted(MODEL_PRESETS))
        raise WorkloadError(f"unknown preset {name!r}; allowed: {allowed}", field="model") from None
