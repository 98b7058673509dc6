"""The HTML report: self-contained, read back from a run directory, and drawn by a real
browser (headless Chromium from the distribution's packages, driven by Selenium)."""

from __future__ import annotations

import os
import shutil
import tempfile
from html.parser import HTMLParser

import numpy as np
import pytest

from simulator import simulate
from simulator.cli.app import main
from simulator.results.html_data import exposed_by_axis_stage, load_run_dir, run_data
from simulator.results.html_report import render_report
from simulator.results.pixels import bin_shares
from simulator.results.plots import PHASE_COLOURS

pytest.importorskip("plotly")

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def quick():
    # Llama-3-8B, TP4 PP2 DP2 on 16 H100s, 1F1B: one simulated rank per stage
    return simulate("quickstart")


@pytest.fixture(scope="module")
def report_dir(quick, tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    quick.write(d, plots=False)
    assert main(["report", str(d), "--html"]) == 0
    return d


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs, self.scripts = [], 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.scripts += tag == "script"
        for key in ("src", "href"):
            if a.get(key):
                self.refs.append((tag, a[key]))


def test_page_needs_no_network(report_dir):
    text = (report_dir / "report.html").read_text(encoding="utf-8")
    p = _Refs()
    p.feed(text)
    assert p.scripts >= 4  # plotly.js, then one per figure
    assert not [r for r in p.refs if r[1].split(":")[0].lower() in ("http", "https", "file") or r[1].startswith("//")]
    assert "plotly.js v" in text  # the library itself is inlined, once
    assert text.count("plotly.js v") == 1


def test_report_from_the_run_directory_is_the_report_of_the_result(quick, report_dir):
    # idle.csv and scenario.json carry everything the page draws: byte-identical pages
    from_dir = (report_dir / "report.html").read_text(encoding="utf-8")
    assert render_report(run_data(quick)) == from_dir
    data = load_run_dir(report_dir)
    assert data.missing == ()
    assert data.labels[8] == "stage 1 (device 8, ×8)"
    for needle in (
        "Timeline",
        "Memory",
        "Exposed communication by axis and stage",
        "Scenario",
        "quickstart-llama3-8b-16xh100",
        "llama3-8b",
    ):
        assert needle in from_dir


def test_old_run_directory_reports_what_it_lacks(quick, tmp_path):
    quick.write(tmp_path, plots=False)
    (tmp_path / "idle.csv").unlink()
    (tmp_path / "scenario.json").unlink()
    data = load_run_dir(tmp_path)
    assert data.missing == ("idle.csv", "scenario.json")
    assert data.labels[8] == "stage 1 (device 8)"
    assert "idle.csv was not in the run directory" in render_report(data)


def test_exposed_comm_by_axis_and_stage_adds_up_to_the_accounting(quick):
    table = exposed_by_axis_stage(run_data(quick))
    raw = quick.raw
    stage = {0: 0, 8: 1}
    for r, st in stage.items():
        for axis in table.columns:
            # accounting.py splits exposed time equally among the axes busy at once; the spans
            # record which were busy, so splitting each span's length gives the same figure
            assert table.loc[st, axis] == pytest.approx(raw.idle[r].get("exposed_" + axis, 0.0), rel=1e-9, abs=1e-12)
    # one simulated rank per stage, each standing for 8 devices: the summary's mean is the stages' mean
    for axis, v in quick.summary["exposed_comm_by_axis_s"].items():
        assert table[axis].mean() == pytest.approx(v, rel=1e-9)


def _areas(pieces) -> list[float]:
    """Pixels x share of the bar's height each group's pieces fill."""
    return [float(np.sum((x1 - x0) * (b1 - b0))) for x0, x1, _, b0, b1 in pieces]


def test_bin_shares_gives_each_group_its_share_of_the_time():
    # 100 pixels, each holding a 0.3-pixel bar of A then a 0.7-pixel bar of B: A fills 30
    # pixels' worth (0.3 of each bar's height, at the bottom), not the 100 that drawing each bar
    # a pixel wide (A on top) would give
    a0 = np.arange(100.0)
    a = (a0, a0 + 0.3, np.zeros(100))
    b = (a0 + 0.3, a0 + 1.0, np.zeros(100))
    got = _areas(bin_shares([a, b], 1, 0.0, 100.0, 100))
    assert abs(got[0] - 30) <= 2 and abs(got[1] - 70) <= 2, got
    # recompute-like: a 0.05-pixel bar of A before each 0.95 of B (5 % of the time)
    a = (a0, a0 + 0.05, np.zeros(100))
    b = (a0 + 0.05, a0 + 1.0, np.zeros(100))
    got = _areas(bin_shares([a, b], 1, 0.0, 100.0, 100))
    assert abs(got[0] - 5) <= 2 and abs(got[1] - 95) <= 2, got


def test_bin_shares_keeps_wide_bars_in_place_and_thin_ones_at_their_share():
    wide = (np.array([10.2, 40.0]), np.array([20.7, 40.25]), np.array([0.0, 1.0]))
    other = (np.array([20.7]), np.array([30.0]), np.array([0.0]))
    (x0, x1, y, b0, b1), (o0, o1, oy, ob0, ob1) = bin_shares([wide, other], 2, 0.0, 50.0, 50)
    # row 0: [10.2, 20.7] fills pixels 11..19 whole, 0.8 of pixel 10 and 0.7 of pixel 20 (the
    # other group on top of it there); row 1: a 0.25-pixel bar, a quarter of one pixel's height
    whole = b1 - b0 == 1.0
    assert list(zip(x0[whole], x1[whole], y[whole])) == [(11.0, 20.0, 0.0)]
    assert (10.0, 11.0, 0.0, 0.0, 0.8125) in list(zip(x0, x1, y, b0, b1))
    assert (40.0, 41.0, 1.0, 0.0, 0.25) in list(zip(x0, x1, y, b0, b1))
    assert list(zip(o0, o1, oy, ob0, ob1)) == [(20.0, 21.0, 0.0, 0.6875, 1.0), (21.0, 30.0, 0.0, 0.0, 1.0)]
    # the range and pixel count scale the pieces: nothing outside [lo, hi] is drawn
    (x0, x1, _, b0, b1), _ = bin_shares([wide, other], 2, 15.0, 25.0, 10)
    assert x0.min() == 15.0 and x1.max() == 21.0


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nowhere"), "--html"]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--html"]) == 2
    assert "has no summary.json" in capsys.readouterr().err
    assert main(["run", "quickstart", "--html"]) == 2
    assert "--html: give --out DIR" in capsys.readouterr().err


