"""The data-parallel side of one rank's program: gradient reduction per parameter unit (overlapped
with the backward, deferred, or per micro-batch under ZeRO-2/3), DualPipe's mirror-stage gradient sum,
the tied-embedding sum, ZeRO parameter all-gathers (ZeRO-3 with prefetch), the optimizer step (on the
device or the host) and the rank's static memory. Mixed into
:class:`~workloads.trace.program.RankProgram`."""

from __future__ import annotations

import math
from functools import cached_property

from workloads import memory
from workloads import schedules as sched
from workloads.trace.ops import Op
from workloads.trace.shared import (
    HOST_UPDATE_BYTES_PER_S,
    OPTIMIZER_BYTES_PER_PARAM,
    PARAM_BYTES,
    optimizer_kernels,
)


class ParamOps:
    """Data-parallel gradient and parameter traffic, the optimizer step and static memory of a rank (a
    part of its :class:`~workloads.trace.program.RankProgram`, held as ``p``, whose state it reads
    and writes)."""

    def __init__(self, program) -> None:
        self.p = program  # the rank's program: its state, its op helpers and its other parts

    # ---- data-parallel gradient and parameter traffic --------------------------------
    # Parameters move in units (one bucket each): every transformer layer, the
    # embedding table (first chunk) and the head (last chunk: final norm, output
    # projection or the tied table's copy, MTP modules), as
    # :func:`memory.rank_parameter_units` cuts them.
    @cached_property
    def units(self) -> dict[str, tuple[float, float]]:
        """``unit name -> (dense, expert)`` parameters this rank holds."""
        b, L = self.p.b, self.p.b.L
        own = [self.p.chunk_index(c) for c in range(self.p.n_local)]
        return {
            name: (float(d), float(e))
            for name, d, e in memory.rank_parameter_units(
                b.model, L, self.my_layers(), has_embedding=0 in own, has_head=b.n_chunks - 1 in own
            )
        }

    def unit_order(self) -> list[str]:
        """The units in forward order over the rank's local chunks."""
        out = []
        for c in range(self.p.n_local):
            k = self.p.chunk_index(c)
            if k == 0:
                out.append("embed")
            out += [f"L{l}" for l in self.p.b.chunks[k]]
            if k == self.p.b.n_chunks - 1:
                out.append("head")
        return [u for u in out if u in self.units]

    @staticmethod
    def _unit_layer(unit: str) -> int:
        return int(unit[1:]) if unit.startswith("L") else -1

    def _grad_coll(self) -> str:
        return "all-reduce" if self.p.b.L.zero == 0 else "reduce-scatter"

    def _grads_ready(self, unit: str, k: int, mb: int, is_last_grad: bool) -> None:
        """A backward pass has produced ``unit``'s gradients for micro-batch ``mb``.

        ZeRO-0/1 reduce once, after the last micro-batch (Megatron-LM accumulates into
        a full-size fp32 buffer, then all-reduces or reduce-scatters it). ZeRO-2 and
        ZeRO-3 reduce-scatter after *every* micro-batch's backward and keep only the
        shard, which is what their sharded gradient memory assumes: DeepSpeed stage 2
        "communicates during non gradient accumulation boundaries as well"
        (deepspeedai/DeepSpeed PR #338, ``allreduce_gradients``), and PyTorch FSDP
        reduce-scatters in every micro-batch's backward unless told not to
        (pytorch/pytorch PR #126166: "FSDP2 offers (1) [reduce-scatter per microbatch
        backward, storing the sharded gradients] without any intervention")."""
        per_mb = self.p.b.L.zero >= 2
        if is_last_grad or per_mb:
            self._grad_sync(unit, k, mb if per_mb else -1, is_last_grad)

    def _grad_sync(self, unit: str, k: int, mb: int, last: bool, deferred: bool = False) -> None:
        if unit not in self.units:
            return
        if not self.p.b.t.overlap_grad_reduce and not deferred:
            self.p.deferred_grads.append((unit, k, mb, last))
            return
        dense, expert = self.units[unit]
        dep = self.p.after_compute()
        ids = []
        for axis, p, nm in (("dp_cp", dense, "grad"), ("edp", expert, "egrad")):
            op = self.p.collective(
                self._grad_coll(),
                axis,
                p * self.p.b.t.grad_bytes,
                f"{unit}.{nm}",
                "sync",
                mb,
                k,
                self._unit_layer(unit),
                dep,
                stream="dp",
            )
            if op:
                ids.append(op.id)
                self.p.grad_ops.append(op.id)
        if last:
            self.p.reduced.append((unit, ids or dep))

    def mirror_grad_sync(self) -> None:
        """DualPipe keeps each stage's parameters on two ranks (r and pp-1-r); the pair
        sums its gradients unit by unit as soon as both copies are reduced over the
        data-parallel group, overlapping the rest of the backward pass: the full
        gradients without ZeRO, each rank's reduce-scattered shard with it (the shards
        of the two copies line up, so the pair sums shard against shard).

        The sums run on their own ``mirror`` stream in one order on both ranks of the
        pair (model chunk of the later stage first, then backward order within a chunk:
        DualPipe finishes the stage farther from the pipeline ends first on both ranks);
        the pair's two ranks produce a unit's gradients at different times, so issue
        order alone would cross and deadlock."""
        b, L = self.p.b, self.p.b.L
        mirror = self.p.rank_at_stage(sched.weight_peer(b.w.schedule, self.p.stage, L.pp))
        if mirror == self.p.rank:
            return
        group = tuple(sorted((self.p.rank, mirror)))
        chunk_of = {u: self._unit_chunk(u) for u, _ in self.p.reduced}

        def key(item):
            u = item[0]
            pos = b.model.layers if u == "head" else self._unit_layer(u)
            return (-chunk_of[u], -pos)

        for unit, deps in sorted(self.p.reduced, key=key):
            dense, expert = self.units[unit]
            if L.zero >= 1:
                dense, expert = dense / (L.dp * L.cp), expert / L.edp
            op = self.p.collective(
                "all-reduce",
                "pp_mirror",
                (dense + expert) * self.p.b.t.grad_bytes,
                f"{unit}.mirror",
                "sync",
                -1,
                -1,
                self._unit_layer(unit),
                deps,
                stream="mirror",
                group=group,
            )
            if op:
                self.p.grad_ops.append(op.id)

    def _unit_chunk(self, unit: str) -> int:
        """Model chunk a unit belongs to."""
        if unit == "embed":
            return 0
        if unit == "head":
            return self.p.b.n_chunks - 1
        l = self._unit_layer(unit)
        return next(k for k, r in enumerate(self.p.b.chunks) if l in r)

    def tied_embedding_sync(self) -> None:
        """The first and last pipeline chunks each hold the embedding table when the
        output head is tied to it or the MTP modules look tokens up in it; when they
        live on different ranks, those two ranks all-reduce the table's full fp32
        gradient after the data-parallel reduction, as Megatron-LM's
        ``finalize_model_grads`` does (``_allreduce_word_embedding_grads`` over the
        embedding group, after ``finish_grad_sync``)."""
        b, L, m = self.p.b, self.p.b.L, self.p.b.model
        if not (m.tied_embeddings or m.mtp_depth):
            return
        own = {self.p.chunk_index(c) for c in range(self.p.n_local)}
        has_first, has_last = 0 in own, b.n_chunks - 1 in own
        if has_first == has_last:  # neither end, or both (DualPipe's end ranks, pp = 1)
            return
        other_chunk = b.n_chunks - 1 if has_first else 0
        other = self.p.rank_at_stage(sched.chunk_owner(b.w.schedule, other_chunk, L.pp, L.vpp)[0])
        if other == self.p.rank:
            return
        table = math.ceil(m.vocab / L.tp) * m.hidden
        self._after_grads("pp_embed", table, "embed.tied_grad", group=tuple(sorted((self.p.rank, other))))

    def _after_grads(self, axis: str, params: float, name: str, group=None) -> None:
        """An all-reduce of ``params`` gradients over ``axis`` once the rank's gradient
        reductions and its last compute are done, on the mirror stream; the optimizer waits
        for it."""
        op = self.p.collective(
            "all-reduce",
            axis,
            params * self.p.b.t.grad_bytes,
            name,
            "sync",
            -1,
            -1,
            -1,
            self.p.grad_ops + self.p.after_compute(),
            stream="mirror",
            group=group,
        )
        if op:
            self.p.grad_ops.append(op.id)

    def tp_replicated_grad_sync(self) -> None:
        """Under sequence parallelism each TP rank's gradients of the parameters TP leaves
        whole (norms, routers, row-parallel biases, duplicated MLA down projections:
        :func:`parameters.tp_replicated_params`) differ, and Megatron-Core sums them over the
        TP group in one coalesced all-reduce after the data-parallel reduction and before the
        embedding's (``finalize_model_grads``, megatron/core/distributed/finalize_model_grads.py
        at NVIDIA/Megatron-LM d98e8a64): :func:`memory.rank_tp_replicated_params`."""
        b, L, m = self.p.b, self.p.b.L, self.p.b.model
        if not (L.sequence_parallel and L.tp > 1):
            return
        has_head = b.n_chunks - 1 in {self.p.chunk_index(c) for c in range(self.p.n_local)}
        self._after_grads(
            "tp", memory.rank_tp_replicated_params(m, L, self.my_layers(), has_head), "tp_replicated.grad"
        )

    def my_layers(self) -> list[int]:
        out = []
        for c in range(self.p.n_local):
            out.extend(self.p.b.chunks[self.p.chunk_index(c)])
        return out

    def param_gathers(self) -> None:
        """ZeRO-1/2: all-gather the updated parameter shards, one bucket per unit
        (embedding, layers, head), at the start of the step: overlapped with the forward
        pass, each unit's first forward waiting for its own bucket
        (``training.overlap_param_gather``), or all of them before the first forward (the
        distributed optimizer's synchronous gathers after its step; the gathers run one
        after another on the rank's ``dp`` stream, so the last one ends last)."""
        t = self.p.b.t
        last = None
        for unit in self.unit_order():
            dense, expert = self.units[unit]
            # FP8 primary weights: the layers' updated shards are gathered in FP8, except MXFP8
            # weights, which Megatron-Core gathers as BF16 into the gradient buffer and quantises
            # after (param_and_grad_buffer.py at NVIDIA/Megatron-LM d98e8a64: the shared buffer
            # viewed as bfloat16; moe/README.md: FP8 halves the parameter all-gather "except MXFP8")
            fp8_gather = t.fp8_params and t.fp8_recipe != "mxfp8"
            per = 1 if (fp8_gather and unit.startswith("L")) else PARAM_BYTES
            ids = []
            for axis, p in (("dp_cp", dense), ("edp", expert)):
                op = self.p.collective(
                    "all-gather",
                    axis,
                    p * per,
                    f"{unit}.param_ag",
                    "sync",
                    -1,
                    -1,
                    self._unit_layer(unit),
                    [],
                    stream="dp",
                )
                if op:
                    ids.append(op.id)
            if ids:
                self.p.param_gather[unit] = last = ids[-1]
        if not t.overlap_param_gather and last is not None:
            self.p.param_gather = dict.fromkeys(self.p.param_gather, last)

    def _params_for(self, unit: str, mb: int, k: int, phase: str) -> list[int]:
        """What a forward of ``unit`` waits for: its ZeRO-1/2 gather of this step, or
        its ZeRO-3 gather."""
        out = self._zero3_gather(unit, mb, k, phase)
        if unit in self.p.param_gather:
            out.append(self.p.param_gather[unit])
        return out

    def _zero3_gather(self, unit: str, mb: int, k: int, phase: str) -> list[int]:
        """ZeRO-3 / FSDP: gather a unit's parameters before each use, at most one
        unit ahead of the compute stream (prefetch depth 1)."""
        if self.p.b.L.zero != 3 or unit not in self.units:
            return []
        dense, expert = self.units[unit]
        window = self.p.compute_history[-2:-1]  # may start once the op before last is done
        ids = []
        for axis, p in (("dp_cp", dense), ("edp", expert)):
            op = self.p.collective(
                "all-gather",
                axis,
                p * PARAM_BYTES,
                f"{unit}.fsdp_ag",
                phase,
                mb,
                k,
                self._unit_layer(unit),
                window,
                stream="fsdp",
            )
            if op:
                ids.append(op.id)
        return ids

    def optimizer(self) -> None:
        L, t = self.p.b.L, self.p.b.t
        dense, expert = self.local_params()
        kern = optimizer_kernels(dense, L.zero, L.dp * L.cp, t.optimizer)
        if expert:
            kern += optimizer_kernels(expert, L.zero, L.edp, t.optimizer)
        if not t.offload_optimizer:
            self.p.compute("optimizer", kern, "opt", -1, -1, -1, deps=self.p.grad_ops)
            return
        # ZeRO-Offload: fp32 gradients down to the host, the update on the CPU,
        # bf16 parameters back up; the compute stream waits for the new weights.
        shard = sum(k.bytes for k in kern) / OPTIMIZER_BYTES_PER_PARAM[t.optimizer]
        # after the last backward kernel too: with dp·cp = 1 there is no reduction to wait on
        d2h = self.host("grads.d2h", shard * t.grad_bytes, "opt", deps=self.p.after_compute() + self.p.grad_ops)
        cpu = self.host(
            "optimizer.cpu",
            shard * OPTIMIZER_BYTES_PER_PARAM[t.optimizer],
            "opt",
            deps=[d2h.id],
            rate=HOST_UPDATE_BYTES_PER_S,
        )
        h2d = self.host("params.h2d", shard * PARAM_BYTES, "opt", deps=[cpu.id])
        self.p.compute("optimizer.wait", (), "opt", -1, -1, -1, deps=[h2d.id])

    def host(self, name: str, size: float, phase: str, deps=(), mb=-1, chunk=-1, layer=-1, rate=0.0, mem=()) -> Op:
        """A transfer over the device's host link (or, with ``rate``, CPU work)."""
        return self.p.b.add(
            rank=self.p.rank,
            stream="offload",
            kind="host",
            name=name,
            phase=phase,
            mb=mb,
            chunk=chunk,
            layer=layer,
            deps=tuple(deps),
            size_bytes=size,
            rate_bytes_per_s=rate,
            mem=tuple(mem),
        )

    def local_params(self) -> tuple[float, float]:
        """(dense, expert) parameters this rank holds, counting every local chunk
        (:func:`memory.rank_parameter_counts`: the sum of its units)."""
        return (sum(d for d, _ in self.units.values()), sum(e for _, e in self.units.values()))

    def static_memory(self) -> dict[str, float]:
        L, t = self.p.b.L, self.p.b.t
        dense, expert = self.local_params()
        s = memory.training_state_bytes(dense, expert, L, t)
        buffers = memory.training_sharding_buffer_bytes(
            self.p.b.model, L, t, [d + e for d, e in self.units.values()], weight_dtype_bytes=PARAM_BYTES
        )
        layer_params = sum(d + e for u, (d, e) in self.units.items() if u.startswith("L"))
        cache = memory.fp8_weight_cache_bytes(layer_params, t, self.p.b.w.chip_family, L.zero)
        return {
            "weights": s.weights + cache,
            "gradients": s.gradients,
            "optimizer": 0.0 if t.offload_optimizer else s.optimizer,  # offloaded: in host memory
            "activations": 0.0,
            "buffers": buffers,
        }
