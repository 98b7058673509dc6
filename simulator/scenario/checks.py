"""Checks that span a scenario's sections, run once its specs are resolved.

Each refuses, as a :class:`~simulator.scenario.schema.ScenarioError` naming the key at
fault, what no single section can see is wrong: a step too large to simulate
(:func:`check_size`), MoE settings on a dense model, MoE without sequence parallelism under
TP, unknown collective algorithms and perturbations naming devices the cluster lacks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from simulator.scenario.schema import NetCalIn, PerturbationIn, ScenarioError, ScenarioIn
from workloads.layout import ParallelLayout
from workloads.model import ModelSpec
from workloads.pipeline import get_schedule
from workloads.training import TrainingSpec

MAX_DEVICES = 262_144
# The simulation's size, estimated before anything is built (workloads.trace.builder.estimated_ops,
# an upper estimate: ~12 ops per layer pass per simulated rank). Measured on 2026-12-01:
# Llama-3-8B widened to 1,000 layers on 8 H100 (112,033 ops, 192,384 estimated) peaked
# 163 MB above the interpreter (~850 B per estimated op) and took 12.9 s. The largest
# built-in case (DeepSeek-V3 on 2,048 H800) estimates 443,520 ops; the largest validation
# case (Narayanan et al. 2021, 1008B on 3,072 A100: pp 64, 512 micro-batches, interleaved,
# full recompute) 4,718,592. The limit admits it with ~25% room (~6 GB at the measured rate).
MAX_ESTIMATED_OPS = 6_000_000
BYTES_PER_ESTIMATED_OP = 1_000
# An expert all-to-all among ep ranks is ep * (ep - 1) flows, all of them loaded even in
# representative mode. Measured on 2026-12-06 (2-layer MoE, ep = devices on H100, one step):
# ep 4,096 peaked at 0.84 GB in 4.0 s, 8,192 at 3.0 GB in 16 s, 16,384 at 11.5 GB in 71 s
# (65,536 would need ~180 GB). Published expert parallelism stays in the hundreds.
MAX_EP = 4_096
# Ring context parallelism simulated rank by rank (--exact, or per-device perturbations): cp
# 1,024 peaked at 1.45 GB in 4.4 s; cp 4,096 passed 11.7 GB (2-layer model on H100, 2026-12-06).
# Representative mode runs cp 4,096 in 1.2 s.
MAX_EXACT_CP = 1_024
# Devices on a torus (TPU slices, all pods together): its topology and collective plans grow
# faster than a switched network's. A 2-layer model on TPU v5p chips, 2026-12-06: one
# 64 x 32 x 32 torus 2.1 GB / 48 s, 64 x 64 x 64 (262,144) 11.1 GB / 296 s; 16 pods of
# 16 x 16 x 16 4.8 GB / 54 s. (A switched network of 262,144 devices: 3.9 GB / 18 s.) The
# largest published TPU job, 50,944 v5e chips in 199 slices (Google Cloud, 2023), fits.
MAX_TORUS_DEVICES = 65_536
# The step's model FLOPs at every device's dense BF16 peak: above this many seconds of ideal
# compute (11.6 days) per step the scenario is refused before anything is built. Real steps
# take seconds (Llama 3 405B on 16,384 H100: 2.5 s ideal); one H100 running a 70B model on a
# million tokens: 440 s.
MAX_IDEAL_COMPUTE_S = 1e6
# A simulated step longer than this (116 days) comes from inputs outside any physical range
# and is refused rather than reported (simulator.simulate, check_step_time).
MAX_STEP_TIME_S = 1e7


def check_size(
    model: ModelSpec, layout: ParallelLayout, training: TrainingSpec, schedule: str, ranks: int | None = None
) -> None:
    """Refuse a step too large to simulate before building it: the estimated op count
    (layers x micro-batches x passes over ``ranks`` simulated ranks, default one per
    pipeline stage) above :data:`MAX_ESTIMATED_OPS`, quoting the estimate and the field."""
    from workloads.trace.builder import estimated_ops
    from workloads.trace.shared import Workload

    if layout.ep > MAX_EP:
        raise ScenarioError(
            f"{layout.ep:,} ranks in one expert all-to-all ({layout.ep:,} x {layout.ep - 1:,} flows) is more than "
            f"stepsim simulates; the limit is {MAX_EP:,}",
            field="parallel.ep",
        )
    if ranks is not None and ranks > layout.pp and layout.cp > MAX_EXACT_CP:
        raise ScenarioError(
            f"context parallelism of {layout.cp:,} simulated rank by rank (--exact or per-device perturbations) "
            f"is more than stepsim simulates; the limit is {MAX_EXACT_CP:,}: drop --exact and perturbations",
            field="parallel.cp",
        )
    n_ranks = layout.pp if ranks is None else ranks
    try:
        m = training.micro_batches(layout.dp)
        try:
            n = estimated_ops(Workload(model, layout, training, schedule), n_ranks)
        except OverflowError:  # layers beyond any float (10**400)
            n = math.inf
    except ValueError:
        return  # an invalid layout or schedule: building reports it, naming the field
    if n <= MAX_ESTIMATED_OPS:
        return
    field = "model.layers" if model.layers >= m else "training.global_batch_size"
    raise ScenarioError(
        f"the step would need about {n:,.0f} operations (~{n * BYTES_PER_ESTIMATED_OP / 1e9:.1f} GB): "
        f"{model.layers:,} layers x {m:,} micro-batches x {n_ranks:,} simulated ranks; the limit "
        f"is {MAX_ESTIMATED_OPS:,} (~{MAX_ESTIMATED_OPS * BYTES_PER_ESTIMATED_OP / 1e9:.0f} GB): "
        "use fewer layers, fewer micro-batches (a larger micro_batch_size) or, with --exact, "
        "fewer devices",
        field=field,
    )


def check_work(model: ModelSpec, training: TrainingSpec, devices: int, peak_flops_per_s: float) -> None:
    """Refuse a step whose model FLOPs would take more than :data:`MAX_IDEAL_COMPUTE_S` on
    ``devices`` chips at their dense BF16 peak, before anything is built (call after
    :func:`check_size`, which bounds the layers)."""
    from workloads.counts import model_flops_per_step

    ideal_s = model_flops_per_step(model, training) / (devices * peak_flops_per_s)
    if ideal_s > MAX_IDEAL_COMPUTE_S:
        raise ScenarioError(
            f"the step's {model_flops_per_step(model, training):.3g} model FLOPs would take {ideal_s:.3g} s at the "
            f"peak of {devices:,} devices; the limit is {MAX_IDEAL_COMPUTE_S:g} s: use fewer tokens per step "
            "(global_batch_size x seq_len), a smaller model or more devices",
            field="training.global_batch_size",
        )


def check_context_parallel(layout: ParallelLayout, training: TrainingSpec) -> None:
    """Load-balanced causal context parallelism cuts each sequence into ``2 * cp`` chunks
    (rank ``r`` holds chunks ``r`` and ``2cp - 1 - r``, as Megatron-Core and Transformer
    Engine do): ``seq_len`` must be a multiple of ``2 * cp``."""
    if layout.cp > 1 and training.seq_len % (2 * layout.cp):
        raise ScenarioError(
            f"must be a multiple of 2 * parallel.cp = {2 * layout.cp} (context parallelism cuts each sequence "
            f"into 2 * cp chunks), got {training.seq_len:,}",
            field="training.seq_len",
        )


def check_step_time(step_time_s: float) -> None:
    """A simulated step that is not finite or longer than :data:`MAX_STEP_TIME_S` is refused:
    bounded inputs do not produce one, so it is reported rather than summarised."""
    if not (0 <= step_time_s <= MAX_STEP_TIME_S):
        raise ScenarioError(
            f"the simulated step takes {step_time_s:.3g} s, outside 0..{MAX_STEP_TIME_S:g} s: the scenario's "
            "bandwidths, efficiencies or perturbations are outside any physical range",
            field="step_time_s",
        )


def check_algorithms(algorithms: Mapping[str, str]) -> None:
    from simulator.network.collectives import VALID_ALGORITHMS

    for op, alg in algorithms.items():
        if alg not in VALID_ALGORITHMS[op]:
            raise ScenarioError(
                f"unknown algorithm {alg!r} for {op}; allowed: {', '.join(VALID_ALGORITHMS[op])}",
                field=f"algorithms.{op}",
            )


def check_moe_layout(model: ModelSpec, layout: ParallelLayout) -> None:
    """MoE layers under tensor parallelism route the sequence-parallel shard of the tokens
    (Megatron-Core requires --sequence-parallel with MoE and tp > 1), refused at load rather
    than when the first MoE layer is counted."""
    has_moe_layer = model.moe is not None and model.moe.dense_layers < model.layers  # layer dense_layers is MoE
    if has_moe_layer and layout.tp > 1 and not layout.sequence_parallel:
        raise ScenarioError(
            "MoE layers with tp > 1 need sequence parallelism "
            "(Megatron-Core routes the sequence-parallel shard of "
            "tokens); set it to true or use tp: 1",
            field="parallel.sequence_parallel",
        )


def check_ep_overlap(model: ModelSpec, layout: ParallelLayout, training: TrainingSpec, schedule: str) -> None:
    """``training.overlap_moe_expert_parallel_comm`` where Megatron-Core runs it
    (``megatron/core/transformer/transformer_config.py`` ``__post_init__`` at d98e8a64): expert
    parallelism, no pipeline or an interleaved one, no full recomputation, shared experts not
    overlapped with the dispatch (``moe_shared_expert_overlap``); and where stepsim can pair the
    passes: not under DualPipe (which pairs its own) or a batch-global auxiliary loss (every
    forward first)."""
    if not training.overlap_moe_expert_parallel_comm:
        return
    field = "training.overlap_moe_expert_parallel_comm"
    if model.moe is None or layout.ep < 2:
        raise ScenarioError(
            "needs a MoE model and parallel.ep > 1 (Megatron-Core asserts expert parallelism)", field=field
        )
    if layout.pp > 1 and not get_schedule(schedule).virtual_stages:
        raise ScenarioError(
            f"needs parallel.pp: 1 or schedule: interleaved-1f1b (Megatron-Core's combined 1F1B runs without a "
            f"pipeline or with virtual stages), got pp {layout.pp} with {schedule}",
            field=field,
        )
    if training.recompute == "full":
        raise ScenarioError("cannot run with training.recompute: full (Megatron-Core asserts it)", field=field)
    if training.moe_shared_expert_overlap:
        raise ScenarioError(
            "cannot run with training.moe_shared_expert_overlap (Megatron-Core asserts it)", field=field
        )
    if training.balance == "aux-loss-global":
        raise ScenarioError(
            "cannot pair passes under balance: aux-loss-global (every forward runs before any backward)", field=field
        )


def check_allgather_dispatcher(training: TrainingSpec, expert_load, schedule: str) -> None:
    """``training.moe_token_dispatcher: allgather`` with the options Megatron-Core's allgather
    dispatcher runs with (``megatron/core/transformer/transformer_config.py`` ``__post_init__``
    and ``moe/token_dispatcher.py`` ``MoEAllGatherTokenDispatcher`` at NVIDIA/Megatron-LM
    d98e8a64): no shared-expert or batch-level all-to-all overlap (both assert alltoall or flex),
    no padding to capacity (only the alltoall dispatcher permutes with ``drop_and_pad``), a
    blocking read of the token counts every MoE layer (``tokens_per_expert ... .cpu()``), BF16
    hidden states on the wire; not under a schedule whose paired passes overlap all-to-alls
    (DualPipe)."""
    if training.moe_token_dispatcher != "allgather":
        return
    field = "training.moe_token_dispatcher"
    refused = (
        (
            training.moe_shared_expert_overlap,
            "training.moe_shared_expert_overlap: true (Megatron-Core asserts alltoall or flex)",
        ),
        (
            training.overlap_moe_expert_parallel_comm,
            "training.overlap_moe_expert_parallel_comm: true (Megatron-Core asserts alltoall or flex)",
        ),
        (
            expert_load is not None and bool(expert_load.pad_to_capacity),
            "training.expert_load.pad_to_capacity: true (only the alltoall dispatcher pads)",
        ),
        (
            not training.moe_host_sync,
            "training.moe_host_sync: false (it reads the token counts on the host every layer)",
        ),
        (training.moe_dispatch_dtype == "fp8", "training.moe_dispatch_dtype: fp8 (it gathers the BF16 hidden states)"),
        (
            get_schedule(schedule).overlapped_pairs,
            f"schedule: {schedule} (its paired passes overlap expert all-to-alls)",
        ),
    )
    for bad, what in refused:
        if bad:
            raise ScenarioError(f"allgather cannot run with {what}", field=field)


def check_torus_size(devices: int, torus: bool) -> None:
    """A torus cluster of more than :data:`MAX_TORUS_DEVICES` is refused before it is built."""
    if torus and devices > MAX_TORUS_DEVICES:
        raise ScenarioError(
            f"at most {MAX_TORUS_DEVICES:,} devices on a torus (all pods together), got {devices:,}: its "
            "topology would take several GB to build (262,144 on one torus: 11 GB, 5 minutes)",
            field="cluster.devices",
        )


def check_cuda_graphs(training: TrainingSpec, chip_family: str) -> None:
    """CUDA graphs are an NVIDIA GPU feature: ``training.cuda_graphs`` on a TPU (XLA compiles the
    step itself) is refused rather than simulated as fewer launches."""
    if training.cuda_graphs != "none" and chip_family == "tpu":
        raise ScenarioError(
            f"CUDA graphs run on NVIDIA GPUs, not on a TPU: use none (got {training.cuda_graphs!r})",
            field="training.cuda_graphs",
        )


def check_fp8_recipe(training: TrainingSpec, chip_family: str) -> None:
    """MXFP8's block scales need Blackwell's tensor cores (Megatron-Core: "'mxfp8' for Blackwell
    architecture only", transformer_config.py at d98e8a64): refused on other chips in FP8 training."""
    if training.dtype == "fp8" and training.fp8_recipe == "mxfp8" and chip_family != "blackwell":
        raise ScenarioError(
            f"mxfp8 runs on Blackwell GPUs only; this cluster's chips are {chip_family or 'unknown'}: "
            "use delayed, tensorwise or blockwise",
            field="training.fp8_recipe",
        )


def check_fused_grouped_mlp(model: ModelSpec, layout: ParallelLayout, training: TrainingSpec, chip_family: str) -> None:
    """``training.moe_expert_gemm: fused-mlp`` is Transformer Engine's fused grouped MLP, which runs
    where TE and Megatron-Core run it (``workloads.quantization.fuse_grouped_mlp``): on Blackwell
    (``ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8.is_supported``: compute capability 10), in MXFP8
    (the block-scaled op; NVFP4 is not modelled), over a SwiGLU expert FFN whose widths are multiples
    of 256 (``fuse_forward_ops`` in transformer_engine/pytorch/ops/fused/forward_grouped_mlp.py at
    NVIDIA/TransformerEngine fb28b6e0), with the routing weight applied in the activation and no
    expert tensor parallelism (``TEGroupedMLP
    ._is_fused_impl_supported`` at NVIDIA/Megatron-LM d98e8a64: no TP group, no
    ``moe_apply_probs_on_input``); its activation is inside FC1's kernel, so there is no
    ``moe_act`` to recompute. Anything else is refused, naming what to change."""
    if training.moe_expert_gemm != "fused-mlp":
        return
    field = "training.moe_expert_gemm"
    needs = [
        (model.moe is not None, f"the model {model.name!r} is dense (no model.moe): use grouped"),
        (chip_family == "blackwell", f"it runs on Blackwell GPUs only; this cluster's chips are {chip_family}"),
        (
            training.dtype == "fp8" and training.fp8_recipe == "mxfp8",
            f"it runs in MXFP8 only (training.dtype fp8, fp8_recipe mxfp8); got {training.dtype}"
            + (f" / {training.fp8_recipe}" if training.dtype == "fp8" else ""),
        ),
        (model.ffn == "swiglu", f"it fuses a SwiGLU; the model's FFN is {model.ffn}"),
        (
            model.moe is None or (model.hidden % 256 == 0 and model.moe.expert_ffn_hidden % 256 == 0),
            "it needs the hidden size and the expert FFN width in multiples of 256; got "
            f"{model.hidden} and {model.moe.expert_ffn_hidden if model.moe else 0}",
        ),
        (layout.etp == 1, f"it runs without expert tensor parallelism; got parallel.etp {layout.etp}"),
        (
            training.moe_gate_weighting == "activation",
            "it applies the routing weight in the activation; got training.moe_gate_weighting "
            f"{training.moe_gate_weighting}",
        ),
        (
            "moe_act" not in (training.recompute_modules or ()),
            "its activation runs inside the up projection's kernel, so there is no moe_act to recompute: "
            "leave moe_act out of training.recompute_modules",
        ),
    ]
    for ok, why in needs:
        if not ok:
            raise ScenarioError(
                f"fused-mlp (Transformer Engine's fused grouped MLP): {why}; or use grouped", field=field
            )


def check_dense(model: ModelSpec, sc: ScenarioIn) -> None:
    """MoE-only settings on a dense model are refused rather than silently ignored."""
    if model.moe is not None:
        return
    dense = f"the model {model.name!r} is dense (no model.moe)"
    if sc.parallel.ep > 1:
        raise ScenarioError(f"expert parallelism needs a MoE model; {dense}: use ep: 1", field="parallel.ep")
    if sc.parallel.etp > 1:
        raise ScenarioError(f"expert tensor parallelism needs a MoE model; {dense}: use etp: 1", field="parallel.etp")
    if sc.training.balance != "aux-free":  # the default, which resolved scenarios spell out
        raise ScenarioError(
            f"load balancing applies to MoE models only; {dense}: leave it out (got {sc.training.balance!r})",
            field="training.balance",
        )
    if sc.training.expert_load is not None:
        raise ScenarioError(f"applies to MoE models only; {dense}: leave it out", field="training.expert_load")
    if sc.training.moe_gate_weighting != "activation":  # the default
        raise ScenarioError(f"applies to MoE models only; {dense}: leave it out", field="training.moe_gate_weighting")
    for key, default in (
        ("moe_router_dtype", "bf16"),
        ("moe_dispatch_dtype", "auto"),
        ("moe_token_dispatcher", "auto"),
        ("moe_host_sync", True),
        ("moe_shared_expert_overlap", False),
        ("moe_router_fusion", True),
        ("moe_permute_fusion", True),
    ):
        if getattr(sc.training, key) != default:
            raise ScenarioError(
                f"applies to MoE models only; {dense}: leave it out (got {getattr(sc.training, key)!r})",
                field=f"training.{key}",
            )
    if "moe_act" in (sc.training.recompute_modules or ()):
        raise ScenarioError(f"moe_act applies to MoE models only; {dense}", field="training.recompute_modules")


def check_perturbations(perturbations: Sequence[PerturbationIn], devices: int) -> None:
    """Each perturbation names what it slows (devices with a compute scale, or a link with a
    bandwidth scale or ``failed``), on devices the cluster has, each device at most once."""
    scaled: dict[int, int] = {}  # device -> the perturbation slowing it
    for i, p in enumerate(perturbations):
        if p.devices is None and p.link is None:
            raise ScenarioError(
                "needs 'devices' (with compute_scale) or 'link' (with bw_scale or failed: true)",
                field=f"perturbations[{i}]",
            )
        if p.devices is not None and not p.devices:
            raise ScenarioError(
                "an empty list slows nothing; name at least one device", field=f"perturbations[{i}].devices"
            )
        for d in p.devices or []:
            if not 0 <= d < devices:
                raise ScenarioError(f"device {d} outside 0..{devices - 1}", field=f"perturbations[{i}].devices")
            if d in scaled:  # a second scale would silently replace the first
                raise ScenarioError(
                    f"device {d} is already slowed by perturbations[{scaled[d]}]; give each device one compute_scale",
                    field=f"perturbations[{i}].devices",
                )
            scaled[d] = i
        if p.devices is not None and p.compute_scale is None:
            raise ScenarioError(
                "needed with 'devices' (e.g. 0.8 = 80% speed)", field=f"perturbations[{i}].compute_scale"
            )
        if p.link is not None and p.bw_scale is None and not p.failed:
            raise ScenarioError("a link perturbation needs bw_scale or failed: true", field=f"perturbations[{i}]")


def check_network_algorithms(cal: NetCalIn) -> None:
    """``network_calibration.algorithm_efficiency`` names known collective algorithms."""
    for alg in cal.algorithm_efficiency:
        from simulator.network.collectives import ALGORITHMS

        if alg not in ALGORITHMS:
            raise ScenarioError(
                f"unknown algorithm; allowed: {', '.join(ALGORITHMS)}",
                field=f"network_calibration.algorithm_efficiency.{alg}",
            )
