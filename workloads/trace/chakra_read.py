"""Reading Chakra ET files (stepsim's own or another tool's) back into a :class:`Trace`
(:func:`read_chakra`, :func:`is_chakra_path`); which node types are read, and how, is described in
:mod:`workloads.trace.chakra`."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from pathlib import Path
from typing import Union

from workloads.counts import KERNEL_KINDS, Kernel
from workloads.trace.ops import MEMORY_CATEGORIES, Op, Trace, TraceError
from workloads.trace.chakra import (
    _CHAKRA_TO_COLL,
    _ET_NAME,
    _SUPPORTED_TYPES,
    COMM_GROUP_FILE,
    FORMAT,
    MAX_CHAKRA_BYTES,
    _chakra,
)


def is_chakra_path(path: Union[str, Path]) -> bool:
    """Whether ``path`` names a Chakra trace: a directory of ``*.<rank>.et`` files or an
    ET prefix (``DIR/trace`` for ``DIR/trace.0.et``, ...), or one ``.et`` file's directory."""
    p = Path(path)
    if p.is_dir():
        return any(_ET_NAME.match(q.name) for q in p.iterdir())
    return Path(f"{p}.0.et").is_file() or (p.suffix == ".et" and p.is_file())


def _et_files(path: Path) -> tuple[dict[int, Path], Path]:
    """rank -> ET file of the trace at ``path``, and the directory holding them."""
    if path.is_dir():
        folder, prefix = path, None
    elif path.suffix == ".et" and path.is_file():
        m = _ET_NAME.match(path.name)
        if not m:
            raise TraceError(f"trace: {path}: an ET file name must be <prefix>.<rank>.et")
        folder, prefix = path.parent, m["prefix"]
    else:
        folder, prefix = path.parent, path.name
    found: dict[str, dict[int, Path]] = {}
    for q in sorted(folder.iterdir()):
        m = _ET_NAME.match(q.name)
        if m and q.is_file() and (prefix is None or m["prefix"] == prefix):
            found.setdefault(m["prefix"], {})[int(m["rank"])] = q
    if not found:
        raise TraceError(f"trace: {path}: no Chakra ET files (<prefix>.<rank>.et) there")
    if len(found) > 1:
        raise TraceError(
            f"trace: {folder} holds ET files of several prefixes ({', '.join(sorted(found))}); "
            f"name one: --trace {folder}/<prefix>"
        )
    return next(iter(found.values())), folder


def _decode_varint(buf: bytes, pos: int, where: str) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise TraceError(f"{where}: the file ends inside a message length (truncated?)")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise TraceError(f"{where}: malformed message length (not a Chakra ET file?)")


def _read_messages(pb, path: Path, budget: list) -> tuple:
    """The GlobalMetadata and Nodes of one ET file (gzip-compressed or not)."""
    from google.protobuf.message import DecodeError

    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as f:
                raw = f.read(budget[0] + 1)
        except (OSError, EOFError) as err:
            raise TraceError(f"trace: {path}: bad gzip data ({err})") from None
    budget[0] -= len(raw)
    if budget[0] < 0:
        raise TraceError(f"trace: the ET files exceed {MAX_CHAKRA_BYTES // 2**20} MiB uncompressed")
    pos, msgs = 0, []
    while pos < len(raw):
        where = f"trace: {path}: message {len(msgs)} (byte {pos})"
        n, pos = _decode_varint(raw, pos, where)
        if pos + n > len(raw):
            raise TraceError(
                f"{where}: the file ends inside the message ({n} bytes announced, {len(raw) - pos} left; truncated?)"
            )
        msg = pb.GlobalMetadata() if not msgs else pb.Node()
        try:
            msg.ParseFromString(raw[pos : pos + n])
        except DecodeError as err:
            raise TraceError(f"{where}: not a Chakra {type(msg).__name__} ({err})") from None
        msgs.append(msg)
        pos += n
    if not msgs:
        raise TraceError(f"trace: {path}: empty ET file (a Chakra ET file starts with a GlobalMetadata message)")
    return msgs[0], msgs[1:]


def _attrs(msg) -> dict:
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
    v = at.get(name, default)
    if name in at and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0):
        raise TraceError(f"{where}: attribute {name} must be a number >= 0, got {v!r}")
    return v


