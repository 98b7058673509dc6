"""What the command line refuses before work starts, beyond the flags' own ranges
(:func:`simulator.cli.common.int_flag`, :func:`~simulator.cli.common.float_flag`): a
``stepsim collective`` benchmark too large for one command (:func:`check_collective_work`)
and a ``summary.json`` holding figures no finished run writes (:func:`check_finite_summary`).
"""

from __future__ import annotations

import math
from pathlib import Path

from simulator.cli.common import CliError

#: ``stepsim collective --max-bytes`` at most (1 PiB: 51 sizes from 1 byte).
MAX_COLLECTIVE_BYTES = 2**50
#: Point-to-point transfers one message size of ``stepsim collective`` may hold at once (an
#: all-to-all of n devices has n (n - 1): about 200 bytes each, so 2 GB of memory).
MAX_COLLECTIVE_FLOWS_PER_SIZE = 10_000_000
#: Work of one ``stepsim collective`` command, in transfers x sizes: an all-to-all's n (n - 1)
#: per size (1.2 us each: 2 minutes), a ring-like collective's 10 n (its cost per device is
#: about ten times a transfer's: all-reduce over 100,000 devices, 31 sizes took 41 s).
MAX_COLLECTIVE_WORK = 100_000_000


def check_collective_work(op: str, n: int, sizes: int) -> None:
    """Refuse, naming ``--devices``, a benchmark whose estimated work or memory is beyond
    what one command should take (:data:`MAX_COLLECTIVE_WORK`, :data:`MAX_COLLECTIVE_FLOWS_PER_SIZE`)."""
    per_size = n * (n - 1) if op == "all-to-all" else 10 * n
    if op == "all-to-all" and per_size > MAX_COLLECTIVE_FLOWS_PER_SIZE:
        raise CliError(
            f"--devices: an all-to-all over {n:,} devices is {per_size:,} transfers per message size, more "
            f"than the {MAX_COLLECTIVE_FLOWS_PER_SIZE:,} one command holds in memory; give fewer --devices",
            field="--devices",
        )
    if per_size * sizes > MAX_COLLECTIVE_WORK:
        raise CliError(
            f"--devices: {op} over {n:,} devices at {sizes} message sizes is about {per_size * sizes:,.0f} "
            f"units of work, more than the {MAX_COLLECTIVE_WORK:,} (about 2 minutes) one command does; give "
            "fewer --devices or a narrower --min-bytes..--max-bytes",
            field="--devices",
        )


def check_finite_summary(summary, path: Path) -> None:
    """Refuse a summary holding a non-finite number (NaN, inf): no finished run writes one,
    and a report of it would show nonsense. Names the file and the (dotted) key."""

    def walk(x, key):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{key}[{i}]")
        elif isinstance(x, float) and not math.isfinite(x):
            raise CliError(
                f"{path}: {key} is {x}, not a finite number; not the summary of a finished run", field=str(path)
            )

    walk(summary, "")
