"""A scenario as the Megatron-LM launch line that would run it (``stepsim export megatron``):
the inverse of :mod:`simulator.interop.megatron` (``stepsim import megatron`` reads it back to
the same model, layout and training settings; ``tests/test_export.py`` holds the round trip on
every built-in scenario Megatron can run).

Argument names are Megatron-LM's (``megatron/training/arguments.py`` at NVIDIA/Megatron-LM
d98e8a64). What Megatron has no argument for is refused, naming the scenario key: a TPU, a schedule
other than 1F1B or interleaved 1F1B (DualPipe, ZB-H1 and GPipe are not Megatron schedules),
a batch-global auxiliary loss, a master copy other than fp32, remainder or fp16, and the
optimizer or MoE dispatcher settings Megatron's arguments cannot combine
(:func:`_optimizer_precision_args`, :func:`_expert_capacity_args`). The routing imbalance
(``training.expert_load``'s distribution) has no argument: it is written in a comment. The
placement (``cluster.devices_per_domain``) has no Megatron argument either: it is written as
the Slurm line that places whole blocks of a rack's trays (``--segment``, Slurm's
topology/block plugin), in a comment. ``training.tp_comm_overlap_sms`` is the userbuffers file
``--tp-comm-overlap-cfg`` names, its contents in a comment.
"""

from __future__ import annotations

from simulator.interop import megatron_moe
from simulator.scenario.errors import ScenarioError
from workloads.pipeline import get_schedule

#: The userbuffers configuration file ``--tp-comm-overlap-cfg`` names (Transformer Engine's
#: ``ub_cfgs``, one entry a layer), written in a comment of the launch line.
UB_CFG_FILE = "tp_comm_overlap_cfg.yaml"
#: Transformer Engine fuses the grouped MLP only with its GLU interleaved in blocks of 32
#: (simulator.interop.megatron_moe.CUTEDSL_ENV).
GLU_INTERLEAVE_ARG = "--" + megatron_moe.GLU_INTERLEAVE

#: Megatron-LM's argument for each stepsim recompute mode.
RECOMPUTE_ARGS = {
    "none": [],
    "selective": ["--recompute-granularity", "selective"],
    "full": ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"],
}


def _check(sc) -> None:
    if sc.cluster.chip.family == "tpu":  # its launch line would name 8 GPUs a node of TPU hosts
        raise ScenarioError(
            f"Megatron-LM runs on NVIDIA GPUs; {sc.cluster.chip.name!r} is a TPU (stepsim export maxtext writes "
            "a TPU run)",
            field="cluster.chip",
        )
    if sc.layout.pp > 1 and not get_schedule(sc.schedule).megatron_lm:
        raise ScenarioError(f"Megatron-LM runs 1f1b and interleaved-1f1b only, got {sc.schedule}", field="schedule")
    if sc.training.balance == "aux-loss-global":
        raise ScenarioError("Megatron-LM has no batch-global auxiliary loss schedule", field="training.balance")


