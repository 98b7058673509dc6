"""``stepsim goodput SCENARIO``: the command line of :mod:`simulator.studies.goodput` (failures
over a run, checkpoints, the checkpoint interval, goodput and effective tokens per day; with
``--failed N``, the step once N devices of one scale-up domain are out and the layout re-planned)."""

from __future__ import annotations

import json
import math

from simulator.cli.common import float_flag, int_flag


def cmd_goodput(args) -> int:
    from simulator import simulate
    from simulator.scenario.loading import load_scenario
    from simulator.studies import goodput as gp

    sc = load_scenario(args.scenario)
    if args.failed is not None:
        gp.check_failed(sc, args.failed)  # before the step is simulated
    s = simulate(sc, steady_state=True).summary
    storage = args.storage_bw if args.storage_bw is not None else sc.cluster.storage_bw_bytes_per_s
    g = gp.goodput(
        s["parameters"] + s.get("mtp_parameters", 0),
        sc.layout.world,
        s["tokens_per_s"],
        storage,
        restart_s=args.restart_s,
        rate_scale=args.rate_scale,
    )
    out = {"scenario": sc.name, "step_time_s": s["step_time_s"], **g.as_dict()}
    replanned = None
    if args.failed is not None:
        replanned = gp.replan_after_failure(sc, args.failed, s["step_time_s"])
        out["replanned_after_failure"] = dict(replanned.__dict__)
    if args.json:
        print(json.dumps(out, indent=2, default=lambda x: None if isinstance(x, float) and math.isinf(x) else x))
        return 0
    print(gp.describe(g, sc.name))
    if replanned is not None:
        r = replanned
        if r.devices_per_domain is None:
            print(f"  {r.failed} of {r.capacity} devices out: no placement keeps the layout's groups in a domain")
        else:
            print(
                f"  {r.failed} of {r.capacity} devices out: {r.devices_per_domain} a domain, {r.domains_after} domains "
                f"(was {r.domains_before}); step {r.step_time_s:.4g} s (was {r.step_time_before_s:.4g} s)"
            )
    return 0


def register(subparsers) -> None:
    """Add ``goodput`` to the ``stepsim`` parser."""
    p = subparsers.add_parser(
        "goodput",
        help="failures over a run: interruptions, checkpoints, the best interval, goodput, tokens per day",
    )
    p.add_argument("scenario", help="scenario file or built-in name")
    p.add_argument(
        "--restart-s",
        type=float_flag(0.0, 1e7),
        default=600.0,
        help="seconds a restart takes before reading the checkpoint (scheduling, start-up, NCCL set-up; "
        "default 600, an assumption: no published figure is used)",
    )
    p.add_argument(
        "--rate-scale",
        type=float_flag(0.0, 1e3),
        default=1.0,
        help="multiply Llama 3 405B's interruption rates per component-hour (arXiv 2407.21783 Table 5)",
    )
    p.add_argument(
        "--storage-bw",
        type=float_flag(1e6, 1e18),
        help="checkpoint storage bandwidth, bytes/s (default: the cluster's storage_bw_bytes_per_s)",
    )
    p.add_argument(
        "--failed",
        type=int_flag(1, 1_000_000),
        help="devices out in one scale-up domain (e.g. 4: a GB200 NVL72 compute tray): the layout re-planned",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=cmd_goodput)
