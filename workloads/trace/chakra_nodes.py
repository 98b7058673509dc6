"""What one node of a Chakra ET file becomes (:func:`_node_fields`): its ``kind``, an op
(compute, collective, send, host) or a node resolved away (recv, skip), and the op's fields,
read from the node's type and attributes, one reader per node type. The reader of whole
traces, :mod:`workloads.trace.chakra_read`, assembles these fields into a :class:`Trace`;
:mod:`workloads.trace.chakra` describes which node types are read, and how."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from workloads.kernels import KERNEL_KINDS, MATH_DTYPES, MAX_KERNEL_LAUNCHES, Kernel
from workloads.trace.chakra import _CHAKRA_TO_COLL, _SUPPORTED_TYPES, COMM_GROUP_FILE
from workloads.trace.ops import MEMORY_CATEGORIES, TraceError

#: Chakra's ``duration_micros`` per second (a recorded CPU node's host op runs its
#: ``duration_micros`` units at this rate: its recorded time).
_MICROS_PER_S = 1e6


def _attrs(msg) -> dict:
    """A message's attributes, name -> value (a list for the ``*_list`` kinds)."""
    out = {}
    for a in msg.attr:
        which = a.WhichOneof("value")
        if which is None:
            out[a.name] = None
            continue
        v = getattr(a, which)
        out[a.name] = list(v.values) if which.endswith("_list") else v
    return out


def _int_attr(at: dict, name: str, where: str, default=None):
    """Attribute ``name`` (``default`` where absent), a number >= 0."""
    v = at.get(name, default)
    if name in at and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0):
        raise TraceError(f"{where}: attribute {name} must be a number >= 0, got {v!r}")
    return v


def _type_name(pb, t: int) -> str:
    """The name of node type ``t`` (its number where Chakra has no such type)."""
    try:
        return pb.NodeType.Name(t)
    except ValueError:
        return str(t)


@dataclasses.dataclass(frozen=True)
class _Node:
    """One node being read: Chakra's message classes ``pb``, the node's attributes, its type's
    name, its recorded ``duration_micros``, and where it stands (its rank, the trace's rank count
    and comm groups, and ``where``, the file and node for errors)."""

    pb: object
    at: dict
    tname: str
    duration_us: int
    rank: int
    world: int
    groups: dict
    where: str

    @property
    def stream(self):
        return self.at.get("stepsim.stream")


def _node_fields(pb, n, at: dict, rank: int, world: int, groups: dict, where: str) -> dict:
    """What one node becomes: ``kind`` compute / collective / send / host (ops), or
    recv / skip (resolved away), with the op's fields."""
    tname = _type_name(pb, n.type)
    f = _common_fields(n, at, tname, where)
    read = _READERS.get(tname)
    if read is None:
        raise TraceError(f"{where}: node type {tname} is not supported; stepsim reads {', '.join(_SUPPORTED_TYPES)}")
    return read(_Node(pb, at, tname, int(n.duration_micros), rank, world, groups, where), f)


def _common_fields(n, at: dict, tname: str, where: str) -> dict:
    """The fields of every node: its name and labels, and its phase, algorithm and memory
    effects where it has them."""
    labels = at.get("stepsim.labels", [-1, -1, -1])
    f = {"name": n.name or f"{tname.lower()}{n.id}", "labels": [int(x) for x in (list(labels) + [-1, -1, -1])[:3]]}
    if "stepsim.phase" in at:
        f["phase"] = str(at["stepsim.phase"])
    if "stepsim.algorithm" in at:
        f["algorithm"] = str(at["stepsim.algorithm"])
    f["host_sync"] = bool(at.get("stepsim.host_sync", False))
    launches, held = at.get("stepsim.launches", -1), at.get("stepsim.sm_held", 0.0)
    if not (isinstance(launches, int) and -1 <= launches <= 1_000_000) or not 0 <= held < 1:
        raise TraceError(f"{where}: malformed stepsim.launches / stepsim.sm_held")
    f["launches"], f["sm_held"] = int(launches), float(held)
    if "stepsim.mem_category" in at:
        cats, deltas, when = (
            at["stepsim.mem_category"],
            at.get("stepsim.mem_delta_bytes", []),
            at.get("stepsim.mem_at", []),
        )
        if (
            not (len(cats) == len(deltas) == len(when))
            or any(c not in MEMORY_CATEGORIES for c in cats)
            or any(w not in ("start", "end") for w in when)
        ):
            raise TraceError(f"{where}: malformed stepsim.mem_* attributes")
        f["mem"] = tuple((c, float(d), w) for c, d, w in zip(cats, deltas, when))
    return f


