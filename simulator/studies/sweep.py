"""Parameter sweeps: many scenarios, one table, resumable after a crash.

A sweep file (YAML or JSON) names a ``base`` scenario and the axes to vary::

    name: pp-vs-nic                   # optional label
    base: ../scenarios/llama.yaml     # a scenario path (relative to this file), or an inline mapping
    grid:                             # the product of every listed value
      parallel.pp: [1, 2, 4, 8]
      cluster.network.nic_bw_bytes_per_s: [25e9, 50e9]
    cases:                            # and/or an explicit list of cases
      - {parallel.tp: 8, schedule: 1f1b}
      - {parallel.tp: 4, schedule: interleaved-1f1b, parallel.vpp: 2}
    skip_invalid: true                # leave out cases whose layout cannot run (see below)
    where:                            # keep only the cases for which every expression holds
      - parallel.tp * parallel.pp <= 32
      - schedule != "gpipe" or parallel.pp <= 4

Axes
----
Every axis is a *dotted scenario key*: ``parallel.pp`` sets ``base["parallel"]["pp"]``.
Axes are checked against the scenario's keys (:func:`scenario_key_tree`) when the sweep
is loaded: a misspelled one (``parallel.ppp``) is refused, naming the closest valid key.
A sweep of more than :data:`MAX_SWEEP_CASES` cases (before ``where``) is refused before
it is expanded. Sweep files are read like scenario files (:mod:`simulator.fileio`).
Missing intermediate mappings are created; an intermediate that is a preset name
(``model: llama3-8b``) becomes ``{preset: llama3-8b}`` so that ``model.layers`` or
``cluster.devices`` override the preset field by field, as in a scenario file. A
value may itself be a mapping or a list (stored JSON-encoded in the tables).

With only ``grid``, the cases are the product of its value lists in the order
the keys are written, the last key varying fastest. With only ``cases``, they
are the list. With both, every case is crossed with the grid (case-major).
Leave ``parallel.dp`` out of the base when varying ``tp``/``pp``/``cp``: it is
then the devices left over.

Constraints
-----------
``where`` is one expression or a list of them (all must hold). They are Python
syntax restricted to literals, dotted keys, arithmetic (``+ - * / // % **``),
comparisons (``< <= == != >= > in``, chained), ``and``/``or``/``not`` and
parentheses; nothing else (no calls, no attribute access beyond dotted keys).
A dotted key is looked up in the case's axis values, then in its scenario
mapping, then in the resolved scenario (presets expanded, so ``model.layers``
and ``cluster.devices`` work); an unknown key is an error. Cases failing a
``where`` are not part of the sweep at all.

``skip_invalid: true`` leaves out the cases whose scenario is refused before
any simulation: it does not load (:func:`simulator.load_scenario`, e.g. a layout
that does not divide the devices) or fails the structural checks of
:func:`check_scenario` (batch split, schedule rules, layers over pipeline
chunks, heads / experts over tp / ep). Without it those cases are run and
recorded as ``failed`` with their error. Skipped cases are listed in
``DataFrame.attrs["skipped"]``.

Outputs and resumption
----------------------
With ``out=DIR``, every finished case is appended to ``DIR/rows.jsonl`` (one JSON
object a line, flushed and fsynced: the source of truth), and
``DIR/results.parquet`` and ``DIR/results.csv`` are rewritten from it (write to a
temporary file, then an atomic rename) every few seconds and at the end.
``DIR/sweep.json`` records the sweep's name, axes and case count. Each case is
keyed by the SHA-256 of the canonical JSON of its resolved scenario
(``scenario_to_dict(load_scenario(mapping))``; the raw mapping for one that does
not load). Running the same sweep again reads ``rows.jsonl``, skips every key
already there (``retry_failed=True`` re-runs the failed ones) and never writes a
key twice into the tables; a torn last line left by a crash is dropped. Cases
resolving to the same scenario are run once (the first case keeps the row; the
others are listed in ``DataFrame.attrs["duplicates"]``).

Table columns: ``case`` (index in the sweep), the axis values (named by their
dotted keys), ``status`` (``ok`` | ``failed``), ``error``, ``stepsim_version`` (the
version that ran the case; ``results.parquet`` also carries the writer's version as
key-value metadata ``stepsim_version``), the summary record
flattened (nested mappings as dotted columns such as
``memory_breakdown_bytes.weights``, lists JSON-encoded), and ``key``. Rows are
sorted by ``case``, so the table does not depend on the executor.

Executors
---------
Cases run in local processes (:class:`concurrent.futures.ProcessPoolExecutor`,
``jobs`` of them, default every core; ``jobs=1`` runs them in this process), on
any :class:`concurrent.futures.Executor` given as ``executor`` (a thread pool,
loky's ``get_reusable_executor()``, Ray's, ``mpi4py.futures.MPIPoolExecutor``; the
sweep submits :func:`run_case` with a picklable payload and leaves the executor
running), or on a Dask cluster when a ``dask.distributed.Client`` is given. Local
workers end when the process that started them dies, killed or not
(:mod:`simulator.studies.workers`). On an executor or Dask, a first task asks a worker for its
stepsim version, and every row carries the version that ran it: a worker running
another version than this process stops the sweep with :class:`WorkerVersionError`
(rows finished before are kept).

The file formats (sweep file, ``rows.jsonl``, the tables, ``sweep.json``) are
also documented in ``docs/formats.md``; the scenario keys in ``docs/scenario.md``.
"""

