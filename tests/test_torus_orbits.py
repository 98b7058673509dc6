"""Translation orbits of a torus (simulator.network.orbits): a phase every translation of
a group maps onto itself, run as one flow per orbit, against running every transfer; and
whole representative runs with the fold against runs without it and against --exact."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from test_symmetry import _moe

import simulator.engine.loop as loop
import simulator.network.orbits as orbits_mod
from simulator import simulate
from simulator.engine.lowering import Lowering
from simulator.network.flows import FlowNetwork, Transfer
from simulator.network.orbits import orbit_phase, translation_group
from topologies.builders import torus
from topologies.topology import Topology


def _torus(shape=(4, 4)) -> Topology:
    return Topology(torus(shape, 100e9, 1e-6))


def _xy(topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    c = np.array([topo.torus_coords(d) for d in range(topo.n_devices)])
    return c[:, 0], c[:, 1]


def _phases(topo: Topology) -> list[list[Transfer]]:
    """An all-to-all inside each x-ring (4 members), and beside it a ring step along y."""
    x, y = _xy(topo)
    a2a = [Transfer(s, d, 3e6) for s in range(16) for d in range(16) if s != d and y[s] == y[d]]
    ring = [Transfer(s, d, 5e6) for s in range(16) for d in range(16) if x[s] == x[d] and (y[d] - y[s]) % 4 == 1]
    return [a2a, ring]


def _finish(topo: Topology, phases: list) -> list[float]:
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    done: list[float] = []
    for p in phases:
        ev = net.transfer(p)
        ev.callbacks.append(lambda _e: done.append(env.now))
    env.run()
    return done


def test_a_large_group_gives_way_to_a_subgroup(monkeypatch):
    topo = _torus()
    monkeypatch.setattr(orbits_mod, "MAX_IMAGE_CELLS", 4 * topo.n_links)  # 4 of the 16 translations
    g = translation_group(topo, [_xy(topo)[1]])
    assert g is not None and g.order == 4
    full = _phases(topo)
    folded = [orbit_phase(FlowNetwork(simpy.Environment(), topo), g, p) for p in full]
    assert [len(p) for p in folded] == [len(full[0]) // 4, len(full[1]) // 4]
    assert _finish(topo, folded) == pytest.approx(_finish(topo, full), rel=1e-12)


def test_group_of_translations_keeps_the_partitions():
    topo = _torus()
    x, y = _xy(topo)
    g = translation_group(topo, [y])  # rows of the torus: every shift keeps them
    assert g is not None and g.order == 16
    g = translation_group(topo, [x // 2])  # pairs along x: only even x shifts (and every y)
    assert g is not None and g.order == 8
    assert set(g.canon_device.tolist()) == {0, 1}
    assert translation_group(topo, [np.arange(16) == 5]) is None  # one device singled out


def test_folded_phases_finish_as_every_transfer_does():
    topo = _torus()
    x, y = _xy(topo)
    g = translation_group(topo, [y])
    assert g is not None
    full = _phases(topo)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    folded = [orbit_phase(net, g, p) for p in full]
    assert [len(p) for p in folded] == [len(full[0]) // 16, len(full[1]) // 16]  # 3 and 1 flows
    assert _finish(topo, folded) == pytest.approx(_finish(topo, full), rel=1e-12)
    # a multiplicity short (each folded flow loading its links once) finishes otherwise
    wrong = [tuple(Transfer(t.src, t.dst, t.size_bytes) for t in p) for p in folded]
    assert _finish(topo, wrong) != pytest.approx(_finish(topo, full), rel=1e-6)


def test_a_phase_that_is_not_mapped_onto_itself_is_not_folded():
    topo = _torus()
    g = translation_group(topo, [_xy(topo)[1]])
    assert g is not None
    net = FlowNetwork(simpy.Environment(), topo)
    a2a = _phases(topo)[0]
    assert orbit_phase(net, g, a2a[1:]) is None  # one transfer short of its orbit
    assert orbit_phase(net, g, [*a2a[:-1], Transfer(a2a[-1].src, a2a[-1].dst, 1.0)]) is None  # another size
    assert orbit_phase(net, g, [Transfer(0, 1, 1.0, incidence=((0, 1.0),))]) is None  # its own incidence


def _run(sc: dict, orbits: bool, monkeypatch, **kw) -> tuple:
    """``simulate(sc, **kw)`` with or without the fold, and the engine's flows started."""
    seen: dict = {}
    run = loop.Engine.run

    def keep(self):
        raw = run(self)
        seen["flows"] = self.net.stats.flows_started
        seen["folded"] = self.lowering._orbits is not None
        return raw

    with monkeypatch.context() as m:
        m.setattr(Lowering, "orbit_quotient", orbits)
        m.setattr(loop.Engine, "run", keep)
        res = simulate(sc, **kw)
    return res.summary, seen


