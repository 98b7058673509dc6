"""Failures over a run (``stepsim goodput``, simulator/studies/goodput.py): the closed forms of
the checkpoint interval, the Llama 3 interruption rates, and Llama 3 405B's goodput against the
effective training time its paper reports (arXiv 2407.21783 §3.3.4: "higher than 90%")."""

from __future__ import annotations

import json
import math

import pytest

from simulator.cli.app import main
from simulator.scenario.loading import load_scenario
from simulator.studies import goodput as gp


def test_young_and_daly_intervals():
    # Young: sqrt(2 delta M); Daly adds higher-order terms and tends to Young for delta << M
    assert gp.young_interval_s(10.0, 3600.0) == pytest.approx(math.sqrt(2 * 10 * 3600))
    assert gp.daly_interval_s(1.0, 1e6) == pytest.approx(gp.young_interval_s(1.0, 1e6), rel=2e-3)
    # Daly, eq. 37, by hand: delta = 300 s, M = 3 h
    d, M = 300.0, 3 * 3600.0
    x = d / (2 * M)
    assert gp.daly_interval_s(d, M) == pytest.approx(math.sqrt(2 * d * M) * (1 + math.sqrt(x) / 3 + x / 9) - d)
    assert gp.daly_interval_s(3 * M, M) == M  # a checkpoint longer than two MTBFs: checkpoint every M


def test_dalys_interval_is_near_the_best_of_the_goodput_model():
    delta, restart, M = 60.0, 600.0, 3 * 3600.0
    best = max(gp.goodput_fraction(t, delta, restart, M) for t in range(60, 20_000, 10))
    assert gp.goodput_fraction(gp.daly_interval_s(delta, M), delta, restart, M) == pytest.approx(best, rel=1e-3)


def test_llama3_rates_give_its_interruptions_back():
    rates = gp.interruptions_per_hour(16_384)
    assert sum(rates.values()) * 54 * 24 == pytest.approx(419)  # the 419 unexpected interruptions
    assert sum(gp.interruptions_per_hour(8_192).values()) == pytest.approx(sum(rates.values()) / 2)
    assert max(rates, key=rates.get) == "faulty GPU"


def test_llama3_405b_goodput_is_in_the_papers_range(capsys):
    """The built-in llama3-405b-16384xh100 at Llama 3's rates, 2 TB/s storage and a 10-minute
    restart: above 90 % of wall time trains, as the paper reports, and not above 99 %."""
    assert main(["goodput", "llama3-405b-16384xh100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 0.90 < out["goodput_fraction"] < 0.99
    assert out["mtbf_s"] == pytest.approx(54 * 24 * 3600 / 419)
    assert out["effective_tokens_per_day"] == pytest.approx(out["tokens_per_s"] * 86_400 * out["goodput_fraction"])
    slower = gp.goodput(405e9, 16_384, 1.0, 2e12, rate_scale=4.0).goodput_fraction
    assert slower < out["goodput_fraction"]


def test_a_failed_tray_replans_the_placement():
    """TP8 on 144 GB200 NVL72 (two racks of 72): with 4 GPUs of a rack out, 48 a rack keep
    every TP group in a rack and divide the job, so it runs on three racks."""
    sc = load_scenario(
        {
            "model": "llama3-8b",
            "cluster": {"preset": "gb200-nvl72", "devices": 144},
            "parallel": {"tp": 8, "pp": 1, "dp": 18},
            "training": {"global_batch_size": 144},
        }
    )
    r = gp.replan_after_failure(sc, 4, 1.0)
    assert (r.capacity, r.devices_per_domain, r.domains_before, r.domains_after) == (72, 48, 2, 3)
    assert r.step_time_s > 0


@pytest.mark.parametrize(
    "argv,field",
    [
        (["goodput", "quickstart", "--restart-s", "-1"], "--restart-s"),
        (["goodput", "deepseek-v3-2048xtpu-v5p", "--failed", "4"], "--failed"),
    ],
)
def test_bad_goodput_input_is_refused(argv, field, capsys):
    assert main(argv) == 2
    assert field in capsys.readouterr().err
