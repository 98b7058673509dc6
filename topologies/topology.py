"""The :class:`Topology`: a validated network graph with stable link ids and routes.

Links are directed: undirected edge ``k`` of the sorted edge list gives link
``2k`` (lower endpoint to higher) and ``2k + 1`` (back). Nodes sort devices
first by index, then other nodes by their id as a string, so link ids depend
only on the graph's content, never on insertion order.

Routing
-------
* Tori: dimension-order routing, axis 0 first, along the shorter way round a
  wrapped axis (ties go the + way).
* Switched networks: inside a domain device -> NVSwitch -> device; across
  domains device -> leaf -> device when both sit on the same leaf (same rail of
  the same leaf group), otherwise device -> leaf -> spine -> leaf -> device. No
  PXN-style forwarding over NVLink to another rail.
* Pods: device -> pod DCN switch -> core -> pod DCN switch -> device.
* Anything else, and any pair whose structured route crosses a link removed by
  :meth:`Topology.without_link`: the lowest-latency path (Dijkstra on integer
  picoseconds), ties broken by fewer hops, then by node order; deterministic.
"""

from __future__ import annotations

import heapq
import math

import networkx as nx
import numpy as np

from .chips import MAX_BW_BYTES_PER_S, MIN_BW_BYTES_PER_S
from .errors import TopologyError
from .graph_checks import graph_flag, main_component, validate_graph

_ROUTE_CACHE_MAX = 1 << 20  # routes kept before the cache is cleared
_TREE_CACHE_MAX = 64  # shortest-path trees kept for the generic router


def _node_key(node, data) -> tuple:
    if data.get("kind") == "device":
        return (0, data["index"], "")
    return (1, 0, str(node))


