"""Parameter counts of a model: per layer, embedding, head, MTP module, experts, in total and
active per token (the counts of the papers' model cards; tests/test_counts.py checks them
against published totals). Pure functions of the model spec."""

from __future__ import annotations

from workloads.model import ModelSpec
from workloads.shapes import _ffn_up_width, _local_heads, _local_kv_heads, _mtp_block_is_moe, _split, mla_down_widths


def _norm_params(model: ModelSpec, width: int) -> int:
    """RMSNorm has a scale; LayerNorm a scale and a shift."""
    return width if model.norm == "rmsnorm" else 2 * width


def _linear(model: ModelSpec, fan_in: int, fan_out: int) -> int:
    return fan_in * fan_out + (fan_out if model.bias else 0)


def _ffn_params(model: ModelSpec, width: int) -> int:
    """One FFN (or its TP shard) of width ``width``: gated = gate, up and down
    matrices (SwiGLU, Shazeer 2020 arXiv 2002.05202); plain = up and down (GELU,
    squared ReLU). Up biases follow the (split) width; the down bias is ``h``
    (replicated on every TP rank)."""
    h = model.hidden
    mats = 3 if model.ffn == "swiglu" else 2
    params = mats * h * width
    if model.bias:
        params += _ffn_up_width(model, width) + h
    return params


def _block_params(
    model: ModelSpec,
    moe: bool,
    tp: int = 1,
    ep: int = 1,
    etp: int = 1,
    active: bool = False,
    mla_down_proj: str = "duplicated",
) -> tuple[int, int]:
    """(dense, routed-expert) parameters of one transformer block held by one
    rank of a ``tp``/``ep``/``etp`` layout (all 1: the whole block).

    Column-parallel matrices and their biases are split by ``tp``; row-parallel
    output biases, norms and the router are replicated, and so are MLA's down
    projections unless ``mla_down_proj`` is ``"column"`` (``parallel.mla_down_proj``,
    :mod:`workloads.layout`). ``active``: count ``top_k`` routed experts instead of
    all (per-token view).
    """
    h = model.hidden
    heads = _local_heads(model, tp)
    dense = 2 * _norm_params(model, h)  # pre-attention and pre-FFN norms
    mla = model.attention
    if mla is None:
        d = model.head_dim
        kv = _local_kv_heads(model, tp)
        dense += h * (heads + 2 * kv) * d + heads * d * h
        if model.bias:
            dense += (heads + 2 * kv) * d + h
    else:
        # DeepSeek-V2 §2.1.2-2.1.3: W^DQ, W^UQ (+W^QR folded into W^UQ's RoPE
        # columns), W^DKV (+W^KR), W^UK, W^UV, W^O; RMSNorms on both latents.
        d_qk = mla.qk_head_dim
        q_down, kv_down = mla_down_widths(mla, tp, mla_down_proj)
        if mla.q_lora_rank:
            dense += _linear(model, h, q_down) + _norm_params(model, mla.q_lora_rank)
            q_in = mla.q_lora_rank
        else:
            q_in = h
        dense += q_in * heads * d_qk + (heads * d_qk if model.bias else 0)
        dense += _linear(model, h, kv_down) + _norm_params(model, mla.kv_lora_rank)
        kv_up = heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        dense += mla.kv_lora_rank * kv_up + (kv_up if model.bias else 0)
        dense += heads * mla.v_head_dim * h + (h if model.bias else 0)
    expert = 0
    if not moe:
        width = _split(model.ffn_hidden, tp, "ffn_hidden")
        dense += _ffn_params(model, width)
    else:
        m = model.moe
        dense += _linear(model, h, m.experts)  # router (replicated)
        if m.shared_experts:
            width = _split(m.shared_experts * m.expert_ffn_hidden, tp, "the shared-expert width")
            dense += _ffn_params(model, width)
        local = _split(m.experts, ep, f"the {m.experts} routed experts", "parallel.ep")
        width = _split(m.expert_ffn_hidden, etp, "expert_ffn_hidden", "parallel.etp")
        n_experts = m.top_k if active else local
        expert = n_experts * _ffn_params(model, width)
    return dense, expert


def tp_replicated_params(model: ModelSpec, moe: bool, mla_down_proj: str = "duplicated") -> int:
    """The parameters of one transformer block that every TP rank holds whole (the part of
    :func:`_block_params` that ``tp`` does not split): norms, row-parallel output biases,
    the router and, ``duplicated``, MLA's down projections. Under sequence parallelism each
    rank's gradients of these differ (each saw its own rows), and Megatron-Core all-reduces
    them over TP after the data-parallel reduction (parameters marked ``sequence_parallel``:
    ``finalize_model_grads``'s ``_allreduce_non_tensor_model_parallel_grads``,
    megatron/core/distributed/finalize_model_grads.py at NVIDIA/Megatron-LM d98e8a64)."""
    h = model.hidden
    out = 2 * _norm_params(model, h)
    out_bias = h if model.bias else 0  # row-parallel output projections' biases
    out += out_bias  # attention's output projection
    mla = model.attention
    if mla is not None:
        out += _norm_params(model, mla.kv_lora_rank) + (_norm_params(model, mla.q_lora_rank) if mla.q_lora_rank else 0)
        if mla_down_proj == "duplicated":
            out += _linear(model, h, mla.kv_lora_rank + mla.qk_rope_head_dim)
            out += _linear(model, h, mla.q_lora_rank) if mla.q_lora_rank else 0
    if not moe:
        return out + out_bias  # the dense FFN's down projection
    m = model.moe
    out += _linear(model, h, m.experts)  # the router
    return out + (out_bias if m.shared_experts else 0)


