"""The rules of the architecture (docs/design.md, "The three packages"), checked on the
source: every ``import`` and ``from ... import`` of every module, read with ``ast``
(imports inside functions and ``TYPE_CHECKING`` blocks included), and the length of every
module and function.

* Layers: each module belongs to the layer of the longest prefix in :data:`LAYERS` and
  may import only the layers :data:`MAY_IMPORT` lists for it — the base (errors, file
  readers) imports nothing of stepsim; ``topologies`` and ``workloads`` import the base
  only (never ``simulator``, never each other); each layer of the simulator imports the
  layers below it; only the command line imports the command line.
* No ``_private`` name (or module) is imported from another package.
* The command-line modules import each other without a cycle.
* Sizes: no module of the packages over :data:`MAX_MODULE_LINES` lines, no function or
  method over :data:`MAX_FUNCTION_LINES` (:func:`size_violations`).

The simulator's sub-packages are layers of their own (network, scenario, engine, results,
the one-step facade, studies, interop, cli), each importing only those below it; a new
sub-package gets a line in :data:`LAYERS` and a place in ``_ORDER``: the rules and the
scan stay as they are.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What is scanned: the packages, and the top-level modules beside them.
PACKAGES = ("simulator", "topologies", "workloads")
TOP_MODULES = ("stepsim_errors", "stepsim_fileio")

#: Dotted module prefix -> layer; the longest matching prefix wins. The simulator's layers,
#: bottom up: the network model, the scenario (which validates against the network's
#: algorithms and calibration), the engine, the results, the one-step facade
#: (``simulator.simulate``), the studies, the readers of other tools' files, the command line.
LAYERS: dict[str, str] = {
    "stepsim_errors": "base",
    # The capped, safe file readers, beside the errors: topologies and workloads read files
    # through them without loading the simulator.
    "stepsim_fileio": "base",
    "simulator.errors": "base",
    "simulator.version": "base",
    "topologies": "topologies",
    "workloads": "workloads",
    "simulator.network": "network",
    "simulator.scenario": "scenario",
    "simulator.engine": "engine",
    "simulator.results": "results",
    "simulator.simulate": "facade",
    # the package itself: ``from simulator import simulate, Result, load_scenario``
    "simulator": "facade",
    "simulator.studies": "studies",
    "simulator.interop": "interop",
    "simulator.cli": "cli",
}

_ORDER = (
    "base",
    "topologies",
    "workloads",
    "network",
    "scenario",
    "engine",
    "results",
    "facade",
    "studies",
    "interop",
    "cli",
)


def _below(layer: str) -> frozenset[str]:
    """A simulator layer imports every layer below it and itself."""
    return frozenset(_ORDER[: _ORDER.index(layer) + 1])


#: Layer -> the layers its modules may import (itself included where it may).
MAY_IMPORT: dict[str, frozenset[str]] = {
    "base": frozenset({"base"}),
    "topologies": frozenset({"base", "topologies"}),
    "workloads": frozenset({"base", "workloads"}),
    **{layer: _below(layer) for layer in _ORDER[3:]},
}

Edge = tuple[str, str, str | None, int]  # (importer, imported module, name or None, line)


def layer_of(module: str, layers: Mapping[str, str] = LAYERS) -> str | None:
    best = max((p for p in layers if module == p or module.startswith(p + ".")), key=len, default=None)
    return None if best is None else layers[best]


def _modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            parts = p.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    for name in TOP_MODULES:
        out[name] = root / f"{name}.py"
    return out


def _imports(module: str, path: Path) -> Iterator[tuple[str, str | None, int]]:
    """``(module imported, name or None, line)`` for each import in ``path``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                yield target, alias.name, node.lineno


def import_edges(modules: Mapping[str, Path]) -> list[Edge]:
    """Every import of a stepsim module by a stepsim module: ``from a import b`` of a
    submodule ``a.b`` is an import of ``a.b``."""
    ours = tuple(dict.fromkeys(m.split(".")[0] for m in modules))
    edges = []
    for module, path in modules.items():
        for target, name, line in _imports(module, path):
            if target.split(".")[0] not in ours:
                continue
            if name is not None and f"{target}.{name}" in modules:
                target, name = f"{target}.{name}", None
            edges.append((module, target, name, line))
    return edges


def layer_violations(
    edges: Iterable[Edge], layers: Mapping[str, str] = LAYERS, may_import: Mapping[str, frozenset] = MAY_IMPORT
) -> list[str]:
    out = []
    for src, dst, name, line in edges:
        a, b = layer_of(src, layers), layer_of(dst, layers)
        if b not in may_import.get(a, ()):
            out.append(f"{src}:{line} ({a}) imports {dst}{'.' + name if name else ''} ({b})")
    return out


