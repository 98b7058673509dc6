"""Exporters: Chrome Trace Event JSON (opens in Perfetto UI and chrome://tracing).

Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
(the Trace Event Format). One process per simulated device (``pid`` = rank), named as
its rows are in every figure (``stage 3 (device 384, ×128)``,
:func:`~simulator.results.report.stage_label`) and labelled with the devices it stands
for (``standing for 128 devices: ranks 384–511``), one thread per stream; complete events (``ph: "X"``) with
microsecond timestamps; idle spans on the compute thread are named ``bubble``,
``exposed comm`` (``waiting_for``: the axes busy, e.g. ``ep_inter+ep_intra``) or
``offload wait`` (see :mod:`simulator.engine.accounting`; a cause not listed in ``_IDLE_STYLE``
is named after itself); flow arrows (``ph: "s"`` /
``"f"``) from each pipeline send, and from every op another device waits for, to the
op that waited; memory in use is a counter per device, an argument per category
(a track each in Perfetto).

The file is written as a stream, in chunks of events, and gzip-compressed when its
name ends in ``.gz`` (Perfetto and ``chrome://tracing`` open both).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
from collections.abc import Iterator
from itertools import chain
from operator import attrgetter
from pathlib import Path

import numpy as np

from workloads.trace.ops import MEMORY_CATEGORIES, STREAMS

_US = 1e6
# idle-span cause (simulator.engine.accounting) -> event name, Chrome trace colour name (reserved
# names of the Trace Event viewers); any other cause: its own name, "yellow"
_IDLE_STYLE = {
    "bubble": ("bubble", "grey"),
    "exposed_comm": ("exposed comm", "terrible"),
    "offload_wait": ("offload wait", "bad"),
}
#: Flow (arrow) names: a pipeline send to the op on the receiving device that waited
#: for it; any other op of one device that an op of another device waited for.
FLOW_SEND, FLOW_DEP = "pipeline send", "cross-device dependency"
#: Events written per ``write`` call while streaming.
_CHUNK = 20_000

# ---- JSON text of one event at a time ------------------------------------------------------
# Each event is formatted from a template: the json module's encoder builds and walks a
# dict per event, several times slower. Strings go through json.dumps once per distinct
# value; numbers are written as json writes them (repr, NaN, Infinity).


class _Strings(dict):
    """str -> its JSON text, each distinct string encoded once."""

    def __missing__(self, s):
        self[s] = v = json.dumps(s)
        return v


def _number(x) -> str:
    return json.dumps(x)


class _Numbers(dict):
    """number -> its JSON text, each distinct number encoded once (ranks, micro-batches)."""

    def __missing__(self, x):
        self[x] = v = json.dumps(x)
        return v


def _each(a: np.ndarray, fmt) -> list:
    """``fmt`` of each element of ``a`` (a numeric column), in order; where the column holds
    few distinct values (sizes, FLOPs, durations, ranks), each is formatted once and
    repeated. ``-0.0`` and ``0.0``, which ``np.unique`` merges, keep their own texts."""
    n = len(a)
    if n >= 1024 and not (a.dtype.kind == "f" and (np.signbit(a) & (a == 0)).any()):
        u, inv = np.unique(a, return_inverse=True)
        if 4 * len(u) <= n:
            text = np.empty(len(u), dtype=object)
            text[:] = list(map(fmt, u.tolist()))
            return text[inv.reshape(-1)].tolist()
    return list(map(fmt, a.tolist()))


def _floats(a: np.ndarray) -> list[str]:
    """JSON text of each float of ``a``."""
    a = np.asarray(a, dtype=float)
    return _each(a, float.__repr__ if np.isfinite(a).all() else _number)


def _ints(a) -> list[int]:
    a = np.asarray(a).astype(np.int64)
    return _each(a, int) if len(a) >= 1024 else a.tolist()


def _process_name_lines(result, ranks, js: _Strings) -> list[str]:
    from simulator.results.report import rank_weight, stage_label, stands_for

    layout = result.scenario.layout if result.scenario is not None else None
    weights = (result.trace.weight if result.trace is not None else None) or {}
    exact = bool(result.summary.get("exact", False))
    out = []
    for r in ranks:
        r = int(r)
        w = rank_weight(layout, r, weights, exact)
        out.append(
            f'{{"ph": "M", "pid": {r}, "name": "process_name", "args": {{"name": {js[stage_label(layout, r, w)]}}}}}'
        )
        if w > 1:
            out.append(
                f'{{"ph": "M", "pid": {r}, "name": "process_labels", '
                f'"args": {{"labels": {js[stands_for(layout, r, w)]}}}}}'
            )
        out.append(f'{{"ph": "M", "pid": {r}, "name": "process_sort_index", "args": {{"sort_index": {r}}}}}')
        for i, s in enumerate(STREAMS):
            out.append(f'{{"ph": "M", "pid": {r}, "tid": {i}, "name": "thread_name", "args": {{"name": {js[s]}}}}}')
            out.append(
                f'{{"ph": "M", "pid": {r}, "tid": {i}, "name": "thread_sort_index", "args": {{"sort_index": {i}}}}}'
            )
    return out


_OP_HEAD = (
    '{"ph": "X", "pid": %d, "tid": %d, "name": %s, "cat": %s, "ts": %s, "dur": %s, "args": {"phase": %s, '
    '"mb": %d, "chunk": %d, "layer": %d, '
)
_OP_COMPUTE = _OP_HEAD + '"flops": %s, "bytes": %s}}'
_OP_COLL = _OP_HEAD + '"size_bytes": %s, "collective": %s, "axis": %s}}'
_OP_OTHER = _OP_HEAD + '"size_bytes": %s, "axis": %s}}'


def _op_lines(ev, tids, js: _Strings) -> list[str]:
    """One complete event per op: ``args`` holds FLOPs and bytes for compute ops, else the
    size, the collective (when one) and the axis."""
    kind = np.asarray(ev["kind"], dtype=object)
    coll = np.asarray(ev["coll"], dtype=object)
    compute = kind == "compute"
    has_coll = np.array([bool(c) for c in coll.tolist()], dtype=bool)
    groups = (
        (_OP_COMPUTE, compute, ("flops", "bytes")),
        (_OP_COLL, ~compute & has_coll, ("size_bytes", "coll", "axis")),
        (_OP_OTHER, ~compute & ~has_coll, ("size_bytes", "axis")),
    )
    out = np.empty(len(kind), dtype=object)
    for template, mask, extra in groups:
        if not mask.any():
            continue

        def text(c, mask=mask):
            return list(map(js.__getitem__, np.asarray(ev[c], dtype=object)[mask].tolist()))

        cols = [
            _ints(np.asarray(ev["rank"])[mask]),
            [tids.get(s, len(tids)) for s in np.asarray(ev["stream"], dtype=object)[mask].tolist()],
            text("name"),
            text("kind"),
            _floats(np.asarray(ev["start_s"], dtype=float)[mask] * _US),
            _floats(np.asarray(ev["duration_s"], dtype=float)[mask] * _US),
            text("phase"),
            _ints(np.asarray(ev["mb"])[mask]),
            _ints(np.asarray(ev["chunk"])[mask]),
            _ints(np.asarray(ev["layer"])[mask]),
        ]
        cols += [text(c) if c in ("coll", "axis") else _floats(np.asarray(ev[c], dtype=float)[mask]) for c in extra]
        out[mask] = list(map(template.__mod__, zip(*cols)))
    return out.tolist()


def _idle_lines(raw, tids, js: _Strings) -> list[str]:
    spans = list(getattr(raw, "idle_spans", None) or ())
    if not spans:
        return []
    start = np.array([s[1] for s in spans], dtype=float)
    end = np.array([s[2] for s in spans], dtype=float)
    ts, dur = _floats(start * _US), _floats((end - start) * _US)
    tid = tids["compute"]
    out = []
    for (r, _, _, cause, axis), t, d in zip(spans, ts, dur):
        name, cname = _IDLE_STYLE.get(cause, (cause.replace("_", " "), "yellow"))
        out.append(
            f'{{"ph": "X", "pid": {int(r)}, "tid": {tid}, "name": {js[name]}, "cat": "idle", "ts": {t}, '
            f'"dur": {d}, "args": {{"waiting_for": {js[axis or "pipeline"]}}}, "cname": {js[cname]}}}'
        )
    return out


def flows(raw) -> list[tuple[str, object, object]]:
    """``(name, from_record, to_record)`` for every dependency that crosses devices: an
    op of one simulated device waiting for an op of another (a pipeline send, named
    :data:`FLOW_SEND`; anything else, :data:`FLOW_DEP`). Ops that took no time are left
    out: a flow is drawn between slices, and an empty slice encloses no instant."""
    if raw is None or not raw.records:
        return []
    recs = list(raw.records)
    ops = list(map(attrgetter("op"), recs))
    n = len(ops)
    ident = np.fromiter(map(attrgetter("id"), ops), dtype=np.int64, count=n)
    rank = np.fromiter(map(attrgetter("rank"), ops), dtype=np.int64, count=n)
    start = np.fromiter(map(attrgetter("start_s"), recs), dtype=float, count=n)
    busy = np.fromiter(map(attrgetter("end_s"), recs), dtype=float, count=n) > start
    deps = list(map(attrgetter("deps"), ops))
    dst = np.repeat(np.arange(n), np.fromiter(map(len, deps), dtype=np.int64, count=n))
    wanted = np.fromiter(chain.from_iterable(deps), dtype=np.int64, count=len(dst))
    # the record of each dependency: the last with that op id, as a dict keyed by id holds
    by_id = np.argsort(ident, kind="stable")
    pos = np.searchsorted(ident[by_id], wanted, side="right") - 1
    found = (pos >= 0) & (ident[by_id][np.maximum(pos, 0)] == wanted)
    src = by_id[np.maximum(pos, 0)]
    keep = found & busy[dst] & busy[src] & (rank[src] != rank[dst])
    src, dst = src[keep], dst[keep]
    order = np.lexsort((ident[dst], ident[src], start[src]))  # stable: ties keep the dependency order
    return [
        (FLOW_SEND if ops[i].kind == "send" else FLOW_DEP, recs[i], recs[j])
        for i, j in zip(src[order].tolist(), dst[order].tolist())
    ]


def _flow_lines(raw, tids, js: _Strings) -> list[str]:
    # Each end is put in the middle of its slice, with "bp": "e" on the finish, so that
    # both bind to the enclosing slice (Perfetto's and chrome://tracing's rule for v1 flows).
    found = flows(raw)
    if not found:
        return []
    names, srcs, dsts = zip(*found)
    numbers = _Numbers()

    def ends(recs):
        ops = list(map(attrgetter("op"), recs))
        start = np.fromiter(map(attrgetter("start_s"), recs), dtype=float, count=len(recs))
        end = np.fromiter(map(attrgetter("end_s"), recs), dtype=float, count=len(recs))
        ts = _floats((start + end) / 2 * _US)
        tid = [tids.get(op.stream, len(tids)) for op in ops]
        return ops, list(map(numbers.__getitem__, map(attrgetter("rank"), ops))), tid, ts

    s_ops, s_pid, s_tid, s_ts = ends(srcs)
    d_ops, d_pid, d_tid, d_ts = ends(dsts)
    out = []
    for i, n in enumerate(map(js.__getitem__, names)):
        s, d = s_ops[i], d_ops[i]
        args = f'{{"from": {js[s.name]}, "to": {js[d.name]}, "mb": {numbers[s.mb]}}}'
        out.append(
            f'{{"ph": "s", "id": {i}, "cat": "flow", "name": {n}, "pid": {s_pid[i]}, '
            f'"tid": {s_tid[i]}, "ts": {s_ts[i]}, "args": {args}}}'
        )
        out.append(
            f'{{"ph": "f", "bp": "e", "id": {i}, "cat": "flow", "name": {n}, "pid": {d_pid[i]}, '
            f'"tid": {d_tid[i]}, "ts": {d_ts[i]}, "args": {args}}}'
        )
    return out


def _memory_lines(mem, js: _Strings) -> list[str]:
    # One counter per device with an argument per category: Perfetto draws a track per
    # category ("memory (GB) weights", ...), chrome://tracing stacks them.
    tmpl = (
        '{"ph": "C", "pid": %d, "name": "memory (GB)", "ts": %s, "args": {'
        + ", ".join(f"{js[c]}: %s" for c in MEMORY_CATEGORIES)
        + "}}"
    )
    cols = [_ints(mem["rank"]), _floats(np.asarray(mem["time_s"], dtype=float) * _US)]
    cols += [_floats(np.asarray(mem[c], dtype=float) / 1e9) for c in MEMORY_CATEGORIES]
    return list(map(tmpl.__mod__, zip(*cols)))


def _sections(result) -> Iterator[list[str]]:
    """The trace's events as JSON text, section by section, in file order."""
    ev, mem = result.table("events"), result.table("memory")
    tids = {s: i for i, s in enumerate(STREAMS)}
    raw = result.raw
    js = _Strings()
    ranks = sorted(set(_ints(ev["rank"])) | set(_ints(mem["rank"])))
    yield _process_name_lines(result, ranks, js)
    yield _op_lines(ev, tids, js)
    yield _idle_lines(raw, tids, js)
    if raw is not None:
        yield _flow_lines(raw, tids, js)
    yield _memory_lines(mem, js)


