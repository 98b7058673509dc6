"""Reading a Megatron-LM / NeMo argument list: :func:`parse_arg_text` and the tables of
which arguments map onto a scenario key (:data:`MAPPED`) and which cannot change the time of
one step (:data:`NO_STEP_EFFECT`). :mod:`simulator.interop.megatron` maps the parsed
arguments onto a scenario."""

from __future__ import annotations

import shlex

from simulator.scenario.errors import ScenarioError

#: Longest word (an argument or its value) of an argument list: a data path blend is many words.
MAX_WORD_CHARS = 65_536
# GPT-2's BPE vocabulary (Radford et al. 2019; gpt2-vocab.json, the file Megatron's GPT
# examples pass as --vocab-file): 50,257 tokens.
GPT2_VOCAB = 50257

#: Arguments that map onto a scenario key (the key they set).
MAPPED = {
    "num-layers": "model.layers",
    "hidden-size": "model.hidden",
    "num-attention-heads": "model.heads",
    "num-query-groups": "model.kv_heads",
    "group-query-attention": "model.kv_heads",
    "kv-channels": "model.head_dim",
    "ffn-hidden-size": "model.ffn_hidden",
    "swiglu": "model.ffn",
    "normalization": "model.norm",
    "disable-bias-linear": "model.bias",
    "add-bias-linear": "model.bias",
    "untie-embeddings-and-output-weights": "model.tied_embeddings",
    "vocab-size": "model.vocab",
    "padded-vocab-size": "model.vocab",
    "vocab-file": "model.vocab",
    "make-vocab-size-divisible-by": "model.vocab",
    "multi-latent-attention": "model.attention",
    "q-lora-rank": "model.attention.q_lora_rank",
    "kv-lora-rank": "model.attention.kv_lora_rank",
    "qk-head-dim": "model.attention.qk_nope_head_dim",
    "qk-pos-emb-head-dim": "model.attention.qk_rope_head_dim",
    "v-head-dim": "model.attention.v_head_dim",
    "mtp-num-layers": "model.mtp_depth",
    "moe-layer-freq": "model.moe.dense_layers",
    "moe-router-group-topk": "model.moe.max_nodes_per_token",
    "moe-router-num-groups": "model.moe.max_nodes_per_token",
    "pipeline-model-parallel-layout": "parallel.pipeline_layers",
    "decoder-first-pipeline-num-layers": "parallel.pipeline_layers",
    "decoder-last-pipeline-num-layers": "parallel.pipeline_layers",
    "segment": "cluster.devices_per_domain",
    "optimizer": "training.optimizer",
    "optimizer-cpu-offload": "training.offload.optimizer",
    "fine-grained-activation-offloading": "training.offload.activations",
    "num-experts": "model.moe.experts",
    "moe-router-topk": "model.moe.top_k",
    "moe-ffn-hidden-size": "model.moe.expert_ffn_hidden",
    "moe-shared-expert-intermediate-size": "model.moe.shared_experts",
    "seq-length": "training.seq_len",
    "encoder-seq-length": "training.seq_len",
    "micro-batch-size": "training.micro_batch_size",
    "global-batch-size": "training.global_batch_size",
    "tensor-model-parallel-size": "parallel.tp",
    "pipeline-model-parallel-size": "parallel.pp",
    "context-parallel-size": "parallel.cp",
    "expert-model-parallel-size": "parallel.ep",
    "expert-tensor-parallel-size": "parallel.etp",
    "data-parallel-size": "parallel.dp",
    "num-layers-per-virtual-pipeline-stage": "parallel.vpp",
    "virtual-pipeline-model-parallel-size": "parallel.vpp",
    "sequence-parallel": "parallel.sequence_parallel",
    "use-distributed-optimizer": "parallel.zero",
    "use-megatron-fsdp": "parallel.zero",
    "data-parallel-sharding-strategy": "parallel.zero",
    "recompute-granularity": "training.recompute",
    "recompute-method": "training.recompute",
    "recompute-num-layers": "training.recompute",
    "recompute-activations": "training.recompute",
    "checkpoint-activations": "training.recompute",
    "fp8-format": "training.dtype",
    "fp8": "training.dtype",
    "bf16": "training.dtype",
    "fp16": "training.dtype",
    "overlap-grad-reduce": "training.overlap_grad_reduce",
    "overlap-param-gather": "training.overlap_param_gather",
    "cuda-graph-impl": "training.cuda_graphs",
    "enable-cuda-graph": "training.cuda_graphs",
    "external-cuda-graph": "training.cuda_graphs",
    "cuda-graph-modules": "training.cuda_graphs",
    "cuda-graph-scope": "training.cuda_graphs",
    # with a capacity factor, also training.expert_load.pad_to_capacity (megatron_memory.capacity)
    "moe-pad-expert-input-to-capacity": "training.moe_host_sync",
    "moe-expert-rank-capacity-factor": "training.moe_host_sync",
    "moe-paged-stash": "training.moe_host_sync",
    # the memory flags (simulator.interop.megatron_memory; NVIDIA/Megatron-LM d98e8a64,
    # megatron/training/arguments.py and megatron/core/transformer/transformer_config.py)
    "distribute-saved-activations": "training.distribute_saved_activations",
    "moe-router-dtype": "training.moe_router_dtype",
    "moe-expert-capacity-factor": "training.expert_load.capacity_factor",
    "use-precision-aware-optimizer": "training.master_weights",
    "main-params-dtype": "training.master_weights",
    "main-grads-dtype": "training.grad_dtype",
    "grad-reduce-in-bf16": "training.grad_dtype",
    "exp-avg-dtype": "training.optimizer_state_dtype",
    "exp-avg-sq-dtype": "training.optimizer_state_dtype",
    "moe-shared-expert-overlap": "training.moe_shared_expert_overlap",
    "tp-comm-overlap": "training.tp_comm_overlap",
    "overlap-moe-expert-parallel-comm": "training.overlap_moe_expert_parallel_comm",
    "moe-dispatch-fwd-dtype": "training.moe_dispatch_dtype",
    "moe-token-dispatcher-type": "training.moe_token_dispatcher",
    "moe-flex-dispatcher-backend": "training.moe_token_dispatcher",
    "moe-grouped-gemm": "training.moe_expert_gemm",
    "moe-use-grouped-tensor": "training.moe_expert_gemm",
    "use-transformer-engine-op-fuser": "training.moe_expert_gemm",
    # Transformer Engine's environment switch on the launch line (NAME=1), read as an argument
    "NVTE-USE-CUTLASS-GROUPED-GEMM": "training.moe_expert_gemm",
    "NVTE-CUTEDSL-FUSED-GROUPED-MLP": "training.moe_expert_gemm",
    "moe-mlp-glu-interleave-size": "training.moe_expert_gemm",
    "moe-router-fusion": "training.moe_router_fusion",
    "moe-router-enable-expert-bias": "training.balance",
    "moe-aux-loss-coeff": "training.balance",
    "moe-router-load-balancing-type": "training.balance",
    "moe-router-score-function": "model.moe.score_function",
    "moe-permute-fusion": "training.moe_permute_fusion",
    "fp8-param-gather": "training.fp8_params",
    "fp8-recipe": "training.fp8_recipe",
    "disable-parameter-transpose-cache": "training.fp8_weight_cache",
    # the paired backward's weight gradient after its input gradient (stepsim splits a paired
    # MLP backward so whenever the overlap is on)
    "delay-wgrad-compute": "training.overlap_moe_expert_parallel_comm",
    "DDP-impl": "training.overlap_grad_reduce",
    "use-flash-attn": "training.flash_attention",
    "attention-backend": "training.flash_attention",
    "transformer-impl": "training.flash_attention",
    "num-gpus": "cluster.devices",
    "nnodes": "cluster.devices",
    "nproc-per-node": "cluster.devices",
    "num-nodes": "cluster.devices",
    "devices": "cluster.devices",
}

