"""The event loop's shortcuts change no figure: chains of ops with known durations run
as one event, and communication nothing else can meet on the network runs as a known
duration (``simulate(..., chain_ops=False, private_phases=False)``), against every op through
its own event and the network, on small scenarios of every schedule."""

from __future__ import annotations

import pytest
from helpers import rerun_engine, scenario
from test_exact import CASES
from test_moe import moe_scenario

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
    # SimAI's workload in small: TP2 collectives share NVLink links with the same rank's expert
    # all-to-alls (EP16 over four nodes) and ZeRO-1 gathers, yet run between other compute ops
    # (simulator.engine.ordering: most TP phases private)
    "tp2-ep16-interleaved": moe_scenario(
        cluster={"preset": "dgx-h100", "devices": 64},
        parallel={"tp": 2, "pp": 2, "dp": 16, "ep": 16, "etp": 2, "vpp": 2, "sequence_parallel": True},
        schedule="interleaved-1f1b",
        training={"global_batch_size": 64},
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
    if name.startswith("tp"):
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


def test_ops_ordered_with_their_ranks_other_streams_run_private(monkeypatch):
    """Tensor-parallel collectives that share NVLink links with the same rank's expert
    all-to-alls and ZeRO-1 gathers, each between other compute ops, run as known durations
    (simulator.engine.ordering); those that may meet a gather of the step's start do not.
    Without the ordering none of them would (their links have other users)."""
    from simulator.engine import private

    res = simulate(SCENARIOS["tp2-ep16-interleaved"])
    eng, raw = rerun_engine(res)
    tp = [op.id for op in eng.trace.ops if op.stream == "tp"]
    ordered = sum(i in eng._known for i in tp)
    assert 0 < ordered < len(tp)
    assert raw.step_time_s == res.raw.step_time_s
    monkeypatch.setattr(private, "_ordered_on_shared_links", lambda *a: set())
    eng, raw = rerun_engine(res)
    assert not any(i in eng._known for i in tp)
    assert raw.step_time_s == res.raw.step_time_s
