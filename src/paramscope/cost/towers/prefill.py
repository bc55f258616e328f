"""What an image input holds before and through the language model's prefill (held_into_prefill → ImageForward):
the class's own forward on fake tensors, with and without the images, the inputs generate() hands it laid out family
by family (Gemma-3, LLaVA, Qwen2.5-VL), measured by traced/timeline.py's recorder."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from ...errors import OptionError, UnsupportedError
from .families import media_family
from .media import MediaInput
from .shapes import images_per_sequence, qwen_vision_layout
from .trace import KeptConstants


@dataclass(frozen=True)
class ImageForward:
    """What the class's own forward on images has live before its language model runs (held_into_prefill's)."""

    held: int  # at the language model's call, beyond a text input's of the same tokens: what the images hold
    # through the prefill
    before_prefill: int  # the largest bytes live from the forward's start to the language model's call, weights
    # not: the inputs given, the input embeddings, the tower's and projector's run, the merge into the embeddings
    # and the masks built for the language model
    given_per_token: int  # of those, the integer inputs given, bytes a token a sequence (int64 token ids and
    # attention mask; Gemma-3's token_type_ids, Qwen2.5-VL's 3-D rope positions)
    given: tuple[str, ...]  # their names
    # the largest bytes live from the language model's call to the forward's end, with the images, weights not (the
    # prefill: a DynamicCache as it fills, the last token's logits as generate()'s prefill asks), measured
    prefill_peak: int = 0
    # the language model's attention masks the forward built and hands it (alive from the call to the forward's
    # end), each distinct tensor's (shape, bytes an element): Gemma-3's token_type_ids make image tokens attend
    # bidirectionally, so transformers materialises a dense B×1×S×S mask for the full and the sliding layers
    masks: tuple[tuple[tuple[int, ...], int], ...] = ()

    @property
    def mask_bytes(self) -> int:
        return sum(math.prod(shape) * size for shape, size in self.masks)


def held_into_prefill(module: Any, media: MediaInput, *, batch: int, context: int, dtype: str) -> ImageForward:
    """What an image input costs before and through the language model's prefill, measured: the class's own forward
    runs on fake tensors (weights in `dtype`, no grad) up to the moment its language model is called, once on
    `batch` sequences with their images (the pixel values in `dtype`, the image tokens first in each sequence) and
    once on the same tokens without them, both with the inputs generate() hands the forward (token ids, attention
    mask, and each family's own). The largest bytes live before the call, with the images, are the forward's before
    its prefill (the tower's moment); the bytes live at the call (weights not) differ by what the forward keeps in
    locals through the prefill: the pixel values, the tower's returned output (transformers keeps
    get_image_features' whole output, every hidden state it returned), the projected features and any copy of them
    (LLaVA's and Qwen2.5-VL's torch.cat), and the image-token mask. The run with images goes on to the
    forward's end (its own cache, the last token's logits, as generate()'s prefill): the largest bytes live from the
    call on are its prefill (ImageForward.prefill_peak), which holds the dense attention masks built for the language
    model (ImageForward.masks, read off the call's arguments)."""
    import torch

    media.check()
    family = media_family(getattr(module, "config", None))
    if family not in _PREFILL_INPUTS:
        raise UnsupportedError("{name}: what an image input holds through the prefill is measured for Gemma-3, "
                               "LLaVA and Qwen2.5-VL", name=type(module).__name__)
    from ..traced.step import assumed_values, fake_mode, running, working_copy
    from ..traced.timeline import allocation_recorder, live_bytes

    make = _PREFILL_INPUTS[family](module, media, batch, context, getattr(torch, dtype))
    # the run on images goes on to the forward's end, every family: Gemma-3's forward builds dense attention masks
    # over the text and image tokens (its image tokens attend both ways), and LLaVA's and Qwen2.5-VL's prefills hold
    # what no analytic term had (LLaVA's: 2,150,400 B more on a cut; Qwen2.5-VL's: 5,088 B), so the prefill's moment
    # is measured, MemTracker's peak over the whole forward to the byte
    live, before, given = [], 0, {}
    for images in (True, False):
        with fake_mode(True) as mode, assumed_values(True), _MatchingTokens(), KeptConstants(family == "qwen2_5_vl"):

            def constant(value: Any) -> Any:  # a small integer layout the tower reads values of (Qwen's grid)
                return mode.fake_tensor_converter.from_real_tensor(mode, value, make_constant=True)

            model = working_copy(module, mode, None, weights_dtype=dtype)
            model.eval()
            owner = model.model if hasattr(model, "model") and hasattr(model.model, "language_model") else model
            recorder = allocation_recorder()
            for tensor in itertools.chain(model.parameters(), model.buffers()):
                recorder.known(tensor)
            reached: list[int] = []

            def stop(_: Any, __: Any, kwargs: dict[str, Any]) -> None:  # the language model is called: count what
                # is live; a text input runs no further, the images' run goes on to the forward's end (the prefill)
                reached.append(len(recorder.events))
                if images:
                    built = kwargs.get("attention_mask")
                    tensors = built.values() if isinstance(built, dict) else [built]
                    distinct = {id(t): t for t in tensors if isinstance(t, torch.Tensor) and t.dim() == 4}
                    masks.extend((tuple(t.shape), t.element_size()) for t in distinct.values())
                else:
                    raise _Reached

            masks: list[tuple[tuple[int, ...], int]] = []
            hook = owner.language_model.register_forward_pre_hook(stop, with_kwargs=True)
            try:
                with running(model), recorder, torch.no_grad():
                    inputs = make(images, constant)
                    if images:  # the integer inputs of the text's length, each a token's bytes a sequence
                        given = {name: value.element_size() * value.numel() // (batch * context)
                                 for name, value in inputs.items() if name in _GIVEN_PER_TOKEN}
                    try:  # generate()'s prefill: a cache (the model's own), the last token's logits
                        # a headless class (LlavaModel built from a config without architectures) generates
                        # nothing: no cache, as the analytic answer holds none for it
                        generation = ({"use_cache": True, "logits_to_keep": 1} if model.can_generate()
                                      else {"use_cache": False})
                        out = model(**inputs, **generation)
                        del out
                    except _Reached:
                        pass
                    del inputs
            finally:
                hook.remove()
                recorder.detach()
            if not reached:
                raise UnsupportedError("{name}'s forward did not call its language model", name=type(module).__name__)
            at, peak = live_bytes(recorder.events[:reached[0]], recorder.allocations)
            live.append(at)
            if images:
                before, found = peak, tuple(masks)
                prefill = at + live_bytes(recorder.events[reached[0]:], recorder.allocations)[1]
    return ImageForward(live[0] - live[1], before, sum(given.values()), tuple(given), prefill, found)


# the forward's integer inputs a token long (a sequence's): live from the forward's start
_GIVEN_PER_TOKEN = ("input_ids", "attention_mask", "token_type_ids", "position_ids")


class _Reached(Exception):
    """Raised where the language model is called: the measurement has what it came for."""


class _MatchingTokens:
    """A model's forward checks that its image tokens match the projected features' rows (a count it reads off the
    tokens, which fake tensors do not hold); the inputs are laid out so they match, so the check's truth is True."""

    def __enter__(self) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        class Assume(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
                if func is torch.ops.aten._local_scalar_dense.default and args[0].dtype == torch.bool \
                        and args[0].dim() == 0:
                    return True
                return func(*args, **(kwargs or {}))

        self.mode = Assume()
        self.mode.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)


def _image_ids(config: Any, batch: int, context: int, tokens: int, images: bool) -> Any:
    """Token ids: each sequence's first `tokens` the image token (with images), the rest a text token."""
    import torch

    ids = torch.zeros(batch, context, dtype=torch.long)
    if images:
        ids[:, :tokens] = int(config.image_token_id)
    return ids


def _square_images(module: Any, media: MediaInput, batch: int, context: int, dtype: Any, tokens_each: int) -> Any:
    """Gemma-3's and LLaVA's inputs: K images a sequence at the vision config's size, their tokens first, every
    token attended (an int64 attention mask of ones, as the processor gives it); Gemma-3's token_type_ids too."""
    import torch

    config, vision = module.config, module.config.vision_config
    per = images_per_sequence(media, tokens_each, "")
    size = int(vision.image_size)

    def make(images: bool, constant: Any) -> dict[str, Any]:
        inputs = {"input_ids": _image_ids(config, batch, context, per * tokens_each, images),
                  "attention_mask": torch.ones(batch, context, dtype=torch.long)}
        if config.model_type == "gemma3":  # its processor's, which generate() hands the prefill: 1 at image tokens
            inputs["token_type_ids"] = torch.zeros(batch, context, dtype=torch.long)
            if images:
                inputs["token_type_ids"][:, :per * tokens_each] = 1
        if images:
            inputs["pixel_values"] = torch.zeros(batch * per, int(vision.num_channels), size, size, dtype=dtype)
        return inputs

    return make


def _gemma3_prefill(module: Any, media: MediaInput, batch: int, context: int, dtype: Any) -> Any:
    return _square_images(module, media, batch, context, dtype, int(module.config.mm_tokens_per_image))


def _llava_prefill(module: Any, media: MediaInput, batch: int, context: int, dtype: Any) -> Any:
    config = module.config
    per_side = int(config.vision_config.image_size) // int(config.vision_config.patch_size)
    each = per_side * per_side + (0 if config.vision_feature_select_strategy == "default" else 1)
    return _square_images(module, media, batch, context, dtype, each)


def _qwen2_5_vl_prefill(module: Any, media: MediaInput, batch: int, context: int, dtype: Any) -> Any:
    """One image a sequence, its grid as the tower's trace lays it out; the 3-D rope positions given (the same
    size with or without the image, so no part of the difference; computing them reads token values)."""
    import torch

    if media.image_tokens is None:
        raise OptionError("{name} reads images at any size: give {0} N", "image_tokens", name=type(module).__name__)
    visual = module.model.visual if hasattr(module, "model") else module.visual
    grid, precomputed, width = qwen_vision_layout(visual, media.image_tokens, batch)
    patches = int(grid[:, 1:].prod(-1).sum())

    def make(images: bool, constant: Any) -> dict[str, Any]:
        inputs = {"input_ids": _image_ids(module.config, batch, context, media.image_tokens, images),
                  "attention_mask": torch.ones(batch, context, dtype=torch.long),
                  "position_ids": torch.zeros(3, batch, context, dtype=torch.long)}
        if images:
            inputs |= {"pixel_values": torch.zeros(patches, width, dtype=dtype), "image_grid_thw": constant(grid)}
            # the tower's own layouts (the forward hands its kwargs to get_image_features); its position ids
            # it makes from the grid, the forward's `position_ids` being the language model's
            inputs |= {name: constant(value) for name, value in precomputed.items() if name != "position_ids"}
        return inputs

    return make


_PREFILL_INPUTS = {"gemma3": _gemma3_prefill, "llava": _llava_prefill, "qwen2_5_vl": _qwen2_5_vl_prefill}
