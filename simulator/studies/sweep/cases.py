"""A sweep's cases: the key of each (the SHA-256 of its resolved scenario's canonical JSON,
:func:`resolve`), the structural checks ``skip_invalid`` applies (:func:`check_scenario`) and the
expansion of a :class:`~simulator.studies.sweep.spec.SweepSpec` into cases (:func:`expand`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError
from simulator.scenario.serialise import scenario_to_dict
from simulator.studies.sweep.spec import _MISSING, Case, SweepSpec, eval_where, get_dotted, set_dotted
from workloads.errors import WorkloadError


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_jsonable, allow_nan=True)


def plain_json(obj: Any) -> str:
    """JSON keeping the key order (rows and summaries); NaN allowed."""
    return json.dumps(obj, default=_jsonable, allow_nan=True)


def _jsonable(x):
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def resolve(mapping: Mapping) -> tuple[str, dict | None, Any | None, str | None]:
    """``(key, resolved dict or None, Scenario or None, error or None)`` for a scenario mapping."""
    try:
        sc = load_scenario(mapping)
    except ScenarioError as err:
        return "raw-" + _sha(canonical_json({"raw": mapping})), None, None, str(err)
    resolved = scenario_to_dict(sc)
    return _sha(canonical_json(resolved)), resolved, sc, None


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def check_scenario(sc) -> None:
    """Checks that refuse a loaded scenario before any simulation (cheap, pure): the batch
    splits into micro-batches, the schedule accepts pp / vpp / micro-batches, the layers
    split over the model chunks, tp divides the heads and FFN width and ep the experts.
    Raises :class:`ScenarioError` naming the field."""
    from workloads import memory
    from workloads.schedules import validate_schedule_args
    from workloads.trace.shared import chunk_layer_ranges

    L, t, model = sc.layout, sc.training, sc.model
    try:
        m = t.micro_batches(L.dp)
        validate_schedule_args(sc.schedule, L.pp, m, L.vpp)
        chunk_layer_ranges(model, L, sc.schedule)
        memory.rank_parameter_counts(model, L, range(model.layers), True, True)
    except WorkloadError as err:
        raise ScenarioError.from_error(err) from None


def absolutise(mapping: dict, base_dir: Path | None) -> dict:
    """Relative ``model.hf_config`` paths are relative to the file the base came from."""
    model = mapping.get("model")
    if base_dir is not None and isinstance(model, dict) and isinstance(model.get("hf_config"), str):
        p = Path(model["hf_config"])
        if not p.is_absolute():
            mapping = set_dotted(mapping, "model.hf_config", str(base_dir / p))
    return mapping


@dataclass
class Expansion:
    cases: list[Case]
    skipped: list[dict] = field(default_factory=list)  # {"axes", "reason"}
    filtered: int = 0  # cases removed by `where`
    duplicates: list[dict] = field(default_factory=list)  # {"axes", "same_as"}


def expand(spec: SweepSpec) -> Expansion:
    """Turn a sweep spec into cases: apply the axes, evaluate ``where``, resolve and hash,
    drop invalid ones when ``skip_invalid``, and fold duplicates."""
    out = Expansion(cases=[])
    seen: dict[str, int] = {}
    for assign in spec.assignments:
        mapping = spec.base
        for k, v in assign.items():
            mapping = set_dotted(mapping, k, v)
        mapping = absolutise(mapping, spec.base_dir)
        key, resolved, sc, error = resolve(mapping)
        if spec.where:

            def lookup(name, _a=assign, _m=mapping, _r=resolved):
                for src in (_a,):
                    if name in src:
                        return src[name]
                for src in (_m, _r):
                    if src is not None:
                        v = get_dotted(src, name, _MISSING)
                        if v is not _MISSING:
                            return v
                raise KeyError(name)

            if not all(eval_where(w, lookup, f"where[{i}]") for i, w in enumerate(spec.where)):
                out.filtered += 1
                continue
        if spec.skip_invalid:
            if sc is not None:
                try:
                    check_scenario(sc)
                except ScenarioError as err:
                    error = str(err)
            if error is not None:
                out.skipped.append({"axes": assign, "reason": error})
                continue
        if key in seen:
            out.duplicates.append({"axes": assign, "same_as": seen[key]})
            continue
        seen[key] = len(out.cases)
        out.cases.append(Case(index=len(out.cases), axes=dict(assign), scenario=mapping, key=key, resolved=resolved))
    return out
