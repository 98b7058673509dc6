"""The input fuzzer's strategies and checks (issue 41), shared by tests/test_fuzz_inputs.py
(a fixed seed and a small budget) and benchmarks/fuzz_inputs.py (as many examples as asked).

Four kinds of input are generated from small valid ones by setting one to three keys to
random values — finite, non-finite, huge, tiny, negative, wrong-type, unicode, quoted
numbers and words for flags — and the raw bytes of a scenario file. Each must end in

* a clean refusal: a :class:`StepsimError` whose one-line message starts with the field (or
  the file) it names (:func:`check_refusal`), or
* an accepted input: for a scenario, a :class:`Scenario` whose every number is finite and, when
  simulated, a summary whose every figure is finite and within physical bounds
  (:func:`check_summary`).

Anything else (another exception, a non-finite figure, a message naming nothing) fails.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from simulator.errors import StepsimError

TINY_MODEL = {"name": "tiny", "layers": 2, "hidden": 256, "heads": 4, "ffn_hidden": 512, "vocab": 1000}
SWITCHED = {
    "name": "fuzz-switched",
    "model": dict(TINY_MODEL),
    "cluster": {
        "preset": "dgx-h100",
        "devices": 8,
        "host_bw_bytes_per_s": 32e9,
        "chip": {
            "preset": "h100",
            "hbm_bytes": 80e9,
            "hbm_bw_bytes_per_s": 3.35e12,
            "peak_flops_per_s": {"bf16": 989e12},
        },
        "network": {
            "nic_bw_bytes_per_s": 50e9,
            "domain_bw_bytes_per_s": 450e9,
            "domain_latency_s": 1.6e-6,
            "nic_latency_s": 1.4e-6,
            "oversubscription": 1.0,
            "nvls": False,
            "sharp": False,
            "rails": True,
        },
    },
    "parallel": {"tp": 2, "pp": 2, "cp": 1, "dp": 2, "zero": 1, "sequence_parallel": True},
    "training": {
        "seq_len": 128,
        "micro_batch_size": 1,
        "global_batch_size": 4,
        "flash_attention": True,
        "offload": {"optimizer": False, "activations": False},
    },
    "compute": {"gemm_efficiency": 0.7, "launch_overhead_s": 4e-6, "gemm_dim_half": 64.0},
    "network_calibration": {"efficiency": {"nic": 0.8}, "message_overhead_s": {"nvlink": 1e-6}},
}
PERTURBED = {
    **copy.deepcopy(SWITCHED),
    "name": "fuzz-perturbed",
    "perturbations": [{"devices": [1], "compute_scale": 0.9}, {"link": ["d0", "p0.nvsw0"], "bw_scale": 0.5}],
}
TORUS = {
    "name": "fuzz-torus",
    "model": dict(TINY_MODEL),
    "cluster": {
        "devices": 8,
        "chip": {
            "peak_flops_per_s": {"bf16": 459e12},
            "hbm_bytes": 95e9,
            "hbm_bw_bytes_per_s": 2.765e12,
            "family": "tpu",
        },
        "network": {
            "kind": "torus",
            "shape": [2, 2, 2],
            "link_bw_bytes_per_s": 90e9,
            "link_latency_s": 1e-6,
            "wraparound": [True, False, True],
        },
        "pods": {"count": 1, "dcn_bw_bytes_per_s": 6.25e9, "dcn_latency_s": 1e-5},
    },
    "parallel": {"tp": 2, "pp": 2, "cp": 2},
    "training": {"seq_len": 128, "global_batch_size": 4},
}
MOE = {
    "name": "fuzz-moe",
    "model": {**TINY_MODEL, "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 256, "shared_experts": 1}},
    "cluster": {"preset": "dgx-h100", "devices": 8},
    "parallel": {"tp": 1, "pp": 2, "ep": 4},
    "training": {
        "seq_len": 128,
        "global_batch_size": 4,
        "expert_load": {"distribution": "zipf", "skew": 1.2, "capacity_factor": 1.5, "seed": 3},
    },
}
# The newest keys at once (placement, Megatron-Core's MoE and TP overlaps, CUDA graphs, the host
# stream, the allocator's reserve, padded experts); and a torus placed in 2 x 2 tiles.
NEWEST = {
    "name": "fuzz-newest",
    "model": {**TINY_MODEL, "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 256, "shared_experts": 1}},
    "cluster": {"preset": "dgx-h100", "devices": 8},
    "placement": {"devices_per_domain": 4},
    "parallel": {"tp": 2, "pp": 1, "ep": 4, "etp": 1, "sequence_parallel": True, "order": "tp-cp-ep-dp-pp"},
    "training": {
        "seq_len": 128,
        "global_batch_size": 4,
        "dtype": "fp8",
        "overlap_moe_expert_parallel_comm": True,
        "tp_comm_overlap": True,
        "cuda_graphs": "per-layer",
        "moe_host_sync": False,
        "moe_dispatch_dtype": "bf16",
        "moe_router_dtype": "fp32",
        "host_launch_s": 5e-6,
        "allocator_reserve_fraction": 0.05,
        "fp8_weight_cache": True,
        "expert_load": {"distribution": "zipf", "skew": 1.1, "capacity_factor": 1.25, "pad_to_capacity": True},
    },
    "compute": {"overlap_a2a_slowdown": 1.3, "comm_sm_fraction": 0.15},
}
TILED = {
    "name": "fuzz-tiled",
    "model": dict(TINY_MODEL),
    "cluster": {"preset": "tpu-v5p", "devices": 16, "network": {"shape": [4, 4]}},
    "placement": {"tile": [2, 2]},
    "parallel": {"tp": 4, "pp": 2},
    "training": {"seq_len": 128, "global_batch_size": 4},
}
BASES = {"switched": SWITCHED, "perturbed": PERTURBED, "torus": TORUS, "moe": MOE, "newest": NEWEST, "tiled": TILED}


def paths(d: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of ``d``, list positions included (``('perturbations', 0, 'bw_scale')``)."""
    out = []
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        out.append(prefix + (k,))
        out.extend(paths(v, prefix + (k,)))
    return out


