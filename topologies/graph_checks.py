"""Checks of a network graph before it becomes a :class:`~topologies.topology.Topology`:
every edge's bandwidth and latency in their physical ranges (``docs/scenario.md``,
"Physical ranges"), devices numbered 0..n-1, flags that are booleans, and one connected
graph; and which devices a failed link cuts off (:func:`main_component`). Every problem is
a :class:`~topologies.errors.TopologyError` naming the element."""

from __future__ import annotations

import math
import operator

import networkx as nx
import numpy as np

from .chips import MAX_BW_BYTES_PER_S, MIN_BW_BYTES_PER_S
from .errors import TopologyError
from .networks import MAX_COUNT, MAX_LATENCY_S

_MISSING = object()


def edges_look_valid(edges: list) -> bool:
    """Whether every ``(u, v, bw, latency, kind)`` row passes :func:`check_edges`,
    tested on whole columns."""
    if not edges:
        return True
    us, vs, bw, lat, kinds = zip(*edges)
    if any(map(operator.eq, us, vs)) or kinds.count(_MISSING):
        return False
    number = (int, float)
    if not all(issubclass(t, number) for t in set(map(type, bw)) | set(map(type, lat))):
        return False
    try:
        bw, lat = np.array(bw, dtype=np.float64), np.array(lat, dtype=np.float64)
    except OverflowError:  # an integer beyond any float: check_edges names the edge
        return False
    return bool(
        ((bw >= MIN_BW_BYTES_PER_S) & (bw <= MAX_BW_BYTES_PER_S)).all() and ((lat >= 0) & (lat <= MAX_LATENCY_S)).all()
    )


def check_edges(G) -> None:
    """Raise :class:`TopologyError` for the first edge that is a self-loop, lacks an
    attribute or has a bad bandwidth or latency."""
    for u, v, data in G.edges(data=True):
        if u == v:
            raise TopologyError(f"topology: self-loop on {u!r}", field="topology")
        for attr in ("bw_bytes_per_s", "latency_s", "kind"):
            if attr not in data:
                raise TopologyError(f"topology: edge ({u!r}, {v!r}) lacks the {attr!r} attribute", field="topology")
        bw, lat = data["bw_bytes_per_s"], data["latency_s"]
        number = (int, float, np.integer, np.floating)
        if not (isinstance(bw, number) and not isinstance(bw, bool) and MIN_BW_BYTES_PER_S <= bw <= MAX_BW_BYTES_PER_S):
            raise TopologyError(
                f"topology: edge ({u!r}, {v!r}) has bw_bytes_per_s={bw!r}; must be a finite number > 0, "
                f"from {MIN_BW_BYTES_PER_S:g} to {MAX_BW_BYTES_PER_S:g} bytes/s",
                field="topology",
            )
        if not (isinstance(lat, number) and not isinstance(lat, bool) and 0 <= lat <= MAX_LATENCY_S):
            raise TopologyError(
                f"topology: edge ({u!r}, {v!r}) has latency_s={lat!r}; must be a finite number >= 0, "
                f"at most {MAX_LATENCY_S:g} s",
                field="topology",
            )


def graph_flag(attrs, key: str) -> bool:
    """The graph attribute ``key`` as a flag: ``true`` or ``false`` only (absent: false); a
    string such as ``"false"`` is refused rather than read as true."""
    value = attrs.get(key, False)
    if not isinstance(value, (bool, np.bool_)):
        raise TopologyError(f"topology: graph attribute {key!r} must be true or false, got {value!r}", field="topology")
    return bool(value)