def _metadata_node(node: _Node, f: dict) -> dict:
    """A ``METADATA_NODE``: skipped, its dependants inherit its dependencies."""
    f["kind"] = "skip"
    return f


def _comp_node(node: _Node, f: dict) -> dict:
    """A ``COMP_NODE``: host CPU work stepsim wrote (at a rate), a recorded CPU op (its
    ``duration_micros`` of host time), or GPU compute."""
    at, where = node.at, node.where
    if at.get("stepsim.kind") == "host" and "stepsim.rate_bytes_per_s" in at:
        f.update(
            kind="host",
            op_kind="host",
            stream=node.stream or "offload",
            rate=float(at["stepsim.rate_bytes_per_s"]),
            size=float(at.get("stepsim.size_bytes", at.get("tensor_size", 0))),
        )
        return f
    cpu = at.get("is_cpu_op", True)  # the Chakra feeder's default: a CPU op
    if not isinstance(cpu, bool):  # a string "false" was truthy: a GPU kernel read as host time
        raise TraceError(f"{where}: attribute is_cpu_op must be a bool_val, got {cpu!r}")
    if cpu:
        # recorded host time on the rank's host stream; issuing nothing to the GPU, it costs no launch
        f.update(
            kind="host",
            op_kind="host",
            stream=node.stream or "host",
            rate=_MICROS_PER_S,
            size=float(node.duration_us),
            launches=0,
        )
        return f
    f["kernels"] = (
        _stepsim_kernels(at, where)
        if "stepsim.kernel_flops" in at
        else _roofline_kernel(at, f["name"], node.duration_us, where)
    )
    if "stepsim.launches" not in at and any(k.recorded_s is not None for k in f["kernels"]):
        f["launches"] = 0  # its launch is recorded host time (the CPU node it depends on)
    f.update(
        kind="compute",
        op_kind="compute",
        stream=node.stream or "compute",
        recompute=bool(at.get("stepsim.recompute", False)),
        comm_overlap=bool(at.get("stepsim.comm_overlap", False)),
    )
    return f


def _stepsim_kernels(at: dict, where: str) -> tuple[Kernel, ...]:
    """The exact kernels stepsim wrote in ``stepsim.kernel_*`` attributes."""
    names, kinds = at.get("stepsim.kernel_names", []), at.get("stepsim.kernel_kinds", [])
    fl, by, sh = (
        at["stepsim.kernel_flops"],
        at.get("stepsim.kernel_bytes", []),
        at.get("stepsim.kernel_shapes", []),
    )
    if not (len(names) == len(kinds) == len(fl) == len(by)) or len(sh) != 4 * len(fl):
        raise TraceError(f"{where}: malformed stepsim.kernel_* attributes")
    ks = []
    for i in range(len(fl)):
        if kinds[i] not in KERNEL_KINDS or fl[i] < 0 or by[i] < 0:
            raise TraceError(
                f"{where}: kernel {i}: kind must be one of {', '.join(KERNEL_KINDS)} with FLOPs and bytes >= 0"
            )
        ks.append(Kernel(names[i], kinds[i], float(fl[i]), float(by[i]), *(int(x) for x in sh[4 * i : 4 * i + 4])))
    ex = at.get("stepsim.kernel_executed_flops")
    if ex is not None:
        if len(ex) != len(ks) or any(x < 0 for x in ex if not math.isnan(x)):
            raise TraceError(f"{where}: malformed stepsim.kernel_executed_flops")
        ks = [k if math.isnan(x) else dataclasses.replace(k, executed_flops=float(x)) for k, x in zip(ks, ex)]
    return _kernel_options(at, ks, where)


