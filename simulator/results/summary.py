"""The summary record of one step (``docs/scenario.md``: key order as written) and the
per-stage table, from the engine's raw run: step time, MFU and HFU, bubbles and exposed
communication averaged as ``--exact`` averages them, peak and reserved memory with their
breakdown, the MoE terms and the host (:func:`summarise`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simulator.results.result import PER_STAGE_COLUMNS, SCHEMA_VERSION, Columns
from simulator.version import __version__
from workloads.trace.ops import MEMORY_CATEGORIES

if TYPE_CHECKING:
    from simulator.scenario.resolved import Scenario
    from topologies.topology import Topology


def summarise(sc: Scenario, trace, raw, mem: Columns, topo: Topology | None = None) -> tuple[dict, Columns]:
    """The summary record (``docs/scenario.md``, key order as written) and the per-stage table.
    With ``topo``, a representative run's notes say where its groups break the symmetry it
    assumes (:func:`~simulator.engine.symmetry.symmetry_note`)."""
    from simulator.engine.symmetry import symmetry_note
    from topologies.placement import domain_usage
    from workloads import parameters

    L, chip, t = sc.layout, sc.cluster.chip, sc.training
    step = raw.step_time_s
    devices = sc.cluster.devices
    model_flops = trace.model_flops
    denom = devices * chip.peak("bf16") * step if step > 0 else float("nan")
    acc = raw.account
    mean, top = _device_mean_and_max(acc, trace)
    bubble, exposed = mean(acc.bubble_s), mean(acc.exposed_s)
    i, memory_keys, reserved_keys = _memory_keys(mem, chip, t)
    per_stage = _per_stage(acc, L, mem, step, [trace.weight[r] for r in acc.ranks])
    usage = domain_usage(sc.cluster)
    summary = {
        "schema_version": SCHEMA_VERSION,
        "name": sc.name,
        "devices": devices,
        # Main-model totals, as published (DeepSeek-V3: 671B / 37B); MTP modules separately.
        "parameters": int(parameters.parameter_count(sc.model, include_mtp=False)),
        "active_parameters": int(parameters.active_parameter_count(sc.model, include_mtp=False)),
        "step_time_s": step,
        "tokens_per_s": t.tokens_per_step / step if step > 0 else float("nan"),
        "model_flops_per_step": model_flops,
        "mfu": model_flops / denom,
        "hfu": _executed_flops(trace, raw) / denom,
        "model_tflops_per_device": model_flops / devices / step / 1e12 if step > 0 else float("nan"),
        "bubble_fraction": bubble / step if step > 0 else 0.0,
        "exposed_comm_fraction": exposed / step if step > 0 else 0.0,
        **memory_keys,  # peak_memory_bytes, memory_breakdown_bytes, hbm_bytes, oom
        # --- extensions (format version 1 allows added keys) ---
        "mtp_parameters": int(
            parameters.parameter_count(sc.model) - parameters.parameter_count(sc.model, include_mtp=False)
        ),
        "schedule": sc.schedule,
        "schedule_enforced": "all-forward-first" if any("all-forward-first" in n for n in trace.notes) else None,
        "micro_batches": t.micro_batches(L.dp),
        "layout": {k: getattr(L, k) for k in ("tp", "cp", "pp", "dp", "ep", "vpp", "etp", "zero")},
        # Scale-up domains used and the devices left idle in them (switched networks; None on
        # a torus), and the throughput per domain used: a layout that leaves 8 of an NVL72
        # rack's 72 GPUs idle is compared per rack as well as per GPU.
        "placement": usage.as_dict() if usage is not None else None,
        "tokens_per_s_per_domain": (
            t.tokens_per_step / step / usage.domains if usage is not None and step > 0 else None
        ),
        "peak_memory_stage": int(L.stage_of(int(mem["rank"][i]))),
        **reserved_keys,  # reserved_memory_bytes, allocator_reserve_fraction
        "peak_activation_bytes": float(mem["activations"].max()),
        "peak_model_state_bytes": float((mem["weights"] + mem["gradients"] + mem["optimizer"]).max()),
        "bubble_time_per_stage_s": [float(x) for x in per_stage["bubble_s"]],
        "exposed_comm_time_per_stage_s": [float(x) for x in per_stage["exposed_comm_s"]],
        **_idle_accounting(acc, mean, top, step, per_stage),
        "simulated_ranks": len(trace.ranks),
        "exact": not trace.representative,
        "events_processed": raw.events_processed,
        "steady_state": None,
        "steady_state_try": None,
        "notes": list(trace.notes)
        + (symmetry_note(sc.layout, topo, len(trace.ranks)) if topo is not None and trace.representative else []),
        "stepsim_version": __version__,
        "sim_wall_s": 0.0,
    }
    from simulator.engine.compute import calibration_for
    from simulator.results.moe_terms import moe_compute_terms

    terms = moe_compute_terms(trace, chip, calibration_for(chip, dict(sc.compute_overrides)), t.dtype)
    if terms:  # routing, permutation, grouped-GEMM shape loss per MoE layer and micro-batch
        summary.setdefault("moe_terms_s", {}).update(terms)
    terms = host_and_overlap_terms(trace, raw)
    if terms:  # per MoE layer and micro-batch (docs/formats.md), beside other engineers' terms
        summary.setdefault("moe_terms_s", {}).update(terms)
    return summary, per_stage


def _memory_keys(mem: Columns, chip, t) -> tuple[int, dict, dict]:
    """The memory table's row of the allocated peak (over devices and time), the summary's
    memory keys at it, and the reserved peak's keys: reserved = allocated + the caching
    allocator's reserve on the bytes allocated and freed within the step (workloads.memory,
    "Memory as allocated"); out of memory is judged on the reserved peak."""
    i = int(mem["total"].argmax())
    fraction = t.reserve_fraction(chip.family)
    reserve = fraction * (np.asarray(mem["activations"], dtype=float) + np.asarray(mem["buffers"], dtype=float))
    reserved = float((np.asarray(mem["total"], dtype=float) + reserve).max())
    keys = {
        "peak_memory_bytes": float(mem["total"][i]),
        "memory_breakdown_bytes": {
            **{c: float(mem[c][i]) for c in MEMORY_CATEGORIES},
            "allocator_reserve": float(reserve[i]),
        },
        "hbm_bytes": chip.hbm_bytes,
        "oom": bool(reserved > chip.hbm_bytes),
    }
    return i, keys, {"reserved_memory_bytes": reserved, "allocator_reserve_fraction": fraction}


def host_and_overlap_terms(trace, raw, extra: dict | None = None) -> dict:
    """Per MoE layer and micro-batch (a forward dispatch of a rank), means over the simulated
    ranks: ``host_exposed`` the seconds the GPU waited for its host to issue that layer's ops
    (forward, recomputation and backward; simulator.engine.host) and ``ep_comm_hidden`` the
    seconds of the rank's expert all-to-alls that ran while its compute stream was busy (busy
    minus exposed over the ``ep*`` axes: what the overlaps in force hide). Empty without
    expert all-to-alls. ``extra``: rank -> forward dispatches a step has beyond the trace's (a
    steady-state step's inserted periods)."""
    acc = raw.account
    layers: dict[int, set] = {}
    for op in trace.ops:
        if op.kind == "collective" and op.phase == "F" and op.name.endswith(".dispatch"):
            layers.setdefault(op.rank, set()).add((op.layer, op.mb, op.chunk))
    if not layers or acc is None:
        return {}
    host, hidden = [], []
    for i, r in enumerate(acc.ranks):
        n = len(layers.get(r, ())) + (extra or {}).get(r, 0)
        if not n:
            continue
        moe = {l for l, _, _ in layers[r]}
        host.append(sum(v for (rr, l), v in raw.host_delay_s.items() if rr == r and l in moe) / n)
        cols = [j for j, a in enumerate(acc.axes) if a.startswith("ep")]
        hidden.append(float(sum(acc.busy_by_axis_s[i, j] - acc.exposed_by_axis_s[i, j] for j in cols)) / n)
    if not host:
        return {}
    return {"host_exposed": sum(host) / len(host), "ep_comm_hidden": sum(hidden) / len(hidden)}


