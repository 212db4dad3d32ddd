"""Run under ``mpiexec -n N python worker_tensor_parallel.py`` (N = 1, 2, 4), or as a plain ``python
worker_tensor_parallel.py`` (a world of one): tensor parallelism against single-device references built from the
same whole weights on every rank. Checks each mapping's forward and backward against its definition, ShardSpec round
trips, ColumnParallelLinear / RowParallelLinear / VocabParallelEmbedding / vocab_parallel_cross_entropy (outputs and
the gradients of inputs and of every whole parameter), an MLP and an attention block (column -> row), the same on
sub-groups of two ranks when the world has four, and the error cases. Prints "rank R TP OK <checks>"."""
import itertools

import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train import nn
from infini_train.nn import functional as F
from infini_train.nn.parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    ShardSpec,
    VocabParallelEmbedding,
    all_reduce_sequence_parallel_grads,
    copy_to_tensor_parallel_region,
    whole_from_shards,
    gather_from_sequence_parallel_region,
    gather_from_tensor_parallel_region,
    mark_sequence_parallel,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
    shard_from_whole,
    vocab_parallel_cross_entropy,
)
from tests.distributed.rank_checks import RankChecks

world_group = dist.init_process_group(timeout=60)
RANK = world_group.rank
check = RankChecks(RANK)
RTOL, ATOL = 1e-5, 1e-6


def close(got, want, what):
    got = got.numpy() if hasattr(got, "numpy") else got
    want = want.numpy() if hasattr(want, "numpy") else want
    check(got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}")
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"rank {RANK}: {what}")


def raises(fn, *needles):
    try:
        fn()
    except ValueError as exc:
        for needle in needles:
            check(needle in str(exc), f"error message {str(exc)!r} lacks {needle!r}")
        return
    raise AssertionError(f"rank {RANK}: expected a ValueError containing {needles}")


