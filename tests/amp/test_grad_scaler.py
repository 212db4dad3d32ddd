"""GradScaler against torch.amp.GradScaler("cpu"): scripted runs with inf/nan/overflowing gradients, unscale_ +
clip_grad_norm_, state_dict round trips, the disabled pass-through, the error cases, and the two kernels
(non-finite check + unscale, scale update) against torch's own."""
import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.amp import GradScaler
from infini_train.amp.grad_scaler import _check_and_unscale_, updated_scale
from tests.amp.scripted_steps import Recording, assert_same_run, initial_params, make_scaler, run, script

# name -> (GradScaler kwargs, steps, optimizer kind, how many steps must be skipped)
PATTERNS = {
    "inf_early": (dict(growth_interval=3), script(14, inf=[0], neg_inf=[1]), "sgd", 2),
    "nan_mid": (dict(growth_interval=2), script(16, nan=[7]), "adamw", 1),
    "grows_long": (dict(growth_interval=2), script(20), "sgd", 0),
    "backs_off_repeatedly": (dict(growth_interval=3), script(14, huge=range(2, 10)), "adamw", 6),
    "odd_factors": (dict(init_scale=1000.0, growth_factor=3.0, backoff_factor=0.3, growth_interval=2),
                    script(14, inf=[3], nan=[4, 9]), "sgd", 3),
    "growth_stops_at_float32_max": (dict(init_scale=2.0**120, growth_factor=4.0, growth_interval=1),
                                    script(6, magnitude=1e-20), "sgd", 0),
    "two_optimizers": (dict(growth_interval=2), script(12, nan=[2, 3], inf=[8]), "split", 3),
}


# the scripted overflows themselves (and the nans an unskipped inf step makes)
OVERFLOWS = pytest.mark.filterwarnings("ignore:(overflow|invalid value) encountered:RuntimeWarning")


@OVERFLOWS
@pytest.mark.parametrize("name", PATTERNS)
def test_scripted_run_matches_torch(name):
    kw, steps, opt_kind, skips = PATTERNS[name]
    ours, _ = run(False, steps, kw, opt_kind)
    theirs, _ = run(True, steps, kw, opt_kind)
    assert_same_run(ours, theirs)
    assert sum(not all(r["stepped"]) for r in ours) == skips
    scales = [r["scale"] for r in ours]
    assert len(set(scales)) > 1 or name == "growth_stops_at_float32_max"


def test_scale_sequences_hold_the_expected_values():
    """Pins the arithmetic itself, not only agreement: growth every growth_interval clean steps, halving on
    inf, float32 rounding with odd factors, no growth past float32's max."""
    inf_early = [r["scale"] for r in run(False, PATTERNS["inf_early"][1], dict(growth_interval=3))[0]]
    assert inf_early[:8] == [2.0**15, 2.0**14, 2.0**14, 2.0**14, 2.0**15, 2.0**15, 2.0**15, 2.0**16]
    odd = [r["scale"] for r in run(False, script(3), dict(init_scale=1000.0, growth_factor=3.0, backoff_factor=0.3,
                                                           growth_interval=1))[0]]
    assert odd == [3000.0, 9000.0, 27000.0]
    backoff = [r["scale"] for r in run(False, script(2, inf=[0, 1]), dict(init_scale=1000.0, backoff_factor=0.3))[0]]
    assert backoff == [float(np.float32(300.0)), float(np.float32(np.float32(300.0) * 0.3))]
    capped = [r["scale"] for r in run(False, *PATTERNS["growth_stops_at_float32_max"][1:2],
                                      PATTERNS["growth_stops_at_float32_max"][0])[0]]
    assert capped == [2.0**122, 2.0**124, 2.0**126, 2.0**126, 2.0**126, 2.0**126]


@pytest.mark.parametrize("opt_kind", ["sgd", "adamw", "split"])
def test_unscale_then_clip_then_step_matches_torch(opt_kind):
    steps = script(12, inf=[1], nan=[6], magnitude=3.0)
    kw = dict(growth_interval=2)
    ours, _ = run(False, steps, kw, opt_kind, clip=0.5)
    theirs, _ = run(True, steps, kw, opt_kind, clip=0.5)
    # clipping sums squares: the two libraries' reductions may round the norm differently in the last place
    assert_same_run(ours, theirs, grads="close")
    clipped = [np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in r["grads"])) for r in ours if all(r["stepped"])]
    np.testing.assert_allclose(clipped, 0.5, rtol=1e-5)  # the stepped gradients really were clipped to norm 0.5


