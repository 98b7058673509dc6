"""Writing a step's trace as MLCommons Chakra ET files (:func:`write_chakra`): one ET file per rank and
``comm_group.json``; the node types and attributes are described in :mod:`workloads.trace.chakra`."""

from __future__ import annotations

import json
from pathlib import Path

from workloads.trace.chakra import (
    _COLL_TO_CHAKRA,
    COMM_GROUP_FILE,
    FORMAT,
    PREFIX,
    SCHEMA_VERSION,
    VERSION,
    _chakra,
)
from workloads.trace.ops import MEMORY_CATEGORIES, Op, Trace, TraceError


def _attr(pb, name: str, **value):
    return pb.AttributeProto(name=name, **value)


def _common_attrs(pb, op: Op) -> list:
    a = [_attr(pb, "stepsim.kind", string_val=op.kind), _attr(pb, "stepsim.stream", string_val=op.stream)]
    if op.phase:
        a.append(_attr(pb, "stepsim.phase", string_val=op.phase))
    a.append(_attr(pb, "stepsim.labels", int64_list=pb.Int64List(values=[op.mb, op.chunk, op.layer])))
    # the host stream's fields (simulator.engine.host), where they differ from the defaults
    if op.host_sync:
        a.append(_attr(pb, "stepsim.host_sync", bool_val=True))
    if op.launches >= 0:
        a.append(_attr(pb, "stepsim.launches", int64_val=op.launches))
    if op.sm_held:
        a.append(_attr(pb, "stepsim.sm_held", double_val=op.sm_held))
    if op.mem:
        a.append(_attr(pb, "stepsim.mem_category", string_list=pb.StringList(values=[m[0] for m in op.mem])))
        a.append(_attr(pb, "stepsim.mem_delta_bytes", double_list=pb.DoubleList(values=[m[1] for m in op.mem])))
        a.append(_attr(pb, "stepsim.mem_at", string_list=pb.StringList(values=[m[2] for m in op.mem])))
    return a


def _comp_node(pb, node, op: Op) -> None:
    node.type = pb.COMP_NODE
    node.attr.extend(
        [
            _attr(pb, "is_cpu_op", bool_val=False),
            _attr(pb, "num_ops", int64_val=int(round(op.flops))),
            _attr(pb, "tensor_size", uint64_val=int(round(op.bytes))),
            _attr(pb, "stepsim.kernel_names", string_list=pb.StringList(values=[k.name for k in op.kernels])),
            _attr(pb, "stepsim.kernel_kinds", string_list=pb.StringList(values=[k.kind for k in op.kernels])),
            _attr(pb, "stepsim.kernel_flops", double_list=pb.DoubleList(values=[k.flops for k in op.kernels])),
            _attr(pb, "stepsim.kernel_bytes", double_list=pb.DoubleList(values=[k.bytes for k in op.kernels])),
            _attr(
                pb,
                "stepsim.kernel_shapes",
                int64_list=pb.Int64List(values=[x for k in op.kernels for x in (k.m, k.n, k.k, k.groups)]),
            ),
        ]
    )
    if any(k.executed_flops is not None for k in op.kernels):  # FLOPs timed instead of `flops`; NaN: none
        node.attr.append(
            _attr(
                pb,
                "stepsim.kernel_executed_flops",
                double_list=pb.DoubleList(
                    values=[float("nan") if k.executed_flops is None else k.executed_flops for k in op.kernels]
                ),
            )
        )
    if any(k.launches != 1 for k in op.kernels):  # a GEMM run one per local expert
        node.attr.append(
            _attr(pb, "stepsim.kernel_launches", int64_list=pb.Int64List(values=[k.launches for k in op.kernels]))
        )
    for f in ("math_dtype", "grad_math_dtype"):  # "": the step's
        if any(getattr(k, f) is not None for k in op.kernels):
            values = [getattr(k, f) or "" for k in op.kernels]
            node.attr.append(_attr(pb, f"stepsim.kernel_{f}", string_list=pb.StringList(values=values)))
    if any(k.bwd_bytes is not None for k in op.kernels):  # NaN: twice the forward's
        values = [float("nan") if k.bwd_bytes is None else k.bwd_bytes for k in op.kernels]
        node.attr.append(_attr(pb, "stepsim.kernel_bwd_bytes", double_list=pb.DoubleList(values=values)))
    if any(k.recorded_s is not None for k in op.kernels):  # NaN: timed by the roofline
        values = [float("nan") if k.recorded_s is None else k.recorded_s for k in op.kernels]
        node.attr.append(_attr(pb, "stepsim.kernel_recorded_s", double_list=pb.DoubleList(values=values)))
    if op.recompute:
        node.attr.append(_attr(pb, "stepsim.recompute", bool_val=True))
    if op.comm_overlap:
        node.attr.append(_attr(pb, "stepsim.comm_overlap", bool_val=True))


