"""Element-wise kernels over cache-sized blocks: the bits of one call over the whole arrays."""
import numpy as np

from infini_train.autograd.ops.blocked import BLOCK, elementwise


def _kernel(x, out):
    np.multiply(x, x, out=out)
    out *= 0.25
    np.tanh(out, out=out)
    out += x


def test_blocks_give_the_bits_of_one_whole_call():
    x = np.random.default_rng(0).standard_normal((97, 3 * BLOCK // 97 + 5)).astype(np.float32)  # a ragged last block
    whole = np.empty_like(x)
    _kernel(x, whole)
    sizes = []

    def recorded(*pieces):
        sizes.append(pieces[0].size)
        _kernel(*pieces)

    out = np.empty_like(x)
    elementwise(recorded, (x, out))
    np.testing.assert_array_equal(out, whole)
    assert sum(sizes) == x.size and max(sizes) == BLOCK and len(sizes) == -(-x.size // BLOCK)


def test_small_strided_or_mismatched_arrays_run_in_one_call():
    rng = np.random.default_rng(1)
    calls = []

    def negate(a, b):
        calls.append(a.shape)
        np.negative(a, out=b)

    small = rng.standard_normal(2 * BLOCK - 1).astype(np.float32)
    strided = np.asfortranarray(rng.standard_normal((512, 512)).astype(np.float32))  # not C-contiguous
    for a in (small, strided):
        out = np.empty_like(a)
        elementwise(negate, (a, out))
        np.testing.assert_array_equal(out, -a)
    assert calls == [small.shape, strided.shape]
    big = rng.standard_normal((4, BLOCK)).astype(np.float32)
    elementwise(lambda a, b: calls.append((a.shape, b.shape)), (big, big[:1]))  # shapes differ: no blocks
    assert calls[-1] == ((4, BLOCK), (1, BLOCK))
