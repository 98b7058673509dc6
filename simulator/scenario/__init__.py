"""The scenario: the user's description of one step (model, cluster, layout, schedule) as a
validated, immutable value.

* :mod:`.schema` — the pydantic schema of the scenario file (``docs/scenario.md``), its
  loading from YAML/JSON or a mapping, built-in scenario names, and the conversion into the
  frozen specs of :mod:`workloads` and :mod:`topologies` that every later layer reads.

Nothing here simulates: a new scenario field is added to the schema and documented in
``docs/scenario.md``; the layers below read the spec it fills.
"""