PATHS = {name: paths(base) for name, base in BASES.items()}

SPECIAL_FLOATS = [math.inf, -math.inf, math.nan, 1e-300, 1e300, 0.0, -0.0, 5e-324, 1.7976931348623157e308, -1.0]
SPECIAL_INTS = [0, -1, 1, 2, 3, 8, 16, 10**12, 2**63, 10**400]
WORDS = ["false", "no", "true", "yes", "off", "1e9", "50e9", "inf", "nan", "", "x" * 300, "d0", "é\u202e\U0001f600"]

VALUES = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(SPECIAL_FLOATS),
    st.integers(),
    st.sampled_from(SPECIAL_INTS),
    st.booleans(),
    st.none(),
    st.text(max_size=12),
    st.sampled_from(WORDS),
    st.lists(st.one_of(st.integers(-2, 9), st.floats(allow_nan=True), st.text(max_size=3)), max_size=3),
    st.dictionaries(st.text(max_size=4), st.one_of(st.integers(), st.floats()), max_size=2),
)
#: Multiply a number by these (a plausible value now and then, so that some cases run).
FACTORS = st.sampled_from([0.5, 2.0, 1e-3, 1e3, 1e-6, 1e6, 1e-12, 1e12, -1.0, 1.0001])


def _get(d, path):
    for k in path:
        d = d[k]
    return d


def _set(d, path, value) -> None:
    node = d
    for k in path[:-1]:
        if isinstance(node, dict) and k in node or isinstance(node, list) and isinstance(k, int) and k < len(node):
            node = node[k]
        else:
            return
    if isinstance(node, dict) or isinstance(node, list) and isinstance(path[-1], int) and path[-1] < len(node):
        node[path[-1]] = value


