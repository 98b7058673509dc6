"""The positional op constructors (:func:`workloads.trace.ops.compute_op`, ``collective_op``, ``send_op``) build
the op keyword construction builds: a reordered or added ``Op`` field fails here, not as a
silently shifted field in every trace."""

import dataclasses

from workloads.kernels import Kernel
from workloads.trace.ops import Op, collective_op, compute_op, send_op


def _fields(op: Op) -> dict:
    return {f.name: getattr(op, f.name) for f in dataclasses.fields(Op)}


def test_compute_op_is_keyword_construction():
    k = (Kernel(name="qkv", kind="gemm", flops=2e12, bytes=3e9),)
    mem = (("activations", 4e6, "end"),)
    got = compute_op(7, 3, "L2.attn.F", "F", 5, 1, 2, (4, 6), k, mem, True, True)
    want = Op(
        id=7, rank=3, stream="compute", kind="compute", name="L2.attn.F", phase="F", mb=5, chunk=1, layer=2,
        deps=(4, 6), kernels=k, mem=mem, recompute=True, comm_overlap=True,
    )  # fmt: skip
    assert _fields(got) == _fields(want)


def test_collective_op_is_keyword_construction():
    got = collective_op(9, 2, "tp", "L0.mlp.out", "B", 4, 0, 0, (8,), "all-reduce", "tp", (0, 1), "tp:0:x", 5e6, 0.5)
    want = Op(
        id=9, rank=2, stream="tp", kind="collective", name="L0.mlp.out", phase="B", mb=4, chunk=0, layer=0,
        deps=(8,), coll="all-reduce", axis="tp", group=(0, 1), key="tp:0:x", size_bytes=5e6, scaleout_fraction=0.5,
    )  # fmt: skip
    assert _fields(got) == _fields(want)
    got = collective_op(9, 2, "ep", "L1.dispatch", "F", 4, 0, 1, (8,), "all-to-all", "ep", (0, 1), "ep:0:x", 5e6, 1.0,
                        True)  # fmt: skip
    want = Op(
        id=9, rank=2, stream="ep", kind="collective", name="L1.dispatch", phase="F", mb=4, chunk=0, layer=1,
        deps=(8,), coll="all-to-all", axis="ep", group=(0, 1), key="ep:0:x", size_bytes=5e6, comm_overlap=True,
    )  # fmt: skip
    assert _fields(got) == _fields(want)


def test_send_op_is_keyword_construction():
    got = send_op(3, 1, "pp", "send.F", "F", 6, 2, (2,), "pp", "pp:1->5:F:6:2", 8e6, 5)
    want = Op(
        id=3, rank=1, stream="pp", kind="send", name="send.F", phase="F", mb=6, chunk=2, deps=(2,), axis="pp",
        key="pp:1->5:F:6:2", size_bytes=8e6, peer=5,
    )  # fmt: skip
    assert _fields(got) == _fields(want)
