"""The host side: one CPU stream per simulated rank that issues its kernels.

The host issues a rank's ops in program order (the trace's order of that rank's ops,
over all its streams), each costing ``launches x launch_s`` of host time
(:attr:`Op.launches`: a compute op's kernels, one for a collective or send, 0 inside a
replayed CUDA graph; ``launch_s`` is ``training.host_launch_s``,
:data:`workloads.training.HOST_LAUNCH_S` with its sources). The host never waits for the
GPU, except after an op marked :attr:`Op.host_sync` (a device-to-host read of its result,
Megatron-Core's dropless all-to-all dispatcher reading the token counts per MoE layer):
there it blocks until that op has ended, so it cannot run ahead past it. Hence, with
``S_i`` the time the host starts issuing op ``i``::

    S_i = max(S_{i-1} + cost_{i-1}, end(op_{i-1}) if op_{i-1} is a sync)

A GPU op cannot start before it is issued: kernel ``j`` (0-based) of a compute op is
ready at ``S + (j + 1) launch_s`` (eager) or, where the op costs fewer launches than it
has kernels (a graph replay), all at ``S + launches x launch_s``; a communication op at
``S + launch_s``. A compute op that the GPU could start at ``g`` then ends at
``e_j = max(e_{j-1}, ready_j) + d_j`` over its kernels (``e_{-1} = g``): exactly
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

from workloads.trace.ops import Op


def launches_of(op: Op) -> int:
    """Host launches issuing ``op`` costs: :attr:`Op.launches` where set, else its kernels
    (compute) or one (a collective, send or host transfer)."""
    if op.launches >= 0:
        return op.launches
    return len(op.kernels) if op.kind == "compute" else 1


class HostTimeline:
    """When each simulated rank's host issues its ops (module notes).

    ``issue_start(op_id, end_time)`` returns ``(S, None)``: the time the host starts issuing
    the op, or ``(None, sync_id)`` where it is still blocked after sync op ``sync_id``
    (not yet ended). Issue times are computed once, in program order, as far as asked."""

    def __init__(self, ops: list[Op], ranks, launch_s: float):
        self.launch_s = launch_s
        order: dict[int, list[Op]] = defaultdict(list)
        sim = set(ranks)
        for op in ops:
            if op.rank in sim:
                order[op.rank].append(op)
        self._order = dict(order)
        self._pos = {op.id: (r, i) for r, rops in self._order.items() for i, op in enumerate(rops)}
        self._cursor = {r: [0, 0.0] for r in self._order}  # next op to issue, host time then
        self._start: dict[int, float] = {}
        #: rank -> seconds its host spent blocked at syncs (waiting for the GPU)
        self.sync_wait_s: dict[int, float] = defaultdict(float)
        #: rank -> seconds of host time issuing ops
        self.busy_s: dict[int, float] = defaultdict(float)

    def issue_start(self, op_id: int, end_time: dict) -> tuple[float | None, int | None]:
        hit = self._start.get(op_id)
        if hit is not None:
            return hit, None
        r, i = self._pos[op_id]
        cur = self._cursor[r]
        k, t = cur
        rops, starts, h = self._order[r], self._start, self.launch_s
        busy = 0.0
        while k <= i:
            if k > 0 and rops[k - 1].host_sync:
                prev = rops[k - 1]
                e = end_time.get(prev.id)
                if e is None:
                    cur[0], cur[1] = k, t
                    self.busy_s[r] += busy
                    return None, prev.id
                if e > t:
                    self.sync_wait_s[r] += e - t
                    t = e
            op = rops[k]
            starts[op.id] = t
            c = launches_of(op) * h
            busy += c
            t += c
            k += 1
        cur[0], cur[1] = k, t
        self.busy_s[r] += busy
        return starts[op_id], None

    def ready(self, op: Op, start: float) -> float:
        """When the GPU may start ``op`` whose issue starts at ``start``: its first kernel
        (compute; all of them under a graph replay) or its launch (communication)."""
        n = launches_of(op)
        if op.kind == "compute":
            return start + (min(n, 1) if n >= len(op.kernels) else n) * self.launch_s
        return start + n * self.launch_s

    def compute_end(self, op: Op, start: float, gpu_ready: float, times: tuple, scale: float) -> float:
        """End of compute op ``op`` (issue starting at ``start``) whose GPU could start it at
        ``gpu_ready``: kernel ``j`` of duration ``times[j] x scale`` starts when both the
        kernel before it has ended and the host has issued it."""
        n, h = launches_of(op), self.launch_s
        e = gpu_ready
        if n >= len(op.kernels):  # eager: one launch per kernel
            a = start
            for d in times:
                a += h
                if a > e:
                    e = a
                e += d * scale
            return e
        a = start + n * h  # a graph replay: every kernel issued by its launches
        if a > e:
            e = a
        for d in times:
            e += d * scale
        return e

    def issue_end(self, op: Op, start: float) -> float:
        """When the host has issued all of ``op``."""
        return start + launches_of(op) * self.launch_s