from __future__ import annotations

import ast
import copy
import difflib
import hashlib
import itertools
import json
import math
import operator
import os
import time
from concurrent.futures import as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

import pandas as pd

from simulator.scenario.loading import load_scenario, read_mapping
from simulator.scenario.schema import ScenarioError
from simulator.scenario.serialise import scenario_to_dict
from simulator.version import __version__
from simulator.errors import StudyError
from simulator.results.parquet import write_parquet
from simulator.studies.workers import process_pool
from workloads.enums import TRACE_COLLECTIVE_OPS
from workloads.errors import WorkloadError

SWEEP_KEYS = ("name", "base", "grid", "cases", "skip_invalid", "where")
ROWS_FILE, PARQUET_FILE, CSV_FILE, META_FILE = "rows.jsonl", "results.parquet", "results.csv", "sweep.json"
MAX_SWEEP_CASES = 100_000  # cases before `where`; a larger sweep is refused before it is expanded
TABLE_REWRITE_INTERVAL_S = 10.0  # how often the tables are rewritten from rows.jsonl while running


# ---- the sweep specification --------------------------------------------------------------


@dataclass(frozen=True)
class SweepSpec:
    """A parsed sweep file: the base scenario mapping and the list of axis assignments."""

    name: str
    base: dict
    assignments: tuple[dict, ...]  # one {dotted key: value} per case, before `where` / skip_invalid
    axes: tuple[str, ...]  # every dotted key, in order of first appearance
    skip_invalid: bool = False
    where: tuple[str, ...] = ()
    base_dir: Optional[Path] = None  # where relative paths inside the base are resolved


@dataclass(frozen=True)
class Case:
    """One scenario of a sweep."""

    index: int
    axes: dict
    scenario: dict
    key: str
    resolved: Optional[dict] = None  # scenario_to_dict of the loaded scenario; None if it does not load


