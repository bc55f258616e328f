"""One device's training answer under a layout (training_step.py): the one-device step's moments moved to a rank (its
bf16-master gradient copy the rank's own), the device's figures (parallel/estimate.layout_device), and its words."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from .phases import PhaseFigure
from .states import grad_buffer
from .training_master import master_copy_on_rank, master_layout_words


@dataclass(frozen=True)
class RankLayout:
    """`device` one device's figures (parallel's DeviceMemory); `layout_at` its largest moment at a batch and length
    from the rank's moments; `to_rank` the one-device moments moved to a rank."""

    device: Any
    layout_at: Callable[..., Any]
    to_rank: Callable[[tuple[PhaseFigure, ...]], tuple[PhaseFigure, ...]]


def rank_layout(context: Any, *, master_copy: int, optimizer_text: str, notes: list[str]) -> RankLayout | None:
    """One device's answer from the one-device step's `context` (parallel/device.StepContext: its phases and its step
    the one device's); `master_copy` bf16-master's fp32 gradient copy in the step, `optimizer_text` the step's words
    without it; the layout's words are added to `notes`. None when the device's per-device recipe is neither kept
    nor derivable without the build."""
    from ..parallel.estimate import layout_device
    from ..parallel.states import bf16_optimizer

    layout, states = context.layout, context.states
    step_bytes, step_text = context.step
    # bf16-master: a rank's step casts its partition of the gradients to fp32
    # (under a pipeline each stage's own: parallel/states.stage_step adds it)
    rank_copy, rank_text = (0, optimizer_text) if master_copy and layout.pp > 1 else \
        master_copy_on_rank(context.report, context.view, layout, master_copy, optimizer=context.optimizer,
                            trainable=context.trainable, own=context.own, words=optimizer_text) if master_copy else \
        (0, step_text)
    if master_copy:
        notes.append(master_layout_words(layout))
    if grad_buffer(states):
        from ..parallel.states import main_grad_layout_words

        notes.append(main_grad_layout_words(layout))

    def to_rank(figures: tuple[PhaseFigure, ...]) -> tuple[PhaseFigure, ...]:
        return tuple(dataclasses.replace(p, bytes=p.bytes - master_copy + rank_copy,
                                         arithmetic=p.arithmetic.replace(step_text, rank_text))
                     if p.phase == "optimizer step" else p for p in figures)

    answer = layout_device(dataclasses.replace(context, phases=to_rank(context.phases),
                                               step=(step_bytes - master_copy + rank_copy, rank_text)))
    if answer is None:
        return None
    device, layout_at = answer
    if grad_buffer(states):  # the device's gradients are its resident fp32 buffer (parallel/states.py)
        device = dataclasses.replace(device, gradients_resident=True)
    if bf16_optimizer(states.precision, layout):  # half its gradients: BF16_Optimizer's bf16 buffer,
        # zeros_like the flat bf16 group of the stage's trained parameters (their bf16 .grad the other half)
        device = dataclasses.replace(device, accumulation_buffer=device.gradients // 2)
    notes.extend(device.notes)
    return RankLayout(device, layout_at, to_rank)
