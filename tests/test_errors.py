"""One error hierarchy (issue 16 item 3): every bad-input error is a StepsimError with a
``field``; the command line maps it (and OSError) to exit 2, anything else to exit 1."""

from __future__ import annotations

import pickle

import pytest

from simulator.cli import app as cli
from simulator.cli import common as cli_common
from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError
from stepsim_errors import StepsimError

ERROR_CLASSES = [
    ("topologies.errors", "TopologyError"),
    ("topologies.errors", "UnknownPresetError"),
    ("workloads.errors", "WorkloadError"),
    ("workloads.layout", "LayoutError"),
    ("workloads.schedules", "ScheduleError"),
    ("workloads.trace.ops", "TraceError"),
    ("simulator.scenario.schema", "ScenarioError"),
    ("stepsim_fileio", "InputFileError"),
    ("simulator.network.flows", "NetworkError"),
    ("simulator.network.collectives", "CollectiveError"),
    ("simulator.network.calibration", "CalibrationError"),
    ("simulator.studies.bench", "BenchError"),
    ("simulator.results.html_data", "ReportError"),
    ("simulator.studies.sweep.plots", "PlotError"),
    ("simulator.errors", "StudyError"),
    ("simulator.studies.validate", "ValidationError"),
    ("simulator.studies.sweep.executors", "WorkerVersionError"),
    ("simulator.studies.sweep.executors", "WorkerLostError"),
    ("simulator.studies.sweep.executors", "ExecutorError"),
    ("simulator.results.outdir", "OutputPathError"),
    ("simulator.studies.calibrate", "CalibrationInputError"),
    ("simulator.studies.goodput", "GoodputError"),
    ("simulator.interop.kineto", "KinetoTraceError"),
    ("simulator.interop.nccl_tests", "NcclTestsError"),
    ("simulator.cli.common", "CliError"),
    ("simulator.cli.app", "CliError"),
]


@pytest.mark.parametrize("module,name", ERROR_CLASSES)
def test_every_error_class_is_a_stepsim_error_and_a_value_error(module, name):
    import importlib

    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, StepsimError) and issubclass(cls, ValueError)


