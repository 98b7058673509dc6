"""Translation orbits of a torus: traffic that a group of torus translations maps onto
itself, as one flow per orbit.

Where every rank of a pipeline stage runs the same program at the same instant (the
representative assumption of :mod:`simulator.engine.loop`) and a translation ``t`` of the
torus maps every group of every axis onto a group of the same axis and every stage onto
itself, the traffic of the whole network at any instant is mapped onto itself by ``t``,
and so is the max-min solution: a transfer and its image run at one rate, and a link and
its image carry one load. The network then need carry one flow per orbit of transfers,
loading one link per orbit of links (the smallest link id of the orbit) as many times as
the orbit's flows cross that orbit's links per link. Under translations that move every
device (a free action) an orbit of transfers and an orbit of links both have ``|G|``
members, so that count is the number of links of the link orbit on one member's route.

:func:`translation_group` finds the translations (the product of one cyclic group per
torus axis: the smallest shift along each axis that keeps every partition);
:func:`orbit_phase` folds one phase's transfers (every twin group's, as the full plans
give them) into their orbits' representatives, or returns None where the phase is not
mapped onto itself (then the caller runs the plans without this quotient).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from simulator.network.phases import Transfer

if TYPE_CHECKING:  # pragma: no cover
    from simulator.network.flows import FlowNetwork
    from topologies.topology import Topology
    from workloads.layout import ParallelLayout

#: Most translations x links held as arrays (each an int64 array of this many cells): past it a
#: subgroup (multiples of an axis's shift), so that a large torus stays within memory.
MAX_IMAGE_CELLS = 1 << 23

#: Whether layouts with pipeline stages fold too (each translation keeping every rank's stage).
#: Off by default: on the PP map's DeepSeek-V3 TP4 PP4 EP64 DualPipe layout on a 16 x 12 x 12
#: TPU v5p torus (12 translations) the fold equals injecting every twin group
#: (``twin_quotient=False``) to the bit, 7.084832032052321 s with 16 micro-batches, where the
#: twin quotient gives 7.084792502235687 s (exposed ZeRO gathers 0.0720 s against 0.0781 s),
#: and it costs more: 25.8 CPU-s against 17.6 (250.7 against 172.2 with the map's 128).
FOLD_STAGES = False

#: The layout's group axes whose groups a translation must map onto groups.
_AXES = ("tp", "cp", "dp", "ep", "edp", "etp", "dp_cp")


@dataclass(frozen=True)
class TorusOrbits:
    """A group of torus translations acting on devices and links.

    ``images[g, d]``: the device translation ``g`` takes device ``d`` to (row 0 the
    identity); ``canon_device[d]``: the smallest device of ``d``'s orbit; ``to_canon[d]``:
    the translation taking ``d`` there; ``canon_link[l]``: the smallest link of ``l``'s orbit."""

    images: np.ndarray
    canon_device: np.ndarray
    to_canon: np.ndarray
    canon_link: np.ndarray

    @property
    def order(self) -> int:
        return int(self.images.shape[0])


def _shift_map(topo: Topology, axis: int, k: int) -> np.ndarray:
    """Device -> device of the translation by ``k`` along torus ``axis`` (one pod)."""
    assert topo.torus_shape is not None
    coords = np.array([topo.torus_coords(d) for d in range(topo.n_devices)], dtype=np.int64)
    moved = coords.copy()
    moved[:, axis] = (moved[:, axis] + k) % topo.torus_shape[axis]
    shape = np.array(topo.torus_shape, dtype=np.int64)
    flat = np.ravel_multi_index(tuple(coords.T), tuple(shape))
    device_of_flat = np.empty(int(shape.prod()), dtype=np.int64)
    device_of_flat[flat] = np.arange(topo.n_devices)
    return device_of_flat[np.ravel_multi_index(tuple(moved.T), tuple(shape))]


def _keeps(perm: np.ndarray, partitions: list[np.ndarray], fixed: np.ndarray) -> bool:
    """Whether ``perm`` keeps every label of ``fixed`` and maps every block of each
    partition (labels per device) onto a block."""
    if (fixed[perm] != fixed).any():
        return False
    for lab in partitions:
        n = int(lab.max()) + 1
        if np.unique(lab * n + lab[perm]).size != np.unique(lab).size:
            return False
    return True


