"""What a simulation gives back and how it is shown.

* :mod:`.result` — :class:`~simulator.results.result.Result`: summary, events, memory and
  bubbles of one step, with lazy pandas tables;
* :mod:`.export` — the output folder of ``stepsim run --out`` (summary.json, CSV/Parquet
  tables, Chrome trace, figures); :mod:`.parquet` its Parquet writer;
* :mod:`.plots` — timeline, memory and bubble figures (matplotlib);
* :mod:`.pixels` — bars reduced to the pixels that show them, so that ops shorter than a pixel
  keep their share of a row (the PNG timeline's and the HTML timeline's);
* :mod:`.links` — the links table (``links.csv``): bytes, busy fraction and peak flows of
  every loaded link by axis, rebuilt from the run's records; :mod:`.links_plot` its heat
  map of racks, trays and switches (``links.png``);
* :mod:`.html_report` — the one-page interactive report (plotly): the page and its memory
  and exposed-communication figures; :mod:`.html_timeline` its timeline, :mod:`.html_data`
  the data it draws (from a Result or a run directory);
* :mod:`.report` — the text summary ``stepsim run`` prints, and how a simulated rank
  is described (which ranks it stands for).
* :mod:`.explain` — a step's time split into causes that add up to it, and two steps'
  difference the same way (``stepsim explain``);
* :mod:`.summary` — the summary record of one step and the per-stage table, from the
  engine's raw run;
* :mod:`.moe_terms` — the summary's MoE compute terms per MoE layer and micro-batch
  (``moe_terms_s``);
* :mod:`.outdir` — output folders and files written whole or not at all;
* :mod:`.beside` — one function run in a forked child beside the caller (figures drawn
  while the tables are written).

A new output file or figure goes here; the figures it needs come from the Result.
"""
