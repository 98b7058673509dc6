"""Build the operation trace of one training step.

:func:`build_trace` turns (model, parallel layout, training settings, pipeline
schedule) into the ops each simulated rank executes:

* per micro-batch and model chunk, forward ops per transformer layer (attention
  block, MLP / MoE block) with their tensor-parallel collectives (all-gather and
  reduce-scatter under sequence parallelism, all-reduce without), context-parallel
  K/V all-gathers, expert-parallel dispatch/combine all-to-alls;
* the matching backward ops in reverse (input-gradient and weight-gradient work
  fused as ``B``, or split as ``I`` then ``W`` for zero-bubble schedules), with
  recomputation ahead of them when asked;
* pipeline sends of activations and gradients between stages;
* data-parallel gradient reduction per parameter unit (layer, embedding, head),
  issued as soon as the last micro-batch's backward of that unit is done (every
  micro-batch's under ZeRO-2/3) so that it overlaps the rest of the backward pass;
  DualPipe's gradient sum between the two ranks holding a stage; the tied-embedding
  sum between first and last stage; ZeRO parameter all-gathers; the optimizer step.

Ranks running the same program on symmetric hardware need not all be built: with
``representatives=True`` (the default) one rank per pipeline stage is built and
stands for its ``world / pp`` twins (see :mod:`simulator.engine.loop` for how their
network traffic is still accounted).

Modelling choices (each documented where it is made):

* Gradients are reduced in fp32 (Megatron-LM's default ``main_grad``), parameters
  gathered in the compute dtype's storage (bf16).
* ZeRO-1/2 parameter all-gathers happen at the start of the step, overlapped with
  the forward pass (Megatron's ``--overlap-param-gather``): the first forward of a
  unit waits for its bucket. ZeRO-3 gathers each unit's parameters before its
  forward and before its backward, for every micro-batch, one unit ahead
  (prefetch). ZeRO-0/1 reduce gradients once after the last micro-batch; ZeRO-2/3
  reduce-scatter them after every micro-batch (see :meth:`workloads.trace.program_params.ParamOps._grads_ready`).
* Tensor-parallel collectives block the compute stream (no TP comm overlap).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from workloads import counts
from workloads import schedules as sched
from workloads.errors import WorkloadError
from workloads.trace.ops import Trace, TraceError
from workloads.trace.program import RankProgram
from workloads.trace.shared import (
    TraceBuilder,
    Workload,
    representative_ranks,
)

# A trace larger than this is refused rather than simulated for hours: it means a
# scenario with (micro-batches x layers per rank x simulated ranks) in the billions.
MAX_TRACE_OPS = 20_000_000


def estimated_ops(w: Workload, n_ranks: int) -> float:
    """An upper estimate of the trace's op count (about 12 ops per layer pass)."""
    L = w.layout
    m = w.training.micro_batches(L.dp)
    passes = 3 if w.training.recompute == "full" else 2
    layers_per_rank = (
        w.model.layers * sched.local_chunks(w.schedule, L.vpp) / max(1, sched.model_chunks(w.schedule, L.pp, L.vpp))
    )
    return n_ranks * m * passes * (layers_per_rank + 2) * 12


def build_trace(w: Workload, ranks: Sequence[int] | None = None, position: int = 0) -> Trace:
    """Build the step's trace for ``ranks`` (default: one representative per stage, ``position``
    ranks into it: :func:`representative_ranks`).

    Raises :class:`LayoutError` / :class:`ScheduleError` / ``ValueError`` naming the
    scenario field when the workload cannot be laid out."""
    b = TraceBuilder(w)
    L = b.L
    rep = ranks is None
    sim_ranks = representative_ranks(L, position) if rep else sorted(set(ranks))
    n_est = estimated_ops(w, len(sim_ranks))
    if n_est > MAX_TRACE_OPS:
        raise WorkloadError(
            f"the step would need about {n_est:,.0f} operations "
            f"({b.m} micro-batches x {w.model.layers} layers over {len(sim_ranks)} simulated ranks); "
            f"the limit is {MAX_TRACE_OPS:,}: use fewer micro-batches (larger micro_batch_size) or fewer layers",
            field="training.global_batch_size",
        )
    for r in sim_ranks:
        if not 0 <= r < L.world:
            raise TraceError(f"ranks: {r} is outside 0..{L.world - 1}")
    programs = {r: RankProgram(b, r) for r in sim_ranks}
    for p in programs.values():
        b.memory_load_factors(p.param_ops.my_layers())
    for p in programs.values():
        p.build()
    # Cross-rank dependencies were recorded as tags; resolve them to op ids now.
    for op in _with_tags(b.ops):
        resolved = []
        for d in op.deps:
            if isinstance(d, tuple):
                if d not in b.tags:
                    raise TraceError(
                        f"op {op.id} ({op.name} on rank {op.rank}) waits for {d}, which no simulated rank produces"
                    )
                resolved.append(b.tags[d])
            else:
                resolved.append(d)
        op.deps = tuple(resolved)
    from workloads.trace.graphs import apply_cuda_graphs

    apply_cuda_graphs(b.ops, w.training.cuda_graphs, w.training.moe_shared_expert_overlap)
    weight = {r: (L.world // L.pp if rep else 1) for r in sim_ranks}
    static = {r: programs[r].param_ops.static_memory() for r in sim_ranks}
    return Trace(
        ops=b.ops,
        ranks=tuple(sim_ranks),
        weight=weight,
        static_memory=static,
        world=L.world,
        notes=b.notes,
        model_flops=counts.model_flops_per_step(w.model, w.training),
        representative=rep,
        unexecuted_flops=b.unexecuted_flops(),
    )


def _with_tags(ops: list) -> list:
    """The ops among ``ops`` with a tag (a tuple; no subclass of tuple is used) among their
    deps, in order: one pass over all deps at once instead of one per op."""
    lens = list(map(len, (op.deps for op in ops)))
    flat = list(itertools.chain.from_iterable(op.deps for op in ops))
    at = [i for i, d in enumerate(flat) if d.__class__ is tuple]
    if not at:
        return []
    owner = np.searchsorted(np.cumsum(lens), at, side="right")
    return [ops[i] for i in np.unique(owner).tolist()]
