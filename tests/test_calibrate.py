"""`stepsim calibrate`: fitting the roofline and link parameters to measured timings."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import yaml

from simulator.cli.validate import main as cli_main
from simulator.engine.compute import DEFAULT_COMPUTE_CALIBRATION, kernel_time_s
from simulator.network.calibration import default_calibration
from simulator.scenario.loading import load_scenario
from simulator.studies import calibrate as c
from simulator.studies.bench import collective_time_s
from topologies.chips import get_chip
from topologies.presets import build_cluster, cluster_preset
from workloads.kernels import Kernel

TRUE = DEFAULT_COMPUTE_CALIBRATION["hopper"].with_(
    gemm_efficiency=0.66, gemm_dim_half=180.0, attention_efficiency=0.47, memory_efficiency=0.81, launch_overhead_s=6e-6
)


def _kernels():
    ks = []
    for m, n, k in [
        (8192, 8192, 8192),
        (4096, 12288, 3072),
        (2048, 1024, 4096),
        (256, 8192, 8192),
        (128, 4096, 4096),
        (16384, 2048, 512),
        (64, 1024, 1024),
        (1024, 1024, 64),
    ]:
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
    assert set(fit.fitted) == {
        "gemm_efficiency",
        "gemm_dim_half",
        "attention_efficiency",
        "memory_efficiency",
        "launch_overhead_s",
    }
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
    from stepsim_fileio import load_yaml  # as a scenario file is read (YAML 1.2 numbers: 6e-06)

    mapping = load_yaml(text[text.index("compute:") :].split("\n#")[0])
    sc = load_scenario(
        {
            "model": "llama3-8b",
            "cluster": {"preset": "dgx-h100", "devices": 8},
            "parallel": {"tp": 8},
            "training": {"global_batch_size": 8},
            **mapping,
        }
    )
    assert dict(sc.compute_overrides)["gemm_efficiency"] == pytest.approx(0.66, rel=1e-3)
    assert out.exists()


@pytest.mark.parametrize(
    "text, message",
    [
        ("kind,m,n,k,flops\n", "missing column"),
        ("kind,time_s\nconv,1e-3\n", "kind 'conv' not allowed"),
        ("kind,flops,time_s\ngemm,1e9,-1\n", "time_s"),
    ],
)
def test_bad_kernel_files_name_the_problem(tmp_path, text, message):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(c.CalibrationInputError, match=message):
        c.read_kernels(p)


@pytest.mark.slow
def test_network_fit_recovers_link_efficiency_and_overhead(tmp_path):
    spec = cluster_preset("dgx-h100", devices=16)
    topo = build_cluster(spec)
    # 16-GPU all-gathers run the rail ring, bound by min(NVLink ring, 8 NICs): with NICs at 0.6
    # (8 x 0.6 x 50 = 240 GB/s < 0.7 x 450 = 315 GB/s) the NICs bind and their efficiency shows
    true = default_calibration("hopper").with_overrides(
        efficiency={"nvlink": 0.7, "nic": 0.6, "fabric": 0.6},
        message_overhead_s={"nvlink": 4e-6, "nic": 8e-6, "fabric": 8e-6},
    )
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


def test_network_fit_takes_all_to_alls_as_their_own_efficiency():
    """alltoall_perf rows fit ``a2a_efficiency`` on top of the bulk rates fitted from the
    other rows (here all-gathers), not the bulk efficiency itself: synthetic timings at a
    known truth (bulk NVLink 0.7, all-to-all 0.6 of it inside a node, 0.8 across nodes)."""
    spec = cluster_preset("dgx-h100", devices=16)
    topo = build_cluster(spec)
    true = default_calibration("hopper").with_overrides(
        efficiency={"nvlink": 0.7},
        message_overhead_s={"nvlink": 4e-6},
        a2a_efficiency={"nvlink": 0.6, "nic": 0.8, "fabric": 0.8},
    )
    rows = []
    for size in (1 << 20, 1 << 24, 1 << 28):
        rows.append(
            c.CollectiveTiming(
                "all-gather", 8, size, collective_time_s("all-gather", topo, list(range(8)), size, calibration=true)[0]
            )
        )
        for n in (8, 16):
            t, _ = collective_time_s("all-to-all", topo, list(range(n)), size, calibration=true)
            rows.append(c.CollectiveTiming("all-to-all", n, size, t))
    fit = c.fit_network(rows, "dgx-h100")
    assert [l.kind for l in fit.links] == ["nvlink"] and fit.links[0].efficiency == pytest.approx(0.7, rel=0.02)
    by = {a.kind: a for a in fit.a2a}
    assert by["nvlink"].a2a_efficiency == pytest.approx(0.6, rel=0.02) and by["nvlink"].rows == 3
    assert by["nic"].a2a_efficiency == pytest.approx(0.8, rel=0.02) and by["nic"].rows == 3
    got = c.network_overrides(fit)
    assert got["a2a_efficiency"] == {
        "fabric": pytest.approx(0.8, rel=0.02),
        "nic": pytest.approx(0.8, rel=0.02),
        "nvlink": pytest.approx(0.6, rel=0.02),
    }
    assert "a2a_efficiency" in c.scenario_block(network=fit) and "all-to-all" in fit.describe()


# ---- real formats: Kineto traces and nccl-tests logs --------------------------------------

import importlib.util
import json
from pathlib import Path

from simulator.cli.app import main as stepsim
from simulator.interop import kineto as kineto_io
from simulator.interop import nccl_tests as nccl_tests_io

DATA = Path(__file__).parent / "data"
KINETO = DATA / "kineto" / "h100_llama_layer.json"
AR_LOG = DATA / "nccl-tests" / "all_reduce_perf_8xH100.txt"
AG_LOG = DATA / "nccl-tests" / "all_gather_perf_16xH100.txt"


def _generator(folder):
    spec = importlib.util.spec_from_file_location(f"gen_{folder}", DATA / folder / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kineto_shapes_from_linked_operators():
    # Closed forms: an 8192^3 bf16 GEMM is 2*8192^3 = 1.0995e12 FLOPs and moves three 8192^2
    # bf16 matrices; flash attention forward 4*b*s^2*h*d (workloads/counts.py convention).
    got = kineto_io.read_kineto(KINETO)
    by_name = {t.kernel.name: t for t in got.timings}
    g = by_name["aten::mm 8192x8192x8192"]
    assert (g.kernel.kind, g.dtype, g.kernel.flops, g.kernel.bytes) == (
        "gemm",
        "bf16",
        2.0 * 8192**3,
        3.0 * 8192**2 * 2,
    )
    # H100 SXM cuBLAS 8192^3 bf16: ~1.4 ms (~750 of 989 TFLOP/s); the fixture's 1.459 ms
    assert g.time_s == pytest.approx(1.459e-3, rel=2e-3)
    a = by_name["aten::_flash_attention_forward b1 h32 sq4096 sk4096 d128"]
    assert a.kernel.flops == 4.0 * 4096 * 4096 * 32 * 128
    # the backward launches three kernels; their durations add up to one call
    b = next(t for t in got.timings if t.kernel.name.startswith("aten::_flash_attention_backward"))
    assert b.kernel.flops == 2 * a.kernel.flops
    # fp8 _scaled_mm -> fp8 GEMMs; the linear -> matmul -> mm chain ends at aten::mm
    assert {t.dtype for t in got.timings if t.kernel.name.startswith("aten::_scaled_mm")} == {"fp8"}
    # backward GEMM kernels carry no External id: linked through their launch's correlation
    assert "aten::mm 4096x4096x14336" in by_name and "aten::mm 14336x4096x4096" in by_name
    # 60 kernels: the NCCL one is left out, the memcpy is not a kernel
    assert got.kernels_used == 59 and got.skipped == {"nccl:all_reduce": 1}


def test_kineto_flow_link_when_kernel_has_no_external_id(tmp_path):
    # A kernel with only its correlation, whose launch is found through the ac2g flow
    # (no runtime event args): the innermost operator around the flow start is used.
    ev = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::linear",
            "pid": 1,
            "tid": 1,
            "ts": 0.0,
            "dur": 50.0,
            "args": {
                "External id": 1,
                "Input Dims": [[64, 256], [512, 256], []],
                "Input type": ["c10::BFloat16"] * 2 + [""],
            },
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::t",
            "pid": 1,
            "tid": 1,
            "ts": 2.0,
            "dur": 3.0,
            "args": {"External id": 2, "Input Dims": [[512, 256]], "Input type": ["c10::BFloat16"]},
        },
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 77, "pid": 1, "tid": 1, "ts": 10.0},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "gemm",
            "pid": 0,
            "tid": 7,
            "ts": 60.0,
            "dur": 12.5,
            "args": {"correlation": 77, "device": 0, "stream": 7},
        },
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    (t,) = kineto_io.read_kineto(p).timings
    assert (t.kernel.m, t.kernel.n, t.kernel.k, t.time_s) == (64, 512, 256, pytest.approx(12.5e-6))


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"traceEvents": 3}, "traceEvents"),
        (
            {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 1, "args": {}}]},
            "no GPU kernel could be linked",
        ),
    ],
)
def test_bad_kineto_traces_name_the_problem(tmp_path, doc, message):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=message):
        kineto_io.read_kineto(p)


def test_kineto_fixture_fit_recovers_the_parameters_that_made_it():
    gen = _generator("kineto")
    assert (DATA / "kineto" / "h100_llama_layer.json").read_text() == gen.render()  # fixture up to date
    fit = c.fit_compute(kineto_io.read_kineto(KINETO).timings, "hopper")
    assert set(fit.fitted) == set(gen.TRUE)
    for k, v in gen.TRUE.items():
        assert getattr(fit.calibration, k) == pytest.approx(v, rel=1e-3), k
    assert fit.max_abs_error < 1e-3


def test_nccl_tests_reader_reads_real_layouts():
    ar = nccl_tests_io.read_nccl_tests(AR_LOG)
    assert (ar.op, ar.devices, len(ar.rows)) == ("all-reduce", 8, 12)
    big = ar.rows[-1]
    # 8 x H100 NVLS all-reduce: busbw ~480 GB/s at large sizes (nccl-tests issue #212)
    assert big.size_bytes == 4 << 30 and 440e9 < big.busbw_bytes_per_s < 500e9
    # busbw = algbw * 2(n-1)/n (nccl-tests PERFORMANCE.md), as printed
    assert big.busbw_bytes_per_s == pytest.approx(big.algbw_bytes_per_s * 2 * 7 / 8, rel=1e-3)
    assert big.algbw_bytes_per_s == pytest.approx(big.size_bytes / big.time_s, rel=1e-3)
    ag = nccl_tests_io.read_nccl_tests(AG_LOG)  # mpirun [1,0]<stdout>: tags and an NCCL INFO line
    assert (ag.op, ag.devices, len(ag.rows), ag.rows[0].redop) == ("all-gather", 16, 9, "none")


def test_nccl_tests_reader_old_layout_and_overrides(tmp_path):
    # nccl-tests before 2.10: no root column, 'error' instead of '#wrong' (issue #107's layout)
    p = tmp_path / "log.txt"
    p.write_text(
        "#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error\n"
        "#        (B)    (elements)                       (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n"
        "     1048576        262144     float     sum    40.00   26.21   39.32  0e+00    40.50   25.89   38.83  0e+00\n"
    )
    with pytest.raises(nccl_tests_io.NcclTestsError, match="cannot tell which collective"):
        nccl_tests_io.read_nccl_tests(p)
    with pytest.raises(nccl_tests_io.NcclTestsError, match="Rank"):
        nccl_tests_io.read_nccl_tests(p, op="all-reduce")
    log = nccl_tests_io.read_nccl_tests(p, op="all_reduce_perf", default_devices=4)
    (r,) = log.rows
    assert (log.op, log.devices, r.size_bytes, r.time_s, r.in_place_time_s) == (
        "all-reduce",
        4,
        1048576,
        pytest.approx(40e-6),
        pytest.approx(40.5e-6),
    )
    p.write_text(p.read_text().replace("40.00", "abc"))
    with pytest.raises(nccl_tests_io.NcclTestsError, match=r"log.txt:3: column 'time'"):
        nccl_tests_io.read_nccl_tests(p, op="all-reduce", default_devices=4)


@pytest.mark.slow
def test_nccl_tests_fixture_fit_recovers_link_efficiency_and_overhead():
    gen = _generator("nccl-tests")
    for name, *args in gen.LOGS:
        assert (DATA / "nccl-tests" / name).read_text() == gen.render(*args)  # fixture up to date
    rows = [t for p in (AR_LOG, AG_LOG) for t in nccl_tests_io.read_nccl_tests(p).timings()]
    fit = c.fit_network(rows, "dgx-h100")
    got = c.network_overrides(fit)
    for k, v in gen.TRUE_EFFICIENCY.items():
        assert got["efficiency"][k] == pytest.approx(v, rel=2e-3), k
    for k, v in gen.TRUE_OVERHEAD_S.items():
        assert got["message_overhead_s"][k] == pytest.approx(v, rel=2e-2), k


@pytest.mark.slow
def test_calibrate_command_writes_a_block_a_scenario_runs(tmp_path, capsys):
    out = tmp_path / "cal.yaml"
    assert (
        stepsim(
            [
                "calibrate",
                "--kineto",
                str(KINETO),
                "--nccl-tests",
                str(AR_LOG),
                "--family",
                "hopper",
                "--cluster",
                "dgx-h100",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    block = yaml.safe_load(out.read_text())
    assert yaml.safe_load(printed.split("# wrote")[0]) == block
    assert set(block) == {"compute", "network_calibration"}
    assert block["compute"]["gemm_efficiency"] == pytest.approx(0.80, rel=1e-3)
    assert block["network_calibration"]["efficiency"]["nvlink"] == pytest.approx(0.80, rel=2e-3)
    scenario = tmp_path / "sc.yaml"
    scenario.write_text(
        "model: llama3-8b\ncluster: {preset: dgx-h100, devices: 8}\nparallel: {tp: 8}\n"
        "training: {global_batch_size: 8, seq_len: 2048}\n" + out.read_text()
    )
    sc = load_scenario(scenario)
    assert dict(sc.network_calibration().efficiency)["nvlink"] == pytest.approx(0.80, rel=2e-3)
    assert stepsim(["run", str(scenario), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["step_time_s"] > 0


def test_calibrate_command_bad_input_exits_2(tmp_path, capsys):
    p = tmp_path / "x.txt"
    p.write_text("hello\n")
    assert stepsim(["calibrate", "--nccl-tests", str(p), "--nccl-op", "all-reduce"]) == 2
    assert "no nccl-tests column header" in capsys.readouterr().err
    assert stepsim(["calibrate"]) == 2


def test_collective_nccl_tests_format_round_trips(capsys):
    assert (
        stepsim(
            [
                "collective",
                "all-gather",
                "--cluster",
                "dgx-h100",
                "--devices",
                "8",
                "--min-bytes",
                "1M",
                "--max-bytes",
                "64M",
                "--format",
                "nccl-tests",
                "--dtype",
                "bfloat16",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    header = next(l for l in text.splitlines() if "size" in l and "count" in l)
    assert header.split()[1:] == [
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong",
    ]
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    log = nccl_tests_io.read_nccl_tests(f.name)
    Path(f.name).unlink()
    assert (log.op, log.devices, [r.size_bytes for r in log.rows]) == ("all-gather", 8, [1 << s for s in range(20, 27)])
    first = log.rows[0]
    # count per rank for all_gather (nccl-tests AllGatherGetCollByteCount), 2-byte bfloat16
    assert (first.count, first.dtype, first.redop, first.root) == ((1 << 20) // 2 // 8, "bfloat16", "none", -1)
    topo = build_cluster(cluster_preset("dgx-h100", devices=8))
    for r in log.rows:
        t, _ = collective_time_s(
            "all-gather", topo, list(range(8)), r.size_bytes, calibration=default_calibration("hopper")
        )
        assert r.time_s == pytest.approx(t, rel=5e-3)  # printed to 3-4 significant digits
        assert r.busbw_bytes_per_s == pytest.approx(r.algbw_bytes_per_s * 7 / 8, rel=1e-2)


@pytest.mark.slow
def test_collective_on_a_calibrated_scenario_reproduces_the_log(tmp_path, capsys):
    # The block fitted to the 8 x H100 all_reduce_perf log, applied by `stepsim collective
    # --cluster SCENARIO`, gives back the log's out-of-place times (to its print precision).
    block = tmp_path / "cal.yaml"
    assert stepsim(["calibrate", "--nccl-tests", str(AR_LOG), "--out", str(block)]) == 0
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("cluster: {preset: dgx-h100, devices: 8}\n" + block.read_text())
    capsys.readouterr()
    assert (
        stepsim(
            [
                "collective",
                "all-reduce",
                "--cluster",
                str(cluster),
                "--min-bytes",
                "1K",
                "--max-bytes",
                "4G",
                "--format",
                "nccl-tests",
            ]
        )
        == 0
    )
    sim = tmp_path / "sim_all_reduce_perf.txt"
    sim.write_text(capsys.readouterr().out)
    measured = nccl_tests_io.read_nccl_tests(AR_LOG).rows
    simulated = {r.size_bytes: r.time_s for r in nccl_tests_io.read_nccl_tests(sim).rows}
    for r in measured:
        assert simulated[r.size_bytes] == pytest.approx(r.time_s, rel=5e-3), r.size_bytes


def test_family_calibrations_are_data_with_a_source_for_every_value():
    """Issue 42: each chip family's calibration is a data file giving every field its value,
    its source and the validation figure it was checked against."""
    import dataclasses
    import json

    from simulator.engine.compute import CALIBRATION_DIR, DEFAULT_COMPUTE_CALIBRATION, calibration_from_document
    from topologies.chips import ComputeCalibration

    names = {f.name for f in dataclasses.fields(ComputeCalibration)} - {"source"}
    for family, cal in DEFAULT_COMPUTE_CALIBRATION.items():
        doc = json.loads((CALIBRATION_DIR / f"compute-{family}.json").read_text())
        assert doc["family"] == family and set(doc["values"]) == names, family
        for name, entry in doc["values"].items():
            assert entry["source"].strip() and entry["checked_against"].strip(), (family, name)
            assert getattr(cal, name) == entry["value"], (family, name)
        assert calibration_from_document(doc, family) == cal
    with pytest.raises(ValueError, match="not a compute calibration"):
        calibration_from_document({"values": {}}, "x.json")
    with pytest.raises(ValueError, match="values must be a mapping of"):
        calibration_from_document({"schema": doc["schema"], "values": {"gemm_eff": {"value": 1}}}, "x.json")


def test_calibrate_writes_the_family_files_schema():
    """``stepsim calibrate --out X.json``'s compute report reads back as a calibration: the
    fitted fields as fitted, the rest the family's."""
    from simulator.engine.compute import DEFAULT_COMPUTE_CALIBRATION, calibration_from_document
    from simulator.interop.kineto import read_kineto
    from simulator.studies.calibrate import fit_compute

    fit = fit_compute(read_kineto(DATA / "kineto" / "h100_llama_layer.json").timings, "hopper")
    back = calibration_from_document(fit.as_dict(), "report")
    assert back.with_(source="") == fit.calibration.with_(source="")
    base = DEFAULT_COMPUTE_CALIBRATION["hopper"]
    assert back.comm_sm_fraction == base.comm_sm_fraction and back.gemm_efficiency != base.gemm_efficiency


def test_network_calibrations_are_data_with_a_source_for_every_value():
    import json

    from simulator.network.calibration import CALIBRATION_DIR, FAMILIES, TABLES, calibration_from_document
    from simulator.network.calibration import default_calibration as net_default

    for family in FAMILIES:
        doc = json.loads((CALIBRATION_DIR / f"network-{family}.json").read_text())
        cal = net_default(family)
        for table in TABLES:
            for key, entry in (doc.get(table) or {}).items():
                assert entry["source"].strip() and entry["checked_against"].strip(), (family, table, key)
                assert getattr(cal, table)[key] == entry["value"]
        assert calibration_from_document(doc, family) == cal


def test_calibrate_writes_the_network_files_schema():
    from simulator.interop import nccl_tests as nt
    from simulator.network.calibration import calibration_from_document

    log = nt.read_nccl_tests(DATA / "nccl-tests" / "all_reduce_perf_8xH100.txt")
    fit = c.fit_network(log.timings(), "dgx-h100", family="hopper")
    back = calibration_from_document(fit.as_dict(), "report")
    assert back.efficiency_of("nvlink") == pytest.approx(c.network_overrides(fit)["efficiency"]["nvlink"])
