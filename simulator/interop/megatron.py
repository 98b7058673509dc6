"""``stepsim import megatron ARGS_FILE``: a scenario from a Megatron-LM / NeMo argument list.

The file holds one argument list as a user launches Megatron-LM (``pretrain_gpt.py
--tensor-model-parallel-size 8 ...``), optionally behind its launcher (``torchrun
--nnodes 4 --nproc-per-node 8 pretrain_gpt.py ...``); newlines, ``\\`` line
continuations and ``#`` comment lines are allowed. NeMo-style Hydra overrides
(``model.tensor_model_parallel_size=8 trainer.num_nodes=4``) are read too: the last
dotted component, with ``_`` as ``-``, names the Megatron argument.

Every argument is either mapped onto a scenario key (:data:`MAPPED`), ignored because it
cannot change the time of one step (:data:`NO_STEP_EFFECT`: learning rate, data, logging,
checkpoints...), or listed as *not mapped*: the YAML written starts with a comment block
listing each of the three groups and the assumptions made, and the command prints the
unmapped ones. The cluster is not in Megatron's arguments: ``--cluster PRESET`` and
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

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


def ScenarioError(field: str, message: str):  # noqa: N802 - stands for the class it returns
    """A :class:`simulator.scenario.schema.ScenarioError`; the schema (pydantic) is imported only
    when an error is raised, so that registering this command keeps ``stepsim --help`` light."""
    from simulator.scenario.schema import ScenarioError as error

    return error(field, message)


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


@dataclass
class ImportResult:
    scenario: dict
    mapped: list[str] = field(default_factory=list)  # "--arg value -> key"
    ignored: list[str] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)


def parse_arg_text(text: str) -> dict[str, Optional[str]]:
    """``name -> value`` (``None`` for a bare flag) of an argument list; the launcher
    (tokens before the ``*.py`` script) contributes its ``--nnodes`` / ``--nproc-per-node``."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    try:
        tokens = shlex.split(joined, comments=True)
    except ValueError as err:
        raise ScenarioError("args", f"cannot split the argument list ({err})") from None
    out: dict[str, Optional[str]] = {}
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


def _int(args: dict, name: str, default=None) -> Optional[int]:
    v = args.get(name, default)
    if v is None or isinstance(v, int):
        return v
    try:
        return int(str(v))
    except ValueError:
        raise ScenarioError(f"--{name}", f"expected an integer, got {v!r}") from None


