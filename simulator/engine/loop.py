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
can ever meet, see :meth:`Engine._private_ops`) runs as one timeout at the sum of
their durations, as long as nothing outside the process waits on the ops inside it;
private ops that the compute stream waits for anyway are run by the compute stream's
process (:meth:`Engine._absorb`). ``Engine(..., chain_ops=False, private_phases=False)``
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
carrying the same load). ``_quotient_phase`` builds them once per plan (per pair
and size for sends); where the twins' plans do not line up with the
representative's (other phase or transfer counts, sizes, weights or latency) every
twin is injected as before. ``Engine(..., twin_quotient=False)`` (``simulate(...,
twin_quotient=False)``) always injects every twin (tests compare the two).

An expert all-to-all planned as ``hierarchical-a2a`` (across scale-up domains, with or
without node-limited routing) is quotiented further, inside its own group: its rail and
NVLink pieces are direct all-to-alls whose members all belong to the representative's
stage, so each transfer is the image of one of the representative's under a rotation
of its group's members (:meth:`_hierarchical_a2a_pieces`).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np
import simpy

from simulator.network import collectives as coll_mod
from simulator.engine.accounting import IdleAccount, account
from simulator.engine.compute import ComputeCalibration, kernels_time_s, overlap_slowdown
from simulator.network.flows import FlowNetwork, Transfer
from topologies.chips import ChipSpec
from workloads.counts import MATMUL_KINDS
from topologies.topology import Topology
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
    account: Optional[IdleAccount] = None  # the per-rank attribution behind idle and idle_spans


