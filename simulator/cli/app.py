"""The ``stepsim`` command line.

The exit codes, :class:`CliError` and the mapping of errors to exit codes are in
:mod:`simulator.cli.common` (shared with the ``sweep``/``search`` and
``validate``/``calibrate`` commands of :mod:`simulator.cli.sweep` and
:mod:`simulator.cli.validate`, which this module registers):

* 0: success;
* 1: an internal error (traceback only with ``STEPSIM_DEBUG=1``);
* 2: bad input (one line naming the field and what is allowed, no traceback);
* 3: ``stepsim validate --max-error F``: a case is off by more than ``F``;
* 4: ``sweep``, ``search`` or ``validate`` ran, but some of its cases failed (the
  command says how many; the others' results are written as usual);
* 130 / 143: interrupted by SIGINT / SIGTERM (one line; outputs left as they were).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

# The exit codes are re-exported: simulator.cli.app is where scripts have always found them.
from simulator.cli import limits
from simulator.cli.common import (  # noqa: F401
    EXIT_BAD_INPUT,
    EXIT_CASES_FAILED,
    EXIT_CODES_HELP,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OFF_TARGET,
    EXIT_OK,
    EXIT_TERMINATED,
    MAX_DEVICES_FLAG,
    CliError,
    int_flag,
    new_parser,
    resolve_scenario_path,
    run,
)
from simulator.cli.limits import check_collective_work, check_finite_summary
from workloads.enums import BALANCE_MODES, COLLECTIVE_OPS, RECOMPUTE_MODES, SCHEDULES

# ---- commands -------------------------------------------------------------------------


def cmd_run(args) -> int:
    from simulator import simulate
    from simulator.results.outdir import check_output_dir, check_output_file, staged_dir, staged_file
    from simulator.results.result import RUN_OUTPUTS

    path = resolve_scenario_path(args.scenario)
    if args.out:  # the output paths are checked before simulating
        check_output_dir(args.out, "--out")
    if args.perfetto:
        if args.out and Path(args.perfetto).resolve() == Path(args.out).resolve():
            raise CliError(f"--perfetto: {args.perfetto} is the --out folder; give a file name", field="--perfetto")
        check_output_file(args.perfetto, "--perfetto", within=args.out)
    topology = None
    if args.topology:
        from topologies.io import load_topology

        topology = load_topology(args.topology)
    trace = None
    if args.trace:
        from workloads.trace.io import read_trace

        trace = read_trace(args.trace)
    if args.html and not args.out:
        raise CliError("--html: give --out DIR too (the report is written to DIR/report.html)")
    if args.html:
        from simulator.results.html_data import require_plotly

        require_plotly()  # before the simulation, not after
    # Without op-level outputs a step whose steady phase provably repeats is skipped ahead
    # (simulator.steady: the same summary to ~1e-12); --full simulates every micro-batch.
    summary_only = not (args.out or args.perfetto or args.full)
    result = simulate(path, exact=args.exact, topology=topology, trace=trace, progress=None, steady_state=summary_only)
    if args.reproducible:
        # Machine-dependent figures left out, so that the same scenario gives a
        # byte-identical summary.json.
        result.summary["sim_wall_s"] = None
        if result.summary.get("steady_state_try"):
            result.summary["steady_state_try"]["wall_s"] = None
    if args.out:  # every file written, then moved into --out together
        with staged_dir(args.out, RUN_OUTPUTS, "--out") as tmp:
            paths = result.write(tmp, plots=not args.no_plots)
            if args.html:
                from simulator.results.html_report import write_report

                paths["report"] = write_report(result, tmp / "report.html")
        paths = {k: Path(args.out) / p.name for k, p in paths.items()}
    if args.perfetto:
        with staged_file(args.perfetto, "--perfetto") as tmp:
            result.to_chrome_trace(tmp)
    if args.json:
        sys.stdout.write(result.summary_json())
    else:
        print(result.text_summary())
        if args.out:
            print(f"  wrote {', '.join(p.name for p in paths.values())} to {args.out}")
        if args.perfetto:
            print(f"  wrote {args.perfetto} (open in https://ui.perfetto.dev)")
    return EXIT_OK


def cmd_report(args) -> int:
    from simulator.results.html_data import load_run_dir
    from simulator.results.html_report import write_report
    from simulator.results.outdir import staged_file
    from simulator.results.report import format_summary

    if args.output and not args.html:
        raise CliError("--output: only with --html")
    out = Path(args.output) if args.output else Path(args.dir) / "report.html"
    if args.html:
        from simulator.results.html_data import require_plotly

        require_plotly()
    data = load_run_dir(args.dir)  # the output path is checked as the page is staged, before it is drawn
    check_finite_summary(data.summary, Path(args.dir) / "summary.json")
    if not args.html:
        print(format_summary(SimpleNamespace(summary=data.summary)))  # it reads .summary only
        return EXIT_OK
    with staged_file(out, "--output" if args.output else "--html") as tmp:
        write_report(data, tmp)
    print(f"wrote {out}")
    return EXIT_OK


def cmd_compare(args) -> int:
    from simulator.results.outdir import check_output_dir, staged_dir
    from simulator.studies.compare import compare_schedules, format_table, plot_comparison, write_tables

    path = resolve_scenario_path(args.scenario)
    schedules = [x.strip() for x in args.schedules.split(",") if x.strip()]
    if args.html and not args.out:
        raise CliError("--html: give --out DIR too (the report is written to DIR/compare.html)")
    if args.out:
        check_output_dir(args.out, "--out")
    if args.html:
        from simulator.results.html_data import require_plotly

        require_plotly()  # before the simulations, not after
    table, results = compare_schedules(path, schedules, vpp=args.vpp)
    print(format_table(table))
    if args.out:
        with staged_dir(args.out, COMPARE_OUTPUTS, "--out") as out:
            write_tables(table, results, out)
            plot_comparison(table, results, out / "compare.png")
            if args.html:
                from simulator.results.html_report import write_compare_report

                write_compare_report(table, results, out / "compare.html")
        print(f"wrote compare.csv, compare_explain.csv and compare.png to {args.out}")
        if args.html:
            print(f"wrote {Path(args.out) / 'compare.html'}")
    return EXIT_OK


#: What ``stepsim compare --out DIR`` writes (those a run does not write are removed from DIR).
COMPARE_OUTPUTS = ("compare.csv", "compare_explain.csv", "compare.png", "compare.html")


def cmd_presets(args) -> int:
    from simulator.engine.compute import DEFAULT_COMPUTE_CALIBRATION
    from simulator.scenario.loading import builtin_scenarios
    from topologies.chips import CHIPS
    from topologies.presets import CLUSTER_PRESETS
    from workloads import parameters
    from workloads.presets import MODEL_PRESETS

    data = {
        "models": {
            k: {
                "parameters": parameters.parameter_count(m, include_mtp=False),
                "active_parameters": parameters.active_parameter_count(m, include_mtp=False),
                "layers": m.layers,
                "hidden": m.hidden,
                "moe": m.moe is not None,
                "mla": m.attention is not None,
            }
            for k, m in sorted(MODEL_PRESETS.items())
        },
        "clusters": {
            k: {
                "chip": p.chip,
                "default_devices": p.default_devices,
                "network": "torus" if p.tpu is not None else "switched",
            }
            for k, p in sorted(CLUSTER_PRESETS.items())
        },
        "chips": {
            k: {
                "bf16_flops_per_s": c.peak("bf16"),
                "fp8_flops_per_s": c.peak("fp8"),
                "hbm_bytes": c.hbm_bytes,
                "hbm_bw_bytes_per_s": c.hbm_bw_bytes_per_s,
                "family": c.family,
            }
            for k, c in sorted(CHIPS.items())
        },
        "schedules": list(SCHEDULES),
        "scenarios": sorted(builtin_scenarios()),
        "recompute": list(RECOMPUTE_MODES),
        "balance": list(BALANCE_MODES),
        "network_kinds": ["torus", "switched"],
        "calibration_families": sorted(DEFAULT_COMPUTE_CALIBRATION),
    }
    if args.json:
        print(json.dumps(data, indent=2))
        return EXIT_OK
    print("models:")
    for k, m in data["models"].items():
        kind = ("MoE " if m["moe"] else "") + ("MLA" if m["mla"] else "")
        print(
            f"  {k:<22} {m['parameters'] / 1e9:8.1f} B params  {m['active_parameters'] / 1e9:7.1f} B active  "
            f"{m['layers']:>3} layers  {kind}"
        )
    print("clusters:")
    for k, c in data["clusters"].items():
        print(f"  {k:<22} chip {c['chip']:<8} {c['network']:<9} default {c['default_devices']} devices")
    print("chips:")
    for k, c in data["chips"].items():
        print(
            f"  {k:<22} {c['bf16_flops_per_s'] / 1e12:6.0f} TFLOP/s bf16  {c['fp8_flops_per_s'] / 1e12:6.0f} fp8  "
            f"{c['hbm_bytes'] / 1e9:5.0f} GB  {c['hbm_bw_bytes_per_s'] / 1e12:4.2f} TB/s  ({c['family']})"
        )
    print("schedules:  " + ", ".join(data["schedules"]))
    print("scenarios:  " + ", ".join(data["scenarios"]))
    print(f"recompute:  {', '.join(RECOMPUTE_MODES)};  balance: {', '.join(BALANCE_MODES)}")
    return EXIT_OK


def _cluster_from_arg(arg: str, devices: int | None):
    from pydantic import ValidationError

    from simulator.scenario.checks import check_torus_size
    from simulator.scenario.loading import read_mapping
    from simulator.scenario.resolve import resolve_cluster
    from simulator.scenario.schema import PlacementIn, error_from_pydantic
    from stepsim_fileio import is_there
    from topologies.networks import TorusNetwork

    p = Path(arg)
    placement = None
    if is_there(p):  # a name too long: reading it says so
        data = read_mapping(p)
        data.pop("name", None)
        spec = data.get("cluster", data)
        if "cluster" in data and data.get("placement") is not None:  # a scenario's placement places its devices
            try:
                placement = PlacementIn.model_validate(data["placement"])
            except ValidationError as err:
                raise error_from_pydantic(err, "placement") from None
    else:
        spec = {"preset": arg}
    if devices is not None:
        spec = {**spec, "devices": devices}
    cluster = resolve_cluster(spec, placement)
    check_torus_size(cluster.devices, isinstance(cluster.network, TorusNetwork))
    return cluster


def _network_calibration(arg: str, family: str):
    """The family's network calibration, with the ``network_calibration`` of a scenario
    file given as ``--cluster`` applied (so that a calibrated scenario can be checked
    against the nccl-tests logs it was fitted to)."""
    from simulator.network.calibration import default_calibration
    from simulator.scenario.loading import read_mapping
    from simulator.scenario.schema import NetCalIn, error_from_pydantic

    cal = default_calibration(family)
    p = Path(arg)
    if not p.exists():
        return cal
    data = read_mapping(p).get("network_calibration")
    if data is None:
        return cal
    from pydantic import ValidationError

    try:
        entries = NetCalIn.model_validate(data)
    except ValidationError as err:
        raise error_from_pydantic(err, "network_calibration") from None
    return cal.with_overrides(**{k: v for k, v in entries.model_dump().items() if v})


def cmd_collective(args) -> int:
    from simulator.results.outdir import check_output_file, staged_file
    from simulator.studies import bench
    from topologies.presets import build_cluster

    try:
        lo, hi = bench.parse_size(args.min_bytes), bench.parse_size(args.max_bytes)
    except ValueError as err:
        raise CliError(f"--min-bytes/--max-bytes: {err}") from None
    if lo <= 0 or hi < lo:
        raise CliError(f"--min-bytes/--max-bytes: need 0 < min <= max, got {lo} and {hi}")
    if hi > limits.MAX_COLLECTIVE_BYTES:
        raise CliError(
            f"--max-bytes: at most {limits.MAX_COLLECTIVE_BYTES:,} bytes (1 PiB), got {hi:,}", field="--max-bytes"
        )
    if args.plot:
        check_output_file(args.plot, "--plot")
    spec = _cluster_from_arg(args.cluster, args.devices)
    n = args.devices or spec.devices
    sizes = bench.size_range(lo, hi)
    check_collective_work(args.op, n, len(sizes))  # before building a network of n devices
    topo = build_cluster(spec)
    if n > topo.n_devices:
        raise CliError(f"--devices: {n} is more than the cluster's {topo.n_devices}")
    rows = bench.collective_sweep(
        args.op,
        topo,
        list(range(n)),
        sizes,
        algorithm=args.algorithm,
        calibration=_network_calibration(args.cluster, spec.chip.family),
    )
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    elif args.format == "csv":
        import csv

        w = csv.DictWriter(sys.stdout, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    elif args.format == "nccl-tests":
        from simulator.interop.nccl_tests import format_nccl_tests

        print(format_nccl_tests(rows, args.op, n, dtype=args.dtype, cluster=spec.name, device_name=spec.chip.name))
    else:
        print(f"# stepsim collective {args.op} on {spec.name} ({n} devices)")
        print(bench.format_table(rows))
    if args.plot:
        with staged_file(args.plot, "--plot") as tmp:
            bench.plot_busbw(rows, tmp)
    return EXIT_OK


def cmd_topology(args) -> int:
    from simulator.results.outdir import check_output_file, staged_file
    from stepsim_fileio import is_there
    from topologies.io import load_topology, save_topology
    from topologies.presets import build_cluster

    for flag, value in (("--save", args.save), ("--plot", args.plot)):
        if value:
            check_output_file(value, flag)

    if (
        Path(args.cluster).suffix.lower() in (".graphml", ".json")
        and is_there(Path(args.cluster))
        and _looks_like_topology(Path(args.cluster))
    ):
        topo = load_topology(args.cluster)
    else:
        topo = build_cluster(_cluster_from_arg(args.cluster, args.devices))
    kinds = {}
    for k in topo.link_kind:
        kinds[k] = kinds.get(k, 0) + 1
    print(
        f"{topo.name or args.cluster}: {topo.kind}, {topo.n_devices} devices, "
        f"{topo.graph.number_of_nodes() - topo.n_devices} switches, {topo.n_links // 2} links "
        f"({', '.join(f'{k} {v // 2}' for k, v in sorted(kinds.items()))})"
    )
    if args.save:
        with staged_file(args.save, "--save") as tmp:
            save_topology(topo, tmp)
        print(f"wrote {args.save}")
    if args.plot:
        from topologies.plot import plot_topology

        with staged_file(args.plot, "--plot") as tmp:
            plot_topology(topo, tmp)
        print(f"wrote {args.plot}")
    return EXIT_OK


def _looks_like_topology(p: Path) -> bool:
    if p.suffix.lower() == ".graphml":
        return True
    from stepsim_fileio import load_json, read_text

    try:
        doc = load_json(read_text(p, 64 * 2**20), str(p))  # capped, like every input file
        return isinstance(doc, dict) and "nodes" in doc
    except (OSError, ValueError):
        return False


# ---- parser -------------------------------------------------------------------------------


def _add_run(sub) -> None:
    """The ``run`` command's arguments."""
    p = sub.add_parser("run", help="simulate a scenario and write its outputs")
    p.add_argument(
        "scenario", help="scenario file (YAML/JSON; docs/scenario.md) or a built-in scenario name (stepsim presets)"
    )
    p.add_argument(
        "--out",
        help="directory for summary.json, trace.json, timeline.png, memory.png, events, memory "
        "(formats: docs/scenario.md, docs/formats.md)",
    )
    p.add_argument("--exact", action="store_true", help="simulate every device (slow; checks the fast path)")
    p.add_argument("--json", action="store_true", help="print summary.json instead of the human summary")
    p.add_argument("--no-plots", action="store_true", help="skip timeline.png and memory.png")
    p.add_argument(
        "--full",
        action="store_true",
        help="simulate every micro-batch (without --out or --perfetto, a step whose steady phase provably "
        "repeats is skipped ahead from a shorter run: the same summary to ~1e-12)",
    )
    p.add_argument(
        "--reproducible",
        action="store_true",
        help="write sim_wall_s as null so that summary.json is byte-identical across runs",
    )
    p.add_argument("--topology", help="a topology file (JSON/GraphML; docs/formats.md) replacing the cluster's network")
    p.add_argument(
        "--trace",
        help="simulate this trace file (from `stepsim trace`; docs/formats.md) or Chakra trace "
        "directory (ET files) instead of generating one",
    )
    p.add_argument(
        "--html",
        action="store_true",
        help="also write --out DIR/report.html (needs plotly: pip install 'stepsim[report]')",
    )
    p.add_argument(
        "--perfetto", metavar="FILE", help="write the Perfetto / Chrome trace to FILE (.json, or .json.gz to compress)"
    )
    p.set_defaults(func=cmd_run)


