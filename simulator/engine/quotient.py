"""Symmetry quotient of twin traffic: a phase issued by every twin group at once, as
the representative's own transfers, each loading the links it crosses as many times
as its images cross them (see :mod:`simulator.engine.loop`). Pure functions of the
transfers and the network's routes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from simulator.network.flows import FlowNetwork, Transfer

#: Twin sends quotiented through :func:`quotient_phase` (Transfer objects) up to this
#: many pairs; more go straight from the pair arrays (``Lowering._pair_quotient``).
SMALL_TWINS = 64


def quotient_plan(net: FlowNetwork, rep, twins: list, stats: dict):
    """``rep`` with each transfer carrying the multiplicities of its twin images
    (a plan of the same phases), or None where the twins do not line up; ``stats``
    counts quotients and fallbacks."""
    if not any(p is rep for p in twins):
        stats["fallback"] += 1
        return None
    n = len(rep.phases)
    if any(p.algorithm != rep.algorithm or len(p.phases) != n for p in twins):
        stats["fallback"] += 1
        return None
    phases = []
    for i, ph in enumerate(rep.phases):
        others = [p.phases[i] for p in twins]
        if any(
            q.steps != ph.steps or q.compute_bytes != ph.compute_bytes or q.in_network != ph.in_network for q in others
        ):
            stats["fallback"] += 1
            return None
        transfers = quotient_phase(net, ph.transfers, [q.transfers for q in others], stats)
        if transfers is None:
            return None
        phases.append(ph if transfers is ph.transfers else replace(ph, transfers=transfers))
    return replace(rep, phases=tuple(phases))


def quotient_phase(net: FlowNetwork, rep: tuple, twins: list, stats: dict) -> tuple | None:
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
        stats["fallback"] += 1
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
        stats["fallback"] += 1
        return None
    cls = np.broadcast_to(np.arange(k), src.shape)
    q = image_quotient(
        net,
        rep,
        cls.ravel(),
        src.ravel(),
        dst.ravel(),
        latency="equal",
        image_of=np.repeat(np.arange(len(twins)), k),
    )
    if q is None:
        stats["fallback"] += 1
        return None
    stats["quotient"] += 1
    return rep if all(a is b for a, b in zip(q, rep)) else q


def image_quotient(
    net: FlowNetwork,
    rep: tuple,
    cls: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    latency: str,
    image_of: np.ndarray | None = None,
) -> tuple | None:
    """``rep``'s transfers, each with incidence counting the images of it that cross
    the links ``U`` its transfers cross (see :func:`quotient_phase`).

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
        assert image_of is not None, 'latency "equal" needs image_of'
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


def bundle(transfers: tuple) -> Transfer:
    """One flow for ``transfers`` (of one size and one latency) that the max-min problem
    gives one rate: weight the sum of theirs, each link loaded as all of them load it at
    that rate (multiplicity: their summed ``weight x multiplicity`` over the new weight);
    ``src -> dst`` the first's."""
    w = sum(t.weight for t in transfers)
    load: dict = {}
    for t in transfers:
        for lk, m in t.incidence:
            load[lk] = load.get(lk, 0.0) + t.weight * m
    return replace(transfers[0], weight=w, incidence=tuple((lk, x / w) for lk, x in load.items()))
