"""The host stream (simulator.engine.host): closed forms on one rank's chain of tiny kernels,
CUDA graphs, a blocking device-to-host sync, and the MoE options that place the sync and the
shared experts (workloads.trace.program_layers)."""

from __future__ import annotations

import pytest
from helpers import scenario
from test_moe import TINY_MOE

from simulator import simulate
from simulator.engine.compute import calibration_for, kernel_time_s
from simulator.engine.loop import Engine
from workloads.kernels import Kernel
from workloads.trace.ops import Op, Trace

H = 10e-6  # host seconds per launch in these tests
N = 20


@pytest.fixture(scope="module")
def base():
    return simulate(scenario())


def _run(base, ops, host_launch_s=H, chain_ops=True):
    sc = base.scenario
    chip = sc.cluster.chip
    cal = calibration_for(chip, {})
    tr = Trace(ops=ops, ranks=(0,), weight={0: 1}, static_memory={0: {}}, world=sc.layout.world)
    eng = Engine(tr, base.topology, sc.layout, chip, cal, host_launch_s=host_launch_s, chain_ops=chain_ops)
    return eng.run(), kernel_time_s, chip, cal


def _tiny(i, kernels=1, **kw):
    ks = tuple(Kernel(f"k{j}", "elementwise", 0.0, 1e3) for j in range(kernels))
    return Op(i, 0, "compute", "compute", f"op{i}", "F", 0, 0, 0, kernels=ks, **kw)


def _d(base) -> float:
    sc = base.scenario
    return kernel_time_s(Kernel("k", "elementwise", 0.0, 1e3), sc.cluster.chip, calibration_for(sc.cluster.chip, {}))


@pytest.mark.parametrize("chain_ops", [True, False])
def test_host_bound_chain_takes_n_launches(base, chain_ops):
    """N kernels shorter than a launch: the GPU waits for each, step = N h + d (the last
    kernel runs after its launch); without the host stream N d."""
    d = _d(base)
    assert d < H
    raw, *_ = _run(base, [_tiny(i) for i in range(N)], chain_ops=chain_ops)
    assert raw.step_time_s == pytest.approx(N * H + d, rel=1e-12)
    raw0, *_ = _run(base, [_tiny(i) for i in range(N)], host_launch_s=0.0)
    assert raw0.step_time_s == pytest.approx(N * d, rel=1e-12)
    # what the GPU lost waiting for the host: N (h - d) + d
    assert sum(raw.host_delay_s.values()) == pytest.approx(raw.step_time_s - N * d, rel=1e-9)


def test_kernels_of_one_op_are_issued_one_by_one(base):
    d = _d(base)
    raw, *_ = _run(base, [_tiny(0, kernels=N)])
    assert raw.step_time_s == pytest.approx(N * H + d, rel=1e-12)


def test_cuda_graph_replay_costs_one_launch(base):
    """The same chain replayed as one graph: one launch, then N kernel times."""
    d = _d(base)
    ops = [_tiny(i, launches=1 if i == 0 else 0) for i in range(N)]
    raw, *_ = _run(base, ops)
    assert raw.step_time_s == pytest.approx(H + N * d, rel=1e-12)


def test_long_kernels_hide_the_host(base):
    """Kernels longer than a launch: the host runs ahead, only the first launch shows."""
    long = Kernel("big", "elementwise", 0.0, 5e8)  # ~0.15 ms on an H100
    ops = [Op(i, 0, "compute", "compute", f"op{i}", "F", 0, 0, 0, kernels=(long,)) for i in range(N)]
    raw, *_ = _run(base, ops)
    raw0, *_ = _run(base, ops, host_launch_s=0.0)
    assert raw.step_time_s == pytest.approx(raw0.step_time_s + H, rel=1e-12)


