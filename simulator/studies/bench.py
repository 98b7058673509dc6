"""nccl-tests-style collective benchmarks on the simulated network.

:func:`collective_sweep` simulates one collective per message size, each in a
fresh simpy environment, and reports time, algorithm bandwidth (size / time) and
bus bandwidth (algbw x :func:`~simulator.network.collectives.bus_bandwidth_factor`), the
numbers ``all_reduce_perf`` and friends print. GB/s are 1e9 bytes/s, as there.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import simpy

from simulator.errors import NetworkError
from simulator.network.calibration import NetCalibration
from simulator.network.collectives import bus_bandwidth_factor, plan_collective, run_collective
from simulator.network.flows import FlowNetwork

if TYPE_CHECKING:  # pragma: no cover
    from topologies.topology import Topology

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)


class BenchError(NetworkError):
    """A bad size string or size range."""


def parse_size(text: str | int | float) -> int:
    """Bytes in ``text``: ``'8G'``, ``'512M'``, ``'1.5K'``, ``'64'``, ``'8GB'``, ``'8GiB'``.

    Suffixes are binary (K = 1024), as in nccl-tests' ``-b``/``-e`` options.

    Raises
    ------
    BenchError
        If ``text`` is not a size.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise BenchError(f"size must be >= 0, got {text!r}")
        return int(text)
    m = _SIZE_RE.match(str(text))
    if not m:
        raise BenchError(f"cannot parse size {text!r}; expected a number with an optional K/M/G/T suffix, e.g. '8G'")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def size_range(min_bytes: int | str, max_bytes: int | str, factor: int = 2) -> list[int]:
    """``min, min*factor, ...`` up to ``max`` inclusive (nccl-tests ``-b -e -f``)."""
    lo, hi = parse_size(min_bytes), parse_size(max_bytes)
    if lo < 1 or hi < lo:
        raise BenchError(f"need 1 <= min_bytes <= max_bytes, got {lo} and {hi}")
    if not (isinstance(factor, int) and factor >= 2):
        raise BenchError(f"factor must be an integer >= 2, got {factor!r}")
    out, size = [], lo
    while size <= hi:
        out.append(size)
        size *= factor
    return out


def collective_time_s(
    op: str,
    topo: Topology,
    devices: Sequence[int],
    size_bytes: float,
    algorithm: str | None = None,
    calibration: NetCalibration | None = None,
    scaleout_fraction: float = 1.0,
) -> tuple[float, str]:
    """(seconds, algorithm) of one collective alone on an idle network (``scaleout_fraction``:
    a node-limited all-to-all's, as :func:`~simulator.network.collectives.plan_collective`)."""
    plan = plan_collective(op, devices, size_bytes, topo, algorithm, scaleout_fraction=scaleout_fraction)
    env = simpy.Environment()
    network = FlowNetwork(env, topo, calibration)
    env.process(run_collective(network, plan))
    env.run()
    return env.now, plan.algorithm


def collective_sweep(
    op: str,
    topo: Topology,
    devices: Sequence[int],
    sizes: Sequence[float],
    algorithm: str | None = None,
    calibration: NetCalibration | None = None,
) -> list[dict]:
    """One row per size: ``size_bytes``, ``time_s``, ``algbw_bytes_per_s``,
    ``busbw_bytes_per_s``, ``algorithm``, ``op``, ``n_ranks``."""
    devices = tuple(devices)
    factor = bus_bandwidth_factor(op, len(devices))
    rows = []
    for size in sizes:
        t, algo = collective_time_s(op, topo, devices, size, algorithm, calibration)
        algbw = size / t if t > 0 else float("inf")
        rows.append(
            {
                "op": op,
                "n_ranks": len(devices),
                "size_bytes": size,
                "time_s": t,
                "algbw_bytes_per_s": algbw,
                "busbw_bytes_per_s": algbw * factor,
                "algorithm": algo,
            }
        )
    return rows


def format_table(rows: Sequence[dict]) -> str:
    """The rows as an nccl-tests-like text table (time in us, bandwidths in GB/s)."""
    lines = ["#       size(B)     time(us)   algbw(GB/s)   busbw(GB/s)   algorithm"]
    for r in rows:
        lines.append(
            f"{int(r['size_bytes']):>15d} {r['time_s'] * 1e6:>12.2f} "
            f"{r['algbw_bytes_per_s'] / 1e9:>13.2f} {r['busbw_bytes_per_s'] / 1e9:>13.2f}"
            f"   {r['algorithm']}"
        )
    if rows:
        avg = sum(r["busbw_bytes_per_s"] for r in rows) / len(rows)
        lines.append(f"# Avg bus bandwidth    : {avg / 1e9:.2f} GB/s")
    return "\n".join(lines)


def plot_busbw(rows: Sequence[dict], path: str) -> None:
    """Bus bandwidth against message size (log-log), saved to ``path``; one line per
    (op, algorithm, n_ranks) found in ``rows``."""
    import matplotlib.pyplot as plt  # no backend chosen here: Agg headless, the notebook's in a notebook

    fig, ax = plt.subplots(figsize=(6, 4))
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        series.setdefault((r.get("op", ""), r["algorithm"], r.get("n_ranks", "")), []).append(r)
    for (op, algo, n), rs in series.items():
        rs = sorted(rs, key=lambda r: r["size_bytes"])
        ax.plot(
            [r["size_bytes"] for r in rs],
            [r["busbw_bytes_per_s"] / 1e9 for r in rs],
            marker="o",
            markersize=3,
            label=f"{op} {algo} n={n}",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
