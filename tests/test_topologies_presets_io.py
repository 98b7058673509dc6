"""Presets, cluster building, file round-trips and plots of :mod:`topologies`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from matplotlib.figure import Figure

from topologies import (
    CLUSTER_PRESETS,
    ClusterSpec,
    SwitchedNetwork,
    TopologyError,
    TorusNetwork,
    UnknownPresetError,
    build_cluster,
    cluster_preset,
    get_chip,
    load_topology,
    plot_topology,
    save_topology,
    torus_shape_for,
)


# ---- presets -------------------------------------------------------------------------------
def test_every_preset_builds_at_its_default_size():
    expected = {
        "dgx-a100",
        "dgx-h100",
        "h800",
        "dgx-b200",
        "gb200-nvl72",
        "gb300-nvl72",
        "tpu-v4",
        "tpu-v5e",
        "tpu-v5p",
        "tpu-v6e",
        "tpu-v7",
    }
    assert expected == set(CLUSTER_PRESETS)
    for name, preset in CLUSTER_PRESETS.items():
        spec = cluster_preset(name)
        assert spec.devices == preset.default_devices and spec.chip == get_chip(preset.chip)
        assert preset.source
        if name in ("tpu-v5e", "tpu-v6e", "gb200-nvl72", "dgx-a100"):  # the small ones
            assert build_cluster(spec).n_devices == spec.devices


def test_gpu_preset_values():
    h800 = cluster_preset("h800", 64)
    assert h800.network.domain_bw_bytes_per_s == 200e9  # 400 GB/s bidirectional
    assert h800.network.nic_bw_bytes_per_s == 50e9  # 400 Gb/s IB per GPU
    assert h800.network.domain_size == 8 and h800.chip.name == "h800"
    assert cluster_preset("gb200-nvl72").network.domain_size == 72
    # GB300 NVL72: the GB200 rack's NVLink domain and tensor rates (the two datasheets' dense FP8
    # a GPU are equal), 20.7 TB of HBM3e / 72, and a ConnectX-8 800 Gb/s NIC a GPU (twice GB200's)
    gb200, gb300 = cluster_preset("gb200-nvl72"), cluster_preset("gb300-nvl72")
    assert gb300.network.domain_size == 72 and gb300.network.nic_bw_bytes_per_s == 100e9
    assert gb300.network.domain_bw_bytes_per_s == gb200.network.domain_bw_bytes_per_s
    assert gb300.chip.peak_flops_per_s == gb200.chip.peak_flops_per_s and gb300.chip.hbm_bytes == 287.5e9
    assert gb300.network.nic_bw_bytes_per_s == 2 * gb200.network.nic_bw_bytes_per_s
    assert cluster_preset("dgx-a100", 16).network.nic_bw_bytes_per_s == 25e9
    topo = build_cluster(cluster_preset("dgx-h100", 64))
    assert topo.nvls and not topo.sharp and topo.n_devices == 64


def test_tpu_preset_shapes_and_pods():
    v5p = cluster_preset("tpu-v5p", 6144)
    assert v5p.network.shape == (16, 16, 24) and v5p.network.wrap == (True, True, True)
    assert v5p.network.link_bw_bytes_per_s == 90e9 and v5p.pods is None
    v5e = cluster_preset("tpu-v5e", 64)
    assert v5e.network.shape == (8, 8) and v5e.network.wrap == (False, False)
    assert cluster_preset("tpu-v6e").network.wrap == (True, True)
    two = cluster_preset("tpu-v6e", 512)
    assert two.network.shape == (16, 16) and two.pods.count == 2
    assert two.pods.dcn_bw_bytes_per_s == 12.5e9
    topo = build_cluster(two)
    assert topo.n_pods == 2 and topo.torus_shape == (16, 16) and topo.n_devices == 512
    big = cluster_preset("tpu-v5p", 16384)  # 8192 does not fit axes <= 28: 4 pods
    assert big.pods.count == 4 and big.network.shape == (16, 16, 16)


def test_torus_shape_for():
    assert torus_shape_for(8, 3) == (2, 2, 2)
    assert torus_shape_for(64, 3) == (4, 4, 4)
    assert torus_shape_for(6144, 3) == (16, 16, 24)
    assert torus_shape_for(8960, 3, 28) == (16, 20, 28)
    assert torus_shape_for(9216, 3) == (16, 24, 24)
    assert torus_shape_for(256, 2, 16) == (16, 16)
    with pytest.raises(TopologyError) as err:
        torus_shape_for(17, 2, 16)
    assert err.value.field == "cluster.devices"


def test_preset_overrides_and_errors():
    spec = cluster_preset("dgx-h100", 16, network={"nic_bw_bytes_per_s": 5e9})
    assert spec.network.nic_bw_bytes_per_s == 5e9 and spec.network.domain_bw_bytes_per_s == 450e9
    spec = cluster_preset("tpu-v5p", 64, network={"link_latency_s": 2e-6}, chip={"hbm_bytes": 1e9})
    assert spec.network.shape == (4, 4, 4) and spec.network.link_latency_s == 2e-6
    assert spec.chip.hbm_bytes == 1e9 and spec.chip.peak("bf16") == 459e12
    with pytest.raises(UnknownPresetError, match="dgx-h100") as err:
        cluster_preset("dgx-h1000")
    assert err.value.field == "cluster.preset"
    with pytest.raises(TopologyError, match="allowed") as err:
        cluster_preset("dgx-h100", 16, network={"nic_gbps": 5})
    assert err.value.field == "cluster.network.nic_gbps"
    # 13 devices fill neither whole 8-GPU nodes nor 2 nodes equally: refused, naming the setting.
    with pytest.raises(TopologyError, match="set cluster.devices_per_domain") as err:
        cluster_preset("dgx-h100", 13)
    assert err.value.field == "cluster.devices"
    with pytest.raises(TopologyError) as err:
        cluster_preset("tpu-v5e", 1001)
    assert err.value.field == "cluster.devices"


def test_cluster_spec_and_build_cluster_refuse_misfits():
    with pytest.raises(TopologyError, match="torus shape") as err:
        build_cluster(ClusterSpec("x", 20, get_chip("tpu-v4"), TorusNetwork((4, 4), 45e9)))
    assert err.value.field == "cluster.devices"
    with pytest.raises(TopologyError) as err:
        ClusterSpec("x", 8, get_chip("h100"), SwitchedNetwork(8, 450e9, -1.0))
    assert err.value.field == "cluster.network.nic_bw_bytes_per_s"
    with pytest.raises(TopologyError, match="wraparound"):
        TorusNetwork((4, 4), 45e9, wraparound=(True,))


def test_large_switched_cluster_builds_and_routes():
    topo = build_cluster(cluster_preset("dgx-h100", 16384))
    assert topo.n_devices == 16384
    assert len(topo.route(0, 16383)) == 4 and len(topo.route(0, 8)) == 2


# ---- io --------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".json", ".graphml"])
@pytest.mark.parametrize("preset, devices", [("tpu-v5e", 512), ("dgx-h100", 32)])
def test_round_trip(tmp_path, suffix, preset, devices):
    topo = build_cluster(cluster_preset(preset, devices))
    path = tmp_path / f"topo{suffix}"
    save_topology(topo, path)
    back = load_topology(path)
    assert back.name == topo.name and back.kind == topo.kind
    assert back.n_links == topo.n_links and back.link_kind == topo.link_kind
    assert np.array_equal(back.link_capacity, topo.link_capacity)
    assert np.array_equal(back.link_latency, topo.link_latency)
    assert back.torus_shape == topo.torus_shape and back.torus_wrap == topo.torus_wrap
    for s, t in [(0, devices - 1), (3, 17), (9, 1)]:
        assert back.route(s, t) == topo.route(s, t)
    if topo.kind == "torus":
        assert back.torus_coords(17) == topo.torus_coords(17)


def _saved(tmp_path):
    topo = build_cluster(cluster_preset("dgx-h100", 16))
    path = tmp_path / "t.json"
    save_topology(topo, path)
    return path, json.loads(path.read_text())


def test_bad_files_raise_topology_error(tmp_path):
    path, doc = _saved(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TopologyError, match="not valid JSON"):
        load_topology(bad)
    doc["edges"][0]["bw_bytes_per_s"] = -1
    bad.write_text(json.dumps(doc))
    with pytest.raises(TopologyError, match=r"bad\.json.*edge .*bw_bytes_per_s=-1"):
        load_topology(bad)
    _, doc = _saved(tmp_path)
    doc["edges"] = [e for e in doc["edges"] if "d5" not in (e["source"], e["target"])]
    bad.write_text(json.dumps(doc))
    with pytest.raises(TopologyError, match="device 'd5' is unreachable"):
        load_topology(bad)
    _, doc = _saved(tmp_path)
    del doc["edges"][3]["latency_s"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(TopologyError, match="lacks the 'latency_s' attribute"):
        load_topology(bad)
    _, doc = _saved(tmp_path)
    del doc["nodes"][0]["kind"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(TopologyError, match="'kind' attribute"):
        load_topology(bad)
    with pytest.raises(TopologyError, match="allowed: .json, .graphml"):
        load_topology(tmp_path / "t.yaml")
    with pytest.raises(TopologyError, match="cannot read"):
        load_topology(tmp_path / "missing.graphml")


# ---- plot ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "preset, devices", [("tpu-v5e", 512), ("tpu-v5p", 64), ("dgx-h100", 32), ("dgx-h100", 1024), ("gb200-nvl72", 144)]
)
def test_plot_writes_png(tmp_path, preset, devices):
    topo = build_cluster(cluster_preset(preset, devices))
    path = tmp_path / "topo.png"
    fig = plot_topology(topo, path)
    assert isinstance(fig, Figure)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_gb300_memory_holds_the_layout_megatron_bridge_runs_there_and_gb200s_does_not():
    """Published: Megatron-Bridge v0.6.0 runs DeepSeek-V3 in MXFP8 on 256 GB300 as PP2 VP8 EP32
    without recomputation (perf_recipes/deepseek/gb300/deepseek_v3.py, deepseek_v3_pretrain_256gpu_gb300_
    fp8mx_config; 6,288 tokens/s/GPU in docs/performance-summary.md at 067f987, 26.08), and on GB200
    as PP4 VP4 EP64 recomputing MLA's up projections. The GB300 layout fits the preset's 287.5 GB a
    GPU and not GB200's 186 GB."""
    from pathlib import Path

    from simulator import load_scenario, simulate
    from simulator.scenario.loading import read_mapping

    root = Path(__file__).resolve().parents[1]
    case = read_mapping(root / "validation" / "nemo-perf" / "mbridge-deepseek-v3-256xgb300-mxfp8-2608.yaml")
    scenario = {k: case[k] for k in ("name", "model", "cluster", "parallel", "schedule", "training")}
    on_gb300 = simulate(load_scenario(scenario)).summary
    scenario["cluster"] = {**scenario["cluster"], "preset": "gb200-nvl72"}
    on_gb200 = simulate(load_scenario(scenario)).summary
    assert not on_gb300["oom"] and 186e9 < on_gb300["peak_memory_bytes"] < 287.5e9
    assert on_gb200["oom"]
