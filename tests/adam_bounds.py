"""Comparing weights after Adam(W) steps of two computations that agree up to rounding (another layout, another BLAS
kernel): Adam divides each gradient by its own running magnitude, so a last-bit difference in a gradient near zero can
move that one weight by up to about 2 lr a step, however small the difference was. Compare losses and gradients for
closeness; for the weights, every element within the optimizer's bound and all but a few within the usual tolerance."""
import numpy as np


def assert_close_after_adam(actual, desired, lr, steps, rtol=1e-4, atol=1e-5, outliers=1e-3, err_msg=""):
    """Every element within ``2 * lr * steps`` (the most two Adam runs can drift apart) and at most an ``outliers``
    share (and at least one element's leeway) outside ``rtol`` / ``atol``."""
    actual, desired = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
    assert actual.shape == desired.shape, (err_msg, actual.shape, desired.shape)
    diff = np.abs(actual - desired)
    bound = 2 * lr * steps
    assert diff.max(initial=0.0) <= bound, f"{err_msg}: an element moved {diff.max():.3g} apart, more than Adam's " \
                                           f"2 lr steps = {bound:.3g}"
    far = int((diff > atol + rtol * np.abs(desired)).sum())
    allowed = max(1, int(outliers * diff.size))
    assert far <= allowed, f"{err_msg}: {far} of {diff.size} elements outside rtol {rtol} / atol {atol} (at most " \
                           f"{allowed} may be, from last-bit gradient differences); largest difference {diff.max():.3g}"
