"""The map of where pipeline parallelism pays (simulator.studies.ppmap) on a 2x2 map of a tiny MoE."""

import json

import pandas as pd
import pytest
from helpers import SEARCH_MOE as TINY_MOE

from simulator.cli import app as cli
from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError
from simulator.studies.ppmap import assemble, run_map
from simulator.studies.ppmap.plot import plot_map
from simulator.studies.ppmap.roofline import dp_traffic_s
from simulator.studies.ppmap.screen import choose, screen
from simulator.studies.ppmap.spec import load_map, points


def tiny_map(**over):
    m = {
        "name": "tiny",
        "devices": 16,
        "models": [TINY_MOE],
        "training": {"seq_len": 512, "sequences_per_device": 4, "dtype": "bf16"},
        "grid": {"cluster": {"preset": "dgx-h100"}, "domain_sizes": [4, 8], "nic_gbps": [5, 100]},
        "marks": {"H100": [8, 100]},
        "search": {
            "max_tp": 1,
            "pp": [1, 2],
            "max_ep": 8,
            "schedules": ["1f1b", "dualpipe"],
            "zero": [1, 3],
            "recompute": ["none"],
        },
        "simulate": {"with_pp": 1, "without_pp": 1},
    }
    m.update(over)
    return m


def test_tiny_map_table_and_figure(tmp_path):
    table, cands = run_map(tiny_map(), tmp_path / "out", jobs=1)
    assert len(table) == 4 and set(table["domain"]) == {4, 8} and set(table["nic_gbps"]) == {5.0, 100.0}
    assert (table["simulated"] == 2).all()
    # the ratio is best-without-PP over the best of both: never below 1
    assert table["ratio"].notna().all() and (table["ratio"] >= 1.0).all()
    for _, r in table.iterrows():
        assert r["best_step_time_s"] == min(r["best_pp_step_time_s"], r["best_nopp_step_time_s"])
        assert r["ratio"] == pytest.approx(r["best_nopp_step_time_s"] / r["best_step_time_s"])
        assert r["aux_global_peak_bytes"] >= r["aux_free_peak_bytes"]  # all forwards first stash more
    assert set(cands["pp"]) == {1, 2} and (cands["status"] == "ok").all()
    assert (tmp_path / "out" / "map.csv").exists() and (tmp_path / "out" / "candidates.csv").exists()
    # a slower network costs the no-PP layout at least as much
    d4 = table[table["domain"] == 4].set_index("nic_gbps")
    assert d4.loc[5.0, "best_nopp_step_time_s"] >= d4.loc[100.0, "best_nopp_step_time_s"]
    png = tmp_path / "map.png"
    plot_map(table, png, markers={"H100": (8, 100.0)})
    assert png.stat().st_size > 10_000


def test_resume_runs_nothing_twice(tmp_path):
    out = tmp_path / "out"
    t1, _ = run_map(tiny_map(), out, jobs=1)
    rows = (out / "sims" / "rows.jsonl").read_text().splitlines()
    t2, _ = run_map(tiny_map(), out, jobs=1)
    assert (out / "sims" / "rows.jsonl").read_text().splitlines() == rows
    pd.testing.assert_frame_equal(t1, t2)
    # assemble alone reads the same table back
    t3, _ = assemble(tiny_map(), out)
    pd.testing.assert_frame_equal(t1, t3)


def test_assemble_leaves_out_rows_of_an_earlier_map_file(tmp_path):
    """A row the store kept from another map file (here: one point's row rewritten as if an
    earlier system had made it, same layout label, another key and step time) is not a
    simulation of today's cases: the table and status.json leave it out."""
    import json

    out = tmp_path / "out"
    t1, c1 = run_map(tiny_map(), out, jobs=1)
    store = out / "sims" / "rows.jsonl"
    rows = [json.loads(line) for line in store.read_text().splitlines()]
    stale = json.loads(json.dumps(rows[0]))
    stale["key"] = "0" * 64
    stale["summary"]["step_time_s"] = rows[0]["summary"]["step_time_s"] / 10
    with store.open("a") as f:
        f.write(json.dumps(stale) + "\n")
    t2, c2 = assemble(tiny_map(), out)
    pd.testing.assert_frame_equal(t1, t2)
    assert len(c2) == len(c1)
    assert json.loads((out / "status.json").read_text())["simulations_done"] == len(c1)


