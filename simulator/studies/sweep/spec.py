"""The sweep file: its schema (:func:`load_sweep`, :class:`SweepSpec`), the dotted scenario keys
its axes name (:func:`scenario_key_tree`, :func:`set_dotted`, :func:`get_dotted`) and its
``where`` expressions (:func:`eval_where`). The format is described in :mod:`simulator.studies.sweep`
and ``docs/formats.md``.
"""

from __future__ import annotations

import ast
import copy
import difflib
import itertools
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.scenario.loading import builtin_file, read_mapping
from simulator.scenario.schema import MAX_NAME_CHARS, ScenarioError
from workloads.enums import TRACE_COLLECTIVE_OPS

SWEEP_KEYS = ("name", "base", "grid", "cases", "skip_invalid", "where")
MAX_SWEEP_CASES = 100_000  # cases before `where`; a larger sweep is refused before it is expanded


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
    base_dir: Path | None = None  # where relative paths inside the base are resolved


@dataclass(frozen=True)
class Case:
    """One scenario of a sweep."""

    index: int
    axes: dict
    scenario: dict
    key: str
    resolved: dict | None = None  # scenario_to_dict of the loaded scenario; None if it does not load


def load_sweep(spec_or_path: str | Path | Mapping) -> SweepSpec:
    """Parse a sweep file (YAML/JSON path) or mapping. Raises :class:`ScenarioError`
    naming the sweep key at fault."""
    data, sweep_dir, default_name = _read_sweep(spec_or_path)
    sweep_file = Path(spec_or_path) if isinstance(spec_or_path, (str, Path)) else None
    base, base_dir = _load_base(data, sweep_dir, sweep_file)
    grid_rows = _grid_rows(data)
    case_rows = _case_rows(data)
    if data.get("grid") is None and data.get("cases") is None:
        raise ScenarioError("a sweep needs 'grid' and/or 'cases'", field="grid")
    assignments = tuple({**c, **g} for c in case_rows for g in grid_rows)
    axes: dict[str, None] = {}
    for a in assignments:
        for k in a:
            axes.setdefault(k, None)
    where = _where_list(data)
    skip = data.get("skip_invalid", False)
    if not isinstance(skip, bool):
        raise ScenarioError(f"must be true or false, got {skip!r}", field="skip_invalid")
    name = str(data.get("name") or default_name)
    if len(name) > MAX_NAME_CHARS:
        raise ScenarioError(f"at most {MAX_NAME_CHARS} characters, got {len(name):,}", field="name")
    return SweepSpec(
        name=name,
        base=base,
        assignments=assignments,
        axes=tuple(axes),
        skip_invalid=skip,
        where=tuple(where),
        base_dir=base_dir,
    )


def _read_sweep(spec_or_path) -> tuple[dict, Path | None, str]:
    """The sweep's mapping, the folder of its file (None for a mapping) and its default name;
    refuses unknown sweep keys."""
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
        raise ScenarioError(f"a sweep is a path or a mapping, got {type(spec_or_path).__name__}", field="")
    for k in data:
        if k not in SWEEP_KEYS:
            raise ScenarioError(f"unknown sweep key; allowed: {', '.join(SWEEP_KEYS)}", field=k)
    return data, sweep_dir, default_name


def _load_base(data: Mapping, sweep_dir: Path | None, sweep_file: Path | None = None) -> tuple[dict, Path | None]:
    """The base scenario mapping (read from its file when a path) and the folder its relative
    paths are resolved in; a base naming the sweep file itself is refused."""
    if "base" not in data:
        raise ScenarioError(
            "required: a scenario path (relative to the sweep file), a built-in scenario name or a mapping",
            field="base",
        )
    base, base_dir = data["base"], sweep_dir
    if isinstance(base, str):
        p = Path(base)
        if not p.is_absolute() and sweep_dir is not None:
            p = sweep_dir / p
        p = builtin_file(base, p) or p  # a built-in scenario's name, where no such file is
        if sweep_file is not None and _same_file(p, sweep_file):
            raise ScenarioError(f"names the sweep file itself ({base}); give a scenario file or mapping", field="base")
        base = read_mapping(p)
        base_dir = p.resolve().parent
    elif not isinstance(base, Mapping):
        raise ScenarioError(
            f"must be a scenario path, a built-in scenario name or a mapping, got {type(base).__name__}", field="base"
        )
    return copy.deepcopy(dict(base)), base_dir


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except (OSError, ValueError):  # either missing or unreadable: reading it says so
        return False


