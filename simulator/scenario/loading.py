"""Loading a scenario: ``load_scenario(path_or_mapping) -> Scenario`` (``docs/scenario.md``).

It reads YAML or JSON (:func:`read_mapping`) or takes a built-in scenario name
(:func:`builtin_scenarios`) or a mapping, validates it against :mod:`.schema`, resolves
presets into frozen specs (:mod:`.resolve`), runs the checks that span sections
(:mod:`.checks`) and returns a :class:`~simulator.scenario.resolved.Scenario`. Every failure
is a :class:`~simulator.scenario.schema.ScenarioError` whose message starts with the dotted
key at fault and says what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from simulator.scenario.checks import (
    check_algorithms,
    check_allgather_dispatcher,
    check_context_parallel,
    check_cuda_graphs,
    check_dense,
    check_ep_overlap,
    check_fp8_recipe,
    check_fused_grouped_mlp,
    check_moe_layout,
    check_network_algorithms,
    check_perturbations,
    check_size,
    check_torus_size,
    check_work,
)
from simulator.scenario.resolve import resolve_cluster, resolve_layout, resolve_model, resolve_training
from simulator.scenario.resolved import Scenario
from simulator.scenario.schema import ScenarioError, ScenarioIn, error_from_pydantic
from topologies.networks import TorusNetwork
from workloads.moe_load import ExpertLoad


def read_mapping(path: str | Path, what: str = "scenario") -> dict:
    """A scenario-like file (YAML, or JSON by extension) as a mapping, read through
    :mod:`stepsim_fileio` (YAML 1.2 floats, duplicate keys, size, depth and alias caps).
    Every failure is a :class:`ScenarioError` naming the file."""
    from stepsim_fileio import InputFileError, load_file

    p = Path(path)
    try:
        data = load_file(p, what=f"{what} file")
    except InputFileError as err:
        raise ScenarioError(str(err), field="") from None
    if not isinstance(data, dict):
        raise ScenarioError(
            f"{p}: a {what} is a mapping with keys "
            f"{'model, cluster, parallel, schedule, training' if what == 'scenario' else 'name, base, grid, cases'}"
            f"; got {type(data).__name__}",
            field="",
        )
    data.setdefault("name", p.stem)
    return data


BUILTIN_DIR = Path(__file__).resolve().parent.parent / "scenarios"
#: The keys a validation case file (``stepsim validate``, validation/README.md) has beside its
#: scenario: the published figure and the assumptions made translating the run. A file with
#: ``published`` loads as the scenario it holds, so ``stepsim run CASE`` shows the timeline
#: behind a validation row (``stepsim validate`` checks the two keys themselves).
CASE_KEYS = ("published", "assumptions")


def builtin_scenarios() -> dict[str, Path]:
    """Built-in scenario files by name (``stepsim presets`` lists them)."""
    return {p.stem: p for p in sorted(BUILTIN_DIR.glob("*.yaml"))}


def builtin_file(name: str, path: Path | None = None) -> Path | None:
    """The file of the built-in scenario ``name`` where no file ``path`` (default: ``name``)
    exists, else None: a file of that name wins over the built-in."""
    p = Path(name) if path is None else path
    from stepsim_fileio import is_there

    return None if is_there(p) else builtin_scenarios().get(name)


def load_scenario(source: str | Path | Mapping) -> Scenario:
    """Validate a scenario given as a path (YAML/JSON), a built-in scenario name, or a mapping."""
    base_dir = None
    if isinstance(source, str):
        source = builtin_file(source) or source
    if isinstance(source, (str, Path)):
        base_dir = Path(source).parent
        data = read_mapping(source)
    elif isinstance(source, Mapping):
        data = dict(source)
    else:
        raise ScenarioError(f"expected a path or a mapping, got {type(source).__name__}", field="")
    if "published" in data:  # a validation case runs as its scenario (validation/README.md)
        data = {k: v for k, v in data.items() if k not in CASE_KEYS}
    try:
        sc = ScenarioIn.model_validate(data)
    except ValidationError as err:
        raise error_from_pydantic(err, "") from None
    model = resolve_model(sc.model, base_dir)
    cluster = resolve_cluster(sc.cluster, sc.placement)
    check_torus_size(cluster.devices, isinstance(cluster.network, TorusNetwork))
    layout = resolve_layout(sc.parallel, cluster.devices)
    training = resolve_training(sc.training, layout)
    check_dense(model, sc)
    check_cuda_graphs(training, cluster.chip.family)
    check_fp8_recipe(training, cluster.chip.family)
    check_fused_grouped_mlp(model, layout, training, cluster.chip.family)
    check_moe_layout(model, layout)
    check_ep_overlap(model, layout, training, sc.schedule)
    check_allgather_dispatcher(training, sc.training.expert_load, sc.schedule)
    check_algorithms(sc.algorithms)
    check_size(model, layout, training, sc.schedule)
    check_work(model, training, cluster.devices, cluster.chip.peak("bf16"))
    check_context_parallel(layout, training)
    check_perturbations(sc.perturbations, cluster.devices)
    check_network_algorithms(sc.network_calibration)
    return Scenario(
        name=str(sc.name or model.name),
        model=model,
        cluster=cluster,
        layout=layout,
        schedule=sc.schedule,
        training=training,
        perturbations=tuple(sc.perturbations),
        compute_overrides=tuple((k, v) for k, v in sc.compute.model_dump().items() if v is not None),
        network_overrides=tuple(
            (k, tuple(sorted(v.items()))) for k, v in sc.network_calibration.model_dump().items() if v
        ),
        algorithms=tuple(sorted(sc.algorithms.items())),
        source=data,
        expert_load=ExpertLoad(**sc.training.expert_load.model_dump()) if sc.training.expert_load else None,
    )