def load_sweep(spec_or_path: Union[str, Path, Mapping]) -> SweepSpec:
    """Parse a sweep file (YAML/JSON path) or mapping. Raises :class:`ScenarioError`
    naming the sweep key at fault."""
    sweep_dir = None
    if isinstance(spec_or_path, (str, Path)):
        path = Path(spec_or_path)
        data = read_mapping(path, what="sweep")
        sweep_dir = path.resolve().parent
        default_name = path.stem
    elif isinstance(spec_or_path, Mapping):
        data = dict(spec_or_path)
        default_name = "sweep"
    else:
        raise ScenarioError("", f"a sweep is a path or a mapping, got {type(spec_or_path).__name__}")
    for k in data:
        if k not in SWEEP_KEYS:
            raise ScenarioError(k, f"unknown sweep key; allowed: {', '.join(SWEEP_KEYS)}")
    if "base" not in data:
        raise ScenarioError("base", "required: a scenario path (relative to the sweep file) or mapping")
    base, base_dir = data["base"], sweep_dir
    if isinstance(base, str):
        p = Path(base)
        if not p.is_absolute() and sweep_dir is not None:
            p = sweep_dir / p
        base = read_mapping(p)
        base_dir = p.resolve().parent
    elif not isinstance(base, Mapping):
        raise ScenarioError("base", f"must be a scenario path or mapping, got {type(base).__name__}")
    base = copy.deepcopy(dict(base))

    grid = data.get("grid")
    grid_rows: list[dict] = [{}]
    if grid is not None:
        if not isinstance(grid, Mapping) or not grid:
            raise ScenarioError("grid", "must be a non-empty mapping of dotted scenario keys to value lists")
        for k, v in grid.items():
            _check_axis_key(k, "grid")
            if not isinstance(v, list) or not v:
                raise ScenarioError(f"grid.{k}", f"must be a non-empty list of values, got {v!r}")
        keys = list(grid)
        n_grid = math.prod(len(grid[k]) for k in keys) * (
            len(data["cases"]) if isinstance(data.get("cases"), list) and data["cases"] else 1
        )
        if n_grid > MAX_SWEEP_CASES:
            raise ScenarioError(
                "grid",
                f"the sweep would have {n_grid:,} cases "
                f"({' x '.join(str(len(grid[k])) for k in keys)}"
                f"{' x cases' if data.get('cases') else ''}); the limit is "
                f"{MAX_SWEEP_CASES:,}: split it or use `where`",
            )
        grid_rows = [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]
    cases = data.get("cases")
    case_rows: list[dict] = [{}]
    if cases is not None:
        if not isinstance(cases, list) or not cases:
            raise ScenarioError("cases", "must be a non-empty list of mappings {dotted key: value}")
        case_rows = []
        for i, c in enumerate(cases):
            if not isinstance(c, Mapping):
                raise ScenarioError(f"cases[{i}]", f"must be a mapping of dotted keys to values, got {c!r}")
            for k in c:
                _check_axis_key(k, f"cases[{i}]")
            case_rows.append(dict(c))
    if grid is None and cases is None:
        raise ScenarioError("grid", "a sweep needs 'grid' and/or 'cases'")
    assignments = tuple({**c, **g} for c in case_rows for g in grid_rows)
    axes: dict[str, None] = {}
    for a in assignments:
        for k in a:
            axes.setdefault(k, None)
    where = data.get("where", [])
    if isinstance(where, str):
        where = [where]
    if not isinstance(where, list) or not all(isinstance(w, str) for w in where):
        raise ScenarioError("where", f"must be an expression or a list of expressions, got {where!r}")
    for i, w in enumerate(where):
        _parse_where(w, f"where[{i}]")
    skip = data.get("skip_invalid", False)
    if not isinstance(skip, bool):
        raise ScenarioError("skip_invalid", f"must be true or false, got {skip!r}")
    return SweepSpec(
        name=str(data.get("name") or default_name),
        base=base,
        assignments=assignments,
        axes=tuple(axes),
        skip_invalid=skip,
        where=tuple(where),
        base_dir=base_dir,
    )


