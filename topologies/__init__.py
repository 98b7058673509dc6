"""What the hardware is: chips, networks, graph builders, presets, routes.

The public names are re-exported here; see each module for details.
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
