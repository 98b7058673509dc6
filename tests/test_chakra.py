"""Chakra execution traces: stepsim's own round trip, the files read by Chakra's own
reader, a hand-made trace stepsim did not write, and refused node types."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("chakra.schema.protobuf.et_def_pb2")

from chakra.schema.protobuf import et_def_pb2 as pb  # noqa: E402
from chakra.src.third_party.utils import protolib  # noqa: E402
from helpers import ideal_scenario, scenario  # noqa: E402

from simulator import simulate  # noqa: E402
from simulator.cli.app import main  # noqa: E402
from simulator.scenario.loading import load_scenario  # noqa: E402
from workloads.trace.builder import build_trace  # noqa: E402
from workloads.trace.io import read_trace, write_trace  # noqa: E402
from workloads.trace.ops import TraceError  # noqa: E402

DATA = Path(__file__).parent / "data" / "chakra"
MOE = {
    "name": "tinymoe",
    "layers": 4,
    "hidden": 1024,
    "heads": 8,
    "kv_heads": 8,
    "ffn_hidden": 4096,
    "ffn": "swiglu",
    "vocab": 8,
    "tied_embeddings": False,
    "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 1024},
}

CASES = {
    "dense-1f1b-tp2-pp2-dp2": (scenario(parallel={"tp": 2, "pp": 2, "dp": 2}), False),
    "interleaved-vpp2": (scenario(parallel={"tp": 2, "pp": 2, "dp": 2, "vpp": 2}, schedule="interleaved-1f1b"), False),
    "moe-ep4-pp2": (scenario(model=MOE, parallel={"tp": 1, "pp": 2, "dp": 4, "ep": 4}), False),
    "moe-aux-global": (
        scenario(model=MOE, parallel={"tp": 1, "pp": 2, "dp": 4, "ep": 4}, training={"balance": "aux-loss-global"}),
        False,
    ),  # cross-rank deps, not messages
    "offload-zero1": (
        scenario(
            parallel={"tp": 2, "pp": 2, "dp": 2, "zero": 1},
            training={"offload": {"optimizer": True, "activations": True}},
        ),
        False,
    ),  # host nodes
    "exact-every-rank": (scenario(parallel={"tp": 2, "pp": 2, "dp": 2}), True),
    # node-limited routing (pipelined two-hop all-to-all: scaleout_fraction < 1) and expert
    # imbalance (unexecuted FLOPs), flash attention (kernels' executed_flops)
    "moe-node-limited-imbalance": (
        scenario(
            model={**MOE, "moe": {**MOE["moe"], "experts": 16, "max_nodes_per_token": 1}},
            cluster={"preset": "dgx-h100", "devices": 16},
            parallel={"tp": 1, "pp": 1, "dp": 16, "ep": 16},
            training={"global_batch_size": 16, "expert_load": {"distribution": "zipf", "skew": 0.5, "seed": 0}},
        ),
        False,
    ),
}


def _trace(sc: dict, exact: bool = False):
    s = load_scenario(sc)
    ranks = list(range(s.layout.world)) if exact else None
    return s, build_trace(s.workload(), ranks=ranks)  # the workload simulate() builds (cluster domain size too)


def _decode(path: Path):
    """Every message of an ET file, read with Chakra's own protolib."""
    with open(path, "rb") as f:
        meta = pb.GlobalMetadata()
        assert protolib.decodeMessage(f, meta)
        nodes = []
        while True:
            n = pb.Node()
            if not protolib.decodeMessage(f, n):
                return meta, nodes
            nodes.append(n)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_round_trip_gives_the_same_step(tmp_path, name):
    sc, exact = CASES[name]
    s, tr = _trace(sc, exact)
    write_trace(tr, tmp_path / "et", scenario=s, format="chakra")
    back = read_trace(tmp_path / "et")
    assert [
        (o.id, o.rank, o.stream, o.kind, o.key, o.size_bytes, o.kernels, o.scaleout_fraction) for o in back.ops
    ] == [(o.id, o.rank, o.stream, o.kind, o.key, o.size_bytes, o.kernels, o.scaleout_fraction) for o in tr.ops]
    assert back.unexecuted_flops == tr.unexecuted_flops
    direct = simulate(sc, exact=exact)
    again = simulate(sc, trace=back, exact=exact)
    assert again.summary["step_time_s"] == pytest.approx(direct.summary["step_time_s"], rel=1e-9, abs=0)
    a = {k: v for k, v in direct.summary.items() if k != "sim_wall_s"}
    b = {k: v for k, v in again.summary.items() if k != "sim_wall_s"}
    assert a == b