@st.composite
def scenarios(draw) -> dict:
    """A base scenario with one to three keys set to random values (or to their own value
    scaled by a random factor)."""
    name = draw(st.sampled_from(sorted(BASES)))
    d = copy.deepcopy(BASES[name])
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS[name]))
        old = _get(BASES[name], path)
        if isinstance(old, (int, float)) and not isinstance(old, bool) and draw(st.booleans()):
            value = old * draw(FACTORS)
            value = int(value) if isinstance(old, int) and draw(st.booleans()) else value
        else:
            value = draw(VALUES)
        _set(d, path, value)
    return d


NUMERIC_PATHS = {
    name: [
        p for p in ps if isinstance(_get(BASES[name], p), (int, float)) and not isinstance(_get(BASES[name], p), bool)
    ]
    for name, ps in PATHS.items()
}


@st.composite
def plausible_scenarios(draw) -> dict:
    """A base scenario with one or two of its numbers scaled by 1/1000 to 1000: most load,
    so that these are the ones simulated."""
    name = draw(st.sampled_from(sorted(BASES)))
    d = copy.deepcopy(BASES[name])
    for _ in range(draw(st.integers(1, 2))):
        path = draw(st.sampled_from(NUMERIC_PATHS[name]))
        old = _get(BASES[name], path)
        value = old * draw(st.sampled_from([0.5, 2.0, 0.9, 1.1, 1e-3, 1e3, 0.01, 100.0]))
        _set(d, path, int(value) if isinstance(old, int) else value)
    return d


def check_refusal(err: StepsimError) -> None:
    """A clean refusal: one line of reasonable length that starts with the field (or file) at fault."""
    msg = str(err)
    assert isinstance(err, StepsimError), type(err)
    assert msg and "\n" not in msg, repr(msg)
    assert len(msg) < 3000, f"{len(msg)} characters: {msg[:200]}"
    head = msg.split(": ", 1)[0]
    assert head and ": " in msg, f"names no field: {msg!r}"
    if err.field:
        assert msg.startswith(err.field) or err.field in head or head in err.field, (err.field, msg)


def _numbers(obj, where="") -> list[tuple[str, float]]:
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return []
    if isinstance(obj, (int, float)):
        return [(where, obj)]
    if isinstance(obj, dict):
        return [x for k, v in obj.items() for x in _numbers(v, f"{where}.{k}")]
    if isinstance(obj, (list, tuple)):
        return [x for i, v in enumerate(obj) for x in _numbers(v, f"{where}[{i}]")]
    return []


def check_summary(summary: dict, scenario: dict | None = None) -> None:
    """Every figure finite; the step in (0, 1e7] s; fractions in [0, 1]; MFU at most the
    fastest device's speed-up; memory >= 0."""
    from simulator.scenario.checks import MAX_STEP_TIME_S

    for where, x in _numbers(summary):
        assert math.isfinite(x), f"summary{where} = {x}"
    step = summary["step_time_s"]
    assert 0 < step <= MAX_STEP_TIME_S, step
    for key in ("bubble_fraction", "exposed_comm_fraction", "offload_wait_fraction"):
        if summary.get(key) is not None:
            assert -1e-9 <= summary[key] <= 1 + 1e-9, (key, summary[key])
    speedup = max([1.0] + [p.get("compute_scale", 1.0) for p in (scenario or {}).get("perturbations", [])])
    assert 0 <= summary["mfu"] <= speedup * (1 + 1e-6), summary["mfu"]
    assert summary["peak_memory_bytes"] >= 0 and summary["hbm_bytes"] > 0


