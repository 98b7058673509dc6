"""The links heat map (``links.png``): the cluster's devices and switches coloured by how
busy their links were, the most loaded links named beside it.

Devices are drawn per scale-up domain (a rack), in rows of one tray each (a GB200 NVL72
compute tray holds 4 GPUs, per NVIDIA's GB200 NVL72 product page; other domains: rows of
8 or of about the square root of the domain's size). Each device is two cells: the
upper one its scale-up links (NVLink, torus links: the busiest of the links leaving or
entering it), the lower one its NIC links. Above them, one strip per switch role --
scale-up switches (reached over NVLink), leaf switches (reached from NICs), spine and
core switches (the rest) -- each switch a cell coloured by its busiest link. The colour
is the links table's ``busy_fraction`` over every axis (:mod:`simulator.results.links`).
The panel on the right lists the most loaded links by name. Text is placed on a fixed
grid, so no two labels overlap.
"""

from __future__ import annotations

import math
import re

import numpy as np

from simulator.results.plots import finish, new_figure

TOP_LINKS = 12  # links named in the side panel
_DOMAINS_PER_ROW = 8  # racks drawn side by side before wrapping
_LABELLED_ROWS = 4  # rows of racks whose racks and trays are named


def _per_row(domain_size: int) -> int:
    if domain_size == 72:  # GB200 NVL72: 18 compute trays of 4 GPUs
        return 4
    return domain_size if domain_size <= 8 else max(8, math.ceil(math.sqrt(domain_size)))


def _busiest(topo, cols) -> tuple[dict, dict]:
    """Per node: the busiest scale-up (non-NIC) and NIC link touching it (absent: none)."""
    up: dict = {}
    nic: dict = {}
    for link, axis, kind, busy in zip(cols["link"], cols["axis"], cols["kind"], cols["busy_fraction"]):
        if axis != "all":
            continue
        into = nic if kind == "nic" else up
        for node in topo.link_endpoints(int(link)):
            into[node] = max(into.get(node, 0.0), float(busy))
    return up, nic


def _natural(name) -> tuple:
    """``leaf0.r10`` after ``leaf0.r9``: runs of digits compared as numbers."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(name)))


def _switch_roles(topo) -> dict[str, list]:
    """Switch nodes by role: scale-up (an NVLink link), leaf (a NIC link), spine / core."""
    roles: dict[str, list] = {"scale-up switches": [], "leaf switches": [], "spine / core switches": []}
    for node, data in topo.graph.nodes(data=True):
        if data.get("kind") == "device":
            continue
        kinds = {k for _, _, k in topo.graph.edges(node, data="kind")}
        role = (
            "scale-up switches" if "nvlink" in kinds else "leaf switches" if "nic" in kinds else "spine / core switches"
        )
        roles[role].append(node)
    return {r: sorted(v, key=_natural) for r, v in roles.items() if v}


def _fmt_bytes(b: float) -> str:
    for unit, k in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= k:
            return f"{b / k:.3g} {unit}"
    return f"{b:.3g} B"


class _Grid:
    """Where the racks go: one box per scale-up domain, ``n_cols`` side by side, each
    holding its devices in rows of ``per_row`` (two cells a device)."""

    def __init__(self, topo):
        self.dom = topo.domains_of(np.arange(topo.n_devices))
        self.domains = sorted(set(self.dom.tolist()))
        size = max(int(np.bincount(self.dom).max()), 1)
        self.per_row = _per_row(size)
        self.trays = size == 72  # rows named as trays
        self.left = 2.0 if self.trays else 0.75  # room in a rack's box left of its devices
        self.w, self.h = self.per_row + self.left + 0.75, 2 * math.ceil(size / self.per_row) + 1.5
        # 8 racks a row, more where that would make the picture taller than wide
        n = len(self.domains)
        self.n_cols = min(n, max(_DOMAINS_PER_ROW, math.ceil(math.sqrt(n * self.h / self.w))))
        self.n_rows = math.ceil(len(self.domains) / self.n_cols)
        # more rows of racks than fit a label each at 10 pt: the title says how they are laid out
        self.labelled = self.n_rows <= _LABELLED_ROWS

    def origin(self, j: int) -> tuple[float, float]:
        return (j % self.n_cols) * self.w, (self.n_rows - 1 - j // self.n_cols) * self.h


def _rack_cells(topo, grid: _Grid, up: dict, nic: dict, cells: list, texts: list) -> None:
    """Each device's two cells (scale-up above, NIC below), the tray and rack labels."""
    for j, d in enumerate(grid.domains):
        gx, gy = grid.origin(j)
        for k, dev in enumerate(np.flatnonzero(grid.dom == d).tolist()):
            r, c = divmod(k, grid.per_row)
            x, y = gx + grid.left + c, gy + grid.h - 1.0 - 2 * (r + 1)
            if grid.trays and grid.labelled and c == 0:
                texts.append((gx + grid.left - 0.15, y + 1.0, f"tray {r}", {"ha": "right", "va": "center"}))
            node = topo.devices[dev]
            cells.append((x, y + 1.0, 0.9, 0.95, up.get(node, 0.0)))
            cells.append((x, y, 0.9, 0.95, nic.get(node, 0.0)))
        if grid.labelled:
            texts.append((gx + grid.w / 2, gy + grid.h - 0.4, f"rack {d}", {"ha": "center", "va": "center"}))