def _executed_flops(trace, raw) -> float:
    """Executed matmul FLOPs over all devices (each simulated rank stands for weight[r] devices).

    Only matmul kinds count, matching the model-FLOPs convention (workloads.kernels.MATMUL_KINDS).
    Under expert-load imbalance a rank is timed at its layer's slowest EP rank's load
    but the devices it stands for execute their own loads: the difference
    (trace.unexecuted_flops) is not hardware work, so HFU never rises because one
    hot rank makes the others wait."""
    return sum(trace.weight[r] * (f - trace.unexecuted_flops.get(r, 0.0)) for r, f in raw.matmul_flops.items())


def _device_mean_and_max(acc, trace):
    """Where each device's step goes (simulator.engine.accounting): compute + exposed communication
    + offload wait + bubble = step on every rank. ``mean(x)`` weighs each simulated rank by the
    devices it stands for; ``top(x)`` is the maximum over devices."""
    w = np.array([trace.weight[r] for r in acc.ranks], dtype=float)

    def mean(x):
        return float(w @ x / w.sum()) if len(w) else 0.0

    def top(x):
        return float(x.max()) if len(x) else 0.0

    return mean, top


def _idle_accounting(acc, mean, top, step: float, per_stage: Columns) -> dict:
    """The summary's communication and idle-time keys, in the record's order: busy and exposed
    time per axis (the host link as 'offload'), then mean and max over devices of compute,
    bubble, exposed communication and offload wait."""
    busy_cols = {a: acc.busy_by_axis_s[:, j] for j, a in enumerate(acc.axes)}
    if acc.offload_busy_s.any():
        busy_cols["offload"] = acc.offload_busy_s
    busy_cols = dict(sorted(busy_cols.items()))
    exp_cols = {a: acc.exposed_by_axis_s[:, j] for j, a in enumerate(acc.axes) if acc.exposed_by_axis_s[:, j].any()}
    return {
        "comm_time_by_axis_s": {a: mean(x) for a, x in busy_cols.items()},
        "exposed_comm_by_axis_s": {a: mean(x) for a, x in exp_cols.items()},
        # --- idle-time accounting: mean and max over devices (simulator.engine.accounting) ---
        "compute_time_s_mean": mean(acc.compute_s),
        "compute_time_s_max": top(acc.compute_s),
        "bubble_s_mean": mean(acc.bubble_s),
        "bubble_s_max": top(acc.bubble_s),
        "exposed_comm_s_mean": mean(acc.exposed_s),
        "exposed_comm_s_max": top(acc.exposed_s),
        "offload_wait_s": mean(acc.offload_wait_s),
        "offload_wait_s_max": top(acc.offload_wait_s),
        "offload_wait_fraction": mean(acc.offload_wait_s) / step if step > 0 else 0.0,
        "offload_wait_time_per_stage_s": [float(x) for x in per_stage["offload_wait_s"]],
        "comm_time_by_axis_s_max": {a: top(x) for a, x in busy_cols.items()},
        "exposed_comm_by_axis_s_max": {a: top(x) for a, x in exp_cols.items()},
    }


