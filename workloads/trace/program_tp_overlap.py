"""Tensor-parallel communication overlap (``training.tp_comm_overlap``; Megatron
``--tp-comm-overlap``, Transformer Engine userbuffers): the sequence-parallel all-gather
before an attention or dense-MLP block and the reduce-scatter after it, chunked and
pipelined with the block's GEMMs. Mixed into :class:`~workloads.trace.program.RankProgram`.

Transformer Engine's defaults (transformer_engine/pytorch/module/base.py ``initialize_ub``,
``methods`` and ``get_default_config``, NVIDIA/TransformerEngine commit d0067d0): the
all-gathers before the column-parallel GEMMs (``qkv_fprop``, ``fc1_fprop``, and in the
backward ``proj_dgrad``, ``fc2_dgrad``) run as ``ring_exchange`` in ``num_splits = tp``
chunks on 1 SM with no SM margin; the reduce-scatters after the row-parallel GEMMs
(``proj_fprop``, ``fc2_fprop``) as ``pipeline`` in 4 chunks on 16 SMs that the GEMM gives
up (``set_sm_margin``); the backward's reduce-scatters (``qkv_dgrad``, ``fc1_dgrad``) as
``bulk`` on 16 SMs. The model, on whole blocks:

* all-gather: its first chunk (1/tp of the bytes) before the block, which waits for it;
  the other (tp-1)/tp on the TP stream beside the block;
* reduce-scatter: (n-1)/n of it beside the block (from the block's start), the last 1/n
  after it (n = 4, TE's pipeline splits; the backward's bulk overlap is modelled alike);
  the block holds 16 of the GPU's SMs for it (``Op.sm_held``, 16/132, an H100's or
  H800's count, on every GPU as :mod:`simulator.engine.compute` does DeepSeek's 20 SMs);
* the block's successors wait for the last chunk (a zero-cost join where none follows).

Exposed per block with the block at least as long as what runs beside it: AG/tp + RS/4.
Megatron asserts sequence parallelism under ``--tp-comm-overlap``
(megatron/training/arguments.py, NVIDIA/Megatron-LM commit d98e8a6); without it (the
all-reduce) nothing is overlapped. MoE blocks, shared experts and the expert-TP
collectives are not userbuffers layers and stay as they are."""

from __future__ import annotations

from typing import Optional

from workloads.trace.ops import Op

#: Transformer Engine's pipelined reduce-scatter: chunks (``num_splits`` 4) and the SMs it
#: holds (``num_sm`` 16) of an H100's / H800's 132.
RS_SPLITS = 4
RS_SM_HELD = 16 / 132


class TpOverlapOps:
    """The TP collectives around an attention or dense-MLP block, overlapped or not."""

    def tp_overlap(self) -> bool:
        b = self.b
        return bool(b.t.tp_comm_overlap) and b.L.sequence_parallel and b.L.tp > 1

    def tp_gather(self, name, phase, mb, k, l, deps, overlap=True) -> tuple[list, list]:
        """The all-gather before a block: (what the block waits for, empty where no
        collective runs; what runs beside it). ``overlap`` False: a MoE block's."""
        h = self.b.hidden_bytes
        if not (overlap and self.tp_overlap()):
            ag = self.collective("all-gather", "tp", h, name, phase, mb, k, l, deps)
            return ([ag.id] if ag else []), []
        tp = self.b.L.tp
        first = self.collective("all-gather", "tp", h / tp, name, phase, mb, k, l, deps)
        rest = self.collective("all-gather", "tp", h * (tp - 1) / tp, f"{name}.rest", phase, mb, k, l, [first.id])
        return [first.id], [rest.id]

    def tp_scatter(self, coll, name, phase, mb, k, l, op: Op, beside: list, overlap=True) -> Optional[Op]:
        """The TP collective after block ``op`` (``coll``: reduce-scatter, or all-reduce
        without sequence parallelism); under the overlap its last chunk, after ``beside``."""
        h = self.b.hidden_bytes
        if not (overlap and self.tp_overlap()):
            return self.collective(coll, "tp", h, name, phase, mb, k, l, [op.id])
        rest = self.collective(
            "reduce-scatter", "tp", h * (RS_SPLITS - 1) / RS_SPLITS, f"{name}.rest", phase, mb, k, l, list(op.deps)
        )
        op.sm_held = RS_SM_HELD
        deps = [op.id, rest.id] + list(beside)
        return self.collective("reduce-scatter", "tp", h / RS_SPLITS, name, phase, mb, k, l, deps)
