"""Trace files round-trip, and edited traces are checked."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from helpers import scenario

from simulator import simulate
from simulator.cli.app import main
from simulator.scenario.loading import load_scenario
from workloads.trace.builder import build_trace
from workloads.trace.io import read_trace, trace_from_dict, trace_to_dict, write_trace
from workloads.trace.ops import TraceError
from workloads.trace.shared import Workload


def _trace(sc):
    s = load_scenario(sc)
    return build_trace(Workload(s.model, s.layout, s.training, s.schedule))


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_written_trace_simulates_to_identical_summary(tmp_path, suffix):
    sc = scenario(parallel={"tp": 2, "pp": 2, "dp": 2})
    direct = simulate(sc)
    path = tmp_path / f"t{suffix}"
    write_trace(_trace(sc), path)
    again = simulate(sc, trace=read_trace(path))
    a = {k: v for k, v in direct.summary.items() if k != "sim_wall_s"}
    b = {k: v for k, v in again.summary.items() if k != "sim_wall_s"}
    assert a == b


def test_offload_ops_survive_a_trace_file(tmp_path):
    """Host copies (activation offload and reload) and optimizer CPU work are ops too:
    a written trace keeps them, so ``stepsim trace`` then ``run --trace`` gives the same step."""
    sc = scenario(
        parallel={"tp": 2, "pp": 2, "dp": 2},
        training={
            "seq_len": 1024,
            "micro_batch_size": 1,
            "global_batch_size": 8,
            "offload": {"optimizer": True, "activations": True},
        },
    )
    direct = simulate(sc)
    assert (direct.events["kind"] == "host").any()
    path = tmp_path / "t.json"
    write_trace(_trace(sc), path)
    again = simulate(sc, trace=read_trace(path))
    a = {k: v for k, v in direct.summary.items() if k != "sim_wall_s"}
    b = {k: v for k, v in again.summary.items() if k != "sim_wall_s"}
    assert a == b


def test_cli_trace_then_run(tmp_path, capsys):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(scenario(parallel={"tp": 2, "pp": 2, "dp": 2})))
    assert main(["trace", str(p), "--out", str(tmp_path / "t.json")]) == 0
    assert main(["run", str(p), "--trace", str(tmp_path / "t.json"), "--json"]) == 0
    out = capsys.readouterr().out
    assert '"step_time_s"' in out


def test_cycle_is_reported_by_name(tmp_path, capsys):
    d = trace_to_dict(_trace(scenario(parallel={"tp": 2, "pp": 2, "dp": 2})))
    ops = d["ops"]
    # make the first compute op depend on the last op of its rank: a cycle through the stream order
    first = next(o for o in ops if o["kind"] == "compute")
    last = [o for o in ops if o["rank"] == first["rank"] and o["stream"] == first["stream"]][-1]
    first["deps"].append(last["id"])
    with pytest.raises(TraceError, match="cycle") as ei:
        trace_from_dict(d)
    assert first["name"] in str(ei.value) or "rank" in str(ei.value)
    p = tmp_path / "cyc.json"
    p.write_text(json.dumps(d))
    s = tmp_path / "s.yaml"
    s.write_text(yaml.safe_dump(scenario(parallel={"tp": 2, "pp": 2, "dp": 2})))
    assert main(["run", str(s), "--trace", str(p)]) == 2
    assert "cycle" in capsys.readouterr().err


def test_dangling_dependency_is_reported():
    d = trace_to_dict(_trace(scenario()))
    d["ops"][3]["deps"].append(10**9)
    with pytest.raises(TraceError, match="unknown op 1000000000"):
        trace_from_dict(d)


def test_bad_fields_are_named():
    d = trace_to_dict(_trace(scenario()))
    d["ops"][0]["stream"] = "warp"
    with pytest.raises(TraceError, match=r"ops\[0\]\.stream"):
        trace_from_dict(d)


def test_mismatched_collective_order_is_a_deadlock_not_a_hang():
    """Two members reaching collectives in different orders: a clear error."""
    sc = scenario(parallel={"tp": 2, "pp": 1, "dp": 4})
    s = load_scenario(sc)
    tr = build_trace(Workload(s.model, s.layout, s.training, s.schedule), ranks=[0, 1])
    d = trace_to_dict(tr)
    tp1 = [o for o in d["ops"] if o["rank"] == 1 and o["stream"] == "tp"]
    tp1[0]["key"], tp1[1]["key"] = tp1[1]["key"], tp1[0]["key"]
    with pytest.raises(TraceError, match="deadlock"):
        simulate(sc, trace=trace_from_dict(d))


def test_trace_check_names_each_kind_of_bad_dependency():
    """The vectorised check (ids equal to positions) and the general one (ids out of order)
    give the same messages: an unknown id, a negative id, a non-integer dependency, a
    cycle through a later op, a cycle through stream order."""
    from workloads.trace.ops import Op, Trace

    def trace(*ops):
        return Trace(ops=list(ops), ranks=(0,), weight={0: 1}, static_memory={0: {}}, world=1)

    def op(i, deps, stream="compute"):
        return Op(id=i, rank=0, stream=stream, kind="compute", name=f"o{i}", deps=tuple(deps))

    trace(op(0, [2], "a"), op(1, [], "b"), op(2, [1], "b")).check()  # a later op, no cycle
    trace(op(1, []), op(0, [1])).check()  # ids out of order
    for ops, message in (
        ((op(0, []), op(1, [5])), "op 1 (o1 on rank 0) depends on unknown op 5"),
        ((op(0, []), op(1, [-1])), "depends on unknown op -1"),
        ((op(0, []), op(1, [("F", 0, 0, 0)])), "depends on unknown op ('F', 0, 0, 0)"),
        ((op(0, [1], "a"), op(1, [0], "b")), "cycle through ops 0 (o0 on rank 0), 1 (o1 on rank 0)"),
        ((op(0, [], "a"), op(1, [2], "a"), op(2, [1], "b")), "cycle through ops 1 (o1 on rank 0), 2"),
        ((op(0, []), op(0, [])), "duplicate op ids"),
    ):
        with pytest.raises(TraceError, match=re.escape(message)):
            trace(*ops).check()


def test_moe_kernel_fields_survive_a_trace_file_and_bad_ones_are_named(tmp_path):
    """The router's own math dtype (BF16 in an FP8 step, TF32 gradients with an FP32 router) and
    the permutations' backward bytes are written and read back, so the step is the same."""
    from test_moe import moe_scenario

    sc = moe_scenario(training={"dtype": "fp8", "moe_router_dtype": "fp32"})
    tr = _trace(sc)
    d = trace_to_dict(tr)
    router = next(k for o in d["ops"] if o["kind"] == "compute" for k in o["kernels"] if k["name"] == "router")
    assert router["math_dtype"] == "bf16" and router["grad_math_dtype"] == "tf32"
    assert any("bwd_bytes" in k for o in d["ops"] if o["kind"] == "compute" for k in o["kernels"])
    write_trace(tr, tmp_path / "t.json")
    a = simulate(sc).summary
    b = simulate(sc, trace=read_trace(tmp_path / "t.json")).summary
    assert a["step_time_s"] == b["step_time_s"]
    router["math_dtype"] = "fp4"
    with pytest.raises(TraceError, match=r"math_dtype: must be one of bf16, fp8, tf32"):
        trace_from_dict(d)


