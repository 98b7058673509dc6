"""Chakra execution traces (MLCommons): the format as stepsim writes and reads it, and the constants
and message classes its writer (:mod:`workloads.trace.chakra_write`) and reader
(:mod:`workloads.trace.chakra_read`, with :mod:`workloads.trace.chakra_nodes` for each node) share.

A Chakra trace is a directory holding one ET file per rank, ``<prefix>.<rank>.et``
(ASTRA-sim's naming: its ``--workload-configuration`` is ``DIR/<prefix>``), and the
communicator groups, ``comm_group.json``: ``{"1": [0, 1, 2, 3], "2": [...]}`` (group
id -> ranks; ASTRA-sim's ``--comm-group-configuration``). An ET file is a sequence of
length-delimited protobuf messages (a varint length, then the message): one
``GlobalMetadata``, then ``Node`` messages. The schema is Chakra's
``schema/protobuf/et_def.proto``; the message classes and the framing come from
MLCommons' own package (PyPI ``mlc-chakra``, import name ``chakra``; the
``stepsim[chakra]`` extra installs it).

Node attributes follow the Chakra feeder (``src/feeder/et_feeder_node.cpp``, which
ASTRA-sim uses): ``is_cpu_op`` bool (absent = a CPU op), ``num_ops`` int64,
``tensor_size`` uint64, ``comm_type`` / ``comm_size`` int64, ``comm_src`` /
``comm_dst`` / ``comm_tag`` int32, ``pg_name`` string (a comm-group id; ``""`` or
``"0"``: every rank). Dependencies are ``data_deps`` (node ids of the same file) and
``ctrl_deps`` (Chakra's PyTorch converter: a node's enclosing op); a ``ctrl_deps`` entry
naming no node of the file (the converter leaves out the trace's root) is ignored.

Writing (:func:`workloads.trace.chakra_write.write_chakra`), per op kind:

* compute -> ``COMP_NODE`` (``is_cpu_op`` false, ``num_ops`` = FLOPs, ``tensor_size``
  = HBM bytes, both rounded to integers);
* collective -> ``COMM_COLL_NODE`` (``comm_type`` ALL_REDUCE / ALL_GATHER /
  REDUCE_SCATTER / ALL_TO_ALL / BROADCAST, ``comm_size`` in the nccl-tests
  convention, ``pg_name`` = the group's id in ``comm_group.json``);
* send -> ``COMM_SEND_NODE`` on the sender (``comm_src``, ``comm_dst``, ``comm_tag``,
  ``comm_size``) and, when the receiver is in the trace, a matching ``COMM_RECV_NODE``
  on the receiver, which the receiver's ops waiting for the message depend on;
* host transfer -> ``MEM_STORE_NODE`` (device to host, names with ``d2h``) or
  ``MEM_LOAD_NODE`` (``tensor_size`` = bytes); host CPU work -> a CPU ``COMP_NODE``.

Each node's ``data_deps`` are its op's dependencies on the same rank plus the
previous op of its stream (stepsim runs each stream in order). What Chakra has no
field for rides in attributes named ``stepsim.*`` (other readers keep them as
unknown attributes): the exact kernels, stream, labels, collective key and axis,
memory effects, exact float sizes, and dependencies on ops of other ranks that are
not messages (``stepsim.remote_deps``, op ids). ``GlobalMetadata`` carries
``stepsim.format`` and the trace's header (world, ranks, weight, model FLOPs,
static memory, notes, and the scenario record with its fingerprint, so that
``run --trace`` refuses the trace under another scenario, as for JSON traces).

Reading (:func:`workloads.trace.chakra_read.read_chakra`): files stepsim wrote come back op for op (same ids,
kernels, streams and keys: the same step time). Other files are read within the node
types stepsim can simulate:

* CPU ``COMP_NODE`` (``is_cpu_op`` true or absent), as Chakra's PyTorch converter
  (``chakra_trace_link`` then ``chakra_converter PyTorch``) writes every host operator:
  host time of its recorded ``duration_micros`` (the converter's exclusive duration,
  children excluded) on the rank's ``host`` stream, costing no kernel launch;
* GPU ``COMP_NODE`` (``is_cpu_op`` false) with ``num_ops`` and/or ``tensor_size``:
  one kernel of that many FLOPs and HBM bytes, timed by the roofline as a GEMM (as
  ASTRA-sim's roofline mode does), re-timed for the simulated chip; with neither (Chakra's
  PyTorch converter writes neither for a GPU kernel), a kernel of its recorded
  ``duration_micros`` on any chip (``Kernel.recorded_s``); nodes are run one at a time
  on the ``compute`` stream in dependency order (file order among independent ones);
* ``COMM_COLL_NODE`` with ``comm_type`` ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER
  (or REDUCE_SCATTER_BLOCK), ALL_TO_ALL or BROADCAST: the group from ``pg_name`` and
  ``comm_group.json``; each group's collectives run in order on a stream of their
  own (``pg<id>``), the n-th of every member meeting (NCCL's rule);
* ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``: matched by (source, destination, tag), in
  order; a send is a transfer that starts when its dependencies are done (the
  receiver does not wait to post), ops depending on the receive wait for it;
* ``MEM_LOAD_NODE`` / ``MEM_STORE_NODE``: a transfer of ``tensor_size`` bytes over the
  device's host link;
* ``METADATA_NODE``: skipped (its dependants inherit its dependencies).

Anything else (``INVALID_NODE``, storage / batch / checkpoint nodes, REDUCE / GATHER /
SCATTER / BARRIER collectives) is refused by a :class:`TraceError`
naming the file, the node id, its name and type. Such a trace has no model FLOPs or scenario record: running
it under a scenario checks only its rank count (one ET file per rank of the layout).
"""

