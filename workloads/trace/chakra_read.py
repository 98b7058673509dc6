"""Reading Chakra ET files (stepsim's own or another tool's) back into a :class:`Trace`
(:func:`read_chakra`, :func:`is_chakra_path`): the files, their messages, and the trace
assembled from the nodes' fields (:mod:`workloads.trace.chakra_nodes` reads each node); which
node types are read, and how, is described in :mod:`workloads.trace.chakra`."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from workloads.trace.chakra import (
    _ET_NAME,
    COMM_GROUP_FILE,
    FORMAT,
    MAX_CHAKRA_BYTES,
    _chakra,
)
from workloads.trace.chakra_nodes import _attrs, _node_fields
from workloads.trace.ops import MEMORY_CATEGORIES, Op, Trace, TraceError


def is_chakra_path(path: str | Path) -> bool:
    """Whether ``path`` names a Chakra trace: a directory of ``*.<rank>.et`` files or an
    ET prefix (``DIR/trace`` for ``DIR/trace.0.et``, ...), or one ``.et`` file's directory."""
    p = Path(path)
    try:
        if p.is_dir():
            return any(_ET_NAME.match(q.name) for q in p.iterdir())
        return Path(f"{p}.0.et").is_file() or (p.suffix == ".et" and p.is_file())
    except OSError:  # a name the file system refuses (too long): reading it as a file says so
        return False


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
        if len(set(v)) != len(v):  # was found only when the network planned the group, unnamed
            raise TraceError(f"trace: {p}: group {k!r}: names a rank twice, got {v!r}")
        out[str(k)] = tuple(v)
    return out


def read_chakra(path: str | Path) -> Trace:
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


def _build(pb, files, metas, nodes, groups, ours: bool) -> Trace:
    """The trace of the ET files read: each node's fields, receives matched to their sends,
    op ids in a dependency order per rank, the ops, and the header (stepsim's own metadata,
    or for another tool's files what stepsim can say of them)."""
    head, world = _header(files, metas, groups, ours)
    info, order = _node_info(pb, files, nodes, world, groups)
    _check_deps(info)
    _match_receives(info, ours)
    topo = {r: _topo_order(r, order[r], info) for r in sorted(files)}
    ops = _make_ops(info, topo, _op_ids(info, topo, ours))
    if not ops:
        raise TraceError("trace: the Chakra trace has no node stepsim can simulate")
    if ours:
        _as_written(ops)
    trace = _trace_of(ops, files, metas, head, world, ours)
    trace.check()
    trace.scenario_record = _scenario_of(head, ours)
    return trace


def _header(files, metas, groups, ours: bool) -> tuple[dict, int]:
    """The first rank's metadata attributes (stepsim's own files; else empty) and the trace's
    rank count, checked against the ET files there and the comm groups."""
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
    return head, world


def _node_info(pb, files, nodes, world: int, groups) -> tuple[dict, dict]:
    """``(rank, node id) -> fields`` of every node (its kind and op fields, ``where`` for
    errors, its ``deps``: ``data_deps`` and the ``ctrl_deps`` naming nodes of the file, and its
    ``remote`` dependencies), and each rank's node ids in file order."""
    info: dict[tuple[int, int], dict] = {}
    order: dict[int, list[int]] = {}
    for r in sorted(files):
        seen: list[int] = []
        for n in nodes[r]:
            where = f"trace: {files[r]}: node {n.id} ({n.name or 'unnamed'})"
            if (r, n.id) in info:
                raise TraceError(f"{where}: duplicate node id")
            at = _attrs(n)
            f = _node_fields(pb, n, at, r, world, groups, where)
            f["where"], f["deps"], f["ctrl"] = where, list(n.data_deps), list(n.ctrl_deps)
            f["remote"] = [int(x) for x in at.get("stepsim.remote_deps", ())]
            info[(r, n.id)] = f
            seen.append(n.id)
        order[r] = seen
        for nid in seen:  # ctrl_deps naming a node of the file (not the root the converter drops)
            f = info[(r, nid)]
            f["deps"] = list(dict.fromkeys(f["deps"] + [d for d in f.pop("ctrl") if (r, d) in info]))
    return info, order


def _check_deps(info: dict) -> None:
    """Every ``data_deps`` entry names a node of the same file."""
    for (r, _nid), f in info.items():
        for d in f["deps"]:
            if (r, d) not in info:
                raise TraceError(f"{f['where']}: depends on node {d}, which is not in the file")


def _match_receives(info: dict, ours: bool) -> None:
    """A receive stands for its matching send (the n-th of each (source, destination, tag)):
    its fields get ``send``, the (rank, node id) of that send. In another tool's files every
    send has its receive too (stepsim's own may leave out the ranks it did not simulate)."""
    sends: dict[tuple, list] = {}
    recvs: dict[tuple, list] = {}
    for (r, nid), f in info.items():
        if f["kind"] == "send":
            sends.setdefault((r, f["peer"], f["tag"]), []).append(nid)
        elif f["kind"] == "recv":
            recvs.setdefault((f["src"], r, f["tag"]), []).append(nid)
    for (src, dst, t), ids in recvs.items():
        have = sends.get((src, dst, t), [])
        for i, nid in enumerate(ids):
            if i >= len(have):
                raise TraceError(
                    f"{info[(dst, nid)]['where']}: receives from rank {src} (tag {t}), but rank {src}'s "
                    "trace has no matching COMM_SEND_NODE"
                )
            info[(dst, nid)]["send"] = (src, have[i])
    for (src, dst, t), ids in sends.items():
        n_recv = len(recvs.get((src, dst, t), ()))
        if not ours and len(ids) > n_recv:  # a send nobody receives would block its rank forever
            raise TraceError(
                f"{info[(src, ids[n_recv])]['where']}: sends to rank {dst} (tag {t}), but rank {dst}'s "
                "trace has no matching COMM_RECV_NODE"
            )