#: Arguments that cannot change the time of one training step (what is learnt, read,
#: logged or saved): accepted and listed as ignored.
NO_STEP_EFFECT = (
    "lr",
    "min-lr",
    "lr-decay-style",
    "lr-decay-iters",
    "lr-warmup-fraction",
    "lr-warmup-iters",
    "lr-warmup-samples",
    "train-iters",
    "train-samples",
    "eval-iters",
    "eval-interval",
    "log-interval",
    "save-interval",
    "save",
    "load",
    "data-path",
    "split",
    "merge-file",
    "tokenizer-type",
    "tokenizer-model",
    "seed",
    "clip-grad",
    "weight-decay",
    "adam-beta1",
    "adam-beta2",
    "adam-eps",
    "init-method-std",
    "loss-scale",
    "initial-loss-scale",
    "min-loss-scale",
    "loss-scale-window",
    "hidden-dropout",
    "attention-dropout",
    "max-position-embeddings",
    "position-embedding-type",
    "rotary-percent",
    "rotary-base",
    "tensorboard-dir",
    "wandb-project",
    "wandb-exp-name",
    "exit-duration-in-mins",
    "distributed-backend",
    "no-masked-softmax-fusion",
    "node-rank",
    "master-addr",
    "master-port",
    "rdzv-endpoint",
    "rdzv-backend",
    "rdzv-id",
    "data-cache-path",
    "log-throughput",
    "timing-log-level",
    "log-timers-to-tensorboard",
    "mock-data",
    "no-load-optim",
    "no-load-rng",
)

