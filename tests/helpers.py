"""Small scenarios shared by the tests."""

from __future__ import annotations

import copy

# A model small enough to simulate in well under a second.
TINY_MODEL = {
    "name": "tiny",
    "layers": 4,
    "hidden": 1024,
    "heads": 8,
    "kv_heads": 8,
    "ffn_hidden": 4096,
    "ffn": "gelu",
    "vocab": 8,
    "tied_embeddings": False,
}

# Big enough that a few microseconds of per-message network overhead are noise next
# to a layer's compute (milliseconds), with a vocabulary so small that the embedding
# and LM head are negligible: pipeline stages are then balanced.
BALANCED_MODEL = {
    "name": "balanced",
    "layers": 8,
    "hidden": 4096,
    "heads": 32,
    "kv_heads": 32,
    "ffn_hidden": 16384,
    "ffn": "gelu",
    "vocab": 8,
    "tied_embeddings": False,
}

# A chip whose memory-bound work is free and whose GEMMs run at a fixed efficiency,
# so that compute time is exactly FLOPs / (peak * efficiency).
IDEAL_CHIP = {
    "name": "ideal",
    "peak_flops_per_s": {"bf16": 1e15, "fp8": 2e15},
    "hbm_bytes": 80e9,
    "hbm_bw_bytes_per_s": 1e18,
    "family": "hopper",
}
IDEAL_COMPUTE = {
    "gemm_efficiency": 0.5,
    "attention_efficiency": 0.5,
    "gemm_dim_half": 0.0,
    "launch_overhead_s": 0.0,
    "memory_efficiency": 1.0,
}

FAST_SWITCHED = {
    "kind": "switched",
    "domain_size": 8,
    "domain_bw_bytes_per_s": 1e16,
    "nic_bw_bytes_per_s": 1e16,
    "domain_latency_s": 0.0,
    "nic_latency_s": 0.0,
    "switch_latency_s": 0.0,
}


def scenario(**over) -> dict:
    base = {
        "name": "tiny",
        "model": copy.deepcopy(TINY_MODEL),
        "cluster": {"preset": "dgx-h100", "devices": 8},
        "parallel": {"tp": 1, "pp": 1, "dp": 8},
        "schedule": "1f1b",
        "training": {"seq_len": 1024, "micro_batch_size": 1, "global_batch_size": 16},
    }
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return base


def ideal_scenario(devices: int, **over) -> dict:
    """A scenario on an 'ideal' cluster: free memory traffic, constant GEMM efficiency,
    and a network so fast that communication is negligible."""
    s = scenario(
        model=copy.deepcopy(BALANCED_MODEL),
        cluster={"chip": dict(IDEAL_CHIP), "devices": devices, "network": dict(FAST_SWITCHED)},
        compute=dict(IDEAL_COMPUTE),
        # an ideal host: never behind the GPU (simulator.engine.host)
        training={"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 8, "host_launch_s": 0.0},
    )
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(s.get(k), dict):
            s[k] = {**s[k], **v}
        else:
            s[k] = v
    return s


#: A small MoE whose layouts the search and ppmap tests enumerate exhaustively.
SEARCH_MOE = {
    "name": "tmoe",
    "layers": 4,
    "hidden": 512,
    "heads": 8,
    "kv_heads": 4,
    "ffn_hidden": 2048,
    "vocab": 64,
    "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 256, "shared_experts": 1, "dense_layers": 1},
}


def rerun_engine(res, **options):
    """The engine of ``simulate()``'s result ``res`` run again on its trace and topology
    with the engine ``options`` (e.g. ``reserve_isolated=False``): ``(Engine, RawRun)``."""
    from simulator.engine.compute import calibration_for
    from simulator.engine.loop import Engine

    sc = res.scenario
    chip = sc.cluster.chip
    scale = {d: p.compute_scale for p in sc.perturbations if p.devices is not None for d in p.devices}
    eng = Engine(
        res.trace,
        res.topology,
        sc.layout,
        chip,
        calibration_for(chip, dict(sc.compute_overrides)),
        network_cal=sc.network_calibration(),
        dtype=sc.training.dtype,
        compute_scale=scale,
        algorithms=dict(sc.algorithms),
        host_bw_bytes_per_s=sc.cluster.host_bw_bytes_per_s,
        **{"host_launch_s": sc.training.launch_s(chip.family), **options},
    )
    return eng, eng.run()


def summary_numbers(summary: dict) -> dict:
    """Every number of a summary record, flattened (``key.sub[i]`` -> float), but the run's wall
    time and the ``steady_state`` note: what two ways of simulating one step must agree on."""
    out = {}

    def walk(key, v):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{key}.{k}", x)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(f"{key}[{i}]", x)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = float(v)

    for k, v in summary.items():
        if k not in ("sim_wall_s", "steady_state", "steady_state_try"):
            walk(k, v)
    return out


def start_phases(env, net, phases) -> dict:
    """Start each ``(start_s, transfers)`` of ``phases`` on flow network ``net`` as a simpy
    process; the returned dict fills with phase index -> finish time as they complete."""
    finish: dict = {}

    def proc(i, start, transfers):
        yield env.timeout(start)
        yield net.transfer(transfers)
        finish[i] = env.now

    for i, (start, transfers) in enumerate(phases):
        env.process(proc(i, start, transfers))
    return finish


def assert_same_run(a, b, rel: float = 1e-9) -> None:
    """Two raw runs of one step (``rerun_engine``) agree: step time and every rank's idle time
    by cause to ``rel``, the same number of records and of network phases started."""
    import pytest

    assert a.step_time_s == pytest.approx(b.step_time_s, rel=rel)
    for rank, idle in a.idle.items():
        for cause, seconds in idle.items():
            assert seconds == pytest.approx(b.idle[rank][cause], rel=rel, abs=1e-15), (rank, cause)
    assert len(a.records) == len(b.records)
    assert a.network_stats["phases_started"] == b.network_stats["phases_started"]
