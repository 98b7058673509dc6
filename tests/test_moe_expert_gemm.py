"""``training.moe_expert_gemm``: the routed experts' GEMMs as one grouped kernel, or one GEMM per
local expert as Transformer Engine's GroupedLinear runs them on its default cuBLAS path.

``nvte_multi_tensor_gemm`` calls ``multi_stream_cublas_gemm`` unless
``NVTE_USE_CUTLASS_GROUPED_GEMM=1`` on Hopper (transformer_engine/common/gemm/cublaslt_gemm.cu at
NVIDIA/TransformerEngine d0067d0), which launches ``nvte_cublas_gemm_v2`` once per GEMM of the
group over 4 compute streams; Megatron-Core builds that module for ``--moe-grouped-gemm``
(TEGroupedMLP, megatron/core/extensions/transformer_engine_spec_provider.py at d98e8a64) and
loops over the experts otherwise (SequentialMLP). The math is the same; each extra launch costs
the host a launch and the GPU its per-kernel overhead. Evidence that the launches are there:
NVIDIA's Nsight capture of Qwen3-30B-A3B (docs/limits.md) counts 151 kernels a MoE layer and
micro-batch where one grouped kernel a GEMM gives 44; with 8 local experts the six expert GEMMs
become 48 launches, 42 more: 86 in all (``test_the_qwen3_30b_layer_launches_86_kernels``).
"""

from __future__ import annotations

import dataclasses

import pytest
from helpers import scenario
from test_host import H, _run
from test_moe import TINY_MOE, moe_scenario

from simulator import simulate
from simulator.engine.compute import calibration_for, kernel_time_s
from simulator.engine.host import launches_of
from simulator.interop.export_megatron import export_megatron
from simulator.interop.megatron import import_megatron
from simulator.scenario.loading import load_scenario
from workloads.enums import MOE_EXPERT_GEMMS
from workloads.kernels import Kernel, backward_kernels
from workloads.trace.io import TraceError, read_trace, trace_from_dict, trace_to_dict, write_trace
from workloads.trace.ops import Op

EP2 = {"tp": 1, "pp": 1, "dp": 16, "ep": 2}  # 16 experts over 2 ranks: 8 local experts
LOCAL = TINY_MOE["moe"]["experts"] // EP2["ep"]


def _sim(gemm: str, **training):
    return simulate(moe_scenario(parallel=EP2, training={"moe_expert_gemm": gemm, **training}))


@pytest.fixture(scope="module")
def runs():
    return {g: _sim(g) for g in ("grouped", "per-expert")}


def _expert_gemms(res) -> list[Kernel]:
    return [k for op in res.trace.ops if op.kind == "compute" for k in op.kernels if k.groups > 1]


def test_per_expert_gemms_launch_once_per_local_expert(runs):
    per = _expert_gemms(runs["per-expert"])
    assert per and {k.launches for k in per} == {LOCAL}
    assert {k.launches for k in _expert_gemms(runs["grouped"])} == {1}
    names = {k.name for k in per}
    assert names == {f"expert_{p}{s}" for p in ("up", "down") for s in ("", ".dgrad", ".wgrad")}
    # the same math: FLOPs and bytes of every kernel unchanged
    strip = [dataclasses.replace(k, launches=1) for k in per]
    assert strip[: len(_expert_gemms(runs["grouped"]))] == _expert_gemms(runs["grouped"])[: len(strip)]


def test_one_local_expert_is_one_launch():
    res = simulate(
        moe_scenario(parallel={"tp": 1, "pp": 1, "dp": 16, "ep": 16}, training={"moe_expert_gemm": "per-expert"})
    )
    assert {k.launches for k in res.trace.ops[0].kernels} <= {1}
    assert all(k.launches == 1 for op in res.trace.ops if op.kind == "compute" for k in op.kernels)


def test_each_launch_costs_the_gpu_its_kernel_overhead():
    sc = load_scenario(moe_scenario(parallel=EP2))
    chip = sc.cluster.chip
    cal = calibration_for(chip, {})
    k = Kernel("L1.expert_up", "gemm", 2 * 2048 * 1024 * 2048 * 8, 1e8, 2048, 2048, 1024, groups=8)
    many = dataclasses.replace(k, launches=8)
    assert kernel_time_s(many, chip, cal) - kernel_time_s(k, chip, cal) == pytest.approx(
        7 * cal.launch_overhead_s, rel=1e-12
    )
    assert all(b.launches == 8 for b in backward_kernels(many))


