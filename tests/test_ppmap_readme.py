"""The PP map's README quotes the committed map: its two ratio tables equal ``map.csv``.

``docs/results/ppmap/README.md`` gives the grid's ratio per GPU and per domain as tables; when
the map is re-run and ``map.csv`` changes, this fails until the tables are written again, so
the prose around them cannot silently describe an older map.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

PPMAP = Path(__file__).resolve().parents[1] / "docs" / "results" / "ppmap"
MODELS = {"DeepSeek-V3": "deepseek-v3", "Kimi K2": "kimi-k2"}


def _table_after(lines: list[str], heading: str) -> dict[tuple[str, int], list[float]]:
    """``{(model, domain): [ratio per NIC column]}`` of the first table after ``heading``."""
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows: dict[tuple[str, int], list[float]] = {}
    for line in lines[start + 1 :]:
        if rows and not line.startswith("|"):
            break
        if not line.startswith("| ") or line.startswith("| ---") or line.startswith("| |"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        label, values = cells[0], cells[1:]
        name, _, size = label.partition(", ")  # "Kimi K2, 16" or "DeepSeek-V3, 8 GPUs a domain"
        rows[(MODELS[name], int(size.split()[0]))] = [float(v) for v in values]
    return rows


@pytest.mark.parametrize(
    ("heading", "column"),
    [("Ratio per GPU", "ratio"), ("Ratio per domain", "ratio_per_domain")],
)
def test_readme_tables_equal_map(heading: str, column: str):
    lines = (PPMAP / "README.md").read_text().splitlines()
    table = _table_after(lines, heading)
    grid = pd.read_csv(PPMAP / "map.csv")
    grid = grid[grid.system == "grid"]
    nics = sorted(grid.nic_gbps.unique())
    expected = {
        (m, int(d)): [float(g.set_index("nic_gbps")[column][n]) for n in nics]
        for (m, d), g in grid.groupby(["model", "domain"])
    }
    assert set(table) == set(expected)
    for key, quoted in table.items():
        values = expected[key]
        assert len(quoted) == len(values), key
        for q, v in zip(quoted, values):
            assert math.isclose(q, round(v, 2), abs_tol=1e-9), (key, q, v)
