"""``stepsim import megatron ARGS_FILE``: the command line of :mod:`simulator.interop.megatron`
(a scenario from a Megatron-LM / NeMo argument list). It writes the scenario YAML, or prints
it, after checking that the scenario loads; the arguments not mapped are printed too."""

from __future__ import annotations

import sys
from pathlib import Path

from simulator.cli.common import MAX_DEVICES_FLAG, int_flag


def cmd_import(args) -> int:
    from simulator.interop.megatron import import_megatron, to_yaml
    from simulator.results.outdir import check_output_file, staged_file
    from simulator.scenario.loading import load_scenario
    from simulator.studies.sweep.cases import check_scenario
    from stepsim_fileio import read_text

    if args.out:
        check_output_file(args.out, "--out")
    path = Path(args.args_file)
    text = read_text(path, 1 << 20, what="argument file")
    name = args.name or path.stem
    res = import_megatron(text, args.cluster, devices=args.devices, name=name)
    check_scenario(load_scenario(res.scenario))  # refuse what would not run, naming the key
    out = to_yaml(res, str(path))
    if args.out:
        with staged_file(args.out, "--out") as tmp:
            tmp.write_text(out, encoding="utf-8")
        print(
            f"wrote {args.out}: {len(res.mapped)} arguments mapped, {len(res.unmapped)} not mapped, "
            f"{len(res.ignored)} ignored (no effect on a step)"
        )
    else:
        sys.stdout.write(out)
    stream = sys.stdout if args.out else sys.stderr
    if res.unmapped:
        print("not mapped (check by hand): " + "; ".join(res.unmapped), file=stream)
    return 0


def register(subparsers) -> None:
    """Add ``import`` and ``export`` to the ``stepsim`` parser."""
    register_export(subparsers)
    p = subparsers.add_parser(
        "import", help="write a scenario from another tool's configuration (Megatron-LM / NeMo arguments)"
    )
    p.add_argument(
        "source", choices=["megatron"], help="what the file is: megatron (a Megatron-LM or NeMo argument list)"
    )
    p.add_argument("args_file", metavar="ARGS_FILE", help="file holding the argument list (newlines and \\ allowed)")
    p.add_argument(
        "--cluster",
        required=True,
        help="cluster preset (stepsim presets): Megatron's arguments do not name the hardware",
    )
    p.add_argument(
        "--devices",
        type=int_flag(1, MAX_DEVICES_FLAG),
        help="GPUs (default: from the torchrun line, --num-gpus, or tp*pp*cp*dp with --data-parallel-size)",
    )
    p.add_argument("--name", help="scenario name (default: the file's name)")
    p.add_argument("--out", help="scenario YAML to write (default: print it)")
    p.set_defaults(func=cmd_import)


def cmd_export(args) -> int:
    from simulator.interop.export_maxtext import export_maxtext
    from simulator.interop.export_megatron import export_megatron
    from simulator.results.outdir import check_output_file, staged_file
    from simulator.scenario.loading import load_scenario

    if args.out:
        check_output_file(args.out, "--out")
    export = export_megatron if args.target == "megatron" else export_maxtext
    text = export(load_scenario(args.scenario))
    if args.out:
        with staged_file(args.out, "--out") as tmp:
            tmp.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def register_export(subparsers) -> None:
    """Add ``export`` to the ``stepsim`` parser."""
    p = subparsers.add_parser(
        "export", help="write the launch line of a scenario for a framework (Megatron-LM arguments)"
    )
    p.add_argument(
        "target",
        choices=["megatron", "maxtext"],
        help="which framework: megatron (Megatron-LM / NeMo arguments) or maxtext (overrides of base.yml)",
    )
    p.add_argument("scenario", help="scenario file or built-in name")
    p.add_argument("--out", help="file to write (default: print it)")
    p.set_defaults(func=cmd_export)
