"""Graph builders: functions that return annotated, undirected ``networkx.Graph`` objects.

Conventions shared by every builder
-----------------------------------
* Each edge is one full-duplex link. Edge attributes: ``bw_bytes_per_s`` (per
  direction), ``latency_s`` (one hop) and ``kind``, one of ``'ici'`` (TPU
  inter-chip link), ``'nvlink'`` (device to its NVSwitch), ``'nic'`` (device to its
  scale-out leaf), ``'fabric'`` (leaf to spine), ``'dcn'`` (data-centre network).
* Device ``i`` is node ``"d{i}"`` with attributes ``kind='device'``, ``index=i``,
  ``domain`` (scale-up domain id) and ``pod``; torus devices also carry ``coords``.
* Switches have ``kind='switch'`` and descriptive ids: ``"p0.nvsw3"`` (NVSwitch of
  domain 3), ``"p0.leaf2.r5"`` (rail 5 of leaf group 2), ``"p0.leaf2"`` (whole
  group when not rail-optimised), ``"p0.spine"``, ``"p1.dcn"``, ``"dcn"``.
* ``G.graph`` holds ``kind`` (``'torus'`` / ``'switched'``), ``domain_size``,
  ``nvls``, ``sharp``, for tori ``shape`` and ``wrap``, and after :func:`join_pods`
  ``pods`` and ``devices_per_pod``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import networkx as nx

from .errors import TopologyError
from .networks import PodsSpec, SwitchedNetwork, check_tile, default_wrap


def device_node(i: int) -> str:
    """Node id of device ``i``."""
    return f"d{i}"


def tiled_coords(shape: Sequence[int], tile: Sequence[int] | None = None) -> list[tuple[int, ...]]:
    """Torus coordinates of devices ``0 .. prod(shape) - 1``.

    Without ``tile``, axis 0 fastest: ``i = x0 + s0*(x1 + s1*(x2 + ...))``. With ``tile``
    (block lengths dividing the axes), consecutive devices fill one block, axis 0 fastest
    inside it, and the blocks follow one another axis 0 fastest: with ``tile = (4, 4, 4)``
    devices 0-63 are one 4 x 4 x 4 cube, 64-127 the next along axis 0. Rank order then maps
    groups of ``prod(tile)`` consecutive ranks, and their halves, quarters, ..., onto
    compact blocks (a JAX device mesh lays its axes out on the slice's 4 x 4 x 4 cubes)."""
    shape = tuple(int(n) for n in shape)
    tile = shape if tile is None else tuple(int(t) for t in tile)
    blocks = tuple(n // t for n, t in zip(shape, tile))
    size = math.prod(tile)
    out = []
    for i in range(math.prod(shape)):
        local, block = i % size, i // size
        coords = []
        for t, b in zip(tile, blocks):
            local, c = divmod(local, t)
            block, k = divmod(block, b)
            coords.append(k * t + c)
        out.append(tuple(coords))
    return out


def torus(
    shape: Sequence[int],
    link_bw: float,
    latency: float = 1e-6,
    wrap: Sequence[bool] | None = None,
    tile: Sequence[int] | None = None,
) -> nx.Graph:
    """An n-D torus of devices, one scale-up domain.

    Devices are numbered with axis 0 fastest: ``i = x0 + s0*(x1 + s1*(x2 + ...))``, or in
    blocks of ``tile`` (:func:`tiled_coords`).
    Axis ``a`` wraps when ``wrap[a]`` (default :func:`~topologies.networks.default_wrap`).
    A length-2 axis has a single link between its two devices, a length-1 axis none.

    Raises
    ------
    TopologyError
        For an empty shape, a non-positive axis or a ``wrap`` of the wrong length.
    """
    shape = tuple(int(n) for n in shape)
    if not shape or any(n < 1 for n in shape):
        raise TopologyError(
            f"cluster.network.shape: axis lengths must be >= 1, got {list(shape)}", field="cluster.network.shape"
        )
    wrap = default_wrap(shape) if wrap is None else tuple(bool(w) for w in wrap)
    if len(wrap) != len(shape):
        raise TopologyError(
            f"cluster.network.wraparound: needs {len(shape)} flags, got {list(wrap)}",
            field="cluster.network.wraparound",
        )
    if not link_bw > 0:
        raise TopologyError(
            f"cluster.network.link_bw_bytes_per_s: must be > 0, got {link_bw!r}",
            field="cluster.network.link_bw_bytes_per_s",
        )
    n = math.prod(shape)
    if tile is not None:
        tile = check_tile(shape, tile)
    coords_of = tiled_coords(shape, tile)
    index_of = {c: i for i, c in enumerate(coords_of)}
    G = nx.Graph(kind="torus", shape=shape, wrap=wrap, domain_size=n, nvls=False, sharp=False)
    G.add_nodes_from(
        (device_node(i), {"kind": "device", "index": i, "domain": 0, "pod": 0, "coords": coords_of[i]})
        for i in range(n)
    )
    attrs = {"bw_bytes_per_s": float(link_bw), "latency_s": float(latency), "kind": "ici"}
    edges = []
    for i, coords in enumerate(coords_of):
        for a, (length, c) in enumerate(zip(shape, coords)):
            if c + 1 < length:
                j = index_of[coords[:a] + (c + 1,) + coords[a + 1 :]]
            elif wrap[a] and length > 2:  # the closing link of a ring; length 2 already has it
                j = index_of[coords[:a] + (0,) + coords[a + 1 :]]
            else:
                continue
            edges.append((device_node(i), device_node(j), attrs))
    G.add_edges_from(edges)
    return G


def switched(devices: int, net: SwitchedNetwork) -> nx.Graph:
    """NVLink domains behind NVSwitches, joined by a (rail-optimised) fat-tree.

    Every device has one ``nvlink`` edge (``domain_bw``) to its domain switch
    ``p0.nvsw{k}``: the domain's NVSwitches are modelled as one non-blocking
    crossbar. With more than one domain each device also has one ``nic`` edge
    (``nic_bw``) to a leaf: rail ``j`` of its leaf group (``p0.leaf{g}.r{j}``, ``j``
    = local index in the domain) when ``net.rails``, else the group's single leaf
    ``p0.leaf{g}``. Each leaf has one ``fabric`` edge to ``p0.spine`` with capacity
    (sum of its NIC downlinks) / ``oversubscription``.

    The spine node stands for the whole ECMP spine layer as one aggregated
    non-blocking core: exact for a perfectly balanced fluid ECMP, optimistic when
    real hashing collides. It is built even when all domains share one leaf group,
    since cross-rail traffic must climb to it.

    Raises
    ------
    TopologyError
        If ``devices`` exceeds one domain but is not a multiple of ``domain_size``.
    """
    if not (isinstance(devices, int) and devices >= 1):
        raise TopologyError(f"cluster.devices: must be an integer >= 1, got {devices!r}", field="cluster.devices")
    size = net.domain_size
    if devices > size and devices % size:
        raise TopologyError(
            f"cluster.devices: {devices} devices is neither at most one domain nor a multiple of domain_size {size}",
            field="cluster.devices",
        )
    n_domains = max(1, devices // size)
    G = nx.Graph(kind="switched", domain_size=size, nvls=bool(net.nvls), sharp=bool(net.sharp))
    nvlink = {
        "bw_bytes_per_s": float(net.domain_bw_bytes_per_s),
        "latency_s": float(net.domain_latency_s),
        "kind": "nvlink",
    }
    nic = {"bw_bytes_per_s": float(net.nic_bw_bytes_per_s), "latency_s": float(net.nic_latency_s), "kind": "nic"}
    names = [device_node(i) for i in range(devices)]
    G.add_nodes_from((f"p0.nvsw{k}" for k in range(n_domains)), kind="switch")
    G.add_nodes_from((names[i], {"kind": "device", "index": i, "domain": i // size, "pod": 0}) for i in range(devices))
    edges = [(names[i], f"p0.nvsw{i // size}", nvlink) for i in range(devices)]
    if n_domains > 1:
        downlinks: dict[str, int] = {}
        for i in range(devices):
            group = (i // size) // net.domains_per_leaf
            leaf = f"p0.leaf{group}.r{i % size}" if net.rails else f"p0.leaf{group}"
            downlinks[leaf] = downlinks.get(leaf, 0) + 1
            edges.append((names[i], leaf, nic))
        G.add_nodes_from(downlinks, kind="switch")
        G.add_node("p0.spine", kind="switch")
        for leaf, count in downlinks.items():
            edges.append(
                (
                    leaf,
                    "p0.spine",
                    {
                        "bw_bytes_per_s": count * float(net.nic_bw_bytes_per_s) / net.oversubscription,
                        "latency_s": float(net.switch_latency_s),
                        "kind": "fabric",
                    },
                )
            )
    G.add_edges_from(edges)
    return G


def join_pods(pod_graphs: Sequence[nx.Graph], pods: PodsSpec) -> nx.Graph:
    """Join identical pod graphs (each built alone, devices ``d0..``) with a data-centre network.

    Pod ``p``'s device ``d{i}`` becomes ``d{p*n + i}`` (``n`` devices per pod) with
    ``pod=p`` and its domain shifted to stay globally unique; a switch id ``p0.X``
    becomes ``p{p}.X``. Every device gets a ``dcn`` edge (``dcn_bw`` per device) to
    its pod's switch ``p{p}.dcn``, and each pod switch a ``dcn`` edge of capacity
    ``n * dcn_bw`` to the core node ``dcn``. ``pods.dcn_latency_s`` is split evenly
    over the four links of a cross-pod path.

    Raises
    ------
    TopologyError
        If the pod count differs from ``pods.count`` or the pods differ in size or kind.
    """
    if len(pod_graphs) != pods.count:
        raise TopologyError(
            f"cluster.pods.count: {pods.count} pods declared, {len(pod_graphs)} pod graphs given",
            field="cluster.pods.count",
        )
    sizes = {sum(1 for _, k in g.nodes(data="kind") if k == "device") for g in pod_graphs}
    kinds = {g.graph.get("kind") for g in pod_graphs}
    if len(sizes) != 1 or len(kinds) != 1:
        raise TopologyError(
            "cluster.pods: all pods must have the same kind and device count, got "
            f"sizes {sorted(sizes)} and kinds {sorted(map(str, kinds))}",
            field="cluster.pods",
        )
    n = sizes.pop()
    per_link_latency = pods.dcn_latency_s / 4
    G = nx.Graph(**pod_graphs[0].graph)
    G.graph.update(pods=pods.count, devices_per_pod=n)
    G.add_node("dcn", kind="switch")
    for p, pg in enumerate(pod_graphs):
        n_domains = 1 + max(d.get("domain", 0) for _, d in pg.nodes(data=True) if d.get("kind") == "device")

        def rename(node, p=p, pg=pg):
            if pg.nodes[node].get("kind") == "device":
                return device_node(p * n + pg.nodes[node]["index"])
            name = str(node)
            return f"p{p}.{name[3:]}" if name.startswith("p0.") else f"p{p}.{name}"

        for node, data in pg.nodes(data=True):
            data = dict(data)
            if data.get("kind") == "device":
                data.update(index=p * n + data["index"], pod=p, domain=p * n_domains + data.get("domain", 0))
            G.add_node(rename(node), **data)
        G.add_edges_from((rename(u), rename(v), dict(d)) for u, v, d in pg.edges(data=True))
        pod_switch = f"p{p}.dcn"
        G.add_node(pod_switch, kind="switch")
        G.add_edges_from(
            (
                device_node(p * n + i),
                pod_switch,
                {"bw_bytes_per_s": float(pods.dcn_bw_bytes_per_s), "latency_s": per_link_latency, "kind": "dcn"},
            )
            for i in range(n)
        )
        G.add_edge(
            pod_switch, "dcn", bw_bytes_per_s=n * float(pods.dcn_bw_bytes_per_s), latency_s=per_link_latency, kind="dcn"
        )
    return G
