"""The recipes by name, and one training step's activations and moments from the layout a recipe gives.

Outside the layers: the embedding output and final norm, the fp32 logits 4·T·V, RoPE's cos and sin, positions and
loss indices; mixed precision adds the 16-bit copies autocast keeps of every matmul weight (2 B each). With full
gradient checkpointing a layer saves only its input (T·h × size) and is recomputed, one at a time, in backward;
the checkpointed layers' weight copies are not kept.

The peak is the largest of the step's moments, not the sum of its parts (R = weights + buffers + optimizer states):
- end of forward, as the loss is taken: R + saved + the loss's log-softmax (4·T·V; 6·T·V when the logits are 16-bit
  and upcast) + what the model's output still holds then (Layout.loss_working: under autocast the last hidden state
  in fp32 and the training KV cache's fp32 keys; a causal LM's labels padded by one) + autocast's cached casts;
- start of backward: R + saved + the logits' gradient and log-softmax (8·T·V; 4·T·V for BERT in bf16-pure, which
  takes the loss in bf16) + Layout.backward_start (a causal LM: − the shifted labels nll_loss's backward frees
  first, + the loss and its gradient);
- last layer recomputed (checkpointing): R + saved − the freed logits + one layer + its gradients;
- the first and the last layer's backward, recomputed (a Llama-style recipe, on one device or a tp rank alone, with
  or without sequence parallel; recomputed_backward_moments, a table of the backward per layout): every later layer's gradient and the head's held beside the layer's recomputed
  activations as its MLP makes its weight gradients (the first layer's peaks the step where a layer's gradients
  outweigh its checkpoint);
- end of backward: R + gradients + the embedding output's gradient, or, with a tied embedding, its two gradients
  and their sum (the embedding's backward frees its output's gradient first);
- optimizer step: R + gradients (fused AdamW and foreach SGD keep no step-sized temporaries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...dims import dim
from .decoders import LLAMA_STYLE, llama_style
from .deepseek import deepseek_style
from .encoders import BERT_STYLE, albert_style, bert_style, deberta_style, modernbert_style
from .gpt import GPT2_STYLE, gpt2_style, gptj_style, neox_style
from .layout import Layout
from .seq2seq import bart_style, t5_style


@dataclass(frozen=True)
class _Recipe:
    model_types: tuple[str, ...]
    heads: tuple[str, ...]  # the class must end with one: the head carries the loss the recipe counts
    layout: Any  # (config, kind, batch, seq) → Layout | None
    attention: str = "sdpa"  # the implementation it was fitted at (flash runs as sdpa here)
    # why the step can peak inside a layer (its forward's or its backward's working tensors), which the moments
    # below do not hold; then what the recipe counts is shown beside a derived or traced answer, never given as it
    peak_inside_layers: str = ""


_NO_LOGITS = "this head has no vocabulary-wide logits, so its step peaks inside the last layer"
_EXPERTS_BACKWARD = ("its experts' grouped backward in the first layer holds their gate and up projections' output "
                     "gradient (4·k·T·2·i_e in fp32) beside nearly every parameter's gradient, so with enough tokens "
                     "the step peaks there")


def _variant(function: Any, variant: str) -> Any:
    return lambda config, kind, batch, seq: function(config, kind, batch, seq, variant=variant)


_RECIPES = {
    "Llama-style decoder": _Recipe(LLAMA_STYLE, ("ForCausalLM",), llama_style),
    "Gemma decoder": _Recipe(("gemma",), ("ForCausalLM",), _variant(llama_style, "gemma")),
    "Gemma-2 decoder": _Recipe(("gemma2",), ("ForCausalLM",), _variant(llama_style, "gemma2"), "eager"),
    "Phi-3 decoder": _Recipe(("phi3",), ("ForCausalLM",), _variant(llama_style, "phi3")),
    "Mixtral (sparse MoE)": _Recipe(("mixtral",), ("ForCausalLM",), _variant(llama_style, "mixtral"),
                                    peak_inside_layers=_EXPERTS_BACKWARD),
    "DeepSeek-V3 (MLA, MoE)": _Recipe(("deepseek_v3",), ("ForCausalLM",), deepseek_style, peak_inside_layers=(
        "its attention runs torch's math kernel (q and k wider than v), whose backward holds several fp32 "
        "B·heads·S² tensors at once: from about a thousand tokens the step peaks inside the last layer's "
        "attention backward")),
    "Qwen2-MoE": _Recipe(("qwen2_moe",), ("ForCausalLM",), _variant(llama_style, "qwen2_moe"),
                         peak_inside_layers=_EXPERTS_BACKWARD),
    "GPT-2": _Recipe(GPT2_STYLE, ("LMHeadModel",), gpt2_style),
    "GPT-NeoX": _Recipe(("gpt_neox",), ("ForCausalLM",), neox_style),
    "GPT-J": _Recipe(("gptj",), ("ForCausalLM",), gptj_style),
    "BERT masked LM": _Recipe(BERT_STYLE, ("ForMaskedLM",), bert_style),
    "RoBERTa masked LM": _Recipe(("roberta",), ("ForMaskedLM",), _variant(bert_style, "roberta")),
    "DistilBERT masked LM": _Recipe(("distilbert",), ("ForMaskedLM",), _variant(bert_style, "distilbert")),
    "T5 (v1)": _Recipe(("t5",), ("ForConditionalGeneration",), t5_style),
    "ModernBERT masked LM": _Recipe(("modernbert",), ("ForMaskedLM",), modernbert_style),
    "ALBERT masked LM": _Recipe(("albert",), ("ForMaskedLM",), albert_style),
    "BART": _Recipe(("bart",), ("ForConditionalGeneration",), bart_style),
    "BART (bare, trained on its output's sum)": _Recipe(("bart",), ("BartModel",), _variant(bart_style, "model"),
                                                        peak_inside_layers=_NO_LOGITS),
    "DeBERTa-v2 (bare, trained on its output's sum)": _Recipe(("deberta-v2",), ("DebertaV2Model",), deberta_style,
                                                       "eager", peak_inside_layers=_NO_LOGITS),
    "DeBERTa-v2 masked LM": _Recipe(("deberta-v2",), ("ForMaskedLM",), _variant(deberta_style, "lm"), "eager"),
    "ELECTRA discriminator": _Recipe(("electra",), ("ForPreTraining",), _variant(bert_style, "electra"),
                                     peak_inside_layers=_NO_LOGITS),
}


@dataclass(frozen=True)
class Moment:
    phase: str  # "forward" | "backward" | "optimizer step"
    where: str  # "end of forward", "start of backward", …
    bytes: int  # beyond the resident weights, buffers and optimizer states
    arithmetic: str


@dataclass(frozen=True)
class TrainingActivations:
    recipe: str  # "Llama-style decoder"
    saved: int  # bytes the forward leaves for backward
    saved_arithmetic: str
    per_layer: int  # saved per layer
    layers: int
    logits: int  # the fp32 logits, 4·T·V
    moments: tuple[Moment, ...]  # candidate peaks; the gradients' moments are added by the caller
    # a Llama-style layer recomputed in backward (full checkpointing): what recomputed_backward_moments reads
    recomputed: RecomputedShape | None = None


@dataclass(frozen=True)
class RecomputedShape:
    """A Llama-style checkpointed layer as its recomputed backward reads it: T tokens, h the hidden width, i the MLP's
    (the rank's, under tp), the elements of one layer's matmul weights and of the head's (autocast copies them, 2 B
    each, under bf16-mixed), the precision kind, and the bytes of one layer's checkpoint (its input)."""

    tokens: int
    hidden: int
    inner: int
    layer_casts: int
    head_casts: int
    kind: str
    checkpoint: int


