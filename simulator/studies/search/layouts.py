"""The layouts a search enumerates: its bounds (:class:`SearchBounds`), every layout of a model on
a cluster within them (:func:`enumerate_layouts`), their labels and the scenario mapping of each
(:func:`candidate_mapping`). The search itself is :mod:`simulator.studies.search`.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from simulator.scenario.schema import ScenarioError
from simulator.studies.sweep.spec import set_dotted_in_place
from topologies.networks import SwitchedNetwork
from topologies.placement import aligned_devices_per_domain, groups_aligned
from workloads import memory
from workloads import schedules as sched
from workloads.enums import RECOMPUTE_MODES
from workloads.layout import LayoutError, ParallelLayout
from workloads.pipeline import get_schedule

LAYOUT_KEYS = (
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "vpp",
    "schedule",
    "zero",
    "micro_batch_size",
    "recompute",
    "devices_per_domain",
)
# The groups a placement aligns with the scale-up domains: the latency-bound collectives of
# every layer (TP, CP) and the expert all-to-all (EP, ETP). DP and EDP reduce once a step
# and span domains anyway.
ALIGNED_AXES = ("tp", "cp", "ep", "etp")
# A layout is pruned only when its memory estimate exceeds the chip's memory by more than
# this share: the closed forms and the trace's accounting differ by well under 0.1 % on
# the test scenarios (tests/test_search.py), so nothing that would fit is dropped.
PRUNE_TOLERANCE = 0.01
# The adaptive search (bounds.estimate_margin, the default) simulates layouts in the order
# of their analytic estimate E and stops when every layout left has E >= S_best (1 + a):
# such a layout's simulated step E / (1 + e) is no shorter than S_best as long as its
# estimate's relative error e = E / S - 1 is at most the allowance a = (largest e seen on
# the layouts simulated so far, at least 0) + ESTIMATE_MARGIN (the same with pp = 1 for the
# best layout without pipeline parallelism). The margin covers the errors of layouts not
# yet simulated beyond those seen. Measured when it was set (2026-12-01) on the 32 layouts
# simulated in the DeepSeek-V3 searches of docs/results/search (with the DualPipe pair model of
# simulator.studies.search.estimate): e in -4.1 .. +2.9 % on 2,048 H800, -0.9 .. +6.1 % on
# 2,304 GB200 (today's committed searches: docs/results/search/README.md), so the largest error of
# a search exceeds the smallest by 7 %; the layouts simulated first are those the estimate
# ranks best, which are also those it most underestimates, so the allowance must reach
# beyond the largest error seen among them by about the spread: 5 % plus what the search
# observes (on a small search whose errors reach +80 %, tests/test_search.py, the seen
# overestimates widen the allowance themselves).
ESTIMATE_MARGIN = 0.05


@dataclass(frozen=True)
class SearchBounds:
    """What :func:`search` may vary. ``None`` means: for ``max_tp`` the scale-up domain,
    for ``max_pp`` / ``max_ep`` no bound, for ``zero`` / ``micro_batch_sizes`` the
    scenario's own value only, for ``estimate_margin`` simulate every layout that fits
    (``max_candidates`` still caps). ``estimate_margin``: simulate only layouts whose
    analytic estimate is within this share of the best estimate (see
    :data:`ESTIMATE_MARGIN`)."""

    max_tp: int | None = None
    max_pp: int | None = None
    max_cp: int = 1
    max_ep: int | None = None
    max_vpp: int = 4
    schedules: tuple[str, ...] = tuple(sched.SCHEDULES)
    zero: tuple[int, ...] | None = None
    micro_batch_sizes: tuple[int, ...] | None = None
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    max_candidates: int | None = None
    estimate_margin: float | None = ESTIMATE_MARGIN
    placements: bool = True  # also try the devices per domain that align each layout's groups

    def __post_init__(self) -> None:
        for name in ("max_tp", "max_pp", "max_ep", "max_candidates"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ScenarioError(f"must be a positive integer or None, got {v!r}", field=f"bounds.{name}")
        for name in ("max_cp", "max_vpp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ScenarioError(f"must be a positive integer, got {v!r}", field=f"bounds.{name}")
        m = self.estimate_margin
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not m >= 0):
            raise ScenarioError(f"must be a number >= 0 or None, got {m!r}", field="bounds.estimate_margin")
        if not self.schedules or any(s not in sched.SCHEDULES for s in self.schedules):
            raise ScenarioError(
                f"must be a non-empty list of {', '.join(sched.SCHEDULES)}; got {list(self.schedules)}",
                field="bounds.schedules",
            )
        if self.zero is not None and (not self.zero or any(z not in (0, 1, 2, 3) for z in self.zero)):
            raise ScenarioError(f"must be a non-empty list of 0, 1, 2, 3; got {list(self.zero)}", field="bounds.zero")
        if self.micro_batch_sizes is not None and (
            not self.micro_batch_sizes
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.micro_batch_sizes)
        ):
            raise ScenarioError(
                f"must be a non-empty list of positive integers; got {list(self.micro_batch_sizes)}",
                field="bounds.micro_batch_sizes",
            )
        if not self.recompute or any(r not in memory.RECOMPUTE_MODES for r in self.recompute):
            raise ScenarioError(
                f"must be a non-empty list of {', '.join(memory.RECOMPUTE_MODES)}; got {list(self.recompute)}",
                field="bounds.recompute",
            )


# ---- enumeration ---------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def scale_up_domain(sc) -> int:
    """Devices in one scale-up domain: a switched network's ``domain_size``; a torus pod."""
    net = sc.cluster.network
    if isinstance(net, SwitchedNetwork):
        return min(net.domain_size, sc.cluster.devices)
    return sc.cluster.devices_per_pod