def test_files_follow_chakra_conventions(tmp_path):
    """Read back with Chakra's protolib, not stepsim: one file per rank, node types and
    feeder attribute types as Chakra's et_feeder_node.cpp reads them, groups in comm_group.json."""
    s, tr = _trace(CASES["dense-1f1b-tp2-pp2-dp2"][0], exact=True)
    write_trace(tr, tmp_path, scenario=s, format="chakra")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comm_group.json"] + sorted(f"trace.{r}.et" for r in range(8))
    groups = {k: tuple(v) for k, v in json.loads((tmp_path / "comm_group.json").read_text()).items()}
    assert set(groups.values()) == {o.group for o in tr.ops if o.kind == "collective"}
    for r in range(8):
        meta, nodes = _decode(tmp_path / f"trace.{r}.et")
        assert meta.version == "1.0.0"
        mine = [o for o in tr.ops if o.rank == r]
        by_type = {
            t: [n for n in nodes if n.type == t]
            for t in (pb.COMP_NODE, pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)
        }
        assert len(by_type[pb.COMP_NODE]) == sum(o.kind == "compute" for o in mine)
        assert len(by_type[pb.COMM_COLL_NODE]) == sum(o.kind == "collective" for o in mine)
        assert len(by_type[pb.COMM_SEND_NODE]) == sum(o.kind == "send" for o in mine)
        assert len(by_type[pb.COMM_RECV_NODE]) == sum(o.kind == "send" and o.peer == r for o in tr.ops)
        ids = {n.id for n in nodes}
        for n in nodes:
            attrs = {a.name: a for a in n.attr}
            assert attrs["is_cpu_op"].WhichOneof("value") == "bool_val" and not attrs["is_cpu_op"].bool_val
            assert set(n.data_deps) <= ids  # dependencies stay inside the file
            if n.type == pb.COMM_COLL_NODE:
                op = next(o for o in mine if o.id == n.id)
                assert attrs["comm_type"].WhichOneof("value") == "int64_val"
                assert pb.CollectiveCommType.Name(attrs["comm_type"].int64_val) == op.coll.upper().replace("-", "_")
                assert attrs["comm_size"].int64_val == round(op.size_bytes)
                assert groups[attrs["pg_name"].string_val] == op.group
            if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                assert attrs["comm_src"].WhichOneof("value") == "int32_val"
                assert (attrs["comm_src"].int32_val == r) == (n.type == pb.COMM_SEND_NODE)
            if n.type == pb.COMP_NODE:
                op = next(o for o in mine if o.id == n.id)
                assert attrs["num_ops"].int64_val == round(op.flops)
                assert attrs["tensor_size"].uint64_val == round(op.bytes)


def test_handmade_fixture_is_what_its_script_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_handmade", DATA / "make_handmade.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(tmp_path)
    for p in DATA.iterdir():
        if p.suffix in (".et", ".json"):
            assert (tmp_path / p.name).read_bytes() == p.read_bytes(), p.name


def test_handmade_trace_simulates(tmp_path):
    """A trace stepsim did not write (tests/data/chakra/make_handmade.py). On the ideal
    chip (1e15 FLOP/s at efficiency 0.5, free memory traffic) rank i's (i + 1) TFLOP
    take 2(i + 1) ms; the all-reduce waits for rank 3 (8 ms); rank 1's last TFLOP
    waits for rank 0's message, sent after the all-reduce: 8 + 2 = 10 ms. The network
    (1e16 B/s, no latency) adds well under a microsecond."""
    tr = read_trace(DATA)
    assert tr.world == 4 and not tr.representative and tr.model_flops == 0
    assert sorted(o.kind for o in tr.ops) == ["collective"] * 4 + ["compute"] * 5 + ["host", "send"]
    res = simulate(ideal_scenario(4, parallel={"tp": 1, "pp": 1, "dp": 4}), trace=tr)
    assert res.summary["step_time_s"] == pytest.approx(0.010, rel=1e-4)
    ev = res.events.set_index(["rank", "name"])
    assert ev.loc[(1, "fwd2"), "start_s"] >= ev.loc[(0, "send_act"), "end_s"]
    assert ev.loc[(0, "grad_allreduce"), "end_s"] == pytest.approx(0.008, rel=1e-4)
    assert ev.loc[(2, "offload"), "kind"] == "host"
    # the CLI too, from the ET prefix
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(ideal_scenario(4, parallel={"tp": 1, "pp": 1, "dp": 4})))
    assert main(["run", str(p), "--trace", str(DATA / "handmade"), "--json"]) == 0