def test_summary_term_is_the_extra_launches_closed_form(runs):
    """Per MoE layer and micro-batch: two forward and four backward expert GEMMs, each with
    ``local - 1`` launches more, at the calibration's ``launch_overhead_s``."""
    sc = runs["per-expert"].scenario
    cal = calibration_for(sc.cluster.chip, {})
    terms = runs["per-expert"].summary["moe_terms_s"]
    assert terms["grouped_gemm_launches"] == pytest.approx(6 * (LOCAL - 1) * cal.launch_overhead_s, rel=1e-9)
    assert runs["grouped"].summary["moe_terms_s"]["grouped_gemm_launches"] == 0.0
    g = runs["grouped"].summary["moe_terms_s"]["grouped_gemm"]
    assert terms["grouped_gemm"] == pytest.approx(g + terms["grouped_gemm_launches"], rel=1e-9)
    assert runs["per-expert"].summary["step_time_s"] > runs["grouped"].summary["step_time_s"]


def test_host_issues_a_per_expert_gemm_launch_by_launch(base_run):
    """One op of one kernel run as 8 GEMMs, each shorter than a launch: the GPU waits for every
    launch, so the op ends at 8 h + d / 8 (its last GEMM runs after its launch); as one grouped
    kernel at h + d."""
    tiny = Kernel("expert_up", "gemm", 1e6, 1e3, 64, 64, 64, groups=8)
    per = dataclasses.replace(tiny, launches=8)
    op = Op(0, 0, "compute", "compute", "op0", "F", 0, 0, 0, kernels=(per,))
    assert launches_of(op) == 8
    raw, _, chip, cal = _run(base_run, [op])
    d = kernel_time_s(per, chip, cal)
    assert d / 8 < H
    assert raw.step_time_s == pytest.approx(8 * H + d / 8, rel=1e-12)
    raw1, *_ = _run(base_run, [dataclasses.replace(op, kernels=(tiny,))])
    assert raw1.step_time_s == pytest.approx(H + kernel_time_s(tiny, chip, cal), rel=1e-12)


@pytest.fixture(scope="module")
def base_run():
    return simulate(scenario())


def test_trace_files_keep_the_launches(runs, tmp_path):
    tr = runs["per-expert"].trace
    back = trace_from_dict(trace_to_dict(tr))
    assert [op.kernels for op in back.ops] == [op.kernels for op in tr.ops]
    pytest.importorskip("chakra.schema.protobuf.et_def_pb2")
    write_trace(tr, tmp_path / "et", format="chakra")
    assert [op.kernels for op in read_trace(tmp_path / "et").ops] == [op.kernels for op in tr.ops]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8", 10**6])
def test_trace_file_launches_are_checked(runs, bad):
    d = trace_to_dict(runs["per-expert"].trace)
    op = next(o for o in d["ops"] if o["kind"] == "compute" and any("launches" in k for k in o["kernels"]))
    k = next(k for k in op["kernels"] if "launches" in k)
    k["launches"] = bad
    with pytest.raises(TraceError, match=r"\.launches: must be an integer in 1\.\.65536"):
        trace_from_dict(d)


MOE_ARGS = """
torchrun --nnodes 2 --nproc_per_node 8 pretrain_gpt.py --num-layers 8 --hidden-size 1024
  --num-attention-heads 8 --seq-length 1024 --micro-batch-size 1 --global-batch-size 16
  --vocab-size 32000 --num-experts 16 --moe-router-topk 2 --expert-model-parallel-size 2
  --moe-token-dispatcher-type alltoall --bf16
"""


@pytest.mark.parametrize(
    "extra,expected",
    [
        ("", "per-expert"),  # SequentialMLP
        ("--moe-grouped-gemm", "per-expert"),  # TEGroupedMLP, cuBLAS per expert
        ("--moe-grouped-gemm --moe-use-grouped-tensor", "grouped"),  # TE's GroupedTensor GEMM
        ("--moe-grouped-gemm --use-transformer-engine-op-fuser", "grouped"),  # which the fuser turns on
        ("NVTE_USE_CUTLASS_GROUPED_GEMM=1 --moe-grouped-gemm", "grouped"),  # TE's CUTLASS grouped GEMM
        ("NVTE_USE_CUTLASS_GROUPED_GEMM=1", "per-expert"),  # SequentialMLP ignores it
    ],
)
def test_megatron_import_maps_the_expert_gemms(extra, expected):
    res = import_megatron(f"{extra} {MOE_ARGS}", "dgx-h100")
    assert res.scenario["training"]["moe_expert_gemm"] == expected
    assert not any("grouped" in u.lower() or "fuser" in u for u in res.unmapped)