def label(p: Mapping) -> str:
    parts = [f"tp{p['tp']}", f"pp{p['pp']}", f"dp{p['dp']}"]
    for k in ("cp", "ep", "vpp"):
        if p[k] > 1:
            parts.append(f"{k}{p[k]}")
    parts += [p["schedule"], f"z{p['zero']}", f"mb{p['micro_batch_size']}", p["recompute"]]
    dpd = devices_per_domain_of(p)
    if dpd is not None:
        parts.append(f"{dpd}perdomain")
    return "-".join(parts)


def devices_per_domain_of(p: Mapping) -> int | None:
    """Layout ``p``'s devices per scale-up domain, or None for the scenario's own placement
    (also where a table held it as NaN)."""
    dpd = p.get("devices_per_domain")
    return None if dpd is None or dpd != dpd else int(dpd)


def expert_tp(scenario_layout, tp: int) -> int:
    """The expert tensor-parallel degree a candidate with ``tp`` gets: ``tp`` where the
    scenario splits experts as wide as its TP (``etp == tp > 1``), else 1."""
    L = scenario_layout
    return tp if L.etp > 1 and L.etp == L.tp else 1


def aligned_placement(sc, p: Mapping) -> int | None:
    """Devices per scale-up domain that align layout ``p``'s TP, CP, EP and ETP groups with
    the domains of ``sc``'s switched network (:func:`topologies.placement.aligned_devices_per_domain`),
    where the scenario's own placement leaves some group straddling domains unevenly;
    ``None`` where it does not, on a torus, or where no count aligns them."""
    c = sc.cluster
    if not isinstance(c.network, SwitchedNetwork):
        return None
    try:
        L = ParallelLayout(
            tp=p["tp"],
            cp=p["cp"],
            pp=p["pp"],
            dp=p["dp"],
            ep=p["ep"],
            vpp=p["vpp"],
            etp=expert_tp(sc.layout, p["tp"]),
            order=sc.layout.order,
            expert_mapping=sc.layout.expert_mapping,
            mla_down_proj=sc.layout.mla_down_proj,
        )
    except LayoutError:
        return None
    tables = [L.group_table(a) for a in ALIGNED_AXES]
    used = c.network.domain_size
    if groups_aligned(tables, used):
        return None
    d = aligned_devices_per_domain(tables, c.domain_capacity or used, c.devices_per_pod)
    return d if d is not None and d != used else None


