"""The operation trace: what each rank executes in one training step.

An :class:`Op` is one unit of work on one stream of one rank: a compute op (a
fused group of kernels), a collective (one rank's part of it), or a
point-to-point send. Ops on the same ``(rank, stream)`` run in list order; an op
also waits for every op named in ``deps`` (op ids, possibly on other ranks).

Memory effects ride on ops: ``mem`` lists ``(category, delta_bytes, at)`` with
``at`` in {"start", "end"}; categories are those of the summary's
``memory_breakdown_bytes``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workloads.errors import WorkloadError
from workloads.kernels import Kernel

if TYPE_CHECKING:  # numpy is imported where the checks run (keeps `import workloads` light)
    import numpy as np

STREAMS = (
    "compute",
    "tp",
    "cp",
    "ep",
    "dp",
    "fsdp",
    "pp",
    "offload",
    "mirror",
    "host",
)  # mirror: gradient sums between pipeline ranks; host: recorded CPU time (a Chakra trace's CPU nodes)
MEMORY_CATEGORIES = ("weights", "gradients", "optimizer", "activations", "buffers")


class TraceError(WorkloadError):
    """A trace that cannot be executed (cycle, dangling dependency, bad field)."""


@dataclass(eq=False, slots=True)
class Op:
    id: int
    rank: int
    stream: str
    kind: str  # "compute" | "collective" | "send" | "host"
    name: str
    phase: str = ""
    mb: int = -1
    chunk: int = -1  # model chunk (pipeline order)
    layer: int = -1
    deps: tuple[int, ...] = ()
    kernels: tuple[Kernel, ...] = ()  # compute ops
    recompute: bool = False  # compute repeated for recomputation (HFU, not MFU)
    # compute op of an overlapped forward/backward pair (DualPipe, Megatron-Core's batch-level
    # overlap): it runs beside all-to-all kernels that hold a share of the SMs
    # (ComputeCalibration.comm_sm_fraction); all-to-all of a batch-level overlapped pair: it
    # runs beside that compute (ComputeCalibration.overlap_a2a_slowdown)
    comm_overlap: bool = False
    coll: str = ""  # collective op: all-reduce | all-gather | reduce-scatter | all-to-all | broadcast
    axis: str = ""  # group axis: tp | cp | dp | pp | ep | edp | etp | dp_cp | custom
    group: tuple[int, ...] = ()  # ranks taking part, ring order
    key: str = ""  # rendezvous key shared by every member's op of one collective instance
    size_bytes: float = 0.0  # collective size (nccl-tests convention) or message size
    # all-to-all under node-limited routing (DeepSeek-V3 §2.1.2, §3.2.2): share of the routed
    # copies that cross between scale-up domains (distinct nodes per token / top_k); the
    # rail hop and the NVLink fan-out then run as one pipelined phase (hierarchical-a2a)
    scaleout_fraction: float = 1.0
    peer: int = -1  # send: destination rank
    mem: tuple[tuple[str, float, str], ...] = ()
    rate_bytes_per_s: float = 0.0  # host ops: 0 = the device's host link; else this rate (CPU work)
    # the host (CPU) blocks after issuing this op until it has ended: a device-to-host
    # read of its result (the MoE dispatcher's token counts, simulator.engine.host)
    host_sync: bool = False
    # host launches issuing this op costs (simulator.engine.host): -1 = its kernels
    # (compute) or 1 (communication); 0 inside a replayed CUDA graph
    launches: int = -1
    # share of the SMs communication kernels hold while this compute op runs beside them
    # (tensor-parallel overlap, Transformer Engine userbuffers): it takes 1 / (1 - share)
    # as long
    sm_held: float = 0.0

    @property
    def flops(self) -> float:
        return sum(k.flops for k in self.kernels)

    @property
    def bytes(self) -> float:
        return sum(k.bytes for k in self.kernels)


# The trace builder makes up to millions of ops; a call with the fields in order costs half one
# with keywords (0.9 against 1.9 us for a compute op, 1.0 against 2.8 us for a collective,
# Python 3.11). The constructors below keep that order in one place, beside the class
# (tests/test_trace_ops.py checks them against keyword construction).


def compute_op(id, rank, name, phase, mb, chunk, layer, deps, kernels, mem, recompute, comm_overlap) -> Op:
    """A compute op (``deps``, ``kernels`` and ``mem`` tuples)."""
    return Op(id, rank, "compute", "compute", name, phase, mb, chunk, layer, deps, kernels, recompute, comm_overlap,
              "", "", (), "", 0.0, 1.0, -1, mem)  # fmt: skip


def collective_op(id, rank, stream, name, phase, mb, chunk, layer, deps, coll, axis, group, key, size_bytes,
                  scaleout_fraction, comm_overlap=False) -> Op:  # fmt: skip
    """One rank's part of a collective (``deps`` and ``group`` tuples); ``comm_overlap``: an
    all-to-all of a batch-level overlapped pair (:attr:`Op.comm_overlap`)."""
    return Op(id, rank, stream, "collective", name, phase, mb, chunk, layer, deps, (), False, comm_overlap, coll, axis,
              group, key, size_bytes, scaleout_fraction)  # fmt: skip


def send_op(id, rank, stream, name, phase, mb, chunk, deps, axis, key, size_bytes, peer) -> Op:
    """A point-to-point send to ``peer`` (a ``deps`` tuple)."""
    return Op(id, rank, stream, "send", name, phase, mb, chunk, -1, deps, (), False, False, "", axis, (), key,
              size_bytes, 1.0, peer)  # fmt: skip


@dataclass
class Trace:
    """Ops of the simulated ranks plus the static memory of each rank.

    ``ranks`` are the ranks simulated. In the fast (representative) mode these are
    one rank per pipeline stage; every other rank of the same stage runs the same
    program, so ``weight[r]`` says how many devices rank ``r`` stands for.
    """

    ops: list[Op]
    ranks: tuple[int, ...]
    weight: dict[int, int]
    static_memory: dict[int, dict[str, float]]  # rank -> category -> bytes at t=0
    world: int
    notes: list[str] = field(default_factory=list)
    model_flops: float = 0.0
    representative: bool = True
    # rank -> matmul FLOPs its ops are timed for that the devices it stands for do not
    # execute (expert-load imbalance: the slowest EP rank's extra expert work); HFU
    # leaves them out.
    unexecuted_flops: dict[int, float] = field(default_factory=dict)

    def check(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Raise :class:`TraceError` for dangling or cyclic dependencies, naming them.

        Returns the dependency edges ``(flat, dst)`` of :meth:`_dep_arrays` where every op's
        id is its list position (the engine reads them again), else None."""
        import numpy as np

        edges = self._dep_arrays()
        if edges is not None:  # ids equal to list positions: no duplicate id
            flat, dst = edges
            bad = np.flatnonzero((flat < 0) | (flat >= len(self.ops)))
            if bad.shape[0]:
                op, d = self.ops[int(dst[bad[0]])], int(flat[bad[0]])
                raise TraceError(f"op {op.id} ({op.name} on rank {op.rank}) depends on unknown op {d}", field="deps")
            # every dependency on an earlier op (the stream predecessor always is): the list
            # is a topological order. Traces built by workloads.trace.builder without
            # pipeline parallelism are such; the others get the cycle search below.
            if bool((flat < dst).all()) or self._acyclic(flat, dst):
                return edges
        ids = {op.id: op for op in self.ops}
        if edges is None:
            if len(ids) != len(self.ops):
                raise TraceError("ops: duplicate op ids")
            for op in self.ops:
                for d in op.deps:
                    if d not in ids:
                        raise TraceError(
                            f"op {op.id} ({op.name} on rank {op.rank}) depends on unknown op {d}", field="deps"
                        )
            if self._acyclic():
                return
        # Stream order adds implicit edges: previous op on the same (rank, stream).
        succ: dict[int, list[int]] = {i: [] for i in ids}
        indeg = {i: 0 for i in ids}
        last: dict[tuple[int, str], int] = {}
        for op in self.ops:
            preds = set(op.deps)
            prev = last.get((op.rank, op.stream))
            if prev is not None:
                preds.add(prev)
            last[(op.rank, op.stream)] = op.id
            for p in preds:
                succ[p].append(op.id)
                indeg[op.id] += 1
        ready = [i for i, d in indeg.items() if d == 0]
        seen = 0
        while ready:
            i = ready.pop()
            seen += 1
            for s in succ[i]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.append(s)
        if seen != len(ids):  # reached only with a cycle (see _acyclic): name it
            stuck = sorted(i for i, d in indeg.items() if d > 0)[:5]
            names = ", ".join(f"{i} ({ids[i].name} on rank {ids[i].rank})" for i in stuck)
            raise TraceError(f"deps: the trace has a dependency cycle through ops {names}")

    def _dep_arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(flat, dst)``: every dependency as an edge ``flat[e] -> dst[e]`` between list
        positions, in op order, when every op's id is its position and every dependency an
        integer (else None)."""
        import numpy as np

        ops = self.ops
        n = len(ops)
        try:
            if not np.array_equal(np.fromiter((op.id for op in ops), dtype=np.int64, count=n), np.arange(n)):
                return None
            lens = np.fromiter((len(op.deps) for op in ops), dtype=np.int64, count=n)
            deps = itertools.chain.from_iterable(op.deps for op in ops)
            flat = np.fromiter(deps, dtype=np.int64, count=int(lens.sum()))
        except (TypeError, ValueError, OverflowError):
            return None
        return flat, np.repeat(np.arange(n, dtype=np.int64), lens)

    def _acyclic(self, src: np.ndarray | None = None, dst: np.ndarray | None = None) -> bool:
        """Whether the dependency graph (deps plus stream order) has no cycle: no
        strongly connected component of two or more ops and no op depending on itself
        (scipy's component search, vectorised; the caller names a cycle if there is one).
        ``src``/``dst``: the dependency edges between list positions, when known."""
        import numpy as np
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        ops = self.ops
        n = len(ops)
        if n == 0:
            return True
        if src is None:
            lens = np.fromiter((len(op.deps) for op in ops), dtype=np.int64, count=n)
            pos = {op.id: i for i, op in enumerate(ops)}
            flat = itertools.chain.from_iterable(op.deps for op in ops)
            src = np.fromiter(map(pos.__getitem__, flat), dtype=np.int64, count=int(lens.sum()))
            dst = np.repeat(np.arange(n, dtype=np.int64), lens)
        # stream order: each op after the previous op of its (rank, stream)
        keys: dict[tuple[int, str], int] = {}
        stream = np.fromiter((keys.setdefault((op.rank, op.stream), len(keys)) for op in ops), dtype=np.int64, count=n)
        order = np.argsort(stream, kind="stable")
        same = stream[order[1:]] == stream[order[:-1]]
        s = np.concatenate([src, order[:-1][same]])
        d = np.concatenate([dst, order[1:][same]])
        if s.shape[0] == 0:
            return True
        if bool((s == d).any()):
            return False
        graph = coo_matrix((np.ones(s.shape[0], dtype=np.int8), (s, d)), shape=(n, n)).tocsr()
        n_comp, _ = connected_components(graph, directed=True, connection="strong")
        return n_comp == n