def _check_axis_key(k, where: str) -> None:
    if not isinstance(k, str) or not k or any(not part for part in k.split(".")):
        raise ScenarioError(where, f"axis keys are dotted scenario keys such as parallel.pp, got {k!r}")
    node = scenario_key_tree()
    parts = k.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            prefix = ".".join(parts[:i])
            if not isinstance(node, dict):
                raise ScenarioError(f"{where}.{k}", f"{prefix} takes a value, not keys inside it")
            sibling = difflib.get_close_matches(part, sorted(node), n=1, cutoff=0.5)
            if sibling:
                close = ".".join(parts[:i] + sibling)
            else:
                close = next(
                    iter(difflib.get_close_matches(k, list(_all_paths(scenario_key_tree())), n=1, cutoff=0.6)), None
                )
            hint = f" (did you mean {close}?)" if close else ""
            raise ScenarioError(
                f"{where}.{k}",
                f"no scenario key {part!r} in {prefix or 'the scenario'}{hint}; "
                f"allowed there: {', '.join(sorted(node))}",
            )
        node = node[part]


def _all_paths(tree: dict, prefix: str = ""):
    for k, v in tree.items():
        yield prefix + k
        if isinstance(v, dict):
            yield from _all_paths(v, prefix + k + ".")


_KEY_TREE: Optional[dict] = None


def scenario_key_tree() -> dict:
    """Every key a scenario mapping may hold, as nested dicts (``None`` = a value)."""
    global _KEY_TREE
    if _KEY_TREE is None:
        import dataclasses as dc

        from pydantic import BaseModel

        from simulator.scenario import schema
        from topologies.networks import PodsSpec, SwitchedNetwork, TorusNetwork

        def of_model(m) -> dict:
            out = {}
            for name, f in m.model_fields.items():
                ann = f.annotation
                sub = next(
                    (
                        a
                        for a in (getattr(ann, "__args__", None) or (ann,))
                        if isinstance(a, type) and issubclass(a, BaseModel)
                    ),
                    None,
                )
                out[name] = of_model(sub) if sub is not None else None
            return out

        tree = of_model(schema.ScenarioIn)
        tree["model"] = of_model(schema.ModelIn)
        chip = {**of_model(schema.ChipIn), "preset": None, "peak_flops_per_s": {"bf16": None, "fp8": None}}
        network = {"kind": None, **{f.name: None for cls in (TorusNetwork, SwitchedNetwork) for f in dc.fields(cls)}}
        tree["cluster"] = {
            "preset": None,
            "devices": None,
            "name": None,
            "host_bw_bytes_per_s": None,
            "devices_per_domain": None,
            "chip": chip,
            "network": network,
            "pods": {f.name: None for f in dc.fields(PodsSpec)},
        }
        tree["algorithms"] = {k: None for k in TRACE_COLLECTIVE_OPS}
        tree["perturbations"] = None
        _KEY_TREE = tree
    return _KEY_TREE


def set_dotted(mapping: Mapping, key: str, value: Any) -> dict:
    """A deep copy of ``mapping`` with dotted ``key`` set to ``value``. A preset name met on
    the way becomes ``{preset: name}``; missing mappings are created."""
    out = copy.deepcopy(dict(mapping))
    parts = key.split(".")
    node = out
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = {}
        elif isinstance(nxt, str):
            nxt = {"preset": nxt}
        elif not isinstance(nxt, dict):
            raise ScenarioError(key, f"cannot set a key inside {'.'.join(parts[: i + 1])} = {nxt!r}")
        node[part] = nxt = dict(nxt)
        node = nxt
    node[parts[-1]] = copy.deepcopy(value)
    return out


_MISSING = object()


def get_dotted(mapping: Any, key: str, default: Any = _MISSING) -> Any:
    node = mapping
    for part in key.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        else:
            if default is _MISSING:
                raise KeyError(key)
            return default
    return node


# ---- `where` expressions ------------------------------------------------------------------

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


