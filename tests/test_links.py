"""The links table (links.csv) and its heat map (links.png): bytes by axis against the
events table, representative mode against --exact, the files of a run folder, and a
legible figure for a GB200 NVL72 cluster of 144 devices."""

import base64

import numpy as np
import pandas as pd
import pytest
from helpers import scenario
from test_moe import moe_scenario

from simulator import simulate
from simulator.network.collectives import choose_algorithm
from simulator.results.links import LINK_COLUMNS, link_columns


def _injected(res) -> dict:
    """Per axis, the bytes the events table says the devices inject: a send its message; a
    ring or direct collective of ``n`` ranks ``(n - 1) / n`` of its size per rank (twice that
    for an all-reduce) -- the nccl-tests bus-bandwidth factors, independent of any route; an
    NVLink SHARP all-reduce ``(n + 1) / n`` (its buffer into the switch and the reduced slice
    back, ``simulator.network.collectives``)."""
    ev = res.events
    ev = ev[ev["kind"].isin(["collective", "send"])]
    out: dict[str, float] = {}
    for kind, coll, axis, rank, size in zip(ev["kind"], ev["coll"], ev["axis"], ev["rank"], ev["size_bytes"]):
        if kind == "send":
            f = 1.0
        else:
            group = res.scenario.layout.group(int(rank), axis)
            n = len(group)
            if coll == "all-reduce" and choose_algorithm(coll, group, res.topology) == "nvls":
                f = (n + 1) / n
            else:
                f = (n - 1) / n * (2.0 if coll == "all-reduce" else 1.0)
        out[axis] = out.get(axis, 0.0) + f * size
    return out


def _first_hops(res, links: pd.DataFrame) -> dict:
    """Per axis, the bytes on links leaving a device: every transfer crosses exactly one."""
    devices = {str(d) for d in res.topology.devices}
    first = links[links["src"].isin(devices) & (links["axis"] != "all")]
    return first.groupby("axis")["bytes"].sum().to_dict()


@pytest.mark.parametrize(
    "sc",
    [
        "quickstart",
        moe_scenario(),  # expert all-to-all, data-parallel reduce-scatter / all-gather, sends
        # data parallel across two nodes, rings chosen by the scenario (the default there,
        # rail-ring, forwards over NVLink to the rail's GPU: more bytes leave the devices)
        scenario(
            cluster={"preset": "dgx-h100", "devices": 16},
            parallel={"tp": 2, "pp": 1, "dp": 8},
            algorithms={"all-gather": "ring", "reduce-scatter": "ring"},
        ),
    ],
    ids=["quickstart", "moe", "dp-across-nodes"],
)
def test_link_bytes_by_axis_equal_the_collectives_bytes_of_the_events(sc):
    """Per axis, the bytes on the links leaving devices equal the events' collectives and sends
    by the bus-bandwidth factors (ring, direct and NVLink SHARP algorithms: nothing is forwarded)."""
    res = simulate(sc, exact=True)
    links = pd.DataFrame(link_columns(res))
    want, got = _injected(res), _first_hops(res, links)
    assert set(want) == set(got) and len(want) >= 2
    for axis in want:
        assert got[axis] == pytest.approx(want[axis], rel=1e-12), axis
    # the "all" rows add up the axes' rows, link by link
    per_axis = links[links["axis"] != "all"].groupby("link")["bytes"].sum()
    total = links[links["axis"] == "all"].set_index("link")["bytes"]
    assert np.allclose(per_axis.sort_index().to_numpy(), total.sort_index().to_numpy(), rtol=1e-12)
    # a route crosses more than its first hop: the table holds every link of it
    assert links[links["axis"] != "all"]["bytes"].sum() > sum(want.values())


@pytest.mark.parametrize(
    "sc",
    [
        "quickstart",
        moe_scenario(),
        moe_scenario(
            cluster={"preset": "gb200-nvl72", "devices": 32, "network": {"domain_size": 8}},
            parallel={"tp": 2, "pp": 2, "dp": 8, "ep": 8},
        ),
    ],
    ids=["quickstart", "moe", "moe-domains-of-8"],
)
def test_representative_mode_gives_the_links_of_exact_mode(sc):
    """Representative mode plans the groups its simulated ranks stand for, including those
    inside one domain that the engine leaves out: the same table as simulating every device."""
    rep, exact = simulate(sc), simulate(sc, exact=True)
    assert rep.summary["simulated_ranks"] < exact.summary["simulated_ranks"]
    a, b = link_columns(rep), link_columns(exact)
    for c in ("link", "axis", "kind", "src", "dst", "peak_flows"):
        assert np.array_equal(a[c], b[c]), c
    for c in ("bytes", "busy_fraction"):
        assert np.allclose(a[c], b[c], rtol=1e-9, atol=1e-12), c


