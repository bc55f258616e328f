"""Gradient accumulation: a replica's batch run as N micro-steps of batch / N sequences, the optimizer after the last.

    options (batch B, grad_accum N) → the step at the micro-batch B / N (any engine) → its moments twice: the first
    micro-step's as they are (no gradient held when it starts), a later micro-step's with the gradients held
    → the optimizer step → the peak is the largest moment

A later micro-step is the first one again over the gradients the earlier ones left: at each of its moments the
gradients held are the whole set (the device's shard of it where the layout shards gradients), in place of the ones
the first micro-step had accumulated by then. Autograd's AccumulateGrad adds a new gradient into a held one in
place (`grad += new`): the new one lives beside the held set until added, where the first micro-step instead keeps
it as the gradient. So a moment's bytes in a later micro-step are its bytes in the first, less the gradients held
then (MemTracker's "gradients": those already accumulated), plus the whole set; at the end of the backward the
embedding's new gradient, still being produced there, is that moment's new one. Every micro-step after the second
is the second again, so two are traced and the rest follow.

One moment a later micro-step has that the first's recipe does not name: the head's backward. In the first micro-step
the head's new weight gradient becomes its .grad; in a later one it is made beside the held one and added into it,
so the head's backward holds every gradient and a second head gradient at once (head_gradient_moments). Read off
the allocation timeline of the traced second micro-step (llama-3-8b cut to 2 layers, 256 tokens): its backward
peaks as the head's matmul backward makes the weight gradient (fp32, bf16-pure), or as autograd casts that bf16
gradient to the fp32 weight's dtype (bf16-mixed, autocast's copy of the head freed with the matmul's backward).
Under full checkpointing a second one: the recomputed last layer's down projection makes its new weight gradient
beside the held ones over the layer's recomputed activations (recomputed_gradient_moments), the later backward's
peak wherever the layer's activations outweigh the head's logits (fp32, bf16-pure and bf16-mixed Llama cuts).

Sharded data parallelism (ZeRO-2/3, FSDP2) reduce-scatters each micro-step's gradients and accumulates the shard,
FSDP2's default (set_requires_gradient_sync(True) on every micro-step; torchtitan and accelerate keep it): each
device holds its shard of the gradients between micro-steps. Turning the sync off for all but the last micro-step
would hold the full unsharded gradients instead, trading memory for communication: not this convention.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Callable

from ..dtypes import itemsize
from ..traced.step import HELD_BACKWARD, HELD_FORWARD
from .activations.step import RECOMPUTE_FREED, sp_recompute_freed  # what the down projection's backward freed
from .phases import RECOMPUTED_MOMENTS, RECOMPUTED_PRECISIONS, PhaseFigure
from .states import as_trained, step_precision

CONVENTION = ("gradient accumulation as FSDP2 and DeepSpeed run it by default: each micro-step's gradients "
              "reduce-scattered (or all-reduced) and added into the held ones, so a device holds its share of the "
              "gradients between micro-steps")


def micro_options(options: Any) -> Any:
    """The options of one micro-step: the micro-batch, one micro-step (the layout at that batch)."""
    micro = options.batch // options.grad_accum
    layout = options.layout
    if layout is not None and getattr(layout, "batch", None) is not None:
        layout = dataclasses.replace(layout, batch=micro)
    return dataclasses.replace(options, batch=micro, grad_accum=1, layout=layout)


# the recipes whose later micro-step's head moment was read off a traced second micro-step (one device and tp)
HEAD_MOMENT_RECIPES = ("Llama-style decoder",)


@dataclass(frozen=True)
class HeadBackward:
    """What the head's backward works on in a micro-step: T tokens (the rank's), V the vocabulary, h the head's
    input width, `head` the head weight's elements on the device (V·h, or its tp shard), `precision` the step's."""

    tokens: int
    vocab: int
    hidden: int
    head: int
    precision: str


def held_phases(phases: tuple[PhaseFigure, ...], gradients: int, last_new: int,
                head: HeadBackward | None = None, exact: bool = False,
                recomputed: RecomputedLayer | None = None) -> tuple[PhaseFigure, ...]:
    """`phases` (one micro-step's moments and the optimizer step) with a later micro-step's moments added before
    the optimizer step: each forward and backward moment less the gradients it held, plus `gradients` (every one,
    the device's share), plus `last_new` at the end of the backward (the embedding's new gradient, added into the
    held one there), and with `head` the head's backward over the held gradients (head_gradient_moments); unless
    `exact` (head_outweighs_layers, or FSDP2's moments, which hold the head's) the later micro-step is a lower
    bound, named so; with `recomputed` (full checkpointing) the recomputed last layer's down projection's backward
    over the held gradients (recomputed_gradient_moments). Phases already measured over held gradients (a traced
    later micro-step) are kept as measured."""
    if measured(phases):
        return phases
    first = [p for p in phases if p.phase != "optimizer step"]
    rest = [p for p in phases if p.phase == "optimizer step"]
    later = []
    bound = "" if exact else " (lower bound)"
    for p in first:
        if recomputed is not None and p.where == "last layer recomputed":
            continue  # the first micro-step's composite of the recomputed layer: recomputed_gradient_moments' below
        if p.where in RECOMPUTED_MOMENTS:
            continue  # the first micro-step's recomputed layers, each new gradient kept as the .grad
        new = last_new if p.where.endswith("end of backward") else 0
        held = p.gradients - new
        words = (f"{p.arithmetic}; a later micro-step{bound}: − the gradients this moment held in the "
                 f"first, {held:,}, + every gradient, held from the earlier micro-steps, {gradients:,}")
        later.append(PhaseFigure(HELD_FORWARD if p.phase == "forward" else HELD_BACKWARD,
                                 p.bytes - held + gradients, p.where, words, gradients, p.variable))
    start = next((p for p in first if p.where.endswith("start of backward")), None)
    if head is not None and start is not None:
        later += head_gradient_moments(start, gradients, head)
    again = next((p for p in first if p.where == "last layer recomputed"), None)
    if recomputed is not None and again is not None:
        later += recomputed_gradient_moments(again, gradients, recomputed)
    return tuple(first) + tuple(later) + tuple(rest)


def head_gradient_moments(start: PhaseFigure, gradients: int, head: HeadBackward) -> list[PhaseFigure]:
    """A later micro-step's moments in the head's backward, from the first micro-step's start of backward `start`
    (its bytes hold the resident states and the saved activations, the fp32 logits 4·T·V among them, and the loss's
    8·T·V: the logits' gradient and log-softmax): by then the loss's backward has freed those 12·T·V, and the head's
    matmul backward holds its output's gradient (the logits', in the head's dtype e: e·T·V), its input's gradient
    e·T·h and the weight's new gradient e·V·h beside every held one, before AccumulateGrad adds it into the held
    .grad. Under autocast (bf16-mixed) the matmul ran on autocast's bf16 copy of the head, so its new gradient is
    bf16 (2·V·h) and is cast to the fp32 weight's dtype (4·V·h) after the matmul's backward, which frees the
    logits' gradient and the copy (2·V·h): two moments, the larger the peak. Each equals the traced second
    micro-step's (llama-3-8b cut to 2 layers, 256 tokens, fp32, bf16-mixed and bf16-pure, with and without full
    checkpointing; tp 2's rank alike)."""
    t, v, h, n = head.tokens, head.vocab, head.hidden, head.head
    base = start.bytes - start.gradients + gradients
    loss = 12 * t * v
    opening = (f"start of backward {start.bytes - start.gradients:,} + every gradient, held from the earlier "
               f"micro-steps, {gradients:,} − the fp32 logits and the loss's logits' gradient and log-softmax, freed "
               f"by the loss's backward, 12·T·V = {loss:,}")
    if head.precision == "bf16-mixed":
        made = base - loss + 2 * t * v + 2 * t * h + 2 * n
        cast = base - loss + 2 * t * h - 2 * n + 2 * n + 4 * n
        return [
            PhaseFigure(HELD_BACKWARD, made, "the head's weight gradient",
                        f"{opening} + the logits' bf16 gradient 2·T·V = {2 * t * v:,} + the head input's bf16 "
                        f"gradient 2·T·h = {2 * t * h:,} + the head's new bf16 weight gradient 2·V·h = {2 * n:,}, "
                        "beside the held one (autocast's bf16 copy of the head still saved)", gradients, made - gradients),
            PhaseFigure(HELD_BACKWARD, cast, "the head's weight gradient cast to fp32",
                        f"{opening} + the head input's bf16 gradient 2·T·h = {2 * t * h:,} − autocast's bf16 copy "
                        f"of the head, freed with the matmul's backward, 2·V·h = {2 * n:,} + the head's new weight "
                        f"gradient in bf16 2·V·h = {2 * n:,} and cast to fp32 4·V·h = {4 * n:,}, beside the held one "
                        "until AccumulateGrad adds it in", gradients, cast - gradients),
        ]
    e = 2 if head.precision == "bf16-pure" else 4
    made = base - loss + e * t * v + e * t * h + e * n
    return [PhaseFigure(HELD_BACKWARD, made, "the head's weight gradient",
                        f"{opening} + the logits' gradient {e}·T·V = {e * t * v:,} + the head input's gradient "
                        f"{e}·T·h = {e * t * h:,} + the head's new weight gradient {e}·V·h = {e * n:,}, beside the "
                        "held one until AccumulateGrad adds it in", gradients, made - gradients)]


@dataclass(frozen=True)
class RecomputedLayer:
    """The last layer's backward under full checkpointing in a micro-step (a Llama-style layer): T tokens, h the
    hidden width, i the down projection's input width, `casts` the elements of the layer's matmul weights, which
    autocast copies to 16 bits again as the layer is recomputed (bf16-mixed), `head` the head weight's elements,
    whose autocast copy the head's backward has freed by then (bf16-mixed), and the step's precision."""

    tokens: int
    hidden: int
    inner: int
    casts: int
    head: int
    precision: str
    ids: int = 0  # a tensor-parallel rank's: the token ids its vocabulary-parallel embedding still references, 8·T
    sp: int = 0  # a tp + sp rank's tp degree: its anchor and its down projection's rows are the tp + sp rank's




def recomputed_gradient_moments(again: PhaseFigure, gradients: int, layer: RecomputedLayer) -> list[PhaseFigure]:
    """A later micro-step's moments in the recomputed last layer's backward under full checkpointing, from the
    first micro-step's "last layer recomputed" `again` (the checkpoints, the outside activations less the fp32
    logits, one layer's activations and 8·T·h of gradients): by the down projection's backward the head's and the
    final norm's backward have freed their saved inputs and the labels, and the down projection's matmul backward
    makes its input's gradient e·T·i and its new weight gradient e·i·h beside every held one, before AccumulateGrad
    adds it in: the largest new gradient over the most activations a later backward holds. Under autocast the
    recomputation made the layer's 16-bit weight copies again (2 B each) while the head's was freed with its
    backward, the new gradient is bf16 and is cast to the fp32 weight's dtype once the matmul's backward has freed
    the projection's copy, its saved input and its output's bf16 gradient: two moments, the larger the peak. Each
    equals the traced second micro-step's (Llama cuts, h 128 and 256, fp32, bf16-pure, bf16-mixed)."""
    t, h, i = layer.tokens, layer.hidden, layer.inner
    k = RECOMPUTE_FREED[layer.precision]
    freed, freed_words = k * t * h + 12 * t - 8, f"{k}·T·h + 12·T − 8 (the loss and its gradient)"
    if layer.sp:  # a tp + sp rank: its table's anchor (activations/step.py), over the moment as sp sheds it
        kind = "mixed" if layer.precision == "bf16-mixed" else layer.precision
        freed, freed_words = sp_recompute_freed(kind, t, h, layer.sp)
    base = again.bytes - again.gradients + gradients - freed + layer.ids
    opening = (f"last layer recomputed {again.bytes - again.gradients:,} + every gradient, held from the earlier "
               f"micro-steps, {gradients:,} − what the head's and the final norm's backward freed and the moment's "
               f"gradients not made or counted twice by the down projection's backward, {freed_words} = {freed:,}" +
               (f" + the token ids the vocabulary-parallel embedding references, 8·T = {layer.ids:,}"
                if layer.ids else ""))
    if layer.sp and layer.precision != "bf16-mixed":
        # the tp + sp rank's table (its rows 1 and 2): 4·T·h/tp freed before the weight gradient is made (traced,
        # the second micro-step's allocations: Llama h 256 and 192, tp 2, fp32 and bf16-pure)
        base -= 4 * (t * h // layer.sp)
        opening += f" − 4·T·h/tp freed as its weight gradient is made = {4 * (t * h // layer.sp):,}"
    if layer.precision == "bf16-mixed":
        copies = 2 * layer.casts - 2 * layer.head
        made = base + copies + 2 * t * i + 2 * i * h
        cast = made - 2 * i * h - 2 * t * i - 2 * t * h + 4 * i * h
        copy_words = (f" + the layer's 16-bit weight copies, made again by its recomputation, 2 × {layer.casts:,} − "
                      f"the head's, freed by its backward, 2 × {layer.head:,}")
        return [
            PhaseFigure(HELD_BACKWARD, made, "the recomputed last layer's down projection gradient",
                        f"{opening}{copy_words} + its input's bf16 gradient 2·T·i = {2 * t * i:,} + its new bf16 "
                        f"weight gradient 2·i·h = {2 * i * h:,}, beside the held one", gradients, made - gradients),
            PhaseFigure(HELD_BACKWARD, cast, "the recomputed down projection gradient cast to fp32",
                        f"{opening}{copy_words} + its input's bf16 gradient 2·T·i = {2 * t * i:,} − its copy, its "
                        f"saved input and its output's bf16 gradient, freed with the matmul's backward, 2·i·h + "
                        f"2·T·i + 2·T·h = {2 * i * h + 2 * t * i + 2 * t * h:,} + the new weight gradient in bf16 "
                        f"2·i·h = {2 * i * h:,} and cast to fp32 4·i·h = {4 * i * h:,}, beside the held one until "
                        "AccumulateGrad adds it in", gradients, cast - gradients),
        ]
    e = 2 if layer.precision == "bf16-pure" else 4
    made = base + e * t * i + e * i * h
    return [PhaseFigure(HELD_BACKWARD, made, "the recomputed last layer's down projection gradient",
                        f"{opening} + its input's gradient {e}·T·i = {e * t * i:,} + its new weight gradient "
                        f"{e}·i·h = {e * i * h:,}, beside the held one until AccumulateGrad adds it in", gradients,
                        made - gradients)]


def recomputed_layer(source: str, report: Any, trainable: frozenset[str], tokens: int,
                     precision: str) -> RecomputedLayer | None:
    """The last layer's backward a later micro-step recomputes (recomputed_gradient_moments) where it was read off
    a trace: an analytic HEAD_MOMENT_RECIPES answer whose head is named (head_shape), the last layer's down
    projection trainable and the largest of its weights (its backward then holds the largest new gradient beside
    the most activations), in a precision its moments were read off (RECOMPUTED_PRECISIONS: fp32, bf16-pure,
    bf16-mixed; fp16-mixed keeps the first micro-step's moments over the held gradients, a lower bound); None
    elsewhere."""
    if step_precision(precision) not in RECOMPUTED_PRECISIONS:
        return None
    shape = head_shape(source, report, trainable)
    if shape is None:
        return None
    layers = {}
    for p in report.params:
        found = re.search(r"\.(\d+)\.", p.name)
        if found:
            layers.setdefault(int(found.group(1)), []).append(p)
    if not layers:
        return None
    last = layers[max(layers)]
    down = [p for p in last if p.role == "mlp.down" and len(p.shape) == 2]
    matmuls = [p for p in last if len(p.shape) == 2]
    if len(down) != 1 or down[0].name not in trainable or any(p.numel > down[0].numel for p in matmuls):
        return None
    hidden, inner = down[0].shape
    return RecomputedLayer(tokens, hidden, inner, sum(p.numel for p in matmuls), shape[0] * shape[1],
                           step_precision(precision))


def head_outweighs_layers(report: Any, trainable: frozenset[str], checkpointing: bool) -> bool:
    """Whether the head's backward is a later micro-step's largest moment among those that make a new gradient
    beside the held ones: each layer's backward makes its own, over what the backward has not yet freed (less than
    at the head's moment), so without checkpointing it is where the head's weight is the largest trainable one
    (equal to the trace on Llama cuts at h 128 and 4,096). Under full checkpointing the recomputed layer's
    activations sit beside its new gradients, a moment the recipe does not name (recomputed_gradient_moments names
    the last layer's, for the Llama recipe)."""
    if checkpointing:
        return False
    head = max((p.numel for p in report.params if p.role == "head.lm" and p.name in trainable), default=0)
    return all(p.numel <= head for p in report.params if p.name in trainable)


def tp_alone(layout: Any) -> bool:
    """Whether `layout` is tensor parallelism alone (no data, context, sequence or expert parallelism beside it),
    whose rank's later micro-step was traced moment by moment."""
    return layout is not None and layout.tp > 1 and layout.dp == layout.cp == layout.ep == layout.pp == 1 and \
        not layout.sp


def sp_alone(layout: Any) -> bool:
    """Whether `layout` is tensor parallelism with sequence parallel alone (no data, context or expert parallelism
    or pipeline beside it), whose rank's recomputed layer's backward was traced (activations/step.py's tp + sp
    table)."""
    return layout is not None and layout.tp > 1 and layout.sp and layout.dp == layout.cp == layout.ep == \
        layout.pp == 1


def fsdp2_alone(layout: Any) -> bool:
    """Whether `layout` is FSDP2 over data parallelism alone, whose closed-form moments equal the traced rank's in
    every micro-step (its head gradient is held in its reduce-scatter moments)."""
    return layout is not None and layout.shard == "fsdp" and layout.tp == layout.cp == layout.ep == layout.pp == 1


def held_between(phases: tuple[PhaseFigure, ...]) -> int:
    """The gradients a device holds between micro-steps: those its optimizer step finds (the device's share under
    ZeRO-2/3 and FSDP2, the whole embedding gradient a tensor-parallel rank keeps)."""
    return max((p.gradients for p in phases if p.phase == "optimizer step"), default=0)


def measured(phases: tuple[PhaseFigure, ...]) -> bool:
    """Whether a later micro-step's moments are among `phases` (a traced step's, measured)."""
    return any(p.phase in (HELD_FORWARD, HELD_BACKWARD) for p in phases)


def embedding_gradient_bytes(report: Any, trainable: frozenset[str], precision: str, own: frozenset[str]) -> int:
    """Bytes of the input embedding's gradient (the largest trainable embedding: its backward runs last)."""
    sizes = [p.numel * itemsize(p.dtype) for p in as_trained(report.params, precision, own)
             if p.role.startswith("embedding") and p.name in trainable]
    return max(sizes, default=0)


def head_shape(source: str, report: Any, trainable: frozenset[str]) -> tuple[int, int] | None:
    """(V, h) of the vocabulary-wide head whose later micro-step's moment was read off a trace
    (head_gradient_moments): an analytic HEAD_MOMENT_RECIPES answer (`source`, its activations' label), the head
    trainable and untied; None elsewhere, where the later micro-step is a lower bound."""
    if not any(source.startswith(f"analytic: {recipe}") for recipe in HEAD_MOMENT_RECIPES):
        return None
    heads = [p for p in report.params if p.role == "head.lm"]
    if len(heads) != 1 or heads[0].aliases or heads[0].name not in trainable or len(heads[0].shape) != 2:
        return None
    vocab, hidden = heads[0].shape
    return vocab, hidden


def head_backward(micro: Any, report: Any, options: Any, trainable: frozenset[str],
                  device: Any = None) -> HeadBackward | None:
    """The head's backward of `micro` (the step at the micro-batch) where head_shape names it: on one device, or a
    tensor-parallel rank (`device`, its DeviceMemory) whose layout is tp alone (no data, context, sequence or expert
    parallelism beside it: their head backward was not traced) and whose head is cut by vocabulary rows over tp."""
    source = device.activations_from if device is not None else micro.settings.get("activations_from", "")
    shape = head_shape(source, report, trainable)
    if shape is None:
        return None
    vocab, hidden = shape
    elements = vocab * hidden
    layout = options.layout
    if device is not None:
        if not tp_alone(layout) or vocab % layout.tp:
            return None
        elements //= layout.tp
    elif layout is not None and not layout.trivial:
        return None
    return HeadBackward(micro.settings["batch"] * micro.settings["seq"], vocab, hidden, elements,
                        step_precision(micro.settings["precision"]))


def derived_later(phases: tuple[PhaseFigure, ...], step: Any, batch: int, seq: int, resident: int,
                  gradients: int) -> tuple[PhaseFigure, ...]:
    """A derived answer's `phases` (forward, backward, optimizer step at `batch` × `seq`) with a later micro-step's
    replayed from the recipe that covers them (`step`: the DerivedStep): its forward over every gradient held, and
    its backward with each new gradient live beside the held ones until AccumulateGrad adds it in
    (DerivedRecipe.later_backward). None of the recipe's allocations changes between micro-steps but these."""
    recipe = next((r for r in step.recipes if r.covers(batch, seq)), None)
    if recipe is None:
        return phases
    forward = next(p for p in phases if p.phase == "forward")
    later = recipe.later_backward(batch, seq)
    held = (PhaseFigure(HELD_FORWARD, forward.bytes + gradients, forward.where,
                        f"{forward.arithmetic}; + every gradient, held from the earlier micro-steps, {gradients:,}",
                        gradients, forward.variable),
            PhaseFigure(HELD_BACKWARD, resident + gradients + later, "derived (the later micro-step replayed)",
                        f"every gradient, held from the earlier micro-steps, {gradients:,} + live at the later "
                        f"backward's peak {later:,} (the recipe's allocations replayed, each new weight gradient beside "
                        "the held one until added in)", gradients, later))
    return tuple(p for p in phases if p.phase != "optimizer step") + held + \
        tuple(p for p in phases if p.phase == "optimizer step")


def later_micro_step(report: Any, trainable: frozenset[str], precision: str, own: frozenset[str],
                     source: str) -> Callable[[tuple[PhaseFigure, ...], int, int], tuple[PhaseFigure, ...]]:
    """One device's phases at (micro-batch, length) → with a later micro-step's moments added, as `accumulated`
    adds them: what the largest batch and context (the fits table, --gpu) are searched over under accumulation."""
    new = embedding_gradient_bytes(report, trainable, precision, own)
    shape = head_shape(source, report, trainable)

    def later(phases: tuple[PhaseFigure, ...], batch: int, length: int) -> tuple[PhaseFigure, ...]:
        head = None if shape is None else HeadBackward(batch * length, shape[0], shape[1], shape[0] * shape[1],
                                                       step_precision(precision))
        again = recomputed_layer(source, report, trainable, batch * length, precision)
        return held_phases(phases, held_between(phases), new, head, recomputed=again)
    return later


def later_rank_step(report: Any, trainable: frozenset[str], precision: str, own: frozenset[str], source: str,
                    layout: Any) -> Callable[[tuple[PhaseFigure, ...], int, int], tuple[PhaseFigure, ...]]:
    """A layout's device phases at (micro-batch, length) → with a later micro-step's moments added, as `accumulated`
    adds them to the device's (`source`: the device's activations_from): what the largest batch and context (the
    fits table, --gpu) are searched over under accumulation beside a layout."""
    whole = tp_alone(layout)  # a tp rank's embedding backward makes the whole gradient beside the whole one held
    new = embedding_gradient_bytes(report, trainable, precision, own) if whole else 0
    shape = head_shape(source, report, trainable) if whole else None
    if shape is not None and shape[0] % layout.tp:
        shape = None

    def later(phases: tuple[PhaseFigure, ...], batch: int, length: int) -> tuple[PhaseFigure, ...]:
        head = None if shape is None else HeadBackward(batch * length, shape[0], shape[1],
                                                       shape[0] * shape[1] // layout.tp, step_precision(precision))
        return held_phases(phases, held_between(phases), new, head)
    return later


def accumulated(micro: Any, report: Any, options: Any) -> Any:
    """The MemoryEstimate of `options` (grad_accum > 1) from `micro`, the estimate at its micro-batch."""
    detail = micro.training
    steps, batch = options.grad_accum, options.batch
    trainable = frozenset(p.name for p in report.params) - frozenset(detail.frozen)
    own = options.own_dtype if options.own_dtype else frozenset()
    new = embedding_gradient_bytes(report, trainable, micro.settings["precision"], own)
    traced = measured(detail.phases)
    head = head_backward(micro, report, options, trainable)
    checkpointing = micro.settings.get("grad_checkpointing") == "full"
    outweighs = head_outweighs_layers(report, trainable, checkpointing)
    named = head is not None  # the head's backward moment named over the held gradients
    # under full checkpointing the recomputed last layer's down projection backward beside the held gradients
    recomputed = recomputed_layer(micro.settings.get("activations_from", ""), report, trainable, head.tokens,
                                  micro.settings["precision"]) if named and checkpointing else None
    exact = traced or named and (outweighs or recomputed is not None)
    phases = held_phases(detail.phases, held_between(detail.phases), new, head, exact, recomputed)
    device = detail.device
    rank_recomputed = None
    replayed = device is not None and measured(device.phases)  # a derived FSDP2 rank's, replayed (estimate.py)
    if device is not None:  # the device's held share; the embedding's new gradient there is left out
        rank_head = head_backward(micro, report, options, trainable, device)
        named = rank_head is not None
        # a tp rank under full checkpointing: its recomputed last layer's down projection, cut over tp
        whole = recomputed_layer(device.activations_from, report, trainable, rank_head.tokens,
                                 micro.settings["precision"]) if named and checkpointing else None
        rank_recomputed = None if whole is None or whole.inner % options.layout.tp else dataclasses.replace(
            whole, inner=whole.inner // options.layout.tp, casts=whole.casts // options.layout.tp,
            head=rank_head.head, ids=8 * rank_head.tokens)
        if checkpointing and rank_recomputed is None and sp_alone(options.layout) and \
                step_precision(micro.settings["precision"]) in ("fp32", "bf16-pure"):
            # a tp + sp rank: its recomputed last layer's down projection over the tp + sp rank's anchor (its head's
            # backward is not named; under autocast the layer's later backward peaks before the anchor, as its
            # 16-bit copies are made again beside its output's gradient: not named either)
            tokens = micro.settings["batch"] * micro.settings["seq"]
            whole = recomputed_layer(device.activations_from, report, trainable, tokens, micro.settings["precision"])
            if whole is not None and whole.inner % options.layout.tp == 0:
                rank_recomputed = dataclasses.replace(whole, inner=whole.inner // options.layout.tp, casts=0, head=0,
                                                      ids=8 * tokens, sp=options.layout.tp)
        exact = measured(device.phases) or named and (outweighs or rank_recomputed is not None) or \
            fsdp2_alone(options.layout)
        # a tp rank's embedding backward makes the whole embedding gradient, added into the whole one it holds
        device_new = new if tp_alone(options.layout) else 0
        device = dataclasses.replace(device, phases=held_phases(device.phases, held_between(device.phases),
                                                                device_new, rank_head, exact, rank_recomputed))
        top = max(device.phases, key=lambda p: p.bytes)
    else:
        top = max(phases, key=lambda p: p.bytes)
    rank = getattr(device, "traced", None)
    check = getattr(device, "rank_check", None)
    micro_notes = micro.notes
    if rank is not None and check is not None and measured(getattr(rank, "phases", ())):  # --trace's rank ran two
        # micro-steps: its check beside the answer with the later micro-step's moments
        from ..parallel.device_trace import rechecked

        device = dataclasses.replace(device, notes=rechecked(device.notes, check, rank, top.bytes),
                                     rank_check=dataclasses.replace(check, peak=top.bytes))
        micro_notes = rechecked(micro.notes, check, rank, top.bytes)
    detail = dataclasses.replace(detail, phases=phases, device=device)
    settings = dict(micro.settings, batch=batch, micro_batch=batch // steps, grad_accum=steps)
    notes = micro_notes + (
        f"gradient accumulation: the batch of {batch:,} runs as {steps:,} micro-steps of {batch // steps:,}, the "
        "optimizer stepping after the last; the first micro-step is the step at the micro-batch without the "
        "optimizer's, each later one starts with the gradients held (the moments named 'gradients held'); every "
        "later micro-step is the same, so the second stands for them all. FLOPs a step are unchanged "
        f"({steps:,} × the micro-batch's). {CONVENTION}",
        ("the later micro-step is replayed from the rank's derived recipe: every gradient shard held, and each "
         "unit's new gradient shard (FSDP2's reduce-scatter output) beside them until added in (equal to the "
         "traced rank's second micro-step on dp, cp, dp × cp and dp × tp cuts, with and without checkpointing; "
         "not checked beside ep or under hybrid sharding)" if replayed else
         "the later micro-step is measured (the traced step runs two micro-steps before the optimizer's)"
         if traced and micro.engine == "traced" else
         "the later micro-step is replayed from the derived recipe's allocations: every gradient held, and each new "
         "weight gradient beside them until AccumulateGrad adds it in (equal to --trace full's second micro-step)"
         if traced else
         "the later micro-step's moments are the first's over the held gradients, the head's backward, where its "
         "new weight gradient lives beside the held ones until added in ('the head's weight gradient'), and the "
         "recomputed last layer's down projection backward, its new weight gradient beside them over the layer's "
         "recomputed activations ('the recomputed last layer's down projection gradient'; the arithmetic of both "
         "read off the traced second micro-step's allocations): the largest moments that hold a new gradient"
         if named and exact and (recomputed is not None or rank_recomputed is not None) else
         "the later micro-step's moments are the first's over the held gradients, and the head's backward, where "
         "its new weight gradient lives beside the held ones until added in ('the head's weight gradient': the "
         "arithmetic read off the traced second micro-step's allocations), the largest moment that holds a new "
         "gradient where the head's weight is the largest and no layer is recomputed" if named and exact else
         "the later micro-step's moments are a lower bound: the first's over the held gradients and the head's "
         "backward ('the head's weight gradient') are named, but not a layer's backward with its new weight "
         "gradients beside the held ones, which can be larger " + (
             "under full checkpointing (the recomputed layer's activations beside them: a 2-layer Llama at h 128, "
             "16 tokens, fp32, 39,488 B over the head's moment)" if checkpointing else
             "where a layer's weight is larger than the head's") if named else
         "the later micro-step's moments are the first's over the held gradient shards (FSDP2's moments hold the "
         "head's unsharded gradient until its reduce-scatter)" if exact else
         "the later micro-step's moments are a lower bound: the moments this engine names (the forward's end, the "
         "backward's start and end), each over the held gradients; a later micro-step also adds each new weight "
         "gradient into the held one, so the head's new gradient lives beside them all (about the head's gradient "
         "above this, up to twice under mixed precision), a moment not yet named for this recipe or layout: "
         "--trace full measures it on one device"),
        "the largest batch and context (--gpu, the fits table) are the micro-step's: each row's batch is a "
        "micro-batch, its later micro-steps over every gradient held (a replica's batch is that × the micro-steps)"
        + ("" if device is None else "; per device, each data-parallel rank's micro-batch"))
    # step_estimate_at searched the micro-batch over the later micro-step's moments (one device: later_micro_step;
    # a layout's device: later_rank_step)
    return dataclasses.replace(micro, settings=settings, peak=top.bytes, peak_phase=top.phase, training=detail,
                               notes=notes)