def _model_args(m) -> list[str]:
    out = ["--num-layers", m.layers, "--hidden-size", m.hidden, "--num-attention-heads", m.heads]
    if m.attention is not None:  # multi-head latent attention (DeepSeek-V2/V3)
        a = m.attention
        out += ["--multi-latent-attention", "--q-lora-rank", a.q_lora_rank, "--kv-lora-rank", a.kv_lora_rank]
        out += ["--qk-head-dim", a.qk_nope_head_dim, "--qk-pos-emb-head-dim", a.qk_rope_head_dim]
        out += ["--v-head-dim", a.v_head_dim]
    elif m.kv_heads != m.heads:
        out += ["--group-query-attention", "--num-query-groups", m.kv_heads]
    if m.head_dim != m.hidden // m.heads:
        out += ["--kv-channels", m.head_dim]
    out += ["--ffn-hidden-size", m.ffn_hidden]
    if m.ffn == "swiglu":
        out.append("--swiglu")
    out += ["--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"]
    out.append("--add-bias-linear" if m.bias else "--disable-bias-linear")
    if not m.tied_embeddings:
        out.append("--untie-embeddings-and-output-weights")
    # the vocabulary as it is, with no further padding (stepsim's vocab is already padded)
    out += ["--vocab-size", m.vocab, "--make-vocab-size-divisible-by", 1]
    if m.moe is not None:
        e = m.moe
        out += ["--num-experts", e.experts, "--moe-router-topk", e.top_k, "--moe-ffn-hidden-size", e.expert_ffn_hidden]
        if e.shared_experts:
            out += ["--moe-shared-expert-intermediate-size", e.shared_experts * e.expert_ffn_hidden]
        if e.max_nodes_per_token:  # node-limited routing: groups of experts, top groups per token
            out += ["--moe-router-num-groups", max(e.max_nodes_per_token, 8), "--moe-router-group-topk"]
            out.append(e.max_nodes_per_token)
        if e.score_function != "softmax":
            out += ["--moe-router-score-function", e.score_function]
        if e.dense_layers:
            out += ["--moe-layer-freq", f'"([0]*{e.dense_layers}+[1]*{m.layers - e.dense_layers})"']
    if m.mtp_depth:
        out += ["--mtp-num-layers", m.mtp_depth]
    return out


def layout_string(chunks: list[int], mtp_depth: int = 0) -> str:
    """Megatron-Core's ``--pipeline-model-parallel-layout`` for these transformer layers per model
    chunk (``megatron/core/transformer/pipeline_parallel_layer_layout.py``): chunks in order,
    ``|`` between them, ``t`` a transformer layer, ``E`` the embedding (first chunk), ``m`` an
    MTP module and ``L`` the loss (last chunk)."""
    parts = [f"t*{n}" if n else "" for n in chunks]
    parts[0] = "E" + parts[0]
    parts[-1] = parts[-1] + "m" * mtp_depth + "L"
    return "|".join(parts)


def _layout_args(sc) -> list[str]:
    L = sc.layout
    out = ["--tensor-model-parallel-size", L.tp, "--pipeline-model-parallel-size", L.pp]
    out += ["--context-parallel-size", L.cp, "--expert-model-parallel-size", L.ep]
    if sc.model.moe is not None:
        out += ["--expert-tensor-parallel-size", L.etp]
    if L.vpp > 1:
        out += ["--virtual-pipeline-model-parallel-size", L.vpp]
    chunks = L.layers_per_chunk(sc.model.layers, mtp_depth=sc.model.mtp_depth) if L.pp > 1 else None
    if chunks and len(set(chunks)) > 1:  # uneven chunks: Megatron-Core's custom layout string
        out += ["--pipeline-model-parallel-layout", f'"{layout_string(chunks, sc.model.mtp_depth)}"']
    if L.sequence_parallel:
        out.append("--sequence-parallel")
    if L.zero >= 1:
        out.append("--use-distributed-optimizer")
    if L.zero >= 2:  # Megatron-FSDP shards gradients and parameters too
        out += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]
    return out  # the data-parallel size follows from the devices (torchrun's line)


def _expert_gemm_args(t) -> list[str]:
    """``training.moe_expert_gemm`` (simulator.interop.megatron_moe): TEGroupedMLP, one cuBLAS
    GEMM per local expert (``per-expert``), or with Transformer Engine's native GroupedTensor
    path, one grouped GEMM (``grouped``: ``--moe-use-grouped-tensor``, which the TE operation
    fuser of the FP8 dispatch turns on as well, transformer_config.py at d98e8a64), or TE's fused
    grouped MLP (``fused-mlp``: the operation fuser, the GLU interleaved in blocks of 32, and
    ``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1`` before the launch line)."""
    if t.fp8_dispatch:
        if t.moe_expert_gemm == "per-expert":
            raise ScenarioError(
                "Megatron-Core sends FP8 tokens only with Transformer Engine's operation fuser, which runs "
                "the experts as one grouped GEMM: set training.moe_expert_gemm: grouped or "
                "training.moe_dispatch_dtype: bf16",
                field="training.moe_expert_gemm",
            )
        # the fuser's flags are written with the dispatch (--moe-grouped-gemm --use-transformer-engine-op-fuser)
        return [GLU_INTERLEAVE_ARG, 32] if t.moe_expert_gemm == "fused-mlp" else []
    if t.moe_expert_gemm == "fused-mlp":  # with NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 (export_megatron)
        return ["--moe-grouped-gemm", "--use-transformer-engine-op-fuser", GLU_INTERLEAVE_ARG, 32]
    if t.moe_expert_gemm == "grouped":
        return ["--moe-grouped-gemm", "--moe-use-grouped-tensor"]
    return ["--moe-grouped-gemm"]


