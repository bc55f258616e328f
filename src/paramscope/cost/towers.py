"""FLOPs of a multimodal model's vision or audio tower on an image or audio input, traced on the tower alone.

A text input runs a multimodal model's language model only (model_view.towers_not_run). An input with images or
audio also runs the tower that reads them and the projector that turns its output into the language model's tokens.
Here those run as the real class runs them (the model's own `get_image_features`, or Whisper's encoder), on fake
tensors of the input's size under FlopCounterMode: the tower is small beside the language model, and its patch
convolutions, pooling and windowed attention have no closed form here. The count is the tower's and the projector's,
each in a line of its own, and how many tokens the projector hands the language model, read off the traced output.

    MediaInput (--image-tokens N | --images K | --audio-seconds T) → the class's own input of that size →
    FlopCounterMode over the tower and projector → MediaFlops (lines, tokens a sequence)

Families: Gemma-3 (SigLIP at the vision config's image size, pooled to mm_tokens_per_image), LLaVA (CLIP's patches,
the CLS token dropped or kept by vision_feature_select_strategy), Qwen2.5-VL (any image size: N tokens are N merged
2×2 blocks of patches, a grid picked as square as N allows; windowed attention laid out by transformers' own
helpers on the real grid), Whisper (its encoder over 30 s windows of 3,000 mel frames).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import types
from dataclasses import dataclass, field
from typing import Any

from ..errors import OptionError, UnsupportedError

MAX_IMAGES = 1024  # images a sequence
MAX_IMAGE_TOKENS = 1 << 20  # image tokens a sequence
MAX_AUDIO_SECONDS = 24 * 3600.0
WHISPER_FRAMES_PER_SECOND = 100  # WhisperFeatureExtractor: a hop of 160 samples at 16 kHz


@dataclass(frozen=True)
class MediaInput:
    """What each sequence holds beside its text: image tokens (the projector's output), images at the vision
    config's own size, or seconds of audio."""

    image_tokens: int | None = None
    images: int | None = None
    audio_seconds: float | None = None

    def check(self) -> None:
        given = [name for name, value in (("image_tokens", self.image_tokens), ("images", self.images),
                                          ("audio_seconds", self.audio_seconds)) if value is not None]
        if len(given) > 1:
            raise OptionError("give one of {0} and {1}, not both", given[0], given[1])
        if self.image_tokens is not None and not 1 <= self.image_tokens <= MAX_IMAGE_TOKENS:
            raise OptionError("{0} must be between 1 and {limit:,}, got {value}", "image_tokens",
                              limit=MAX_IMAGE_TOKENS, value=self.image_tokens)
        if self.images is not None and not 1 <= self.images <= MAX_IMAGES:
            raise OptionError("{0} must be between 1 and {limit:,} images a sequence, got {value}", "images",
                              limit=MAX_IMAGES, value=self.images)
        if self.audio_seconds is not None and not 0 < self.audio_seconds <= MAX_AUDIO_SECONDS:  # also refuses nan
            raise OptionError("{0} must be a positive number of seconds up to {limit:,.0f}, got {value}",
                              "audio_seconds", limit=MAX_AUDIO_SECONDS, value=self.audio_seconds)

    @property
    def given(self) -> bool:
        return any(value is not None for value in (self.image_tokens, self.images, self.audio_seconds))


@dataclass(frozen=True)
class TowerLine:
    """One part an image or audio input runs: its module path, class, and FLOPs as FlopCounterMode counts them."""

    part: str  # "vision tower" | "projector" | "audio encoder"
    path: str
    class_name: str
    forward: int
    backward: int | None  # training: the part's backward (its weights train)


@dataclass(frozen=True)
class MediaFlops:
    """The towers' FLOPs for one step's images or audio (batch × what each sequence holds), and the tokens the
    language model then reads."""

    kind: str  # "image" | "audio"
    input_words: str  # what a sequence holds, in the tower's own terms
    per_sequence: int  # images (audio: 30 s windows) a sequence
    tokens: int  # tokens the projector adds to each sequence's language-model input (0: read by cross-attention)
    tokens_words: str  # how that count follows from the class and config
    lines: tuple[TowerLine, ...]
    engine: str = "traced"  # FlopCounterMode on the tower alone, fake tensors
    notes: tuple[str, ...] = field(default=())
    # the language model's forward FLOPs by module path, the rest of the same trace, where it reads the tower by
    # cross-attention (Whisper's decoder, Llama-3.2-Vision's text model): the estimate reads them by role in place of
    # the analytic count; empty where the projector hands the language model tokens
    decoder_by_module: tuple[tuple[str, int], ...] = field(default=())
    # training, where decoder_by_module is read: the language model's backward in the same trace (the whole
    # backward less the tower's and projector's lines); None for a forward
    decoder_backward: int | None = None
    # training in a precision (media_flops' `precision`): the bytes the tower's and projector's forward saves for the
    # backward and still holds when it ends (activations and autocast's weight copies, each storage once; the
    # weights not), alive until the backward reaches them
    saved_bytes: int | None = None
    # serving in a dtype (media_flops' `serving_dtype`): the largest bytes live at once during the tower's and
    # projector's forward (no grad), the image input and every intermediate, weights not: what the tower adds to
    # the resident weights while it runs, before the language model's prefill
    forward_peak: int | None = None
    # serving images (held_into_prefill's, set by the serving estimate): the bytes the forward keeps of the images
    # through the language model's prefill, beyond a text input's
    held_through_prefill: int | None = None

    @property
    def forward(self) -> int:
        return sum(line.forward for line in self.lines)

    @property
    def backward(self) -> int | None:
        if any(line.backward is None for line in self.lines):
            return None
        return sum(line.backward for line in self.lines)


def media_family(config: Any) -> str | None:
    """The family whose tower input paramscope lays out, from the config's model_type; None for any other."""
    kind = getattr(config, "model_type", None)
    return kind if kind in _FAMILIES else None


def media_flops(module: Any, media: MediaInput, *, batch: int, seq: int, training: bool,
                precision: str | None = None, attention: str | None = None,
                frozen: frozenset[str] = frozenset(), serving_dtype: str | None = None) -> MediaFlops:
    """Trace the tower (and projector) of `module` (built on meta) on `batch` sequences' images or audio. With a
    training `precision` ("bf16-mixed", …) the trace runs as that step runs it (the weights' dtype, autocast) and
    also measures what the towers save for backward (MediaFlops.saved_bytes), with the step's `attention` (None: the
    model's own). `frozen`: parameter names that do not train (--freeze): no weight gradient, and no input gradient
    where nothing before them trains. With `serving_dtype` (a forward, "bfloat16", …) the trace also measures the
    forward's peak in that dtype (MediaFlops.forward_peak), with the model's own attention."""
    media.check()
    config = getattr(module, "config", None)
    family = media_family(config)
    if family is None:
        raise UnsupportedError("{name} ({kind}): image and audio inputs are counted for Gemma-3, LLaVA, Qwen2.5-VL, "
                               "Llama-3.2-Vision and Whisper; a text input counts its language model only", name=type(module).__name__,
                               kind=getattr(config, "model_type", None) or "no model_type")
    layout = _FAMILIES[family]
    if media.audio_seconds is not None and family != "whisper":
        raise OptionError("{0} is for an audio tower (Whisper); {name} reads images: use {1} or {2}", "audio_seconds",
                          "images", "image_tokens", name=type(module).__name__)
    if media.audio_seconds is None and family == "whisper":
        raise OptionError("{name} reads audio: give {0}", "audio_seconds", name=type(module).__name__)
    from .. import progress

    with progress.status(f"counting {type(module).__name__}'s {'audio' if family == 'whisper' else 'vision'} tower on "
                         "fake tensors (FlopCounterMode)"):
        return layout(module, media, batch, seq, TraceStep(training, precision if training else None, attention,
                                                           frozenset(frozen) if training else frozenset(),
                                                           None if training else serving_dtype))


@dataclass(frozen=True)
class TraceStep:
    """How a family's trace runs: the FLOPs of a forward, or of a training step (its backward too); with a training
    `precision`, also what the towers save for backward, measured with the step's `attention` (None: the model's)."""

    training: bool
    precision: str | None = None
    attention: str | None = None
    frozen: frozenset[str] = frozenset()  # parameter names that do not train
    serving_dtype: str | None = None  # a forward's: also measure its peak live bytes with the weights in this dtype


@dataclass(frozen=True)
class Traced:
    """What `_traced_parts` read off a trace: each part's line, the rows the projector produced, every module's own
    forward FLOPs by path (when asked), and the bytes the forward saves for backward (TraceStep.precision)."""

    lines: tuple[TowerLine, ...]
    rows: int
    own: dict[str, int] | None
    saved: int | None
    peak: int | None = None  # TraceStep.serving_dtype: the forward's largest live bytes, weights not
    backward_total: int | None = None  # training: the whole trace's backward (every module, and outside any)


# ---- the families' inputs ----------------------------------------------------------------------------------------

def _pixel_dtype(step: TraceStep) -> Any:
    """The pixel values' dtype: serving, the weights' (transformers' model cards cast the processor's output to the
    model's dtype, as held_into_prefill's forward takes them); else float32, the processor's (the tower casts them
    to its weights' dtype, the same FLOPs)."""
    import torch

    return getattr(torch, step.serving_dtype) if step.serving_dtype is not None else torch.float32


def _per_image(media: MediaInput, tokens_each: int, words: str) -> int:
    """Images a sequence: --images K, or --image-tokens N when N is a whole number of images."""
    if media.images is not None:
        return media.images
    if media.image_tokens % tokens_each:
        raise OptionError("{0} {value:,} is not a whole number of images: each image is {each:,} tokens ({words})",
                          "image_tokens", value=media.image_tokens, each=tokens_each, words=words)
    return media.image_tokens // tokens_each


def _gemma3(module: Any, media: MediaInput, batch: int, seq: int, step: TraceStep) -> MediaFlops:
    import torch

    config = module.config
    vision = config.vision_config
    size, patch = int(vision.image_size), int(vision.patch_size)
    per_side = size // patch
    tokens_each = int(config.mm_tokens_per_image)
    pooled = math.isqrt(tokens_each)
    words = (f"Gemma3MultiModalProjector average-pools the {per_side}×{per_side} patches to {pooled}×{pooled} = "
             f"mm_tokens_per_image {tokens_each:,}")
    images = _per_image(media, tokens_each, words)
    owner = module.model if hasattr(module, "model") and hasattr(module.model, "vision_tower") else module
    pixels = _pixel_dtype(step)
    traced = _traced_parts(
        module, lambda model: _image_features(model)(torch.zeros(batch * images, int(vision.num_channels), size, size,
                                                                 dtype=pixels)),
        [("vision tower", _path(module, owner.vision_tower)), ("projector", _path(module, owner.multi_modal_projector))],
        step)
    return MediaFlops("image", _image_words(images, size, per_side, patch), images, traced.rows // batch, words,
                      traced.lines, saved_bytes=traced.saved, forward_peak=traced.peak)


def _llava(module: Any, media: MediaInput, batch: int, seq: int, step: TraceStep) -> MediaFlops:
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
    images = _per_image(media, tokens_each, words)
    owner = module.model if hasattr(module, "model") and hasattr(module.model, "vision_tower") else module

    pixels = _pixel_dtype(step)

    def run(model: Any) -> Any:
        return _image_features(model)(torch.zeros(batch * images, int(vision.num_channels), size, size, dtype=pixels),
                                      vision_feature_layer=layer, vision_feature_select_strategy=strategy)

    traced = _traced_parts(module, run, [("vision tower", _path(module, owner.vision_tower)),
                                         ("projector", _path(module, owner.multi_modal_projector))], step)
    notes = ()
    if layer not in (-1, None):
        notes = (f"the tower runs all its layers although the projector reads hidden states {layer}: every layer "
                 "is counted, as transformers runs them",)
    return MediaFlops("image", _image_words(images, size, per_side, patch), images, traced.rows // batch, words,
                      traced.lines, notes=notes, saved_bytes=traced.saved, forward_peak=traced.peak)


def _qwen2_5_vl(module: Any, media: MediaInput, batch: int, seq: int, step: TraceStep) -> MediaFlops:
    import torch

    visual = module.model.visual if hasattr(module, "model") else module.visual
    merge = int(visual.spatial_merge_size)
    if media.image_tokens is None:
        raise OptionError("{name} reads images at any size, so {0} has no size to count: give {1} N (N merged "
                          "{merge}×{merge} blocks of patches)", "images", "image_tokens", name=type(module).__name__,
                          merge=merge)
    n = media.image_tokens
    grid_thw, precomputed, width = _qwen_layout(visual, n, batch)
    grid = tuple(int(x) for x in grid_thw[0])
    patch = int(visual.patch_size)
    words = (f"{merge}×{merge} patches merge into one token (spatial_merge_size {merge}): {grid[1]}×{grid[2]} "
             f"patches → {n:,} tokens")
    images = batch  # one image a sequence
    patches = images * grid[1] * grid[2]

    def run(model: Any, constant: Any) -> Any:
        given = {name: constant(value) for name, value in precomputed.items()}
        return _image_features(model)(torch.zeros(patches, width), image_grid_thw=constant(grid_thw), **given)

    traced = _traced_parts(module, run, [("vision tower", _path(module, visual)),
                                         ("projector", _path(module, visual.merger))], step, constants=True)
    notes = (f"an image of {grid[1] * patch}×{grid[2] * patch} px ({grid[1]}×{grid[2]} patches of {patch} px, the "
             f"grid as square as {n:,} tokens allow); windowed attention over {visual.window_size} px windows, full "
             f"attention in blocks {tuple(visual.fullatt_block_indexes)}, laid out by transformers' own helpers",)
    return MediaFlops("image", f"1 image of {n:,} tokens", 1, traced.rows // batch, words, traced.lines, notes=notes,
                      saved_bytes=traced.saved, forward_peak=traced.peak)


def _qwen_layout(visual: Any, tokens: int, images: int) -> tuple[Any, dict[str, Any], int]:
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


def _whisper(module: Any, media: MediaInput, batch: int, seq: int, step: TraceStep) -> MediaFlops:
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

    parts = [("audio encoder", _path(module, encoder))]
    traced = _traced_parts(module, run, parts, dataclasses.replace(step, serving_dtype=None), with_own=True)
    lines, own = traced.lines, traced.own
    if step.training:
        traced, lines = _with_tower_backward(module, run_tower, parts, step, traced)
    peak = None
    if step.serving_dtype is not None:  # generate() runs the encoder alone first: its peak is its own
        peak = _traced_parts(module, run_tower, parts, step).peak
    enc = _path(module, encoder)
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


def _mllama(module: Any, media: MediaInput, batch: int, seq: int, step: TraceStep) -> MediaFlops:
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
    images = _per_image(media, states, words)
    owner = module.model

    def run(model: Any) -> Any:
        shape = (batch, images, tiles)
        return model(input_ids=torch.zeros(batch, seq, dtype=torch.long),
                     pixel_values=torch.zeros(*shape, int(vision.num_channels), size, size),
                     aspect_ratio_ids=torch.ones(batch, images, dtype=torch.long),
                     aspect_ratio_mask=torch.ones(*shape, dtype=torch.long),
                     cross_attention_mask=torch.ones(batch, seq, images, tiles, dtype=torch.long))

    parts = [("vision tower", _path(module, owner.vision_model)),
             ("projector", _path(module, owner.multi_modal_projector))]
    def run_tower(model: Any) -> Any:
        states = model.model.vision_model(pixel_values=torch.zeros(batch, images, tiles, int(vision.num_channels),
                                                                   size, size),
                                          aspect_ratio_ids=torch.ones(batch, images, dtype=torch.long),
                                          aspect_ratio_mask=torch.ones(batch, images, tiles, dtype=torch.long))
        projected = model.model.multi_modal_projector(states.last_hidden_state)
        return types.SimpleNamespace(pooler_output=projected.reshape(-1, projected.shape[-2], projected.shape[-1]))

    traced = _traced_parts(module, run, parts, dataclasses.replace(step, serving_dtype=None), with_own=True)
    lines, own = traced.lines, traced.own
    if step.training:
        traced, lines = _with_tower_backward(module, run_tower, parts, step, traced)
    peak = None
    if step.serving_dtype is not None:  # the vision model and projector run first in the forward: their own peak
        peak = _traced_parts(module, run_tower, parts, step).peak
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
    alone = _traced_parts(module, run_tower, parts, step)
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


_FAMILIES = {"gemma3": _gemma3, "llava": _llava, "qwen2_5_vl": _qwen2_5_vl, "whisper": _whisper, "mllama": _mllama}


# ---- the trace ---------------------------------------------------------------------------------------------------

def _traced_parts(module: Any, run: Any, parts: list[tuple[str, str]], step: TraceStep, constants: bool = False,
                  with_own: bool = False) -> Traced:
    """Run `run` on a fake copy of `module` under FlopCounterMode (forward, and the backward of the output's sum when
    training); each part's FLOPs by its module path (a part nested in an earlier one is taken out of it), the rows
    of the output (the tokens get_image_features produced), every module's own forward FLOPs by path (`with_own`),
    and, with the step's precision, what the forward saves for backward (a second forward, without the counter)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    import gc
    import weakref

    from .traced.flops import missing_formulas
    from .traced.step import assumed_values, autocast_for, fake_mode, running, working_copy

    training, precision = step.training, step.precision
    packed: list[tuple[Any, int, int]] = []  # (a weak reference to a saved tensor, its storage, the storage's bytes)
    with fake_mode(True) as mode, assumed_values(True), _constants(constants):
        # eager attention: its score matmuls count as sdpa's do, and its backward is the model's (2 × the forward),
        # with no fused kernel's recomputed scores in it
        model = working_copy(module, mode, "eager", weights_dtype="bfloat16" if precision == "bf16-pure" else None)
        model.train(training)
        _freeze(model, step.frozen)
        weights = {_storage(p) for p in itertools.chain(model.parameters(), model.buffers())}

        def pack(tensor: Any) -> Any:
            key = _storage(tensor)
            if key not in weights:
                packed.append((weakref.ref(tensor), key, tensor.untyped_storage().nbytes()))
            return tensor

        def constant(value: Any) -> Any:  # a small integer layout the tower reads values of: kept real in the fake
            if not isinstance(value, torch.Tensor):
                return value
            return mode.fake_tensor_converter.from_real_tensor(mode, value, make_constant=True)

        with running(model):
            # one counter for both passes: FlopCounterMode attributes the backward to modules through hooks it sets
            # in the forward it saw
            counter = FlopCounterMode(display=False, depth=None, custom_mapping=missing_formulas())
            with counter:
                with torch.set_grad_enabled(training), autocast_for(precision or "fp32"):
                    out = run(model, constant) if constants else run(model)
                    loss = _sum(out) if training else None
                forward = _by_path(counter.get_flop_counts(), module, model)
                own = _own_by_path(forward) if with_own else None
                rows = _rows(out)
                del out
                backward = None
                if training and loss.requires_grad:  # (a frozen tower and projector: no backward at all)
                    loss.backward()
                    both = _by_path(counter.get_flop_counts(), module, model)
                    backward = {path: total - forward.get(path, 0) for path, total in both.items()}
            del loss
            saved = None
            if training and precision is not None:
                # again without the counter, whose module hooks hold every output: what the backward still needs
                # once the forward is done, the tower's other outputs (every hidden state, a layer whose output
                # nothing reads) dropped as the model drops them
                # with the step's attention (the FLOPs' eager attention keeps scores that sdpa does not)
                model = working_copy(module, mode, step.attention,
                                     weights_dtype="bfloat16" if precision == "bf16-pure" else None)
                model.train(True)
                _freeze(model, step.frozen)
                weights = {_storage(p) for p in itertools.chain(model.parameters(), model.buffers())}
                with torch.set_grad_enabled(True), autocast_for(precision), \
                        torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                    out = run(model, constant) if constants else run(model)
                    graph = [_sum(out)]  # the loss, whose graph holds what the backward needs while the rest goes
                del out
                gc.collect()
                saved = sum({key: size for ref, key, size in packed if ref() is not None}.values())
                graph.clear()
        peak = None
        if step.serving_dtype is not None:
            peak = _forward_peak(module, mode, step.serving_dtype,
                                 (lambda model: run(model, constant)) if constants else run)
    lines = []
    taken: set[str] = set()
    for part, path in reversed(parts):  # nested parts first (Qwen's merger inside its visual)
        lines.append(TowerLine(part, path, _class_at(module, path), _within(forward, path, taken),
                               None if backward is None else _within(backward, path, taken)))
        taken.add(path)
    lines.reverse()
    return Traced(tuple(lines), rows, own, saved, peak, None if backward is None else backward.get("", 0))


def _forward_peak(module: Any, mode: Any, dtype: str, run: Any) -> int:
    """The largest bytes live at once while `run` runs a fake copy of `module` with its floating weights in `dtype`
    (no grad, the model's own attention): every storage an operator returns, from when it is made to when it is
    freed, the weights not, after each operator as torch's MemTracker takes its peak (traced/timeline.py's
    recorder, which tests/test_derived_memory.py holds equal to MemTracker's)."""
    import torch

    from .traced.step import running, working_copy
    from .traced.timeline import allocation_recorder, live_bytes

    model = working_copy(module, mode, None, weights_dtype=dtype)
    model.eval()
    recorder = allocation_recorder()
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        recorder.known(tensor)
    try:
        with running(model), recorder, torch.no_grad():
            out = run(model)
            del out
    finally:
        recorder.detach()
    return live_bytes(recorder.events, recorder.allocations)[1]


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
    from .traced.step import assumed_values, fake_mode, running, working_copy
    from .traced.timeline import allocation_recorder, live_bytes

    make = _PREFILL_INPUTS[family](module, media, batch, context, getattr(torch, dtype))
    # the run on images goes on to the forward's end, every family: Gemma-3's forward builds dense attention masks
    # over the text and image tokens (its image tokens attend both ways), and LLaVA's and Qwen2.5-VL's prefills hold
    # what no analytic term had (LLaVA's: 2,150,400 B more on a cut; Qwen2.5-VL's: 5,088 B), so the prefill's moment
    # is measured, MemTracker's peak over the whole forward to the byte
    live, before, given = [], 0, {}
    for images in (True, False):
        with fake_mode(True) as mode, assumed_values(True), _MatchingTokens(), _constants(family == "qwen2_5_vl"):

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
    per = _per_image(media, tokens_each, "")
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
    grid, precomputed, width = _qwen_layout(visual, media.image_tokens, batch)
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


def _freeze(model: Any, frozen: frozenset[str]) -> None:
    for name, param in model.named_parameters():
        if name in frozen:
            param.requires_grad_(False)


def _storage(tensor: Any) -> int:
    """The identity of a tensor's storage (views and a parameter's uses share it)."""
    return tensor.untyped_storage()._cdata


def _within(counts: dict[str, int], path: str, taken: set[str]) -> int:
    """FLOPs of the module at `path` and below, less those of the already-taken parts inside it."""
    inside = [p for p in taken if p.startswith(path + ".")]
    return counts.get(path, 0) - sum(counts.get(p, 0) for p in inside)


def _by_path(counts: dict[str, dict[Any, int]], module: Any, model: Any) -> dict[str, int]:
    """FlopCounterMode's totals (a module's FLOPs including its children's) keyed by the module's path in `module`.
    The counter names a module by the first module it saw running and the attribute names below it; a call into a
    method (get_image_features) starts at the tower, named by its class."""
    roots = {}
    for path, sub in model.named_modules():
        roots.setdefault(type(sub).__name__, path)
    result: dict[str, int] = {}
    for name, ops in counts.items():
        if name == "Global":
            result[""] = sum(ops.values())
            continue
        head, _, rest = name.partition(".")
        base = roots.get(head)
        if base is None:
            continue
        if base == "" and head == type(model).__name__:
            if not rest:  # the whole model, run as a whole (Whisper, Llama-3.2-Vision): "" is Global's, which has it
                continue
            path = rest
        else:
            path = ".".join(p for p in (base, rest) if p)
        result[path] = result.get(path, 0) + sum(ops.values())
    return result


def _own_by_path(totals: dict[str, int]) -> dict[str, int]:
    """Each module's own FLOPs: its total less those of the modules counted under it nearest (a layer list the
    counter never entered leaves its layers under the stack)."""
    own: dict[str, int] = {}
    paths = [p for p in totals if p]

    def nearest(path: str) -> str:
        parent = path
        while "." in parent:
            parent = parent.rsplit(".", 1)[0]
            if parent in totals:
                return parent
        return ""

    under: dict[str, int] = {}
    for path in paths:
        parent = nearest(path)
        under[parent] = under.get(parent, 0) + totals[path]
    for path in paths:
        value = totals[path] - under.get(path, 0)
        if value:
            own[path] = value
    rest = totals.get("", 0) - under.get("", 0)
    if rest:
        own["(outside any module)"] = rest
    return own


def _class_at(module: Any, path: str) -> str:
    return type(module.get_submodule(path)).__name__


def _path(module: Any, sub: Any) -> str:
    for path, candidate in module.named_modules():
        if candidate is sub:
            return path
    raise UnsupportedError("{name}'s tower is not among its modules", name=type(module).__name__)


def _image_features(model: Any) -> Any:
    features = getattr(model, "get_image_features", None)
    if features is None:
        raise UnsupportedError("{name} has no get_image_features", name=type(model).__name__)
    return features


def _rows(out: Any) -> int:
    """Tokens the projector produced: the rows of get_image_features' pooled output (a tensor of images × tokens ×
    width, or a list of tokens × width per image)."""
    pooled = getattr(out, "pooler_output", out)
    if isinstance(pooled, (list, tuple)):
        return sum(int(t.shape[0]) for t in pooled)
    if pooled is None or not hasattr(pooled, "shape"):
        return 0
    return int(math.prod(pooled.shape[:-1]))


def _sum(out: Any) -> Any:
    """A scalar the backward starts from: the sum of every floating tensor the tower returned."""
    import torch

    pooled = getattr(out, "pooler_output", None)
    tensors = list(pooled) if isinstance(pooled, (list, tuple)) else [pooled]
    if hasattr(out, "logits"):
        tensors = [out.logits]
    return sum(t.float().sum() for t in tensors if isinstance(t, torch.Tensor))


def _image_words(images: int, size: int, per_side: int, patch: int) -> str:
    return (f"{images:,} image{'s' if images > 1 else ''} of {size}×{size} px ({per_side}×{per_side} = "
            f"{per_side * per_side:,} patches of {patch} px)")


class _constants:
    """While tracing a tower that reads values of its small integer layouts (Qwen2.5-VL's grid, windows and
    position ids), fake tensors keep those values: torch's fake tensors propagate constants up to
    CONSTANT_NUMEL_LIMIT elements (1 by default), raised here for the trace and put back after."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.old = None

    def __enter__(self) -> None:
        if self.on:
            import torch._subclasses.fake_tensor as fake_tensor

            self.old = fake_tensor.CONSTANT_NUMEL_LIMIT
            fake_tensor.CONSTANT_NUMEL_LIMIT = 1 << 24

    def __exit__(self, *exc: Any) -> None:
        if self.on:
            import torch._subclasses.fake_tensor as fake_tensor

            fake_tensor.CONSTANT_NUMEL_LIMIT = self.old


# ---- kept with the config's cost facts ----------------------------------------------------------------------------

FORMAT = 2  # 2: decoder_backward (training a cross-attention family)
_PARTS = ("vision tower", "projector", "audio encoder")
MAX_LINES = 8
MAX_MODULES = 100_000
MAX_WORDS = 2_000


def media_key(facts_key: str, media: MediaInput, *, batch: int, seq: int, training: bool,
              frozen: frozenset[str] = frozenset()) -> str:
    """The trace's key: the config's facts key and everything the trace depends on (the decoder's length only for
    Whisper, whose decoder is read off the same trace)."""
    import hashlib

    audio = media.audio_seconds is not None
    spec = json_dumps({"config": facts_key, "image_tokens": media.image_tokens, "images": media.images,
                       "audio_seconds": media.audio_seconds, "batch": batch, "seq": seq if audio else None,
                       "training": training, "frozen": sorted(frozen) if training else []})
    return hashlib.sha256(spec.encode()).hexdigest()[:32]


def json_dumps(data: Any) -> str:
    import json

    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def to_json(media: MediaFlops) -> dict[str, Any]:
    return {"kind": media.kind, "input": media.input_words, "per_sequence": media.per_sequence, "tokens": media.tokens,
            "tokens_from": media.tokens_words, "engine": media.engine, "notes": list(media.notes),
            "lines": [[line.part, line.path, line.class_name, line.forward, line.backward] for line in media.lines],
            "decoder": [[path, flops] for path, flops in media.decoder_by_module],
            "decoder_backward": media.decoder_backward}


def from_json(data: Any) -> MediaFlops:
    """A kept trace, validated field by field (CacheEntryError for anything else)."""
    from ..disk_cache import expect, is_int
    from .engine_check import printable

    expect(isinstance(data, dict) and set(data) == {"kind", "input", "per_sequence", "tokens", "tokens_from",
                                                    "engine", "notes", "lines", "decoder", "decoder_backward"},
           "not a tower trace")
    expect(data["kind"] in ("image", "audio") and data["engine"] == "traced", "unknown kind or engine")
    for name in ("per_sequence", "tokens"):
        expect(is_int(data[name]) and 0 <= data[name] <= MAX_IMAGE_TOKENS * MAX_IMAGES, f"bad {name}")
    words = [data["input"], data["tokens_from"], *(data["notes"] if isinstance(data["notes"], list) else [None])]
    expect(all(isinstance(w, str) and len(w) <= MAX_WORDS and printable(w) == w for w in words), "bad words")
    expect(isinstance(data["lines"], list) and 1 <= len(data["lines"]) <= MAX_LINES, "bad lines")
    lines = []
    for line in data["lines"]:
        expect(isinstance(line, list) and len(line) == 5 and line[0] in _PARTS, "bad line")
        part, path, class_name, forward, backward = line
        expect(all(isinstance(s, str) and len(s) <= MAX_WORDS and printable(s) == s for s in (path, class_name)),
               "bad path")
        expect(is_int(forward) and forward >= 0 and (backward is None or is_int(backward) and backward >= 0),
               "bad FLOPs")
        lines.append(TowerLine(part, path, class_name, forward, backward))
    expect(isinstance(data["decoder"], list) and len(data["decoder"]) <= MAX_MODULES, "bad decoder")
    decoder = []
    for item in data["decoder"]:
        expect(isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and len(item[0]) <= MAX_WORDS
               and is_int(item[1]) and item[1] >= 0, "bad decoder module")
        decoder.append((item[0], item[1]))
    rest = data["decoder_backward"]
    expect(rest is None or is_int(rest) and rest >= 0, "bad decoder backward")
    return MediaFlops(data["kind"], data["input"], data["per_sequence"], data["tokens"], data["tokens_from"],
                      tuple(lines), notes=tuple(data["notes"]), decoder_by_module=tuple(decoder), decoder_backward=rest)


def _entry(class_name: str, key: str) -> Any:
    from ..disk_cache import class_directory, installed_transformers_version, safe_name
    from ..template import cache_directory
    from .facts.store import facts_directory

    version = installed_transformers_version()
    if version is None:
        return None
    return facts_directory(class_directory(cache_directory(version), class_name)) / f"{safe_name(key)}.towers.json"


def find_media(class_name: str, key: str) -> MediaFlops | None:
    """The tower trace kept for this class and key by these versions, or None."""
    from ..disk_cache import CacheEntryError, expect, read_entry, versions

    path = _entry(class_name, key)
    if path is None:
        return None
    try:
        data = read_entry(path)
        expect(isinstance(data, dict) and data.get("format") == FORMAT and data.get("key") == key
               and data.get("class") == class_name and data.get("versions") == versions(), "not this trace")
        return from_json(data.get("media"))
    except (CacheEntryError, OSError):
        return None


def keep_media(media: MediaFlops, class_name: str, key: str) -> None:
    from ..disk_cache import versions, write_entry

    path = _entry(class_name, key)
    if path is not None:
        write_entry(path, {"format": FORMAT, "key": key, "class": class_name, "versions": versions(),
                           "media": to_json(media)})
