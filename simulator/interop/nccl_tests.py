"""The text output of NVIDIA's nccl-tests (``all_reduce_perf`` and friends): read and write.

What a run prints (nccl-tests 2.x; layout read from the logs posted in NVIDIA/nccl-tests
issues, e.g. #294 on 8 x H100, and from ``src/common.cu``)::

    # nThread 1 nGpus 8 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 ...
    #
    # Using devices
    #  Rank  0 Group  0 Pid  12345 on     node-1 device  0 [0x18] NVIDIA H100 80GB HBM3
    #  ...
    #
    #                                                     out-of-place                       in-place
    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
               8             2     float     sum      -1    40.53    0.00    0.00      0    40.11    0.00    0.00      0
    ...
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 123.456

Older versions have no ``root`` column and an ``error`` column (``0e+00``) instead of
``#wrong``; ``mpirun`` may prefix every line with ``[1,0]<stdout>:`` and NCCL may interleave
``NCCL INFO`` lines. :func:`read_nccl_tests` finds the column header line and reads each
row by the header's column names, so all of these read the same.

The output never names the collective: :func:`read_nccl_tests` takes it from the binary's
name (``all_reduce_perf`` ...) found in the text (a logged command line) or in the file
name, or from the ``op`` argument. The device count is the number of ``Rank`` lines
(``-g`` GPUs x threads x MPI processes), or the ``devices`` argument.

Columns: ``size`` in bytes (for all_gather the whole gathered buffer, for
reduce_scatter the whole input), ``count`` in elements (per rank for all_gather,
reduce_scatter and alltoall), ``time`` in microseconds, ``algbw = size / time`` and
``busbw = algbw x factor`` in GB/s (1e9 B/s); the factors (nccl-tests ``doc/PERFORMANCE.md``):
all_reduce ``2(n-1)/n``; all_gather, reduce_scatter, alltoall ``(n-1)/n``; broadcast,
reduce, sendrecv 1 (:func:`simulator.network.collectives.bus_bandwidth_factor`).

:func:`format_nccl_tests` writes rows of ``stepsim collective`` in the same layout.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from simulator.errors import StudyError

#: nccl-tests binary of each ``stepsim collective`` op.
BINARY_OF_OP = {
    "all-reduce": "all_reduce_perf",
    "all-gather": "all_gather_perf",
    "reduce-scatter": "reduce_scatter_perf",
    "all-to-all": "alltoall_perf",
    "broadcast": "broadcast_perf",
    "send-recv": "sendrecv_perf",
}
OP_OF_BINARY = {v: k for k, v in BINARY_OF_OP.items()}

#: Bytes per element of the nccl-tests data types this module writes (``-d``).
DTYPE_BYTES = {
    "float": 4,
    "bfloat16": 2,
    "half": 2,
    "double": 8,
    "int32": 4,
    "int8": 1,
    "uint8": 1,
    "int64": 8,
    "uint32": 4,
    "uint64": 8,
    "f8e4m3": 1,
    "f8e5m2": 1,
}

#: Ops whose ``count`` column is per rank (nccl-tests ``*GetCollByteCount``: paramcount = count / nranks).
_PER_RANK_COUNT = ("all-gather", "reduce-scatter", "all-to-all")

_PREFIX_RE = re.compile(r"^\s*\[\d+,\d+\]<std(?:out|err)>:")  # mpirun --tag-output
_RANK_RE = re.compile(r"^#\s*Rank\s+(\d+)\b")
_BINARY_RE = re.compile(r"\b(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|sendrecv)_perf\b")
_NUM_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


class NcclTestsError(StudyError):
    """An nccl-tests log that cannot be read (names the file and line)."""


@dataclass(frozen=True)
class NcclTestsRow:
    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int
    time_s: float  # out-of-place
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    in_place_time_s: float | None = None


@dataclass(frozen=True)
class NcclTestsLog:
    op: str  # a ``stepsim collective`` op name (all-reduce ...)
    devices: int
    rows: tuple[NcclTestsRow, ...]
    source: str = ""

    def timings(self):
        """The out-of-place times as :class:`simulator.studies.calibrate.CollectiveTiming` rows."""
        from simulator.studies.calibrate import CollectiveTiming

        return [CollectiveTiming(self.op, self.devices, float(r.size_bytes), r.time_s) for r in self.rows]


def _strip(line: str) -> str:
    return _PREFIX_RE.sub("", line.rstrip("\r\n"), count=1)


def _op_from(text: str, name: str) -> str | None:
    found = {m.group(1) for m in _BINARY_RE.finditer(text)}
    if len(found) == 1:
        return OP_OF_BINARY[found.pop() + "_perf"]
    m = _BINARY_RE.search(name)
    if m:
        return OP_OF_BINARY[m.group(1) + "_perf"]
    if len(found) > 1:
        raise NcclTestsError(
            f"{name}: names several nccl-tests binaries ({', '.join(sorted(found))}); "
            "give one log per binary, or name the op"
        )
    return None


def read_nccl_tests(
    path: str | Path,
    op: str | None = None,
    devices: int | None = None,
    default_devices: int | None = None,
) -> NcclTestsLog:
    """Read an nccl-tests log (see the module notes).

    ``op`` (``all-reduce`` ..., or the binary name ``all_reduce_perf``) and ``devices``
    override what the log says; ``default_devices`` is used when it lists no ranks. Rows whose time is not a positive number are refused
    naming the line; a log without a column header or rows is refused.

    Raises
    ------
    NcclTestsError
        Naming the file (and line) and what is wrong.
    """
    from stepsim_fileio import read_text

    p = Path(path)
    text = read_text(p, 256 * 2**20, what="nccl-tests log")
    name = str(p)
    if op is not None:
        key = op.strip().lower()
        key = OP_OF_BINARY.get(key if key.endswith("_perf") else key + "_perf", key)
        if key not in BINARY_OF_OP:
            raise NcclTestsError(
                f"op: {op!r} not allowed; choose from {', '.join(BINARY_OF_OP)} or {', '.join(OP_OF_BINARY)}"
            )
        the_op = key
    else:
        the_op = _op_from(text, p.name)
        if the_op is None:
            raise NcclTestsError(
                f"{name}: cannot tell which collective this log measured (nccl-tests does not "
                "print it): name the file after the binary (all_reduce_perf.txt ...) or give "
                f"the op (--nccl-op; one of {', '.join(BINARY_OF_OP)})"
            )
    ranks: set[int] = set()
    header: list[str] | None = None
    rows: list[NcclTestsRow] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _strip(raw)
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            m = _RANK_RE.match(s)
            if m:
                ranks.add(int(m.group(1)))
            words = s.lstrip("#").split()
            if words[:2] == ["size", "count"]:
                header = words
            continue
        if header is None:
            continue  # NCCL INFO lines, the "NCCL version" line, ...
        parts = s.split()
        if not parts or not parts[0].isdigit():
            continue  # an interleaved NCCL INFO line
        rows.append(_row(parts, header, f"{name}:{lineno}"))
    if header is None:
        raise NcclTestsError(
            f"{name}: no nccl-tests column header ('#  size  count  type ...') found; "
            "is this the output of an nccl-tests binary?"
        )
    if not rows:
        raise NcclTestsError(f"{name}: a column header but no result rows")
    n = devices if devices is not None else (len(ranks) or default_devices)
    if n is None or n < 2:
        if n is None:
            raise NcclTestsError(
                f"{name}: no '#  Rank N ...' lines to count the devices from; give the device count (--devices)"
            )
        raise NcclTestsError(f"{name}: devices must be >= 2 for a collective, got {n}")
    return NcclTestsLog(the_op, int(n), tuple(rows), name)


def _num(word: str, col: str, where: str) -> float:
    if not _NUM_RE.match(word):
        raise NcclTestsError(f"{where}: column {col!r}: not a number: {word!r}")
    v = float(word)
    if not math.isfinite(v):
        raise NcclTestsError(f"{where}: column {col!r}: not finite: {word!r}")
    return v


def _row(parts: list[str], header: list[str], where: str) -> NcclTestsRow:
    # Header words: size count type [redop] [root] time algbw busbw (#wrong|error) time algbw busbw (#wrong|error)
    lead = [h for h in header[: header.index("time")]] if "time" in header else []
    if len(lead) < 3 or len(parts) < len(lead) + 3:
        raise NcclTestsError(
            f"{where}: expected {len(lead) + 3} or more columns "
            f"({' '.join(header)}), got {len(parts)}: {' '.join(parts)!r}"
        )
    cols = dict(zip(lead, parts))
    size = _num(cols["size"], "size", where)
    count = _num(cols["count"], "count", where)
    t_us = _num(parts[len(lead)], "time", where)
    if t_us <= 0:
        raise NcclTestsError(f"{where}: column 'time': must be > 0 us, got {parts[len(lead)]!r}")
    algbw = _num(parts[len(lead) + 1], "algbw", where)
    busbw = _num(parts[len(lead) + 2], "busbw", where)
    ip = None
    if len(parts) >= len(lead) + 5:
        try:
            v = float(parts[len(lead) + 4])
            ip = v * 1e-6 if v > 0 and math.isfinite(v) else None
        except ValueError:
            ip = None
    root = cols.get("root", "-1")
    return NcclTestsRow(
        int(size),
        int(count),
        cols["type"],
        cols.get("redop", "none"),
        int(root) if re.match(r"^-?\d+$", root) else -1,
        t_us * 1e-6,
        algbw * 1e9,
        busbw * 1e9,
        ip,
    )


def _fmt_time(t_us: float) -> str:
    # nccl-tests prints fewer decimals as the time grows (src/common.cu).
    if t_us >= 10000.0:
        return f"{t_us:8.0f}"
    if t_us >= 100.0:
        return f"{t_us:8.1f}"
    return f"{t_us:8.2f}"


def format_nccl_tests(
    rows: Sequence[dict], op: str, n_ranks: int, dtype: str = "float", cluster: str = "", device_name: str = ""
) -> str:
    """Rows of :func:`simulator.studies.bench.collective_sweep` as nccl-tests prints them.

    Out-of-place and in-place columns carry the same simulated time (the simulator
    does not tell them apart); ``#wrong`` is 0. A first comment line names the binary,
    so that :func:`read_nccl_tests` reads the text back without being told the op."""
    if op not in BINARY_OF_OP:
        raise NcclTestsError(f"op: {op!r} has no nccl-tests binary; choose from {', '.join(BINARY_OF_OP)}")
    if dtype not in DTYPE_BYTES:
        raise NcclTestsError(f"dtype: {dtype!r} not allowed; choose from {', '.join(DTYPE_BYTES)}")
    elem = DTYPE_BYTES[dtype]
    sizes = [int(r["size_bytes"]) for r in rows]
    redop = "sum" if op in ("all-reduce", "reduce-scatter") else "none"
    root = 0 if op == "broadcast" else -1
    lines = [
        f"# stepsim collective: {BINARY_OF_OP[op]} simulated on {cluster or 'a cluster'}, {n_ranks} devices",
        f"# nThread 1 nGpus {n_ranks} minBytes {min(sizes, default=0)} maxBytes {max(sizes, default=0)} "
        "step: 2(factor) warmup iters: 0 iters: 1 agg iters: 1 validation: 0 graph: 0",
        "#",
        "# Using devices",
    ]
    for r in range(n_ranks):
        lines.append(f"#  Rank {r:2d} Group  0 Pid      0 on    stepsim device {r:2d} [sim] {device_name}".rstrip())
    lines += [
        "#",
        f"# {'':>10s} {'':>13s} {'':>9s} {'':>7s} {'':>7s}     out-of-place                       in-place",
        f"# {'size':>10s} {'count':>13s} {'type':>9s} {'redop':>7s} {'root':>7s} {'time':>8s} {'algbw':>7s} "
        f"{'busbw':>7s} {'#wrong':>6s} {'time':>8s} {'algbw':>7s} {'busbw':>7s} {'#wrong':>6s}",
        f"# {'(B)':>10s} {'(elements)':>13s} {'':>9s} {'':>7s} {'':>7s} {'(us)':>8s} {'(GB/s)':>7s} "
        f"{'(GB/s)':>7s} {'':>6s} {'(us)':>8s} {'(GB/s)':>7s} {'(GB/s)':>7s} {'':>6s}",
    ]
    for r in rows:
        size = int(r["size_bytes"])
        count = size // elem // (n_ranks if op in _PER_RANK_COUNT else 1)
        t = _fmt_time(r["time_s"] * 1e6)
        bw = f"{r['algbw_bytes_per_s'] / 1e9:7.2f} {r['busbw_bytes_per_s'] / 1e9:7.2f} {0:6d}"
        lines.append(f"{size:12d} {count:13d} {dtype:>9s} {redop:>7s} {root:7d} {t} {bw} {t} {bw}")
    lines.append("# Out of bounds values : 0 OK")
    avg = sum(r["busbw_bytes_per_s"] for r in rows) / len(rows) / 1e9 if rows else 0.0
    lines.append(f"# Avg bus bandwidth    : {avg:.4g} ")
    lines.append("#")
    return "\n".join(lines)
