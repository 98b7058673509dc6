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


def _table(header: str) -> dict[str, list[str]]:
    """``{scenario: cells}`` of the README's table whose header row starts with ``header``."""
    lines = (HERE / "README.md").read_text().split(header, 1)[1].splitlines()[2:]  # past the rule
    rows: dict[str, list[str]] = {}
    for line in lines:
        if not line.startswith("| `"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def _rows() -> dict[str, list[str]]:
    return _table("| scenario | published tokens/s/GPU")


def _number(cell: str) -> float:
    return float(cell.replace(",", "").replace("%", "").replace("+", "").strip())


def test_the_table_lists_every_scenario_file():
    assert set(_rows()) == {p.stem for p in HERE.glob("*.yaml")}


def test_the_host_what_if_sweep_loads():
    """The README's sweep, with its base read from the repository root as the README says to save
    it, expands to its four cases on that scenario."""
    from simulator.studies.sweep.cases import expand
    from simulator.studies.sweep.spec import load_sweep

    block = (HERE / "README.md").read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    data = load_yaml(block, "host-whatif.yaml")
    data["base"] = str(HERE.parents[3] / data["base"])
    cases = expand(load_sweep(data)).cases
    assert len(cases) == 4


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


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.stem for p in HERE.glob("*.yaml")))
def test_the_host_what_if_quotes_the_simulation(name):
    published = _number(_rows()[name][0])
    at_10, at_50 = _table("| scenario | speed error at 10 us")[name]
    sc = load_yaml((HERE / f"{name}.yaml").read_text(), name)
    sc["training"]["host_launch_s"] = 5.0e-5
    res = simulate(sc)
    per_gpu = res.summary["tokens_per_s"] / res.summary["devices"]
    assert round(100 * (per_gpu / published - 1), 1) == pytest.approx(_number(at_50))
    assert _number(at_10) == _number(_rows()[name][2])