_FLAGS = (
    "swiglu",
    "disable-bias-linear",
    "add-bias-linear",
    "untie-embeddings-and-output-weights",
    "group-query-attention",
    "sequence-parallel",
    "use-distributed-optimizer",
    "bf16",
    "fp16",
    "fp8",
    "overlap-grad-reduce",
    "overlap-param-gather",
    "enable-cuda-graph",
    "external-cuda-graph",
    "moe-pad-expert-input-to-capacity",
    "moe-paged-stash",
    "distribute-saved-activations",
    "use-precision-aware-optimizer",
    "grad-reduce-in-bf16",
    "moe-shared-expert-overlap",
    "moe-grouped-gemm",
    "moe-use-grouped-tensor",
    "use-transformer-engine-op-fuser",
    "tp-comm-overlap",
    "fp8-param-gather",
    "disable-parameter-transpose-cache",
    "use-flash-attn",
    "recompute-activations",
    "checkpoint-activations",
    "mock-data",
    "log-throughput",
    "no-masked-softmax-fusion",
    "no-load-optim",
    "no-load-rng",
    "log-timers-to-tensorboard",
)


def parse_arg_text(text: str) -> dict[str, str | None]:
    """``name -> value`` (``None`` for a bare flag) of an argument list; the launcher
    (tokens before the ``*.py`` script) contributes its ``--nnodes`` / ``--nproc-per-node``."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    longest = max(joined.split(), key=len, default="")
    if len(longest) > MAX_WORD_CHARS:  # shlex builds a word a character at a time: 1 MB took 16 s
        raise ScenarioError(
            f"a word of {len(longest):,} characters ({longest[:40]!r}...); the limit is {MAX_WORD_CHARS:,}",
            field="args",
        )
    try:
        tokens = shlex.split(joined, comments=True)
    except ValueError as err:
        raise ScenarioError(f"cannot split the argument list ({err})", field="args") from None
    out: dict[str, str | None] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if tok.startswith("--"):
            name, eq, val = tok[2:].partition("=")
            name = name.replace("_", "-")
            if eq:
                out[name] = val
                continue
            vals = []
            while (
                i < len(tokens)
                and not tokens[i].startswith("--")
                and "=" not in tokens[i]
                and not tokens[i].endswith(".py")
                and name not in _FLAGS
            ):
                vals.append(tokens[i])
                i += 1
            out[name] = " ".join(vals) if vals else None
        elif "=" in tok and not tok.startswith("-"):  # NeMo / Hydra override: a.b.c=value
            key, _, val = tok.partition("=")
            name = key.lstrip("+~").split(".")[-1].replace("_", "-")
            if val.lower() in ("true", "false", "null", "none"):
                if val.lower() in ("true",):
                    out[name] = None
                continue
            out[name] = val
        # anything else: the launcher or script name (torchrun, python, pretrain_gpt.py, -u ...)
    return out


def arg_int(args: dict, name: str, default=None) -> int | None:
    """The argument ``--name`` as an integer (``default`` when absent)."""
    v = args.get(name, default)
    if v is None or isinstance(v, int):
        return v
    try:
        return int(str(v))
    except ValueError:
        raise ScenarioError(f"expected an integer, got {v!r}", field=f"--{name}") from None
