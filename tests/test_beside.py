"""Result.write renders the figures in a forked child where it may: the same files, and
the child's failures reach the caller."""

import multiprocessing
import os
import threading

import pytest

from simulator import simulate
from simulator.results import beside as beside_mod
from simulator.results.beside import Beside, can_fork

needs_fork = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="the fork start method is Linux's"
)


@pytest.fixture(scope="module")
def result():
    return simulate("schedules-llama3-8b-16xh100")


@needs_fork
def test_forked_write_gives_the_same_files(result, tmp_path, monkeypatch):
    monkeypatch.setattr(beside_mod, "usable_cpus", lambda: 2)  # fork even on one core
    forked = []
    real = beside_mod.Beside.__init__

    def spy(self, fn):
        forked.append(os.getpid())
        real(self, fn)

    monkeypatch.setattr(beside_mod.Beside, "__init__", spy)
    paths_a = result.write(tmp_path / "a", parallel=None)
    assert forked, "write did not fork (another thread alive?)"
    paths_b = result.write(tmp_path / "b", parallel=False)
    assert len(forked) == 1
    assert list(paths_a) == list(paths_b)
    assert {"timeline", "memory_plot"} <= set(paths_a)
    for key, p in paths_a.items():
        assert p.read_bytes() == paths_b[key].read_bytes(), key


@needs_fork
def test_a_failure_in_the_child_is_raised_in_the_parent(result, tmp_path, monkeypatch):
    from simulator.results import plots

    monkeypatch.setattr(beside_mod, "usable_cpus", lambda: 2)

    def broken(*a, **k):
        raise ValueError("no figure today")

    monkeypatch.setattr(plots, "plot_memory", broken)
    with pytest.raises(ValueError, match="no figure today"):
        result.write(tmp_path / "out", parallel=None)
    # the parent's half was written, into a staging folder removed with the failure
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())


@needs_fork
def test_a_child_that_dies_is_an_error_with_its_exit_code():
    b = Beside(lambda: os._exit(7))
    with pytest.raises(RuntimeError, match="exit code 7"):
        b.wait()


@needs_fork
def test_no_fork_beside_another_thread(monkeypatch):
    monkeypatch.setattr(beside_mod, "usable_cpus", lambda: 2)
    assert can_fork()
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not can_fork()
    finally:
        stop.set()
        t.join()
    monkeypatch.setattr(beside_mod, "usable_cpus", lambda: 1)
    assert not can_fork()


def test_the_engine_leaves_no_thread_behind():
    # tqdm's monitor thread would outlive the run and keep write() from forking
    before = threading.active_count()
    simulate("quickstart", progress=True)
    assert threading.active_count() == before


def test_a_sweep_leaves_no_thread_behind():
    # the sweeps' bar too (a sweep with progress=True left tqdm's monitor running: later
    # writes in the same process could not fork, and this file failed after test_plots)
    from helpers import scenario

    from simulator.studies.sweep import sweep

    before = threading.active_count()
    sweep({"base": scenario(), "grid": {"parallel.tp": [1]}}, jobs=1, progress=True)
    assert threading.active_count() == before
