"""Kernel timings from a PyTorch profiler trace (Kineto's Chrome trace JSON).

``torch.profiler.profile(activities=[CPU, CUDA], record_shapes=True)`` and
``prof.export_chrome_trace("trace.json")`` (or the ``tensorboard_trace_handler``,
``*.pt.trace.json[.gz]``) write ``{"traceEvents": [...]}`` with complete events
(``"ph": "X"``, ``ts``/``dur`` in microseconds) of several categories:

* ``cpu_op``: an ATen operator on a CPU thread, with ``args["External id"]`` and, with
  ``record_shapes=True``, ``args["Input Dims"]`` (one list of sizes per input, ``[]``
  for a non-tensor) and ``args["Input type"]`` (``"c10::BFloat16"``, ``"float"``...).
  Operators nest (``aten::linear`` holds ``aten::addmm``) by time on the same thread.
* ``cuda_runtime`` / ``cuda_driver``: ``cudaLaunchKernel`` & co., with ``args["correlation"]``
  and the ``External id`` of the operator that launched it.
* ``kernel``: a GPU kernel, with ``args["correlation"]`` (its launch), ``args["External id"]``,
  ``device``, ``stream``, ``grid``, ``block``...
* ``ac2g`` flow events (``"ph": "s"`` at the launch, ``"f"`` at the kernel, ``id`` = the
  correlation) drawing the launch-to-kernel arrows.

Linking a kernel to its operator: the ``External id`` of the kernel; failing that, its
``correlation`` to a runtime event (that event's ``External id``, or the innermost
operator around it on its thread); failing that, the ``ac2g`` flow that starts at the
launch. From that operator outwards (the operators around it on its thread), the first
one this module knows gives the kernel's shape:

* GEMMs: ``aten::mm``, ``aten::addmm``, ``aten::bmm``, ``aten::baddbmm``, ``aten::linear``,
  ``aten::matmul``, ``aten::_scaled_mm`` (fp8). FLOPs ``2 m n k`` (x batch), bytes: the
  operands and the result once each.
* Attention: ``aten::scaled_dot_product_attention``, ``aten::_scaled_dot_product_flash_attention``,
  ``..._efficient_attention``, ``..._cudnn_attention`` (``[batch, heads, seq, head_dim]``),
  ``aten::_flash_attention_forward``, ``aten::_efficient_attention_forward``,
  ``flash_attn::_flash_attn_forward`` (``[batch, seq, heads, head_dim]``) and their
  ``_backward`` operators. FLOPs and bytes as :mod:`workloads.counts` counts them (the
  non-causal ``4 b s_q s_k h d`` forward; the backward 2x, see
  :func:`workloads.kernels.backward_kernels`), so the fitted ``attention_efficiency`` is the
  one the simulator's attention kernels need.
* Norms (``aten::native_layer_norm``, ``aten::rms_norm``, ``aten::_fused_rms_norm`` and
  backwards), the embedding (``aten::embedding``, ``aten::embedding_dense_backward``) and
  element-wise operators (:data:`ELEMENTWISE_OPS`): memory-bound; bytes = the tensor
  inputs read plus the output written (the size of the largest input; in-place ``op_``
  writes its first input, ``aten::copy_`` reads the source and writes the destination).

Kernels of any other operator (NCCL, memcpy, reductions...) are left out and counted
by operator name in :attr:`KinetoKernels.skipped`. The kernels one operator call launches
(FlashAttention's backward launches three; a split-K GEMM two) are summed into the
call's time; calls of one shape are folded into one timing, the median of their times.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from simulator.errors import StudyError
from workloads.kernels import Kernel, backward_kernels

#: ``Input type`` strings of the profiler and their element sizes in bytes.
ELEMENT_BYTES = {
    "c10::BFloat16": 2,
    "c10::Half": 2,
    "float": 4,
    "double": 8,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
}
_FP8 = {"c10::Float8_e4m3fn", "c10::Float8_e5m2", "c10::Float8_e4m3fnuz", "c10::Float8_e5m2fnuz"}
_HALF = {"c10::BFloat16", "c10::Half"}

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul", "aten::_scaled_mm")
#: Attention operators: (index of q, k, v among the inputs, layout of q).
ATTENTION_OPS = {
    "aten::scaled_dot_product_attention": (0, "bhsd", False),
    "aten::_scaled_dot_product_flash_attention": (0, "bhsd", False),
    "aten::_scaled_dot_product_efficient_attention": (0, "bhsd", False),
    "aten::_scaled_dot_product_cudnn_attention": (0, "bhsd", False),
    "aten::_flash_attention_forward": (0, "bshd", False),
    "aten::_efficient_attention_forward": (0, "bshd", False),
    "flash_attn::_flash_attn_forward": (0, "bshd", False),
    # backward operators take grad_out first, then q, k, v
    "aten::_scaled_dot_product_flash_attention_backward": (1, "bhsd", True),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, "bhsd", True),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, "bhsd", True),
    "aten::_flash_attention_backward": (1, "bshd", True),
    "aten::_efficient_attention_backward": (1, "bshd", True),
    "flash_attn::_flash_attn_backward": (1, "bshd", True),
}
NORM_OPS = (
    "aten::native_layer_norm",
    "aten::layer_norm",
    "aten::rms_norm",
    "aten::_fused_rms_norm",
    "aten::native_layer_norm_backward",
    "aten::_fused_rms_norm_backward",
    "aten::group_norm",
)
EMBEDDING_OPS = ("aten::embedding", "aten::embedding_dense_backward")
#: Element-wise operators (one pass over their tensors).
ELEMENTWISE_OPS = tuple(
    f"aten::{n}"
    for n in (
        "add",
        "add_",
        "sub",
        "sub_",
        "mul",
        "mul_",
        "div",
        "div_",
        "neg",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "pow",
        "silu",
        "silu_",
        "silu_backward",
        "gelu",
        "gelu_backward",
        "relu",
        "relu_",
        "threshold_backward",
        "sigmoid",
        "sigmoid_backward",
        "tanh",
        "tanh_backward",
        "where",
        "copy_",
        "clone",
        "_to_copy",
        "fill_",
        "zero_",
        "_softmax",
        "_softmax_backward_data",
        "_log_softmax",
        "_log_softmax_backward_data",
        "native_dropout",
        "native_dropout_backward",
        "masked_fill_",
        "cat",
        "mul_scalar",
        "addcmul_",
        "addcdiv_",
        "lerp_",
        "_foreach_add_",
        "_foreach_mul_",
        "clamp",
        "clamp_min",
        "abs",
    )
)

_KERNEL_CATS = {"kernel"}
_OP_CATS = {"cpu_op", "operator"}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime"}

#: Traces can be large: at most this many bytes are read (gzip: after decompression).
MAX_TRACE_BYTES = 2 * 2**30


class KinetoTraceError(StudyError):
    """A trace file that cannot be read as a Kineto/Chrome trace (names the file)."""


@dataclass
class KinetoKernels:
    """What :func:`read_kineto` found: the timings to fit and what it left out."""

    timings: list  # of simulator.studies.calibrate.KernelTiming, one per distinct shape
    kernels_used: int = 0
    skipped: Counter = field(default_factory=Counter)  # operator (or reason) -> kernels left out
    source: str = ""

    def describe(self) -> str:
        total = self.kernels_used + sum(self.skipped.values())
        lines = [
            f"# {self.source}: {self.kernels_used} of {total} GPU kernels used, {len(self.timings)} distinct shapes"
        ]
        if self.skipped:
            top = ", ".join(f"{k} {v}" for k, v in self.skipped.most_common(6))
            lines.append(f"#   left out: {top}{' ...' if len(self.skipped) > 6 else ''}")
        return "\n".join(lines)


def load_events(path: str | Path) -> list[dict]:
    """The ``traceEvents`` list of a Chrome trace file (``.json`` or ``.json.gz``; a bare
    list of events is accepted too)."""
    from stepsim_fileio import load_json, read_text

    p = Path(path)
    doc = load_json(read_text(p, MAX_TRACE_BYTES, what="profiler trace"), str(p))
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise KinetoTraceError(f"{p}: not a Chrome trace: expected a 'traceEvents' list")
    out = [e for e in events if isinstance(e, dict) and "ph" in e]
    if not out:
        what = "a 'traceEvents' list" if isinstance(doc, dict) else "a JSON list"
        raise KinetoTraceError(
            f"{p}: not a Chrome trace: {what} of {len(events):,} items, none a trace event "
            "(an object with 'ph', 'ts' and 'dur'); profile with torch.profiler and export_chrome_trace"
        )
    return out


def _bad_durations(events: Sequence[dict]) -> int:
    """Complete events (``ph: X``) whose ``ts`` or ``dur`` is missing, not finite or negative:
    left out, and counted so that the refusal says so."""
    bad = 0
    for e in events:
        if e.get("ph") == "X":
            ts, dur = _num(e.get("ts")), _num(e.get("dur"))
            bad += ts is None or dur is None or dur < 0
    return bad


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


class _Thread:
    """The operators of one (pid, tid), for 'innermost operator around time t'."""

    def __init__(self, ops: list[dict]):
        self.ops = sorted(ops, key=lambda e: (e["ts"], -e["dur"]))
        self.starts = [e["ts"] for e in self.ops]
        self.parent: dict[int, dict | None] = {}
        stack: list[dict] = []
        for e in self.ops:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < e["ts"] + e["dur"] - 1e-9:
                stack.pop()
            self.parent[id(e)] = stack[-1] if stack else None
            stack.append(e)

    def around(self, t: float) -> dict | None:
        """The innermost operator running at time ``t``: from the last one started by
        then, out through its parents."""
        i = bisect.bisect_right(self.starts, t) - 1
        e = self.ops[i] if i >= 0 else None
        while e is not None and not (e["ts"] <= t <= e["ts"] + e["dur"]):
            e = self.parent[id(e)]
        return e


def _link(events: Sequence[dict]):
    """(kernel event, innermost operator or None) for every kernel."""
    ops_by_ext: dict = {}
    threads_ops: dict = defaultdict(list)
    runtime_by_corr: dict = {}
    flow_start: dict = {}
    kernels = []
    for e in events:
        cat = str(e.get("cat", "")).lower()
        ph = e.get("ph")
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if ph == "X":
            ts, dur = _num(e.get("ts")), _num(e.get("dur"))
            if ts is None or dur is None or dur < 0:
                continue
            e = {**e, "ts": ts, "dur": dur, "args": args}
            if cat in _KERNEL_CATS:
                kernels.append(e)
            elif cat in _OP_CATS:
                threads_ops[(e.get("pid"), e.get("tid"))].append(e)
                if "External id" in args:
                    ops_by_ext.setdefault(args["External id"], e)
            elif cat in _RUNTIME_CATS and "correlation" in args:
                runtime_by_corr[args["correlation"]] = e
        elif ph == "s" and cat == "ac2g" and "id" in e:
            flow_start[e["id"]] = e
    threads = {k: _Thread(v) for k, v in threads_ops.items()}

    def around(pid, tid, t):
        th = threads.get((pid, tid))
        return th.around(t) if th is not None and t is not None else None

    out = []
    for k in kernels:
        a = k["args"]
        op = ops_by_ext.get(a["External id"]) if "External id" in a else None
        corr = a.get("correlation")
        if op is None and corr is not None and corr in runtime_by_corr:
            rt = runtime_by_corr[corr]
            op = ops_by_ext.get(rt["args"].get("External id")) or around(rt.get("pid"), rt.get("tid"), rt["ts"])
        if op is None and corr is not None and corr in flow_start:
            fs = flow_start[corr]
            op = around(fs.get("pid"), fs.get("tid"), _num(fs.get("ts")))
        out.append((k, op, threads.get((op.get("pid"), op.get("tid"))) if op is not None else None))
    return out


def _dims(args: dict) -> tuple[list, list]:
    dims = args.get("Input Dims")
    types = args.get("Input type")
    if not isinstance(dims, list):
        return [], []
    if not isinstance(types, list) or len(types) != len(dims):
        types = [""] * len(dims)
    clean = []
    for d in dims:
        ok = isinstance(d, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d)
        clean.append(d if ok else [])
    return clean, [str(t) for t in types]


def _numel(d: Sequence[int]) -> int:
    return math.prod(d) if d else 0


def _gemm(name: str, dims: list, types: list):
    """(Kernel, dtype) of a GEMM operator, or a reason string."""
    tensors = [(d, t) for d, t in zip(dims, types) if d]
    if name in ("aten::addmm", "aten::baddbmm"):
        tensors = tensors[1:]  # bias / input first
    elif name == "aten::linear":
        if len(tensors) < 2:
            return "no shapes"
        (x, tx), (w, tw) = tensors[0], tensors[1]
        if len(w) != 2 or not x or x[-1] != w[1]:
            return "shapes do not multiply"
        m, k, n = _numel(x[:-1]), w[1], w[0]
        bias = _numel(tensors[2][0]) if len(tensors) > 2 else 0
        return _gemm_kernel(name, m, n, k, 1, tx, tw, bias)
    if len(tensors) < 2:
        return "no shapes (profile with record_shapes=True)"
    (a, ta), (b, tb) = tensors[0], tensors[1]
    if len(a) == 2 and len(b) == 2:
        if a[1] != b[0]:
            return "shapes do not multiply"
        return _gemm_kernel(name, a[0], b[1], a[1], 1, ta, tb, 0)
    if len(a) >= 3 and len(b) == 2 and a[-1] == b[0]:  # matmul of a batch of rows by a matrix
        return _gemm_kernel(name, _numel(a[:-1]), b[1], b[0], 1, ta, tb, 0)
    if len(a) >= 3 and len(b) == len(a) and a[:-2] == b[:-2] and a[-1] == b[-2]:
        return _gemm_kernel(name, a[-2], b[-1], a[-1], _numel(a[:-2]), ta, tb, 0)
    return "shapes do not multiply"


def _gemm_kernel(name, m, n, k, batch, ta, tb, bias_elems):
    if ta in _FP8 or tb in _FP8:
        dtype, out_bytes = "fp8", 2  # fp8 operands, bf16 result (torch._scaled_mm's usual out_dtype)
    elif ta in _HALF and tb in _HALF:
        dtype, out_bytes = "bf16", ELEMENT_BYTES[ta]
    else:
        return f"{ta or 'unknown'} GEMM (only bf16/fp16/fp8 rates are modelled)"
    if min(m, n, k) <= 0:
        return "empty GEMM"
    nbytes = (
        batch * (m * k * ELEMENT_BYTES[ta] + k * n * ELEMENT_BYTES[tb] + m * n * out_bytes) + bias_elems * out_bytes
    )
    return Kernel(
        f"{name} {m}x{n}x{k}" + (f" x{batch}" if batch > 1 else ""),
        "gemm",
        2.0 * m * n * k * batch,
        float(nbytes),
        m,
        n,
        k,
        batch,
    ), dtype


def _attention(name: str, dims: list, types: list):
    first, layout, backward = ATTENTION_OPS[name]
    if len(dims) < first + 3 or not all(len(d) == 4 for d in dims[first : first + 3]):
        return "attention without 4-d q, k, v shapes"
    q, k, v = dims[first : first + 3]
    if layout == "bhsd":
        b, h, sq, dqk = q
        hk, sk, dv = k[1], k[2], v[3]
    else:
        b, sq, h, dqk = q
        sk, hk, dv = k[1], k[2], v[3]
    t = types[first]
    if t not in ELEMENT_BYTES:
        return f"attention of type {t or 'unknown'}"
    el = ELEMENT_BYTES[t]
    # workloads.counts._attention_core: non-causal FLOPs; bytes read Q, K, V, write O and the fp32 LSE.
    flops = 2.0 * b * sq * sk * h * (dqk + dv)
    traffic = el * (b * sq * h * dqk + b * sk * hk * (dqk + dv) + b * sq * h * dv) + 4.0 * b * sq * h
    fwd = Kernel(f"{name} b{b} h{h} sq{sq} sk{sk} d{dqk}", "attention", flops, float(traffic))
    if backward:
        fwd = backward_kernels(fwd)[0]
    return fwd, "bf16"


def _memory_bound(name: str, dims: list, types: list):
    sizes = [(_numel(d) * ELEMENT_BYTES[t]) for d, t in zip(dims, types) if d and t in ELEMENT_BYTES]
    if not sizes:
        return "no tensor shapes (profile with record_shapes=True)"
    if name in EMBEDDING_OPS:
        kind = "embedding"
        if name == "aten::embedding" and len(dims) >= 2 and len(dims[0]) == 2:
            rows = _numel(dims[1])
            el = ELEMENT_BYTES.get(types[0], 2)
            nbytes = 2.0 * rows * dims[0][1] * el + rows * ELEMENT_BYTES.get(types[1], 8)  # gather rows, write, indices
        else:
            nbytes = float(sum(sizes) + max(sizes))
    else:
        kind = "norm" if name in NORM_OPS else "elementwise"
        if name == "aten::copy_":
            nbytes = float(sum(sizes[:2]))  # write the destination, read the source
        elif name.endswith("_"):
            nbytes = float(sum(sizes) + sizes[0])  # in place: the first input is written back
        else:
            nbytes = float(sum(sizes) + max(sizes))
    elems = max(_numel(d) for d in dims if d)
    return Kernel(f"{name} {nbytes:.0f}B", kind, float(elems), nbytes), "bf16"


def kernel_of(op_name: str, args: dict):
    """(Kernel, dtype) for an operator of this name and ``args``, or a reason string."""
    dims, types = _dims(args)
    if op_name in GEMM_OPS:
        return _gemm(op_name, dims, types)
    if op_name in ATTENTION_OPS:
        return _attention(op_name, dims, types)
    if op_name in NORM_OPS or op_name in EMBEDDING_OPS or op_name in ELEMENTWISE_OPS:
        return _memory_bound(op_name, dims, types)
    return None


def read_kineto(paths: str | Path | Iterable[str | Path], device: int | None = None) -> KinetoKernels:
    """Kernel timings (:class:`simulator.studies.calibrate.KernelTiming`, one per distinct shape:
    the median duration) from one or more Kineto traces. ``device``: only kernels of that
    GPU index (default: every device in the trace).

    Raises
    ------
    KinetoTraceError
        A file that is not a Chrome trace, or no kernel that could be linked to a known
        operator with shapes (the message says what was left out most).
    """
    from simulator.studies.calibrate import KernelTiming

    if isinstance(paths, (str, Path)):
        paths = [paths]
    paths = list(paths)
    groups: dict = defaultdict(list)
    skipped: Counter = Counter()
    used = 0
    per_call: dict = {}
    for p in paths:
        events = load_events(p)
        bad = _bad_durations(events)
        if bad:
            skipped["(negative, missing or non-finite ts/dur)"] += bad
        for k, op, thread in _link(events):
            if device is not None and k["args"].get("device") not in (device, str(device)):
                continue
            if op is None:
                skipped["(no launching operator)"] += 1
                continue
            found, reason, node = None, None, op
            while node is not None:
                got = kernel_of(str(node.get("name", "")), node["args"])
                if isinstance(got, tuple):
                    found = got
                    break
                if isinstance(got, str) and reason is None:
                    reason = f"{node.get('name')}: {got}"
                node = thread.parent.get(id(node)) if thread is not None else None
            if found is None:
                skipped[reason or str(op.get("name", "?"))] += 1
                continue
            kern, dtype = found
            used += 1
            # the kernels of one operator call (flash backward: three; split-K GEMMs: two) do its work together
            per_call.setdefault(id(node), [kern, dtype, 0.0])[2] += k["dur"] * 1e-6
        for kern, dtype, t in per_call.values():
            key = (kern.kind, dtype, kern.m, kern.n, kern.k, kern.groups, kern.flops, kern.bytes)
            groups[key].append((kern, t))
        per_call.clear()
    timings = []
    for key in sorted(groups):
        kern = groups[key][0][0]
        t = float(statistics.median(t for _, t in groups[key]))
        if t > 0:
            timings.append(KernelTiming(kern, key[1], t))
    src = ", ".join(str(p) for p in paths)
    if not timings:
        top = ", ".join(f"{k} ({v})" for k, v in skipped.most_common(4)) or "no kernel events"
        raise KinetoTraceError(
            f"{src}: no GPU kernel could be linked to a GEMM, attention, norm or element-wise "
            f"operator with shapes; left out: {top}. Profile with "
            "activities=[CPU, CUDA] and record_shapes=True"
        )
    return KinetoKernels(timings, used, skipped, src)
