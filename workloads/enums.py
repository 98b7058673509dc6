"""The named choices of a scenario and a trace, each defined once: a ``Literal`` type (for
the schema and type checkers) and the tuple of its values (for checks, messages and the
command line's choices), in the order messages list them.

Every module that checks or offers one of these imports it from here: the scenario
schema (``simulator.scenario.schema``), the trace and its file formats, the collective planner
(``simulator.network.collectives``), the layout search and the command line.
"""

from __future__ import annotations

from typing import Literal, get_args

#: Collective operations the network model plans (``stepsim collective OP``).
CollectiveOp = Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast", "send-recv"]
COLLECTIVE_OPS: tuple[str, ...] = get_args(CollectiveOp)

#: Collectives a trace holds as ``collective`` ops, whose algorithm a scenario may choose
#: (its ``algorithms:`` keys); a point-to-point ``send-recv`` is a trace's ``send`` op.
TraceCollectiveOp = Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast"]
TRACE_COLLECTIVE_OPS: tuple[str, ...] = get_args(TraceCollectiveOp)

#: Activation recomputation (``training.recompute``): nothing, the attention core
#: (Korthikanti et al. 2022's selective recompute) or whole layers.
Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[str, ...] = get_args(Recompute)

#: MoE load balancing (``training.balance``): DeepSeek-V3's auxiliary-loss-free bias, or an
#: auxiliary loss over each micro-batch's or the global batch's tokens.
Balance = Literal["aux-free", "aux-loss-local", "aux-loss-global"]
BALANCE_MODES: tuple[str, ...] = get_args(Balance)

#: Pipeline schedules (``schedule``; ``workloads.schedules`` builds them).
Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "dualpipe"]
SCHEDULES: tuple[str, ...] = get_args(Schedule)

#: How FP8 tensors are scaled (``training.fp8_recipe``; Megatron-Core's ``--fp8-recipe``
#: names, ``custom`` aside; ``workloads.quantization`` prices each).
FP8Recipe = Literal["delayed", "tensorwise", "blockwise", "mxfp8"]
FP8_RECIPES: tuple[str, ...] = get_args(FP8Recipe)

#: How the routed experts' GEMMs are launched (``training.moe_expert_gemm``): one grouped
#: kernel for all local experts (DeepGEMM, CUTLASS grouped GEMM, the ``grouped_gemm``
#: library), one GEMM per local expert (Transformer Engine's GroupedLinear on its default
#: cuBLAS path, Megatron-Core's SequentialMLP; ``workloads.moe_kernels``), or Transformer
#: Engine's fused grouped MLP, the activation and the quantisation between the two grouped
#: GEMMs in their epilogues (``fused-mlp``; ``workloads.quantization.fuse_grouped_mlp``).
MoEExpertGemm = Literal["grouped", "per-expert", "fused-mlp"]
MOE_EXPERT_GEMMS: tuple[str, ...] = get_args(MoEExpertGemm)

#: The MoE router's score function (``model.moe.score_function``; Megatron's
#: ``--moe-router-score-function``, the HF config's ``scoring_func``; ``workloads.moe_unfused``).
ScoreFunction = Literal["softmax", "sigmoid"]
SCORE_FUNCTIONS: tuple[str, ...] = get_args(ScoreFunction)

assert set(TRACE_COLLECTIVE_OPS) < set(COLLECTIVE_OPS)