def validate_graph(G) -> tuple[list, list]:
    """Check ``G`` and return its device node ids ordered by index and its edges as
    ``(u, v, bw_bytes_per_s, latency_s, kind)`` rows."""
    if not isinstance(G, nx.Graph) or G.is_directed() or G.is_multigraph():
        raise TopologyError(
            f"topology: expected an undirected networkx.Graph, got {type(G).__name__}", field="topology"
        )
    devices = {}
    for node, data in G.nodes(data=True):
        if "kind" not in data:
            raise TopologyError(
                f"topology: node {node!r} lacks the 'kind' attribute ('device' or 'switch')", field="topology"
            )
        if data["kind"] == "device":
            index = data.get("index")
            if not isinstance(index, (int, np.integer)) or isinstance(index, bool) or index < 0:
                raise TopologyError(
                    f"topology: device {node!r} needs an integer 'index' >= 0, got {index!r}", field="topology"
                )
            if index in devices:
                raise TopologyError(
                    f"topology: devices {devices[index]!r} and {node!r} share index {index}", field="topology"
                )
            devices[int(index)] = node
    if not devices:
        raise TopologyError("topology: the graph has no node with kind='device'", field="topology")
    missing = [i for i in range(len(devices)) if i not in devices]
    if missing:
        raise TopologyError(
            f"topology: device indices must be 0..{len(devices) - 1}; index {missing[0]} is missing", field="topology"
        )
    edges = [
        (u, v, d.get("bw_bytes_per_s", _MISSING), d.get("latency_s", _MISSING), d.get("kind", _MISSING))
        for u, v, d in G.edges(data=True)
    ]
    if not edges_look_valid(edges):
        check_edges(G)  # raises, naming the first bad edge
    edges = [(u, v, bw, lat, str(kind)) for u, v, bw, lat, kind in edges]
    ordered = [devices[i] for i in range(len(devices))]
    check_structure(G, ordered)
    if not nx.is_connected(G):
        reached = nx.node_connected_component(G, ordered[0])
        lost = next((d for d in ordered if d not in reached), None)
        if lost is None:
            lost = next(n for n in G if n not in reached)
            raise TopologyError(f"topology: node {lost!r} is not connected to the devices", field="topology")
        raise TopologyError(f"topology: device {lost!r} is unreachable from device {ordered[0]!r}", field="topology")
    return ordered, edges


def main_component(G, devices) -> set:
    """The connected component of ``G`` holding the most devices (the lowest device on a
    tie): the devices outside it are the ones cut off, whichever device is numbered first."""
    best: set = set()
    best_n = 0
    seen: set = set()
    for d in devices:
        if d in seen:
            continue
        comp = nx.node_connected_component(G, d)
        seen |= comp
        n = sum(1 for x in devices if x in comp)
        if n > best_n:
            best, best_n = comp, n
        if 2 * best_n >= len(devices):
            break
    return best


def _count(value, what: str, low: int = 0) -> None:
    if not (
        isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and low <= value <= MAX_COUNT
    ):
        raise TopologyError(
            f"topology: {what} must be an integer from {low} to {MAX_COUNT:,}, got {value!r}", field="topology"
        )


def check_structure(G, devices: list) -> None:
    """The attributes the routing reads: each device's ``domain`` and ``pod`` (integers >= 0)
    and, on a torus, its ``coords``; the graph's ``domain_size`` and a torus's ``shape`` (axis
    lengths) and ``wrap`` (one flag per axis)."""
    for d in devices:
        data = G.nodes[d]
        for key in ("domain", "pod"):
            _count(data.get(key, 0), f"device {d!r} attribute {key!r}")
    if G.graph.get("domain_size"):
        _count(G.graph["domain_size"], "graph attribute 'domain_size'", 1)
    if G.graph.get("kind") != "torus":
        return
    shape, wrap = G.graph.get("shape"), G.graph.get("wrap")
    for key, value in (("shape", shape), ("wrap", wrap)):
        if value is not None and not isinstance(value, (list, tuple)):
            raise TopologyError(f"topology: graph attribute {key!r} must be a list, got {value!r}", field="topology")
    for n in shape or ():
        _count(n, "graph attribute 'shape'", 1)
    if shape is not None and (wrap is not None and len(wrap) != len(shape) or math.prod(shape) > MAX_COUNT):
        raise TopologyError(
            f"topology: a torus needs one 'wrap' flag per axis of 'shape' {list(shape)}", field="topology"
        )
    for d in devices:
        coords = G.nodes[d].get("coords", ())
        if not isinstance(coords, (list, tuple)) or shape is not None and len(coords) != len(shape):
            raise TopologyError(
                f"topology: device {d!r} needs 'coords', one per axis of 'shape', got {coords!r}", field="topology"
            )
        for c, n in zip(coords, shape or coords):
            _count(c, f"device {d!r} coords", 0)
            if shape is not None and c >= n:
                raise TopologyError(
                    f"topology: device {d!r} coords {list(coords)} outside shape {list(shape)}", field="topology"
                )
