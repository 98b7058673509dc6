"""The command line, ``stepsim COMMAND``: the top layer, the only one that reads ``argv``,
prints, and turns a :class:`~stepsim_errors.StepsimError` into exit code 2.

* :mod:`.app` — the parser of every command and the commands that run one scenario
  (``run``, ``trace``, ``estimate``, ``report``, ``compare``, ``bench``...);
* :mod:`.sweep` — ``sweep``, ``search`` and their workers;
* :mod:`.validate` — ``validate`` and ``calibrate``;
* :mod:`.ppmap` — ``ppmap``, the map of where pipeline parallelism pays;
* :mod:`.importer` — ``import megatron``, a scenario from a Megatron-LM / NeMo argument list, and
  ``export megatron``, the launch line of a scenario;
* :mod:`.goodput` — ``goodput``, failures over a run and the goodput they leave;
* :mod:`.explain` — ``explain``, the difference of two steps split into its causes;
* :mod:`.common` — what they share: the error-to-exit-code mapping, progress, output.
* :mod:`.limits` — what is refused before work starts beyond each flag's own range (a
  benchmark too large to run);
* :mod:`.interrupts` — SIGINT and SIGTERM: one line and exit 130 or 143, workers ended;
* :mod:`.__main__` — ``python -m simulator.cli ARGS`` is ``stepsim ARGS``.

A new command goes in the module of its family and is registered in
:func:`.app.build_parser`. ``python -m simulator.cli ARGS`` is ``stepsim ARGS``.
"""

from simulator.cli.app import console, main

__all__ = ["console", "main"]