def _package(module: str, modules: Mapping[str, Path]) -> str:
    path = modules.get(module)
    return module if path is not None and path.name == "__init__.py" else module.rpartition(".")[0]


def private_violations(edges: Iterable[Edge], modules: Mapping[str, Path]) -> list[str]:
    """``_name`` (a function, a constant or a module) imported from another package."""
    out = []
    for src, dst, name, line in edges:
        private_name = name is not None and name.startswith("_") and not name.startswith("__")
        private_module = dst.rpartition(".")[2].startswith("_") and not dst.endswith("__init__")
        if (private_name or private_module) and _package(src, modules) != _package(dst, modules):
            out.append(f"{src}:{line} imports {dst}{'.' + name if name else ''} from another package")
    return out


def cycles(edges: Iterable[Edge], among: set[str]) -> list[list[str]]:
    """Import cycles among the modules ``among`` (each cycle once, from its smallest name)."""
    graph: dict[str, set[str]] = {m: set() for m in among}
    for src, dst, _, _ in edges:
        if src in among and dst in among and src != dst:
            graph[src].add(dst)
    found, seen = [], set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt == path[0]:
                cyc = tuple(path)
                key = frozenset(cyc)
                if key not in seen:
                    seen.add(key)
                    found.append(list(cyc) + [nxt])
            elif nxt not in path and nxt > path[0]:
                walk(nxt, path + [nxt])

    for start in sorted(graph):
        walk(start, [start])
    return found


MODULES = _modules()
EDGES = import_edges(MODULES)


def test_every_module_has_a_layer():
    assert len(MODULES) > 40 and all(layer_of(m) in MAY_IMPORT for m in MODULES), [
        m for m in MODULES if layer_of(m) not in MAY_IMPORT
    ]


def test_each_layer_imports_only_the_layers_below_it():
    assert not layer_violations(EDGES), "\n".join(layer_violations(EDGES))


def test_no_private_name_is_imported_from_another_package():
    assert not private_violations(EDGES, MODULES), "\n".join(private_violations(EDGES, MODULES))


def test_no_module_imports_itself_in_a_circle():
    """No import circle anywhere in the packages (imports inside functions included): a module
    that needs another's names takes them from a module below both."""
    assert cycles(EDGES, set(MODULES)) == []


def test_the_command_line_modules_import_each_other_without_a_cycle():
    cli = {m for m in MODULES if layer_of(m) == "cli"}
    assert len(cli) >= 4 and not cycles(EDGES, cli), cycles(EDGES, cli)


def test_the_rules_catch_what_they_forbid():
    """Each rule fails on a made-up import that breaks it."""
    fake = {
        "simulator": Path("simulator/__init__.py"),
        "simulator.cli.app": Path("simulator/cli/app.py"),
        "simulator.cli.sweep": Path("simulator/cli/sweep.py"),
        "simulator.scenario.schema": Path("simulator/scenario/schema.py"),
        "workloads.trace.builder": Path("workloads/trace/builder.py"),
        "topologies.io": Path("topologies/io.py"),
    }
    assert layer_violations([("workloads.trace.builder", "simulator.scenario.schema", "ScenarioError", 1)])
    assert layer_violations([("topologies.io", "workloads.trace.builder", None, 1)])
    assert layer_violations([("simulator.scenario.schema", "simulator.cli.app", "CliError", 1)])
    assert not layer_violations(
        [
            ("simulator.cli.app", "simulator.scenario.schema", "load_scenario", 1),
            ("workloads.trace.builder", "stepsim_errors", "StepsimError", 1),
            ("topologies.io", "stepsim_fileio", "read_text", 1),
        ]
    )
    assert private_violations([("simulator.scenario.schema", "workloads.trace.builder", "_helper", 1)], fake)
    assert not private_violations([("simulator.cli.app", "simulator.scenario.schema", "resolve_cluster", 1)], fake)
    assert private_violations([("simulator.cli.app", "simulator.scenario.schema", "_resolve", 1)], fake)
    assert not private_violations([("simulator.scenario.schema", "simulator.scenario.schema", "_resolve", 1)], fake)
    assert cycles(
        [("simulator.cli.app", "simulator.cli.sweep", None, 1), ("simulator.cli.sweep", "simulator.cli.app", None, 2)],
        {"simulator.cli.app", "simulator.cli.sweep"},
    ) == [["simulator.cli.app", "simulator.cli.sweep", "simulator.cli.app"]]
    assert layer_of("simulator.cli.sweep") == "cli" and layer_of("simulator.studies.sweep") == "studies"
    # the simulator's layers import downwards only: the engine never reaches the studies
    assert layer_violations([("simulator.engine.loop", "simulator.studies.sweep", "run_sweep", 1)])
    assert layer_violations([("simulator.network.flows", "simulator.engine.loop", "Engine", 1)])
    assert not layer_violations([("simulator.studies.sweep", "simulator.engine.loop", "Engine", 1)])


