"""The ``validate`` and ``calibrate`` commands of ``stepsim``.

``register(subparsers)`` adds them to the ``stepsim`` parser (``simulator.cli.app``);
``python -m simulator.cli.validate COMMAND ...`` runs them on their own with the
same exit codes (0 ok, 1 internal error, 2 bad input; ``validate``: 3 a case off by
more than ``--max-error`` or failing on memory (a run the source made does not fit, or
an ``oom`` case disagrees), 4 some cases could not be simulated — the others are
reported as usual).

    stepsim validate [--cases GLOB ...] [--out DIR] [--jobs N] [--max-error F]
    stepsim calibrate [KERNELS.csv] [--kineto TRACE.json ...] [--collectives COLL.csv]
                      [--nccl-tests LOG.txt ...] [--cluster dgx-h100] [--devices N] [--family hopper]
                      [--out calibration.yaml|calibration.json]
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from simulator.cli.common import (
    EXIT_CASES_FAILED,
    EXIT_OFF_TARGET,
    EXIT_OK,
    MAX_DEVICES_FLAG,
    MAX_JOBS,
    CliError,
    float_flag,
    int_flag,
    new_parser,
    run,
)


def cmd_validate(args) -> int:
    from simulator.results.outdir import check_output_dir, staged_dir
    from simulator.studies import validate as v

    if args.out:
        check_output_dir(args.out, "--out")
    if args.suite is not None:
        try:
            what = (
                None
                if Path(args.suite).is_dir()
                else "no such folder"
                if not Path(args.suite).exists()
                else "not a folder"
            )
        except OSError as err:  # a name the file system refuses (too long)
            what = err.strerror or str(err)
        if what is not None:
            raise CliError(f"--suite: {args.suite}: {what}; give a folder of case files")
    cases = v.discover(args.cases, root=args.suite)
    jobs = args.jobs if args.jobs is not None else max(1, min(len(cases), os.cpu_count() or 1))
    t0 = time.perf_counter()

    def progress(r):
        if not args.quiet:
            print(f"  {r.case.name}: {r.error:+.1%} ({r.sim_wall_s:.1f} s)", file=sys.stderr, flush=True)

    failures: list = []
    results = v.run_suite(cases, jobs=jobs, progress=progress, failures=failures, steady_state=not args.full)
    wall = time.perf_counter() - t0
    if results:
        print(v.format_table(results))
    print(f"total wall time {wall:.1f} s with {jobs} job(s)")
    if results and args.out:
        with staged_dir(args.out, ("validation.csv", "parity.png"), "--out") as tmp:
            v.write_csv(results, tmp / "validation.csv")
            v.plot_parity(results, tmp / "parity.png")
        out = Path(args.out)
        print(f"wrote {out / 'validation.csv'} and {out / 'parity.png'}")
    code = EXIT_OK
    memory_failed = [r for r in results if r.failure]
    if memory_failed:  # a run the source made must fit (and an oom case must agree)
        print(
            f"stepsim: {len(memory_failed)} case(s) fail on memory: {', '.join(r.case.name for r in memory_failed)}",
            file=sys.stderr,
        )
        code = EXIT_OFF_TARGET
    if args.max_error is not None and results:
        _, worst, name = v.error_stats(results)
        if worst > args.max_error:
            print(f"worst |error| {worst:.1%} ({name}) is above --max-error {args.max_error:.1%}", file=sys.stderr)
            code = EXIT_OFF_TARGET
    if failures:
        print(f"stepsim: {len(failures)} of {len(cases)} cases failed:", file=sys.stderr)
        for f in failures:
            print(f"  {f.error}", file=sys.stderr)
        code = EXIT_CASES_FAILED
    return code


def cmd_calibrate(args) -> int:
    from simulator.results.outdir import check_output_file, staged_file
    from simulator.studies import calibrate as c

    if args.out:
        check_output_file(args.out, "--out")
    report, notes = {}, []
    kernels = c.read_kernels(args.kernels) if args.kernels else []
    if args.kineto:
        from simulator.interop.kineto import read_kineto

        got = read_kineto(args.kineto)
        kernels += got.timings
        notes += got.describe().splitlines()
    fit = nfit = None
    if kernels:
        fit = c.fit_compute(kernels, args.family, chip=args.chip)
        report["compute"] = fit.as_dict()
    collectives = c.read_collectives(args.collectives) if args.collectives else []
    if args.nccl_tests:
        from simulator.interop.nccl_tests import read_nccl_tests

        for path in args.nccl_tests:
            log = read_nccl_tests(path, op=args.nccl_op, default_devices=args.devices)
            collectives += log.timings()
            notes.append(
                f"# {path}: {log.op} on {log.devices} devices, {len(log.rows)} sizes "
                f"({log.rows[0].size_bytes}..{log.rows[-1].size_bytes} B), out-of-place times"
            )
    if collectives:
        cluster = args.cluster or c.FAMILY_CLUSTER.get(args.family)
        if not cluster:
            raise CliError("--cluster: needed with collective timings (the cluster preset they were measured on)")
        if not args.cluster:
            notes.append(f"# links of cluster preset {cluster} assumed (--cluster to choose)")
        nfit = c.fit_network(collectives, cluster, family=args.family)
        report["network"] = nfit.as_dict()
    if not report:
        raise CliError(
            "calibrate: give --kineto TRACE.json and/or --nccl-tests LOG.txt (or the CSVs: KERNELS.csv, "
            "--collectives COLL.csv)"
        )
    block = c.scenario_block(fit, nfit, notes)
    print(block, end="")
    if args.out:
        out = Path(args.out)
        with staged_file(out, "--out") as tmp:
            tmp.write_text(json.dumps(report, indent=2) + "\n" if out.suffix.lower() == ".json" else block)
        print(f"# wrote {out}")
    return EXIT_OK


def register(subparsers) -> None:
    """Add ``validate`` and ``calibrate`` to an argparse subparsers action."""
    _add_validate(subparsers)
    _add_calibrate(subparsers)


def _add_validate(subparsers) -> None:
    p = subparsers.add_parser(
        "validate",
        help="simulate the published runs of validation/ and compare",
        epilog=f"exit codes: {EXIT_OK} every case ran (and is within --max-error), 1 internal error, 2 bad input, "
        f"{EXIT_OFF_TARGET} a case is off by more than --max-error or fails on memory (does not fit although "
        f"the source ran it, or an oom case disagrees), {EXIT_CASES_FAILED} some cases failed "
        "(the others are reported)",
    )
    p.add_argument(
        "--cases",
        nargs="+",
        metavar="GLOB",
        help="case names, paths relative to validation/ (narayanan2021/*) or files; default: all",
    )
    p.add_argument(
        "--suite",
        help="folder of case files (default: the built-in suite, validation/ of the "
        "repository, installed as package data)",
    )
    p.add_argument("--out", help="write DIR/validation.csv and DIR/parity.png")
    p.add_argument("--jobs", type=int_flag(1, MAX_JOBS), help="worker processes (default: one per CPU)")
    p.add_argument(
        "--max-error",
        type=float_flag(0.0),
        metavar="F",
        help=f"exit {EXIT_OFF_TARGET} when a case is off by more than this fraction (e.g. 0.2)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-case progress on stderr")
    p.add_argument(
        "--full",
        action="store_true",
        help="simulate every micro-batch of every case; by default a long pipeline's step is "
        "skipped ahead from a shorter run where its steady phase provably repeats (the same "
        "figures to 1e-9; docs/design.md, 'Steady-state skipping')",
    )
    p.set_defaults(func=cmd_validate)


def _add_calibrate(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="fit compute (and network) efficiencies to measured kernel/collective timings",
        description="Least-squares fit of the roofline parameters of simulator/engine/compute.py to measured kernel "
        "times, and of link efficiency + per-message latency to collective times. Prints the "
        "`compute:` and `network_calibration:` mappings to paste into a scenario (docs/calibration.md).",
    )
    p.add_argument(
        "kernels", nargs="?", help="CSV: kind,m,n,k,flops,bytes,dtype,time_s (see simulator/studies/calibrate.py)"
    )
    p.add_argument(
        "--kineto",
        nargs="+",
        metavar="TRACE",
        help="PyTorch profiler trace(s) (export_chrome_trace JSON, .json.gz; record_shapes=True): "
        "GEMM, attention, norm and element-wise kernels with their shapes",
    )
    p.add_argument(
        "--nccl-tests",
        nargs="+",
        metavar="LOG",
        help="nccl-tests output(s) (all_reduce_perf ...; the op from the binary named in the log or the file name)",
    )
    p.add_argument(
        "--nccl-op",
        help="the collective of --nccl-tests logs that do not name their binary "
        "(all-reduce, all-gather, reduce-scatter, all-to-all, broadcast, send-recv)",
    )
    p.add_argument(
        "--devices",
        type=int_flag(1, MAX_DEVICES_FLAG),
        help="device count of --nccl-tests logs that list no '# Rank' lines",
    )
    p.add_argument("--family", default="hopper", help="chip family whose defaults seed the fit and fill gaps")
    p.add_argument("--chip", help="chip preset giving peak FLOP/s and HBM bandwidth (default: the family's usual chip)")
    p.add_argument("--collectives", help="CSV: op,devices,size_bytes,time_s (nccl-tests style)")
    p.add_argument(
        "--cluster",
        help="cluster preset the collectives were measured on (default: the family's "
        "8-GPU node, e.g. dgx-h100 for hopper)",
    )
    p.add_argument(
        "--out", help="write the YAML block to paste into a scenario (FILE.yaml), or the fit report as JSON (FILE.json)"
    )
    p.set_defaults(func=cmd_calibrate)


def main(argv: Sequence[str] | None = None) -> int:
    """These commands on their own, as ``stepsim`` runs them (the same parser options and
    exit codes): ``python -m simulator.cli.validate validate ...`` is ``stepsim validate ...``."""
    ap, sub = new_parser()
    register(sub)
    return run(ap, argv)


if __name__ == "__main__":
    sys.exit(main())