def test_export_writes_the_grouped_tensor_switch_and_reads_back():
    for gemm, args in (
        ("grouped", "--moe-grouped-gemm \\\n  --moe-use-grouped-tensor"),
        ("per-expert", "--moe-grouped-gemm"),
    ):
        sc = load_scenario(moe_scenario(parallel=EP2, training={"moe_expert_gemm": gemm}))
        text = export_megatron(sc)
        assert (args in text) and (("grouped-tensor" in text) == (gemm == "grouped"))
        assert import_megatron(text, sc.cluster.name).scenario["training"]["moe_expert_gemm"] == gemm


def test_export_refuses_fp8_dispatch_with_per_expert_gemms():
    """Megatron-Core sends FP8 tokens only through the TE operation fuser, which runs one grouped
    GEMM: a per-expert scenario with FP8 dispatch has no launch line."""
    from simulator.scenario.schema import ScenarioError

    sc = load_scenario(moe_scenario(parallel=EP2, training={"moe_expert_gemm": "per-expert", "dtype": "fp8"}))
    assert sc.training.fp8_dispatch
    with pytest.raises(ScenarioError) as e:
        export_megatron(sc)
    assert e.value.field == "training.moe_expert_gemm"


def test_a_bad_choice_is_refused():
    from simulator.scenario.schema import ScenarioError

    with pytest.raises(ScenarioError) as e:
        load_scenario(moe_scenario(training={"moe_expert_gemm": "cutlass"}))
    assert "training.moe_expert_gemm" in str(e.value)
    assert all(f"'{v}'" in str(e.value) for v in MOE_EXPERT_GEMMS)  # the choices, named


def test_the_qwen3_30b_layer_launches_86_kernels():
    """The layout of NVIDIA's Nsight capture (Qwen3-30B-A3B, BF16, 16 H100, EP16: 8 local experts,
    HybridEP; NVIDIA/skills nemo-mbridge-perf-expert-parallel-overlap, docs/limits.md), which
    measured 151 kernels a MoE layer and micro-batch: one grouped kernel a GEMM gives 40 compute
    kernels (the auxiliary loss's statistics with their backward among them) and 4 all-to-alls,
    44; one GEMM per local expert 6 x 7 more, 86."""
    sc = dict(load_scenario("validation/nemo-perf/mbridge-qwen3-30b-16xh100-fp8.yaml").source)
    for k in ("published", "assumptions"):
        sc.pop(k, None)
    t = sc["training"]
    for k in ("fp8_recipe", "fp8_params", "moe_dispatch_dtype"):
        t.pop(k)
    t.update(dtype="bf16", global_batch_size=32)
    counts = {}
    for gemm in ("grouped", "per-expert"):
        res = simulate({**sc, "training": {**t, "moe_expert_gemm": gemm}})
        r = res.trace.ranks[0]
        ops = [o for o in res.trace.ops if o.rank == r and o.mb == 0 and o.layer == 3]
        counts[gemm] = sum(launches_of(o) for o in ops)
    assert counts == {"grouped": 44, "per-expert": 44 + 6 * (8 - 1)}


@pytest.mark.parametrize("recipe,launches", [("tensorwise", LOCAL), ("blockwise", LOCAL), ("delayed", 1)])
def test_fp8_expert_inputs_are_quantised_split_by_split(recipe, launches):
    """Transformer Engine's split_quantize quantises a GroupedLinear's input one split (expert) at
    a time (multi_tensor_quantize_impl, transformer_engine/pytorch/csrc/extensions/cast.cpp at
    d0067d0), in one fused multi_cast_transpose kernel under delayed scaling only: the passes of
    a per-expert GEMM launch once per local expert, forward and backward."""
    res = _sim("per-expert", dtype="fp8", fp8_recipe=recipe, moe_dispatch_dtype="bf16")
    quant = [
        k
        for op in res.trace.ops
        if op.kind == "compute"
        for k in op.kernels
        if "expert_" in k.name and k.kind == "quantize"
    ]
    assert quant and {k.launches for k in quant} == {launches}
    assert {k.name.endswith(".bwd") for k in quant} == {False, True}
    grouped = _sim("grouped", dtype="fp8", fp8_recipe=recipe, moe_dispatch_dtype="bf16")
    assert all(k.launches == 1 for op in grouped.trace.ops if op.kind == "compute" for k in op.kernels)