def _switch_cells(
    roles: dict, y0: float, width: float, u: float, up: dict, nic: dict, cells: list, texts: list
) -> None:
    """One strip per switch role above the racks (``u`` high), a cell per switch, its label
    above it."""
    for i, (role, nodes) in enumerate(roles.items()):
        y = y0 + 0.6 * u + i * 2.2 * u
        w = width / len(nodes)
        for k, node in enumerate(nodes):
            cells.append((k * w + 0.05 * w, y, 0.9 * w, u, max(up.get(node, 0.0), nic.get(node, 0.0))))
        texts.append((width / 2, y + 1.45 * u, f"{role} ({len(nodes)})", {"ha": "center", "va": "center"}))


def _corners(x, y, w, h) -> np.ndarray:
    """Rectangles as polygons: (n, 4, 2) corners."""
    return np.stack([np.stack(p, 1) for p in ((x, y), (x + w, y), (x + w, y + h), (x, y + h))], 1)


def plot_links(result, cols, path=None, dpi: int = 130):
    """Draw the links heat map of ``result`` from its links table ``cols``
    (:func:`~simulator.results.links.link_columns`); returns the figure (saved to
    ``path`` if given)."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import Normalize

    topo = result.topology
    up, nic = _busiest(topo, cols)
    grid = _Grid(topo)
    roles = _switch_roles(topo)
    width = grid.n_cols * grid.w
    u = max(1.0, grid.n_rows * grid.h / 30)  # a switch strip's height: visible beside many racks
    height = grid.n_rows * grid.h + (len(roles) * 2.2 + 0.5) * u
    fig, (ax, side) = new_figure(
        (15, max(6.0, min(14.0, 0.22 * height + 2.5))),
        ncols=2,
        gridspec_kw={"width_ratios": [3, 2]},
        layout="constrained",
    )
    fig.get_layout_engine().set(h_pad=0.15, w_pad=0.1)  # margins clear of the colour bar's tick labels
    cmap, norm = colormaps["YlOrRd"], Normalize(0.0, 1.0)
    cells: list = []  # (x, y, w, h, busy fraction)
    texts: list = []  # (x, y, text, keywords)
    _rack_cells(topo, grid, up, nic, cells, texts)
    _switch_cells(roles, grid.n_rows * grid.h, width, u, up, nic, cells, texts)
    x, y, w, h, v = (np.asarray(c, dtype=float) for c in zip(*cells))
    edge = "0.6" if len(cells) <= 4000 else "none"  # thousands of cells: outlines would hide them
    ax.add_collection(PolyCollection(_corners(x, y, w, h), facecolors=cmap(norm(v)), edgecolors=edge, linewidths=0.3))
    for x, y, t, kw in texts:
        ax.text(x, y, t, fontsize=10, **kw)
    gx, gy = (np.asarray(c, dtype=float) for c in zip(*map(grid.origin, range(len(grid.domains)))))
    racks = _corners(gx + 0.4, gy + 0.2, np.full(len(gx), grid.w - 0.8), np.full(len(gx), grid.h - 1.0))
    ax.add_collection(PolyCollection(racks, facecolors="none", edgecolors="0.3", linewidths=0.8))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_axis_off()
    rows = f"rows of {grid.per_row} devices" + (" (a compute tray)" if grid.trays else "")
    if not grid.labelled:
        rows = f"{len(grid.domains)} racks, {grid.n_cols} a row from the top left, their devices in {rows}"
    ax.set_title(
        f"Link busy fraction by device and switch: {rows}; each device's upper cell its scale-up links, "
        "lower cell its NICs",
        fontsize=10,
        loc="left",
    )
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, location="bottom", shrink=0.6)
    bar.set_label("busy fraction")
    bar.ax.xaxis.set_label_position("top")  # above the bar: clear of the figure's edge
    _side_panel(side, cols)
    return finish(fig, path, dpi=dpi)


def _line(cols, r: int) -> str:
    return (
        f"{cols['src'][r]} → {cols['dst'][r]} ({cols['kind'][r]}): {100 * cols['busy_fraction'][r]:.0f}%, "
        f"{_fmt_bytes(float(cols['bytes'][r]))}, {int(cols['peak_flows'][r])}"
    )


def _side_panel(ax, cols) -> None:
    """The most loaded links, one line each, on a fixed grid of lines."""
    ax.set_axis_off()
    sel = np.flatnonzero(np.asarray(cols["axis"], dtype=object) == "all")
    busy = np.asarray(cols["busy_fraction"], dtype=float)[sel]
    order = sel[np.lexsort((-np.asarray(cols["bytes"], dtype=float)[sel], -busy))][:TOP_LINKS]
    ax.text(0.0, 1.0, "Most loaded links (busy fraction, bytes, peak flows)", fontsize=11, weight="bold", va="top")
    if not len(order):
        ax.text(0.0, 0.9, "no link carried traffic", fontsize=10, va="top")
    for i, r in enumerate(order.tolist()):
        ax.text(0.0, 0.93 - i * 0.055, f"{i + 1:>2}. {_line(cols, r)}", fontsize=10, va="top", family="monospace")
    # the busiest link of each kind, so that a lightly loaded tier is named too
    kinds = np.asarray(cols["kind"], dtype=object)[sel]
    y = 0.93 - len(order) * 0.055 - 0.04
    if len(sel):
        ax.text(0.0, y, "Busiest link of each kind", fontsize=11, weight="bold", va="top")
    for j, kind in enumerate(sorted(set(kinds.tolist()))):
        mine = sel[kinds == kind]
        r = int(mine[np.lexsort((-np.asarray(cols["bytes"], dtype=float)[mine], -busy[kinds == kind]))][0])
        ax.text(0.0, y - 0.07 - j * 0.055, f"{kind:>6}: {_line(cols, r)}", fontsize=10, va="top", family="monospace")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
