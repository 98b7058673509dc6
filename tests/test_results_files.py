"""The scenario and map files committed beside the results still load on today's schema.

Each README under ``docs/results/`` tells the reader to run one of these files (``stepsim run
FILE``, ``stepsim search FILE``, ``stepsim ppmap FILE``); a renamed or tightened key would
otherwise break the documented command without any test noticing. Loading validates every key
and the layout against the cluster; nothing is simulated.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.scenario.loading import load_scenario
from simulator.studies.ppmap.spec import load_map
from stepsim_fileio import load_yaml

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
FILES = sorted(RESULTS.rglob("*.yaml"))


def _is_map(path: Path) -> bool:
    """A map file (``stepsim ppmap``) lists ``models``; a scenario names one ``model``."""
    data = load_yaml(path.read_text(), str(path))
    return isinstance(data, dict) and "models" in data


def test_results_hold_yaml_files():
    assert len(FILES) >= 8, FILES  # the torus cubes, the what-ifs, the maps, the placement search


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(RESULTS)) for p in FILES])
def test_results_file_loads(path: Path):
    if _is_map(path):
        spec = load_map(path)
        assert spec.name
    else:
        sc = load_scenario(path)
        assert sc.layout.world <= sc.cluster.devices
