"""Failures over a training run: how often a job is interrupted, what a checkpoint costs, the
best checkpoint interval and the goodput that leaves (``stepsim goodput``).

**Failure rates.** Meta's Llama 3 405B pre-training (arXiv 2407.21783, §3.3.4 and Table 5):
466 job interruptions in a 54-day snapshot on 16,384 H100 GPUs (2,048 hosts of 8), 47 planned,
419 unexpected, by root cause. Each cause is a rate per component-hour of the component it
belongs to (:data:`LLAMA3_INTERRUPTIONS`): GPU causes per GPU, host causes per host (a server of
``gpus_per_host`` GPUs), network causes per GPU (NICs and cables scale with them), software
causes per GPU (one process each). A cluster's mean time between interruptions is the inverse
of the summed rates over its components; planned maintenance is left out.

**Checkpoints.** A checkpoint holds every parameter in the compute dtype, the FP32 master
copy and the optimizer's moments (Megatron's distributed checkpoint: ``ckpt_bytes_per_param``,
default 2 + 4 + 8 = 14 bytes for BF16 weights and Adam), written to and read from storage at
``cluster.storage_bw_bytes_per_s``. A restart is the job's start-up (``restart_s``, an input:
scheduling, process start, NCCL initialisation; no published figure is used for it) and
reading the checkpoint back.

**Interval and goodput.** The checkpoint interval is Daly's optimum (J. T. Daly, "A higher
order estimate of the optimum checkpoint interval for restart dumps", FGCS 22, 2006, eq. 37):
``tau = sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + delta / 18M] - delta`` for ``delta < 2M``,
else ``M`` (Young's ``sqrt(2 delta M)`` to first order, :func:`young_interval_s`). Per
interruption the run loses the restart and on average half an interval of work since the last
checkpoint; each interval pays one checkpoint write. The goodput fraction is
``tau / (tau + delta) * M / (M + R + (tau + delta) / 2)`` (:func:`goodput_fraction`), and the
effective tokens per day are the step's tokens per second times 86,400 times that fraction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from simulator.errors import StudyError

#: Llama 3 405B, 54 days on 16,384 H100 (arXiv 2407.21783, Table 5): unexpected interruptions
#: by root cause, each with the component it scales with.
LLAMA3_INTERRUPTIONS: Mapping[str, tuple[int, str]] = {
    "faulty GPU": (148, "gpu"),
    "GPU HBM3 memory": (72, "gpu"),
    "software bug": (54, "gpu"),
    "network switch / cable": (35, "gpu"),
    "host maintenance": (32, "host"),
    "GPU SRAM memory": (19, "gpu"),
    "GPU system processor": (17, "gpu"),
    "NIC": (7, "gpu"),
    "NCCL watchdog timeout": (7, "gpu"),
    "silent data corruption": (6, "gpu"),
    "GPU thermal interface and sensor": (6, "gpu"),
    "SSD": (3, "host"),
    "power supply": (3, "host"),
    "server chassis": (2, "host"),
    "IO expansion board": (2, "host"),
    "dependency": (2, "gpu"),
    "CPU": (2, "host"),
    "system memory": (2, "host"),
}
LLAMA3_GPUS, LLAMA3_HOURS, LLAMA3_GPUS_PER_HOST = 16_384, 54 * 24, 8
#: Bytes a checkpoint holds per parameter: BF16 weights, FP32 master weights, FP32 Adam moments.
CKPT_BYTES_PER_PARAM = 2 + 4 + 8


class GoodputError(StudyError):
    """A goodput input out of range: the message starts with the flag it names."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message, field=field)


