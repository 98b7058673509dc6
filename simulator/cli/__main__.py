"""``python -m simulator.cli ARGS`` is ``stepsim ARGS``."""

import sys

from simulator.cli.app import main

sys.exit(main())
