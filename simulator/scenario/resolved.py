"""The resolved scenario: :class:`Scenario`, the frozen value every later layer reads.

:func:`simulator.scenario.loading.load_scenario` builds it from a validated file; it holds
the specs of :mod:`workloads` and :mod:`topologies` plus the scenario's calibration
overrides, and builds the :class:`workloads.trace.shared.Workload` it describes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.scenario.schema import PerturbationIn
from topologies.networks import ClusterSpec
from workloads.layout import ParallelLayout
from workloads.model import ModelSpec
from workloads.moe_load import ExpertLoad
from workloads.training import TrainingSpec


@dataclass(frozen=True)
class Scenario:
    """A validated scenario: frozen specs, ready for :func:`simulator.simulate`."""

    name: str
    model: ModelSpec
    cluster: ClusterSpec
    layout: ParallelLayout
    schedule: str
    training: TrainingSpec
    perturbations: tuple[PerturbationIn, ...] = ()
    compute_overrides: tuple[tuple[str, float], ...] = ()
    network_overrides: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()  # network_calibration
    algorithms: tuple[tuple[str, str], ...] = ()
    expert_load: ExpertLoad | None = None
    source: Any = None  # the raw mapping it was loaded from

    @property
    def devices(self) -> int:
        return self.cluster.devices

    def network_calibration(self):
        """The chip family's :class:`simulator.network.calibration.NetCalibration` with the scenario's
        ``network_calibration`` entries applied."""
        from simulator.network.calibration import default_calibration

        cal = default_calibration(self.cluster.chip.family)
        return cal.with_overrides(**{k: dict(v) for k, v in self.network_overrides}) if self.network_overrides else cal

    def workload(self):
        """The :class:`workloads.trace.shared.Workload` this scenario describes."""
        from workloads.trace.shared import Workload

        net = self.cluster.network
        domain = net.domain_size if getattr(net, "kind", "") == "switched" else 0
        return Workload(
            self.model,
            self.layout,
            self.training,
            self.schedule,
            expert_load=self.expert_load,
            domain_size=domain,
            chip_family=self.cluster.chip.family,
        )
