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
time metric too pessimistic).

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
import csv
import fnmatch
import statistics
from importlib import resources
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence, Union

from simulator.errors import StudyError
from simulator.scenario.loading import read_mapping
from simulator.scenario.schema import ScenarioError


def _suite_dir() -> Path:
    """The built-in suite. An installed wheel ships the case files as package data,
    ``simulator/validation_cases/`` (``pyproject.toml`` maps the repository's
    ``validation/`` there); a checkout (or an editable install) has them in
    ``validation/`` beside the ``simulator`` package. One copy of the files either way."""
    packaged = Path(str(resources.files("simulator") / "validation_cases"))
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "validation"


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


class ValidationError(StudyError):
    """A case file that is not a valid case (names the file and the key)."""


@dataclass(frozen=True)
class Case:
    """One published run: a scenario and the figure to compare with."""

    name: str
    path: Optional[Path]
    scenario: Mapping
    metric: str
    published: float
    unit: str
    source: str
    assumptions: tuple[str, ...] = ()

    def scenario_with(self, compute: Optional[Mapping[str, float]] = None) -> dict:
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
    def is_timing(self) -> bool:
        """A speed metric (step time, throughput, MFU, TFLOP/s), not a memory figure or an
        expected-OOM verdict."""
        return self.case.metric not in BOOLEAN_METRICS and self.case.metric not in MEMORY_METRICS

    @property
    def failure(self) -> Optional[str]:
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


def load_case(source: Union[str, Path, Mapping], name: Optional[str] = None) -> Case:
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


