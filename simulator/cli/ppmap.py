"""``stepsim ppmap``: the command line of :mod:`simulator.studies.ppmap` (the map of where
pipeline parallelism pays). The study itself, and pandas with it, is imported only when
the command runs, so ``stepsim --help`` stays light."""

from __future__ import annotations

from pathlib import Path

from simulator.cli.common import MAX_JOBS, CliError, int_flag


def register(subparsers) -> None:
    p = subparsers.add_parser("ppmap", help="the map of where pipeline parallelism pays (domain size x NIC bandwidth)")
    p.add_argument("map", help="map file (YAML/JSON): models, grid of domain sizes and NIC bandwidths, systems")
    p.add_argument("--out", required=True, help="directory: screen.jsonl, sims/ (resumable), map.csv, candidates.csv")
    p.add_argument("--plot", help="write the heat map to this PNG")
    p.add_argument("--assemble-only", action="store_true", help="simulate nothing: tables from what --out holds")
    p.add_argument(
        "--points",
        nargs="+",
        metavar="PATTERN",
        help="screen and simulate only the points whose ids match (shell-style: 'kimi-k2/d72-*', "
        "'deepseek-v3/GB200*'); the tables still hold every point the store has",
    )
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="simulate again the layouts the store records as failed, where the rounds choose them "
        "(a resumed run takes them as done)",
    )
    p.add_argument(
        "--recheck",
        action="store_true",
        help="simulate only each point's best layout with PP and without again, on this version, and compare "
        "them with the store (OUT/recheck.csv)",
    )
    p.add_argument(
        "--jobs", type=int_flag(1, MAX_JOBS), help="local worker processes (default: every core; 1: in this process)"
    )
    p.add_argument("--dask", metavar="ADDRESS", help="run the simulations on the Dask scheduler at ADDRESS")
    p.set_defaults(func=cmd_ppmap)


def cmd_ppmap(args) -> int:
    from simulator.cli.sweep import _dask_client
    from simulator.results.outdir import check_output_dir, check_output_file, staged_file
    from simulator.studies.ppmap import assemble, run_map
    from simulator.studies.ppmap.plot import plot_map
    from simulator.studies.ppmap.run import failed_count
    from simulator.studies.ppmap.spec import CANDIDATES_CSV, MAP_CSV, SCREEN_FILE, load_map
    from stepsim_fileio import is_there

    if not is_there(Path(args.map)):  # a name too long: reading it says so
        raise CliError(f"ppmap: no file {args.map!r}")
    check_output_dir(args.out, "--out")  # resumable: its files are added to as it goes
    if args.plot:
        check_output_file(args.plot, "--plot", within=args.out)
    spec = load_map(args.map)
    if args.recheck:
        if not (Path(args.out) / SCREEN_FILE).is_file():  # pandas said "Cannot save file into a non-existent directory"
            raise CliError(
                f"--recheck: {args.out} holds no map store ({SCREEN_FILE}); run `stepsim ppmap MAP --out DIR` first"
            )
        return _recheck(spec, args)
    if args.assemble_only:
        table, cands = assemble(spec, args.out)
    else:
        with _dask_client(args.dask) as client:
            table, cands = run_map(
                spec,
                args.out,
                client=client,
                jobs=args.jobs,
                progress=None,
                only=args.points,
                retry_failed=args.retry_failed,
            )
    done = int(table["ratio"].notna().sum()) if len(table) else 0
    print(
        f"ppmap {spec.name}: {len(table)} points screened, {done} with a ratio; "
        f"{len(cands)} layouts simulated; wrote {MAP_CSV}, {CANDIDATES_CSV} to {args.out}"
    )
    failed = failed_count(cands)
    if failed:
        print(
            f"  {failed} simulation(s) failed: no candidate of their point's comparison (status, error in "
            f"{CANDIDATES_CSV}); --retry-failed simulates them again"
        )
    if args.plot and len(table):
        with staged_file(args.plot, "--plot", within=args.out) as tmp:
            plot_map(table, tmp, markers={m[0]: m[1:] for m in spec.marks}, title=spec.name)
        print(f"  figure: {args.plot}")
    return 0


def _recheck(spec, args) -> int:
    from simulator.cli.sweep import _dask_client
    from simulator.studies.ppmap.recheck import RECHECK_CSV, SAME_REL, recheck

    with _dask_client(args.dask) as client:
        df = recheck(spec, args.out, client=client, jobs=args.jobs, only=args.points)
    ok = df[df.status == "ok"]
    moved = ok[~ok.same.astype(bool)]
    worst = f"; largest change {ok.rel_change.abs().max():+.3g}" if len(ok) else ""
    print(
        f"ppmap {spec.name} recheck: {len(df)} best layouts simulated again ({len(df) - len(ok)} failed), "
        f"{len(moved)} differ from the store by more than {SAME_REL:g}{worst}; wrote {RECHECK_CSV} to {args.out}"
    )
    for r in moved.itertuples():
        print(f"  {r.point} {r.layout} {r.label}: {r.stored_step_time_s:.6g} -> {r.step_time_s:.6g} s")
    return 0
