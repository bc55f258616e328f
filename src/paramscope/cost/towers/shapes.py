"""The families' image inputs laid out as their classes read them: images a sequence from --images or
--image-tokens, and Qwen2.5-VL's grid, windows and positions for N merged tokens (transformers' own helpers). The
FLOPs traces (image_families.py) and the prefill's moment (prefill.py) lay out the same input."""

from __future__ import annotations

import math
from typing import Any

from ...errors import OptionError
from .media import MediaInput


def images_per_sequence(media: MediaInput, tokens_each: int, words: str) -> int:
    """Images a sequence: --images K, or --image-tokens N when N is a whole number of images."""
    if media.images is not None:
        return media.images
    if media.image_tokens % tokens_each:
        raise OptionError("{0} {value:,} is not a whole number of images: each image is {each:,} tokens ({words})",
                          "image_tokens", value=media.image_tokens, each=tokens_each, words=words)
    return media.image_tokens // tokens_each


def qwen_vision_layout(visual: Any, tokens: int, images: int) -> tuple[Any, dict[str, Any], int]:
    """(grid_thw, the layouts the tower would compute from it, a patch's width): `images` images of `tokens` merged
    blocks each, the grid (t, h, w) in patches as square as the count allows (a still image one temporal patch),
    the windows and positions by transformers' own helpers."""
    import torch
    from transformers import vision_utils

    vision, merge, patch = visual.config, int(visual.spatial_merge_size), int(visual.patch_size)
    rows = max(d for d in range(1, math.isqrt(tokens) + 1) if tokens % d == 0)
    grid_thw = torch.tensor([(1, rows * merge, tokens // rows * merge)] * images)
    precomputed: dict[str, Any] = {"position_ids": vision_utils.get_vision_position_ids(grid_thw, merge)}
    precomputed["cu_seqlens"], _ = vision_utils.get_vision_attention_seqlens(grid_thw, vision)
    precomputed["window_index"], precomputed["cu_window_seqlens"] = vision_utils.get_vision_window_index(
        grid_thw, spatial_merge_size=merge, window_size=visual.window_size, patch_size=patch)
    return grid_thw, precomputed, int(vision.in_channels) * int(vision.temporal_patch_size) * patch * patch