def trace_events(result) -> Iterator[dict]:
    """Every event of the trace, in file order."""
    for lines in _sections(result):
        for line in lines:
            yield json.loads(line)


def _other_data(result) -> dict:
    s = result.summary
    return {
        "generator": "stepsim",
        "name": s.get("name"),
        "stepsim_version": s.get("stepsim_version"),
        "devices": s.get("devices"),
        "simulated_ranks": s.get("simulated_ranks"),
    }


def chrome_trace(result) -> dict:
    """The whole trace as one mapping (what :func:`write_chrome_trace` writes)."""
    return {"traceEvents": list(trace_events(result)), "displayTimeUnit": "ms", "otherData": _other_data(result)}


def write_chrome_trace(result, path) -> Path:
    """Write the trace to ``path`` (gzip-compressed when it ends in ``.gz``), streaming:
    one event per line, a section (ops, idle spans, flows, counters) at a time."""
    path = Path(path)
    with contextlib.ExitStack() as stack:
        if path.suffix == ".gz":
            raw = stack.enter_context(path.open("wb"))
            # level 6: within a few % of 9's size, several times faster. No file name in the
            # header: the file is written under a staging name, then renamed (outdir.staged_file).
            gz = stack.enter_context(gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6))
            f = stack.enter_context(io.TextIOWrapper(gz, encoding="utf-8"))
        else:
            f = stack.enter_context(path.open("w", encoding="utf-8"))
        f.write('{"displayTimeUnit": "ms", "otherData": ')
        f.write(json.dumps(_other_data(result)))
        f.write(', "traceEvents": [\n')
        sep = ""
        for lines in _sections(result):
            for k in range(0, len(lines), _CHUNK):
                f.write(sep + ",\n".join(lines[k : k + _CHUNK]))
                sep = ",\n"
        f.write("\n]}\n")
    return path


