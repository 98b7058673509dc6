"""Property-based fuzzing of the input files (issue 41): scenarios, sweeps, topologies and
traces with random finite, non-finite, huge, tiny, wrong-type and unicode values each end in a
clean refusal naming the field or in an accepted input whose every number is finite (and, for
the scenarios simulated, a summary within physical bounds). The strategies and checks are in
tests/fuzz_inputs.py; benchmarks/fuzz_inputs.py runs them for as many examples as asked.

PP map files are fuzzed the same way. A fixed seed (``derandomize=True``) and small budgets keep
this file under ~30 s on 2 cores.
"""

from __future__ import annotations

import copy
from pathlib import Path

import fuzz_inputs as fz
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.errors import StepsimError

FIXED = settings(derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@settings(FIXED, max_examples=250)
@given(fz.scenarios())
def test_random_scenarios_are_refused_by_field_or_load_finite(d):
    fz.check_scenario(d)


@settings(FIXED, max_examples=12)
@given(fz.plausible_scenarios())
def test_random_scenarios_that_load_simulate_to_finite_bounded_figures(d):
    fz.check_scenario(d, simulate_it=True)


@settings(FIXED, max_examples=150)
@given(fz.sweeps())
def test_random_sweeps_are_refused_by_field_or_load(d):
    fz.check_sweep(d)


@settings(FIXED, max_examples=150)
@given(fz.maps())
def test_random_pp_maps_are_refused_by_field_or_load(d):
    fz.check_map(d)


TOPOLOGY = fz.small_topology()
TRACE = fz.small_trace()


@settings(FIXED, max_examples=120)
@given(st.data())
def test_random_topology_files_are_refused_naming_the_file_or_load_finite(tmp_path_factory, data):
    fz.check_topology(data.draw(fz.topology_docs(TOPOLOGY)), tmp_path_factory.mktemp("topo"))


@settings(FIXED, max_examples=120)
@given(st.data())
def test_random_trace_files_are_refused_by_field_or_load_finite(data):
    fz.check_trace(data.draw(fz.trace_docs(TRACE)))


@settings(FIXED, max_examples=80)
@given(st.binary(max_size=200) | st.text(max_size=80).map(lambda t: t.encode("utf-16")))
def test_random_bytes_as_a_scenario_file_are_refused_naming_the_file(tmp_path_factory, data):
    fz.check_scenario_bytes(data, tmp_path_factory.mktemp("bytes"))


# ---- the checks can fail: known-bad inputs are caught ------------------------------------------


def test_the_summary_check_catches_a_non_finite_or_absurd_figure():
    good = {
        "step_time_s": 1.0,
        "mfu": 0.4,
        "bubble_fraction": 0.1,
        "exposed_comm_fraction": 0.0,
        "peak_memory_bytes": 1e9,
        "hbm_bytes": 8e10,
        "comm_time_by_axis_s": {"tp": 0.1},
    }
    fz.check_summary(good)
    for key, bad in [("step_time_s", 1e300), ("mfu", 2.0), ("comm_time_by_axis_s", {"tp": float("nan")})]:
        with pytest.raises(AssertionError):
            fz.check_summary({**good, key: bad})


def test_the_refusal_check_wants_one_line_naming_a_field():
    fz.check_refusal(StepsimError("training.seq_len: must be >= 1", field="training.seq_len"))
    assert str(StepsimError("a: b\nc: d", field="a")) == "a: b\\nc: d"  # one line whatever the input
    for bad in (StepsimError("something went wrong"), StepsimError("a: " + "x" * 4000, field="a")):
        with pytest.raises(AssertionError):
            fz.check_refusal(bad)


@pytest.mark.parametrize(
    "path, value, field",
    [
        (("cluster", "chip", "hbm_bytes"), float("inf"), "cluster.chip.hbm_bytes"),
        (("perturbations", 0, "compute_scale"), 1e-300, "perturbations[0].compute_scale"),
        (("perturbations", 1, "bw_scale"), float("nan"), "perturbations[1].bw_scale"),
        (("cluster", "host_bw_bytes_per_s"), 1e-300, "cluster.host_bw_bytes_per_s"),
        (("cluster", "network", "nvls"), "false", "cluster.network.nvls"),
        (("cluster", "network", "sharp"), "no", "cluster.network.sharp"),
        (("training", "offload", "optimizer"), "yes", "training.offload.optimizer"),
        (("compute", "gemm_efficiency"), 1e-300, "compute.gemm_efficiency"),
        (("name",), "n" * 5_000_000, "name"),
    ],
)
def test_each_issue_41_value_is_refused_naming_its_field(path, value, field):
    from simulator import load_scenario

    d = copy.deepcopy(fz.PERTURBED)
    fz._set(d, path, value)
    with pytest.raises(StepsimError) as err:
        load_scenario(d)
    assert str(err.value).startswith(field), str(err.value)[:200]
    fz.check_refusal(err.value)


def test_context_parallelism_needs_a_sequence_of_2cp_chunks():
    from simulator import load_scenario

    d = copy.deepcopy(fz.TORUS)  # cp 2
    d["training"]["seq_len"] = 102  # not a multiple of 4
    with pytest.raises(StepsimError, match=r"^training\.seq_len: must be a multiple of 2 \* parallel\.cp = 4"):
        load_scenario(d)
    d["training"]["seq_len"] = 128
    load_scenario(d)


def test_a_sweep_over_the_case_cap_is_refused_before_it_is_expanded():
    from simulator.studies.sweep.spec import MAX_SWEEP_CASES, load_sweep

    case = {"parallel.pp": 2}
    with pytest.raises(StepsimError, match=r"^cases: 100,001 cases; the limit is 100,000"):
        load_sweep({"base": fz.SWITCHED, "cases": [case] * (MAX_SWEEP_CASES + 1)})


def test_a_sweep_whose_base_is_itself_is_refused(tmp_path):
    from simulator.studies.sweep.spec import load_sweep

    p = tmp_path / "s.yaml"
    p.write_text("base: s.yaml\ngrid: {parallel.pp: [1, 2]}\n")
    with pytest.raises(StepsimError, match=r"^base: names the sweep file itself"):
        load_sweep(p)


def test_special_files_are_refused_at_once_naming_the_file(tmp_path):
    import os

    from stepsim_fileio import read_text

    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)  # reading it would block forever
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(tmp_path / "loop2.yaml")
    (tmp_path / "loop2.yaml").symlink_to(loop)
    utf16 = tmp_path / "u16.yaml"
    utf16.write_bytes("model: llama3-8b\n".encode("utf-16"))
    for path, words in [
        (fifo, "FIFO"),
        (loop, "symbolic-link loop"),
        (Path("/dev/zero"), "character device"),
        (tmp_path, "directory"),
        (utf16, "UTF-16"),
    ]:
        with pytest.raises(StepsimError, match=words) as err:
            read_text(path, what="scenario file")
        assert str(err.value).startswith(str(path))