def _parse_where(expr: str, field: str) -> ast.Expression:
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as err:
        raise ScenarioError(field, f"not a valid expression {expr!r}: {err.msg}") from None
    for node in ast.walk(tree):
        ok = (
            isinstance(
                node,
                (
                    ast.Expression,
                    ast.BoolOp,
                    ast.And,
                    ast.Or,
                    ast.UnaryOp,
                    ast.Not,
                    ast.USub,
                    ast.UAdd,
                    ast.BinOp,
                    ast.Compare,
                    ast.Constant,
                    ast.Name,
                    ast.Attribute,
                    ast.Load,
                    ast.List,
                    ast.Tuple,
                ),
            )
            or type(node) in _BINOPS
            or type(node) in _CMPOPS
        )
        if not ok:
            raise ScenarioError(
                field,
                f"{type(node).__name__} not allowed in {expr!r}; use literals, dotted keys, "
                "arithmetic, comparisons, and/or/not",
            )
    return tree


def _dotted_name(node) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted_name(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def eval_where(expr: str, lookup, field: str = "where") -> bool:
    """Evaluate one ``where`` expression; ``lookup(dotted_key)`` returns a value or raises KeyError."""
    tree = _parse_where(expr, field)

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = _dotted_name(node)
            if name is None:
                raise ScenarioError(field, f"only dotted keys may be looked up in {expr!r}")
            try:
                return lookup(name)
            except KeyError:
                raise ScenarioError(field, f"unknown key {name!r} in {expr!r}") from None
        if isinstance(node, (ast.List, ast.Tuple)):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.BoolOp):
            vals = (ev(v) for v in node.values)
            return all(vals) if isinstance(node.op, ast.And) else any(vals)
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return (not v) if isinstance(node.op, ast.Not) else (-v if isinstance(node.op, ast.USub) else +v)
        if isinstance(node, ast.BinOp):
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            for op, comp in zip(node.ops, node.comparators):
                right = ev(comp)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        raise ScenarioError(field, f"{type(node).__name__} not allowed in {expr!r}")  # pragma: no cover

    try:
        return bool(ev(tree))
    except ScenarioError:
        raise
    except (TypeError, ZeroDivisionError, ValueError) as err:
        raise ScenarioError(field, f"cannot evaluate {expr!r}: {err}") from None


# ---- cases ---------------------------------------------------------------------------------


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


def resolve(mapping: Mapping) -> tuple[str, Optional[dict], Optional[Any], Optional[str]]:
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
    from workloads.trace.builder import chunk_layer_ranges

    L, t, model = sc.layout, sc.training, sc.model
    try:
        m = t.micro_batches(L.dp)
        validate_schedule_args(sc.schedule, L.pp, m, L.vpp)
        chunk_layer_ranges(model, L, sc.schedule)
        memory.rank_parameter_counts(model, L, range(model.layers), True, True)
    except WorkloadError as err:
        raise ScenarioError.from_error(err) from None


def _absolutise(mapping: dict, base_dir: Optional[Path]) -> dict:
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
        mapping = _absolutise(mapping, spec.base_dir)
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


# ---- running one case (in a worker) ---------------------------------------------------------


def run_case(payload: tuple) -> dict:
    """Simulate one case; never raises for a bad scenario. ``payload = (index, key, mapping)``.
    Returns ``{"case", "key", "status", "error", "summary", "stepsim_version"}`` with plain
    JSON types (``stepsim_version``: the version that ran the case)."""
    index, key, mapping = payload
    from simulator import simulate

    try:
        summary = simulate(mapping).summary
        row = {"case": index, "key": key, "status": "ok", "error": None, "summary": summary}
    except ScenarioError as err:
        row = {"case": index, "key": key, "status": "failed", "error": str(err), "summary": None}
    except Exception as err:  # noqa: BLE001 — one broken scenario must not stop the sweep
        row = {"case": index, "key": key, "status": "failed", "error": f"{type(err).__name__}: {err}", "summary": None}
    row["stepsim_version"] = worker_version()
    return json.loads(plain_json(row))


