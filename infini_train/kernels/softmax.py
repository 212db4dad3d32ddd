"""Attention's row softmax and its backward, one block per row of a block of scores: the forward scales a row of
q @ k^T, masks the keys after the row's query (causal, top-left aligned as torch), and writes the probabilities in
float32 (in place over float32 scores); the backward turns dP into dS = P * dP - P * sum(P * dP) in place."""
from __future__ import annotations

import numpy as np

from .cuda_source import enabled, function, kernel_dtype, register

THREADS = 256

SOURCE = register("softmax", ("S",), r"""
// row r of the scores is query q0 + (r % rows_per_matrix); causal rows see keys 0 .. that query
extern "C" __global__ void softmax_rows(const S_t* scores, float* probs, int keys, float scale, int causal,
                                        int q0, int rows_per_matrix) {
    __shared__ float shared[33];
    const long long row = blockIdx.x;
    const S_t* sr = scores + row * keys;
    float* pr = probs + row * keys;
    int seen = keys;
    if (causal) { const int query = q0 + (int)(row % rows_per_matrix); seen = query + 1 < keys ? query + 1 : keys; }
    float m = __int_as_float(0xff800000);
    for (int j = threadIdx.x; j < seen; j += blockDim.x) m = fmaxf(m, LOAD_S(sr[j]) * scale);
    m = block_reduce(m, shared, true);
    float s = 0.0f;
    for (int j = threadIdx.x; j < seen; j += blockDim.x) s += expf(LOAD_S(sr[j]) * scale - m);
    s = block_reduce(s, shared, false);
    for (int j = threadIdx.x; j < keys; j += blockDim.x) pr[j] = j < seen ? expf(LOAD_S(sr[j]) * scale - m) / s : 0.0f;
}

// dp <- p * dp - p * sum(p * dp), row by row
extern "C" __global__ void softmax_rows_backward(const float* probs, float* dp, int keys) {
    __shared__ float shared[33];
    const long long row = blockIdx.x;
    const float* pr = probs + row * keys;
    float* dr = dp + row * keys;
    float s = 0.0f;
    for (int j = threadIdx.x; j < keys; j += blockDim.x) s += pr[j] * dr[j];
    s = block_reduce(s, shared, false);
    for (int j = threadIdx.x; j < keys; j += blockDim.x) { const float p = pr[j]; dr[j] = p * dr[j] - p * s; }
}
""")


def rows(cp, scores, scale, causal, q0, rows_per_matrix):
    """float32 probabilities of the scores' rows (in place when the scores are float32), or None."""
    if not enabled() or not scores.flags.c_contiguous or kernel_dtype(scores.dtype) is None or scores.size == 0:
        return None
    kernel = function("softmax", "softmax_rows", S=scores.dtype.name)
    if kernel is None:
        return None
    keys = scores.shape[-1]
    probs = scores if scores.dtype == np.float32 else cp.empty(scores.shape, cp.float32)
    kernel((scores.size // keys,), (THREADS,), (scores, probs, np.int32(keys), np.float32(scale), np.int32(causal),
                                                np.int32(q0), np.int32(rows_per_matrix)))
    return probs


def rows_backward(cp, probs, dp):
    """dp, overwritten by the scores' gradient; None where the array code should run."""
    if (not enabled() or dp.shape != probs.shape or dp.dtype != np.float32 or probs.dtype != np.float32
            or not (dp.flags.c_contiguous and probs.flags.c_contiguous) or dp.size == 0):
        return None
    kernel = function("softmax", "softmax_rows_backward", S="float32")
    if kernel is None:
        return None
    keys = dp.shape[-1]
    kernel((dp.size // keys,), (THREADS,), (probs, dp, np.int32(keys)))
    return dp
