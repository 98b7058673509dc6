"""The validation suite: simulate published training runs and compare.

Each case is a YAML file under ``validation/`` (one folder per source; installed
as package data, ``simulator/validation_cases/``). It is a
scenario file (:mod:`simulator.scenario.schema`) plus two keys this module removes before
:func:`simulator.simulate` sees the mapping:

``published``
    ``metric`` (one of :data:`METRICS`), ``value`` (in the metric's unit),
    ``unit`` (free text, what the source printed) and ``source`` (paper or page,
    table or section).
``assumptions``
    A list of sentences: what the case had to assume where the source is silent
    (micro-batch size, vocabulary, number of virtual stages...).

The comparison is ``error = simulated / published - 1`` (a signed fraction; a
positive error on a throughput metric means the simulator is too optimistic, on a
time metric too pessimistic). The *speed-signed* error
(:attr:`CaseResult.speed_error`) puts both on one sign: positive when the simulation
is faster than the published run, for time and throughput metrics alike. It is
``error`` on a throughput metric (tokens/s, MFU, HFU, TFLOP/s) and ``-error`` on a
time metric (:data:`TIME_METRICS`), so its magnitude is ``|error|``.

Memory. Every result carries the simulated ``peak_memory_bytes`` and ``oom`` (the
peak exceeds the device's memory). A published run ran, so a case whose simulated
peak does not fit *fails* (:attr:`CaseResult.failure`), whatever its metric. Memory
figures are cases too: metric ``peak_memory_bytes`` (bytes in use on the fullest
device), ``activation_bytes`` (the largest stash of activations on one device) or
``model_state_bytes`` (weights, gradients and optimizer states of the fullest device),
compared as above; and configurations a source reports as not fitting are cases with
metric ``oom`` and ``value: true`` (``false``: the source says it fits): the error is
``published - simulated`` (1 = the simulator says it fits where the source says it
does not: optimistic, like a positive throughput error), and a mismatch fails.

Calibration is never per case: every case uses the chip family's
:data:`simulator.engine.compute.DEFAULT_COMPUTE_CALIBRATION` entry unless the caller
passes ``compute`` overrides, which then apply to every case alike (that is how
``tests/test_validate.py`` shows a parameter moves every affected case).
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from simulator.errors import StudyError
from simulator.scenario.loading import read_mapping


def _suite_dir() -> Path:
    """The built-in suite. An installed wheel ships the case files as package data,
    ``simulator/validation_cases/`` (``pyproject.toml`` maps the repository's
    ``validation/`` there); a checkout (or an editable install) has them in
    ``validation/`` beside the ``simulator`` package. One copy of the files either way."""
    packaged = Path(str(resources.files("simulator") / "validation_cases"))
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[3] / "validation"


#: The built-in suite's folder (see :func:`_suite_dir`).
SUITE_DIR = _suite_dir()


def _hw_tflops(summary: Mapping, peak_bf16: float) -> float:
    return summary["hfu"] * peak_bf16 / 1e12


#: metric name -> (what it is, function of (summary, bf16 peak FLOP/s)).
METRICS: dict[str, tuple[str, Callable[[Mapping, float], float]]] = {
    "step_time_s": ("seconds per optimizer step", lambda s, p: s["step_time_s"]),
    "tokens_per_s": ("global tokens per second", lambda s, p: s["tokens_per_s"]),
    "mfu": ("model FLOPs / (devices x bf16 peak x step time)", lambda s, p: s["mfu"]),
    "hfu": ("as mfu, recomputed FLOPs counted", lambda s, p: s["hfu"]),
    "model_tflops_per_device": ("model TFLOP/s per device", lambda s, p: s["model_tflops_per_device"]),
    # Narayanan et al. 2021 Eq. 3 counts the recompute pass: compare with executed FLOPs.
    "hw_tflops_per_device": ("hardware TFLOP/s per device incl. recompute = hfu x bf16 peak", _hw_tflops),
    "peak_memory_bytes": ("peak bytes in use on the fullest device", lambda s, p: s["peak_memory_bytes"]),
    "activation_bytes": ("peak bytes of stashed activations on one device", lambda s, p: s["peak_activation_bytes"]),
    "model_state_bytes": (
        "weights + gradients + optimizer states on the fullest device",
        lambda s, p: s["model_state_bytes"],
    ),
    "oom": ("1 when the peak exceeds the device memory, else 0", lambda s, p: float(bool(s["oom"]))),
}

#: Metrics whose published value is true/false rather than a positive number.
BOOLEAN_METRICS = ("oom",)
#: Memory figures (bytes), as opposed to the speed metrics.
MEMORY_METRICS = ("peak_memory_bytes", "activation_bytes", "model_state_bytes")
#: Speed metrics that are times (larger = slower); the others are throughputs.
TIME_METRICS = ("step_time_s",)


class ValidationError(StudyError):
    """A case file that is not a valid case (names the file and the key)."""


@dataclass(frozen=True)
class Case:
    """One published run: a scenario and the figure to compare with."""

    name: str
    path: Path | None
    scenario: Mapping
    metric: str
    published: float
    unit: str
    source: str
    assumptions: tuple[str, ...] = ()

    def scenario_with(self, compute: Mapping[str, float] | None = None) -> dict:
        """The scenario mapping, with ``compute`` overrides merged over the case's own."""
        sc = copy.deepcopy(dict(self.scenario))
        if compute:
            sc["compute"] = {**sc.get("compute", {}), **dict(compute)}
        return sc


