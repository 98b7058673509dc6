"""What a simulation gives back and how it is shown.

* :mod:`.result` — :class:`~simulator.results.result.Result`: summary, events, memory and
  bubbles of one step, with lazy pandas tables;
* :mod:`.export` — the output folder of ``stepsim run --out`` (summary.json, CSV/Parquet
  tables, Chrome trace, figures); :mod:`.parquet` its Parquet writer;
* :mod:`.plots` — timeline, memory and bubble figures (matplotlib);
* :mod:`.html_report` — the one-page interactive report (plotly): the page and its memory
  and exposed-communication figures; :mod:`.html_timeline` its timeline, :mod:`.html_data`
  the data it draws (from a Result or a run directory);
* :mod:`.report` — the text summary ``stepsim run`` prints, and how a simulated rank
  is described (which ranks it stands for).

A new output file or figure goes here; the figures it needs come from the Result.
"""
