"""The closed-form columns of the map: the memory side of a batch-global auxiliary loss
(:func:`aux_global_memory`) and a roofline of what pipeline parallelism saves against what it
costs (:func:`roofline`, :func:`dp_traffic_s`).
"""

from __future__ import annotations

from collections.abc import Mapping

from simulator.scenario.loading import load_scenario
from simulator.studies.search.estimate import estimate_memory
from simulator.studies.search.layouts import (
    candidate_mapping,
)
from simulator.studies.search.network_model import NetModel
from workloads import memory

# ---- the memory side: a batch-global auxiliary loss ------------------------------------------


def aux_global_memory(point: Mapping, best_pp: Mapping | None) -> dict:
    """For the best PP layout: its estimated peak memory under a batch-global auxiliary
    loss (``balance: aux-loss-global``: every forward before any backward, so every
    micro-batch's activations are stashed at once) against auxiliary-loss-free balancing
    (the map's own runs). Closed form (:func:`simulator.studies.search.estimate.estimate_memory`);
    the simulator runs it under every schedule, DualPipe included (all forwards first, so
    DualPipe's pairs cannot form)."""
    if best_pp is None:
        return {"aux_free_peak_bytes": None, "aux_global_peak_bytes": None, "aux_global_fits": None}
    mapping = candidate_mapping(point["scenario"], best_pp, point["id"])
    free = estimate_memory(load_scenario(mapping))["total"]
    glob = load_scenario({**mapping, "training": {**mapping["training"], "balance": "aux-loss-global"}})
    g = estimate_memory(glob)["total"]
    return {
        "aux_free_peak_bytes": free,
        "aux_global_peak_bytes": g,
        "aux_global_fits": bool(g <= glob.cluster.chip.hbm_bytes),
    }


# ---- the roofline ------------------------------------------------------------------------------


def dp_traffic_s(sc, net: NetModel | None = None) -> float:
    """Seconds one step's data-parallel traffic takes alone on the network, no overlap
    ("How to Scale Your Model"'s DP term): each gradient reduction (fp32; all-reduce under
    ZeRO-0, reduce-scatter otherwise; once a step, every micro-batch under ZeRO-2/3) and
    parameter all-gather (bf16; once under ZeRO-1/2, forward and backward of every
    micro-batch under ZeRO-3) of the parameters rank 0 holds, over its dense (``dp_cp``)
    and expert (``edp``) groups, costed by the estimate's :class:`NetModel`."""
    L, t, model = sc.layout, sc.training, sc.model
    net = net if net is not None else NetModel(sc.cluster, sc.network_calibration(), sc.algorithms)
    dense, expert = memory.rank_parameter_counts(model, L, range(model.layers), True, True)
    dense, expert = dense / L.pp, expert / L.pp  # one stage's share
    m = t.micro_batches(L.dp)
    groups = ((L.group(0, "dp_cp"), dense), (L.group(0, "edp"), expert))
    grad_op = "all-reduce" if L.zero == 0 else "reduce-scatter"
    n_red = m if L.zero >= 2 else 1
    n_gather = 2 * m if L.zero == 3 else (1 if L.zero >= 1 else 0)
    total = 0.0
    for g, n in groups:
        total += n_red * net.time_s(grad_op, g, n * t.grad_bytes)
        total += n_gather * net.time_s("all-gather", g, n * 2)
    return total


def roofline(point: Mapping, best_pp: Mapping | None, best_nopp: Mapping | None) -> dict:
    """The roofline view of the two best layouts: per layout, compute per step (the
    estimate's roofline compute of the slowest rank plus its closed-form bubble) against
    the DP traffic alone (:func:`dp_traffic_s`); the roofline step is their maximum, and
    ``roof_ratio`` the no-PP layout's roofline step over the better of the two."""
    from simulator.studies.search.estimate import estimate_step_time

    rec = {}
    steps = {}
    for tag, b in (("pp", best_pp), ("nopp", best_nopp)):
        if b is None:
            rec.update({f"roof_{tag}_compute_s": None, f"roof_{tag}_dp_s": None, f"roof_{tag}_ep_s": None})
            continue
        sc = load_scenario(candidate_mapping(point["scenario"], b, point["id"]))
        est = estimate_step_time(sc)
        comp = est["compute_s"] + est["bubble_s"]
        dp = dp_traffic_s(sc)
        rec.update({f"roof_{tag}_compute_s": comp, f"roof_{tag}_dp_s": dp, f"roof_{tag}_ep_s": est["ep_s"]})
        steps[tag] = max(comp, dp)
    rec["roof_ratio"] = (steps["nopp"] / min(steps.values())) if "nopp" in steps else None
    return rec