def discover(patterns: Optional[Sequence[str]] = None, root: Union[str, Path, None] = None) -> list[Case]:
    """The suite's cases (sorted by path), or those matching any of ``patterns``.

    A pattern is a glob matched against the case name, the file's path relative to
    ``root`` (``narayanan2021/*``) and the file name; or an existing file/folder.

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
            names.append(case.path.resolve().relative_to(base.resolve()).as_posix())
        except ValueError:
            names.append(case.path.as_posix())
    return any(fnmatch.fnmatch(n, pattern) for n in names)


def run_case(case: Case, compute: Optional[Mapping[str, float]] = None, steady_state: bool = True) -> CaseResult:
    """Simulate one case and read its metric off the summary. ``steady_state``: skip ahead in a
    long pipeline's step from a shorter run where its steady phase provably repeats
    (:mod:`simulator.steady`; the same figures to 1e-9); ``False`` simulates every micro-batch."""
    from simulator import simulate
    from simulator.scenario.loading import load_scenario

    sc = load_scenario(case.scenario_with(compute))
    res = simulate(sc, steady_state=steady_state)
    s = dict(res.summary)
    s["model_state_bytes"] = s["peak_model_state_bytes"]
    value = METRICS[case.metric][1](s, sc.cluster.chip.peak("bf16"))
    keep = {
        k: s[k]
        for k in (
            "step_time_s",
            "mfu",
            "hfu",
            "bubble_fraction",
            "exposed_comm_fraction",
            "peak_memory_bytes",
            "reserved_memory_bytes",
            "peak_activation_bytes",
            "model_state_bytes",
            "memory_breakdown_bytes",
            "hbm_bytes",
            "oom",
            "micro_batches",
            "sim_wall_s",
        )
    }
    keep["chip_family"] = sc.cluster.chip.family
    return CaseResult(case, float(value), float(s["sim_wall_s"]), keep)


@dataclass(frozen=True)
class CaseFailure:
    """A case that could not be simulated, and why."""

    case: Case
    error: str


def run_suite(
    cases: Iterable[Case],
    compute: Optional[Mapping[str, float]] = None,
    jobs: int = 1,
    progress: Optional[Callable[[CaseResult], None]] = None,
    failures: Optional[list] = None,
    steady_state: bool = True,
) -> list[CaseResult]:
    """Run ``cases`` (``jobs`` worker processes, which end if this process dies); results
    in the order of ``cases``.

    A case that cannot be simulated raises :class:`ValidationError` naming the case;
    when a ``failures`` list is given it is appended there as a :class:`CaseFailure`
    instead and the other cases go on (the results then leave it out).
    """
    from simulator.studies.workers import process_pool

    cases = list(cases)
    results: list[Optional[CaseResult]] = [None] * len(cases)

    def take(i: int, get: Callable[[], CaseResult]) -> None:
        try:
            results[i] = get()
        except Exception as err:  # noqa: BLE001 — recorded when asked to, else raised
            if failures is None:
                raise
            msg = (
                str(err)
                if isinstance(err, ValidationError)
                else f"{cases[i].path or cases[i].name}: {type(err).__name__}: {err}"
            )
            failures.append(CaseFailure(cases[i], msg))
            return
        if progress:
            progress(results[i])

    if jobs <= 1 or len(cases) <= 1:
        for i, c in enumerate(cases):
            take(i, lambda c=c: _guarded(c, compute, steady_state))
    else:
        # Longest cases first so that the pool is not left waiting on one straggler.
        order = sorted(range(len(cases)), key=lambda i: -_size_hint(cases[i]))
        with process_pool(jobs) as pool:
            futs = {i: pool.submit(_guarded, cases[i], compute, steady_state) for i in order}
            for i in order:
                take(i, futs[i].result)
    return [r for r in results if r is not None]


def _guarded(case: Case, compute, steady_state: bool = True) -> CaseResult:
    try:
        return run_case(case, compute, steady_state)
    except ScenarioError as err:
        raise ValidationError(f"{case.path or case.name}: {err}") from None


def _size_hint(case: Case) -> float:
    """Rough relative cost, to start the longest cases first: micro-batches x pipeline stages,
    twice that for expert parallelism, whose all-to-alls run through the contended flow network
    rather than as private (known-duration) collectives. By the case times of a two-job run on
    2026-12-02 this order finishes in 83.6 s where micro-batches x stages alone gives 88.3 s
    (the longest case, dgxc-deepseek-v3-128xgb200, started 27th of 57)."""
    sc = case.scenario
    tr, par = sc.get("training", {}), sc.get("parallel", {})
    try:
        per_replica = (
            tr.get("global_batch_size", 1) / max(1, par.get("dp") or 1) / max(1, tr.get("micro_batch_size", 1))
        )
        return per_replica * par.get("pp", 1) * (2.0 if (par.get("ep") or 1) > 1 else 1.0)
    except TypeError:
        return 0.0


def error_stats(results: Sequence[CaseResult]) -> tuple[float, float, str]:
    """(median |error|, worst |error|, name of the worst case)."""
    if not results:
        return float("nan"), float("nan"), ""
    errs = [abs(r.error) for r in results]
    worst = max(results, key=lambda r: abs(r.error))
    return statistics.median(errs), abs(worst.error), worst.case.name


def family_stats(results: Sequence[CaseResult], timing_only: bool = True) -> dict:
    """Per chip family: ``{family: (cases, median |error|, worst |error|, worst case)}``,
    over the speed metrics only by default (memory figures and expected-OOM verdicts are
    left out: their errors are 0 or of another kind), families in the order of
    :data:`FAMILY_ORDER`."""
    sel = [r for r in results if r.is_timing or not timing_only]
    fams = sorted({r.family for r in sel}, key=_family_key)
    out = {}
    for fam in fams:
        rs = [r for r in sel if r.family == fam]
        med, worst, name = error_stats(rs)
        out[fam] = (len(rs), med, worst, name)
    return out


#: Chip families in the order tables and plots list them (oldest first).
FAMILY_ORDER = ("ampere", "hopper", "blackwell", "tpu")


def _family_key(fam: str):
    return (FAMILY_ORDER.index(fam) if fam in FAMILY_ORDER else len(FAMILY_ORDER), fam)


def format_table(results: Sequence[CaseResult]) -> str:
    """The human table: case, metric, published, simulated, error, simulated peak
    memory (``OOM`` when it does not fit), wall time; the cases that fail on memory last."""
    w = max([len("case")] + [len(r.case.name) for r in results])
    lines = [
        f"{'case':<{w}}  {'metric':<22} {'published':>10} {'simulated':>10} {'error':>8} {'peak GB':>8} "
        f"{'':>3} {'sim s':>7}"
    ]
    for r in results:
        lines.append(
            f"{r.case.name:<{w}}  {r.case.metric:<22} {_fmt(r.case.published):>10} {_fmt(r.simulated):>10} "
            f"{r.error:>+8.1%} {r.peak_memory_bytes / 1e9:>8.1f} {'OOM' if r.oom else '':>3} "
            f"{r.sim_wall_s:>7.1f}"
        )
    med, worst, name = error_stats(results)
    lines.append(f"{len(results)} cases; median |error| {med:.1%}; worst |error| {worst:.1%} ({name})")
    timing = [r for r in results if r.is_timing]
    if timing and len(timing) < len(results):
        med, worst, name = error_stats(timing)
        lines.append(f"{len(timing)} speed cases; median |error| {med:.1%}; worst |error| {worst:.1%} ({name})")
    for fam, (n, med, worst, name) in family_stats(results).items():
        lines.append(f"  {fam or '?'}: {n} speed cases; median |error| {med:.1%}; worst {worst:.1%} ({name})")
    failed = [r for r in results if r.failure]
    for r in failed:
        lines.append(f"FAILED {r.case.name}: {r.failure}")
    return "\n".join(lines)


def _fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 1 else f"{x:.2f}" if abs(x) < 100 else f"{x:.1f}"


CSV_COLUMNS = ("case", "metric", "published", "simulated", "error", "source", "peak_memory_bytes", "oom", "family")


def write_csv(results: Sequence[CaseResult], path: Union[str, Path]) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in results:
            w.writerow(
                [
                    r.case.name,
                    r.case.metric,
                    repr(r.case.published),
                    repr(r.simulated),
                    repr(r.error),
                    r.case.source,
                    repr(r.peak_memory_bytes),
                    str(r.oom).lower(),
                    r.family,
                ]
            )
    return p


def plot_parity(results: Sequence[CaseResult], path: Union[str, Path], band: float = 0.10) -> Path:
    """Simulated vs published, one panel per chip family (the unit of calibration), log
    axes, a ±``band`` band, one marker per metric (each scaled by the geometric mean of its
    published values in the panel); each panel's title gives its speed cases' median and
    worst |error|. Expected-OOM verdicts (booleans) are left out."""
    rows = [
        (r.family, r.case.metric, r.case.published, r.simulated, r.error, r.is_timing)
        for r in results
        if r.case.metric not in BOOLEAN_METRICS
    ]  # log axes: numbers only
    return plot_parity_rows(rows, path, band)


def plot_parity_rows(rows, path: Union[str, Path], band: float = 0.10) -> Path:
    """:func:`plot_parity` from plain rows ``(family, metric, published, simulated, error,
    is_timing)`` (what ``validation.csv`` holds, so the notebook can draw the committed run)."""
    import matplotlib.pyplot as plt  # no backend chosen here: Agg headless, the notebook's in a notebook
    import numpy as np
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    rows = [r for r in rows if r[2] > 0 and r[3] > 0]
    # Metrics differ by orders of magnitude (MFU ~0.5, tokens/s ~1e6): within a panel each
    # metric is divided by the geometric mean of its published values, so every metric sits
    # around 1 and the diagonal and the band keep their meaning.
    scale = {}
    for fam, m in {(r[0], r[1]) for r in rows}:
        pub = [r[2] for r in rows if r[0] == fam and r[1] == m]
        scale[fam, m] = float(np.exp(np.mean(np.log(pub))))
    rows = [(f, m, p / scale[f, m], q / scale[f, m], e, t) for f, m, p, q, e, t in rows]
    fams = sorted({r[0] for r in rows}, key=_family_key) or [""]
    metrics = sorted({r[1] for r in rows})
    markers = dict(zip(metrics, "osD^vP*X<>h"))
    fig, axes = plt.subplots(1, len(fams), figsize=(4.4 * len(fams), 4.5), squeeze=False)
    for ax, fam in zip(axes[0], fams):
        rs = [r for r in rows if r[0] == fam]
        if not rs:
            ax.text(0.5, 0.5, "no numeric metric to plot", ha="center", va="center")
            continue
        vals = [v for r in rs for v in (r[2], r[3])]
        lo, hi = min(vals) / 1.5, max(vals) * 1.5
        x = np.geomspace(lo, hi, 50)
        ax.fill_between(x, x * (1 - band), x * (1 + band), color="0.88", label=f"±{band:.0%}")
        ax.plot(x, x, color="0.4", lw=0.8)
        for m in metrics:
            sel = [r for r in rs if r[1] == m]
            if sel:
                ax.scatter([r[2] for r in sel], [r[3] for r in sel], marker=markers[m], label=m, s=30, zorder=3)
        errs = [abs(r[4]) for r in rs if r[5]]
        title = fam or "?"
        if errs:
            title += f": {len(errs)} speed cases, median |err| {np.median(errs):.1%}, worst {max(errs):.1%}"
        ax.set_title(title, fontsize=8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        for axis in (ax.xaxis, ax.yaxis):  # log axes spanning < 2 decades: no crowded minor labels
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_minor_formatter(NullFormatter())
            axis.set_major_formatter(FormatStrFormatter("%g"))
        ax.set_xlabel("published (÷ geometric mean of its metric)")
        ax.set_ylabel("simulated (same scale)")
        ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p