def _per_stage(acc, layout, mem: Columns, step: float, weight: list) -> Columns:
    """The per-stage table (``Result.per_stage``): means over each stage's devices, the
    stage's peak memory, and the bubble and exposed fractions of the step. Each simulated
    rank stands for ``weight`` devices (its class's, :func:`simulator.engine.symmetry.
    class_ranks`); where a stage's ranks stand for as many devices each, the means are sums
    by ``np.add.reduceat`` over the ranks in stage order divided by the count (what pandas'
    grouped mean computes: the same bits as when this table was a groupby), else sums of
    ``weight * x`` divided by the weights'."""
    ranks = np.asarray(acc.ranks, dtype=np.int64)
    stage = np.array([layout.stage_of(int(r)) for r in ranks], dtype=np.int64)
    order = np.argsort(stage, kind="stable")
    stages, starts, sizes = np.unique(stage[order], return_index=True, return_counts=True)
    w = np.asarray(weight, dtype=float)[order]
    alike = len(w) == 0 or bool((np.fmax.reduceat(w, starts) == np.fmin.reduceat(w, starts)).all())

    def means(values) -> np.ndarray:
        v = np.asarray(values, dtype=float)[order]
        if not len(v):
            return np.zeros(0)
        if alike:
            return np.add.reduceat(v, starts) / sizes
        return np.add.reduceat(w * v, starts) / np.add.reduceat(w, starts)

    # each rank's peak over time, then the highest of its stage
    peak_of = {}
    for r, t in zip(mem["rank"].tolist(), mem["total"].tolist()):
        if r not in peak_of or t > peak_of[r]:
            peak_of[r] = t
    peaks = np.array([peak_of.get(int(r), np.nan) for r in ranks[order]], dtype=float)
    cols = {
        "stage": stages,
        "bubble_s": means(acc.bubble_s),
        "exposed_comm_s": means(acc.exposed_s),
        "peak_memory_bytes": np.fmax.reduceat(peaks, starts) if len(peaks) else np.zeros(0),
        "compute_s": means(acc.compute_s),
        "offload_wait_s": means(acc.offload_wait_s),
    }
    cols = {c: cols[c] for c in PER_STAGE_COLUMNS}
    if step > 0:
        cols["bubble_fraction"] = cols["bubble_s"] / step
        cols["exposed_comm_fraction"] = cols["exposed_comm_s"] / step
    return cols
