"""The MoE side of a Megatron-LM import (:mod:`simulator.interop.megatron`): which token
dispatcher runs (``--moe-token-dispatcher-type``, ``--moe-flex-dispatcher-backend``) and how the
routed experts' GEMMs are launched (``--moe-grouped-gemm``, ``--moe-use-grouped-tensor``;
Transformer Engine's ``NVTE_USE_CUTLASS_GROUPED_GEMM``), and whether the router and the
permutations run fused (``--moe-router-fusion``, ``--moe-permute-fusion``). Each function takes the import under way ``r`` (its
``args``, ``take``, ``assume`` and ``used``) and returns the training keys it sets.

Read from NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553
(``megatron/core/transformer/transformer_config.py``, ``megatron/core/models/backends.py``,
``megatron/core/extensions/transformer_engine_spec_provider.py``) and NVIDIA/TransformerEngine
at d0067d0da6cb01811b8072a7d304f0e00344ce2b (``transformer_engine/common/gemm/cublaslt_gemm.cu``).
"""

from __future__ import annotations

from simulator.interop.megatron_memory import dense_only
from simulator.scenario.errors import ScenarioError

#: Transformer Engine's switch to its CUTLASS grouped GEMM (``nvte_multi_tensor_gemm``: on
#: Hopper, BF16/FP16 operands, no fused bias, a uniform K divisible by 128), read from a
#: ``NAME=1`` word of the launch line.
CUTLASS_ENV = "NVTE-USE-CUTLASS-GROUPED-GEMM"
#: Transformer Engine's switch to its CuTe DSL fused grouped MLP (``fused-mlp``): the operation
#: fuser fuses MXFP8 GroupedLinear + ScaledSwiGLU + GroupedLinear with the GLU interleaved in
#: blocks of 32 (``fuse_forward_ops``, transformer_engine/pytorch/ops/fused/forward_grouped_mlp.py
#: at NVIDIA/TransformerEngine fb28b6e0); Megatron-Bridge's MXFP8 MoE recipes set both.
CUTEDSL_ENV = "NVTE-CUTEDSL-FUSED-GROUPED-MLP"
GLU_INTERLEAVE = "moe-mlp-glu-interleave-size"


def dispatcher(r, moe: bool) -> dict:
    """``--moe-token-dispatcher-type`` -> ``training.moe_token_dispatcher``: ``allgather``
    (Megatron-Core's default, also without the flag: every rank gathers its expert-TP x EP
    group's tokens), ``alltoall`` (one copy of a token per routed expert across the nodes)
    and ``flex`` with the ``deepep`` or ``hybridep`` backend (one copy per destination node,
    forwarded over NVLink). The flex ``ncclep`` backend has no model of its own and stays in
    the not-mapped list (transformer_config.py at NVIDIA/Megatron-LM d98e8a64:
    ``moe_token_dispatcher_type`` allgather, ``moe_flex_dispatcher_backend`` deepep)."""
    args = r.args
    kind = args.get("moe-token-dispatcher-type")
    if not moe:
        dense_only(r, ("moe-token-dispatcher-type", "moe-flex-dispatcher-backend"))
        return {}
    if kind is None:
        r.assume(
            "no --moe-token-dispatcher-type: Megatron-Core's default, the allgather dispatcher "
            "(training.moe_token_dispatcher: allgather)"
        )
        return {"moe_token_dispatcher": "allgather"}
    if kind in ("alltoall", "allgather"):
        r.take("moe-token-dispatcher-type", "training.moe_token_dispatcher", kind)
        return {"moe_token_dispatcher": kind}
    if kind == "flex":
        backend = args.get("moe-flex-dispatcher-backend") or "deepep"  # Megatron-Core's default backend
        if backend in ("deepep", "hybridep"):
            r.take("moe-token-dispatcher-type", "training.moe_token_dispatcher", "flex")
            if "moe-flex-dispatcher-backend" in args:
                r.take("moe-flex-dispatcher-backend", "training.moe_token_dispatcher", "flex")
            return {"moe_token_dispatcher": "flex"}
    return {}


