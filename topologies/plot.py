"""A picture of a topology for design reviews.

Tori are drawn as their lattice: axes 0 and 1 as a grid of devices (the plane at
index 0 of the higher axes), wrap-around links as dashed arcs, the rest of the
shape and the pods stated in the title. Switched and custom graphs are drawn as a
hierarchy of boxes, none over another, each labelled once: scale-up domains along
the bottom (a domain's box holds its devices, and strips for its NVLink switch and
its NICs, keyed by the legend), then scale-out switches by their hop distance from
the devices. A row of more than ``max_per_layer`` items is summarised into
consecutive groups (``leaf0.r0–r8``, 9 switches).

Text is at least 10 pt at the saved size (fit for a slide). New figures are drawn
on the Agg canvas directly (no pyplot, no global backend change), so this works
headless and leaves a notebook's backend alone; a notebook shows the returned
figure when it is a cell's value. matplotlib is imported by :func:`plot_topology`, so
``import topologies`` does not load it.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

import networkx as nx
import numpy as np

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

        fig = Figure(figsize=(12, 6.5))
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


#: Colours of the drawing: a domain's box, and in it its devices, its scale-up switch and
#: its NICs; scale-out switches.
_DOMAIN_FILL, _DEVICE, _NVSWITCH, _NIC, _SWITCH = "#F4F4F4", "#F28E2B", "#4E79A7", "#59A14F", "#A0CBE8"


def _group_name(names: list) -> str:
    """A group of switches named by its first and last: ``p0.leaf0.r0`` ... ``p0.leaf0.r8``
    -> ``leaf0.r0–r8``; ``p0.leaf0.r6`` ... ``p0.leaf1.r3`` -> ``leaf0.r6 –`` / ``leaf1.r3`` on
    two lines."""
    if len(names) == 1:
        return str(names[0]).split(".", 1)[-1] if "." in str(names[0]) else str(names[0])
    first, last = str(names[0]).split("."), str(names[-1]).split(".")
    k = 0
    while k < min(len(first), len(last)) - 1 and first[k] == last[k]:
        k += 1
    if k == len(first) - 1 == len(last) - 1:  # only the last part differs
        return ".".join(first[max(0, k - 1) :]) + f"–{last[k]}"
    return f"{'.'.join(first[k:])} –\n{'.'.join(last[k:])}"


def _layers(topo: Topology, max_per_layer: int):
    """The drawing's boxes and edges. Units: a domain (its devices with the switch(es) only
    they reach over NVLink) or a scale-out switch; layers: domains at 0, switches at their
    hop distance from the devices; a layer of more than ``max_per_layer`` units is summarised
    into consecutive groups. Returns ``{group: (layer, index, count, label, info)}`` and
    ``{(group, group): total bandwidth}``."""
    G = topo.graph
    device_nodes = set(topo.devices)
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
    domain_devices, domain_switches, domain_nics = defaultdict(int), defaultdict(int), defaultdict(int)
    for i in range(topo.n_devices):
        domain_devices[topo.domain_of(i)] += 1
    for node in G:
        if node not in device_nodes and unit[node][0] == "domain":
            domain_switches[unit[node][1]] += 1
    for u, v in G.edges():
        for a, b in ((u, v), (v, u)):
            if a in device_nodes and unit[b][0] == "switch":
                domain_nics[unit[a][1]] += 1
    group_of, boxes = {}, {}
    for lv, items in sorted(layers.items()):
        items = sorted(items, key=lambda it: (it[1] if it[0] == "domain" else 0, _natural(str(it[1]))))
        per = math.ceil(len(items) / max_per_layer)
        chunks = [items[k : k + per] for k in range(0, len(items), per)]
        for c, chunk in enumerate(chunks):
            gid = (lv, c)
            for it in chunk:
                group_of[it] = gid
            if chunk[0][0] == "domain":
                ids = [it[1] for it in chunk]
                name = f"domain {ids[0]}" if len(ids) == 1 else f"domains\n{ids[0]}–{ids[-1]}"
                info = {
                    "domains": len(ids),
                    "devices": sum(domain_devices[d] for d in ids),
                    "switches": sum(domain_switches[d] for d in ids),
                    "nics": sum(domain_nics[d] for d in ids),
                }
                label = f"{name}\n{info['devices']} devices"
            else:
                names = [it[1] for it in chunk]
                info = {"switches": len(chunk)}
                label = _group_name(names) + (f"\n{len(chunk)} switches" if len(chunk) > 1 else "")
            boxes[gid] = (lv, c, len(chunks), label, info)
    bw = defaultdict(float)
    for u, v, d in G.edges(data=True):
        a, b = group_of[unit[u]], group_of[unit[v]]
        if a != b:
            bw[tuple(sorted((a, b)))] += d["bw_bytes_per_s"]
    return boxes, bw


def _natural(name: str) -> tuple:
    """``"r10"`` after ``"r9"``: digits compared as numbers."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _draw_layers(topo: Topology, ax, max_per_layer: int) -> None:
    """Switched and custom graphs as a hierarchy of boxes: one row per layer (domains at
    the bottom, scale-out switches above by hop distance), each row's boxes side by side
    with a gap, each labelled once; a domain's box holds strips for its NICs and its NVLink
    switch, keyed by the legend below. Edges join the boxes, behind them."""
    # as many boxes side by side as 10-pt labels fit: one per ~1.15 in of the axes' width
    width_in = ax.get_position().width * ax.figure.get_figwidth()
    boxes, bw = _layers(topo, max(2, min(max_per_layer, int(width_in / 1.15))))
    geom = _box_geometry(boxes)
    below = _draw_edges(ax, geom, bw)
    per_domain = _draw_boxes(ax, boxes, geom)
    _box_legend(ax, per_domain, any("devices" not in info for *_, info in boxes.values()), width_in)
    ax.set_xlim(-0.01, 1.01)
    lo = min(y0 for _, y0, _, _ in geom.values()) - below - 0.05
    hi = max(y0 + h for _, y0, _, h in geom.values()) + 0.05
    pad = max(0.0, 2.6 - (hi - lo)) / 2  # a layer is as tall in a one- or two-layer drawing
    ax.set_ylim(lo - pad, hi + pad)
    extra = f", {topo.n_pods} pods" if topo.n_pods > 1 else ""
    per_kind = {}
    for cap, kind in zip(topo.link_capacity, topo.link_kind):
        per_kind.setdefault(kind, set()).add(float(cap))
    links = ", ".join(
        f"{k} {_gbps(min(c))}" + (f"-{_gbps(max(c))}" if len(c) > 1 else "") for k, c in sorted(per_kind.items())
    )
    ax.set_title(
        f"{topo.name or topo.kind}: {topo.n_devices} devices, {topo.kind}, domain size "
        f"{topo.domain_size}{extra}\nlinks per direction: {links}",
        fontsize=11,
    )


