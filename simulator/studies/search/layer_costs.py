"""Per-layer costs of the analytic step-time estimate (:mod:`simulator.studies.search.estimate`).

:class:`StepCosts` holds what every part of the estimate shares -- the scenario, its trace
builder (whose sizes the estimate reuses, so that no formula is repeated), the network model and
a cache of kernel times -- and costs one layer's forward and backward on a rank: compute on the
roofline, blocking TP / CP / EP communication, ZeRO-3 gathers and the layer's data-parallel
traffic.
"""

from __future__ import annotations

from simulator.studies.search.network_model import NetModel
from workloads import memory
from workloads import schedules as sched

#: Kernel times by chip, calibration and dtype, shared by the estimates of a process (a
#: search or map screen estimates thousands of layouts whose layers share their kernels);
#: cleared when it holds :data:`_KERNEL_TIMES_MAX` kernel groups.
_KERNEL_TIMES: dict = {}
_KERNEL_TIMES_MAX = 65536


def _kernel_times(chip, cal, dtype: str) -> dict:
    """The shared cache of kernel groups' seconds on ``chip`` under ``cal`` in ``dtype``."""
    if sum(map(len, _KERNEL_TIMES.values())) >= _KERNEL_TIMES_MAX:
        _KERNEL_TIMES.clear()
    return _KERNEL_TIMES.setdefault((chip, cal, dtype), {})


