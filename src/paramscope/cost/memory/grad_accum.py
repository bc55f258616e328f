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

Sharded data parallelism (ZeRO-2/3, FSDP2) reduce-scatters each micro-step's gradients and accumulates the shard,
FSDP2's default (set_requires_gradient_sync(True) on every micro-step; torchtitan and accelerate keep it): each
device holds its shard of the gradients between micro-steps. Turning the sync off for all but the last micro-step
would hold the full unsharded gradients instead, trading memory for communication: not this convention.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..dtypes import itemsize
from ..traced.step import HELD_BACKWARD, HELD_FORWARD
from .phases import PhaseFigure
from .states import as_trained

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


def held_phases(phases: tuple[PhaseFigure, ...], gradients: int, last_new: int) -> tuple[PhaseFigure, ...]:
    """`phases` (one micro-step's moments and the optimizer step) with a later micro-step's moments added before
    the optimizer step: each forward and backward moment less the gradients it held, plus `gradients` (every one,
    the device's share), plus `last_new` at the end of the backward (the embedding's new gradient, added into the
    held one there). Phases already measured over held gradients (a traced later micro-step) are kept as measured."""
    if measured(phases):
        return phases
    first = [p for p in phases if p.phase != "optimizer step"]
    rest = [p for p in phases if p.phase == "optimizer step"]
    later = []
    for p in first:
        new = last_new if p.where.endswith("end of backward") else 0
        held = p.gradients - new
        words = (f"{p.arithmetic}; a later micro-step (lower bound): − the gradients this moment held in the "
                 f"first, {held:,}, + every gradient, held from the earlier micro-steps, {gradients:,}")
        later.append(PhaseFigure(HELD_FORWARD if p.phase == "forward" else HELD_BACKWARD,
                                 p.bytes - held + gradients, p.where, words, gradients, p.variable))
    return tuple(first) + tuple(later) + tuple(rest)


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


def accumulated(micro: Any, report: Any, options: Any) -> Any:
    """The MemoryEstimate of `options` (grad_accum > 1) from `micro`, the estimate at its micro-batch."""
    detail = micro.training
    steps, batch = options.grad_accum, options.batch
    trainable = frozenset(p.name for p in report.params) - frozenset(detail.frozen)
    own = options.own_dtype if options.own_dtype else frozenset()
    new = embedding_gradient_bytes(report, trainable, micro.settings["precision"], own)
    traced = measured(detail.phases)
    phases = held_phases(detail.phases, held_between(detail.phases), new)
    device = detail.device
    if device is not None:  # the device's held share; the embedding's new gradient there is left out (a bound)
        device = dataclasses.replace(device, phases=held_phases(device.phases, held_between(device.phases), 0))
        top = max(device.phases, key=lambda p: p.bytes)
    else:
        top = max(phases, key=lambda p: p.bytes)
    detail = dataclasses.replace(detail, phases=phases, device=device)
    settings = dict(micro.settings, batch=batch, micro_batch=batch // steps, grad_accum=steps)
    notes = micro.notes + (
        f"gradient accumulation: the batch of {batch:,} runs as {steps:,} micro-steps of {batch // steps:,}, the "
        "optimizer stepping after the last; the first micro-step is the step at the micro-batch without the "
        "optimizer's, each later one starts with the gradients held (the moments named 'gradients held'); every "
        "later micro-step is the same, so the second stands for them all. FLOPs a step are unchanged "
        f"({steps:,} × the micro-batch's). {CONVENTION}",
        ("the later micro-step is measured (the traced step runs two micro-steps before the optimizer's)"
         if traced else
         "the later micro-step's moments are a lower bound: the moments this engine names (the forward's end, the "
         "backward's start and end), each over the held gradients; a later micro-step also adds each new weight "
         "gradient into the held one, so the head's new gradient lives beside them all (about the head's gradient "
         "above this, up to twice under mixed precision), a moment no recipe names yet: --trace full measures it"),
        "the largest batch and context (--gpu, the fits table) are not searched under gradient accumulation: the "
        "peak above is this micro-batch's")
    return dataclasses.replace(micro, settings=settings, peak=top.bytes, peak_phase=top.phase, training=detail,
                               notes=notes, fits=(), budget=None)
