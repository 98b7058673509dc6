"""The tensor-parallel collectives around an attention or dense-MLP block, and their overlap
with its GEMMs. Mixed into :class:`~workloads.trace.program.RankProgram`.

Without overlap (Megatron's default) the sequence-parallel all-gather before a block and the
reduce-scatter after it run exposed in the forward. The backward follows Megatron-Core's and
Transformer Engine's column-parallel layers (``LinearWithGradAccumulationAndAsyncCommunication``,
megatron/core/tensor_parallel/layers.py, NVIDIA/Megatron-LM d98e8a64; ``_LayerNormLinear``,
transformer_engine/pytorch/module/layernorm_linear.py, NVIDIA/TransformerEngine d0067d0): such a
layer keeps only its input's sequence shard, so its backward all-gathers the input again while
the input-gradient GEMM runs (asynchronous), and reduce-scatters the input gradient while the
weight-gradient GEMM runs (asynchronous). :meth:`TpOverlapOps.tp_backward` runs a block's
backward as three ops: the kernels after its first column-parallel GEMM; the column-parallel
GEMMs' input gradients, beside the all-gather; their weight gradients and the kernels before
them (the norm, which in the frameworks waits for the reduce-scatter: an approximation), once
the all-gather has arrived, beside the reduce-scatter. Without sequence parallelism the
all-reduce of the input gradient follows the block's whole backward.

Under ``training.tp_comm_overlap`` (Megatron ``--tp-comm-overlap``, Transformer Engine
userbuffers), Transformer Engine's defaults (transformer_engine/pytorch/module/base.py
``initialize_ub``, ``methods`` and ``get_default_config``, NVIDIA/TransformerEngine d0067d0):
the all-gathers before the column-parallel GEMMs (``qkv_fprop``, ``fc1_fprop``, and in the
backward ``proj_dgrad``, ``fc2_dgrad``) run as ``ring_exchange`` in ``num_splits = tp`` chunks
on 1 SM with no SM margin; the reduce-scatters after the row-parallel GEMMs (``proj_fprop``,
``fc2_fprop``) as ``pipeline`` in 4 chunks on 16 SMs that the GEMM gives up
(``set_sm_margin``); the backward's input all-gather and input-gradient reduce-scatter
(``qkv_dgrad`` / ``fc1_dgrad``, ``qkv_wgrad`` / ``fc1_wgrad``) as ``bulk``: whole, beside the
GEMM, on 16 SMs it gives up. The model, on whole blocks:

* all-gather: its first chunk (1/tp of the bytes) before the block, which waits for it;
  the other (tp-1)/tp on the TP stream beside the block;
* forward reduce-scatter: (n-1)/n of it beside the row-parallel GEMM (``out_proj``,
  ``mlp_down``) and what follows it, a second op, the last 1/n after the block (n = 4, TE's
  pipeline splits). That op gives up 16 of the GPU's SMs (``Op.sm_held``, 16/132, an H100's
  or H800's count, on every GPU as :mod:`simulator.engine.compute` does DeepSeek's 20 SMs);
* backward: the three ops above, the input gradients' and the weight gradients' holding the
  SMs of the bulk overlaps (16, or a recipe's ``training.tp_comm_overlap_sms``, as the forward's
  second op does);
* the block's successors wait for the last chunk (a zero-cost join where none follows).

Exposed per forward block with the GEMMs at least as long as what runs beside them: AG/tp + RS/4.
Under context parallelism the forward attention stays one op (no SMs given up) and the
reduce-scatter runs beside its last part.
Megatron asserts sequence parallelism under ``--tp-comm-overlap``
(megatron/training/arguments.py, NVIDIA/Megatron-LM commit d98e8a6); without it (the
all-reduce) nothing is overlapped. MoE blocks, shared experts and the expert-TP
collectives are not userbuffers layers and stay as they are. The experts' token gathers are
explicit (``gather_from_sequence_parallel_region``; autograd keeps the gathered tokens); a
shard-routing MoE block's shared experts run their backward through :meth:`TpOverlapOps.tp_backward`
without the overlap (``LayerOps._shared_backward``)."""

from __future__ import annotations

from workloads.trace.ops import Op
from workloads.training import UB_DEFAULT_SMS

