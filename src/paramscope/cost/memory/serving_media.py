"""A serving answer's media input (serving.py): images or audio before the prefill. The context the input makes and
the tower's trace (`media_input`), the prefill measured where no formula holds what the images hold
(`measured_prefill`: Llama-3.2-Vision's cross-attention; `measured_token_prefill`: images made tokens), and the
tower's moment beside the prefill's (`with_tower`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ...errors import OptionError, UnsupportedError
from ..dims import config_int, dim
from ..dtypes import itemsize


def media_input(view: Any, options: Any, seq: int,
                 dtype: str) -> tuple[Any, int, Any, Any, Any]:
    """(the tower's trace, the context length, the options the cache and prefill take, the prefill measured on the
    images where no formula holds it, else None, the forward up to the language model's call measured where the
    images become tokens (towers.ImageForward), else None). Images: --seq S text tokens and the N image tokens the
    projector hands the language model make a context of S + N; without --seq the context is the model's maximum,
    N of it images. Images read by cross-attention (Llama-3.2-Vision): the context is the text's, the
    cross-attention layers cache each sequence's vision tokens (images × tiles × (patches + 1)), and the prefill is
    measured (image_prefill.py). Audio (Whisper): each 30 s window is a sequence of its own, its decoder
    cross-attending to the window's encoder states, so the batch is B × windows and the cross-attention cache holds
    max_source_positions states a sequence."""
    from ..towers.families import media_family, media_flops
    from ..towers.prefill import held_into_prefill

    config = getattr(view.module, "config", None)
    cross = media_family(config) == "mllama"
    if cross and options.encoder_seq is not None:  # before any trace
        raise OptionError("{0} is the images': each sequence's images × tiles × (patches + 1) vision tokens",
                          "encoder_seq")
    media = media_flops(view.module, options.media, batch=options.batch, seq=options.seq or seq, training=False,
                        serving_dtype=dtype)
    if cross:
        from .image_prefill import measure_prefill

        measured = measure_prefill(view.module, images=media.per_sequence, batch=options.batch, context=seq,
                                   dtype=dtype)
        return (dataclasses.replace(media, held_through_prefill=measured.held), seq,
                dataclasses.replace(options, encoder_seq=measured.vision_tokens), measured, None)
    if media.kind == "audio":
        if options.encoder_seq is not None:
            raise OptionError("{0} is the audio's: each window's {states:,} encoder states", "encoder_seq",
                              states=int(config.max_source_positions))
        return media, seq, dataclasses.replace(options, batch=options.batch * media.per_sequence,
                                               encoder_seq=int(config.max_source_positions)), None, None
    if options.seq is not None:
        seq = options.seq + media.tokens
    elif media.tokens >= seq:
        raise OptionError("{tokens:,} image tokens fill the model's {seq:,}-token context: give {0} for the text",
                          "seq", tokens=media.tokens, seq=seq)
    forward = held_into_prefill(view.module, options.media, batch=options.batch, context=seq, dtype=dtype)
    return dataclasses.replace(media, held_through_prefill=forward.held), seq, options, None, forward


def measured_prefill(measured: Any, analytic_at: Any, analytic: Any, weights: Any, cache: Any,
                      options: Any, seq: int) -> tuple[Any, Any, str]:
    """(the prefill's curve without what the images hold, which with_tower adds; the workspace; the note) where the
    prefill on images is measured (image_prefill.ImagePrefill): at the asked point the prefill's moment is the
    weights and the measured peak, which holds the KV cache (self-attention over the text, cross-attention over the
    vision tokens), what the images hold and the working tensors; the workspace is the measured peak less the
    other two. Elsewhere (the fits) the analytic curve moved by the same bytes, exact at the asked point only."""
    from .result import Workspace

    kv = cache.at(options.batch, seq) if cache is not None else 0
    moment = weights.bytes + weights.buffer_bytes + measured.peak
    difference = analytic_at(options.batch, seq) + measured.held - moment
    rest = measured.peak - kv - measured.held
    workspace = Workspace(rest, (f"measured: the prefill's largest live bytes {measured.peak:,} less the KV cache "
                                 f"{kv:,} and the images held {measured.held:,} (the token ids, a layer's working "
                                 "tensors, the last token's logits)"), analytic.logits)

    def prefill_at(batch: int, length: int) -> int:
        return analytic_at(batch, length) - difference

    change = f"{difference:,} B over" if difference >= 0 else f"{-difference:,} B short of"
    note = (f"prefill on images: measured, the class's own forward on fake tensors (weights in the compute dtype, no "
            f"grad, a DynamicCache, the last token's logits as generate()'s prefill, the model's own attention as "
            f"torch runs it on CPU tensors), from the language model's call to the end: {measured.peak:,} B beyond the "
            f"weights; the analytic prefill (a Llama-style workspace over the text, without the cross-attention "
            f"layers' tensors) is {change} it; the fits below move the analytic curve by the same (exact at "
            f"the asked point only)")
    return prefill_at, workspace, note


def measured_token_prefill(forward: Any, analytic_at: Any, analytic: Any, weights: Any, cache: Any,
                            options: Any, seq: int, additive: int) -> tuple[Any, Any, str]:
    """(the prefill's curve without what the images hold, which with_tower adds; the workspace; the note) where the
    images become tokens (towers.ImageForward, the class's own forward on fake tensors through to its end): at the
    asked point the prefill's moment is the weights and the measured peak from the language model's call to the
    forward's end. That peak holds the attention masks the forward built for the language model, which the analytic
    workspace has not: Gemma-3's token_type_ids make image tokens attend bidirectionally, so transformers builds a
    dense B×1×S×S mask for its full and its sliding layers (bool under sdpa), alive until the forward ends. In the
    fits the masks grow as batch × S² (their measured shapes scaled) and the rest is the analytic curve moved by
    the same bytes as at the asked point (exact there only). `additive`: under sdpa, the compute dtype's bytes: torch's
    scaled_dot_product_attention turns a bool mask into an additive one of that dtype (convert_boolean_attn_mask,
    on CPU and CUDA alike), one B×1×S×S copy alive within each layer's attention, which the fits grow as S² too."""
    from .result import Workspace

    masks = forward.masks

    def built_at(batch: int, length: int) -> int:
        return sum(size * math.prod(shape[1:-2]) * batch * length * length for shape, size in masks)

    bool_masks = [shape for shape, size in masks if size == 1]
    copy_heads = max((math.prod(shape[1:-2]) for shape in bool_masks), default=0) if additive else 0

    def masks_at(batch: int, length: int) -> int:  # the masks built, and sdpa's additive copy of one (a layer's)
        return built_at(batch, length) + additive * copy_heads * batch * length * length

    def kv_at(batch: int, length: int) -> int:
        return cache.at(batch, length) if cache is not None else 0

    kv = cache.at(options.batch, seq) if cache is not None else 0
    moment = weights.bytes + weights.buffer_bytes + forward.prefill_peak
    built = forward.mask_bytes
    if built != built_at(options.batch, seq):  # a mask not B×…×S×S: the fits cannot scale it
        raise UnsupportedError("the language model's attention masks are not batch × S × S ({shapes})",
                               shapes=", ".join("×".join(map(str, shape)) for shape, _ in masks))
    # the analytic prefill (a Llama-style workspace with its own sliding-window mask where the prompt fills the
    # window) with the masks and the images held, beside the measured: the note says by how much it differs
    difference = analytic_at(options.batch, seq) + masks_at(options.batch, seq) + forward.held - moment
    rest = forward.prefill_peak - kv - forward.held
    # the fits: the KV cache as computed, the masks as batch × S², and the rest of the measured peak (a layer's
    # working tensors, the sliding layers' prompt K and V, the logits) in batch × tokens
    linear = rest - masks_at(options.batch, seq)
    workspace = Workspace(rest, (f"measured: the prefill's largest live bytes {forward.prefill_peak:,} less the KV "
                                 f"cache {kv:,} and the images held {forward.held:,} (the inputs given, the merged "
                                 "embeddings, the attention masks built, a layer's working tensors, the last "
                                 "token's logits)"), analytic.logits)

    def prefill_at(batch: int, length: int) -> int:
        return (weights.bytes + weights.buffer_bytes + kv_at(batch, length) + masks_at(batch, length)
                + linear * batch * length // (options.batch * seq))

    change = f"{difference:,} B over" if difference >= 0 else f"{-difference:,} B short of"
    if masks:
        kinds = {size: "bool" if size == 1 else f"{size} B an element" for _, size in masks}
        each = " and ".join(kinds.values())
        mask_words = (f"attention masks over text + image tokens, B×S×S {each} each: {len(masks)} × "
                      f"{options.batch:,} × {seq:,} × {seq:,} = {built:,} B (transformers' masks for the full and "
                      "the sliding-window layers: token_type_ids make each image's tokens attend to each other "
                      "both ways, which no causal kernel does, so the masks are dense; built before the language "
                      "model's call and alive to the forward's end; in the fits they grow as batch × S²)"
                      + (f", and within each layer's attention sdpa's additive copy of one in the compute dtype "
                         f"({copy_heads * options.batch * seq * seq * additive:,} B here: torch turns a bool mask "
                         "into -inf/0 before its kernel, on GPU as on CPU; also B×S² in the fits)"
                         if copy_heads else ""))
    else:
        mask_words = "no dense attention mask (the model's attention runs causal without one)"
    note = (f"prefill on images: measured, the class's own forward on fake tensors (weights in the compute dtype, "
            f"no grad, the model's own cache, the last token's logits as generate()'s prefill, the model's own "
            f"attention as torch runs it on CPU tensors), from the language model's call to the end: "
            f"{forward.prefill_peak:,} B beyond the weights, which holds {mask_words}; the analytic prefill with "
            f"the masks and the images held is {change} it. The fits below: the KV cache as computed, the masks "
            f"as batch × S², the rest of the measured peak ({linear:,} B) in batch × tokens (exact at the asked "
            f"point; elsewhere approximate: ask --seq at the length that matters)")
    return prefill_at, workspace, note


def with_tower(media: Any, prefill_at: Any, weights: Any, text: Any, options: Any, seq: int,
                dtype: str, image_prefill: Any = None, forward: Any = None) -> tuple[Any, dict[str, Any], str]:
    """(the peak curve with the tower's moment in it, settings["media"], the note). The tower runs before the
    prefill, with the weights resident; its moment is the weights and the tower's and projector's measured forward
    peak, linear in the batch (each image or window runs the same layers), and for images the language model's input
    embeddings over the whole context (transformers' forward makes them before it runs the tower). The prefill's:
    weights, KV cache and workspace over text + image tokens, as for text, and what the forward keeps of the images
    through it (media.held_through_prefill, measured); for audio the encoder's output, which the decoder reads
    through generation (its cross-attention K and V are in the cache besides). Images read by cross-attention
    (`image_prefill`, Llama-3.2-Vision's measured prefill): the tower runs before the language model embeds the
    text, beside the inputs given for it, the token ids and the int64 cross-attention mask (8 B a token, and 8 B a
    token a tile). Images made tokens (`forward`, towers.ImageForward): the moment is measured over the forward
    from its start to the language model's call, which holds the integer inputs given (token ids, attention mask,
    each family's own) and the input embeddings beside the tower's run, and then merges the image features into a
    new copy of the embeddings and builds the language model's masks."""
    size = itemsize(dtype)
    audio = media.kind == "audio"
    # images read by cross-attention (Llama-3.2-Vision): the forward runs the tower before the language model
    # embeds the text, and the cross-attention layers cache the vision tokens (options.encoder_seq a sequence)
    cross = image_prefill is not None
    per_token = 0 if audio else (dim(text, "hidden") or 0) * size  # the input embeddings, a token
    if cross:  # the token ids and the cross-attention mask given (text tokens × images × tiles), int64
        per_token = 8 * (1 + image_prefill.images * image_prefill.tiles)
    given = forward.given_per_token if forward is not None else 0  # the integer inputs given, a token
    states = config_int(text, "max_source_positions") or 0
    # what the input holds through the prefill, a sequence: Whisper's encoder output; the images' pixel values, the
    # tower's returned output and the projected features (measured: towers.held_into_prefill)
    held_each = states * (config_int(text, "d_model") or 0) * size if audio else 0
    resident = weights.bytes + weights.buffer_bytes

    # the tower's moment is measured in the whole forward (image_prefill.tower; forward.before_prefill up to the
    # language model's call): any bytes beyond the inputs given, the embeddings and the tower's own peak (the merge's
    # copy of the embeddings and the masks, where they bind) move the curve, exact at the asked point
    shift = 0
    if cross:
        shift = image_prefill.tower - options.batch * seq * per_token - media.forward_peak
    elif forward is not None:
        shift = forward.before_prefill - options.batch * seq * (per_token + given) - media.forward_peak

    # Gemma-3 (dense masks built before the call): the rest is the masks' construction, their B×S×S temporaries,
    # which grow as batch × S² (approximate away from the asked point)
    square = forward is not None and bool(forward.masks)

    def tower_at(batch: int, length: int) -> int:  # the rest measured before the call is each sequence's
        rest = shift * batch // options.batch if forward is not None else shift
        if square:
            rest = shift * batch * length * length // (options.batch * seq * seq)
        return (resident + batch * length * (per_token + given) + media.forward_peak * batch // options.batch
                + rest)

    def held_at(batch: int, length: int) -> int:  # linear in the batch (the image-token mask, a byte a token, at
        # the asked S); cross-attention's: the images' own part linear in the batch, the masks' in batch × length
        if cross:
            return (image_prefill.held_fixed * batch // options.batch
                    + batch * length * image_prefill.held_per_token)
        return batch * held_each if audio else media.held_through_prefill * batch // options.batch

    def mask_at(batch: int, length: int) -> int:
        """Cross-attention's: building the mask over text × vision tokens, after the tower and before the prefill,
        beside the images' own part (linear in the batch) and the mask's temporaries (in batch × length)."""
        if not cross:
            return 0
        fixed = image_prefill.held_fixed
        grows = image_prefill.mask - fixed
        return resident + fixed * batch // options.batch + grows * batch * length // (options.batch * seq)

    def peak_at(batch: int, length: int) -> int:
        return max(prefill_at(batch, length) + held_at(batch, length), tower_at(batch, length),
                   mask_at(batch, length))

    tower, prefill = tower_at(options.batch, seq), prefill_at(options.batch, seq) + held_at(options.batch, seq)
    mask = mask_at(options.batch, seq)
    part = "audio encoder" if audio else "vision tower"
    # the first of equal moments binds: the prefill's
    binds = max([(prefill, "prefill"), (tower, part), (mask, "cross-attention mask")], key=lambda m: m[0])[1]
    embeddings, held = options.batch * seq * per_token, held_at(options.batch, seq)
    inputs = options.batch * seq * given  # the integer inputs given (images made tokens)
    settings = {"kind": media.kind, "input": media.input_words, "per_sequence": media.per_sequence,
                "image_tokens": media.tokens, "text_seq": seq - media.tokens, "tokens_from": media.tokens_words,
                "tower_forward_peak": media.forward_peak, "embeddings": 0 if cross else embeddings,
                "encoder_output": held if audio else 0, "image_features_held": 0 if audio else held,
                "tower_moment": tower, "prefill_moment": prefill, "binds": binds,
                "vision_tokens": options.encoder_seq if cross else 0,
                "text_inputs": embeddings if cross else inputs,
                "text_inputs_given": list(forward.given) if forward is not None else
                ["input_ids", "cross_attention_mask"] if cross else [],
                "tower_rest": shift if forward is not None else 0,
                "mask_moment": mask if cross else None,
                # the language model's dense attention masks, built before its call and alive through the prefill
                "attention_masks": forward.mask_bytes if forward is not None else 0,
                "parts": [[line.part, line.path, line.class_name] for line in media.lines]}
    parts = " and ".join(f"{line.part} {line.path} ({line.class_name})" for line in media.lines)
    measured = (f"the forward peak, {media.forward_peak:,} B (the largest bytes live at once in {dtype}, the "
                "input and every intermediate, weights not: measured on fake tensors)")
    if audio:
        note = (f"audio input: each sequence holds {media.input_words}; each window is a sequence of its own, "
                f"{options.batch:,} in all, its decoder over {seq:,} tokens cross-attending to the window's "
                f"{states:,} encoder states (the cross-attention KV cache). The {parts} runs first: "
                f"{measured}, with the weights, is its moment, {tower:,} B; the prefill's, {prefill:,} B, holds the "
                f"encoder's output ({held:,} B) beside the KV cache and workspace; the peak is the larger, the "
                f"{binds}'s (fits: both linear in the batch)")
    elif cross:
        note = (f"image input: each sequence holds {media.input_words}; {media.tokens_words}. Every image is "
                f"{image_prefill.tiles} tiles (max_num_tiles) whatever its size: transformers' MllamaImageProcessor "
                "pads each to max_image_tiles zero tiles (float32 pixel values), which the vision model runs and the "
                "cross-attention layers cache, masked. The self-attention "
                f"layers' KV cache and the prefill are over the "
                f"{seq:,} text tokens, the cross-attention layers' cache over the {options.encoder_seq:,} vision "
                f"tokens. The {parts} run first in the forward, before the language model embeds the text: "
                f"{measured}, with the weights and the token ids and cross-attention mask given ({embeddings:,} B, "
                f"8 B a token × (1 + {image_prefill.images * image_prefill.tiles} tiles)) is the tower's moment, "
                f"{tower:,} B. Then the forward builds the cross-attention mask over text × vision tokens (int64, "
                f"float32 and bool temporaries of {seq:,} × {options.encoder_seq:,} a sequence): the weights and the "
                f"largest bytes live then, measured, are its moment, {mask:,} B. The prefill's, {prefill:,} B, is "
                f"the weights and the measured prefill, which holds what the forward keeps of the images, {held:,} B "
                "(the pixel values, the tile and cross-attention masks given, the vision model's output, which "
                "transformers returns with the logits, the projected tiles and the float cross-attention mask it "
                "builds over text × vision tokens: measured at the language model's call against a text input), "
                f"the KV cache and the workspace; the peak is the largest, the {binds}'s (fits: the tower's peak "
                "linear in the batch; the mask's and what the images hold, their own part linear in the batch and "
                "the rest in batch × text tokens)")
    else:
        note = (f"image input: each sequence holds {media.input_words}, {media.tokens:,} image tokens "
                f"({media.tokens_words}): the KV cache and prefill workspace are over {seq - media.tokens:,} text + "
                f"{media.tokens:,} image tokens = {seq:,}. The {parts} run first: {measured}. The tower's moment, "
                f"{tower:,} B, is the weights and the largest bytes live from the forward's start to the language "
                f"model's call, measured on the class's own forward (fake tensors, pixel values in {dtype}): the "
                f"integer inputs given ({', '.join(forward.given)}: {inputs:,} B, {given} B a token), the language "
                f"model's input embeddings over the {seq:,} tokens ({embeddings:,} B, made before the tower runs), "
                f"the tower's run and "
                + (f"{shift:,} B more (the image features merged into a copy of the embeddings, and the language "
                   "model's masks, where they bind" + ("; in the fits batch × S², the masks' construction, "
                                                       "approximate" if square else "") + ")"
                   if shift else "nothing more (the merge into the embeddings and the masks built after it stay "
                   "below)")
                + f"; the prefill's, {prefill:,} B, holds what the "
                f"forward keeps of the images through it, {held:,} B (the pixel values, the tower's returned output "
                "and the projected features, measured at the language model's call on fake tensors against a text "
                "input of the same length) beside the KV cache and workspace; the peak is the "
                f"larger, the {binds}'s (fits: the tower's peak linear in the batch, the inputs and embeddings in "
                f"batch × tokens, the rest linear in the batch at {seq:,} tokens: exact at the asked point)")
    return peak_at, settings, note
