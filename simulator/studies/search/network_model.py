"""Closed-form time of one collective on a cluster, alone on the network (:class:`NetModel`).

The communication costs of the analytic step-time estimate (:mod:`simulator.studies.search.estimate`):
each parallel axis's collectives costed at the bandwidth its group sees on the cluster's
switched (NVLink domains + fat-tree) or torus network.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from simulator.network.alltoall import direct_a2a_time, hierarchical_a2a_time
from simulator.network.collectives import default_algorithm
from simulator.network.reductions import nvls_time, rail_ring_time, ring_time, sharp_time
from simulator.network.torus_collective import torus_a2a_time, torus_box_time, torus_ring_time
from topologies.networks import SwitchedNetwork


class NetModel:
    """Time of one collective on a cluster, closed form, alone on the network.

    Ranks are devices (the trace places rank ``r`` on device ``r``). Bandwidths are per
    device and direction, times the link efficiency of the chip family's network
    calibration (``simulator.network.calibration``: NVLink 370/450, InfiniBand 48/50, ICI 1.0).

    * Switched (NVLink domains + fat-tree): the algorithm is the network's own choice
      (:func:`simulator.network.collectives.default_algorithm`, or the scenario's
      ``algorithms``) and its time the closed form beside its plan
      (``simulator/network/reductions.py``, ``alltoall.py``; ``tests/test_closed_forms.py``
      holds each against the plan simulated alone). A group inside one domain runs on the domain
      link (NVLS for all-reduce when the domain has it); across domains with ``k > 1``
      members per domain: the rail-ring
      (NCCL's ring, one channel per rail: the whole ring load on NVLink and ``1/k`` of it on
      each NIC, at once), the pipelined SHARP all-reduce when the fabric has it (NVLink
      reduce-scatter + all-gather beside ``S/k`` into the switch), and the DeepSeek-style
      hierarchical all-to-all (``(nd-1)/nd`` of the buffer over the NIC and ``(k-1)/k``
      over NVLink at once); with one member per domain a ring / direct exchange
      over the NICs. Leaf uplinks divide the NIC bandwidth by the oversubscription when the
      group spans more domains than one leaf group holds; crossing pods, the DCN bandwidth.
    * Torus: a group that is a box of the torus runs dimension by dimension, the buffer split
      into one share per axis with rotated axis orders so that every axis is busy at every
      stage (per axis a bidirectional ring when the group covers a wrapped axis, else a
      bidirectional line at half that bandwidth: ``torus_collective.torus_phases``); any other group a ring whose links carry
      as many chunks as the mean hop count between ring neighbours (twin groups interleave
      on the same links). An all-to-all is limited by its busiest link: along an axis of
      ``e`` members each line carries an all-to-all of ``S/e`` per pair, whose busiest link
      carries ``floor(e/2)*ceil(e/2)`` such messages on a line and
      ``sum(d < e/2) + e/4`` on a wrapped ring (shortest paths, ties split). Across pods:
      the pod part on ICI plus the ``S/k`` shard (all-to-all: the cross-pod share) over DCN.

    Each step of a ring pays the per-hop latency. Results are cached per (op, group)."""

    def __init__(self, cluster, calibration=None, algorithms: Mapping[str, str] | None = None):
        from simulator.network.calibration import default_calibration  # lazy: search imports stay light

        self.cluster = cluster
        self.algorithms = dict(algorithms or {})  # the scenario's ``algorithms``: op -> algorithm
        # layout -> representative position (simulator.studies.search.estimate), kept as long
        # as this model: a search or map screen estimates thousands of layouts of one cluster
        self.positions: dict = {}
        ncal = calibration if calibration is not None else default_calibration(cluster.chip.family)
        net = cluster.network
        self.kind = "switched" if isinstance(net, SwitchedNetwork) else "torus"
        self.per_pod = cluster.devices_per_pod
        pods = cluster.pods
        self.dcn_bw = pods.dcn_bw_bytes_per_s * ncal.efficiency_of("dcn") if pods is not None else None
        self.dcn_latency_s = pods.dcn_latency_s if pods is not None else 0.0
        # all-to-all kernels reach these shares of the bulk rates (calibration.a2a_efficiency)
        self.a2a_up = ncal.a2a_efficiency_of("nvlink")
        self.a2a_out = min(ncal.a2a_efficiency_of("nic"), ncal.a2a_efficiency_of("fabric"))
        self.a2a_ici = ncal.a2a_efficiency_of("ici")
        self.a2a_dcn = ncal.a2a_efficiency_of("dcn")
        if self.kind == "switched":
            self.domain = min(net.domain_size, self.per_pod)
            self.up_bw = net.domain_bw_bytes_per_s * ncal.efficiency_of("nvlink")
            self.out_bw = net.nic_bw_bytes_per_s * ncal.efficiency_of("nic")
            self.oversubscription = net.oversubscription
            self.domains_per_leaf = net.domains_per_leaf
            self.nvls = net.nvls
            self.sharp = net.sharp
            self.nvls_efficiency = ncal.algorithm_efficiency_of("nvls")
            self.up_latency_s = 2 * net.domain_latency_s  # device -> switch -> device
            self.out_latency_s = 2 * (net.nic_latency_s + net.switch_latency_s)  # NIC, leaf, spine, leaf, NIC
        else:
            self.shape = tuple(net.shape)
            self.wrap = tuple(net.wrap)
            self.strides = [math.prod(self.shape[:a]) for a in range(len(self.shape))]
            self.link_bw = net.link_bw_bytes_per_s * ncal.efficiency_of("ici")
            self.link_latency_s = net.link_latency_s
        self._cache: dict = {}

    def domains_of(self, ranks) -> np.ndarray:
        """Scale-up domain of each device (switched networks; as :meth:`Topology.domains_of`)."""
        return np.asarray(ranks, dtype=np.int64) // self.domain

    def time_s(self, op: str, group, size_bytes: float, scaleout_fraction: float = 1.0) -> float:
        """Seconds for ``op`` (all-reduce | all-gather | reduce-scatter | all-to-all) of
        ``size_bytes`` (nccl-tests convention, as ``simulator.network.collectives``) over ``group``.
        ``scaleout_fraction``: a node-limited all-to-all's share of routed copies that
        cross between switched domains (``collectives.plan_collective``)."""
        group = tuple(group)
        if len(group) <= 1 or size_bytes <= 0:
            return 0.0
        key = (op, group, scaleout_fraction)
        hit = self._cache.get(key)
        if hit is None:
            arr = np.asarray(group, dtype=np.int64)
            if self.kind == "switched":
                per_byte_s, latency_s = self._switched(op, arr, scaleout_fraction)
            else:
                per_byte_s, latency_s = self._torus_pods(op, arr)
            hit = self._cache[key] = (float(per_byte_s), float(latency_s))
        per_byte_s, latency_s = hit
        return float(size_bytes * per_byte_s + latency_s)

    def p2p_s(self, src: int, dst: int, size_bytes: float) -> float:
        """One point-to-point transfer (a pipeline send)."""
        if src == dst or size_bytes <= 0:
            return 0.0
        if src // self.per_pod != dst // self.per_pod:
            return size_bytes / self.dcn_bw + self.dcn_latency_s
        if self.kind == "switched":
            if src // self.domain == dst // self.domain:
                return size_bytes / self.up_bw + self.up_latency_s
            return size_bytes / self.out_bw + self.out_latency_s
        hops = int(self._hops(np.array([src % self.per_pod]), np.array([dst % self.per_pod])).sum())
        return size_bytes / self.link_bw + hops * self.link_latency_s

    # -- switched ---------------------------------------------------------------------------
    def _switched(self, op: str, arr, scaleout_fraction: float = 1.0) -> tuple[float, float]:
        """The algorithm the network would run (the scenario's ``algorithms`` first, else
        :func:`~simulator.network.collectives.default_algorithm`) costed by the closed form
        beside its plan (``simulator/network/reductions.py``, ``alltoall.py``)."""
        n = len(arr)
        _, counts = np.unique(arr // self.domain, return_counts=True)
        nd, k = len(counts), int(counts.max())
        alg = self.algorithms.get(op) if scaleout_fraction == 1.0 else None
        if alg is None:
            alg = default_algorithm(op, "switched", counts.tolist(), nvls=self.nvls, sharp=self.sharp)
        out_bw = self.out_bw
        if nd > self.domains_per_leaf:
            out_bw /= self.oversubscription
        if self.dcn_bw is not None and len(np.unique(arr // self.per_pod)) > 1:
            out_bw = min(out_bw, self.dcn_bw)
        up, up_a, out_a = self.up_bw, self.up_latency_s, self.out_latency_s
        if op == "all-to-all":
            up, out_bw = up * self.a2a_up, out_bw * self.a2a_out
            if alg == "hierarchical-a2a" and nd > 1 and int(counts.min()) == k:
                return hierarchical_a2a_time(nd, k, up, out_bw, out_a + up_a, scaleout_fraction)
            # direct (or a hierarchical one the group cannot run)
            k_min = int(counts.min()) if nd > 1 else n
            return direct_a2a_time(n, k_min, k, up, out_bw, up_a if nd == 1 else out_a, scaleout_fraction)
        if nd == 1:
            if alg == "nvls":
                return nvls_time(n, up, up_a, self.nvls_efficiency)
            return ring_time(op, n, up, up_a)
        if k == 1 or int(counts.min()) != k:  # one member per domain (or uneven): over the NICs
            return ring_time(op, n, out_bw, out_a)
        alpha = max(up_a, out_a)
        if alg == "sharp" and op == "all-reduce":
            return sharp_time(k, up, out_bw, alpha)
        if alg == "rail-ring":
            return rail_ring_time(op, n, k, up, out_bw, alpha)
        # a ring in group order: every hop over the NIC when the domains are cut alike, and
        # algorithms without a closed form here (tree, halving-doubling, ring-bidir) costed so
        return ring_time(op, n, min(up, out_bw), alpha)

    # -- torus ------------------------------------------------------------------------------
    def _coords(self, local):
        return [(local // s) % e for s, e in zip(self.strides, self.shape)]

    def _hops(self, a, b):
        """Dimension-order hop counts between local device indices ``a`` and ``b``."""
        total = np.zeros(len(a), dtype=np.int64)
        for ca, cb, e, w in zip(self._coords(a), self._coords(b), self.shape, self.wrap):
            d = np.abs(ca - cb)
            total += np.minimum(d, e - d) if (w and e > 2) else d
        return total

    def _torus_pods(self, op: str, arr) -> tuple[float, float]:
        pods, counts = np.unique(arr // self.per_pod, return_counts=True)
        if len(pods) == 1:
            return self._torus(op, arr % self.per_pod)
        npods, k = len(pods), int(counts.max())
        intra = self._torus(op, (arr[arr // self.per_pod == pods[0]] % self.per_pod)) if k > 1 else (0.0, 0.0)
        if op == "all-to-all":
            return max(intra[0], (npods - 1) / npods / (self.dcn_bw * self.a2a_dcn)), intra[1] + self.dcn_latency_s
        f = 2 if op == "all-reduce" else 1
        # Hierarchical: the pod part on the full buffer, then the S/k shard across pods.
        return intra[0] + f * (npods - 1) / npods / k / self.dcn_bw, intra[1] + f * (npods - 1) * self.dcn_latency_s

    def _torus(self, op: str, local) -> tuple[float, float]:
        n = len(local)
        if n <= 1:
            return 0.0, 0.0
        coords = self._coords(local)
        extents, box = [], True
        for c in coords:
            vals = np.unique(c)
            extents.append(len(vals))
            if vals[-1] - vals[0] + 1 != len(vals):
                box = False
        box = box and math.prod(extents) == n and self.algorithms.get(op) != "ring"  # a ring asked for
        B, a = self.link_bw, self.link_latency_s
        if op == "all-to-all":
            return torus_a2a_time(coords, extents, n, self.shape, self.wrap, B * self.a2a_ici, a)
        if box:
            return torus_box_time(op, extents, self.shape, self.wrap, B, a)
        return torus_ring_time(op, coords, self._coords(np.roll(local, -1)), n, self.shape, self.wrap, B, a)


def net_model_for(models: dict, sc) -> NetModel:
    """The :class:`NetModel` of loaded scenario ``sc``'s cluster as placed, from ``models`` (a
    dict the caller keeps), made once per ``devices_per_domain``: a placement that leaves
    devices of each domain idle changes which ranks share a domain (``network.domain_size``
    becomes the devices used), so a model of the scenario's default placement misprices every
    candidate placed otherwise."""
    key = sc.cluster.devices_per_domain
    net = models.get(key)
    if net is None:
        net = models[key] = NetModel(sc.cluster, sc.network_calibration(), sc.algorithms)
    return net