class Topology:
    """A validated network graph with directed link ids, capacities and routes.

    Parameters
    ----------
    graph
        An annotated graph as made by :mod:`topologies.builders` or loaded by
        :mod:`topologies.io`. It is frozen (``networkx.freeze``): perturbations
        return new topologies instead of editing it.
    name
        A label.

    Raises
    ------
    TopologyError
        If the graph is disconnected, lacks an attribute, has a non-positive
        bandwidth or a device index gap; the message names the element.
    """

    def __init__(self, graph: nx.Graph, name: str = "", *, _base: Topology | None = None):
        devices, edge_rows = validate_graph(graph)
        self.devices: tuple = tuple(devices)
        self.graph = nx.freeze(graph)
        self.name, self.path = name, None  # path: the file it was read from (topologies.io.load_topology)
        kind = graph.graph.get("kind", "custom")
        self.kind: str = kind if kind in ("torus", "switched") else "custom"
        self.n_devices = len(self.devices)

        nodes = sorted(graph.nodes(data=True), key=lambda nd: _node_key(*nd))
        self._nodes = [n for n, _ in nodes]
        self._node_index = {n: k for k, n in enumerate(self._nodes)}
        idx = self._node_index
        # Undirected edge k of the sorted edge list -> links 2k (lower to higher node) and 2k + 1.
        rows = [(idx[u], idx[v], bw, lat, kind) for u, v, bw, lat, kind in edge_rows]
        u_, v_, bw, lat, kind = (list(col) for col in zip(*rows)) if rows else ([], [], [], [], [])
        lo, hi = np.minimum(u_, v_).astype(np.int64), np.maximum(u_, v_).astype(np.int64)
        order = np.lexsort((hi, lo))
        lo, hi = lo[order], hi[order]
        self.n_links = 2 * len(rows)
        self._ends = np.empty((self.n_links, 2), dtype=np.int64)
        self._ends[0::2, 0], self._ends[0::2, 1] = lo, hi
        self._ends[1::2, 0], self._ends[1::2, 1] = hi, lo
        a, b = lo.tolist(), hi.tolist()
        self._link_of: dict = dict(zip(zip(a, b), range(0, self.n_links, 2)))
        self._link_of.update(zip(zip(b, a), range(1, self.n_links, 2)))
        self.link_capacity = np.repeat(np.asarray(bw, dtype=np.float64)[order], 2)
        self.link_latency = np.repeat(np.asarray(lat, dtype=np.float64)[order], 2)
        self.link_kind: tuple[str, ...] = tuple(kind[i] for i in order.tolist() for _ in (0, 1))
        self.link_capacity.setflags(write=False)
        self.link_latency.setflags(write=False)

        data = [graph.nodes[d] for d in self.devices]
        self._domain = [int(d.get("domain", 0)) for d in data]
        self._pod = [int(d.get("pod", 0)) for d in data]
        self.domain_size: int = int(graph.graph.get("domain_size") or max(np.bincount(self._domain)))
        self.nvls: bool = graph_flag(graph.graph, "nvls")
        self.sharp: bool = graph_flag(graph.graph, "sharp")
        self.n_pods: int = max(self._pod) + 1
        if self.kind == "torus":
            missing = [k for k in ("shape", "wrap") if k not in graph.graph]
            missing += ["coords"] if any("coords" not in d for d in data) else []
            if missing:
                raise TopologyError(
                    f"topology: a torus graph needs the {missing[0]!r} attribute (graph: shape, wrap; devices: coords)",
                    field="topology",
                )
            self.torus_shape: tuple | None = tuple(int(n) for n in graph.graph["shape"])
            self.torus_wrap: tuple | None = tuple(graph_flag({"wrap": w}, "wrap") for w in graph.graph["wrap"])
            self._coords = [tuple(int(c) for c in d["coords"]) for d in data]
            # coords -> index inside a pod; the pods share the first pod's numbering
            per_pod = math.prod(self.torus_shape)
            self._local_of: dict | None = {c: k for k, c in enumerate(self._coords[:per_pod])}
        else:
            self.torus_shape = self.torus_wrap = None
            self._coords = self._local_of = None

        self._route_cache: dict = {}
        self._sw_tables = None
        self._domain_arr = self._pod_arr = None
        self._trees: dict = {}
        self._adjacency = None
        # Structured routing: a perturbed topology routes like its unperturbed base and maps
        # the base's links onto its own; a pair crossing a removed link goes generic.
        self._base = _base if _base is not None else self
        self._base_map = None
        if _base is None:
            self._build_structure()
        else:
            base_nodes = _base._nodes
            mapped = np.array(
                [
                    self._link_of.get((idx.get(base_nodes[a], -1), idx.get(base_nodes[b], -1)), -1)
                    for a, b in _base._ends.tolist()
                ],
                dtype=np.int64,
            )
            if len(mapped) != self.n_links or (mapped != np.arange(len(mapped))).any():
                self._base_map = mapped

    # ---- links -------------------------------------------------------------------------
    def link_id(self, u, v) -> int:
        """Directed link id from node ``u`` to node ``v``."""
        try:
            return self._link_of[(self._node_index[u], self._node_index[v])]
        except KeyError:
            raise TopologyError(f"topology: no link from {u!r} to {v!r}", field="topology") from None

    @property
    def link_ends(self) -> np.ndarray:
        """``(n_links, 2)`` node numbers of every directed link's ends (from, to), read-only.
        Nodes are numbered devices first (device ``d`` is node ``d``), then switches."""
        view = self._ends.view()
        view.setflags(write=False)
        return view

    def link_endpoints(self, link: int) -> tuple:
        """``(u, v)`` node ids of directed link ``link``."""
        a, b = self._ends[link]
        return self._nodes[a], self._nodes[b]

    # ---- devices -----------------------------------------------------------------------
    def _check_device(self, dev: int) -> int:
        if not (isinstance(dev, (int, np.integer)) and 0 <= dev < self.n_devices):
            raise TopologyError(
                f"topology: device index must be in 0..{self.n_devices - 1}, got {dev!r}", field="topology"
            )
        return int(dev)

    def domain_of(self, dev: int) -> int:
        return self._domain[self._check_device(dev)]

    def domains_of(self, devices, by_pod: bool = False) -> np.ndarray:
        """:meth:`domain_of` (or :meth:`pod_of`) of every device in ``devices`` at once."""
        if self._domain_arr is None:
            self._domain_arr = np.array(self._domain, dtype=np.int64)
            self._pod_arr = np.array(self._pod, dtype=np.int64)
        devices = np.asarray(devices, dtype=np.int64)
        if devices.size and not (devices.min() >= 0 and devices.max() < self.n_devices):
            self._check_device(int(next(d for d in devices.ravel() if not 0 <= d < self.n_devices)))
        return (self._pod_arr if by_pod else self._domain_arr)[devices]

    def pod_of(self, dev: int) -> int:
        return self._pod[self._check_device(dev)]

    def torus_coords(self, dev: int) -> tuple:
        """Coordinates of device ``dev`` inside its pod's torus."""
        if self._coords is None:
            raise TopologyError(f"topology: {self.kind} topology has no torus coordinates", field="topology")
        return self._coords[self._check_device(dev)]

    def device_at(self, coords, pod: int = 0) -> int:
        """Index of the device at torus ``coords`` in ``pod``."""
        if self.torus_shape is None:
            raise TopologyError(f"topology: {self.kind} topology has no torus coordinates", field="topology")
        coords = tuple(int(c) for c in coords)
        if len(coords) != len(self.torus_shape) or not all(0 <= c < n for c, n in zip(coords, self.torus_shape)):
            raise TopologyError(
                f"topology: coordinates {coords} are outside shape {self.torus_shape}", field="topology"
            )
        return pod * math.prod(self.torus_shape) + self._local_of[coords]

    # ---- routing -----------------------------------------------------------------------
    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Directed link ids from device ``src`` to device ``dst`` (``()`` if equal)."""
        key = (src, dst)
        links = self._route_cache.get(key)
        if links is None:
            self._check_device(src)
            self._check_device(dst)
            if src == dst:
                links = ()
            else:
                links = self._mapped_structured(src, dst)
                if links is None:
                    links = self._generic_route(src, dst)
            if len(self._route_cache) >= _ROUTE_CACHE_MAX:
                self._route_cache.clear()
            self._route_cache[key] = links
        return links

    def routes(self, src, dst) -> np.ndarray:
        """``route(src[i], dst[i])`` for every ``i`` at once: an ``(n, hops)`` int64
        array of directed link ids, each row padded with -1 after its route (``hops``
        is the longest route, at least 1). Vectorised on an unperturbed switched
        network within one pod; other pairs are routed one by one."""
        src = np.asarray(src, dtype=np.int64).ravel()
        dst = np.asarray(dst, dtype=np.int64).ravel()
        n = src.shape[0]
        if n and not (min(src.min(), dst.min()) >= 0 and max(src.max(), dst.max()) < self.n_devices):
            bad = next(int(d) for d in np.r_[src, dst] if not 0 <= d < self.n_devices)
            self._check_device(bad)
        out = np.full((n, 4), -1, dtype=np.int64)
        todo = np.ones(n, dtype=bool)
        sw = self._switched_tables()
        if sw is not None and n:
            out, todo = self._switched_routes(sw, src, dst)
        same = src == dst
        out[same] = -1
        todo &= ~same
        rest = np.flatnonzero(todo).tolist()
        if rest:
            found = [self.route(s, t) for s, t in zip(src[rest].tolist(), dst[rest].tolist())]
            width = max(out.shape[1], max(map(len, found)))
            if width > out.shape[1]:
                out = np.hstack([out, np.full((n, width - out.shape[1]), -1, dtype=np.int64)])
            for i, links in zip(rest, found):
                out[i, : len(links)] = links
        return out

    def _switched_tables(self):
        """Per-device numpy link tables of the structured switched router (None where
        the topology is not an unperturbed switched network): NVLink up/down and
        switch, NIC up/down and leaf, the leaf's fabric up/down and spine (-1 absent),
        pod."""
        if self._base is not self or self._struct is None or self._struct[0] != "switched":
            return None
        return self._sw_tables

    @staticmethod
    def _switched_routes(tables, s: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_structured_route` of a switched network for arrays of pairs in one
        pod: ``(routes padded with -1, pairs it could not route)``."""
        nv_up, nv_down, nv_sw, nic_up, nic_down, leaf, fab_up, fab_down, spine, pod = tables
        out = np.full((s.shape[0], 4), -1, dtype=np.int64)
        same_sw = (nv_sw[s] >= 0) & (nv_sw[s] == nv_sw[t])
        has_leaf = ~same_sw & (leaf[s] >= 0) & (leaf[t] >= 0)
        same_leaf = has_leaf & (leaf[s] == leaf[t])
        spined = has_leaf & ~same_leaf & (spine[s] >= 0) & (spine[s] == spine[t])
        out[same_sw, 0], out[same_sw, 1] = nv_up[s[same_sw]], nv_down[t[same_sw]]
        out[same_leaf, 0], out[same_leaf, 1] = nic_up[s[same_leaf]], nic_down[t[same_leaf]]
        a, b = s[spined], t[spined]
        out[spined] = np.stack([nic_up[a], fab_up[a], fab_down[b], nic_down[b]], axis=1)
        width = np.where(spined, 4, 2)
        complete = (out >= 0).sum(axis=1) == width
        done = (same_sw | same_leaf | spined) & complete & (pod[s] == pod[t])
        out[~done] = -1
        return out, ~done

    def path_latency_s(self, src: int, dst: int) -> float:
        """Sum of the link latencies along ``route(src, dst)``."""
        return float(sum(self.link_latency[link] for link in self.route(src, dst)))

    def _mapped_structured(self, src: int, dst: int):
        links = self._base._structured_route(src, dst)
        if links is None or self._base_map is None:
            return links
        mapped = tuple(int(self._base_map[link]) for link in links)
        return None if min(mapped) < 0 else mapped

    def _only_neighbour(self, kind: str, switches_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Per node: its neighbour over its only ``kind`` edge (between two non-device
        nodes if ``switches_only``) and the link to it; both -1 where it has none or
        several."""
        n_nodes = len(self._nodes)
        sel = np.flatnonzero(np.array(self.link_kind[0::2]) == kind) if self.n_links else np.zeros(0, np.int64)
        lo, hi = self._ends[2 * sel, 0], self._ends[2 * sel, 1]
        if switches_only:
            keep = lo >= self.n_devices  # devices sort first, so lo is the device if any
            sel, lo, hi = sel[keep], lo[keep], hi[keep]
        count = np.bincount(lo, minlength=n_nodes) + np.bincount(hi, minlength=n_nodes)
        other, link = np.full(n_nodes, -1, dtype=np.int64), np.full(n_nodes, -1, dtype=np.int64)
        other[lo], link[lo] = hi, 2 * sel
        other[hi], link[hi] = lo, 2 * sel + 1
        other[count != 1] = -1
        link[count != 1] = -1
        return other, link

    def _build_structure(self) -> None:
        """Per-device link tables for structure-aware routing (each -1 where absent)."""
        idx, link = self._node_index, self._link_of
        self._struct = None
        n = self.n_devices

        def back(up: np.ndarray) -> np.ndarray:
            return np.where(up >= 0, up ^ 1, -1)  # links 2k and 2k + 1 are one edge's

        # pods: device <-> pod switch <-> core
        self._dcn = None
        if self.n_pods > 1:
            sw, s_up = (x[:n] for x in self._only_neighbour("dcn"))
            core, c_up = self._only_neighbour("dcn", switches_only=True)
            at = np.where(sw >= 0, sw, 0)
            sw_up = np.where(sw >= 0, c_up[at], -1)
            sw_core = np.where(sw >= 0, core[at], -1)
            self._dcn = [
                ((u, d), (cu, cd, c))
                for u, d, cu, cd, c in zip(
                    s_up.tolist(), back(s_up).tolist(), sw_up.tolist(), back(sw_up).tolist(), sw_core.tolist()
                )
            ]
        if self.kind == "torus":
            shape, wrap = self.torus_shape, self.torus_wrap
            per_pod = math.prod(shape)
            plus = [[(-1, -1)] * n for _ in shape]
            minus = [[(-1, -1)] * n for _ in shape]
            local_of = self._local_of
            for i, coords in enumerate(self._coords):
                base = self._pod[i] * per_pod
                if len(coords) != len(shape) or i - base >= per_pod:
                    return
                for a, (c, length) in enumerate(zip(coords, shape)):
                    for table, step in ((plus, 1), (minus, -1)):
                        c2 = c + step
                        if not 0 <= c2 < length:
                            if not wrap[a]:
                                continue
                            c2 %= length
                        k = local_of.get(coords[:a] + (c2,) + coords[a + 1 :])
                        if k is None:
                            return
                        j = base + k
                        lk = link.get((idx[self.devices[i]], idx[self.devices[j]]), -1)
                        table[a][i] = (lk, j) if lk >= 0 else (-1, -1)
            self._struct = ("torus", plus, minus)
        elif self.kind == "switched":
            nv_sw, nv_up = (x[:n] for x in self._only_neighbour("nvlink"))
            leaf, nic_up = (x[:n] for x in self._only_neighbour("nic"))
            spine, fab_up = self._only_neighbour("fabric")
            at = np.where(leaf >= 0, leaf, 0)
            spine, fab_up = np.where(leaf >= 0, spine[at], -1), np.where(leaf >= 0, fab_up[at], -1)
            self._sw_tables = (
                nv_up,
                back(nv_up),
                nv_sw,
                nic_up,
                back(nic_up),
                leaf,
                fab_up,
                back(fab_up),
                spine,
                np.array(self._pod, dtype=np.int64),
            )
            self._struct = ("switched",) + tuple(t.tolist() for t in self._sw_tables[:9])

    def _structured_route(self, s: int, t: int):
        """Structure-aware route in this (unperturbed) topology, or None if not applicable."""
        if self._pod[s] != self._pod[t]:
            if self._dcn is None:
                return None
            (s_up, _), (sw_up, _, core_s) = self._dcn[s]
            (_, t_down), (_, sw_down, core_t) = self._dcn[t]
            route = (s_up, sw_up, sw_down, t_down)
            return route if min(route) >= 0 and core_s == core_t else None
        st = self._struct
        if st is None:
            return None
        if st[0] == "torus":
            _, plus, minus = st
            cs, ct = self._coords[s], self._coords[t]
            route, cur = [], s
            for a, length in enumerate(self.torus_shape):
                delta = ct[a] - cs[a]
                if delta == 0:
                    continue
                if self.torus_wrap[a] and length > 2:
                    fwd = delta % length
                    table, steps = (plus[a], fwd) if fwd <= length - fwd else (minus[a], length - fwd)
                else:
                    table, steps = (plus[a], delta) if delta > 0 else (minus[a], -delta)
                for _ in range(steps):
                    lk, cur = table[cur]
                    if lk < 0:
                        return None
                    route.append(lk)
            return tuple(route)
        _, nv_up, nv_down, nv_sw, nic_up, nic_down, leaf, fab_up, fab_down, spine = st
        if nv_sw[s] >= 0 and nv_sw[s] == nv_sw[t]:
            route = (nv_up[s], nv_down[t])
        elif leaf[s] < 0 or leaf[t] < 0:
            return None
        elif leaf[s] == leaf[t]:
            route = (nic_up[s], nic_down[t])
        elif spine[s] < 0 or spine[s] != spine[t]:
            return None
        else:
            route = (nic_up[s], fab_up[s], fab_down[t], nic_down[t])
        return route if min(route) >= 0 else None

    def _generic_route(self, s: int, t: int) -> tuple[int, ...]:
        src, dst = self._node_index[self.devices[s]], self._node_index[self.devices[t]]
        pred_link = self._trees.get(src)
        if pred_link is None:
            pred_link = self._shortest_path_tree(src)
            if len(self._trees) >= _TREE_CACHE_MAX:
                self._trees.pop(next(iter(self._trees)))
            self._trees[src] = pred_link
        route, node = [], dst
        while node != src:
            lk = pred_link[node]
            route.append(lk)
            node = int(self._ends[lk, 0])
        return tuple(reversed(route))

    def _shortest_path_tree(self, src: int) -> list:
        """Predecessor link per node of the lowest-latency tree from node ``src``.

        Distances are integer picoseconds so equal-latency paths tie exactly; ties
        go to fewer hops, then to the predecessor settled first in (distance, hops,
        node index) order.
        """
        if self._adjacency is None:
            adj = [[] for _ in self._nodes]
            ps = np.rint(self.link_latency * 1e12).astype(np.int64).tolist()
            for lk, (a, b) in enumerate(self._ends.tolist()):
                adj[a].append((b, ps[lk], lk))
            self._adjacency = [sorted(row) for row in adj]
        adj = self._adjacency
        best = {src: (0, 0)}
        pred = [-1] * len(self._nodes)
        done = [False] * len(self._nodes)
        heap = [(0, 0, src)]
        while heap:
            dist, hops, u = heapq.heappop(heap)
            if done[u]:
                continue
            done[u] = True
            for v, w, lk in adj[u]:
                cand = (dist + w, hops + 1)
                if not done[v] and (v not in best or cand < best[v]):
                    best[v] = cand
                    pred[v] = lk
                    heapq.heappush(heap, (cand[0], cand[1], v))
        return pred

    # ---- perturbations -----------------------------------------------------------------
    def _edge(self, u, v) -> tuple:
        u = self.devices[u] if isinstance(u, (int, np.integer)) else u
        v = self.devices[v] if isinstance(v, (int, np.integer)) else v
        if not self.graph.has_edge(u, v):
            raise TopologyError(
                f"perturbations.link: no link between {u!r} and {v!r} in topology {self.name!r}",
                field="perturbations.link",
            )
        return u, v

    def with_link_scaled(self, u, v, bw_scale: float) -> Topology:
        """A copy in which the link ``u``-``v`` (both directions) has ``bw_scale`` x bandwidth."""
        u, v = self._edge(u, v)
        if not (isinstance(bw_scale, (int, float)) and math.isfinite(bw_scale) and bw_scale > 0):
            raise TopologyError(
                f"perturbations.bw_scale: must be a finite number > 0 (use "
                f"failed: true to remove a link), got {bw_scale!r}",
                field="perturbations.bw_scale",
            )
        G = self.graph.copy()
        scaled = G.edges[u, v]["bw_bytes_per_s"] * bw_scale
        if not MIN_BW_BYTES_PER_S <= scaled <= MAX_BW_BYTES_PER_S:
            raise TopologyError(
                f"perturbations.bw_scale: {bw_scale!r} takes link ({u!r}, {v!r}) to {scaled:g} bytes/s, outside "
                f"{MIN_BW_BYTES_PER_S:g} to {MAX_BW_BYTES_PER_S:g} (use failed: true to remove a link)",
                field="perturbations.bw_scale",
            )
        G.edges[u, v]["bw_bytes_per_s"] = scaled
        return Topology(G, self.name, _base=self._base)

    def without_link(self, u, v) -> Topology:
        """A copy with the link ``u``-``v`` failed; routes that used it go around it.

        Switches left with no path to the devices are dropped. Link ids are
        renumbered (they follow the sorted edge list of the new graph).

        Raises
        ------
        TopologyError
            Naming the link and a device it would cut off.
        """
        u, v = self._edge(u, v)
        G = self.graph.copy()
        G.remove_edge(u, v)
        reached = main_component(G, self.devices)
        lost = next((d for d in self.devices if d not in reached), None)
        if lost is not None:
            raise TopologyError(
                f"perturbations.link: failing link ({u!r}, {v!r}) disconnects device {lost!r}",
                field="perturbations.link",
            )
        G.remove_nodes_from([n for n in list(G) if n not in reached])
        return Topology(G, self.name, _base=self._base)

    def __repr__(self) -> str:
        return f"Topology(name={self.name!r}, kind={self.kind!r}, devices={self.n_devices}, links={self.n_links})"
