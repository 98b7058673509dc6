"""What a simulation gives back and how it is shown.

* :mod:`.result` — :class:`~simulator.results.result.Result`: summary, events, memory and
  bubbles of one step, with lazy pandas tables;
* :mod:`.export` — the output folder of ``stepsim run --out`` (summary.json, CSV/Parquet
  tables, Chrome trace, figures); :mod:`.parquet` its Parquet writer;
* :mod:`.plots` — timeline, memory and bubble figures (matplotlib);
* :mod:`.html_report` — the one-page interactive report (plotly);
* :mod:`.report` — the text summary ``stepsim run`` prints, and how a simulated rank
  is described (which ranks it stands for).

A new output file or figure goes here; the figures it needs come from the Result.
"""
