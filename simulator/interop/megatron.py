"""A scenario from a Megatron-LM / NeMo argument list (``stepsim import megatron ARGS_FILE``,
whose command line is :mod:`simulator.cli.importer`).

The file holds one argument list as a user launches Megatron-LM (``pretrain_gpt.py
--tensor-model-parallel-size 8 ...``), optionally behind its launcher (``torchrun
--nnodes 4 --nproc-per-node 8 pretrain_gpt.py ...``); newlines, ``\\`` line
continuations and ``#`` comment lines are allowed. NeMo-style Hydra overrides
(``model.tensor_model_parallel_size=8 trainer.num_nodes=4``) are read too: the last
dotted component, with ``_`` as ``-``, names the Megatron argument.

Every argument is either mapped onto a scenario key (:data:`MAPPED`), ignored because it
cannot change the time of one step (:data:`NO_STEP_EFFECT`: learning rate, data, logging,
checkpoints...), or listed as *not mapped*: the YAML written starts with a comment block
listing each of the three groups and the assumptions made (:func:`to_yaml`), and the command
prints the unmapped ones. :mod:`simulator.interop.megatron_args` reads the argument list. The cluster is not in Megatron's arguments: ``--cluster PRESET`` and
``--devices N`` (default: ``--nnodes`` x ``--nproc-per-node`` of a torchrun line,
``--num-gpus``, NeMo's ``trainer.num_nodes`` x ``trainer.devices``, or tp·pp·cp·dp when
``--data-parallel-size`` is given).

Megatron defaults applied where an argument is absent (Megatron-LM
``megatron/training/arguments.py``): FFN ``4h`` (``int(8h/3 / 64) * 64`` with
``--swiglu``), GELU, LayerNorm, linear biases, tied embeddings, 2 experts routed per
token, expert tensor parallelism = tensor parallelism, no sequence parallelism, no
distributed optimizer (ZeRO 0), no gradient-reduction overlap, vocabulary padded to a
multiple of ``--make-vocab-size-divisible-by`` (128) x tp (``_vocab_size_with_padding``
in ``megatron/training/tokenizer``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from simulator.interop import megatron_layout, megatron_memory, megatron_moe, megatron_precision
from simulator.interop.megatron_args import GPT2_VOCAB, NO_STEP_EFFECT, ScenarioError, arg_int, parse_arg_text
from workloads.enums import SCORE_FUNCTIONS


@dataclass
class ImportResult:
    scenario: dict
    mapped: list[str] = field(default_factory=list)  # "--arg value -> key"
    ignored: list[str] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)


class _Mapping:
    """One import under way: the parsed arguments, the result filled section by section and
    the arguments used so far (the rest are listed as ignored or not mapped)."""

    def __init__(self, args: dict, name: str):
        self.args = args
        self.res = ImportResult(scenario={})
        self.used: set[str] = set()
        self.name = name
        self.tp = 1
        self.devices_per_domain: int | None = None  # from Slurm's --segment

    def integer(self, name: str, default=None, low: int | None = None) -> int | None:
        """``--name`` as an integer (``default`` when absent); below ``low`` is refused."""
        v = arg_int(self.args, name, default)
        if v is not None and low is not None and v < low:
            raise ScenarioError(f"must be an integer >= {low}, got {v}", field=f"--{name}")
        return v

    def take(self, arg: str, key: str, shown=None) -> None:
        """Record ``--arg`` as mapped onto ``key`` (``= shown`` when the value differs)."""
        self.used.add(arg)
        v = self.args.get(arg)
        self.res.mapped.append(
            f"--{arg}{'' if v is None else ' ' + str(v)} -> {key}" + (f" = {shown}" if shown is not None else "")
        )

    def assume(self, text: str) -> None:
        self.res.assumptions.append(text)

    # ---- model ---------------------------------------------------------------------------

    def model(self) -> dict:
        """The model section; sets ``self.tp``, which pads the vocabulary."""
        args = self.args
        for req in ("num-layers", "hidden-size", "num-attention-heads"):
            if args.get(req) is None:
                raise ScenarioError("required: the model's shape is not complete without it", field=f"--{req}")
        layers, hidden, heads = (
            self.integer("num-layers"),
            self.integer("hidden-size"),
            self.integer("num-attention-heads"),
        )
        for a, k in (
            ("num-layers", "model.layers"),
            ("hidden-size", "model.hidden"),
            ("num-attention-heads", "model.heads"),
        ):
            self.take(a, k)
        model: dict = {"name": f"{self.name}-model", "layers": layers, "hidden": hidden, "heads": heads}
        self.tp = self.integer("tensor-model-parallel-size", 1, low=1)
        self.attention(model)
        self.mlp(model, hidden)
        self.vocab(model, self.tp)
        self.moe(model)
        if args.get("mtp-num-layers") is not None:
            model["mtp_depth"] = self.integer("mtp-num-layers")
            self.take("mtp-num-layers", "model.mtp_depth")
        return model

    def attention(self, model: dict) -> None:
        args = self.args
        if "group-query-attention" in args:
            self.take("group-query-attention", "model.kv_heads")
            if "num-query-groups" in args:
                model["kv_heads"] = self.integer("num-query-groups")
                self.take("num-query-groups", "model.kv_heads")
        elif "num-query-groups" in args:
            model["kv_heads"] = self.integer("num-query-groups")  # NeMo sets the groups alone
            self.take("num-query-groups", "model.kv_heads")
        if "kv-channels" in args:
            model["head_dim"] = self.integer("kv-channels")
            self.take("kv-channels", "model.head_dim")
        if (
            "multi-latent-attention" in args
        ):  # DeepSeek-V2/V3's MLA (megatron/core/transformer/multi_latent_attention.py)
            self.take("multi-latent-attention", "model.attention")
            mla = {}
            for a, k in (
                ("q-lora-rank", "q_lora_rank"),
                ("kv-lora-rank", "kv_lora_rank"),
                ("qk-head-dim", "qk_nope_head_dim"),
                ("qk-pos-emb-head-dim", "qk_rope_head_dim"),
                ("v-head-dim", "v_head_dim"),
            ):
                if args.get(a) is not None:
                    mla[k] = self.integer(a)
                    self.take(a, f"model.attention.{k}")
            model["attention"] = mla

    def mlp(self, model: dict, hidden: int) -> None:
        """FFN kind and width, norm, biases and embedding tying."""
        args = self.args
        swiglu = "swiglu" in args
        model["ffn"] = "swiglu" if swiglu else "gelu"
        if swiglu:
            self.take("swiglu", "model.ffn", "swiglu")
        if "ffn-hidden-size" in args:
            model["ffn_hidden"] = self.integer("ffn-hidden-size")
            self.take("ffn-hidden-size", "model.ffn_hidden")
        else:  # Megatron's default (megatron/training/arguments.py)
            model["ffn_hidden"] = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden
            self.assume(
                f"model.ffn_hidden = {model['ffn_hidden']}: Megatron's default "
                f"({'int(8h/3 / 64) * 64 under --swiglu' if swiglu else '4h'})"
            )
        norm = str(args.get("normalization") or "LayerNorm")
        if norm not in ("LayerNorm", "RMSNorm"):
            raise ScenarioError(f"LayerNorm or RMSNorm, got {norm!r}", field="--normalization")
        model["norm"] = "rmsnorm" if norm == "RMSNorm" else "layernorm"
        if "normalization" in args:
            self.take("normalization", "model.norm", model["norm"])
        model["bias"] = "disable-bias-linear" not in args
        for a in ("disable-bias-linear", "add-bias-linear"):
            if a in args:
                self.take(a, "model.bias", model["bias"])
        model["tied_embeddings"] = "untie-embeddings-and-output-weights" not in args
        if not model["tied_embeddings"]:
            self.take("untie-embeddings-and-output-weights", "model.tied_embeddings", False)

    def vocab(self, model: dict, tp: int) -> None:
        """The vocabulary, padded as Megatron pads it."""
        args = self.args
        multiple = self.integer("make-vocab-size-divisible-by", 128, low=1) * tp
        if "make-vocab-size-divisible-by" in args:
            self.take("make-vocab-size-divisible-by", "model.vocab")
        if args.get("padded-vocab-size") is not None:
            model["vocab"] = self.integer("padded-vocab-size")
            self.take("padded-vocab-size", "model.vocab")
            return
        if args.get("vocab-size") is not None:
            raw = self.integer("vocab-size")
            self.take("vocab-size", "model.vocab")
        elif args.get("vocab-file") and "gpt2-vocab" in Path(str(args["vocab-file"])).name:
            raw = GPT2_VOCAB
            self.take("vocab-file", "model.vocab", f"{GPT2_VOCAB} (GPT-2 BPE)")
        else:
            raise ScenarioError(
                "the vocabulary size is not in the arguments (a tokenizer stepsim "
                "cannot read): add --vocab-size N (or --padded-vocab-size N)",
                field="--vocab-size",
            )
        model["vocab"] = -(-raw // multiple) * multiple
        self.assume(
            f"model.vocab = {model['vocab']}: {raw} padded to a multiple of {multiple} "
            f"(--make-vocab-size-divisible-by {multiple // tp} x tp {tp}), as Megatron pads it"
        )

    def moe(self, model: dict) -> None:
        args = self.args
        if args.get("num-experts") is None:
            return
        experts = self.integer("num-experts")
        self.take("num-experts", "model.moe.experts")
        moe = {"experts": experts, "top_k": self.integer("moe-router-topk", 2)}
        if "moe-router-topk" in args:
            self.take("moe-router-topk", "model.moe.top_k")
        else:
            self.assume("model.moe.top_k = 2: Megatron's default --moe-router-topk")
        moe["expert_ffn_hidden"] = self.integer("moe-ffn-hidden-size", model["ffn_hidden"])
        if "moe-ffn-hidden-size" in args:
            self.take("moe-ffn-hidden-size", "model.moe.expert_ffn_hidden")
        shared = self.integer("moe-shared-expert-intermediate-size")
        if shared:
            if shared % moe["expert_ffn_hidden"]:
                raise ScenarioError(
                    f"{shared} is not a multiple of the expert FFN width {moe['expert_ffn_hidden']}; "
                    "stepsim counts shared experts of that width",
                    field="--moe-shared-expert-intermediate-size",
                )
            moe["shared_experts"] = shared // moe["expert_ffn_hidden"]
            self.take("moe-shared-expert-intermediate-size", "model.moe.shared_experts", moe["shared_experts"])
        if args.get("moe-router-group-topk") is not None:  # node-limited routing
            moe["max_nodes_per_token"] = self.integer("moe-router-group-topk")
            self.take("moe-router-group-topk", "model.moe.max_nodes_per_token")
            if "moe-router-num-groups" in args:
                self.take("moe-router-num-groups", "model.moe.max_nodes_per_token")
        score = args.get("moe-router-score-function")
        if score is not None:  # Megatron's default softmax; sqrtsoftplus is not modelled
            if score not in SCORE_FUNCTIONS:
                raise ScenarioError(
                    f"must be {' or '.join(SCORE_FUNCTIONS)} (the score functions stepsim models), got {score!r}",
                    field="--moe-router-score-function",
                )
            moe["score_function"] = score
            self.take("moe-router-score-function", "model.moe.score_function")
        freq = args.get("moe-layer-freq")
        if freq is not None:
            moe["dense_layers"] = megatron_layout.dense_layers(self, str(freq), model["layers"])
            self.take("moe-layer-freq", "model.moe.dense_layers", moe["dense_layers"])
        model["moe"] = moe

    # ---- layout --------------------------------------------------------------------------

    def layout(self, model: dict) -> dict:
        args, tp = self.args, self.tp
        par: dict = {"tp": tp}
        if "tensor-model-parallel-size" in args:
            self.take("tensor-model-parallel-size", "parallel.tp")
        for a, k in (
            ("pipeline-model-parallel-size", "pp"),
            ("context-parallel-size", "cp"),
            ("expert-model-parallel-size", "ep"),
        ):
            par[k] = self.integer(a, 1, low=1)
            if a in args:
                self.take(a, f"parallel.{k}")
        if "moe" in model:
            par["etp"] = self.integer("expert-tensor-parallel-size", tp, low=1)
            if "expert-tensor-parallel-size" in args:
                self.take("expert-tensor-parallel-size", "parallel.etp")
            else:
                self.assume(
                    f"parallel.etp = {tp}: Megatron's default expert tensor parallelism is the tensor parallelism"
                )
        par["vpp"] = self.vpp(model["layers"], par["pp"])
        megatron_layout.pipeline_layers(self, model["layers"], par)
        par["sequence_parallel"] = "sequence-parallel" in args
        if par["sequence_parallel"]:
            self.take("sequence-parallel", "parallel.sequence_parallel", True)
        par["zero"] = 1 if "use-distributed-optimizer" in args else 0
        if par["zero"]:
            self.take("use-distributed-optimizer", "parallel.zero", 1)
        if "use-megatron-fsdp" in args:  # Megatron-FSDP: ZeRO-3 by default, ZeRO-2 for optim_grads
            strategy = str(args.get("data-parallel-sharding-strategy") or "optim_grads_params")
            zero = {"optim_grads_params": 3, "optim_grads": 2, "optim": 1, "no_shard": 0}.get(strategy)
            if zero is None:
                raise ScenarioError(
                    f"no_shard, optim, optim_grads or optim_grads_params, got {strategy!r}",
                    field="--data-parallel-sharding-strategy",
                )
            par["zero"] = zero
            self.take("use-megatron-fsdp", "parallel.zero", zero)
            if "data-parallel-sharding-strategy" in args:
                self.take("data-parallel-sharding-strategy", "parallel.zero", zero)
        dp = self.integer("data-parallel-size", low=1)
        if dp is not None:
            par["dp"] = dp
            self.take("data-parallel-size", "parallel.dp")
        return par

    def vpp(self, layers: int, pp: int) -> int:
        """Virtual pipeline stages: from the layers per virtual stage or the stage count."""
        args = self.args
        if args.get("num-layers-per-virtual-pipeline-stage") is not None:
            per = self.integer("num-layers-per-virtual-pipeline-stage")
            if per <= 0 or layers % (pp * per):
                raise ScenarioError(
                    f"{layers} layers do not split into {pp} stages of chunks of {per}",
                    field="--num-layers-per-virtual-pipeline-stage",
                )
            vpp = layers // (pp * per)
            self.take("num-layers-per-virtual-pipeline-stage", "parallel.vpp", vpp)
            return vpp
        if args.get("virtual-pipeline-model-parallel-size") is not None:
            vpp = self.integer("virtual-pipeline-model-parallel-size", low=1)
            self.take("virtual-pipeline-model-parallel-size", "parallel.vpp")
            return vpp
        return 1

    # ---- training ------------------------------------------------------------------------

    def training(self, layers: int, par: dict) -> dict:
        args = self.args
        seq_arg = "seq-length" if args.get("seq-length") is not None else "encoder-seq-length"
        if args.get(seq_arg) is None:
            raise ScenarioError("required: tokens per sequence", field="--seq-length")
        tr: dict = {"seq_len": self.integer(seq_arg)}
        self.take(seq_arg, "training.seq_len")
        if args.get("micro-batch-size") is None:
            raise ScenarioError("required: sequences per micro-batch", field="--micro-batch-size")
        tr["micro_batch_size"] = self.integer("micro-batch-size")
        self.take("micro-batch-size", "training.micro_batch_size")
        if args.get("global-batch-size") is not None:
            tr["global_batch_size"] = self.integer("global-batch-size")
            self.take("global-batch-size", "training.global_batch_size")
        tr["dtype"] = megatron_precision.dtype(self)
        tr.update(megatron_precision.moe_dispatch(self, tr["dtype"]))
        tr.update(megatron_precision.fp8_weights(self, tr["dtype"]))
        tr.update(megatron_precision.fp8_recipe(self, tr["dtype"]))
        tr["recompute"] = self.recompute(layers, par)
        tr["overlap_grad_reduce"] = self.overlap_grad_reduce()
        if par["zero"] in (1, 2) or "overlap-param-gather" in args:  # else no gather to overlap
            tr["overlap_param_gather"] = self.overlap_param_gather(par["zero"], tr["overlap_grad_reduce"])
        tr["flash_attention"] = self.flash_attention()
        tr.update(self.host_side())
        tr.update(self.optimizer_and_offload())
        # the memory flags (megatron_memory: Megatron-LM d98e8a64, arguments.py and transformer_config.py)
        moe = args.get("num-experts") is not None
        tr.update(megatron_memory.saved_activations(self, tr["recompute"], par))
        tr.update(megatron_memory.router_dtype(self, moe))
        tr.update(megatron_moe.dispatcher(self, moe))
        tr.update(megatron_moe.expert_gemm(self, moe))
        tr.update(megatron_moe.fusion(self, moe))
        tr.update(megatron_moe.balance(self, moe))
        tr.update(megatron_memory.capacity(self, moe, tr.get("moe_token_dispatcher") == "allgather"))
        tr.update(megatron_memory.optimizer_precision(self, tr.get("optimizer", "adam")))
        return tr

    def optimizer_and_offload(self) -> dict:
        """``--optimizer`` (adam, sgd, muon) and host offload: ``--optimizer-cpu-offload`` (the
        optimizer step on the host) and ``--fine-grained-activation-offloading`` (activations
        copied to the host after their layer's forward)."""
        args, out = self.args, {}
        opt = args.get("optimizer")
        if opt is not None:
            name = {"dist_muon": "muon", "adaptive_muon": "muon"}.get(str(opt), str(opt))
            if name not in ("adam", "sgd", "muon"):
                raise ScenarioError(f"adam, sgd or muon, got {opt!r}", field="--optimizer")
            out["optimizer"] = name
            self.take("optimizer", "training.optimizer", name)
        offload = {}
        if "optimizer-cpu-offload" in args:
            offload["optimizer"] = True
            self.take("optimizer-cpu-offload", "training.offload.optimizer", True)
        if "fine-grained-activation-offloading" in args:
            offload["activations"] = True
            self.take("fine-grained-activation-offloading", "training.offload.activations", True)
        if offload:
            out["offload"] = {"optimizer": False, "activations": False, **offload}
        return out

    def host_side(self) -> dict:
        """The host side (simulator.engine.host) and the shared-expert overlap: CUDA graphs
        (``--cuda-graph-impl`` none / local / transformer_engine / full_iteration, the older
        ``--enable-cuda-graph`` / ``--external-cuda-graph``),
        ``--moe-shared-expert-overlap`` and ``--tp-comm-overlap`` (the MoE dispatcher's blocking
        host read, none under ``--moe-pad-expert-input-to-capacity``, is
        :func:`simulator.interop.megatron_memory.capacity`'s); Megatron's defaults (eager,
        no overlap)
        where absent (megatron/training/arguments.py, NVIDIA/Megatron-LM d98e8a6)."""
        args, out = self.args, {}
        impl = args.get("cuda-graph-impl")
        if impl is None and "enable-cuda-graph" in args:
            impl = "local"
            self.take("enable-cuda-graph", "training.cuda_graphs", "per-layer")
        if impl is None and "external-cuda-graph" in args:
            impl = "transformer_engine"
            self.take("external-cuda-graph", "training.cuda_graphs", "per-layer")
        scope = " ".join(str(args.get(a) or "") for a in ("cuda-graph-modules", "cuda-graph-scope"))
        if "full_iteration" in scope:
            impl = "full_iteration"
        if impl is not None:
            graphs = {"none": "none", "local": "per-layer", "transformer_engine": "per-layer"}.get(
                str(impl), "full" if impl == "full_iteration" else None
            )
            if graphs is None:
                raise ScenarioError(
                    f"none, local, transformer_engine or full_iteration, got {impl!r}", field="--cuda-graph-impl"
                )
            if "cuda-graph-impl" in args:
                self.take("cuda-graph-impl", "training.cuda_graphs", graphs)
            out["cuda_graphs"] = graphs
        for a in ("cuda-graph-modules", "cuda-graph-scope"):
            if args.get(a) is not None:
                self.take(a, "training.cuda_graphs", out.get("cuda_graphs", "none"))
                if "full_iteration" not in scope:
                    self.assume(
                        f"--{a} {args[a]}: per-layer graphs of whole layers, up to the MoE dispatcher's host sync "
                        "where it has one (stepsim does not capture a subset of a layer's modules)"
                    )
        if "moe-shared-expert-overlap" in args:
            self.take("moe-shared-expert-overlap", "training.moe_shared_expert_overlap", True)
            out["moe_shared_expert_overlap"] = True
        if "overlap-moe-expert-parallel-comm" in args:  # the combined 1F1B (workloads.pipeline.ep_overlap)
            self.take("overlap-moe-expert-parallel-comm", "training.overlap_moe_expert_parallel_comm", True)
            out["overlap_moe_expert_parallel_comm"] = True
            if "delay-wgrad-compute" in args:
                self.take("delay-wgrad-compute", "training.overlap_moe_expert_parallel_comm", True)
        if "tp-comm-overlap" in args:  # Transformer Engine userbuffers (workloads.trace.program_tp_overlap)
            self.take("tp-comm-overlap", "training.tp_comm_overlap", True)
            out["tp_comm_overlap"] = True
        return out

    def recompute(self, layers: int, par: dict) -> str:
        args = self.args
        gran = args.get("recompute-granularity")
        if "recompute-activations" in args:
            recompute = "selective"
            self.take("recompute-activations", "training.recompute", "selective")
        elif gran is not None:
            if gran not in ("full", "selective"):
                raise ScenarioError(f"full or selective, got {gran!r}", field="--recompute-granularity")
            recompute = gran
            self.take("recompute-granularity", "training.recompute", gran)
        elif args.get("recompute-method") is not None or "checkpoint-activations" in args:
            recompute = "full"
            self.assume(
                "training.recompute = full: a --recompute-method without --recompute-granularity "
                "(or the older --checkpoint-activations) recomputes whole layers"
            )
        else:
            recompute = "none"
        for a in ("recompute-method", "checkpoint-activations"):
            if a in args:
                self.take(a, "training.recompute", recompute)
        if args.get("recompute-num-layers") is not None:
            n = self.integer("recompute-num-layers")
            per_stage = layers // (par["pp"] * par["vpp"])
            method = args.get("recompute-method") or "uniform"
            if recompute == "full" and (method == "uniform" and n == 1 or method == "block" and n >= per_stage):
                self.take("recompute-num-layers", "training.recompute", "full")
            else:
                self.used.add("recompute-num-layers")
                self.res.unmapped.append(
                    f"--recompute-num-layers {n} (with --recompute-method {method}: stepsim recomputes all "
                    f"layers or none; simulated as recompute {recompute})"
                )
        return recompute

    def overlap_grad_reduce(self) -> bool:
        ddp = self.args.get("DDP-impl")
        if "overlap-grad-reduce" in self.args:
            self.take("overlap-grad-reduce", "training.overlap_grad_reduce", True)
            return True
        if ddp is not None:
            self.take("DDP-impl", "training.overlap_grad_reduce", ddp == "torch")
            self.assume(
                "--DDP-impl torch overlaps bucketed all-reduces with the backward pass (PyTorch DDP); "
                "local reduces after it"
            )
            return ddp == "torch"
        self.assume("training.overlap_grad_reduce = false: Megatron's default (no --overlap-grad-reduce)")
        return False

    def overlap_param_gather(self, zero: int, overlap_grad: bool) -> bool:
        """``--overlap-param-gather`` (Megatron-LM d98e8a64 arguments.py: default off; it asserts
        a distributed optimizer and ``--overlap-grad-reduce``)."""
        if "overlap-param-gather" in self.args:
            if zero not in (1, 2) or not overlap_grad:
                need = "--use-distributed-optimizer" if zero not in (1, 2) else "--overlap-grad-reduce"
                raise ScenarioError(f"needs {need}, as Megatron-LM asserts", field="--overlap-param-gather")
            self.take("overlap-param-gather", "training.overlap_param_gather", True)
            return True
        self.assume(
            "training.overlap_param_gather = false: Megatron's default (no --overlap-param-gather): "
            "the distributed optimizer gathers the parameters after its step, before the next forward"
        )
        return False

    def flash_attention(self) -> bool:
        args = self.args
        backend = args.get("attention-backend")
        if "use-flash-attn" in args:
            self.take("use-flash-attn", "training.flash_attention", True)
            return True
        if backend is not None:
            flash = backend in ("flash", "fused", "auto")
            self.take("attention-backend", "training.flash_attention", flash)
            return flash
        if args.get("transformer-impl") is not None:
            flash = args["transformer-impl"] == "transformer_engine"
            self.take("transformer-impl", "training.flash_attention", flash)
            return flash
        self.assume(
            "training.flash_attention = true: the arguments do not name the attention kernel; "
            "current Megatron-LM fuses attention (Transformer Engine); Megatron-LM before 2023 "
            "materialised the scores: set training.flash_attention: false for those runs"
        )
        return True

    # ---- devices and the rest ------------------------------------------------------------

    def devices(self, devices: int | None, par: dict) -> int:
        """The GPU count: given, from the launcher, ``--num-gpus`` or tp x pp x cp x dp."""
        args = self.args
        if devices is not None:
            self.used.update(a for a in ("nnodes", "nproc-per-node", "num-nodes", "devices", "num-gpus") if a in args)
            return devices
        nodes = self.integer("nnodes", low=1) if args.get("nnodes") is not None else self.integer("num-nodes", low=1)
        per = (
            self.integer("nproc-per-node", low=1)
            if args.get("nproc-per-node") is not None
            else self.integer("devices", low=1)
        )
        if args.get("num-gpus") is not None:
            n_dev = self.integer("num-gpus", low=1)
            self.take("num-gpus", "cluster.devices")
        elif nodes is not None and per is not None:
            n_dev = nodes * per
            for a in ("nnodes", "nproc-per-node", "num-nodes", "devices"):
                if a in args:
                    self.take(a, "cluster.devices", n_dev)
            if args.get("segment") is not None:  # Slurm topology/block: nodes placed together
                self.devices_per_domain = self.integer("segment", low=1) * per
                self.take("segment", "cluster.devices_per_domain", self.devices_per_domain)
        elif par.get("dp") is not None:
            n_dev = par["tp"] * par["pp"] * par["cp"] * par["dp"]
            self.assume(f"cluster.devices = {n_dev}: tp x pp x cp x dp")
        else:
            raise ScenarioError(
                "the arguments do not say how many GPUs ran: give --devices N (or "
                "--data-parallel-size, or the torchrun line's --nnodes/--nproc-per-node)",
                field="--devices",
            )
        return n_dev

    def leftovers(self) -> None:
        """Every argument not used: ignored (no effect on a step) or not mapped."""
        for a, v in self.args.items():
            if a in self.used:
                continue
            shown = f"--{a}" + ("" if v is None else f" {v}")
            if a in NO_STEP_EFFECT:
                self.res.ignored.append(shown)
            else:
                self.res.unmapped.append(shown)


def import_megatron(text: str, cluster: str, devices: int | None = None, name: str = "megatron-import") -> ImportResult:
    """Map an argument list onto a scenario mapping (see the module notes)."""
    m = _Mapping(parse_arg_text(text), name)
    model = m.model()
    par = m.layout(model)
    tr = m.training(model["layers"], par)
    n_dev = m.devices(devices, par)
    m.res.scenario = {
        "name": name,
        "model": model,
        "cluster": {"preset": cluster, "devices": int(n_dev)}
        | ({"devices_per_domain": m.devices_per_domain} if m.devices_per_domain else {}),
        "parallel": par,
        "schedule": "interleaved-1f1b" if par["vpp"] > 1 else "1f1b",
        "training": tr,
    }
    m.leftovers()
    return m.res


def to_yaml(res: ImportResult, source: str) -> str:
    """The scenario as YAML, headed by a comment block: source, mapped, assumed,
    not mapped, ignored."""
    import yaml

    lines = [f"# Imported by `stepsim import megatron` from {source}.", "# Mapped:"]
    lines += [f"#   {m}" for m in res.mapped]
    if res.assumptions:
        lines.append("# Assumed (not in the arguments):")
        lines += [f"#   {a}" for a in res.assumptions]
    lines.append("# Not mapped (no scenario key; check by hand):" + ("" if res.unmapped else " none"))
    lines += [f"#   {u}" for u in res.unmapped]
    if res.ignored:
        lines.append("# Ignored (no effect on the time of one step): " + " ".join(a.split()[0] for a in res.ignored))
    return "\n".join(lines) + "\n" + yaml.safe_dump(res.scenario, sort_keys=False)