def _add_report(sub) -> None:
    """The ``report`` command's arguments."""
    p = sub.add_parser("report", help="summarise a `run --out` directory; --html: one self-contained HTML page")
    p.add_argument("dir", help="the --out directory of `stepsim run`")
    p.add_argument(
        "--html", action="store_true", help="write DIR/report.html (needs plotly: pip install 'stepsim[report]')"
    )
    p.add_argument("--output", metavar="FILE", help="with --html: write the page here instead")
    p.set_defaults(func=cmd_report)


def _add_compare(sub) -> None:
    """The ``compare`` command's arguments."""
    p = sub.add_parser("compare", help="run a scenario under several pipeline schedules, side by side")
    p.add_argument("scenario", help="scenario file or built-in scenario name")
    p.add_argument("--schedules", default="gpipe,1f1b,interleaved-1f1b,zb-h1,dualpipe")
    p.add_argument("--vpp", type=int_flag(1, 1024), default=2, help="virtual stages for interleaved-1f1b (default 2)")
    p.add_argument("--out", help="directory for compare.csv and compare.png")
    p.add_argument("--html", action="store_true", help="also write --out DIR/compare.html (needs plotly)")
    p.set_defaults(func=cmd_compare)


def _add_presets(sub) -> None:
    """The ``presets`` command's arguments."""
    p = sub.add_parser("presets", help="list every model, cluster, chip, schedule and built-in scenario")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_presets)


