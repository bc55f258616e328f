"""Llama-3.2-Vision's prefill on images, measured: the real class's forward on fake tensors, from its language
model's call to its end.

Llama-3.2-Vision reads its images by cross-attention. Its forward runs the vision model and projector first, then
the language model, whose self-attention layers run over the text alone and whose cross-attention layers take K and
V of the projected tiles, which they cache (K·tiles·(patches + 1) tokens a sequence, not the text's length), beside
a float cross-attention mask of text × vision tokens that the forward builds from the processor's. Those layers'
working tensors depend on both lengths, so the prefill is measured rather than written as a formula:

    K images a sequence at max_num_tiles tiles → the class's forward on fake tensors (weights in the compute dtype,
    no grad, a DynamicCache, the last token's logits as generate()'s prefill asks, the model's own attention) →
    traced/timeline.py's recorder (held equal to torch's MemTracker) → three moments, weights not: the largest
    bytes live until the projector returns (the vision model's run), from then to the language model's call (the
    cross-attention mask built over text × vision tokens) and from that call to the forward's end (the prefill);
    at the call, the bytes the images hold beyond a text input's

The inputs are the processor's as generate() receives them: token ids, float32 pixel values (the vision model casts
them to the weights' dtype), the aspect-ratio ids and tile mask, and the int64 cross-attention mask (text tokens ×
images × tiles), every tile and token attending.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from ...errors import UnsupportedError


@dataclass(frozen=True)
class ImagePrefill:
    """A prefill over `context` text tokens with `images` images a sequence, measured on fake tensors."""

    images: int  # a sequence's
    tiles: int  # an image's (max_num_tiles)
    vision_tokens: int  # a sequence's: images × tiles × (patches + the class token), what each cross-attention
    # layer caches K and V of
    batch: int  # sequences
    context: int  # text tokens a sequence
    held: int  # live at the language model's call beyond a text input's: the pixel values, the tile and
    # cross-attention masks given, the vision model's output (transformers returns it with the logits), the projected
    # tiles, and the float cross-attention mask the forward builds (text tokens × vision tokens) with its row mask
    held_per_token: int  # of `held`, the bytes a text token a sequence: the int64 cross-attention mask given
    # (8 B a tile), the float mask built (a dtype's bytes a vision token) and its row mask (a dtype's bytes)
    tower: int  # the largest bytes live from the forward's start until the projector returns: the inputs given
    # and the vision model's and projector's run
    mask: int  # the largest bytes live from then until the language model's call: the int64, float32 and bool
    # text × vision-token temporaries of the cross-attention mask as the forward builds it
    peak: int  # the largest bytes live from the language model's call to the forward's end, weights not: the token
    # ids, what the images hold, the KV cache as it fills, a layer's working tensors, the last token's logits

    @property
    def held_fixed(self) -> int:
        """Of `held`, what does not grow with the text: the pixel values, the tile mask, the vision model's output
        and the projected tiles (the whole batch's)."""
        return self.held - self.batch * self.context * self.held_per_token


def vision_tokens(config: Any, images: int) -> tuple[int, int]:
    """(tiles an image, vision tokens a sequence) for `images` images at the vision config's max_num_tiles."""
    vision = config.vision_config
    tiles = int(vision.max_num_tiles)
    per_side = int(vision.image_size) // int(vision.patch_size)
    return tiles, images * tiles * (per_side * per_side + 1)


def image_inputs(config: Any, *, batch: int, context: int, images: int, with_images: bool) -> dict[str, Any]:
    """The forward's inputs: `context` token ids a sequence and, `with_images`, `images` images a sequence at
    max_num_tiles tiles (every tile real: aspect-ratio id 1, the tile mask all ones) that every token attends."""
    import torch

    inputs: dict[str, Any] = {"input_ids": torch.zeros(batch, context, dtype=torch.long)}
    if with_images:
        vision = config.vision_config
        tiles, size = int(vision.max_num_tiles), int(vision.image_size)
        inputs |= {"pixel_values": torch.zeros(batch, images, tiles, int(vision.num_channels), size, size),
                   "aspect_ratio_ids": torch.ones(batch, images, dtype=torch.long),
                   "aspect_ratio_mask": torch.ones(batch, images, tiles, dtype=torch.long),
                   "cross_attention_mask": torch.ones(batch, context, images, tiles, dtype=torch.long)}
    return inputs


def measure_prefill(module: Any, *, images: int, batch: int, context: int, dtype: str) -> ImagePrefill:
    """The prefill of `batch` sequences of `context` text tokens and `images` images each, on a fake copy of
    `module` (MllamaForConditionalGeneration, built on meta) with its floating weights in `dtype`."""
    config = getattr(module, "config", None)
    if getattr(config, "model_type", None) != "mllama":
        raise UnsupportedError("{name}: the prefill on images is measured here for Llama-3.2-Vision",
                               name=type(module).__name__)
    import torch

    at, tower, mask, peak = _record(module, config, dtype, batch, context, images, True)
    text = _record(module, config, dtype, batch, context, images, False, stop=True)[0]
    tiles, tokens = vision_tokens(config, images)
    size = getattr(torch, dtype).itemsize
    return ImagePrefill(images, tiles, tokens, batch, context, at - text, 8 * images * tiles + size * (tokens + 1),
                        tower, mask, peak)


class _Reached(Exception):
    """Raised at the language model's call of a text input: what is live then is all that was asked."""


def _record(module: Any, config: Any, dtype: str, batch: int, context: int, images: int, with_images: bool,
            stop: bool = False) -> tuple[int, int, int, int]:
    """(bytes live at the language model's call; the largest bytes live until the projector returns, from then to
    the call, and from the call to the end), weights not; a text input stops at the call."""
    import torch

    from ..traced.step import assumed_values, fake_mode, running, working_copy
    from ..traced.timeline import allocation_recorder, live_bytes

    with fake_mode(True) as mode, assumed_values(True):
        model = working_copy(module, mode, None, weights_dtype=dtype)
        model.eval()
        recorder = allocation_recorder()
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            recorder.known(tensor)
        reached: list[int] = []

        def called(*_: Any) -> None:
            reached.append(len(recorder.events))
            if stop:
                raise _Reached

        projected: list[int] = []
        hooks = [model.model.language_model.register_forward_pre_hook(called),
                 model.model.multi_modal_projector.register_forward_hook(
                     lambda *_: projected.append(len(recorder.events)))]
        try:
            with running(model), recorder, torch.no_grad():
                try:
                    out = model(**image_inputs(config, batch=batch, context=context, images=images,
                                               with_images=with_images), use_cache=True, logits_to_keep=1)
                    del out
                except _Reached:
                    pass
        finally:
            for hook in hooks:
                hook.remove()
            recorder.detach()
    if not reached:
        raise UnsupportedError("{name}'s forward did not call its language model", name=type(module).__name__)
    events, allocations, call = recorder.events, recorder.allocations, reached[0]
    at = live_bytes(events[:call], allocations)[0]
    if not with_images:
        return at, 0, 0, 0
    done, tower = live_bytes(events[:projected[0]], allocations)
    return (at, tower, done + live_bytes(events[projected[0]:call], allocations)[1],
            at + live_bytes(events[call:], allocations)[1])