def _read_comm_groups(folder: Path) -> dict[str, tuple[int, ...]]:
    p = folder / COMM_GROUP_FILE
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise TraceError(f"trace: {p}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise TraceError(f"trace: {p}: expected a mapping of group id to a list of ranks")
    out = {}
    for k, v in data.items():
        if not isinstance(v, list) or not v or any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in v):
            raise TraceError(f"trace: {p}: group {k!r}: expected a non-empty list of ranks, got {v!r}")
        out[str(k)] = tuple(v)
    return out


def read_chakra(path: Union[str, Path]) -> Trace:
    """Read the Chakra trace at ``path`` (a directory, an ET prefix or one of its ET
    files). Every problem is a :class:`TraceError` naming the file and node."""
    pb, _ = _chakra()
    files, folder = _et_files(Path(path))
    budget = [MAX_CHAKRA_BYTES]
    metas, nodes = {}, {}
    for r, p in files.items():
        metas[r], nodes[r] = _read_messages(pb, p, budget)
    mine = [_attrs(m).get("stepsim.format") == FORMAT for m in metas.values()]
    if any(mine) and not all(mine):
        raise TraceError(
            f"trace: {folder}: some ET files were written by stepsim and some not; keep one trace per directory"
        )
    groups = _read_comm_groups(folder)
    return _build(pb, files, metas, nodes, groups, ours=all(mine))


def _type_name(pb, t: int) -> str:
    try:
        return pb.NodeType.Name(t)
    except ValueError:
        return str(t)