@pytest.mark.parametrize("fresh", [True, False], ids=["into_fresh_scaler", "into_used_scaler"])
def test_state_dict_round_trip_mid_sequence_continues_identically(fresh):
    kw = dict(init_scale=1000.0, growth_factor=3.0, backoff_factor=0.3, growth_interval=3)
    steps = script(14, inf=[2], nan=[9])
    saved = {}

    def swap(i, scaler):
        if i == 5:
            saved["ours"] = scaler.state_dict()
            other = GradScaler() if fresh else run(False, script(2, inf=[0]))[1]  # its tracker is 1, not 2
            other.load_state_dict(saved["ours"])
            return other
        return None

    theirs, torch_scaler = run(True, steps, kw)
    ours, scaler = run(False, steps, kw, on_step=swap)
    assert_same_run(ours, theirs)
    assert scaler.state_dict() == torch_scaler.state_dict()
    _, at_five = run(True, steps[:5], kw)
    assert saved["ours"] == at_five.state_dict()  # same keys, same values mid-sequence
    assert saved["ours"]["_growth_tracker"] == 2  # mid-interval: the tracker must survive the round trip


def test_state_dicts_load_across_libraries():
    kw = dict(growth_interval=2)
    steps = script(10, nan=[2])

    def load_torchs(i, scaler):
        if i == 4:
            scaler.load_state_dict(run(True, steps[:4], kw)[1].state_dict())

    theirs, _ = run(True, steps, kw)
    ours, scaler = run(False, steps, kw, on_step=load_torchs)
    assert_same_run(ours, theirs)
    t = torch.amp.GradScaler("cpu")
    t.load_state_dict(scaler.state_dict())
    assert t.state_dict() == scaler.state_dict()


@OVERFLOWS
def test_disabled_scaler_is_a_pass_through():
    steps = script(5, inf=[2])
    ours, scaler = run(False, steps, dict(enabled=False))
    theirs, _ = run(True, steps, dict(enabled=False))
    assert_same_run(ours, theirs)
    assert all(all(r["stepped"]) for r in ours) and np.isnan(ours[-1]["params"][0]).any()  # inf steps not skipped
    assert not scaler.is_enabled() and scaler.get_scale() == 1.0 and scaler.state_dict() == {}
    scaler.load_state_dict({})  # a no-op when disabled
    loss = it.tensor(2.5, requires_grad=True)
    assert scaler.scale(loss) is loss
    p = it.tensor(np.ones(3, np.float32), requires_grad=True)
    p.grad = it.tensor(np.full(3, 8.0, np.float32))
    opt = it.optim.SGD([p], lr=0.5)
    scaler.unscale_(opt)
    np.testing.assert_array_equal(p.grad.numpy(), 8.0)
    assert scaler.step(opt, closure=lambda: 7.0) == 7.0  # the closure goes to the optimizer
    np.testing.assert_array_equal(p.numpy(), -3.0)
    scaler.update()


def test_scale_nests_like_torch_and_multiplies_in_float32():
    values = np.array([0.5, 2.0, 1e-3, -3.0], np.float32)
    ours, theirs = GradScaler(), torch.amp.GradScaler("cpu")
    a = ours.scale([it.tensor(values), (it.tensor(values[:2]), [it.tensor(values[2:])])])
    b = theirs.scale([torch.tensor(values), (torch.tensor(values[:2]), [torch.tensor(values[2:])])])
    assert type(a) is list and type(a[1]) is tuple and type(a[1][1]) is list
    np.testing.assert_array_equal(a[0].numpy(), b[0].numpy())
    np.testing.assert_array_equal(a[1][1][0].numpy(), b[1][1][0].numpy())
    # a float16 output times 2**16 (not a float16 number) is finite where the product fits: 0.5 * 2**16 = 32768
    h = it.tensor(values.astype(np.float16), requires_grad=True)
    th = torch.tensor(values.astype(np.float16), requires_grad=True)
    out, tout = ours.scale(h), theirs.scale(th)
    np.testing.assert_array_equal(out.numpy(), tout.detach().numpy())
    assert out.numpy()[0] == 32768 and np.isinf(out.numpy()[1])
    upstream = np.array([1e-3, 1e-4, 1.0, 0.25], np.float16)
    out.backward(it.tensor(upstream))
    tout.backward(torch.tensor(upstream))
    np.testing.assert_array_equal(h.grad.numpy(), th.grad.numpy())


