"""Analytic estimates of one training step, without simulating it.

* :func:`estimate_memory` -- the peak memory of each pipeline stage by the memory
  model (used to prune layouts that cannot fit before simulating them);
* :func:`estimate_step_time` -- a closed-form step time: compute on the roofline, the
  schedule's bubble in closed form and each parallel axis's communication at the
  bandwidth its group sees (:class:`~simulator.studies.search.network_model.NetModel`), used by
  :mod:`simulator.studies.search` to rank layouts when only some can be simulated (:func:`proxy_cost`).

This module assembles the step from a rank's per-layer costs
(:class:`~simulator.studies.search.layer_costs.StepCosts`) and DualPipe's overlapped pairs
(:mod:`simulator.studies.search.dualpipe_pairs`). Both are built from the trace builder's own sizes (:class:`workloads.trace.shared.TraceBuilder`)
so that they describe the step the simulator would run.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from simulator.engine.symmetry import representative_position, uneven_groups
from simulator.studies.search.dualpipe_pairs import dualpipe_busy, step_terms
from simulator.studies.search.layer_costs import StepCosts
from simulator.studies.search.network_model import NetModel
from workloads import activations, memory
from workloads import schedules as sched
from workloads.activations import ActivationPolicy
from workloads.pipeline import get_schedule
from workloads.shard import Shard
from workloads.trace.shared import INPUT_GRAD_FREED_FRACTION, chunk_layer_ranges

# ---- memory estimate -----------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def schedule_counts(name: str, stage: int, pp: int, m: int, vpp: int = 1, all_forward_first: bool = False):
    """Pipeline rank ``stage``'s schedule (:func:`workloads.schedules.schedule`, put
    all-forward-first when ``all_forward_first``) as counts: ``(F, B, I, W)``, each an
    integer array ``[step, local chunk]`` of how many actions of that kind the step runs on
    the chunk. Cached: a search asks for the same few schedules for many layouts."""
    steps = sched.schedule(name, stage, pp, m, vpp)
    if all_forward_first:
        steps = sched.all_forward_first(steps)
    out = {op: np.zeros((len(steps), sched.local_chunks(name, vpp)), dtype=np.int64) for op in "FBIW"}
    for i, st in enumerate(steps):
        for a in st:
            out[a.op][i, a.chunk] += 1
    for arr in out.values():
        arr.setflags(write=False)
    return out["F"], out["B"], out["I"], out["W"]


#: Bytes of the all-to-all by which :func:`_position` compares expert groups (a DeepSeek-V3
#: dispatch of one 4,096-token sequence in FP8 is 58.7 MB): large enough that bandwidth, not
#: latency, orders them.
_A2A_PROBE_BYTES = 64e6


def _position(layout, net: NetModel) -> int:
    """The rank into each stage whose costs the estimate takes, kept in ``net.positions`` (the
    layouts a search or map screen estimates share their groups and differ in schedule,
    micro-batch or recompute): where expert groups split over scale-up domains unlike one
    another, the first rank of stage 0's slowest expert group by the network model's
    all-to-all; the step waits for it (the data-parallel synchronisation). That is the most
    uneven split, not the one with most pairs across domains: in 8 + 56 the 8 ranks each send
    7/8 of their tokens over the NICs, in 32 + 32 each sends half (DeepSeek-V3 TP4 EP64 on
    72-GPU domains: 1.18 against 0.68 ms a dispatch). Elsewhere
    :func:`~simulator.engine.symmetry.representative_position`."""
    groups = (layout.tp, layout.cp, layout.pp, layout.dp, layout.ep, layout.etp, layout.order, layout.expert_mapping)
    hit = net.positions.get(groups)  # the groups decide it: not ZeRO, vpp or the stage split
    if hit is None:
        hit = representative_position(layout, net)
        if layout.ep > 1 and "ep" in uneven_groups(layout, net):
            table = layout.group_table("ep")
            stage0 = table[table[:, 0] < layout.world // layout.pp]
            hit = int(max(stage0.tolist(), key=lambda g: net.time_s("all-to-all", tuple(g), _A2A_PROBE_BYTES))[0])
        net.positions[groups] = hit
    return hit


@functools.lru_cache(maxsize=1024)
def dualpipe_steps(name: str, stage: int, pp: int, m: int, vpp: int = 1, all_forward_first: bool = False):
    """:func:`schedule_counts`' steps as :func:`~simulator.studies.search.dualpipe_pairs.step_terms`
    (cached: walking the arrays with numpy calls per step, for each of thousands of layouts, was
    a fifth of a PP map point's screen)."""
    return step_terms(schedule_counts(name, stage, pp, m, vpp, all_forward_first))


def _activation_peak(counts, chunk_bytes, rebuilt) -> float:
    """Peak stashed activations of a rank walking its schedule (``counts`` from
    :func:`schedule_counts`): each step first adds its forwards' chunks (body + head),
    the level is sampled, a backward with full recompute samples the level less the
    chunk's head plus the rebuilt layer, then the step's backward-side actions free what
    they use (``B`` all, ``I`` the head and ``INPUT_GRAD_FREED_FRACTION`` of the body,
    ``W`` the rest of the body)."""
    nF, nB, nI, nW = counts
    if not len(nF):
        return 0.0
    body = np.array([c[0] for c in chunk_bytes], dtype=float)
    head = np.array([c[1] for c in chunk_bytes], dtype=float)
    add = nF @ (body + head)
    free = (
        nB @ (body + head)
        + nI @ (body * INPUT_GRAD_FREED_FRACTION + head)
        + nW @ (body * (1 - INPUT_GRAD_FREED_FRACTION))
    )
    level = np.concatenate(([0.0], np.cumsum(add - free)[:-1])) + add  # after each step's forwards
    peak = max(0.0, float(level.max()))
    reb = np.asarray(rebuilt, dtype=float)
    if reb.any():
        back = (nB + nI) > 0
        if back.any():
            cand = level[:, None] - head[None, :] + reb[None, :]
            peak = max(peak, float(cand[back & (reb[None, :] > 0)].max(initial=-np.inf)))
    return peak


def estimate_memory(sc) -> dict:
    """Closed-form peak memory of the most loaded pipeline rank of a loaded scenario:
    ``{"weights", "gradients", "optimizer", "activations", "buffers", "total", "stage"}`` in bytes.

    Per pipeline rank: its model chunks' parameters (:func:`workloads.memory.rank_parameter_counts`,
    embedding on the first chunk, head on the last) in ``state_bytes`` under the ZeRO stage;
    activations by walking the rank's schedule (:func:`workloads.schedules.schedule`,
    all-forward-first under a global MoE auxiliary loss): each forward stashes its chunk's
    layers (``activation_bytes_per_layer``, plus the output layer and the MTP modules on the
    last chunk), a
    full backward frees them, an input-gradient pass frees ``INPUT_GRAD_FREED_FRACTION`` of
    the layers and the weight-gradient pass the rest — as the trace does. Full recompute
    adds one layer's rebuilt activations during a backward. ZeRO-2/3's full-size gradient
    and gathered-weight buffers are :func:`workloads.memory.sharding_buffer_bytes`, as in the
    trace; the trace frees activations at op boundaries the walk does not see, so the
    estimate agrees with the simulated peak to a fraction of a per cent without being a
    strict bound: :data:`PRUNE_TOLERANCE` covers the difference."""
    L, t, model, name = sc.layout, sc.training, sc.model, sc.schedule
    m = t.micro_batches(L.dp)
    chunks = chunk_layer_ranges(model, L, name)
    n_local = sched.local_chunks(name, L.vpp)
    global_aux = model.is_moe and t.balance == "aux-loss-global"

    shard, policy = Shard.of(L, t), ActivationPolicy.of(t)
    rebuild = replace(policy, recompute="none")  # what full recompute rebuilds before a backward

    # the last chunk's head op keeps the output layer's and the MTP modules' activations
    # (the trace's ``_head_bytes``)
    head = activations.head_activation_bytes(model, shard) + activations.mtp_activation_bytes(model, shard, policy)
    per_layer = {}
    best = None
    for stage in range(L.pp):
        own = [sched.model_chunk(name, stage, c, L.pp, L.vpp) for c in range(n_local)]
        layers = [l for k in own for l in chunks[k]]
        units = memory.rank_parameter_units(model, L, layers, has_embedding=0 in own, has_head=len(chunks) - 1 in own)
        dense, expert = sum(u[1] for u in units), sum(u[2] for u in units)
        state = memory.training_state_bytes(dense, expert, L, t)
        layer_params = sum(d + e for u, d, e in units if u.startswith("L"))
        state = replace(
            state,
            weights=state.weights + memory.fp8_weight_cache_bytes(layer_params, t, sc.cluster.chip.family, L.zero),
        )
        buffers = memory.training_sharding_buffer_bytes(model, L, t, [d + e for _, d, e in units])
        chunk_bytes = []
        for k in own:
            total = 0.0
            for l in chunks[k]:
                moe = model.is_moe_layer(l)  # a layer's activations depend on its kind only
                if moe not in per_layer:
                    per_layer[moe] = activations.activation_bytes_per_layer(model, l, shard, policy)
                total += per_layer[moe]
            chunk_bytes.append((total, head if k == len(chunks) - 1 else 0.0))
        # Full recompute rebuilds a layer's activations just before its backward, after
        # the output layer's backward freed the head's: the first layer a chunk's
        # backward meets (its last) is the worst moment.
        rebuilt = [
            activations.activation_bytes_per_layer(model, chunks[k][-1], shard, rebuild)
            if t.recompute == "full" and len(chunks[k])
            else 0.0
            for k in own
        ]
        peak = _activation_peak(schedule_counts(name, stage, L.pp, m, L.vpp, global_aux), chunk_bytes, rebuilt)
        rec = {
            "weights": state.weights,
            "gradients": state.gradients,
            "optimizer": state.optimizer,
            "activations": peak,
            "buffers": buffers,
            "stage": stage,
        }
        rec["total"] = state.total + peak + buffers
        if best is None or rec["total"] > best["total"]:
            best = rec
    return best


# ---- analytic step-time estimate -----------------------------------------------------------
#
# ``max_candidates`` simulates only the layouts this estimate ranks best, so it must see what
# separates layouts at scale: communication as well as compute. It is a closed-form model of
# the same step the trace describes, built from the trace's own sizes (``workloads.trace.builder``:
# kernels per layer and micro-batch, activation, K/V, dispatch and parameter bytes) and the
# simulator's compute roofline (``simulator.engine.compute``), with each collective costed alone on
# the links its group uses (``NetModel``). It leaves out contention between collectives of
# different axes on shared links (the simulator's max-min sharing), per-flow routing on the
# fat-tree, activation offload, ``algorithms:`` overrides and perturbations. It is a ranking
# device, not a prediction: tests/test_search.py checks its rank correlation with simulated
# step times on a small search; on the committed searches of docs/results/search it is
# 0.7-10.8 % faster than the simulation on DeepSeek-V3 / 2,048 H800, -10.5 .. +12.8 % on the
# GB200 placement search and 3-24 % faster on Kimi K2 as those searches ran
# (docs/results/search/README.md); with the ZeRO-3 gathers' overlap below, -10.5 .. +2.8 % on the
# GB200 placement search's simulated layouts.

# Share of the data-parallel gradient reduction that can hide behind compute. The trace issues
# a layer's reduction when the *last* micro-batch's backward of that layer is done (one bucket
# per layer, Megatron's --overlap-grad-reduce), so what is left to hide it behind is, per local
# chunk, that chunk's last backward and the actions the schedule runs after it (interleaved
# 1F1B's cool-down: ``pp`` backwards of each later chunk; ``_chunk_reduction_tail``, the chunks'
# reductions one after another), plus the time by which the rank finishes before the slowest
# one. That window is what ``estimate_step_time`` subtracts; the last
# layer's own bucket is always exposed. Without ``training.overlap_grad_reduce`` every
# reduction starts after the last backward and is exposed whole. ZeRO-1/2 parameter gathers
# (start of the step) hide behind the forward pass the same way, or not at all without
# ``training.overlap_param_gather``. ZeRO-3 per-layer gathers may
# start only when the compute op before last has finished (the trace's prefetch window): each
# layer pass pays what of its gathers the previous layer's last op does not hide
# (``StepCosts.gather_exposed``: without TP the dense MLP's forward and the attention's
# backward; an MoE layer's forward and anything with TP hide nothing). Against the PP map's
# 1,220 stored simulations this took the largest overestimate of its ZeRO-3 families from
# +19.2 to +3.8 % (DualPipe +11.9 to +2.0 %), the median |error| from 3.8 to 2.8 %.
# TP collectives and EP all-to-alls block the compute stream (trace: no TP overlap; only the
# shared experts run during a dispatch), so they count whole, less the shared-expert overlap.


def estimate_step_time(sc, net: NetModel | None = None) -> dict:
    """Analytic step time of a loaded scenario, in seconds, and its parts.

    Per pipeline rank and micro-batch, per layer: compute from the trace's own kernels
    (``workloads.trace.builder`` builder, i.e. ``workloads.counts`` kernels with the layout's TP/CP/
    EP split and routing load) on the simulator's roofline (``simulator.engine.compute``: calibrated
    GEMM / attention / HBM efficiencies, FP8 GEMMs under FP8), the forward again under full
    recomputation; blocking communication: TP all-gathers/reduce-scatters (all-reduces
    without sequence parallelism) of the layer's activations, CP K/V exchange, EP dispatch
    and combine all-to-alls of the routed tokens (``top_k`` copies, FP8 dispatch under FP8;
    two hops under node-limited routing), less the shared experts that overlap them; under
    ZeRO-3 each layer pass also pays its parameter all-gathers (dense over ``dp*cp``,
    experts over ``edp``), less what the previous layer's last op hides (the note above;
    ``fsdp_s`` is the gathers' whole time). Collective times come from :class:`NetModel`.

    The pipeline: ``m`` micro-batches on the slowest rank plus the schedule's bubble in
    closed form (the published forms ``tests/test_schedules.py`` checks the schedules
    against): GPipe / 1F1B ``(pp-1) (F+B)``, interleaved ``(pp-1)(F+B)/vpp``, ZB-H1
    ``(pp-1)(F+I-W)``, DualPipe ``(pp/2-1)(F&B + B - 3W)`` with an overlapped pair
    costing ``F + B`` (the simulator runs both halves on one in-order compute stream, so
    blocking communication is not hidden by the pair); all-forward-first (a
    global MoE auxiliary loss) as GPipe. Pipeline sends to the neighbouring stages are added
    to every forward and backward (they pace the pipeline when slower than its compute).
    Then the exposed data-parallel traffic (see the note above this function): every parameter
    unit's reduction (layers, embedding, head; every micro-batch under ZeRO-2/3) and DualPipe's
    gradient sum between mirror ranks (the shard under ZeRO), overlapping the backward, the
    tied-embedding sum between the first and last stage after it, and the optimizer step (or
    its host offload).

    Returns ``{"step_time_s", "compute_s", "tp_s", "cp_s", "ep_s", "fsdp_s", "bubble_s",
    "pp_send_s", "dp_s", "optimizer_s"}`` (the parts are those of the slowest rank; their
    sum is only roughly the step time, since DualPipe's pairs overlap some of them)."""
    c = StepCosts(sc, net)
    pp, m, name, n_local = c.pp, c.m, c.name, c.n_local
    # the ranks the simulation would run (where a stage's groups are unlike, the one sending most
    # across domains: simulator.engine.symmetry)
    pos = _position(c.L, c.net)  # 0 on a torus
    ranks_of = [c.L.rank_of(pp=s) + pos for s in range(pp)]
    ranks = [_rank_costs(c, s, ranks_of) for s in range(pp)]

    # -- the pipeline --------------------------------------------------------------------
    work = [r["work"] for r in ranks]
    slow = max(range(pp), key=lambda s: work[s])
    busy = [m * w for w in work]
    bubble = _bubble(c, ranks)
    makespan = max(busy) + bubble

    # -- data-parallel traffic, optimizer ------------------------------------------------------
    start, dp_end, tied, opt = _data_parallel_tail(c, ranks)
    step = makespan + start + max(0.0, dp_end) + tied + opt
    tot = ranks[slow]["tot"]
    # the micro-batches' share of the rank's chunks (a DualPipe micro-batch visits one of two)
    share = m * get_schedule(name).chunks_per_micro_batch(c.vpp) / n_local
    return {
        "step_time_s": step,
        **{f"{k_}_s": share * tot[k_] for k_ in ("compute", "tp", "cp", "ep", "fsdp")},
        "pp_send_s": m * tot["pp_send"] / n_local,
        "bubble_s": bubble,
        "dp_s": start + max(0.0, dp_end) + tied,
        "optimizer_s": opt,
    }


_KEYS = ("F", "B", "I", "W", "compute", "tp", "cp", "ep", "fsdp", "grad", "param_ag", "pp_send")


def _unit_extras(c: StepCosts, rank: int, own: list) -> tuple:
    """The embedding and the head (output layer, loss, MTP modules) on ``rank``: parameter units
    like the layers, reduced, ZeRO-1/2 gathered once, ZeRO-3 gathered per use. Returns their
    cost records and, per unit, ``(forward, backward, ZeRO-3 gather)`` for DualPipe's pairs."""
    b, L, kt = c.b, c.L, c.kt
    n_chunks = len(b.chunks)
    emb_f, emb_b = kt(b.embed_kernels()), kt(b.bwd(b.embed_kernels(), "B"))
    head_f, head_b = kt(b.head_kernels()), kt(b.bwd(b.head_kernels(), "B"))
    head_i, head_w = kt(b.bwd(b.head_kernels(), "I")), kt(b.bwd(b.head_kernels(), "W"))
    extras, extras_by_unit = [], {}
    units = {
        u: (d, e)
        for u, d, e in memory.rank_parameter_units(c.model, L, [], has_embedding=0 in own, has_head=n_chunks - 1 in own)
    }
    for u, (f_, b_, i_, w_) in (("embed", (emb_f, emb_b, emb_b, 0.0)), ("head", (head_f, head_b, head_i, head_w))):
        if u not in units:
            continue
        g = c.gather_s(rank, *units[u])
        z3 = g if L.zero == 3 else 0.0
        extras.append(
            {
                "F": f_ + z3,
                "B": b_ + z3,
                "I": i_ + z3,
                "W": w_,
                "compute": f_ + b_,
                "fsdp": 2 * z3,
                "grad": c.reduce_s(rank, *units[u]),
                "param_ag": g if L.zero in (1, 2) else 0.0,
            }
        )
        extras_by_unit[u] = (f_, b_, z3)
    return extras, extras_by_unit


def _pipeline_sends(c: StepCosts, s: int, ranks_of: list) -> tuple:
    """Seconds of stage ``s``'s pipeline sends per action: activations forward, their gradients
    backward, to the neighbouring stages."""
    pp, name, rank = c.pp, c.name, ranks_of[s]
    send_bytes = c.b.hidden_bytes / (c.L.tp if c.L.sequence_parallel else 1)
    nb = [
        ranks_of[(s + 1) % pp] if (s + 1 < pp or get_schedule(name).wraps_stages) else None,
        ranks_of[s - 1] if (s > 0 or get_schedule(name).wraps_stages) else None,
    ]
    if get_schedule(name).bidirectional:  # chunk 0 flows down the stages, chunk 1 up: half each way
        send_f = send_b = sum(c.net.p2p_s(rank, x, send_bytes) for x in nb if x is not None) / 2
    else:
        send_f = c.net.p2p_s(rank, nb[0], send_bytes) if nb[0] is not None else 0.0
        send_b = c.net.p2p_s(rank, nb[1], send_bytes) if nb[1] is not None else 0.0
    return send_f, send_b


def _mirror_s(c: StepCosts, s: int, ranks_of: list, all_units) -> float:
    """DualPipe: the two ranks holding a stage sum each unit's gradients (the shard under
    ZeRO) after its data-parallel reduction, overlapping the backward like it."""
    L, pp = c.L, c.pp
    peer = get_schedule(c.name).weight_peer(s, pp)
    if peer is None or pp == 1:
        return 0.0
    pair = tuple(sorted((ranks_of[s], ranks_of[peer])))
    shard = (lambda d, e: d / (L.dp * L.cp) + e / L.edp) if L.zero >= 1 else (lambda d, e: d + e)
    return sum(c.net.time_s("all-reduce", pair, shard(d, e) * c.t.grad_bytes) for _, d, e in all_units)


def _tied_embedding_s(c: StepCosts, rank: int, own: list, ranks_of: list) -> float:
    """Megatron-LM sums the tied (or MTP-shared) embedding table between the first and the
    last stage after the data-parallel reduction (the trace's ``tied_embedding_sync``)."""
    model, L, n_chunks = c.model, c.L, len(c.b.chunks)
    if not ((model.tied_embeddings or model.mtp_depth) and ((0 in own) != (n_chunks - 1 in own))):
        return 0.0
    other_chunk = n_chunks - 1 if 0 in own else 0
    other = ranks_of[sched.chunk_owner(c.name, other_chunk, c.pp, c.vpp)[0]]
    if other == rank:
        return 0.0
    table = math.ceil(model.vocab / L.tp) * model.hidden
    return c.net.time_s("all-reduce", tuple(sorted((rank, other))), table * c.t.grad_bytes)


def _tp_replicated_s(c: StepCosts, rank: int, layers: list, has_head: bool) -> float:
    """The all-reduce over TP of the gradients of what TP leaves whole, after the data-parallel
    reduction (the trace's ``tp_replicated_grad_sync``)."""
    L = c.L
    if not (L.sequence_parallel and L.tp > 1):
        return 0.0
    params = memory.rank_tp_replicated_params(c.model, L, layers, has_head)
    return c.net.time_s("all-reduce", L.group(rank, "tp"), params * c.t.grad_bytes)


def _rank_costs(c: StepCosts, s: int, ranks_of: list) -> dict:
    """Pipeline stage ``s``'s totals per micro-batch (``tot``), per action (``act``), its work per
    micro-batch and what its data-parallel tail needs."""
    pp, m, name, n_local, b = c.pp, c.m, c.name, c.n_local, c.b
    n_chunks = len(b.chunks)
    rank = ranks_of[s]
    tot = dict.fromkeys(_KEYS, 0.0)
    own = [sched.model_chunk(name, s, k, pp, c.vpp) for k in range(n_local)]
    layers = [l for k in own for l in b.chunks[k]]
    for l in layers:
        for k_, v in c.layer(l, rank).items():
            tot[k_] += v
    extras, extras_by_unit = _unit_extras(c, rank, own)
    for extra in extras:
        for k_, v in extra.items():
            tot[k_] += v
    # Per action (one micro-batch through one local chunk): DualPipe's micro-batches take
    # one of the rank's two chunks each, the interleaved schedule's every chunk.
    per = 1.0 / n_local
    act = {k_: tot[k_] * per for k_ in ("F", "B", "I", "W")}
    # Pipeline sends, counted on the critical path: when they are slower than a stage's
    # compute per micro-batch they set the pipeline's pace.
    if pp > 1:
        send_f, send_b = _pipeline_sends(c, s, ranks_of)
        act["F"] += send_f
        act["B"] += send_b
        act["I"] += send_b
        tot["pp_send"] = (send_f + send_b) * n_local
    mb_work = (act["F"] + act["B"]) * get_schedule(name).chunks_per_micro_batch(c.vpp)
    pair_mean = None
    # DualPipe's forward/backward pairs overlap the expert all-to-alls with the other half's
    # compute (the trace's ``ep_overlap``), every compute op of a pair on the SMs the
    # communication kernels leave free (``simulator.engine.compute.overlap_slowdown``).
    if get_schedule(name).overlapped_pairs and b.dualpipe_ep and not c.global_aux and pp > 1:
        busy_s, pair_mean = dualpipe_busy(
            steps=dualpipe_steps(name, s, pp, m, c.vpp, c.global_aux),
            own=own,
            chunks=b.chunks,
            layer=lambda l: c.layer(l, rank),
            seg=lambda l: c.segs[c.layer_key(l, rank)],
            extras=extras_by_unit,
            n_chunks=n_chunks,
            send_f=send_f,
            send_b=send_b,
            slowdown=c.slowdown,
        )
        mb_work = busy_s / m
    all_units = memory.rank_parameter_units(c.model, c.L, layers, has_embedding=0 in own, has_head=n_chunks - 1 in own)
    # each local chunk's share of the rank's gradient reductions, by its layers' parameters
    chunk_params = [sum(sum(b.layer_param_split(l)) for l in b.chunks[k]) for k in own]
    total_params = sum(chunk_params) or 1.0
    return {
        "chunk_share": [p_ / total_params for p_ in chunk_params],
        "rank": rank,
        "tot": tot,
        "act": act,
        "work": mb_work,
        "layers": max(1, len(layers)),
        "dense": sum(u[1] for u in all_units),
        "expert": sum(u[2] for u in all_units),
        "mirror": _mirror_s(c, s, ranks_of, all_units),
        # after the data-parallel reduction: the TP sum of replicated gradients, the tied embedding's
        "tied": _tp_replicated_s(c, rank, layers, n_chunks - 1 in own) + _tied_embedding_s(c, rank, own, ranks_of),
        "pair": pair_mean,
    }


def _mean(ranks: list, k_: str) -> float:
    """Per-action time ``k_`` averaged over the pipeline ranks."""
    return sum(r["act"][k_] for r in ranks) / len(ranks)


def _bubble(c: StepCosts, ranks: list) -> float:
    """The schedule's pipeline bubble in closed form, in seconds."""
    pp, name = c.pp, c.name

    def mean(k_: str) -> float:
        return _mean(ranks, k_)

    if pp == 1:
        return 0.0
    if c.global_aux:  # all forwards first: GPipe's (pp - 1)(F + B), whatever the schedule
        return (pp - 1) * (mean("F") + mean("B"))
    pair = sum(r["pair"] for r in ranks) / pp if all(r["pair"] is not None for r in ranks) else None
    return get_schedule(name).bubble_s(pp, mean, pair)


def _optimizer_s(c: StepCosts, r: dict) -> float:
    """Seconds of rank ``r``'s optimizer step (or its host offload)."""
    from workloads.trace.shared import (
        HOST_UPDATE_BYTES_PER_S,
        OPTIMIZER_BYTES_PER_PARAM,
        PARAM_BYTES,
        optimizer_kernels,
    )

    L, t = c.L, c.t
    kern = optimizer_kernels(r["dense"], L.zero, L.dp * L.cp, t.optimizer)
    if r["expert"]:
        kern += optimizer_kernels(r["expert"], L.zero, L.edp, t.optimizer)
    if t.offload_optimizer:
        shard = sum(k.bytes for k in kern) / OPTIMIZER_BYTES_PER_PARAM[t.optimizer]
        host = c.sc.cluster.host_bw_bytes_per_s
        return (
            shard * (t.grad_bytes + PARAM_BYTES) / host
            + shard * OPTIMIZER_BYTES_PER_PARAM[t.optimizer] / HOST_UPDATE_BYTES_PER_S
        )
    return c.kt(kern)


def _data_parallel_tail(c: StepCosts, ranks: list) -> tuple:
    """The step's exposed tail after the pipeline: ``(parameter gathers at the start, exposed
    gradient reductions, tied-embedding sum, optimizer step)``, each the slowest rank's."""
    pp, m, name, n_local, L, t = c.pp, c.m, c.name, c.n_local, c.L, c.t
    dp_end = start = tied = opt = 0.0
    b_act = _mean(ranks, "B")
    f_act = _mean(ranks, "F")
    # ZeRO-2/3 reduce-scatter every micro-batch's gradients (the trace's ``_grads_ready``);
    # a DualPipe micro-batch passes through one of the rank's two chunks.
    schedule = get_schedule(name)
    visits = schedule.chunks_per_micro_batch(c.vpp)
    n_reductions = m * visits // n_local if L.zero >= 2 else 1
    for s, r in enumerate(ranks):
        tot = r["tot"]
        R = tot["grad"] + r["mirror"]  # the last micro-batch's reductions
        total = n_reductions * tot["grad"] + r["mirror"]
        if t.overlap_grad_reduce:
            slack = schedule.finish_lead(s, pp) * b_act
            tail = _chunk_reduction_tail(c, s, r["act"], [R * x for x in r["chunk_share"]])
            exposed = max(R / r["layers"], tail, total - m * r["work"]) - slack
        else:
            exposed = total
        dp_end = max(dp_end, exposed)
        tied = max(tied, r["tied"])
        G = tot["param_ag"]
        if G and not t.overlap_param_gather:  # every gather before the first forward
            start = max(start, G)
        elif G:
            start = max(start, max(G / r["layers"], G - r["act"]["F"] - s * f_act))
        opt = max(opt, _optimizer_s(c, r))
    return start, dp_end, tied, opt


def _chunk_reduction_tail(c: StepCosts, s: int, act: Mapping, reductions) -> float:
    """Seconds by which stage ``s``'s last gradient reductions (``reductions[k]``: local chunk
    ``k``'s) outlast its last action. A chunk's layers are reduced as the last micro-batch's
    backward of each completes (the trace's ``_grads_ready``), so its reductions may start with
    its last backward action and run, one after another on the links, beside the actions the
    schedule runs after it: in interleaved 1F1B's cool-down the other chunks' backwards (``pp``
    of them per chunk), in 1F1B none. Bubbles are left out, so the tail is an upper bound of
    this kind."""
    nF, nB, nI, nW = schedule_counts(c.name, s, c.pp, c.m, c.vpp, c.global_aux)
    per_step = (nF * act["F"] + nB * act["B"] + nI * act["I"] + nW * act["W"]).sum(axis=1)
    after = np.concatenate((np.cumsum(per_step[::-1])[::-1][1:], [0.0]))  # of the steps after each
    done = nB + nW  # the actions that complete a chunk's gradients
    ready = []
    for k in range(done.shape[1]):
        hit = np.flatnonzero(done[:, k])
        if hit.size and reductions[k] > 0:
            # from the start of the chunk's last backward action (its layers' buckets follow it)
            ready.append((-(after[hit[-1]] + (act["B"] if nB[hit[-1], k] else act["W"])), reductions[k]))
    finish = -np.inf
    for at, red in sorted(ready):
        finish = max(finish, at) + red
    return max(0.0, finish) if ready else 0.0


def proxy_cost(p: Mapping, micro_batches: int, sc, net: NetModel | None = None) -> float:
    """The ranking key of ``max_candidates``: lower is better. :func:`estimate_step_time`
    in seconds of ``sc``, the loaded scenario of layout ``p`` (``net`` reuses one
    :class:`NetModel` across candidates); ``p`` and ``micro_batches`` are the search's
    record of it."""
    return estimate_step_time(sc, net)["step_time_s"]