def _build(pb, files, metas, nodes, groups, ours: bool) -> Trace:
    world = len(files)
    head = _attrs(metas[min(files)]) if ours else {}
    if ours:
        world = int(head.get("stepsim.world", world))
        ranks = tuple(int(x) for x in head.get("stepsim.ranks", ()))
        if set(files) != set(ranks):
            raise TraceError(
                f"trace: the metadata lists ranks {list(ranks)[:8]}, the directory has ET files for {sorted(files)[:8]}"
            )
    else:
        missing = [r for r in range(max(files) + 1) if r not in files]
        if missing:
            raise TraceError(
                f"trace: ranks {missing[:8]} have no ET file; stepsim needs one per rank "
                f"0..{max(files)} (<prefix>.<rank>.et)"
            )
    for g, members in groups.items():
        if any(x >= world for x in members):
            raise TraceError(f"trace: {COMM_GROUP_FILE}: group {g} has ranks beyond the {world} ranks of the trace")
    # ---- per node: kind and fields; record sends and receives to match ------------------------
    info: dict[tuple[int, int], dict] = {}  # (rank, node id) -> fields
    order: dict[int, list[int]] = {}
    sends: dict[tuple, list] = {}
    recvs: dict[tuple, list] = {}
    for r in sorted(files):
        seen: list[int] = []
        for n in nodes[r]:
            where = f"trace: {files[r]}: node {n.id} ({n.name or 'unnamed'})"
            if (r, n.id) in info:
                raise TraceError(f"{where}: duplicate node id")
            at = _attrs(n)
            f = _node_fields(pb, n, at, r, world, groups, where, ours)
            f["where"], f["deps"] = where, list(n.data_deps)
            f["remote"] = [int(x) for x in at.get("stepsim.remote_deps", ())]
            info[(r, n.id)] = f
            seen.append(n.id)
            if f["kind"] == "send":
                sends.setdefault((r, f["peer"], f["tag"]), []).append(n.id)
            elif f["kind"] == "recv":
                recvs.setdefault((f["src"], r, f["tag"]), []).append(n.id)
        order[r] = seen
    for (r, nid), f in info.items():
        for d in f["deps"]:
            if (r, d) not in info:
                raise TraceError(f"{f['where']}: depends on node {d}, which is not in the file")
    # A receive stands for its matching send (the n-th of each (source, destination, tag)).
    for (src, dst, t), ids in recvs.items():
        have = sends.get((src, dst, t), [])
        for i, nid in enumerate(ids):
            if i >= len(have):
                raise TraceError(
                    f"{info[(dst, nid)]['where']}: receives from rank {src} (tag {t}), but rank {src}'s "
                    "trace has no matching COMM_SEND_NODE"
                )
            info[(dst, nid)]["send"] = (src, have[i])
    # ---- op ids, in a dependency order per rank ------------------------------------------------
    topo = {r: _topo_order(r, order[r], info) for r in sorted(files)}
    op_id: dict[tuple[int, int], int] = {}
    if ours:
        for key, f in info.items():
            if f["kind"] not in ("recv", "skip"):
                op_id[key] = key[1]
    else:
        for r in sorted(files):
            for nid in topo[r]:
                if info[(r, nid)]["kind"] not in ("recv", "skip"):
                    op_id[(r, nid)] = len(op_id)
    resolved: dict[tuple[int, int], tuple] = {}

    def deps_of(key) -> tuple:  # op ids a node's dependants wait for through it
        hit = resolved.get(key)
        if hit is None:
            f = info[key]
            if f["kind"] in ("recv", "skip"):
                out = []
                for d in f["deps"]:
                    out.extend(deps_of((key[0], d)))
                if "send" in f:
                    out.append(op_id[f["send"]])
                hit = tuple(dict.fromkeys(out))
            else:
                hit = (op_id[key],)
            resolved[key] = hit
        return hit

    ops: list[Op] = []
    kernel_tuples: dict[tuple, tuple] = {}
    coll_count: dict[tuple[int, str], int] = {}
    for r in sorted(files):
        for nid in topo[r]:
            f = info[(r, nid)]
            if f["kind"] in ("recv", "skip"):
                continue
            deps = []
            for d in f["deps"]:
                deps.extend(deps_of((r, d)))
            deps.extend(f["remote"])
            deps = tuple(dict.fromkeys(deps))
            stream = f["stream"]
            key = f.get("key", "")
            if f["kind"] == "collective" and not key:
                n = coll_count.get((r, f["pg"]), 0)
                coll_count[(r, f["pg"])] = n + 1
                key = f"pg{f['pg']}:{n}"
            kernels = f.get("kernels", ())
            kernels = kernel_tuples.setdefault(kernels, kernels)
            ops.append(
                Op(
                    id=op_id[(r, nid)],
                    rank=r,
                    stream=stream,
                    kind=f["op_kind"],
                    name=f["name"],
                    phase=f.get("phase", ""),
                    mb=f["labels"][0],
                    chunk=f["labels"][1],
                    layer=f["labels"][2],
                    deps=deps,
                    kernels=kernels,
                    recompute=f.get("recompute", False),
                    comm_overlap=f.get("comm_overlap", False),
                    coll=f.get("coll", ""),
                    axis=f.get("axis", ""),
                    group=f.get("group", ()),
                    key=key,
                    size_bytes=f.get("size", 0.0),
                    peer=f.get("peer", -1),
                    mem=f.get("mem", ()),
                    rate_bytes_per_s=f.get("rate", 0.0),
                    scaleout_fraction=f.get("scaleout_fraction", 1.0),
                )
            )
    if not ops:
        raise TraceError("trace: the Chakra trace has no node stepsim can simulate")
    if ours:
        ops.sort(key=lambda o: o.id)
        # the stream predecessor was written as a dependency for other readers; the stream implies it
        last: dict[tuple[int, str], int] = {}
        for op in ops:
            prev = last.get((op.rank, op.stream))
            if prev is not None and prev in op.deps:
                op.deps = tuple(d for d in op.deps if d != prev)
            last[(op.rank, op.stream)] = op.id
        ids = {op.id for op in ops}
        for op in ops:
            for d in op.deps:
                if d not in ids:
                    raise TraceError(f"op {op.id} ({op.name} on rank {op.rank}) depends on unknown op {d}")
    ranks = tuple(sorted(files))
    weight, static = {}, {}
    for r in ranks:
        a = _attrs(metas[r]) if ours else {}
        weight[r] = int(a.get("stepsim.weight", 1))
        mem = list(a.get("stepsim.static_memory", [0.0] * len(MEMORY_CATEGORIES)))
        if len(mem) != len(MEMORY_CATEGORIES):
            raise TraceError(f"trace: {files[r]}: stepsim.static_memory needs {len(MEMORY_CATEGORIES)} values")
        static[r] = dict(zip(MEMORY_CATEGORIES, (float(x) for x in mem)))
    notes = (
        list(head.get("stepsim.notes", ()))
        if ours
        else [
            f"read from a Chakra trace of {world} ranks that stepsim did not write: no model FLOPs (MFU is 0) and no "
            "memory before the step"
        ]
    )
    unexecuted = {}
    if ours and "stepsim.unexecuted_flops" in head:
        try:
            unexecuted = {int(r): float(v) for r, v in json.loads(head["stepsim.unexecuted_flops"]).items()}
        except (ValueError, TypeError, AttributeError):
            raise TraceError("trace: malformed stepsim.unexecuted_flops in the Chakra metadata") from None
    trace = Trace(
        ops=ops,
        ranks=ranks,
        weight=weight,
        static_memory=static,
        world=world,
        notes=notes,
        unexecuted_flops=unexecuted,
        model_flops=float(head.get("stepsim.model_flops", 0.0)) if ours else 0.0,
        representative=bool(head.get("stepsim.representative", False)) if ours else False,
    )
    trace.check()
    rec = None
    if ours and "stepsim.scenario" in head:
        try:
            rec = json.loads(head["stepsim.scenario"])
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            raise TraceError("trace.scenario: the metadata's stepsim.scenario is not a JSON mapping")
    trace.scenario_record = rec
    return trace