@pytest.mark.parametrize("chain_ops", [True, False])
def test_blocking_sync_makes_the_host_wait_for_the_device(base, chain_ops):
    """A long op A read back to the host, then a tiny op B. Without the sync the host
    issued B long before A ended (B runs right after A); with it the host waits for A to
    end and only then launches B: exactly one launch later."""
    long = Kernel("big", "elementwise", 0.0, 5e8)
    d = _d(base)

    def ops(sync):
        a = Op(0, 0, "compute", "compute", "a", "F", 0, 0, 0, kernels=(long,), host_sync=sync)
        return [a, _tiny(1)]

    free, *_ = _run(base, ops(False), chain_ops=chain_ops)
    held, *_ = _run(base, ops(True), chain_ops=chain_ops)
    assert held.step_time_s == pytest.approx(free.step_time_s + H, rel=1e-12)
    end_a = [r.end_s for r in held.records if r.op.name == "a"][0]
    assert held.step_time_s == pytest.approx(end_a + H + d, rel=1e-12)
    assert held.host.sync_wait_s[0] > 0


def _moe(**training):
    """Two stages of 8-way EP on 16 H100s, a MoE with shared experts."""
    return scenario(
        model=dict(TINY_MOE),
        cluster={"preset": "dgx-h100", "devices": 16},
        parallel={"tp": 1, "pp": 2, "dp": 8, "ep": 8},
        training={"seq_len": 1024, "micro_batch_size": 1, "global_batch_size": 16, **training},
    )


def test_moe_dispatch_blocks_the_host_each_forward_layer():
    """The router op before each dispatch is a host sync (forward and recomputation only);
    with moe_host_sync off none is; the sync costs time, never saves it."""
    on = simulate(_moe())
    off = simulate(_moe(moe_host_sync=False))
    syncs = [op for op in on.trace.ops if op.host_sync]
    assert syncs and all(op.phase in ("F", "R") for op in syncs)
    dispatches = [op for op in on.trace.ops if op.name.endswith(".dispatch") and op.phase in ("F", "R")]
    assert len(syncs) == len(dispatches)
    assert not any(op.host_sync for op in off.trace.ops)
    assert on.summary["step_time_s"] >= off.summary["step_time_s"]


def test_shared_expert_overlap_runs_shared_experts_beside_the_dispatch():
    """Megatron's default runs the shared experts before the dispatch (the dispatch starts
    after them); --moe-shared-expert-overlap runs them while it is in flight, which can only
    shorten the step."""
    seq = simulate(_moe(host_launch_s=0.0))
    ovl = simulate(_moe(host_launch_s=0.0, moe_shared_expert_overlap=True))
    for res, overlapped in ((seq, False), (ovl, True)):
        ev = res.events
        r0 = ev[(ev["rank"] == ev["rank"].min()) & (ev["phase"] == "F")]
        for l in sorted({n.split(".")[0] for n in r0["name"] if n.endswith(".dispatch")}):
            sh = r0[r0["name"] == f"{l}.shared.F"].iloc[0]
            dp = r0[r0["name"] == f"{l}.dispatch"].iloc[0]
            if overlapped:
                assert sh["start_s"] < dp["end_s"] and sh["end_s"] > dp["start_s"]
            else:
                assert dp["start_s"] >= sh["end_s"]
    assert ovl.summary["step_time_s"] < seq.summary["step_time_s"]


def test_per_layer_graphs_remove_launches_but_not_past_the_sync():
    """Per-layer graphs: one launch per layer and phase where nothing blocks; the MoE part
    after the router's sync stays eager; full graphs are refused while the sync is on."""
    eager = simulate(_moe())
    graphed = simulate(_moe(cuda_graphs="per-layer"))
    ops = graphed.trace.ops
    assert any(op.launches == 0 for op in ops)
    assert all(op.launches == -1 for op in ops if ".experts." in op.name or op.name.endswith(".dispatch"))
    assert graphed.summary["step_time_s"] <= eager.summary["step_time_s"]
    with pytest.raises(Exception, match="cuda_graphs"):
        simulate(_moe(cuda_graphs="full"))
    full = simulate(_moe(cuda_graphs="full", moe_host_sync=False))
    assert sum(op.launches for op in full.trace.ops if op.rank == full.trace.ranks[0]) == 1
