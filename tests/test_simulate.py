"""End-to-end checks of simulate(): closed forms, determinism, monotonicity."""

from __future__ import annotations

import copy
import json

import pytest
from helpers import ideal_scenario, scenario

from simulator import simulate
from workloads import activations
from workloads.activations import ActivationPolicy
from workloads.model import ModelSpec
from workloads.shard import Shard

SUMMARY_KEYS = [
    "schema_version",
    "name",
    "devices",
    "parameters",
    "active_parameters",
    "step_time_s",
    "tokens_per_s",
    "model_flops_per_step",
    "mfu",
    "hfu",
    "model_tflops_per_device",
    "bubble_fraction",
    "exposed_comm_fraction",
    "peak_memory_bytes",
    "memory_breakdown_bytes",
    "hbm_bytes",
    "oom",
    "sim_wall_s",
]


def test_summary_has_every_documented_key():
    res = simulate(scenario())
    for k in SUMMARY_KEYS:
        assert k in res.summary, k
    assert res.summary["schema_version"] == 1
    assert set(res.summary["memory_breakdown_bytes"]) == {
        "weights",
        "gradients",
        "optimizer",
        "activations",
        "buffers",
        "allocator_reserve",
    }
    assert res.summary["oom"] == (res.summary["peak_memory_bytes"] > res.summary["hbm_bytes"])
    assert res.summary["tokens_per_s"] == pytest.approx(16 * 1024 / res.summary["step_time_s"])


@pytest.mark.parametrize("flash", [False, True])
def test_one_device_mfu_equals_the_compute_efficiency(flash):
    """With free memory traffic and a constant GEMM/attention efficiency e, a
    one-device step runs every executed FLOP at e x peak. Unfused attention executes
    what the model-FLOPs convention counts: MFU = e. A causal flash kernel executes,
    in FlashAttention's convention (Dao 2023, arXiv 2307.08691 §4.1), half the
    counted forward square A and 2.5 x that in the backward: 1.75 A of the 3 A the
    model FLOPs count per layer, so MFU = e x model / (model - 1.25 A x layers)."""
    sc = ideal_scenario(
        1, parallel={"tp": 1, "pp": 1, "dp": 1}, training={"global_batch_size": 2, "flash_attention": flash}
    )
    res = simulate(sc)
    model = res.summary["model_flops_per_step"]
    tokens, seq, hidden, layers = 2 * 4096, 4096, 4096, 8  # BALANCED_MODEL, 2 sequences of 4096
    attn_fwd_counted = 4.0 * tokens * seq * hidden  # QK^T and PV over the full square, one layer
    expect = 0.5 * model / (model - 1.25 * attn_fwd_counted * layers) if flash else 0.5
    assert res.summary["mfu"] == pytest.approx(expect, rel=2e-3)
    assert res.summary["bubble_fraction"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 4)])
def test_1f1b_bubble_fraction_matches_closed_form(pp, m):
    """Narayanan et al. 2021 §2.2.1: with balanced stages and free communication the
    1F1B bubble is (p-1)/(m+p-1) of the step."""
    sc = ideal_scenario(pp, parallel={"tp": 1, "pp": pp, "dp": 1}, training={"global_batch_size": m})
    res = simulate(sc)
    assert res.summary["bubble_fraction"] == pytest.approx((pp - 1) / (m + pp - 1), rel=0.02)


def test_gpipe_and_1f1b_first_stage_activation_memory():
    """GPipe keeps all m micro-batches' activations on the first stage, 1F1B at most p."""
    pp, m = 4, 8
    peaks = {}
    for name in ("gpipe", "1f1b"):
        sc = ideal_scenario(pp, parallel={"tp": 1, "pp": pp, "dp": 1}, schedule=name, training={"global_batch_size": m})
        res = simulate(sc)
        stage0 = res.memory[res.memory["stage"] == 0]
        peaks[name] = stage0["activations"].max()
    model = ModelSpec(**{k: v for k, v in sc["model"].items()})
    per_mb = sum(
        activations.activation_bytes_per_layer(model, l, Shard(1, 4096), ActivationPolicy(flash_attention=True))
        for l in range(2)
    )
    assert peaks["gpipe"] == pytest.approx(m * per_mb, rel=1e-9)
    assert peaks["1f1b"] == pytest.approx(pp * per_mb, rel=1e-9)


