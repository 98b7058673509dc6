"""Tensor-parallel communication overlap (``training.tp_comm_overlap``,
workloads.trace.program_tp_overlap): closed forms on an ideal chip, the option's scope, and
the fast path against the exact simulation with it on."""

from __future__ import annotations

import pytest
from helpers import FAST_SWITCHED, ideal_scenario, scenario
from test_moe import moe_scenario

from simulator import simulate
from workloads.trace.program_tp_overlap import RS_SM_HELD, RS_SPLITS

TP = 2


def _tp2(overlap: bool, **parallel) -> dict:
    """TP 2 alone on an ideal chip, a link slow enough that TP traffic counts (no DP, no PP)."""
    net = {**FAST_SWITCHED, "domain_bw_bytes_per_s": 4e11}
    return ideal_scenario(
        TP,
        parallel={"tp": TP, "pp": 1, "dp": 1, **parallel},
        cluster={"network": net},
        training={"tp_comm_overlap": overlap},
    )


def _rank0(res):
    ev = res.events
    return ev[ev["rank"] == 0]


@pytest.fixture(scope="module")
def runs():
    return simulate(_tp2(False)), simulate(_tp2(True))


def test_overlap_leaves_one_chunk_of_each_collective_exposed(runs):
    """Off: the forward's collectives and the backward's gather of the output gradient are
    exposed; the backward's second gather of the column-parallel GEMMs' input (``.regather``)
    and the reduce-scatter of their input gradient (``.ag.bwd``) run beside those GEMMs'
    gradients (Megatron-Core's and TE's asynchronous backward; the blocks are longer than
    the collectives here). On: each forward all-gather's first 1/tp and reduce-scatter's last
    1/4 (TE's pipeline splits) are exposed, the backward gather's first 1/tp (ring exchange),
    and the bulk overlaps nothing: the exposed TP time per layer is 2 (1/tp + 1/4) + 2/tp of
    the collective's time against 6 of it off."""
    off, on = runs
    e0, e1 = _rank0(off), _rank0(on)
    # after the step's gradients, the TP sum of the replicated parameters' (norms): exposed either way
    sync = e0[e0["name"] == "tp_replicated.grad"]
    assert list(sync["coll"]) == ["all-reduce"]
    sync_s = float(sync["duration_s"].iloc[0])
    tp0 = e0[(e0["axis"] == "tp") & (e0["phase"] != "sync")]
    assert set(tp0["coll"]) == {"all-gather", "reduce-scatter"}
    full = float(tp0["duration_s"].iloc[0])
    assert tp0["duration_s"].to_numpy() == pytest.approx(full, rel=1e-12)  # one hidden-size collective each
    hidden = tp0["name"].str.endswith(".regather") | tp0["name"].str.endswith(".ag.bwd")
    assert hidden.sum() == 0.4 * len(tp0)  # 4 of a layer's 10
    exposed_off = off.summary["exposed_comm_by_axis_s"]["tp"]
    assert exposed_off == pytest.approx(tp0["duration_s"][~hidden].sum() + sync_s, rel=1e-9)
    tp1 = e1[(e1["axis"] == "tp") & (e1["phase"] != "sync")]
    last = tp1[~tp1["name"].str.endswith(".rest")]
    fwd = last[last["phase"] == "F"]
    ag, rs = fwd[fwd["coll"] == "all-gather"], fwd[fwd["coll"] == "reduce-scatter"]
    assert ag["duration_s"].to_numpy() == pytest.approx(full / TP, rel=1e-9)
    assert rs["duration_s"].to_numpy() == pytest.approx(full / RS_SPLITS, rel=1e-9)
    layers = len(ag) / 2  # two blocks a layer and micro-batch
    assert on.summary["exposed_comm_by_axis_s"]["tp"] == pytest.approx(
        layers * full * (2 * (1 / TP + 1 / RS_SPLITS) + 2 / TP) + sync_s, rel=1e-9
    )
    assert exposed_off == pytest.approx(layers * full * 6 + sync_s, rel=1e-9)
    step_on = on.summary["step_time_s"]
    compute_on = e1[e1["kind"] == "compute"]["duration_s"].sum()
    assert step_on == pytest.approx(compute_on + on.summary["exposed_comm_by_axis_s"]["tp"], rel=1e-9)