class StepCosts:
    """The shared state of one step-time estimate of scenario ``sc`` and its cached costs."""

    def __init__(self, sc, net: NetModel | None = None):
        from simulator.engine.compute import calibration_for, kernels_time_s, overlap_slowdown
        from workloads.trace.shared import TraceBuilder

        self.sc = sc
        self.L, self.t, self.model, self.name = sc.layout, sc.training, sc.model, sc.schedule
        self.chip = sc.cluster.chip
        self.net = net if net is not None else NetModel(sc.cluster, sc.network_calibration(), sc.algorithms)
        self.cal = calibration_for(self.chip, dict(sc.compute_overrides))
        self._kernels_time_s = kernels_time_s
        # The trace builder's sizes, so that the estimate and the simulated trace agree on
        # every byte and FLOP (no formula is repeated here).
        self.b = b = TraceBuilder(sc.workload(), shared_backward=True)
        self.m, self.pp, self.vpp = b.m, self.L.pp, self.L.vpp
        self.n_local = sched.local_chunks(self.name, self.vpp)
        self.sp = self.L.sequence_parallel and self.L.tp > 1
        self.recompute = self.t.recompute == "full"
        self.global_aux = self.model.is_moe and self.t.balance == "aux-loss-global"
        self.grad_op = "all-reduce" if self.L.zero == 0 else "reduce-scatter"
        self.slowdown = overlap_slowdown(self.cal)
        self.kcache: dict = _kernel_times(self.chip, self.cal, self.t.dtype)
        self.kid: dict = {}  # id(tuple of kernels) -> (it, seconds)
        self.lcache: dict = {}
        self.segs: dict = {}

    def kt(self, kernels) -> float:
        """Seconds of a list of kernels on the roofline (cached by content, and by identity for
        the trace builder's long-lived tuples: hashing a tuple of kernels hashes every kernel)."""
        hit = self.kid.get(id(kernels))
        if hit is not None and hit[0] is kernels:
            return hit[1]
        key = tuple(kernels)
        if key not in self.kcache:
            self.kcache[key] = self._kernels_time_s(key, self.chip, self.cal, self.t.dtype)
        out = self.kcache[key]
        if isinstance(kernels, tuple):  # held here, so that its id is not reused while cached
            self.kid[id(kernels)] = (kernels, out)
        return out

    def ep_collective(self, rank: int, layer: int, combine: bool, backward: bool = False) -> float:
        """One of a MoE layer's expert-parallel collectives on ``rank``: the dispatch (or
        ``combine``) of the forward, or its gradient (``backward``). An all-to-all, or under
        Megatron-Core's allgather dispatcher an all-gather (the dispatch, the combine's
        gradient) or reduce-scatter over EP, sized as the trace sizes it."""
        b = self.b
        if self.t.moe_token_dispatcher != "allgather":
            return self.a2a(rank, b.dispatch_bytes(combine or backward, layer))
        gather = combine == backward
        op = "all-gather" if gather else "reduce-scatter"
        return self.net.time_s(op, self.L.group(rank, "ep"), b.allgather_bytes(gather, backward))

    def a2a(self, rank: int, size: float) -> float:
        """One expert all-to-all of ``size`` bytes on ``rank``'s EP group."""
        # node-limited routing: the rail hop carries distinct nodes / top_k of the copies,
        # pipelined with the NVLink fan-out (workloads.trace.builder.RankProgram.all_to_all)
        nl = self.b.node_limited()
        frac = 1.0 if nl is None else min(1.0, nl[0] / self.model.moe.top_k)
        return self.net.time_s("all-to-all", self.L.group(rank, "ep"), size, scaleout_fraction=frac)

    def reduce_s(self, rank: int, dense: float, exp: float) -> float:
        """One data-parallel gradient reduction of a unit (fp32)."""
        L, net, t = self.L, self.net, self.t
        return net.time_s(self.grad_op, L.group(rank, "dp_cp"), dense * t.grad_bytes) + net.time_s(
            self.grad_op, L.group(rank, "edp"), exp * t.grad_bytes
        )

    def gather_s(self, rank: int, dense: float, exp: float) -> float:
        """One all-gather of a unit's bf16 parameters."""
        from workloads.trace.shared import PARAM_BYTES

        return self.net.time_s("all-gather", self.L.group(rank, "dp_cp"), dense * PARAM_BYTES) + self.net.time_s(
            "all-gather", self.L.group(rank, "edp"), exp * PARAM_BYTES
        )

    def layer_key(self, l: int, rank: int) -> tuple:
        """The cache key of layer ``l`` on ``rank`` (layers of one shape share it)."""
        return (id(self.b.layer_parts(l)), rank, self.model.is_moe_layer(l))

    def layer_comm(self, l: int, rank: int, expert, shared) -> tuple:
        """Layer ``l``'s blocking communication on ``rank`` per micro-batch: ``(tp_f, tp_b, cp_f,
        cp_b, ep_f, ep_b, dispatch, combine, combine_backward)`` (the last three raw all-to-alls)."""
        L, net, b, kt = self.L, self.net, self.b, self.kt
        tp_f = tp_b = cp_f = cp_b = ep_f = ep_b = 0.0
        disp = comb = comb_b = None
        if L.tp > 1:
            g, h = L.group(rank, "tp"), b.hidden_bytes
            attn_ag, attn_back, attn_back_ag = b.attn_tp_bytes  # hidden states or MLA's latents
            ag_attn = net.time_s("all-gather", g, attn_ag)
            back_ag = net.time_s("all-gather", g, attn_back_ag)
            if self.sp:  # the attention's gather and reduce-scatter, the MLP's, and their gradients
                ag, rs = net.time_s("all-gather", g, h), net.time_s("reduce-scatter", g, h)
                tp_f = ag_attn + rs + ag + rs
                # the backward's second gather of the column-parallel GEMMs' inputs and the
                # reduce-scatter of their input gradient hide behind those GEMMs' gradients
                # (program_tp_overlap.TpOverlapOps.tp_backward)
                attn, pre = b.layer_parts(l)[:2]
                # a shard-routing MoE block's shared experts regather as an MLP (without their overlap)
                shared_mlp = expert and shared and L.routes_sp_shard and not self.t.moe_shared_expert_overlap
                mlp = shared if shared_mlp else pre
                tp_b = ag + back_ag + ag
                for block, scatter in ((attn, net.time_s("reduce-scatter", g, attn_back)), (mlp, rs)):
                    split = b.column_split(block, "B")
                    if split is None:
                        tp_b += scatter
                        continue
                    again = net.time_s("all-gather", g, b.regather_bytes(attention=block is attn))
                    tp_b += max(0.0, again - self.kt(split[1])) + max(0.0, scatter - self.kt(split[2]))
            else:
                ar = net.time_s("all-reduce", g, h)
                tp_f, tp_b = ag_attn + 2 * ar, ar + net.time_s("all-reduce", g, attn_back)
        if L.cp > 1:
            g = L.group(rank, "cp")
            cp_f = net.time_s("all-gather", g, b.kv_bytes() * L.cp)
            cp_b = net.time_s("reduce-scatter", g, b.kv_bytes() * L.cp)
        if expert and L.ep > 1:
            disp, comb = self.ep_collective(rank, l, False), self.ep_collective(rank, l, True)
            ep_f = max(0.0, disp - kt(shared)) + comb
            comb_b = self.ep_collective(rank, l, True, backward=True)
            disp_b = self.ep_collective(rank, l, False, backward=True)
            ep_b = max(0.0, comb_b - kt(b.bwd(shared, "B"))) + disp_b
        return tp_f, tp_b, cp_f, cp_b, ep_f, ep_b, disp, comb, comb_b

    def layer_segments(self, parts, rc: float, c_f: float, c_bB: float, a2as: tuple) -> tuple:
        """DualPipe's overlapped pairs: the layer's compute in the order the trace runs it and its
        all-to-alls (raw), forward and backward, for :func:`~simulator.studies.search.dualpipe_pairs.pair_time`."""
        attn, pre, shared, expert, post = parts
        b, kt = self.b, self.kt
        disp, comb, comb_b = a2as
        if expert and self.L.ep > 1:
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
        return seg_f, seg_b

    def gather_exposed(self, gather: float, parts) -> tuple[float, float, float]:
        """A layer's ZeRO-3 gather as exposed in its forward, its backward and its input-gradient
        pass (zero-bubble schedules split the backward). The trace lets a gather start once the
        compute op before last is done (prefetch depth one, ``program_params._zero3_gather``), so
        it hides behind the previous layer's last op: in a forward the dense MLP (an MoE layer's
        last op, the unpermutation after the combine, is short and the combine holds the NICs
        the gather needs: counted whole), in a backward the attention block's backward (its
        input-gradient part in an input-gradient pass). With tensor parallelism the last op is
        the zero-cost join after the block's collective, and the gather is counted whole. The
        previous layer's op is taken as this layer's (the layers of a stage are alike)."""
        if gather == 0.0 or self.L.tp > 1:
            return gather, gather, gather
        attn, pre, _, expert, _ = parts
        window_f = 0.0 if expert else self.kt(pre)
        hidden = (max(0.0, gather - self.kt(self.b.bwd(attn, part))) for part in ("B", "I"))
        return (max(0.0, gather - window_f), *hidden)

    def layer(self, l: int, rank: int) -> dict:
        """Per micro-batch: one layer's forward / backward parts on ``rank``."""
        L, t, b, kt = self.L, self.t, self.b, self.kt
        parts = b.layer_parts(l)
        key = self.layer_key(l, rank)
        if key in self.lcache:
            return self.lcache[key]
        _, _, shared, expert, _ = parts
        full = b.layer_all(l)
        c_f, c_bB, c_bI, c_bW = kt(full), kt(b.bwd(full, "B")), kt(b.bwd(full, "I")), kt(b.bwd(full, "W"))
        tp_f, tp_b, cp_f, cp_b, ep_f, ep_b, *a2as = self.layer_comm(l, rank, expert, shared)
        dense, exp = b.layer_param_split(l)
        gather = 0.0
        if L.zero == 3:
            gather = self.gather_s(rank, dense, exp)
        rc, re = (c_f, tp_f + cp_f + ep_f) if self.recompute else (0.0, 0.0)
        if not self.recompute and memory.recomputed_kernel_names(t):
            rc = kt(b.saved_recompute_kernels(l))  # norms, MLA up-projections, SwiGLUs
        e_f, e_b = tp_f + cp_f + ep_f, tp_b + cp_b + ep_b
        g_f, g_b, g_i = self.gather_exposed(gather, parts)
        F = c_f + e_f + g_f
        B = rc + re + c_bB + e_b + g_b
        I = rc + re + c_bI + e_b + g_i
        # What blocks the stream besides a DualPipe pair's all-to-alls (TP, CP, ZeRO-3 gathers,
        # a full recompute's own collectives) is added to the pair whole.
        seg_f, seg_b = self.layer_segments(parts, rc, c_f, c_bB, tuple(a2as))
        self.segs[key] = (seg_f, seg_b, tp_f + cp_f + g_f, re + tp_b + cp_b + g_b)
        rcp = self.recompute
        out = self.lcache[key] = {
            "F": F,
            "B": B,
            "I": I,
            "W": c_bW,
            "compute": c_f + rc + c_bB,
            "tp": tp_f + tp_b + (tp_f if rcp else 0.0),
            "cp": cp_f + cp_b + (cp_f if rcp else 0.0),
            "ep": ep_f + ep_b + (ep_f if rcp else 0.0),
            "fsdp": 2 * gather,  # the gathers' time; F and B count what stays exposed
            "grad": self.reduce_s(rank, dense, exp),
            "param_ag": self.gather_s(rank, dense, exp) if L.zero in (1, 2) else 0.0,
        }
        return out
