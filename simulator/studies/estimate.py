"""Analytic estimates of one training step, without simulating it.

* :func:`estimate_memory` -- the peak memory of each pipeline stage by the memory
  model (used to prune layouts that cannot fit before simulating them);
* :func:`estimate_step_time` -- a closed-form step time: compute on the roofline, the
  schedule's bubble in closed form and each parallel axis's communication at the
  bandwidth its group sees (:class:`NetModel`), used by :mod:`simulator.studies.search` to
  rank layouts when only some can be simulated (:func:`proxy_cost`).

Both are built from the trace builder's own sizes (:class:`workloads.trace.builder.TraceBuilder`)
so that they describe the step the simulator would run.
"""

from __future__ import annotations

import functools
import math
from typing import Mapping, Optional

import numpy as np

from topologies.networks import SwitchedNetwork
from workloads import memory
from workloads import activations
from workloads import schedules as sched
from workloads.trace.builder import INPUT_GRAD_FREED_FRACTION, chunk_layer_ranges


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
    layers (``activation_bytes_per_layer``, plus the output layer on the last chunk), a
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

    def stash(layer: int, recompute: str) -> float:
        return activations.activation_bytes_per_layer(
            model,
            layer,
            t.micro_batch_size,
            t.seq_len,
            tp=L.tp,
            cp=L.cp,
            sequence_parallel=L.sequence_parallel,
            recompute=recompute,
            ep=L.ep,
            etp=L.etp,
            **memory.activation_options(t),
        )

    head = activations.head_activation_bytes(
        model, t.micro_batch_size, t.seq_len, tp=L.tp, cp=L.cp, sequence_parallel=L.sequence_parallel
    )
    per_layer = {}
    best = None
    for stage in range(L.pp):
        own = [sched.model_chunk(name, stage, c, L.pp, L.vpp) for c in range(n_local)]
        layers = [l for k in own for l in chunks[k]]
        units = memory.rank_parameter_units(model, L, layers, has_embedding=0 in own, has_head=len(chunks) - 1 in own)
        dense, expert = sum(u[1] for u in units), sum(u[2] for u in units)
        state = memory.training_state_bytes(dense, expert, L, t)
        buffers = memory.sharding_buffer_bytes([d + e for _, d, e in units], L.zero, grad_dtype_bytes=t.grad_bytes)
        chunk_bytes = []
        for k in own:
            total = 0.0
            for l in chunks[k]:
                if l not in per_layer:
                    per_layer[l] = stash(l, t.recompute)
                total += per_layer[l]
            chunk_bytes.append((total, head if k == len(chunks) - 1 else 0.0))
        # Full recompute rebuilds a layer's activations just before its backward, after
        # the output layer's backward freed the head's: the first layer a chunk's
        # backward meets (its last) is the worst moment.
        rebuilt = [stash(chunks[k][-1], "none") if t.recompute == "full" and len(chunks[k]) else 0.0 for k in own]
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
# step times on a small search; on the DeepSeek-V3 searches of docs/results/search it came
# within 1-2 % of the simulated step times on GPUs and 3-9 % on a TPU v5p torus.

# Share of the data-parallel gradient reduction that can hide behind compute. The trace issues
# a layer's reduction when the *last* micro-batch's backward of that layer is done (one bucket
# per layer, Megatron's --overlap-grad-reduce), so the only compute left to hide it behind is
# the rest of that last backward pass on the rank, plus the time by which the rank finishes
# before the slowest one. That window is what ``estimate_step_time`` subtracts; the last
# layer's own bucket is always exposed. Without ``training.overlap_grad_reduce`` every
# reduction starts after the last backward and is exposed whole. ZeRO-1/2 parameter gathers
# (start of the step) hide behind the forward pass the same way. ZeRO-3 per-layer gathers may
# start only when the compute op before last has finished (the trace's prefetch window), which
# with a layer's several compute ops leaves almost nothing to hide them behind: each layer pass
# pays its gathers on top of its compute.
# TP collectives and EP all-to-alls block the compute stream (trace: no TP overlap; only the
# shared experts run during a dispatch), so they count whole, less the shared-expert overlap.