def test_float64_params_match_torch():
    """Unscaling float64 gradients multiplies by the float32 reciprocal of the scale, as torch does; with a scale
    of 3000 that differs from dividing by it in float64."""
    kw, steps, _, _ = PATTERNS["odd_factors"]
    ours, _ = run(False, steps, kw, dtype="float64")
    theirs, _ = run(True, steps, kw, dtype="float64")
    assert_same_run(ours, theirs)
    assert ours[0]["grads"][0].dtype == np.float64


def test_bfloat16_params_match_torch():
    steps = script(10, inf=[3], magnitude=0.5)
    ours, _ = run(False, steps, dict(growth_interval=2), dtype="bfloat16")
    theirs, _ = run(True, steps, dict(growth_interval=2), dtype="bfloat16")
    assert_same_run(ours, theirs, rtol=1e-2, atol=1e-2)  # exact gradients; bfloat16 SGD updates may round apart


@OVERFLOWS
def test_float16_gradients_are_unscaled_where_torch_refuses():
    p = it.tensor(np.ones(4, np.float16), requires_grad=True)
    opt = it.optim.SGD([p], lr=1.0)
    scaler = GradScaler(init_scale=1024.0)
    x = np.array([0.5, -1.0, 30.0, 1e-3], np.float16)
    scaler.scale((p * it.tensor(x)).sum()).backward()
    assert scaler.step(opt) is None
    np.testing.assert_array_equal(p.numpy(), (1.0 - x).astype(np.float16))
    scaler.update()
    scaler.scale((p * it.tensor(np.array([100.0, 0, 0, 0], np.float16))).sum()).backward()  # 1024*100 > 65504
    before = p.numpy().copy()
    scaler.step(opt)
    scaler.update()
    np.testing.assert_array_equal(p.numpy(), before)
    assert scaler.get_scale() == 512.0
    tp = torch.ones(4, dtype=torch.float16, requires_grad=True)
    tp.grad = torch.ones(4, dtype=torch.float16)
    t = torch.amp.GradScaler("cpu")
    t.scale(torch.ones(()))
    with pytest.raises(ValueError, match="FP16"):
        t.unscale_(torch.optim.SGD([tp], lr=1.0))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("inv_scale", [2.0**-16, 1 / 1000.0, 1 / 3.0, 1.0, 3.7])
def test_check_and_unscale_matches_torch_kernel(dtype, inv_scale):
    inv_scale = float(np.float32(inv_scale))
    rng = np.random.default_rng(3)
    for special in [None, np.inf, -np.inf, np.nan]:
        x = (rng.standard_normal(64) * 1000).astype(np.float32)
        x[7] = 60000.0
        if special is not None:
            x[11] = special
        t = torch.tensor(x).to(getattr(torch, dtype))
        found = torch.zeros(())
        torch._amp_foreach_non_finite_check_and_unscale_([t], found, torch.tensor(inv_scale))
        g = it.tensor(x).to(getattr(it, dtype))
        nonfinite = _check_and_unscale_(g, inv_scale)
        assert bool(nonfinite) == bool(found.item()) == (special is not None)
        np.testing.assert_array_equal(np.asarray(g.numpy(), np.float64), t.double().numpy())


def test_updated_scale_matches_torch_kernel():
    rng = np.random.default_rng(4)
    cases = [(2.0**16, 1999, 0.0, 2.0, 0.5, 2000), (2.0**16, 1998, 0.0, 2.0, 0.5, 2000),
             (2.0**127, 0, 0.0, 2.0, 0.5, 1), (3.0e38, 4, 0.0, 1.1, 0.5, 5), (1.0e-38, 3, 1.0, 2.0, 1e-3, 5),
             (1000.0, 7, 0.0, 3.0, 0.3, 3)]  # the last: a tracker past a shrunk interval never grows again
    for _ in range(200):
        cases.append((float(np.float32(rng.uniform(1e-3, 1e6))), int(rng.integers(0, 4)), float(rng.random() < 0.3),
                      float(rng.uniform(1.01, 5.0)), float(rng.uniform(0.01, 0.99)), int(rng.integers(1, 5))))
    for scale, tracker, found, gf, bf, gi in cases:
        ts, tt = torch.tensor(scale, dtype=torch.float32), torch.tensor(tracker, dtype=torch.int32)
        torch._amp_update_scale_(ts, tt, torch.tensor(found), gf, bf, gi)
        assert updated_scale(float(np.float32(scale)), tracker, found, gf, bf, gi) == (ts.item(), tt.item())