def recipe_for(config: Any, class_name: str) -> str | None:
    """The recipe covering this config's layout built as `class_name`, or None."""
    model_type = getattr(config, "model_type", None)
    return next((name for name, recipe in _RECIPES.items()
                 if model_type in recipe.model_types and class_name.endswith(recipe.heads)), None)


def recipe_attention(recipe: str) -> str:
    """The attention implementation a recipe was fitted at: "sdpa" (flash too) or "eager"."""
    return _RECIPES[recipe].attention


def recipe_peak_inside_layers(recipe: str) -> str:
    """Why the recipe's step can peak inside a layer, where its moments do not reach ("" when it cannot): then its
    figures are a check beside the derived or traced answer."""
    return _RECIPES[recipe].peak_inside_layers


def recipe_declines(config: Any, class_name: str, *, batch: int, seq: int, precision: str,
                    checkpointing: bool) -> str | None:
    """What of this config (or step) its recipe was not fitted for, in words; None when the recipe answers or
    there is none."""
    _, layout = _layout(config, class_name, batch, seq, precision, checkpointing)
    return layout if isinstance(layout, str) else None


def _kind(precision: str) -> str:
    return "fp32" if precision == "fp32" else "bf16-pure" if precision == "bf16-pure" else "mixed"


def _layout(config: Any, class_name: str, batch: int, seq: int, precision: str,
            checkpointing: bool) -> tuple[str | None, Layout | str | None]:
    """(the recipe's name, its layout or what it was not fitted for); (None, None) without a recipe."""
    recipe = recipe_for(config, class_name)
    if recipe is None:
        return None, None
    layout = _RECIPES[recipe].layout(config, _kind(precision), batch, seq)
    if isinstance(layout, Layout) and checkpointing and not layout.checkpointing:
        # checkpointed layers keep more than their input here (the bare BartModel)
        return recipe, "gradient checkpointing (its checkpointed layers keep more than their inputs)"
    return recipe, layout


