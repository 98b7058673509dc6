"""The array pass over a flow network's link table finds the same link-sharing
components, in the same canonical order, as the breadth-first search over its
link -> flows sets (simulator/network/components.py)."""

import numpy as np
import pytest

from simulator.network.components import bounded_search, canonical, components_of


def _network(rng, n_slots, n_links, width, free_frac):
    """A random flow table: slots with routes of 1..width links, some slots free."""
    tab = np.full((n_slots + 5, width), -1, dtype=np.int32)
    batch = np.full(n_slots + 5, -1, dtype=np.int64)
    links, lf = [], {}
    for s in range(n_slots):
        route = tuple(int(x) for x in rng.choice(n_links, size=int(rng.integers(1, width + 1)), replace=False))
        links.append(route)
        if rng.random() < free_frac:
            continue
        batch[s] = int(rng.integers(0, 3))
        tab[s, : len(route)] = route
        for lk in route:
            lf.setdefault(lk, set()).add(s)
    seq = rng.permutation(n_slots + 5).astype(np.int64)
    return tab, batch, links, lf, seq


@pytest.mark.parametrize("seed", range(20))
def test_array_pass_matches_search(seed):
    rng = np.random.default_rng(seed)
    n_slots, n_links = int(rng.integers(1, 300)), int(rng.integers(2, 400))
    tab, batch, links, lf, seq = _network(rng, n_slots, n_links, 4, 0.3)
    seeds = [int(x) for x in rng.integers(0, n_links, size=int(rng.integers(0, 60)))]
    found = bounded_search(lf, links, seeds, budget=10**9)
    want = canonical(*found, seq)
    got = components_of(tab, batch, n_slots, n_links, seeds, seq)
    assert got == want
    comps, singles = got
    assert all(len(c) >= 2 for c in comps)
    flat = [s for c in comps for s in c] + singles
    assert len(flat) == len(set(flat)) and all(batch[s] != -1 for s in flat)


def test_search_gives_up_past_its_budget():
    chain = {lk: {lk, lk + 1} for lk in range(50)}  # link l carries flows l and l+1: one chain
    links = [(0,)] + [(f - 1, f) for f in range(1, 50)] + [(49,)]
    assert bounded_search(chain, links, [0], budget=10) is None
    comps, singles = bounded_search(chain, links, [0], budget=100)
    assert singles == [] and sorted(comps[0]) == list(range(51))