def _comm_attrs(pb, op: Op) -> list:
    a = [
        _attr(pb, "is_cpu_op", bool_val=False),
        _attr(pb, "comm_size", int64_val=int(round(op.size_bytes))),
        _attr(pb, "stepsim.size_bytes", double_val=op.size_bytes),
        _attr(pb, "stepsim.key", string_val=op.key),
        _attr(pb, "stepsim.axis", string_val=op.axis),
    ]
    if op.scaleout_fraction != 1.0:  # node-limited all-to-all: the rail share of the routed copies
        a.append(_attr(pb, "stepsim.scaleout_fraction", double_val=op.scaleout_fraction))
    if op.comm_overlap:  # an all-to-all beside a batch-level overlapped pair's compute
        a.append(_attr(pb, "stepsim.comm_overlap", bool_val=True))
    return a


def write_chakra(
    trace: Trace, out_dir: str | Path, scenario_record: dict | None = None, prefix: str = PREFIX
) -> list[Path]:
    """Write ``trace`` to directory ``out_dir``: ``<prefix>.<rank>.et`` for every rank of
    the trace and ``comm_group.json``. ``scenario_record`` (see
    :func:`workloads.trace.io.scenario_record`) is kept in every file's metadata.
    Returns the paths written."""
    pb, protolib = _chakra()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise TraceError(f"trace: --out {out} is a file; a Chakra trace is a directory (one ET file per rank)")
    out.mkdir(parents=True, exist_ok=True)
    groups = _comm_groups(trace)
    header = _header_attrs(pb, trace, scenario_record)
    nodes_of = _RankNodes(pb, trace, groups).nodes()
    written = []
    for r in trace.ranks:
        p = out / f"{prefix}.{r}.et"
        with open(p, "wb") as f:
            protolib.encodeMessage(f, _rank_metadata(pb, trace, header, r))
            for node in nodes_of[r]:
                protolib.encodeMessage(f, node)
        written.append(p)
    cg = out / COMM_GROUP_FILE
    cg.write_text(json.dumps({str(i): list(g) for g, i in groups.items()}, indent=1) + "\n")
    written.append(cg)
    return written


def _comm_groups(trace: Trace) -> dict[tuple, int]:
    """Ring-ordered ranks of each collective's group -> its comm-group id (1, 2, ...; 0 means
    "all"), in order of first use."""
    groups: dict[tuple, int] = {}
    for op in trace.ops:
        if op.kind == "collective" and op.group not in groups:
            groups[op.group] = len(groups) + 1
    return groups


def _header_attrs(pb, trace: Trace, scenario_record: dict | None) -> list:
    """The ``GlobalMetadata`` attributes every rank's file shares: the format and the trace's header."""
    header = [
        _attr(pb, "stepsim.format", string_val=FORMAT),
        _attr(pb, "stepsim.format_version", int64_val=VERSION),
        _attr(pb, "stepsim.world", int64_val=trace.world),
        _attr(pb, "stepsim.ranks", int64_list=pb.Int64List(values=list(trace.ranks))),
        _attr(pb, "stepsim.representative", bool_val=bool(trace.representative)),
        _attr(pb, "stepsim.model_flops", double_val=float(trace.model_flops)),
        _attr(pb, "stepsim.notes", string_list=pb.StringList(values=list(trace.notes))),
    ]
    if trace.unexecuted_flops:  # rank -> FLOPs timed but not executed (HFU leaves them out)
        header.append(
            _attr(
                pb,
                "stepsim.unexecuted_flops",
                string_val=json.dumps({str(r): v for r, v in sorted(trace.unexecuted_flops.items())}),
            )
        )
    if scenario_record is not None:
        header.append(_attr(pb, "stepsim.scenario", string_val=json.dumps(scenario_record, sort_keys=True)))
    return header


def _rank_metadata(pb, trace: Trace, header: list, r: int):
    """Rank ``r``'s ``GlobalMetadata``: the shared header, then its rank, weight and static memory."""
    meta = pb.GlobalMetadata(version=SCHEMA_VERSION)
    meta.attr.extend(
        header
        + [
            _attr(pb, "stepsim.rank", int64_val=r),
            _attr(pb, "stepsim.weight", int64_val=int(trace.weight.get(r, 1))),
            _attr(
                pb,
                "stepsim.static_memory",
                double_list=pb.DoubleList(
                    values=[float(trace.static_memory.get(r, {}).get(c, 0.0)) for c in MEMORY_CATEGORIES]
                ),
            ),
        ]
    )
    return meta


