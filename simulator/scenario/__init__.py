"""The scenario: the user's description of one step (model, cluster, layout, schedule) as a
validated, immutable value.

* :mod:`.schema` — the pydantic models of the scenario file (``docs/scenario.md``) and how
  their failures read;
* :mod:`.errors` — :class:`~.errors.ScenarioError`, the dotted key at fault first (no pydantic);
* :mod:`.loading` — ``load_scenario``: reading YAML/JSON or a mapping, built-in scenario names;
* :mod:`.resolve` — presets and overrides into the frozen specs of :mod:`workloads` and
  :mod:`topologies` that every later layer reads;
* :mod:`.checks` — checks that span sections (size of the step, MoE-only settings, ...);
* :mod:`.resolved` — :class:`~.resolved.Scenario`, the resolved value;
* :mod:`.serialise` — ``scenario_to_dict``, the resolved scenario back as a mapping.

Nothing here simulates: a new scenario field is added to the schema and documented in
``docs/scenario.md``; the layers below read the spec it fills.
"""
