"""The counters a :class:`~simulator.network.flows.FlowNetwork` keeps (bytes per link, events, solves)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simulator.errors import NetworkError


@dataclass
class NetworkStats:
    """Counters of a :class:`FlowNetwork`.

    ``link_bytes[l]`` is the number of bytes carried by directed link ``l`` by the
    flows completed so far (a flow's bytes are counted when it completes); divide
    by ``link_capacity * elapsed`` (see :meth:`utilisation`) for its average
    utilisation.

    ``flows_started`` counts network transfers handed to ``transfer`` (after
    dropping local and empty ones), ``flow_rows_started`` the flows they became
    after merging identical transfers, ``unit_flows_started`` the sum of weights.
    ``recomputations`` counts instants at which some rates were recomputed,
    ``components_solved`` the max-min problems solved then and
    ``flows_recomputed`` the flows in them; ``wakeups`` counts completion events;
    ``reserved_phases`` the phases run alone on their links from their cached
    evolution (some of them later materialised into flows), ``split_materialisations``
    the times some of a reserved big phase's components were materialised and not all;
    ``instants_ahead`` the completion instants of big components computed ahead
    (:mod:`simulator.network.runahead`), which the counters above include.
    """

    link_bytes: np.ndarray
    recomputations: int = 0
    flows_started: int = 0  # network transfers (before merging identical ones)
    unit_flows_started: int = 0  # sum of weights
    phases_started: int = 0
    max_concurrent_flows: int = 0  # flows (merged rows) in flight at once
    link_capacity: np.ndarray = field(default_factory=lambda: np.zeros(0))
    flow_rows_started: int = 0
    components_solved: int = 0
    flows_recomputed: int = 0
    wakeups: int = 0
    reserved_phases: int = 0  # phases run alone on their links (cached evolution)
    split_materialisations: int = 0  # reserved big phases materialised in part (by component)
    instants_ahead: int = 0  # completion instants of big components computed ahead (chains)

    def utilisation(self, elapsed_s: float) -> np.ndarray:
        """Average fraction of (calibrated) capacity used on each link over ``elapsed_s``."""
        if not elapsed_s > 0:
            raise NetworkError(f"elapsed_s must be > 0, got {elapsed_s!r}")
        return self.link_bytes / (self.link_capacity * elapsed_s)
