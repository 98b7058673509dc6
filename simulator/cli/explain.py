"""``stepsim explain A B``: the command line of :mod:`simulator.results.explain` (the
step-time difference of two scenarios split into causes that add up to it)."""

from __future__ import annotations

import csv
import json

from simulator.cli.common import CliError

#: What ``stepsim explain --out DIR`` writes (explain.html with ``--html``; the others are removed).
EXPLAIN_OUTPUTS = ("explain.csv", "explain.json", "explain.png", "explain.html")


def cmd_explain(args) -> int:
    from pathlib import Path

    from simulator import load_scenario, simulate
    from simulator.errors import StepsimError
    from simulator.results import explain as ex
    from simulator.results.outdir import check_output_dir, staged_dir

    if args.html and not args.out:
        raise CliError("--html: give --out DIR too (the page is written to DIR/explain.html)")
    if args.out:
        check_output_dir(args.out, "--out")
    if args.html:
        from simulator.results.html_data import require_plotly

        require_plotly()  # before the simulations, not after
    # both loaded before either runs, an error saying which of the two it is in
    loaded = []
    for which, source in (("A", args.a), ("B", args.b)):
        try:
            loaded.append(load_scenario(source))
        except StepsimError as err:
            raise CliError(f"scenario {which} ({source}): {err}") from None
    a, b = simulate(loaded[0]), simulate(loaded[1])
    name_a, name_b = a.scenario.name, b.scenario.name
    if name_a == name_b:
        name_a, name_b = f"A {name_a}", f"B {name_b}"
    rows = ex.explain(ex.causes(a), ex.causes(b))
    doc = {
        "a": name_a,
        "b": name_b,
        "step_time_s": {"a": a.summary["step_time_s"], "b": b.summary["step_time_s"]},
        "causes": [{"cause": k, "a_s": x, "b_s": y, "delta_s": d} for k, x, y, d in rows],
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(ex.format_table(rows, name_a, name_b))
    if args.out:
        with staged_dir(args.out, EXPLAIN_OUTPUTS, "--out") as tmp:
            tmp = Path(tmp)
            (tmp / "explain.json").write_text(json.dumps(doc, indent=2) + "\n")
            with open(tmp / "explain.csv", "w", newline="") as f:
                wr = csv.writer(f)
                wr.writerow(["cause", "a_s", "b_s", "delta_s"])
                wr.writerows([k, repr(x), repr(y), repr(d)] for k, x, y, d in rows)
            ex.plot_waterfall(rows, tmp / "explain.png", name_a, name_b)
            if args.html:
                from simulator.results.html_report import render_explain

                (tmp / "explain.html").write_text(render_explain(rows, name_a, name_b), encoding="utf-8")
        if not args.json:
            written = EXPLAIN_OUTPUTS if args.html else EXPLAIN_OUTPUTS[:-1]
            print(f"wrote {args.out}: {', '.join(written)}")
    return 0


def register(subparsers) -> None:
    """Add ``explain`` to the ``stepsim`` parser."""
    p = subparsers.add_parser(
        "explain",
        help="why step B differs from step A: the difference split into causes that add up to it",
    )
    p.add_argument("a", help="scenario A: a file or a built-in name")
    p.add_argument("b", help="scenario B: a file or a built-in name")
    p.add_argument("--out", help="directory: explain.csv, explain.json and the waterfall explain.png")
    p.add_argument("--json", action="store_true", help="print the causes as JSON")
    p.add_argument("--html", action="store_true", help="also write DIR/explain.html: the waterfall, interactive")
    p.set_defaults(func=cmd_explain)
