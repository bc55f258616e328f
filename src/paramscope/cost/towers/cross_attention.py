"""The towers a language model reads by cross-attention, not as tokens (Whisper's encoder, Llama-3.2-Vision's vision
model): the whole forward is traced and split into the tower's and projector's lines and the language model's
modules (MediaFlops.decoder_by_module); training, each part's backward from a trace of the tower alone, the
language model's the rest of the whole backward."""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Any

from .media import MediaFlops, MediaInput, TowerLine
from .shapes import images_per_sequence
from .trace import Traced, TraceStep, module_path, trace_parts

WHISPER_FRAMES_PER_SECOND = 100  # WhisperFeatureExtractor: a hop of 160 samples at 16 kHz


def trace_whisper(module: Any, media: MediaInput, batch: int, seq: int, step: TraceStep) -> MediaFlops:
    import torch

    model_part = module.model if hasattr(module, "model") else module
    encoder = model_part.encoder
    frames = int(encoder.config.max_source_positions) * encoder.conv1.stride[0] * encoder.conv2.stride[0]
    window = frames / WHISPER_FRAMES_PER_SECOND
    windows = max(1, math.ceil(media.audio_seconds / window - 1e-9))
    mels = int(encoder.config.num_mel_bins)
    sequences = batch * windows

    def run(model: Any) -> Any:
        owner = model.model if hasattr(model, "model") else model
        inputs = {"input_features": torch.zeros(sequences, mels, frames, dtype=owner.encoder.conv1.weight.dtype),
                  "decoder_input_ids": torch.zeros(sequences, seq, dtype=torch.long)}
        return model(**inputs)

    def run_tower(model: Any) -> Any:
        owner = model.model if hasattr(model, "model") else model
        # the mel frames as the feature extractor's output is cast to the weights' dtype before generate()
        features = torch.zeros(sequences, mels, frames, dtype=owner.encoder.conv1.weight.dtype)
        return types.SimpleNamespace(pooler_output=owner.encoder(input_features=features).last_hidden_state)

    parts = [("audio encoder", module_path(module, encoder))]
    traced = trace_parts(module, run, parts, dataclasses.replace(step, serving_dtype=None), with_own=True)
    lines, own = traced.lines, traced.own
    if step.training:
        traced, lines = _with_tower_backward(module, run_tower, parts, step, traced)
    peak = None
    if step.serving_dtype is not None:  # generate() runs the encoder alone first: its peak is its own
        peak = trace_parts(module, run_tower, parts, step).peak
    enc = module_path(module, encoder)
    decoder = tuple((path, flops) for path, flops in own.items() if not (path == enc or path.startswith(enc + ".")))
    input_words = (f"{media.audio_seconds:g} s of audio: {windows:,} window{'s' if windows > 1 else ''} of "
                   f"{window:g} s ({frames:,} mel frames at {WHISPER_FRAMES_PER_SECOND} a second, padded)")
    notes = (f"Whisper's encoder reads {window:g} s windows ({frames:,} frames: max_source_positions × the two "
             "convolutions' strides), shorter audio padded to one; longer audio is transcribed window by window, so "
             f"each window is its own sequence here: {batch:,} × {windows:,} = {sequences:,} encoder windows and "
             f"decoder passes of {seq:,} tokens, each decoder pass cross-attending to its window's "
             f"{int(encoder.config.max_source_positions):,} encoder states",)
    return MediaFlops("audio", input_words, windows, 0, "the decoder reads the audio by cross-attention, not as "
                      "tokens", lines, notes=notes, decoder_by_module=decoder,
                      decoder_backward=_rest_of_backward(traced, step), forward_peak=peak)


