"""Lowering: what a collective or send op of the trace runs on the network.

One call per op (:meth:`Lowering.collective_phases`, :meth:`Lowering.send_transfers`)
plans the op's collective (:func:`~simulator.network.collectives.plan_collective`),
adds its twin groups' plans in representative mode, folds them into the
representative's by the symmetry quotient (:mod:`simulator.engine.quotient`) and
merges them into the network phases the engine runs
(:func:`~simulator.network.collectives.merged_phases`), cached per op shape and rank;
in representative mode those phases' transfers leave out the links that can never bind
(:func:`never_binding`).
See :mod:`simulator.engine.loop` for the representative assumption and the quotient.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from simulator.engine.quotient import SMALL_TWINS, bundle, image_quotient, quotient_phase, quotient_plan
from simulator.network import collectives as coll_mod
from simulator.network.binding import never_binding
from simulator.network.flows import FlowNetwork, Transfer
from simulator.network.orbits import TorusOrbits, layout_translations, orbit_phase
from topologies.topology import Topology
from workloads.layout import ParallelLayout
from workloads.trace.ops import Op, Trace


class Lowering:
    """Plans, twins, quotient and merge of the collectives and sends of one trace.

    ``algorithms``: op -> algorithm (the scenario's choice); ``twin_quotient=False``
    injects every twin group's transfers; ``a2a_quotient=False`` runs an expert
    all-to-all planned as ``hierarchical-a2a`` as its full (twin-quotiented) plan
    rather than as the quotient of its rail and NVLink pieces (tests compare)."""

    def __init__(
        self,
        trace: Trace,
        topo: Topology,
        layout: ParallelLayout,
        net: FlowNetwork,
        algorithms: dict[str, str] | None = None,
        twin_quotient: bool = True,
        a2a_quotient: bool = True,
        a2a_overlap_slowdown: float = 1.0,
        orbit_quotient: bool | None = None,
    ) -> None:
        self.trace, self.topo, self.layout, self.net = trace, topo, layout, net
        # an all-to-all marked ``comm_overlap`` (beside a batch-level overlapped pair's compute)
        # moves its bytes this many times slower (ComputeCalibration.overlap_a2a_slowdown)
        self.a2a_overlap_slowdown = a2a_overlap_slowdown
        self.algorithms = algorithms or {}
        self.twin_quotient = twin_quotient
        self.a2a_quotient = a2a_quotient
        self.orbit_quotient = type(self).orbit_quotient if orbit_quotient is None else orbit_quotient
        self._orbits: TorusOrbits | None | bool = False  # (_orbit_group) False: not decided yet
        self.twin_stats = {"quotient": 0, "fallback": 0, "partial": 0}  # quotiented / fallbacks / by class
        self._twin_cache: dict = {}
        self._plan_cache: dict = {}
        self._net_phase_cache: dict = {}  # (coll, group number, size, axis, rank) -> network phases
        self._group_ids: dict[int, tuple] = {}  # id(group) -> (group, its number): keeps it alive
        self._group_numbers: dict[tuple, int] = {}
        self._send_cache: dict = {}  # (rank, peer, size, axis) -> transfers tuple
        # Several simulated ranks per stage (symmetry.rank_classes): each rank's class, and
        # whether it is simulated; None with one simulated rank per stage.
        self._cls = self._sim = None
        self._lies: tuple[np.ndarray, np.ndarray] | None = None  # each device's domain and leaf
        self._shift_ok: dict[int, bool] = {}  # shift -> whether it keeps every rank's class
        self._unbinding: np.ndarray | None = None  # per link: never binds (_never_binding)
        if trace.representative and len(trace.ranks) > layout.pp:
            from simulator.engine.symmetry import rank_classes

            self._cls = rank_classes(layout, topo, max_classes=len(trace.ranks))
            self._sim = np.zeros(layout.world, dtype=bool)
            self._sim[list(trace.ranks)] = True

    #: Whether a representative run on a torus folds its phases by translations (_orbit_group).
    orbit_quotient: bool = True

    def quotient_phase(self, rep: tuple, twins: list) -> tuple | None:
        """:func:`~simulator.engine.quotient.quotient_phase` on this network, counted in
        :attr:`twin_stats`."""
        return quotient_phase(self.net, rep, twins, self.twin_stats)

    def collective_phases(self, op: Op) -> tuple:
        """The merged network phases (:func:`collectives.merged_phases`) of
        :meth:`_network_plans`, once per collective shape and rank."""
        key = self._phase_key(op)
        hit = self._net_phase_cache.get(key)
        if hit is None and self._orbit_group() is not None:
            hit = self._net_phase_cache.get(key)  # filled by _orbit_group
        if hit is None:
            hit = coll_mod.merged_phases(self.net, self._network_plans(self._planned(op)))
            if self.trace.representative:
                hit = self._binding_only(hit)
            self._net_phase_cache[key] = hit
        return hit

    def _phase_key(self, op: Op) -> tuple:
        # With one rank per class the phases are the group's, whichever member asks
        # (:meth:`_network_plans` reads the rank only for its stage): one entry per group.
        who = op.rank if self._cls is None else -1 - self.layout.stage_of(op.rank)
        return (op.coll, self._group_id(op.group), op.size_bytes, op.axis, who, op.scaleout_fraction, op.comm_overlap)

    def _planned(self, op: Op) -> Op:
        """``op`` as planned: an all-to-all marked ``comm_overlap`` (beside a batch-level
        overlapped pair's compute) as ``a2a_overlap_slowdown`` times its bytes, as the
        calibration's a2a_efficiency is; the op's own bytes (events, links table) stay."""
        if op.comm_overlap and op.coll == "all-to-all" and self.a2a_overlap_slowdown != 1.0:
            return replace(op, size_bytes=op.size_bytes * self.a2a_overlap_slowdown)
        return op

    def _orbit_group(self) -> TorusOrbits | None:
        """The torus translations folding every phase (:mod:`simulator.network.orbits`), decided
        once: None without ``orbit_quotient``/``twin_quotient``, with one rank per class, or
        where an op's phases do not fold (then none does: folded flows must not meet others)."""
        if self._orbits is False:
            ok = self.orbit_quotient and self.twin_quotient and self.trace.representative and self._cls is None
            self._orbits = layout_translations(self.topo, self.layout) if ok else None
            for op in self.trace.ops if self._orbits is not None else ():  # fill the caches
                if op.kind == "send":
                    key, cache, fold = (op.rank, op.peer, op.size_bytes, op.axis), self._send_cache, self._orbit_send
                elif op.kind == "collective":
                    key, cache, fold = self._phase_key(op), self._net_phase_cache, self._orbit_phases
                else:
                    continue
                if key not in cache and cache.setdefault(key, fold(op)) is None:  # not folded: none is
                    self._orbits = None
                    self._net_phase_cache.clear()
                    self._send_cache.clear()
                    break
        return self._orbits  # pyright: ignore[reportReturnType]  (decided above)

    def _orbit_phases(self, op: Op) -> tuple | None:
        """The merged phases of ``op``'s and its twin groups' plans, each folded into its
        orbits (None where one is not mapped onto itself)."""
        assert isinstance(self._orbits, TorusOrbits)
        op = self._planned(op)
        plans = [self._plan(op.coll, g, op.size_bytes, op.scaleout_fraction) for g in self._groups_on_network(op)]
        out = [
            (orbit_phase(self.net, self._orbits, t), steps, c)
            for t, steps, c in coll_mod.merged_phases(self.net, plans)
        ]
        return None if any(q is None for q, _, _ in out) else tuple(out)

    def _orbit_send(self, op: Op) -> tuple | None:
        """A send and its twin pairs' (:meth:`_twin_rows`), folded into their orbits."""
        assert isinstance(self._orbits, TorusOrbits)
        pairs = self._twin_rows(op, pair=(op.rank, op.peer))
        return orbit_phase(self.net, self._orbits, [Transfer(int(a), int(b), op.size_bytes) for a, b in pairs])

    def _group_id(self, group: tuple) -> int:
        """A number for ``group``, the same for equal groups, found by the tuple's identity
        where it was seen before (a layout hands every member of a group its one tuple), so
        that a cache key does not hash a data-parallel group of thousands of ranks per op."""
        hit = self._group_ids.get(id(group))
        if hit is None or hit[0] is not group:
            hit = self._group_ids[id(group)] = (group, self._group_numbers.setdefault(group, len(self._group_numbers)))
        return hit[1]

    def _binding_only(self, phases: tuple) -> tuple:
        """Merged ``phases`` with every transfer loading only the links that can bind
        (its route, or incidence, less the :func:`never_binding` links; its latency still its
        route's). Twin groups crossing the NICs all load a leaf group's uplinks, joining their
        flows into one max-min component; without them they meet only at a device or NIC, at the
        same rates (EP64 on 2,304 GB200, a rank per class: to 1e-15, 10.4 -> 2.6 s; DeepSeek-V3
        TP4 PP16 EP16 on 2,304 H100 in 72-GPU domains, a rank per stage, every twin injected:
        to 2e-14, 16.2 -> 4.5 s; with the twin quotient, itself 1e-3 off that, to 1e-4)."""
        drop = self._never_binding()
        if not drop.any():
            return phases
        out = []
        for transfers, steps, compute in phases:
            new = list(transfers)
            plain = [i for i, t in enumerate(transfers) if t.incidence is None and t.src != t.dst and t.size_bytes > 0]
            if plain:
                links, _ = self.net.routes(
                    np.array([transfers[i].src for i in plain]), np.array([transfers[i].dst for i in plain])
                )
                routed = links >= 0
                hit = (drop[np.where(routed, links, 0)] & routed).any(axis=1)  # routes through a dropped link
                for i, row in zip(np.asarray(plain)[hit].tolist(), links[hit].tolist()):
                    t = transfers[i]
                    inc = tuple((lk, 1.0) for lk in row if lk >= 0 and not drop[lk])
                    new[i] = Transfer(t.src, t.dst, t.size_bytes, t.weight, inc)
            for i, t in enumerate(transfers):
                if t.incidence is not None and any(drop[lk] for lk, _ in t.incidence):
                    new[i] = replace(t, incidence=tuple((lk, m) for lk, m in t.incidence if not drop[lk]))
            out.append((tuple(new), steps, compute))
        return tuple(out)

    def _never_binding(self) -> np.ndarray:
        """:func:`never_binding` of this network, computed once."""
        if self._unbinding is None:
            self._unbinding = never_binding(self.topo, self.net.capacity)
        return self._unbinding

    def _network_plans(self, op: Op) -> list:
        """What ``op`` runs on the network: its own plan, or in representative mode
        its quotient plan (see :func:`~simulator.engine.quotient.quotient_phase`), or, where the twin plans do
        not line up with it, every twin's plan. With one rank per class, the twins that are
        not images of ``op``'s group (:meth:`_images`) fold orbit by orbit into the first
        of each orbit (every twin an image of that one), each orbit one plan."""
        if (
            op.coll == "all-to-all"
            and self.trace.representative
            and self.twin_quotient
            and self.a2a_quotient
            and self._cls is None
        ):
            pieces = self._hierarchical_a2a_pieces(op)
            if pieces is None:
                pieces = self._domain_a2a_quotient(op)
            if pieces is not None:
                return pieces
        groups = self._groups_on_network(op)
        rep = self._plan(op.coll, op.group, op.size_bytes, op.scaleout_fraction)
        if len(groups) == 1:
            return [rep]
        twins = [self._plan(op.coll, g, op.size_bytes, op.scaleout_fraction) for g in groups]
        if not self.twin_quotient:
            return twins
        if self._cls is None:
            q = quotient_plan(self.net, rep, twins, self.twin_stats)
            return twins if q is None else [q]
        # One rank per class: only the group's images fold into it; the twins that are not
        # its images fold likewise into the first of theirs, orbit by orbit.
        out: list = []
        while groups:
            head = op.group if not out else groups[0]
            mask = self._images(head, groups)
            images = [p for p, m in zip(twins, mask) if m]
            first = rep if not out else images[0]
            q = quotient_plan(self.net, first, images, self.twin_stats) if len(images) > 1 else None
            out.extend(images if q is None else [q])
            groups = [g for g, m in zip(groups, mask) if not m]
            twins = [p for p, m in zip(twins, mask) if not m]
        return out

    def _images(self, group: tuple, rows: list) -> list[bool]:
        """Which of ``rows`` (twin groups, ``group`` among them) are images of ``group`` that
        the quotient may fold into it when one rank per class is simulated: members of the
        same classes in the same positions, lying alike over the scale-up domains and the
        leaf switches (the same pairs share a domain, the same pairs a leaf), and shifted
        from ``group`` by a number of ranks that maps every rank of the stage to one of its
        own class (the whole stage's traffic then looks alike from either group). A group that
        lies otherwise -- the mirror of a straddling group, its 2 + 6 against 6 + 2 --
        loads other links than its image would, so it runs beside the quotient
        (``--exact``'s loads), folded with its own images into a quotient of its own
        (:meth:`_network_plans`: EP64 on 2,304 GB200 in NVL72 racks, the mirror's copies
        in the 4 leaf groups as one plan, an all-to-all 8,064 transfers instead of 20,160)."""
        assert self._cls is not None
        if self._lies is None:
            from simulator.engine.symmetry import leaves

            self._lies = (self.topo.domains_of(np.arange(self.layout.world)), leaves(self.topo)[: self.layout.world])
        dom, leaf = self._lies
        cls = self._cls
        g = np.asarray(group, dtype=np.int64)

        def shape(m: np.ndarray) -> tuple:
            return (
                cls[m].tobytes(),
                (dom[m][:, None] == dom[m][None, :]).tobytes(),
                (leaf[m][:, None] == leaf[m][None, :]).tobytes(),
            )

        mine = shape(g)
        out = []
        for r in rows:
            m = np.asarray(r, dtype=np.int64)
            t = int(m[0] - g[0]) if len(m) == len(g) else 0
            out.append(len(m) == len(g) and bool((m == g + t).all()) and self._keeps_classes(t) and shape(m) == mine)
        return out

    def _keeps_classes(self, t: int) -> bool:
        """Whether shifting every rank ``t`` places on within its stage (stages are
        contiguous blocks of ranks, wrapping around) maps it to a rank of its own class."""
        assert self._cls is not None
        hit = self._shift_ok.get(t)
        if hit is None:
            by_stage = self._cls.reshape(self.layout.pp, -1)
            hit = self._shift_ok[t] = bool((np.roll(by_stage, -t, axis=1) == by_stage).all())
        return hit

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

    def _hierarchical_a2a_pieces(self, op: Op) -> list | None:
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

    def _domain_a2a_quotient(self, op: Op) -> list | None:
        """An expert all-to-all planned ``direct`` inside one scale-up domain of a switched
        network, as the quotient of its ``n (n - 1)`` transfers by the rotations of its
        members (every member belongs to the representative's stage: under the
        representative assumption each runs at its image's rate): the representative's
        ``n - 1`` receives, which load its own downlink, so that they meet whatever else
        arrives on its links, and its ``n - 1`` sends, each loading the links its images
        cross (:meth:`_rail_quotient` over the one group). Each set runs as one flow of
        weight ``n - 1`` (:func:`~simulator.engine.quotient.bundle`): the sends' images
        differ only in which other member's uplink they leave out (the one whose send
        lands in the representative, a receive of its own), the receives only in the
        uplink they leave, so where the traffic is symmetric each set shares one rate.
        2 flows of ``3 n - 1`` link crossings instead of the plan's ``n (n - 1)`` flows of
        ``2 n (n - 1)`` (DGX Cloud DeepSeek-V3 on 128 GB200: EP32, 2 flows of 95 crossings
        instead of 992 of 1,984). None where the group is not the layout's EP group, spans
        domains or is planned otherwise: the full plan runs."""
        L, topo = self.layout, self.topo
        if topo.kind != "switched" or op.group != L.group(op.rank, "ep"):
            return None
        if len({topo.domain_of(r) for r in op.group}) != 1:
            return None
        plan = self._plan(op.coll, op.group, op.size_bytes, op.scaleout_fraction)
        if plan.algorithm != "direct" or len(plan.phases) != 1:
            return None
        q = self._rail_quotient(op.rank, op.group, [op.group], op.size_bytes / len(op.group))
        if q is None:
            return None
        phase = coll_mod.Phase(q, steps=plan.phases[0].steps)
        return [coll_mod.CollectivePlan(op.coll, "direct", op.group, op.size_bytes, (phase,))]

    def _bundled(self, transfers: tuple) -> tuple:
        """``transfers`` (a quotient's sends, or its receives) as one flow
        (:func:`~simulator.engine.quotient.bundle`; a transfer without incidence loads its
        route once); as they are where their sizes or path latencies differ (the phase keeps
        its latency) or there is nothing to bundle."""
        transfers = tuple(transfers)
        if len(transfers) < 2 or any(t.size_bytes != transfers[0].size_bytes for t in transfers):
            return transfers
        routes, lat = self.net.routes(np.array([t.src for t in transfers]), np.array([t.dst for t in transfers]))
        if (lat != lat[0]).any():
            return transfers
        with_incidence = tuple(
            t if t.incidence is not None else replace(t, incidence=tuple((lk, 1.0) for lk in row[row >= 0].tolist()))
            for t, row in zip(transfers, routes)
        )
        return (bundle(with_incidence),)

    def _rail_quotient(self, rank: int, rail: tuple, groups: list, chunk: float) -> tuple | None:
        """Quotient of the direct all-to-alls of ``chunk`` per pair over the rail groups
        ``groups`` (``rail``, the representative's, among them): the representative's
        sends and receives, every other transfer folded into the send it is the image
        of under the rotations of its group's members (``g[q] -> g[q + s]`` is the image
        of the representative's send to ``p + s``). A transfer loads a link in ``U``
        (the links the representative's transfers cross) once per such image crossing
        it; links outside ``U`` carry images of ``U``'s loads and are dropped. Unlike a
        quotient of the sends alone, the flows into the representative load its own
        links, so they meet whatever else arrives there. The sends run as one flow and
        the receives as another (:meth:`_bundled`). None where the groups differ in size
        or an image's latency exceeds the representative transfers' (the full plan runs)."""
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
        q = image_quotient(
            self.net,
            tuple(Transfer(a, b, chunk) for a, b in own),
            cls.ravel(),
            src.ravel(),
            dst.ravel(),
            latency="at-most",
        )
        if q is None:
            return None
        return self._bundled(q[: m - 1]) + self._bundled(q[m - 1 :])  # sends, receives

    def _rotation_quotient(self, rank: int, group: tuple, chunk: float) -> tuple | None:
        """Quotient of the direct all-to-all of ``chunk`` per pair over ``group`` by the
        rotations of its members: ``rank``'s own sends, with the multiplicities of their
        images, as one flow (:meth:`_bundled`; None where the images' latencies differ)."""
        m = len(group)
        p = group.index(rank)

        def sends(q: int) -> tuple:
            return tuple(Transfer(group[q], group[(q + s) % m], chunk) for s in range(1, m))

        rep = sends(p)
        q = self.quotient_phase(rep, [rep if q == p else sends(q) for q in range(m)])
        return None if q is None else self._bundled(q)

    def send_transfers(self, op: Op) -> tuple:
        """The network transfers of a send (one tuple per pair and size, so that the
        network reuses its routed form): the pair's, or its quotient over its twins."""
        key = (op.rank, op.peer, op.size_bytes, op.axis)
        hit = self._send_cache.get(key)
        if hit is None and self._orbit_group() is not None:
            hit = self._send_cache.get(key)  # filled by _orbit_group
        if hit is None:
            pairs = np.asarray(self._twin_rows(op, pair=(op.rank, op.peer)), dtype=np.int64)
            own = (Transfer(op.rank, op.peer, op.size_bytes),)
            hit = None
            others: tuple = ()  # twin pairs that are not images (:meth:`_images`): sent as they are
            if self._cls is not None and len(pairs) > 1:
                mask = np.array(self._images((op.rank, op.peer), pairs.tolist()))
                others = tuple(Transfer(a, b, op.size_bytes) for a, b in pairs[~mask].tolist())
                pairs = pairs[mask]
            if len(pairs) > 1 and self.twin_quotient:
                mine = np.flatnonzero((pairs[:, 0] == op.rank) & (pairs[:, 1] == op.peer))
                if mine.size:
                    hit = (
                        self.quotient_phase(
                            own,
                            [
                                own if i == mine[0] else (Transfer(a, b, op.size_bytes),)
                                for i, (a, b) in enumerate(pairs.tolist())
                            ],
                        )
                        if len(pairs) <= SMALL_TWINS
                        else self._pair_quotient(own, pairs)
                    )
                else:
                    self.twin_stats["fallback"] += 1
                if hit is None and mine.size:
                    hit = self._partial_pair_quotient(own, pairs, mine[0])
            if hit is None:
                hit = own if len(pairs) == 1 else tuple(Transfer(a, b, op.size_bytes) for a, b in pairs.tolist())
            if others:  # the pairs that are not images, sent beside the quotient every time
                hit += others
            self._send_cache[key] = hit
        return hit

    def _partial_pair_quotient(self, own: tuple, pairs: np.ndarray, mine: int) -> tuple | None:
        """A send whose twin pairs do not all have its path latency (some cross a leaf
        boundary of a fat-tree that the representative's pair does not: narayanan21-529.6b's
        stages of 9 nodes against leaves of 32), quotiented class by class: the pairs of
        each latency folded into one of them (the representative's own for its class) by
        :meth:`_pair_quotient`, a class that does not fold injected whole. The phase keeps
        the full plan's latency (its largest) and every pair's links; None where every
        pair has one latency (the whole quotient failed for another reason) or the
        representative's class is itself alone."""
        _, lat = self.net.routes(pairs[:, 0], pairs[:, 1])
        values = np.unique(lat)
        if values.size < 2 or (lat == lat[mine]).sum() < 2:
            return None
        size = own[0].size_bytes
        out: list = []
        for v in [lat[mine], *[x for x in values.tolist() if x != lat[mine]]]:
            cls = pairs[lat == v]
            if v == lat[mine]:
                rep = own
            else:
                rep = (Transfer(int(cls[0, 0]), int(cls[0, 1]), size),)
            q = self._pair_quotient(rep, cls) if len(cls) > 1 else rep
            out.extend(q if q is not None else (Transfer(a, b, size) for a, b in cls.tolist()))
        self.twin_stats["partial"] += 1
        return tuple(out)

    def _pair_quotient(self, own: tuple, pairs: np.ndarray) -> tuple | None:
        """:func:`~simulator.engine.quotient.quotient_phase` of a send ``own`` over its twin ``pairs`` (rows
        ``(src, dst)``, ``own``'s among them), straight from the arrays."""
        q = image_quotient(
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

    def _groups_on_network(self, op: Op, pair: tuple[int, int] | None = None) -> list[tuple[int, ...]]:
        """The group itself plus, in representative mode, its twins (see module doc)."""
        rows = self._twin_rows(op, pair)
        return rows if isinstance(rows, list) else list(map(tuple, rows.tolist()))

    def _twin_rows(self, op: Op, pair: tuple[int, int] | None = None):
        """:meth:`_groups_on_network` as an array of one row per group (a list of
        groups where they differ in size), cached per (axis, stage, group). A group inside
        one scale-up domain runs alone with one simulated rank per stage; with one per class
        (:func:`~simulator.engine.symmetry.rank_classes`) its twins run too, since the
        simulated ranks' groups along other axes (a stage's gradient ring) load their
        devices' links (TP2 EP8 PP2 on 12-GPU domains: without the twin TP pairs the ring
        ran 4 % faster and the exposed share was 0.2964 against --exact's 0.2965)."""
        group = pair if pair is not None else op.group
        if not self.trace.representative:
            return np.array([group], dtype=np.int64)
        topo = self.topo
        if topo.kind == "switched" and self._cls is None and len({topo.domain_of(r) for r in group}) == 1:
            return np.array([group], dtype=np.int64)
        stage = self.layout.stage_of(op.rank)
        key = (op.axis, stage, group)
        twins = self._twin_cache.get(key)
        if twins is None:
            twins = self._twins(op.axis, stage, group)
            if self._cls is not None:
                twins = self._class_twins(twins, group)
            self._twin_cache[key] = twins
        return twins

    def _class_twins(self, rows, group: tuple) -> np.ndarray | list:
        """With one simulated rank per class (:func:`~simulator.engine.symmetry.rank_classes`),
        the twins ``group`` stands for among ``rows`` (every group of its stage along its axis):
        the groups whose members are of the same classes (as a multiset) and none of them
        simulated, when ``group`` is the first simulated group of those classes; else ``group``
        alone (a simulated group runs its own collective, and groups of other classes are
        stood for by theirs)."""
        cls, sim = self._cls, self._sim
        assert cls is not None and sim is not None  # called only with one rank per class
        if not isinstance(rows, list):  # groups of one size: as arrays
            rows = np.asarray(rows, dtype=np.int64)
            same = (np.sort(cls[rows], axis=1) == np.sort(cls[np.asarray(group)])).all(axis=1)
            simulated = sim[rows].any(axis=1)
            issuer = int(np.flatnonzero(same & simulated)[0])
            if tuple(rows[issuer].tolist()) != tuple(group):
                return rows[issuer : issuer + 1].copy()
            return rows[same & (~simulated | (np.arange(len(rows)) == issuer))]
        rows = [tuple(g) for g in rows]
        mine = sorted(cls[list(group)].tolist())
        same = [g for g in rows if sorted(cls[list(g)].tolist()) == mine]
        issuer = next(g for g in same if sim[list(g)].any())
        out = [g for g in same if g == issuer or not sim[list(g)].any()] if issuer == tuple(group) else [issuer]
        return np.array(out, dtype=np.int64) if len({len(g) for g in out}) == 1 else out

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