def data(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def leaf(array):
    return it.tensor(array, requires_grad=True)


def chunk(array, rank, size, dim):
    return np.split(array, size, axis=dim)[rank]


# ------------------------------------------------------------------------------------------------- mappings
def mapping_checks(group):
    rank, size = group.rank, group.size
    per_rank = [data(100 + r, (2 * size, 4 * size, 3 * size)) for r in range(size)]  # x on rank r
    grads = [data(200 + r, (2 * size, 4 * size, 3 * size)) for r in range(size)]  # upstream gradient on rank r
    mine, total = per_rank[rank], sum(per_rank)

    x = leaf(mine)
    y = copy_to_tensor_parallel_region(x, group)
    close(y, mine, "copy forward")
    y.backward(it.tensor(grads[rank]))
    close(x.grad, sum(grads), "copy backward: all-reduce")

    x = leaf(mine)
    y = reduce_from_tensor_parallel_region(x, group)
    close(y, total, "reduce forward: all-reduce")
    y.backward(it.tensor(grads[rank]))
    close(x.grad, grads[rank], "reduce backward: identity")

    for scatter in (scatter_to_tensor_parallel_region, lambda t, g: scatter_to_sequence_parallel_region(t, g, 2)):
        x = leaf(mine)
        y = scatter(x, group)
        close(y, chunk(mine, rank, size, -1), "scatter forward: my chunk of the last dim")
        g = [chunk(a, r, size, -1) for r, a in enumerate(grads)]
        y.backward(it.tensor(g[rank]))
        close(x.grad, np.concatenate(g, -1), "scatter backward: all-gather along the last dim")

    x = leaf(chunk(mine, rank, size, -1))
    y = gather_from_tensor_parallel_region(x, group)
    close(y, np.concatenate([chunk(a, r, size, -1) for r, a in enumerate(per_rank)], -1), "gather forward")
    y.backward(it.tensor(grads[rank]))
    close(x.grad, chunk(grads[rank], rank, size, -1), "gather backward: my chunk")

    for dim in (1, 0, -2):
        x = leaf(mine)
        y = scatter_to_sequence_parallel_region(x, group, dim)
        close(y, chunk(mine, rank, size, dim), f"sequence scatter forward (dim {dim})")
        g = [chunk(a, r, size, dim) for r, a in enumerate(grads)]
        y.backward(it.tensor(g[rank]))
        close(x.grad, np.concatenate(g, dim), f"sequence scatter backward (dim {dim})")

        parts = [chunk(a, r, size, dim) for r, a in enumerate(per_rank)]
        x = leaf(parts[rank])
        y = gather_from_sequence_parallel_region(x, group, dim)
        close(y, np.concatenate(parts, dim), f"sequence gather forward (dim {dim})")
        y.backward(it.tensor(grads[rank]))
        close(x.grad, chunk(sum(grads), rank, size, dim), f"sequence gather backward: reduce-scatter (dim {dim})")

        x = leaf(mine)
        y = reduce_scatter_to_sequence_parallel_region(x, group, dim)
        close(y, chunk(total, rank, size, dim), f"reduce-scatter forward (dim {dim})")
        g = [chunk(a, r, size, dim) for r, a in enumerate(grads)]
        y.backward(it.tensor(g[rank]))
        close(x.grad, np.concatenate(g, dim), f"reduce-scatter backward: all-gather (dim {dim})")

    # float64 keeps its dtype through every collective
    x = leaf(mine.astype(np.float64))
    y = reduce_from_tensor_parallel_region(gather_from_sequence_parallel_region(x, group), group)
    check(y.dtype == it.float64, f"float64 through the mappings, got {y.dtype}")
    # the input is never written by a collective
    before = mine.copy()
    x = it.tensor(mine)
    reduce_from_tensor_parallel_region(x, group)
    check(np.array_equal(x.numpy(), before), "reduce_from_tensor_parallel_region left its input untouched")


# ----------------------------------------------------------------------------------------------- shard specs
def spec_checks(group):
    rank, size = group.rank, group.size
    full = np.arange(6 * size * 5, dtype=np.float32).reshape(6 * size, 5)
    for blocks in (1, 2, 3):
        spec = ShardSpec(0, blocks)
        shard = shard_from_whole(full, spec, rank, size, np)
        want = np.concatenate([chunk(b, rank, size, 0) for b in np.split(full, blocks, 0)], 0)
        check(np.array_equal(shard, want), f"shard_from_whole blocks={blocks}")
        check(np.array_equal(whole_from_shards(shard, spec, group), full), f"round trip blocks={blocks}")
        wide = full.T.copy()
        shard = shard_from_whole(wide, ShardSpec(1, blocks), rank, size, np)
        check(np.array_equal(shard, want.T), f"shard_from_whole dim 1 blocks={blocks}")
        check(np.array_equal(whole_from_shards(shard, ShardSpec(-1, blocks), group), wide), "round trip dim -1")
    vocab = np.arange(257 * 2, dtype=np.float32).reshape(257, 2) + 1
    for multiple in (1, 64):
        spec = ShardSpec(0, whole_size=257, pad_to_multiple_of=multiple)
        padded = spec.padded_length(257, size)
        check(padded % (size * multiple) == 0 and 257 <= padded < 257 + size * multiple, f"padded length {padded}")
        shard = shard_from_whole(vocab, spec, rank, size, np)
        whole = np.concatenate([vocab, np.zeros((padded - 257, 2), np.float32)])
        check(np.array_equal(shard, chunk(whole, rank, size, 0)), f"padded shard (multiple {multiple})")
        check(np.array_equal(shard_from_whole(whole, spec, rank, size, np), shard), "an already padded full array")
        back = whole_from_shards(it.tensor(shard), spec, group)
        check(np.array_equal(back, vocab), f"padding dropped on the way back (multiple {multiple})")
    raises(lambda: shard_from_whole(np.zeros((6 * size + 1, 2)), ShardSpec(0, 3), rank, size, np),
           f"divisible by group size x blocks = {size} x 3 = {3 * size}", "HINT")
    raises(lambda: shard_from_whole(np.zeros((250, 2)), ShardSpec(0, whole_size=257), rank, size, np),
           "whole_size=257", "got an array of shape (250, 2)", "HINT")


# -------------------------------------------------------------------------------------------- linear layers
def column_checks(group):
    rank, size = group.rank, group.size
    batch, seq, width, out = 2, 2 * size, 8, 6 * size
    for blocks, gather_output, sequence_parallel in itertools.product((1, 3), (False, True), (False, True)):
        label = f"ColumnParallelLinear blocks={blocks} gather_output={gather_output} sequence={sequence_parallel}"
        it.manual_seed(1)
        full = nn.Linear(width, out)
        tp = ColumnParallelLinear.from_linear(full, group, blocks, gather_output, sequence_parallel)
        spec = ShardSpec(0, blocks)
        check(tp.weight.placement.tensor_shard == spec and tp.bias.placement.tensor_shard == spec,
              f"{label}: tensor_shard")
        check(tuple(tp.weight.shape) == (out // size, width), f"{label}: weight shape {tuple(tp.weight.shape)}")
        x_full, g_full = data(3, (batch, seq, width)), data(4, (batch, seq, out))
        x_ref = leaf(x_full)
        y_ref = full(x_ref)
        y_ref.backward(it.tensor(g_full))

        x = leaf(chunk(x_full, rank, size, 1) if sequence_parallel else x_full)
        y = tp(x)
        want_y, g = y_ref.numpy(), g_full
        if not gather_output:  # this rank's output features, in the full layer's block layout
            want_y, g = (shard_from_whole(a, ShardSpec(-1, blocks), rank, size, np) for a in (want_y, g))
        close(y, want_y, f"{label}: forward")
        y.backward(it.tensor(g))
        want_x = x_ref.grad.numpy()
        close(x.grad, chunk(want_x, rank, size, 1) if sequence_parallel else want_x, f"{label}: input grad")
        close(whole_from_shards(tp.weight.grad, spec, group), full.weight.grad, f"{label}: weight grad")
        close(whole_from_shards(tp.bias.grad, spec, group), full.bias.grad, f"{label}: bias grad")

    it.manual_seed(7)
    full = nn.Linear(width, out)
    it.manual_seed(7)
    built = ColumnParallelLinear(width, out, group=group, blocks=3)
    check(np.array_equal(built.weight.numpy(), shard_from_whole(full.weight.numpy(), ShardSpec(0, 3), rank, size, np)),
          "a seeded ColumnParallelLinear holds the shard of the seeded Linear")
    check(ColumnParallelLinear(width, out, bias=False, group=group).bias is None, "bias=False")
    raises(lambda: ColumnParallelLinear(width, 6 * size + 1, group=group) if size > 1 else
           ColumnParallelLinear(width, 7, group=group, blocks=3),
           "ColumnParallelLinear: expected out_features divisible by the tensor-parallel group size", "HINT")
    raises(lambda: ColumnParallelLinear(width, 4 * size, group=group, blocks=3),
           f"group size {size} x blocks 3 = {3 * size}, got out_features={4 * size}")


def row_checks(group):
    rank, size = group.rank, group.size
    batch, seq, width, out = 2, 2 * size, 4 * size, 6
    for input_is_parallel, sequence_parallel in itertools.product((True, False), (False, True)):
        label = f"RowParallelLinear input_is_parallel={input_is_parallel} sequence={sequence_parallel}"
        it.manual_seed(2)
        full = nn.Linear(width, out)
        tp = RowParallelLinear.from_linear(full, group, input_is_parallel, sequence_parallel)
        check(tp.weight.placement.tensor_shard == ShardSpec(1) and tp.bias.placement.tensor_shard is None,
              f"{label}: tensor_shard")
        check(tp.bias.placement.sequence_parallel == sequence_parallel, f"{label}: bias placed sequence_parallel")
        x_full, g_full = data(5, (batch, seq, width)), data(6, (batch, seq, out))
        x_ref = leaf(x_full)
        y_ref = full(x_ref)
        y_ref.backward(it.tensor(g_full))

        x = leaf(chunk(x_full, rank, size, -1) if input_is_parallel else x_full)
        y = tp(x)
        mine = (lambda a: chunk(a, rank, size, 1)) if sequence_parallel else (lambda a: a)
        close(y, mine(y_ref.numpy()), f"{label}: forward")
        y.backward(it.tensor(mine(g_full)))
        want_x = x_ref.grad.numpy()
        close(x.grad, chunk(want_x, rank, size, -1) if input_is_parallel else want_x, f"{label}: input grad")
        close(whole_from_shards(tp.weight.grad, ShardSpec(1), group), full.weight.grad, f"{label}: weight grad")
        all_reduce_sequence_parallel_grads(tp, group)
        close(tp.bias.grad, full.bias.grad, f"{label}: bias grad")
    if size > 1:
        raises(lambda: RowParallelLinear(4 * size + 1, out, group=group),
               "RowParallelLinear: expected in_features divisible", f"got in_features={4 * size + 1}", "HINT")


# --------------------------------------------------------------------------------------------------- vocab
def embedding_checks(group):
    rank, size = group.rank, group.size
    ids = np.array([[0, 1, 128, 129, 256, 255, 64, 0, 200], [3, 3, 3, 130, 131, 256, 2, 190, 65]])
    for multiple in (1, 64):
        label = f"VocabParallelEmbedding pad_to_multiple_of={multiple}"
        it.manual_seed(3)
        full = nn.Embedding(257, 6)
        tp = VocabParallelEmbedding.from_embedding(full, group, pad_to_multiple_of=multiple)
        per = tp.num_embeddings_per_partition
        check(tp.padded_num_embeddings == per * size and tp.padded_num_embeddings % (size * multiple) == 0,
              f"{label}: padded size {tp.padded_num_embeddings}")
        check(tp.vocab_range == (rank * per, (rank + 1) * per), f"{label}: vocab_range {tp.vocab_range}")
        g = data(8, (2, 9, 6))
        y_ref = full(it.tensor(ids))
        y_ref.backward(it.tensor(g))
        y = tp(it.tensor(ids))
        close(y, y_ref, f"{label}: forward")
        y.backward(it.tensor(g))
        close(whole_from_shards(tp.weight.grad, tp.weight.placement.tensor_shard, group), full.weight.grad,
              f"{label}: weight grad")
        start = rank * per
        padding_rows = tp.weight.grad.numpy()[max(257 - start, 0):]
        check(not padding_rows.any(), f"{label}: padding rows get no gradient")
        check(not tp.weight.numpy()[max(257 - start, 0):].any(), f"{label}: padding rows are zero")
    try:
        tp(it.tensor(np.array([0, 257])))
        raise AssertionError("an id past the vocabulary was accepted")
    except ValueError as exc:
        check("ids in [0, 257)" in str(exc) and "id 257" in str(exc), f"id range error: {exc}")


def cross_entropy_checks(group):
    rank, size = group.rank, group.size
    vocab, rows = 257, 12
    for multiple, ignore_index in ((1, -100), (64, -100), (64, 5)):
        target = np.array([0, 256, 5, ignore_index, 128, 129, 127, 64, ignore_index, 200, 1, 255])
        label = f"vocab_parallel_cross_entropy pad_to_multiple_of={multiple} ignore_index={ignore_index}"
        padded = ShardSpec(0, whole_size=vocab, pad_to_multiple_of=multiple).padded_length(vocab, size)
        logits = data(9, (rows, vocab)) * 3
        garbage = np.full((rows, padded - vocab), 1e3, np.float32)  # padding columns must never count
        shard_cols = chunk(np.concatenate([logits, garbage], 1), rank, size, 1)
        g = data(10, (rows,))
        ref_in = leaf(logits)
        ref = F.cross_entropy(ref_in, it.tensor(target), ignore_index=ignore_index, reduction="none")
        ref.backward(it.tensor(g))
        x = leaf(shard_cols)
        losses = vocab_parallel_cross_entropy(x, it.tensor(target), group, vocab, ignore_index=ignore_index)
        check(losses.dtype == it.float32, f"{label}: float32 losses")
        close(losses, ref, f"{label}: losses")
        check(not losses.numpy()[target == ignore_index].any(), f"{label}: 0 where ignored")
        losses.backward(it.tensor(g))
        want = chunk(np.concatenate([ref_in.grad.numpy(), np.zeros_like(garbage)], 1), rank, size, 1)
        close(x.grad, want, f"{label}: logits grad (padding columns zero)")
    x = leaf(chunk(data(11, (2, 3, 8 * size)), rank, size, -1))
    t = np.array([[0, 1, 2], [3, 4, 8 * size - 1]])
    losses = vocab_parallel_cross_entropy(x, it.tensor(t), group, 8 * size)
    check(tuple(losses.shape) == (2, 3), f"(B, T, V_local) logits give (B, T) losses, got {tuple(losses.shape)}")
    try:
        vocab_parallel_cross_entropy(leaf(np.zeros((2, 4), np.float32)), it.tensor([0, 4 * size]), group, 4 * size)
        raise AssertionError("a target past the vocabulary was accepted")
    except ValueError as exc:
        check(f"target values in [0, {4 * size})" in str(exc) and "HINT" in str(exc), f"target range error: {exc}")


# ---------------------------------------------------------------------------------------------------- chains
def mlp_checks(group, seed):
    """layer norm -> column -> gelu -> row; under sequence parallelism the layer norm runs on sequence shards and its
    (partial) gradients are summed by all_reduce_sequence_parallel_grads, with the row-parallel bias's."""
    rank, size = group.rank, group.size
    batch, seq, width = 2, 2 * size, 8
    for sequence_parallel in (False, True):
        label = f"MLP (group of {size}, sequence={sequence_parallel})"
        it.manual_seed(4)
        ln, fc, proj = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        with it.no_grad():
            ln.weight.copy_(it.tensor(1 + data(seed + 2, (width,))))
            ln.bias.copy_(it.tensor(data(seed + 3, (width,))))
        tp_ln = nn.LayerNorm(width)
        tp_ln.load_state_dict(ln.state_dict())
        if sequence_parallel:
            mark_sequence_parallel(tp_ln)
        tp_fc = ColumnParallelLinear.from_linear(fc, group, sequence_parallel=sequence_parallel)
        tp_proj = RowParallelLinear.from_linear(proj, group, sequence_parallel=sequence_parallel)
        x_full, g_full = data(seed, (batch, seq, width)), data(seed + 1, (batch, seq, width))
        x_ref = leaf(x_full)
        y_ref = proj(F.gelu(fc(ln(x_ref)), approximate="tanh"))
        y_ref.backward(it.tensor(g_full))
        mine = (lambda a: chunk(a, rank, size, 1)) if sequence_parallel else (lambda a: a)
        x = leaf(mine(x_full))
        y = tp_proj(F.gelu(tp_fc(tp_ln(x)), approximate="tanh"))
        close(y, mine(y_ref.numpy()), f"{label}: forward")
        y.backward(it.tensor(mine(g_full)))
        close(x.grad, mine(x_ref.grad.numpy()), f"{label}: input grad")
        chain = nn.ModuleDict({"ln": tp_ln, "fc": tp_fc, "proj": tp_proj})
        all_reduce_sequence_parallel_grads(chain, group)
        marked = sorted(n for n, p in chain.named_parameters() if p.placement.sequence_parallel)
        check(marked == (["ln.bias", "ln.weight", "proj.bias"] if sequence_parallel else []), f"{label}: {marked}")
        for name, tp_p, p in [("ln.weight", tp_ln.weight, ln.weight), ("ln.bias", tp_ln.bias, ln.bias),
                              ("fc.weight", tp_fc.weight, fc.weight), ("fc.bias", tp_fc.bias, fc.bias),
                              ("proj.weight", tp_proj.weight, proj.weight), ("proj.bias", tp_proj.bias, proj.bias)]:
            spec = tp_p.placement.tensor_shard
            grad = whole_from_shards(tp_p.grad, spec, group) if spec else tp_p.grad
            close(grad, p.grad, f"{label}: {name} grad")


def attention_checks(group):
    """GPT-2's attention: c_attn (fused q|k|v, blocks=3) column-parallel by heads, c_proj row-parallel."""
    size = group.size
    batch, seq, heads, head_dim = 2, 4, 2 * size, 3
    width = heads * head_dim

    def attend(qkv, n_head):
        q, k, v = qkv.split(qkv.shape[-1] // 3, dim=-1)
        q, k, v = (t.reshape(batch, seq, n_head, head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(batch, seq, n_head * head_dim)

    it.manual_seed(5)
    c_attn, c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
    tp_attn = ColumnParallelLinear.from_linear(c_attn, group, blocks=3)
    tp_proj = RowParallelLinear.from_linear(c_proj, group)
    x_full, g_full = data(12, (batch, seq, width)), data(13, (batch, seq, width))
    x_ref = leaf(x_full)
    y_ref = c_proj(attend(c_attn(x_ref), heads))
    y_ref.backward(it.tensor(g_full))
    x = leaf(x_full)
    y = tp_proj(attend(tp_attn(x), heads // size))
    close(y, y_ref, "attention: forward")
    y.backward(it.tensor(g_full))
    close(x.grad, x_ref.grad, "attention: input grad")
    close(whole_from_shards(tp_attn.weight.grad, ShardSpec(0, 3), group), c_attn.weight.grad, "c_attn.weight grad")
    close(whole_from_shards(tp_attn.bias.grad, ShardSpec(0, 3), group), c_attn.bias.grad, "c_attn.bias grad")
    close(whole_from_shards(tp_proj.weight.grad, ShardSpec(1), group), c_proj.weight.grad, "c_proj.weight grad")
    close(tp_proj.bias.grad, c_proj.bias.grad, "c_proj.bias grad")


def error_checks(group):
    size = group.size
    if size == 1:
        return
    x = it.tensor(np.zeros((2, 2 * size + 1, 2 * size), np.float32))
    raises(lambda: scatter_to_sequence_parallel_region(x, group),
           "scatter_to_sequence_parallel_region: expected dim 1 of length divisible by the tensor-parallel group "
           f"size {size}, got a tensor of shape (2, {2 * size + 1}, {2 * size}) (length {2 * size + 1}, remainder 1)",
           "HINT: make that length a multiple of")
    raises(lambda: reduce_scatter_to_sequence_parallel_region(x, group), "reduce_scatter_to_sequence_parallel_region")
    raises(lambda: scatter_to_tensor_parallel_region(it.tensor(np.zeros((2, size + 1), np.float32)), group),
           f"dim 1 of length divisible by the tensor-parallel group size {size}")
    raises(lambda: gather_from_sequence_parallel_region(x, group, dim=3), "dim in [-3, 3) for a 3-d tensor", "HINT")


def run_all(group, seed):
    mapping_checks(group)
    spec_checks(group)
    column_checks(group)
    row_checks(group)
    embedding_checks(group)
    cross_entropy_checks(group)
    mlp_checks(group, seed)
    attention_checks(group)
    error_checks(group)


run_all(world_group, 20)
if world_group.size == 4:  # two tensor-parallel groups of two, as a DP x TP layout makes them (tensor fastest)
    pair = dist.new_group([0, 1]) if RANK < 2 else dist.new_group([2, 3])
    check(pair.rank == RANK % 2 and pair.size == 2, f"sub-group ranks {pair.ranks}")
    mlp_checks(pair, 30 + RANK // 2)  # each pair its own data
    attention_checks(pair)
    cross_entropy_checks(pair)
print(f"rank {RANK} TP OK {check.count}", flush=True)
dist.destroy_process_group()
