"""The committed PP map store (``docs/results/ppmap/sims/``) assembles into the committed
``map.csv``, as the map's README says it does (``stepsim ppmap ... --assemble-only``): a change
to what a case's key hashes (a field added to the resolved scenario) that leaves the store's
keys behind would leave the map empty."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pandas as pd
import pytest

from simulator.studies.ppmap.run import assemble

MAP = Path(__file__).resolve().parent.parent / "docs" / "results" / "ppmap"


@pytest.mark.slow  # about 25 s: the map's 45,255 cases are resolved to find their keys
def test_the_committed_store_assembles_into_the_committed_map(tmp_path):
    # assemble writes its tables into the folder it reads: a copy, so the committed files stay
    for name in ("screen.jsonl", "sims/rows.jsonl", "sims/fingerprints.jsonl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(MAP / name, tmp_path / name)
    table, _ = assemble(MAP / "ppmap.yaml", tmp_path)
    buf = io.StringIO()
    table.to_csv(buf, index=False)
    buf.seek(0)
    again = pd.read_csv(buf)
    committed = pd.read_csv(MAP / "map.csv")
    assert again["ratio"].notna().sum() == committed["ratio"].notna().sum() == len(committed)
    pd.testing.assert_frame_equal(again, committed)
