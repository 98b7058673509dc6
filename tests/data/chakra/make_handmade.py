"""Writes the hand-made Chakra trace ``handmade.<rank>.et`` + ``comm_group.json`` with
MLCommons' Chakra protobuf classes directly (not with stepsim), the way Chakra's own
generator does (``chakra/src/generator/generator.py``): a GlobalMetadata, then Nodes,
each length-delimited by ``protolib.encodeMessage``. Run from this directory:

    python make_handmade.py

Four ranks. Rank i computes (i + 1) TFLOP (node 1), then all four all-reduce 1 MiB in
process group "1" (node 2); a METADATA_NODE (node 3) follows. Rank 0 then sends 1 MiB
to rank 1 (tag 7, node 4, after the all-reduce); rank 1 receives it (node 4) and
computes 1 TFLOP more (node 5, after the receive and the metadata node). Rank 2 also
moves 1 MiB to host memory (MEM_STORE_NODE, node 4).
"""

import json
from pathlib import Path

from chakra.schema.protobuf.et_def_pb2 import (
    ALL_REDUCE,
    COMM_COLL_NODE,
    COMM_RECV_NODE,
    COMM_SEND_NODE,
    COMP_NODE,
    MEM_STORE_NODE,
    METADATA_NODE,
    GlobalMetadata,
    Node,
)
from chakra.schema.protobuf.et_def_pb2 import (
    AttributeProto as A,
)
from chakra.src.third_party.utils.protolib import encodeMessage

HERE = Path(__file__).parent
MIB = 1 << 20


def node(i, name, typ, deps=(), **attrs):
    n = Node(id=i, name=name, type=typ)
    n.data_deps.extend(deps)
    n.attr.append(A(name="is_cpu_op", bool_val=False))
    for k, v in attrs.items():
        n.attr.append(A(name=k, **v))
    return n


def main(out: Path = HERE):
    for r in range(4):
        nodes = [
            node(1, "fwd", COMP_NODE, num_ops={"int64_val": (r + 1) * 10**12}, tensor_size={"uint64_val": 10**9}),
            node(
                2,
                "grad_allreduce",
                COMM_COLL_NODE,
                [1],
                comm_type={"int64_val": ALL_REDUCE},
                comm_size={"int64_val": MIB},
                pg_name={"string_val": "1"},
            ),
            Node(id=3, name="pg_metadata", type=METADATA_NODE, data_deps=[2]),
        ]
        if r == 0:
            nodes.append(
                node(
                    4,
                    "send_act",
                    COMM_SEND_NODE,
                    [2],
                    comm_src={"int32_val": 0},
                    comm_dst={"int32_val": 1},
                    comm_tag={"int32_val": 7},
                    comm_size={"int64_val": MIB},
                )
            )
        if r == 1:
            nodes.append(
                node(
                    4,
                    "recv_act",
                    COMM_RECV_NODE,
                    [],
                    comm_src={"int32_val": 0},
                    comm_dst={"int32_val": 1},
                    comm_tag={"int32_val": 7},
                    comm_size={"int64_val": MIB},
                )
            )
            nodes.append(
                node(5, "fwd2", COMP_NODE, [4, 3], num_ops={"int64_val": 10**12}, tensor_size={"uint64_val": 10**9})
            )
        if r == 2:
            nodes.append(node(4, "offload", MEM_STORE_NODE, [2], tensor_size={"uint64_val": MIB}))
        with open(out / f"handmade.{r}.et", "wb") as f:
            encodeMessage(f, GlobalMetadata(version="1.0.0"))
            for n in nodes:
                encodeMessage(f, n)
    (out / "comm_group.json").write_text(json.dumps({"1": [0, 1, 2, 3]}) + "\n")


if __name__ == "__main__":
    main()
