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


# ---- closed forms: one all-to-all alone on the network (see reductions.py's) ----------------


def direct_a2a_time(
    n: int, k_min: int, k_max: int, up_bw: float, out_bw: float, latency_s: float, scaleout_fraction: float = 1.0
) -> tuple[float, float]:
    """:func:`direct_a2a` over ``n`` members, ``k_min`` to ``k_max`` in one scale-up domain: a
    device in the smallest part sends ``(n-k_min)/n`` of its buffer over its NIC
    (``scaleout_fraction`` of it under node-limited routing), one in the largest ``(k_max-1)/n``
    over the domain links, all at once, so the slowest leg sets the time (``k_min = n``: inside
    one domain)."""
    if k_min >= n:
        return (n - 1) / n / up_bw, latency_s
    return max(scaleout_fraction * (n - k_min) / n / out_bw, (k_max - 1) / n / up_bw), latency_s


def hierarchical_a2a_time(
    nd: int, k: int, up_bw: float, out_bw: float, latency_s: float, scaleout_fraction: float = 1.0
) -> tuple[float, float]:
    """:func:`hierarchical_a2a` over ``nd`` domains of ``k``: the rail leg (``(nd-1)/nd`` of the
    buffer, ``scaleout_fraction`` of it) and the domain fan-out (``(k-1)/k``) in one phase."""
    return max(scaleout_fraction * (nd - 1) / nd / out_bw, (k - 1) / k / up_bw), latency_s
