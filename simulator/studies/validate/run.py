"""Running validation cases: one case simulated and its metric read off the summary
(:func:`run_case`), the suite on worker processes (:func:`run_suite`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from simulator.scenario.schema import ScenarioError
from simulator.studies.validate.cases import METRICS, Case, CaseResult, ValidationError


def run_case(case: Case, compute: Mapping[str, float] | None = None, steady_state: bool = True) -> CaseResult:
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
    keep["moe"] = sc.model.is_moe
    return CaseResult(case, float(value), float(s["sim_wall_s"]), keep)


@dataclass(frozen=True)
class CaseFailure:
    """A case that could not be simulated, and why."""

    case: Case
    error: str


def run_suite(
    cases: Iterable[Case],
    compute: Mapping[str, float] | None = None,
    jobs: int = 1,
    progress: Callable[[CaseResult], None] | None = None,
    failures: list | None = None,
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
    results: list[CaseResult | None] = [None] * len(cases)

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