def import_megatron(
    text: str, cluster: str, devices: Optional[int] = None, name: str = "megatron-import"
) -> ImportResult:
    """Map an argument list onto a scenario mapping (see the module notes)."""
    args = parse_arg_text(text)
    res = ImportResult(scenario={})
    used: set[str] = set()

    def take(arg: str, key: str, shown=None) -> None:
        used.add(arg)
        v = args.get(arg)
        res.mapped.append(
            f"--{arg}{'' if v is None else ' ' + str(v)} -> {key}" + (f" = {shown}" if shown is not None else "")
        )

    for req in ("num-layers", "hidden-size", "num-attention-heads"):
        if args.get(req) is None:
            raise ScenarioError(f"--{req}", "required: the model's shape is not complete without it")
    layers, hidden, heads = _int(args, "num-layers"), _int(args, "hidden-size"), _int(args, "num-attention-heads")
    for a, k in (
        ("num-layers", "model.layers"),
        ("hidden-size", "model.hidden"),
        ("num-attention-heads", "model.heads"),
    ):
        take(a, k)
    model: dict = {"name": f"{name}-model", "layers": layers, "hidden": hidden, "heads": heads}
    tp = _int(args, "tensor-model-parallel-size", 1)
    # attention
    if "group-query-attention" in args:
        take("group-query-attention", "model.kv_heads")
        if "num-query-groups" in args:
            model["kv_heads"] = _int(args, "num-query-groups")
            take("num-query-groups", "model.kv_heads")
    elif "num-query-groups" in args:
        model["kv_heads"] = _int(args, "num-query-groups")  # NeMo sets the groups alone
        take("num-query-groups", "model.kv_heads")
    if "kv-channels" in args:
        model["head_dim"] = _int(args, "kv-channels")
        take("kv-channels", "model.head_dim")
    # MLP
    swiglu = "swiglu" in args
    model["ffn"] = "swiglu" if swiglu else "gelu"
    if swiglu:
        take("swiglu", "model.ffn", "swiglu")
    if "ffn-hidden-size" in args:
        model["ffn_hidden"] = _int(args, "ffn-hidden-size")
        take("ffn-hidden-size", "model.ffn_hidden")
    else:  # Megatron's default (megatron/training/arguments.py)
        model["ffn_hidden"] = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden
        res.assumptions.append(
            f"model.ffn_hidden = {model['ffn_hidden']}: Megatron's default "
            f"({'int(8h/3 / 64) * 64 under --swiglu' if swiglu else '4h'})"
        )
    norm = str(args.get("normalization") or "LayerNorm")
    if norm not in ("LayerNorm", "RMSNorm"):
        raise ScenarioError("--normalization", f"LayerNorm or RMSNorm, got {norm!r}")
    model["norm"] = "rmsnorm" if norm == "RMSNorm" else "layernorm"
    if "normalization" in args:
        take("normalization", "model.norm", model["norm"])
    model["bias"] = "disable-bias-linear" not in args
    for a in ("disable-bias-linear", "add-bias-linear"):
        if a in args:
            take(a, "model.bias", model["bias"])
    model["tied_embeddings"] = "untie-embeddings-and-output-weights" not in args
    if not model["tied_embeddings"]:
        take("untie-embeddings-and-output-weights", "model.tied_embeddings", False)
    # vocabulary, padded as Megatron pads it
    multiple = _int(args, "make-vocab-size-divisible-by", 128) * tp
    if "make-vocab-size-divisible-by" in args:
        take("make-vocab-size-divisible-by", "model.vocab")
    if args.get("padded-vocab-size") is not None:
        model["vocab"] = _int(args, "padded-vocab-size")
        take("padded-vocab-size", "model.vocab")
    else:
        if args.get("vocab-size") is not None:
            raw = _int(args, "vocab-size")
            take("vocab-size", "model.vocab")
        elif args.get("vocab-file") and "gpt2-vocab" in Path(str(args["vocab-file"])).name:
            raw = GPT2_VOCAB
            take("vocab-file", "model.vocab", f"{GPT2_VOCAB} (GPT-2 BPE)")
        else:
            raise ScenarioError(
                "--vocab-size",
                "the vocabulary size is not in the arguments (a tokenizer stepsim "
                "cannot read): add --vocab-size N (or --padded-vocab-size N)",
            )
        model["vocab"] = -(-raw // multiple) * multiple
        res.assumptions.append(
            f"model.vocab = {model['vocab']}: {raw} padded to a multiple of {multiple} "
            f"(--make-vocab-size-divisible-by {multiple // tp} x tp {tp}), as Megatron pads it"
        )
    # MoE
    if args.get("num-experts") is not None:
        experts = _int(args, "num-experts")
        take("num-experts", "model.moe.experts")
        moe = {"experts": experts, "top_k": _int(args, "moe-router-topk", 2)}
        if "moe-router-topk" in args:
            take("moe-router-topk", "model.moe.top_k")
        else:
            res.assumptions.append("model.moe.top_k = 2: Megatron's default --moe-router-topk")
        moe["expert_ffn_hidden"] = _int(args, "moe-ffn-hidden-size", model["ffn_hidden"])
        if "moe-ffn-hidden-size" in args:
            take("moe-ffn-hidden-size", "model.moe.expert_ffn_hidden")
        shared = _int(args, "moe-shared-expert-intermediate-size")
        if shared:
            if shared % moe["expert_ffn_hidden"]:
                raise ScenarioError(
                    "--moe-shared-expert-intermediate-size",
                    f"{shared} is not a multiple of the expert FFN width {moe['expert_ffn_hidden']}; "
                    "stepsim counts shared experts of that width",
                )
            moe["shared_experts"] = shared // moe["expert_ffn_hidden"]
            take("moe-shared-expert-intermediate-size", "model.moe.shared_experts", moe["shared_experts"])
        model["moe"] = moe
    # layout
    par: dict = {"tp": tp}
    if "tensor-model-parallel-size" in args:
        take("tensor-model-parallel-size", "parallel.tp")
    for a, k in (
        ("pipeline-model-parallel-size", "pp"),
        ("context-parallel-size", "cp"),
        ("expert-model-parallel-size", "ep"),
    ):
        par[k] = _int(args, a, 1)
        if a in args:
            take(a, f"parallel.{k}")
    if "moe" in model:
        par["etp"] = _int(args, "expert-tensor-parallel-size", tp)
        if "expert-tensor-parallel-size" in args:
            take("expert-tensor-parallel-size", "parallel.etp")
        else:
            res.assumptions.append(
                f"parallel.etp = {tp}: Megatron's default expert tensor parallelism is the tensor parallelism"
            )
    vpp = 1
    if args.get("num-layers-per-virtual-pipeline-stage") is not None:
        per = _int(args, "num-layers-per-virtual-pipeline-stage")
        if per <= 0 or layers % (par["pp"] * per):
            raise ScenarioError(
                "--num-layers-per-virtual-pipeline-stage",
                f"{layers} layers do not split into {par['pp']} stages of chunks of {per}",
            )
        vpp = layers // (par["pp"] * per)
        take("num-layers-per-virtual-pipeline-stage", "parallel.vpp", vpp)
    elif args.get("virtual-pipeline-model-parallel-size") is not None:
        vpp = _int(args, "virtual-pipeline-model-parallel-size")
        take("virtual-pipeline-model-parallel-size", "parallel.vpp")
    par["vpp"] = vpp
    par["sequence_parallel"] = "sequence-parallel" in args
    if par["sequence_parallel"]:
        take("sequence-parallel", "parallel.sequence_parallel", True)
    par["zero"] = 1 if "use-distributed-optimizer" in args else 0
    if par["zero"]:
        take("use-distributed-optimizer", "parallel.zero", 1)
    dp = _int(args, "data-parallel-size")
    if dp is not None:
        par["dp"] = dp
        take("data-parallel-size", "parallel.dp")
    # training
    seq_arg = "seq-length" if args.get("seq-length") is not None else "encoder-seq-length"
    if args.get(seq_arg) is None:
        raise ScenarioError("--seq-length", "required: tokens per sequence")
    tr: dict = {"seq_len": _int(args, seq_arg)}
    take(seq_arg, "training.seq_len")
    if args.get("micro-batch-size") is None:
        raise ScenarioError("--micro-batch-size", "required: sequences per micro-batch")
    tr["micro_batch_size"] = _int(args, "micro-batch-size")
    take("micro-batch-size", "training.micro_batch_size")
    if args.get("global-batch-size") is not None:
        tr["global_batch_size"] = _int(args, "global-batch-size")
        take("global-batch-size", "training.global_batch_size")
    # precision
    precision = str(args.get("precision") or "")  # NeMo: trainer.precision
    if precision:
        used.add("precision")
        if "bf16" in precision:
            args.setdefault("bf16", None)
        elif precision.startswith("16"):
            args.setdefault("fp16", None)
        else:
            used.discard("precision")
    if args.get("fp8-format") is not None or "fp8" in args:
        tr["dtype"] = "fp8"
        for a in ("fp8-format", "fp8"):
            if a in args:
                take(a, "training.dtype", "fp8")
    else:
        tr["dtype"] = "bf16"
        if "bf16" in args:
            take("bf16", "training.dtype", "bf16")
        if "fp16" in args:
            take("fp16", "training.dtype", "bf16")
            res.assumptions.append("--fp16 simulated as bf16: the same tensor-core peak and activation bytes")
    # recomputation
    gran = args.get("recompute-granularity")
    if "recompute-activations" in args:
        tr["recompute"] = "selective"
        take("recompute-activations", "training.recompute", "selective")
    elif gran is not None:
        if gran not in ("full", "selective"):
            raise ScenarioError("--recompute-granularity", f"full or selective, got {gran!r}")
        tr["recompute"] = gran
        take("recompute-granularity", "training.recompute", gran)
    elif args.get("recompute-method") is not None or "checkpoint-activations" in args:
        tr["recompute"] = "full"
        res.assumptions.append(
            "training.recompute = full: a --recompute-method without --recompute-granularity "
            "(or the older --checkpoint-activations) recomputes whole layers"
        )
    else:
        tr["recompute"] = "none"
    for a in ("recompute-method", "checkpoint-activations"):
        if a in args:
            take(a, "training.recompute", tr["recompute"])
    if args.get("recompute-num-layers") is not None:
        n = _int(args, "recompute-num-layers")
        per_stage = layers // (par["pp"] * vpp)
        method = args.get("recompute-method") or "uniform"
        if tr["recompute"] == "full" and (method == "uniform" and n == 1 or method == "block" and n >= per_stage):
            take("recompute-num-layers", "training.recompute", "full")
        else:
            used.add("recompute-num-layers")
            res.unmapped.append(
                f"--recompute-num-layers {n} (with --recompute-method {method}: stepsim recomputes all "
                f"layers or none; simulated as recompute {tr['recompute']})"
            )
    # gradient-reduction overlap
    ddp = args.get("DDP-impl")
    if "overlap-grad-reduce" in args:
        tr["overlap_grad_reduce"] = True
        take("overlap-grad-reduce", "training.overlap_grad_reduce", True)
    elif ddp is not None:
        tr["overlap_grad_reduce"] = ddp == "torch"
        take("DDP-impl", "training.overlap_grad_reduce", ddp == "torch")
        res.assumptions.append(
            "--DDP-impl torch overlaps bucketed all-reduces with the backward pass (PyTorch DDP); "
            "local reduces after it"
        )
    else:
        tr["overlap_grad_reduce"] = False
        res.assumptions.append("training.overlap_grad_reduce = false: Megatron's default (no --overlap-grad-reduce)")
    # attention kernel
    backend = args.get("attention-backend")
    if "use-flash-attn" in args:
        tr["flash_attention"] = True
        take("use-flash-attn", "training.flash_attention", True)
    elif backend is not None:
        tr["flash_attention"] = backend in ("flash", "fused", "auto")
        take("attention-backend", "training.flash_attention", tr["flash_attention"])
    elif args.get("transformer-impl") is not None:
        tr["flash_attention"] = args["transformer-impl"] == "transformer_engine"
        take("transformer-impl", "training.flash_attention", tr["flash_attention"])
    else:
        tr["flash_attention"] = True
        res.assumptions.append(
            "training.flash_attention = true: the arguments do not name the attention kernel; "
            "current Megatron-LM fuses attention (Transformer Engine); Megatron-LM before 2023 "
            "materialised the scores: set training.flash_attention: false for those runs"
        )
    # devices
    n_dev = devices
    if n_dev is None:
        nodes = _int(args, "nnodes") if args.get("nnodes") is not None else _int(args, "num-nodes")
        per = _int(args, "nproc-per-node") if args.get("nproc-per-node") is not None else _int(args, "devices")
        if args.get("num-gpus") is not None:
            n_dev = _int(args, "num-gpus")
            take("num-gpus", "cluster.devices")
        elif nodes is not None and per is not None:
            n_dev = nodes * per
            for a in ("nnodes", "nproc-per-node", "num-nodes", "devices"):
                if a in args:
                    take(a, "cluster.devices", n_dev)
        elif dp is not None:
            n_dev = tp * par["pp"] * par["cp"] * dp
            res.assumptions.append(f"cluster.devices = {n_dev}: tp x pp x cp x dp")
        else:
            raise ScenarioError(
                "--devices",
                "the arguments do not say how many GPUs ran: give --devices N (or "
                "--data-parallel-size, or the torchrun line's --nnodes/--nproc-per-node)",
            )
    else:
        used.update(a for a in ("nnodes", "nproc-per-node", "num-nodes", "devices", "num-gpus") if a in args)
    res.scenario = {
        "name": name,
        "model": model,
        "cluster": {"preset": cluster, "devices": int(n_dev)},
        "parallel": par,
        "schedule": "interleaved-1f1b" if vpp > 1 else "1f1b",
        "training": tr,
    }
    for a, v in args.items():
        if a in used:
            continue
        shown = f"--{a}" + ("" if v is None else f" {v}")
        if a in NO_STEP_EFFECT:
            res.ignored.append(shown)
        else:
            res.unmapped.append(shown)
    return res


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


def cmd_import(args) -> int:
    from simulator.fileio import read_text
    from simulator.scenario.loading import load_scenario

    path = Path(args.args_file)
    text = read_text(path, 1 << 20, what="argument file")
    name = args.name or path.stem
    res = import_megatron(text, args.cluster, devices=args.devices, name=name)
    load_scenario(res.scenario)  # refuse what would not run, naming the key
    out = to_yaml(res, str(path))
    if args.out:
        Path(args.out).write_text(out)
        print(
            f"wrote {args.out}: {len(res.mapped)} arguments mapped, {len(res.unmapped)} not mapped, "
            f"{len(res.ignored)} ignored (no effect on a step)"
        )
    else:
        sys.stdout.write(out)
    stream = sys.stdout if args.out else sys.stderr
    if res.unmapped:
        print("not mapped (check by hand): " + "; ".join(res.unmapped), file=stream)
    return 0


def register(subparsers) -> None:
    """Add ``import`` to the ``stepsim`` parser."""
    p = subparsers.add_parser(
        "import", help="write a scenario from another tool's configuration (Megatron-LM / NeMo arguments)"
    )
    p.add_argument(
        "source", choices=["megatron"], help="what the file is: megatron (a Megatron-LM or NeMo argument list)"
    )
    p.add_argument("args_file", metavar="ARGS_FILE", help="file holding the argument list (newlines and \\ allowed)")
    p.add_argument(
        "--cluster",
        required=True,
        help="cluster preset (stepsim presets): Megatron's arguments do not name the hardware",
    )
    p.add_argument(
        "--devices",
        type=int,
        help="GPUs (default: from the torchrun line, --num-gpus, or tp*pp*cp*dp with --data-parallel-size)",
    )
    p.add_argument("--name", help="scenario name (default: the file's name)")
    p.add_argument("--out", help="scenario YAML to write (default: print it)")
    p.set_defaults(func=cmd_import)
