"""CUDA graphs: which ops of a trace the host issues as one graph replay (``training.cuda_graphs``).

Sets :attr:`~workloads.trace.ops.Op.launches` (what issuing an op costs the host, in
launches; :mod:`simulator.engine.host`):

* ``none`` (eager, Megatron's default ``--cuda-graph-impl none``): nothing set, every
  kernel is its launches (one, or one per local expert: :attr:`workloads.kernels.Kernel.launches`).
* ``per-layer`` (Megatron ``--cuda-graph-impl local`` or ``transformer_engine``, graphs per
  transformer layer, ``--cuda-graph-modules`` empty = the whole layer): each layer's ops of
  one micro-batch, chunk and phase (forward, recomputation, backward) replay as one graph,
  one launch for the graph, none for the ops in it (collectives included: NCCL kernels are
  captured). Where a MoE layer's dispatcher blocks on the host (``training.moe_host_sync``),
  nothing after the blocking read can be captured (the host needs the token counts to size
  the all-to-all and the expert GEMMs): the graph stops at the router, as Megatron's
  ``--cuda-graph-modules attn moe_router moe_preprocess`` does ("captures operations ... up
  to MoELayer.router(), including the shared experts if they are not overlapped with EP
  comm", megatron/training/arguments.py, NVIDIA/Megatron-LM commit d98e8a6), and the
  dispatch, experts, combine and their gradients stay eager. Ops outside the layers
  (embedding, head, pipeline sends, gradient reduction, optimizer) stay eager.
* ``full`` (``--cuda-graph-impl full_iteration``): the whole step is one graph, one launch
  per rank. Refused where a MoE dispatcher blocks on the host: a blocking device-to-host
  read cannot be captured (the sync-free dispatcher, ``moe_host_sync: false``, is needed).
"""

from __future__ import annotations

from workloads.errors import WorkloadError
from workloads.trace.ops import Op

#: Op name parts of a MoE layer that follow its dispatcher's blocking host read.
_AFTER_SYNC = (".dispatch", ".experts", ".combine", ".moe_out")


def apply_cuda_graphs(ops: list[Op], mode: str, shared_overlap: bool) -> None:
    """Set ``launches`` on ``ops`` (edited in place) for CUDA-graph ``mode`` (module notes)."""
    if mode == "none":
        return
    if mode == "full":
        sync = next((op for op in ops if op.host_sync), None)
        if sync is not None:
            raise WorkloadError(
                f"full needs a sync-free MoE dispatcher: op {sync.name} blocks the host on the token "
                "counts (set training.moe_host_sync: false, as with experts padded to capacity; the allgather "
                "dispatcher always reads them)",
                field="training.cuda_graphs",
            )
        first: set[int] = set()
        for op in ops:
            if op.rank not in first:
                first.add(op.rank)
                op.launches = 1
            else:
                op.launches = 0
        return
    if mode != "per-layer":
        raise WorkloadError(f"must be none, per-layer or full, got {mode!r}", field="training.cuda_graphs")
    eager_parts = _AFTER_SYNC + ((".shared",) if shared_overlap else ())
    synced = {(op.rank, op.layer) for op in ops if op.host_sync}
    last: dict[int, tuple] = {}  # rank -> the graph its previous captured op belonged to
    for op in ops:
        if op.layer < 0 or op.kind not in ("compute", "collective"):
            last.pop(op.rank, None)
            continue
        if (op.rank, op.layer) in synced and any(p in op.name for p in eager_parts):
            last.pop(op.rank, None)  # eager; a captured op after it starts a new graph
            continue
        region = (op.layer, op.mb, op.chunk, op.phase)
        if last.get(op.rank) == region:
            op.launches = 0
        else:
            op.launches = 1
            last[op.rank] = region