def _topo_order(r: int, seq: list[int], info: dict) -> list[int]:
    """The nodes of rank ``r`` in a dependency order, file order among the ready ones."""
    import heapq

    pos = {nid: i for i, nid in enumerate(seq)}
    indeg = {nid: 0 for nid in seq}
    succ: dict[int, list[int]] = {nid: [] for nid in seq}
    for nid in seq:
        for d in set(info[(r, nid)]["deps"]):
            succ[d].append(nid)
            indeg[nid] += 1
    ready = [pos[n] for n in seq if indeg[n] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        nid = seq[heapq.heappop(ready)]
        out.append(nid)
        for s in succ[nid]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, pos[s])
    if len(out) != len(seq):
        stuck = [n for n in seq if indeg[n] > 0][:5]
        raise TraceError(f"trace: rank {r}: the data_deps form a cycle through nodes {stuck}")
    return out


def _node_fields(pb, n, at: dict, rank: int, world: int, groups: dict, where: str, ours: bool) -> dict:
    """What one node becomes: ``kind`` compute / collective / send / host (ops), or
    recv / skip (resolved away), with the op's fields."""
    t = n.type
    tname = _type_name(pb, t)
    labels = at.get("stepsim.labels", [-1, -1, -1])
    f = {"name": n.name or f"{tname.lower()}{n.id}", "labels": [int(x) for x in (list(labels) + [-1, -1, -1])[:3]]}
    if "stepsim.phase" in at:
        f["phase"] = str(at["stepsim.phase"])
    if "stepsim.algorithm" in at:
        f["algorithm"] = str(at["stepsim.algorithm"])
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
    kind = at.get("stepsim.kind")
    stream = at.get("stepsim.stream")
    is_cpu = at.get("is_cpu_op", True)  # the Chakra feeder's default: a CPU op
    if t == pb.METADATA_NODE:
        f["kind"] = "skip"
        return f
    if t == pb.COMP_NODE and kind == "host" and "stepsim.rate_bytes_per_s" in at:
        f.update(
            kind="host",
            op_kind="host",
            stream=stream or "offload",
            rate=float(at["stepsim.rate_bytes_per_s"]),
            size=float(at.get("stepsim.size_bytes", at.get("tensor_size", 0))),
        )
        return f
    if t == pb.COMP_NODE:
        if is_cpu:
            raise TraceError(
                f"{where}: a CPU COMP_NODE (is_cpu_op true or absent): stepsim simulates GPU work from "
                "num_ops and tensor_size, not recorded CPU durations"
            )
        if "stepsim.kernel_flops" in at:
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
                ks.append(
                    Kernel(names[i], kinds[i], float(fl[i]), float(by[i]), *(int(x) for x in sh[4 * i : 4 * i + 4]))
                )
            ex = at.get("stepsim.kernel_executed_flops")
            if ex is not None:
                if len(ex) != len(ks) or any(x < 0 for x in ex if not math.isnan(x)):
                    raise TraceError(f"{where}: malformed stepsim.kernel_executed_flops")
                ks = [k if math.isnan(x) else dataclasses.replace(k, executed_flops=float(x)) for k, x in zip(ks, ex)]
            f["kernels"] = tuple(ks)
        else:
            flops, nbytes = _int_attr(at, "num_ops", where), _int_attr(at, "tensor_size", where)
            if flops is None and nbytes is None:
                raise TraceError(
                    f"{where}: a COMP_NODE with neither num_ops nor tensor_size: stepsim times compute "
                    "from FLOPs and bytes (roofline), not recorded durations"
                )
            flops, nbytes = float(flops or 0), float(nbytes or 0)
            f["kernels"] = (Kernel(f["name"], "gemm" if flops > 0 else "elementwise", flops, nbytes),)
        f.update(
            kind="compute",
            op_kind="compute",
            stream=stream or "compute",
            recompute=bool(at.get("stepsim.recompute", False)),
            comm_overlap=bool(at.get("stepsim.comm_overlap", False)),
        )
        return f
    if t in (pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE):
        size = at.get("stepsim.size_bytes", _int_attr(at, "tensor_size", where))
        if size is None:
            raise TraceError(f"{where}: a {tname} needs tensor_size (bytes moved)")
        f.update(kind="host", op_kind="host", stream=stream or "offload", size=float(size))
        return f
    if t in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
        if at.get("is_cpu_op") is True:
            raise TraceError(f"{where}: a communication node marked is_cpu_op: communication runs on the device")
        size = at.get("stepsim.size_bytes")
        if size is None:
            size = _int_attr(at, "comm_size", where)
            if size is None and t != pb.COMM_COLL_NODE:
                size = _int_attr(at, "tensor_size", where)
            if size is None:
                raise TraceError(f"{where}: a {tname} needs comm_size (bytes)")
        f["size"] = float(size)
        f["axis"] = str(at.get("stepsim.axis", ""))
        if "stepsim.key" in at:
            f["key"] = str(at["stepsim.key"])
    if t == pb.COMM_COLL_NODE:
        if "comm_type" not in at:
            raise TraceError(f"{where}: a COMM_COLL_NODE needs comm_type")
        try:
            ctype = pb.CollectiveCommType.Name(int(at["comm_type"]))
        except (ValueError, TypeError):
            ctype = f"comm_type {at['comm_type']!r}"
        if ctype not in _CHAKRA_TO_COLL:
            raise TraceError(
                f"{where}: collective {ctype} is not supported; stepsim simulates {', '.join(sorted(_CHAKRA_TO_COLL))}"
            )
        pg = str(at.get("pg_name") or "0")
        if pg == "0":
            group = tuple(range(world))
        elif pg in groups:
            group = groups[pg]
        else:
            raise TraceError(
                f"{where}: process group pg_name {pg!r} is not in {COMM_GROUP_FILE}"
                + ("" if groups else f" (the directory has no {COMM_GROUP_FILE})")
            )
        if rank not in group:
            raise TraceError(
                f"{where}: rank {rank} runs a collective of group {pg} {list(group)[:8]}, which it is not a member of"
            )
        f.update(
            kind="collective",
            op_kind="collective",
            coll=_CHAKRA_TO_COLL[ctype],
            group=group,
            pg=pg,
            stream=stream or f"pg{pg}",
        )
        if "stepsim.scaleout_fraction" in at:
            frac = float(at["stepsim.scaleout_fraction"])
            if not 0.0 < frac <= 1.0:
                raise TraceError(f"{where}: stepsim.scaleout_fraction must be in (0, 1], got {frac}")
            f["scaleout_fraction"] = frac
        if not f["axis"]:
            f["axis"] = f"pg{pg}"
        return f
    if t == pb.COMM_SEND_NODE:
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
            stream=stream or f"p2p{int(dst)}",
        )
        if not f["axis"]:
            f["axis"] = "p2p"
        return f
    if t == pb.COMM_RECV_NODE:
        src = _int_attr(at, "comm_src", where)
        dst = _int_attr(at, "comm_dst", where, rank)
        if dst != rank:
            raise TraceError(f"{where}: a COMM_RECV_NODE in rank {rank}'s file receives at rank {dst}")
        if src is None or not 0 <= src < world or src == rank:
            raise TraceError(f"{where}: a COMM_RECV_NODE needs comm_src, another rank in 0..{world - 1}, got {src!r}")
        f.update(kind="recv", src=int(src), tag=int(_int_attr(at, "comm_tag", where, 0)))
        return f
    raise TraceError(f"{where}: node type {tname} is not supported; stepsim reads {', '.join(_SUPPORTED_TYPES)}")