def _add_collective(sub) -> None:
    """The ``collective`` command's arguments."""
    p = sub.add_parser("collective", help="nccl-tests-style collective benchmark on a simulated cluster")
    p.add_argument("op", choices=COLLECTIVE_OPS)
    p.add_argument("--cluster", required=True, help="cluster preset name or a file holding a `cluster` mapping")
    p.add_argument(
        "--devices", type=int_flag(1, MAX_DEVICES_FLAG), help="devices taking part (default: the whole cluster)"
    )
    p.add_argument("--algorithm", help="collective algorithm (default: chosen per topology)")
    p.add_argument("--min-bytes", default="8")
    p.add_argument("--max-bytes", default="8G")
    p.add_argument(
        "--format",
        choices=["table", "csv", "json", "nccl-tests"],
        default="table",
        help="nccl-tests: the columns all_reduce_perf & co print (size, count, type, redop, root, time "
        "in us, algbw, busbw in GB/s), readable by `stepsim calibrate --nccl-tests`",
    )
    p.add_argument(
        "--dtype",
        choices=["float", "bfloat16"],
        default="float",
        help="element type of the nccl-tests count/type columns (default float, as nccl-tests' -d)",
    )
    p.add_argument("--plot", help="write a busbw-vs-size plot to this PNG/SVG")
    p.set_defaults(func=cmd_collective)