def test_activation_stash_follows_korthikanti_with_tp_and_sp():
    sc = ideal_scenario(
        8,
        parallel={"tp": 8, "pp": 1, "dp": 1},
        schedule="gpipe",
        training={"global_batch_size": 1, "flash_attention": False},
    )
    res = simulate(sc)
    model = ModelSpec(**sc["model"])
    s, b, h, a, t = 4096, 1, 4096, 32, 8
    # No dropout in modern training: Korthikanti's (sbh/t)(34 + 5as/h) less the masks.
    expected = model.layers * activations.activation_bytes_per_layer(
        model, 0, Shard(b, s, tp=t, sequence_parallel=True)
    )
    got = res.memory["activations"].max()
    head = activations.head_activation_bytes(model, Shard(b, s, tp=t))
    assert got == pytest.approx(expected + head, rel=1e-9)
    # with dropout the formula is the paper's
    assert activations.activation_bytes_per_layer(
        model, 0, Shard(b, s, tp=t), ActivationPolicy(dropout=True)
    ) == pytest.approx(s * b * h / t * (34 + 5 * a * s / h))


def test_identical_runs_give_identical_summaries():
    a = simulate(scenario(parallel={"tp": 2, "pp": 2, "dp": 2}))
    b = simulate(scenario(parallel={"tp": 2, "pp": 2, "dp": 2}))
    sa = {k: v for k, v in a.summary.items() if k != "sim_wall_s"}
    sb = {k: v for k, v in b.summary.items() if k != "sim_wall_s"}
    assert json.dumps(sa, sort_keys=True) == json.dumps(sb, sort_keys=True)
    assert a.events.equals(b.events)


def _scaled_network(sc, nvlink=1.0, nic=1.0):
    sc = copy.deepcopy(sc)
    net = sc["cluster"].setdefault("network", {})
    net["domain_bw_bytes_per_s"] = 450e9 * nvlink
    net["nic_bw_bytes_per_s"] = 50e9 * nic
    return sc


def test_halving_bandwidth_never_makes_a_step_faster():
    for par in ({"tp": 2, "pp": 2, "dp": 4}, {"tp": 8, "pp": 1, "dp": 2}, {"tp": 1, "pp": 4, "dp": 4}):
        base = scenario(cluster={"preset": "dgx-h100", "devices": 16}, parallel=par)
        t_full = simulate(_scaled_network(base)).summary["step_time_s"]
        t_half = simulate(_scaled_network(base, 0.5, 0.5)).summary["step_time_s"]
        assert t_half >= t_full


def test_tp_only_step_is_limited_by_nvlink():
    base = scenario(
        cluster={"preset": "dgx-h100", "devices": 8},
        parallel={"tp": 8, "pp": 1, "dp": 1},
        training={"global_batch_size": 4},
    )
    t = simulate(_scaled_network(base)).summary["step_time_s"]
    t_nvl = simulate(_scaled_network(base, nvlink=0.25)).summary["step_time_s"]
    t_nic = simulate(_scaled_network(base, nic=0.25)).summary["step_time_s"]
    assert t_nvl > 1.05 * t
    assert t_nic == pytest.approx(t, rel=1e-12)


def test_two_node_dp_step_is_limited_by_the_nic():
    """Two data-parallel replicas, one per node (pipeline stages inside the node via
    parallel.order): the gradient all-reduce crosses InfiniBand only."""
    base = scenario(
        cluster={"preset": "dgx-h100", "devices": 16},
        parallel={"tp": 1, "pp": 8, "dp": 2, "order": "tp-cp-ep-pp-dp"},
        training={"global_batch_size": 16},
        model={**scenario()["model"], "layers": 8, "hidden": 2048, "heads": 16, "kv_heads": 16, "ffn_hidden": 8192},
    )
    res = simulate(_scaled_network(base))
    t = res.summary["step_time_s"]
    t_nic = simulate(_scaled_network(base, nic=0.25)).summary["step_time_s"]
    t_nvl = simulate(_scaled_network(base, nvlink=0.25)).summary["step_time_s"]
    assert t_nic > 1.05 * t
    assert (t_nic - t) > 5 * abs(t_nvl - t)
    assert res.summary["exposed_comm_fraction"] > 0


def test_full_recompute_counts_an_extra_forward_in_hfu_only():
    """Full recomputation re-runs each layer's forward before its backward: hardware
    FLOPs grow by the layers' forward (4/3 of model FLOPs for the layers), MFU does not count it.
    Unfused attention, which executes the FLOPs it counts, so that HFU = the efficiency."""
    sc = ideal_scenario(
        1,
        parallel={"tp": 1, "pp": 1, "dp": 1},
        training={"global_batch_size": 2, "recompute": "full", "flash_attention": False},
    )
    res = simulate(sc)
    assert res.summary["hfu"] == pytest.approx(res.summary["mfu"] * 4 / 3, rel=1e-3)
    assert res.summary["hfu"] == pytest.approx(0.5, rel=2e-3)
    assert (res.events["phase"] == "R").any()


def test_grad_reduce_overlap_hides_data_parallel_traffic():
    base = scenario(
        cluster={"preset": "dgx-h100", "devices": 16}, parallel={"tp": 1, "pp": 2, "dp": 8, "order": "tp-cp-ep-pp-dp"}
    )
    on = simulate(base)
    off = simulate({**base, "training": {**base["training"], "overlap_grad_reduce": False}})
    assert off.summary["step_time_s"] > on.summary["step_time_s"]
    assert off.summary["exposed_comm_fraction"] > on.summary["exposed_comm_fraction"]