def test_update_with_new_scale_and_the_accessors():
    ours, theirs = GradScaler(init_scale=0.1), torch.amp.GradScaler("cpu", init_scale=0.1)
    assert ours.get_scale() == theirs.get_scale() == 0.1  # before the first scale(): the init value as given
    ours.scale(it.tensor(1.0))
    theirs.scale(torch.tensor(1.0))
    assert ours.get_scale() == theirs.get_scale() == float(np.float32(0.1))
    ours.update(0.3)
    theirs.update(0.3)
    assert ours.get_scale() == theirs.get_scale() == float(np.float32(0.3))
    ours.update(it.tensor(np.array([5.5], np.float64)))
    assert ours.get_scale() == 5.5
    for name, value in [("growth_factor", 3.0), ("backoff_factor", 0.25), ("growth_interval", 7)]:
        getattr(ours, f"set_{name}")(value)
        assert getattr(ours, f"get_{name}")() == value
    assert ours.state_dict() == {"scale": 5.5, "growth_factor": 3.0, "backoff_factor": 0.25, "growth_interval": 7,
                                 "_growth_tracker": 0}
    assert ours.is_enabled()


def _scaled_param(lib):
    p = lib.tensor(np.ones(2, np.float32), requires_grad=True)
    p.grad = lib.tensor(np.full(2, 4.0, np.float32))
    return p


def _prepared(lib, torch_side, scale=True, **kw):
    scaler = make_scaler(torch_side, **kw)
    p = _scaled_param(lib)
    opt = (torch.optim if torch_side else it.optim).SGD([p], lr=0.1)
    if scale:
        scaler.scale(lib.tensor(1.0))
    return scaler, opt, p


def _no_grad_opt(lib, torch_side):
    scaler, _, _ = _prepared(lib, torch_side)
    return scaler, (torch.optim if torch_side else it.optim).SGD([lib.tensor(np.ones(2, np.float32),
                                                                             requires_grad=True)], lr=0.1)


ERROR_CASES = {
    "growth_factor_not_above_1": (AssertionError, lambda lib, ts: make_scaler(ts, growth_factor=1.0)),
    "backoff_factor_not_below_1": (AssertionError, lambda lib, ts: make_scaler(ts, backoff_factor=1.0)),
    "unscale_before_scale": (AssertionError, lambda lib, ts: (lambda s, o, p: s.unscale_(o))(
        *_prepared(lib, ts, scale=False))),
    "step_before_scale": (AssertionError, lambda lib, ts: (lambda s, o, p: s.step(o))(*_prepared(lib, ts, False))),
    "update_before_scale": (AssertionError, lambda lib, ts: _prepared(lib, ts, scale=False)[0].update()),
    "unscale_twice": (RuntimeError, lambda lib, ts: (lambda s, o, p: (s.unscale_(o), s.unscale_(o)))(
        *_prepared(lib, ts))),
    "unscale_after_step": (RuntimeError, lambda lib, ts: (lambda s, o, p: (s.step(o), s.unscale_(o)))(
        *_prepared(lib, ts))),
    "step_twice": (RuntimeError, lambda lib, ts: (lambda s, o, p: (s.step(o), s.step(o)))(*_prepared(lib, ts))),
    "step_with_closure": (RuntimeError, lambda lib, ts: (lambda s, o, p: s.step(o, closure=lambda: 1.0))(
        *_prepared(lib, ts))),
    "step_without_grads": (AssertionError, lambda lib, ts: (lambda s, o: s.step(o))(*_no_grad_opt(lib, ts))),
    "update_without_step": (AssertionError, lambda lib, ts: _prepared(lib, ts)[0].update()),
    "new_scale_requires_grad": (AssertionError, lambda lib, ts: (lambda s, o, p: (s.step(o), s.update(
        lib.tensor(np.array([2.0], np.float32), requires_grad=True))))(*_prepared(lib, ts))),
    "new_scale_two_elements": (AssertionError, lambda lib, ts: (lambda s, o, p: (s.step(o), s.update(
        lib.tensor(np.array([2.0, 3.0], np.float32)))))(*_prepared(lib, ts))),
    "load_empty_state_dict": (RuntimeError, lambda lib, ts: make_scaler(ts).load_state_dict({})),
    "scale_a_number": (ValueError, lambda lib, ts: make_scaler(ts).scale(3)),
}


@pytest.mark.parametrize("name", ERROR_CASES)
def test_error_cases_raise_like_torch(name):
    expected, action = ERROR_CASES[name]
    with pytest.raises(expected):
        action(torch, True)
    with pytest.raises(expected) as info:
        action(it, False)
    assert "HINT" in str(info.value)