def worker_version() -> str:
    """The stepsim version of the process this runs in (read when called, so that a
    worker reports its own). The first task every executor of a sweep is sent."""
    from simulator import version as _version

    return _version.__version__


class WorkerVersionError(StudyError):
    """A worker runs another stepsim version than the process running the sweep."""


def _check_version(version, who: str) -> None:
    if version is not None and version != __version__:
        raise WorkerVersionError(
            f"executor: {who} runs stepsim {version}, this process stepsim {__version__}; install the same "
            f"version on every worker (pip install stepsim=={__version__}) - results of two versions in one "
            "table would not compare. The rows finished so far are saved."
        )


def _failed_row(p: tuple, err: BaseException) -> dict:
    return {"case": p[0], "key": p[1], "status": "failed", "error": f"{type(err).__name__}: {err}", "summary": None}


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover — not Linux
        return max(1, os.cpu_count() or 1)


def execute(payloads: Sequence[tuple], client=None, jobs: Optional[int] = None, executor=None) -> Iterator[dict]:
    """Run :func:`run_case` over ``payloads``, yielding rows as they finish (any order).

    ``executor``: any :class:`concurrent.futures.Executor` (a thread or process pool, loky's,
    Ray's, ``mpi4py.futures.MPIPoolExecutor``...; left running: its owner shuts it down);
    ``client``: a ``dask.distributed.Client``; otherwise ``jobs`` local processes (default:
    every core; ``1``: in this process). On an executor or Dask, a first task asks a worker
    for its stepsim version and every row carries the version that ran it: another version
    than this process's stops the sweep with :class:`WorkerVersionError`."""
    if client is not None and executor is not None:
        raise ValueError("executor: give either a Dask client or an executor, not both")
    if not payloads:
        return
    if executor is not None:
        if not callable(getattr(executor, "submit", None)):
            raise ValueError(
                f"executor: expected a concurrent.futures.Executor (with submit), got {type(executor).__name__}"
            )
        _check_version(executor.submit(worker_version).result(), "a worker")
        futs = {executor.submit(run_case, p): p for p in payloads}
        try:
            for f in as_completed(futs):
                p = futs[f]
                try:
                    row = f.result()
                except BrokenProcessPool:
                    raise RuntimeError(
                        "a worker process died (killed, or out of memory); the rows finished so far are saved - "
                        "run the same sweep again to resume (with jobs=1 to find the case at fault)"
                    ) from None
                except Exception as err:  # noqa: BLE001 — a worker lost, a task erred: record it
                    row = _failed_row(p, err)
                _check_version(row.get("stepsim_version"), f"the worker that ran case {p[0]}")
                yield row
        finally:
            for f in futs:
                f.cancel()
        return
    if client is not None:
        from distributed import as_completed as dask_completed

        _check_version(client.submit(worker_version, pure=False).result(), "a Dask worker")
        futures = client.map(run_case, list(payloads), pure=False)
        by_future = dict(zip(futures, payloads))
        try:
            for fut in dask_completed(futures):
                p = by_future.pop(fut)
                try:
                    row = fut.result()
                except Exception as err:  # noqa: BLE001 — a worker lost, a task erred: record it
                    row = _failed_row(p, err)
                fut.release()
                _check_version(row.get("stepsim_version"), f"the Dask worker that ran case {p[0]}")
                yield row
        finally:
            for fut in by_future:
                fut.cancel()
        return
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs: must be >= 1, got {jobs}")
    if jobs == 1:
        for p in payloads:
            yield run_case(p)
        return
    ex = process_pool(min(jobs, len(payloads)))  # its workers end when this process dies
    try:
        futs = [ex.submit(run_case, p) for p in payloads]
        for f in as_completed(futs):
            try:
                yield f.result()
            except BrokenProcessPool:
                raise RuntimeError(
                    "a worker process died (killed, or out of memory); the rows finished so far are saved - "
                    "run the same sweep again to resume (with jobs=1 to find the case at fault)"
                ) from None
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