def test_the_slow_marker_is_registered(pytestconfig):
    """``-m "not slow"`` (the fast tier) selects on a marker pyproject.toml declares, so a
    typo in ``@pytest.mark.slow`` fails under ``--strict-markers`` instead of running."""
    assert any(m.startswith("slow:") for m in pytestconfig.getini("markers"))


def _subpackages(root: Path = ROOT) -> set[str]:
    """The simulator's sub-packages on disk (folders with an ``__init__.py``)."""
    return {p.parent.name for p in (root / "simulator").glob("*/__init__.py")}


def test_the_design_doc_and_architecture_page_map_every_sub_package():
    """docs/design.md's layer table and docs/architecture.md's package table name exactly the simulator's
    sub-packages on disk, and each sub-package is a layer of :data:`LAYERS`: the map a
    newcomer reads matches the tree."""
    import re

    on_disk = _subpackages()
    assert on_disk, "no sub-packages found under simulator/"
    for doc in ("docs/design.md", "docs/architecture.md"):
        named = set(re.findall(r"^\s*\| (?:\w+ \| )?`simulator/(\w+)/`", (ROOT / doc).read_text(), re.M))
        assert named == on_disk, f"{doc}: the table names {sorted(named)}, the tree has {sorted(on_disk)}"
    assert {m.split(".")[1] for m in LAYERS if m.count(".") == 1 and m.startswith("simulator.")} >= on_disk


# ---- sizes: no module over MAX_MODULE_LINES, no function over MAX_FUNCTION_LINES ----------