def expert_gemm(r, moe: bool) -> dict:
    """How the routed experts' GEMMs are launched (``training.moe_expert_gemm``). Megatron-Core
    runs one GEMM per local expert unless told otherwise: ``--moe-grouped-gemm`` with Transformer
    Engine builds TEGroupedMLP, whose GroupedLinear calls ``nvte_multi_tensor_gemm`` -> one cuBLAS
    GEMM per expert over 4 compute streams; without it (or with the local spec) SequentialMLP
    loops over the experts. One grouped kernel (``grouped``) takes ``--moe-use-grouped-tensor``
    or the TE operation fuser (``--use-transformer-engine-op-fuser``, which turns it on:
    Transformer Engine's native GroupedTensor GEMM), or ``NVTE_USE_CUTLASS_GROUPED_GEMM=1`` on
    the launch line (TE's CUTLASS grouped GEMM, Hopper). The operation fuser with
    ``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1``, ``--moe-mlp-glu-interleave-size 32`` and
    ``--fp8-recipe mxfp8`` is TE's fused grouped MLP (``fused-mlp``; without any of them TE runs
    the three ops unfused)."""
    names = ("moe-grouped-gemm", "moe-use-grouped-tensor")
    if not moe:
        dense_only(r, names)
        return {}
    args = r.args
    switches = [a for a in ("moe-use-grouped-tensor", "use-transformer-engine-op-fuser") if a in args]
    if str(args.get(CUTLASS_ENV, "0")) == "1":
        switches.append(CUTLASS_ENV)
    gemm = "grouped" if switches and "moe-grouped-gemm" in args else "per-expert"
    fused = (
        gemm == "grouped"
        and "use-transformer-engine-op-fuser" in args
        and str(args.get(CUTEDSL_ENV, "0")) == "1"
        and str(args.get(GLU_INTERLEAVE, "")) == "32"
        and str(args.get("fp8-recipe", "")) == "mxfp8"
    )
    gemm = "fused-mlp" if fused else gemm
    switches += [a for a in (CUTEDSL_ENV, GLU_INTERLEAVE) if a in args]
    for a in ("moe-grouped-gemm", *switches):
        if a in args:
            r.take(a, "training.moe_expert_gemm", gemm)
    if gemm == "per-expert":
        r.assume(
            "training.moe_expert_gemm = per-expert: Megatron-Core runs one GEMM per local expert "
            "(TEGroupedMLP's cuBLAS path, or SequentialMLP), each a kernel launch"
        )
    return {"moe_expert_gemm": gemm}


#: Megatron's fusion switches and the training keys they set (both off by default in
#: transformer_config.py: ``moe_router_fusion``, ``moe_permute_fusion``).
FUSIONS = {"moe-router-fusion": "moe_router_fusion", "moe-permute-fusion": "moe_permute_fusion"}


def fusion(r, moe: bool) -> dict:
    """``--moe-router-fusion`` / ``--moe-permute-fusion`` -> ``training.moe_router_fusion`` /
    ``training.moe_permute_fusion``. Megatron-Core's default, without the flag, is the unfused
    chain of PyTorch ops (workloads.moe_unfused), so an absent flag sets False."""
    if not moe:
        dense_only(r, tuple(FUSIONS))
        return {}
    out = {}
    for a, key in FUSIONS.items():
        if a in r.args:
            r.take(a, f"training.{key}", True)
            out[key] = True
        else:
            r.assume(f"no --{a}: Megatron-Core's unfused ops (training.{key}: false)")
            out[key] = False
    return out


#: Megatron's load-balancing types that are an auxiliary loss computed per micro-batch (over the
#: TP x CP group, per sequence, or over TP x DP x CP: ``router.py`` at d98e8a64), stepsim's
#: ``aux-loss-local``; none makes every forward wait for the last one (``aux-loss-global``).
AUX_LOSS_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss")
BALANCE_ARGS = ("moe-router-enable-expert-bias", "moe-aux-loss-coeff", "moe-router-load-balancing-type")


def balance(r, moe: bool) -> dict:
    """``training.balance`` from ``--moe-router-enable-expert-bias`` (aux-loss-free balancing:
    ``aux-free``), else ``--moe-aux-loss-coeff`` above 0 with ``--moe-router-load-balancing-type``
    one of :data:`AUX_LOSS_TYPES` (Megatron's default ``aux_loss``): ``aux-loss-local``. Both
    flags take several values (one per type); a coefficient of 0 everywhere is no loss. Sinkhorn
    and quantile balancing have no model and stay in the not-mapped list."""
    if not moe:
        dense_only(r, BALANCE_ARGS)
        return {}
    args = r.args
    types = str(args.get("moe-router-load-balancing-type") or "aux_loss").split()
    coeffs = str(args.get("moe-aux-loss-coeff") or "0").split()
    try:
        loss = any(float(c) > 0 for c in coeffs)
    except ValueError:
        raise ScenarioError(
            f"expected numbers, got {args['moe-aux-loss-coeff']!r}", field="--moe-aux-loss-coeff"
        ) from None
    if "moe-router-enable-expert-bias" in args:
        r.take("moe-router-enable-expert-bias", "training.balance", "aux-free")
        if loss:
            r.assume("an auxiliary loss beside the expert bias (--moe-aux-loss-coeff): its kernels are not modelled")
        return {"balance": "aux-free"}
    if not set(types) <= {*AUX_LOSS_TYPES, "none"}:
        return {}
    if loss and set(types) & set(AUX_LOSS_TYPES):
        r.take("moe-aux-loss-coeff", "training.balance", "aux-loss-local")
        if "moe-router-load-balancing-type" in args:
            r.take("moe-router-load-balancing-type", "training.balance", "aux-loss-local")
        return {"balance": "aux-loss-local"}
    r.assume(
        "no auxiliary loss and no expert bias (--moe-aux-loss-coeff 0, Megatron's default): "
        "training.balance = aux-free, whose statistics kernel reads the routing map once"
    )
    return {"balance": "aux-free"}