def _grid_rows(data: Mapping) -> list[dict]:
    """The product of the ``grid`` value lists (``[{}]`` without a grid), refusing a sweep of
    more than :data:`MAX_SWEEP_CASES` cases before expanding it."""
    grid = data.get("grid")
    if grid is None:
        return [{}]
    if not isinstance(grid, Mapping) or not grid:
        raise ScenarioError("must be a non-empty mapping of dotted scenario keys to value lists", field="grid")
    for k, v in grid.items():
        _check_axis_key(k, "grid")
        if not isinstance(v, list) or not v:
            raise ScenarioError(f"must be a non-empty list of values, got {v!r}", field=f"grid.{k}")
    keys = list(grid)
    n_grid = math.prod(len(grid[k]) for k in keys) * (
        len(data["cases"]) if isinstance(data.get("cases"), list) and data["cases"] else 1
    )
    if n_grid > MAX_SWEEP_CASES:
        raise ScenarioError(
            f"the sweep would have {n_grid:,} cases "
            f"({' x '.join(str(len(grid[k])) for k in keys)}"
            f"{' x cases' if data.get('cases') else ''}); the limit is "
            f"{MAX_SWEEP_CASES:,}: split it or use `where`",
            field="grid",
        )
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def _case_rows(data: Mapping) -> list[dict]:
    """The explicit ``cases`` list, checked (``[{}]`` without one)."""
    cases = data.get("cases")
    if cases is None:
        return [{}]
    if not isinstance(cases, list) or not cases:
        raise ScenarioError("must be a non-empty list of mappings {dotted key: value}", field="cases")
    if len(cases) > MAX_SWEEP_CASES:
        raise ScenarioError(
            f"{len(cases):,} cases; the limit is {MAX_SWEEP_CASES:,}: split the sweep into several files", field="cases"
        )
    case_rows = []
    for i, c in enumerate(cases):
        if not isinstance(c, Mapping):
            raise ScenarioError(f"must be a mapping of dotted keys to values, got {c!r}", field=f"cases[{i}]")
        for k in c:
            _check_axis_key(k, f"cases[{i}]")
        case_rows.append(dict(c))
    return case_rows


def _where_list(data: Mapping) -> list[str]:
    """The ``where`` expressions as a list, each parsed (and refused if not allowed)."""
    where = data.get("where", [])
    if isinstance(where, str):
        where = [where]
    if not isinstance(where, list) or not all(isinstance(w, str) for w in where):
        raise ScenarioError(f"must be an expression or a list of expressions, got {where!r}", field="where")
    for i, w in enumerate(where):
        _parse_where(w, f"where[{i}]")
    return where


def _check_axis_key(k, where: str) -> None:
    if not isinstance(k, str) or not k or any(not part for part in k.split(".")):
        raise ScenarioError(f"axis keys are dotted scenario keys such as parallel.pp, got {k!r}", field=where)
    node = scenario_key_tree()
    parts = k.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            prefix = ".".join(parts[:i])
            if not isinstance(node, dict):
                raise ScenarioError(f"{prefix} takes a value, not keys inside it", field=f"{where}.{k}")
            sibling = difflib.get_close_matches(part, sorted(node), n=1, cutoff=0.5)
            if sibling:
                close = ".".join(parts[:i] + sibling)
            else:
                close = next(
                    iter(difflib.get_close_matches(k, list(_all_paths(scenario_key_tree())), n=1, cutoff=0.6)), None
                )
            hint = f" (did you mean {close}?)" if close else ""
            raise ScenarioError(
                f"no scenario key {part!r} in {prefix or 'the scenario'}{hint}; "
                f"allowed there: {', '.join(sorted(node))}",
                field=f"{where}.{k}",
            )
        node = node[part]


def _all_paths(tree: dict, prefix: str = ""):
    for k, v in tree.items():
        yield prefix + k
        if isinstance(v, dict):
            yield from _all_paths(v, prefix + k + ".")


_KEY_TREE: dict | None = None


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
    set_dotted_in_place(out, key, value)
    return out


def set_dotted_in_place(out: dict, key: str, value: Any) -> None:
    """:func:`set_dotted` on ``out`` itself (a mapping the caller owns: the mappings on the
    key's way are replaced by copies, ``value`` is deep-copied): one deep copy of a scenario
    serves several keys."""
    parts = key.split(".")
    node = out
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = {}
        elif isinstance(nxt, str):
            nxt = {"preset": nxt}
        elif not isinstance(nxt, dict):
            raise ScenarioError(f"cannot set a key inside {'.'.join(parts[: i + 1])} = {nxt!r}", field=key)
        node[part] = nxt = dict(nxt)
        node = nxt
    node[parts[-1]] = copy.deepcopy(value)


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

#: Largest exponent in a ``where`` expression: ``9**9**9**9`` ran for hours building one integer.
MAX_WHERE_EXPONENT = 64


def _pow(a, b):
    if isinstance(b, (int, float)) and abs(b) > MAX_WHERE_EXPONENT:
        raise ValueError(f"exponents are limited to {MAX_WHERE_EXPONENT}, got {b!r}")
    return operator.pow(a, b)


def _mul(a, b):
    if isinstance(a, (str, list)) or isinstance(b, (str, list)):  # 'a' * 10**10: gigabytes
        raise TypeError("a string or list cannot be repeated")
    return operator.mul(a, b)


def _mod(a, b):
    if isinstance(a, str):  # '%0999999999d' % 1: printf-style formatting
        raise TypeError("a string cannot be formatted")
    return operator.mod(a, b)


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: _mod,
    ast.Pow: _pow,
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
        raise ScenarioError(f"not a valid expression {expr!r}: {err.msg}", field=field) from None
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
                f"{type(node).__name__} not allowed in {expr!r}; use literals, dotted keys, "
                "arithmetic, comparisons, and/or/not",
                field=field,
            )
    return tree


def _dotted_name(node) -> str | None:
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
                raise ScenarioError(f"only dotted keys may be looked up in {expr!r}", field=field)
            try:
                return lookup(name)
            except KeyError:
                raise ScenarioError(f"unknown key {name!r} in {expr!r}", field=field) from None
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
        raise ScenarioError(f"{type(node).__name__} not allowed in {expr!r}", field=field)  # pragma: no cover

    try:
        return bool(ev(tree))
    except ScenarioError:
        raise
    except (TypeError, ZeroDivisionError, ValueError, OverflowError) as err:
        raise ScenarioError(f"cannot evaluate {expr!r}: {err}", field=field) from None