def _kernel_options(at: dict, ks: list, where: str) -> tuple[Kernel, ...]:
    """The optional kernel fields stepsim writes (math dtypes, backward bytes, recorded times)
    applied to ``ks``."""
    for f in ("math_dtype", "grad_math_dtype"):
        vals = at.get(f"stepsim.kernel_{f}")
        if vals is None:
            continue
        if len(vals) != len(ks) or any(v not in ("", *MATH_DTYPES) for v in vals):
            raise TraceError(f"{where}: malformed stepsim.kernel_{f} (one of {', '.join(MATH_DTYPES)} or '' a kernel)")
        ks = [dataclasses.replace(k, **{f: v}) if v else k for k, v in zip(ks, vals)]
    bwd = at.get("stepsim.kernel_bwd_bytes")
    if bwd is not None:
        if len(bwd) != len(ks) or any(not math.isnan(x) and not 0 <= x < math.inf for x in bwd):
            raise TraceError(f"{where}: malformed stepsim.kernel_bwd_bytes")
        ks = [k if math.isnan(x) else dataclasses.replace(k, bwd_bytes=float(x)) for k, x in zip(ks, bwd)]
    launches = at.get("stepsim.kernel_launches")
    if launches is not None:
        if len(launches) != len(ks) or any(not 1 <= x <= MAX_KERNEL_LAUNCHES for x in launches):
            raise TraceError(f"{where}: malformed stepsim.kernel_launches (1..{MAX_KERNEL_LAUNCHES} a kernel)")
        ks = [dataclasses.replace(k, launches=int(x)) if x != 1 else k for k, x in zip(ks, launches)]
    rec = at.get("stepsim.kernel_recorded_s")
    if rec is not None:
        if len(rec) != len(ks) or any(not math.isnan(x) and not 0 <= x < math.inf for x in rec):
            raise TraceError(f"{where}: malformed stepsim.kernel_recorded_s")
        ks = [k if math.isnan(x) else dataclasses.replace(k, recorded_s=float(x)) for k, x in zip(ks, rec)]
    return tuple(ks)


def _roofline_kernel(at: dict, name: str, duration_us: int, where: str) -> tuple[Kernel, ...]:
    """Another tool's compute node: one kernel of ``num_ops`` FLOPs and ``tensor_size`` bytes,
    re-timed for the simulated chip; with neither, a kernel of its recorded ``duration_micros``
    (Chakra's PyTorch converter writes no FLOPs or bytes for a GPU kernel)."""
    flops, nbytes = _int_attr(at, "num_ops", where), _int_attr(at, "tensor_size", where)
    if flops is None and nbytes is None:
        return (Kernel(name, "elementwise", 0.0, 0.0, recorded_s=duration_us / _MICROS_PER_S),)
    flops, nbytes = float(flops or 0), float(nbytes or 0)
    return (Kernel(name, "gemm" if flops > 0 else "elementwise", flops, nbytes),)


def _mem_node(node: _Node, f: dict) -> dict:
    """A ``MEM_LOAD_NODE`` / ``MEM_STORE_NODE``: a transfer over the device's host link."""
    size = node.at.get("stepsim.size_bytes", _int_attr(node.at, "tensor_size", node.where))
    if size is None:
        raise TraceError(f"{node.where}: a {node.tname} needs tensor_size (bytes moved)")
    f.update(kind="host", op_kind="host", stream=node.stream or "offload", size=float(size))
    return f


def _comm_fields(node: _Node, f: dict) -> None:
    """The fields every communication node has: its size in bytes, axis and key."""
    at, where = node.at, node.where
    if at.get("is_cpu_op") is True:
        raise TraceError(f"{where}: a communication node marked is_cpu_op: communication runs on the device")
    size = at.get("stepsim.size_bytes")
    if size is None:
        size = _int_attr(at, "comm_size", where)
        if size is None and node.tname != "COMM_COLL_NODE":
            size = _int_attr(at, "tensor_size", where)
        if size is None:
            raise TraceError(f"{where}: a {node.tname} needs comm_size (bytes)")
    f["size"] = float(size)
    f["axis"] = str(at.get("stepsim.axis", ""))
    if "stepsim.key" in at:
        f["key"] = str(at["stepsim.key"])