def layer_parameter_count(model: ModelSpec, layer: int) -> int:
    """Parameters of transformer layer ``layer`` (0-based): attention, norms,
    biases, dense FFN or router + shared + all routed experts."""
    if not 0 <= layer < model.layers:
        raise IndexError(f"layer {layer} outside 0..{model.layers - 1} of {model.name!r}")
    return sum(_block_params(model, model.is_moe_layer(layer)))


def embedding_parameter_count(model: ModelSpec) -> int:
    """The input token-embedding table: ``vocab * hidden``."""
    return model.vocab * model.hidden


def head_parameter_count(model: ModelSpec) -> int:
    """Final norm plus the output projection (0 extra when tied to the embedding)."""
    return _norm_params(model, model.hidden) + (0 if model.tied_embeddings else model.vocab * model.hidden)


def mtp_parameter_count(model: ModelSpec) -> int:
    """Unique weights of the MTP modules (DeepSeek-V3 §2.2): per depth, two
    RMSNorms, the ``2h -> h`` projection, one transformer block, and the output
    head's norm. The embedding and output head are shared with the main model."""
    h = model.hidden
    per = 2 * _norm_params(model, h) + _linear(model, 2 * h, h) + sum(_block_params(model, _mtp_block_is_moe(model)))
    per += _norm_params(model, h)
    return model.mtp_depth * per


def head_extra_parameter_count(model: ModelSpec, include_mtp: bool = True) -> int:
    """Parameters the last pipeline stage holds besides its transformer layers
    and the output projection table: the final norm and (unless
    ``include_mtp=False``) the MTP modules' unique weights, routed experts
    included. For an exact per-rank split (TP-replicated norms, EP-sharded
    experts, embedding copies) use :func:`workloads.memory.rank_parameter_counts`."""
    return _norm_params(model, model.hidden) + (mtp_parameter_count(model) if include_mtp else 0)


def _mtp_active(model: ModelSpec) -> int:
    h = model.hidden
    per = 2 * _norm_params(model, h) + _linear(model, 2 * h, h) + _norm_params(model, h)
    per += sum(_block_params(model, _mtp_block_is_moe(model), active=True))
    return model.mtp_depth * per


def parameter_count(model: ModelSpec, include_mtp: bool = True) -> int:
    """Total parameters: embedding, every layer, final norm, untied output head,
    and (unless ``include_mtp=False``) the MTP modules' unique weights."""
    total = embedding_parameter_count(model) + head_parameter_count(model)
    total += sum(layer_parameter_count(model, i) for i in range(model.layers))
    return total + (mtp_parameter_count(model) if include_mtp else 0)


def expert_parameter_count(model: ModelSpec, include_mtp: bool = True) -> int:
    """Routed-expert parameters (the ones expert parallelism shards); shared
    experts are dense parameters."""
    if model.moe is None:
        return 0
    per_layer = _block_params(model, True)[1]
    n = model.moe_layers + (model.mtp_depth if include_mtp and _mtp_block_is_moe(model) else 0)
    return n * per_layer


def active_parameter_count(model: ModelSpec, include_mtp: bool = True) -> int:
    """Parameters a token's forward pass uses: everything but the routed experts
    it is not sent to (``top_k`` of ``experts`` counted per MoE layer)."""
    total = embedding_parameter_count(model) + head_parameter_count(model)
    total += sum(sum(_block_params(model, model.is_moe_layer(i), active=True)) for i in range(model.layers))
    return total + (_mtp_active(model) if include_mtp else 0)


def largest_weight_params(model: ModelSpec, tp: int = 1, ep: int = 1, etp: int = 1) -> int:
    """Parameters of the largest single weight array one rank holds, every projection
    counted as its own array: query, key, value and output (MLA: each down and up
    projection), each FFN matrix (gate, up, down), the routed experts of a matrix stacked
    into one array ``[local experts, fan_in, fan_out]``, and the vocabulary-parallel
    embedding or output table. This is the unit JAX / MaxText parameters come in
    (MaxText's ``Attention`` keeps query, key, value and out apart and ``MlpBlock`` one
    array per gate without ``fused_mlp``; its ``MoeBlock`` stacks experts per matrix), and
    the size of the full-size gradient that GSPMD reduce-scatters at a time (Xu et al.
    2021, arXiv 2105.04663, §3.3: a dot contracting a sharded dimension is followed by
    a reduce-scatter of its own result)."""
    h = model.hidden
    heads = _local_heads(model, tp)
    arrays = [-(-model.vocab // tp) * h]
    mla = model.attention
    if mla is None:
        arrays += [h * heads * model.head_dim, h * _local_kv_heads(model, tp) * model.head_dim]
    else:
        q_in = mla.q_lora_rank or h
        arrays += [
            q_in * heads * mla.qk_head_dim,
            h * (mla.kv_lora_rank + mla.qk_rope_head_dim),
            mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim),
            heads * mla.v_head_dim * h,
        ]
        if mla.q_lora_rank:
            arrays.append(h * mla.q_lora_rank)
    if model.moe_layers < model.layers:  # some layers have a dense FFN
        arrays.append(h * _split(model.ffn_hidden, tp, "ffn_hidden"))
    m = model.moe
    if m is not None:
        if m.shared_experts:
            arrays.append(h * _split(m.shared_experts * m.expert_ffn_hidden, tp, "the shared-expert width"))
        local = _split(m.experts, ep, f"the {m.experts} routed experts", "parallel.ep")
        arrays.append(local * h * _split(m.expert_ffn_hidden, etp, "expert_ffn_hidden", "parallel.etp"))
    return max(arrays)
