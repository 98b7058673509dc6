"""Execute every notebook in ``notebooks/`` top to bottom (CI mode) and fail on any error.

Notebooks read ``STEPSIM_FULL`` (unset here: the reduced-but-real variants run, each in
about a minute or less) and write their files under ``STEPSIM_OUT`` (a temporary folder
here, so the repository is left untouched). The kernel runs with ``notebooks/`` as its
working directory, as it does for a reader who opens the notebook there, and with the
backend a reader gets (the kernel's inline backend: ``MPLBACKEND`` is cleared), so every
cell that draws must come back with its picture.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each notebook runs for seconds to minutes

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 600
#: A cell that calls one of these draws a figure and must show it.
PLOT_CALL = re.compile(
    r"\b(plot_timeline|plot_memory|plot_comparison|plot_topology|plot_parity|plot_metric|"
    r"plot_heatmap|parity_from_table|plt\.subplots|plt\.figure)\("
)


def _images(cell) -> int:
    return sum("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


def test_notebooks_exist():
    names = {p.name for p in NOTEBOOKS}
    for expected in (
        "01_quickstart.ipynb",
        "02_do_we_need_pipeline_parallelism.ipynb",
        "03_schedules_and_memory.ipynb",
        "04_validation.ipynb",
        "05_your_cluster.ipynb",
    ):
        assert expected in names, f"notebooks/{expected} is missing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.get("outputs"), f"{path.name} cell {i} has stored outputs"
            assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    monkeypatch.delenv("STEPSIM_FULL", raising=False)
    monkeypatch.delenv("STEPSIM_FIGURES", raising=False)
    monkeypatch.setenv("STEPSIM_OUT", str(tmp_path))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's own (inline) backend
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK_DIR)}}
    )
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError on the first failing cell
    wall = time.perf_counter() - t0
    print(f"{path.name}: {wall:.1f} s")
    plotting = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code" and PLOT_CALL.search(c.source)]
    for i, cell in plotting:
        # exactly one picture per figure drawn: none lost to a backend switch, none shown twice
        assert _images(cell) >= 1, f"{path.name} cell {i} draws a figure but shows no image/png output"
    if path.name == "01_quickstart.ipynb":
        # the timeline and the memory curve, once each; the simulate(progress=True) cell shows its bar
        assert [_images(c) for i, c in plotting] == [1, 1]
        bar_cell = next(c for c in nb.cells if c.cell_type == "code" and "progress=True" in c.source)
        shown = [
            o
            for o in bar_cell.outputs
            if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
            or (o.get("name") == "stderr" and "simulating" in o.get("text", ""))
        ]
        assert shown, "simulate(progress=True) showed no progress bar in the notebook"
