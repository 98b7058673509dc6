"""Every YAML block in docs/*.md and README.md loads (issue 14 item 2).

Each ```yaml block must be preceded by a marker line saying what it is:
``<!-- example: scenario -->`` (loaded with :func:`load_scenario`; perturbation
links must exist in its topology), ``<!-- example: sweep -->`` (loaded with
:func:`load_sweep`; every case must load) or ``<!-- example: fragment -->``
(only parsed). A block without a marker fails, so none is skipped by accident.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simulator.scenario.loading import load_scenario
from simulator.studies.sweep.cases import expand
from simulator.studies.sweep.spec import load_sweep
from stepsim_fileio import load_yaml
from topologies.presets import build_cluster

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
_BLOCK = re.compile(r"(?:<!--\s*example:\s*(\w+)\s*-->\s*\n)?```ya?ml\n(.*?)```", re.S)


def _blocks():
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for _i, m in enumerate(_BLOCK.finditer(text)):
            line = text[: m.start(2)].count("\n") + 1
            out.append(pytest.param(m.group(1), m.group(2), id=f"{doc.name}:{line}"))
    return out


BLOCKS = _blocks()


def test_docs_have_yaml_examples():
    # docs/scenario.md holds the scenario reference, a custom torus cluster, a partly filled
    # GB200 cluster and a sweep: at least those four blocks.
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("kind,text", BLOCKS)
def test_yaml_block_loads(kind, text):
    assert kind in ("scenario", "sweep", "fragment"), "mark the block: <!-- example: scenario|sweep|fragment -->"
    data = load_yaml(text, "doc block")
    if kind == "fragment":
        return
    assert isinstance(data, dict)
    if kind == "scenario":
        sc = load_scenario(data)
        topo = build_cluster(sc.cluster)
        for p in sc.perturbations:
            if p.link is not None:
                assert topo.graph.has_edge(*p.link), f"perturbation link {p.link} does not exist"
    else:
        cases = expand(load_sweep(data)).cases
        assert cases and all(c.resolved is not None for c in cases)
        # the numbers written 12.5e9 / 50e9 reach the scenario as numbers
        values = {c.axes.get("cluster.network.nic_bw_bytes_per_s") for c in cases}
        assert values <= {None, 12.5e9, 50e9}
