"""Write the nccl-tests fixtures of tests/test_calibrate.py (run from the repository root:
``PYTHONPATH=$PWD python tests/data/nccl-tests/generate.py``).

The logs are in the layout nccl-tests prints (see simulator/interop/nccl_tests.py), made for the
tests, not copied from a run: the times are stepsim's simulated collective times on
``dgx-h100`` under the network calibration :data:`TRUE` below, so that fitting them must give
:data:`TRUE` back. The large-size figures are those of real 8 x H100 machines: all-reduce
busbw about 480 GB/s with NVLink SHARP (S. Jeaugey, NVIDIA/nccl-tests issue #212).
``tests/test_calibrate.py`` checks that running this script reproduces the files byte for byte.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: The calibration the logs are made with (what the fit must recover).
TRUE_EFFICIENCY = {"nvlink": 0.80, "nic": 0.85, "fabric": 0.85}
TRUE_OVERHEAD_S = {"nvlink": 3e-6, "nic": 5e-6, "fabric": 5e-6}

#: (file, op, devices, host names, mpirun tag prefix, minBytes, maxBytes)
LOGS = (
    ("all_reduce_perf_8xH100.txt", "all-reduce", 8, ("dgx-a01",), False, 1024, 8 << 30),
    ("all_gather_perf_16xH100.txt", "all-gather", 16, ("dgx-a01", "dgx-a02"), True, 1 << 16, 4 << 30),
)


def true_calibration():
    from simulator.network.calibration import default_calibration

    return default_calibration("hopper").with_overrides(efficiency=TRUE_EFFICIENCY, message_overhead_s=TRUE_OVERHEAD_S)


def render(op: str, devices: int, hosts, tagged: bool, lo: int, hi: int) -> str:
    from simulator.interop.nccl_tests import BINARY_OF_OP, _fmt_time
    from simulator.studies.bench import collective_sweep, size_range
    from topologies.presets import build_cluster, cluster_preset

    topo = build_cluster(cluster_preset("dgx-h100", devices=devices))
    rows = collective_sweep(op, topo, list(range(devices)), size_range(lo, hi, 4), calibration=true_calibration())
    per_host = devices // len(hosts)
    pids = [211873 + 7 * i for i in range(devices)]
    bus = ["0x18", "0x2a", "0x3a", "0x5d", "0x9a", "0xab", "0xba", "0xdb"]
    out = [
        f"$ mpirun -np {devices} --map-by ppr:{per_host}:node ./build/{BINARY_OF_OP[op]} -b {lo} -e {hi} -f 4 -g 1",
        f"# nThread 1 nGpus 1 minBytes {lo} maxBytes {hi} step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 "
        "validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    for r in range(devices):
        out.append(
            f"#  Rank {r:2d} Group  0 Pid {pids[r]:6d} on {hosts[r // per_host]:>10s} device {r % per_host:2d} "
            f"[{bus[r % per_host]}] NVIDIA H100 80GB HBM3"
        )
    out.append("NCCL version 2.21.5+cuda12.4")
    out += [
        "#",
        "#                                                              out-of-place                       in-place          ",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ",
    ]
    per_rank = op in ("all-gather", "reduce-scatter", "all-to-all")
    redop = "sum" if op in ("all-reduce", "reduce-scatter") else "none"
    for i, r in enumerate(rows):
        size = int(r["size_bytes"])
        t_us = r["time_s"] * 1e6
        # in place: a fixed +-0.6 % so that the two column groups differ as on real machines
        t_ip = t_us * (1.006 if i % 2 else 0.994)
        factor = r["busbw_bytes_per_s"] / r["algbw_bytes_per_s"]
        cells = []
        for t in (t_us, t_ip):
            tt = float(_fmt_time(t))  # algbw from the printed time, as nccl-tests computes it from its own
            alg = size / (tt * 1e-6) / 1e9
            cells.append(f"{_fmt_time(t)} {alg:7.2f} {alg * factor:7.2f} {0:6d}")
        out.append(
            f"{size:12d}  {size // 4 // (devices if per_rank else 1):12d}     float  {redop:>6s}      -1"
            f"  {cells[0]}  {cells[1]}"
        )
        if tagged and i == 2:
            out.append(
                f"{hosts[0]}:{pids[0]}:{pids[0] + 91} [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0"
            )
    out.append("# Out of bounds values : 0 OK")
    busbws = [float(line.split()[7]) for line in out if line[:1] == " " or line[:1].isdigit()]
    out.append(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.3f} ")
    out.append("#")
    if tagged:
        out = [line if line.startswith("$") else f"[1,0]<stdout>:{line}" for line in out]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    target = Path(argv[0]) if argv else HERE
    for name, op, devices, hosts, tagged, lo, hi in LOGS:
        (target / name).write_text(render(op, devices, hosts, tagged, lo, hi))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