def _training_args(t, moe: bool, zero: int, dp: int, load=None, node_limited: bool = False) -> list[str]:
    out = ["--seq-length", t.seq_len, "--max-position-embeddings", t.seq_len]
    out += ["--micro-batch-size", t.micro_batch_size, "--global-batch-size", t.global_batch_size]
    out.append("--bf16")
    if t.dtype == "fp8":
        out += ["--fp8-format", "hybrid"]
    out += RECOMPUTE_ARGS[t.recompute]
    if t.overlap_grad_reduce:
        out.append("--overlap-grad-reduce")
    if t.overlap_param_gather and zero in (1, 2):
        if t.overlap_grad_reduce:
            out.append("--overlap-param-gather")
        elif dp > 1:  # a gather to overlap, which Megatron-LM cannot without --overlap-grad-reduce
            raise ScenarioError(
                "Megatron-LM overlaps the parameter gather only with --overlap-grad-reduce: set it false, "
                "or training.overlap_grad_reduce true",
                field="training.overlap_param_gather",
            )
    out += ["--attention-backend", "flash" if t.flash_attention else "unfused"]
    if t.cuda_graphs == "per-layer":
        out += ["--cuda-graph-impl", "transformer_engine"]
    elif t.cuda_graphs == "full":
        out += ["--cuda-graph-impl", "full_iteration"]
    out += _expert_capacity_args(t, load) if moe else []
    if t.moe_shared_expert_overlap:
        out.append("--moe-shared-expert-overlap")
    if t.tp_comm_overlap:
        out.append("--tp-comm-overlap")
        if t.tp_comm_overlap_sms:  # the file's contents go in a comment (export_megatron)
            out += ["--tp-comm-overlap-cfg", UB_CFG_FILE]
    if t.overlap_moe_expert_parallel_comm:
        out += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    if t.dtype == "fp8" and t.fp8_recipe != "delayed":
        out += ["--fp8-recipe", t.fp8_recipe]
    if t.fp8_params:
        out.append("--fp8-param-gather")
    if t.dtype == "fp8" and not t.fp8_params and not t.fp8_weight_cache:
        out.append("--disable-parameter-transpose-cache")
    out += _dispatcher_args(t, node_limited) if moe else []
    out += _expert_gemm_args(t) if moe else []
    if t.fp8_dispatch and moe:
        # Megatron-Core sends FP8 tokens only through the flex 'ncclep' backend
        # (transformer_config.py at d98e8a64: moe_dispatch_fwd_dtype needs it, the TE op
        # fuser and grouped GEMMs)
        out += ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "ncclep"]
        out += ["--moe-dispatch-fwd-dtype", "mxfp8", "--moe-grouped-gemm", "--use-transformer-engine-op-fuser"]
    if t.optimizer != "adam":
        out += ["--optimizer", t.optimizer]
    if t.offload_optimizer:
        out.append("--optimizer-cpu-offload")
    if t.offload_activations:  # Megatron-Core's fine-grained activation offloading (2026/01)
        out.append("--fine-grained-activation-offloading")
    if t.distribute_saved_activations:
        out.append("--distribute-saved-activations")
    if moe and t.moe_router_dtype == "fp32":
        out += ["--moe-router-dtype", "fp32"]
    out += [f"--{a}" for a, key in megatron_moe.FUSIONS.items() if moe and getattr(t, key)]
    return out