def test_failing_the_only_link_of_device_0_names_device_0():
    import networkx as nx

    from topologies.errors import TopologyError
    from topologies.topology import Topology

    G = nx.Graph(kind="custom")
    for i in range(3):
        G.add_node(f"d{i}", kind="device", index=i)
    G.add_node("s", kind="switch")
    for i in range(3):
        G.add_edge(f"d{i}", "s", bw_bytes_per_s=1e9, latency_s=1e-6, kind="nic")
    with pytest.raises(TopologyError, match="disconnects device 'd0'"):
        Topology(G, "star").without_link("d0", "s")


# ---- what the fuzzer found (each an internal error before) --------------------------------------


@pytest.mark.parametrize(
    "path, value, field",
    [
        (("cluster", "chip", "preset"), None, None),  # a chip without a preset: its own keys
        (("model", "layers"), 10**400, "model.layers"),  # OverflowError estimating the ops
        (("parallel", "t\np\u202e"), 2, "parallel.t\\np\\u202e"),  # a key that broke the line
    ],
)
def test_fuzzer_findings_are_refused_naming_the_field_or_load(path, value, field):
    from simulator import load_scenario

    d = copy.deepcopy(fz.SWITCHED)
    fz._set(d, path, value)
    if field is None:
        load_scenario(d)
        return
    with pytest.raises(StepsimError) as err:
        load_scenario(d)
    assert str(err.value).startswith(field) and "\n" not in str(err.value)


def test_fewer_tokens_than_experts_over_the_capacity_factor_keep_one_row_per_expert():
    from simulator import simulate

    d = copy.deepcopy(fz.MOE)
    d["model"]["moe"]["experts"] = 4000  # 256 assignments per micro-batch: capacity 1.5 * 0.064 < 1
    fz.check_summary(simulate(d).summary)


def test_a_nul_in_a_file_name_or_a_huge_integer_bandwidth_is_refused(tmp_path):
    from stepsim_fileio import read_text
    from topologies.io import load_topology

    with pytest.raises(StepsimError, match="NUL"):
        read_text("a\0b.yaml")
    doc = copy.deepcopy(TOPOLOGY)
    doc["edges"][0]["bw_bytes_per_s"] = 10**400
    p = tmp_path / "t.json"
    p.write_text(__import__("json").dumps(doc))
    with pytest.raises(StepsimError, match="bw_bytes_per_s"):
        load_topology(p)