def test_a_failed_simulation_is_counted_and_said(tmp_path, capsys):
    """A simulation that raised is no candidate of its point's comparison; status.json counts it
    and the command says so (the map's Kimi K2 TP2 PP8 EP48 layouts on 32-GPU domains failed
    without a word but their rows' status)."""
    out = tmp_path / "out"
    _, c1 = run_map(tiny_map(), out, jobs=1)
    store = out / "sims" / "rows.jsonl"
    rows = [json.loads(line) for line in store.read_text().splitlines()]
    assert json.loads((out / "status.json").read_text())["simulations_failed"] == 0
    rows[0].update(
        status="failed", error="op 1 (x on rank 2) waits for ('F', 1, 0, 2), which no simulated rank produces"
    )
    rows[0]["summary"] = None
    store.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec_file = tmp_path / "map.json"
    spec_file.write_text(json.dumps(tiny_map()))
    assert cli.main(["ppmap", str(spec_file), "--out", str(out), "--assemble-only"]) == 0
    assert "1 simulation(s) failed" in capsys.readouterr().out
    assert json.loads((out / "status.json").read_text())["simulations_failed"] == 1
    _, c2 = assemble(tiny_map(), out)
    assert (c2["status"] == "failed").sum() == 1 and len(c2) == len(c1)
    # a resumed run takes it as done; --retry-failed simulates it again (DeepSeek-V3's 72-GPU /
    # 100 GB/s point kept a layout that had failed on an earlier version)
    assert cli.main(["ppmap", str(spec_file), "--out", str(out)]) == 0
    assert json.loads((out / "status.json").read_text())["simulations_failed"] == 1
    assert cli.main(["ppmap", str(spec_file), "--out", str(out), "--retry-failed"]) == 0
    assert json.loads((out / "status.json").read_text())["simulations_failed"] == 0
    _, c3 = assemble(tiny_map(), out)
    assert (c3["status"] == "ok").all() and len(c3) == len(c1)


def test_choose_takes_each_kind_and_distinct_schedules():
    spec = load_map(tiny_map(simulate={"with_pp": 2, "without_pp": 1}))
    pt = points(spec)[0]
    t = screen(pt, spec)
    picks = choose(t, 2, 1)
    assert [p["pp"] > 1 for p in picks] == [True, True, False]
    assert {p["schedule"] for p in picks[:2]} == {"1f1b", "dualpipe"}
    assert all(p["est_memory_bytes"] <= t["hbm_bytes"].iloc[0] for p in picks)


def test_dp_traffic_scales_with_bandwidth_and_zero3():
    spec = load_map(tiny_map())
    slow, fast = points(spec)[0]["scenario"], points(spec)[1]["scenario"]  # domain 4: 5 and 100 GB/s
    for s in (slow, fast):
        s["parallel"] = {"tp": 1, "pp": 1, "ep": 4, "zero": 1}
    a, b = dp_traffic_s(load_scenario(slow)), dp_traffic_s(load_scenario(fast))
    assert a > 5 * b > 0
    z3 = {**slow, "parallel": {**slow["parallel"], "zero": 3}}
    assert dp_traffic_s(load_scenario(z3)) > a  # gathers every micro-batch


def test_bad_map_names_the_field(tmp_path, capsys):
    with pytest.raises(ScenarioError, match="grid.domain_sizes"):
        load_map(tiny_map(grid={"domain_sizes": [3], "nic_gbps": [50]}))
    with pytest.raises(ScenarioError, match="bogus"):
        load_map(tiny_map(bogus=1))
    p = tmp_path / "m.json"
    p.write_text('{"devices": 16, "models": ["x"], "grid": {"domain_sizes": [5], "nic_gbps": [1]}}')
    assert cli.main(["ppmap", str(p), "--out", str(tmp_path / "o")]) == 2
    assert "domain_sizes" in capsys.readouterr().err


def test_larger_micro_batches_only_without_pp():
    search = {**tiny_map()["search"], "nopp_micro_batch_sizes": [1, 2]}
    spec = load_map(tiny_map(search=search))
    t = screen(points(spec)[0], spec)
    assert set(t[t["pp"] == 1]["micro_batch_size"]) == {1, 2}
    assert set(t[t["pp"] > 1]["micro_batch_size"]) == {1}


