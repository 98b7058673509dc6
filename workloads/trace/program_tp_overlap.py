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
* reduce-scatter: (n-1)/n of it beside the block's GEMM it overlaps, the last 1/n after
  the block (n = 4, TE's pipeline splits). The block is two ops: in the forward the
  row-parallel GEMM (``out_proj``, ``mlp_down``) and what follows it is the second; in the
  backward the gradient of the block's first GEMM (``qkv_proj``, ``mlp_up``: the bulk
  reduce-scatter overlaps its weight gradient), modelled like the forward's pipeline. That
  op gives up 16 of the GPU's SMs (``Op.sm_held``, 16/132, an H100's or H800's count, on
  every GPU as :mod:`simulator.engine.compute` does DeepSeek's 20 SMs);
* the block's successors wait for the last chunk (a zero-cost join where none follows).

Exposed per block with the GEMMs at least as long as what runs beside them: AG/tp + RS/4.
Under context parallelism the forward attention stays one op (no SMs given up) and the
reduce-scatter runs beside its last part.
Megatron asserts sequence parallelism under ``--tp-comm-overlap``
(megatron/training/arguments.py, NVIDIA/Megatron-LM commit d98e8a6); without it (the
all-reduce) nothing is overlapped. MoE blocks, shared experts and the expert-TP
collectives are not userbuffers layers and stay as they are."""

from __future__ import annotations

from workloads.trace.ops import Op

#: Transformer Engine's pipelined reduce-scatter: chunks (``num_splits`` 4) and the SMs it
#: holds (``num_sm`` 16) of an H100's / H800's 132.
RS_SPLITS = 4
RS_SM_HELD = 16 / 132


class TpOverlapOps:
    """The TP collectives around an attention or dense-MLP block, overlapped or not (a part of the
    rank's :class:`~workloads.trace.program.RankProgram`, held as ``p``)."""

    def __init__(self, program) -> None:
        self.p = program  # the rank's program: its state, its op helpers and its other parts

    def tp_overlap(self) -> bool:
        b = self.p.b
        return bool(b.t.tp_comm_overlap) and b.L.sequence_parallel and b.L.tp > 1

    def tp_gather(self, name, phase, mb, k, l, deps, overlap=True, size=None) -> tuple[list, list]:
        """The all-gather before a block: (what the block waits for, empty where no
        collective runs; what runs beside it). ``overlap`` False: a MoE block's. ``size``:
        the bytes gathered, by default the hidden states'."""
        h = self.p.b.hidden_bytes if size is None else size
        if not (overlap and self.tp_overlap()):
            ag = self.p.collective("all-gather", "tp", h, name, phase, mb, k, l, deps)
            return ([ag.id] if ag else []), []
        tp = self.p.b.L.tp
        first = self.p.collective("all-gather", "tp", h / tp, name, phase, mb, k, l, deps)
        rest = self.p.collective("all-gather", "tp", h * (tp - 1) / tp, f"{name}.rest", phase, mb, k, l, [first.id])
        return [first.id], [rest.id]

    def tp_scatter(self, coll, name, phase, mb, k, l, op: Op, beside: list, overlap=True, size=None) -> Op | None:
        """The TP collective after block ``op`` (``coll``: reduce-scatter, or all-reduce
        without sequence parallelism); under the overlap its last chunk, after ``beside``.
        ``size``: as :meth:`tp_gather`'s."""
        h = self.p.b.hidden_bytes if size is None else size
        if not (overlap and self.tp_overlap()):
            return self.p.collective(coll, "tp", h, name, phase, mb, k, l, [op.id])
        rest = self.p.collective(
            "reduce-scatter", "tp", h * (RS_SPLITS - 1) / RS_SPLITS, f"{name}.rest", phase, mb, k, l, list(op.deps)
        )  # from the start of op, the block's second part (tp_block)
        deps = [op.id, rest.id] + list(beside)
        return self.p.collective("reduce-scatter", "tp", h / RS_SPLITS, name, phase, mb, k, l, deps)

    def tp_block(self, name, fwd, part, mb, k, l, deps, mem=(), recompute=False, overlap=True) -> Op:
        """An attention or dense-MLP block's compute (forward kernels ``fwd``; ``part`` F / R
        or a backward part); under the overlap as two ops, the second holding the SMs (module
        notes). ``mem``: ``start`` entries on the first op, ``end`` on the last."""
        kernels = fwd if part in ("F", "R") else self.p.b.bwd(fwd, part)
        cut = -1
        if overlap and self.tp_overlap():
            names = [x.name for x in fwd]
            if part in ("F", "R"):
                cut = next((i for i, n in enumerate(names) if n in ("out_proj", "mlp_down")), -1)
            elif any(n in ("qkv_proj", "mlp_up") for n in names):
                cut = next(i for i, n in enumerate(names) if n in ("qkv_proj", "mlp_up"))
        if cut < 0 or (cut == 0 and part in ("F", "R")):
            return self.p.compute(name, kernels, part, mb, k, l, deps=deps, mem=mem, recompute=recompute)
        if part in ("F", "R"):
            body, tail = fwd[:cut], fwd[cut:]
        else:
            body = self.p.b.bwd(fwd[:cut] + fwd[cut + 1 :], part)
            tail = self.p.b.bwd(fwd[cut : cut + 1], part)
        start = tuple(m for m in mem if m[2] == "start")
        end = tuple(m for m in mem if m[2] != "start")
        first = self.p.compute(f"{name}.body", body, part, mb, k, l, deps=deps, mem=start, recompute=recompute)
        op = self.p.compute(name, tail, part, mb, k, l, deps=[first.id], mem=end, recompute=recompute)
        op.sm_held = RS_SM_HELD
        return op
