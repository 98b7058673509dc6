"""``python -m simulator.cli ARGS`` is ``stepsim ARGS``."""

from simulator.cli.app import console

console()
