"""The one entry point: ``simulate(scenario) -> Result``.

``import simulator`` imports this module, so it imports the engine, the scenario
schema, the topologies and the trace builder (simpy, scipy, networkx, pydantic) when
:func:`simulate` first runs, not at import.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.results.result import Result
from simulator.results.summary import summarise
from simulator.step import load_engine, run_step

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from simulator.scenario.resolved import Scenario
    from topologies.topology import Topology


def simulate(
    scenario: Scenario | str | Path | Mapping,
    exact: bool = False,
    topology: Topology | None = None,
    trace=None,
    progress: bool | None = False,
    twin_quotient: bool = True,
    chain_ops: bool = True,
    private_phases: bool = True,
    steady_state: bool = False,
) -> Result:
    """Simulate one training step.

    ``scenario`` is a :class:`Scenario`, a path to a YAML/JSON scenario file, or a
    mapping in that format. ``exact=True`` simulates every device and every
    transfer instead of one representative rank per pipeline stage (slow; used to
    check the fast path). ``topology`` replaces the cluster's network graph (for
    a topology loaded from a file). ``trace`` (a :class:`~workloads.trace.ops.Trace`,
    e.g. from :func:`workloads.trace.io.read_trace`) replaces the trace the
    scenario would generate: edit a written trace and simulate it again.
    ``progress``: a progress bar on stderr (``None``: only when it is a terminal).
    ``twin_quotient=False`` injects every twin of a representative rank's collectives and
    sends instead of their symmetry quotient (the same answer, slower; tests compare the two).
    ``chain_ops=False`` gives every op its own simpy event and ``private_phases=False``
    sends every communication op through the flow network (see
    :class:`simulator.engine.loop.Engine`): the same answer to the bit, slower.
    ``steady_state=True`` skips ahead from a shorter run where the schedule's steady phase
    provably repeats (:mod:`simulator.steady`: the same summary to ~1e-12, several times
    faster on long pipelines; no op-level tables), and simulates
    every micro-batch where it does not; ``exact``, ``trace`` and ``topology`` imply the
    full simulation.

    Raises :class:`ScenarioError` (a ``ValueError``) naming the offending field.
    """
    # The run allocates millions of short-lived objects (ops, events, records), few of
    # them in reference cycles; pausing the cyclic collector for its duration saves
    # ~15% of the wall time (DeepSeek-V3 on 2,048 H800: 9.5 -> 7.3 s, 409 MB peak
    # either way; the 98,304-device MoE benchmark peaks at 2.2 GB instead of 1.8 GB).
    # Reference counting still frees everything not in a cycle; the collector resumes
    # afterwards and takes the rest. Before it resumes, every object it tracks moves to
    # its oldest generation (``gc.freeze()`` then ``gc.unfreeze()``: two list splices):
    # else the first young collection would walk the run's millions of surviving objects
    # (the trace, the records) at once, 1.9 s of a 41 s korthikanti22-1t case. They are
    # long-lived, and a full collection still takes whatever cycles the run left.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        options = dict(twin_quotient=twin_quotient, chain_ops=chain_ops, private_phases=private_phases)
        if steady_state and not exact and topology is None and trace is None:
            from simulator.errors import StepsimError
            from simulator.scenario.loading import load_scenario
            from simulator.scenario.resolved import Scenario
            from simulator.steady import simulate_steady

            sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
            tried: list[int] = []  # the runs a try simulated (micro-batches)
            tried_s = 0.0
            if not sc.perturbations:
                t0 = time.perf_counter()
                try:
                    res = simulate_steady(sc, progress, options, tried)
                except StepsimError as err:  # a bad scenario: the full simulation names the field
                    if err.field == "step_time_s":  # the extended step is out of range: so is the full one
                        raise
                    res = None
                if res is not None:
                    return res
                tried_s = time.perf_counter() - t0
            res = _simulate(sc, exact, topology, trace, progress, options)
            if tried:  # the try that did not certify is part of the simulation's time
                res.summary["steady_state_try"] = {"micro_batches_simulated": tried, "wall_s": tried_s}
                res.summary["sim_wall_s"] += tried_s
            return res
        return _simulate(scenario, exact, topology, trace, progress, options)
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:  # nobody else's frozen objects to thaw
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _simulate(scenario, exact, topology, trace, progress, engine_options: Mapping | None = None) -> Result:
    t0 = load_engine()
    sc, topo, trace, raw, mem = run_step(scenario, exact, topology, trace, progress, engine_options)
    summary, per_stage = summarise(sc, trace, raw, mem, topo)
    from simulator.scenario.checks import check_step_time

    check_step_time(summary["step_time_s"])
    summary["sim_wall_s"] = time.perf_counter() - t0
    # the events table is built from raw.records when first asked for
    return Result(
        summary=summary,
        scenario=sc,
        notes=list(summary["notes"]),
        raw=raw,
        trace=trace,
        topology=topo,
        columns={"memory": mem, "per_stage": per_stage},
    )