@pytest.mark.skipif(it.backend.cuda_available(), reason="checks the fallback where CUDA is unavailable")
def test_cuda_scaler_without_cuda_disables_itself_like_torch():
    for make in (lambda: torch.amp.GradScaler("cuda"), lambda: GradScaler("cuda")):
        with pytest.warns(UserWarning, match="CUDA is not available"):
            scaler = make()
        assert not scaler.is_enabled() and scaler.get_scale() == 1.0
    with pytest.raises(ValueError, match="expected device 'cpu' or 'cuda'"):
        GradScaler("mps")


def test_update_with_an_int_new_scale_raises():
    for lib, torch_side, error in [(torch, True, AttributeError), (it, False, TypeError)]:  # torch: no .device
        scaler, opt, _ = _prepared(lib, torch_side)
        scaler.step(opt)
        with pytest.raises(error):
            scaler.update(2)
    with pytest.raises(TypeError, match="new_scale should be a float"):
        scaler.update(2)


class PeerGroup:
    """A stand-in process group of two ranks whose other rank reports ``peer_found_inf``: all_reduce(MAX) takes
    the max of this rank's flag and the peer's, as a real 2-rank group would."""

    size = 2

    def __init__(self, peer_found_inf):
        self.peer = peer_found_inf
        self.calls = 0

    def all_reduce(self, array, op):
        assert op is it.distributed.ReduceOp.MAX
        self.calls += 1
        np.maximum(array, self.peer, out=array)


@pytest.mark.parametrize("peer_found_inf", [0.0, 1.0])
def test_found_inf_is_all_reduced_over_the_process_group(peer_found_inf):
    group = PeerGroup(peer_found_inf)
    scaler = GradScaler(process_group=group)
    p = it.tensor(np.ones(2, np.float32), requires_grad=True)
    opt = Recording(it.optim.SGD([p], lr=0.1))
    scaler.scale((p * 2.0).sum()).backward()
    scaler.unscale_(opt)
    assert group.calls == 0  # no communication until the decision is needed
    stepped = scaler.step(opt) == "stepped"
    scaler.update()
    assert group.calls == 1  # one all-reduce per optimizer per iteration, shared by step and update
    assert stepped == (peer_found_inf == 0.0)
    assert scaler.get_scale() == (2.0**16 if stepped else 2.0**15)


def test_nothing_is_communicated_outside_a_distributed_run():
    if it.distributed.is_initialized():  # an earlier test in this process used the default world of one
        it.distributed.destroy_process_group()
    assert not it.distributed.is_initialized()
    records, _ = run(False, script(3, inf=[1]))
    assert [r["stepped"] for r in records] == [[True], [False], [True]]
    assert not it.distributed.is_initialized()  # the scaler did not start a world of its own


def test_initial_params_are_what_the_runs_start_from():
    """Guards the harness: the recorded first-step parameters moved away from the initial ones."""
    first = run(False, script(1))[0][0]["params"]
    assert all(not np.array_equal(a, b) for a, b in zip(first, initial_params()))


@pytest.mark.parametrize("peer_found_inf", [0.0, 1.0])
def test_a_stage_without_the_loss_unscales_the_gradient_it_received(peer_found_inf):
    """A pipeline stage whose gradients arrive scaled by another rank's scaler: expect_scaled_gradients fixes the
    iteration's scale there, so unscale_/step/update give the true gradients and the peer's skip decision."""
    group = PeerGroup(peer_found_inf)
    scaler = GradScaler(init_scale=1024.0, growth_interval=1, process_group=group)
    p = it.tensor(np.array([1.0, -2.0], np.float32), requires_grad=True)
    opt = Recording(it.optim.SGD([p], lr=0.5))
    with pytest.raises(AssertionError, match="_scale is None"):
        scaler.unscale_(opt)
    scaler.expect_scaled_gradients()
    (p * 3.0).backward(it.tensor(np.full(2, 1024.0, np.float32)))  # the received gradient of the scaled loss
    scaler.unscale_(opt)
    np.testing.assert_array_equal(p.grad.numpy(), [3.0, 3.0])
    stepped = scaler.step(opt) == "stepped"
    scaler.update()
    assert stepped == (peer_found_inf == 0.0)
    assert scaler.get_scale() == (2048.0 if stepped else 512.0)
    scaler.expect_scaled_gradients()  # the scale stays what update made it
    assert scaler.get_scale() == (2048.0 if stepped else 512.0)
    disabled = GradScaler(enabled=False)
    disabled.expect_scaled_gradients()
    assert disabled.get_scale() == 1.0
