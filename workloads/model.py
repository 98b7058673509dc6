"""Model specifications: plain, frozen data describing a decoder-only transformer.

A :class:`ModelSpec` says *what* the network is (sizes, attention kind, MoE
layout). Counting parameters, FLOPs and activation bytes lives in pure functions
elsewhere (:mod:`workloads.counts`, :mod:`workloads.memory`); the spec holds no
behaviour beyond derived sizes.

Each field is written once, here: its name, type, default and (in ``metadata``, as pydantic's
``ge``/``gt``/``le``/``lt``) its constraint, from which the scenario schema
(:mod:`simulator.scenario.schema`) builds the input model that validates it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from workloads.enums import ScoreFunction

FfnKind = Literal["swiglu", "gelu"]

# Upper bounds of the sizes (docs/scenario.md, "Physical ranges"), far above any published
# model (hidden 16,384 to 53,248; vocab 256,000; 384 experts): each a power of two.
# ``layers`` has none of its own: the step's size (simulator.scenario.checks.check_size) bounds it.
MAX_WIDTH = 2**20  # hidden size, MLA ranks
MAX_HEADS = 2**16  # heads, head dimensions, experts, top_k
MAX_FFN = 2**24  # feed-forward widths
MAX_VOCAB = 2**24


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3, arXiv 2405.04434 §2.1).

    Queries are compressed to ``q_lora_rank`` (0 = no query compression), keys and
    values jointly to ``kv_lora_rank``; each head has a ``qk_nope_head_dim`` part
    and a decoupled RoPE part of ``qk_rope_head_dim`` (shared across heads for K).
    """

    q_lora_rank: int = field(default=1536, metadata={"ge": 0, "le": MAX_WIDTH})
    kv_lora_rank: int = field(default=512, metadata={"ge": 1, "le": MAX_WIDTH})
    qk_rope_head_dim: int = field(default=64, metadata={"ge": 0, "le": MAX_HEADS})
    qk_nope_head_dim: int = field(default=128, metadata={"ge": 1, "le": MAX_HEADS})
    v_head_dim: int = field(default=128, metadata={"ge": 1, "le": MAX_HEADS})

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts feed-forward layers.

    The first ``dense_layers`` layers use the dense FFN (``ModelSpec.ffn_hidden``);
    the rest route each token to ``top_k`` of ``experts`` routed experts of width
    ``expert_ffn_hidden``, plus ``shared_experts`` always-active experts of the
    same width. ``layer_freq`` = k makes every k-th layer (after the dense ones)
    an MoE layer, the others dense (1 = every layer).
    """

    experts: int = field(metadata={"ge": 1, "le": MAX_HEADS})
    top_k: int = field(metadata={"ge": 1, "le": MAX_HEADS})
    expert_ffn_hidden: int = field(metadata={"ge": 1, "le": MAX_FFN})
    shared_experts: int = field(default=0, metadata={"ge": 0, "le": MAX_HEADS})
    dense_layers: int = field(default=0, metadata={"ge": 0})
    layer_freq: int = field(default=1, metadata={"ge": 1, "le": MAX_HEADS})
    # DeepSeek-V3 node-limited routing (M = 4)
    max_nodes_per_token: int | None = field(default=None, metadata={"ge": 1, "le": MAX_HEADS})
    # The router's score function (Megatron --moe-router-score-function): "softmax"
    # (Mixtral, Qwen3, Grok-1) or "sigmoid" (DeepSeek-V3 §2.1.2, Kimi K2: HF config
    # scoring_func). It sets which small kernels an unfused router runs
    # (workloads.moe_kernels); a fused router's traffic is the same either way.
    score_function: ScoreFunction = "softmax"


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer.

    ``head_dim`` defaults to ``hidden // heads``. ``kv_heads`` = ``heads`` for MHA,
    1 for MQA, anything dividing ``heads`` for GQA. ``attention`` is ``None`` for
    standard (MHA/GQA/MQA) attention or an :class:`MLASpec`.
    """

    name: str
    layers: int = field(metadata={"ge": 1})
    hidden: int = field(metadata={"ge": 1, "le": MAX_WIDTH})
    heads: int = field(metadata={"ge": 1, "le": MAX_HEADS})
    ffn_hidden: int = field(metadata={"ge": 1, "le": MAX_FFN})
    vocab: int = field(metadata={"ge": 1, "le": MAX_VOCAB})
    kv_heads: int | None = field(default=None, metadata={"ge": 1, "le": MAX_HEADS})
    head_dim: int | None = field(default=None, metadata={"ge": 1, "le": MAX_HEADS})
    ffn: FfnKind = "swiglu"
    tied_embeddings: bool = False
    parallel_block: bool = False
    attention: MLASpec | None = None
    moe: MoESpec | None = None
    mtp_depth: int = field(default=0, metadata={"ge": 0, "le": 64})  # multi-token-prediction modules (DeepSeek-V3: 1)
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    bias: bool = False  # linear-layer biases (GPT-2/3 style)
    source: str = ""  # citation for the numbers

    def __post_init__(self) -> None:
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    # ---- derived structure -------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def is_moe_layer(self, layer: int) -> bool:
        """Whether transformer layer ``layer`` (0-based) has an MoE feed-forward."""
        m = self.moe
        if m is None or layer < m.dense_layers:
            return False
        return (layer - m.dense_layers) % m.layer_freq == 0

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    def with_(self, **changes) -> ModelSpec:
        return replace(self, **changes)