def training_activations(config: Any, class_name: str, *, batch: int, seq: int, precision: str,
                         checkpointing: bool, cast_weights: int = 0, cast_head: int = 0,
                         cast_biases: int = 0) -> TrainingActivations | None:
    """The analytic activations of one training step, or None when no recipe covers the config's layout.

    `cast_weights`: elements of the matmul weights autocast copies to 16 bits (mixed precision only), of which
    `cast_head` are outside the repeated layers (the heads'). Checkpointed layers do not keep their copies for backward (autocast's
    cache is dropped as the forward leaves it, and the recomputation casts again); the head's copy is kept."""
    recipe, layout = _layout(config, class_name, batch, seq, precision, checkpointing)
    if not isinstance(layout, Layout):
        return None
    kind = _kind(precision)
    tokens, h, vocab, layers = batch * seq, layout.hidden, layout.vocab, layout.layers
    if checkpointing:
        size = 2 if kind == "bf16-pure" else 4
        per_layer = size * tokens * h
        layer_text = f"the layer's input, {size}·T·h = {per_layer:,} B each (recomputed in backward)"
    else:
        per_layer, layer_text = layout.layer, layout.layer_text
    outside, outside_text = layout.checkpointed_outside if checkpointing and layout.checkpointed_outside else \
        (layout.outside, layout.outside_text)
    kept_casts = (cast_head if checkpointing else cast_weights) if kind == "mixed" else 0
    casts = 2 * kept_casts
    if layout.stack is not None and not checkpointing:
        stack, stack_text = layout.stack
    else:
        stack, stack_text = layers * per_layer, f"{layers} layers × {layer_text}"
    saved = stack + outside + casts
    text = (f"{stack_text}; outside the layers {outside_text}"
            + (f"; autocast's 16-bit weights 2 × {kept_casts:,}" if casts else ""))
    logits = 4 * tokens * vocab
    forward_tv, backward_tv = layout.loss_tv if layout.loss_tv != (0, 0) else (4 if kind == "fp32" else 6, 8)
    forward_extra = forward_tv * tokens * vocab
    # live at the end of the forward beside what it saves, (bytes, words): autocast's cached copies and what the
    # model's output holds as the loss is taken
    working: list[tuple[int, str]] = []
    if kind == "mixed" and cast_weights != kept_casts:  # the layers' copies, alive until the forward ends
        working.append((2 * (cast_weights - kept_casts),
                        f"the layers' 16-bit weight copies 2 × {cast_weights - kept_casts:,}"))
    working += [(n, f"{words} = {n:,}") for n, words, kept in layout.loss_working if kept or not checkpointing]
    if cast_biases and kind == "mixed":  # cast beside the weights, cached until the forward ends; backward reads none
        working.append((2 * cast_biases, f"autocast's 16-bit biases 2 × {cast_biases:,} = {2 * cast_biases:,}"))
    in_flight = sum(n for n, _ in working)
    working_text = "".join(f" + {words}" for _, words in working)
    if not vocab:  # a bare model trains on its output's sum: no logits, no loss buffers (the sum's gradient is a view)
        moments = [Moment("forward", "end of forward", saved + in_flight, f"saved {saved:,}{working_text}")]
        return TrainingActivations(recipe, saved, text, per_layer, layers, 0, tuple(moments))
    moments = [
        Moment("forward", "end of forward", saved + forward_extra + in_flight,
               f"saved {saved:,} + the loss's log-softmax {forward_extra // (tokens * vocab)}·T·V = {forward_extra:,}"
               f"{working_text}"),
        Moment("backward", "start of backward", saved + backward_tv * tokens * vocab +
               sum(n for n, _ in layout.backward_start),
               f"saved {saved:,} + the logits' gradient and log-softmax {backward_tv}·T·V = "
               f"{backward_tv * tokens * vocab:,}" + "".join(
                   f" − {words}" if n < 0 else f" + {words}" for n, words in layout.backward_start)),
    ]
    if checkpointing:
        recompute = saved - 4 * tokens * vocab + layout.layer + 8 * tokens * h
        moments.append(Moment("backward", "last layer recomputed", recompute,
                              f"saved {saved:,} − the freed fp32 logits 4·T·V = {4 * tokens * vocab:,} + one "
                              f"layer's activations {layout.layer:,} + its output and input gradients 8·T·h = "
                              f"{8 * tokens * h:,}"))
    shape = None
    if checkpointing and recipe == "Llama-style decoder" and layers:
        inner = dim(config, "intermediate") or 0
        shape = RecomputedShape(tokens, h, inner, (cast_weights - cast_head) // layers, cast_head,
                                kind, per_layer) if inner else None
    return TrainingActivations(recipe, saved, text, per_layer, layers, logits, tuple(moments), shape)


