"""Communication ops of one rank that provably never run at once: their windows on the
rank's compute stream.

A rank's compute stream runs its ops one at a time, in program order. A communication op
``X`` of the same rank starts after every op it depends on has ended, and ends before every
op that depends on it starts. With ``a(X)`` the last compute op ``X`` waits for (directly, or
through other communication ops of the rank; -1 where none) and ``b(X)`` the first compute op
that waits for ``X`` (likewise; infinite where none), ``X`` runs between the end of compute op
``a(X)`` and the start of compute op ``b(X)``. Two ops with ``b(X) <= a(Y)`` never run at the
same time: ``X`` ends before compute op ``b(X)`` starts, which is no later than compute op
``a(Y)`` starts, and ``Y`` starts after that op ends.

:func:`simulator.engine.private.private_ops` uses it where a communication op shares links
only with other streams of its own rank: a tensor-parallel collective between two compute
ops of a layer never meets the same rank's expert all-to-all, whose window lies between two
other compute ops, so it runs alone on its links as if no other stream loaded them.
Dependencies on other ranks' ops only delay an op further: leaving them out keeps ``a`` a
lower bound and ``b`` an upper bound, so every pair found ordered is ordered.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from workloads.trace.ops import Trace

__all__ = ["RankWindows"]

_COMM = ("collective", "send")


class RankWindows:
    """The windows ``(a, b)`` of every communication op of a trace, computed per rank when
    first asked for (see the module doc)."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self._by_rank: dict[int, list] | None = None
        self._win: dict[int, dict[int, tuple[int, float]]] = {}
        self._streams: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}

    def window(self, rank: int) -> dict[int, tuple[int, float]]:
        """Op id -> ``(a, b)`` of each communication op of ``rank``."""
        hit = self._win.get(rank)
        if hit is None:
            if self._by_rank is None:
                self._by_rank = defaultdict(list)
                for op in self.trace.ops:
                    self._by_rank[op.rank].append(op)
            hit = self._win[rank] = _windows(self._by_rank.get(rank, []))
        return hit

    def ordered(self, rank: int, op_ids: list[int], streams) -> np.ndarray:
        """Per op of ``op_ids`` (communication ops of ``rank``): whether it is ordered with every
        communication op of each of ``streams`` (other streams of ``rank``)."""
        win = self.window(rank)
        a = np.array([win[i][0] for i in op_ids], dtype=float)
        b = np.array([win[i][1] for i in op_ids], dtype=float)
        ok = np.ones(len(op_ids), dtype=bool)
        for stream in streams:
            starts, ends = self._stream(rank, stream)
            # Y is ordered with X where a(Y) >= b(X) or b(Y) <= a(X) (never both: a < b)
            before = np.searchsorted(ends, a, side="right")  # ops of the stream with b(Y) <= a(X)
            after = starts.shape[0] - np.searchsorted(starts, b, side="left")  # a(Y) >= b(X)
            ok &= before + after == starts.shape[0]
        return ok

    def _stream(self, rank: int, stream: str) -> tuple[np.ndarray, np.ndarray]:
        """Sorted ``a`` and sorted ``b`` of the communication ops of ``(rank, stream)``."""
        key = (rank, stream)
        hit = self._streams.get(key)
        if hit is None:
            win = self.window(rank)
            assert self._by_rank is not None  # filled by window()
            ids = [op.id for op in self._by_rank[rank] if op.stream == stream and op.kind in _COMM]
            hit = self._streams[key] = (
                np.sort(np.array([win[i][0] for i in ids], dtype=float)),
                np.sort(np.array([win[i][1] for i in ids], dtype=float)),
            )
        return hit


def _windows(ops: list) -> dict[int, tuple[int, float]]:
    """``(a, b)`` of each op among ``ops`` (one rank's, in program order) off the compute stream.
    Besides dependencies, a stream runs its ops in order: an op starts after the one before it
    on its stream ends, so it inherits that op's ``a``, and the one before inherits its ``b``."""
    pos: dict[int, int] = {}  # compute op id -> its place in the compute stream
    for op in ops:
        if op.stream == "compute":
            pos[op.id] = len(pos)
    lo: dict[int, int] = {}
    last: dict[str, int] = {}  # stream -> its latest op so far
    waiting: dict[int, list[int]] = defaultdict(list)  # op id -> ids of this rank's ops waiting for it
    for op in ops:
        for d in op.deps:
            waiting[d].append(op.id)
        if op.stream == "compute":
            continue
        prev = last.get(op.stream)
        if prev is not None:
            waiting[prev].append(op.id)
        a = -1 if prev is None else lo[prev]
        for d in op.deps:
            p = pos.get(d)
            if p is None:
                p = lo.get(d, -1)  # an op of this rank before it, else unknown
            if p > a:
                a = p
        lo[op.id] = a
        last[op.stream] = op.id
    hi: dict[int, float] = {}
    for op in reversed(ops):
        if op.stream == "compute":
            continue
        b = float("inf")
        for z in waiting.get(op.id, ()):
            p = pos.get(z)
            q = float(p) if p is not None else hi.get(z, float("inf"))
            if q < b:
                b = q
        hi[op.id] = b
    return {i: (a, hi[i]) for i, a in lo.items()}
