"""The terminal summary and the HTML report name the summary's bubble for what it is: a pipeline
bubble with pp > 1; with pp = 1 a device waiting for peers that reach a collective later."""

from types import SimpleNamespace

from simulator.results.html_report import headline_cards
from simulator.results.report import format_summary, idle_label


def _summary(pp: int) -> dict:
    return {
        "name": "x",
        "devices": 8,
        "layout": {"tp": 1, "cp": 1, "pp": pp, "dp": 8 // pp, "ep": 1, "vpp": 1, "zero": 1},
        "schedule": "1f1b",
        "micro_batches": 4,
        "parameters": 1e9,
        "active_parameters": 1e9,
        "step_time_s": 1.0,
        "tokens_per_s": 1.0,
        "mfu": 0.5,
        "hfu": 0.5,
        "model_tflops_per_device": 100.0,
        "bubble_fraction": 0.125,
        "exposed_comm_fraction": 0.0,
        "peak_memory_bytes": 1e9,
        "hbm_bytes": 8e10,
        "oom": False,
        "memory_breakdown_bytes": {"weights": 1e9},
        "sim_wall_s": 0.1,
        "simulated_ranks": 1,
        "events_processed": 10,
    }


def test_pp1_idle_is_waiting_on_peers_and_pp2_idle_a_pipeline_bubble():
    assert idle_label(_summary(1)) == "waiting on peers"
    assert idle_label(_summary(2)) == "pipeline bubble"
    one = format_summary(SimpleNamespace(summary=_summary(1)))
    two = format_summary(SimpleNamespace(summary=_summary(2)))
    assert "waiting on peers   12.5 % of the step" in one and "pipeline bubble" not in one
    assert "pipeline bubble    12.5 % of the step" in two
    assert "waiting on peers" in headline_cards(_summary(1))
    assert "pipeline bubble" in headline_cards(_summary(2))
