"""One step run: the scenario loaded, the topology built (with its perturbations), the trace
built (one rank per class of ranks, or every device) and the engine run
(:func:`run_step`); :func:`load_engine` imports the engine's modules first. The facade
(:mod:`simulator.simulate`) and steady-state skipping (:mod:`simulator.steady`) both call it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from simulator.results.result import memory_columns

if TYPE_CHECKING:
    from simulator.scenario.resolved import Scenario
    from topologies.topology import Topology


def load_engine() -> float:
    """Import the engine's modules (first call in a process only: ~0.7 s, scipy and networkx
    mostly) and return the clock from which ``sim_wall_s`` counts, after them."""
    import simulator.engine.loop  # noqa: F401
    import simulator.scenario.checks  # noqa: F401
    import simulator.scenario.loading  # noqa: F401
    import topologies.presets  # noqa: F401
    import workloads.trace.builder  # noqa: F401

    return time.perf_counter()


def run_step(
    scenario, exact, topology, trace, progress, engine_options: Mapping | None = None, max_classes: int | None = None
):
    """Load, build and run one step: ``(scenario, topology, trace, raw run, memory columns)``;
    ``max_classes``: representative mode's rank budget (:func:`~simulator.engine.symmetry.class_budget`
    of this step's workload where None)."""
    from simulator.engine.compute import calibration_for
    from simulator.engine.loop import Engine
    from simulator.errors import StepsimError
    from simulator.scenario.checks import check_size
    from simulator.scenario.loading import load_scenario
    from simulator.scenario.resolved import Scenario
    from simulator.scenario.schema import ScenarioError
    from topologies.presets import build_cluster
    from workloads.trace.builder import build_trace

    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    try:
        topo = topology if topology is not None else build_cluster(sc.cluster)
        if topo.n_devices < sc.layout.world:
            raise ScenarioError(
                f"{topo.path or repr(topo.name)} has {topo.n_devices:,} devices; the scenario's layout needs "
                f"{sc.layout.world:,} (tp*cp*pp*dp)",
                field="topology",
            )
        topo = _perturb_links(topo, sc)
        workload = sc.workload()
        if trace is None:
            ranks = list(range(sc.layout.world)) if exact or _needs_exact(sc) else None
            if ranks is not None:
                check_size(sc.model, sc.layout, sc.training, sc.schedule, ranks=len(ranks))
            if ranks is None:  # where a stage's groups are unlike, one rank per class of them
                from simulator.engine.symmetry import representative_trace

                trace = representative_trace(workload, sc.layout, topo, max_classes)
            else:
                trace = build_trace(workload, ranks=ranks)
        else:
            from workloads.trace.io import check_trace_for

            check_trace_for(trace, sc)  # built for this scenario (ranks, fingerprint, model FLOPs)
    except ScenarioError:
        raise
    except StepsimError as err:  # a layout, schedule, trace or topology error: the field it names
        raise ScenarioError.from_error(err) from None
    chip = sc.cluster.chip
    cal = calibration_for(chip, dict(sc.compute_overrides))
    scale = {}
    for p in sc.perturbations:
        if p.devices is not None:
            for d in p.devices:
                scale[d] = p.compute_scale
    engine = Engine(
        trace,
        topo,
        sc.layout,
        chip,
        cal,
        network_cal=sc.network_calibration(),
        dtype=sc.training.dtype,
        compute_scale=scale,
        algorithms=dict(sc.algorithms),
        host_bw_bytes_per_s=sc.cluster.host_bw_bytes_per_s,
        host_launch_s=sc.training.launch_s(sc.cluster.chip.family),
        progress=progress,
        **(engine_options or {}),
    )
    raw = engine.run()
    return sc, topo, trace, raw, memory_columns(raw, trace, sc.layout)


def _needs_exact(sc: Scenario) -> bool:
    """Symmetry breaks under per-device perturbations: simulate every device."""
    return any(p.devices is not None for p in sc.perturbations) or any(p.link is not None for p in sc.perturbations)


def _perturb_links(topo: Topology, sc: Scenario) -> Topology:
    from simulator.scenario.schema import ScenarioError
    from topologies.errors import TopologyError

    for i, p in enumerate(sc.perturbations):
        if p.link is None:
            continue
        u, v = p.link
        try:
            topo = topo.without_link(u, v) if p.failed else topo.with_link_scaled(u, v, p.bw_scale)
        except TopologyError as err:
            raise ScenarioError(err.reason + _link_hint(topo, u, v), field=f"perturbations[{i}].link") from None
    return topo


def _link_hint(topo: Topology, u, v) -> str:
    """Which link ids exist next to ``u`` (or ``v``), for a perturbation naming a missing link."""
    G = topo.graph
    for end in (u, v):
        if end in G:
            near = sorted(map(str, G.neighbors(end)))
            return f"; {end!r} links to {', '.join(near[:8])}{' ...' if len(near) > 8 else ''}"
    return (
        f"; link ends are node ids such as {topo.devices[0]!r} (device 0) and its neighbours "
        f"{', '.join(sorted(map(str, G.neighbors(topo.devices[0])))[:4])} (`stepsim topology --save x.json` lists them)"
    )