from __future__ import annotations

import re

from workloads.trace.ops import TraceError

FORMAT = "stepsim-chakra"
VERSION = 1
PREFIX = "trace"  # ET files are <prefix>.<rank>.et
COMM_GROUP_FILE = "comm_group.json"
SCHEMA_VERSION = "1.0.0"  # GlobalMetadata.version, as Chakra's own generator writes it
MAX_CHAKRA_BYTES = 256 * 2**20  # all ET files together, uncompressed (as for JSON traces)

_ET_NAME = re.compile(r"^(?P<prefix>.+)\.(?P<rank>\d+)\.et$")
_COLL_TO_CHAKRA = {
    "all-reduce": "ALL_REDUCE",
    "all-gather": "ALL_GATHER",
    "reduce-scatter": "REDUCE_SCATTER",
    "all-to-all": "ALL_TO_ALL",
    "broadcast": "BROADCAST",
}
_CHAKRA_TO_COLL = {v: k for k, v in _COLL_TO_CHAKRA.items()}
_CHAKRA_TO_COLL["REDUCE_SCATTER_BLOCK"] = "reduce-scatter"
_SUPPORTED_TYPES = (
    "COMP_NODE (CPU: recorded host time; GPU: num_ops / tensor_size or recorded time)",
    "COMM_COLL_NODE",
    "COMM_SEND_NODE",
    "COMM_RECV_NODE",
    "MEM_LOAD_NODE",
    "MEM_STORE_NODE",
    "METADATA_NODE (skipped)",
)


def _chakra():
    """MLCommons' Chakra message classes and framing helpers, or a TraceError saying how to get them."""
    try:
        from chakra.schema.protobuf import et_def_pb2 as pb
        from chakra.src.third_party.utils import protolib
    except ImportError as err:
        raise TraceError(
            f"trace: Chakra traces need MLCommons' Chakra package ({err}); install it with "
            "`pip install 'stepsim[chakra]'` (PyPI package mlc-chakra)"
        ) from None
    return pb, protolib