def _dispatcher_args(t, node_limited: bool = False) -> list:
    """``training.moe_token_dispatcher``: ``alltoall``, ``allgather`` or ``flex`` with the
    ``deepep`` backend (Megatron-Core's default backend); ``auto`` writes the dispatcher it
    simulates (``flex`` where the model limits the nodes a token reaches, ``node_limited``, else
    ``alltoall``), never nothing, which Megatron-Core would run as its allgather default. FP8 on
    the wire (``training.moe_dispatch_dtype``) needs the flex ``ncclep`` backend, which is neither
    (under ``auto`` the caller writes it)."""
    if t.moe_token_dispatcher == "auto":
        if t.fp8_dispatch:
            return []
        if node_limited:
            return ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"]
        return ["--moe-token-dispatcher-type", "alltoall"]
    if t.fp8_dispatch:
        raise ScenarioError(
            "Megatron-Core sends FP8 tokens only through the flex ncclep backend, which stepsim models as "
            f"neither alltoall nor flex: leave it auto or set training.moe_dispatch_dtype: bf16 (got "
            f"{t.moe_token_dispatcher!r})",
            field="training.moe_token_dispatcher",
        )
    if t.moe_token_dispatcher in ("alltoall", "allgather"):
        return ["--moe-token-dispatcher-type", t.moe_token_dispatcher]
    return ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"]


def _expert_capacity_args(t, load) -> list:
    """Token dropping and padding (``training.expert_load.capacity_factor`` /
    ``pad_to_capacity``) and the sync-free dispatcher (``training.moe_host_sync: false``).
    Megatron-Core's dispatcher skips the host sync exactly when it pads to capacity
    (transformer_config.py at d98e8a64): the two other combinations of a capacity factor have
    no launch line and are refused, naming the key. ``load``: the scenario's ``expert_load``."""
    cf = None if load is None else load.capacity_factor
    pad = bool(load is not None and load.pad_to_capacity)
    if pad and t.moe_host_sync:
        raise ScenarioError(
            "Megatron-Core's dispatcher padded to capacity does not block on the host: set it false beside "
            "training.expert_load.pad_to_capacity",
            field="training.moe_host_sync",
        )
    if cf is not None and not pad and not t.moe_host_sync:
        raise ScenarioError(
            "Megatron-Core drops tokens without a host sync only when it pads each expert to its capacity: "
            "set it true (or training.moe_host_sync: true)",
            field="training.expert_load.pad_to_capacity",
        )
    out = [] if cf is None else ["--moe-expert-capacity-factor", cf]
    if not t.moe_host_sync:
        out.append("--moe-pad-expert-input-to-capacity")
    return out


def _optimizer_precision_args(t, zero: int) -> list:
    """``training.grad_dtype``, ``master_weights`` and ``optimizer_state_dtype`` as Megatron's
    arguments: ``--grad-reduce-in-bf16``, and the precision-aware optimizer
    (``--use-precision-aware-optimizer``, ``--main-params-dtype``, ``--exp-avg(-sq)-dtype``:
    megatron/training/arguments.py at d98e8a64), which needs the distributed optimizer and Adam
    and keeps an FP32 master as 16-bit remainders beside the BF16 weights
    (``store_param_remainders``, no argument turns it off): an FP32 master beside 16-bit or
    8-bit moments has no launch line and is refused, naming the key."""
    out = ["--grad-reduce-in-bf16"] if t.grad_dtype == "bf16" else []
    master, state = t.master_weights, t.optimizer_state_dtype
    if master in ("none", "bf16"):
        raise ScenarioError(
            f"Megatron-LM keeps a master copy (fp32, remainder or fp16), got {master!r}",
            field="training.master_weights",
        )
    if master == "fp32" and state == "fp32":
        return out
    if master == "fp32":
        raise ScenarioError(
            f"Megatron's precision-aware optimizer, which {state} moments need, keeps the FP32 master as 16-bit "
            "remainders: set training.master_weights: remainder",
            field="training.master_weights",
        )
    if zero < 1 or t.optimizer != "adam":
        raise ScenarioError(
            "Megatron's precision-aware optimizer needs the distributed optimizer (parallel.zero >= 1) and adam, "
            f"got zero {zero}, optimizer {t.optimizer}",
            field="training.master_weights",
        )
    out.append("--use-precision-aware-optimizer")
    if master == "fp16":
        out += ["--main-params-dtype", "fp16"]
    if state != "fp32":
        out += ["--exp-avg-dtype", state, "--exp-avg-sq-dtype", state]
    return out