def test_busy_fraction_and_peak_flows_from_spans():
    """busy_fraction is the union of the spans of the ops loading a link over the step;
    on a ring all-gather among 4 devices each directed link carries one flow at a time."""
    res = simulate("quickstart", exact=True)
    cols = link_columns(res)
    assert list(cols) == LINK_COLUMNS
    assert (cols["busy_fraction"] > 0).all() and (cols["busy_fraction"] <= 1.0).all()
    assert np.allclose(cols["busy_s"] / res.summary["step_time_s"], cols["busy_fraction"])
    # the link of device 0 to its NVSwitch, tp only: busy while device 0's tp collectives run
    link = res.topology.route(0, 1)[0]
    ev = res.events
    tp = ev[(ev["rank"] == 0) & (ev["axis"] == "tp")].sort_values("start_s")
    spans = list(zip(tp["start_s"], tp["end_s"]))
    union, reach = 0.0, -1.0
    for s, e in spans:
        union += max(0.0, e - max(s, reach))
        reach = max(reach, e)
    row = np.flatnonzero((cols["link"] == link) & (cols["axis"] == "tp"))
    assert len(row) == 1
    assert cols["busy_s"][row[0]] == pytest.approx(union, rel=1e-9)
    assert cols["peak_flows"][row[0]] == 1  # ring: one flow out of each member per step


def test_run_folder_has_the_links_files(tmp_path):
    from simulator.results.parquet import read_metadata

    res = simulate("quickstart")
    res.write(tmp_path / "a", plots=False)
    assert (tmp_path / "a" / "links.csv").is_file() and not (tmp_path / "a" / "links.png").exists()
    back = pd.read_csv(tmp_path / "a" / "links.csv", keep_default_na=False)
    assert list(back.columns) == LINK_COLUMNS
    assert np.allclose(back["bytes"], res.links_table()["bytes"], rtol=1e-15)
    assert "stepsim_version" in read_metadata(tmp_path / "a" / "links.parquet")
    assert pd.read_parquet(tmp_path / "a" / "links.parquet")["bytes"].equals(back["bytes"])
    res.write(tmp_path / "a")
    assert (tmp_path / "a" / "links.png").stat().st_size > 10_000


def test_report_shows_the_links(tmp_path):
    """`run --out --html`: the page shows links.png and the busiest links; from the run folder
    the same page; without the figures (--no-plots) the table alone."""
    pytest.importorskip("plotly")
    from simulator.cli.app import main
    from simulator.results.html_data import load_run_dir
    from simulator.results.html_report import render_report

    assert main(["run", "quickstart", "--out", str(tmp_path / "a"), "--html"]) == 0
    page = (tmp_path / "a" / "report.html").read_text(encoding="utf-8")
    assert "<h2>Links</h2>" in page and 'id="links-map"' in page and 'id="links-top"' in page
    png = base64.b64encode((tmp_path / "a" / "links.png").read_bytes()).decode()
    assert png in page
    top = pd.read_csv(tmp_path / "a" / "links.csv", keep_default_na=False)
    busiest = top[top["axis"] == "all"].sort_values("busy_fraction", ascending=False).iloc[0]
    assert f"{busiest['src']} → {busiest['dst']}" in page
    assert render_report(load_run_dir(tmp_path / "a")).count(png) == 1
    res = simulate("quickstart")
    res.write(tmp_path / "b", plots=False)
    page = render_report(load_run_dir(tmp_path / "b"))
    assert 'id="links-top"' in page and 'id="links-map"' not in page


def _gb200_144():
    return moe_scenario(
        cluster={"preset": "gb200-nvl72", "devices": 144},
        parallel={"tp": 2, "pp": 2, "dp": 36, "ep": 8},
        training={"global_batch_size": 72},
    )


def test_heat_map_of_gb200_nvl72_at_144_devices_is_legible(tmp_path):
    """Two racks of 18 trays, the switches above: no two labels overlap, every label lies
    inside the figure, and the most loaded link is named."""
    from matplotlib.text import Text

    from simulator.results.links_plot import TOP_LINKS, plot_links

    res = simulate(_gb200_144())
    cols = res.links_table()
    fig = plot_links(res, cols)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    drawn = list(fig.texts)
    for a in fig.axes:  # what each axes draws: its texts, titles and, if shown, its axis text
        drawn += [*a.texts, a.title, a._left_title, a._right_title]
        if a.axison:
            for axis in (a.xaxis, a.yaxis):
                drawn += [axis.label, *axis.get_ticklabels()]
    texts = [t for t in drawn if isinstance(t, Text) and t.get_visible() and t.get_text().strip()]
    boxes = [t.get_window_extent(renderer) for t in texts]
    fig_box = fig.bbox
    for b in boxes:
        assert b.x0 >= fig_box.x0 - 1 and b.x1 <= fig_box.x1 + 1 and b.y0 >= fig_box.y0 - 1 and b.y1 <= fig_box.y1 + 1
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not boxes[i].overlaps(boxes[j]), (texts[i].get_text(), texts[j].get_text())
    words = [t.get_text() for t in texts]
    assert sum(w.startswith("tray ") for w in words) == 2 * 18
    assert {"rack 0", "rack 1"} <= set(words)
    named = [w for w in words if "→" in w]
    kinds = set(cols["kind"].tolist())
    assert {"nvlink", "nic"} <= kinds and len(named) == TOP_LINKS + len(kinds)
    assert all(any(w.lstrip().startswith(f"{k}:") for w in named) for k in kinds)
    busiest = int(np.argmax(np.where(cols["axis"] == "all", cols["busy_fraction"], -1.0)))
    assert f"{cols['src'][busiest]} → {cols['dst'][busiest]}" in named[0]
    fig.savefig(tmp_path / "links.png")
