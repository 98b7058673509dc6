"""What the hardware is: chips, networks, graph builders, presets, routes.

The public names are re-exported here; see each module for details.

* :mod:`.chips` — chip specifications (peak FLOP/s, HBM, links) with their sources;
* :mod:`.networks` — plain data for a cluster's network: switched, torus, pods;
* :mod:`.builders` — graph builders (torus, switched fat-trees and rails, joined pods);
* :mod:`.presets` — named clusters (``dgx-h100``, ``gb200-nvl72``, ``tpu-v5p``...);
* :mod:`.topology` — :class:`Topology`: a validated graph with stable link ids and routes,
  checked by :mod:`.graph_checks` (ranges, connectivity);
* :mod:`.placement` — how a job's ranks land on the scale-up domains;
* :mod:`.io` — topologies saved and loaded as JSON or GraphML;
* :mod:`.plot` — a picture of a topology for design reviews;
* :mod:`.errors` — :class:`TopologyError` and :class:`UnknownPresetError`.
"""

from .builders import device_node, join_pods, switched, torus
from .chips import CHIPS, FAMILIES, ChipSpec, get_chip
from .errors import TopologyError, UnknownPresetError
from .io import load_topology, save_topology
from .networks import ClusterSpec, PodsSpec, SwitchedNetwork, TorusNetwork, default_wrap
from .plot import plot_topology
from .presets import CLUSTER_PRESETS, ClusterPreset, TpuSliceRule, build_cluster, cluster_preset, torus_shape_for
from .topology import Topology

__all__ = [
    "CHIPS",
    "CLUSTER_PRESETS",
    "FAMILIES",
    "ChipSpec",
    "ClusterPreset",
    "ClusterSpec",
    "PodsSpec",
    "SwitchedNetwork",
    "Topology",
    "TopologyError",
    "TorusNetwork",
    "TpuSliceRule",
    "UnknownPresetError",
    "build_cluster",
    "cluster_preset",
    "default_wrap",
    "device_node",
    "get_chip",
    "join_pods",
    "load_topology",
    "plot_topology",
    "save_topology",
    "switched",
    "torus",
    "torus_shape_for",
]
