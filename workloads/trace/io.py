"""Trace files: write a step's operation trace, edit it, read it back.

Format (JSON, optionally gzip-compressed when the name ends in ``.gz``)::

    {
      "format": "stepsim-trace", "version": 1,
      "world": 16,                      # ranks in the layout
      "ranks": [0, 8],                  # ranks whose ops are listed
      "weight": {"0": 8, "8": 8},       # devices each listed rank stands for
      "representative": true,           # one rank per stage (true) or every rank (false)
      "model_flops": 1.2e15,            # model FLOPs of the step (for MFU)
      "unexecuted_flops": {"0": 3e12},  # optional: FLOPs timed but not executed (HFU leaves them out)
      "static_memory": {"0": {"weights": ..., "gradients": ..., "optimizer": ...,
                              "activations": 0, "buffers": 0}, ...},
      "notes": ["..."],
      "scenario": {"name": "...", "model": "llama3-8b", "layout": {...}, "schedule": "1f1b",
                   "fingerprint": "<sha256>"},   # optional: what the trace was built from
      "ops": [
        {"id": 0, "rank": 0, "stream": "compute", "kind": "compute", "name": "L0.attn.F",
         "phase": "F", "mb": 0, "chunk": 0, "layer": 0, "deps": [],
         "kernels": [{"name": "qkv_proj", "kind": "gemm", "flops": 1e12, "bytes": 3e8,
                      "m": 4096, "n": 6144, "k": 4096, "groups": 1}, ...],
                     # optional per kernel: "executed_flops" (timed instead of "flops",
                     # e.g. a causal flash-attention kernel's half square), "math_dtype" /
                     # "grad_math_dtype" (bf16 | fp8 | tf32: a GEMM's own, e.g. the MoE
                     # router's), "bwd_bytes" (a backward pass's bytes, not twice its own),
                     # "recorded_s" (timed by its recording, not the roofline),
                     # "launches" (absent: 1; a grouped GEMM run one GEMM per local expert:
                     # its groups, each a host launch and the GPU's per-kernel overhead)
         "recompute": false,
         "mem": [["activations", 1.5e8, "end"]]},
        {"id": 5, "rank": 0, "stream": "tp", "kind": "collective", "name": "L0.attn.out",
         "coll": "reduce-scatter", "axis": "tp", "group": [0, 1, 2, 3],
         "key": "tp:0:L0.attn.out:0:0:F", "size_bytes": 3.3e7, "deps": [4], ...},
        {"id": 9, "rank": 0, "stream": "pp", "kind": "send", "peer": 8, "size_bytes": 8.4e6, ...}
      ]
    }

Any op may carry ``"host_sync": true`` (absent = false: the host blocks after issuing it
until it has ended, a device-to-host read) and ``"launches": n`` (absent: its kernels, or 1
for communication; 0 inside a replayed CUDA graph), what issuing it costs the host stream
(:mod:`simulator.engine.host`); a compute op ``"sm_held": f`` (absent = 0, ``0 <= f < 1``):
communication kernels hold that share of the SMs beside it (tensor-parallel overlap).
A compute op may carry ``"comm_overlap": true`` (absent = false): it belongs to an
overlapped forward/backward pair (DualPipe) and runs on the SMs the all-to-all
kernels leave free (:attr:`topologies.chips.ComputeCalibration.comm_sm_fraction`); an
all-to-all may carry it too: it runs beside such a pair's compute (Megatron-Core's
batch-level overlap) and takes :attr:`~topologies.chips.ComputeCalibration.overlap_a2a_slowdown`
times as long.
An all-to-all may carry ``"scaleout_fraction": f`` (absent = 1, ``0 < f <= 1``):
node-limited routing, only ``f`` of its routed copies cross between scale-up domains
(:func:`simulator.network.collectives.plan_collective`).

Ops on one ``(rank, stream)`` run in file order; ``deps`` are op ids. ``kind`` is
``compute`` (time from its ``kernels`` by the roofline model), ``collective``
(members with the same ``key`` meet; ``size_bytes`` in the nccl-tests convention)
``send`` (``size_bytes`` to rank ``peer``) or ``host`` (``size_bytes`` over the
device's host link, or at ``rate_bytes_per_s`` when given: activation offload and
reload on the ``offload`` stream). ``mem`` entries change memory in use
by ``delta`` bytes at the op's ``start`` or ``end``. Every amount is a finite number in a
physical range (:data:`MAX_AMOUNT_BYTES` bytes, :data:`MAX_KERNEL_FLOPS` FLOPs, a host rate
of at most :data:`MAX_RATE_BYTES_PER_S`). Reading checks every field and
the dependency graph: a dangling or cyclic dependency is reported by op id and
name (:class:`workloads.trace.ops.TraceError`), never a hang. A trace with no ops, or over
:data:`MAX_TRACE_FILE_BYTES`, is refused. Simulating a trace under a scenario checks that
it was built for it (:func:`check_trace_for`): the rank count, the recorded
``scenario.fingerprint`` (model, layout, schedule, training) and the model FLOPs per step.
The user documentation of the format is ``docs/formats.md``.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import math
from pathlib import Path

from workloads.kernels import KERNEL_KINDS, MATH_DTYPES, MAX_KERNEL_LAUNCHES, Kernel

# Kernel fields written only where set: the math dtype of a GEMM (and of its gradients) where it
# is not the step's, the bytes of a backward pass that is not twice its forward's, and the
# recorded time of a kernel not timed by the roofline.
KERNEL_OPTIONAL = ("math_dtype", "grad_math_dtype", "bwd_bytes", "recorded_s")
from workloads.enums import TRACE_COLLECTIVE_OPS
from workloads.trace.ops import MEMORY_CATEGORIES, STREAMS, Op, Trace, TraceError

FORMAT = "stepsim-trace"
VERSION = 1
_KINDS = ("compute", "collective", "send", "host")
_COLLS = TRACE_COLLECTIVE_OPS
# Physical ranges of a trace's amounts (docs/formats.md): 1 PB per op or memory change (a
# whole cluster's HBM is less), 1e21 FLOPs per kernel (1,000 s at 1 EFLOP/s), model FLOPs
# per step 1e30 and host rates up to 1 EB/s (topologies.chips.MAX_BW_BYTES_PER_S).
MAX_AMOUNT_BYTES = 1e15
MAX_KERNEL_FLOPS = 1e21
MAX_STEP_FLOPS = 1e30
MAX_RATE_BYTES_PER_S = 1e18
MAX_RECORDED_S = 86400.0  # a recorded kernel: at most a day (a training step takes seconds)


def _amount(v, where: str, high: float, low: float = 0.0) -> float:
    """``v`` as a float in ``[low, high]`` (a number, not a boolean; NaN and infinities refused)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
        raise TraceError(f"{where}: must be a number from {low:g} to {high:g}, got {v!r}")
    return float(v)


