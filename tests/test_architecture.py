"""The import rules of the architecture (docs/design.md, "The three packages"), checked on
the source: every ``import`` and ``from ... import`` of every module, read with ``ast``
(imports inside functions and ``TYPE_CHECKING`` blocks included).

* Layers: each module belongs to the layer of the longest prefix in :data:`LAYERS` and
  may import only the layers :data:`MAY_IMPORT` lists for it — the base (errors, file
  readers) imports nothing of stepsim; ``topologies`` and ``workloads`` import the base
  only (never ``simulator``, never each other); the simulator imports all three; only the
  command line imports the command line.
* No ``_private`` name (or module) is imported from another package.
* The command-line modules import each other without a cycle.

When ``simulator/`` is split into layered sub-packages (``simulator/scenario``,
``engine``, ``network``, ``results``, ``studies``, ``cli``), edit :data:`LAYERS` and
:data:`MAY_IMPORT` only: the rules and the scan stay as they are.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Optional

ROOT = Path(__file__).resolve().parent.parent
#: What is scanned: the packages, and the top-level modules beside them.
PACKAGES = ("simulator", "topologies", "workloads")
TOP_MODULES = ("stepsim_errors",)

#: Dotted module prefix -> layer; the longest matching prefix wins.
LAYERS: dict[str, str] = {
    "stepsim_errors": "base",
    # The capped, safe file readers. In simulator/ for now, but below the packages: topologies
    # and workloads import it (inside functions: importing simulator/ loads the simulator).
    "simulator.fileio": "base",
    "topologies": "topologies",
    "workloads": "workloads",
    "simulator": "simulator",
    "simulator.cli": "cli",
    "simulator.cli_common": "cli",
    "simulator.cli_sweep": "cli",
    "simulator.cli_validate": "cli",
    "simulator.cli_ppmap": "cli",
}

#: Layer -> the layers its modules may import (itself included where it may).
MAY_IMPORT: dict[str, frozenset[str]] = {
    "base": frozenset({"base"}),
    "topologies": frozenset({"base", "topologies"}),
    "workloads": frozenset({"base", "workloads"}),
    "simulator": frozenset({"base", "topologies", "workloads", "simulator"}),
    "cli": frozenset({"base", "topologies", "workloads", "simulator", "cli"}),
}

Edge = tuple[str, str, Optional[str], int]  # (importer, imported module, name or None, line)


def layer_of(module: str, layers: Mapping[str, str] = LAYERS) -> Optional[str]:
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


def _imports(module: str, path: Path) -> Iterator[tuple[str, Optional[str], int]]:
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


def test_the_command_line_modules_import_each_other_without_a_cycle():
    cli = {m for m in MODULES if layer_of(m) == "cli"}
    assert len(cli) >= 4 and not cycles(EDGES, cli), cycles(EDGES, cli)


def test_the_rules_catch_what_they_forbid():
    """Each rule fails on a made-up import that breaks it."""
    fake = {
        "simulator": Path("simulator/__init__.py"),
        "simulator.cli": Path("simulator/cli.py"),
        "simulator.cli_sweep": Path("simulator/cli_sweep.py"),
        "simulator.schema": Path("simulator/schema.py"),
        "workloads.trace": Path("workloads/trace.py"),
        "topologies.io": Path("topologies/io.py"),
    }
    assert layer_violations([("workloads.trace", "simulator.schema", "ScenarioError", 1)])
    assert layer_violations([("topologies.io", "workloads.trace", None, 1)])
    assert layer_violations([("simulator.schema", "simulator.cli", "CliError", 1)])
    assert not layer_violations(
        [
            ("simulator.cli", "simulator.schema", "load_scenario", 1),
            ("workloads.trace", "stepsim_errors", "StepsimError", 1),
            ("topologies.io", "simulator.fileio", "read_text", 1),
        ]
    )
    assert private_violations([("simulator.schema", "workloads.trace", "_helper", 1)], fake)
    assert not private_violations([("simulator.cli", "simulator.schema", "_resolve_cluster", 1)], fake)
    assert cycles(
        [("simulator.cli", "simulator.cli_sweep", None, 1), ("simulator.cli_sweep", "simulator.cli", None, 2)],
        {"simulator.cli", "simulator.cli_sweep"},
    ) == [["simulator.cli", "simulator.cli_sweep", "simulator.cli"]]
    assert layer_of("simulator.cli_sweep") == "cli" and layer_of("simulator.sweep") == "simulator"


def test_the_slow_marker_is_registered(pytestconfig):
    """``-m "not slow"`` (the fast tier) selects on a marker pyproject.toml declares, so a
    typo in ``@pytest.mark.slow`` fails under ``--strict-markers`` instead of running."""
    assert any(m.startswith("slow:") for m in pytestconfig.getini("markers"))