def test_cli_trace_writes_the_ranks_run_simulates_where_groups_straddle_domains(tmp_path, capsys):
    """EP48 on 144 GB200: one rank per class of ranks that see the network alike (six, each
    standing for 24 devices), as ``stepsim run`` simulates them; running the written trace gives
    run's step."""
    from test_moe import TINY_MOE

    model = dict(TINY_MOE, hidden=2048, ffn_hidden=8192, moe={**TINY_MOE["moe"], "experts": 48})
    sc = scenario(
        model=model,
        cluster={"preset": "gb200-nvl72", "devices": 144},
        parallel={"tp": 1, "pp": 1, "dp": 144, "ep": 48},
        training={"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 288},
    )
    p, t = tmp_path / "s.yaml", tmp_path / "t.json"
    p.write_text(yaml.safe_dump(sc))
    assert main(["trace", str(p), "--out", str(t)]) == 0
    capsys.readouterr()
    tr = read_trace(t)
    six = [0, 24, 48, 72, 96, 120]
    assert list(tr.ranks) == six and tr.representative and tr.weight == dict.fromkeys(six, 24)
    assert main(["run", str(p), "--trace", str(t), "--json"]) == 0
    replayed = json.loads(capsys.readouterr().out)["step_time_s"]
    assert replayed == pytest.approx(simulate(sc).summary["step_time_s"], rel=1e-9)