#: The SMs of a GPU, of which a collective beside a GEMM holds a share: an H100's or H800's 132,
#: on every GPU.
GPU_SMS = 132
#: Transformer Engine's pipelined reduce-scatter: its chunks (``num_splits`` 4), and the share of
#: the SMs a userbuffers collective holds by default (``num_sm`` 16; ``training.tp_comm_overlap_sms``).
RS_SPLITS = 4
RS_SM_HELD = UB_DEFAULT_SMS / GPU_SMS


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

    def tp_backward(
        self, name, scatter, fwd, part, mb, k, l, deps, attention, mem=(), overlap=True, beside=(), size=None
    ):
        """A block's backward ``part`` and the TP collective after it (``scatter`` its name):
        ``(the block's last compute op, the collective its successors wait for or None)``.

        Under sequence parallelism a block with column-parallel GEMMs runs as Megatron-Core's and
        Transformer Engine's column-parallel layers do (:meth:`TraceBuilder.regather_bytes`): the
        kernels after the first such GEMM; then the all-gather of the GEMMs' inputs again beside
        their input gradients; their weight gradients (and the kernels before them, the norm) once
        it has arrived, with the reduce-scatter of the input gradient beside them. Under the
        overlap (userbuffers' ``bulk`` methods for ``qkv_dgrad`` / ``fc1_dgrad`` and
        ``qkv_wgrad`` / ``fc1_wgrad``: whole) the same, the two GEMM ops holding the SMs the
        collectives occupy (``training.tp_comm_overlap_sms``, TE's 16 by default). ``beside``: the all-gather chunks the reduce-scatter
        follows; ``attention``: the attention block (else the dense MLP's); ``size``: the scattered bytes
        (:meth:`tp_gather`'s)."""
        b, L = self.p.b, self.p.b.L
        coll = "reduce-scatter" if L.sequence_parallel else "all-reduce"
        split = b.column_split(fwd, part) if L.sequence_parallel and L.tp > 1 and part in ("B", "I") else None
        if split is None:
            op = self.tp_block(name, fwd, part, mb, k, l, deps, mem, overlap=overlap)
            return op, self.tp_scatter(coll, scatter, part, mb, k, l, op, list(beside), overlap=overlap, size=size)
        rest, dgrad, wgrad = split
        start, end = _split_mem(mem)
        body = self.p.compute(f"{name}.body", rest, part, mb, k, l, deps=deps, mem=start)
        regather = b.regather_bytes(attention)
        ag = self.p.collective("all-gather", "tp", regather, f"{name}.regather", part, mb, k, l, [body.id])
        d = self.p.compute(f"{name}.dgrad", dgrad, part, mb, k, l)
        op = self.p.compute(name, wgrad, part, mb, k, l, deps=[ag.id] if ag else [], mem=end)
        if overlap and self.tp_overlap():
            layer = "qkv" if attention else "fc1"
            d.sm_held = b.t.ub_sms(f"{layer}_dgrad") / GPU_SMS
            op.sm_held = b.t.ub_sms(f"{layer}_wgrad") / GPU_SMS
        h = b.hidden_bytes if size is None else size
        return op, self.p.collective(coll, "tp", h, scatter, part, mb, k, l, [d.id] + list(beside))

    def tp_block(self, name, fwd, part, mb, k, l, deps, mem=(), recompute=False, overlap=True) -> Op:
        """An attention or dense-MLP block's compute (forward kernels ``fwd``; ``part`` F / R
        or a backward part); under the overlap as two ops, the second holding the SMs (module
        notes). ``mem``: ``start`` entries on the first op, ``end`` on the last."""
        forward = part in ("F", "R")
        kernels = fwd if forward else self.p.b.bwd(fwd, part)
        cut = -1
        if forward and overlap and self.tp_overlap():  # a backward's overlaps are tp_backward's
            cut = next((i for i, x in enumerate(fwd) if x.name in ("out_proj", "mlp_down")), -1)
        if cut <= 0:
            return self.p.compute(name, kernels, part, mb, k, l, deps=deps, mem=mem, recompute=recompute)
        body, tail = fwd[:cut], fwd[cut:]
        start, end = _split_mem(mem)
        first = self.p.compute(f"{name}.body", body, part, mb, k, l, deps=deps, mem=start, recompute=recompute)
        op = self.p.compute(name, tail, part, mb, k, l, deps=[first.id], mem=end, recompute=recompute)
        op.sm_held = self.p.b.t.ub_sms("proj_fprop" if fwd[cut].name == "out_proj" else "fc2_fprop") / GPU_SMS
        return op


def _split_mem(mem: tuple) -> tuple[tuple, tuple]:
    """A block's memory entries as (those at its first op's start, those at its last op's end),
    for a block run as several ops."""
    return tuple(m for m in mem if m[2] == "start"), tuple(m for m in mem if m[2] != "start")