def test_fallback_halves_the_micro_batch_without_pp_only():
    from simulator.studies.ppmap import with_fallbacks

    base = {"tp": 1, "dp": 16, "cp": 1, "ep": 4, "vpp": 1, "schedule": "1f1b", "zero": 3, "recompute": "full"}
    chosen = [
        {**base, "pp": 2, "dp": 8, "micro_batch_size": 1, "label": "a"},
        {**base, "pp": 1, "micro_batch_size": 4, "label": "b"},
    ]
    got = with_fallbacks(chosen)
    assert [(p["pp"], p["micro_batch_size"]) for p in got] == [(2, 1), (1, 4), (1, 2)]
    assert got[2]["label"].endswith("z3-mb2-full")
    assert with_fallbacks([{**base, "pp": 1, "micro_batch_size": 1, "label": "c"}])[-1]["label"] == "c"


def test_adaptive_map_finds_the_best_layouts_simulating_all_would(tmp_path):
    """Without simulate.with_pp / without_pp a point simulates as `stepsim search` does, in
    rounds until no layout left can win; its best layouts with and without PP equal those of
    simulating every candidate that fits."""
    m = tiny_map()
    m.pop("simulate")
    assert load_map(m).adaptive
    table, cands = run_map(m, tmp_path / "adaptive", jobs=1)
    everything, _ = run_map(tiny_map(simulate={"with_pp": 99, "without_pp": 99}), tmp_path / "all", jobs=1)
    assert (table["simulated"] < everything["simulated"]).any()  # the rounds stopped early somewhere
    for col in ("best_pp_label", "best_nopp_label", "ratio"):
        assert list(table[col]) == list(everything[col]), col
    assert set(cands["status"]) <= {"ok", "oom"} and (table["best_pp_label"].notna()).all()
    bad = tiny_map(simulate={"adaptive": "yes"})
    with pytest.raises(ScenarioError, match="simulate.adaptive"):
        load_map(bad)


def test_the_map_tries_placements_and_names_them_per_cell(tmp_path):
    """Issue 39: with 6-GPU scale-up domains an EP4 group of 12 GPUs straddles two domains
    (ranks 4-7); the map, like the search, also tries 4 devices per domain (three domains, two
    GPUs each idle), and each cell names the placement of both layouts it compares and their
    throughput per domain."""
    m = tiny_map(
        devices=12,
        grid={"cluster": {"preset": "dgx-h100"}, "domain_sizes": [6], "nic_gbps": [5]},
        marks={},
        search={"max_tp": 1, "pp": [1, 2], "max_ep": 4, "schedules": ["1f1b"], "zero": [1], "recompute": ["none"]},
    )
    m["training"] = {"seq_len": 512, "sequences_per_device": 4, "dtype": "bf16"}
    m.pop("simulate")
    table, cands = run_map(m, tmp_path / "placed", jobs=1)
    assert 4.0 in set(cands["devices_per_domain"].dropna())
    row = table.iloc[0]
    for tag in ("best_pp", "best_nopp"):
        assert f"{tag}_devices_per_domain" in table.columns and row[f"{tag}_tokens_per_s_per_domain"] > 0
    assert row["ratio_per_domain"] >= 1.0
    per_domain = cands[cands["status"] == "ok"]["tokens_per_s_per_domain"]
    assert row["ratio_per_domain"] == pytest.approx(
        per_domain.max() / cands[(cands["status"] == "ok") & (cands["pp"] == 1)]["tokens_per_s_per_domain"].max()
    )


def test_each_placement_is_estimated_on_its_own_domains():
    """A candidate placed 4 devices a domain is estimated with ranks 0-3, 4-7, 8-11 sharing a
    domain, not with the point's default 6-GPU domains (where its EP4 groups straddle two): every
    screened estimate equals the estimate of the candidate's own scenario, and the aligned
    placement of a layout is estimated faster than the straddling default. (Priced with the
    default placement's domains, a placed candidate was estimated up to 2.1x slow in the PP map:
    DeepSeek-V3 TP4 PP16 EP16 DualPipe in 64-GPU blocks of 72-GPU domains, 45.7 s against 21.8 s
    simulated.)"""
    from simulator.studies.search.estimate import estimate_step_time
    from simulator.studies.search.layouts import LAYOUT_KEYS, candidate_mapping

    m = tiny_map(
        devices=12,
        grid={"cluster": {"preset": "dgx-h100"}, "domain_sizes": [6], "nic_gbps": [5]},
        marks={},
        search={"max_tp": 1, "pp": [1], "max_ep": 4, "schedules": ["1f1b"], "zero": [1], "recompute": ["none"]},
    )
    m["training"] = {"seq_len": 512, "sequences_per_device": 4, "dtype": "bf16"}
    spec = load_map(m)
    pt = points(spec)[0]
    table = screen(pt, spec)
    placed = table[table["devices_per_domain"].notna()]
    assert len(placed)
    for r in table.to_dict("records"):
        p = {k: r[k] for k in LAYOUT_KEYS}
        p["devices_per_domain"] = None if pd.isna(p["devices_per_domain"]) else int(p["devices_per_domain"])
        sc = load_scenario(candidate_mapping(pt["scenario"], p, pt["id"]))
        assert r["est_step_time_s"] == estimate_step_time(sc)["step_time_s"], r["label"]
    for r in placed.to_dict("records"):
        default = table[(table["label"] == r["label"].rsplit("-", 1)[0]) & table["devices_per_domain"].isna()]
        assert len(default) == 1 and r["est_step_time_s"] < default["est_step_time_s"].iloc[0]