def _coll_node(node: _Node, f: dict) -> dict:
    """A ``COMM_COLL_NODE``: a collective of a supported type over its process group."""
    _comm_fields(node, f)
    at, where = node.at, node.where
    ctype = _collective_type(node)
    pg, group = _process_group(node)
    f.update(
        kind="collective",
        op_kind="collective",
        coll=_CHAKRA_TO_COLL[ctype],
        group=group,
        pg=pg,
        stream=node.stream or f"pg{pg}",
    )
    if "stepsim.scaleout_fraction" in at:
        frac = float(at["stepsim.scaleout_fraction"])
        if not 0.0 < frac <= 1.0:
            raise TraceError(f"{where}: stepsim.scaleout_fraction must be in (0, 1], got {frac}")
        f["scaleout_fraction"] = frac
    if at.get("stepsim.comm_overlap"):
        f["comm_overlap"] = True
    if not f["axis"]:
        f["axis"] = f"pg{pg}"
    return f


def _collective_type(node: _Node) -> str:
    """The Chakra name of a collective's ``comm_type``, one stepsim simulates."""
    at, where = node.at, node.where
    if "comm_type" not in at:
        raise TraceError(f"{where}: a COMM_COLL_NODE needs comm_type")
    try:
        ctype = node.pb.CollectiveCommType.Name(int(at["comm_type"]))
    except (ValueError, TypeError):
        ctype = f"comm_type {at['comm_type']!r}"
    if ctype not in _CHAKRA_TO_COLL:
        raise TraceError(
            f"{where}: collective {ctype} is not supported; stepsim simulates {', '.join(sorted(_CHAKRA_TO_COLL))}"
        )
    return ctype


def _process_group(node: _Node) -> tuple[str, tuple[int, ...]]:
    """A collective's process group (``pg_name``; ``""`` or ``"0"``: every rank) and its ranks,
    which the node's rank must be one of."""
    where = node.where
    pg = str(node.at.get("pg_name") or "0")
    if pg == "0":
        group = tuple(range(node.world))
    elif pg in node.groups:
        group = node.groups[pg]
    else:
        raise TraceError(
            f"{where}: process group pg_name {pg!r} is not in {COMM_GROUP_FILE}"
            + ("" if node.groups else f" (the directory has no {COMM_GROUP_FILE})")
        )
    if node.rank not in group:
        raise TraceError(
            f"{where}: rank {node.rank} runs a collective of group {pg} {list(group)[:8]}, which it is not a member of"
        )
    return pg, group


def _send_node(node: _Node, f: dict) -> dict:
    """A ``COMM_SEND_NODE``: a message from this rank to another."""
    _comm_fields(node, f)
    at, where, rank, world = node.at, node.where, node.rank, node.world
    src = _int_attr(at, "comm_src", where, rank)
    dst = _int_attr(at, "comm_dst", where)
    if src != rank:
        raise TraceError(f"{where}: a COMM_SEND_NODE in rank {rank}'s file sends from rank {src}")
    if dst is None or not 0 <= dst < world or dst == rank:
        raise TraceError(f"{where}: a COMM_SEND_NODE needs comm_dst, another rank in 0..{world - 1}, got {dst!r}")
    f.update(
        kind="send",
        op_kind="send",
        peer=int(dst),
        tag=int(_int_attr(at, "comm_tag", where, 0)),
        stream=node.stream or f"p2p{int(dst)}",
    )
    if not f["axis"]:
        f["axis"] = "p2p"
    return f


def _recv_node(node: _Node, f: dict) -> dict:
    """A ``COMM_RECV_NODE``: stands for its matching send, on another rank."""
    _comm_fields(node, f)
    at, where, rank, world = node.at, node.where, node.rank, node.world
    src = _int_attr(at, "comm_src", where)
    dst = _int_attr(at, "comm_dst", where, rank)
    if dst != rank:
        raise TraceError(f"{where}: a COMM_RECV_NODE in rank {rank}'s file receives at rank {dst}")
    if src is None or not 0 <= src < world or src == rank:
        raise TraceError(f"{where}: a COMM_RECV_NODE needs comm_src, another rank in 0..{world - 1}, got {src!r}")
    f.update(kind="recv", src=int(src), tag=int(_int_attr(at, "comm_tag", where, 0)))
    return f


#: Node type name -> its reader; any other type is refused.
_READERS: dict[str, Callable[[_Node, dict], dict]] = {
    "METADATA_NODE": _metadata_node,
    "COMP_NODE": _comp_node,
    "MEM_LOAD_NODE": _mem_node,
    "MEM_STORE_NODE": _mem_node,
    "COMM_COLL_NODE": _coll_node,
    "COMM_SEND_NODE": _send_node,
    "COMM_RECV_NODE": _recv_node,
}
