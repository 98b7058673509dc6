"""On TPUs the step is one program XLA compiled ahead of it, run without a host dispatch per
operation: the default host stream is off there (``training.host_launch_s`` unset means 0),
and stays 10 us a launch on GPUs. A tiny step, host-bound on a GPU, shows the difference."""

from helpers import TINY_MODEL, scenario

from simulator import simulate
from workloads.training import HOST_LAUNCH_S


def _step(cluster: dict, **training) -> float:
    sc = scenario(
        model=TINY_MODEL,
        cluster=cluster,
        parallel={"tp": 1, "pp": 1, "dp": 8},
        training={"seq_len": 128, "micro_batch_size": 1, "global_batch_size": 8, **training},
    )
    return simulate(sc).summary["step_time_s"]


def test_the_host_stream_is_off_by_default_on_tpus_and_on_on_gpus():
    tpu = {"preset": "tpu-v5p", "devices": 8}
    gpu = {"preset": "dgx-h100", "devices": 8}
    assert _step(tpu) == _step(tpu, host_launch_s=0.0)
    assert _step(tpu, host_launch_s=HOST_LAUNCH_S) > 1.15 * _step(tpu)  # the tiny step is host-bound there
    assert _step(gpu) == _step(gpu, host_launch_s=HOST_LAUNCH_S) > _step(gpu, host_launch_s=0.0)


def test_the_resolved_scenario_writes_the_launch_cost_the_chip_resolves():
    """Sweep and map keys hash the resolved scenario: a GPU scenario that leaves the key unset
    writes 10 us, as every earlier version did (so stored simulations are found again), and a
    TPU one 0."""
    from simulator.scenario.loading import load_scenario
    from simulator.scenario.serialise import scenario_to_dict

    gpu = scenario_to_dict(load_scenario(scenario(model=TINY_MODEL)))["training"]
    tpu = scenario_to_dict(load_scenario(scenario(model=TINY_MODEL, cluster={"preset": "tpu-v5p", "devices": 8})))
    assert gpu["host_launch_s"] == HOST_LAUNCH_S == 10e-6
    assert tpu["training"]["host_launch_s"] == 0.0
