"""Megatron-Core's unfused MoE router and permutations: the chains of small PyTorch ops it runs
where ``--moe-router-fusion`` / ``--moe-permute-fusion`` are off (Megatron's own default): each
chain's launches (one an op) and bytes, forward and backward, which :mod:`workloads.moe_kernels`
turns into two kernels (``_chain_kernels``).

Counted from NVIDIA/Megatron-LM at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553,
``megatron/core/transformer/moe/moe_utils.py``: ``topk_routing_with_score_function`` and
``group_limited_topk`` (the router's scores and top-k), ``compute_routing_scores_for_aux_loss``
and ``switch_load_balancing_loss_func`` (an auxiliary loss), ``permute``, ``unpermute`` and
``sort_chunks_by_idxs`` (the unfused branches of each). PyTorch runs each tensor op of such a
chain eagerly as (at least) one CUDA kernel; views (``view``, ``T``, ``unsqueeze``, ``expand``,
slicing) launch nothing. An out-of-place ``scatter`` is a copy and the scatter (two), a sort
its indices' iota and the sort (two). The backward runs one kernel per differentiable op of the
chain, two for a gather-type op (``topk``, ``gather``, ``index_select``: a zeroed gradient and
the scatter-add into it). Counts are a floor: a library op that launches more than one kernel
(a radix sort's passes) counts as above.

Bytes are each op's HBM reads and writes at its dtype, over ``R x C`` (rows x experts) for the
router's maps, ``S x h`` / ``R x h`` for the rows; the per-token top-k tensors (``R x k``) are
left out. ``L`` = the logits' bytes (BF16 2, FP32 4 under ``--moe-router-dtype fp32``).
"""

from __future__ import annotations

from dataclasses import dataclass

_F = 4  # FP32 scores
_I64 = 8  # int64 indices (torch.topk, argsort, arange)
_MAP = 1  # bool / int8 routing map


@dataclass(frozen=True)
class Chain:
    """An unfused chain of ops: its forward and backward launches and HBM bytes."""

    launches: int
    bwd_launches: int
    bytes: float
    bwd_bytes: float


def _routing_map_bytes(L: int) -> float:
    """``torch.zeros_like(logits).int().scatter(1, top_indices, 1).bool()``: zeros (write L),
    ``.int()`` (read L, write 4), the scatter's copy (read and write 4), ``.bool()`` (read 4,
    write 1): five launches."""
    return L + (L + 4) + 8 + (4 + _MAP)


def router_topk(score_function: str, expert_bias: bool, groups: bool, L: int, R: float, C: int) -> Chain:
    """``topk_routing_with_score_function`` unfused, on ``R`` tokens' logits over ``C`` experts.

    * softmax (Mixtral, Qwen3, Grok-1): ``topk`` (read L), ``softmax`` and ``type_as`` on the
      k picked, the probabilities scattered into a zeroed ``[R, C]`` (zeros, copy, scatter:
      write L, read and write L) and the routing map (five launches): 11 forward (10 with FP32
      logits: no cast back); backward: the scatter's gather, the cast, softmax's backward,
      topk's zeros and scatter: 5 (4).
    * sigmoid (DeepSeek-V3, Kimi K2): ``logits.float()`` (read L, write 4; none for FP32),
      ``sigmoid`` (read and write 4), ``+ expert_bias`` (aux-loss-free balancing: read and
      write 4), the top-k (one ``topk``, read 4; group-limited, node-limited routing:
      ``group_limited_topk``'s topk, sum, topk, zeros, scatter, the expanded mask's reshape
      copy (write 4), ``bool``, ``~``, ``masked_fill`` and ``topk``: ten launches, ``6 x 4 + 4``
      bytes), ``gather``, the normalisation (sum, ``+ 1e-20``, divide), the scaling factor
      (DeepSeek-V3 2.5, Kimi K2 2.827), ``type_as`` and the two scatters; backward: the
      scatter's gather, the cast, the scaling's multiply, the divide's (four), the sum's
      accumulate, gather's zeros and scatter-add (write 4), sigmoid's (read 8, write 4) and
      the cast to L (read 4, write L)."""
    cast = 0 if L == _F else 1
    scatter_probs = 3 * L  # zeros_like(logits), the scatter's copy
    if score_function == "softmax":
        fwd = 1 + 1 + cast + 3 + 5
        nbytes = L + scatter_probs + _routing_map_bytes(L)
        return Chain(fwd, 4 + cast, nbytes * R * C, L * R * C)
    bias = 1 if expert_bias else 0
    topk_launches, topk_bytes = (10, 6 * _F + 4) if groups else (1, _F)
    fwd = cast + 1 + bias + topk_launches + 1 + 3 + 1 + cast + 3 + 5
    nbytes = cast * (L + _F) + 2 * _F + bias * 2 * _F + topk_bytes + scatter_probs + _routing_map_bytes(L)
    bwd = 1 + cast + 1 + 4 + 1 + 2 + 1 + cast
    bwd_bytes = _F + 3 * _F + (L + _F if cast else 0)
    return Chain(fwd, bwd, nbytes * R * C, bwd_bytes * R * C)


