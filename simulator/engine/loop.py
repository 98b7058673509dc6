"""The event engine: executes a :class:`~workloads.trace.ops.Trace` on a topology.

Every simulated rank has one in-order simpy process per stream (``compute``,
``tp``, ``cp``, ``ep``, ``dp``, ``fsdp``, ``pp``). An op starts when the previous op
of its stream has finished and every op in its ``deps`` has finished; then

* a compute op takes the roofline time of its kernels (:mod:`simulator.engine.compute`),
  ``1 / (1 - comm_sm_fraction)`` times longer when it belongs to an overlapped
  forward/backward pair (``Op.comm_overlap``: the all-to-all kernels hold SMs);
* a collective waits until every *simulated* member of its group has reached it
  (rendezvous), then runs its algorithm's phases on the shared flow network;
* a send moves its message to the peer over the network.

Fewer events, same times. A chain of ops whose durations are known when they start
(compute ops, and *private* communication: ops whose network phases no other process
can ever meet, see :mod:`simulator.engine.private`) runs as one timeout at the sum of
their durations, as long as nothing outside the process waits on the ops inside it;
private ops that the compute stream waits for anyway are run by the compute stream's
process (:func:`~simulator.engine.private.absorb`). ``Engine(..., chain_ops=False, private_phases=False)``
(the same keywords of ``simulate()``) switch these off (tests compare).

Representative ranks. When the trace holds one rank per pipeline stage (the
default), each collective or send issued by a representative is also issued, on
the network, for every *twin* group of the same stage: the groups of the ranks not
simulated, which run the same program at the same instant. Their transfers load
the links exactly as in a per-device simulation. Twins of a group that lies
inside one scale-up domain of a switched network are left out: they use only
their own devices' links into their own domain's (non-blocking) switch, which
nothing the representatives do touches, so leaving them out cannot change any
simulated rate.

Symmetry quotient. Under that assumption every twin image of a transfer runs at
the transfer's own rate, so the network need only carry the representative
group's transfers, each loading link l ``m(f, l)`` times its rate, where
``m(f, l)`` counts the images of f (itself included) that cross l, over the links
the representative's transfers cross (images' other links are images of these,
carrying the same load). :func:`~simulator.engine.quotient.quotient_phase` builds them once per plan (per pair
and size for sends); where the twins' plans do not line up with the
representative's (other phase or transfer counts, sizes, weights or latency) every
twin is injected as before; a send's twin pairs that differ only in path latency fold
class by class instead (``Lowering._partial_pair_quotient``). ``Engine(...,
twin_quotient=False)`` (``simulate(..., twin_quotient=False)``) always injects every
twin (tests compare the two).

An expert all-to-all planned as ``hierarchical-a2a`` (across scale-up domains, with or
without node-limited routing) is quotiented further, inside its own group: its rail and
NVLink pieces are direct all-to-alls whose members all belong to the representative's
stage, so each transfer is the image of one of the representative's under a rotation
of its group's members (``Lowering._hierarchical_a2a_pieces``). So is a direct
all-to-all inside one scale-up domain, whose twins are left out but whose members are
the representative's stage (``Lowering._domain_a2a_quotient``). A quotient's sends,
and its receives, run as one flow each of their summed weight, loading each link as
they all do at one rate (:func:`~simulator.engine.quotient.bundle`; where the traffic
is symmetric they share one rate): an all-to-all of ``n`` members in one domain is 2
flows. ``Engine(..., a2a_quotient=False)`` runs the full plans instead.

What a collective or send runs on the network -- plan, twin injection, symmetry
quotient, merge into network phases -- is one call to :class:`~simulator.engine.lowering.Lowering`;
this module only runs streams and events.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache, cached_property
from operator import attrgetter

import numpy as np
import simpy
from simpy.events import NORMAL

from simulator.engine.accounting import IdleAccount, account
from simulator.engine.compute import kernel_time_s, kernels_time_s, overlap_slowdown
from simulator.engine.host import HostTimeline
from simulator.engine.lowering import Lowering
from simulator.engine.private import PrivateBook, absorb, private_ops
from simulator.network import collectives as coll_mod
from simulator.network.flows import FlowNetwork
from topologies.chips import ChipSpec, ComputeCalibration
from topologies.topology import Topology
from workloads.counts import matmul_flops
from workloads.layout import ParallelLayout
from workloads.trace.ops import Op, Trace, TraceError


@dataclass(slots=True)
class OpRecord:
    op: Op
    start_s: float
    end_s: float


@dataclass
class RawRun:
    records: list[OpRecord]
    step_time_s: float
    idle: dict[int, dict[str, float]]  # rank -> seconds per category (see simulator.engine.accounting)
    mem_events: list[tuple[float, int, str, float]]  # (time, rank, category, delta)
    matmul_flops: dict[int, float]  # rank -> GEMM + attention FLOPs of its compute ops (incl. recompute)
    network_stats: dict
    events_processed: int
    idle_spans: list[tuple[int, float, float, str, str]] = field(default_factory=list)
    # (rank, start_s, end_s, cause 'bubble' | 'exposed_comm' | 'offload_wait', axes busy or 'offload')
    account: IdleAccount | None = None  # the per-rank attribution behind idle and idle_spans
    # (rank, layer) -> seconds the GPU waited for its host to issue that layer's ops (layer -1:
    # outside the layers); empty without a host stream (simulator.engine.host)
    host_delay_s: dict = field(default_factory=dict)
    host: HostTimeline | None = None  # the host stream's issue times and busy / sync-wait seconds
    # op id -> seconds the GPU waited for the host to issue that op (the same waits as
    # host_delay_s, by op: steady-state skipping repeats one period's of them)
    host_delay_by_op_s: dict = field(default_factory=dict)


class _Environment(simpy.Environment):
    """simpy's environment plus a timeout at an absolute time (a chain of compute ops
    ends at the sum of its durations, which ``now + (t - now)`` need not round to)."""

    def timeout_at(self, t: float) -> simpy.Event:
        ev = simpy.Event(self)
        ev._ok = True
        ev._value = None
        heapq.heappush(self._queue, (t, NORMAL, next(self._eid), ev))
        return ev


@cache
def progress_bar():
    """``tqdm.auto``'s bar (a widget in a notebook, with ipywidgets; text elsewhere)
    without tqdm's monitor thread, which would outlive the run and keep
    :meth:`~simulator.results.result.Result.write` from forking (engine and sweep bars
    update every op or case: the monitor's nudge for stalled bars has nothing to do)."""
    from tqdm.auto import tqdm

    class Bar(tqdm):
        monitor_interval = 0

    return Bar


class Engine:
    def __init__(
        self,
        trace: Trace,
        topo: Topology,
        layout: ParallelLayout,
        chip: ChipSpec,
        compute_cal: ComputeCalibration,
        network_cal=None,
        dtype: str = "bf16",
        compute_scale: dict[int, float] | None = None,
        algorithms: dict[str, str] | None = None,
        host_bw_bytes_per_s: float = 32e9,
        progress: bool | None = False,
        twin_quotient: bool = True,
        chain_ops: bool = True,
        private_phases: bool = True,
        reserve_isolated: bool = True,
        a2a_quotient: bool = True,
        account_idle: bool = True,
        host_launch_s: float = 0.0,
    ):
        if layout.world > topo.n_devices:
            raise TraceError(f"parallel: the layout needs {layout.world} devices, the cluster has {topo.n_devices}")
        self.trace, self.topo, self.layout, self.chip = trace, topo, layout, chip
        self.cal, self.dtype = compute_cal, dtype
        self._overlap_slowdown = overlap_slowdown(compute_cal)  # compute beside SM-holding comm kernels
        self.compute_scale = compute_scale or {}
        self.host_bw = host_bw_bytes_per_s  # each device's own host link (PCIe); not shared
        # progress: True = always, None = only on a terminal (tqdm's rule), False = never.
        self.progress = progress
        self._bar = None
        # Run chains of ops with known durations as one event (see :meth:`_chain`); False
        # gives every op its own event (tests compare the two).
        self.chain_ops = chain_ops
        # Run communication ops that nothing else can meet on the network as known durations
        # (see :mod:`simulator.engine.private`); False sends every op through the network.
        self.private_phases = private_phases
        # Attribute idle time when the run ends (False: the caller accounts the records itself,
        # as steady-state skipping does for a timeline with periods inserted).
        self.account_idle = account_idle
        self.env = _Environment()
        self.net = FlowNetwork(self.env, topo, network_cal, reserve_isolated=reserve_isolated)
        # What a collective or send runs on the network: plan, twins, quotient, merge.
        slow_a2a = compute_cal.overlap_a2a_slowdown  # all-to-alls beside an overlapped pair's compute
        self.lowering = Lowering(trace, topo, layout, self.net, algorithms, twin_quotient, a2a_quotient, slow_a2a)
        self.sim_ranks = set(trace.ranks)
        self.done: dict[int, simpy.Event] = {}  # op id -> its end, for ops waited on
        self.end_time: dict[int, float] = {}
        self.records: list[OpRecord] = []
        self.mem_events: list[tuple[float, int, str, float]] = []
        self._rdv: dict[str, list] = {}
        self._sim_members: dict[tuple, int] = {}  # group -> how many of it are simulated
        self._dur_cache: dict = {}
        #: Private ops run as known durations (:func:`~simulator.engine.private.private_ops`).
        self.private_ops_run = 0
        self._book: PrivateBook | None = None
        # The host stream (simulator.engine.host): seconds per host launch; 0 = none.
        self.host_launch_s = host_launch_s
        self._host: HostTimeline | None = None
        self.host_delay: dict[tuple[int, int], float] = defaultdict(float)
        self.host_delay_by_op: dict[int, float] = defaultdict(float)
        self._times_cache: dict = {}
        # op id -> merged phases of a collective with no other simulated member, looked up
        # by private_ops (:meth:`_stream` runs them from here; others it looks up itself)
        self._solo: dict[int, tuple] = {}

    @cached_property
    def ops_by_id(self) -> dict[int, Op]:
        """Op id -> op, built when first asked for (the run itself does not look ops up by id)."""
        return {op.id: op for op in self.trace.ops}

    # ---- public -----------------------------------------------------------------
    def run(self) -> RawRun:
        edges = self.trace.check()
        streams: dict[tuple[int, str], list[Op]] = defaultdict(list)
        for op in self.trace.ops:
            streams[(op.rank, op.stream)].append(op)
        self._known, self._book = (
            private_ops(self.trace, self.lowering, self.sim_ranks, self._sim_members, self._solo)
            if self.private_phases and self.net.reserves_isolated
            else ({}, None)
        )
        self._log = self._book.log.append if self._book is not None else None
        if self._known:
            absorb(streams, self._known)
        self._external = self._external_targets(streams, edges)
        if self.host_launch_s > 0:
            self._host = HostTimeline(self.trace.ops, self.trace.ranks, self.host_launch_s)
            # a host blocked after a sync op waits on its end: always an event
            self._external.update(op.id for op in self.trace.ops if op.host_sync)
        for (rank, stream), ops in sorted(streams.items()):
            if ops:
                self.env.process(self._stream(rank, stream, ops))
        if self.progress is not False:
            self._bar = progress_bar()(
                total=len(self.trace.ops),
                unit="op",
                desc="simulating",
                disable=None if self.progress is None else False,
                leave=False,
                mininterval=0.5,
            )
        try:
            self.env.run()
        finally:
            if self._bar is not None:
                self._bar.close()
        if self._book is not None:
            self._book.flush(self.net)
            self.private_ops_run = self._book.ops_run
        unfinished = (
            [op for op in self.trace.ops if op.id not in self.end_time]
            if len(self.end_time) < len(self.trace.ops)
            else []
        )
        if unfinished:
            waiting = ", ".join(f"{o.name} (rank {o.rank}, {o.stream})" for o in unfinished[:4])
            raise TraceError(
                f"deps: the trace deadlocks: {len(unfinished)} ops never start, e.g. {waiting}; "
                "collectives must be reached in the same order by every member of their group"
            )
        step = max(self.end_time.values()) if self.end_time else 0.0
        acc = account(self.records, self.trace.ranks, step) if self.account_idle else None
        flops: dict[int, float] = defaultdict(float)
        stats = self._dur_cache  # every compute op run looked its kernel group up there
        for op in map(attrgetter("op"), self.records):  # in record order: the same sums
            if op.kind == "compute":
                flops[op.rank] += stats[id(op.kernels)][2]
        return RawRun(
            records=self.records,
            step_time_s=step,
            idle=acc.per_rank() if acc is not None else {},
            idle_spans=acc.spans if acc is not None else [],
            account=acc,
            mem_events=self.mem_events,
            matmul_flops=dict(flops),
            network_stats=self._net_stats(),
            events_processed=len(self.records),
            host_delay_s=dict(self.host_delay),
            host=self._host,
            host_delay_by_op_s=dict(self.host_delay_by_op),
        )

    def _external_targets(self, streams: dict, edges: tuple | None = None) -> set[int]:
        """Ids of the ops that an op of another process depends on: the only ends other
        processes wait for (see :meth:`_stream`'s chains). ``streams``: (rank, stream) ->
        the ops that process runs, after :func:`~simulator.engine.private.absorb` moved
        some (op ids are unique: :meth:`Trace.check`). ``edges``: the dependency edges
        ``(flat, dst)`` between list positions that :meth:`Trace.check` returns where ids
        are positions: then compared as arrays, each op's process a number."""
        if edges is not None:
            flat, dst = edges
            proc = np.full(len(self.trace.ops), -1, dtype=np.int64)
            for number, ops in enumerate(streams.values()):
                proc[[op.id for op in ops]] = number
            return set(np.unique(flat[proc[flat] != proc[dst]]).tolist())
        where: dict[int, tuple] = {}
        for key, ops in streams.items():
            where.update(dict.fromkeys([op.id for op in ops], key))
        out: set[int] = set()
        add, get = out.add, where.get
        for key, ops in streams.items():
            for op in ops:
                for d in op.deps:
                    if get(d, key) is not key:  # one key object per process
                        add(d)
        return out

    # ---- private communication: ops whose network phases nothing else can meet ----------

    def _net_stats(self) -> dict:
        st = self.net.stats
        return {
            "flows_started": st.flows_started,
            "unit_flows_started": st.unit_flows_started,
            "phases_started": st.phases_started,
            "rate_recomputations": st.recomputations,
            "max_concurrent_flows": st.max_concurrent_flows,
            "reserved_phases": st.reserved_phases,
        }

    # ---- processes ----------------------------------------------------------------
    def _stream(self, rank: int, stream: str, ops: list[Op]):
        """simpy process body: run one stream's ops in order, each once its deps have ended.

        A collective with no other simulated member runs its merged phases right here
        (what :meth:`_communicate` and :meth:`_collective` do, without their generators;
        with ``chain_ops=False`` it goes through them)."""
        env = self.env
        end_time, done = self.end_time, self.done
        known = self._known
        bar = self._bar
        host = self._host
        issued, issued_end = (host._start, host.end) if host is not None else ({}, {})
        phases_of, transfer = self.lowering.collective_phases, self.net.transfer
        members_of, record = self._members_of, self.records.append
        inline = self.chain_ops  # False: every communication op through _communicate, as before
        solo = self._solo.get if inline else {}.get
        i, n = 0, len(ops)
        while i < n:
            op = ops[i]
            deps = op.deps
            if deps:
                if len(deps) == 1:  # the common case, without a list
                    d = deps[0]
                    if d not in end_time:
                        yield done.get(d) or self._done_event(d)
                else:
                    pending = [done.get(d) or self._done_event(d) for d in deps if d not in end_time]
                    if len(pending) == 1:
                        yield pending[0]
                    elif pending:
                        yield env.all_of(pending)
            kind = op.kind
            if host is not None and op.id not in issued:  # wait until the host can issue it (past any sync before it)
                start, sync = host.issue_start(op.id, end_time)
                while start is None:
                    yield done.get(sync) or self._done_event(sync)  # pyright: ignore[reportArgumentType]  (no start: a sync op id)
                    start, sync = host.issue_start(op.id, end_time)
            if kind == "compute" or op.id in known:
                i, op, t = self._chain(ops, i)
                if t != env._now:
                    yield env.timeout_at(t)
                end_time[op.id] = t
            else:
                if host is not None:
                    ready = issued_end[op.id]  # host.ready of a communication op
                    if ready > env._now:
                        self._host_late(op, ready - env._now)
                        yield env.timeout_at(ready)
                phases = solo(op.id)
                if phases is None and kind == "collective" and inline and members_of(op) == 1:
                    phases = phases_of(op)  # not looked up by private_ops
                if phases is not None:  # nobody to wait for
                    start = env._now
                    if op.mem:
                        self._mem(op, "start")
                    for transfers, steps, _compute in phases:  # coll_mod.run_merged
                        yield transfer(transfers, steps)
                    t = env._now
                    if op.mem:
                        self._mem(op, "end")
                    end_time[op.id] = t
                    record(OpRecord(op, start, t))
                else:
                    yield from self._communicate(op)
                i += 1
            waiter = done.pop(op.id, None)
            if waiter is not None:
                waiter.succeed()
            if bar is not None:
                bar.update()

    def _chain(self, ops: list[Op], i: int) -> tuple[int, Op, float]:
        """Run ``ops[i]`` and the ops after it that join its chain, from now: returns the
        index after the chain, its last op and that op's end (not yet recorded in
        ``end_time``).

        A chain of ops whose durations are known when they start (compute, and private
        communication: see :mod:`simulator.engine.private`), each starting when the one
        before ends: the next joins the chain when every dep of it has already ended and
        nothing outside this process waits on the one before (so its end, known now, need
        not be an event). The times are the same sums a timeout per op would give; only
        the chain's last end is scheduled."""
        end_time, record = self.end_time, self.records.append
        external, known, chain = self._external, self._known, self.chain_ops
        dur_cache, slowdown, scales = self._dur_cache, self._overlap_slowdown, self.compute_scale
        bar, log = self._bar, self._log
        host = self._host
        issued, issued_end = (host._start, host.end) if host is not None else ({}, {})
        n = len(ops)
        op = ops[i]
        t = self.env._now
        active = -1  # flows in flight now (read once: nothing changes them during a chain)
        while True:
            start = t
            if op.mem:
                self._mem_at(op, "start", start)
            if op.kind == "compute":
                kern = op.kernels  # the op's duration, inlined
                hit = dur_cache.get(id(kern))
                if hit is None or hit[0] is not kern:
                    hit = self._kernel_stats(kern)
                dur = hit[1]
                if op.comm_overlap:
                    dur *= slowdown
                if op.sm_held:
                    dur /= 1.0 - op.sm_held
                if scales:
                    sc = scales.get(op.rank)
                    if sc:
                        dur = dur / sc
                if host is not None and issued_end[op.id] > start:  # else issued before the GPU gets to it
                    start, t, dur = self._host_compute(op, start, t, dur, hit[1])
                if dur > 0:
                    t = start + dur
                if op.mem:
                    self._mem_at(op, "end", t)
                if op.kernels:
                    record(OpRecord(op, start, t))
            else:  # a private op: its phases' seconds one after another (see PrivateBook)
                durs, code, most, now = known[op.id]
                log(code)  # pyright: ignore[reportOptionalCall]  (a private op: the book logs)
                if host is not None:
                    ready = issued_end[op.id]  # host.ready of a communication op
                    if ready > t:
                        self._host_late(op, ready - t)
                        start = t = ready
                for d in durs:
                    t = t + d
                if most or now is not None:
                    active = self._private_stats(most, now, active)
                if op.mem:
                    self._mem_at(op, "end", t)
                record(OpRecord(op, start, t))
            i += 1
            if i == n or not chain or op.id in external:
                return i, op, t
            end_time[op.id] = t  # nobody outside this process waits on it
            nxt = ops[i]
            if (nxt.kind != "compute" and nxt.id not in known) or (
                nxt.deps and not all(map(end_time.__contains__, nxt.deps))
            ):
                return i, op, t
            if host is not None and nxt.id not in issued and host.issue_start(nxt.id, end_time)[0] is None:
                return i, op, t
            if bar is not None:
                bar.update()
            op = nxt

    def _private_stats(self, most: int, now, active: int) -> int:
        """Count a private op's flows in the network's statistics: its ``most`` concurrent
        flows on top of the ``active`` ones (read once per chain; -1: not yet) and the bytes
        ``now`` puts on links. Returns ``active``."""
        net = self.net
        if most:
            if active < 0:
                active = net.active_flows
            if active + most > net.stats.max_concurrent_flows:
                net.stats.max_concurrent_flows = active + most
        if now is not None:
            for links, added in now:
                net.stats.link_bytes[links] += added
        return active

    def _host_late(self, op: Op, seconds: float) -> None:
        """Count ``seconds`` the GPU waited for the host to issue ``op``."""
        self.host_delay[(op.rank, op.layer)] += seconds
        self.host_delay_by_op[op.id] += seconds

    def _host_compute(self, op: Op, start: float, t: float, dur: float, base: float) -> tuple[float, float, float]:
        """A compute op the GPU could start at ``start`` for ``dur`` seconds (``base`` unscaled),
        with its kernels issued by the host, which has not issued all of them by ``start``
        (:meth:`_chain` checks ``HostTimeline.end`` first): ``(start, t, dur)`` unchanged where they
        still end at ``start + dur``; else its start, end and ``0.0`` (its end ``t`` is then the
        host-bound one)."""
        host = self._host
        assert host is not None  # called only with a host stream
        issued = host.issue_start(op.id, self.end_time)[0]
        assert issued is not None  # the op's turn on the host has come (_stream waited for it)
        ratio = dur / base if base > 0 else 1.0
        e = host.compute_end(op, issued, start, self._kernel_times(op.kernels), ratio)
        late = e - (start + dur)
        if late <= 0:
            return start, t, dur
        self._host_late(op, late)
        return max(start, host.ready(op, issued)), e, 0.0

    def _communicate(self, op: Op):
        """simpy process body: run a collective, send or host op through the network (or
        the host link) and record it."""
        env = self.env
        start = env._now
        if op.mem:
            self._mem(op, "start")
        kind = op.kind
        if kind == "collective":
            yield from self._collective(op)
        elif kind == "send":
            yield from self._send(op)
        elif kind == "host":
            rate = op.rate_bytes_per_s or self.host_bw
            if op.size_bytes > 0:
                yield env.timeout(op.size_bytes / rate)
        else:
            raise TraceError(f"op {op.id}: unknown kind {kind!r}; expected compute, collective, send or host")
        end = env._now
        if op.mem:
            self._mem(op, "end")
        self.end_time[op.id] = end
        self.records.append(OpRecord(op, start, end))

    def _done_event(self, op_id: int) -> simpy.Event:
        """The event fired when op ``op_id`` ends (made only for ops someone waits on)."""
        ev = self.done.get(op_id)
        if ev is None:
            ev = self.done[op_id] = self.env.event()
        return ev

    def _mem(self, op: Op, at: str) -> None:
        self._mem_at(op, at, self.env._now)

    def _mem_at(self, op: Op, at: str, t: float) -> None:
        for cat, delta, when in op.mem:
            if when == at and delta:
                self.mem_events.append((t, op.rank, cat, delta))

    def _kernel_stats(self, kernels: tuple) -> tuple:
        """``(kernels, roofline time, matmul FLOPs)`` of a kernel group, computed once per
        distinct group (the trace shares one tuple among all ops of the same shape)."""
        hit = self._dur_cache.get(id(kernels))
        if hit is None or hit[0] is not kernels:
            # Keep the tuple alive with its figures so that its id cannot be reused.
            hit = self._dur_cache[id(kernels)] = (
                kernels,
                kernels_time_s(kernels, self.chip, self.cal, self.dtype),
                matmul_flops(kernels),
            )
        return hit

    def _kernel_times(self, kernels: tuple) -> tuple:
        """Each kernel's roofline time (the host stream's per-kernel issue, simulator.engine.host)."""
        hit = self._times_cache.get(id(kernels))
        if hit is None or hit[0] is not kernels:
            hit = self._times_cache[id(kernels)] = (
                kernels,
                tuple(kernel_time_s(k, self.chip, self.cal, self.dtype) for k in kernels),
            )
        return hit[1]

    # ---- communication -----------------------------------------------------------------
    def _members_of(self, op: Op) -> int:
        """How many members of ``op``'s group are simulated."""
        n_members = self._sim_members.get(op.group)
        if n_members is None:
            n_members = self._sim_members[op.group] = sum(r in self.sim_ranks for r in op.group)
        return n_members

    def _collective(self, op: Op):
        n_members = self._members_of(op)
        if n_members == 1:  # nobody to wait for: run it in this stream's process
            yield from coll_mod.run_merged(self.net, self.lowering.collective_phases(op))
            return
        entry = self._rdv.get(op.key)
        if entry is None:
            entry = self._rdv[op.key] = [0, self.env.event()]
        entry[0] += 1
        if entry[0] == n_members:
            del self._rdv[op.key]
            self.env.process(self._run_collective(op, entry[1]))
        yield entry[1]

    def _run_collective(self, op: Op, done: simpy.Event):
        yield from coll_mod.run_merged(self.net, self.lowering.collective_phases(op))
        done.succeed()

    def _send(self, op: Op):
        yield self.net.transfer(self.lowering.send_transfers(op))
