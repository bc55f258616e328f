"""The image towers whose projector hands the language model tokens (Gemma-3, LLaVA, Qwen2.5-VL): each family's
input at the asked size, traced through the class's own get_image_features (trace.py), the tokens read off the
projector's output."""

from __future__ import annotations

import math
from typing import Any

from ...errors import OptionError, UnsupportedError
from .media import MediaFlops, MediaInput
from .shapes import images_per_sequence, qwen_vision_layout
from .trace import TraceStep, module_path, trace_parts


def _pixel_dtype(step: TraceStep) -> Any:
    """The pixel values' dtype: serving, the weights' (transformers' model cards cast the processor's output to the
    model's dtype, as held_into_prefill's forward takes them); else float32, the processor's (the tower casts them
    to its weights' dtype, the same FLOPs)."""
    import torch

    return getattr(torch, step.serving_dtype) if step.serving_dtype is not None else torch.float32


def trace_gemma3(module: Any, media: MediaInput, batch: int, seq: int, step: TraceStep) -> MediaFlops:
    import torch

    config = module.config
    vision = config.vision_config
    size, patch = int(vision.image_size), int(vision.patch_size)
    per_side = size // patch
    tokens_each = int(config.mm_tokens_per_image)
    pooled = math.isqrt(tokens_each)
    words = (f"Gemma3MultiModalProjector average-pools the {per_side}×{per_side} patches to {pooled}×{pooled} = "
             f"mm_tokens_per_image {tokens_each:,}")
    images = images_per_sequence(media, tokens_each, words)
    owner = module.model if hasattr(module, "model") and hasattr(module.model, "vision_tower") else module
    pixels = _pixel_dtype(step)
    traced = trace_parts(
        module, lambda model: _image_features(model)(torch.zeros(batch * images, int(vision.num_channels), size, size,
                                                                 dtype=pixels)),
        [("vision tower", module_path(module, owner.vision_tower)),
         ("projector", module_path(module, owner.multi_modal_projector))], step)
    return MediaFlops("image", _image_words(images, size, per_side, patch), images, traced.rows // batch, words,
                      traced.lines, saved_bytes=traced.saved, forward_peak=traced.peak)


def trace_llava(module: Any, media: MediaInput, batch: int, seq: int, step: TraceStep) -> MediaFlops:
    import torch

    config = module.config
    vision = config.vision_config
    size, patch = int(vision.image_size), int(vision.patch_size)
    per_side = size // patch
    strategy = config.vision_feature_select_strategy
    tokens_each = per_side * per_side + (0 if strategy == "default" else 1)
    layer = config.vision_feature_layer
    words = (f"{per_side}×{per_side} = {per_side * per_side:,} patches, "
             + ("the CLS token dropped" if strategy == "default" else "the CLS token kept")
             + f" (vision_feature_select_strategy {strategy!r}), from the tower's hidden states {layer}")
    images = images_per_sequence(media, tokens_each, words)
    owner = module.model if hasattr(module, "model") and hasattr(module.model, "vision_tower") else module

    pixels = _pixel_dtype(step)

    def run(model: Any) -> Any:
        return _image_features(model)(torch.zeros(batch * images, int(vision.num_channels), size, size, dtype=pixels),
                                      vision_feature_layer=layer, vision_feature_select_strategy=strategy)

    traced = trace_parts(module, run, [("vision tower", module_path(module, owner.vision_tower)),
                                       ("projector", module_path(module, owner.multi_modal_projector))], step)
    notes = ()
    if layer not in (-1, None):
        notes = (f"the tower runs all its layers although the projector reads hidden states {layer}: every layer "
                 "is counted, as transformers runs them",)
    return MediaFlops("image", _image_words(images, size, per_side, patch), images, traced.rows // batch, words,
                      traced.lines, notes=notes, saved_bytes=traced.saved, forward_peak=traced.peak)


def trace_qwen2_5_vl(module: Any, media: MediaInput, batch: int, seq: int, step: TraceStep) -> MediaFlops:
    import torch

    visual = module.model.visual if hasattr(module, "model") else module.visual
    merge = int(visual.spatial_merge_size)
    if media.image_tokens is None:
        raise OptionError("{name} reads images at any size, so {0} has no size to count: give {1} N (N merged "
                          "{merge}×{merge} blocks of patches)", "images", "image_tokens", name=type(module).__name__,
                          merge=merge)
    n = media.image_tokens
    grid_thw, precomputed, width = qwen_vision_layout(visual, n, batch)
    grid = tuple(int(x) for x in grid_thw[0])
    patch = int(visual.patch_size)
    words = (f"{merge}×{merge} patches merge into one token (spatial_merge_size {merge}): {grid[1]}×{grid[2]} "
             f"patches → {n:,} tokens")
    images = batch  # one image a sequence
    patches = images * grid[1] * grid[2]

    def run(model: Any, constant: Any) -> Any:
        given = {name: constant(value) for name, value in precomputed.items()}
        return _image_features(model)(torch.zeros(patches, width), image_grid_thw=constant(grid_thw), **given)

    traced = trace_parts(module, run, [("vision tower", module_path(module, visual)),
                                       ("projector", module_path(module, visual.merger))], step, constants=True)
    notes = (f"an image of {grid[1] * patch}×{grid[2] * patch} px ({grid[1]}×{grid[2]} patches of {patch} px, the "
             f"grid as square as {n:,} tokens allow); windowed attention over {visual.window_size} px windows, full "
             f"attention in blocks {tuple(visual.fullatt_block_indexes)}, laid out by transformers' own helpers",)
    return MediaFlops("image", f"1 image of {n:,} tokens", 1, traced.rows // batch, words, traced.lines, notes=notes,
                      saved_bytes=traced.saved, forward_peak=traced.peak)


def _image_features(model: Any) -> Any:
    features = getattr(model, "get_image_features", None)
    if features is None:
        raise UnsupportedError("{name} has no get_image_features", name=type(model).__name__)
    return features


def _image_words(images: int, size: int, per_side: int, patch: int) -> str:
    return (f"{images:,} image{'s' if images > 1 else ''} of {size}×{size} px ({per_side}×{per_side} = "
            f"{per_side * per_side:,} patches of {patch} px)")