def check_scenario(d: dict, simulate_it: bool = False) -> str:
    """``"refused"``, ``"loaded"`` or ``"simulated"``; fails on anything else."""
    from simulator import simulate
    from simulator.scenario.loading import load_scenario

    try:
        sc = load_scenario(d)
    except StepsimError as err:
        check_refusal(err)
        return "refused"
    for where, x in _numbers(_scenario_numbers(sc)):
        assert math.isfinite(x), f"scenario{where} = {x}"
    if not simulate_it:
        return "loaded"
    try:
        res = simulate(sc)
    except StepsimError as err:
        check_refusal(err)
        return "refused"
    check_summary(res.summary, d)
    return "simulated"


def _scenario_numbers(sc) -> dict:
    from simulator.scenario.serialise import scenario_to_dict

    return scenario_to_dict(sc)


# ---- sweeps -------------------------------------------------------------------------------

SWEEP_KEYS = ["name", "base", "grid", "cases", "skip_invalid", "where"]


@st.composite
def sweeps(draw) -> dict:
    """A sweep mapping with a tiny base and random (sometimes valid) grid, cases and flags."""
    axis = st.sampled_from(
        ["parallel.pp", "parallel.tp", "cluster.network.nvls", "training.seq_len", "cluster.devices", "nope", "a..b", 7]
    )
    d: dict = {"base": copy.deepcopy(SWITCHED)}
    if draw(st.booleans()):
        d["grid"] = draw(st.dictionaries(axis, st.one_of(st.lists(VALUES, max_size=3), VALUES), max_size=2))
    if draw(st.booleans()):
        d["cases"] = draw(st.one_of(st.lists(st.dictionaries(axis, VALUES, max_size=2), max_size=3), VALUES))
    for key in ("name", "skip_invalid", "where"):
        if draw(st.booleans()):
            d[key] = draw(st.one_of(VALUES, st.sampled_from(["parallel.pp > 1", "__import__('os')", "x" * 500])))
    if draw(st.integers(0, 9)) == 0:
        d["base"] = draw(VALUES)
    return d


def check_sweep(d: dict) -> str:
    from simulator.studies.sweep.spec import load_sweep

    try:
        spec = load_sweep(d)
    except StepsimError as err:
        check_refusal(err)
        return "refused"
    assert len(spec.assignments) <= 100_000
    return "loaded"


# ---- PP map files -------------------------------------------------------------------------

