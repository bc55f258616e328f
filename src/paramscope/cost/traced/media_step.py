"""A training step's audio or image input for the families that read their tower by cross-attention.

Whisper's decoder and Llama-3.2-Vision's text model do not take the tower's output as tokens: they attend to it in
cross-attention layers. Their training step is therefore one forward of the whole class on the real input, traced
as any other step (traced/step.py) once the inputs are laid out here:

    MediaInput (--audio-seconds T | --images K) → StepMedia (sequences, the tower's module paths, words)
    → media_inputs(model, …): the keyword arguments of the class's own forward, as a Trainer's batch holds them

Whisper: each 30 s window (3,000 mel frames; max_source_positions × the two convolutions' strides) is a sequence of
its own; its encoder runs on the frames and its decoder on the text (labels, shifted right by the class itself).
Llama-3.2-Vision: each image as max_num_tiles tiles (the most its processor cuts one into: a bound for smaller
images), every tile real in the aspect-ratio and cross-attention masks, every text token attending to every tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...errors import OptionError, UnsupportedError

FAMILIES = ("whisper", "mllama")
WHISPER_FRAMES_PER_SECOND = 100  # WhisperFeatureExtractor: a hop of 160 samples at 16 kHz


@dataclass(frozen=True)
class StepMedia:
    """The audio or images each of the step's sequences holds, laid out for the class's forward."""

    family: str  # "whisper" | "mllama"
    sequences: int  # rows the step runs: the batch, × the windows a sequence's audio takes (Whisper)
    per_sequence: int  # Whisper: 30 s windows a sequence; Llama-3.2-Vision: images a sequence
    tiles: int  # Llama-3.2-Vision: tiles an image (max_num_tiles); Whisper: 0
    frames: int  # Whisper: mel frames a window; Llama-3.2-Vision: 0
    parts: tuple[tuple[str, str], ...]  # (part, module path): the tower, and its projector where it has one
    words: str  # what a sequence holds, in the tower's own terms
    notes: tuple[str, ...] = ()


def step_media(module: Any, media: Any, batch: int) -> StepMedia:
    """Lay out `media` (towers.MediaInput) for `batch` sequences of `module` (Whisper or Llama-3.2-Vision)."""
    config = getattr(module, "config", None)
    family = getattr(config, "model_type", None)
    if family not in FAMILIES:
        raise UnsupportedError("{name}: a training step on audio or images by cross-attention is laid out for "
                               "Whisper and Llama-3.2-Vision", name=type(module).__name__)
    owner = module.model
    if family == "whisper":
        if media.audio_seconds is None:
            raise OptionError("{name} reads audio: give {0}", "audio_seconds", name=type(module).__name__)
        encoder = owner.encoder
        positions = int(encoder.config.max_source_positions)
        frames = positions * encoder.conv1.stride[0] * encoder.conv2.stride[0]
        window = frames / WHISPER_FRAMES_PER_SECOND
        windows = max(1, math.ceil(media.audio_seconds / window - 1e-9))
        words = (f"{media.audio_seconds:g} s of audio: {windows:,} window{'s' if windows > 1 else ''} of {window:g} s "
                 f"({frames:,} mel frames, padded; the encoder's two convolutions stride them to {positions:,} "
                 "positions)")
        notes = (f"Whisper's encoder reads {window:g} s windows, shorter audio padded to one, longer audio window by "
                 f"window: each window is a sequence of its own, {batch:,} × {windows:,} = {batch * windows:,} "
                 f"encoder passes over {frames:,} mel frames and decoder passes over the text, each cross-attending "
                 f"to its window's {positions:,} encoder states",)
        return StepMedia("whisper", batch * windows, windows, 0, frames, (("audio encoder", _path(module, encoder)),),
                         words, notes)
    if media.images is None:
        raise OptionError("{name} reads images as tiles by cross-attention: give {0} K", "images",
                          name=type(module).__name__)
    vision = config.vision_config
    size, patch, tiles = int(vision.image_size), int(vision.patch_size), int(vision.max_num_tiles)
    per_side = size // patch
    images = media.images
    words = (f"{images:,} image{'s' if images > 1 else ''} of {tiles} tiles of {size}×{size} px "
             f"({per_side}×{per_side} patches + the class token = {per_side * per_side + 1:,} vision states a tile), "
             "read by the text model's cross-attention layers")
    notes = (f"each image at {tiles} tiles (max_num_tiles, the most the processor cuts one into: a bound for smaller "
             "images); every text token attends to every tile (cross_attention_mask all ones)",)
    parts = (("vision tower", _path(module, owner.vision_model)),
             ("projector", _path(module, owner.multi_modal_projector)))
    return StepMedia("mllama", batch, images, tiles, 0, parts, words, notes)


def media_inputs(model: Any, media: StepMedia, seq: int) -> dict[str, Any]:
    """The forward's keyword arguments for `media.sequences` sequences of `seq` text tokens (ids 0, labels the ids),
    the audio or pixels in the tower's weights' dtype (a bf16-pure step's input is cast as its weights are)."""
    import torch

    owner = model.model
    ids = torch.zeros(media.sequences, seq, dtype=torch.long)
    if media.family == "whisper":
        encoder = owner.encoder
        features = torch.zeros(media.sequences, int(encoder.config.num_mel_bins), media.frames,
                               dtype=encoder.conv1.weight.dtype)
        return {"input_features": features, "labels": ids}  # the class shifts the labels into the decoder's input
    vision = model.config.vision_config
    size, images, tiles = int(vision.image_size), media.per_sequence, media.tiles
    batch = media.sequences
    return {"input_ids": ids, "labels": ids,
            "pixel_values": torch.zeros(batch, images, tiles, int(vision.num_channels), size, size,
                                        dtype=owner.vision_model.patch_embedding.weight.dtype),
            # the aspect ratio's id picks an embedding row: every id costs the same bytes
            "aspect_ratio_ids": torch.ones(batch, images, dtype=torch.long),
            "aspect_ratio_mask": torch.ones(batch, images, tiles, dtype=torch.long),
            "cross_attention_mask": torch.ones(batch, seq, images, tiles, dtype=torch.long)}


def _path(module: Any, sub: Any) -> str:
    for path, candidate in module.named_modules():
        if candidate is sub:
            return path
    raise UnsupportedError("{name}'s tower is not among its modules", name=type(module).__name__)
