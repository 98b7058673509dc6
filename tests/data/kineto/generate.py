"""Write the Kineto fixture of tests/test_calibrate.py (run from the repository root:
``PYTHONPATH=$PWD python tests/data/kineto/generate.py``).

``h100_llama_layer.json`` is in the layout of ``torch.profiler`` ``export_chrome_trace``
with ``record_shapes=True`` (see simulator/interop/kineto.py), made for the tests, not copied
from a run: three Llama-3-8B-like layers (hidden 4096, GQA 32/8 heads, FFN 14336, 4096
tokens) forward and backward on one H100, plus an 8192^3 matmul, fp8 ``_scaled_mm`` GEMMs,
an NCCL all-reduce and a memcpy (which calibration must leave out). Every operator's GPU
time is the roofline of simulator/engine/compute.py under :data:`TRUE` on the H100's peaks, times
1.00 / 1.01 / 0.99 in layers 0 / 1 / 2 (so the median is the model time), split over the
kernels the operator launches; durations are rounded to the nanosecond as Kineto writes
them. With :data:`TRUE` the 8192^3 bf16 GEMM takes 1.46 ms, the ~1.4 ms H100 SXM cuBLAS
figure (750 TFLOP/s of 989; NVIDIA H100 datasheet peak, Hopper tuning guides).
``tests/test_calibrate.py`` checks that this script reproduces the file byte for byte.

The FLOPs and bytes of each operator are written out here from the tensor shapes (the
test oracle), independently of simulator/interop/kineto.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: The compute calibration the trace is made with (what the fit must recover).
TRUE = dict(
    gemm_efficiency=0.80,
    fp8_gemm_efficiency=0.60,
    gemm_dim_half=128.0,
    attention_efficiency=0.45,
    memory_efficiency=0.82,
    launch_overhead_s=3e-6,
)

BF16, F32, I64, F8 = "c10::BFloat16", "float", "long int", "c10::Float8_e4m3fn"
SIZE = {BF16: 2, F32: 4, I64: 8, F8: 1}
T, H, HQ, HKV, D, FFN, V = 4096, 4096, 32, 8, 128, 14336, 128256

GEMM_K = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
NVJET_K = "nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
FP8_K = "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1_execute_kernel__5x_cublas"
EW_K = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)"
SILU_K = "void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)"
MUL_K = "void at::native::vectorized_elementwise_kernel<4, at::native::binary_internal::MulFunctor<c10::BFloat16>, at::detail::Array<char*, 3> >(int, at::native::binary_internal::MulFunctor<c10::BFloat16>, at::detail::Array<char*, 3>)"
COPY_K = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1>)"
LN_K = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)"
EMB_K = "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<long, unsigned int>, int, int, unsigned int, unsigned int, long)"
FLASH_FWD_K = "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, false, true, false, false>(pytorch_flash::Flash_fwd_params)"
FLASH_BWD_K = (
    "void pytorch_flash::flash_bwd_dot_do_o_kernel<true, pytorch_flash::Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> > >(pytorch_flash::Flash_bwd_params)",
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<pytorch_flash::Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >, false, true, false, false, false, false, false, false>(pytorch_flash::Flash_bwd_params)",
    "void pytorch_flash::flash_bwd_convert_dq_kernel<pytorch_flash::Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> > >(pytorch_flash::Flash_bwd_params, int)",
)
NCCL_K = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _gemm(m, n, k, ta=BF16, out=2, batch=1):
    from workloads.kernels import Kernel

    return Kernel(
        "g",
        "gemm",
        2.0 * m * n * k * batch,
        float(batch * (m * k * SIZE[ta] + k * n * SIZE[ta] + m * n * out)),
        m,
        n,
        k,
        batch,
    )


def _flash(b, hq, hkv, s, d, backward=False):
    from workloads.kernels import Kernel

    flops = 4.0 * b * s * s * hq * d  # non-causal 2 products x 2 FLOPs, workloads/counts.py
    nbytes = 2.0 * (b * s * hq * d + b * s * hkv * 2 * d + b * s * hq * d) + 4.0 * b * s * hq
    k = Kernel("a", "attention", flops, nbytes)
    return Kernel("a", "attention", 2 * flops, 2 * nbytes) if backward else k


def _mem(kind, nbytes, elems):
    from workloads.kernels import Kernel

    return Kernel("m", kind, float(elems), float(nbytes))


class _Writer:
    def __init__(self):
        from simulator.engine.compute import DEFAULT_COMPUTE_CALIBRATION
        from topologies.chips import get_chip

        self.cal = DEFAULT_COMPUTE_CALIBRATION["hopper"].with_(**TRUE)
        self.chip = get_chip("h100")
        self.events = []
        self.ext = 100
        self.corr = 1000
        self.cpu_t = {1: 1_000.0, 2: 1_000.0}
        self.gpu_t = 2_000.0
        self.pid = 2741

    def time_s(self, kernel, dtype="bf16"):
        from simulator.engine.compute import kernel_time_s

        return kernel_time_s(kernel, self.chip, self.cal, dtype)

    def op(self, name, dims, types, kernels=(), children=(), tid=1, scale=1.0, ext_on_kernel=True, extra=None):
        """A cpu_op with children ops, launching ``kernels``: [(kernel name, duration_s, grid, block)]."""
        tids = {1: self.pid, 2: self.pid + 17}
        start = self.cpu_t[tid]
        self.cpu_t[tid] += 2.0
        ext = self.ext
        self.ext += 1
        args = {
            "External id": ext,
            "Record function id": 0,
            "Concrete Inputs": [""] * len(dims),
            "Input type": types,
            "Input Strides": [_strides(d) for d in dims],
            "Input Dims": dims,
            "Ev Idx": ext - 1,
        }
        if extra:
            args.update(extra)
        ev = {
            "ph": "X",
            "cat": "cpu_op",
            "name": name,
            "pid": self.pid,
            "tid": tids[tid],
            "ts": round(start, 3),
            "dur": 0.0,
            "args": args,
        }
        self.events.append(ev)
        for child in children:
            child(tid)
        for kname, dur_s, grid, block in kernels:
            t_launch = self.cpu_t[tid]
            corr = self.corr
            self.corr += 1
            self.events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": self.pid,
                    "tid": tids[tid],
                    "ts": round(t_launch, 3),
                    "dur": 4.218,
                    "args": {"External id": ext, "cbid": 211, "correlation": corr},
                }
            )
            self.events.append(
                {
                    "ph": "s",
                    "id": corr,
                    "pid": self.pid,
                    "tid": tids[tid],
                    "ts": round(t_launch, 3),
                    "cat": "ac2g",
                    "name": "ac2g",
                }
            )
            self.cpu_t[tid] += 5.0
            self.gpu_t = max(self.gpu_t, t_launch + 6.0)
            dur_us = round(dur_s * scale * 1e6, 3)
            kargs = {
                "queued": 0,
                "device": 0,
                "context": 1,
                "stream": 7,
                "correlation": corr,
                "registers per thread": 168,
                "shared memory": 213248,
                "blocks per SM": 1.0,
                "warps per SM": 4.0,
                "grid": grid,
                "block": block,
                "est. achieved occupancy %": 0,
            }
            if ext_on_kernel:
                kargs["External id"] = ext
            self.events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": kname,
                    "pid": 0,
                    "tid": 7,
                    "ts": round(self.gpu_t, 3),
                    "dur": dur_us,
                    "args": kargs,
                }
            )
            self.events.append(
                {
                    "ph": "f",
                    "id": corr,
                    "pid": 0,
                    "tid": 7,
                    "ts": round(self.gpu_t, 3),
                    "cat": "ac2g",
                    "name": "ac2g",
                    "bp": "e",
                }
            )
            self.gpu_t += dur_us + 1.5
        self.cpu_t[tid] += 1.0
        ev["dur"] = round(self.cpu_t[tid] - start, 3)


def _strides(d):
    out, acc = [], 1
    for x in reversed(d):
        out.append(acc)
        acc *= x
    return list(reversed(out))


def build() -> dict:
    w = _Writer()
    G, B = [132, 16, 1], [384, 1, 1]

    def gemm_kernel(m, n, k, scale, ta=BF16, name=GEMM_K, batch=1):
        dtype = "fp8" if ta == F8 else "bf16"
        return [(name, w.time_s(_gemm(m, n, k, ta, batch=batch), dtype), G, B)]

    def mm(a, b, scale, tid=1, kname=GEMM_K, ext_on_kernel=True):
        m, k, n = a[0], a[1], b[1]
        return lambda t: w.op(
            "aten::mm",
            [a, b],
            [BF16, BF16],
            gemm_kernel(m, n, k, scale, name=kname),
            tid=t,
            scale=scale,
            ext_on_kernel=ext_on_kernel,
        )

    def linear(x, wt, scale, tid=1, bias=False):
        m, k, n = x[0] * x[1], x[2], wt[0]
        trans = lambda t: w.op("aten::t", [wt], [BF16], tid=t)
        if bias:
            inner = lambda t: w.op(
                "aten::addmm",
                [[n], [m, k], [k, n], [], []],
                [BF16, BF16, BF16, "Scalar", "Scalar"],
                gemm_kernel(m, n, k, scale, name=NVJET_K),
                tid=t,
                scale=scale,
            )
        else:
            inner = lambda t: w.op(
                "aten::matmul",
                [[x[0], x[1], k], [k, n]],
                [BF16, BF16],
                children=[lambda t2: w.op("aten::_unsafe_view", [[m, k]], [BF16], tid=t2), mm([m, k], [k, n], scale)],
                tid=t,
            )
        return w.op(
            "aten::linear",
            [x, wt, [n] if bias else []],
            [BF16, BF16, BF16 if bias else ""],
            children=[trans, inner],
            tid=tid,
        )

    def ew(name, dims, kname, nbytes, scale, tid=1, kind="elementwise", types=None):
        elems = max(_n(d) for d in dims if d)
        w.op(
            name,
            dims,
            types or [BF16 if d else "Scalar" for d in dims],
            [(kname, w.time_s(_mem(kind, nbytes, elems)), [T * H // 2048, 1, 1], [512, 1, 1])],
            tid=tid,
            scale=scale,
        )

    x = [1, T, H]
    act = T * H * 2
    w.op("aten::matmul", [[8192, 8192], [8192, 8192]], [BF16, BF16], children=[mm([8192, 8192], [8192, 8192], 1.0)])
    w.op(
        "aten::embedding",
        [[V, H], [1, T], [], [], []],
        [BF16, I64, "Scalar", "Scalar", "Scalar"],
        [(EMB_K, w.time_s(_mem("embedding", 2 * T * H * 2 + T * 8, T * H)), [T, 1, 1], [128, 1, 1])],
    )
    for _layer, scale in enumerate((1.00, 1.01, 0.99)):
        ew(
            "aten::native_layer_norm",
            [x, [H], [H], [H], []],
            LN_K,
            act * 2 + 3 * H * 2,
            scale,
            kind="norm",
            types=[BF16, "", BF16, BF16, "Scalar"],
        )
        linear(x, [HQ * D + 2 * HKV * D, H], scale)
        q, kv = [1, HQ, T, D], [1, HKV, T, D]
        fa = lambda t, s=scale: w.op(
            "aten::_flash_attention_forward",
            [[1, T, HQ, D], [1, T, HKV, D], [1, T, HKV, D], [], [], [], [], [], []],
            [BF16, BF16, BF16, "", "", "Scalar", "Scalar", "Scalar", "Scalar"],
            [(FLASH_FWD_K, w.time_s(_flash(1, HQ, HKV, T, D)), [32, 32, 1], [128, 1, 1])],
            tid=t,
            scale=s,
        )
        sdpa_flash = lambda t: w.op(
            "aten::_scaled_dot_product_flash_attention",
            [q, kv, kv, [], [], [], []],
            [BF16, BF16, BF16, "Scalar", "Scalar", "Scalar", ""],
            children=[fa],
            tid=t,
        )
        w.op(
            "aten::scaled_dot_product_attention",
            [q, kv, kv, [], [], [], [], []],
            [BF16, BF16, BF16, "", "Scalar", "Scalar", "", "Scalar"],
            children=[sdpa_flash],
        )
        linear(x, [H, HQ * D], scale)
        ew("aten::add", [x, x, []], EW_K, 3 * act, scale)
        linear(x, [2 * FFN, H], scale)
        ffn = [1, T, FFN]
        ew("aten::silu", [ffn], SILU_K, 2 * T * FFN * 2, scale)
        ew("aten::mul", [ffn, ffn], MUL_K, 3 * T * FFN * 2, scale)
        linear([1, T, FFN], [H, FFN], scale)
        w.op(
            "aten::bmm",
            [[HQ, 512, D], [HQ, D, 512]],
            [BF16, BF16],
            gemm_kernel(512, 512, D, scale, batch=HQ),
            scale=scale,
        )
        linear([1, 256, H], [H, H], scale, bias=True)
        for m, n, k in ((T, 2 * FFN, H), (T, H, FFN)):
            w.op(
                "aten::_scaled_mm",
                [[m, k], [k, n], [], [], [], [], []],
                [F8, F8, F32, F32, "", "", "Scalar"],
                gemm_kernel(m, n, k, scale, ta=F8, name=FP8_K),
                scale=scale,
            )
    # autograd thread: backward GEMMs (kernels carry only the correlation), flash backward (three kernels)
    for _layer, scale in enumerate((1.00, 1.01, 0.99)):
        bwd = lambda t, s=scale: w.op(
            "aten::_flash_attention_backward",
            [[1, T, HQ, D], [1, T, HQ, D], [1, T, HKV, D], [1, T, HKV, D], [1, T, HQ, D], [1, HQ, T], [], [], [], []],
            [BF16, BF16, BF16, BF16, BF16, F32, "", "", "Scalar", "Scalar"],
            [
                (k, w.time_s(_flash(1, HQ, HKV, T, D, backward=True)) * f, [32, 32, 1], [256, 1, 1])
                for k, f in zip(FLASH_BWD_K, (0.04, 0.91, 0.05))
            ],
            tid=t,
            scale=s,
        )
        w.op(
            "aten::_scaled_dot_product_flash_attention_backward",
            [
                [1, HQ, T, D],
                [1, HQ, T, D],
                [1, HKV, T, D],
                [1, HKV, T, D],
                [1, HQ, T, D],
                [1, HQ, T],
                [],
                [],
                [],
                [],
                [],
                [],
                [],
                [],
                [],
            ],
            [BF16] * 5 + [F32] + [""] * 9,
            children=[bwd],
            tid=2,
        )
        mm([T, FFN], [FFN, H], scale, tid=2, ext_on_kernel=False)(2)  # dgrad of the down projection
        mm([FFN, T], [T, H], scale, tid=2, ext_on_kernel=False)(2)  # wgrad
        ew("aten::copy_", [[H, H], [H, H], []], COPY_K, H * H * (4 + 2), scale, tid=2, types=[F32, BF16, "Scalar"])
    w.op("nccl:all_reduce", [[218_112_000]], [BF16], [(NCCL_K, 1.9e-3, [32, 1, 1], [640, 1, 1])], tid=2)
    w.events.append(
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy DtoH (Device -> Pinned)",
            "pid": 0,
            "tid": 7,
            "ts": round(w.gpu_t, 3),
            "dur": 2.1,
            "args": {"device": 0, "stream": 7, "correlation": w.corr, "bytes": 4, "memory bandwidth (GB/s)": 0.0019},
        }
    )
    meta = [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": w.pid, "tid": 0, "args": {"name": "python3"}},
        {"name": "process_name", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"name": "python3"}},
        {"name": "process_labels", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": 7, "args": {"name": "stream 7 "}},
    ]
    return {
        "schemaVersion": 1,
        "deviceProperties": [
            {
                "id": 0,
                "name": "NVIDIA H100 80GB HBM3",
                "totalGlobalMem": 85045870592,
                "computeMajor": 9,
                "computeMinor": 0,
                "maxThreadsPerBlock": 1024,
                "maxThreadsPerMultiprocessor": 2048,
                "regsPerBlock": 65536,
                "warpSize": 32,
                "sharedMemPerBlock": 49152,
                "numSms": 132,
                "sharedMemPerMultiprocessor": 233472,
            }
        ],
        "distributedInfo": {
            "backend": "nccl",
            "rank": 0,
            "world_size": 8,
            "pg_count": 1,
            "pg_config": [],
            "nccl_version": "2.21.5",
        },
        "record_shapes": 1,
        "with_stack": 0,
        "traceEvents": meta + w.events,
        "traceName": "h100_llama_layer.json",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1733000000000000000,
    }


def _n(d):
    out = 1
    for x in d:
        out *= x
    return out


def render() -> str:
    """One trace event a line, as export_chrome_trace writes them."""
    doc = build()
    events = doc.pop("traceEvents")
    head = json.dumps(doc, indent=1)[:-2]
    body = ",\n".join("  " + json.dumps(e) for e in events)
    return f'{head},\n "traceEvents": [\n{body}\n ]\n}}\n'


def main(argv=None) -> int:
    target = Path(argv[0]) if argv else HERE
    (target / "h100_llama_layer.json").write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