MAX_MODULE_LINES = 600
#: A function's lines run from its ``def`` (decorators excluded) to its last line, docstring
#: included; a long table of constants is no function and may be as long as it needs.
MAX_FUNCTION_LINES = 80
#: ``path::qualified name`` of the functions let past :data:`MAX_FUNCTION_LINES` (none today).
LONG_FUNCTIONS_ALLOWED: frozenset[str] = frozenset()


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """``(qualified name, node)`` of every function and method in ``tree``, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                yield name, node
            yield from _functions(node, f"{name}.")
        else:
            yield from _functions(node, prefix)


def size_violations(
    label: str,
    source: str,
    max_module: int = MAX_MODULE_LINES,
    max_function: int = MAX_FUNCTION_LINES,
    allowed: frozenset = LONG_FUNCTIONS_ALLOWED,
) -> list[str]:
    """The module ``label`` (its path) if ``source`` is over ``max_module`` lines, and each of
    its functions over ``max_function`` lines that ``allowed`` does not name."""
    out = []
    lines = len(source.splitlines())
    if lines > max_module:
        out.append(f"{label}: {lines} lines (a module has at most {max_module}: split it by job)")
    for name, node in _functions(ast.parse(source, label)):
        length = node.end_lineno - node.lineno + 1
        if length > max_function and f"{label}::{name}" not in allowed:
            out.append(
                f"{label}:{node.lineno}: {name} is {length} lines (a function has at most {max_function}: "
                "split it into functions with one job each)"
            )
    return out


def test_no_module_over_600_lines_and_no_function_over_80():
    found = []
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            found += size_violations(p.relative_to(ROOT).as_posix(), p.read_text())
    assert not found, "\n".join(found)


def test_the_size_rule_catches_long_modules_and_functions():
    """A made-up module over the limits fails; the same within them (or exempted) passes."""

    def body(indent: int) -> str:
        return "".join(f"{' ' * indent}x{i} = {i}\n" for i in range(6))

    src = "@decorator\ndef f():\n" + body(4) + "\n\nclass C:\n    def m(self):\n" + body(8)
    src += "        def inner():\n" + body(12)
    found = size_violations("pkg/mod.py", src, max_module=100, max_function=5)
    assert len(found) == 3, found
    assert "pkg/mod.py:2: f is 7 lines" in found[0]  # from its `def`, not its decorator
    assert "C.m is 14 lines" in found[1] and "C.m.inner is 7 lines" in found[2]
    assert not size_violations("pkg/mod.py", src, max_module=100, max_function=14, allowed=frozenset())
    at_seven = size_violations("pkg/mod.py", src, max_module=100, max_function=7, allowed=frozenset())
    assert [v.partition(" (")[0] for v in at_seven] == ["pkg/mod.py:12: C.m is 14 lines"]
    assert not size_violations(
        "pkg/mod.py", src, max_module=100, max_function=7, allowed=frozenset({"pkg/mod.py::C.m"})
    )
    assert size_violations("pkg/mod.py", src, max_module=10, max_function=14) == [
        f"pkg/mod.py: {len(src.splitlines())} lines (a module has at most 10: split it by job)"
    ]
    # a long table of constants is not a function
    table = "TABLE = {\n" + "".join(f"    {i}: {i},\n" for i in range(200)) + "}\n"
    assert not size_violations("pkg/table.py", table, max_module=600, max_function=5)


def unnamed_modules(package_dir: Path) -> list[str]:
    """The modules and sub-packages of ``package_dir`` that its ``__init__`` docstring does
    not name (as ``:mod:`.name``` or the bare name as a word)."""
    import re

    doc = ast.get_docstring(ast.parse((package_dir / "__init__.py").read_text())) or ""
    names = [p.stem for p in package_dir.glob("*.py") if p.stem != "__init__"]
    names += [p.name for p in package_dir.iterdir() if (p / "__init__.py").exists()]
    return sorted(n for n in names if not re.search(rf"(?<!\w){re.escape(n)}(?!\w)", doc))


def test_every_module_is_named_in_its_package_docstring():
    """A newcomer reads a package's ``__init__`` first: it names every module beside it
    (and every sub-package), each with its job."""
    found = []
    for pkg in PACKAGES:
        for init in sorted((ROOT / pkg).rglob("__init__.py")):
            missing = unnamed_modules(init.parent)
            if missing:
                found.append(f"{init.parent.relative_to(ROOT).as_posix()}: {', '.join(missing)}")
    assert not found, "\n".join(found)


def test_the_docstring_rule_catches_an_unnamed_module(tmp_path):
    (tmp_path / "__init__.py").write_text('"""* :mod:`.named` — a module."""\n')
    (tmp_path / "named.py").write_text("")
    (tmp_path / "forgotten.py").write_text("")
    assert unnamed_modules(tmp_path) == ["forgotten"]


# ---- schedules: one module each (workloads/pipeline/), no name compared elsewhere -----------


def schedule_name_comparisons(module: str, source: str, own: Iterable[str] = ()) -> list[str]:
    """``module:line`` of each comparison of a schedule's name (``== "dualpipe"``,
    ``in ("gpipe", "1f1b")``, ``case "zb-h1":``) and each table keyed by one
    (``{"1f1b": ...}``) in ``source``, other than of the names in ``own``: a schedule's
    behaviour belongs to its own module of :mod:`workloads.pipeline`, asked through its hooks."""
    from workloads.enums import SCHEDULES

    foreign = set(SCHEDULES) - set(own)

    def names(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in foreign
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names(e) for e in node.elts)
        return False

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):  # == "dualpipe", in ("gpipe", "1f1b")
            listed = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):  # a table keyed by schedule
            listed = [k for k in node.keys if k is not None]
        else:
            listed = []
        if any(names(x) for x in listed):
            out.append(f"{module}:{node.lineno}")
        if isinstance(node, ast.match_case) and any(
            isinstance(p, ast.MatchValue) and names(p.value) for p in ast.walk(node.pattern)
        ):
            out.append(f"{module}:{node.pattern.lineno}")
    return out


def test_no_schedule_name_is_compared_outside_its_module():
    """Outside :mod:`workloads.pipeline` no module compares a schedule's name; inside it, a
    schedule's module compares its own name only."""
    from workloads.pipeline import REGISTRY

    own: dict[str, set[str]] = {}
    for s in REGISTRY.values():
        own.setdefault(type(s).__module__, set()).add(s.name)
    found = []
    for module, path in MODULES.items():
        if module == "workloads.enums":
            continue
        found += schedule_name_comparisons(module, path.read_text(), own.get(module, ()))
    assert found == []


def test_the_schedule_rule_catches_a_comparison():
    src = 'def f(name):\n    if name == "dualpipe":\n        return 1\n    return 2 if name in ("gpipe", "x") else 3\n'
    assert schedule_name_comparisons("m", src) == ["m:2", "m:4"]
    assert schedule_name_comparisons("m", src, own=("dualpipe",)) == ["m:4"]
    assert schedule_name_comparisons("m", 'x = {"schedule": "1f1b"}\n') == []
    assert schedule_name_comparisons("m", 'PERIOD = {"1f1b": 2, "dualpipe": 4}\n') == ["m:1"]
    match = 'match name:\n    case "zb-h1" | "1f1b":\n        pass\n    case _:\n        pass\n'
    assert schedule_name_comparisons("m", match) == ["m:2"]


# ---- one error signature (the check itself is tests/test_errors.py's) ----------------------


def test_every_error_class_has_the_one_signature():
    """Every StepsimError subclass of the packages is built ``Error(message, *, field=None)``."""
    from test_errors import _all_error_classes, signature_faults

    assert [f for cls in sorted(_all_error_classes(), key=lambda c: c.__name__) for f in signature_faults(cls)] == []
