"""How fast this machine runs the kind of Python the simulator is: a reference for comparing
timings taken on different machines.

    python benchmarks/machine.py            # best of 3, one line per probe
    python benchmarks/machine.py --json     # the same as JSON

Three probes, each timed with ``time.process_time`` (CPU seconds of this process), best of
``--repeat``:

* ``python_loop``: 10,000,000 additions in a ``for`` loop (the interpreter alone);
* ``simpy_events``: 200,000 timeouts through one simpy process (the event engine's own cost per
  event, without the simulator's handlers);
* ``random_lookups``: 2,000,000 lookups in random order in a dict of 2,000,000 tuples (memory
  latency: a step's ops, records and caches are millions of small objects).

The speed targets of ``benchmarks/README.md`` are seconds on the machine of the day they were
measured. Run this beside a target's command and record both: a later session on another
machine then tells a change in the code from a change in the machine (``benchmarks/README.md``,
"Machines").
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

LOOP_N = 10_000_000
EVENTS_N = 200_000
LOOKUPS_N = 2_000_000


def python_loop(n: int = LOOP_N) -> float:
    """CPU seconds for ``n`` additions in a Python ``for`` loop."""
    t = time.process_time()
    s = 0
    for i in range(n):
        s += i
    return time.process_time() - t


def simpy_events(n: int = EVENTS_N) -> float:
    """CPU seconds for ``n`` timeouts yielded by one simpy process."""
    import simpy

    env = simpy.Environment()

    def proc():
        for _ in range(n):
            yield env.timeout(1.0)

    env.process(proc())
    t = time.process_time()
    env.run()
    return time.process_time() - t


def random_lookups(n: int = LOOKUPS_N) -> float:
    """CPU seconds for ``n`` lookups, in a fixed random order, in a dict of ``n`` small tuples."""
    import random

    table = {i: (i, str(i)) for i in range(n)}
    keys = list(range(n))
    random.Random(1).shuffle(keys)
    t = time.process_time()
    s = 0
    for k in keys:
        s += table[k][0]
    return time.process_time() - t


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` where it exists, else ``platform.processor``)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per probe; the best is reported (default 3)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of lines")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat: at least 1, got {args.repeat}")
    out = {
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "python_loop_s": min(python_loop() for _ in range(args.repeat)),
        "simpy_events_s": min(simpy_events() for _ in range(args.repeat)),
        "random_lookups_s": min(random_lookups() for _ in range(args.repeat)),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"cpu {out['cpu']}, Python {out['python']}")
        print(f"python_loop   {out['python_loop_s']:.3f} CPU-s ({LOOP_N:,} additions)")
        print(f"simpy_events  {out['simpy_events_s']:.3f} CPU-s ({EVENTS_N:,} timeouts)")
        print(f"random_lookups {out['random_lookups_s']:.3f} CPU-s ({LOOKUPS_N:,} lookups in a dict of as many)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
