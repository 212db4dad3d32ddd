"""``it.Generator``: a random stream of its own, as torch.Generator. Random factories and fills take it as
``generator=`` and draw from it instead of the global stream (``it.manual_seed``), which they leave untouched.

A CPU generator wraps numpy's PCG64 (the global host stream's kind); a CUDA one wraps cupy's XORWOW, created
on first draw. ``get_state()`` is a uint8 tensor as torch's (its bytes are this project's, not torch's): set on
another generator of the same device type, both draw the same from then on.
"""
from __future__ import annotations

import numbers
import os

import numpy as np

from . import backend

DEFAULT_SEED = 67280421310721  # torch's default generator seed, so an unseeded Generator() is deterministic
_U64 = 1 << 64



class Generator:
    """A random number generator object, as ``torch.Generator(device='cpu')``."""

    def __init__(self, device="cpu"):
        dev = backend.Device.parse(device)
        if dev.type not in ("cpu", "cuda"):
            raise RuntimeError(f"Generator: expected a 'cpu' or 'cuda' device, got {device!r}\n"
                               "HINT: it.Generator(device='cpu') or it.Generator(device='cuda:0')")
        if dev.type == "cuda" and dev.index is None:
            dev = backend.Device.parse("cuda:0")
        self.device = dev
        self._engine = None  # numpy / cupy generator, made by _seed_engine
        self.manual_seed(DEFAULT_SEED)

    def __repr__(self):
        return f"<infini_train.Generator device={self.device} initial_seed={self._seed}>"

    # ------------------------------------------------------------------------------------------ seeding
    def manual_seed(self, seed):
        """Seed the generator; returns it. ``seed`` is an int in [-2**63, 2**64) (negatives wrap, as torch's)."""
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise RuntimeError(f"manual_seed expected a long, but got {type(seed).__name__} ({seed!r})\n"
                               "HINT: pass an int, e.g. g.manual_seed(0)")
        seed = int(seed)
        if not -(1 << 63) <= seed < _U64:
            raise ValueError(f"manual_seed: seed {seed} is out of range; expected -2**63 <= seed < 2**64")
        self._seed = seed % _U64
        self._seed_engine()
        return self

    def seed(self):
        """Seed from the operating system's entropy (non-deterministic); returns the seed used."""
        seed = int.from_bytes(os.urandom(8), "little") >> 1  # below 2**63, as torch's
        self.manual_seed(seed)
        return seed

    def initial_seed(self):
        """The seed this generator was last seeded with."""
        return self._seed

    def _seed_engine(self):
        if self.device.type == "cpu":
            self._engine = np.random.Generator(np.random.PCG64(self._seed))
        else:
            cp = backend.cupy_module()
            if not hasattr(cp.random, "XORWOW"):
                raise RuntimeError("Generator: a CUDA generator needs cupy.random.XORWOW (cupy 9 or later)\n"
                                   "HINT: upgrade cupy, or use it.Generator(device='cpu')")
            with cp.cuda.Device(self.device.index):
                self._engine = cp.random.Generator(cp.random.XORWOW(self._seed))

    # -------------------------------------------------------------------------------------------- state
    def get_state(self):
        """The generator's state as a 1-d uint8 tensor (on the CPU), for ``set_state``."""
        from .tensor import Tensor
        seed = self._seed.to_bytes(8, "little")
        if self.device.type == "cpu":
            bits = self._engine.bit_generator.state
            body = (bits["state"]["state"].to_bytes(16, "little") + bits["state"]["inc"].to_bytes(16, "little")
                    + int(bits["has_uint32"]).to_bytes(8, "little") + int(bits["uinteger"]).to_bytes(8, "little"))
        else:
            with backend.cupy_module().cuda.Device(self.device.index):
                body = self._engine.bit_generator._state.get().tobytes()
        return Tensor._make(np.frombuffer(seed + body, dtype=np.uint8).copy(), backend.CPU)

    def set_state(self, new_state):
        """Restore a state from ``get_state()``; returns the generator."""
        from .tensor import Tensor
        if not isinstance(new_state, Tensor) or new_state.dtype != backend.uint8:
            got = f"a tensor of dtype {new_state.dtype}" if isinstance(new_state, Tensor) else type(new_state).__name__
            raise TypeError(f"set_state: expected a uint8 tensor (from Generator.get_state()), but got {got}\n"
                            "HINT: pass the tensor get_state() returned, unchanged")
        raw = backend.to_device_array(new_state.array, backend.CPU).reshape(-1).tobytes()
        expected = len(self.get_state().array)
        if len(raw) != expected:
            raise RuntimeError(f"set_state: expected a {self.device.type} generator state of {expected} bytes, but "
                               f"got {len(raw)}\nHINT: a state only fits a generator of the device type that made it")
        self._seed = int.from_bytes(raw[:8], "little")
        if self.device.type == "cpu":
            self._engine.bit_generator.state = {
                "bit_generator": "PCG64",
                "state": {"state": int.from_bytes(raw[8:24], "little"), "inc": int.from_bytes(raw[24:40], "little")},
                "has_uint32": int.from_bytes(raw[40:48], "little"),
                "uinteger": int.from_bytes(raw[48:56], "little")}
        else:
            cp = backend.cupy_module()
            with cp.cuda.Device(self.device.index):
                state = self._engine.bit_generator._state
                state[...] = cp.asarray(np.frombuffer(raw[8:], dtype=np.uint8).view(state.dtype).reshape(state.shape))
        return self

    # ------------------------------------------------------------------------------------------ drawing
    def engine_for(self, dev, op):
        """The numpy / cupy generator to draw ``op``'s values on ``dev`` from, after checking the device types."""
        if dev.type != self.device.type:
            raise RuntimeError(f"{op}: expected a '{dev.type}' device type for generator but found "
                               f"'{self.device.type}'\nHINT: make the generator on the tensor's device: "
                               f"it.Generator(device='{dev}')")
        return self._engine


def draw_source(generator, dev, op):
    """What ``op`` draws from on ``dev``: the global stream of the device when ``generator`` is None (one check),
    else ``generator``'s own stream."""
    if generator is None:
        return backend.generator_for(dev)
    if not isinstance(generator, Generator):
        raise TypeError(f"{op}: generator must be an it.Generator or None, but got {type(generator).__name__}\n"
                        "HINT: g = it.Generator().manual_seed(0); then pass generator=g")
    return generator.engine_for(dev, op)


__all__ = ["Generator", "draw_source"]