@dataclass
class CaseResult:
    case: Case
    simulated: float
    sim_wall_s: float
    summary: dict = field(repr=False, default_factory=dict)

    @property
    def error(self) -> float:
        if self.case.metric in BOOLEAN_METRICS:
            return self.case.published - self.simulated
        return self.simulated / self.case.published - 1.0

    @property
    def peak_memory_bytes(self) -> float:
        return float(self.summary.get("peak_memory_bytes", float("nan")))

    @property
    def oom(self) -> bool:
        return bool(self.summary.get("oom", False))

    @property
    def family(self) -> str:
        """The chip family the case ran on (``ampere``, ``hopper``, ``blackwell``, ``tpu``):
        the unit the compute calibration is fitted per."""
        return str(self.summary.get("chip_family", ""))

    @property
    def kind(self) -> str:
        """``moe`` when the case's model has experts (``model.moe``), else ``dense``."""
        return "moe" if self.summary.get("moe") else "dense"

    @property
    def speed_error(self) -> float:
        """The error signed by speed: positive when the simulation is faster than the
        published run, for time and throughput metrics alike (``-error`` on a time metric,
        :data:`TIME_METRICS`; ``error`` otherwise). Its magnitude is ``|error|``; NaN for a
        memory figure or an expected-OOM verdict, which are not speeds."""
        if not self.is_timing:
            return float("nan")
        return -self.error if self.case.metric in TIME_METRICS else self.error

    @property
    def is_timing(self) -> bool:
        """A speed metric (step time, throughput, MFU, TFLOP/s), not a memory figure or an
        expected-OOM verdict."""
        return self.case.metric not in BOOLEAN_METRICS and self.case.metric not in MEMORY_METRICS

    @property
    def failure(self) -> str | None:
        """Why the case fails on memory, or None: a run the source made whose simulated
        peak does not fit, or an ``oom`` case the simulator gets wrong."""
        peak, hbm = self.peak_memory_bytes / 1e9, self.summary.get("hbm_bytes", float("nan")) / 1e9
        # oom is judged on what the caching allocator holds (reserved_memory_bytes)
        reserved = self.summary.get("reserved_memory_bytes", self.peak_memory_bytes) / 1e9
        held = f"peak {peak:.1f} GB, {reserved:.1f} GB reserved"
        if self.case.metric in BOOLEAN_METRICS:
            if bool(self.simulated) == bool(self.case.published):
                return None
            if self.case.published:
                return f"fits in the simulation ({held} of {hbm:.1f} GB) but the source says it does not"
            return f"out of memory in the simulation ({held} > {hbm:.1f} GB) but the source says it fits"
        if self.oom:
            return f"out of memory in the simulation ({held} > {hbm:.1f} GB), but the source ran it"
        return None