# ---- tables ------------------------------------------------------------------------------


def _csv_text(values: list[str]) -> list[str]:
    """Text fields as the csv module's minimal quoting writes them (what pandas writes)."""
    quoted = {
        v: ('"' + v.replace('"', '""') + '"') if any(ch in v for ch in ',"\r\n') else v for v in set(values)
    }  # few distinct names, many rows
    return list(map(quoted.__getitem__, values))


def _csv_float(x: float) -> str:
    return "" if x != x else float.__repr__(x)


def _csv_column(a: np.ndarray) -> list[str]:
    """One column's fields as ``DataFrame.to_csv`` writes them: numbers as ``repr`` writes
    them (pandas writes numpy's ``astype(str)``: the same shortest text that reads back to
    the same value), NaN and None as empty fields, text quoted only where it must be."""
    a = np.asarray(a)
    if a.dtype.kind == "f":
        a = a.astype(float)
        return _each(a, float.__repr__ if not np.isnan(a).any() else _csv_float)
    if a.dtype.kind in "iu":
        return _each(a, str)
    values = a.tolist()
    if not all(type(v) is str for v in set(values)):
        values = ["" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v) for v in values]
    return _csv_text(values)


def write_csv(columns, path) -> Path:
    """Write a table (column name -> numpy array, in order) as CSV, byte for byte what
    ``pandas.DataFrame(columns).to_csv(path, index=False)`` writes, several times faster."""
    path = Path(path)
    names = list(columns)
    fields = [_csv_column(columns[c]) for c in names]
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write(",".join(_csv_text([str(c) for c in names])) + "\n")
        rows = list(map(",".join, zip(*fields)))
        for k in range(0, len(rows), _CHUNK):
            f.write("\n".join(rows[k : k + _CHUNK]) + "\n")
    return path