def test_missing_plotly_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly -> ImportError
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    assert main(["report", str(tmp_path), "--html"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'stepsim[report]'" in err and "Traceback" not in err


# ---- in a real browser -------------------------------------------------------------------


def _browser_or_skip():
    required = os.environ.get("CI") or os.environ.get("STEPSIM_REQUIRE_BROWSER")
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
    if missing:
        msg = (
            f"browser test needs {', '.join(missing)} (apt-get install chromium chromium-driver; "
            "pip install -e '.[test]'); .ci/run installs them"
        )
        if required:
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="module")
def browser():
    _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="stepsim-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1400,900",
        "--force-device-scale-factor=1",
    ):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _rgb(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]) / 255.0


@pytest.mark.slow
def test_browser_draws_the_timeline_without_errors(browser, report_dir, quick, tmp_path):
    from matplotlib.image import imread
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    browser.get((report_dir / "report.html").as_uri())
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    # nothing fetched from anywhere: the page and its script are the only resources
    fetched = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert [u for u in fetched if not u.startswith(("file:", "data:", "blob:"))] == []

    # the timeline's plot, in view
    rect = browser.execute_script(
        "var gd = document.getElementById('timeline'); gd.scrollIntoView(); window.scrollBy(0, -5);"
        "var r = gd.querySelector('.nsewdrag').getBoundingClientRect();"
        "return [r.left, r.top, r.width, r.height];"
    )
    left, top, width, height = rect
    assert width > 800 and height > 100
    shot = tmp_path / "timeline.png"
    browser.save_screenshot(str(shot))
    img = imread(str(shot))[..., :3]
    plot = img[int(top) + 2 : int(top + height) - 2, int(left) + 2 : int(left + width) - 2]
    share = {p: float((np.abs(plot - _rgb(PHASE_COLOURS[p])).max(axis=2) < 0.03).mean()) for p in ("F", "B")}
    # compute is ~80% of each compute row (bubble 9.6%, exposed comm 16%); the two compute
    # rows are 2 of 8 rows: forward and backward bars cover a few % of the plot each
    assert share["F"] > 0.01 and share["B"] > 0.02, share
    # a bubble is drawn hatched (grey lines on white) on the compute rows
    neutral = (plot.max(axis=2) - plot.min(axis=2) < 0.04) & (plot.mean(axis=2) > 0.35) & (plot.mean(axis=2) < 0.9)
    assert neutral.mean() > 0.002

    # zoom to 4 ms around the longest forward op of device 0: the bars are redrawn for the
    # visible range (joined only where closer than half a pixel), with no error
    ev = quick.events
    op = ev[(ev["rank"] == 0) & (ev["stream"] == "compute") & (ev["phase"] == "F")].nlargest(1, "duration_s").iloc[0]
    mid_ms = (op["start_s"] + op["end_s"]) / 2 * 1e3
    browser.execute_script(f"Plotly.relayout('timeline', {{'xaxis.range': [{mid_ms - 2}, {mid_ms + 2}]}})")
    shapes = browser.execute_script(
        "var gd = document.getElementById('timeline');"
        "return gd.data.filter(t => t.fill === 'toself').map(t => Array.from(t.x).filter(v => v === v).length / 4);"
    )
    in_view = ev[(ev["end_s"] * 1e3 > mid_ms - 2) & (ev["start_s"] * 1e3 < mid_ms + 2) & (ev["duration_s"] > 0)]
    assert 0 < sum(shapes) <= len(in_view) + len(quick.idle)
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []

    # hover its middle: its name, micro-batch and times come up
    x, y = browser.execute_script(
        "var gd = document.getElementById('timeline'), xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;"
        "var r = gd.getBoundingClientRect();"
        f"return [r.left + xa._offset + xa.l2p({mid_ms}), r.top + ya._offset + ya.l2p(0)];"
    )
    mouse = ActionBuilder(browser)
    mouse.pointer_action.move_to_location(int(x), int(y))
    mouse.perform()
    label = " ".join(e.text for e in browser.find_elements("css selector", "g.hovertext"))
    assert f"{op['name']} · mb {op['mb']}" in label and f"start {op['start_s'] * 1e3:.4g} ms" in label, label