def trace_to_dict(trace: Trace) -> dict:
    ops = []
    for op in trace.ops:
        d = {
            "id": op.id,
            "rank": op.rank,
            "stream": op.stream,
            "kind": op.kind,
            "name": op.name,
            "phase": op.phase,
            "mb": op.mb,
            "chunk": op.chunk,
            "layer": op.layer,
            "deps": list(op.deps),
        }
        if op.kind == "compute":
            d["kernels"] = [
                {
                    "name": k.name,
                    "kind": k.kind,
                    "flops": k.flops,
                    "bytes": k.bytes,
                    "m": k.m,
                    "n": k.n,
                    "k": k.k,
                    "groups": k.groups,
                    **({} if k.executed_flops is None else {"executed_flops": k.executed_flops}),
                    **{f: getattr(k, f) for f in KERNEL_OPTIONAL if getattr(k, f) is not None},
                    **({} if k.launches == 1 else {"launches": k.launches}),
                }
                for k in op.kernels
            ]
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
            if op.comm_overlap:
                d["comm_overlap"] = True
            if op.scaleout_fraction != 1.0:
                d["scaleout_fraction"] = op.scaleout_fraction
        if op.host_sync:
            d["host_sync"] = True
        if op.launches >= 0:
            d["launches"] = op.launches
        if op.sm_held:
            d["sm_held"] = op.sm_held
        if op.kind == "send":
            d["peer"] = op.peer
        if op.kind == "host" and op.rate_bytes_per_s:
            d["rate_bytes_per_s"] = op.rate_bytes_per_s
        if op.mem:
            d["mem"] = [list(m) for m in op.mem]
        ops.append(d)
    return {
        "format": FORMAT,
        "version": VERSION,
        "world": trace.world,
        "ranks": list(trace.ranks),
        "weight": {str(r): w for r, w in trace.weight.items()},
        "representative": trace.representative,
        "model_flops": trace.model_flops,
        **(
            {"unexecuted_flops": {str(r): v for r, v in trace.unexecuted_flops.items()}}
            if trace.unexecuted_flops
            else {}
        ),
        "static_memory": {str(r): dict(m) for r, m in trace.static_memory.items()},
        "notes": list(trace.notes),
        "ops": ops,
    }