class _Environment(simpy.Environment):
    """simpy's environment plus a timeout at an absolute time (a chain of compute ops
    ends at the sum of its durations, which ``now + (t - now)`` need not round to)."""

    def timeout_at(self, t: float) -> simpy.Event:
        ev = simpy.Event(self)
        ev._ok = True
        ev._value = None
        heapq.heappush(self._queue, (t, simpy.events.NORMAL, next(self._eid), ev))
        return ev


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
        compute_scale: Optional[dict[int, float]] = None,
        algorithms: Optional[dict[str, str]] = None,
        host_bw_bytes_per_s: float = 32e9,
        progress: Optional[bool] = False,
        twin_quotient: bool = True,
        chain_ops: bool = True,
        private_phases: bool = True,
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
        self.algorithms = algorithms or {}
        # Representative mode: run each collective or send once, as the symmetry quotient
        # of its twins' traffic (see :meth:`_quotient_phase`); False injects every twin.
        self.twin_quotient = twin_quotient
        # Run chains of ops with known durations as one event (see :meth:`_stream`); False
        # gives every op its own event (tests compare the two).
        self.chain_ops = chain_ops
        # Run communication ops that nothing else can meet on the network as known
        # durations (see :meth:`_private_ops`); False sends every op through the network.
        self.private_phases = private_phases
        self.env = _Environment()
        self.net = FlowNetwork(self.env, topo, network_cal)
        self.sim_ranks = set(trace.ranks)
        self.done: dict[int, simpy.Event] = {}  # op id -> its end, for ops waited on
        self.end_time: dict[int, float] = {}
        self.ops_by_id = {op.id: op for op in trace.ops}
        self.records: list[OpRecord] = []
        self.mem_events: list[tuple[float, int, str, float]] = []
        self._rdv: dict[str, list] = {}
        self._sim_members: dict[tuple, int] = {}  # group -> how many of it are simulated
        self._dur_cache: dict = {}
        self._twin_cache: dict = {}
        self._plan_cache: dict = {}
        self._net_phase_cache: dict = {}  # (coll, group, size, axis, rank) -> network phases
        self._send_cache: dict = {}  # (rank, peer, size, axis) -> transfers tuple
        self.twin_stats = {"quotient": 0, "fallback": 0}  # phases quotiented / fallbacks

    # ---- public -----------------------------------------------------------------
    def run(self) -> RawRun:
        self.trace.check()
        streams: dict[tuple[int, str], list[Op]] = defaultdict(list)
        for op in self.trace.ops:
            streams[(op.rank, op.stream)].append(op)
        self._known = self._private_ops() if self.private_phases and self.net.reserves_isolated else {}
        where = self._absorb(streams) if self._known else {}
        self._external = self._external_targets(where)
        for (rank, stream), ops in sorted(streams.items()):
            if ops:
                self.env.process(self._stream(rank, stream, ops))
        if self.progress is not False:
            from tqdm.auto import tqdm  # a widget in a notebook (with ipywidgets), text elsewhere

            self._bar = tqdm(
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
        unfinished = [op for op in self.trace.ops if op.id not in self.end_time]
        if unfinished:
            waiting = ", ".join(f"{o.name} (rank {o.rank}, {o.stream})" for o in unfinished[:4])
            raise TraceError(
                f"deps: the trace deadlocks: {len(unfinished)} ops never start, e.g. {waiting}; "
                "collectives must be reached in the same order by every member of their group"
            )
        step = max(self.end_time.values()) if self.end_time else 0.0
        acc = account(self.records, self.trace.ranks, step)
        flops: dict[int, float] = defaultdict(float)
        for rec in self.records:
            if rec.op.kind == "compute":
                flops[rec.op.rank] += self._kernel_stats(rec.op.kernels)[2]
        return RawRun(
            records=self.records,
            step_time_s=step,
            idle=acc.per_rank(),
            idle_spans=acc.spans,
            account=acc,
            mem_events=self.mem_events,
            matmul_flops=dict(flops),
            network_stats=self._net_stats(),
            events_processed=len(self.records),
        )

    def _external_targets(self, moved: dict) -> set[int]:
        """Ids of the ops that an op of another process depends on: the only ends other
        processes wait for (see :meth:`_stream`'s chains). ``moved``: op id -> the
        stream that runs it, where :meth:`_absorb` moved it."""
        where = {op.id: (op.rank, op.stream) for op in self.trace.ops}
        where.update(moved)
        out: set[int] = set()
        for op in self.trace.ops:
            if op.deps:
                me = where[op.id]
                for d in op.deps:
                    if where.get(d, me) != me:
                        out.add(d)
        return out

    # ---- private communication: ops whose network phases nothing else can meet ----------
    def _private_ops(self) -> dict[int, tuple]:
        """Communication ops whose timing is known when they start: op id ->
        ``((prepared phase or None, isolated evolution, seconds), ...)`` per phase.

        An op qualifies when it runs in its own stream's process (a send, or a collective
        with no other simulated member), every phase of it has a cached isolated
        evolution, and no link any of its phases loads is loaded by a phase of another
        process (stream, or collective rendezvous) anywhere in the trace. Its stream runs
        one op at a time, so each of its phases is always alone on its links: the
        network would reserve it on arrival and never materialise it, and it ends
        ``steps x latency + evolution`` after it starts (see :mod:`simulator.network.flows`).
        :meth:`_known_end` books what the network would have booked."""
        users: dict[int, set] = defaultdict(set)  # link -> processes that load it
        shapes: dict[int, tuple] = {}  # id(phases) -> (phases, links, info | None)
        seen: dict[tuple, tuple] = {}  # (id(phases), process) -> shape
        cand: list[tuple[int, tuple, tuple]] = []
        sim = self.sim_ranks
        members = self._sim_members
        for op in self.trace.ops:
            kind = op.kind
            if kind == "collective":
                n = members.get(op.group)
                if n is None:
                    n = members[op.group] = sum(r in sim for r in op.group)
                phases = self._network_phases(op)
                who = (op.rank, op.stream) if n == 1 else ("rendezvous", op.key)
            elif kind == "send":
                phases = self._send_transfers(op)
                who = (op.rank, op.stream)
                n = 1
            else:
                continue
            key = (id(phases), who)
            hit = seen.get(key)
            if hit is None:
                hit = shapes.get(id(phases))
                if hit is None:
                    merged = phases if kind == "collective" else ((phases, 1, 0.0),)
                    hit = shapes[id(phases)] = (phases,) + self._phase_info(merged)
                seen[key] = hit
                for lk in hit[1]:
                    users[lk].add(who)
            if hit[2] is not None and n == 1:
                cand.append((op.id, who, hit))
        private: dict[tuple, bool] = {}
        out = {}
        for oid, who, hit in cand:
            key = (id(hit[0]), who)
            ok = private.get(key)
            if ok is None:
                ok = private[key] = all(len(users[lk]) == 1 for lk in hit[1])  # only ``who``
            if ok:
                out[oid] = hit[2]
        return out

    def _phase_info(self, phases: tuple) -> tuple:
        """``(links loaded, per-phase (prepared, evolution, seconds) or None)`` of merged
        network phases; None where a phase has no cached isolated evolution."""
        net = self.net
        links: set[int] = set()
        info: Optional[list] = []
        for transfers, steps, _compute in phases:
            prep = net.prepared(transfers)
            if prep is None:
                if info is not None:
                    info.append((None, None, 0.0))
                continue
            arr, link_list, iso = net.isolation(prep)
            links.update(link_list)
            if iso is None:
                info = None
            elif info is not None:
                info.append((prep, iso, steps * prep.latency_s + iso.duration_s))
        return links, None if info is None else tuple(info)

    def _known_end(self, op: Op, t: float) -> float:
        """Run private op ``op`` (see :meth:`_private_ops`) from ``t``: its end, with the
        network's counters and link bytes booked as its reservations would book them
        (``max_concurrent_flows`` counts its flows with those in flight at its start)."""
        net = self.net
        st = net.stats
        for prep, iso, dur in self._known[op.id]:
            st.phases_started += 1
            if prep is None:
                continue
            k = len(prep.links)
            st.flows_started += prep.n_transfers
            st.flow_rows_started += k
            st.unit_flows_started += prep.units
            st.reserved_phases += 1
            if net.active_flows + k > st.max_concurrent_flows:
                st.max_concurrent_flows = net.active_flows + k
            st.link_bytes[iso.links] += iso.link_bytes
            t = t + dur
        return t

    def _absorb(self, streams: dict) -> dict:
        """Move private ops (:meth:`_private_ops`) of a rank's communication streams into
        its compute stream where that changes no start time, so that a compute chain runs
        through them without an event: a run ``a_j .. a_k`` of stream S (each depending
        on the one before alone) joins right after compute op ``c`` when

        * ``a_j`` depends on ``c`` alone and the compute op after ``c`` depends on ``a_k``
          (the compute stream waits for the run anyway, and nothing else of it overlaps it);
        * the op before ``a_j`` in S has ended when ``c`` ends (it was moved before ``c``,
          or the compute stream waited for it at or before ``c``);
        * the op after ``a_k`` in S starts after ``a_k`` ends (it was moved too, or it
          depends on a compute op after the run).

        Returns op id -> the stream that now runs it; ``streams`` is edited in place."""
        known = self._known
        moved: dict[int, tuple] = {}
        for (rank, stream), cops in list(streams.items()):
            if stream != "compute":
                continue
            pos = {op.id: i for i, op in enumerate(cops)}
            first_wait: dict[int, int] = {}  # op id -> first compute index depending on it
            for i, op in enumerate(cops):
                for d in op.deps:
                    if d not in first_wait:
                        first_wait[d] = i
            claimed: dict[int, list] = {}  # compute index -> the ops moved after it
            for (r2, s2), sops in list(streams.items()):
                if r2 != rank or s2 == "compute":
                    continue
                # runs a_j..a_k of S: a_j depends on compute op c alone, each next one on
                # the one before alone, and the compute op after c on a_k
                units: dict[int, tuple[int, int]] = {}  # start j -> (end k, compute index)
                j = 0
                while j < len(sops):
                    a = sops[j]
                    if a.id in known and len(a.deps) == 1 and a.deps[0] in pos:
                        i = pos[a.deps[0]]
                        if i not in claimed and i + 1 < len(cops):
                            waits = cops[i + 1].deps
                            k = j
                            while (
                                sops[k].id not in waits
                                and k + 1 < len(sops)
                                and sops[k + 1].id in known
                                and sops[k + 1].deps in ((), (sops[k].id,))
                            ):
                                k += 1
                            if sops[k].id in waits:
                                units[j] = (k, i)
                                j = k + 1
                                continue
                    j += 1
                changed = True
                while changed:
                    changed = False
                    ends = {k: (j, i) for j, (k, i) in units.items()}
                    used: set[int] = set()
                    for j in sorted(units):
                        k, i = units[j]
                        if j == 0:
                            prev_ok = True
                        elif j - 1 in ends:
                            prev_ok = ends[j - 1][1] < i
                        else:
                            prev_ok = first_wait.get(sops[j - 1].id, len(cops)) <= i
                        nxt_ok = (
                            k + 1 == len(sops) or k + 1 in units or any(pos.get(d, -1) > i for d in sops[k + 1].deps)
                        )
                        if not (prev_ok and nxt_ok) or i in used:
                            del units[j]
                            changed = True
                            break
                        used.add(i)
                if units:
                    gone = set()
                    for j, (k, i) in units.items():
                        claimed[i] = sops[j : k + 1]
                        gone.update(op.id for op in sops[j : k + 1])
                    streams[(r2, s2)] = [op for op in sops if op.id not in gone]
            if not claimed:
                continue
            new = []
            for i, op in enumerate(cops):
                new.append(op)
                run = claimed.get(i)
                if run is not None:
                    new.extend(run)
                    for a in run:
                        moved[a.id] = (rank, stream)
            streams[(rank, stream)] = new
        return moved

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
        env = self.env
        end_time, done = self.end_time, self.done
        record = self.records.append
        external, known, chain = self._external, self._known, self.chain_ops
        dur_cache, slowdown, scales = self._dur_cache, self._overlap_slowdown, self.compute_scale
        bar = self._bar
        i, n = 0, len(ops)
        while i < n:
            op = ops[i]
            if op.deps:
                pending = [self._done_event(d) for d in op.deps if d not in end_time]
                if len(pending) == 1:
                    yield pending[0]
                elif pending:
                    yield env.all_of(pending)
            kind = op.kind
            if kind == "compute" or op.id in known:
                # A chain of ops whose durations are known when they start (compute, and
                # private communication: see _private_ops), each starting when the one
                # before ends: the next joins the chain when every dep of it has already
                # ended and nothing outside this process waits on the one before (so its
                # end, known now, need not be an event). The times are the same sums a
                # timeout per op would give; only the chain's last end is scheduled.
                t = env.now
                while True:
                    start = t
                    if op.mem:
                        self._mem_at(op, "start", start)
                    if op.kind == "compute":
                        kern = op.kernels  # self._duration(op), inlined
                        hit = dur_cache.get(id(kern))
                        if hit is None or hit[0] is not kern:
                            hit = self._kernel_stats(kern)
                        dur = hit[1]
                        if op.comm_overlap:
                            dur *= slowdown
                        if scales:
                            sc = scales.get(op.rank)
                            if sc:
                                dur = dur / sc
                        if dur > 0:
                            t = start + dur
                        if op.mem:
                            self._mem_at(op, "end", t)
                        if op.kernels:
                            record(OpRecord(op, start, t))
                    else:
                        t = self._known_end(op, start)
                        if op.mem:
                            self._mem_at(op, "end", t)
                        record(OpRecord(op, start, t))
                    i += 1
                    if i == n or not chain or op.id in external:
                        break
                    end_time[op.id] = t  # nobody outside this process waits on it
                    nxt = ops[i]
                    if (nxt.kind != "compute" and nxt.id not in known) or (
                        nxt.deps and not all(map(end_time.__contains__, nxt.deps))
                    ):
                        break
                    if bar is not None:
                        bar.update()
                    op = nxt
                if t != env.now:
                    yield env.timeout_at(t)
                end_time[op.id] = t
            else:
                start = env.now
                if op.mem:
                    self._mem(op, "start")
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
                end = env.now
                if op.mem:
                    self._mem(op, "end")
                end_time[op.id] = end
                record(OpRecord(op, start, end))
                i += 1
            waiter = done.pop(op.id, None)
            if waiter is not None:
                waiter.succeed()
            if bar is not None:
                bar.update()

    def _done_event(self, op_id: int) -> simpy.Event:
        """The event fired when op ``op_id`` ends (made only for ops someone waits on)."""
        ev = self.done.get(op_id)
        if ev is None:
            ev = self.done[op_id] = self.env.event()
        return ev

    def _mem(self, op: Op, at: str) -> None:
        self._mem_at(op, at, self.env.now)

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
                sum(k.flops for k in kernels if k.kind in MATMUL_KINDS),
            )
        return hit

    def _duration(self, op: Op) -> float:
        d = self._kernel_stats(op.kernels)[1]
        if op.comm_overlap:
            d *= self._overlap_slowdown
        scale = self.compute_scale.get(op.rank)
        return d / scale if scale else d

    # ---- communication -----------------------------------------------------------------
    def _collective(self, op: Op):
        n_members = self._sim_members.get(op.group)
        if n_members is None:
            n_members = self._sim_members[op.group] = sum(r in self.sim_ranks for r in op.group)
        if n_members == 1:  # nobody to wait for: run it in this stream's process
            yield from coll_mod.run_merged(self.net, self._network_phases(op))
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
        yield from coll_mod.run_merged(self.net, self._network_phases(op))
        done.succeed()

    def _plan(self, coll: str, group: tuple[int, ...], size: float, scaleout_fraction: float = 1.0):
        key = (coll, group, size, scaleout_fraction)
        p = self._plan_cache.get(key)
        if p is None:
            # A node-limited all-to-all's route is fixed by its routing (hierarchical-a2a):
            # the scenario's algorithm choice applies to the others.
            algorithm = self.algorithms.get(coll) if scaleout_fraction == 1.0 else None
            p = coll_mod.plan_collective(
                coll, group, size, self.topo, algorithm=algorithm, scaleout_fraction=scaleout_fraction
            )
            self._plan_cache[key] = p
        return p

    def _network_phases(self, op: Op) -> tuple:
        """The merged network phases (:func:`collectives.merged_phases`) of
        :meth:`_network_plans`, once per collective shape and rank."""
        key = (op.coll, op.group, op.size_bytes, op.axis, op.rank, op.scaleout_fraction)
        hit = self._net_phase_cache.get(key)
        if hit is None:
            hit = self._net_phase_cache[key] = coll_mod.merged_phases(self.net, self._network_plans(op))
        return hit

    def _network_plans(self, op: Op) -> list:
        """What ``op`` runs on the network: its own plan, or in representative mode
        its quotient plan (see :meth:`_quotient_phase`), or, where the twin plans do
        not line up with it, every twin's plan."""
        if op.coll == "all-to-all" and self.trace.representative and self.twin_quotient:
            pieces = self._hierarchical_a2a_pieces(op)
            if pieces is not None:
                return pieces
        groups = self._groups_on_network(op)
        rep = self._plan(op.coll, op.group, op.size_bytes, op.scaleout_fraction)
        if len(groups) == 1:
            return [rep]
        twins = [self._plan(op.coll, g, op.size_bytes, op.scaleout_fraction) for g in groups]
        q = self._quotient_plan(rep, twins) if self.twin_quotient else None
        return twins if q is None else [q]

    def _hierarchical_a2a_pieces(self, op: Op) -> Optional[list]:
        """An expert all-to-all planned as ``hierarchical-a2a`` (``scaleout_fraction``
        below 1 under node-limited routing) over the representative's EP group, as the
        quotient of its two hops' pieces, of which
        the full plan is exactly the union: the direct rail all-to-alls among the
        members at the same position in each domain (``f S`` per rank) and the direct
        NVLink all-to-alls inside each domain (``S``).

        * Rail: the representative's own rail sends and receives, every other rail
          transfer of the stage folded in as an image (:meth:`_rail_quotient`).
        * NVLink: only the representative's own domain (the others' touch none of its
          links), and in it only the representative's own sends, each loading the
          links it crosses as many times as its images under the rotations
          ``q -> q + t`` of the domain's members cross them (member ``q``'s send to
          ``q + s`` is the image of the representative's to ``p + s``; every member
          belongs to the representative's stage, so under the representative
          assumption each runs at its image's rate).

        Both pieces run in one network phase of the full plan's 2 steps, so the hops
        stay concurrent. None where the op's group is not the layout's EP group (a
        trace file's own grouping), lies in one domain, is planned otherwise (a
        scenario's ``algorithms``) or the pieces do not line up: the full plan runs."""
        L, D = self.layout, self.topo.domain_size
        if self.topo.kind != "switched" or op.group != L.group(op.rank, "ep"):
            return None
        if (
            len(L.ep_subgroup(op.rank, "inter", D)) <= 1
            or self._plan(op.coll, op.group, op.size_bytes, op.scaleout_fraction).algorithm != "hierarchical-a2a"
        ):
            return None
        transfers: list = []
        rail = L.ep_subgroup(op.rank, "inter", D)
        if len(rail) > 1:
            q = self._rail_quotient(
                op.rank,
                rail,
                L.ep_subgroups("inter", L.stage_of(op.rank), D),
                op.size_bytes * op.scaleout_fraction / len(rail),
            )
            if q is None:
                return None
            transfers.extend(q)
        local = L.ep_subgroup(op.rank, "intra", D)
        if len(local) > 1:
            q = self._rotation_quotient(op.rank, local, op.size_bytes / len(local))
            if q is None:
                return None
            transfers.extend(q)
        if not transfers:
            return None
        phase = coll_mod.Phase(tuple(transfers), steps=2)
        return [coll_mod.CollectivePlan(op.coll, "hierarchical-a2a", op.group, op.size_bytes, (phase,))]

    def _rail_quotient(self, rank: int, rail: tuple, groups: list, chunk: float) -> Optional[tuple]:
        """Quotient of the direct all-to-alls of ``chunk`` per pair over the rail groups
        ``groups`` (``rail``, the representative's, among them): the representative's
        sends and receives, every other transfer folded into the send it is the image
        of under the rotations of its group's members (``g[q] -> g[q + s]`` is the image
        of the representative's send to ``p + s``). A transfer loads a link in ``U``
        (the links the representative's transfers cross) once per such image crossing
        it; links outside ``U`` carry images of ``U``'s loads and are dropped. Unlike a
        quotient of the sends alone, every flow into the representative stays a flow
        of its own, so it meets whatever else arrives on the representative's links.
        None where the groups differ in size or an image's latency exceeds the
        representative transfers' (the full plan runs)."""
        m = len(rail)
        if rail not in groups or any(len(g) != m for g in groups):
            return None
        p = rail.index(rank)
        own = [(rail[p], rail[(p + s) % m]) for s in range(1, m)]  # class s-1
        own += [(rail[(p - s) % m], rail[p]) for s in range(1, m)]  # class m-2+s
        # Every transfer g[q] -> g[q + s] of every group, as arrays [group, q, s - 1].
        members = np.array(groups, dtype=np.int64)
        q, s = np.meshgrid(np.arange(m), np.arange(1, m), indexing="ij")
        src = np.broadcast_to(members[:, q], (len(groups), m, m - 1))
        dst = members[:, (q + s) % m]
        cls = np.broadcast_to(s - 1, src.shape).copy()
        cls[groups.index(rail), (p - s[0]) % m, s[0] - 1] = m - 2 + s[0]  # sends into the rep
        q = _image_quotient(
            self.net,
            tuple(Transfer(a, b, chunk) for a, b in own),
            cls.ravel(),
            src.ravel(),
            dst.ravel(),
            latency="at-most",
        )
        return None if q is None else tuple(q)

    def _rotation_quotient(self, rank: int, group: tuple, chunk: float) -> Optional[tuple]:
        """Quotient of the direct all-to-all of ``chunk`` per pair over ``group`` by the
        rotations of its members: ``rank``'s own sends, with the multiplicities of their
        images (None where the images' latencies differ)."""
        m = len(group)
        p = group.index(rank)

        def sends(q: int) -> tuple:
            return tuple(Transfer(group[q], group[(q + s) % m], chunk) for s in range(1, m))

        rep = sends(p)
        return self._quotient_phase(rep, [rep if q == p else sends(q) for q in range(m)])

    def _quotient_plan(self, rep, twins: list):
        """``rep`` with each transfer carrying the multiplicities of its twin images
        (a plan of the same phases), or None where the twins do not line up."""
        if not any(p is rep for p in twins):
            self.twin_stats["fallback"] += 1
            return None
        n = len(rep.phases)
        if any(p.algorithm != rep.algorithm or len(p.phases) != n for p in twins):
            self.twin_stats["fallback"] += 1
            return None
        phases = []
        for i, ph in enumerate(rep.phases):
            others = [p.phases[i] for p in twins]
            if any(
                q.steps != ph.steps or q.compute_bytes != ph.compute_bytes or q.in_network != ph.in_network
                for q in others
            ):
                self.twin_stats["fallback"] += 1
                return None
            transfers = self._quotient_phase(ph.transfers, [q.transfers for q in others])
            if transfers is None:
                return None
            phases.append(ph if transfers is ph.transfers else replace(ph, transfers=transfers))
        return replace(rep, phases=tuple(phases))

    def _quotient_phase(self, rep: tuple, twins: list) -> Optional[tuple]:
        """The symmetry quotient of one phase issued by every twin group at once.

        ``twins`` lists every twin's transfers of the phase (``rep`` among them), the
        j-th transfer of each being the image of ``rep[j]``. Under the representative
        assumption every image runs at its representative's rate, so the load of link
        ``l`` is ``sum_j m(j, l) * rate_j``, with ``m(j, l)`` the number of images of
        ``rep[j]`` (itself included) that cross ``l``. It is kept on the links the
        representative transfers cross (``U``); an image's links outside ``U`` are the
        images of links in ``U`` and carry the same load, so they are dropped. Each
        transfer of the result has incidence ``((l, m(j, l)) for l in U if m > 0)``
        (its route first), or none where that is its route once (then ``rep`` itself
        where every transfer is so).

        None (fall back to injecting every twin) where the twins do not line up:
        other transfer counts, sizes or weights, or another phase latency."""
        k = len(rep)
        if any(len(t) != k for t in twins):
            self.twin_stats["fallback"] += 1
            return None
        rows = [(t.src, t.dst, t.size_bytes, t.weight, t.incidence is None) for tt in twins for t in tt]
        src, dst, size, weight, plain = (
            (np.array(col).reshape(len(twins), k) for col in zip(*rows))
            if rows
            else (np.zeros((len(twins), 0), dtype=np.int64),) * 5
        )
        is_rep = np.array([tt is rep for tt in twins])
        others = ~is_rep[:, None]
        if (
            others
            & ((size != np.array([t.size_bytes for t in rep])) | (weight != np.array([t.weight for t in rep])) | ~plain)
        ).any():
            self.twin_stats["fallback"] += 1
            return None
        cls = np.broadcast_to(np.arange(k), src.shape)
        q = _image_quotient(
            self.net,
            rep,
            cls.ravel(),
            src.ravel(),
            dst.ravel(),
            latency="equal",
            image_of=np.repeat(np.arange(len(twins)), k),
        )
        if q is None:
            self.twin_stats["fallback"] += 1
            return None
        self.twin_stats["quotient"] += 1
        return rep if all(a is b for a, b in zip(q, rep)) else q

    def _send(self, op: Op):
        yield self.net.transfer(self._send_transfers(op))

    def _send_transfers(self, op: Op) -> tuple:
        """The network transfers of a send (one tuple per pair and size, so that the
        network reuses its routed form): the pair's, or its quotient over its twins."""
        key = (op.rank, op.peer, op.size_bytes, op.axis)
        hit = self._send_cache.get(key)
        if hit is None:
            pairs = self._twin_rows(op, pair=(op.rank, op.peer))
            own = (Transfer(op.rank, op.peer, op.size_bytes),)
            hit = None
            if len(pairs) > 1 and self.twin_quotient:
                mine = np.flatnonzero((pairs[:, 0] == op.rank) & (pairs[:, 1] == op.peer))
                if mine.size:
                    hit = (
                        self._quotient_phase(
                            own,
                            [
                                own if i == mine[0] else (Transfer(a, b, op.size_bytes),)
                                for i, (a, b) in enumerate(pairs.tolist())
                            ],
                        )
                        if len(pairs) <= _SMALL_TWINS
                        else self._pair_quotient(own, pairs)
                    )
                else:
                    self.twin_stats["fallback"] += 1
            if hit is None:
                hit = own if len(pairs) == 1 else tuple(Transfer(a, b, op.size_bytes) for a, b in pairs.tolist())
            self._send_cache[key] = hit
        return hit

    def _pair_quotient(self, own: tuple, pairs: np.ndarray) -> Optional[tuple]:
        """:meth:`_quotient_phase` of a send ``own`` over its twin ``pairs`` (rows
        ``(src, dst)``, ``own``'s among them), straight from the arrays."""
        q = _image_quotient(
            self.net,
            own,
            np.zeros(len(pairs), dtype=np.int64),
            pairs[:, 0],
            pairs[:, 1],
            latency="equal",
            image_of=np.arange(len(pairs)),
        )
        self.twin_stats["fallback" if q is None else "quotient"] += 1
        return q

    def _groups_on_network(self, op: Op, pair: Optional[tuple[int, int]] = None) -> list[tuple[int, ...]]:
        """The group itself plus, in representative mode, its twins (see module doc)."""
        rows = self._twin_rows(op, pair)
        return rows if isinstance(rows, list) else list(map(tuple, rows.tolist()))

    def _twin_rows(self, op: Op, pair: Optional[tuple[int, int]] = None):
        """:meth:`_groups_on_network` as an array of one row per group (a list of
        groups where they differ in size), cached per (axis, stage, group)."""
        group = pair if pair is not None else op.group
        if not self.trace.representative:
            return np.array([group], dtype=np.int64)
        topo = self.topo
        if topo.kind == "switched" and len({topo.domain_of(r) for r in group}) == 1:
            return np.array([group], dtype=np.int64)
        stage = self.layout.stage_of(op.rank)
        key = (op.axis, stage, group)
        twins = self._twin_cache.get(key)
        if twins is None:
            twins = self._twin_cache[key] = self._twins(op.axis, stage, group)
        return twins

    def _twins(self, axis: str, stage: int, group: tuple[int, ...]):
        """Every group of ``stage`` along ``axis`` (``group`` among them), rows of an
        array (a list of tuples for node-limited EP subgroups, whose sizes may differ)."""
        L = self.layout
        if axis in ("tp", "cp", "dp", "ep", "edp", "etp", "dp_cp"):
            table = L.group_table(axis)  # every group of these axes lies in one stage
            return table[(table[:, 0] // L.rank_of(pp=1)) % L.pp == stage] if L.pp > 1 else table
        if axis in ("ep_inter", "ep_intra"):
            return L.ep_subgroups(axis[3:], stage, self.topo.domain_size)
        # Groups whose members differ only in pipeline coordinate (sends, DualPipe mirrors):
        # translate to every (tp, cp, dp) position of the stage, preserving member order.
        pp_stride = L.rank_of(pp=1) if L.pp > 1 else 0
        shift = np.array([(L.stage_of(r) - stage) * pp_stride for r in group], dtype=np.int64)
        return np.array(L.stage_ranks(stage), dtype=np.int64)[:, None] + shift[None, :]


#: Twin sends quotiented through :meth:`Engine._quotient_phase` (Transfer objects) up to
#: this many pairs; more go straight from the pair arrays (:meth:`Engine._pair_quotient`).
_SMALL_TWINS = 64


def _image_quotient(
    net: FlowNetwork,
    rep: tuple,
    cls: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    latency: str,
    image_of: Optional[np.ndarray] = None,
) -> Optional[tuple]:
    """``rep``'s transfers, each with incidence counting the images of it that cross
    the links ``U`` its transfers cross (see :meth:`Engine._quotient_phase`).

    The images are the transfers ``src[i] -> dst[i]``, ``i``-th the image of
    ``rep[cls[i]]`` (of its size; ``rep``'s own among them). ``latency``: ``"equal"``
    -- every image set ``image_of`` (a twin's transfers) must have the phase latency
    of ``rep`` (the largest over its transfers); ``"at-most"`` -- no image may exceed
    it. None where that fails. A transfer whose count is its route once is returned
    as it is (the same object)."""
    k = len(rep)
    rep_src = np.array([t.src for t in rep], dtype=np.int64)
    rep_dst = np.array([t.dst for t in rep], dtype=np.int64)
    sends = np.array([t.size_bytes > 0 for t in rep], dtype=bool) & (rep_src != rep_dst)
    own = np.full((k, 1), -1, dtype=np.int64)  # each transfer's route, padded with -1
    routed, rep_lat = net.routes(rep_src[sends], rep_dst[sends])
    if routed.size:
        own = np.full((k, routed.shape[1]), -1, dtype=np.int64)
        own[sends] = routed
    used = np.unique(own[own >= 0])
    lat = float(rep_lat.max()) if rep_lat.size else 0.0
    sized = np.array([t.size_bytes > 0 for t in rep], dtype=bool)
    live = (src != dst) & sized[cls] if k else np.zeros(src.shape, dtype=bool)
    links, img_lat = net.routes(src[live], dst[live])
    if latency == "at-most":
        if (img_lat > lat).any():
            return None
    else:
        worst = np.zeros(int(image_of.max()) + 1 if image_of.size else 0)
        np.maximum.at(worst, image_of[live], img_lat)
        if (worst != lat).any():
            return None
    # (class, link of U) of every crossing, counted: class by class, links ascending
    width = max(used.size, 1)
    if used.size:
        at = np.minimum(np.searchsorted(used, links), used.size - 1)
        hit = (links >= 0) & (used[at] == links)
        keys, counts = np.unique(
            np.broadcast_to(cls[live][:, None], links.shape)[hit] * width + at[hit], return_counts=True
        )
    else:
        keys = counts = np.zeros(0, dtype=np.int64)
    of_class = keys // width
    bounds = np.searchsorted(of_class, np.arange(k + 1))
    # A transfer crossing exactly its own links, each once, stays as it is.
    plain = (
        (np.diff(bounds) == (own >= 0).sum(axis=1)) & (np.bincount(of_class[counts != 1], minlength=k) == 0)
    ).tolist()
    if all(plain):
        return tuple(rep)
    bounds, crossed, counts = bounds.tolist(), used[keys % width].tolist(), counts.tolist()
    out = []
    for j, t in enumerate(rep):
        if plain[j]:
            out.append(t)
            continue
        route = [lk for lk in own[j].tolist() if lk >= 0]
        of = dict(zip(crossed[bounds[j] : bounds[j + 1]], counts[bounds[j] : bounds[j + 1]]))
        inc = tuple((lk, float(of[lk])) for lk in route)
        inc += tuple((lk, float(x)) for lk, x in of.items() if lk not in route)
        out.append(replace(t, incidence=inc))
    return tuple(out)