def _op_ids(info: dict, topo: dict, ours: bool) -> dict[tuple[int, int], int]:
    """``(rank, node id) -> op id`` of the nodes that are ops: stepsim's own files keep the
    node ids; others are numbered rank by rank in dependency order."""
    op_id: dict[tuple[int, int], int] = {}
    if ours:
        for key, f in info.items():
            if f["kind"] not in ("recv", "skip"):
                op_id[key] = key[1]
    else:
        for r in sorted(topo):
            for nid in topo[r]:
                if info[(r, nid)]["kind"] not in ("recv", "skip"):
                    op_id[(r, nid)] = len(op_id)
    return op_id


class _Deps:
    """The op ids an op waits for. A node that is an op stands for itself; a receive or a
    skipped node for what it waits for itself (and a receive for its matching send)."""

    def __init__(self, info: dict, op_id: dict):
        self.info, self.op_id = info, op_id
        self.resolved: dict[tuple[int, int], tuple] = {}

    def through(self, key) -> tuple:
        """The op ids a node's dependants wait for through it."""
        hit = self.resolved.get(key)
        if hit is None:
            f = self.info[key]
            if f["kind"] in ("recv", "skip"):
                out = []
                for d in f["deps"]:
                    out.extend(self.through((key[0], d)))
                if "send" in f:
                    out.append(self.op_id[f["send"]])
                hit = tuple(dict.fromkeys(out))
            else:
                hit = (self.op_id[key],)
            self.resolved[key] = hit
        return hit

    def of(self, rank: int, f: dict) -> tuple:
        """The dependencies of the op of fields ``f`` on ``rank``, each once, in order."""
        deps = []
        for d in f["deps"]:
            deps.extend(self.through((rank, d)))
        deps.extend(f["remote"])
        return tuple(dict.fromkeys(deps))


def _make_ops(info: dict, topo: dict, op_id: dict) -> list[Op]:
    """The ops, rank by rank in dependency order. A collective without a key gets the n-th
    of its group on its rank (``pg<id>:<n>``); equal kernel tuples are shared."""
    deps = _Deps(info, op_id)
    ops: list[Op] = []
    kernel_tuples: dict[tuple, tuple] = {}
    coll_count: dict[tuple[int, str], int] = {}
    coll_type: dict[str, tuple[str, str]] = {}  # key -> (collective, where) of its first member
    for r in sorted(topo):
        for nid in topo[r]:
            f = info[(r, nid)]
            if f["kind"] in ("recv", "skip"):
                continue
            key = f.get("key", "")
            if f["kind"] == "collective" and not key:
                n = coll_count.get((r, f["pg"]), 0)
                coll_count[(r, f["pg"])] = n + 1
                key = f"pg{f['pg']}:{n}"
                first = coll_type.setdefault(key, (f.get("coll", ""), f["where"]))
                if first[0] != f.get("coll", ""):  # NCCL would hang; the members must agree
                    raise TraceError(
                        f"{f['where']}: collective {n} of process group {f['pg']} is {f.get('coll')}, "
                        f"but {first[1].removeprefix('trace: ')} calls it {first[0]}"
                    )
            kernels = f.get("kernels", ())
            kernels = kernel_tuples.setdefault(kernels, kernels)
            ops.append(_op(op_id[(r, nid)], r, f, deps.of(r, f), key, kernels))
    return ops


def _op(op_id: int, rank: int, f: dict, deps: tuple, key: str, kernels: tuple) -> Op:
    """The op of one node's fields."""
    return Op(
        id=op_id,
        rank=rank,
        stream=f["stream"],
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
        host_sync=f.get("host_sync", False),
        launches=f.get("launches", -1),
        sm_held=f.get("sm_held", 0.0),
    )


def _as_written(ops: list[Op]) -> None:
    """stepsim's own ops as it wrote them: in id order, without the stream predecessor it wrote
    as a dependency for other readers (the stream implies it), every dependency a known op."""
    ops.sort(key=lambda o: o.id)
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


def _trace_of(ops: list[Op], files, metas, head: dict, world: int, ours: bool) -> Trace:
    """The trace of ``ops`` with its header: per rank (weight, static memory) from each
    file's metadata, the rest from ``head``; for another tool's files, a note saying what is
    missing."""
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
    return Trace(
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


def _scenario_of(head: dict, ours: bool):
    """The scenario record stepsim kept in the metadata, or None."""
    rec = None
    if ours and "stepsim.scenario" in head:
        try:
            rec = json.loads(head["stepsim.scenario"])
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            raise TraceError("trace.scenario: the metadata's stepsim.scenario is not a JSON mapping")
    return rec


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
