"""The layer-level ops of one rank's program: per transformer layer, the forward (and recomputed)
attention and MLP / MoE blocks with their tensor-, context- and expert-parallel collectives, the
MoE block that routes the sequence-parallel shard (Megatron-Core's), the activation stash and its
host offload, and the backward passes (fused ``B`` or split ``I`` / ``W``). Mixed into
:class:`~workloads.trace.program.RankProgram`."""

from __future__ import annotations

from dataclasses import replace

from workloads import activations
from workloads.trace.ops import Op
from workloads.trace.shared import (
    INPUT_GRAD_FREED_FRACTION,
)


class LayerOps:
    """Forward and backward ops of a rank's layers (a part of its
    :class:`~workloads.trace.program.RankProgram`, held as ``p``, whose state it reads and writes):
    attention, MLP / MoE blocks with their TP, CP and EP collectives, recomputation, activation
    stash and offload."""

    def __init__(self, program) -> None:
        self.p = program  # the rank's program: its state, its op helpers and its other parts

    # ---- forward ---------------------------------------------------------------
    def forward(self, a, path, pos, layers):
        b = self.p.b
        deps: list = []
        own = None  # this action's last compute op
        if pos > 0:
            self.p._recv("F", path, pos, a.mb, deps)
        else:
            own = self.p.compute(
                "embed.F",
                b.embed_kernels(),
                "F",
                a.mb,
                pos,
                -1,
                deps=self.p.param_ops._params_for("embed", a.mb, pos, "F"),
            )
        for l in layers:
            deps += self.p.param_ops._params_for(f"L{l}", a.mb, pos, "F")
            handed = yield from self.layer_forward(l, a.mb, pos, deps, recompute=False)
            own = self.p.last_compute
            deps = []
            if not handed:
                yield  # no all-to-all to hand over at: hand over at the layer's end
        if pos == len(path) - 1:
            head = own = self.p.compute(
                "head.F",
                b.head_kernels(),
                "F",
                a.mb,
                pos,
                -1,
                deps=self.p.param_ops._params_for("head", a.mb, pos, "F"),
                mem=(("activations", self._head_bytes(), "start"),),
            )
            b.tags[("HEAD", a.mb, self.p.rank)] = head.id
        self.p._send("F", path, pos, a.mb, after=own)

    def _head_bytes(self) -> float:
        """Activations the last chunk's head op keeps: output layer and MTP modules."""
        b = self.p.b
        key = ("head", "stash")
        if key not in b._stash_cache:
            head = activations.head_activation_bytes(b.model, b.shard)
            b._stash_cache[key] = head + activations.mtp_activation_bytes(b.model, b.shard, b.policy)
        return b._stash_cache[key]

    def layer_forward(self, l: int, mb: int, k: int, deps: list, recompute: bool):
        """Generate one layer's forward ops (or its recomputation). A generator: it
        yields wherever it has issued an expert all-to-all and its next op would wait
        for it (an overlapped pair hands over to its other half there, see
        :meth:`_interleave`), and returns how many times it yielded."""
        b, L = self.p.b, self.p.b.L
        handed = 0
        attn, pre, shared, expert, post = b.layer_parts(l)
        phase = "R" if recompute else "F"
        sp = L.sequence_parallel
        deps = list(deps)
        # Attention block: [TP all-gather] [CP K/V all-gather] compute, TP reduce-scatter/all-reduce.
        beside: list = []  # TP all-gather chunks beside the block (program_tp_overlap)
        gather = b.attn_tp_bytes[0]  # the hidden states, or MLA's latents (TraceBuilder.attn_tp_bytes)
        if gather:
            wait, beside = self.p.tp_ops.tp_gather(
                f"L{l}.attn.ag", phase, mb, k, l, deps + self.p.after_compute(), size=gather
            )
            deps = wait or deps
        if recompute:
            mem = (("activations", self._recompute_transient(l), "start"),)
        else:
            mem = (("activations", self._stash(l), "end"),)
        if L.cp > 1:
            op = self.cp_attention(l, attn, phase, mb, k, deps, mem, recompute)
        else:
            op = self.p.tp_ops.tp_block(f"L{l}.attn.{phase}", attn, phase, mb, k, l, deps, mem, recompute)
        out = self.p.tp_ops.tp_scatter(
            "reduce-scatter" if sp else "all-reduce", f"L{l}.attn.out", phase, mb, k, l, op, beside
        )
        deps, beside = ([out.id] if out else []), []
        if expert and L.routes_sp_shard:
            handed = yield from self.shard_moe_forward(l, mb, k, deps, phase, recompute)
            self._offload_stash(l, mb, k, recompute)
            return handed
        if sp and out:
            wait, beside = self.p.tp_ops.tp_gather(f"L{l}.mlp.ag", phase, mb, k, l, deps, overlap=not expert)
            deps = wait or deps
        op = self.p.tp_ops.tp_block(f"L{l}.mlp.{phase}", pre, phase, mb, k, l, deps, (), recompute, overlap=not expert)
        if expert:
            overlap = b.t.moe_shared_expert_overlap
            if shared and not overlap:  # Megatron's default: the shared experts before the dispatch
                op = self.p.compute(f"L{l}.shared.{phase}", shared, phase, mb, k, l, recompute=recompute)
            self._host_sync(op)
            d = self.p.all_to_all(b.dispatch_bytes(False, l), f"L{l}.dispatch", phase, mb, k, l, [op.id])
            if shared and overlap:  # --moe-shared-expert-overlap: while the dispatch is in flight
                self.p.compute(f"L{l}.shared.{phase}", shared, phase, mb, k, l, recompute=recompute)
            if d:
                handed += 1
                yield
            op = self.p.compute(
                f"L{l}.experts.{phase}", expert, phase, mb, k, l, deps=[d.id] if d else [], recompute=recompute
            )
            c = self.p.all_to_all(b.dispatch_bytes(True, l), f"L{l}.combine", phase, mb, k, l, [op.id])
            if c:
                handed += 1
                yield
            op = self.p.compute(
                f"L{l}.moe_out.{phase}", post, phase, mb, k, l, deps=[c.id] if c else [], recompute=recompute
            )
        coll = "reduce-scatter" if sp else "all-reduce"
        out = self.p.tp_ops.tp_scatter(coll, f"L{l}.mlp.out", phase, mb, k, l, op, beside, overlap=not expert)
        if out:
            # The next layer's compute waits for this collective: a zero-cost join on
            # the compute stream carries the dependency in stream order.
            self.p.compute(f"L{l}.join", (), phase, mb, k, l, deps=[out.id])
        self._offload_stash(l, mb, k, recompute)
        return handed

    def _host_sync(self, op: Op) -> None:
        """Mark ``op``, the last compute op before a MoE layer's dispatch, as a blocking
        device-to-host read (``training.moe_host_sync``, :mod:`simulator.engine.host`):
        Megatron-Core's all-to-all dispatcher copies the token counts to the host on a side
        stream after the router and synchronises on them before the expert all-to-all
        (megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher
        ``_maybe_dtoh_and_synchronize``, ``self.d2h_event.synchronize()`` at
        ``cuda_sync_point`` "before_ep_alltoall"; NVIDIA/Megatron-LM commit d98e8a6), unless
        the experts are padded to capacity (``drop_and_pad``). The host blocks until the GPU
        has run everything issued before (the stream is in order), shared experts included
        where they run before the router. The allgather dispatcher reads them after its gather
        (:meth:`RankProgram.allgather_dispatch` marks that op), here only where it gathers
        nothing over EP."""
        b = self.p.b
        if b.t.moe_host_sync and (b.t.moe_token_dispatcher != "allgather" or b.L.ep == 1):
            op.host_sync = True

    def _offload_stash(self, l: int, mb: int, k: int, recompute: bool) -> None:
        """Activation offload: copy layer ``l``'s stash to the host after its forward."""
        if self.p.b.t.offload_activations and not recompute:
            stash = self._stash(l)
            self.p.param_ops.host(
                f"L{l}.act.d2h",
                stash,
                "F",
                deps=self.p.after_compute(),
                mb=mb,
                chunk=k,
                layer=l,
                mem=(("activations", -stash, "end"),),
            )

    # ---- MoE block routing the sequence-parallel shard (Megatron-Core's) -------------
    # Megatron-Core's all-to-all dispatcher (megatron/core/transformer/moe/token_dispatcher.py,
    # MoEAlltoAllTokenDispatcher) routes the sequence-parallel shard each TP rank holds
    # after the attention block's reduce-scatter ([S/TP, B, H]): no TP all-gather before
    # the router; all-to-all over the EP group (under MoE Parallel Folding it spans the
    # TP ranks); all-gather over the expert-TP group (``gather_from_sequence_parallel_region``
    # on the ETP group, the TP group itself where ``etp = tp``) before the expert GEMMs
    # (each ETP rank computes 1/etp of every expert's width over the assignments of its
    # etp ranks) and reduce-scatter over it after them; all-to-all back, and the output is
    # again the SP shard, so no TP reduce-scatter follows (ParallelLayout.routes_sp_shard).
    # Shared experts keep the attention's TP split ("the parallelism patterns of the shared
    # experts follow the settings of the dense part", megatron/core/transformer/moe/README.md):
    # a TP all-gather of the block input before them and a reduce-scatter of their output.

    def etp_bytes(self, combine: bool, layer: int, gather: bool = True, backward: bool = False) -> float:
        """Expert-TP all-gather (dispatch) / reduce-scatter (combine) of a MoE block that
        routes the SP shard: the assignments of the ``etp`` ranks, in the all-to-all's precision. Under
        the allgather dispatcher the whole expert-TP x EP group's rows of the collective
        ``gather`` (all-gather or reduce-scatter) of the ``backward`` pass or not
        (:meth:`TraceBuilder.allgather_bytes`)."""
        b = self.p.b
        if b.t.moe_token_dispatcher == "allgather":
            return b.allgather_bytes(gather, backward, etp_stage=True)
        return b.dispatch_bytes(combine, layer) * b.L.etp

    def shard_moe_forward(self, l: int, mb: int, k: int, deps: list, phase: str, recompute: bool):
        """One shard-routing MoE block's forward (after the attention block's TP collective,
        ``deps``); yields like :meth:`layer_forward` after each all-to-all."""
        b = self.p.b
        _, pre, shared, expert, post = b.layer_parts(l)
        h, handed = b.hidden_bytes, 0
        op = self.p.compute(f"L{l}.mlp.{phase}", pre, phase, mb, k, l, deps=deps, recompute=recompute)
        overlap = b.t.moe_shared_expert_overlap
        first: list = []  # the shared experts' output, before the dispatch (Megatron's default)
        if shared and not overlap:
            ag = self.p.collective("all-gather", "tp", h, f"L{l}.shared.ag", phase, mb, k, l, [op.id])
            op = self.p.compute(
                f"L{l}.shared.{phase}", shared, phase, mb, k, l, deps=[ag.id] if ag else [], recompute=recompute
            )
            rs = self.p.collective("reduce-scatter", "tp", h, f"L{l}.shared.rs", phase, mb, k, l, [op.id])
            first = [rs.id] if rs else []
        self._host_sync(op)
        d = self.p.all_to_all(b.dispatch_bytes(False, l), f"L{l}.dispatch", phase, mb, k, l, [op.id] + first)
        wait = [d.id] if d else []
        if shared and overlap:  # --moe-shared-expert-overlap: while the dispatch is in flight
            ag = self.p.collective("all-gather", "tp", h, f"L{l}.shared.ag", phase, mb, k, l, [op.id])
            sh = self.p.compute(
                f"L{l}.shared.{phase}", shared, phase, mb, k, l, deps=[ag.id] if ag else [], recompute=recompute
            )
            rs = self.p.collective("reduce-scatter", "tp", h, f"L{l}.shared.rs", phase, mb, k, l, [sh.id])
            wait += [rs.id] if rs else []
        if d:
            handed += 1
            yield
        ag = self.p.collective("all-gather", "etp", self.etp_bytes(False, l), f"L{l}.experts.ag", phase, mb, k, l, wait)
        op = self.p.compute(
            f"L{l}.experts.{phase}", expert, phase, mb, k, l, deps=[ag.id] if ag else wait, recompute=recompute
        )
        rs = self.p.collective(
            "reduce-scatter", "etp", self.etp_bytes(True, l, gather=False), f"L{l}.experts.rs", phase, mb, k, l, [op.id]
        )
        c = self.p.all_to_all(b.dispatch_bytes(True, l), f"L{l}.combine", phase, mb, k, l, [rs.id if rs else op.id])
        if c:
            handed += 1
            yield
        self.p.compute(f"L{l}.moe_out.{phase}", post, phase, mb, k, l, deps=[c.id] if c else [], recompute=recompute)
        return handed

    def _shared_backward(self, l: int, mb: int, k: int, part: str, shared: tuple, after: Op, regather=True) -> tuple:
        """A shard-routing MoE block's shared experts backward after op ``after``: the TP all-gather
        of their output gradient, their backward and the reduce-scatter of their input gradient:
        ``(their last compute op, the reduce-scatter or None)``. ``regather``: as a dense MLP's
        under sequence parallelism, the up projection (Transformer Engine's column-parallel
        ``Linear`` of Megatron-Core's ``SharedExpertMLP``, an ``MLP``) keeping only its input's
        shard and gathering it again beside its input gradient
        (:meth:`~workloads.trace.program_tp_overlap.TpOverlapOps.tp_backward`); False under
        ``--moe-shared-expert-overlap``, which gathers the input itself and turns the linear
        layers' TP communication off (``parallel_mode = None``: the gathered input is what the up
        projection keeps; megatron/core/transformer/moe/shared_experts.py, NVIDIA/Megatron-LM
        d98e8a64)."""
        h = self.p.b.hidden_bytes
        ag = self.p.collective("all-gather", "tp", h, f"L{l}.shared.rs.bwd", part, mb, k, l, [after.id])
        deps = [ag.id] if ag else []
        name, scatter = f"L{l}.shared.{part}", f"L{l}.shared.ag.bwd"
        if regather:
            return self.p.tp_ops.tp_backward(name, scatter, shared, part, mb, k, l, deps, False, overlap=False)
        op = self.p.compute(name, self.p.b.bwd(shared, part), part, mb, k, l, deps=deps)
        return op, self.p.collective("reduce-scatter", "tp", h, scatter, part, mb, k, l, [op.id])

    def shard_moe_backward(self, l: int, mb: int, k: int, deps: list, part: str):
        """One shard-routing MoE block's backward (the reverse of :meth:`shard_moe_forward`),
        down to the router's gradient; yields like :meth:`layer_backward`."""
        b = self.p.b
        _, pre, shared, expert, post = b.layer_parts(l)
        handed = 0
        op = self.p.compute(f"L{l}.moe_out.{part}", self.p.b.bwd(post, part), part, mb, k, l, deps=deps)
        first: list = []
        if shared and not b.t.moe_shared_expert_overlap:  # before the combine's gradient
            op, rs = self._shared_backward(l, mb, k, part, shared, op)
            first = [rs.id] if rs else []
        c = self.p.all_to_all(b.dispatch_bytes(True, l), f"L{l}.combine.bwd", part, mb, k, l, [op.id] + first)
        wait = [c.id] if c else []
        if shared and b.t.moe_shared_expert_overlap:  # overlaps the combine's backward all-to-all
            _, rs = self._shared_backward(l, mb, k, part, shared, op, regather=False)
            wait += [rs.id] if rs else []
        if c:
            handed += 1
            yield
        split = part == "B" and b.dualpipe_ep  # see layer_backward
        ag = self.p.collective(
            "all-gather", "etp", self.etp_bytes(True, l, backward=True), f"L{l}.experts.rs.bwd", part, mb, k, l, wait
        )
        op = self.p.compute(
            f"L{l}.experts.{part}",
            self.p.b.bwd(expert, "I" if split else part),
            part,
            mb,
            k,
            l,
            deps=[ag.id] if ag else wait,
        )
        rs = self.p.collective(
            "reduce-scatter",
            "etp",
            self.etp_bytes(True, l, gather=False, backward=True),
            f"L{l}.experts.ag.bwd",
            part,
            mb,
            k,
            l,
            [op.id],
        )
        d = self.p.all_to_all(b.dispatch_bytes(True, l), f"L{l}.dispatch.bwd", part, mb, k, l, [rs.id if rs else op.id])
        if split:
            self.p.compute(f"L{l}.experts_w.{part}", self.p.b.bwd(expert, "W"), part, mb, k, l)
        if d:
            handed += 1
            yield
        self.p.compute(f"L{l}.mlp.{part}", self.p.b.bwd(pre, part), part, mb, k, l, deps=[d.id] if d else [])
        return handed

    def _prefetch(self, l: int, mb: int, k: int) -> list[int]:
        """Activation offload: bring layer ``l``'s stash back to HBM before its backward."""
        if not self.p.b.t.offload_activations:
            return []
        stash = self._stash(l)
        op = self.p.param_ops.host(
            f"L{l}.act.h2d", stash, "B", mb=mb, chunk=k, layer=l, mem=(("activations", stash, "start"),)
        )
        return [op.id]

    def cp_attention(self, l, attn, phase, mb, k, deps, mem, recompute) -> Op:
        """Attention under context parallelism. The QKV projection runs first; its K
        and V are then exchanged over the CP group. ``ring`` (ring attention, Liu et
        al. 2023, arXiv 2310.01889, as Megatron-Core's CP runs it): attention over
        the local K/V block (1/cp of the core) proceeds while the other blocks
        circulate, and the remaining (cp-1)/cp of the core waits for them.
        ``all-gather``: the whole core waits for the gathered K/V."""
        b, L = self.p.b, self.p.b.L
        names = [x.name for x in attn]
        cut = names.index("attn_core")
        proj, core, rest = attn[:cut], attn[cut], attn[cut + 1 :]
        op = self.p.compute(f"L{l}.attn_qkv.{phase}", proj, phase, mb, k, l, deps=deps, recompute=recompute)
        kv = self.p.collective("all-gather", "cp", b.kv_bytes() * L.cp, f"L{l}.attn.kv_ag", phase, mb, k, l, [op.id])
        wait = [kv.id] if kv else []
        if b.t.cp_algorithm == "ring":
            local = b.scaled(core, 1.0 / L.cp)
            self.p.compute(f"L{l}.attn_local.{phase}", (local,), phase, mb, k, l, recompute=recompute)
            remote = (b.scaled(core, (L.cp - 1) / L.cp),) + tuple(rest)
        else:
            remote = (core,) + tuple(rest)
        return self.p.compute(f"L{l}.attn.{phase}", remote, phase, mb, k, l, deps=wait, mem=mem, recompute=recompute)

    def _stash(self, l: int) -> float:
        b = self.p.b
        key = (l, "stash")
        if key not in b._stash_cache:
            b._stash_cache[key] = self._stash_uncached(l)
        return b._stash_cache[key]

    def _expert_tokens(self, l: int) -> float | None:
        """Routed-token assignments layer ``l``'s activations hold on the stage's most
        loaded device under expert-load imbalance (None: balanced)."""
        f = self.p.b._memory_load.get(l)
        return None if f is None else self.p.b.expert_assignments(f)

    def _stash_uncached(self, l: int) -> float:
        b = self.p.b
        return activations.activation_bytes_per_layer(b.model, l, b.shard, b.policy, self._expert_tokens(l))

    def _recompute_transient(self, l: int) -> float:
        """Activations rebuilt by full recomputation of one layer, alive until its backward ends."""
        b = self.p.b
        rebuilt = replace(b.policy, recompute="none")
        return activations.activation_bytes_per_layer(b.model, l, b.shard, rebuilt, self._expert_tokens(l))

    # ---- backward --------------------------------------------------------------
    def backward(self, a, path, pos, layers, is_last_grad):
        b, t = self.p.b, self.p.b.t
        part = a.op
        deps: list = []
        own = None  # this action's last compute op
        if b.global_aux:
            # Every micro-batch's loss (its head op, on the last rank of its own path:
            # DualPipe's two directions end on opposite ranks) before any backward.
            deps += [("HEAD", j, self.p.rank_at_stage(self.p.path(j)[-1][0])) for j in range(b.m)]
        if pos < len(path) - 1:
            self.p._recv("B", path, pos, a.mb, deps)
        else:
            deps += self.p.param_ops._zero3_gather("head", a.mb, pos, part)
            own = self.p.compute(
                "head." + part,
                self.p.b.bwd(b.head_kernels(), part),
                part,
                a.mb,
                pos,
                -1,
                deps=deps,
                mem=(("activations", -self._head_bytes(), "end"),),
            )
            deps = []
            if part == "B":
                self.p.param_ops._grads_ready("head", pos, a.mb, is_last_grad)
        rev = list(reversed(layers))
        fetched = {rev[0]: self._prefetch(rev[0], a.mb, pos)} if rev else {}
        for i, l in enumerate(rev):
            deps += self.p.param_ops._zero3_gather(f"L{l}", a.mb, pos, part) + fetched.pop(l, [])
            if i + 1 < len(rev):  # prefetch one layer ahead
                fetched[rev[i + 1]] = self._prefetch(rev[i + 1], a.mb, pos)
            handed = 0
            if t.recompute == "full":
                handed += yield from self.layer_forward(l, a.mb, pos, deps, recompute=True)
                deps = []
            handed += yield from self.layer_backward(l, a.mb, pos, deps, part, is_last_grad)
            own = self.p.last_compute
            deps = []
            if not handed:
                yield
        if pos == 0:
            own = self.p.compute(
                "embed." + part,
                self.p.b.bwd(b.embed_kernels(), part),
                part,
                a.mb,
                pos,
                -1,
                deps=self.p.param_ops._zero3_gather("embed", a.mb, pos, part),
            )
            if part == "B":
                self.p.param_ops._grads_ready("embed", pos, a.mb, is_last_grad)
        self.p._send("B", path, pos, a.mb, after=own)

    def layer_backward(self, l, mb, k, deps, part, is_last_grad):
        """Generate one layer's backward ops; yields and returns like :meth:`layer_forward`."""
        b, L = self.p.b, self.p.b.L
        handed = 0
        attn, pre, shared, expert, post = b.layer_parts(l)
        sp = L.sequence_parallel
        deps = list(deps)
        if part in ("B", "I") and b.recomputed_names:
            # the norms, MLA up-projections and SwiGLUs whose outputs were not kept
            redo = b.saved_recompute_kernels(l)
            if redo:
                op = self.p.compute(f"L{l}.recompute.R", redo, "R", mb, k, l, deps=deps, recompute=True)
                deps = [op.id]
        # Reverse of the forward: the gradient of a reduce-scatter is an all-gather and vice versa.
        if expert and L.routes_sp_shard:
            handed += yield from self.shard_moe_backward(l, mb, k, deps + self.p.after_compute(), part)
            wait, beside = (
                self.p.tp_ops.tp_gather(f"L{l}.attn.out.bwd", part, mb, k, l, self.p.after_compute())
                if sp
                else ([], [])
            )
            self._attention_backward(l, mb, k, wait, part, attn, is_last_grad, beside)
            return handed
        beside: list = []
        if sp:
            wait, beside = self.p.tp_ops.tp_gather(
                f"L{l}.mlp.out.bwd", part, mb, k, l, deps + self.p.after_compute(), not expert
            )
            deps = wait or deps
        if expert:
            n, deps = yield from self._experts_backward(l, mb, k, deps, part, shared, expert, post)
            handed += n
        name = f"L{l}.mlp"
        _, out = self.p.tp_ops.tp_backward(
            f"{name}.{part}", f"{name}.ag.bwd", pre, part, mb, k, l, deps, False, overlap=not expert, beside=beside
        )
        deps, beside = ([out.id] if out else []), []
        if sp and out:
            wait, beside = self.p.tp_ops.tp_gather(f"L{l}.attn.out.bwd", part, mb, k, l, deps + self.p.after_compute())
            deps = wait or deps
        self._attention_backward(l, mb, k, deps, part, attn, is_last_grad, beside)
        return handed

    def _experts_backward(self, l, mb, k, deps, part, shared, expert, post):
        """An MoE layer's routed and shared experts backward, from the gradient at the block's
        output (``deps``) to the dispatch's gradient: ``(the yields handed, what the router's
        backward waits for)``; yields like :meth:`layer_forward`."""
        b = self.p.b
        handed = 0
        op = self.p.compute(f"L{l}.moe_out.{part}", self.p.b.bwd(post, part), part, mb, k, l, deps=deps)
        overlap = b.t.moe_shared_expert_overlap
        if shared and not overlap:  # before the combine's gradient (no overlap)
            op = self.p.compute(f"L{l}.shared.{part}", self.p.b.bwd(shared, part), part, mb, k, l)
        c = self.p.all_to_all(b.dispatch_bytes(True, l), f"L{l}.combine.bwd", part, mb, k, l, [op.id])
        if shared and overlap:  # overlaps the combine's backward all-to-all
            self.p.compute(f"L{l}.shared.{part}", self.p.b.bwd(shared, part), part, mb, k, l)
        if c:
            handed += 1
            yield
        # DualPipe splits a backward chunk's MLP into input- and weight-gradient parts
        # (DeepSeek-V3 §3.2.1, Figure 4's "MLP(B)" then "MLP(W)"): the experts' input
        # gradient is computed and sent back (the dispatch's gradient), and their
        # weight gradient computes while it is in flight.
        split = part == "B" and b.dualpipe_ep
        op = self.p.compute(
            f"L{l}.experts.{part}",
            self.p.b.bwd(expert, "I" if split else part),
            part,
            mb,
            k,
            l,
            deps=[c.id] if c else [],
        )
        d = self.p.all_to_all(b.dispatch_bytes(True, l), f"L{l}.dispatch.bwd", part, mb, k, l, [op.id])
        deps = [d.id] if d else []
        if split:
            self.p.compute(f"L{l}.experts_w.{part}", self.p.b.bwd(expert, "W"), part, mb, k, l)
        if d:
            handed += 1
            yield
        return handed, deps

    def _attention_backward(self, l, mb, k, deps, part, attn, is_last_grad, beside):
        """The attention block's backward (after the gradient reached the block's
        output, ``deps``; ``beside``: TP all-gather chunks beside it) and the layer's
        gradient hand-off."""
        b, L, t = self.p.b, self.p.b.L, self.p.b.t
        free = -self._stash(l)
        if part == "I":
            free *= INPUT_GRAD_FREED_FRACTION
        mem = [("activations", free, "end")]
        if t.recompute == "full":
            mem.append(("activations", -self._recompute_transient(l), "end"))
        _, scatter, gather = b.attn_tp_bytes
        op, out = self.p.tp_ops.tp_backward(
            f"L{l}.attn.{part}", f"L{l}.attn.ag.bwd", attn, part, mb, k, l, deps, True,
            tuple(mem), beside=beside, size=scatter,
        )  # fmt: skip
        if L.cp > 1:
            self.p.collective("reduce-scatter", "cp", b.kv_bytes() * L.cp, f"L{l}.attn.dkv_rs", part, mb, k, l, [op.id])
        if gather:  # MLA's column-parallel down projections: the latents' cut to the shard, reversed
            self.p.collective("all-gather", "tp", gather, f"L{l}.attn.latent_ag.bwd", part, mb, k, l, [op.id])
        if out:
            self.p.compute(f"L{l}.join", (), part, mb, k, l, deps=[out.id])
        if part == "B":
            self.p.param_ops._grads_ready(f"L{l}", k, mb, is_last_grad)

    def weight_grad(self, a, path, pos, layers, is_last_grad):
        b = self.p.b
        if pos == len(path) - 1:  # the LM head's (and MTP modules') weight-gradient GEMMs
            self.p.compute("head.W", self.p.b.bwd(b.head_kernels(), "W"), "W", a.mb, pos, -1)
            self.p.param_ops._grads_ready("head", pos, a.mb, is_last_grad)
        for l in reversed(layers):
            kern = self.p.b.bwd(b.layer_all(l), "W")
            free = -self._stash(l) * (1 - INPUT_GRAD_FREED_FRACTION)
            self.p.compute(f"L{l}.W", kern, "W", a.mb, pos, l, mem=(("activations", free, "end"),))
            self.p.param_ops._grads_ready(f"L{l}", pos, a.mb, is_last_grad)
            yield
        if pos == 0:
            self.p.compute("embed.W", self.p.b.bwd(b.embed_kernels(), "W"), "W", a.mb, pos, -1)
            self.p.param_ops._grads_ready("embed", pos, a.mb, is_last_grad)