def aux_loss(score_function: str, L: int, R: float, C: int) -> Chain:
    """``compute_routing_scores_for_aux_loss`` and ``switch_load_balancing_loss_func`` unfused,
    with the token counts between them (``routing_map.sum(dim=0)``): softmax (read L, write 4)
    or sigmoid (the cast, ``sigmoid``, the row sums, ``+ 1e-20`` and the divide, read and write
    4 each over the map), ``topk`` (read 4), the routing map (five launches), its column sums
    (read 1), then the loss: the probabilities' column sums (read 4), a multiply, a sum and
    the coefficient's multiply on ``C`` values. Backward: the loss's multiplies, the column
    sums' expanded gradient made contiguous (write 4), the score function's backward (read 8,
    write L), and the accumulation into the logits' gradient (read 2 L, write L)."""
    cast = 0 if L == _F else 1
    if score_function == "softmax":
        launches, nbytes = 1, L + _F
    else:
        launches, nbytes = cast + 4, cast * (L + _F) + 2 * _F + 2 * _F
    fwd = launches + 1 + 5 + 1 + 4
    nbytes += _F + _routing_map_bytes(L) + _MAP + _F
    return Chain(fwd, 5, nbytes * R * C, (_F + 2 * _F + L + 3 * L) * R * C)


def permute(R: float, C: int, S: float, probs: bool, drop_and_pad: bool, act: int, h: int, L: int) -> Chain:
    """``moe_utils.permute`` unfused: ``R`` token rows to ``S`` permuted rows by a ``[R, C]`` map.

    Dropless: the map transposed (read and write 1), flattened and ``argsort``-ed (iota and the
    sort: keys read and written, int64 indices written and read), the first ``S`` indices
    ``% R`` (read and write 8); drop-and-pad (a capacity): the map cast to int8 and transposed,
    a per-expert ``argsort``, its first ``capacity`` columns made contiguous. With the
    probabilities (the gate weight applied in the expert activation): ``probs.T.contiguous()``
    (read and write L) and their gather (dropless: one index; drop-and-pad: ``arange``, a
    multiply, an add and ``index_select``). Then ``tokens.index_select``: each permuted row read
    from its token and written (``2 S h`` activation bytes; the fused kernel reads a token once,
    ``R h + S h``). Backward: ``index_select``'s zeros and ``index_add_`` (write ``R h``, read
    ``S h``, read and write ``R h``); the probabilities' gather's zeros and scatter and the
    transpose's copy."""
    sort_bytes = 2 * _MAP + 2 * _I64  # keys read and written, int64 indices written and read
    if drop_and_pad:
        launches, nbytes = 1 + 1 + 2 + 1, 2 * _MAP + 2 * _MAP + sort_bytes
        index = (_I64 + _I64) * S  # the first `capacity` columns copied
        probs_launches = 5
    else:
        launches, nbytes = 1 + 2 + 1, 2 * _MAP + sort_bytes
        index = 2 * _I64 * S  # % R
        probs_launches = 2
    map_bytes = nbytes * R * C
    row_bytes = 2 * act * S * h + _I64 * S
    bwd, bwd_bytes = 2, act * (S * h + 3 * R * h) + _I64 * S
    if probs:
        launches += probs_launches
        map_bytes += 2 * L * R * C + (_I64 + 2 * L) * S
        bwd += 3
        bwd_bytes += 3 * L * R * C
    return Chain(launches + 1, bwd, map_bytes + index + row_bytes, bwd_bytes)


def unpermute(R: float, C: int, S: float, probs: bool, drop_and_pad: bool, act: int, h: int, L: int) -> Chain:
    """``moe_utils.unpermute`` unfused: ``S`` rows summed back into ``R`` token rows.

    A zeroed ``[R, h]`` output (write ``R h``) and ``scatter_add_`` (read ``S h``, read and
    write ``R h``; the fused kernel reads ``S h`` and writes ``R h`` once); ``.to(dtype)`` is
    a no-op. With merging probabilities (the gate weight applied here, Megatron-Core <= 0.12):
    the probabilities gathered from their transposed copy (drop-and-pad: the transpose,
    ``arange``, a multiply, an add and ``index_select``; dropless: both transposes and
    ``masked_select``, whose output size the host reads back: that sync is not modelled) and
    the rows multiplied by them (read and write ``S h``). Backward: the scatter-add's gather
    (read and write ``S h``); with probabilities the rows' gradient (read and write ``S h``),
    the probabilities' gradient (a multiply, read ``2 S h`` and write ``S h``, and the row
    sums, read ``S h``), the gather's zeros and scatter and the transpose's copy."""
    launches, bwd = 2, 1
    nbytes = act * (S * h + 3 * R * h)
    bwd_bytes = 2 * act * S * h
    if probs:
        launches += (5 if drop_and_pad else 4) + 1
        nbytes += 2 * L * R * C + 2 * act * S * h + (2 * _MAP * R * C if not drop_and_pad else 0)
        bwd += 1 + 2 + 2 + 1
        bwd_bytes += 2 * act * S * h + 4 * act * S * h + 3 * L * R * C
    return Chain(launches, bwd, nbytes, bwd_bytes)