def trace_mllama(module: Any, media: MediaInput, batch: int, seq: int, step: TraceStep) -> MediaFlops:
    """Llama-3.2-Vision: each image as max_num_tiles tiles of image_size px (the most its processor cuts one into);
    the language model reads the projected tiles by cross-attention (its cross-attention layers, which a text
    input skips), so the whole forward is traced and split: the vision model and projector, and the rest."""
    import torch

    config = module.config
    vision = config.vision_config
    size, patch, tiles = int(vision.image_size), int(vision.patch_size), int(vision.max_num_tiles)
    per_side = size // patch
    positions = per_side * per_side + 1  # and the class token
    padded = positions + (8 - positions % 8) % 8  # MllamaVisionModel pads each tile's patches to a multiple of 8
    states = tiles * positions  # … and slices the padding off again before the projector
    words = (f"cross-attention, not tokens: each image is {tiles} tiles × ({per_side}×{per_side} patches + CLS) = "
             f"{states:,} vision states the cross-attention layers read (the tower runs on each tile's {padded:,}, "
             "padded to a multiple of 8)")
    images = images_per_sequence(media, states, words)
    owner = module.model

    def run(model: Any) -> Any:
        shape = (batch, images, tiles)
        return model(input_ids=torch.zeros(batch, seq, dtype=torch.long),
                     pixel_values=torch.zeros(*shape, int(vision.num_channels), size, size),
                     aspect_ratio_ids=torch.ones(batch, images, dtype=torch.long),
                     aspect_ratio_mask=torch.ones(*shape, dtype=torch.long),
                     cross_attention_mask=torch.ones(batch, seq, images, tiles, dtype=torch.long))

    parts = [("vision tower", module_path(module, owner.vision_model)),
             ("projector", module_path(module, owner.multi_modal_projector))]
    def run_tower(model: Any) -> Any:
        states = model.model.vision_model(pixel_values=torch.zeros(batch, images, tiles, int(vision.num_channels),
                                                                   size, size),
                                          aspect_ratio_ids=torch.ones(batch, images, dtype=torch.long),
                                          aspect_ratio_mask=torch.ones(batch, images, tiles, dtype=torch.long))
        projected = model.model.multi_modal_projector(states.last_hidden_state)
        return types.SimpleNamespace(pooler_output=projected.reshape(-1, projected.shape[-2], projected.shape[-1]))

    traced = trace_parts(module, run, parts, dataclasses.replace(step, serving_dtype=None), with_own=True)
    lines, own = traced.lines, traced.own
    if step.training:
        traced, lines = _with_tower_backward(module, run_tower, parts, step, traced)
    peak = None
    if step.serving_dtype is not None:  # the vision model and projector run first in the forward: their own peak
        peak = trace_parts(module, run_tower, parts, step).peak
    language = tuple((path, flops) for path, flops in own.items()
                     if not any(path == p or path.startswith(p + ".") for _, p in parts))
    input_words = (f"{images:,} image{'s' if images > 1 else ''} of {tiles} tiles of {size}×{size} px "
                   f"({per_side}×{per_side} = {per_side * per_side:,} patches of {patch} px a tile)")
    notes = (f"each image at {tiles} tiles, the most the processor cuts one into (max_num_tiles): a bound for "
             "smaller images",)
    return MediaFlops("image", input_words, images, 0, words, lines, notes=notes, decoder_by_module=language,
                      decoder_backward=_rest_of_backward(traced, step), forward_peak=peak)


def _with_tower_backward(module: Any, run_tower: Any, parts: list[tuple[str, str]], step: TraceStep,
                         whole: Traced) -> tuple[Traced, tuple[TowerLine, ...]]:
    """A whole forward's training trace (cross-attention) with each part's backward from a trace of the tower and
    projector alone (the sum of their output as the loss): in the whole trace FlopCounterMode's module tracker loses
    its place in the backward once a module whose inputs need no gradient (the token embedding) starts its own, and
    files what follows under it; the whole backward (its Global count) is right, and the tower's backward is the same
    alone (the same weights train, the same input needs no gradient), so the language model's is the difference."""
    alone = trace_parts(module, run_tower, parts, step)
    # the last part (the projector, a bare nn.Linear the counter cannot place when called alone) takes what the
    # alone trace's whole backward leaves after the parts before it
    backward = [line.backward or 0 for line in alone.lines[:-1]]
    backward.append((alone.backward_total or 0) - sum(backward))
    lines = tuple(dataclasses.replace(line, backward=value) for line, value in zip(whole.lines, backward))
    return dataclasses.replace(whole, lines=lines), lines


def _rest_of_backward(traced: Traced, step: TraceStep) -> int | None:
    """Training a whole-forward trace (cross-attention): the language model's backward, the trace's whole backward
    less the tower's and projector's lines (the loss is the sum of the logits, so every trained weight and every
    activation a trained weight needs takes its gradient, as a cross-entropy loss gives them)."""
    if not step.training:
        return None
    return (traced.backward_total or 0) - sum(line.backward or 0 for line in traced.lines)