def test_auto_pipeline_layers_split_unevenly_with_lighter_ends():
    from workloads.layout import auto_layer_split

    split = auto_layer_split(61, 16)
    assert sum(split) == 61 and max(split) - min(split) == 1
    assert split[0] == split[-1] == min(split)
    res = simulate(
        scenario(
            model={**scenario()["model"], "layers": 5},
            cluster={"preset": "dgx-h100", "devices": 4},
            parallel={"tp": 1, "pp": 4, "dp": 1, "pipeline_layers": "auto"},
        )
    )
    assert res.summary["step_time_s"] > 0


@pytest.mark.parametrize(
    "chunks,megatron_bridge",
    [
        (4, [16, 16, 16, 13]),  # (pp, vpp) = (4, 1)
        (8, [8, 8, 8, 8, 8, 8, 8, 5]),  # (8, 1) and (4, 2)
        (16, [4] * 15 + [1]),  # (16, 1), (8, 2) and (4, 4)
    ],
)
def test_auto_split_of_a_model_with_mtp_is_megatron_bridges_deepseek_v3_layout(chunks, megatron_bridge):
    """With DeepSeek-V3's MTP module counted as two layers on the last chunk (its block and its
    pass through the output head), ``pipeline_layers: auto`` gives each layout of Megatron-Bridge's
    table (``set_deepseek_v3_pipeline_model_parallel_layout``, src/megatron/bridge/recipes/deepseek/
    h100/deepseek_v3.py at v0.6.0: the embedding first, the MTP module and the loss last)."""
    from workloads.layout import auto_layer_split

    assert auto_layer_split(61, chunks, mtp_depth=1) == megatron_bridge
    assert auto_layer_split(61, chunks) != megatron_bridge  # without the MTP module, not


def test_the_mtp_aware_split_is_what_a_deepseek_v3_step_runs():
    """The scenario's auto split passes the model's MTP depth: a DeepSeek-V3 trace's last chunk
    holds one layer at 16 chunks; the split never leaves a chunk empty."""
    from simulator.scenario.loading import load_scenario
    from workloads.layout import auto_layer_split
    from workloads.trace.shared import chunk_layer_ranges

    sc = load_scenario(
        scenario(
            model="deepseek-v3",
            cluster={"preset": "gb200-nvl72", "devices": 256, "network": {"domain_size": 64}},
            parallel={"tp": 1, "pp": 4, "vpp": 4, "dp": 64, "ep": 64, "pipeline_layers": "auto"},
            schedule="interleaved-1f1b",
            training={"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 256},
        )
    )
    assert [len(r) for r in chunk_layer_ranges(sc.model, sc.layout, sc.schedule)] == [4] * 15 + [1]
    assert sc.model.mtp_depth == 1
    for chunks in range(2, 62):
        split = auto_layer_split(61, chunks, mtp_depth=1)
        assert sum(split) == 61 and min(split) >= 1, chunks


def test_ring_attention_overlaps_the_kv_exchange():
    base = scenario(
        cluster={"preset": "dgx-h100", "devices": 16},
        parallel={"tp": 1, "cp": 8, "pp": 1, "dp": 2},
        training={"seq_len": 8192, "micro_batch_size": 1, "global_batch_size": 4},
    )
    ring = simulate(base)
    gather = simulate({**base, "training": {**base["training"], "cp_algorithm": "all-gather"}})
    assert (ring.events["axis"] == "cp").any()
    assert ring.summary["step_time_s"] < gather.summary["step_time_s"]
    assert ring.summary["mfu"] > gather.summary["mfu"]
    exact = simulate(base, exact=True)
    assert exact.summary["step_time_s"] == pytest.approx(ring.summary["step_time_s"], rel=1e-9)


def test_the_run_leaves_the_collector_on_with_its_objects_long_lived():
    # simulate() pauses the cyclic collector, then moves what it tracks to the oldest
    # generation: the first young collection afterwards need not walk the whole run
    import gc

    assert gc.isenabled()
    simulate("quickstart")
    assert gc.isenabled()
    assert gc.get_count()[0] < 1000  # young objects: only those made since, not the run's
    assert gc.get_freeze_count() == 0


def test_the_run_leaves_the_callers_frozen_objects_frozen():
    import gc

    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        simulate("quickstart")
        after = gc.get_freeze_count()
        # thawing them (freeze + unfreeze in the finally) would leave 0; freezing the
        # run's survivors would add to them. Frozen objects that the run lets go (a
        # cache entry replaced) still leave the permanent generation: a few may go.
        assert 0.99 * frozen <= after <= frozen
    finally:
        gc.unfreeze()