@pytest.mark.slow
def test_browser_opens_the_compare_page(browser, tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", "quickstart", "--schedules", "gpipe,1f1b", "--out", str(out), "--html"]) == 0
    browser.get((out / "compare.html").as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    sizes = browser.execute_script(
        "return ['bars', 'timeline-gpipe', 'timeline-1f1b'].map(function (i) {"
        "  var r = document.getElementById(i).querySelector('.nsewdrag').getBoundingClientRect();"
        "  return r.width * r.height; });"
    )
    assert all(s > 10_000 for s in sizes), sizes


def _phase_pixel_shares(browser, path) -> dict:
    """Share of each phase colour among the phase-coloured pixels of the timeline's plot area
    (backward and input-grad share a colour), from a screenshot."""
    from matplotlib.image import imread

    left, top, width, height = browser.execute_script(
        "var gd = document.getElementById('timeline'); gd.scrollIntoView();"
        "var r = gd.querySelector('.nsewdrag').getBoundingClientRect();"
        "return [r.left, r.top, r.width, r.height];"
    )
    browser.save_screenshot(str(path))
    plot = imread(str(path))[..., :3][int(top) : int(top + height), int(left) : int(left + width)]
    counts = {
        p: float((np.abs(plot - _rgb(PHASE_COLOURS[p])).max(axis=2) < 0.03).sum()) for p in ("F", "B", "W", "R", "opt")
    }
    total = sum(counts.values())
    assert total > 5000, counts
    return {p: c / total for p, c in counts.items()}


def _time_shares(ev, lo_s: float, hi_s: float) -> dict:
    """Share of each phase in the compute time between ``lo_s`` and ``hi_s`` (I counted as B)."""
    c = ev[ev["stream"] == "compute"]
    t = (np.minimum(c["end_s"], hi_s) - np.maximum(c["start_s"], lo_s)).clip(lower=0)
    by = t.groupby(c["phase"].replace({"I": "B"})).sum()
    return {p: float(by.get(p, 0.0) / by.sum()) for p in ("F", "B", "W", "R", "opt")}


@pytest.mark.slow
def test_browser_timeline_colours_follow_the_time_shares(browser, tmp_path):
    """Thousands of ops a few pixels wide, recompute and weight-grad ops between the
    backward ones: each phase's share of the screenshot's phase-coloured pixels is its share
    of the compute time, at the default zoom and zoomed in (the page's reduction)."""
    import copy

    from helpers import SEARCH_MOE, scenario

    model = copy.deepcopy(SEARCH_MOE)
    model["layers"] = 8
    res = simulate(
        scenario(
            model=model,
            cluster={"devices": 16},
            parallel={"tp": 1, "pp": 2, "dp": 8, "ep": 8},
            schedule="zb-h1",
            training={"recompute": "full", "global_batch_size": 64, "seq_len": 2048},
        )
    )
    d = tmp_path / "run"
    res.write(d, plots=False)
    assert main(["report", str(d), "--html"]) == 0
    browser.get((d / "report.html").as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    ev, step = res.events, res.summary["step_time_s"]
    want = _time_shares(ev, 0.0, step)
    assert want["R"] > 0.1 and want["W"] > 0.05  # the test means something
    got = _phase_pixel_shares(browser, tmp_path / "all.png")
    assert max(abs(got[p] - want[p]) for p in want) < 0.03, (got, want)
    # zoomed to the middle fifth of the step (ms on the axis)
    lo, hi = 0.4 * step, 0.6 * step
    browser.execute_script(f"Plotly.relayout('timeline', {{'xaxis.range': [{lo * 1e3}, {hi * 1e3}]}})")
    browser.execute_script("return new Promise(r => setTimeout(r, 300))")
    want = _time_shares(ev, lo, hi)
    got = _phase_pixel_shares(browser, tmp_path / "zoom.png")
    assert max(abs(got[p] - want[p]) for p in want) < 0.03, (got, want)


def test_moe_terms_and_placement_are_in_the_report():
    """A MoE run's report has the terms around the experts per layer and micro-batch, in ms, as
    the summary holds them, and the devices card says how the racks are used."""
    from test_moe import moe_scenario

    from simulator.results.html_report import MOE_TERMS, headline_cards, moe_terms_table

    res = simulate(moe_scenario(cluster={"preset": "gb200-nvl72", "devices": 16}))
    s = res.summary
    table = moe_terms_table(s)
    for key, value in s["moe_terms_s"].items():
        assert html_escape(MOE_TERMS[key]) in table and f"{1e3 * value:.3f}" in table
    assert "Around the experts" in render_report(run_data(res))
    assert "16/72 a domain, 56 idle" in headline_cards(s)
    assert moe_terms_table({"moe_terms_s": {}}) == ""


def html_escape(text: str) -> str:
    import html

    return html.escape(text)


def _bars_drawn(browser, div_id: str) -> int:
    """How many bars of the plotly waterfall in ``div_id`` the browser drew with a height."""
    return browser.execute_script(
        f"var gd = document.getElementById('{div_id}'); gd.scrollIntoView();"
        "return Array.from(gd.querySelectorAll('g.point path')).filter(function (p) {"
        "  var r = p.getBoundingClientRect(); return r.width > 1 && r.height > 0.5; }).length;"
    )


@pytest.mark.slow
def test_browser_draws_the_explain_waterfall(browser, tmp_path):
    """``stepsim explain --html`` and ``compare --html``: the waterfall has a bar for step A,
    one per cause that moved and one for step B, each drawn with a height."""
    from simulator.results.explain import causes, explain, moved_causes

    out = tmp_path / "ex"
    assert main(["explain", "quickstart", "schedules-llama3-8b-16xh100", "--out", str(out), "--html"]) == 0
    browser.get((out / "explain.html").as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    moved = moved_causes(explain(causes(simulate("quickstart")), causes(simulate("schedules-llama3-8b-16xh100"))))
    assert len(moved) >= 2
    assert _bars_drawn(browser, "explain") == len(moved) + 2

    cmp = tmp_path / "cmp"
    assert main(["compare", "quickstart", "--schedules", "gpipe,1f1b", "--out", str(cmp), "--html"]) == 0
    browser.get((cmp / "compare.html").as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    assert _bars_drawn(browser, "explain-1f1b") >= 3


@pytest.mark.slow
def test_browser_shows_the_links_heat_map_and_table(browser, quick, tmp_path):
    """The report's links section: the inlined heat map decodes to an image of the PNG's size
    and the table lists the busiest links of links.csv, busiest first."""
    import pandas as pd
    from matplotlib.image import imread

    d = tmp_path / "run"
    quick.write(d)  # with the figures: links.png
    assert main(["report", str(d), "--html"]) == 0
    browser.get((d / "report.html").as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    w, h = browser.execute_script(
        "var i = document.getElementById('links-map'); i.scrollIntoView(); return [i.naturalWidth, i.naturalHeight];"
    )
    png = imread(str(d / "links.png"))
    assert (h, w) == png.shape[:2]
    cells = browser.execute_script(
        "return Array.from(document.querySelectorAll('#links-top tr')).slice(1).map(function (r) {"
        "  return Array.from(r.cells).map(function (c) { return c.innerText; }); });"
    )
    links = pd.read_csv(d / "links.csv", keep_default_na=False)
    busiest = links[links["axis"] == "all"].sort_values(["busy_fraction", "bytes"], ascending=False)
    assert 0 < len(cells) == min(10, len(busiest))
    assert [float(c[2]) for c in cells] == [round(100 * f, 1) for f in busiest["busy_fraction"].head(len(cells))]
