"""Save and load topologies as JSON or GraphML (chosen by the file extension).

JSON layout (``.json``)::

    {"format": "stepsim-topology", "version": 1, "name": "...",
     "graph": {"kind": "torus" | "switched" | "custom", "domain_size": 8, "nvls": false,
               "sharp": false, "shape": [4, 4], "wrap": [true, true],
               "pods": 2, "devices_per_pod": 16},           # optional keys as they apply
     "nodes": [{"id": "d0", "kind": "device", "index": 0, "domain": 0, "pod": 0,
                "coords": [0, 0]},                         # coords on tori only
               {"id": "p0.spine", "kind": "switch"}, ...],
     "edges": [{"source": "d0", "target": "p0.nvsw0", "bw_bytes_per_s": 4.5e11,
                "latency_s": 1.665e-06, "kind": "nvlink"}, ...]}

Node attributes: ``kind`` (``'device'`` or ``'switch'``, required), devices also
``index`` (required, 0..n-1), ``domain`` and ``pod`` (default 0) and, on tori,
``coords``. Edge attributes (all required): ``bw_bytes_per_s`` per direction,
``latency_s`` per hop, ``kind`` (``ici``, ``nvlink``, ``nic``, ``fabric``, ``dcn``).

GraphML (``.graphml``) carries the same attributes; tuples (``coords``, ``shape``,
``wrap``) are stored as JSON strings, since GraphML has no list type.

Loading validates through :class:`~topologies.topology.Topology`; every problem
is a :class:`~topologies.errors.TopologyError` naming the file and the element. Files
over 64 MiB, binary files and GraphML with a DOCTYPE or entity declarations are refused.
The user documentation of the format is ``docs/formats.md``.
"""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx

from .errors import TopologyError
from .topology import Topology

FORMAT = "stepsim-topology"
VERSION = 1
_TUPLE_KEYS = ("coords", "shape", "wrap")
MAX_TOPOLOGY_FILE_BYTES = 64 * 2**20  # a 100,000-device switched cluster is ~40 MB of JSON


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".json", ".graphml"):
        return suffix[1:]
    raise TopologyError(
        f"topology: {path}: unknown extension {path.suffix!r}; allowed: .json, .graphml", field="topology"
    )


def _plain(value):
    """JSON-friendly copy of an attribute value."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):  # numpy scalar
        return value.item()
    return value


def save_topology(topo: Topology, path: str | Path) -> None:
    """Write ``topo`` to ``path`` as JSON (``.json``) or GraphML (``.graphml``)."""
    path = Path(path)
    fmt = _format_of(path)
    G = topo.graph
    if fmt == "json":
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "name": topo.name,
            "graph": {k: _plain(v) for k, v in G.graph.items()},
            "nodes": [{"id": n, **{k: _plain(v) for k, v in d.items()}} for n, d in G.nodes(data=True)],
            "edges": [
                {"source": u, "target": v, **{k: _plain(x) for k, x in d.items()}} for u, v, d in G.edges(data=True)
            ],
        }
        path.write_text(json.dumps(doc, indent=1))
        return
    H = nx.Graph()

    def encode(attrs):
        return {k: json.dumps(_plain(v)) if k in _TUPLE_KEYS else _plain(v) for k, v in attrs.items() if v is not None}

    H.graph.update(encode(G.graph), name=topo.name)
    H.add_nodes_from((str(n), encode(d)) for n, d in G.nodes(data=True))
    H.add_edges_from((str(u), str(v), encode(d)) for u, v, d in G.edges(data=True))
    nx.write_graphml(H, path)


def _decode_tuples(attrs: dict, where: str) -> None:
    for key in _TUPLE_KEYS:
        value = attrs.get(key)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (json.JSONDecodeError, RecursionError):
                raise TopologyError(
                    f"topology: {where}: attribute {key!r} is not a list: {value!r}", field="topology"
                ) from None
        if isinstance(value, list):
            attrs[key] = tuple(value)


def load_topology(path: str | Path) -> Topology:
    """Read a topology written by :func:`save_topology` (or by hand in the same layout).

    Raises
    ------
    TopologyError
        For an unreadable or malformed file, a missing attribute, a non-positive
        bandwidth or a disconnected graph; the message names the file and element.
    """
    from stepsim_fileio import InputFileError, load_json, read_text

    path = Path(path)
    fmt = _format_of(path)
    try:
        text = read_text(path, MAX_TOPOLOGY_FILE_BYTES, what="topology file")
        if fmt == "json":
            G, name = _from_json(load_json(text, str(path)))
        else:
            if "<!DOCTYPE" in text or "<!ENTITY" in text:
                raise TopologyError("topology: GraphML with a DOCTYPE or entities is not accepted", field="topology")
            G = nx.parse_graphml(text)
            name = str(G.graph.pop("name", ""))
    except InputFileError as err:
        raise TopologyError(f"topology: {err}", field="topology") from None
    except TopologyError as err:
        raise TopologyError(f"{path}: {err}", field=err.field) from None
    except Exception as err:  # noqa: BLE001 -- XML parse errors (a SyntaxError), NetworkXError, ...
        raise TopologyError(
            f"topology: {path} is not a readable {fmt.upper() if fmt == 'json' else 'GraphML'} "
            f"topology ({type(err).__name__}: {err})",
            field="topology",
        ) from None
    _decode_tuples(G.graph, "graph")
    for node, data in G.nodes(data=True):
        _decode_tuples(data, f"node {node!r}")
    try:
        topo = Topology(G, name)
    except TopologyError as err:
        raise TopologyError(f"{path}: {err}", field=err.field) from err
    topo.path = str(path)
    return topo


def _from_json(doc):
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TopologyError(f'topology: expected an object with "format": "{FORMAT}"', field="topology")
    if doc.get("version") != VERSION:
        raise TopologyError(
            f"topology: unsupported version {doc.get('version')!r}; allowed: {VERSION}", field="topology"
        )
    for key in ("nodes", "edges"):
        if not isinstance(doc.get(key), list):
            raise TopologyError(f"topology: missing list {key!r}", field="topology")
    G = nx.Graph(**dict(doc.get("graph") or {}))
    for k, node in enumerate(doc["nodes"]):
        if not isinstance(node, dict) or "id" not in node:
            raise TopologyError(f"topology: nodes[{k}] lacks 'id'", field="topology")
        attrs = {a: v for a, v in node.items() if a != "id"}
        G.add_node(node["id"], **attrs)
    for k, edge in enumerate(doc["edges"]):
        if not isinstance(edge, dict) or "source" not in edge or "target" not in edge:
            raise TopologyError(f"topology: edges[{k}] lacks 'source' or 'target'", field="topology")
        for end in (edge["source"], edge["target"]):
            if end not in G:
                raise TopologyError(f"topology: edges[{k}] names unknown node {end!r}", field="topology")
        G.add_edge(edge["source"], edge["target"], **{a: v for a, v in edge.items() if a not in ("source", "target")})
    return G, str(doc.get("name", ""))