def young_interval_s(delta_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum checkpoint interval, ``sqrt(2 delta M)``."""
    return math.sqrt(2.0 * delta_s * mtbf_s)


def daly_interval_s(delta_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (FGCS 2006, eq. 37): Young's corrected by
    ``1 + sqrt(delta/2M)/3 + delta/(18 M)``, less ``delta``; ``M`` once ``delta >= 2M``."""
    if delta_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = delta_s / (2.0 * mtbf_s)
    return young_interval_s(delta_s, mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta_s


def goodput_fraction(interval_s: float, delta_s: float, restart_s: float, mtbf_s: float) -> float:
    """The share of wall time that trains: each interval pays a checkpoint write, and each
    interruption (mean ``mtbf_s`` apart) costs the restart and half an interval's work."""
    per_write = interval_s / (interval_s + delta_s)
    per_failure = mtbf_s / (mtbf_s + restart_s + (interval_s + delta_s) / 2.0)
    return per_write * per_failure


@dataclass(frozen=True)
class Goodput:
    """A run's failures, checkpoints and goodput (:func:`goodput`)."""

    gpus: int
    hosts: float
    mtbf_s: float
    interruptions_per_day: float
    by_cause_per_day: dict = field(repr=False)
    checkpoint_bytes: float
    checkpoint_write_s: float
    restart_s: float
    interval_s: float
    goodput_fraction: float
    tokens_per_s: float
    effective_tokens_per_day: float

    def as_dict(self) -> dict:
        return {
            "gpus": self.gpus,
            "hosts": self.hosts,
            "mtbf_s": self.mtbf_s,
            "interruptions_per_day": self.interruptions_per_day,
            "interruptions_per_day_by_cause": dict(self.by_cause_per_day),
            "checkpoint_bytes": self.checkpoint_bytes,
            "checkpoint_write_s": self.checkpoint_write_s,
            "restart_s": self.restart_s,
            "checkpoint_interval_s": self.interval_s,
            "goodput_fraction": self.goodput_fraction,
            "tokens_per_s": self.tokens_per_s,
            "effective_tokens_per_day": self.effective_tokens_per_day,
        }


def interruptions_per_hour(gpus: int, gpus_per_host: int = LLAMA3_GPUS_PER_HOST, rate_scale: float = 1.0) -> dict:
    """Expected unexpected interruptions per hour of a job on ``gpus`` GPUs, by cause, at the
    Llama 3 rates per component-hour times ``rate_scale``."""
    hosts = gpus / gpus_per_host
    llama_hosts = LLAMA3_GPUS / LLAMA3_GPUS_PER_HOST
    out = {}
    for cause, (count, unit) in LLAMA3_INTERRUPTIONS.items():
        per_component_hour = count / ((LLAMA3_GPUS if unit == "gpu" else llama_hosts) * LLAMA3_HOURS)
        out[cause] = rate_scale * per_component_hour * (gpus if unit == "gpu" else hosts)
    return out


def goodput(
    parameters: float,
    gpus: int,
    tokens_per_s: float,
    storage_bw_bytes_per_s: float,
    restart_s: float = 600.0,
    rate_scale: float = 1.0,
    gpus_per_host: int = LLAMA3_GPUS_PER_HOST,
    ckpt_bytes_per_param: float = CKPT_BYTES_PER_PARAM,
) -> Goodput:
    """The goodput of a run of a ``parameters``-parameter model on ``gpus`` GPUs whose step
    trains ``tokens_per_s`` (see the module doc)."""
    for name, v, lo in (
        ("--restart-s", restart_s, 0.0),
        ("--rate-scale", rate_scale, 0.0),
        ("--ckpt-bytes-per-param", ckpt_bytes_per_param, 0.0),
    ):
        if not (math.isfinite(v) and v >= lo):
            raise GoodputError(f"must be a finite number >= {lo:g}, got {v!r}", field=name)
    rates = interruptions_per_hour(gpus, gpus_per_host, rate_scale)
    per_hour = sum(rates.values())
    mtbf_s = math.inf if per_hour == 0 else 3600.0 / per_hour
    ckpt = parameters * ckpt_bytes_per_param
    delta = ckpt / storage_bw_bytes_per_s
    restart = restart_s + delta  # start-up, then the checkpoint read back
    if math.isinf(mtbf_s):
        interval, frac = math.inf, 1.0
    else:
        interval = daly_interval_s(delta, mtbf_s) if delta > 0 else 0.0
        frac = goodput_fraction(interval, delta, restart, mtbf_s) if interval > 0 else mtbf_s / (mtbf_s + restart)
    return Goodput(
        gpus=gpus,
        hosts=gpus / gpus_per_host,
        mtbf_s=mtbf_s,
        interruptions_per_day=24.0 * per_hour,
        by_cause_per_day={k: 24.0 * v for k, v in rates.items()},
        checkpoint_bytes=ckpt,
        checkpoint_write_s=delta,
        restart_s=restart,
        interval_s=interval,
        goodput_fraction=frac,
        tokens_per_s=tokens_per_s,
        effective_tokens_per_day=tokens_per_s * 86_400.0 * frac,
    )


def describe(g: Goodput, name: str) -> str:
    """The human report ``stepsim goodput`` prints."""
    top = sorted(g.by_cause_per_day.items(), key=lambda kv: -kv[1])[:3]
    causes = ", ".join(f"{k} {v:.2f}" for k, v in top)
    return "\n".join(
        [
            f"{name}: {g.gpus:,} GPUs ({g.hosts:,.0f} hosts)",
            f"  interruptions       {g.interruptions_per_day:.2f} a day, one every {g.mtbf_s / 3600:.2f} h "
            f"(Llama 3 405B's rates, arXiv 2407.21783 Table 5; most: {causes})",
            f"  checkpoint          {g.checkpoint_bytes / 1e12:.2f} TB, written in {g.checkpoint_write_s:.1f} s",
            f"  restart             {g.restart_s:.0f} s (start-up and reading the checkpoint back)",
            f"  interval            {g.interval_s / 60:.1f} min (Daly's optimum)",
            f"  goodput             {g.goodput_fraction:.1%} of wall time trains",
            f"  tokens per day      {g.effective_tokens_per_day / 1e9:,.1f} B effective "
            f"({g.tokens_per_s * 86_400 / 1e9:,.1f} B without failures)",
        ]
    )


@dataclass(frozen=True)
class Replanned:
    """The layout's placement once ``failed`` devices of one scale-up domain are out: the most
    devices per domain (at most ``capacity - failed``) that keep every TP, CP, EP and ETP group
    inside a domain, applied to every domain (a job's layout is one placement)."""

    failed: int
    capacity: int
    devices_per_domain: int | None
    domains_before: int
    domains_after: int | None
    step_time_s: float | None
    step_time_before_s: float


def check_failed(scenario, failed: int) -> int:
    """The scale-up domain's capacity, where ``failed`` devices of one domain can be out: a
    switched cluster, fewer than a domain holds."""
    from topologies.networks import SwitchedNetwork

    c = scenario.cluster
    if not isinstance(c.network, SwitchedNetwork):
        raise GoodputError("needs a switched cluster with scale-up domains (a torus has none)", field="--failed")
    capacity = c.domain_capacity or c.network.domain_size
    if not 0 < failed < capacity:
        raise GoodputError(f"must be 1 to {capacity - 1} (the domain holds {capacity}), got {failed}", field="--failed")
    return capacity


def replan_after_failure(scenario, failed: int, before_step_s: float) -> Replanned:
    """What losing ``failed`` devices of one domain (a GB200 NVL72 compute tray: 4 GPUs) costs a
    switched cluster's layout: its placement re-planned to the largest aligned count that fits
    the degraded domain (:func:`topologies.placement.aligned_devices_per_domain`), the step
    simulated with it (the same devices over more domains)."""
    from simulator import simulate
    from simulator.scenario.serialise import scenario_to_dict
    from simulator.studies.search.layouts import ALIGNED_AXES
    from topologies.placement import aligned_devices_per_domain

    capacity = check_failed(scenario, failed)
    c = scenario.cluster
    used = c.devices_per_domain or c.network.domain_size
    L = scenario.layout
    tables = [L.group_table(a) for a in ALIGNED_AXES]
    d = aligned_devices_per_domain(tables, capacity - failed, c.devices_per_pod)
    if d is None:
        return Replanned(failed, capacity, None, -(-L.world // used), None, None, before_step_s)
    mapping = scenario_to_dict(scenario)
    mapping["cluster"]["devices_per_domain"] = d
    mapping["cluster"]["network"]["domain_size"] = capacity
    step = simulate(mapping, steady_state=True).summary["step_time_s"]
    return Replanned(failed, capacity, d, -(-L.world // used), -(-L.world // d), step, before_step_s)
