"""Training settings of one step: plain data, validated where they are built.

Each field is written once, here (constraints in ``metadata``, as pydantic's ``ge``/``gt``/...):
the scenario schema (:mod:`simulator.scenario.schema`) builds its ``training`` input model
from :class:`TrainingSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from workloads.enums import Balance, FP8Recipe, MoEExpertGemm, Recompute
from workloads.errors import WorkloadError

Dtype = Literal["bf16", "fp8"]
Optimizer = Literal["adam", "muon", "sgd"]
#: Megatron-Core ``--recompute-modules`` the memory model knows (TransformerConfig
#: ``recompute_modules``): ``core_attn`` the attention core (scores), ``layernorm``
#: the two pre-block norms, ``mla_up_proj`` MLA's up-projections with their latent
#: norms and RoPE, ``moe_act`` the routed experts' activation function.
# Megatron-Core's --recompute-modules, plus "matmul_outputs": JAX's
# checkpoint_dots_with_no_batch_dims policy (MaxText remat_policy "minimal"), which keeps
# only matmul outputs and the layer input (workloads.memory, "Recompute policies").
# Upper bounds (docs/scenario.md, "Physical ranges"): 16 Mi tokens per sequence, 16 Mi
# sequences per batch; the step's size (simulator.scenario.checks) bounds their product.
MAX_SEQ_LEN = 2**24
MAX_BATCH = 2**24
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act", "matmul_outputs")
#: Transformer Engine's userbuffers layers whose GEMM can give up SMs to the collective beside it
#: (``ub_cfgs`` names of the ``pipeline`` and ``bulk`` methods, transformer_engine/pytorch/module/
#: base.py ``initialize_ub``, NVIDIA/TransformerEngine d0067d0): the forward reduce-scatters after
#: the row-parallel GEMMs, the backward's gather and reduce-scatter beside the column-parallel
#: GEMMs' input and weight gradients (workloads.trace.program_tp_overlap).
UB_SM_LAYERS = ("proj_fprop", "fc2_fprop", "qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad")
#: TE's default for those methods: ``num_sm`` 16 with ``set_sm_margin`` (``get_default_config``).
UB_DEFAULT_SMS = 16

#: Host (CPU) seconds to issue one kernel in PyTorch eager mode: the CUDA launch call plus
#: PyTorch's per-op dispatch, not fitted to any validation row.
#: * CUDA launch: a raw cuLaunchKernel costs 3.0 us (no arguments) to 3.3 us (19 arguments)
#:   of host time on GB200 (meta-pytorch/tritonbench pull request #1017, 2026-04-14, its
#:   per-kernel overhead table: "cuLaunchKernel 3.0us (irreducible CUDA driver cost)").
#: * PyTorch eager dispatch before it (Python binding, autograd node, ATen dispatcher,
#:   backend selection): ~5-25 us of CPU per op for a bf16 matmul on H100 ("From PyTorch
#:   op to kernel launch", jiahuanglin.xyz/all_lessons/gpu_kernel_serving/18_pytorch_to_kernel.html,
#:   its per-layer cost table); a model "completely dispatch bound" on A100 with PyTorch 1.12
#:   measured ~4 us per op on CUDA with no autograd (pytorch/pytorch issue #82793).
#: 10 us = the 3 us launch plus the low end of the eager dispatch range. One launch per
#: kernel the trace models, one per local expert for a GEMM run expert by expert
#: (Kernel.launches; a modelled kernel may stand for several framework ops, so this is a
#: lower bound on the host's work); simulator.engine.host.
HOST_LAUNCH_S = 10e-6
#: On TPUs the step is one program XLA compiled ahead of it, which the runtime runs without a
#: host dispatch per operation, so the default host stream is off there: JAX's jax.jit compiles
#: a whole Python function through XLA into one executable (the JAX README, "just-in-time
#: compile your own Python functions into XLA-optimized kernels"; Deep Learning with JAX,
#: Manning, ch. 5.2.2), and MaxText jit-compiles its whole training step (train.py).
XLA_HOST_LAUNCH_S = 0.0

#: The CUDA caching allocator's reserve, as a fraction of the transient bytes (activations
#: and communication buffers: what is allocated and freed within a step) held on top of
#: the allocated bytes (TrainingSpec.allocator_reserve_fraction; workloads.memory,
#: "Memory as allocated"). 0.0145: a Megatron-Core training run on an A100 80 GB printed
#: torch.cuda.memory_reserved() 44,926 MB against memory_allocated() 44,283.33 MB at its
#: highest point in the attention forward (NVIDIA/Megatron-LM issue #965, 2024-08-05:
#: +643 MB, 1.45 % of what was allocated; the gap stayed 0.56-0.64 GB while allocations
#: grew from 36.7 to 44.3 GB, so it is charged to what varies, not to the persistent state,
#: which Megatron allocates once in large contiguous buffers). Larger figures are published
#: for other workloads and are the option's range: 6.6 % reserved over allocated at a NeMo
#: Qwen3-30B-A3B H100 step's peak (github.com/NVIDIA-NeMo/Speech/issues/14850: max_memory_reserved
#: 57,466,159,104 vs max_memory_allocated 53,930,270,720), of which the allocator returns
#: the unsplit cached segments before it reports out of memory (c10/cuda/
#: CUDACachingAllocator.cpp, DeviceCachingAllocator::malloc: "Free all non-split cached
#: blocks and retry alloc"); GMLake (Guo et al., ASPLOS'24, arXiv 2401.08156) measures 15 %
#: average (up to 33 %) fragmentation on eight LLMs fine-tuned on A100 80 GB with
#: recomputation, offloading and LoRA under DeepSpeed, FSDP and Colossal-AI.
ALLOCATOR_RESERVE_FRACTION = 0.0145
#: XLA (TPU) assigns buffers when it compiles the step, with no caching allocator: the
#: default reserve on the "tpu" chip family.
XLA_ALLOCATOR_RESERVE_FRACTION = 0.0


@dataclass(frozen=True)
class TrainingSpec:
    seq_len: int = field(default=4096, metadata={"ge": 1, "le": MAX_SEQ_LEN})
    micro_batch_size: int = field(default=1, metadata={"ge": 1, "le": MAX_BATCH})  # sequences per micro-batch
    global_batch_size: int = field(default=1, metadata={"ge": 1, "le": MAX_BATCH})  # sequences per optimizer step
    dtype: Dtype = "bf16"
    recompute: Recompute = "none"
    balance: Balance = "aux-free"
    optimizer: Optimizer = "adam"
    # Fused (flash) attention never materialises the s x s scores: the activation
    # estimate drops Korthikanti's 5as/h term (Dao et al. 2022, arXiv 2205.14135).
    flash_attention: bool = True
    # Host-memory offload (ZeRO-Offload, Ren et al. 2021, arXiv 2101.06840): optimizer
    # states live in host memory and the update runs on the CPU; stashed activations
    # are copied to the host after each layer's forward and back before its backward.
    # Data-parallel gradient reduction overlapped with the backward pass, one bucket per
    # layer as soon as its last micro-batch is done (Megatron --overlap-grad-reduce);
    # False: all reductions start after the last backward (older Megatron-LM).
    overlap_grad_reduce: bool = True
    # ZeRO-1/2 parameter all-gathers overlapped with the forward pass, a unit's first forward
    # waiting for its own bucket only (Megatron --overlap-param-gather; Megatron-Bridge's
    # recipes set it wherever dp > 1: src/megatron/bridge/training/comm_overlap.py at v0.4.2);
    # False: every bucket gathered before the first forward, as Megatron-LM's distributed
    # optimizer does without the flag (its default: step_with_ready_grads launches synchronous
    # all-gathers after the update, megatron/core/optimizer/distrib_optimizer.py at
    # NVIDIA/Megatron-LM d98e8a64; the flag arrived in f048bf8, 2023-11-17). No effect at ZeRO 0
    # or 3.
    overlap_param_gather: bool = True
    # Context parallelism: "ring" (ring attention, K/V blocks circulate while attention
    # over the blocks at hand runs) or "all-gather" (K/V gathered before attention).
    cp_algorithm: Literal["ring", "all-gather"] = "ring"
    offload_optimizer: bool = False
    offload_activations: bool = False
    # DeepSeek-V3's activation savings (arXiv 2412.19437): "deepseek-v3" recomputes every
    # RMSNorm and the MLA up-projections in the backward pass instead of keeping their
    # outputs (§3.2.3), caches GEMM inputs in FP8 (the attention output, which the
    # attention backward also reads, in E5M6: 1.5 bytes) and keeps the SwiGLU inputs in
    # FP8 while recomputing its output (§3.3.2). Kimi K2 reports the same recipe (norms,
    # SwiGLU and MLA up-projections recomputed; MoE up-projection and SwiGLU inputs in
    # FP8). Needs FP8 training. "none": every activation kept in 16 bits.
    activation_saving: Literal["none", "deepseek-v3"] = "none"
    # Where a routed expert's gate weight multiplies (workloads.memory, "MoE"): "activation"
    # (Megatron-Core >= 0.13: the SwiGLU output is scaled, only an fp32 weight is kept per
    # token-expert assignment) or "combine" (Megatron-Core <= 0.12 and NeMo 1.0 recipes: the
    # expert output is scaled when tokens are un-permuted, so its BF16 copy is kept for the
    # gate gradient).
    moe_gate_weighting: Literal["activation", "combine"] = "activation"
    # The MoE router's logits dtype (Megatron --moe-router-dtype; default None there, the
    # input's BF16): "fp32" writes FP32 logits from the BF16 router GEMM and runs its two
    # gradient GEMMs on FP32 operands (TF32 tensor cores under Transformer Engine),
    # workloads.moe_kernels.MoEOptions.
    moe_router_dtype: Literal["bf16", "fp32"] = "bf16"
    # Wire dtype of the expert dispatch all-to-all (the combine is BF16 always). "auto": FP8
    # under FP8 training, as DeepSeek-V3 does (arXiv 2412.19437 §3.3: activations quantised to
    # FP8 before the dispatch), else BF16. "bf16": what Megatron-Core sends with every dispatcher
    # but one (alltoall, DeepEP and HybridEP all-to-all the permuted BF16 hidden states,
    # moe/token_dispatcher.py and moe/fused_a2a.py; only the flex 'ncclep' backend with
    # moe_dispatch_fwd_dtype mxfp8 sends FP8, transformer_config.py, all at NVIDIA/Megatron-LM
    # d98e8a64). "fp8": one byte an element.
    moe_dispatch_dtype: Literal["auto", "bf16", "fp8"] = "auto"
    # The expert dispatcher, for the traffic an expert all-to-all puts across scale-up
    # domains (workloads.trace.shared.TraceBuilder.node_limited). "alltoall": one copy of a
    # token per routed expert on another node (Megatron-Core's alltoall dispatcher,
    # --moe-token-dispatcher-type alltoall: moe/token_dispatcher.py permutes the tokens per
    # expert, then all-to-alls them). "allgather": Megatron-Core's default dispatcher
    # (MoEAllGatherTokenDispatcher, moe/token_dispatcher.py at NVIDIA/Megatron-LM d98e8a64):
    # every rank all-gathers the hidden states, routing map and probabilities of its expert-TP x
    # EP group, keeps the rows of its local experts, and reduce-scatters the unpermuted outputs
    # back (workloads.trace.shared.TraceBuilder.allgather_bytes). "flex": one copy per destination node,
    # forwarded over NVLink to that node's experts (DeepEP's internode dispatch,
    # get_dispatch_layout's num_tokens_per_rdma_rank, deepseek-ai/DeepEP README at b57e5e2;
    # DeepSeek-V3 §3.2.2; Megatron --moe-token-dispatcher-type flex with the deepep or
    # hybridep backend). "auto": per node where the model limits the nodes a token reaches
    # (model.moe.max_nodes_per_token: the DeepSeek-V3 preset, dispatched as DeepSeek does), else
    # per expert.
    moe_token_dispatcher: Literal["auto", "alltoall", "allgather", "flex"] = "auto"
    # Bytes per element of the gradient buffer (Megatron-LM / NeMo keep FP32 main gradients;
    # "bf16" = Megatron --grad-reduce-in-bf16 / NeMo optim.grad_sync_dtype: bf16) and of the
    # Adam / Muon moments ("bf16": DeepSeek-V3 §3.3.3, low-precision optimizer states).
    grad_dtype: Literal["fp32", "bf16"] = "fp32"
    # "fp16" and "fp8" as Megatron's precision-aware optimizer stores them (--exp-avg-dtype /
    # --exp-avg-sq-dtype, choices fp32, fp16, bf16, fp8: megatron/training/arguments.py at
    # NVIDIA/Megatron-LM d98e8a64; one dtype here for both moments).
    optimizer_state_dtype: Literal["fp32", "bf16", "fp16", "fp8"] = "fp32"
    # The optimizer's master copy of the weights: "fp32" (4 bytes) or "remainder": only
    # the 16 low bits of the FP32 master, the BF16 weight being its high bits (Apex
    # DistributedFusedAdam store_param_remainders, which NeMo 1.0 turns on for BF16 models),
    # or "none": no separate copy, the weights themselves are kept in FP32 (4 bytes) and
    # cast to the compute dtype per matmul (JAX / MaxText weight_dtype float32), or "fp16":
    # a 2-byte master (Megatron --use-precision-aware-optimizer --main-params-dtype fp16,
    # megatron/training/arguments.py at d98e8a64), or "bf16": no master at all, the optimizer
    # updates the BF16 weights themselves (pure BF16 AdamW; workloads.memory.MASTER_BYTES).
    master_weights: Literal["fp32", "remainder", "none", "fp16", "bf16"] = "fp32"
    # What ZeRO-2/3 reduce-scatters as one full-size gradient (workloads.memory,
    # sharding_buffer_bytes): "unit", a whole layer, embedding or head (PyTorch FSDP's
    # flat parameter per wrapped module, the trace's buckets) or "tensor", one weight
    # array at a time (JAX / XLA GSPMD: each weight's gradient is reduce-scattered as its
    # matmul produces it; workloads.parameters.largest_weight_params).
    grad_reduce_granularity: Literal["unit", "tensor"] = "unit"
    # Megatron-Core's --recompute-modules under selective recompute (workloads.memory,
    # RECOMPUTE_MODULES): parts of each layer whose outputs are recomputed in the
    # backward pass instead of kept. Empty: the attention core only (Korthikanti's
    # selective recompute, Megatron-Core's default ``core_attn``).
    recompute_modules: tuple[str, ...] = ()
    # Dropout after attention, MLP and on the attention probabilities (GPT-3-era models,
    # Megatron-LM's default 0.1): its 1-byte masks and the dropped-out probabilities are
    # kept for the backward (Korthikanti et al. 2022 §4.1). Memory only; the dropout
    # kernels are not timed. Modern LLMs train without it.
    dropout: bool = False
    # ---- the host side (simulator.engine.host) ----
    # Host (CPU) seconds to issue one kernel: PyTorch eager dispatch plus the CUDA launch
    # call, on the host stream each simulated rank has (simulator.engine.host). The GPU
    # cannot start a kernel before it is issued, so the host's time is exposed where
    # kernels are shorter than it. None (default): HOST_LAUNCH_S (sources there) on GPUs,
    # XLA_HOST_LAUNCH_S on TPUs (launch_s). 0: the host is never behind (no host stream).
    host_launch_s: float | None = field(default=None, metadata={"ge": 0, "le": 1e-3})
    # CUDA graphs (Megatron --cuda-graph-impl / --cuda-graph-modules): "none" (eager, the
    # Megatron default), "per-layer" (each transformer layer's forward and backward
    # replayed as graphs, one launch each; under a blocking MoE sync only the part up to
    # it, Megatron's scope attn + moe_router + moe_preprocess) or "full" (the whole step,
    # --cuda-graph-impl full_iteration; needs a sync-free MoE dispatcher).
    cuda_graphs: Literal["none", "per-layer", "full"] = "none"
    # The MoE dispatcher copies token counts to the host and blocks on them once per MoE
    # layer forward (Megatron-Core's dropless alltoall dispatcher, token_dispatcher.py
    # _maybe_dtoh_and_synchronize; DeepEP's normal-mode dispatch): the host waits until
    # the GPU has run the router. False: a sync-free dispatcher (drop-and-pad to capacity,
    # --moe-pad-expert-input-to-capacity).
    moe_host_sync: bool = True
    # Shared experts computed while the dispatch all-to-all is in flight (Megatron
    # --moe-shared-expert-overlap; default off: they run before the router).
    moe_shared_expert_overlap: bool = False
    # Tensor-parallel communication overlap (Megatron --tp-comm-overlap, Transformer Engine
    # userbuffers; default off, Megatron's): the sequence-parallel all-gather and
    # reduce-scatter around attention and dense-MLP blocks chunked beside their GEMMs
    # (workloads.trace.program_tp_overlap). Needs sequence parallelism, as Megatron asserts.
    tp_comm_overlap: bool = False
    # Under tp_comm_overlap, the SMs the collective's kernels occupy beside each userbuffers
    # layer's GEMM (UB_SM_LAYERS; a recipe's ``ub_tp_comm_overlap_cfg`` ``num_sm``, whether its
    # ``set_sm_margin`` sizes the GEMM for the rest or lets the two share them); the layers not
    # named keep TE's default, UB_DEFAULT_SMS. Sorted (layer, SMs) pairs; the scenario file
    # writes a mapping.
    tp_comm_overlap_sms: tuple[tuple[str, int], ...] = ()
    # Megatron-Core's batch-level overlap of the expert all-to-all (--overlap-moe-expert-parallel-comm,
    # Megatron-Core 0.14; megatron/core/pipeline_parallel/combined_1f1b.py at d98e8a64): each
    # backward runs beside the next micro-batch's forward as one combined step, layer by layer,
    # so one's all-to-alls hide behind the other's compute (workloads.pipeline.ep_overlap).
    # Default off, Megatron's; the checks Megatron asserts are simulator.scenario.checks.check_ep_overlap.
    overlap_moe_expert_parallel_comm: bool = False
    # ---- memory as allocated (workloads.memory, "Memory as allocated") ----
    # Transformer Engine keeps each FP8 linear layer's quantised weight from the first
    # micro-batch to the last (its weight workspace, cached when Megatron-Core passes
    # is_first_microbatch: TransformerEngine module/base.py quantize_weight at d0067d0,
    # megatron/core/extensions/transformer_engine.py at d98e8a64), rowwise and columnwise
    # (memory.fp8_weight_cache_bytes). Megatron-LM's default with BF16 weights, which
    # `stepsim import megatron` writes; off here by default, as frameworks without Transformer
    # Engine (DeepSeek's, JAX) keep no such copy. Megatron --disable-parameter-transpose-cache: off.
    fp8_weight_cache: bool = False
    # FP8 primary weights (Megatron --fp8-param-gather, Megatron-Bridge's fp8_param_gather, which
    # its FP8 current-scaling recipe sets: bf16_with_fp8_current_scaling_mixed in
    # src/megatron/bridge/training/mixed_precision.py at 067f987): the layers' weights are kept
    # in FP8 (with the transpose on Hopper) instead of BF16 plus a cached FP8 copy, and the
    # distributed optimizer all-gathers them in FP8 (MXFP8 weights in BF16: Megatron-Core gathers
    # them into the gradient buffer viewed as bfloat16, param_and_grad_buffer.py at d98e8a64).
    # FP8 only.
    fp8_params: bool = False
    # How FP8 tensors are scaled (Megatron-Core --fp8-recipe, default "delayed":
    # transformer_config.py at NVIDIA/Megatron-LM d98e8a64): "delayed" (amax history),
    # "tensorwise" (per-tensor current scaling, Megatron-Bridge's FP8-CS recipes), "blockwise"
    # (1x128 activation tiles, DeepSeek-V3's scaling, TE Float8BlockScaling) or "mxfp8"
    # (Blackwell's 1x32 E8M0 blocks). It sets the bytes of the quantisation passes beside each
    # FP8 GEMM (workloads.quantization). No effect outside FP8 training (a sweep or map may
    # set it beside BF16 points).
    fp8_recipe: FP8Recipe = "delayed"
    # How the routed experts' GEMMs are launched (workloads.moe_kernels): "grouped" (default),
    # one kernel for all local experts (DeepGEMM, CUTLASS grouped GEMM, the grouped_gemm
    # library's GroupedMLP); "per-expert", one cuBLAS GEMM per local expert, as Transformer
    # Engine's GroupedLinear runs Megatron-Core's TEGroupedMLP (--moe-grouped-gemm with TE):
    # nvte_multi_tensor_gemm -> multi_stream_cublas_gemm over 4 compute streams unless
    # NVTE_USE_CUTLASS_GROUPED_GEMM=1 on Hopper (transformer_engine/common/gemm/cublaslt_gemm.cu
    # at NVIDIA/TransformerEngine d0067d0). Each launch costs the host and the GPU their
    # per-kernel time; the math is the same.
    moe_expert_gemm: MoEExpertGemm = "grouped"
    # Megatron --moe-router-fusion / --moe-permute-fusion: the router's score function and
    # top-k (and an auxiliary loss's scores and sum), and the token permutations, run as
    # fused Transformer Engine kernels (True, default: DeepSeek-V3's own kernels, and the
    # permutations of the NeMo / Megatron-Bridge MoE performance recipes) or as Megatron-Core's
    # unfused chains of small PyTorch ops (False: Megatron's own default, transformer_config.py
    # at NVIDIA/Megatron-LM d98e8a64), one kernel launch an op (workloads.moe_kernels).
    moe_router_fusion: bool = True
    moe_permute_fusion: bool = True
    # Megatron --distribute-saved-activations: under full recompute each layer's saved
    # input is split over the TP group and all-gathered before the layer is recomputed
    # (megatron/core/tensor_parallel/random.py CheckpointFunction at d98e8a64). Needs
    # recompute: full, tp > 1 and no sequence parallelism, as Megatron asserts. Default off.
    distribute_saved_activations: bool = False
    # ZeRO-3 / FSDP: units (layers) whose all-gather runs ahead of the one computing, each
    # holding its unsharded weights: 1 (default) is PyTorch FSDP's limit_all_gathers and
    # FSDP2's implicit prefetch, two units gathered at once (workloads.memory). Memory only.
    fsdp_prefetch_units: int = field(default=1, metadata={"ge": 0, "le": 64})
    # ZeRO-2/3 / FSDP with grad_reduce_granularity unit: units whose full-size gradient is
    # held at once, the one being reduce-scattered and the one whose backward produces the
    # next (Megatron-FSDP: "To overlap gradient reduce-scatter with wgrad computation, at
    # least two FSDP units worth of un-sharded gradient memory is required",
    # docs/user-guide/features/megatron_fsdp.md at NVIDIA/Megatron-LM d98e8a64; its double
    # buffer holds two). Memory only: the trace reduce-scatters one unit at a time.
    fsdp_grad_units: int = field(default=2, metadata={"ge": 1, "le": 64})
    # ZeRO-3 / FSDP: free the unsharded weights after each unit's forward and gather them
    # again for its backward (FSDP2 fully_shard(reshard_after_forward=True), the default);
    # False keeps every unit's unsharded weights from its forward to its backward. Memory only.
    reshard_after_forward: bool = True
    # The CUDA caching allocator's reserve, as a fraction of the transient bytes
    # (activations and communication buffers) it allocates and frees during the step:
    # reserved = allocated + fraction x (activations + buffers), summary.json's
    # reserved_memory_bytes, on which oom is judged. None (default): ALLOCATOR_RESERVE_FRACTION
    # (sources there) on GPUs, XLA_ALLOCATOR_RESERVE_FRACTION on TPUs.
    allocator_reserve_fraction: float | None = field(default=None, metadata={"ge": 0, "le": 1})

    def __post_init__(self) -> None:
        if self.activation_saving not in ("none", "deepseek-v3"):
            raise WorkloadError(
                f"must be none or deepseek-v3, got {self.activation_saving!r}", field="training.activation_saving"
            )
        for name, allowed in (
            ("moe_gate_weighting", ("activation", "combine")),
            ("moe_router_dtype", ("bf16", "fp32")),
            ("moe_dispatch_dtype", ("auto", "bf16", "fp8")),
            ("moe_token_dispatcher", ("auto", "alltoall", "allgather", "flex")),
            ("grad_dtype", ("fp32", "bf16")),
            ("optimizer_state_dtype", ("fp32", "bf16", "fp16", "fp8")),
            ("master_weights", ("fp32", "remainder", "none", "fp16", "bf16")),
            ("grad_reduce_granularity", ("unit", "tensor")),
            ("cuda_graphs", ("none", "per-layer", "full")),
        ):
            if getattr(self, name) not in allowed:
                raise WorkloadError(
                    f"must be one of {', '.join(allowed)}, got {getattr(self, name)!r}", field=f"training.{name}"
                )
        for m in self.recompute_modules:
            if m not in RECOMPUTE_MODULES:
                raise WorkloadError(
                    f"{m!r} not allowed; choose from {', '.join(RECOMPUTE_MODULES)}", field="training.recompute_modules"
                )
        if self.recompute_modules and self.recompute != "selective":
            raise WorkloadError(
                "needs training.recompute: selective (Megatron-Core "
                f"recomputes modules only under selective granularity), got {self.recompute!r}",
                field="training.recompute_modules",
            )
        for name in ("fp8_params", "fp8_weight_cache"):
            if getattr(self, name) and self.dtype != "fp8":
                raise WorkloadError(
                    f"needs training.dtype: fp8 (FP8 weights exist only in FP8 training), got {self.dtype!r}",
                    field=f"training.{name}",
                )
        if self.distribute_saved_activations and self.recompute != "full":
            raise WorkloadError(
                f"needs training.recompute: full (Megatron distributes only the inputs full recompute saves), "
                f"got {self.recompute!r}",
                field="training.distribute_saved_activations",
            )
        if self.activation_saving == "deepseek-v3" and self.dtype != "fp8":
            raise WorkloadError(
                f"deepseek-v3 caches activations in FP8 and needs training.dtype: fp8, got {self.dtype}",
                field="training.activation_saving",
            )

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element (4 for fp32, 2 for bf16)."""
        return 2 if self.grad_dtype == "bf16" else 4

    @property
    def moment_bytes(self) -> int:
        """Bytes per optimizer-moment element (4 for fp32, 2 for bf16 / fp16, 1 for fp8)."""
        return {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}[self.optimizer_state_dtype]

    @property
    def fp8_dispatch(self) -> bool:
        """Whether the expert dispatch all-to-all sends one byte an element
        (``moe_dispatch_dtype``; ``auto``: under FP8 training, except with the allgather
        dispatcher, which gathers BF16 hidden states)."""
        if self.moe_dispatch_dtype == "auto":
            return self.dtype == "fp8" and self.moe_token_dispatcher != "allgather"
        return self.moe_dispatch_dtype == "fp8"

    def launch_s(self, family: str) -> float:
        """Host seconds to issue a kernel on a chip of ``family`` (``host_launch_s`` or its
        default: 0 on TPUs, whose step XLA compiles into one program)."""
        if self.host_launch_s is not None:
            return float(self.host_launch_s)
        return XLA_HOST_LAUNCH_S if family == "tpu" else HOST_LAUNCH_S

    def reserve_fraction(self, family: str) -> float:
        """The allocator's reserve on a chip of ``family`` (``allocator_reserve_fraction`` or
        its default: 0 on TPUs, whose XLA assigns buffers at compile time)."""
        if self.allocator_reserve_fraction is not None:
            return float(self.allocator_reserve_fraction)
        return XLA_ALLOCATOR_RESERVE_FRACTION if family == "tpu" else ALLOCATOR_RESERVE_FRACTION

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch_size

    def ub_sms(self, layer: str) -> int:
        """The SMs the collective beside userbuffers layer ``layer``'s GEMM occupies under
        ``tp_comm_overlap``."""
        return dict(self.tp_comm_overlap_sms).get(layer, UB_DEFAULT_SMS)

    def micro_batches(self, dp: int) -> int:
        """Micro-batches each data-parallel replica runs per step.

        Raises ``ValueError`` naming the field when the batch does not split."""
        per_replica, rem = divmod(self.global_batch_size, dp)
        if rem:
            raise WorkloadError(
                f"{self.global_batch_size} sequences do not split over "
                f"dp = {dp} data-parallel replicas; use a multiple of {dp}",
                field="training.global_batch_size",
            )
        m, rem = divmod(per_replica, self.micro_batch_size)
        if rem or m == 0:
            raise WorkloadError(
                f"{self.micro_batch_size} does not divide the "
                f"{per_replica} sequences of each data-parallel replica "
                f"(global_batch_size {self.global_batch_size} / dp {dp})",
                field="training.micro_batch_size",
            )
        return m
