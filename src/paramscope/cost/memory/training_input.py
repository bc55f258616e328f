"""A training step's input (training_step.py): a text input, or the image or audio input the towers run on and train
from (an image beside the language model's text, counted by towers/families.media_flops; a cross-attention family's,
Whisper's or Llama-3.2-Vision's, fed to a traced step), the parameters that take no gradient from it, and its words."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..model_view import towers_not_run
from ..traced.media_step import FAMILIES as CROSS_ATTENTION_FAMILIES
from .training_options import DEFAULT_TRAINING_SEQ, TrainingOptions


@dataclass(frozen=True)
class StepInput:
    """What a step runs on: `media` an image input's towers (towers/families.media_flops) or None; `cross` a
    cross-attention family's audio or images (traced/media_step.StepMedia) or None; `frozen` the parameters that take
    no gradient (--freeze's, the module's, the idle towers'); `idle` the towers a text input does not run; `unused`
    their parameters; `notes` what the input assumed."""

    media: Any
    cross: Any
    frozen: list[str]
    idle: tuple[str, ...]
    unused: list[str]
    notes: list[str]


def step_input(report: Any, view: Any, options: TrainingOptions, frozen: list[str], run: str) -> StepInput | None:
    """The step's input under `options` (`run`: the forward and backward's precision); None when the towers run and
    the view has no module (the caller builds)."""
    module = view.module
    media = None
    cross = None
    media_notes: list[str] = []
    asked = options.media if options.media is not None and options.media.given else None
    if asked is None and getattr(view.config, "model_type", None) == "whisper":
        from ..towers.media import MediaInput

        asked = MediaInput(audio_seconds=30.0)  # Whisper's forward needs its mel frames: it pads any audio to 30 s
        dataclasses.replace(options, media=asked).check()  # what an audio input's step is counted without
        media_notes.append("Whisper trains on audio and its transcript: 30 s of audio a sequence assumed (the window "
                           "its feature extractor pads every clip to; --audio-seconds T)")
    if asked is not None:  # the towers run on the image or audio input, and train
        from ..towers.families import media_family, media_flops

        if module is None:
            return None
        if media_family(view.config) in CROSS_ATTENTION_FAMILIES:
            from ..traced.media_step import step_media

            asked.check()
            cross = step_media(module, asked, options.batch)
            fixed = [p for p in report.params if not p.trainable and p.name not in set(frozen)]
            if fixed:  # the step runs the class as built: what it sets requires_grad False on takes no gradient
                frozen = sorted(set(frozen) | {p.name for p in fixed})
                media_notes.append(f"{', '.join(p.name for p in fixed[:4])}{' …' if len(fixed) > 4 else ''} "
                                   f"({sum(p.numel for p in fixed):,} parameters) do not train: {view.class_name} sets "
                                   "requires_grad False on them (Whisper's sinusoidal encoder positions), so no "
                                   "gradient or optimizer state is kept for them")
        else:
            media = media_flops(module, asked, batch=options.batch, seq=options.seq or DEFAULT_TRAINING_SEQ,
                                training=True, precision=run, attention=options.attention,
                                frozen=frozenset(frozen))
    idle = () if media is not None or cross is not None else towers_not_run(view)
    unused = [p.name for p in report.params if any(p.name.startswith(tower + ".") for tower in idle)]
    if unused:  # a text input runs no vision or audio tower: their parameters' .grad stays None
        frozen = sorted(set(frozen) | set(unused))
    return StepInput(media, cross, frozen, idle, unused, media_notes)


def input_words(report: Any, view: Any, inputs: StepInput, seq: int) -> list[str]:
    """The notes on the step's input over `seq` text tokens a sequence: a cross-attention family's traced input, an
    image's tokens and the towers' saved activations, the idle towers' parameters."""
    notes = []
    cross, media = inputs.cross, inputs.media
    if cross is not None:
        notes.append(f"{'audio' if cross.family == 'whisper' else 'image'} input: each sequence holds {cross.words}; "
                     f"the text is {seq:,} tokens; " + "; ".join(cross.notes))
        notes.append(f"{view.class_name} reads its {'encoder' if cross.family == 'whisper' else 'vision tower'} by "
                     "cross-attention: the step is traced on the real input, every layer of the tower and the "
                     "language model, forward, backward and optimizer step (MemTracker on fake tensors); the "
                     "analytic and derived engines take no such input, so the answer is the trace's")
    if media is not None:
        total = seq + media.tokens
        notes.append(f"image input: each sequence holds {media.input_words}; the language model's activations are "
                     f"over {seq:,} text + {media.tokens:,} image tokens = {total:,}; the towers train (but "
                     "for what --freeze names), and "
                     f"what their forward saves for backward, {media.saved_bytes or 0:,} B (what the tower's and "
                     "projector's forward saves and still holds at its end, each storage once, weights not: measured "
                     "on fake tensors), is held from the forward through the language model's backward, added to "
                     "those moments (linear in the batch)")
    if inputs.unused:
        held = sum(p.numel for p in report.params if p.name in set(inputs.unused))
        notes.append(f"a text input runs the language model only: {', '.join(inputs.idle)} ({held:,} parameters) get "
                     "no gradient, so no gradient, optimizer state or master copy is kept for them (PyTorch's "
                     "optimizers skip a parameter whose .grad is None); their weights stay resident")
    return notes
