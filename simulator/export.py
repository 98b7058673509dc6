"""Exporters: Chrome Trace Event JSON (opens in Perfetto UI and chrome://tracing).

Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
(the Trace Event Format). One process per simulated device (``pid`` = rank), one
thread per stream; complete events (``ph: "X"``) with microsecond timestamps;
idle spans on the compute thread are named ``bubble``, ``exposed comm`` (``waiting_for``:
the axes busy, e.g. ``ep_inter+ep_intra``) or ``offload wait`` (see
:mod:`simulator.accounting`); a cause not listed in ``_IDLE_STYLE`` is named after
itself. Memory in use is a counter track per device.
"""

from __future__ import annotations

import json
from pathlib import Path

from workloads.ops import MEMORY_CATEGORIES, STREAMS

_US = 1e6
# idle-span cause (simulator.accounting) -> event name, Chrome trace colour name (reserved
# names of the Trace Event viewers); any other cause: its own name, "yellow"
_IDLE_STYLE = {"bubble": ("bubble", "grey"), "exposed_comm": ("exposed comm", "terrible"),
               "offload_wait": ("offload wait", "bad")}


def chrome_trace(result) -> dict:
    ev = result.events
    layout = result.scenario.layout if result.scenario is not None else None
    out = []
    tids = {s: i for i, s in enumerate(STREAMS)}
    ranks = sorted(set(ev["rank"])) if len(ev) else []
    for r in ranks:
        stage = layout.stage_of(int(r)) if layout is not None else 0
        out.append({"ph": "M", "pid": int(r), "name": "process_name", "args": {"name": f"device {r} (stage {stage})"}})
        out.append({"ph": "M", "pid": int(r), "name": "process_sort_index", "args": {"sort_index": int(r)}})
        for s, i in tids.items():
            out.append({"ph": "M", "pid": int(r), "tid": i, "name": "thread_name", "args": {"name": s}})
    names = ("rank", "stream", "name", "kind", "phase", "mb", "chunk", "layer", "start_s", "duration_s",
             "flops", "bytes", "size_bytes", "coll", "axis")
    # plain Python columns: iterating a DataFrame row by row is many times slower
    for (rank, stream, name, kind, phase, mb, chunk, layer, start, dur, flops, nbytes, size,
         coll, axis) in zip(*(ev[c].tolist() for c in names)):
        args = {"phase": phase, "mb": int(mb), "chunk": int(chunk), "layer": int(layer)}
        if kind == "compute":
            args["flops"] = float(flops)
            args["bytes"] = float(nbytes)
        else:
            args["size_bytes"] = float(size)
            if coll:
                args["collective"] = coll
            args["axis"] = axis
        out.append({
            "ph": "X", "pid": int(rank), "tid": tids.get(stream, len(tids)), "name": name,
            "cat": kind, "ts": start * _US, "dur": dur * _US, "args": args,
        })
    raw = getattr(result, "raw", None)
    if raw is not None:
        for r, s, e, cause, axis in raw.idle_spans:
            name, cname = _IDLE_STYLE.get(cause, (cause.replace("_", " "), "yellow"))
            out.append({
                "ph": "X", "pid": int(r), "tid": tids["compute"], "name": name,
                "cat": "idle", "ts": s * _US, "dur": (e - s) * _US, "args": {"waiting_for": axis or "pipeline"},
                "cname": cname,
            })
    mem = result.memory
    for rank, t, *vals in zip(*(mem[c].tolist() for c in ("rank", "time_s", *MEMORY_CATEGORIES))):
        out.append({
            "ph": "C", "pid": int(rank), "name": "memory (GB)", "ts": t * _US,
            "args": {c: v / 1e9 for c, v in zip(MEMORY_CATEGORIES, vals)},
        })
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": {"generator": "stepsim", "name": result.summary.get("name")}}


def write_chrome_trace(result, path) -> None:
    Path(path).write_text(json.dumps(chrome_trace(result)))