#: Height of a domain's box and of a switch group's, in layers (one layer apart is 1).
_DOMAIN_H, _SWITCH_H = 0.62, 0.36


def _box_geometry(boxes: dict) -> dict:
    """group -> ``(x0, y0, width, height)``: a layer's boxes in equal slots across [0, 1]
    (at most 0.22 wide), centred on the layer's height."""
    geom = {}
    for gid, (lv, c, n, _label, info) in boxes.items():
        slot = 1.0 / n
        w = min(slot * 0.88, 0.22)
        h = _DOMAIN_H if "devices" in info else _SWITCH_H
        geom[gid] = (c * slot + (slot - w) / 2, lv - h / 2, w, h)
    return geom


def _draw_edges(ax, geom: dict, bw: dict) -> float:
    """Edges behind the boxes: from the top of the lower box to the bottom of the upper one;
    boxes of one layer joined by an arc under the row. Returns how far the arcs under the
    bottom row reach below it."""
    below = 0.0
    for a, b in sorted(bw):
        (ax0, ay0, aw, _), (bx0, _, bw_, _) = geom[a], geom[b]
        if a[0] == b[0]:
            xa, xb = ax0 + aw / 2, bx0 + bw_ / 2
            t = np.linspace(0.0, 1.0, 30)
            dip = 0.3 * min(1.0, abs(xb - xa) * 3)
            ax.plot(xa + (xb - xa) * t, ay0 - 4 * dip * t * (1 - t), color="#9A9A9A", lw=0.8, zorder=1)
            below = max(below, dip) if a[0] == 0 else below
            continue
        lo, hi = (a, b) if a[0] < b[0] else (b, a)
        (lx, ly, lw_, lh), (hx, hy, hw, _) = geom[lo], geom[hi]
        ax.plot([lx + lw_ / 2, hx + hw / 2], [ly + lh, hy], color="#9A9A9A", lw=0.8, zorder=1)
    return below


def _draw_boxes(ax, boxes: dict, geom: dict) -> dict:
    """Each group's box and label (``gid`` ``"node:…"`` and ``"label"``); a domain's box with
    a strip for its NICs along the top and one for its NVLink switch along the bottom.
    Returns ``{"nics" | "switches": (colour, {count per domain})}`` for the legend."""
    from matplotlib.patches import FancyBboxPatch

    per_domain: dict = {}
    for gid, (_lv, _c, _n, label, info) in sorted(boxes.items()):
        x0, y0, w, h = geom[gid]
        is_domain = "devices" in info
        ax.add_patch(
            FancyBboxPatch(
                (x0, y0),
                w,
                h,
                boxstyle="round,pad=0,rounding_size=0.02",
                facecolor=_DOMAIN_FILL if is_domain else _SWITCH,
                edgecolor="#555555",
                lw=1.0,
                zorder=2,
                gid=f"node:{label}",
            )
        )
        ax.text(x0 + w / 2, y0 + h / 2, label, ha="center", va="center", fontsize=10, zorder=4, gid="label")
        if not is_domain:
            continue
        strip = 0.07
        for yy, colour, key in ((y0 + h - strip - 0.02, _NIC, "nics"), (y0 + 0.02, _NVSWITCH, "switches")):
            if info[key]:
                ax.add_patch(
                    FancyBboxPatch(
                        (x0 + 0.1 * w, yy), 0.8 * w, strip, boxstyle="square,pad=0", facecolor=colour, lw=0, zorder=3
                    )
                )
                per_domain.setdefault(key, (colour, set()))[1].add(info[key] // info["domains"])
    return per_domain


def _box_legend(ax, per_domain: dict, switches: bool, width_in: float) -> None:
    """The key of the boxes and strips, below the axes."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=_DOMAIN_FILL, edgecolor="#555555", label="scale-up domain (its devices)")]
    what = {"nics": "NICs", "switches": "NVLink switches"}
    for key, (colour, per) in per_domain.items():
        count = f"{per.pop()} per domain" if len(per) == 1 else "per domain"
        handles.append(Patch(color=colour, label=f"{what[key]} ({count})"))
    if switches:
        handles.append(Patch(facecolor=_SWITCH, edgecolor="#555555", label="scale-out switches"))
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=max(1, min(4, len(handles), int(width_in / 2.6))),
        frameon=False,
        fontsize=10,
    )
