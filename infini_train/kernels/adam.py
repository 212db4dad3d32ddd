"""The Adam / AdamW update of one float32 parameter in one pass (4 arrays read, 3 written), rounding every operation
as the array code in optim/adam.py does (compiled without fused multiply-adds): the same bits, in one launch
instead of a dozen."""
from __future__ import annotations

import numpy as np

from .cuda_source import enabled, function, launch_1d, register

SOURCE = register("adam", (), r"""
extern "C" __global__ void adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                                     long long n, float l2_decay, float decay_factor, int decoupled, float weight1,
                                     float weight1_complement, int small_weight1, float beta2, float weight2,
                                     float bias_correction2_sqrt, float eps, float step_size) {
    FOR_EACH(i, n) {
        float p = param[i];
        float g = grad[i];
        if (l2_decay != 0.0f) g = p * l2_decay + g;  // Adam's L2 decay: grad + wd * param
        if (decoupled) p = p * decay_factor;         // AdamW: param *= 1 - lr * wd
        float m = exp_avg[i];
        const float diff = g - m;                    // lerp(m, g, 1 - beta1), torch's two formulas
        m = small_weight1 ? m + diff * weight1 : g - diff * weight1_complement;
        float v = exp_avg_sq[i] * beta2;
        v = v + (g * weight2) * g;
        float denom = sqrtf(v) / bias_correction2_sqrt;
        denom = denom + eps;
        param[i] = p - (m / denom) * step_size;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}
""")


def step(param, grad, exp_avg, exp_avg_sq, *, lr, beta1, beta2, eps, weight_decay, decoupled, step_number):
    """One update in place; False where the array code should run (dtypes other than float32, strided arrays)."""
    arrays = (param, grad, exp_avg, exp_avg_sq)
    if not enabled() or any(a.dtype != np.float32 or not a.flags.c_contiguous or a.shape != param.shape
                            for a in arrays):
        return False
    kernel = function("adam", "adam_step")
    if kernel is None:
        return False
    weight1 = 1.0 - beta1
    grid, block = launch_1d(param.size)
    f32 = np.float32
    kernel(grid, block, (param, grad, exp_avg, exp_avg_sq, np.int64(param.size),
                         f32(weight_decay if weight_decay and not decoupled else 0.0), f32(1.0 - lr * weight_decay),
                         np.int32(bool(weight_decay) and decoupled), f32(weight1), f32(1.0 - weight1),
                         np.int32(weight1 < 0.5), f32(beta2),
                         f32(1.0 - beta2), f32((1.0 - beta2 ** step_number) ** 0.5), f32(eps),
                         f32(lr / (1.0 - beta1 ** step_number))))
    return True
