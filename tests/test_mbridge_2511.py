"""The coverage check of Megatron-Bridge 25.11's other MoE rows quotes today's simulation.

``docs/results/moe/mbridge-2511/README.md`` tabulates, per scenario file beside it, the published
and simulated tokens/s/GPU and steps. This re-simulates each file and compares it with the table, so
a model change that moves them fails here until the table (and the prose that reads it) is written
again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator import simulate
from stepsim_fileio import load_yaml

HERE = Path(__file__).resolve().parents[1] / "docs" / "results" / "moe" / "mbridge-2511"


def _rows() -> dict[str, list[str]]:
    """``{scenario: cells}`` of the README's table."""
    rows = {}
    for line in (HERE / "README.md").read_text().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def _number(cell: str) -> float:
    return float(cell.replace(",", "").replace("%", "").replace("+", "").strip())


def test_the_table_lists_every_scenario_file():
    assert set(_rows()) == {p.stem for p in HERE.glob("*.yaml")}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.stem for p in HERE.glob("*.yaml")))
def test_the_table_quotes_the_simulation(name):
    published, simulated, error, published_step, simulated_step, _missing = _rows()[name]
    res = simulate(HERE / f"{name}.yaml")
    per_gpu = res.summary["tokens_per_s"] / res.summary["devices"]
    assert round(per_gpu) == _number(simulated)
    assert round(res.summary["step_time_s"], 2) == _number(simulated_step)
    assert round(100 * (per_gpu / _number(published) - 1), 1) == pytest.approx(_number(error))
    sc = load_yaml((HERE / f"{name}.yaml").read_text(), name)
    tokens = sc["training"]["global_batch_size"] * sc["training"]["seq_len"]
    assert round(tokens / (_number(published) * res.summary["devices"]), 2) == _number(published_step)