def embedding_gradient(config: Any, *, batch: int, seq: int, precision: str) -> int:
    """The gradient of the embedding's output, live as backward ends."""

    h = dim(config, "hidden") or 0
    return (2 if precision == "bf16-pure" else 4) * batch * seq * h + 8


# what the "last layer recomputed" moment holds that the recomputed layer's down projection's backward has freed or
# would count twice, ·T·h by precision (this first micro-step's moments and grad_accum's later one's): the final
# norm's and the head's saved inputs (the recipe's outside T·h: 12, 8, 10), the layer's input (among the checkpoints
# and in its activations: 4, 2, 4) and the moment's output and input gradients 8·T·h, less the gradient flowing into
# the layer then (4 fp32 and bf16-pure; 6 under autocast, the fp32 one and its bf16 cast); read off the traced steps
# (Llama cuts at h 128 and 256, i 344 and 512, 16 to 256 tokens, fp32, bf16-pure and bf16-mixed)
RECOMPUTE_FREED = {"fp32": 20, "bf16-pure": 14, "bf16-mixed": 16}
# the layouts whose recomputed layer's backward was read off the traced allocations (recomputed_backward_moments)
ONE_DEVICE, TP_RANK, SP_RANK = "one device", "tp rank", "tp + sp rank"
# the recomputed layer's backward through its MLP, its post-attention norm and (one device) its output projection,
# operator by operator, as the first micro-step runs it on each layout (each new parameter gradient is
# kept as the .grad): the bytes live after each allocation, over the moment before the down projection's weight
# gradient (the anchor), as coefficients of _BASIS[layout] (T tokens, h the hidden width, i the rank's MLP width, tp
# the tensor-parallel degree). Each row read off the traced allocations (traced/timeline.py, the backward of the
# first recomputed layer stepped through allocation by allocation) and equal to them:
# - one device: six Llama cuts (h 96-256, i 256-600, 24-128 tokens) at each precision (the step's peak equal to
#   --trace on 13 Llama, Mistral and Qwen2 cuts);
# - a tp rank (DTensor's parallelize_module on the fake process group, no sp), every allocation from the anchor
#   through the end of the post-attention norm's backward: beside one device's, the rank holds the norm's output
#   gradient (fp32 4·T·h, the sum of the column-parallel MLP projections' input gradients) to the end of the norm's
#   backward (one device frees it inside it); Llama h 128-256, i 344-600, 1 × 32 to 2 × 64 at tp 2 (and h 256 i 344
#   at tp 4 under autocast); the step's peak equal to the rank's trace on the h 256 i 344 2 × 64 (was 131,072 B under
#   under autocast, 43,520 in fp32, with one device's rows) and h 128 cuts of tests/test_recomputed_backward.py (at
#   1 × 32, h 256, i 600 under autocast one device's rows plus that 4·T·h were 32,768 B under the layer's traced
#   largest);
# - a tp + sp rank, every allocation likewise: the MLP reads its input all-gathered (B·S tokens) and the norm's
#   backward runs on the rank's S / tp tokens after the reduce-scatter of its output gradient (the T·h / tp and
#   T / tp terms); Llama h 128-256, i 344-600, 1 × 32 to 2 × 64 at tp 2, h 256 i 344 and h 192 i 480 (bf16-mixed)
#   2 × 64 at tp 4, 2 and 3 layers, V 500 and 1,000 (the step's peak was 78,856 B under the rank's trace at h 256
#   i 344 2 × 64 under autocast, at the optimizer step: the recomputed layer was not priced under sp).
# On a tp rank, with or without sp, the output projection's backward and the attention's follow these rows, below
# their largest on every cut traced but one, with few tokens beside a wide MLP under sp (1 × 32, h 256, i 600,
# bf16-mixed: the q projection's weight gradient 2,752 B above it, the layer's gradients then nearly all made).
# Each gradient is made beside the layer's recomputed activations and every later layer's gradient.
_BASIS = {ONE_DEVICE: ("T·i", "i·h", "T·h", "T", "h"), TP_RANK: ("T·i", "i·h", "T·h", "T", "h"),
          SP_RANK: ("T·i", "i·h", "T·h", "T·h/tp", "T/tp", "h")}
