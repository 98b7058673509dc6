"""``stepsim trace SCENARIO --out FILE``: write a scenario's operation trace (JSON, or Chakra ET
files with ``--format chakra``) of the ranks ``stepsim run`` simulates (``--exact``: every rank),
to edit and simulate again with ``stepsim run --trace`` (docs/formats.md, "Trace file")."""

from __future__ import annotations

from pathlib import Path

from simulator.cli.common import EXIT_OK, resolve_scenario_path


def cmd_trace(args) -> int:
    from simulator.results.outdir import check_output_dir, check_output_file, staged_dir, staged_file
    from simulator.scenario.loading import load_scenario
    from simulator.scenario.schema import ScenarioError
    from workloads.errors import WorkloadError
    from workloads.trace.builder import build_trace
    from workloads.trace.io import write_trace

    sc = load_scenario(resolve_scenario_path(args.scenario))
    (check_output_dir if args.format == "chakra" else check_output_file)(args.out, "--out")
    try:
        if args.exact:
            tr = build_trace(sc.workload(), ranks=list(range(sc.layout.world)))
        else:  # the representatives `stepsim run` simulates (one rank per class of ranks that see
            # the network alike where groups split over scale-up domains unlike one another)
            from simulator.engine.symmetry import representative_trace
            from topologies.presets import build_cluster

            tr = representative_trace(sc.workload(), sc.layout, build_cluster(sc.cluster))
    except WorkloadError as err:
        raise ScenarioError.from_error(err) from None
    if args.format == "chakra":
        from workloads.trace.chakra import PREFIX

        # An earlier trace's ET files of ranks this one has not are stale.
        old = [p.name for p in Path(args.out).glob(f"{PREFIX}.*.et")] if Path(args.out).is_dir() else []
        with staged_dir(args.out, [*old, "comm_group.json"], "--out") as tmp:
            write_trace(tr, tmp, scenario=sc, format=args.format)
    else:
        with staged_file(args.out, "--out") as tmp:
            write_trace(tr, tmp, scenario=sc, format=args.format)
    print(f"wrote {len(tr.ops):,} ops of {len(tr.ranks)} ranks to {args.out}")
    if args.format == "chakra":
        from workloads.trace.chakra import PREFIX

        print(
            f"  Chakra ET files {PREFIX}.<rank>.et and comm_group.json (ASTRA-sim: --workload-configuration="
            f"{Path(args.out) / PREFIX}"
            + ("" if args.exact else "; the ranks `stepsim run` simulates: add --exact for every rank")
            + ")"
        )
    return EXIT_OK


def register(sub) -> None:
    """Add ``trace`` to the ``stepsim`` parser."""
    p = sub.add_parser(
        "trace",
        help="write a scenario's operation trace to a file (JSON, .gz to compress) or a directory of Chakra ET files",
    )
    p.add_argument("scenario", help="scenario file or built-in scenario name")
    p.add_argument(
        "--out", required=True, help="trace file to write (.json or .json.gz); with --format chakra, a directory"
    )
    p.add_argument(
        "--format",
        choices=["json", "chakra"],
        default="json",
        help="json (default) or chakra: MLCommons Chakra ET files, one per rank, and comm_group.json (docs/formats.md)",
    )
    p.add_argument("--exact", action="store_true", help="every rank instead of the ranks `stepsim run` simulates")
    p.set_defaults(func=cmd_trace)