MAP = {
    "name": "fuzz-map",
    "devices": 16,
    "models": [{**TINY_MODEL, "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 256}}],
    "training": {"seq_len": 128, "sequences_per_device": 1, "dtype": "bf16"},
    "grid": {"cluster": {"preset": "dgx-h100"}, "domain_sizes": [8, 16], "nic_gbps": [25, 50]},
    "systems": {"H800": {"cluster": {"preset": "h800"}, "training": {"dtype": "fp8"}}},
    "search": {"max_tp": 2, "pp": [1, 2], "zero": [1], "schedules": ["1f1b"], "nopp_micro_batch_sizes": [1]},
    "simulate": {"with_pp": 1, "without_pp": 1},
    "marks": {"H800": [8, 50]},
}
MAP_PATHS = paths(MAP)


@st.composite
def maps(draw) -> dict:
    """The small map with one to three keys (a section, a list, an entry) set to random values."""
    d = copy.deepcopy(MAP)
    for _ in range(draw(st.integers(1, 3))):
        _set(d, draw(st.sampled_from(MAP_PATHS)), draw(VALUES))
    return d


def check_map(d: dict) -> str:
    from simulator.studies.ppmap.spec import load_map, points

    try:
        spec = load_map(d)
    except StepsimError as err:
        check_refusal(err)
        return "refused"
    points(spec)  # every point's scenario mapping can be made
    return "loaded"


# ---- topology files ---------------------------------------------------------------------------


def small_topology() -> dict:
    """A 4-device DGX H100 topology as its JSON document."""
    from topologies.io import save_topology
    from topologies.presets import build_cluster, cluster_preset

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "t.json"
        save_topology(build_cluster(cluster_preset("dgx-h100", 4)), p)
        return json.loads(p.read_text())


@st.composite
def topology_docs(draw, base: dict) -> dict:
    """``base`` with one to three graph, node or edge attributes set to random values."""
    d = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        part = draw(st.sampled_from(["graph", "nodes", "edges"]))
        if part == "graph":
            key = draw(st.sampled_from(["nvls", "sharp", "domain_size", "kind", "pods", "shape", "wrap"]))
            d["graph"][key] = draw(VALUES)
        else:
            item = d[part][draw(st.integers(0, len(d[part]) - 1))]
            keys = (
                ["kind", "index", "domain", "pod", "id"] if part == "nodes" else ["bw_bytes_per_s", "latency_s", "kind"]
            )
            bw = item.get("bw_bytes_per_s")
            if part == "edges" and isinstance(bw, float) and draw(st.booleans()):
                item["bw_bytes_per_s"] = bw * draw(FACTORS)
            else:
                item[draw(st.sampled_from(keys))] = draw(VALUES)
    return d


def check_topology(doc: dict, folder: Path) -> str:
    from topologies.io import load_topology

    p = folder / "fuzz-topology.json"
    try:
        p.write_text(json.dumps(doc))
    except ValueError:  # a value json cannot write (a circular reference)
        return "refused"
    try:
        topo = load_topology(p)
    except StepsimError as err:
        check_refusal(err)
        return "refused"
    assert all(math.isfinite(x) and x > 0 for x in topo.link_capacity.tolist())
    assert all(math.isfinite(x) and x >= 0 for x in topo.link_latency.tolist())
    return "loaded"


# ---- trace files ------------------------------------------------------------------------------


def small_trace() -> dict:
    from simulator.scenario.loading import load_scenario
    from workloads.trace.builder import build_trace
    from workloads.trace.io import scenario_record, trace_to_dict

    sc = load_scenario(SWITCHED)
    d = trace_to_dict(build_trace(sc.workload()))
    d["scenario"] = scenario_record(sc)
    return d


@st.composite
def trace_docs(draw, base: dict) -> dict:
    """``base`` with one to three top-level, op or kernel fields set to random values."""
    d = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["top", "op", "kernel"]))
        if where == "top":
            d[
                draw(st.sampled_from(["model_flops", "world", "ranks", "weight", "static_memory", "unexecuted_flops"]))
            ] = draw(VALUES)
            continue
        op = d["ops"][draw(st.integers(0, len(d["ops"]) - 1))]
        if where == "kernel" and op.get("kernels"):
            op["kernels"][0][draw(st.sampled_from(["flops", "bytes", "executed_flops", "m", "kind"]))] = draw(VALUES)
        else:
            keys = ["size_bytes", "rate_bytes_per_s", "peer", "group", "deps", "mem", "mb", "scaleout_fraction", "rank"]
            op[draw(st.sampled_from(keys))] = draw(VALUES)
    return d


def check_trace(doc: dict) -> str:
    from workloads.trace.io import trace_from_dict

    try:
        trace = trace_from_dict(json.loads(json.dumps(doc)))
    except StepsimError as err:
        check_refusal(err)
        return "refused"
    except (TypeError, ValueError, AttributeError, OverflowError):
        return "refused"  # read_trace turns these into "trace: FILE: malformed field (...)"
    for op in trace.ops:
        assert math.isfinite(op.size_bytes) and 0 <= op.size_bytes <= 1e15
        for k in op.kernels:
            assert math.isfinite(k.flops) and math.isfinite(k.bytes)
    return "loaded"


# ---- raw bytes of a scenario file -------------------------------------------------------------


def check_scenario_bytes(data: bytes, folder: Path) -> str:
    from simulator.scenario.loading import load_scenario

    p = folder / "fuzz-scenario.yaml"
    p.write_bytes(data)
    try:
        load_scenario(p)
    except StepsimError as err:
        check_refusal(err)
        return "refused"
    return "loaded"
