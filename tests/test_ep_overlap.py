"""Megatron-Core's batch-level overlap of the expert all-to-all (``training.overlap_moe_expert_parallel_comm``,
``--overlap-moe-expert-parallel-comm``): the combined 1F1B of
``megatron/core/pipeline_parallel/combined_1f1b.py`` (NVIDIA/Megatron-LM d98e8a64) and the
checks ``transformer_config.py`` asserts."""

from __future__ import annotations

import pytest
from helpers import scenario
from test_moe import TINY_MOE

from simulator import simulate
from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError
from workloads.pipeline.ep_overlap import combine_forward_backward
from workloads.schedules import Action, schedule

FIELD = "training.overlap_moe_expert_parallel_comm"


def _sc(over: bool, nic: float = 25e9, **parallel) -> dict:
    par = {"tp": 1, "pp": 1, "dp": 32, "ep": 16, **parallel}
    training = {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 128}
    return scenario(
        model=dict(TINY_MOE, hidden=2048, ffn_hidden=8192, moe={**TINY_MOE["moe"], "experts": 16}),
        cluster={"preset": "dgx-h100", "devices": 32, "network": {"nic_bw_bytes_per_s": nic}},
        parallel=par,
        schedule="interleaved-1f1b" if par.get("vpp", 1) > 1 else "1f1b",
        training={**training, "overlap_moe_expert_parallel_comm": over},
    )


def test_without_a_pipeline_it_is_megatrons_combined_schedule():
    """combined_1f1b_schedule_for_no_pipelining, 4 micro-batches: the first forward alone, each
    backward beside the next forward, the last backward alone."""
    got = combine_forward_backward(schedule("1f1b", 0, 1, 4))
    F, B = (lambda j: Action("F", j)), (lambda j: Action("B", j))
    assert got == [(F(0),), (F(1), B(0)), (F(2), B(1)), (F(3), B(2)), (B(3),)]


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_interleaved_steady_phase_pairs_each_backward_with_the_next_forward(rank):
    steps = schedule("interleaved-1f1b", rank, 4, 8, 2)
    got = combine_forward_backward(steps)
    assert [a for st in got for a in sorted(st, key=lambda a: a.op == "F")] == [a for st in steps for a in st]
    pairs = [st for st in got if len(st) == 2]
    assert pairs and all(f.op == "F" and b.op == "B" and f.mb != b.mb for f, b in pairs)
    assert len(got) == len(steps) - len(pairs)


def test_the_overlap_hides_the_expert_all_to_all_where_the_nics_bind():
    """EP16 over two DGX H100 nodes at 25 GB/s of NIC per GPU, no pipeline, 4 micro-batches: the
    paired passes hide more than half of the exposed expert all-to-all and the step is shorter,
    though every paired op runs on the SMs the communication leaves (20 of 132); one more
    micro-batch's activations are held (the next forward starts before the backward ends)."""
    off, on = simulate(_sc(False)).summary, simulate(_sc(True)).summary
    assert on["exposed_comm_by_axis_s"]["ep"] < 0.6 * off["exposed_comm_by_axis_s"]["ep"]
    assert on["step_time_s"] < 0.9 * off["step_time_s"]
    assert on["peak_memory_bytes"] > off["peak_memory_bytes"]
    fast_off, fast_on = simulate(_sc(False, nic=400e9)).summary, simulate(_sc(True, nic=400e9)).summary
    assert fast_on["exposed_comm_by_axis_s"]["ep"] < fast_off["exposed_comm_by_axis_s"]["ep"]


def test_off_is_the_default_and_changes_nothing():
    sc = _sc(False)
    del sc["training"]["overlap_moe_expert_parallel_comm"]
    a, b = simulate(sc).summary, simulate(_sc(False)).summary
    assert a["step_time_s"] == b["step_time_s"] and a["peak_memory_bytes"] == b["peak_memory_bytes"]


@pytest.mark.parametrize(
    "parallel,training,why",
    [
        ({"pp": 2, "dp": 16}, {}, "needs parallel.pp: 1 or schedule: interleaved-1f1b"),
        ({"ep": 1}, {}, "needs a MoE model and parallel.ep > 1"),
        ({}, {"recompute": "full"}, "training.recompute: full"),
        ({}, {"moe_shared_expert_overlap": True}, "moe_shared_expert_overlap"),
        ({}, {"balance": "aux-loss-global"}, "aux-loss-global"),
    ],
)
def test_what_megatron_refuses_is_refused_naming_the_field(parallel, training, why):
    sc = _sc(True, **parallel)
    sc["training"].update(training)
    with pytest.raises(ScenarioError, match=why) as e:
        load_scenario(sc)
    assert e.value.field == FIELD
