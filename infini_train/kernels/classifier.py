"""Softmax + cross-entropy over the vocabulary without the probabilities (llm.c's fused classifier, split into the
autograd's two passes): the forward reads each row of logits once, keeping a running max and a running sum of
exponentials per thread (online softmax), merges the threads' pairs, and writes the row's max m, sum s and loss
(m - x[target]) + log s (the difference first: exact for logits close together, however large); the backward reads
the row once more and writes exp(x - m) * (scale / s) - onehot(target) * scale, the gradient of the reduced loss, in
the logits' dtype (the array code's arithmetic: exponentials times a per-row factor). A registry kernel
(registry.py); reference/classifier.py is the same arithmetic in NumPy.

One block of 256 threads per row; thread t visits columns t, t + 256, ... in order. A thread's pair (m, s) takes
x as: x > m: s = s exp(m - x) + 1, m = x; otherwise s += exp(x - m) (a -inf logit adds nothing). Pairs merge as
m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m) (0 if m is -inf): a warp's butterfly (16, 8, 4, 2, 1), then
warp 0 merges the 8 warps' pairs the same way (lanes past them hold (-inf, 0)).
"""
from __future__ import annotations

import numpy as np

from . import registry
from .cuda_source import function, kernel_dtype, register

NAME = "fused_classifier"
THREADS = 256

SOURCE = register("classifier", ("X",), r"""
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ void merge(float* m, float* s, float m2, float s2) {
    const float top = fmaxf(*m, m2);
    *s = top == NEG_INF ? 0.0f : *s * expf(*m - top) + s2 * expf(m2 - top);
    *m = top;
}

__device__ __forceinline__ void warp_merge(float* m, float* s) {
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, *m, o), s2 = __shfl_xor_sync(0xffffffffu, *s, o);
        merge(m, s, m2, s2);
    }
}

// losses[r] = (m - x[r, targets[r]]) + log s (0 where targets[r] == ignore_index): row_max[r] = m = max x[r, :],
// row_sum[r] = s = sum exp(x[r, :] - m)
extern "C" __global__ void __launch_bounds__(256) classifier_forward(const X_t* logits, const long long* targets,
                                                                     float* losses, float* row_max, float* row_sum,
                                                                     int classes, long long ignore_index) {
    __shared__ float shared_m[32], shared_s[32];
    const long long row = blockIdx.x;
    const X_t* x = logits + row * classes;
    float m = NEG_INF, s = 0.0f;
    for (int j = threadIdx.x; j < classes; j += blockDim.x) {
        const float v = LOAD_X(x[j]);
        if (v > m) { s = s * expf(m - v) + 1.0f; m = v; }
        else if (v != NEG_INF) s += expf(v - m);
    }
    warp_merge(&m, &s);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { shared_m[warp] = m; shared_s[warp] = s; }
    __syncthreads();
    if (warp == 0) {
        m = lane < (int)(blockDim.x >> 5) ? shared_m[lane] : NEG_INF;
        s = lane < (int)(blockDim.x >> 5) ? shared_s[lane] : 0.0f;
        warp_merge(&m, &s);
        if (lane == 0) {
            const long long t = targets[row];
            row_max[row] = m;
            row_sum[row] = s;
            losses[row] = t == ignore_index ? 0.0f : (m - LOAD_X(x[t])) + logf(s);
        }
    }
}

// dlogits[r, j] = exp(x[r, j] - row_max[r]) * (scale[r] / row_sum[r]) - (j == targets[r]) * scale[r]
extern "C" __global__ void __launch_bounds__(256) classifier_backward(const X_t* logits, const long long* targets,
                                                                      const float* row_max, const float* row_sum,
                                                                      const float* scale, X_t* dlogits,
                                                                      int classes) {
    const long long row = blockIdx.x;
    const X_t* x = logits + row * classes;
    X_t* dx = dlogits + row * classes;
    const float m = row_max[row], factor = scale[row] / row_sum[row], row_scale = scale[row];
    const long long t = targets[row];
    for (int j = threadIdx.x; j < classes; j += blockDim.x) {
        const float d = expf(LOAD_X(x[j]) - m) * factor;
        dx[j] = STORE_X(j == t ? d - row_scale : d);
    }
}
""")


def why_not(x, targets):
    """None where the kernels take (rows, classes) logits and their (rows,) targets, else why the array path runs."""
    if not registry.use(NAME):
        return "off (INFINI_TRAIN_KERNELS does not name it)"
    if isinstance(x, np.ndarray):
        return "host arrays"
    if kernel_dtype(x.dtype) is None:
        return f"logits of dtype {x.dtype}"
    if x.ndim != 2 or not x.flags.c_contiguous or 0 in x.shape or x.shape[1] >= 2 ** 31:
        return f"logits of shape {x.shape} (contiguous: {x.flags.c_contiguous})"
    if targets.shape != (x.shape[0],) or targets.dtype.kind not in "iu":
        return f"targets of shape {targets.shape}, dtype {targets.dtype}"
    return None


def ready(dtype):
    return function("classifier", "classifier_forward", X=np.dtype(dtype).name) is not None


def forward(cp, x, targets, ignore_index):
    """(losses, row_max, row_sum), float32 (rows,): each row's loss (0 where ignored), max and sum of exp(x - max)."""
    kernel = function("classifier", "classifier_forward", X=x.dtype.name)
    rows, classes = x.shape
    losses, row_max, row_sum = (cp.empty(rows, cp.float32) for _ in range(3))
    targets = cp.ascontiguousarray(targets, dtype=cp.int64)
    kernel((rows,), (THREADS,), (x, targets, losses, row_max, row_sum, np.int32(classes), np.int64(ignore_index)))
    return losses, row_max, row_sum


def backward(cp, x, targets, row_max, row_sum, scale):
    """The logits' gradient in their dtype: (softmax - onehot) times ``scale`` (rows,), the reduced loss's gradient
    with respect to each row's loss (0 for ignored rows)."""
    kernel = function("classifier", "classifier_backward", X=x.dtype.name)
    rows, classes = x.shape
    dx = cp.empty_like(x)
    kernel((rows,), (THREADS,), (x, cp.ascontiguousarray(targets, dtype=cp.int64), row_max, row_sum,
                                 cp.ascontiguousarray(scale, dtype=cp.float32), dx, np.int32(classes)))
    return dx
