"""Exporters: Chrome Trace Event JSON (opens in Perfetto UI and chrome://tracing).

Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
(the Trace Event Format). One process per simulated device (``pid`` = rank), named
after the devices it stands for (``stage 3: device 384, standing for 128 devices
(ranks 384–511)``), one thread per stream; complete events (``ph: "X"``) with
microsecond timestamps; idle spans on the compute thread are named ``bubble``,
``exposed comm`` (``waiting_for``: the axes busy, e.g. ``ep_inter+ep_intra``) or
``offload wait`` (see :mod:`simulator.accounting`; a cause not listed in ``_IDLE_STYLE``
is named after itself); flow arrows (``ph: "s"`` /
``"f"``) from each pipeline send, and from every op another device waits for, to the
op that waited; memory in use is a counter per device, an argument per category
(a track each in Perfetto).

The file is written as a stream, in chunks of events, and gzip-compressed when its
name ends in ``.gz`` (Perfetto and ``chrome://tracing`` open both).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Iterator

from workloads.ops import MEMORY_CATEGORIES, STREAMS

_US = 1e6
# idle-span cause (simulator.accounting) -> event name, Chrome trace colour name (reserved
# names of the Trace Event viewers); any other cause: its own name, "yellow"
_IDLE_STYLE = {"bubble": ("bubble", "grey"), "exposed_comm": ("exposed comm", "terrible"),
               "offload_wait": ("offload wait", "bad")}
#: Flow (arrow) names: a pipeline send to the op on the receiving device that waited
#: for it; any other op of one device that an op of another device waited for.
FLOW_SEND, FLOW_DEP = "pipeline send", "cross-device dependency"
#: Events serialised per ``json.dumps`` call while streaming (one call per event is
#: several times slower; the whole trace at once holds it all in memory twice).
_CHUNK = 20_000


def _process_names(result, ranks) -> Iterator[dict]:
    from simulator.report import stands_for

    layout = result.scenario.layout if result.scenario is not None else None
    weight = getattr(getattr(result, "trace", None), "weight", None) or {}
    for r in ranks:
        r = int(r)
        yield {"ph": "M", "pid": r, "name": "process_name",
               "args": {"name": stands_for(layout, r, int(weight.get(r, 1)))}}
        yield {"ph": "M", "pid": r, "name": "process_sort_index", "args": {"sort_index": r}}
        for i, s in enumerate(STREAMS):
            yield {"ph": "M", "pid": r, "tid": i, "name": "thread_name", "args": {"name": s}}
            yield {"ph": "M", "pid": r, "tid": i, "name": "thread_sort_index", "args": {"sort_index": i}}


def _ops(ev, tids) -> Iterator[dict]:
    names = ("rank", "stream", "name", "kind", "phase", "mb", "chunk", "layer", "start_s", "duration_s",
             "flops", "bytes", "size_bytes", "coll", "axis")
    # plain Python columns: iterating a DataFrame row by row is many times slower
    for (rank, stream, name, kind, phase, mb, chunk, layer, start, dur, flops, nbytes, size,
         coll, axis) in zip(*(ev[c].tolist() for c in names)):
        args = {"phase": phase, "mb": mb, "chunk": chunk, "layer": layer}
        if kind == "compute":
            args["flops"] = flops
            args["bytes"] = nbytes
        else:
            args["size_bytes"] = size
            if coll:
                args["collective"] = coll
            args["axis"] = axis
        yield {"ph": "X", "pid": rank, "tid": tids.get(stream, len(tids)), "name": name,
               "cat": kind, "ts": start * _US, "dur": dur * _US, "args": args}


def flows(raw) -> list[tuple[str, object, object]]:
    """``(name, from_record, to_record)`` for every dependency that crosses devices: an
    op of one simulated device waiting for an op of another (a pipeline send, named
    :data:`FLOW_SEND`; anything else, :data:`FLOW_DEP`). Ops that took no time are left
    out: a flow is drawn between slices, and an empty slice encloses no instant."""
    if raw is None:
        return []
    by_id = {rec.op.id: rec for rec in raw.records}
    out = []
    for rec in raw.records:
        op = rec.op
        if not op.deps or rec.end_s <= rec.start_s:
            continue
        for d in op.deps:
            src = by_id.get(d)
            if src is None or src.op.rank == op.rank or src.end_s <= src.start_s:
                continue
            out.append((FLOW_SEND if src.op.kind == "send" else FLOW_DEP, src, rec))
    out.sort(key=lambda f: (f[1].start_s, f[1].op.id, f[2].op.id))
    return out


def _flows(raw, tids) -> Iterator[dict]:
    # Each end is put in the middle of its slice, with "bp": "e" on the finish, so that
    # both bind to the enclosing slice (Perfetto's and chrome://tracing's rule for v1 flows).
    for i, (name, src, dst) in enumerate(flows(raw)):
        s, d = src.op, dst.op
        args = {"from": s.name, "to": d.name, "mb": s.mb}
        yield {"ph": "s", "id": i, "cat": "flow", "name": name, "pid": s.rank, "tid": tids.get(s.stream, len(tids)),
               "ts": (src.start_s + src.end_s) / 2 * _US, "args": args}
        yield {"ph": "f", "bp": "e", "id": i, "cat": "flow", "name": name, "pid": d.rank,
               "tid": tids.get(d.stream, len(tids)), "ts": (dst.start_s + dst.end_s) / 2 * _US, "args": args}


def _idle(raw, tids) -> Iterator[dict]:
    if raw is None:
        return
    for r, s, e, cause, axis in raw.idle_spans:
        name, cname = _IDLE_STYLE.get(cause, (cause.replace("_", " "), "yellow"))
        yield {"ph": "X", "pid": int(r), "tid": tids["compute"], "name": name, "cat": "idle",
               "ts": s * _US, "dur": (e - s) * _US, "args": {"waiting_for": axis or "pipeline"}, "cname": cname}


def _memory(mem) -> Iterator[dict]:
    # One counter per device with an argument per category: Perfetto draws a track per
    # category ("memory (GB) weights", ...), chrome://tracing stacks them.
    for rank, t, *vals in zip(*(mem[c].tolist() for c in ("rank", "time_s", *MEMORY_CATEGORIES))):
        yield {"ph": "C", "pid": rank, "name": "memory (GB)", "ts": t * _US,
               "args": {c: v / 1e9 for c, v in zip(MEMORY_CATEGORIES, vals)}}


def trace_events(result) -> Iterator[dict]:
    """Every event of the trace, in file order."""
    ev = result.events
    tids = {s: i for i, s in enumerate(STREAMS)}
    raw = getattr(result, "raw", None)
    ranks = sorted(set(ev["rank"].tolist()) | set(result.memory["rank"].tolist()))
    yield from _process_names(result, ranks)
    yield from _ops(ev, tids)
    yield from _idle(raw, tids)
    yield from _flows(raw, tids)
    yield from _memory(result.memory)


def _other_data(result) -> dict:
    s = result.summary
    return {"generator": "stepsim", "name": s.get("name"), "stepsim_version": s.get("stepsim_version"),
            "devices": s.get("devices"), "simulated_ranks": s.get("simulated_ranks")}


def chrome_trace(result) -> dict:
    """The whole trace as one mapping (what :func:`write_chrome_trace` writes)."""
    return {"traceEvents": list(trace_events(result)), "displayTimeUnit": "ms", "otherData": _other_data(result)}


def write_chrome_trace(result, path) -> Path:
    """Write the trace to ``path`` (gzip-compressed when it ends in ``.gz``), streaming."""
    path = Path(path)
    # level 6: within a few % of 9's size, several times faster
    f = gzip.open(path, "wt", encoding="utf-8", compresslevel=6) if path.suffix == ".gz" \
        else path.open("w", encoding="utf-8")
    with f:
        f.write('{"displayTimeUnit": "ms", "otherData": ')
        f.write(json.dumps(_other_data(result)))
        f.write(', "traceEvents": [\n')
        chunk: list = []
        first = True
        for e in trace_events(result):
            chunk.append(e)
            if len(chunk) == _CHUNK:
                f.write(("" if first else ",\n") + json.dumps(chunk)[1:-1])
                first, chunk = False, []
        if chunk:
            f.write(("" if first else ",\n") + json.dumps(chunk)[1:-1])
        f.write("\n]}\n")
    return path
