"""The summary's MoE compute terms: the kernels around the routed experts and the grouped
GEMMs' shape loss, per MoE layer and micro-batch (``summary.json`` ``moe_terms_s``;
docs/formats.md, docs/moe.md).

Each term is the roofline seconds (:func:`simulator.engine.compute.kernel_time_s`, launch
overhead included, before any sharing of the SMs with communication kernels) of the
kernels it names (:data:`workloads.moe_kernels.MOE_TERM_KERNELS`) in every phase a rank runs
them (forward, recomputation, backward), summed over the rank's compute ops and divided by
the MoE layer forwards it runs (one per MoE layer, MTP block included, chunk and
micro-batch), then averaged over the simulated ranks:

* ``routing``: router GEMM, score function and top-k, balance statistics, capacity
  dropping, the token-count histogram;
* ``permutation`` / ``unpermutation``: the token permutations before and after the expert
  all-to-alls (and the sorts by local expert);
* ``quantization``: under FP8 training, the passes quantising the routed experts' inputs
  and output gradients (:mod:`workloads.quantization`; 0 in BF16);
* ``grouped_gemm_shape_loss``: the routed experts' grouped GEMMs at their shape's
  efficiency minus the same GEMMs at the large-shape efficiency
  (:func:`simulator.engine.compute.grouped_gemm_shape_loss_s`);
* ``grouped_gemm_launches``: the GPU's per-kernel overhead of the routed experts' GEMMs
  beyond one launch each (``training.moe_expert_gemm: per-expert``, one GEMM per local
  expert: ``(groups - 1) x launch_overhead_s`` a GEMM; 0 for one grouped kernel). What their
  launches cost the host shows in ``host_exposed`` where the GPU waits for it;
* ``grouped_gemm``: the routed experts' grouped GEMMs themselves, for scale.
"""

from __future__ import annotations

from simulator.engine.compute import grouped_gemm_shape_loss_s, kernel_time_s
from workloads.moe_kernels import MOE_TERM_KERNELS

_SUFFIXES = (".bwd", ".dgrad", ".wgrad")
_TERM_OF = {name: term for term, names in MOE_TERM_KERNELS.items() for name in names}


def _base(name: str) -> str:
    """A kernel's forward name without its MTP prefix and gradient suffix."""
    if name.startswith("mtp") and "." in name:
        name = name.split(".", 1)[1]
    for s in _SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def _kernel_terms(k, chip, cal, dtype) -> tuple[str, float, float, float]:
    """``(term, seconds, shape loss, extra launches' overhead)`` of one kernel; ``term`` empty
    where it counts in none."""
    base = _base(k.name)
    term = _TERM_OF.get(base)
    grouped = k.kind == "gemm" and k.groups > 1
    if term is None and not grouped:
        return ("", 0.0, 0.0, 0.0)
    t = kernel_time_s(k, chip, cal, dtype)
    loss = grouped_gemm_shape_loss_s(k, chip, cal, dtype) if grouped else 0.0
    launches = (k.launches - 1) * cal.launch_overhead_s if grouped and k.recorded_s is None else 0.0
    return (term or "grouped_gemm", t, loss, launches)


def _group_terms(kernels, cache: dict, chip, cal, dtype) -> tuple[list, int]:
    """Of one kernel group (shared by many ops): its counted kernels' ``(term, seconds, shape
    loss, extra launches' overhead)`` in order, and how many of its kernels are routers."""
    terms, routers = [], 0
    for k in kernels:
        hit = cache.get(id(k))
        if hit is None or hit[0] is not k:
            hit = cache[id(k)] = (k, _kernel_terms(k, chip, cal, dtype))
        if hit[1][0]:
            terms.append(hit[1])
        routers += k.name.split(".")[-1] == "router"
    return terms, routers


def moe_compute_terms(trace, chip, cal, dtype: str) -> dict:
    """``{routing, permutation, unpermutation, quantization, grouped_gemm, grouped_gemm_shape_loss,
    grouped_gemm_launches}`` in
    seconds per MoE layer and micro-batch (module notes); empty for a dense model.

    Ops share kernel groups: each group's terms are worked out once, then added op by op in
    kernel order (the same additions as one kernel at a time)."""
    per_rank: dict[int, dict[str, float]] = {}
    layers: dict[int, int] = {}
    cache: dict[int, tuple] = {}  # id(kernel) -> (kernel, its terms)
    groups: dict[int, tuple] = {}  # id(kernel group) -> (group, its terms, its routers)
    for op in trace.ops:
        kernels = op.kernels
        if op.kind != "compute" or not kernels:
            continue
        acc = per_rank.get(op.rank)
        if acc is None:
            acc = per_rank[op.rank] = dict.fromkeys(
                (*MOE_TERM_KERNELS, "grouped_gemm", "grouped_gemm_shape_loss", "grouped_gemm_launches"), 0.0
            )
        g = groups.get(id(kernels))
        if g is None or g[0] is not kernels:
            g = groups[id(kernels)] = (kernels, *_group_terms(kernels, cache, chip, cal, dtype))
        for term, t, loss, launches in g[1]:
            acc[term] += t
            acc["grouped_gemm_shape_loss"] += loss
            acc["grouped_gemm_launches"] += launches
        if g[2] and op.phase == "F" and not op.recompute:
            layers[op.rank] = layers.get(op.rank, 0) + g[2]
    rows = [{t: v / layers[r] for t, v in acc.items()} for r, acc in per_rank.items() if layers.get(r)]
    if not rows:
        return {}
    return {t: sum(row[t] for row in rows) / len(rows) for t in rows[0]}
