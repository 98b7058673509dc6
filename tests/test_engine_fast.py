"""The event loop's shortcuts change no figure: chains of ops with known durations run
as one event, and communication nothing else can meet on the network runs as a known
duration (``simulate(..., chain_ops=False, private_phases=False)``), against every op through
its own event and the network, on small scenarios of every schedule."""

from __future__ import annotations

import pytest
from helpers import rerun_engine, scenario
from test_exact import CASES

from simulator import simulate

#: Summary keys that describe the run, not the step.
RUN_KEYS = {"sim_wall_s", "stepsim_version", "events_processed"}

SCENARIOS = {
    **{k: CASES[k] for k in ("1f1b", "interleaved", "zb-h1", "dualpipe", "moe-ep", "torus")},
    # Megatron-style: TP inside a node, pipeline sends across nodes (TP phases private)
    "tp8-1f1b": scenario(
        cluster={"preset": "dgx-a100", "devices": 16},
        parallel={"tp": 8, "pp": 2, "dp": 1},
        training={"global_batch_size": 8},
    ),
    "tp8-interleaved": scenario(
        cluster={"preset": "dgx-a100", "devices": 16},
        parallel={"tp": 8, "pp": 2, "dp": 1, "vpp": 2, "sequence_parallel": True},
        schedule="interleaved-1f1b",
        training={"global_batch_size": 8},
    ),
}


def _figures(res) -> dict:
    return {k: v for k, v in res.summary.items() if k not in RUN_KEYS}


def _plain(sc):
    return simulate(sc, chain_ops=False, private_phases=False)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_shortcuts_change_no_figure(name):
    sc = SCENARIOS[name]
    fast = simulate(sc)
    plain = _plain(sc)
    assert _figures(fast) == _figures(plain)  # bit for bit, every figure
    assert fast.raw.network_stats["phases_started"] == plain.raw.network_stats["phases_started"]
    assert fast.raw.network_stats["flows_started"] == plain.raw.network_stats["flows_started"]
    assert fast.raw.network_stats["reserved_phases"] == plain.raw.network_stats["reserved_phases"]
    assert fast.memory.equals(plain.memory)  # the memory timeline, row by row
    ev_f = fast.events.sort_values(["rank", "start_s", "stream", "name"], kind="stable").reset_index(drop=True)
    ev_p = plain.events.sort_values(["rank", "start_s", "stream", "name"], kind="stable").reset_index(drop=True)
    assert ev_f[["rank", "name", "start_s", "end_s"]].equals(ev_p[["rank", "name", "start_s", "end_s"]])
    if name.startswith("tp8"):
        eng, raw = rerun_engine(fast)
        assert raw.step_time_s == fast.raw.step_time_s
        assert eng.private_ops_run > 0  # the private path was taken
        eng, _ = rerun_engine(fast, chain_ops=False, private_phases=False)
        assert eng.private_ops_run == 0


def test_private_tp_phases_book_the_same_link_bytes():
    import numpy as np

    res = simulate(SCENARIOS["tp8-1f1b"])
    fast, _ = rerun_engine(res)
    plain, _ = rerun_engine(res, chain_ops=False, private_phases=False)
    assert fast.net.stats.link_bytes.sum() > 0
    assert np.array_equal(fast.net.stats.link_bytes, plain.net.stats.link_bytes)
    assert fast.net.stats.unit_flows_started == plain.net.stats.unit_flows_started


def test_chains_alone_change_no_figure():
    sc = SCENARIOS["dualpipe"]
    fast = simulate(sc)
    plain = simulate(sc, chain_ops=False)
    assert _figures(fast) == _figures(plain)
