"""One device's activations under tensor parallelism, from the family's analytic recipe on the device's own shard.

Under tensor parallelism (without sequence parallel) a rank computes its layer on the full sequence with 1/t of the
attention heads and 1/t of the MLP's (and each expert's) width; the residual stream, the norms and what the matmuls
read are replicated. That is the recipe's layer with heads, KV heads and widths at their local sizes and the hidden
size unchanged: the recipe is evaluated on a view of the config with those fields at the rank's values (the head
dimension kept). The logits are gathered (transformers' colwise_gather_output), so the loss terms keep the whole
vocabulary. The trace on torch's fake process group (traced/parallel.py) checks this.

Recipes whose closed forms keep the attention and MLP widths apart from the hidden size (the Llama-style family)
take the local view; the others are traced.

Sequence parallel runs every norm of the residual stream on S / t tokens (torch's SequenceParallel, as torchtitan
and Megatron place it): what a norm saves for backward, its input and its fp32 result with one fp32 statistic a
token, (8h + 4)·T bytes (fp32 and mixed precision; 6h + 4 in bf16, whose Llama-style norm saves its input in bf16;
Gemma's norms, which scale in fp32, save 8h + 4 there too), is then held for 1/t of the tokens. The gathered sequence the attention and MLP read stays whole: torch saves it for the
column-parallel weights' gradients (Megatron gathers it again in backward instead, Korthikanti et al.'s 34/t).
The per-norm figure was read off traces of one rank on torch's fake process group (tests/test_parallel_check.py
holds the result equal to them).
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


# bytes a hidden-size norm saves per token, (·h, constant), by the recipe's precision kind; Gemma's norms upcast to
# fp32 and scale there (Llama's scale the input's dtype), so in bf16 they save as in fp32
NORM_SAVED = {"fp32": (8, 4), "mixed": (8, 4), "bf16-pure": (6, 4)}
FP32_NORMS = ("Gemma decoder", "Gemma-2 decoder")


def norm_kind(precision: str, recipe: str | None = None) -> str:
    if precision == "bf16-pure" and recipe not in FP32_NORMS:
        return "bf16-pure"
    return "fp32" if precision == "fp32" else "mixed"


def norm_saved(precision: str, hidden: int, recipe: str | None = None) -> int:
    per_h, constant = NORM_SAVED[norm_kind(precision, recipe)]
    return per_h * hidden + constant


def sequence_parallel(act: TrainingActivations, *, tp: int, tokens: int, hidden: int, precision: str,
                      layer_norms: int, checkpointing: bool = False) -> TrainingActivations:
    """`act` (a tensor-parallel rank's) with every norm of the residual stream on 1/tp of the tokens: the layers'
    `layer_norms` each and the final norm. Under full `checkpointing` a layer saves no norm: its checkpoint, its
    input (`act.per_layer`, e·T·h), is the residual stream between the norms, on the rank's S / tp tokens too."""
    import dataclasses

    kind = norm_kind(precision, act.recipe)
    per_norm = norm_saved(precision, hidden, act.recipe) * tokens
    outside = per_norm - per_norm // tp
    norm_words = f"({NORM_SAVED[kind][0]}h + {NORM_SAVED[kind][1]})·T·(1 − 1/{tp}) a norm"
    if checkpointing:
        # traced (Llama, tp 2 and 4 + sp, fp32, bf16-mixed and bf16-pure): each checkpoint is e·T·h / tp; taking
        # the norms' share off instead left the forward L·(1 − 1/tp)·(12·h + 8)·T under (10·h + 8 in bf16-pure)
        layer = act.per_layer - act.per_layer // tp
        less = act.layers * layer + outside
        size = act.per_layer // (tokens * hidden) if tokens and hidden else 0
        words = (f"; sequence parallel: {act.layers} layers' checkpoints (each its input) and the final norm on "
                 f"1/{tp} of the tokens, − {less:,} ({size}·T·h·(1 − 1/{tp}) a checkpoint, {norm_words})")
    else:
        layer = layer_norms * per_norm - layer_norms * per_norm // tp
        less = act.layers * layer + outside
        words = (f"; sequence parallel: {act.layers} layers × {layer_norms} norms and the final norm on 1/{tp} of "
                 f"the tokens, − {less:,} ({norm_words})")
    # under autocast the model's output holds the final norm's fp32 output as the loss is taken (4·T·h, the end of
    # forward's loss_working): on the rank's S / t tokens under sp (traced, Llama tp 2 and tp 4 + sp: the end of
    # forward was 4·T·h·(1 − 1/t) over without this)
    final = 4 * tokens * hidden - 4 * tokens * hidden // tp if precision.endswith("-mixed") else 0
    final_words = f"; the final norm's fp32 output the loss is taken beside, on 1/{tp} of the tokens, − {final:,}"
    if kind != "mixed":
        # in fp32 and bf16-pure the head saves its input all-gathered whole (counted with the one-device recipe's
        # saved activations), and the model's output still holds the final norm's own output, on the rank's
        # S / t tokens, as the loss is taken: e·T·h / t more (traced, the llama-3-8b cut at tp 2 + sp, B 1 and 2:
        # the end of forward was 2,097,152 B under in fp32 at B 1, 256 tokens, 1,048,576 B in bf16-pure)
        size = 2 if kind == "bf16-pure" else 4
        final = -(size * tokens * hidden // tp)
        final_words = (f"; the final norm's output on 1/{tp} of the tokens, which the model's output holds as the "
                       f"loss is taken beside the head's all-gathered input, {size}·T·h / {tp} = {-final:,}")

    # under full checkpointing the last layer, recomputed, runs its own norms on 1/tp of the tokens too, and its
    # output's and input's gradients (the recipe's 8·T·h) are the residual stream's, on 1/tp of the tokens
    # (traced, the second micro-step's backward under --grad-accum 2: without the gradients' share it was up to
    # 8·T·h·(1 − 1/tp) over)
    norms_again = layer_norms * (per_norm - per_norm // tp) if checkpointing else 0
    gradients_again = 8 * tokens * hidden - 8 * tokens * hidden // tp if checkpointing else 0
    recomputed = norms_again + gradients_again
    recomputed_words = (f"; the recomputed layer's {layer_norms} norms, − {norms_again:,}, and its output and input "
                        f"gradients 8·T·h·(1 − 1/{tp}), − {gradients_again:,}, on 1/{tp} of the tokens"
                        if recomputed else "")

    def moment(m: Any) -> Any:  # a negative `final` is held, not shed
        again = recomputed if m.where == "last layer recomputed" else 0
        end = final if m.where == "end of forward" else 0
        return dataclasses.replace(m, bytes=m.bytes - less - end - again, arithmetic=m.arithmetic + words + (
            final_words if end else "") + (recomputed_words if again else ""))
    # the tp + sp rank's recomputed backward (activations/step.SP_RECOMPUTE_FREED) is anchored on this
    # "last layer recomputed", as shed here
    return dataclasses.replace(
        act, saved=act.saved - less, saved_arithmetic=act.saved_arithmetic + words, per_layer=act.per_layer - layer,
        moments=tuple(moment(m) for m in act.moments))


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