# ---- the row store ---------------------------------------------------------------------------


class RowStore:
    """``DIR/rows.jsonl``: one finished case a line, appended, flushed and fsynced."""

    def __init__(self, out: Union[str, Path]):
        self.dir = Path(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / ROWS_FILE

    def load(self) -> dict[str, dict]:
        """Rows by key (the last line of a key wins). A torn last line is cut off the file."""
        rows: dict[str, dict] = {}
        if not self.path.exists():
            return rows
        data = self.path.read_bytes()
        good_end = 0
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                break  # no newline: a torn write
            line = data[pos:nl]
            pos = nl + 1
            if not line.strip():
                good_end = pos
                continue
            try:
                row = json.loads(line)
            except ValueError:
                break  # a torn write followed by nothing we can trust
            if isinstance(row, dict) and "key" in row:
                rows[row["key"]] = row
            good_end = pos
        if good_end < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
                f.flush()
                os.fsync(f.fileno())
        return rows

    def append(self, row: dict) -> None:
        line = plain_json(row) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_tables(frame: pd.DataFrame, out: Union[str, Path]) -> dict[str, Path]:
    """Write ``results.parquet`` (with the key-value metadata ``stepsim_version``) and
    ``results.csv`` atomically."""
    out = Path(out)
    paths = {"parquet": out / PARQUET_FILE, "csv": out / CSV_FILE}
    _atomic_write(paths["parquet"], lambda p: write_parquet(_parquet_safe(frame), p))
    _atomic_write(paths["csv"], lambda p: frame.to_csv(p, index=False))
    return paths


def _parquet_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """Object columns mixing types (e.g. a str axis beside numbers) become JSON strings."""
    out = frame.copy()
    for c in out.columns:
        if out[c].dtype != object:
            continue
        kinds = {type(v) for v in out[c] if v is not None and not (isinstance(v, float) and math.isnan(v))}
        mixed = len(kinds) > 1 and bool(kinds - {int, float})
        if mixed or kinds & {dict, list}:
            out[c] = [None if v is None else (v if isinstance(v, str) else canonical_json(v)) for v in out[c]]
    return out


# ---- the table -------------------------------------------------------------------------------


def flatten(summary: Optional[Mapping], prefix: str = "") -> dict:
    """A summary record as flat columns: nested mappings dotted, lists JSON-encoded."""
    out: dict = {}
    for k, v in (summary or {}).items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, name + "."))
        elif isinstance(v, (list, tuple)):
            out[name] = canonical_json(list(v))
        else:
            out[name] = v
    return out


def _axis_value(v):
    return v if v is None or isinstance(v, (bool, int, float, str)) else canonical_json(v)


def rows_frame(cases: Sequence[Case], rows: Mapping[str, dict], axes: Sequence[str]) -> pd.DataFrame:
    """The result table: one row per case with a finished row, sorted by case index."""
    records = []
    for c in cases:
        row = rows.get(c.key)
        if row is None:
            continue
        rec = {"case": c.index}
        for a in axes:
            rec[a] = _axis_value(c.axes.get(a))
        rec["status"] = row["status"]
        rec["error"] = row.get("error")
        # The version that ran the case (a resumed sweep may mix versions); None for rows
        # written before stepsim recorded it.
        rec["stepsim_version"] = row.get("stepsim_version", (row.get("summary") or {}).get("stepsim_version"))
        for k, v in flatten(row.get("summary")).items():
            rec.setdefault(k, v)
        rec["key"] = c.key
        records.append(rec)
    cols: dict[str, None] = dict.fromkeys(["case", *axes, "status", "error", "stepsim_version"])
    for r in records:
        for k in r:
            cols.setdefault(k, None)
    cols.pop("key", None)
    cols["key"] = None
    frame = pd.DataFrame.from_records(records, columns=list(cols))
    return frame.sort_values("case", kind="stable").reset_index(drop=True)


