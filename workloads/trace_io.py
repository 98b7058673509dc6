"""Trace files: write a step's operation trace, edit it, read it back.

Format (JSON, optionally gzip-compressed when the name ends in ``.gz``)::

    {
      "format": "stepsim-trace", "version": 1,
      "world": 16,                      # ranks in the layout
      "ranks": [0, 8],                  # ranks whose ops are listed
      "weight": {"0": 8, "8": 8},       # devices each listed rank stands for
      "representative": true,           # one rank per stage (true) or every rank (false)
      "model_flops": 1.2e15,            # model FLOPs of the step (for MFU)
      "static_memory": {"0": {"weights": ..., "gradients": ..., "optimizer": ...,
                              "activations": 0, "buffers": 0}, ...},
      "notes": ["..."],
      "ops": [
        {"id": 0, "rank": 0, "stream": "compute", "kind": "compute", "name": "L0.attn.F",
         "phase": "F", "mb": 0, "chunk": 0, "layer": 0, "deps": [],
         "kernels": [{"name": "qkv_proj", "kind": "gemm", "flops": 1e12, "bytes": 3e8,
                      "m": 4096, "n": 6144, "k": 4096, "groups": 1}, ...],
         "recompute": false,
         "mem": [["activations", 1.5e8, "end"]]},
        {"id": 5, "rank": 0, "stream": "tp", "kind": "collective", "name": "L0.attn.out",
         "coll": "reduce-scatter", "axis": "tp", "group": [0, 1, 2, 3],
         "key": "tp:0:L0.attn.out:0:0:F", "size_bytes": 3.3e7, "deps": [4], ...},
        {"id": 9, "rank": 0, "stream": "pp", "kind": "send", "peer": 8, "size_bytes": 8.4e6, ...}
      ]
    }

A compute op may carry ``"comm_overlap": true`` (absent = false): it belongs to an
overlapped forward/backward pair (DualPipe) and runs on the SMs the all-to-all
kernels leave free (:attr:`simulator.compute.ComputeCalibration.comm_sm_fraction`).
An all-to-all may carry ``"scaleout_fraction": f`` (absent = 1, ``0 < f <= 1``):
node-limited routing, only ``f`` of its routed copies cross between scale-up domains
(:func:`simulator.collectives.plan_collective`).

Ops on one ``(rank, stream)`` run in file order; ``deps`` are op ids. ``kind`` is
``compute`` (time from its ``kernels`` by the roofline model), ``collective``
(members with the same ``key`` meet; ``size_bytes`` in the nccl-tests convention)
or ``send`` (``size_bytes`` to rank ``peer``). ``mem`` entries change memory in use
by ``delta`` bytes at the op's ``start`` or ``end``. Reading checks every field and
the dependency graph: a dangling or cyclic dependency is reported by op id and
name (:class:`workloads.ops.TraceError`), never a hang.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Union

from workloads.counts import KERNEL_KINDS, Kernel
from workloads.ops import MEMORY_CATEGORIES, STREAMS, Op, Trace, TraceError

FORMAT = "stepsim-trace"
VERSION = 1
_KINDS = ("compute", "collective", "send")
_COLLS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast")


def trace_to_dict(trace: Trace) -> dict:
    ops = []
    for op in trace.ops:
        d = {"id": op.id, "rank": op.rank, "stream": op.stream, "kind": op.kind, "name": op.name,
             "phase": op.phase, "mb": op.mb, "chunk": op.chunk, "layer": op.layer, "deps": list(op.deps)}
        if op.kind == "compute":
            d["kernels"] = [{"name": k.name, "kind": k.kind, "flops": k.flops, "bytes": k.bytes, "m": k.m, "n": k.n,
                             "k": k.k, "groups": k.groups} for k in op.kernels]
            d["recompute"] = op.recompute
            if op.comm_overlap:
                d["comm_overlap"] = True
        else:
            d["size_bytes"] = op.size_bytes
            d["axis"] = op.axis
            d["key"] = op.key
        if op.kind == "collective":
            d["coll"] = op.coll
            d["group"] = list(op.group)
            if op.scaleout_fraction != 1.0:
                d["scaleout_fraction"] = op.scaleout_fraction
        if op.kind == "send":
            d["peer"] = op.peer
        if op.mem:
            d["mem"] = [list(m) for m in op.mem]
        ops.append(d)
    return {
        "format": FORMAT, "version": VERSION, "world": trace.world, "ranks": list(trace.ranks),
        "weight": {str(r): w for r, w in trace.weight.items()}, "representative": trace.representative,
        "model_flops": trace.model_flops,
        "static_memory": {str(r): dict(m) for r, m in trace.static_memory.items()},
        "notes": list(trace.notes), "ops": ops,
    }


def write_trace(trace: Trace, path: Union[str, Path]) -> None:
    data = json.dumps(trace_to_dict(trace))
    p = Path(path)
    if p.suffix == ".gz":
        with gzip.open(p, "wt") as f:
            f.write(data)
    else:
        p.write_text(data)


def read_trace(path: Union[str, Path]) -> Trace:
    p = Path(path)
    try:
        if p.suffix == ".gz":
            with gzip.open(p, "rt") as f:
                data = json.load(f)
        else:
            data = json.loads(p.read_text())
    except OSError as err:
        raise TraceError(f"trace: cannot read {str(p)!r}: {err.strerror or err}") from None
    except (ValueError, EOFError) as err:
        raise TraceError(f"trace: {p.name} is not valid JSON: {err}") from None
    return trace_from_dict(data)


def _need(d: dict, key: str, types, where: str):
    if key not in d:
        raise TraceError(f"{where}.{key}: required")
    v = d[key]
    if not isinstance(v, types) or isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise TraceError(f"{where}.{key}: expected {getattr(types, '__name__', types)}, got {v!r}")
    return v


def trace_from_dict(data: dict) -> Trace:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TraceError(f"trace: not a {FORMAT} file (missing \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise TraceError(f"trace.version: this stepsim reads version {VERSION}, got {data.get('version')!r}")
    world = _need(data, "world", int, "trace")
    ranks = tuple(_need(data, "ranks", list, "trace"))
    weight = {int(k): int(v) for k, v in _need(data, "weight", dict, "trace").items()}
    static = {int(k): {c: float(v.get(c, 0.0)) for c in MEMORY_CATEGORIES}
              for k, v in _need(data, "static_memory", dict, "trace").items()}
    for r in ranks:
        if not isinstance(r, int) or not 0 <= r < world:
            raise TraceError(f"trace.ranks: {r!r} is not a rank in 0..{world - 1}")
        weight.setdefault(r, 1)
        static.setdefault(r, {c: 0.0 for c in MEMORY_CATEGORIES})
    ops = []
    rankset = set(ranks)
    for i, d in enumerate(_need(data, "ops", list, "trace")):
        where = f"ops[{i}]"
        if not isinstance(d, dict):
            raise TraceError(f"{where}: expected a mapping")
        kind = _need(d, "kind", str, where)
        if kind not in _KINDS:
            raise TraceError(f"{where}.kind: must be one of {', '.join(_KINDS)}, got {kind!r}")
        stream = _need(d, "stream", str, where)
        if stream not in STREAMS:
            raise TraceError(f"{where}.stream: must be one of {', '.join(STREAMS)}, got {stream!r}")
        rank = _need(d, "rank", int, where)
        if rank not in rankset:
            raise TraceError(f"{where}.rank: {rank} is not among trace.ranks")
        kernels = []
        for j, k in enumerate(d.get("kernels", [])):
            kw = f"{where}.kernels[{j}]"
            kk = _need(k, "kind", str, kw)
            if kk not in KERNEL_KINDS:
                raise TraceError(f"{kw}.kind: must be one of {', '.join(KERNEL_KINDS)}, got {kk!r}")
            flops, nbytes = float(_need(k, "flops", (int, float), kw)), float(_need(k, "bytes", (int, float), kw))
            if flops < 0 or nbytes < 0:
                raise TraceError(f"{kw}: flops and bytes must be >= 0")
            kernels.append(Kernel(str(k.get("name", "")), kk, flops, nbytes, int(k.get("m", 0)), int(k.get("n", 0)),
                                  int(k.get("k", 0)), int(k.get("groups", 1))))
        mem = []
        for j, m in enumerate(d.get("mem", [])):
            if (not isinstance(m, list) or len(m) != 3 or m[0] not in MEMORY_CATEGORIES
                    or m[2] not in ("start", "end") or not isinstance(m[1], (int, float))):
                raise TraceError(f"{where}.mem[{j}]: expected [category, delta_bytes, 'start'|'end'] with category in "
                                 f"{', '.join(MEMORY_CATEGORIES)}, got {m!r}")
            mem.append((m[0], float(m[1]), m[2]))
        coll = d.get("coll", "")
        if kind == "collective" and coll not in _COLLS:
            raise TraceError(f"{where}.coll: must be one of {', '.join(_COLLS)}, got {coll!r}")
        size = float(d.get("size_bytes", 0.0))
        if size < 0:
            raise TraceError(f"{where}.size_bytes: must be >= 0, got {size}")
        group = tuple(int(x) for x in d.get("group", ()))
        if kind == "collective" and any(not 0 <= g < world for g in group):
            raise TraceError(f"{where}.group: ranks must be in 0..{world - 1}")
        frac = d.get("scaleout_fraction", 1.0)
        if (isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 < frac <= 1.0
                or (frac < 1.0 and coll != "all-to-all")):
            raise TraceError(f"{where}.scaleout_fraction: a number in (0, 1], below 1 only on an "
                             f"all-to-all, got {frac!r}")
        peer = int(d.get("peer", -1))
        if kind == "send" and not 0 <= peer < world:
            raise TraceError(f"{where}.peer: must be a rank in 0..{world - 1}, got {peer}")
        deps = d.get("deps", [])
        if not isinstance(deps, list) or any(not isinstance(x, int) for x in deps):
            raise TraceError(f"{where}.deps: expected a list of op ids")
        ops.append(Op(
            id=_need(d, "id", int, where), rank=rank, stream=stream, kind=kind, name=str(d.get("name", f"op{i}")),
            phase=str(d.get("phase", "")), mb=int(d.get("mb", -1)), chunk=int(d.get("chunk", -1)),
            layer=int(d.get("layer", -1)), deps=tuple(deps), kernels=tuple(kernels),
            recompute=bool(d.get("recompute", False)), comm_overlap=bool(d.get("comm_overlap", False)),
            coll=coll, axis=str(d.get("axis", "")), group=group,
            key=str(d.get("key", f"op{i}")), size_bytes=size, peer=peer, mem=tuple(mem),
            scaleout_fraction=float(frac),
        ))
    trace = Trace(ops=ops, ranks=ranks, weight=weight, static_memory=static, world=world,
                  notes=list(data.get("notes", [])), model_flops=float(data.get("model_flops", 0.0)),
                  representative=bool(data.get("representative", False)))
    trace.check()
    return trace