def test_overlapped_gemms_give_the_collectives_their_sms(runs):
    """Forward: each block is split where the row-parallel GEMM starts, and that part runs on
    116 of 132 SMs, 1 / (1 - 16/132) as long. Backward (three ops either way): the
    column-parallel GEMMs' input gradients and their weight gradients with the norm hold the
    bulk overlaps' 16 SMs; the rest of the block runs as without the overlap."""
    off, on = runs
    c0 = _rank0(off).set_index(["name", "mb"])["duration_s"]
    c1 = _rank0(on).set_index(["name", "mb"])["duration_s"]
    for name in ("L1.attn.F", "L1.mlp.F"):
        body, tail = c1[(f"{name}.body", 0)], c1[(name, 0)]
        assert 0 < tail * (1 - RS_SM_HELD) < c0[(name, 0)]
        assert body + tail * (1 - RS_SM_HELD) == pytest.approx(c0[(name, 0)], rel=1e-9)
    for name in ("L1.attn.B", "L1.mlp.B"):
        assert c1[(f"{name}.body", 0)] == pytest.approx(c0[(f"{name}.body", 0)], rel=1e-12)
        for part in (f"{name}.dgrad", name):
            assert c1[(part, 0)] * (1 - RS_SM_HELD) == pytest.approx(c0[(part, 0)], rel=1e-9)
    assert c1[("embed.F", 0)] == pytest.approx(c0[("embed.F", 0)], rel=1e-12)


def test_off_and_out_of_scope_change_nothing():
    """The option needs sequence parallelism (Megatron asserts it): without it, or off, the
    step is today's to the last bit; MoE blocks keep their TP collectives whole."""
    base = simulate(_tp2(False, sequence_parallel=False)).summary
    on = simulate(_tp2(True, sequence_parallel=False)).summary
    assert on["step_time_s"] == base["step_time_s"]
    assert on["exposed_comm_by_axis_s"] == base["exposed_comm_by_axis_s"]
    moe = moe_scenario(parallel={"tp": 2, "pp": 1, "dp": 8, "ep": 8, "sequence_parallel": True})
    moe["training"] = {**moe["training"], "tp_comm_overlap": True}
    ev = simulate(moe).events
    names = set(ev["name"])
    dense = [l for l in range(moe["model"]["layers"]) if f"L{l}.experts.F" not in names]
    split = {n for n in names if n.endswith(".rest")}
    assert split and all(n.split(".")[1] == "attn" or int(n.split(".")[0][1:]) in dense for n in split)


def test_fast_path_equals_exact_with_tp_overlap():
    sc = scenario(cluster={"preset": "dgx-h100", "devices": 16}, parallel={"tp": 2, "pp": 2, "dp": 4})
    sc["training"] = {**sc["training"], "tp_comm_overlap": True}
    fast = simulate(sc)
    exact = simulate(sc, exact=True)
    assert fast.summary["simulated_ranks"] < exact.summary["simulated_ranks"]
    assert fast.summary["step_time_s"] == pytest.approx(exact.summary["step_time_s"], rel=1e-9)
    off = simulate(scenario(cluster={"preset": "dgx-h100", "devices": 16}, parallel={"tp": 2, "pp": 2, "dp": 4}))
    assert fast.summary["step_time_s"] != off.summary["step_time_s"]


def test_a_recipes_sm_counts_set_each_overlapped_gemms_share():
    """``training.tp_comm_overlap_sms``: the SMs the collective occupies beside each userbuffers
    GEMM, by TE's layer name (a recipe's ``ub_tp_comm_overlap_cfg`` ``num_sm``, e.g. the DGX
    Cloud GPT-3 175B recipe's proj_fprop 24, qkv_wgrad 8); the GEMM op takes 1 / (1 - SMs/132)
    as long, a layer not named keeps TE's 16."""
    sms = {"proj_fprop": 24, "qkv_dgrad": 4, "qkv_wgrad": 8, "fc1_wgrad": 0}
    base = _tp2(True)
    mine = {**base, "training": {**base["training"], "tp_comm_overlap_sms": sms}}
    ref, res = _rank0(simulate(base)), _rank0(simulate(mine))
    c0 = ref.set_index(["name", "mb"])["duration_s"]
    c1 = res.set_index(["name", "mb"])["duration_s"]
    for op, layer in (
        ("L1.attn.F", "proj_fprop"),
        ("L1.mlp.F", "fc2_fprop"),
        ("L1.attn.B.dgrad", "qkv_dgrad"),
        ("L1.attn.B", "qkv_wgrad"),
        ("L1.mlp.B.dgrad", "fc1_dgrad"),
        ("L1.mlp.B", "fc1_wgrad"),
    ):
        held = sms.get(layer, 16) / 132
        assert c1[(op, 0)] * (1 - held) == pytest.approx(c0[(op, 0)] * (1 - RS_SM_HELD), rel=1e-9), op


@pytest.mark.parametrize(
    ("value", "words"),
    [({"qkv_fprop": 4}, "tp_comm_overlap_sms"), ({"proj_fprop": 132}, "less than or equal to 131")],
)
def test_sm_counts_outside_te_s_layers_or_the_gpu_are_refused(value, words):
    from simulator.scenario.errors import ScenarioError
    from simulator.scenario.loading import load_scenario

    sc = _tp2(True)
    sc["training"] = {**sc["training"], "tp_comm_overlap_sms": value}
    with pytest.raises(ScenarioError, match=words):
        load_scenario(sc)