def test_a_layout_that_does_not_fit_is_never_a_best():
    from simulator.studies.ppmap.run import _map_record

    pt = {"id": "p", "model": "m", "system": "grid", "domain": 8, "nic_gbps": 50.0, "scenario": {}}
    scr = {"chosen": [], "layouts_fit": 2, "nopp_fits": True, "nopp_fits_without_zero3": True,
           "nopp_fits_without_recompute": True, "nopp_fits_without_either": True}  # fmt: skip
    base = {"peak_memory_bytes": 1.0, "mfu": 0.5, "devices_per_domain": None, "tokens_per_s_per_domain": 1.0}
    sims = [
        {**base, "label": "fast-but-oom", "pp": 2, "status": "oom", "step_time_s": 1.0},
        {**base, "label": "pp-fits", "pp": 2, "status": "ok", "step_time_s": 3.0},
        {**base, "label": "nopp-fits", "pp": 1, "status": "ok", "step_time_s": 2.0},
    ]
    import simulator.studies.ppmap.run as run_mod

    rec = {}
    orig_aux, orig_roof = run_mod.aux_global_memory, run_mod.roofline
    run_mod.aux_global_memory, run_mod.roofline = (lambda *a: {}), (lambda *a: {})
    try:
        rec = _map_record(pt, scr, sims)
    finally:
        run_mod.aux_global_memory, run_mod.roofline = orig_aux, orig_roof
    assert rec["best_label"] == "nopp-fits" and rec["best_pp_label"] == "pp-fits" and rec["ratio"] == 1.0


def test_screens_in_processes_equal_the_screen_in_one(tmp_path):
    """``run_screens`` with two processes (one per group of points: a model's grid, a system)
    writes the records one process writes, CPU seconds aside."""
    from simulator.studies.ppmap.screen import run_screens

    spec = load_map(tiny_map(systems={"H800": {"cluster": {"preset": "h800"}}}))

    def records(jobs: int) -> dict:
        out = tmp_path / f"j{jobs}"
        out.mkdir()
        got = run_screens(spec, out, jobs=jobs)
        return {k: {f: v for f, v in r.items() if f != "screen_cpu_s"} for k, r in got.items()}

    one, two = records(1), records(2)
    assert len(one) == 5 and one == two
    assert any(r["chosen"] for r in one.values())


def test_adaptive_map_simulates_a_repeat_of_a_layout_once(tmp_path):
    """As `stepsim search` does (rounds.Dedupe): with flash attention ``selective`` recompute is
    ``none``, so of two layouts that differ only there one is simulated; the map's best step
    times are those of simulating both."""
    m = tiny_map(search={**tiny_map()["search"], "recompute": ["none", "selective"]})
    m.pop("simulate")
    table, cands = run_map(m, tmp_path / "dedupe", jobs=1)
    keys = [c for c in cands.columns if c in ("point", "tp", "pp", "dp", "ep", "vpp", "schedule", "zero")]
    keys += [c for c in ("micro_batch_size", "devices_per_domain") if c in cands.columns]
    pairs = cands.groupby(keys, dropna=False)["recompute"].nunique()
    assert len(pairs) and (pairs == 1).all()  # never both none and selective of one layout
    both = m | {"simulate": {"with_pp": 99, "without_pp": 99}}
    everything, _ = run_map(both, tmp_path / "all", jobs=1)
    for col in ("best_pp_step_time_s", "best_nopp_step_time_s", "ratio"):
        assert list(table[col]) == list(everything[col]), col