_MLP_BACKWARD = {
    ONE_DEVICE: {
        "fp32": ((0, 0, 0, 0, 0), (0, 4, 0, 0, 0), (4, 4, 0, 0, 0), (8, 4, 0, 0, 0), (-4, 8, 0, 0, 0),
                 (-4, 8, 4, 0, 0), (-12, 12, 4, 0, 0), (-12, 12, 8, 0, 0), (-16, 12, 8, 0, 0), (-16, 12, 4, 0, 4),
                 (-16, 12, 4, 4, 4), (-16, 12, -8, 16, 4), (-16, 12, 8, -4, 4)),
        "bf16-pure": ((0, 0, 0, 0, 0), (0, 2, -2, 0, 0), (2, 2, -2, 0, 0), (4, 2, -2, 0, 0), (-2, 4, -2, 0, 0),
                      (-2, 4, 0, 0, 0), (-6, 6, 0, 0, 0), (-6, 6, 2, 0, 0), (-8, 6, 2, 0, 0), (-8, 6, 0, 0, 2),
                      (-8, 6, 2, 0, 2), (-8, 6, 6, 0, 2), (-8, 6, 6, 4, 2), (-8, 6, -2, 16, 2), (-8, 6, 6, -4, 2),
                      (-8, 6, 10, -4, 2), (-8, 6, 14, -4, 2)),
        "mixed": ((0, 0, 0, 0, 0), (-2, 2, -2, 0, 0), (0, 0, -2, 0, 0), (2, 0, -2, 0, 0), (-4, 2, -2, 0, 0),
                  (-4, 2, 0, 0, 0), (-6, 0, 2, 0, 0), (-6, 4, 0, 0, 0), (-8, 4, 0, 0, 0), (-8, 4, 2, 0, 0),
                  (-10, 2, 4, 0, 0), (-10, 2, 6, 0, 0), (-10, 6, -2, 0, 0), (-10, 4, 2, 0, 0), (-10, 4, 6, 0, 0),
                  (-10, 4, 2, 0, 4), (-10, 4, -2, 0, 4), (-10, 4, 2, 4, 4), (-10, 4, -2, 4, 4),
                  (-10, 4, -10, 12, 4), (-10, 4, 6, -4, 4)),
    },
    TP_RANK: {
        "fp32": ((0, 0, 0, 0, 0), (0, 4, 0, 0, 0), (4, 4, 0, 0, 0), (4, 4, 0, 0, 0), (8, 4, 0, 0, 0),
                 (-4, 8, 0, 0, 0), (-4, 8, 4, 0, 0), (-8, 8, 8, 0, 0), (-4, 8, 4, 0, 0), (-12, 12, 4, 0, 0),
                 (-12, 12, 8, 0, 0), (-16, 12, 8, 0, 0), (-16, 12, 8, 0, 0), (-16, 12, 4, 0, 0), (-16, 12, 8, 0, 0),
                 (-16, 12, 4, 0, 4), (-16, 12, 0, 0, 4), (-16, 12, 4, 0, 4), (-16, 12, 4, 4, 4), (-16, 12, -4, 8, 4),
                 (-16, 12, -4, 12, 4), (-16, 12, -4, 16, 4), (-16, 12, 0, 0, 4), (-16, 12, 4, -4, 4),
                 (-16, 12, 8, -4, 4), (-16, 12, 12, -4, 4), (-16, 12, 0, -4, 4), (-16, 12, -4, -4, 4)),
        "bf16-pure": ((0, 0, 0, 0, 0), (0, 2, -2, 0, 0), (2, 2, -2, 0, 0), (2, 2, -2, 0, 0), (4, 2, -2, 0, 0),
                      (-2, 4, -2, 0, 0), (-2, 4, 0, 0, 0), (-4, 4, 2, 0, 0), (-2, 4, 0, 0, 0), (-6, 6, 0, 0, 0),
                      (-6, 6, 2, 0, 0), (-8, 6, 2, 0, 0), (-8, 6, 2, 0, 0), (-8, 6, 0, 0, 0), (-8, 6, 2, 0, 0),
                      (-8, 6, 0, 0, 2), (-8, 6, 0, 0, 2), (-8, 6, 2, 0, 2), (-8, 6, 6, 0, 2), (-8, 6, 6, 4, 2),
                      (-8, 6, -2, 8, 2), (-8, 6, -2, 12, 2), (-8, 6, -2, 16, 2), (-8, 6, 2, 0, 2), (-8, 6, 6, -4, 2),
                      (-8, 6, 10, -4, 2), (-8, 6, 14, -4, 2), (-8, 6, 2, -4, 2), (-8, 6, -4, -4, 2),
                      (-8, 6, -6, -4, 2)),
        "mixed": ((0, 0, 0, 0, 0), (-2, 2, -2, 0, 0), (0, 0, -2, 0, 0), (2, 0, -2, 0, 0), (-4, 2, -2, 0, 0),
                  (-4, 2, 0, 0, 0), (-6, 0, 2, 0, 0), (-6, 4, 0, 0, 0), (-6, 2, 4, 0, 0), (-4, 2, 0, 0, 0),
                  (-8, 4, 0, 0, 0), (-8, 4, 2, 0, 0), (-10, 2, 4, 0, 0), (-10, 6, 2, 0, 0), (-10, 4, 6, 0, 0),
                  (-10, 4, 6, 0, 0), (-10, 4, 2, 0, 0), (-10, 4, 6, 0, 0), (-10, 4, 2, 0, 4), (-10, 4, -2, 0, 4),
                  (-10, 4, 2, 0, 4), (-10, 4, 2, 4, 4), (-10, 4, -6, 8, 4), (-10, 4, -6, 12, 4), (-10, 4, -6, 16, 4),
                  (-10, 4, -2, 0, 4), (-10, 4, 2, -4, 4), (-10, 4, 6, -4, 4), (-10, 4, 10, -4, 4),
                  (-10, 4, -2, -4, 4), (-10, 4, -6, -4, 4), (-10, 4, -12, -4, 4)),
    },
    SP_RANK: {
        "fp32": ((0, 0, 0, 0, 0, 0), (0, 4, 0, -4, 0, 0), (4, 4, 0, -4, 0, 0), (4, 4, -4, -4, 0, 0),
                 (8, 4, -4, -4, 0, 0), (-4, 8, -4, -4, 0, 0), (-4, 8, 0, -4, 0, 0), (-8, 8, 4, -4, 0, 0),
                 (-4, 8, 0, -4, 0, 0), (-12, 12, 0, -4, 0, 0), (-12, 12, 4, -4, 0, 0), (-16, 12, 4, -4, 0, 0),
                 (-16, 12, 4, -4, 0, 0), (-16, 12, -4, 0, 0, 0), (-16, 12, -8, 4, 0, 0), (-16, 12, -8, 8, 0, 0),
                 (-16, 12, -8, 4, 0, 4), (-16, 12, -8, 0, 0, 4), (-16, 12, -8, 4, 0, 4), (-16, 12, -8, 4, 4, 4),
                 (-16, 12, -8, -4, 8, 4), (-16, 12, -8, -4, 12, 4), (-16, 12, -8, -4, 16, 4), (-16, 12, -8, 0, 0, 4),
                 (-16, 12, -8, 4, -4, 4), (-16, 12, -8, 8, -4, 4), (-16, 12, -8, 12, -4, 4), (-16, 12, -8, 0, -4, 4),
                 (-16, 12, -8, -4, -4, 4), (-16, 12, -4, -12, -4, 4)),
        "bf16-pure": ((0, 0, 0, 0, 0, 0), (0, 2, 0, -4, 0, 0), (2, 2, 0, -4, 0, 0), (2, 2, -2, -4, 0, 0),
                      (4, 2, -2, -4, 0, 0), (-2, 4, -2, -4, 0, 0), (-2, 4, 0, -4, 0, 0), (-4, 4, 2, -4, 0, 0),
                      (-2, 4, 0, -4, 0, 0), (-6, 6, 0, -4, 0, 0), (-6, 6, 2, -4, 0, 0), (-8, 6, 2, -4, 0, 0),
                      (-8, 6, 2, -4, 0, 0), (-8, 6, -2, -2, 0, 0), (-8, 6, -4, 0, 0, 0), (-8, 6, -4, 2, 0, 0),
                      (-8, 6, -4, 0, 0, 2), (-8, 6, -4, 0, 0, 2), (-8, 6, -4, 2, 0, 2), (-8, 6, -4, 6, 0, 2),
                      (-8, 6, -4, 6, 4, 2), (-8, 6, -4, -2, 8, 2), (-8, 6, -4, -2, 12, 2), (-8, 6, -4, -2, 16, 2),
                      (-8, 6, -4, 2, 0, 2), (-8, 6, -4, 6, -4, 2), (-8, 6, -4, 10, -4, 2), (-8, 6, -4, 14, -4, 2),
                      (-8, 6, -4, 2, -4, 2), (-8, 6, -4, -4, -4, 2), (-8, 6, -4, -6, -4, 2), (-8, 6, -2, -10, -4, 2)),
        "mixed": ((0, 0, 0, 0, 0, 0), (-2, 2, -2, 0, 0, 0), (0, 0, -2, 0, 0, 0), (2, 0, -2, 0, 0, 0),
                  (-4, 2, -2, 0, 0, 0), (-4, 2, 0, 0, 0, 0), (-6, 0, 2, 0, 0, 0), (-6, 4, 0, 0, 0, 0),
                  (-6, 2, 4, 0, 0, 0), (-4, 2, 0, 0, 0, 0), (-8, 4, 0, 0, 0, 0), (-8, 4, 2, 0, 0, 0),
                  (-10, 2, 4, 0, 0, 0), (-10, 6, 2, 0, 0, 0), (-10, 4, 6, 0, 0, 0), (-10, 4, 6, 0, 0, 0),
                  (-10, 4, -2, 4, 0, 0), (-10, 4, -6, 8, 0, 0), (-10, 4, -6, 12, 0, 0), (-10, 4, -6, 8, 0, 4),
                  (-10, 4, -6, 4, 0, 4), (-10, 4, -6, 8, 0, 4), (-10, 4, -6, 8, 4, 4), (-10, 4, -6, 0, 8, 4),
                  (-10, 4, -6, 0, 12, 4), (-10, 4, -6, 0, 16, 4), (-10, 4, -6, 4, 0, 4), (-10, 4, -6, 8, -4, 4),
                  (-10, 4, -6, 12, -4, 4), (-10, 4, -6, 16, -4, 4), (-10, 4, -6, 4, -4, 4), (-10, 4, -6, 0, -4, 4),
                  (-10, 4, -6, -6, -4, 4), (-10, 4, -4, -6, -4, 4)),
    },
}
# a tp + sp rank's anchor: "last layer recomputed" as parallel/activations.sequence_parallel sheds it (each layer's
# checkpoint, its input, on the rank's S / tp tokens, and the recomputed layer's two norms and its output and input
# gradients 8·T·h on them too) less what the head's and the final norm's backward have freed by the down
# projection's weight gradient, (b·T·h/tp + c·T + d·T/tp − 8) by precision, (b, c, d): no whole-sequence T·h term
# is left. Read off the same traced ranks as its rows (tp 2 and tp 4 separate the sharded terms) over the moment
# before that shed, as (24, −12, 16, −4) in fp32, (20, −12, 16, −4) in bf16-pure and (24, −8, 16, −4) under
# autocast on (T·h, T·h/tp, T, T/tp); these are those less the shed, the norms' 2 × (p·h + 4)·T·(1 − 1/tp) (p 8; 6 in
# bf16-pure) and the gradients' 8·T·h·(1 − 1/tp), where tp divides T (the traced rank refuses an S it does not)
SP_RECOMPUTE_FREED = {"fp32": (12, 8, 4), "bf16-pure": (8, 8, 4), "mixed": (16, 8, 4)}


