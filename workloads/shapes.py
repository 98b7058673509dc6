"""Shapes of a model's tensors on one tensor-parallel rank: heads, KV heads and widths after
splitting, and the checks that a degree divides them. Pure functions shared by the kernel
counts (:mod:`workloads.counts`), the parameter counts (:mod:`workloads.parameters`), memory
and the trace builder."""

from __future__ import annotations

from workloads.errors import WorkloadError
from workloads.model import ModelSpec


def _check_positive(**degrees: int) -> None:
    for name, v in degrees.items():
        if not isinstance(v, int) or v < 1:
            raise WorkloadError(f"must be a positive integer, got {v!r}", field=f"parallel.{name}")


def _local_heads(model: ModelSpec, tp: int) -> int:
    if model.heads % tp:
        raise WorkloadError(
            f"{tp} does not divide the {model.heads} attention heads of {model.name!r}", field="parallel.tp"
        )
    return model.heads // tp


def _local_kv_heads(model: ModelSpec, tp: int) -> int:
    """KV heads on one TP rank. When ``tp`` exceeds the KV heads, each KV head is
    replicated on ``tp / kv_heads`` ranks (Megatron-LM's GQA handling), so every
    rank holds one."""
    kv = model.kv_heads
    if kv % tp == 0:
        return kv // tp
    if tp % kv == 0:
        return 1
    raise WorkloadError(
        f"{tp} neither divides nor is a multiple of the {kv} KV heads of {model.name!r}", field="parallel.tp"
    )


def _split(size: int, degree: int, what: str, field: str = "parallel.tp") -> int:
    if size % degree:
        raise WorkloadError(f"{degree} does not divide {what} ({size})", field=field)
    return size // degree


def mla_down_widths(mla, tp: int, mla_down_proj: str) -> tuple[int, int]:
    """Output widths of MLA's query and KV down projections on one rank: the query latent
    (0 without query compression) and the KV latent plus the RoPE key, split over ``tp``
    where the down projections are column-parallel (``parallel.mla_down_proj: column``)."""
    split = tp if mla_down_proj == "column" else 1
    q = _split(mla.q_lora_rank, split, "the MLA query latent (q_lora_rank)") if mla.q_lora_rank else 0
    kv = _split(mla.kv_lora_rank + mla.qk_rope_head_dim, split, "the MLA KV latent and RoPE key")
    return q, kv


def _ffn_up_width(model: ModelSpec, width: int) -> int:
    """Output width of the up projection: gated FFNs (SwiGLU, GeGLU) fuse gate
    and up into one ``2*width`` GEMM; plain ones (GELU, squared ReLU) have one."""
    return 2 * width if model.ffn == "swiglu" else width


def _mtp_block_is_moe(model: ModelSpec) -> bool:
    """The MTP module's transformer block has the FFN of the last main layer
    (DeepSeek-V3: an MoE block, arXiv 2412.19437 §2.2)."""
    return model.is_moe_layer(model.layers - 1)
