"""The ``sweep``, ``search`` and ``sweep-plot`` commands of ``stepsim``.

``register(subparsers)`` adds them to the ``stepsim`` parser (``simulator.cli.app``);
``python -m simulator.cli.sweep COMMAND ...`` runs them on their own, with the same
exit codes (0 ok, 1 internal error, 2 bad input, 4 some cases failed: ``sweep`` when a
case's status is ``failed``, ``search`` when a layout's is — the tables hold every
case, the failed ones with their error; ``oom``, ``pruned``, ``invalid`` and
``skipped`` layouts of a search are answers, not failures). File formats:
``docs/formats.md``.

    stepsim sweep SWEEP.yaml --out DIR [--jobs N | --dask ADDRESS] [--retry-failed] [--plot]
    stepsim search SCENARIO [--out DIR] [--max-tp 8 --max-pp 16 --schedules 1f1b,interleaved-1f1b
                            --zero 0,1,3 --micro-batch-sizes 1,2 --recompute none,selective,full
                            --max-candidates N --estimate-margin 0.05] [--jobs N | --dask ADDRESS] [--top 10]
    stepsim sweep-plot DIR [--x KEY] [--y mfu] [--hue KEY] [--heatmap KEY]
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from simulator.cli.common import (
    EXIT_CASES_FAILED,
    EXIT_OK,
    MAX_DEVICES_FLAG,
    MAX_JOBS,
    CliError,
    int_flag,
    new_parser,
    run,
)

# ---- argument helpers ----------------------------------------------------------------------


def _int_list(flag: str, text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise CliError(f"{flag}: a comma-separated list of integers, got {text!r}") from None
    if not vals:
        raise CliError(f"{flag}: give at least one value")
    return vals


def _str_list(flag: str, text: str, allowed: Sequence[str]) -> tuple[str, ...]:
    vals = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [v for v in vals if v not in allowed]
    if bad or not vals:
        raise CliError(f"{flag}: {', '.join(bad) or 'nothing'} not allowed; choose from {', '.join(allowed)}")
    return vals


def _jobs(args) -> int | None:
    if args.jobs is not None and args.jobs < 1:
        raise CliError(f"--jobs: must be >= 1, got {args.jobs}")
    return args.jobs


@contextlib.contextmanager
def _dask_client(address: str | None):
    if not address:
        yield None
        return
    try:
        from distributed import Client
    except ImportError:
        raise CliError("--dask: needs dask[distributed] (pip install 'stepsim[dask]')") from None
    try:
        client = Client(address, timeout="20s")
    except (OSError, TimeoutError) as err:
        raise CliError(f"--dask: cannot reach a scheduler at {address!r}: {err}") from None
    except ValueError as err:  # 'host' without a port, an unknown protocol
        raise CliError(
            f"--dask: expected a scheduler address such as tcp://host:8786, got {address!r} ({err})"
        ) from None
    try:
        yield client
    finally:
        client.close()


@contextlib.contextmanager
def _executor(spec: str | None, jobs: int | None, dask: str | None):
    """``--executor MODULE:CALLABLE``: the callable's result (``max_workers=--jobs`` when given),
    shut down at the end."""
    if not spec:
        yield None
        return
    if dask:
        raise CliError("--executor: give either --dask or --executor, not both")
    import importlib

    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise CliError(f"--executor: expected MODULE:CALLABLE (e.g. loky:get_reusable_executor), got {spec!r}")
    try:
        factory = importlib.import_module(mod_name)
        for part in attr.split("."):
            factory = getattr(factory, part)
    except ImportError as err:
        raise CliError(f"--executor: cannot import {mod_name!r}: {err}") from None
    except AttributeError:
        raise CliError(f"--executor: {mod_name!r} has no {attr!r}") from None
    ex = _make_executor(spec, factory, jobs)
    interrupted = False
    try:
        yield ex
    except KeyboardInterrupt:  # SIGINT / SIGTERM: not waiting for the cases it runs
        interrupted = True
        raise
    finally:
        if interrupted:
            from simulator.studies.workers import abandon

            abandon(ex)
        else:
            ex.shutdown(wait=True)


def _make_executor(spec: str, factory, jobs: int | None):
    """The executor ``factory`` returns, or a :class:`CliError` naming ``--executor``: the
    factory must be callable, return without error, and give an object whose ``submit``
    and ``shutdown`` are implemented (not :class:`concurrent.futures.Executor`'s own
    abstract ones)."""
    from concurrent.futures import Executor

    if not callable(factory):
        raise CliError(f"--executor: {spec} is a {type(factory).__name__}, not a callable returning an executor")
    kwargs = {"max_workers": jobs} if jobs is not None else {}
    try:
        ex = factory(**kwargs)
    except Exception as err:  # noqa: BLE001 — any failure of the user's callable is bad input
        call = f"{spec}({', '.join(f'{k}={v}' for k, v in kwargs.items())})"
        raise CliError(f"--executor: calling {call} failed: {type(err).__name__}: {err}") from None
    submit, shutdown = getattr(type(ex), "submit", None), getattr(type(ex), "shutdown", None)
    if not callable(submit) or not callable(shutdown) or submit is Executor.submit:
        raise CliError(
            f"--executor: {spec} returned a {type(ex).__name__}, not a usable concurrent.futures.Executor "
            "(one that implements submit and shutdown)"
        )
    return ex


# ---- commands ------------------------------------------------------------------------------


def cmd_sweep(args) -> int:
    from simulator.results.outdir import check_output_dir
    from simulator.studies.sweep import sweep
    from simulator.studies.sweep.rows import CSV_FILE, PARQUET_FILE
    from stepsim_fileio import is_there

    if not is_there(Path(args.sweep)):  # a link loop or a name too long: reading it says so
        raise CliError(f"sweep: no file {args.sweep!r}")
    check_output_dir(args.out, "--out")  # resumable: rows.jsonl is appended to as cases end
    with _executor(args.executor, _jobs(args), args.dask) as ex, _dask_client(args.dask) as client:
        frame = sweep(
            args.sweep,
            out=args.out,
            client=client,
            jobs=_jobs(args),
            progress=False if args.no_progress else None,
            retry_failed=args.retry_failed,
            executor=ex,
        )
    counts = frame["status"].value_counts() if len(frame) else {}
    extra = []
    for k, what in (("skipped", "invalid skipped"), ("duplicates", "duplicate")):
        if frame.attrs.get(k):
            extra.append(f"{len(frame.attrs[k])} {what}")
    if frame.attrs.get("filtered"):
        extra.append(f"{frame.attrs['filtered']} left out by where")
    reused = frame.attrs.get("reused", 0)
    runs = f" ({len(frame) - reused} run now, {reused} reused from {args.out}/rows.jsonl)" if reused else ""
    print(
        f"sweep {frame.attrs.get('name', '')}: {len(frame)} cases{runs}, {counts.get('ok', 0)} ok, "
        f"{counts.get('failed', 0)} failed" + (f" ({', '.join(extra)})" if extra else "")
    )
    print(f"  wrote {PARQUET_FILE}, {CSV_FILE}, rows.jsonl to {args.out}")
    if args.plot:
        from simulator.studies.sweep.plots import PlotError, plot_sweep

        try:
            paths = plot_sweep(args.out)
        except PlotError as err:
            raise CliError(f"--plot: {err}") from None
        print(f"  plots: {', '.join(p.name for p in paths)} in {Path(args.out) / 'plots'}")
    failed = frame[frame["status"] == "failed"] if len(frame) else frame
    if len(failed):
        _report_failed(
            f"{len(failed)} of {len(frame)} cases failed",
            failed["case"],
            failed["error"],
            f"the error column of {Path(args.out) / CSV_FILE}; --retry-failed runs them again",
        )
        return EXIT_CASES_FAILED
    return EXIT_OK


def _report_failed(what: str, cases, errors, where: str, noun: str = "case", show: int = 3) -> None:
    """One line on stderr saying how many failed, the first ``show`` errors, and where the rest are."""
    print(f"stepsim: {what}; see {where}", file=sys.stderr)
    for case, err in list(zip(cases, errors))[:show]:
        print(f"  {noun} {case}: {err}", file=sys.stderr)
    if len(cases) > show:
        print(f"  ... and {len(cases) - show} more", file=sys.stderr)


def _margin(text: str):
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise CliError(f"--estimate-margin: expected a number >= 0 or 'none', got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise CliError(f"--estimate-margin: expected a finite number >= 0 or 'none', got {text!r}")
    return value


# Layouts `stepsim search` may screen: most are pruned by the memory estimate or invalid before
# the step-time estimate (~12 ms a layout) runs. The built-in DeepSeek-V3 on 2,048 H800 has
# 3,612 under the default bounds, on 2,304 GB200 29,082 (the whole search 4 minutes), the
# committed GB200 placement search 133,464 (docs/results/search/README.md); 500,000 is past
# every search a user has run here and refuses bounds that would screen for hours.
MAX_SEARCH_LAYOUTS = 500_000


def _check_layout_count(path: Path, bounds) -> None:
    from simulator.scenario.loading import load_scenario
    from simulator.studies.search.layouts import enumerate_layouts

    n = len(enumerate_layouts(load_scenario(path), bounds))
    if n > MAX_SEARCH_LAYOUTS:
        raise CliError(
            f"search: the bounds give {n:,} layouts to screen; the limit is {MAX_SEARCH_LAYOUTS:,}: narrow them "
            "(--max-tp, --max-pp, --max-ep, --max-vpp, --schedules, --zero, --micro-batch-sizes, --recompute)"
        )


def cmd_search(args) -> int:
    from simulator.cli.common import resolve_scenario_path
    from simulator.results.outdir import check_output_dir
    from simulator.studies.search import search
    from simulator.studies.search.layouts import SearchBounds
    from workloads.enums import RECOMPUTE_MODES, SCHEDULES

    path = resolve_scenario_path(args.scenario)
    if args.out:
        check_output_dir(args.out, "--out")  # resumable, as a sweep's
    bounds = SearchBounds(
        max_tp=args.max_tp,
        max_pp=args.max_pp,
        max_cp=args.max_cp,
        max_ep=args.max_ep,
        max_vpp=args.max_vpp,
        schedules=_str_list("--schedules", args.schedules, SCHEDULES),
        zero=_int_list("--zero", args.zero) if args.zero else None,
        micro_batch_sizes=_int_list("--micro-batch-sizes", args.micro_batch_sizes) if args.micro_batch_sizes else None,
        recompute=_str_list("--recompute", args.recompute, RECOMPUTE_MODES),
        max_candidates=args.max_candidates,
        estimate_margin=_margin(args.estimate_margin),
    )
    _check_layout_count(path, bounds)
    with _executor(args.executor, _jobs(args), args.dask) as ex, _dask_client(args.dask) as client:
        result = search(
            path,
            out=args.out,
            bounds=bounds,
            client=client,
            jobs=_jobs(args),
            progress=False if args.no_progress else None,
            executor=ex,
        )
    if args.json:
        sys.stdout.write(json.dumps(result.best_json(), indent=2, default=str) + "\n")
    else:
        print(result.to_text(top=args.top))
        if args.out:
            print(f"  wrote search.csv, best.json to {args.out}")
    failed = result.table[result.table["status"] == "failed"]
    if len(failed):
        _report_failed(
            f"{len(failed)} of {len(result.table)} layouts failed to simulate",
            failed["label"],
            failed["reason"],
            f"the reason column of {Path(args.out) / 'search.csv'}" if args.out else "the table (--out DIR writes it)",
            noun="layout",
        )
        return EXIT_CASES_FAILED
    return EXIT_OK


def cmd_sweep_plot(args) -> int:
    from simulator.studies.sweep.plots import PlotError, plot_sweep

    try:
        paths = plot_sweep(args.dir, x=args.x, y=args.y, hue=args.hue, heatmap=args.heatmap)
    except PlotError as err:
        raise CliError(f"sweep-plot: {err}") from None
    for p in paths:
        print(f"wrote {p}")
    return EXIT_OK


# ---- parser --------------------------------------------------------------------------------


def _executor_flags(p) -> None:
    p.add_argument(
        "--jobs", type=int_flag(1, MAX_JOBS), help="local worker processes (default: every core; 1: in this process)"
    )
    p.add_argument("--dask", metavar="ADDRESS", help="run on the Dask scheduler at ADDRESS (e.g. tcp://host:8786)")
    p.add_argument(
        "--executor",
        metavar="MODULE:CALLABLE",
        help="run on the concurrent.futures.Executor this callable returns (called with "
        "max_workers=--jobs when given), e.g. loky:get_reusable_executor, "
        "mpi4py.futures:MPIPoolExecutor; workers must run this stepsim version",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it is off anyway when not a TTY)")


def register(subparsers) -> None:
    """Add ``sweep``, ``search`` and ``sweep-plot`` to ``stepsim``'s sub-command parsers."""
    p = subparsers.add_parser(
        "sweep",
        help="run a parameter sweep (resumable) into a results table",
        epilog="exit codes: 0 every case ran, 1 internal error, 2 bad input (the sweep file), "
        f"{EXIT_CASES_FAILED} some cases failed (counted on stderr; their errors are "
        "in the tables). Formats: docs/formats.md.",
    )
    p.add_argument("sweep", help="sweep file (YAML/JSON): base scenario + grid/cases (docs/formats.md)")
    p.add_argument("--out", required=True, help="directory for rows.jsonl, results.parquet, results.csv")
    p.add_argument("--retry-failed", action="store_true", help="re-run the cases recorded as failed")
    p.add_argument("--plot", action="store_true", help="also draw the sweep plots into DIR/plots")
    _executor_flags(p)
    p.set_defaults(func=cmd_sweep)

    p = subparsers.add_parser(
        "search",
        help="search the parallel layouts of a scenario for the fastest step",
        epilog="exit codes: 0 every layout ran or was ruled out (oom, pruned, invalid, "
        f"skipped), 1 internal error, 2 bad input, {EXIT_CASES_FAILED} some layouts "
        "failed to simulate (counted on stderr). Formats: docs/formats.md.",
    )
    p.add_argument("scenario", help="scenario file (YAML/JSON) or a built-in scenario name")
    p.add_argument("--out", help="directory for search.csv and best.json")
    p.add_argument(
        "--max-tp", type=int_flag(1, MAX_DEVICES_FLAG), help="largest tensor parallelism (default: the scale-up domain)"
    )
    p.add_argument(
        "--max-pp", type=int_flag(1, MAX_DEVICES_FLAG), help="largest pipeline parallelism (default: the layer count)"
    )
    p.add_argument(
        "--max-cp", type=int_flag(1, MAX_DEVICES_FLAG), default=1, help="largest context parallelism (default 1)"
    )
    p.add_argument(
        "--max-ep", type=int_flag(1, MAX_DEVICES_FLAG), help="largest expert parallelism (MoE; default: no bound)"
    )
    p.add_argument(
        "--max-vpp", type=int_flag(1, 1024), default=4, help="largest virtual stages for interleaved-1f1b (default 4)"
    )
    p.add_argument(
        "--schedules",
        default="gpipe,1f1b,interleaved-1f1b,zb-h1,dualpipe",
        help="comma-separated pipeline schedules (default: every schedule)",
    )
    p.add_argument("--zero", help="comma-separated ZeRO stages (default: the scenario's)")
    p.add_argument("--micro-batch-sizes", help="comma-separated micro-batch sizes (default: the scenario's)")
    p.add_argument("--recompute", default="none,selective,full", help="comma-separated recompute modes")
    p.add_argument(
        "--max-candidates",
        type=int_flag(1, 10**7),
        help="simulate at most N layouts (ranked by the analytic step-time estimate, column est_step_time_s)",
    )
    p.add_argument(
        "--estimate-margin",
        default="0.05",
        metavar="X|none",
        help="simulate in the order of the analytic estimate until no layout left can beat the best "
        "simulated one unless its estimate errs by more than the largest error seen plus X "
        "(default 0.05); 'none': simulate every layout that fits",
    )
    p.add_argument("--top", type=int_flag(0, 10**7), default=10, help="rows of the runner-up table (default 10)")
    p.add_argument("--json", action="store_true", help="print best.json instead of the table")
    _executor_flags(p)
    p.set_defaults(func=cmd_search)

    p = subparsers.add_parser("sweep-plot", help="draw a sweep's results (PNG and SVG into DIR/plots)")
    p.add_argument("dir", help="the sweep's --out directory")
    p.add_argument("--x", help="axis on the x axis (default: the sweep's first axis)")
    p.add_argument("--y", default="step_time_s", help="metric: step_time_s (default), mfu, tokens_per_s, ...")
    p.add_argument("--hue", help="column giving one line each (default: every other axis)")
    p.add_argument("--heatmap", help="second axis of the heatmap (default: the sweep's second axis)")
    p.set_defaults(func=cmd_sweep_plot)


def main(argv: Sequence[str] | None = None) -> int:
    """These commands on their own, as ``stepsim`` runs them (the same parser options and
    exit codes): ``python -m simulator.cli.sweep sweep ...`` is ``stepsim sweep ...``."""
    ap, sub = new_parser()
    register(sub)
    return run(ap, argv)


if __name__ == "__main__":
    sys.exit(main())
