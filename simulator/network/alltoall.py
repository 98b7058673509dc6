"""All-to-all collectives: ``direct`` (every ordered pair in one phase) and DeepSeek's
``hierarchical-a2a`` (rail hop and NVLink fan-out pipelined in one phase)."""

from __future__ import annotations

from collections.abc import Sequence

from simulator.network.phases import Transfer
from simulator.network.plans import CollectiveError, Phase, equal_split


def direct_a2a(members: Sequence[int], size: float) -> list[Phase]:
    n = len(members)
    if n < 2:
        return []
    chunk = size / n
    return [Phase(tuple(Transfer(s, d, chunk) for s in members for d in members if s != d), 1)]


def hierarchical_a2a(parts: list[list[int]], size: float, scaleout_fraction: float = 1.0) -> list[Phase]:
    """Rail hop and NVLink fan-out as one pipelined phase (module docstring); the rail
    carries ``scaleout_fraction`` of the ``k S/n`` routed copies bound for each domain."""
    if not equal_split(parts):
        raise CollectiveError(
            f"hierarchical-a2a needs the same number of members in every domain; got {[len(p) for p in parts]}"
        )
    m, k = len(parts), len(parts[0])
    n = m * k
    if m == 1:
        return direct_a2a(parts[0], size)
    chunk = size / n
    rail = scaleout_fraction * k * chunk
    transfers = []
    for d, dom in enumerate(parts):
        for i, src in enumerate(dom):
            for d2 in range(m):
                if d2 != d:
                    transfers.append(Transfer(src, parts[d2][i], rail))  # rail
            for j, dst in enumerate(dom):
                if j != i:
                    transfers.append(Transfer(src, dst, m * chunk))  # own + forwarded
    return [Phase(tuple(transfers), 2)]