def _all_error_classes() -> set[type]:
    """Every subclass of StepsimError defined in stepsim's own modules (all imported)."""
    import importlib
    import pkgutil

    importlib.import_module("stepsim_fileio")
    for package in ("simulator", "topologies", "workloads"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name.endswith("__main__"):  # running it is the command line
                continue
            try:
                importlib.import_module(info.name)
            except ImportError:  # an optional dependency (plotly) that is not installed
                continue
    found, todo = set(), [StepsimError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.split(".")[0] in ("simulator", "topologies", "workloads", "stepsim_fileio"):
                found.add(sub)
            todo.append(sub)
    return found


def test_every_error_class_is_in_the_documented_tree():
    """The tree in stepsim_errors' docstring names every StepsimError subclass, and this
    file's ERROR_CLASSES lists each one: a new error class is documented where users look."""
    import stepsim_errors

    classes = _all_error_classes()
    assert len(classes) >= 20
    tree = stepsim_errors.__doc__
    assert sorted(c.__name__ for c in classes if c.__name__ not in tree) == []
    listed = {name for _, name in ERROR_CLASSES}
    assert sorted(c.__name__ for c in classes if c.__name__ not in listed) == []


def test_an_error_keeps_its_field_across_layers_and_processes():
    with pytest.raises(ScenarioError) as e:  # a LayoutError of workloads, re-raised by the schema
        load_scenario(
            {
                "model": "llama3-8b",
                "cluster": "dgx-h100",
                "parallel": {"tp": 8, "order": "tp-dp-pp-cp"},
                "training": {"global_batch_size": 8},
            }
        )
    assert e.value.field == "parallel.order" and str(e.value).startswith("parallel.order: ")
    back = pickle.loads(pickle.dumps(e.value))  # sweeps and validation runs send errors between processes
    assert type(back) is ScenarioError and str(back) == str(e.value) and back.field == e.value.field


def test_from_error_names_the_field_once():
    from workloads.errors import WorkloadError

    err = ScenarioError.from_error(WorkloadError("must be > 0", field="training.seq_len"))
    assert (
        str(err) == "training.seq_len: must be > 0" and err.field == "training.seq_len" and err.reason == "must be > 0"
    )
    assert str(ScenarioError.from_error(StepsimError("no field here"), "cluster")) == "cluster: no field here"


def _failing_command(exc):
    def run(args):
        raise exc

    return run


@pytest.mark.parametrize(
    "exc,code",
    [
        (ScenarioError("bad", field="parallel.tp"), 2),
        (OSError("disk full"), 2),
        (ValueError("a bug"), 1),
        (KeyError("a bug"), 1),
        (ZeroDivisionError(), 1),
    ],
)
def test_the_command_line_maps_only_stepsim_errors_and_os_errors_to_exit_2(monkeypatch, capsys, exc, code):
    ap, sub = cli_common.new_parser()
    sub.add_parser("boom").set_defaults(func=_failing_command(exc))
    monkeypatch.delenv(cli_common.DEBUG_ENV, raising=False)
    assert cli_common.run(ap, ["boom"]) == code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("stepsim: error: " if code == 2 else "stepsim: internal error: ")
    if code == 1:
        assert cli_common.DEBUG_ENV in lines[0]
        monkeypatch.setenv(cli_common.DEBUG_ENV, "1")
        assert cli_common.run(ap, ["boom"]) == 1
        assert "Traceback" in capsys.readouterr().err


def test_cli_exit_codes_are_the_shared_ones():
    assert (cli.EXIT_OK, cli.EXIT_INTERNAL, cli.EXIT_BAD_INPUT) == (0, 1, 2) and cli.CliError is cli_common.CliError


def test_each_choice_is_defined_once_and_offered_everywhere():
    """The enums of workloads.enums are what the schema accepts, the planner plans, the
    trace files hold and the command line offers."""
    import typing

    from simulator.cli.app import build_parser
    from simulator.network import collectives
    from simulator.scenario import schema
    from workloads import enums, memory, schedules
    from workloads.trace import io as trace_io

    assert collectives.OPS == enums.COLLECTIVE_OPS and set(collectives.VALID_ALGORITHMS) == set(enums.COLLECTIVE_OPS)
    assert schedules.SCHEDULES == enums.SCHEDULES and memory.RECOMPUTE_MODES == enums.RECOMPUTE_MODES
    assert trace_io._COLLS == enums.TRACE_COLLECTIVE_OPS
    fields = schema.TrainingIn.model_fields
    assert typing.get_args(fields["recompute"].annotation) == enums.RECOMPUTE_MODES
    assert typing.get_args(fields["balance"].annotation) == enums.BALANCE_MODES
    assert typing.get_args(schema.ScenarioIn.model_fields["schedule"].annotation) == enums.SCHEDULES
    key = typing.get_args(schema.ScenarioIn.model_fields["algorithms"].annotation)[0]
    assert typing.get_args(key) == enums.TRACE_COLLECTIVE_OPS
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    op = next(a for a in sub.choices["collective"]._actions if a.dest == "op")
    assert tuple(op.choices) == enums.COLLECTIVE_OPS


def test_a_dependency_on_a_rank_not_simulated_is_named():
    """Cross-rank dependencies are tags resolved once every program is built; a stage built
    without the one it receives from waits for a tag nobody defines."""
    from helpers import scenario

    from simulator.scenario.loading import load_scenario
    from workloads.trace.builder import build_trace
    from workloads.trace.ops import TraceError

    sc = load_scenario(
        scenario(
            cluster={"preset": "dgx-h100", "devices": 16},
            parallel={"tp": 8, "pp": 2, "dp": 1},
            training={"global_batch_size": 4},
        )
    )
    assert build_trace(sc.workload(), ranks=[0, 8]).ops  # both stages: every tag resolves
    with pytest.raises(TraceError, match=r"on rank 8\) waits for \('F', 0, 0, 0\), which no simulated rank"):
        build_trace(sc.workload(), ranks=[8])


def signature_faults(cls: type) -> list[str]:
    """How ``cls.__init__`` departs from the one signature ``(message, *, field=None, ...)``:
    one positional parameter, ``message`` (it may have a default), then keyword-only ones,
    among them ``field`` defaulting to None."""
    import inspect

    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    faults = []
    if [p.name for p in positional] != ["message"]:
        faults.append(f"{cls.__name__}: positional parameters {[p.name for p in positional]}, want ['message']")
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        faults.append(f"{cls.__name__}: *args")
    field = next((p for p in params if p.name == "field"), None)
    if field is None or field.kind is not field.KEYWORD_ONLY or field.default is not None:
        faults.append(f"{cls.__name__}: field must be keyword-only, default None")
    return faults


def test_every_error_has_the_one_signature():
    """Issue 42: ``(message, *, field=None)`` everywhere, so a call reads the same for every
    class (ScenarioError and WorkloadError put the field in front of the message)."""
    assert [f for cls in sorted(_all_error_classes(), key=lambda c: c.__name__) for f in signature_faults(cls)] == []
    assert signature_faults(StepsimError) == []


def test_the_signature_rule_catches_the_old_forms():
    class FieldFirst(StepsimError):
        def __init__(self, field, message):
            super().__init__(message, field=field)

    class PositionalField(StepsimError):
        def __init__(self, message, field=None):
            super().__init__(message, field=field)

    assert signature_faults(FieldFirst) and signature_faults(PositionalField)
    err = ScenarioError("must be > 0", field="parallel.tp")
    assert str(err) == "parallel.tp: must be > 0" and err.field == "parallel.tp"
