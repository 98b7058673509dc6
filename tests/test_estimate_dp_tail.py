"""The search estimate's exposed gradient reductions per local chunk: a chunk's reductions may
start with its last backward action and run, one after another, beside the actions its stage
runs after it (interleaved 1F1B's cool-down runs ``pp`` backwards of each later chunk)."""

from types import SimpleNamespace

import pytest

from simulator.studies.search.estimate import _chunk_reduction_tail

ACT = {"F": 1.0, "B": 2.0, "I": 0.0, "W": 0.0}


@pytest.mark.parametrize("reductions, tail", [(1.0, 0.0), (5.0, 3.0)])
def test_1f1b_hides_the_reductions_behind_the_last_backward_only(reductions, tail):
    c = SimpleNamespace(name="1f1b", pp=4, m=8, vpp=1, global_aux=False)
    assert _chunk_reduction_tail(c, 0, ACT, [reductions]) == pytest.approx(tail)


@pytest.mark.parametrize(
    "reductions, tail",
    [
        # stage 0's cool-down: the later chunk's last 4 backwards, then the first chunk's 4
        ([0.0, 10.0], 0.0),  # the later chunk's: its own backward and the first chunk's 4 (10 s)
        ([10.0, 0.0], 8.0),  # the first chunk's: only its own last backward (2 s)
        ([4.0, 4.0], 2.0),  # the later chunk's done at -6 s, the first chunk's from -2 s: 2 s past the end
    ],
)
def test_interleaved_reductions_of_an_earlier_chunk_hide_behind_the_cool_down(reductions, tail):
    c = SimpleNamespace(name="interleaved-1f1b", pp=4, m=8, vpp=2, global_aux=False)
    assert _chunk_reduction_tail(c, 0, ACT, reductions) == pytest.approx(tail)