MAX_TRACE_FILE_BYTES = 256 * 2**20  # uncompressed; a larger trace would take gigabytes once parsed


def scenario_record(sc) -> dict:
    """What a trace file records of the scenario it was built from (a
    :class:`simulator.scenario.resolved.Scenario`): names, layout, schedule and a SHA-256
    ``fingerprint`` of the model, layout, schedule and training specs."""
    L = sc.layout
    layout = {"tp": L.tp, "cp": L.cp, "pp": L.pp, "dp": L.dp, "ep": L.ep, "vpp": L.vpp, "etp": L.etp, "zero": L.zero}
    return {
        "name": sc.name,
        "model": sc.model.name,
        "layout": layout,
        "schedule": sc.schedule,
        "fingerprint": scenario_fingerprint(sc),
    }


def scenario_fingerprint(sc) -> str:
    L = sc.layout
    spec = {
        "model": dataclasses.asdict(sc.model),
        "training": dataclasses.asdict(sc.training),
        "schedule": sc.schedule,
        "layout": [
            L.tp,
            L.cp,
            L.pp,
            L.dp,
            L.ep,
            L.vpp,
            L.etp,
            L.zero,
            bool(L.sequence_parallel),
            list(L.order),
            L.pipeline_layers if L.pipeline_layers in (None, "auto") else list(L.pipeline_layers),
        ],
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()


def check_trace_for(trace: Trace, sc) -> None:
    """Refuse simulating ``trace`` under scenario ``sc`` when it was built for another one:
    another rank count, another model / layout / training (by the recorded fingerprint, or
    for files without one by the model FLOPs per step). Raises :class:`TraceError`."""
    from workloads import counts

    if trace.world != sc.layout.world:
        raise TraceError(
            f"trace.world: the trace is for {trace.world} ranks, the scenario's layout has {sc.layout.world}"
        )
    rec = getattr(trace, "scenario_record", None)
    if isinstance(rec, dict) and rec.get("fingerprint") and rec["fingerprint"] != scenario_fingerprint(sc):
        mine = scenario_record(sc)
        diffs = [f"{k} {rec.get(k)!r} vs {mine[k]!r}" for k in ("model", "layout", "schedule") if rec.get(k) != mine[k]]
        raise TraceError(
            f"trace.scenario: the trace was built from scenario {rec.get('name')!r}, not this one "
            f"({'; '.join(diffs) if diffs else 'the model, layout or training differ'}); rebuild it "
            "with `stepsim trace` from this scenario"
        )
    if trace.model_flops > 0:
        want = counts.model_flops_per_step(sc.model, sc.training)
        if not math.isclose(trace.model_flops, want, rel_tol=1e-9):
            raise TraceError(
                f"trace.model_flops: the trace's {trace.model_flops:.4g} model FLOPs per step differ "
                f"from this scenario's {want:.4g} ({sc.model.name}): it was built for another model "
                "or batch; rebuild it with `stepsim trace` from this scenario"
            )


TRACE_FORMATS = ("json", "chakra")


def write_trace(trace: Trace, path: str | Path, scenario=None, format: str = "json") -> None:
    """Write ``trace`` to ``path``; with ``scenario`` (the :class:`Scenario` it was built
    from) the file records it (``"scenario"``: names, layout, fingerprint), so that
    running it under another scenario is refused. ``format``: ``json`` (this module's
    format, one file) or ``chakra`` (a directory of Chakra ET files:
    :mod:`workloads.trace.chakra`)."""
    if format == "chakra":
        from workloads.trace.chakra_write import write_chakra

        write_chakra(trace, path, scenario_record=scenario_record(scenario) if scenario is not None else None)
        return
    if format != "json":
        raise TraceError(f"trace: --format must be one of {', '.join(TRACE_FORMATS)}, got {format!r}")
    d = trace_to_dict(trace)
    if scenario is not None:
        d["scenario"] = scenario_record(scenario)
    data = json.dumps(d)
    p = Path(path)
    if p.suffix == ".gz":
        with gzip.open(p, "wt") as f:
            f.write(data)
    else:
        p.write_text(data)


def read_trace(path: str | Path) -> Trace:
    """Read a trace file (at most :data:`MAX_TRACE_FILE_BYTES` uncompressed), or a
    Chakra trace (a directory of ET files or their prefix: :mod:`workloads.trace.chakra`);
    every problem is a :class:`TraceError` naming the file or the field."""
    from workloads.trace.chakra_read import is_chakra_path, read_chakra

    p = Path(path)
    if is_chakra_path(p):
        return read_chakra(p)
    from stepsim_fileio import InputFileError, is_folder, load_json, read_text

    if is_folder(p):  # a name too long is no folder: reading it says why
        raise TraceError(f"trace: {p} is a directory without Chakra ET files (<prefix>.<rank>.et)")

    try:
        data = load_json(read_text(p, MAX_TRACE_FILE_BYTES, what="trace file"), str(p))
    except InputFileError as err:
        raise TraceError(f"trace: {err}") from None
    try:
        return trace_from_dict(data)
    except TraceError:
        raise
    except (TypeError, ValueError, AttributeError, OverflowError) as err:
        raise TraceError(f"trace: {p}: malformed field ({type(err).__name__}: {err})") from None


def _need(d: dict, key: str, types, where: str):
    if key not in d:
        raise TraceError(f"{where}.{key}: required")
    v = d[key]
    if (
        not isinstance(v, types)
        or isinstance(v, bool)
        and bool not in (types if isinstance(types, tuple) else (types,))
    ):
        raise TraceError(f"{where}.{key}: expected {getattr(types, '__name__', types)}, got {v!r}")
    return v


def _unexecuted(data: dict, ranks: set) -> dict[int, float]:
    raw = data.get("unexecuted_flops", {})
    if not isinstance(raw, dict):
        raise TraceError("trace.unexecuted_flops: expected a mapping rank -> FLOPs")
    out = {}
    for k, v in raw.items():
        try:
            r = int(k)
        except ValueError:
            raise TraceError(f"trace.unexecuted_flops: {k!r} is not a rank") from None
        if r not in ranks:
            raise TraceError(f"trace.unexecuted_flops: {r} is not among trace.ranks")
        out[r] = _amount(v, f"trace.unexecuted_flops.{k}", MAX_STEP_FLOPS)
    return out


def trace_from_dict(data: dict) -> Trace:
    """The trace a parsed trace file holds (:func:`trace_to_dict`'s inverse); every field is
    checked, a problem is a :class:`TraceError` naming it."""
    _check_format(data)
    world, ranks, weight, static = _ranks_of(data)
    rankset = set(ranks)
    raw_ops = _need(data, "ops", list, "trace")
    if not raw_ops:
        raise TraceError("trace.ops: the trace has no ops; a step needs at least one")
    if not ranks:
        raise TraceError("trace.ranks: the trace lists no ranks")
    ops = [_op_from_dict(i, d, world, rankset) for i, d in enumerate(raw_ops)]
    trace = Trace(
        ops=ops,
        ranks=ranks,
        weight=weight,
        static_memory=static,
        world=world,
        notes=list(data.get("notes", [])),
        model_flops=_amount(data.get("model_flops", 0.0), "trace.model_flops", MAX_STEP_FLOPS),
        representative=bool(data.get("representative", False)),
        unexecuted_flops=_unexecuted(data, rankset),
    )
    trace.check()
    rec = data.get("scenario")
    if rec is not None and not isinstance(rec, dict):
        raise TraceError(f"trace.scenario: expected a mapping, got {rec!r}")
    trace.scenario_record = rec
    return trace


def _check_format(data) -> None:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TraceError(f'trace: not a {FORMAT} file (missing "format": "{FORMAT}")')
    if data.get("version") != VERSION:
        raise TraceError(f"trace.version: this stepsim reads version {VERSION}, got {data.get('version')!r}")


def _ranks_of(data: dict) -> tuple[int, tuple, dict, dict]:
    """The trace's rank count, its listed ranks, and each listed rank's weight and static
    memory (1 and none where the file gives none)."""
    world = _need(data, "world", int, "trace")
    ranks = tuple(_need(data, "ranks", list, "trace"))
    weight = {int(k): int(v) for k, v in _need(data, "weight", dict, "trace").items()}
    static = {
        int(k): {c: _amount(v.get(c, 0.0), f"trace.static_memory.{k}.{c}", MAX_AMOUNT_BYTES) for c in MEMORY_CATEGORIES}
        for k, v in _need(data, "static_memory", dict, "trace").items()
    }
    for r in ranks:
        if not isinstance(r, int) or not 0 <= r < world:
            raise TraceError(f"trace.ranks: {r!r} is not a rank in 0..{world - 1}")
        weight.setdefault(r, 1)
        static.setdefault(r, {c: 0.0 for c in MEMORY_CATEGORIES})
    return world, ranks, weight, static


def _op_from_dict(i: int, d, world: int, rankset: set) -> Op:
    """The op of ``ops[i]``."""
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
    kernels = tuple(_kernel_from_dict(k, f"{where}.kernels[{j}]") for j, k in enumerate(d.get("kernels", [])))
    mem = tuple(_mem_entry(m, f"{where}.mem[{j}]") for j, m in enumerate(d.get("mem", [])))
    transfer = _transfer_fields(d, kind, world, where)
    deps = d.get("deps", [])
    if not isinstance(deps, list) or any(not isinstance(x, int) for x in deps):
        raise TraceError(f"{where}.deps: expected a list of op ids")
    return Op(
        id=_need(d, "id", int, where),
        rank=rank,
        stream=stream,
        kind=kind,
        name=str(d.get("name", f"op{i}")),
        phase=str(d.get("phase", "")),
        mb=int(d.get("mb", -1)),
        chunk=int(d.get("chunk", -1)),
        layer=int(d.get("layer", -1)),
        deps=tuple(deps),
        kernels=kernels,
        recompute=_flag(d, "recompute", where),
        comm_overlap=_flag(d, "comm_overlap", where),
        axis=str(d.get("axis", "")),
        key=str(d.get("key", f"op{i}")),
        mem=mem,
        host_sync=_flag(d, "host_sync", where),
        launches=_launches(d, where),
        sm_held=_sm_held(d, where),
        **transfer,
    )


def _flag(d: dict, key: str, where: str) -> bool:
    """A true/false field (absent: false): a string "no" was truthy (a host sync, a recomputed op)."""
    v = d.get(key, False)
    if not isinstance(v, bool):
        raise TraceError(f"{where}.{key}: expected true or false, got {v!r}")
    return v


def _launches(d: dict, where: str) -> int:
    """``launches`` (absent: -1, counted from the op): host launches issuing the op."""
    v = d.get("launches", -1)
    if isinstance(v, bool) or not isinstance(v, int) or v < -1 or v > 1_000_000:
        raise TraceError(f"{where}.launches: expected an integer from 0 to 1000000, got {v!r}")
    return v


def _sm_held(d: dict, where: str) -> float:
    """``sm_held`` (absent: 0): share of the SMs communication kernels hold beside the op."""
    v = d.get("sm_held", 0.0)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
        raise TraceError(f"{where}.sm_held: expected a number in [0, 1), got {v!r}")
    return float(v)


def _kernel_from_dict(k: dict, kw: str) -> Kernel:
    """One kernel of a compute op (``kw``: where it is, for errors)."""
    kk = _need(k, "kind", str, kw)
    if kk not in KERNEL_KINDS:
        raise TraceError(f"{kw}.kind: must be one of {', '.join(KERNEL_KINDS)}, got {kk!r}")
    flops = _amount(_need(k, "flops", (int, float), kw), f"{kw}.flops", MAX_KERNEL_FLOPS)
    nbytes = _amount(_need(k, "bytes", (int, float), kw), f"{kw}.bytes", MAX_AMOUNT_BYTES)
    executed = k.get("executed_flops")
    if executed is not None:
        executed = _amount(executed, f"{kw}.executed_flops", MAX_KERNEL_FLOPS)
    dtypes = {}
    for f in ("math_dtype", "grad_math_dtype"):
        v = k.get(f)
        if v is not None and v not in MATH_DTYPES:
            raise TraceError(f"{kw}.{f}: must be one of {', '.join(MATH_DTYPES)}, got {v!r}")
        dtypes[f] = v
    bwd = k.get("bwd_bytes")
    if bwd is not None:
        bwd = float(_amount(bwd, f"{kw}.bwd_bytes", MAX_AMOUNT_BYTES))
    rec = k.get("recorded_s")
    if rec is not None:
        rec = _amount(rec, f"{kw}.recorded_s", MAX_RECORDED_S)
    launches = k.get("launches", 1)
    if isinstance(launches, bool) or not isinstance(launches, int) or not 1 <= launches <= MAX_KERNEL_LAUNCHES:
        raise TraceError(f"{kw}.launches: must be an integer in 1..{MAX_KERNEL_LAUNCHES}, got {launches!r}")
    return Kernel(
        str(k.get("name", "")),
        kk,
        flops,
        nbytes,
        int(k.get("m", 0)),
        int(k.get("n", 0)),
        int(k.get("k", 0)),
        int(k.get("groups", 1)),
        None if executed is None else float(executed),
        bwd_bytes=bwd,
        recorded_s=rec,
        launches=launches,
        **dtypes,
    )


def _mem_entry(m, where: str) -> tuple:
    """One memory effect ``[category, delta_bytes, 'start'|'end']`` of an op."""
    if (
        not isinstance(m, list)
        or len(m) != 3
        or m[0] not in MEMORY_CATEGORIES
        or m[2] not in ("start", "end")
        or not isinstance(m[1], (int, float))
    ):
        raise TraceError(
            f"{where}: expected [category, delta_bytes, 'start'|'end'] with category in "
            f"{', '.join(MEMORY_CATEGORIES)}, got {m!r}"
        )
    return (m[0], _amount(m[1], f"{where}.delta_bytes", MAX_AMOUNT_BYTES, -MAX_AMOUNT_BYTES), m[2])


def _transfer_fields(d: dict, kind: str, world: int, where: str) -> dict:
    """The :class:`Op` fields of what an op moves: the collective and its group, the bytes,
    the all-to-all's scale-out share, a send's peer and a host op's rate."""
    coll = d.get("coll", "")
    if kind == "collective" and coll not in _COLLS:
        raise TraceError(f"{where}.coll: must be one of {', '.join(_COLLS)}, got {coll!r}")
    size = _amount(d.get("size_bytes", 0.0), f"{where}.size_bytes", MAX_AMOUNT_BYTES)
    group = tuple(int(x) for x in d.get("group", ()))
    if kind == "collective" and any(not 0 <= g < world for g in group):
        raise TraceError(f"{where}.group: ranks must be in 0..{world - 1}")
    frac = d.get("scaleout_fraction", 1.0)
    if (
        isinstance(frac, bool)
        or not isinstance(frac, (int, float))
        or not 0.0 < frac <= 1.0
        or (frac < 1.0 and coll != "all-to-all")
    ):
        raise TraceError(f"{where}.scaleout_fraction: a number in (0, 1], below 1 only on an all-to-all, got {frac!r}")
    peer = int(d.get("peer", -1))
    if kind == "send" and not 0 <= peer < world:
        raise TraceError(f"{where}.peer: must be a rank in 0..{world - 1}, got {peer}")
    rate = d.get("rate_bytes_per_s", 0.0)
    if (
        isinstance(rate, bool)
        or not isinstance(rate, (int, float))
        or not (rate == 0 or 1e6 <= rate <= MAX_RATE_BYTES_PER_S)
        or (rate and kind != "host")
    ):
        raise TraceError(
            f"{where}.rate_bytes_per_s: 0 (the device's host link) or from 1e6 to {MAX_RATE_BYTES_PER_S:g} bytes/s, "
            f"on host ops only, got {rate!r}"
        )
    return {
        "coll": coll,
        "group": group,
        "size_bytes": size,
        "peer": peer,
        "scaleout_fraction": float(frac),
        "rate_bytes_per_s": float(rate),
    }
