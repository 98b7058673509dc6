"""`stepsim calibrate`: fitting the roofline and link parameters to measured timings."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import yaml

from simulator import calibrate as c
from simulator.bench import collective_time_s
from simulator.cli_validate import main as cli_main
from simulator.compute import DEFAULT_COMPUTE_CALIBRATION, kernel_time_s
from simulator.netcal import default_calibration
from simulator.schema import load_scenario
from topologies.chips import get_chip
from topologies.presets import build_cluster, cluster_preset
from workloads.counts import Kernel

TRUE = DEFAULT_COMPUTE_CALIBRATION["hopper"].with_(
    gemm_efficiency=0.66, gemm_dim_half=180.0, attention_efficiency=0.47, memory_efficiency=0.81,
    launch_overhead_s=6e-6)


def _kernels():
    ks = []
    for m, n, k in [(8192, 8192, 8192), (4096, 12288, 3072), (2048, 1024, 4096), (256, 8192, 8192),
                    (128, 4096, 4096), (16384, 2048, 512), (64, 1024, 1024), (1024, 1024, 64)]:
        ks.append((Kernel("g", "gemm", 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), m, n, k), "bf16"))
    for tokens in (2048, 8192, 32768):
        ks.append((Kernel("a", "attention", 4.0 * tokens * 4096 * 4096, 4.0 * tokens * 4096), "bf16"))
    for nbytes in (1e5, 1e7, 1e9, 4e9):
        ks.append((Kernel("e", "elementwise", nbytes / 4, nbytes), "bf16"))
    return ks


def _write_kernel_csv(path, cal=TRUE):
    chip = get_chip("h100")
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "m", "n", "k", "flops", "bytes", "dtype", "time_s"])
        for k, dtype in _kernels():
            w.writerow([k.kind, k.m, k.n, k.k, k.flops, k.bytes, dtype, kernel_time_s(k, chip, cal, dtype)])
    return path


def test_fit_recovers_the_parameters_that_made_the_timings(tmp_path):
    fit = c.fit_compute(c.read_kernels(_write_kernel_csv(tmp_path / "k.csv")), "hopper")
    got = fit.calibration
    assert set(fit.fitted) == {"gemm_efficiency", "gemm_dim_half", "attention_efficiency", "memory_efficiency",
                               "launch_overhead_s"}
    assert got.gemm_efficiency == pytest.approx(0.66, rel=1e-3)
    assert got.gemm_dim_half == pytest.approx(180.0, rel=1e-2)
    assert got.attention_efficiency == pytest.approx(0.47, rel=1e-3)
    assert got.memory_efficiency == pytest.approx(0.81, rel=1e-3)
    assert got.launch_overhead_s == pytest.approx(6e-6, rel=5e-2)
    assert fit.max_abs_error < 1e-3
    # Nothing informs the fp8 GEMM efficiency: the family default stays.
    assert got.fp8_gemm_efficiency == DEFAULT_COMPUTE_CALIBRATION["hopper"].fp8_gemm_efficiency


def test_noisy_timings_fit_within_the_noise(tmp_path):
    path = _write_kernel_csv(tmp_path / "k.csv")
    rows = list(csv.reader(path.open()))
    rng = np.random.default_rng(0)
    for r in rows[1:]:
        r[-1] = repr(float(r[-1]) * float(rng.uniform(0.97, 1.03)))
    csv.writer(path.open("w", newline="")).writerows(rows)
    fit = c.fit_compute(c.read_kernels(path), "hopper")
    assert fit.calibration.gemm_efficiency == pytest.approx(0.66, rel=0.05)
    assert fit.rms_log_error < 0.03


def test_calibrate_command_prints_a_compute_mapping_a_scenario_accepts(tmp_path, capsys):
    path = _write_kernel_csv(tmp_path / "k.csv")
    out = tmp_path / "cal.json"
    assert cli_main(["calibrate", str(path), "--family", "hopper", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    mapping = yaml.safe_load(text[text.index("compute:"):].split("\n#")[0])
    sc = load_scenario({"model": "llama3-8b", "cluster": {"preset": "dgx-h100", "devices": 8},
                        "parallel": {"tp": 8}, "training": {"global_batch_size": 8}, **mapping})
    assert dict(sc.compute_overrides)["gemm_efficiency"] == pytest.approx(0.66, rel=1e-3)
    assert out.exists()


@pytest.mark.parametrize("text, message", [
    ("kind,m,n,k,flops\n", "missing column"),
    ("kind,time_s\nconv,1e-3\n", "kind 'conv' not allowed"),
    ("kind,flops,time_s\ngemm,1e9,-1\n", "time_s"),
])
def test_bad_kernel_files_name_the_problem(tmp_path, text, message):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(c.CalibrationInputError, match=message):
        c.read_kernels(p)


def test_network_fit_recovers_link_efficiency_and_overhead(tmp_path):
    spec = cluster_preset("dgx-h100", devices=16)
    topo = build_cluster(spec)
    # 16-GPU all-gathers run the rail ring, bound by min(NVLink ring, 8 NICs): with NICs at 0.6
    # (8 x 0.6 x 50 = 240 GB/s < 0.7 x 450 = 315 GB/s) the NICs bind and their efficiency shows
    true = default_calibration("hopper").with_overrides(efficiency={"nvlink": 0.7, "nic": 0.6, "fabric": 0.6},
                                                        message_overhead_s={"nvlink": 4e-6, "nic": 8e-6, "fabric": 8e-6})
    p = tmp_path / "coll.csv"
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["op", "devices", "size_bytes", "time_s"])
        for n in (8, 16):
            for size in (1 << 16, 1 << 20, 1 << 24, 1 << 28):
                t, _ = collective_time_s("all-gather", topo, list(range(n)), size, calibration=true)
                w.writerow(["all-gather", n, size, t])
    fit = c.fit_network(c.read_collectives(p), "dgx-h100")
    by = {l.kind: l for l in fit.links}
    assert by["nvlink"].efficiency == pytest.approx(0.7, rel=0.05)
    assert by["nic"].efficiency == pytest.approx(0.6, rel=0.05)
    assert by["nvlink"].rms_rel_error < 0.05 and by["nic"].rms_rel_error < 0.05
    assert by["nvlink"].message_overhead_s == pytest.approx(4e-6, rel=0.2)
