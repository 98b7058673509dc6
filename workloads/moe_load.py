"""How unevenly tokens land on experts, and what that does to expert-parallel ranks.

Routing is never perfectly balanced. :class:`ExpertLoad` describes the imbalance:

* ``balanced`` — every expert gets ``tokens * top_k / experts`` assignments.
* ``zipf`` — expert popularity ``p_e ∝ 1 / rank_e ** skew`` over a random
  permutation of the experts (a heavy head of hot experts).
* ``lognormal`` — ``p_e ∝ exp(N(0, skew²))``.
* ``dirichlet`` — ``p ~ Dirichlet(1/skew)`` (larger skew, more uneven).

Top-k routing bounds the imbalance. A token's ``k`` experts are distinct, so an
expert receives at most one assignment per token: at most ``T`` of the ``T*k``
assignments of ``T`` routed tokens, i.e. at most ``E/k`` times the mean
``T*k/E`` (:func:`max_expert_load_factor`). Conversely any per-expert counts
``c_e <= T`` summing to ``T*k`` can be realised by distinct top-k choices, so
this is the whole constraint. An EP rank holding ``n = E/ep`` experts receives at
most ``min(n, k)`` assignments per token, at most ``min(n, k) * ep / k`` times
the per-rank mean ``T*k/ep``, which is ``min(E/k, ep)``
(:func:`max_rank_load_factor`; it follows from the per-expert cap and the fixed
total).

Per MoE layer, ``tokens * top_k`` assignments are drawn (multinomial, seeded:
the same seed gives the same draw) from ``p`` after capping every expert's
routing probability at ``1/k`` (a token picks expert ``e`` with probability
``k * p_e <= 1``; the excess is spread over the other experts in proportion to
their popularity); an expert whose draw still exceeds ``T`` keeps ``T`` and the
surplus is spread the same way. With ``capacity_factor`` each expert keeps at
most ``capacity_factor * tokens * top_k / experts`` of them (the rest are
dropped, GShard-style); with ``pad_to_capacity`` as well, every expert computes exactly its
capacity (drop-and-pad: padded rows are computed and sent too), so every rank's load factor
is the capacity over the mean. Each EP rank holds ``experts / ep`` consecutive
experts; its *load factor* is its assignments over the mean per rank.

An expert-parallel all-to-all and the expert GEMMs are synchronous across the EP
group: the combine cannot finish before the most loaded rank has computed and
sent its outputs. stepsim therefore *times* every rank's expert work and
all-to-all at the *largest* load factor of the layer — the slowest expert rank
sets the pace — while the FLOPs the EP group executes are each rank's own: their
mean (``1``, less what capacity drops) times the balanced work. The activation
memory of the routed tokens follows the load of the device that holds the most
of them over its stage's layers (:func:`hottest_rank`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from workloads.errors import WorkloadError

DISTRIBUTIONS = ("balanced", "zipf", "lognormal", "dirichlet")
Distribution = Literal[DISTRIBUTIONS]


@dataclass(frozen=True)
class ExpertLoad:
    """How tokens spread over the routed experts (the scenario's ``training.expert_load``).
    Constraints in ``metadata`` (pydantic's ``gt``/``ge``) are what the scenario schema checks."""

    distribution: Distribution = "balanced"
    skew: float = field(default=1.0, metadata={"gt": 0, "le": 100})
    capacity_factor: float | None = field(default=None, metadata={"ge": 1, "le": 1e3})
    seed: int = field(default=0, metadata={"ge": 0, "le": 2**63 - 1})
    # Drop-and-pad (Megatron --moe-pad-expert-input-to-capacity, with a capacity factor):
    # every expert computes exactly its capacity, padded rows included, so the expert GEMMs
    # and the all-to-alls are sized by capacity_factor x the balanced rows, whatever the
    # routing (token_dispatcher.py MoEAlltoAllTokenDispatcher.preprocess, drop_and_pad).
    pad_to_capacity: bool = False

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise WorkloadError(
                f"must be one of {', '.join(DISTRIBUTIONS)}, got {self.distribution!r}",
                field="training.expert_load.distribution",
            )
        if not self.skew > 0:
            raise WorkloadError(f"must be > 0, got {self.skew!r}", field="training.expert_load.skew")
        if self.capacity_factor is not None and not self.capacity_factor >= 1:
            raise WorkloadError(
                f"must be >= 1, got {self.capacity_factor!r}", field="training.expert_load.capacity_factor"
            )
        if self.pad_to_capacity and self.capacity_factor is None:
            raise WorkloadError(
                "needs a capacity_factor (Megatron pads each expert's input to its capacity)",
                field="training.expert_load.pad_to_capacity",
            )


def expert_popularity(load: ExpertLoad, experts: int, rng: np.random.Generator) -> np.ndarray:
    """Routing probabilities of the experts (sum 1)."""
    if load.distribution == "balanced":
        return np.full(experts, 1.0 / experts)
    if load.distribution == "zipf":
        p = 1.0 / np.arange(1, experts + 1, dtype=float) ** load.skew
        p = p[rng.permutation(experts)]
    elif load.distribution == "lognormal":
        p = np.exp(rng.normal(0.0, load.skew, experts))
    else:
        p = rng.dirichlet(np.full(experts, 1.0 / load.skew))
    return p / p.sum()


def max_expert_load_factor(experts: int, top_k: int) -> float:
    """The largest load factor one expert can have under top-k routing: it receives
    at most one of each token's ``top_k`` distinct assignments, ``T`` of ``T*top_k``,
    against a mean of ``T*top_k/experts``: ``experts / top_k``."""
    return experts / top_k


def max_rank_load_factor(experts: int, top_k: int, ep: int) -> float:
    """The largest load factor an EP rank holding ``experts/ep`` experts can have:
    at most ``min(experts/ep, top_k)`` of a token's assignments land on it, against
    a mean of ``top_k/ep`` per token: ``min(experts/top_k, ep)``."""
    return min(experts // ep, top_k) * ep / top_k


def _cap_shares(x: np.ndarray, cap: float) -> np.ndarray:
    """``x`` (non-negative, ``sum(x) <= cap * len(x)``) with no entry above ``cap``
    and the same total: what the capped entries lose goes to the others in
    proportion to their values (evenly where they are all zero), repeated until no
    entry exceeds ``cap`` (water-filling)."""
    x = np.asarray(x, dtype=float)
    total = float(x.sum())
    out = x.copy()
    capped = np.zeros(len(x), dtype=bool)
    while True:
        over = (out > cap) & ~capped
        if not over.any():
            return out
        capped |= over
        out[capped] = cap
        free = ~capped
        rest = total - cap * int(capped.sum())
        w = x[free]
        out[free] = w / w.sum() * rest if w.sum() > 0 else rest / int(free.sum())


def rank_load_factors(load: ExpertLoad, experts: int, top_k: int, ep: int, tokens: int, layers: int) -> np.ndarray:
    """Load factor of every EP rank in every MoE layer: shape ``(layers, ep)``, each
    row with mean 1 before capacity dropping (dropped tokens lower it) and no entry
    above :func:`max_rank_load_factor`. ``tokens``: the tokens the EP group routes
    in one micro-batch."""
    if experts % ep:
        raise WorkloadError(f"must divide the {experts} experts, got {ep}", field="parallel.ep")
    if not 1 <= top_k <= experts:
        raise WorkloadError(f"must be in 1..{experts}, got {top_k}", field="model.moe.top_k")
    assignments = int(tokens) * top_k
    mean_per_expert = assignments / experts
    out = np.ones((layers, ep))
    if load.distribution == "balanced" and load.capacity_factor is None:
        return out
    if load.pad_to_capacity:
        # every expert holds its capacity, ceil(cf * T * k / E) rows (moe_utils.get_capacity)
        capacity = math.ceil(load.capacity_factor * mean_per_expert)
        return np.full((layers, ep), capacity * (experts // ep) / (assignments / ep))
    rng = np.random.default_rng(load.seed)
    for l in range(layers):
        p = _cap_shares(expert_popularity(load, experts, rng), 1.0 / top_k)
        if load.distribution != "balanced":
            # one assignment per token at most: an expert keeps T of its draw
            counts = _cap_shares(rng.multinomial(assignments, p).astype(float), float(int(tokens)))
        else:
            counts = p * assignments
        if load.capacity_factor is not None:
            # at least one row per expert: fewer tokens than experts / capacity_factor would
            # otherwise drop every token and leave no rank any load
            counts = np.minimum(counts, max(1.0, np.floor(load.capacity_factor * mean_per_expert)))
        per_rank = counts.reshape(ep, experts // ep).sum(axis=1)
        out[l] = per_rank / (assignments / ep)
    return out


def hottest_rank(factors: np.ndarray) -> int:
    """The EP rank (column of ``factors``, rows = the MoE layers one device holds)
    that receives the most routed tokens over those layers: the device whose
    routed-token activations peak highest (every MoE layer keeps the same bytes per
    assignment). Ties go to the lowest rank."""
    f = np.asarray(factors, dtype=float)
    if f.ndim != 2 or f.shape[0] == 0:
        return 0
    return int(np.argmax(f.sum(axis=0)))