def sp_recompute_freed(kind: str, t: int, h: int, tp: int) -> tuple[int, str]:
    """(bytes, words) of what a tp + sp rank's head's and final norm's backward have freed of "last layer
    recomputed" by the recomputed layer's down projection's weight gradient (SP_RECOMPUTE_FREED; `kind` fp32,
    bf16-pure or mixed; T tokens, h the hidden width): the anchor of its first micro-step's table and of a later
    micro-step's down projection moment (grad_accum.recomputed_gradient_moments)."""
    b, c, d = SP_RECOMPUTE_FREED[kind]
    return b * (t * h // tp) + c * t + d * (t // tp) - 8, f"{b}·T·h/tp + {c}·T + {d}·T/tp − 8"


def _basis(layout: str, t: int, h: int, i: int, tp: int) -> tuple[int, ...]:
    if layout == SP_RANK:
        return t * i, i * h, t * h, t * h // tp, t // tp, h
    return t * i, i * h, t * h, t, h


def recomputed_backward_moments(act: TrainingActivations, *, held_last: int, layer_gradients: int,
                                ids: int = 0, layout: str = ONE_DEVICE,
                                tp: int = 1) -> tuple[tuple[str, int, str, int], ...]:
    """The first micro-step's moments inside a recomputed layer's backward under full checkpointing (a Llama-style
    recipe): (where, bytes beyond the resident states, words, the gradients held), for the first layer and the last.

    Layer l's backward holds the checkpoints of layers 0..l, the outside activations the head's and the final norm's
    backward left, its own recomputed activations, and the gradients of the head and the final norm (`held_last`: a
    tied head's is held in the tied weight's gradient buffer until the embedding's adds in) and of layers
    l+1..L−1 (`layer_gradients` each): linear in l, so its largest is at layer 0 or at the last layer. In the layer
    the MLP's backward makes its weight gradients one by one as it frees its activations (_MLP_BACKWARD[layout],
    from the moment before the down projection's weight gradient: "last layer recomputed" − what the head's and the
    final norm's backward freed (one device and a tp rank: k·T·h + 12·T − 8; a tp + sp rank: SP_RECOMPUTE_FREED, over
    its checkpoints on S / tp tokens), + the down projection's input gradient and, under autocast, the layer's
    16-bit weight copies made again, less the head's, freed with its backward). `layout`: ONE_DEVICE, TP_RANK or
    SP_RANK (tensor parallel with sequence parallel), of degree `tp`. `ids`: the token ids a vocabulary-parallel
    embedding still references (a tp rank's 8·T)."""
    shape = act.recomputed
    again = next((m for m in act.moments if m.where == "last layer recomputed"), None)
    if shape is None or again is None or not act.layers:
        return ()
    t, h, i, kind = shape.tokens, shape.hidden, shape.inner, shape.kind
    sp = layout == SP_RANK
    checkpoint = shape.checkpoint // tp if sp else shape.checkpoint  # a layer's input, on the rank's S / tp tokens
    if sp:
        freed, freed_words = sp_recompute_freed(kind, t, h, tp)
        anchor = again.bytes - freed + ids
        anchor_words = f"last layer recomputed {again.bytes:,} − ({freed_words}) freed by then = "
        if kind != "mixed":
            anchor_words += f"{anchor:,}"
    else:
        k = RECOMPUTE_FREED["bf16-mixed" if kind == "mixed" else kind]
        anchor = again.bytes - k * t * h - 12 * t + 8 + ids
        anchor_words = f"last layer recomputed {again.bytes:,} − ({k}·T·h + 12·T − 8) freed by then = "
        if kind == "bf16-pure":
            anchor += 2 * t * h
            anchor_words += f"{anchor - 2 * t * h:,} + the down projection's output gradient 2·T·h"
        elif kind == "fp32":
            anchor_words += f"{anchor:,}"
    if kind == "mixed":
        copies = 2 * shape.layer_casts - 2 * shape.head_casts
        anchor += copies + 2 * t * i + 2 * i * h
        anchor_words += (f"{anchor - copies - 2 * t * i - 2 * i * h:,} + the layer's 16-bit weight copies 2 × "
                         f"{shape.layer_casts:,} − the head's 2 × {shape.head_casts:,} + the down projection's "
                         f"bf16 input and weight gradients 2·T·i + 2·i·h")
    basis = _basis(layout, t, h, i, tp)
    table = _MLP_BACKWARD[layout][kind]
    steps = [sum(c * b for c, b in zip(coefs, basis)) for coefs in table]
    top = max(range(len(steps)), key=lambda n: steps[n])
    named = [(c, n) for c, n in zip(table[top], _BASIS[layout]) if c]
    terms = "".join((("−" if c < 0 else "") if k == 0 else f" {'−' if c < 0 else '+'} ") + f"{abs(c)}·{n}"
                    for k, (c, n) in enumerate(named))
    inner = steps[top]
    earlier = act.layers - 1
    out = []
    for where, layer, held, kept in (("last layer's backward (recomputed)", earlier, held_last, 0),
                                     ("first layer's backward (recomputed)", 0, held_last + earlier * layer_gradients,
                                      earlier * checkpoint)):
        total = anchor + inner + held - kept
        words = (f"{anchor_words}; its MLP's backward at its largest, {terms or '0'} = {inner:,}; the gradients "
                 f"held, {held:,} (the head's and the final norm's"
                 + (f", and layers 1–{earlier}'s, {layer_gradients:,} each" if layer == 0 and earlier else "") + ")"
                 + (f" − the checkpoints of layers 1–{earlier}, freed, {earlier} × {checkpoint:,}"
                    if kept else ""))
        out.append((where, total, words, held))
    return tuple(out)
