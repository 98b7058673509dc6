"""The host side: one CPU stream per simulated rank that issues its kernels.

The host issues a rank's ops in program order (the trace's order of that rank's ops,
over all its streams), each costing ``launches x launch_s`` of host time
(:attr:`Op.launches`: a compute op's kernels, a GEMM run one per local expert counting one per
expert (:attr:`workloads.kernels.Kernel.launches`), one for a collective or send, 0 inside a
replayed CUDA graph; ``launch_s`` is ``training.host_launch_s``, by default
:data:`workloads.training.HOST_LAUNCH_S` with its sources on GPUs and 0 on TPUs, whose XLA
program has no per-operation host dispatch). The host never waits for the
GPU, except after an op marked :attr:`Op.host_sync` (a device-to-host read of its result,
Megatron-Core's dropless all-to-all dispatcher reading the token counts per MoE layer):
there it blocks until that op has ended, so it cannot run ahead past it. Hence, with
``S_i`` the time the host starts issuing op ``i``::

    S_i = max(S_{i-1} + cost_{i-1}, end(op_{i-1}) if op_{i-1} is a sync)

A GPU op cannot start before it is issued: launch ``j`` (0-based) of a compute op is
ready at ``S + (j + 1) launch_s`` (eager) or, where the op costs fewer launches than it
has kernels (a graph replay), all at ``S + launches x launch_s``; a communication op at
``S + launch_s``. A compute op that the GPU could start at ``g`` then ends at
``e_j = max(e_{j-1}, ready_j) + d_j`` over its launches (``e_{-1} = g``; a per-expert GEMM's
``groups`` launches each run an equal share of its time): exactly
``g + sum d`` when the host is ahead (``S + cost <= g``), the common case for long
kernels, so no per-kernel work is done then.

The GPU-side per-kernel cost ``launch_overhead_s`` of the compute calibration
(:mod:`simulator.engine.compute`) stays as it was: it is the device's own gap and tail
per kernel, paid even when the host is far ahead; the host's cost here is a second
resource, overlapped with the GPU and exposed only where the GPU catches up with it.
Nothing is counted twice: with the host ahead a step is as before.

Times are folded into the engine's chains of known durations (no event per op or
kernel): an op's issue time is known as soon as the sync before it (if any) has ended,
and the engine waits on that sync's end only where a stream reaches an op beyond it.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import accumulate

from workloads.trace.ops import Op


def launches_of(op: Op, memo: dict | None = None) -> int:
    """Host launches issuing ``op`` costs: :attr:`Op.launches` where set, else its kernels'
    (compute) or one (a collective, send or host transfer)."""
    if op.launches >= 0:
        return op.launches
    return kernel_launches(op, memo) if op.kind == "compute" else 1


def kernel_launches(op: Op, memo: dict | None = None) -> int:
    """Launches of a compute op's kernels issued one at a time (eager): one each, ``groups``
    for a GEMM run one per local expert (:attr:`workloads.kernels.Kernel.launches`). ``memo``
    (id of a kernel tuple -> (tuple, launches)) keeps the sum per tuple ops share."""
    ks = op.kernels
    if memo is None:
        return sum(k.launches for k in ks)
    hit = memo.get(id(ks))
    if hit is None or hit[0] is not ks:
        hit = memo[id(ks)] = (ks, sum(k.launches for k in ks))
    return hit[1]


class HostTimeline:
    """When each simulated rank's host issues its ops (module notes).

    ``issue_start(op_id, end_time)`` returns ``(S, None)``: the time the host starts issuing
    the op, or ``(None, sync_id)`` where it is still blocked after sync op ``sync_id``
    (not yet ended). Issue times are computed once, in program order, a stretch between two
    syncs at a time (each stretch's sums in order: the same bits as op by op)."""

    def __init__(self, ops: list[Op], ranks, launch_s: float):
        self.launch_s = launch_s
        self._memo: dict[int, tuple] = {}  # kernel_launches' sums per kernel tuple
        order: dict[int, list[Op]] = defaultdict(list)
        sim = set(ranks)
        for op in ops:
            if op.rank in sim:
                order[op.rank].append(op)
        self._order = dict(order)
        self._rank_of: dict[int, int] = {}  # op id -> its rank
        # rank -> (op ids, each op's host seconds, start index of each stretch between syncs
        # and the end): a stretch's issue times are known together once the sync before it ended
        self._stretches: dict[int, tuple[list[int], list[float], list[int]]] = {}
        for r, rops in self._order.items():
            ids = [op.id for op in rops]
            self._rank_of.update(dict.fromkeys(ids, r))
            memo = self._memo
            cost = [launches_of(op, memo) * launch_s for op in rops]
            cuts = [k + 1 for k, op in enumerate(rops[:-1]) if op.host_sync]
            self._stretches[r] = (ids, cost, [0, *cuts, len(rops)])
        self._cursor = {r: [0, 0.0] for r in self._order}  # next stretch to issue, host time then
        self._start: dict[int, float] = {}
        #: op id -> when its host has issued all of it (its start + launches x launch_s), set
        #: with its start; the engine reads both dicts directly for ops already issued
        self.end: dict[int, float] = {}
        #: rank -> seconds its host spent blocked at syncs (waiting for the GPU)
        self.sync_wait_s: dict[int, float] = defaultdict(float)
        #: rank -> seconds of host time issuing ops
        self.busy_s: dict[int, float] = defaultdict(float)

    def issue_start(self, op_id: int, end_time: dict) -> tuple[float | None, int | None]:
        hit = self._start.get(op_id)
        if hit is not None:
            return hit, None
        r = self._rank_of[op_id]
        ids, cost, cuts = self._stretches[r]
        cur = self._cursor[r]
        j, t = cur
        starts, ends = self._start, self.end
        while op_id not in starts:  # issue the next stretch: S_i = S_{i-1} + cost_{i-1}
            a, b = cuts[j], cuts[j + 1]
            if j > 0:  # after a sync: the host waits for its end
                prev = ids[a - 1]
                e = end_time.get(prev)
                if e is None:
                    cur[0], cur[1] = j, t
                    return None, prev
                if e > t:
                    self.sync_wait_s[r] += e - t
                    t = e
            times = list(accumulate(cost[a:b], initial=t))  # the same additions, in order
            starts.update(zip(ids[a:b], times))
            ends.update(zip(ids[a:b], times[1:]))  # start + launches x launch_s
            self.busy_s[r] += times[-1] - times[0]
            t = times[-1]
            j += 1
        cur[0], cur[1] = j, t
        return starts[op_id], None

    def ready(self, op: Op, start: float) -> float:
        """When the GPU may start ``op`` whose issue starts at ``start``: its first kernel
        (compute; all of them under a graph replay) or its launch (communication)."""
        n = launches_of(op, self._memo)
        if op.kind == "compute":
            return start + (min(n, 1) if n >= kernel_launches(op, self._memo) else n) * self.launch_s
        return start + n * self.launch_s

    def compute_end(self, op: Op, start: float, gpu_ready: float, times: tuple, scale: float) -> float:
        """End of compute op ``op`` (issue starting at ``start``) whose GPU could start it at
        ``gpu_ready``: kernel ``j`` of duration ``times[j] x scale`` starts when both the
        kernel before it has ended and the host has issued it."""
        n, h = launches_of(op, self._memo), self.launch_s
        e = gpu_ready
        if n >= kernel_launches(op, self._memo):  # eager: one launch per kernel (per expert GEMM)
            a = start
            for k, d in zip(op.kernels, times):
                part = d * scale / k.launches  # a per-expert GEMM: one of its equal launches
                for _ in range(k.launches):
                    a += h
                    if a > e:
                        e = a
                    e += part
            return e
        a = start + n * h  # a graph replay: every kernel issued by its launches
        if a > e:
            e = a
        for d in times:
            e += d * scale
        return e
