"""Expert all-to-alls against published kernel measurements (the calibration's ``a2a_efficiency``).

The traffic of each benchmark is rebuilt from its own script: DeepEP's tests route 4,096 tokens
(8,192 in V2) of hidden 7,168 to the top 8 of 256 experts by ``|randn| + 1`` scores, internode
first to the top ``min(nodes, 4)`` nodes by their best expert (``tests/test_internode.py``,
``tests/test_intranode.py``, deepseek-ai/DeepEP); a token goes once to each rank (NVLink) and
once to each node (RDMA) it reaches. Its FP8 dispatch moves 7,168 bytes plus 4-byte scales per
128 (7,392 per token), its BF16 combine 14,336. Those tests report "bottleneck bandwidth": bytes
over time, RDMA bytes counting the tokens for the sender's own node too and NVLink bytes every
token received. So a published bandwidth gives the time the step took, and stepsim's plan of the
same volumes on the same machine gives its own: the test compares the two. What the rates rest on
(bulk-copy efficiencies from nccl-tests, and ``a2a_efficiency``) is in
``simulator/network/calibration.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simulator.network.calibration import default_calibration
from simulator.network.collectives import plan_collective, run_collective
from simulator.network.flows import FlowNetwork
from simulator.studies.bench import collective_time_s
from topologies.presets import build_cluster, cluster_preset

HIDDEN, TOP_K, EXPERTS = 7168, 8, 256
FP8_TOKEN_BYTES = HIDDEN * (1 + 4 / 128)  # DeepEP tests: fp8_factor (1 + 4/128) / 2 of BF16
BF16_TOKEN_BYTES = HIDDEN * 2

#: DeepEP V1 (docs/legacy.md, "Normal kernels with NVLink and RDMA forwarding"): H800 with
#: ~160 GB/s NVLink and one 400 Gb/s CX7 per GPU, 4,096 tokens, 24 SMs. EP -> (dispatch,
#: combine) bottleneck bandwidth, bytes/s (NVLink for EP 8, RDMA otherwise).
DEEPEP_V1_H800 = {8: (153e9, 158e9), 16: (43e9, 43e9), 32: (58e9, 57e9), 64: (51e9, 50e9)}


def _distinct(ranks: int, tokens: int, seed: int = 0) -> tuple[float, float]:
    """Mean distinct ranks and distinct nodes (8 ranks each) per token under DeepEP's routing."""
    rng = np.random.default_rng(seed)
    scores = np.abs(rng.standard_normal((tokens, EXPERTS))) + 1
    nodes = max(ranks // 8, 1)
    if nodes > 1:  # node-limited: the top min(nodes, 4) nodes by their best expert's score
        best = scores.reshape(tokens, nodes, -1).max(axis=-1)
        keep = np.zeros((tokens, nodes), dtype=bool)
        np.put_along_axis(keep, np.argsort(-best, axis=1)[:, : min(nodes, 4)], True, axis=1)
        scores = np.where(np.repeat(keep, EXPERTS // nodes, axis=1), scores, -np.inf)
    rank = np.argsort(-scores, axis=1)[:, :TOP_K] // (EXPERTS // ranks)
    node = rank // 8
    per_rank = np.mean([len(set(r)) for r in rank.tolist()])
    per_node = np.mean([len(set(r)) for r in node.tolist()])
    return float(per_rank), float(per_node)


def _simulated_s(preset: str, ranks: int, size: float, scaleout_fraction: float = 1.0) -> float:
    """One all-to-all of ``size`` bytes per rank over ranks 0..ranks-1 of ``preset``, alone,
    with the family's default calibration; stepsim's own choice of algorithm."""
    spec = cluster_preset(preset, ranks)
    cal = default_calibration(spec.chip.family)
    t, algorithm = collective_time_s(
        "all-to-all", build_cluster(spec), range(ranks), size, calibration=cal, scaleout_fraction=scaleout_fraction
    )
    assert algorithm == ("direct" if ranks <= 8 else "hierarchical-a2a")
    return t


def _deepep_ratio(ranks: int, combine: bool) -> float:
    """stepsim's time / DeepEP V1's for its dispatch (or combine) over ``ranks`` H800s."""
    tokens = 4096
    per_rank, per_node = _distinct(ranks, tokens)
    token_bytes = BF16_TOKEN_BYTES if combine else FP8_TOKEN_BYTES
    # Per rank: one copy per distinct destination rank; the rail carries one per distinct
    # node, i.e. per_node / per_rank of them (hierarchical-a2a's scaleout_fraction).
    size = tokens * per_rank * token_bytes
    published = DEEPEP_V1_H800[ranks][int(combine)]
    if ranks == 8:
        t_pub = size / published  # NVLink bytes: every token received
        return _simulated_s("h800", ranks, size) / t_pub
    t_pub = tokens * per_node * token_bytes / published  # RDMA bytes: per distinct node
    return _simulated_s("h800", ranks, size, per_node / per_rank) / t_pub


@pytest.mark.parametrize("combine", [False, True], ids=["dispatch", "combine"])
@pytest.mark.parametrize("ranks", [8, 32, 64])
def test_deepep_v1_on_h800_within_5_percent(ranks, combine):
    """EP 8 inside one node (NVLink-bound), EP 32 and 64 over 4 and 8 nodes (RDMA-bound):
    stepsim's time within 5 % of DeepEP's (0.96-1.03 of it with the default calibration; 0.82,
    0.91, 0.93 for the dispatches with bulk-copy rates alone, before ``a2a_efficiency``)."""
    assert _deepep_ratio(ranks, combine) == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("combine", [False, True], ids=["dispatch", "combine"])
def test_deepep_v1_ep16_forwarding_bound_within_15_percent(combine):
    """EP 16 on 2 nodes is bound by NVLink, which carries both the node's own traffic and what
    the rail peers forward: stepsim is 12 % faster than DeepEP (0.88 of its time), the one
    measured configuration it misses by more than 5 %; its forwarding kernels' overhead is not
    modelled beyond ``a2a_efficiency``."""
    ratio = _deepep_ratio(16, combine)
    assert 0.85 <= ratio <= 1.0


def test_deepep_v2_on_b200_between_its_sm_budgets():
    """DeepEP V2 (README, "Performance"): intranode EP 8 on B200 (SM100), 8,192 tokens, FP8
    dispatch at 726 GB/s with 64 SMs and 643 GB/s with 24, BF16 combine at 740 and 675 ("logical
    bandwidth", every token received). Blackwell's ``a2a_efficiency`` is the mean of the four, so
    stepsim's rate lies between each pair."""
    tokens = 8192
    per_rank, _ = _distinct(8, tokens)
    for token_bytes, (low, high) in ((FP8_TOKEN_BYTES, (643e9, 726e9)), (BF16_TOKEN_BYTES, (675e9, 740e9))):
        size = tokens * per_rank * token_bytes
        rate = size / _simulated_s("dgx-b200", 8, size)
        assert low < rate < high


def test_nccl_alltoall_on_four_h100():
    """NCCL's own all-to-all over NVLink: 4 x H100 80GB HBM3, ``alltoall_perf`` at 524,288,000
    bytes, 334.90 GB/s busbw out of place, 337.99 in place (NVIDIA/nccl issue #2169, NCCL
    2.30.4). busbw = algbw (n-1)/n: the per-GPU NVLink rate of the (n-1)/n that leaves it.
    stepsim: 0.822 x 450 GB/s bulk copies (nccl-tests issue #212) x Hopper's NVLink
    ``a2a_efficiency``, within 8 % (5.8 % under it: the DeepEP figures, the other two behind the
    mean, are lower)."""
    size = 524288000.0
    t = _simulated_s("dgx-h100", 4, size)
    busbw = size / t * 3 / 4
    assert busbw == pytest.approx(334.90e9, rel=0.08)
    assert busbw < 334.90e9  # below NCCL's: the mean includes DeepEP's slower kernels


def test_a2a_efficiency_scales_all_to_alls_by_the_kind_of_link_they_load():
    """Closed forms on 2 nodes of 8 (NVLink 450, NIC 50 GB/s, IDEAL otherwise): a direct
    all-to-all inside a node takes (n-1)/n S / (B e_nvlink); the hierarchical one across both
    nodes, IB-bound, k S/n / (B_nic e_nic) after its latency; an all-reduce is untouched."""
    from simulator.network.calibration import IDEAL
    from topologies.builders import switched
    from topologies.networks import SwitchedNetwork
    from topologies.topology import Topology

    topo = Topology(switched(16, SwitchedNetwork(8, 450e9, 50e9)))
    cal = IDEAL.with_overrides(a2a_efficiency={"nvlink": 0.5, "nic": 0.8})
    S = 1e9

    def run(plan, calibration):
        env = simpy.Environment()
        net = FlowNetwork(env, topo, calibration)
        env.process(run_collective(net, plan))
        env.run()
        return env.now, net.phase_latency_s(plan.phases[0].transfers, plan.phases[0].steps)

    inside = plan_collective("all-to-all", range(8), S, topo)
    t, lat = run(inside, cal)
    assert t - lat == pytest.approx(7 / 8 * S / (450e9 * 0.5), rel=1e-9)
    across = plan_collective("all-to-all", range(16), S, topo)
    assert across.algorithm == "hierarchical-a2a"
    t, lat = run(across, cal)
    ib, nvlink = 8 * S / 16 / (50e9 * 0.8), 7 * 2 * S / 16 / (450e9 * 0.5)
    assert ib > nvlink and t - lat == pytest.approx(ib, rel=1e-9)
    ring = plan_collective("all-reduce", range(8), S, topo, "ring")
    assert run(ring, cal)[0] == run(ring, IDEAL)[0]


def test_a2a_efficiency_in_a_scenario_file():
    """``network_calibration.a2a_efficiency`` replaces the family's entries; out of (0, 1] it
    is refused with the field named."""
    from simulator.scenario.loading import load_scenario
    from stepsim_errors import StepsimError

    base = {
        "model": "mixtral-8x7b",
        "cluster": {"preset": "dgx-h100", "devices": 16},
        "parallel": {"tp": 1, "pp": 1, "dp": 16, "ep": 8},
        "training": {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 16},
    }
    sc = load_scenario({**base, "network_calibration": {"a2a_efficiency": {"nvlink": 0.5}}})
    cal = sc.network_calibration()
    assert cal.a2a_efficiency_of("nvlink") == 0.5 and cal.a2a_efficiency_of("nic") == 0.913
    with pytest.raises(StepsimError, match="a2a_efficiency"):
        load_scenario({**base, "network_calibration": {"a2a_efficiency": {"nvlink": 1.5}}})
