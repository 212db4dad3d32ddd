"""What a run of a mixture-of-experts model cannot do yet, and what expert parallelism asks of it: the run checks of
every MoE arch's ModelSection (models/model_section.py), refused before anything is built. Tensor and pipeline
parallelism are the model spec's layout problems; that parallel.expert divides the data-parallel size is checked
when the run knows its world."""
from __future__ import annotations

from .model_section import ModelSection


class MoESection(ModelSection):
    """A ModelSection whose model routes tokens to experts (``experts`` true). ``EXPERT_MODULES``: a few of the
    model's expert and router module names, which LoRA targets may not match."""

    EXPERT_MODULES = ()

    def run_problems(self, cfg, ok, config):
        return self.moe_problems(cfg, ok, config) + self.expert_parallel_problems(cfg, ok, config)

    def moe_problems(self, cfg, ok, config):
        """What a run of this model refuses whatever the expert size."""
        arch, p, problems = self.arch, cfg.parallel, []
        if ok("train.recompute") and cfg.train.recompute != "none":
            problems.append(f"train.recompute: expected 'none' for model.arch={arch} (the auxiliary loss reads every "
                            "MoE layer's router logits from the forward; recomputing blocks is not supported for MoE "
                            f"models yet), got {cfg.train.recompute!r}; HINT: set train.recompute=none")
        if ok("parallel.context") and p.context > 1:
            problems.append(f"parallel.context: expected 1 for model.arch={arch} (each context rank would route "
                            "only its chunks of the sequence, so the load-balancing loss would not be the one-process "
                            f"run's; not supported for MoE models yet), got {p.context}; HINT: use data parallelism")
        lora = cfg.lora
        if ok("lora.rank", "lora.target_modules") and lora.rank > 0:
            from ..nn.lora import matches_target

            targets = lora.targets()
            if targets == "all-linear" or any(matches_target(n, targets) for n in self.EXPERT_MODULES):
                problems.append(f"lora.target_modules: expected modules outside the experts and routers for "
                                f"model.arch={arch} (LoRA on experts is not supported yet), got "
                                f"{lora.target_modules!r}; HINT: set lora.target_modules=q_proj,k_proj,v_proj,o_proj "
                                "(the attention layers)")
        return problems

    def expert_parallel_problems(self, cfg, ok, config):
        """``parallel.expert``: a divisor of num_experts, and what expert parallelism does not support yet."""
        e, problems = cfg.parallel.expert, []
        if not ok("parallel.expert") or e == 1:
            return problems
        if config.num_experts % e:
            divisors = [d for d in range(1, config.num_experts + 1) if config.num_experts % d == 0]
            problems.append(f"parallel.expert: expected a divisor of model.num_experts ({config.num_experts}: each "
                            f"rank of an expert group keeps num_experts / expert of them), got {e}; HINT: choose "
                            f"parallel.expert among {divisors}")
        if ok("lora.rank") and cfg.lora.rank > 0:
            problems.append(f"lora.rank: expected 0 with parallel.expert={e} (LoRA runs with expert parallelism are "
                            f"not supported yet), got {cfg.lora.rank}; HINT: set parallel.expert=1 for a LoRA "
                            "fine-tune")
        replicate = cfg.parallel.data_replicate
        if ok("parallel.data_replicate") and replicate > 1:
            problems.append(f"parallel.data_replicate: expected 1 with parallel.expert={e} (hybrid sharding shards "
                            "the dense parameters within each replica, while ZeRO-3 shards the experts over their "
                            "expert-data group across the replicas: the gradient norm would have to count the two "
                            f"differently; not supported yet), got {replicate}; HINT: set parallel.data_replicate=1 "
                            "(ZeRO-3 over the whole data-parallel group)")
        split = [f"parallel.{key}={getattr(cfg.parallel, key)}" for key in ("pipeline", "tensor")
                 if ok(f"parallel.{key}") and getattr(cfg.parallel, key) > 1]
        if ok("train.checkpoint_format") and cfg.train.checkpoint_format == "whole" and split:
            problems.append(f"train.checkpoint_format: expected 'sharded' or 'auto' with parallel.expert={e} and "
                            f"{' and '.join(split)} (each rank writes its experts and its part of the rest; the whole "
                            "format gathers experts over data-parallel ranks only), got 'whole'; HINT: set "
                            "train.checkpoint_format=auto -- a sharded checkpoint resumes under any layout, one "
                            "process included")
        return problems


__all__ = ["MoESection"]