def test_a_resumed_map_builds_no_trace_it_has_fingerprinted(tmp_path, monkeypatch):
    """A resumed adaptive map reads its finished points back without building their traces
    again for the duplicate check (it took 83 % of a restart on the committed store): layouts
    already in the store are not compared, and the fingerprints of the others are kept in
    ``sims/fingerprints.jsonl``. The map is the same."""
    from workloads.trace import builder

    m = tiny_map(search={**tiny_map()["search"], "recompute": ["none", "selective"]})
    m.pop("simulate")
    out = tmp_path / "resume"
    first, _ = run_map(m, out, jobs=1)
    saved = (out / "sims" / "fingerprints.jsonl").read_text().splitlines()
    assert saved and all("fingerprint" in line for line in saved)
    built = []
    real = builder.build_trace
    monkeypatch.setattr(builder, "build_trace", lambda *a, **k: built.append(1) or real(*a, **k))
    again, _ = run_map(m, out, jobs=1)
    assert built == []
    for col in ("best_pp_step_time_s", "best_nopp_step_time_s", "ratio", "best_pp_label", "best_nopp_label"):
        assert list(first[col]) == list(again[col]), col


def test_recheck_simulates_the_bests_again_and_finds_a_stale_row(tmp_path):
    """--recheck re-simulates each point's best layout with PP and without: on a store this
    version wrote they equal it; a stored row whose step differs (an older version's) is
    named, and the store is left as it was."""
    from simulator.studies.ppmap.recheck import recheck

    out = tmp_path / "out"
    table, _ = run_map(tiny_map(), out, jobs=1)
    df = recheck(tiny_map(), out, jobs=1)
    n = int(table.ratio.notna().sum())
    assert n > 0 and len(df) == 2 * n
    assert df.same.all() and (df.status == "ok").all()
    assert (out / "recheck.csv").exists()
    # an older version's row: the best without PP of the first point, 10 % faster (so that it
    # stays the best)
    first = table[table.ratio.notna()].iloc[0]
    store = out / "sims" / "rows.jsonl"
    lines = store.read_text().splitlines()
    name = f"{first.point}:{first.best_nopp_label}"
    for i, line in enumerate(lines):
        row = json.loads(line)
        if (row.get("summary") or {}).get("name") == name:
            row["summary"]["step_time_s"] *= 0.9
            lines[i] = json.dumps(row)
    store.write_text("\n".join(lines) + "\n")
    before = store.read_text()
    df = recheck(tiny_map(), out, jobs=1)
    stale = df[~df.same]
    assert stale.label.tolist() == [first.best_nopp_label]
    assert stale.rel_change.iloc[0] == pytest.approx(1 / 0.9 - 1, rel=1e-9)
    assert store.read_text() == before


def test_points_runs_only_the_points_it_names(tmp_path):
    """--points screens and simulates only the matching points; the others keep no ratio
    until a later run, and a pattern matching nothing is refused naming --points."""
    from simulator.errors import StudyError

    ids = [p["id"] for p in points(load_map(tiny_map()))]
    first = ids[0]
    table, _ = run_map(tiny_map(), tmp_path / "out", jobs=1, only=[first])
    got = table.set_index("point").ratio
    assert got.notna()[first] and got.drop(first).isna().all()
    assert set(table.point) == {first}  # only the selected point was screened
    assert not (tmp_path / "out" / "run.json").exists()  # a whole map's wall time only
    with pytest.raises(StudyError, match="matches no point") as err:
        run_map(tiny_map(), tmp_path / "out", jobs=1, only=["no-such-point*"])
    assert err.value.field == "--points" and first in str(err.value)


def test_an_adaptive_map_in_two_workers_equals_one_in_this_process(tmp_path):
    """With local workers the points' rounds run at once, sharing one pool (``_run_adaptive``'s
    threads): each point simulates the same layouts and finds the same figures as the points run
    one after another in this process, and the store holds each case once."""
    m = tiny_map()
    m.pop("simulate")
    one, c1 = run_map(m, tmp_path / "one", jobs=1)
    two, c2 = run_map(m, tmp_path / "two", jobs=2)
    pd.testing.assert_frame_equal(one, two)
    cols = [c for c in c1.columns if c not in ("sim_wall_s",)]
    key = ["point", "label"]
    pd.testing.assert_frame_equal(
        c1[cols].sort_values(key).reset_index(drop=True), c2[cols].sort_values(key).reset_index(drop=True)
    )
    lines = (tmp_path / "two" / "sims" / "rows.jsonl").read_text().splitlines()
    assert len(lines) == len({json.loads(x)["key"] for x in lines}) == int(two["simulated"].sum())