def enumerate_layouts(sc, bounds: SearchBounds) -> list[dict]:
    """Every layout within ``bounds`` whose degrees divide the devices (and, for MoE, ep the
    experts; for pipelines, the layers over pp*vpp chunks). Deterministic order."""
    n = sc.cluster.devices
    model = sc.model
    max_tp = bounds.max_tp or scale_up_domain(sc)
    max_pp = min(bounds.max_pp or model.layers, model.layers)
    zeros = bounds.zero if bounds.zero is not None else (sc.layout.zero,)
    mbs = bounds.micro_batch_sizes if bounds.micro_batch_sizes is not None else (sc.training.micro_batch_size,)
    out = []
    aligned_by_shape: dict[tuple, int | None] = {}
    for tp in _divisors(n):
        if tp > max_tp:
            continue
        for cp in _divisors(n // tp):
            if cp > bounds.max_cp:
                continue
            for pp in _divisors(n // (tp * cp)):
                if pp > max_pp:
                    continue
                dp = n // (tp * cp * pp)
                eps = [1]
                if model.is_moe:
                    # Megatron-Core folds EP over the stage's tp*cp*dp ranks (etp 1); DeepSpeed carves
                    # it out of dp*cp, as does an expert TP as wide as the attention's.
                    folds = sc.layout.expert_mapping == "megatron-core" and expert_tp(sc.layout, tp) == 1
                    eps = [
                        e
                        for e in _divisors(dp * cp * (tp if folds else 1))
                        if model.moe.experts % e == 0 and (bounds.max_ep is None or e <= bounds.max_ep)
                    ]
                for ep in eps:
                    for schedule in bounds.schedules:
                        if get_schedule(schedule).virtual_stages:
                            if pp < 2:
                                continue
                            # Uneven splits are fine (pipeline_layers: auto), but every
                            # chunk needs a layer.
                            vpps = [v for v in range(2, bounds.max_vpp + 1) if pp * v <= model.layers]
                        else:
                            if sched.model_chunks(schedule, pp, 1) > model.layers:
                                continue
                            vpps = [1]
                        for vpp in vpps:
                            shape = {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": ep, "vpp": vpp}
                            places = [None]
                            if bounds.placements:
                                key = (tp, cp, pp, dp, ep)  # vpp changes no group
                                if key not in aligned_by_shape:
                                    aligned_by_shape[key] = aligned_placement(sc, shape)
                                aligned = aligned_by_shape[key]
                                if aligned is not None:
                                    places.append(aligned)
                            for zero, mb, rc, place in itertools.product(zeros, mbs, bounds.recompute, places):
                                out.append(
                                    {
                                        **shape,
                                        "schedule": schedule,
                                        "zero": zero,
                                        "micro_batch_size": mb,
                                        "recompute": rc,
                                        "devices_per_domain": place,
                                    }
                                )
    return out


def candidate_mapping(base: Mapping, p: Mapping, name: str) -> dict:
    """The scenario mapping of one layout: ``base`` (the scenario as given) with its
    parallel layout, schedule, micro-batch size and recompute mode replaced; every other
    field (model, cluster, sequence length, batch, dtype, ...) kept as it was."""
    par = dict(base.get("parallel") or {})
    etp = p["tp"] if par.get("etp", 1) > 1 and par.get("etp") == par.get("tp") else 1  # as expert_tp()
    par.update(
        tp=p["tp"],
        pp=p["pp"],
        dp=p["dp"],
        cp=p["cp"],
        ep=p["ep"],
        vpp=p["vpp"],
        zero=p["zero"],
        etp=etp,
        pipeline_layers="auto",
    )
    out = copy.deepcopy(dict(base))  # one copy; the keys are set in it
    set_dotted_in_place(out, "parallel", par)
    set_dotted_in_place(out, "schedule", p["schedule"])
    set_dotted_in_place(out, "training.micro_batch_size", p["micro_batch_size"])
    set_dotted_in_place(out, "training.recompute", p["recompute"])
    dpd = devices_per_domain_of(p)
    if dpd is not None:
        given_in_placement = (base.get("placement") or {}).get("devices_per_domain") is not None
        key = "placement.devices_per_domain" if given_in_placement else "cluster.devices_per_domain"
        set_dotted_in_place(out, key, dpd)
    set_dotted_in_place(out, "name", f"{name}:{label(p)}")
    return out