class NetModel:
    """Time of one collective on a cluster, closed form, alone on the network.

    Ranks are devices (the trace places rank ``r`` on device ``r``). Bandwidths are per
    device and direction, times the link efficiency of the chip family's network
    calibration (``simulator.network.calibration``: NVLink 370/450, InfiniBand 48/50, ICI 1.0).

    * Switched (NVLink domains + fat-tree): a group inside one domain runs on the domain
      link (NVLS for all-reduce when the domain has it); across domains with ``k > 1``
      members per domain the algorithms ``simulator.network.collectives`` picks: the rail-ring
      (NCCL's ring, one channel per rail: the whole ring load on NVLink and ``1/k`` of it on
      each NIC, at once), the pipelined SHARP all-reduce when the fabric has it (NVLink
      reduce-scatter + all-gather beside ``S/k`` into the switch), and the DeepSeek-style
      hierarchical all-to-all (``(nd-1)/nd`` of the buffer over the NIC and ``(k-1)/k``
      over NVLink at once); with one member per domain a ring / direct exchange
      over the NICs. Leaf uplinks divide the NIC bandwidth by the oversubscription when the
      group spans more domains than one leaf group holds; crossing pods, the DCN bandwidth.
    * Torus: a group that is a box of the torus runs dimension by dimension, the buffer split
      into one share per axis with rotated axis orders so that every axis is busy at every
      stage (per axis a bidirectional ring when the group covers a wrapped axis, else a
      bidirectional line at half that bandwidth: ``collectives._torus``); any other group a ring whose links carry
      as many chunks as the mean hop count between ring neighbours (twin groups interleave
      on the same links). An all-to-all is limited by its busiest link: along an axis of
      ``e`` members each line carries an all-to-all of ``S/e`` per pair, whose busiest link
      carries ``floor(e/2)*ceil(e/2)`` such messages on a line and
      ``sum(d < e/2) + e/4`` on a wrapped ring (shortest paths, ties split). Across pods:
      the pod part on ICI plus the ``S/k`` shard (all-to-all: the cross-pod share) over DCN.

    Each step of a ring pays the per-hop latency. Results are cached per (op, group)."""

    def __init__(self, cluster, calibration=None):
        from simulator.network.calibration import default_calibration  # lazy: search imports stay light

        self.cluster = cluster
        ncal = calibration if calibration is not None else default_calibration(cluster.chip.family)
        net = cluster.network
        self.kind = "switched" if isinstance(net, SwitchedNetwork) else "torus"
        self.per_pod = cluster.devices_per_pod
        pods = cluster.pods
        self.dcn_bw = pods.dcn_bw_bytes_per_s * ncal.efficiency_of("dcn") if pods is not None else None
        self.dcn_latency_s = pods.dcn_latency_s if pods is not None else 0.0
        if self.kind == "switched":
            self.domain = min(net.domain_size, self.per_pod)
            self.up_bw = net.domain_bw_bytes_per_s * ncal.efficiency_of("nvlink")
            self.out_bw = net.nic_bw_bytes_per_s * ncal.efficiency_of("nic")
            self.oversubscription = net.oversubscription
            self.domains_per_leaf = net.domains_per_leaf
            self.nvls = net.nvls
            self.sharp = net.sharp
            self.nvls_efficiency = ncal.algorithm_efficiency_of("nvls")
            self.up_latency_s = 2 * net.domain_latency_s  # device -> switch -> device
            self.out_latency_s = 2 * (net.nic_latency_s + net.switch_latency_s)  # NIC, leaf, spine, leaf, NIC
        else:
            self.shape = tuple(net.shape)
            self.wrap = tuple(net.wrap)
            self.strides = [math.prod(self.shape[:a]) for a in range(len(self.shape))]
            self.link_bw = net.link_bw_bytes_per_s * ncal.efficiency_of("ici")
            self.link_latency_s = net.link_latency_s
        self._cache: dict = {}

    def time_s(self, op: str, group, size_bytes: float, scaleout_fraction: float = 1.0) -> float:
        """Seconds for ``op`` (all-reduce | all-gather | reduce-scatter | all-to-all) of
        ``size_bytes`` (nccl-tests convention, as ``simulator.network.collectives``) over ``group``.
        ``scaleout_fraction``: a node-limited all-to-all's share of routed copies that
        cross between switched domains (``collectives.plan_collective``)."""
        group = tuple(group)
        if len(group) <= 1 or size_bytes <= 0:
            return 0.0
        key = (op, group, scaleout_fraction)
        hit = self._cache.get(key)
        if hit is None:
            arr = np.asarray(group, dtype=np.int64)
            if self.kind == "switched":
                per_byte_s, latency_s = self._switched(op, arr, scaleout_fraction)
            else:
                per_byte_s, latency_s = self._torus_pods(op, arr)
            hit = self._cache[key] = (float(per_byte_s), float(latency_s))
        per_byte_s, latency_s = hit
        return float(size_bytes * per_byte_s + latency_s)

    def p2p_s(self, src: int, dst: int, size_bytes: float) -> float:
        """One point-to-point transfer (a pipeline send)."""
        if src == dst or size_bytes <= 0:
            return 0.0
        if src // self.per_pod != dst // self.per_pod:
            return size_bytes / self.dcn_bw + self.dcn_latency_s
        if self.kind == "switched":
            if src // self.domain == dst // self.domain:
                return size_bytes / self.up_bw + self.up_latency_s
            return size_bytes / self.out_bw + self.out_latency_s
        hops = int(self._hops(np.array([src % self.per_pod]), np.array([dst % self.per_pod])).sum())
        return size_bytes / self.link_bw + hops * self.link_latency_s

    # -- switched ---------------------------------------------------------------------------
    def _switched(self, op: str, arr, scaleout_fraction: float = 1.0) -> tuple[float, float]:
        n = len(arr)
        _, counts = np.unique(arr // self.domain, return_counts=True)
        nd, k = len(counts), int(counts.max())
        out_bw = self.out_bw
        if nd > self.domains_per_leaf:
            out_bw /= self.oversubscription
        if self.dcn_bw is not None and len(np.unique(arr // self.per_pod)) > 1:
            out_bw = min(out_bw, self.dcn_bw)
        up, up_a, out_a = self.up_bw, self.up_latency_s, self.out_latency_s
        if nd == 1:
            if op == "all-to-all":
                return (n - 1) / n / up, up_a
            if op == "all-reduce":
                if self.nvls:
                    return (n + 1) / n / (up * self.nvls_efficiency), 2 * up_a
                return 2 * (n - 1) / n / up, 2 * (n - 1) * up_a
            return (n - 1) / n / up, (n - 1) * up_a
        if k == 1 or int(counts.min()) != k:  # one member per domain (or uneven): over the NICs
            if op == "all-to-all":
                return scaleout_fraction * (n - k) / n / out_bw + (k - 1) / n / up, out_a
            f = 2 if op == "all-reduce" else 1
            return f * (n - 1) / n / out_bw, f * (n - 1) * out_a
        if op == "all-to-all":  # hierarchical: rail and NVLink legs in one phase
            return max(scaleout_fraction * (nd - 1) / nd / out_bw, (k - 1) / k / up), out_a + up_a
        alpha = max(up_a, out_a)
        if op == "all-reduce" and self.sharp:  # pipelined: NVLink RS + AG beside the switch
            return max(2 * (k - 1) / k / up, 1 / k / out_bw), (2 * (k - 1) + 1) * alpha
        # rail-ring (NCCL's ring, one channel per rail): the whole ring load on NVLink, 1/k
        # of it on each NIC, at once
        f = 2 if op == "all-reduce" else 1
        return f * (n - 1) / n * max(1 / up, 1 / (k * out_bw)), f * (n - 1) * alpha

    # -- torus ------------------------------------------------------------------------------
    def _coords(self, local):
        return [(local // s) % e for s, e in zip(self.strides, self.shape)]

    def _hops(self, a, b):
        """Dimension-order hop counts between local device indices ``a`` and ``b``."""
        total = np.zeros(len(a), dtype=np.int64)
        for ca, cb, e, w in zip(self._coords(a), self._coords(b), self.shape, self.wrap):
            d = np.abs(ca - cb)
            total += np.minimum(d, e - d) if (w and e > 2) else d
        return total

    def _torus_pods(self, op: str, arr) -> tuple[float, float]:
        pods, counts = np.unique(arr // self.per_pod, return_counts=True)
        if len(pods) == 1:
            return self._torus(op, arr % self.per_pod)
        npods, k = len(pods), int(counts.max())
        intra = self._torus(op, (arr[arr // self.per_pod == pods[0]] % self.per_pod)) if k > 1 else (0.0, 0.0)
        if op == "all-to-all":
            return max(intra[0], (npods - 1) / npods / self.dcn_bw), intra[1] + self.dcn_latency_s
        f = 2 if op == "all-reduce" else 1
        # Hierarchical: the pod part on the full buffer, then the S/k shard across pods.
        return intra[0] + f * (npods - 1) / npods / k / self.dcn_bw, intra[1] + f * (npods - 1) * self.dcn_latency_s

    def _torus(self, op: str, local) -> tuple[float, float]:
        n = len(local)
        if n <= 1:
            return 0.0, 0.0
        coords = self._coords(local)
        extents, box = [], True
        for c, e in zip(coords, self.shape):
            vals = np.unique(c)
            extents.append(len(vals))
            if vals[-1] - vals[0] + 1 != len(vals):
                box = False
        box = box and math.prod(extents) == n
        B, a = self.link_bw, self.link_latency_s
        if op == "all-to-all":
            worst = 0.0
            for c, e_full, w in zip(coords, self.shape, self.wrap):
                e = int(c.max() - c.min() + 1)  # bounding extent: twin groups fill the gaps
                if e <= 1:
                    continue
                if w and e == e_full and e_full > 2:
                    load = sum(range(1, (e + 1) // 2)) + (e / 4 if e % 2 == 0 else 0.0)
                else:
                    load = (e // 2) * ((e + 1) // 2)
                worst = max(worst, load / e)
            span = math.prod(int(c.max() - c.min() + 1) for c in coords)
            return worst * span / n / B, a * max(1, sum(extents) - len(extents))
        f = 2 if op == "all-reduce" else 1
        if box:
            # collectives._torus: one share of 1/d per axis, share i taking the axes in the
            # order rotated by i; stage j of every share runs at once (max over shares)
            axes = [
                (e, 2 if (w and e == e_full and e_full > 2) else 1)
                for e, e_full, w in zip(extents, self.shape, self.wrap)
                if e > 1
            ]
            d = len(axes)
            orders = [axes[i:] + axes[:i] for i in range(d)]
            per_byte, steps = 0.0, 0
            for j in range(d):
                per_byte += max(
                    (o[j][0] - 1) / o[j][0] / d / math.prod(e for e, _ in o[:j]) / (B * o[j][1]) for o in orders
                )
                steps += max(o[j][0] - 1 for o in orders)
            return f * per_byte, f * steps * a
        # Not a box: a ring in group order; its neighbour transfers take several hops.
        nxt = np.roll(local, -1)
        worst = 0.0
        for ca, cb, e, w in zip(coords, self._coords(nxt), self.shape, self.wrap):
            d = np.abs(ca - cb)
            d = np.minimum(d, e - d) if (w and e > 2) else d
            worst = max(worst, float(d.sum()) / n)
        return f * (n - 1) / n * max(worst, 1.0) / B, f * (n - 1) * a * max(worst, 1.0)


def _pair_time(f_layers, b_layers, slowdown: float) -> float:
    """Seconds of one DualPipe forward/backward pair on the compute stream: the two halves'
    layers interleaved as the trace does (``workloads.trace.program.RankProgram._interleave``, the
    backward half first), its compute ops ``slowdown`` times longer, the expert all-to-alls
    in order on one communication stream, each starting when issued (and the stream is
    free) and waited for by the op that needs it. ``f_layers``: per forward layer
    ``(attention + router, shared, experts, output, dispatch, combine)``; ``b_layers``
    (backward order): ``(recompute + output grad, shared grad, experts input grad, experts
    weight grad, router + attention grad, combine grad, dispatch grad)``."""
    T = C = 0.0

    def issue(d: float) -> float:
        nonlocal C
        if d <= 0:
            return T
        C = max(T, C) + d
        return C

    pend = None  # the previous forward layer's combine and output op
    for i in range(max(len(f_layers), len(b_layers))):
        if i < len(b_layers):
            rp, bs, ei, ew, ba, a_bc, a_bd = b_layers[i]
            T += slowdown * rp
            e_bc = issue(a_bc)
            T += slowdown * bs
        if pend is not None:
            T = max(T, pend[0]) + slowdown * pend[1]
            pend = None
        if i < len(f_layers):
            fa, fs, fe, fp, a_fd, a_fc = f_layers[i]
            T += slowdown * fa
            e_fd = issue(a_fd)
            T += slowdown * fs
        if i < len(b_layers):
            T = max(T, e_bc) + slowdown * ei
            e_bd = issue(a_bd)
            T += slowdown * ew
        if i < len(f_layers):
            T = max(T, e_fd) + slowdown * fe
            pend = (issue(a_fc), fp)
        if i < len(b_layers):
            T = max(T, e_bd) + slowdown * ba
    if pend is not None:
        T = max(T, pend[0]) + slowdown * pend[1]
    return T


def _dualpipe_busy(sched_counts, own, chunks, layer, seg, extras, n_chunks, send_f, send_b, slowdown):
    """A DualPipe rank's busy time over the step and its mean pair time: every step of its
    schedule (``sched_counts``, :func:`schedule_counts`) costed on its own chunk — a lone
    ``F`` / ``B`` / ``I`` / ``W`` as without overlap, an ``F`` + ``B`` pair by
    :func:`_pair_time` plus what blocks the stream in both halves (TP, CP, ZeRO-3 gathers)
    and both halves' embedding / head compute (slowed) and pipeline sends."""
    nF, nB, nI, nW = sched_counts
    n_local = len(own)
    cost = {op: [0.0] * n_local for op in "FBIW"}
    fl, bl, blk_f, blk_b, ext_f, ext_b = ([], [], [0.0] * n_local, [0.0] * n_local, [0.0] * n_local, [0.0] * n_local)
    for c, k in enumerate(own):
        f_c, b_c = [], []
        for l in chunks[k]:
            d = layer(l)
            for op in "FBIW":
                cost[op][c] += d[op]
            sf, sb, xf, xb = seg(l)
            f_c.append(sf)
            b_c.append(sb)
            blk_f[c] += xf
            blk_b[c] += xb
        fl.append(f_c)
        bl.append(b_c[::-1])
        for u, has in (("embed", k == 0), ("head", k == n_chunks - 1)):
            if has and u in extras:
                f_, b_, z3 = extras[u]
                cost["F"][c] += f_ + z3
                cost["B"][c] += b_ + z3
                cost["I"][c] += b_ + z3
                ext_f[c] += f_
                ext_b[c] += b_
                blk_f[c] += z3
                blk_b[c] += z3
        cost["F"][c] += send_f
        cost["B"][c] += send_b
        cost["I"][c] += send_b
    ptime: dict = {}
    busy = 0.0
    pair_sum, pairs = 0.0, 0
    for i in range(len(nF)):
        f_row, b_row = nF[i], nB[i]
        if f_row.sum() == 1 and b_row.sum() == 1 and not nI[i].any() and not nW[i].any():
            cf, cb = int(f_row.argmax()), int(b_row.argmax())
            if (cf, cb) not in ptime:
                ptime[(cf, cb)] = (
                    _pair_time(fl[cf], bl[cb], slowdown)
                    + slowdown * (ext_f[cf] + ext_b[cb])
                    + blk_f[cf]
                    + blk_b[cb]
                    + send_f
                    + send_b
                )
            busy += ptime[(cf, cb)]
            pair_sum += ptime[(cf, cb)]
            pairs += 1
            continue
        for op, row in (("F", f_row), ("B", b_row), ("I", nI[i]), ("W", nW[i])):
            for c in np.flatnonzero(row):
                busy += row[c] * cost[op][c]
    return busy, (pair_sum / pairs if pairs else None)


def estimate_step_time(sc, net: Optional[NetModel] = None) -> dict:
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
    experts over ``edp``). Collective times come from :class:`NetModel`.

    The pipeline: ``m`` micro-batches on the slowest rank plus the schedule's bubble in
    closed form (the published forms ``tests/test_schedules.py`` checks the schedules
    against): GPipe / 1F1B ``(pp-1) (F+B)``, interleaved ``(pp-1)(F+B)/vpp``, ZB-H1
    ``(pp-1)(F+I-W)``, DualPipe ``(pp/2-1)(F&B + B - 3W)`` with an overlapped pair
    costing ``F + B`` (the simulator runs both halves on one in-order compute stream, so
    blocking communication is not hidden by the pair); all-forward-first (a
    global MoE auxiliary loss) as GPipe. Pipeline sends to the neighbouring stages are added
    to every forward and backward (they pace the pipeline when slower than its compute).
    Then the exposed data-parallel traffic (see the note above ``NetModel``): every parameter
    unit's reduction (layers, embedding, head; every micro-batch under ZeRO-2/3) and DualPipe's
    gradient sum between mirror ranks (the shard under ZeRO), overlapping the backward, the
    tied-embedding sum between the first and last stage after it, and the optimizer step (or
    its host offload).

    Returns ``{"step_time_s", "compute_s", "tp_s", "cp_s", "ep_s", "fsdp_s", "bubble_s",
    "pp_send_s", "dp_s", "optimizer_s"}`` (the parts are those of the slowest rank; their
    sum is only roughly the step time, since DualPipe's pairs overlap some of them)."""
    from simulator.engine.compute import calibration_for, kernels_time_s, overlap_slowdown
    from workloads.trace.builder import (
        HOST_UPDATE_BYTES_PER_S,
        OPTIMIZER_BYTES_PER_PARAM,
        PARAM_BYTES,
        TraceBuilder,
        optimizer_kernels,
    )

    L, t, model, name = sc.layout, sc.training, sc.model, sc.schedule
    chip = sc.cluster.chip
    net = net if net is not None else NetModel(sc.cluster, sc.network_calibration())
    cal = calibration_for(chip, dict(sc.compute_overrides))
    # The trace builder's sizes, so that the estimate and the simulated trace agree on
    # every byte and FLOP (no formula is repeated here).
    b = TraceBuilder(sc.workload())
    m, pp, vpp = b.m, L.pp, L.vpp
    n_local = sched.local_chunks(name, vpp)
    sp = L.sequence_parallel and L.tp > 1
    recompute = t.recompute == "full"
    global_aux = model.is_moe and t.balance == "aux-loss-global"
    grad_op = "all-reduce" if L.zero == 0 else "reduce-scatter"
    kcache: dict = {}

    def kt(kernels) -> float:
        key = tuple(kernels)
        if key not in kcache:
            kcache[key] = kernels_time_s(key, chip, cal, t.dtype)
        return kcache[key]

    def a2a(rank: int, size: float) -> float:
        # node-limited routing: the rail hop carries distinct nodes / top_k of the copies,
        # pipelined with the NVLink fan-out (workloads.trace.program.RankProgram.all_to_all)
        nl = b.node_limited()
        frac = 1.0 if nl is None else min(1.0, nl[0] / model.moe.top_k)
        return net.time_s("all-to-all", L.group(rank, "ep"), size, scaleout_fraction=frac)

    lcache: dict = {}
    segs: dict = {}

    def layer(l: int, rank: int) -> dict:
        """Per micro-batch: one layer's forward / backward parts on ``rank``."""
        parts = b.layer_parts(l)
        key = (id(parts), rank, model.is_moe_layer(l))
        if key in lcache:
            return lcache[key]
        attn, pre, shared, expert, post = parts
        full = b.layer_all(l)
        c_f, c_bB, c_bI, c_bW = kt(full), kt(b.bwd(full, "B")), kt(b.bwd(full, "I")), kt(b.bwd(full, "W"))
        tp_f = tp_b = cp_f = cp_b = ep_f = ep_b = 0.0
        if L.tp > 1:
            g, h = L.group(rank, "tp"), b.hidden_bytes
            tp_f = tp_b = (
                2 * (net.time_s("all-gather", g, h) + net.time_s("reduce-scatter", g, h))
                if sp
                else 2 * net.time_s("all-reduce", g, h)
            )
        if L.cp > 1:
            g = L.group(rank, "cp")
            cp_f = net.time_s("all-gather", g, b.kv_bytes() * L.cp)
            cp_b = net.time_s("reduce-scatter", g, b.kv_bytes() * L.cp)
        if expert and L.ep > 1:
            disp, comb = a2a(rank, b.dispatch_bytes(False, l)), a2a(rank, b.dispatch_bytes(True, l))
            ep_f = max(0.0, disp - kt(shared)) + comb
            comb_b = a2a(rank, b.dispatch_bytes(True, l))
            ep_b = max(0.0, comb_b - kt(b.bwd(shared, "B"))) + comb_b
        dense, exp = b.layer_param_split(l)
        gather = 0.0
        if L.zero == 3:
            gather = net.time_s("all-gather", L.group(rank, "dp_cp"), dense * PARAM_BYTES) + net.time_s(
                "all-gather", L.group(rank, "edp"), exp * PARAM_BYTES
            )
        rc, re = (c_f, tp_f + cp_f + ep_f) if recompute else (0.0, 0.0)
        if not recompute and memory.recomputed_kernel_names(t):
            rc = kt(b.saved_recompute_kernels(l))  # norms, MLA up-projections, SwiGLUs
        e_f, e_b = tp_f + cp_f + ep_f, tp_b + cp_b + ep_b
        # The trace lets a ZeRO-3 gather start once the compute op before last is done: with
        # several compute ops per layer that is within the previous layer's last op, so the
        # gather barely overlaps and is counted whole (see the note above NetModel).
        F = c_f + e_f + gather
        B = rc + re + c_bB + e_b + gather
        I = rc + re + c_bI + e_b + gather
        # DualPipe's overlapped pairs: the layer's compute in the order the trace runs it and
        # its all-to-alls (raw), for _pair_time; what blocks the stream besides (TP, CP,
        # ZeRO-3 gathers, a full recompute's own collectives) is added whole.
        if expert and L.ep > 1:
            seg_f = (kt(attn) + kt(pre), kt(shared), kt(expert), kt(post), disp, comb)
            seg_b = (
                rc + kt(b.bwd(post, "B")),
                kt(b.bwd(shared, "B")),
                kt(b.bwd(expert, "I")),
                kt(b.bwd(expert, "W")),
                kt(b.bwd(pre, "B")) + kt(b.bwd(attn, "B")),
                comb_b,
                comb_b,
            )
        else:
            seg_f = (c_f, 0.0, 0.0, 0.0, 0.0, 0.0)
            seg_b = (rc + c_bB, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        segs[key] = (seg_f, seg_b, tp_f + cp_f + gather, re + tp_b + cp_b + gather)
        out = lcache[key] = {
            "F": F,
            "B": B,
            "I": I,
            "W": c_bW,
            "compute": c_f + rc + c_bB,
            "tp": tp_f + tp_b + (tp_f if recompute else 0.0),
            "cp": cp_f + cp_b + (cp_f if recompute else 0.0),
            "ep": ep_f + ep_b + (ep_f if recompute else 0.0),
            "fsdp": (F - c_f - e_f) + (B - rc - re - c_bB - e_b),
            "grad": (
                net.time_s(grad_op, L.group(rank, "dp_cp"), dense * t.grad_bytes)
                + net.time_s(grad_op, L.group(rank, "edp"), exp * t.grad_bytes)
            ),
            "param_ag": (
                net.time_s("all-gather", L.group(rank, "dp_cp"), dense * PARAM_BYTES)
                + net.time_s("all-gather", L.group(rank, "edp"), exp * PARAM_BYTES)
            )
            if L.zero in (1, 2)
            else 0.0,
        }
        return out

    n_chunks = len(b.chunks)
    emb_f, emb_b = kt(b.embed_kernels()), kt(b.bwd(b.embed_kernels(), "B"))
    head_f, head_b = kt(b.head_kernels()), kt(b.bwd(b.head_kernels(), "B"))
    head_i, head_w = kt(b.bwd(b.head_kernels(), "I")), kt(b.bwd(b.head_kernels(), "W"))

    def reduce_s(rank: int, dense: float, exp: float) -> float:
        """One data-parallel gradient reduction of a unit (fp32)."""
        return net.time_s(grad_op, L.group(rank, "dp_cp"), dense * t.grad_bytes) + net.time_s(
            grad_op, L.group(rank, "edp"), exp * t.grad_bytes
        )

    def gather_s(rank: int, dense: float, exp: float) -> float:
        """One all-gather of a unit's bf16 parameters."""
        return net.time_s("all-gather", L.group(rank, "dp_cp"), dense * PARAM_BYTES) + net.time_s(
            "all-gather", L.group(rank, "edp"), exp * PARAM_BYTES
        )

    # DualPipe's forward/backward pairs overlap the expert all-to-alls with the other half's
    # compute (the trace's ``ep_overlap``), every compute op of a pair on the SMs the
    # communication kernels leave free (``simulator.engine.compute.overlap_slowdown``).
    pair_overlap = name == "dualpipe" and b.dualpipe_ep and not global_aux
    slowdown = overlap_slowdown(cal)
    keys = ("F", "B", "I", "W", "compute", "tp", "cp", "ep", "fsdp", "grad", "param_ag", "pp_send")
    ranks_of = [L.rank_of(pp=s) for s in range(pp)]
    send_bytes = b.hidden_bytes / (L.tp if L.sequence_parallel else 1)
    ranks = []
    for s in range(pp):
        rank = ranks_of[s]
        tot = dict.fromkeys(keys, 0.0)
        own = [sched.model_chunk(name, s, c, pp, vpp) for c in range(n_local)]
        layers = [l for k in own for l in b.chunks[k]]
        for l in layers:
            for k_, v in layer(l, rank).items():
                tot[k_] += v
        extras, extras_by_unit = [], {}
        # The embedding and the head (output layer, loss, MTP modules) are parameter units
        # like the layers: reduced, ZeRO-1/2 gathered once, ZeRO-3 gathered per use.
        units = {
            u: (d, e)
            for u, d, e in memory.rank_parameter_units(
                model, L, [], has_embedding=0 in own, has_head=n_chunks - 1 in own
            )
        }
        for u, (f_, b_, i_, w_) in (("embed", (emb_f, emb_b, emb_b, 0.0)), ("head", (head_f, head_b, head_i, head_w))):
            if u not in units:
                continue
            g = gather_s(rank, *units[u])
            z3 = g if L.zero == 3 else 0.0
            extras.append(
                {
                    "F": f_ + z3,
                    "B": b_ + z3,
                    "I": i_ + z3,
                    "W": w_,
                    "compute": f_ + b_,
                    "fsdp": 2 * z3,
                    "grad": reduce_s(rank, *units[u]),
                    "param_ag": g if L.zero in (1, 2) else 0.0,
                }
            )
            extras_by_unit[u] = (f_, b_, z3)
        for extra in extras:
            for k_, v in extra.items():
                tot[k_] += v
        # Per action (one micro-batch through one local chunk): DualPipe's micro-batches take
        # one of the rank's two chunks each, the interleaved schedule's every chunk.
        per = 1.0 / n_local
        act = {k_: tot[k_] * per for k_ in ("F", "B", "I", "W")}
        # Pipeline sends of activations (forward) and their gradients (backward) to the
        # neighbouring stages, counted on the critical path: when they are slower than a
        # stage's compute per micro-batch they set the pipeline's pace.
        if pp > 1:
            nb = [
                ranks_of[(s + 1) % pp] if (s + 1 < pp or name == "interleaved-1f1b") else None,
                ranks_of[s - 1] if (s > 0 or name == "interleaved-1f1b") else None,
            ]
            if name == "dualpipe":  # chunk 0 flows down the stages, chunk 1 up: half each way
                send_f = send_b = sum(net.p2p_s(rank, x, send_bytes) for x in nb if x is not None) / 2
            else:
                send_f = net.p2p_s(rank, nb[0], send_bytes) if nb[0] is not None else 0.0
                send_b = net.p2p_s(rank, nb[1], send_bytes) if nb[1] is not None else 0.0
            act["F"] += send_f
            act["B"] += send_b
            act["I"] += send_b
            tot["pp_send"] = (send_f + send_b) * n_local
        mb_work = (act["F"] + act["B"]) * (1 if name == "dualpipe" else n_local)
        pair_mean = None
        if pair_overlap and pp > 1:
            busy_s, pair_mean = _dualpipe_busy(
                sched_counts=schedule_counts(name, s, pp, m, vpp, global_aux),
                own=own,
                chunks=b.chunks,
                layer=lambda l: layer(l, rank),
                seg=lambda l: segs[(id(b.layer_parts(l)), rank, model.is_moe_layer(l))],
                extras=extras_by_unit,
                n_chunks=n_chunks,
                send_f=send_f,
                send_b=send_b,
                slowdown=slowdown,
            )
            mb_work = busy_s / m
        all_units = memory.rank_parameter_units(model, L, layers, has_embedding=0 in own, has_head=n_chunks - 1 in own)
        dense, expert = sum(u[1] for u in all_units), sum(u[2] for u in all_units)
        # DualPipe: the two ranks holding a stage sum each unit's gradients (the shard under
        # ZeRO) after its data-parallel reduction, overlapping the backward like it.
        mirror_s = 0.0
        if name == "dualpipe" and pp > 1:
            pair = tuple(sorted((rank, ranks_of[pp - 1 - s])))
            shard = (lambda d, e: d / (L.dp * L.cp) + e / L.edp) if L.zero >= 1 else (lambda d, e: d + e)
            mirror_s = sum(net.time_s("all-reduce", pair, shard(d, e) * t.grad_bytes) for _, d, e in all_units)
        # Megatron-LM sums the tied (or MTP-shared) embedding table between the first and the
        # last stage after the data-parallel reduction (the trace's ``tied_embedding_sync``).
        tied_s = 0.0
        if (model.tied_embeddings or model.mtp_depth) and ((0 in own) != (n_chunks - 1 in own)):
            other_chunk = n_chunks - 1 if 0 in own else 0
            other = ranks_of[sched.chunk_owner(name, other_chunk, pp, vpp)[0]]
            if other != rank:
                table = math.ceil(model.vocab / L.tp) * model.hidden
                tied_s = net.time_s("all-reduce", tuple(sorted((rank, other))), table * t.grad_bytes)
        ranks.append(
            {
                "rank": rank,
                "tot": tot,
                "act": act,
                "work": mb_work,
                "layers": max(1, len(layers)),
                "dense": dense,
                "expert": expert,
                "mirror": mirror_s,
                "tied": tied_s,
                "pair": pair_mean,
            }
        )

    # -- the pipeline --------------------------------------------------------------------
    work = [r["work"] for r in ranks]
    slow = max(range(pp), key=lambda s: work[s])

    def mean(k_: str) -> float:
        """Per-action time ``k_`` averaged over the pipeline ranks."""
        return sum(r["act"][k_] for r in ranks) / pp

    busy = [m * w for w in work]
    if pp == 1:
        bubble = 0.0
    elif global_aux or name in ("gpipe", "1f1b", "interleaved-1f1b"):
        # Per action = one micro-batch through one local chunk: (pp-1)(F+B) for GPipe / 1F1B,
        # (pp-1)(F+B)/vpp of a rank's work per micro-batch when interleaved.
        bubble = (pp - 1) * (mean("F") + mean("B"))
    elif name == "zb-h1":
        bubble = max(0.0, (pp - 1) * (mean("F") + mean("I") - mean("W")))
    else:  # dualpipe
        # An overlapped pair F&B costs F + B: the simulator interleaves the two halves layer
        # by layer on one in-order compute stream, so a blocking all-to-all of one half still
        # stalls the stream (measured: DeepSeek-V3 on H800, pp8/pp16 DualPipe, simulated step
        # times within 2 % of F + B with no pair overlap).
        # DualPipe (DeepSeek-V3 §3.2.1, Table 2): (pp/2 - 1)(F&B + B - 3W), F&B the time of an
        # overlapped forward/backward pair (F + B when the pairs do not overlap).
        fb = sum(r["pair"] for r in ranks) / pp if all(r["pair"] is not None for r in ranks) else mean("F") + mean("B")
        bubble = max(0.0, (pp / 2 - 1) * (fb + mean("B") - 3 * mean("W")))
    makespan = max(busy) + bubble

    # -- data-parallel traffic, optimizer ------------------------------------------------------
    dp_end = start = tied = opt = 0.0
    b_act = mean("B")
    f_act = mean("F")
    # ZeRO-2/3 reduce-scatter every micro-batch's gradients (the trace's ``_grads_ready``);
    # a DualPipe micro-batch passes through one of the rank's two chunks.
    n_reductions = (m // 2 if name == "dualpipe" else m) if L.zero >= 2 else 1
    for s, r in enumerate(ranks):
        tot = r["tot"]
        R = tot["grad"] + r["mirror"]  # the last micro-batch's reductions
        total = n_reductions * tot["grad"] + r["mirror"]
        if t.overlap_grad_reduce:
            window = r["act"]["B"] * n_local / (2 if name == "dualpipe" else 1)  # the last micro-batch's backward
            slack = (min(s, pp - 1 - s) if name == "dualpipe" else s) * b_act
            exposed = max(R / r["layers"], R - window, total - m * r["work"]) - slack
        else:
            exposed = total
        dp_end = max(dp_end, exposed)
        tied = max(tied, r["tied"])
        G = tot["param_ag"]
        if G:
            start = max(start, max(G / r["layers"], G - r["act"]["F"] - s * f_act))
        kern = optimizer_kernels(r["dense"], L.zero, L.dp * L.cp, t.optimizer)
        if r["expert"]:
            kern += optimizer_kernels(r["expert"], L.zero, L.edp, t.optimizer)
        if t.offload_optimizer:
            shard = sum(k.bytes for k in kern) / OPTIMIZER_BYTES_PER_PARAM[t.optimizer]
            host = sc.cluster.host_bw_bytes_per_s
            o = (
                shard * (t.grad_bytes + PARAM_BYTES) / host
                + shard * OPTIMIZER_BYTES_PER_PARAM[t.optimizer] / HOST_UPDATE_BYTES_PER_S
            )
        else:
            o = kt(kern)
        opt = max(opt, o)
    step = makespan + start + max(0.0, dp_end) + tied + opt
    tot = ranks[slow]["tot"]
    share = m * (0.5 if name == "dualpipe" else 1.0)  # a DualPipe micro-batch visits one of two chunks
    return {
        "step_time_s": step,
        **{f"{k_}_s": share * tot[k_] for k_ in ("compute", "tp", "cp", "ep", "fsdp")},
        "pp_send_s": m * tot["pp_send"] / n_local,
        "bubble_s": bubble,
        "dp_s": start + max(0.0, dp_end) + tied,
        "optimizer_s": opt,
    }


def proxy_cost(p: Mapping, micro_batches: int, sc, net: Optional[NetModel] = None) -> float:
    """The ranking key of ``max_candidates``: lower is better. :func:`estimate_step_time`
    in seconds of ``sc``, the loaded scenario of layout ``p`` (``net`` reuses one
    :class:`NetModel` across candidates); ``p`` and ``micro_batches`` are the search's
    record of it."""
    return estimate_step_time(sc, net)["step_time_s"]