class _RankNodes:
    """Each rank's nodes, in file order: one per op, with its ``data_deps`` (its dependencies
    on the same rank and the previous op of its stream), and a receive node for each send to
    a rank of the trace, placed just before its first reader."""

    def __init__(self, pb, trace: Trace, groups: dict[tuple, int]):
        self.pb, self.trace, self.groups = pb, trace, groups
        self.ops_by_id = {op.id: op for op in trace.ops}
        # Each send to a rank of the trace gets a receive node there; tags number the sends.
        next_id = max(self.ops_by_id) + 1
        self.tag, self.recv_id = {}, {}
        rankset = set(trace.ranks)
        for op in trace.ops:
            if op.kind == "send":
                self.tag[op.id] = len(self.tag)
                if op.peer in rankset and op.peer != op.rank:
                    self.recv_id[op.id] = next_id
                    next_id += 1
        self.nodes_of: dict[int, list] = {r: [] for r in trace.ranks}
        self.placed_recv: set[int] = set()

    def nodes(self) -> dict[int, list]:
        """rank -> its nodes, in file order."""
        pb = self.pb
        last: dict[tuple[int, str], int] = {}
        for op in self.trace.ops:
            node = pb.Node(id=op.id, name=op.name)
            deps, remote = self._deps(op)
            prev = last.get((op.rank, op.stream))
            if prev is not None and prev not in deps:
                deps.append(prev)
            last[(op.rank, op.stream)] = op.id
            node.data_deps.extend(deps)
            self._typed(node, op)
            node.attr.extend(_common_attrs(pb, op))
            if remote:
                node.attr.append(_attr(pb, "stepsim.remote_deps", int64_list=pb.Int64List(values=remote)))
            self.nodes_of[op.rank].append(node)
        for sid, rid in self.recv_id.items():  # receives nobody waits for still match their send
            if rid not in self.placed_recv:
                s = self.ops_by_id[sid]
                self.nodes_of[s.peer].append(_recv_node(pb, rid, s, self.tag[sid]))
        return self.nodes_of

    def _deps(self, op: Op) -> tuple[list[int], list[int]]:
        """``op``'s dependencies as node ids of its file (a message it waits for: its receive
        node, placed here if not yet), and its other dependencies on other ranks' ops."""
        deps, remote = [], []
        for d in op.deps:
            dop = self.ops_by_id[d]
            if dop.rank == op.rank:
                deps.append(d)
            elif dop.kind == "send" and dop.peer == op.rank and d in self.recv_id:
                rid = self.recv_id[d]
                if rid not in self.placed_recv:  # the receive goes just before its first reader
                    self.placed_recv.add(rid)
                    self.nodes_of[op.rank].append(_recv_node(self.pb, rid, dop, self.tag[d]))
                deps.append(rid)
            else:
                remote.append(d)
        return deps, remote

    def _typed(self, node, op: Op) -> None:
        """The node type and attributes of ``op``'s kind."""
        pb = self.pb
        if op.kind == "compute":
            _comp_node(pb, node, op)
        elif op.kind == "collective":
            _coll_node(pb, node, op, self.groups[op.group])
        elif op.kind == "send":
            _send_node(pb, node, op, self.tag[op.id])
        elif op.kind == "host":
            _host_node(pb, node, op)
        else:
            raise TraceError(f"op {op.id} ({op.name}): kind {op.kind!r} has no Chakra node type")


def _coll_node(pb, node, op: Op, group_id: int) -> None:
    node.type = pb.COMM_COLL_NODE
    node.attr.extend(
        [
            _attr(pb, "comm_type", int64_val=pb.CollectiveCommType.Value(_COLL_TO_CHAKRA[op.coll])),
            _attr(pb, "pg_name", string_val=str(group_id)),
        ]
        + _comm_attrs(pb, op)
    )


def _send_node(pb, node, op: Op, tag: int) -> None:
    node.type = pb.COMM_SEND_NODE
    node.attr.extend(
        [
            _attr(pb, "comm_src", int32_val=op.rank),
            _attr(pb, "comm_dst", int32_val=op.peer),
            _attr(pb, "comm_tag", int32_val=tag),
        ]
        + _comm_attrs(pb, op)
    )


def _host_node(pb, node, op: Op) -> None:
    """A host op: CPU work at a rate (e.g. the offloaded optimizer step) as a CPU ``COMP_NODE``,
    else a transfer, ``MEM_STORE_NODE`` (device to host) or ``MEM_LOAD_NODE``."""
    if op.rate_bytes_per_s > 0:
        node.type = pb.COMP_NODE
        node.attr.extend(
            [
                _attr(pb, "is_cpu_op", bool_val=True),
                _attr(pb, "stepsim.rate_bytes_per_s", double_val=op.rate_bytes_per_s),
            ]
        )
    else:
        node.type = pb.MEM_STORE_NODE if "d2h" in op.name else pb.MEM_LOAD_NODE
    node.attr.extend(
        [
            _attr(pb, "tensor_size", uint64_val=int(round(op.size_bytes))),
            _attr(pb, "stepsim.size_bytes", double_val=op.size_bytes),
        ]
    )


def _recv_node(pb, rid: int, send: Op, tag: int):
    node = pb.Node(id=rid, name=f"recv.{send.name}", type=pb.COMM_RECV_NODE)
    node.attr.extend(
        [
            _attr(pb, "is_cpu_op", bool_val=False),
            _attr(pb, "comm_src", int32_val=send.rank),
            _attr(pb, "comm_dst", int32_val=send.peer),
            _attr(pb, "comm_tag", int32_val=tag),
            _attr(pb, "comm_size", int64_val=int(round(send.size_bytes))),
        ]
    )
    return node