def load_case(source: str | Path | Mapping, name: str | None = None) -> Case:
    """A case from a YAML/JSON file or a mapping.

    Raises
    ------
    ValidationError
        When ``published`` is missing or incomplete, or its metric is unknown.
    """
    path = None
    if isinstance(source, Mapping):
        data = copy.deepcopy(dict(source))
    else:
        path = Path(source)
        data = read_mapping(path)
    where = str(path) if path else (name or data.get("name") or "case")
    pub = data.pop("published", None)
    assumptions = data.pop("assumptions", None) or []
    if not isinstance(pub, Mapping):
        raise ValidationError(f"{where}: published: needs a mapping with metric, value, source")
    metric = pub.get("metric")
    if metric not in METRICS:
        raise ValidationError(f"{where}: published.metric: {metric!r} not allowed; choose from {', '.join(METRICS)}")
    if metric in BOOLEAN_METRICS:
        if not isinstance(pub.get("value"), bool):
            raise ValidationError(
                f"{where}: published.value: metric {metric} needs true or false, got {pub.get('value')!r}"
            )
        value = float(pub["value"])
    else:
        try:
            if isinstance(pub["value"], bool):
                raise TypeError
            value = float(pub["value"])
        except (KeyError, TypeError, ValueError):
            raise ValidationError(f"{where}: published.value: needs a number, got {pub.get('value')!r}") from None
        if not value > 0:
            raise ValidationError(f"{where}: published.value: must be > 0, got {value!r}")
    if not pub.get("source"):
        raise ValidationError(f"{where}: published.source: say where the figure comes from (paper, table)")
    if not isinstance(assumptions, list) or not all(isinstance(a, str) for a in assumptions):
        raise ValidationError(f"{where}: assumptions: a list of sentences")
    case_name = name or data.get("name") or (path.stem if path else "case")
    data.setdefault("name", case_name)
    return Case(case_name, path, data, metric, value, str(pub.get("unit", "")), str(pub["source"]), tuple(assumptions))


def discover(patterns: Sequence[str] | None = None, root: str | Path | None = None) -> list[Case]:
    """The suite's cases (sorted by path), or those matching any of ``patterns``.

    A pattern is a glob matched against the case name, the file's path relative to
    ``root`` with or without its suffix (``narayanan2021/*``, ``dgxc/dgxc-grok1-512xh100``) and the
    file name; or an existing file/folder.

    Raises
    ------
    ValidationError
        When nothing matches (the message lists the case names).
    """
    base = Path(root) if root is not None else SUITE_DIR
    files = sorted(base.rglob("*.yaml")) + sorted(base.rglob("*.json")) if base.is_dir() else []
    cases = [load_case(f) for f in files]
    if not patterns:
        if not cases:
            raise ValidationError(f"--cases: no case files under {base}")
        return cases
    out: list[Case] = []
    seen: set = set()
    for pat in patterns:
        p = Path(pat)
        if p.is_file():
            found = [load_case(p)]
        elif p.is_dir():
            found = [load_case(f) for f in sorted(p.rglob("*.yaml"))]
        else:
            found = [c for c in cases if _matches(c, pat, base)]
        for c in found:
            key = c.path.resolve() if c.path else c.name
            if key not in seen:
                seen.add(key)
                out.append(c)
    if not out:
        raise ValidationError(
            f"--cases: {', '.join(patterns)} matches no case; cases: {', '.join(c.name for c in cases)}"
        )
    return out


def _matches(case: Case, pattern: str, base: Path) -> bool:
    names = [case.name]
    if case.path is not None:
        names.append(case.path.name)
        names.append(case.path.stem)
        try:
            rel = case.path.resolve().relative_to(base.resolve())
        except ValueError:
            rel = case.path
        names += [rel.as_posix(), rel.with_suffix("").as_posix()]  # dgxc/dgxc-grok1-512xh100(.yaml)
    return any(fnmatch.fnmatch(n, pattern) for n in names)