def test_pytorch_recorded_trace_simulates_on_the_host_stream():
    """A step of a small MLP on two CPU ranks, recorded by PyTorch and converted by Chakra's
    own tools (tests/data/chakra/pytorch/record_pytorch.py): every node is a CPU op, so each
    rank's events are host rows whose durations add up to its nodes' recorded
    ``duration_micros`` (read here with Chakra's own protolib), the ranks independent (gloo's
    all-reduce ran on the CPU: recorded host time, no COMM node)."""
    folder = DATA / "pytorch"
    recorded = {}
    for r in (0, 1):
        _, nodes = _decode(folder / f"mlp.{r}.et")
        assert {n.type for n in nodes} == {pb.COMP_NODE, pb.METADATA_NODE}
        assert any(n.name == "aten::addmm" for n in nodes) and any("allreduce" in n.name for n in nodes)
        recorded[r] = sum(n.duration_micros for n in nodes if n.type == pb.COMP_NODE)
    assert min(recorded.values()) > 1000  # milliseconds of CPU time, not a handful of zeros
    tr = read_trace(folder)
    assert tr.world == 2 and {(o.kind, o.stream, o.launches) for o in tr.ops} == {("host", "host", 0)}
    res = simulate(ideal_scenario(2, parallel={"tp": 1, "pp": 1, "dp": 2}), trace=tr)
    ev = res.events
    assert set(ev["stream"]) == {"host"}
    for r in (0, 1):
        rows = ev[ev["rank"] == r]
        assert rows["duration_s"].sum() == pytest.approx(recorded[r] / 1e6, rel=1e-12)
        assert rows["end_s"].max() == pytest.approx(recorded[r] / 1e6, rel=1e-12)  # one stream, back to back
    assert res.summary["step_time_s"] == pytest.approx(max(recorded.values()) / 1e6, rel=1e-12)


def test_cpu_nodes_host_time_gates_gpu_nodes_and_ctrl_deps_order(tmp_path):
    """A CPU node's recorded time delays the GPU nodes depending on it; ``ctrl_deps`` order
    nodes as ``data_deps`` do (node 2, first in the file, waits for node 1), and one naming
    no node of the file (the converter's dropped root) is ignored. A GPU node with num_ops is
    re-timed for the simulated chip (1 TFLOP: 2 ms on the ideal chip, 1 ms at twice its
    peak); one with only its recorded duration_micros (as Chakra's PyTorch converter writes
    kernels) keeps it on any chip."""
    late = pb.Node(id=2, name="late_cpu", type=pb.COMP_NODE, duration_micros=300, ctrl_deps=[1])
    first = pb.Node(id=1, name="first_cpu", type=pb.COMP_NODE, duration_micros=500, ctrl_deps=[0])
    gemm = _gpu(pb.Node(id=3, name="gemm", type=pb.COMP_NODE, data_deps=[2]), num_ops={"int64_val": 10**12})
    kern = _gpu(pb.Node(id=4, name="recorded_kernel", type=pb.COMP_NODE, duration_micros=700, data_deps=[3]))
    d = _write_et(tmp_path / "et", {0: [late, first, gemm, kern]})
    tr = read_trace(d)
    assert [(o.name, o.kind, o.stream) for o in tr.ops] == [
        ("first_cpu", "host", "host"),
        ("late_cpu", "host", "host"),
        ("gemm", "compute", "compute"),
        ("recorded_kernel", "compute", "compute"),
    ]
    sc = ideal_scenario(1, parallel={"tp": 1, "pp": 1, "dp": 1})
    res = simulate(sc, trace=tr)
    ev = res.events.set_index("name")
    assert ev.loc["first_cpu", "end_s"] == pytest.approx(500e-6, rel=1e-12)
    assert ev.loc["late_cpu", "start_s"] == pytest.approx(500e-6, rel=1e-12)
    assert ev.loc["gemm", "start_s"] >= ev.loc["late_cpu", "end_s"] == pytest.approx(800e-6, rel=1e-12)
    assert ev.loc["recorded_kernel", "duration_s"] == pytest.approx(700e-6, rel=1e-12)
    assert res.summary["step_time_s"] == pytest.approx(800e-6 + 2e-3 + 700e-6, rel=1e-4)
    fast = copy.deepcopy(sc)
    fast["cluster"]["chip"]["peak_flops_per_s"] = {"bf16": 2e15, "fp8": 4e15}
    ev2 = simulate(fast, trace=read_trace(d)).events.set_index("name")
    assert ev2.loc["gemm", "duration_s"] == pytest.approx(1e-3, rel=1e-4)
    assert ev2.loc["recorded_kernel", "duration_s"] == pytest.approx(700e-6, rel=1e-12)
    assert [o.launches for o in tr.ops] == [0, 0, -1, 0]  # a recorded kernel's launch is in the host time
    # the recorded time survives stepsim's own JSON and Chakra writers
    for fmt, out in (("json", tmp_path / "t.json"), ("chakra", tmp_path / "et2")):
        write_trace(tr, out, format=fmt)
        back = read_trace(out)
        assert [o.kernels for o in back.ops] == [o.kernels for o in tr.ops], fmt
        assert back.ops[3].kernels[0].recorded_s == 700e-6


