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
* ``grouped_gemm_shape_loss``: the routed experts' grouped GEMMs at their shape's
  efficiency minus the same GEMMs at the large-shape efficiency
  (:func:`simulator.engine.compute.grouped_gemm_shape_loss_s`);
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


def moe_compute_terms(trace, chip, cal, dtype: str) -> dict:
    """``{routing, permutation, unpermutation, grouped_gemm, grouped_gemm_shape_loss}`` in
    seconds per MoE layer and micro-batch (module notes); empty for a dense model."""
    per_rank: dict[int, dict[str, float]] = {}
    layers: dict[int, int] = {}
    cache: dict[int, tuple[str, float, float]] = {}
    for op in trace.ops:
        if op.kind != "compute" or not op.kernels:
            continue
        acc = per_rank.setdefault(op.rank, dict.fromkeys((*MOE_TERM_KERNELS, "grouped_gemm"), 0.0))
        acc.setdefault("grouped_gemm_shape_loss", 0.0)
        for k in op.kernels:
            hit = cache.get(id(k))
            if hit is None:
                base = _base(k.name)
                term = _TERM_OF.get(base)
                grouped = k.kind == "gemm" and k.groups > 1
                if term is None and not grouped:
                    hit = ("", 0.0, 0.0)
                else:
                    t = kernel_time_s(k, chip, cal, dtype)
                    loss = grouped_gemm_shape_loss_s(k, chip, cal, dtype) if grouped else 0.0
                    hit = (term or "grouped_gemm", t, loss)
                cache[id(k)] = hit
            term, t, loss = hit
            if term:
                acc[term] += t
                acc["grouped_gemm_shape_loss"] += loss
            if k.name.split(".")[-1] == "router" and op.phase == "F" and not op.recompute:
                layers[op.rank] = layers.get(op.rank, 0) + 1
    rows = [{t: v / layers[r] for t, v in acc.items()} for r, acc in per_rank.items() if layers.get(r)]
    if not rows:
        return {}
    return {t: sum(row[t] for row in rows) / len(rows) for t in rows[0]}