def _balance_args(sc) -> list:
    """``training.balance`` (simulator.interop.megatron_moe.balance reads it back): ``aux-free``
    is the expert bias, which Megatron-Core allows with sigmoid scores only (else no balancing
    term: nothing written); ``aux-loss-local`` Megatron's ``aux_loss`` at the coefficient its
    help recommends to start from, 1e-2 (the value does not change a step's time)."""
    if sc.training.balance == "aux-loss-local":
        return ["--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-2"]
    if sc.model.moe.score_function == "sigmoid":
        return ["--moe-router-enable-expert-bias"]
    return []


def export_megatron(sc) -> str:
    """The launch line of resolved scenario ``sc`` (torchrun over its devices, 8 a node where
    they divide, else one node each), with the placement as a Slurm comment."""
    _check(sc)
    devices = sc.layout.world
    c = sc.cluster
    # GPUs a node (a GB200 NVL72 compute tray holds 4; a DGX or HGX node 8)
    per_node = 4 if (c.domain_capacity or 0) == 72 else (8 if devices % 8 == 0 else devices)
    node_limited = bool(sc.model.moe is not None and sc.model.moe.max_nodes_per_token)
    args = (
        _model_args(sc.model)
        + _layout_args(sc)
        + _training_args(sc.training, sc.model.is_moe, sc.layout.zero, sc.layout.dp, sc.expert_load, node_limited)
    )
    args += _optimizer_precision_args(sc.training, sc.layout.zero)
    args += _balance_args(sc) if sc.model.is_moe else []
    lines = [f"# {sc.name}: written by stepsim export megatron (Megatron-LM arguments, d98e8a64)"]
    load = sc.expert_load
    if sc.model.is_moe and load is not None and load.distribution != "balanced":  # no Megatron argument
        lines.append(
            f"# routing imbalance (training.expert_load): {load.distribution}, skew {load.skew}, seed {load.seed}"
        )
    t = sc.training
    if t.tp_comm_overlap and t.tp_comm_overlap_sms:  # training.tp_comm_overlap_sms as TE's ub_cfgs
        cfg = ", ".join(f"{name}: {{num_sm: {n}}}" for name, n in t.tp_comm_overlap_sms)
        lines.append(f"# {UB_CFG_FILE} (training.tp_comm_overlap_sms): {{{cfg}}}")
    launch = f"torchrun --nnodes {devices // per_node} --nproc-per-node {per_node} pretrain_gpt.py \\"
    if c.devices_per_domain is not None and c.domain_capacity:
        # Slurm's topology/block plugin places --segment nodes in one block (one rack): the
        # placement, where Megatron has no knob for it
        lines.append(f"# placement: {c.devices_per_domain} of {c.domain_capacity} devices a scale-up domain")
        launch = f"srun --segment={c.devices_per_domain // per_node} " + launch
    if t.moe_expert_gemm == "fused-mlp":  # Transformer Engine reads its switch from the environment
        launch = "NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 " + launch
    lines.append(launch)
    pairs, i = [], 0
    while i < len(args):
        a = str(args[i])
        if i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
            pairs.append(f"{a} {args[i + 1]}")
            i += 2
        else:
            pairs.append(a)
            i += 1
    lines += [f"  {p} \\" for p in pairs[:-1]] + [f"  {pairs[-1]}"]
    return "\n".join(lines) + "\n"