def _write_et(folder: Path, nodes_by_rank: dict, groups=None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for r, nodes in nodes_by_rank.items():
        with open(folder / f"x.{r}.et", "wb") as f:
            protolib.encodeMessage(f, pb.GlobalMetadata(version="1.0.0"))
            for n in nodes:
                protolib.encodeMessage(f, n)
    if groups is not None:
        (folder / "comm_group.json").write_text(json.dumps(groups))
    return folder


def _gpu(n: pb.Node, **attrs) -> pb.Node:
    n.attr.append(pb.AttributeProto(name="is_cpu_op", bool_val=False))
    for k, v in attrs.items():
        n.attr.append(pb.AttributeProto(name=k, **v))
    return n


@pytest.mark.parametrize(
    "make,expect",
    [
        (lambda: _gpu(pb.Node(id=6, name="ckpt", type=10)), "node 6 (ckpt): node type 10 is not supported"),
        (
            lambda: _gpu(
                pb.Node(id=8, name="bar", type=pb.COMM_COLL_NODE),
                comm_type={"int64_val": pb.BARRIER},
                comm_size={"int64_val": 0},
            ),
            "node 8 (bar): collective BARRIER is not supported",
        ),
        (
            lambda: _gpu(
                pb.Node(id=9, name="ar", type=pb.COMM_COLL_NODE),
                comm_type={"int64_val": pb.ALL_REDUCE},
                comm_size={"int64_val": 8},
                pg_name={"string_val": "5"},
            ),
            "node 9 (ar): process group pg_name '5' is not in comm_group.json",
        ),
        (
            lambda: _gpu(
                pb.Node(id=3, name="rx", type=pb.COMM_RECV_NODE), comm_src={"int32_val": 1}, comm_size={"int64_val": 8}
            ),
            "node 3 (rx): receives from rank 1 (tag 0), but rank 1's trace has no",
        ),
    ],
)
def test_unsupported_nodes_are_refused_by_id_and_type(tmp_path, capsys, make, expect):
    d = _write_et(
        tmp_path / "et",
        {0: [make()], 1: [_gpu(pb.Node(id=1, name="c", type=pb.COMP_NODE), num_ops={"int64_val": 10})]},
        groups={"1": [0, 1]},
    )
    with pytest.raises(TraceError, match="x.0.et: " + expect.replace("(", r"\(").replace(")", r"\)")):
        read_trace(d)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(ideal_scenario(2, parallel={"tp": 1, "pp": 1, "dp": 2})))
    assert main(["run", str(p), "--trace", str(d)]) == 2
    err = capsys.readouterr().err
    assert expect.split(":")[0] in err and "Traceback" not in err


def test_truncated_file_is_refused(tmp_path):
    d = _write_et(tmp_path / "et", {0: [_gpu(pb.Node(id=1, name="c", type=pb.COMP_NODE), num_ops={"int64_val": 10})]})
    f = d / "x.0.et"
    f.write_bytes(f.read_bytes()[:-3])
    with pytest.raises(TraceError, match="truncated"):
        read_trace(d)


def test_trace_for_another_scenario_is_refused(tmp_path, capsys):
    """The scenario fingerprint rides in the ET metadata: another model is refused;
    a foreign trace is checked by its rank count only."""
    a = tmp_path / "a.yaml"
    a.write_text(yaml.safe_dump(scenario(parallel={"tp": 2, "pp": 2, "dp": 2})))
    b = tmp_path / "b.yaml"
    b.write_text(yaml.safe_dump(scenario(parallel={"tp": 2, "pp": 2, "dp": 2}, model={**MOE})))
    assert main(["trace", str(a), "--format", "chakra", "--out", str(tmp_path / "et")]) == 0
    assert "ASTRA-sim" in capsys.readouterr().out
    assert main(["run", str(a), "--trace", str(tmp_path / "et"), "--json"]) == 0
    capsys.readouterr()
    assert main(["run", str(b), "--trace", str(tmp_path / "et")]) == 2
    assert "trace.scenario" in capsys.readouterr().err
    c = tmp_path / "c.yaml"
    c.write_text(yaml.safe_dump(ideal_scenario(8, parallel={"tp": 1, "pp": 1, "dp": 8})))
    assert main(["run", str(c), "--trace", str(DATA)]) == 2
    assert "trace.world: the trace is for 4 ranks" in capsys.readouterr().err
