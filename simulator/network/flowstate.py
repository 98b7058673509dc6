"""The state a :class:`~simulator.network.flows.FlowNetwork` shares with its two halves,
:class:`~simulator.network.flowslots.FlowSlots` (the in-flight flows' slot arrays) and
:class:`~simulator.network.isolated.Reservations` (phases alone on their links): declared
once here, so that each half says what it reads of the whole and a type checker holds it.
Declarations only: the values are set by ``FlowNetwork.__init__`` and the halves' ``_init_*``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

from simulator.network.stats import NetworkStats


class FlowState:
    """What the network's parts read and write of one another (see the module doc)."""

    env: simpy.Environment
    stats: NetworkStats
    capacity: np.ndarray  # bytes/s of each link, after its efficiency
    # arrivals and completions since the last rate update
    _new: list[int]
    _new_phases: list
    _dirty: list[int]
    # per phase id: flows left, and the event its waiter holds
    _phase_left: dict[int, int]
    _phase_event: dict[int, simpy.Event]
    # per slot: bytes left at _t0, the rate, the completion time; per link: its active slots
    _rem: np.ndarray
    _t0: np.ndarray
    _rate: np.ndarray
    _end: np.ndarray
    _link_flows: dict[int, set[int]]
    # the network's own methods each half calls
    _request_update: Callable[[], None]
    _arrive: Callable[..., None]
    _insert: Callable[..., np.ndarray]
    _release: Callable[..., None]
    _flow_ids: Callable[..., np.ndarray]
