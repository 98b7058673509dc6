"""How unevenly tokens land on experts, and what that does to expert-parallel ranks.

Routing is never perfectly balanced. :class:`ExpertLoad` describes the imbalance:

* ``balanced`` — every expert gets ``tokens * top_k / experts`` assignments.
* ``zipf`` — expert popularity ``p_e ∝ 1 / rank_e ** skew`` over a random
  permutation of the experts (a heavy head of hot experts).
* ``lognormal`` — ``p_e ∝ exp(N(0, skew²))``.
* ``dirichlet`` — ``p ~ Dirichlet(1/skew)`` (larger skew, more uneven).

Per MoE layer, ``tokens * top_k`` assignments are drawn (multinomial, seeded:
the same seed gives the same draw) from ``p``; with ``capacity_factor`` each
expert keeps at most ``capacity_factor * tokens * top_k / experts`` of them (the
rest are dropped, GShard-style). Each EP rank holds ``experts / ep`` consecutive
experts; its *load factor* is its assignments over the mean per rank.

An expert-parallel all-to-all and the expert GEMMs are synchronous across the EP
group: the combine cannot finish before the most loaded rank has computed and
sent its outputs. stepsim therefore runs every rank's expert work and all-to-all
at the *largest* load factor of the layer — the slowest expert rank sets the pace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np

Distribution = Literal["balanced", "zipf", "lognormal", "dirichlet"]
DISTRIBUTIONS = ("balanced", "zipf", "lognormal", "dirichlet")


@dataclass(frozen=True)
class ExpertLoad:
    distribution: Distribution = "balanced"
    skew: float = 1.0
    capacity_factor: Optional[float] = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"training.expert_load.distribution: must be one of {', '.join(DISTRIBUTIONS)}, "
                             f"got {self.distribution!r}")
        if not self.skew > 0:
            raise ValueError(f"training.expert_load.skew: must be > 0, got {self.skew!r}")
        if self.capacity_factor is not None and not self.capacity_factor >= 1:
            raise ValueError(f"training.expert_load.capacity_factor: must be >= 1, got {self.capacity_factor!r}")


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


def rank_load_factors(load: ExpertLoad, experts: int, top_k: int, ep: int, tokens: int, layers: int) -> np.ndarray:
    """Load factor of every EP rank in every MoE layer: shape ``(layers, ep)``, each
    row with mean 1 before capacity dropping (dropped tokens lower it)."""
    if experts % ep:
        raise ValueError(f"parallel.ep: must divide the {experts} experts, got {ep}")
    assignments = int(tokens) * top_k
    mean_per_expert = assignments / experts
    out = np.ones((layers, ep))
    if load.distribution == "balanced" and load.capacity_factor is None:
        return out
    rng = np.random.default_rng(load.seed)
    for l in range(layers):
        p = expert_popularity(load, experts, rng)
        counts = rng.multinomial(assignments, p).astype(float) if load.distribution != "balanced" else p * assignments
        if load.capacity_factor is not None:
            counts = np.minimum(counts, np.floor(load.capacity_factor * mean_per_expert))
        per_rank = counts.reshape(ep, experts // ep).sum(axis=1)
        out[l] = per_rank / (assignments / ep)
    return out