def write_events_parquet(columns, path) -> Path:
    """Write a table (column name -> numpy array) as Parquet with pyarrow, with the
    key-value metadata ``stepsim_version`` (:mod:`simulator.results.parquet`); it reads back
    (``pandas.read_parquet``) as the same frame."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from simulator.results.parquet import VERSION_KEY
    from simulator.version import __version__

    def strings(values: list) -> pa.Array:
        encoded = [str(x).encode("utf-8") for x in values]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        return pa.Array.from_buffers(
            pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
        )

    def array(v):
        # pa.array() asks pyarrow's pandas shim about its argument, which imports pandas
        # (0.3-0.5 s): the columns are handed over as Arrow buffers instead
        v = np.asarray(v)
        if v.dtype == object:
            # few distinct names, many rows: encode each once, then let Arrow repeat them
            values = v.tolist()
            distinct = list(dict.fromkeys(values))
            code = {x: i for i, x in enumerate(distinct)}
            index = np.fromiter(map(code.__getitem__, values), dtype=np.int32, count=len(values))
            return strings(distinct).take(pa.Array.from_buffers(pa.int32(), len(index), [None, pa.py_buffer(index)]))
        v = np.ascontiguousarray(v)
        return pa.Array.from_buffers(pa.from_numpy_dtype(v.dtype), len(v), [None, pa.py_buffer(v)])

    table = pa.table({c: array(v) for c, v in columns.items()})
    table = table.replace_schema_metadata({VERSION_KEY.encode(): __version__.encode()})
    pq.write_table(table, path)
    return Path(path)