def translation_group(
    topo: Topology, partitions: list[np.ndarray], fixed: np.ndarray | None = None
) -> TorusOrbits | None:
    """The translations of ``topo``'s torus that keep every partition (an array of labels
    per device: blocks onto blocks) and every label of ``fixed`` (each device onto one of
    its own label: pipeline stages), as the product over axes of the cyclic group of the
    smallest such shift along that axis; None where the topology is not one wrapped torus
    pod of devices only linked to devices, or no shift but the identity keeps them."""
    shape, wrap = topo.torus_shape, topo.torus_wrap
    if topo.kind != "torus" or shape is None or wrap is None or topo.n_pods != 1:
        return None
    n = topo.n_devices
    if n != math.prod(shape):
        return None
    fixed = np.zeros(n, dtype=np.int64) if fixed is None else fixed
    index = {name: i for i, name in enumerate(topo.devices)}
    ends = np.full((topo.n_links, 2), -1, dtype=np.int64)
    for k in range(topo.n_links):
        u, v = topo.link_endpoints(k)
        if u not in index or v not in index:
            return None
        ends[k] = index[u], index[v]
    shifts = {}  # axis -> the smallest shift along it that keeps the partitions
    for axis, length in enumerate(shape):
        if wrap[axis] and length > 2:  # (a 2-ring's shift maps a link onto its reverse)
            k = next(
                (
                    k
                    for k in range(1, length)
                    if not length % k and _keeps(_shift_map(topo, axis, k), partitions, fixed)
                ),
                0,
            )
            if k:
                shifts[axis] = k
    while shifts and math.prod(shape[a] // k for a, k in shifts.items()) * topo.n_links > MAX_IMAGE_CELLS:
        a = max(shifts, key=lambda a: shape[a] // shifts[a])  # a subgroup: a multiple of its shift
        shifts[a] = next(k for k in range(shifts[a] + 1, shape[a] + 1) if not shape[a] % k and not k % shifts[a])
        if shifts[a] == shape[a]:
            del shifts[a]
    if not shifts:
        return None
    images = np.arange(n, dtype=np.int64)[None, :]
    for axis, k in shifts.items():
        step = _shift_map(topo, axis, k)
        powers = [np.arange(n, dtype=np.int64)]
        for _ in range(shape[axis] // k - 1):
            powers.append(step[powers[-1]])
        images = np.concatenate([p[images] for p in powers])  # compose with every power
    # link images: (u, v) -> (g u, g v), looked up by the pair's key
    key = ends[:, 0] * n + ends[:, 1]
    order = np.argsort(key)
    moved = images[:, ends[:, 0]] * n + images[:, ends[:, 1]]
    at = np.searchsorted(key, moved, sorter=order)
    at = np.minimum(at, key.size - 1)
    link_images = order[at]
    if (key[link_images] != moved).any():
        return None  # a translated link that does not exist
    canon_link = link_images.min(axis=0)
    canon_device = images.min(axis=0)
    to_canon = np.argmin(images, axis=0)
    return TorusOrbits(images, canon_device, to_canon, canon_link)


def layout_translations(topo: Topology, layout: ParallelLayout) -> TorusOrbits | None:
    """:func:`translation_group` of the partitions of ``layout``'s ranks (device ``r``
    holds rank ``r``) into the groups of every axis, each rank kept in its pipeline stage.

    None where the layout does not fill the torus; with pipeline stages unless
    :data:`FOLD_STAGES`; without them where the group has fewer translations than some axis
    has groups of two or more ranks (the fold could carry more flows than the twin
    quotient's one group)."""
    if topo.kind != "torus" or layout.world != topo.n_devices or (layout.pp > 1 and not FOLD_STAGES):
        return None
    ranks = np.arange(layout.world)
    stage = ranks // layout.rank_of(pp=1) % layout.pp if layout.pp > 1 else None
    orbits = translation_group(topo, [np.asarray(layout.group_index(a)) for a in _AXES], fixed=stage)
    if orbits is None or layout.pp > 1:
        return orbits
    if any(t.shape[1] > 1 and t.shape[0] > orbits.order for t in map(layout.group_table, _AXES)):
        return None
    return orbits


def orbit_phase(net: FlowNetwork, orbits: TorusOrbits, transfers) -> tuple | None:
    """One phase's ``transfers`` as one transfer per orbit under ``orbits``: the orbit's
    member from its canonical device, of the member's size and weight, loading each
    canonical link as many times as its route crosses that link's orbit. None where the
    phase is not mapped onto itself (an orbit short of members, members of unequal
    weight, a transfer with its own incidence, routes that are not translates of each
    other, or links of one orbit with unequal capacity or latency)."""
    if any(t.incidence is not None for t in transfers):
        return None
    live = [t for t in transfers if t.src != t.dst and t.size_bytes > 0]
    if not live:
        return ()
    src = np.array([t.src for t in live], dtype=np.int64)
    dst = np.array([t.dst for t in live], dtype=np.int64)
    size = np.array([t.size_bytes for t in live], dtype=float)
    weight = np.array([t.weight for t in live], dtype=np.int64)
    # one row per distinct (src, dst, size), its summed weight (as the network merges them)
    _, size_id = np.unique(size, return_inverse=True)
    n = orbits.images.shape[1]
    pair_key = (size_id * n + src) * n + dst
    _, first, inverse = np.unique(pair_key, return_index=True, return_inverse=True)
    w = np.bincount(inverse, weights=weight).astype(np.int64)
    src, dst, size, size_id = src[first], dst[first], size[first], size_id[first]
    g = orbits.to_canon[src]
    csrc, cdst = orbits.canon_device[src], orbits.images[g, dst]
    orbit_key = (size_id * n + csrc) * n + cdst
    _, rep_at, of, members = np.unique(orbit_key, return_index=True, return_inverse=True, return_counts=True)
    if (members != orbits.order).any() or (w != w[rep_at][of]).any():
        return None
    links, lat = net.routes(src, dst)
    canon = np.where(links >= 0, orbits.canon_link[np.where(links >= 0, links, 0)], -1)
    cap = net.capacity
    on = links >= 0
    if (on & (cap[np.where(on, links, 0)] != cap[np.where(on, canon, 0)])).any():
        return None
    canon.sort(axis=1)
    if (canon != canon[rep_at][of]).any() or (lat != lat[rep_at][of]).any():
        return None  # routes that are not translates of their representative's
    rep_links, _ = net.routes(csrc[rep_at], cdst[rep_at])
    out = []
    for j, i in enumerate(rep_at.tolist()):
        route = [lk for lk in rep_links[j].tolist() if lk >= 0]
        crossed = [int(orbits.canon_link[lk]) for lk in route]
        t = Transfer(int(csrc[i]), int(cdst[i]), float(size[i]), int(w[i]))
        if crossed != route or len(set(crossed)) != len(crossed):
            counts: dict[int, float] = {}
            for lk in crossed:
                counts[lk] = counts.get(lk, 0.0) + 1.0
            t = Transfer(t.src, t.dst, t.size_bytes, t.weight, tuple(counts.items()))
        out.append(t)
    return tuple(out)
