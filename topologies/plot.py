"""A picture of a topology for design reviews.

Tori are drawn as their lattice: axes 0 and 1 as a grid of devices (the plane at
index 0 of the higher axes), wrap-around links as dashed arcs, the rest of the
shape and the pods stated in the title. Switched and custom graphs are drawn in
layers: scale-up domains at the bottom (a device and its NVSwitch count as its
domain), then switches by their hop distance from the devices. Any layer with
more than ``max_per_layer`` items is summarised into consecutive groups, and
edges carry the total bandwidth between the items they join.

Text is at least 10 pt at the saved size (fit for a slide). New figures are drawn
on the Agg canvas directly (no pyplot, no global backend change), so this works
headless and leaves a notebook's backend alone; a notebook shows the returned
figure when it is a cell's value. matplotlib is imported by :func:`plot_topology`, so
``import topologies`` does not load it.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict

import networkx as nx

from .topology import Topology


def _gbps(bw: float) -> str:
    if bw >= 10e9:
        return f"{bw / 1e9:,.0f} GB/s"
    return f"{bw / 1e9:.3g} GB/s" if bw >= 1e9 else f"{bw / 1e6:.3g} MB/s"


def plot_topology(topo: Topology, path=None, ax=None, max_per_layer: int = 8):
    """Draw ``topo`` and return the matplotlib Figure (saved to ``path`` if given).

    ``ax``: draw into this Axes instead of a new figure.
    """
    if ax is None:
        # matplotlib loads here, not when topologies is imported
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(11, 6.5))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
    else:
        fig = ax.figure
    if topo.kind == "torus" and len(topo.torus_shape) <= 3 and math.prod(topo.torus_shape[:2]) <= 1024:
        _draw_torus(topo, ax)
    else:
        _draw_layers(topo, ax, max_per_layer)
    ax.set_axis_off()
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig


def _draw_torus(topo: Topology, ax) -> None:
    shape, wrap = topo.torus_shape, topo.torus_wrap
    sx = shape[0]
    sy = shape[1] if len(shape) > 1 else 1
    bw = topo.link_capacity[0] if topo.n_links else 0.0
    for x in range(sx):
        for y in range(sy):
            if x + 1 < sx:
                ax.plot([x, x + 1], [y, y], color="tab:blue", lw=1, zorder=1)
            if y + 1 < sy:
                ax.plot([x, x], [y, y + 1], color="tab:blue", lw=1, zorder=1)
    stub = 0.35
    for axis, (n, w) in enumerate(zip(shape[:2], wrap[:2])):
        if not w or n <= 2:
            continue
        for k in range(sy if axis == 0 else sx):
            if axis == 0:
                ends = [((0, k), (-stub, k)), ((sx - 1, k), (sx - 1 + stub, k))]
            else:
                ends = [((k, 0), (k, -stub)), ((k, sy - 1), (k, sy - 1 + stub))]
            for (x0, y0), (x1, y1) in ends:
                ax.plot([x0, x1], [y0, y1], color="tab:gray", lw=0.8, linestyle="--", zorder=1)
    xs = [x for x in range(sx) for _ in range(sy)]
    ys = [y for _ in range(sx) for y in range(sy)]
    size = max(8, 300 / max(sx, sy)) if sx * sy > 64 else 420
    ax.scatter(xs, ys, s=size, color="tab:orange", zorder=2)
    if sx * sy <= 64:
        for x, y in zip(xs, ys):
            ax.annotate(
                str(topo.device_at((x, y) + (0,) * (len(shape) - 2))),
                (x, y),
                fontsize=10,
                ha="center",
                va="center",
                zorder=3,
            )
    rest = f"\n{math.prod(shape[2:])} planes along axis 2 (plane 0 shown)" if len(shape) > 2 else ""
    pods = ""
    if topo.n_pods > 1:
        dcn = [c for c, k in zip(topo.link_capacity, topo.link_kind) if k == "dcn"]
        pods = f"\n{topo.n_pods} pods joined by DCN, {_gbps(min(dcn))} per device"
    ax.set_title(
        f"{topo.name or 'torus'}: {topo.n_devices} devices, torus "
        f"{' x '.join(map(str, shape))}, wrap {list(wrap)}{rest}\n"
        f"ICI {_gbps(bw)} per link per direction (dashed stubs: wrap-around){pods}",
        fontsize=11,
    )
    ax.set_aspect("equal")
    ax.margins(0.1)


def _draw_layers(topo: Topology, ax, max_per_layer: int) -> None:
    G = topo.graph
    device_nodes = set(topo.devices)
    # Unit of each node: a domain (device + its NVSwitch) or the switch itself.
    unit = {d: ("domain", topo.domain_of(i)) for i, d in enumerate(topo.devices)}
    for u, v, k in G.edges(data="kind"):
        if k == "nvlink":
            sw, dev = (v, u) if u in device_nodes else (u, v)
            unit.setdefault(sw, unit.get(dev, ("switch", str(sw))))
    level = nx.multi_source_dijkstra_path_length(G, device_nodes, weight=lambda *_: 1)
    layers = defaultdict(set)
    for node in G:
        unit.setdefault(node, ("switch", str(node)))
        layers[0 if unit[node][0] == "domain" else level[node]].add(unit[node])
    # Summarise crowded layers into consecutive groups.
    group_of, label, pos = {}, {}, {}
    domain_devices = defaultdict(int)
    for i in range(topo.n_devices):
        domain_devices[topo.domain_of(i)] += 1
    for lv, items in sorted(layers.items()):
        items = sorted(items, key=lambda it: (it[1] if it[0] == "domain" else 0, str(it[1])))
        per = math.ceil(len(items) / max_per_layer)
        chunks = [items[k : k + per] for k in range(0, len(items), per)]
        for c, chunk in enumerate(chunks):
            gid = (lv, c)
            for it in chunk:
                group_of[it] = gid
            if chunk[0][0] == "domain":
                devs = sum(domain_devices[it[1]] for it in chunk)
                name = f"domain {chunk[0][1]}" if len(chunk) == 1 else f"domains {chunk[0][1]}-{chunk[-1][1]}"
                label[gid] = f"{name}\n{devs} dev"
            else:
                names = [it[1] for it in chunk]
                label[gid] = names[0] if len(chunk) == 1 else (f"{os.path.commonprefix(names)}*\n{len(chunk)} switches")
            # crowded layers alternate up and down so that 10-pt labels do not collide
            pos[gid] = ((c + 0.5) / len(chunks), lv + (0.25 if len(chunks) > 5 and c % 2 else 0.0))
    bw = defaultdict(float)
    for u, v, d in G.edges(data=True):
        a, b = group_of[unit[u]], group_of[unit[v]]
        if a != b:
            bw[tuple(sorted((a, b)))] += d["bw_bytes_per_s"]
    S = nx.Graph()
    S.add_nodes_from(pos)
    S.add_edges_from(bw)
    nx.draw_networkx_edges(S, pos, ax=ax, edge_color="tab:gray", width=0.8)
    colours = ["tab:orange" if gid[0] == 0 else "tab:blue" for gid in S]
    nx.draw_networkx_nodes(S, pos, ax=ax, node_color=colours, node_size=2200, alpha=0.85)
    nx.draw_networkx_labels(S, pos, labels={g: label[g] for g in S}, ax=ax, font_size=10)
    if len(bw) <= 16:
        nx.draw_networkx_edge_labels(S, pos, edge_labels={e: _gbps(b) for e, b in bw.items()}, ax=ax, font_size=10)
    extra = f", {topo.n_pods} pods" if topo.n_pods > 1 else ""
    per_kind = {}
    for cap, kind in zip(topo.link_capacity, topo.link_kind):
        per_kind.setdefault(kind, set()).add(float(cap))
    links = ", ".join(
        f"{k} {_gbps(min(c))}" + (f"-{_gbps(max(c))}" if len(c) > 1 else "") for k, c in sorted(per_kind.items())
    )
    ax.set_title(
        f"{topo.name or topo.kind}: {topo.n_devices} devices, {topo.kind}, domain size "
        f"{topo.domain_size}{extra}\nlinks per direction: {links}"
        + ("\nedge labels: total bandwidth per direction" if len(bw) <= 16 else ""),
        fontsize=11,
    )
    ax.margins(0.08)
