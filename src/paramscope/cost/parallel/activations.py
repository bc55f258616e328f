"""One device's activations under tensor parallelism, from the family's analytic recipe on the device's own shard.

Under tensor parallelism (without sequence parallel) a rank computes its layer on the full sequence with 1/t of the
attention heads and 1/t of the MLP's (and each expert's) width; the residual stream, the norms and what the matmuls
read are replicated. That is the recipe's layer with heads, KV heads and widths at their local sizes and the hidden
size unchanged: the recipe is evaluated on a view of the config with those fields at the rank's values (the head
dimension kept). The logits are gathered (transformers' colwise_gather_output), so the loss terms keep the whole
vocabulary. The trace on torch's fake process group (traced/parallel.py) checks this.

Recipes whose closed forms keep the attention and MLP widths apart from the hidden size (the Llama-style family)
take the local view; the others are traced.
"""

from __future__ import annotations

from typing import Any

from ..dims import config_int
from ..memory.activations import TrainingActivations, recipe_for, training_activations

# recipes whose per-layer closed form is written in h, q, kv, i (and the experts' widths) apart
LOCAL_VIEW_RECIPES = ("Llama-style decoder", "Gemma decoder", "Gemma-2 decoder", "Phi-3 decoder",
                      "Mixtral (sparse MoE)", "Qwen2-MoE")
WIDTHS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size")


class LocalConfig:
    """The config as one tensor-parallel rank's shard reads it: some fields at their local values, the rest the
    config's own."""

    def __init__(self, base: Any, overrides: dict[str, int]) -> None:
        self._base = base
        self._overrides = overrides

    def __getattr__(self, name: str) -> Any:
        overrides = self.__dict__.get("_overrides", {})
        if name in overrides:
            return overrides[name]
        return getattr(self.__dict__["_base"], name)


def local_config(config: Any, tp: int) -> LocalConfig:
    heads = config_int(config, "num_attention_heads")
    kv = config_int(config, "num_key_value_heads") or heads
    hidden = config_int(config, "hidden_size")
    overrides: dict[str, int] = {}
    if heads:
        overrides["num_attention_heads"] = heads // tp
        overrides["head_dim"] = config_int(config, "head_dim") or (hidden // heads if hidden else 0)
    if kv:
        overrides["num_key_value_heads"] = max(1, kv // tp)
    for name in WIDTHS:
        width = config_int(config, name)
        if width:
            overrides[name] = width // tp
    return LocalConfig(config, overrides)


def local_recipe(config: Any, class_name: str) -> str | None:
    """The recipe that answers a tensor-parallel rank analytically, or None (traced)."""
    recipe = recipe_for(config, class_name)
    return recipe if recipe in LOCAL_VIEW_RECIPES else None


def tp_activations(config: Any, class_name: str, *, tp: int, batch: int, seq: int, precision: str,
                   checkpointing: bool, cast_weights: int, cast_head: int,
                   cast_biases: int) -> TrainingActivations | None:
    """Rank 0's activations under tensor parallel degree `tp`; `cast_*` are the rank's own matmul elements."""
    if local_recipe(config, class_name) is None:
        return None
    view = local_config(config, tp) if tp > 1 else config
    return training_activations(view, class_name, batch=batch, seq=seq, precision=precision,
                                checkpointing=checkpointing, cast_weights=cast_weights, cast_head=cast_head,
                                cast_biases=cast_biases)