def run_cases(
    cases: Sequence[Case],
    axes: Sequence[str],
    out: Optional[Union[str, Path]] = None,
    client=None,
    jobs: Optional[int] = None,
    progress: Optional[bool] = False,
    retry_failed: bool = False,
    desc: str = "sweep",
    executor=None,
) -> tuple[pd.DataFrame, dict[str, dict]]:
    """Run the cases not already finished in ``out`` and return ``(table, rows by key)``.
    The engine under :func:`sweep` and :func:`simulator.studies.search.search`."""
    from tqdm.auto import tqdm

    store = RowStore(out) if out is not None else None
    rows = store.load() if store is not None else {}
    if retry_failed:
        rows = {k: r for k, r in rows.items() if r.get("status") != "failed"}
    wanted = {c.key for c in cases}
    todo = [c for c in cases if c.key not in rows]
    done_before = sum(1 for k in rows if k in wanted)
    by_key = {c.key: c for c in cases}
    # progress=True: shown (in a notebook too, where stderr is no terminal); None: only on a terminal
    bar = tqdm(
        total=len(cases),
        initial=done_before,
        desc=desc,
        unit="case",
        dynamic_ncols=True,
        disable=True if progress is False else (None if progress is None else False),
    )
    last_write = time.monotonic()
    failed = 0
    try:
        for row in execute([(c.index, c.key, c.scenario) for c in todo], client=client, jobs=jobs, executor=executor):
            c = by_key[row["key"]]
            row["axes"] = {a: c.axes.get(a) for a in c.axes}
            rows[row["key"]] = row
            if store is not None:
                store.append(row)
                if time.monotonic() - last_write > TABLE_REWRITE_INTERVAL_S:
                    write_tables(rows_frame(cases, rows, axes), store.dir)
                    last_write = time.monotonic()
            failed += row["status"] == "failed"
            bar.set_postfix(failed=failed, refresh=False)
            bar.update(1)
    finally:
        bar.close()
        frame = rows_frame(cases, rows, axes)
        if store is not None:
            write_tables(frame, store.dir)
    return frame, rows


def sweep(
    spec_or_path: Union[str, Path, Mapping],
    out: Optional[Union[str, Path]] = None,
    client=None,
    jobs: Optional[int] = None,
    progress: Optional[bool] = False,
    retry_failed: bool = False,
    executor=None,
) -> pd.DataFrame:
    """Run a sweep (a path to a sweep file or a mapping in that format; see the module notes)
    and return its table. With ``out``, rows are saved as they finish and a second call
    resumes. ``executor``: any :class:`concurrent.futures.Executor` (workers must run this
    stepsim version: checked); ``client``: a ``dask.distributed.Client``; ``jobs``: local processes.
    ``progress``: a progress bar (``tqdm.auto``: a widget in a notebook); ``None``: only
    when stderr is a terminal.

    ``DataFrame.attrs`` holds ``skipped`` (invalid cases left out by ``skip_invalid``),
    ``filtered`` (cases removed by ``where``) and ``duplicates``."""
    spec = load_sweep(spec_or_path)
    exp = expand(spec)
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        meta = {
            "name": spec.name,
            "axes": list(spec.axes),
            "cases": len(exp.cases),
            "skipped": exp.skipped,
            "filtered": exp.filtered,
            "duplicates": exp.duplicates,
        }
        _atomic_write(Path(out) / META_FILE, lambda p: p.write_text(canonical_json(meta)))
    frame, _ = run_cases(
        exp.cases,
        spec.axes,
        out=out,
        client=client,
        jobs=jobs,
        progress=progress,
        retry_failed=retry_failed,
        desc=spec.name,
        executor=executor,
    )
    frame.attrs.update(
        skipped=exp.skipped, filtered=exp.filtered, duplicates=exp.duplicates, axes=list(spec.axes), name=spec.name
    )
    return frame
