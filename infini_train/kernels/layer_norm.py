"""Layer norm's backward over the last dimension: the input's gradient in one row-per-block pass (from the mean and
1/std the forward kept, float32 (rows, 1) arrays), the weight's and bias's gradients as column sums over chunks of
rows, the chunks then added in order (no atomics: the same sums every run). Sums are float32."""
from __future__ import annotations

import numpy as np

from .cuda_source import enabled, function, kernel_dtype, register

THREADS = 256
CHUNK_ROWS = 64  # rows per partial column sum of the weight's and bias's gradients

SOURCE = register("layer_norm", ("X", "W", "G"), r"""
// dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = g * weight
extern "C" __global__ void layer_norm_backward_input(const X_t* x, const G_t* g, const W_t* weight,
                                                     const float* mean, const float* rstd, X_t* dx, int size) {
    __shared__ float shared[33];
    const long long row = blockIdx.x;
    const X_t* xr = x + row * size;
    const G_t* gr = g + row * size;
    const float mu = mean[row], rs = rstd[row];
    float s1 = 0.0f, s2 = 0.0f;
    for (int j = threadIdx.x; j < size; j += blockDim.x) {
        const float d = LOAD_G(gr[j]) * (weight ? LOAD_W(weight[j]) : 1.0f);
        s1 += d;
        s2 += d * ((LOAD_X(xr[j]) - mu) * rs);
    }
    const float mean_d = block_reduce(s1, shared, false) / size;
    const float mean_dx = block_reduce(s2, shared, false) / size;
    for (int j = threadIdx.x; j < size; j += blockDim.x) {
        const float d = LOAD_G(gr[j]) * (weight ? LOAD_W(weight[j]) : 1.0f);
        const float xhat = (LOAD_X(xr[j]) - mu) * rs;
        dx[row * size + j] = STORE_X(rs * (d - mean_d - xhat * mean_dx));
    }
}

// partial[c, j] = sum over the rows of chunk c of g * xhat (weight) and g (bias)
extern "C" __global__ void layer_norm_backward_params(const X_t* x, const G_t* g, const float* mean,
                                                      const float* rstd, float* partial_w, float* partial_b,
                                                      long long rows, int size, int chunk_rows) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= size) return;
    const long long first = (long long)blockIdx.y * chunk_rows;
    const long long last = first + chunk_rows < rows ? first + chunk_rows : rows;
    float sw = 0.0f, sb = 0.0f;
    for (long long r = first; r < last; ++r) {
        const float gv = LOAD_G(g[r * size + j]);
        sw += gv * ((LOAD_X(x[r * size + j]) - mean[r]) * rstd[r]);
        sb += gv;
    }
    partial_w[(long long)blockIdx.y * size + j] = sw;
    partial_b[(long long)blockIdx.y * size + j] = sb;
}
""")


def _pointer(array):
    """An array argument, or the null pointer for a missing weight."""
    return array if array is not None else np.uint64(0)


def _roles(x, g, weight):
    """The dtypes of x, g and the weight as the kernels take them, or None where the array code should run."""
    if not enabled() or not x.flags.c_contiguous or kernel_dtype(x.dtype) is None:
        return None
    params = [weight] if weight is not None else []
    w_dtype = params[0].dtype.name if params else x.dtype.name
    if any(p.dtype.name != w_dtype or not p.flags.c_contiguous for p in params) or kernel_dtype(w_dtype) is None:
        return None
    if g.shape != x.shape or not g.flags.c_contiguous or kernel_dtype(g.dtype) is None:
        return None
    return dict(X=x.dtype.name, W=w_dtype, G=g.dtype.name)


def backward(cp, x, g, weight, mean, rstd, size, need_x, need_params):
    """(dx in x's dtype or None, float32 column sums (g * xhat, g) or None), or None where the array code runs."""
    roles = _roles(x, g, weight)
    if roles is None or any(s.dtype != np.float32 or not s.flags.c_contiguous for s in (mean, rstd)):
        return None
    rows = x.size // size
    dx = sums = None
    if need_x:
        kernel = function("layer_norm", "layer_norm_backward_input", **roles)
        if kernel is None:
            return None
        dx = cp.empty_like(x)
        kernel((rows,), (THREADS,), (x, g, _pointer(weight), mean, rstd, dx, np.int32(size)))
    if need_params:
        kernel = function("layer_norm", "layer_norm_backward_params", **roles)
        if kernel is None:
            return None
        chunks = -(-rows // CHUNK_ROWS)
        partial_w, partial_b = cp.empty((chunks, size), cp.float32), cp.empty((chunks, size), cp.float32)
        kernel((-(-size // THREADS), chunks), (THREADS,), (x, g, mean, rstd, partial_w, partial_b, np.int64(rows),
                                                          np.int32(size), np.int32(CHUNK_ROWS)))
        sums = partial_w.sum(axis=0), partial_b.sum(axis=0)
    return dx, sums
