"""State-dict hooks (register_state_dict_pre_hook / _post_hook, register_load_state_dict_pre_hook / _post_hook)
against torch 2.13 on the same programs: order over nested modules, prefixes, metadata, what they may change."""
import numpy as np
import pytest
import torch

import infini_train as it
from tests.torch_parity import same


def model(m):
    """Sequential(Linear(2, 3), Sequential(Linear(3, 1), BatchNorm1d(1))) with its values fixed."""
    net = m.nn.Sequential(m.nn.Linear(2, 3), m.nn.Sequential(m.nn.Linear(3, 1), m.nn.BatchNorm1d(1)))
    with m.no_grad():
        for i, p in enumerate(net.parameters()):
            p.copy_(m.tensor(np.arange(p.numel(), dtype=np.float32).reshape(tuple(p.shape)) + i))
    return net


def values(sd):
    return {k: v.detach().numpy().tolist() for k, v in sd.items()}


def test_state_dict_hooks_run_in_torch_order_with_prefix_and_metadata():
    def run(m):
        net, log = model(m), []
        for name, mod in (("root", net), ("inner", net[1]), ("leaf", net[1][0])):
            mod.register_state_dict_pre_hook(lambda mod, prefix, keep_vars, name=name:
                                             log.append(("pre", name, prefix, keep_vars)))
            mod.register_state_dict_post_hook(lambda mod, sd, prefix, md, name=name:
                                              log.append(("post", name, prefix, md, len(sd))))
        sd = net.state_dict(keep_vars=True)
        return log, list(sd), dict(sd._metadata)

    log, keys, metadata = same(run)
    assert log[0] == ("pre", "root", "", True) and log[-1][:3] == ("post", "root", "")
    assert metadata[""] == {"version": 1} and "1.0" in metadata


def test_a_state_dict_post_hook_converts_keys_in_place():
    def run(m):
        net = model(m)

        def rename(mod, sd, prefix, md):  # this model's "1.0." entries saved under "proj." instead
            for key in [k for k in sd if k.startswith(prefix + "0.")]:
                sd[prefix + "proj." + key[len(prefix) + 2:]] = sd.pop(key)

        net[1].register_state_dict_post_hook(rename)
        return values(net.state_dict())

    assert "1.proj.weight" in same(run)


def test_a_state_dict_post_hook_returning_a_value_is_an_error():
    for m in (it, torch):
        net = m.nn.Linear(2, 2)
        net.register_state_dict_post_hook(lambda mod, sd, prefix, md: {})
        with pytest.raises(RuntimeError, match="state_dict post-hook must return None"):
            net.state_dict()


def test_load_hooks_see_each_modules_entries_prefix_and_keys_in_torch_order():
    def run(m):
        net, log = model(m), []
        sd = model(m).state_dict()
        sd["extra"] = m.zeros(1)
        sd["1.0.stray"] = m.zeros(1)
        del sd["0.bias"]
        for name, mod in (("root", net), ("inner", net[1]), ("leaf", net[1][0])):
            mod.register_load_state_dict_pre_hook(
                lambda mod, sd, prefix, md, strict, missing, unexpected, errors, name=name:
                log.append(("pre", name, sorted(sd), prefix, md, strict, list(missing), list(unexpected))))
            mod.register_load_state_dict_post_hook(
                lambda mod, keys, name=name: log.append(("post", name, list(keys.missing_keys),
                                                         list(keys.unexpected_keys))))
        result = net.load_state_dict(sd, strict=False)
        return log, list(result.missing_keys), list(result.unexpected_keys)

    log, missing, unexpected = same(run)
    assert missing == ["0.bias"] and unexpected == ["extra", "1.0.stray"]
    assert [entry[:2] for entry in log] == [("pre", "root"), ("pre", "inner"), ("pre", "leaf"), ("post", "leaf"),
                                            ("post", "inner"), ("post", "root")]


def test_a_load_pre_hook_converts_an_old_checkpoint_layout():
    def run(m):
        net, old = model(m), model(m).state_dict()
        old = {("1.proj." + k[4:] if k.startswith("1.0.") else k): v * 2 for k, v in old.items()}

        def convert(mod, sd, prefix, md, strict, missing, unexpected, errors):
            for key in [k for k in sd if k.startswith(prefix + "proj.")]:
                sd[prefix + "0." + key[len(prefix) + 5:]] = sd.pop(key)

        net[1].register_load_state_dict_pre_hook(convert)
        result = net.load_state_dict(old)  # strict: passes only through the conversion
        return values(net.state_dict()), list(result.missing_keys), list(result.unexpected_keys)

    same(run)


def test_a_load_post_hook_may_forgive_missing_keys_for_a_strict_load():
    def run(m):
        net, sd = model(m), model(m).state_dict()
        del sd["1.1.running_var"]
        net[1].register_load_state_dict_post_hook(lambda mod, keys: keys.missing_keys.clear())
        result = net.load_state_dict(sd)
        return list(result.missing_keys), values(net.state_dict())

    assert same(run)[0] == []


def test_a_load_post_hook_sees_the_loaded_values():
    def run(m):
        net, seen = model(m), []
        sd = {k: v + 1 for k, v in model(m).state_dict().items() if v.dtype == m.float32}
        sd["1.1.num_batches_tracked"] = m.tensor(0)
        net[0].register_load_state_dict_post_hook(lambda mod, keys: seen.append(mod.weight.detach().numpy().tolist()))
        net.load_state_dict(sd)
        return seen

    same(run)


def test_load_errors_strict_and_from_a_pre_hook():
    def run(m):
        net, sd = model(m), model(m).state_dict()
        net[0].register_load_state_dict_pre_hook(
            lambda mod, sd, prefix, md, strict, missing, unexpected, errors: errors.append("converter: bad layout"))
        with pytest.raises(RuntimeError, match="converter: bad layout"):
            net.load_state_dict(sd)
        return values(net.state_dict())

    same(run)


def test_a_load_post_hook_returning_a_value_is_an_error():
    for m in (it, torch):
        net = m.nn.Linear(2, 2)
        net.register_load_state_dict_post_hook(lambda mod, keys: keys)
        with pytest.raises(AssertionError, match="not expected to return new values"):
            net.load_state_dict(net.state_dict())


def test_removed_state_dict_hooks_no_longer_run():
    def run(m):
        net, log = m.nn.Linear(2, 2), []
        handles = [net.register_state_dict_pre_hook(lambda *a: log.append("pre")),
                   net.register_state_dict_post_hook(lambda *a: log.append("post")),
                   net.register_load_state_dict_pre_hook(lambda *a: log.append("load-pre")),
                   net.register_load_state_dict_post_hook(lambda *a: log.append("load-post"))]
        net.load_state_dict(net.state_dict())
        for h in handles:
            h.remove()
        net.load_state_dict(net.state_dict())
        return log

    assert same(run) == ["pre", "post", "load-pre", "load-post"]
