#!/usr/bin/env python3
"""Precompute the headline results that notebooks/02_do_we_need_pipeline_parallelism.ipynb shows.

Every number in ``docs/results/pp_layouts.csv`` and ``docs/results/pp_bandwidth_sweep.csv`` is a
stepsim simulation run by this script (``simulator.studies.sweep.sweep``; each case is a complete
scenario, also stored in the CSV's ``scenario`` column, that ``stepsim run`` reproduces).
``docs/results/make_results.json`` records the settings that produced the files.

    python docs/results/make_results.py            # the reduced run committed here (see below)
    python docs/results/make_results.py --full     # the same questions at 2,048-GPU scale (slow)
    python docs/results/make_results.py --figures-only   # re-run the notebooks to refresh the PNGs

What it simulates
-----------------
1. ``pp_layouts.csv`` — DeepSeek-V3 and Kimi K2 (both 61 layers, MoE, 4,096-token sequences,
   8 sequences per device per step = 32,768 tokens per device, about DeepSeek-V3's 30,720), on
   three machines: 8-GPU H800 nodes over InfiniBand (``h800``), GB200 NVL72 racks
   (``gb200-nvl72``) and a TPU v5p torus slice (``tpu-v5p``). For each, candidate layouts with
   and without pipeline parallelism (PP); the notebook takes the fastest that fits in memory.
2. ``pp_bandwidth_sweep.csv`` — DeepSeek-V3 on 8-GPU H800-style nodes, the best no-PP and PP
   layouts of (1) that fit in memory (the fastest of each kind if none fits), with the scale-out
   (NIC) bandwidth per GPU swept: 12.5, 50 (the preset) and 200 GB/s reduced; 6.25 to 400 full.

Reduced (default) vs ``--full``
-------------------------------
The committed files come from the reduced run: 512 devices (576 = 8 racks for NVL72) instead
of 2,048 (2,304), the same tokens per device, and a short list of candidate layouts rather
than an exhaustive search: ``simulator.studies.search.search`` cannot split 61 layers over a
pipeline (it sets ``pipeline_layers`` to an even split, and 61 is prime), so the PP
candidates here give ``pipeline_layers`` explicitly. ``--full`` uses 2,048/2,304 devices and
more candidates; it takes hours on a laptop.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from simulator.studies.sweep import sweep  # noqa: E402
from simulator.studies.sweep.cases import expand  # noqa: E402
from simulator.studies.sweep.rows import RowStore, flatten  # noqa: E402
from simulator.studies.sweep.spec import load_sweep  # noqa: E402

SEQ_LEN = 4096
SEQS_PER_DEVICE = 8
MODELS = ("deepseek-v3", "kimi-k2")
HARDWARE = {
    # name: (cluster preset, devices reduced, devices full, training dtype, label)
    "h800": ("h800", 512, 2048, "fp8", "8-GPU H800 nodes + InfiniBand"),
    "gb200-nvl72": ("gb200-nvl72", 576, 2304, "fp8", "GB200 NVL72 racks"),
    "tpu-v5p": ("tpu-v5p", 512, 2048, "bf16", "TPU v5p 3D torus"),
}


def pipeline_layers(layers: int, pp: int) -> list[int]:
    """An even split of ``layers`` over ``pp`` stages; the remainder is taken off the last
    stages (they also hold the LM head and MTP module) and the first (the embedding)."""
    base, extra = divmod(layers, pp)
    if extra == 0:
        return [base] * pp
    split = [base + 1] * pp
    short = pp - extra
    # take one layer off the first stage, then off the last ones
    order = [0] + list(range(pp - 1, 0, -1))
    for i in order[:short]:
        split[i] -= 1
    assert sum(split) == layers
    return split


def layout(tp=1, pp=1, ep=64, zero=1, schedule="1f1b", recompute="full", layers=61):
    par = {"tp": tp, "pp": pp, "ep": ep, "zero": zero, "sequence_parallel": tp > 1}
    if pp > 1:
        par["pipeline_layers"] = pipeline_layers(layers, pp)
    return {"parallel": par, "schedule": schedule, "training.recompute": recompute}


def candidates(hw: str, full: bool) -> list[dict]:
    """Candidate layouts; ``skip_invalid`` drops the ones whose degrees do not divide."""
    out = [
        # no pipeline: ZeRO-3 (FSDP) data parallelism + expert parallelism, full recompute
        {"name": "noPP fsdp+ep64", **layout(pp=1, ep=64, zero=3)},
        # pipeline: 8 stages, ZeRO-1, experts over 64 devices (DeepSeek-V3 style, fewer stages)
        {"name": "PP8 ep64", **layout(pp=8, ep=64, zero=1)},
    ]
    if hw == "gb200-nvl72":
        # 576 = 8 x 72: with 8 stages dp = 72, so ep must divide 72 and the experts
        out.append({"name": "PP8 ep8", **layout(pp=8, ep=8, zero=1)})
        # 186 GB of HBM: plain ZeRO-1 data parallelism (weights replicated) may fit without PP
        out.append({"name": "noPP zero1+ep64", **layout(pp=1, ep=64, zero=1)})
        # ZeRO-2: gradients sharded too, weights still replicated (no per-layer all-gathers)
        out.append({"name": "noPP zero2+ep64", **layout(pp=1, ep=64, zero=2)})
    if full:
        out += [
            {"name": "noPP tp8 fsdp+ep64", **layout(tp=8, pp=1, ep=64, zero=3, recompute="selective")},
            {"name": "noPP fsdp+ep8", **layout(pp=1, ep=8, zero=3)},
            {"name": "PP16 ep64 dualpipe", **layout(pp=16, ep=64, zero=1, schedule="dualpipe", recompute="selective")},
            {"name": "PP16 ep64", **layout(pp=16, ep=64, zero=1)},
            {"name": "PP4 ep64", **layout(pp=4, ep=64, zero=1)},
        ]
    return out


def base_scenario(model: str, hw: str, full: bool) -> dict:
    preset, n_red, n_full, dtype, _ = HARDWARE[hw]
    n = n_full if full else n_red
    return {
        "name": f"{model}-{n}x{hw}",
        # DeepSeek-V3's multi-token-prediction module is left out (Kimi K2 has none): the trace
        # currently stores its MoE experts unsplit by expert parallelism on the last pipeline
        # stage (about 23 GB of extra bf16 weights at ep 64), which would make every PP layout
        # run out of memory for a bookkeeping reason; see MTP_NOTE.
        "model": {"preset": model, "mtp_depth": 0} if model == "deepseek-v3" else model,
        "cluster": {"preset": preset, "devices": n},
        "parallel": {"tp": 1, "pp": 1, "ep": 64, "zero": 1},
        "schedule": "1f1b",
        "training": {
            "seq_len": SEQ_LEN,
            "micro_batch_size": 1,
            "global_batch_size": SEQS_PER_DEVICE * n,
            "dtype": dtype,
            "recompute": "full",
            "balance": "aux-free",
        },
    }


MTP_NOTE = (
    "deepseek-v3 simulated with mtp_depth 0: with the MTP module the simulated last pipeline stage holds "
    "its routed experts unsplit by ep (weights 31.6 GB vs 8.4 GB without, DSV3 8-layer check at pp4 ep8), "
    "which is a memory-accounting issue reported to the maintainers"
)

KEEP = [
    "step_time_s",
    "mfu",
    "hfu",
    "tokens_per_s",
    "bubble_fraction",
    "exposed_comm_fraction",
    "peak_memory_bytes",
    "hbm_bytes",
    "oom",
    "micro_batches",
    "parameters",
    "active_parameters",
    "model_flops_per_step",
    "sim_wall_s",
]


def _scenarios(spec: dict) -> dict:
    """case index -> the complete scenario mapping simulated (JSON), for ``stepsim run``."""
    return {c.index: json.dumps(c.scenario, sort_keys=True) for c in expand(load_sweep(spec)).cases}


def _tidy(frame: pd.DataFrame, extra: dict, scenarios: dict) -> pd.DataFrame:
    rows = []
    for r in frame.to_dict("records"):
        row = {**extra, "label": r.get("name"), "status": r["status"], "error": r.get("error")}
        for k in ("layout.tp", "layout.pp", "layout.dp", "layout.ep", "layout.zero"):
            row[k.split(".")[1]] = r.get(k)
        row["schedule"] = r.get("schedule")
        for k in KEEP:
            row[k] = r.get(k)
        row["scenario"] = scenarios.get(r["case"])
        for k, v in r.items():
            if k.startswith("exposed_comm_by_axis_s."):
                row["exposed_" + k.split(".", 1)[1] + "_s"] = v
        rows.append(row)
    return pd.DataFrame(rows)


def run_layouts(full: bool, jobs, work: Path, assemble: bool = False) -> pd.DataFrame:
    parts = []
    for model in MODELS:
        for hw in HARDWARE:
            base = base_scenario(model, hw, full)
            cases = candidates(hw, full)
            spec = {"name": f"layouts-{model}-{hw}", "base": base, "cases": cases, "skip_invalid": True}
            t0 = time.perf_counter()
            frame = (
                _assembled(work / f"layouts-{model}-{hw}", spec)
                if assemble
                else sweep(spec, out=work / f"layouts-{model}-{hw}", jobs=jobs)
            )
            print(f"{model} on {hw}: {len(frame)} cases in {time.perf_counter() - t0:.0f} s", flush=True)
            parts.append(
                _tidy(frame, {"model": model, "hardware": hw, "devices": base["cluster"]["devices"]}, _scenarios(spec))
            )
    return pd.concat(parts, ignore_index=True)


def best(table: pd.DataFrame, model: str, hw: str, with_pp: bool, allow_oom: bool = False):
    t = table[(table.model == model) & (table.hardware == hw) & (table.status == "ok")]
    if not allow_oom:
        t = t[~t.oom.astype(bool)]
    t = t[(t.pp > 1) if with_pp else (t.pp == 1)]
    return None if t.empty else t.sort_values("step_time_s").iloc[0]


NIC_BW = (12.5e9, 50e9, 200e9)
NIC_BW_FULL = (6.25e9, 12.5e9, 25e9, 50e9, 100e9, 200e9, 400e9)


def run_bandwidth(layouts: pd.DataFrame, full: bool, jobs, work: Path, assemble: bool = False) -> pd.DataFrame:
    model, hw = "deepseek-v3", "h800"
    base = base_scenario(model, hw, full)
    picks = []
    for with_pp in (False, True):
        b = best(layouts, model, hw, with_pp)
        if b is None:
            b = best(layouts, model, hw, with_pp, allow_oom=True)
        if b is not None:
            cand = next(c for c in candidates(hw, full) if c["name"] == b["label"])
            picks.append(cand)
    spec = {
        "name": "nic-sweep",
        "base": base,
        "cases": picks,
        "grid": {"cluster.network.nic_bw_bytes_per_s": list(NIC_BW_FULL if full else NIC_BW)},
        "skip_invalid": True,
    }
    # The preset's own bandwidth (50e9) resolves to the very scenarios of pp_layouts: seed the
    # sweep's row store with those rows so that they are not simulated twice.
    (work / "nic-sweep").mkdir(parents=True, exist_ok=True)
    seed, rows = work / f"layouts-{model}-{hw}" / "rows.jsonl", work / "nic-sweep" / "rows.jsonl"
    if seed.exists() and not rows.exists():
        shutil.copy(seed, rows)
    t0 = time.perf_counter()
    frame = _assembled(work / "nic-sweep", spec) if assemble else sweep(spec, out=work / "nic-sweep", jobs=jobs)
    print(f"bandwidth sweep: {len(frame)} cases in {time.perf_counter() - t0:.0f} s", flush=True)
    tidy = _tidy(frame, {"model": model, "hardware": hw, "devices": base["cluster"]["devices"]}, _scenarios(spec))
    tidy.insert(3, "nic_bw_bytes_per_s", frame["cluster.network.nic_bw_bytes_per_s"].values)
    return tidy


def _assembled(work: Path, spec: dict) -> pd.DataFrame:
    """The sweep table of ``spec`` from the rows already in its folder, matched by case name
    (the last row per name wins) instead of by scenario hash: used by ``--assemble`` when the
    simulator's scenario schema changed while a long run was under way (the hash then changes
    although the scenario does not)."""
    rows = RowStore(work).load() if (work / "rows.jsonl").exists() else {}
    by_name = {}
    for row in rows.values():
        if row.get("summary"):
            by_name[row["summary"]["name"]] = row
    records = []
    for c in expand(load_sweep(spec)).cases:
        name = c.scenario.get("name")
        nic = c.axes.get("cluster.network.nic_bw_bytes_per_s")
        match = [
            r
            for r in rows.values()
            if r.get("summary")
            and r["summary"]["name"] == name
            and (nic is None or r.get("axes", {}).get("cluster.network.nic_bw_bytes_per_s", 50e9) == nic)
        ]
        row = match[-1] if match else None
        if row is None:
            continue
        rec = {
            "case": c.index,
            **{a: c.axes.get(a) for a in c.axes},
            "status": row["status"],
            "error": row.get("error"),
        }
        for k, v in flatten(row["summary"]).items():
            rec.setdefault(k, v)
        records.append(rec)
    return pd.DataFrame(records)


def make_figures(out: Path) -> None:
    """Execute every notebook (CI mode) with ``STEPSIM_FIGURES`` set, so that each saves its
    README figure into ``out``; the executed copies are discarded (notebooks are stored
    without outputs)."""
    import os

    import nbclient
    import nbformat

    env = {"STEPSIM_FIGURES": str(out.resolve()), "STEPSIM_OUT": str(ROOT / "out" / "notebooks"), "MPLBACKEND": "Agg"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    os.environ.pop("STEPSIM_FULL", None)
    try:
        for nb_path in sorted((ROOT / "notebooks").glob("*.ipynb")):
            t0 = time.perf_counter()
            nb = nbformat.read(nb_path, as_version=4)
            nbclient.NotebookClient(
                nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(nb_path.parent)}}
            ).execute()
            print(f"{nb_path.name}: {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="2,048-GPU scale and more candidates (hours)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel simulations (default: every core)")
    ap.add_argument("--work", default=None, help="resumable sweep folders (default: out/make_results[-full])")
    ap.add_argument("--out", default=str(HERE), help="where the CSV/JSON files go (default: docs/results)")
    ap.add_argument(
        "--figures",
        action="store_true",
        help="then run every notebook (CI mode) to refresh the README figures in --out",
    )
    ap.add_argument("--figures-only", action="store_true", help="only refresh the figures")
    ap.add_argument(
        "--assemble",
        action="store_true",
        help="simulate nothing: build the tables from the rows already in --work, matched by case name",
    )
    args = ap.parse_args(argv)
    if args.figures_only:
        make_figures(Path(args.out))
        return 0
    suffix = "-full" if args.full else ""
    work = Path(args.work or ROOT / "out" / f"make_results{suffix}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    layouts = run_layouts(args.full, args.jobs, work, args.assemble)
    layouts.to_csv(out / f"pp_layouts{suffix}.csv", index=False)
    bw = run_bandwidth(layouts, args.full, args.jobs, work, args.assemble)
    bw.to_csv(out / f"pp_bandwidth_sweep{suffix}.csv", index=False)
    meta = {
        "mode": "full" if args.full else "reduced",
        "command": " ".join(["python docs/results/make_results.py", *(sys.argv[1:] if argv is None else argv)]),
        "devices": {hw: (v[2] if args.full else v[1]) for hw, v in HARDWARE.items()},
        "hardware": {hw: v[4] for hw, v in HARDWARE.items()},
        "dtype": {hw: v[3] for hw, v in HARDWARE.items()},
        "seq_len": SEQ_LEN,
        "sequences_per_device": SEQS_PER_DEVICE,
        "tokens_per_device": SEQ_LEN * SEQS_PER_DEVICE,
        "models": list(MODELS),
        "note": MTP_NOTE,
        "candidates": {hw: candidates(hw, args.full) for hw in HARDWARE},
        "nic_bw_bytes_per_s": list(NIC_BW_FULL if args.full else NIC_BW),
        "bandwidth_sweep": {
            "model": "deepseek-v3",
            "hardware": "h800",
            "layouts": "best without PP and best with PP of pp_layouts for deepseek-v3 on h800",
        },
        "assembled": bool(args.assemble)
        and (
            "tables built from the rows of the resumable sweep folders, matched by case name: the run was "
            "interrupted and resumed while the simulator's scenario schema changed, which changes the scenario "
            "hashes but not the scenarios"
        ),
        "simulation_wall_s_total": round(
            float(pd.concat([layouts["sim_wall_s"], bw["sim_wall_s"]]).fillna(0).sum()), 1
        ),
        "host": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
        "wall_s": round(time.perf_counter() - t0, 1),
        "python": platform.python_version(),
    }
    (out / f"make_results{suffix}.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {out} in {meta['wall_s']} s")
    if args.figures:
        make_figures(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