# EP16 on 4 x 8 x 8 TPU v5p: each EP group covers half of its y rings, so the expert
# data-parallel gathers' lines run along the all-to-all's links; ZeRO-3 gathers over all.
MOE_TORUS = _moe(32, {"preset": "tpu-v5p", "devices": 256}, {"tp": 1, "pp": 1, "dp": 256, "ep": 16, "zero": 3}, 512)


@pytest.mark.parametrize(
    "sc",
    [
        MOE_TORUS,
        _moe(32, {"preset": "tpu-v5p", "devices": 128}, {"tp": 2, "pp": 1, "dp": 64, "ep": 16, "zero": 1}, 128),
    ],
    ids=["ep16-zero3", "tp2-ep16"],
)
def test_run_folded_equals_unfolded_and_exact(sc, monkeypatch):
    folded, f = _run(sc, True, monkeypatch)
    plain, p = _run(sc, False, monkeypatch)
    exact, _ = _run(sc, True, monkeypatch, exact=True)
    assert f["folded"] and not p["folded"]
    assert f["flows"] < p["flows"]
    for key in ("step_time_s", "exposed_comm_fraction", "bubble_fraction", "peak_memory_bytes"):
        assert folded[key] == pytest.approx(plain[key], rel=1e-9, abs=1e-15), key
        assert folded[key] == pytest.approx(exact[key], rel=1e-9, abs=1e-15), key


def test_stages_fold_only_when_asked_and_equal_every_twin_injected(monkeypatch):
    sc = _moe(32, {"preset": "tpu-v5p", "devices": 128}, {"tp": 2, "pp": 4, "dp": 16, "ep": 8}, 128)
    sc["schedule"] = "dualpipe"
    _, seen = _run(sc, True, monkeypatch)
    assert not seen["folded"]
    monkeypatch.setattr(orbits_mod, "FOLD_STAGES", True)
    folded, f = _run(sc, True, monkeypatch)
    every, _ = _run(sc, True, monkeypatch, twin_quotient=False)
    exact, _ = _run(sc, True, monkeypatch, exact=True)
    assert f["folded"]
    for key in ("step_time_s", "exposed_comm_fraction", "bubble_fraction", "peak_memory_bytes"):
        assert folded[key] == pytest.approx(every[key], rel=1e-9, abs=1e-15), key
        assert folded[key] == pytest.approx(exact[key], rel=1e-9, abs=1e-15), key


def test_no_fold_without_the_twin_quotient_with_stages_or_off_a_torus(monkeypatch):
    _, seen = _run(MOE_TORUS, True, monkeypatch, twin_quotient=False)
    assert not seen["folded"]
    sc = _moe(32, {"preset": "tpu-v5p", "devices": 64}, {"tp": 2, "pp": 2, "dp": 16, "ep": 8}, 64)
    _, seen = _run(sc, True, monkeypatch)
    assert not seen["folded"]
    sc = _moe(32, {"preset": "dgx-h100", "devices": 16}, {"tp": 1, "pp": 1, "dp": 16, "ep": 8}, 32)
    _, seen = _run(sc, True, monkeypatch)
    assert not seen["folded"]