def _add_topology(sub) -> None:
    """The ``topology`` command's arguments."""
    p = sub.add_parser("topology", help="describe, save or draw a cluster topology")
    p.add_argument("cluster", help="cluster preset name, a scenario/cluster file, or a topology file")
    p.add_argument("--devices", type=int_flag(1, MAX_DEVICES_FLAG))
    p.add_argument("--plot", help="write a picture of the topology (PNG/SVG)")
    p.add_argument("--save", help="save the topology as JSON or GraphML (by extension)")
    p.set_defaults(func=cmd_topology)


def build_parser() -> argparse.ArgumentParser:
    """The ``stepsim`` parser: every command and its arguments, in the order ``--help`` lists them."""
    from simulator.cli import trace as cli_trace

    ap, sub = new_parser()
    _add_run(sub)
    _add_report(sub)
    cli_trace.register(sub)
    _add_compare(sub)
    _add_presets(sub)
    _add_collective(sub)
    _add_topology(sub)

    from simulator.cli import explain as cli_explain
    from simulator.cli import goodput as cli_goodput
    from simulator.cli import importer as cli_import
    from simulator.cli import ppmap as cli_ppmap
    from simulator.cli import sweep as cli_sweep
    from simulator.cli import validate as cli_validate

    for family in (cli_sweep, cli_ppmap, cli_validate, cli_import, cli_goodput, cli_explain):
        family.register(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """``stepsim ARGV``: the exit code (:func:`simulator.cli.common.run`)."""
    return run(build_parser(), argv)


#: Commands after which the process may end without tearing the interpreter down: they
#: leave nothing that an exit handler must release (no dask cluster, no worker pool).
QUICK_EXIT_COMMANDS = frozenset({"run", "trace"})


def console() -> None:
    """The ``stepsim`` console script (and ``python -m simulator.cli``): :func:`main` on
    ``sys.argv``, then exit with its code. After a command of :data:`QUICK_EXIT_COMMANDS`
    the process ends at once (``os._exit``, its output flushed first): freeing a large
    step's millions of objects one by one takes longer than writing some of its files
    (0.6 s for ``deepseek-v3-2048xh800``), and nothing needs it. So does any command ended
    by SIGINT or SIGTERM, once its clean-up has run: the exit handlers left would only wait
    for threads of an executor still running a case."""
    code = main()
    if code in (EXIT_INTERRUPTED, EXIT_TERMINATED) or (len(sys.argv) > 1 and sys.argv[1] in QUICK_EXIT_COMMANDS):
        import os

        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe (``| head``): nothing to flush to
                stream.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
