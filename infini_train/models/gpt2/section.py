"""GPT-2's reading of a run config's model section (models/model_section.py): the shared keys only, in its own
names; a preset (GPT2_PRESETS) gives the shape and leaves block_size to the default, 1024."""
from __future__ import annotations

from ..model_section import ModelSection


class GPT2Section(ModelSection):
    def shape_problems(self, m):
        shape = {**(self.presets()[m.preset] if m.preset else {}), **self.given(m)}
        n_embd, n_head = shape.get("n_embd", 768), shape.get("n_head", 12)
        if n_embd % n_head:
            key = "model.n_head" if m.n_head is not None or m.n_embd is None else "model.n_embd"
            return [f"{key}: expected n_embd ({n_embd}) divisible by n_head ({n_head}), got n_embd % n_head = "
                    f"{n_embd % n_head}"]
        return []


SECTIONS = {"gpt2": GPT2Section("gpt2", ".gpt2.model", preset_keys=("n_layer", "n_head", "n_embd", "block_size"),
                                preset_doc="gpt2, gpt2-medium, d12, ...", hf_model_type="gpt2", llmc=True)}

__all__ = ["GPT2Section", "SECTIONS"]
