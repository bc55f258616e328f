"""Issue 31 §3, serving Llama-3.2-Vision on images (`memory --images K`): the vision model and projector run first in
the forward (their moment: the weights, their forward peak and the text's inputs given), then the language model's
prefill, whose cross-attention layers cache K and V of the projected tiles and work over text × vision tokens
(measured on fake tensors: cost/memory/image_prefill.py). Held here to torch's MemTracker over the real class's
whole forward on the same fake input, on a cut of 2 text layers, one of them cross-attention, exact to the byte."""

from __future__ import annotations

from transformers import MllamaConfig

from paramscope.api import inspect_with_module
from paramscope.cost.memory.serving import MemoryOptions
from paramscope.cost.memory.serving_answer import estimate_memory
from paramscope.cost.towers.media import MediaInput


def _cut(cross: int) -> dict:
    """Llama-3.2-Vision cut: 2 text layers, layer `cross` the cross-attention one (GQA: 4 heads, 2 kv heads of 16);
    the vision model one local and one global layer, 4 tiles of 56 px in patches of 14 (16 patches + CLS a tile)."""
    config = MllamaConfig().to_dict() | {"architectures": ["MllamaForConditionalGeneration"]}
    config["text_config"] |= {"num_hidden_layers": 2, "cross_attention_layers": [cross], "hidden_size": 64,
                              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                              "vocab_size": 500, "pad_token_id": 0}
    config["vision_config"] |= {"num_hidden_layers": 1, "num_global_layers": 1, "hidden_size": 32,
                                "intermediate_size": 64, "attention_heads": 2, "image_size": 56, "patch_size": 14,
                                "intermediate_layers_indices": [0], "vision_output_dim": 64}
    return config


class _Stop(Exception):
    pass


def _memtracker(module, *, batch: int, seq: int, tower_only: bool = False, until_language_model: bool = False) -> int:
    """torch's MemTracker over the class's whole forward (a prefill: a DynamicCache, the last token's logits), up to
    its language model's call, or over the vision model and projector alone, on fake tensors of one image a
    sequence, the weights in bf16, no grad, the inputs made under it: the peak's bytes less the parameters' and
    buffers'."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from paramscope.cost.memory.image_prefill import image_inputs
    from paramscope.cost.traced.step import fake_mode, working_copy

    with fake_mode(True) as mode:
        model = working_copy(module, mode, None, weights_dtype="bfloat16")
        model.eval()
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker, torch.no_grad():
            inputs = image_inputs(module.config, batch=batch, context=seq, images=1, with_images=True)
            if tower_only:  # the vision model's inputs alone
                del inputs["input_ids"], inputs["cross_attention_mask"]
                states = model.model.vision_model(pixel_values=inputs["pixel_values"],
                                                  aspect_ratio_ids=inputs["aspect_ratio_ids"],
                                                  aspect_ratio_mask=inputs["aspect_ratio_mask"]).last_hidden_state
                out = model.model.multi_modal_projector(states)
                del states
            else:
                def stop(*_):
                    raise _Stop

                if until_language_model:
                    model.model.language_model.register_forward_pre_hook(stop)
                out = None
                try:
                    out = model(**inputs, use_cache=True, logits_to_keep=1)
                except _Stop:
                    pass
            del out, inputs
        [peak] = tracker.get_tracker_snapshot("peak").values()
    return peak["Total"] - sum(v for k, v in peak.items() if getattr(k, "value", None) in ("Parameter", "Buffer"))


def test_serving_llama_3_2_vision_on_an_image_equals_memtracker_over_the_whole_forward():
    """batch 2, one image a sequence (4 tiles × 17 = 68 vision tokens): the KV cache is the self-attention layer's
    over the text and the cross-attention layer's over the 68 vision tokens; the tower's forward peak equals
    MemTracker's on the vision model and projector alone. At 8 text tokens the tower's moment binds, at 600 the
    prefill's; either way the peak beyond the weights is MemTracker's over the real class's whole forward, and at 600
    the cross-attention mask's build (over 600 × 68 tokens a sequence, after the tower) is MemTracker's peak up to
    the language model's call."""
    config = _cut(1)
    _, module = inspect_with_module(config)
    per_token = 2 * 2 * 16 * 2  # K and V × 2 kv heads × head_dim 16 × bf16, a layer
    tower = _memtracker(module, batch=2, seq=8, tower_only=True)
    for seq, binds in ((8, "vision tower"), (600, "prefill")):
        served = estimate_memory(config, MemoryOptions(dtype="bf16", batch=2, seq=seq, media=MediaInput(images=1)),
                                 False)
        media = served.settings["media"]
        assert (served.settings["seq"], media["vision_tokens"], media["image_tokens"]) == (seq, 68, 0)
        assert served.kv_cache.bytes == 2 * per_token * (seq + 68)
        assert [(g.kind, g.layers, g.tokens) for g in served.kv_cache.groups] == [("full attention", 1, seq),
                                                                                 ("cross-attention", 1, 68)]
        assert media["tower_forward_peak"] == tower
        assert media["text_inputs"] == 2 * seq * 8 * (1 + 4)  # the token ids and the int64 cross-attention mask
        resident = served.weights.bytes + served.weights.buffer_bytes
        assert media["tower_moment"] == resident + media["text_inputs"] + tower
        assert media["prefill_moment"] == (resident + served.kv_cache.bytes + served.activations.bytes
                                           + media["image_features_held"])
        assert (served.peak_phase, media["binds"]) == (binds, binds)
        assert served.peak == max(media["tower_moment"], media["prefill_moment"], media["mask_moment"])
        assert served.peak - resident == _memtracker(module, batch=2, seq=seq)
    assert media["mask_moment"] - resident == _memtracker(module, batch=2, seq=600, until_language_model=True)


def test_what_the_images_hold_into_the_prefill_by_hand():
    """At the language model's call (batch 2, 600 text tokens, one image of 4 tiles a sequence) the forward holds,
    beyond a text input's: the fp32 pixel values, the aspect-ratio ids and tile mask, the int64 cross-attention
    mask given, the vision model's output (the last and one intermediate layer's states, 2 × 32 wide) and the
    projected tiles (64 wide) in bf16, and the bf16 cross-attention mask it builds (600 × 68) with its row mask;
    of which the masks' bytes grow with the text: 8 B a tile + 2 B a vision token + 2 B a token."""
    from paramscope.cost.memory.image_prefill import measure_prefill

    _, module = inspect_with_module(_cut(1))
    measured = measure_prefill(module, images=1, batch=2, context=600, dtype="bfloat16")
    pixels, ids, tiles, given = 2 * 4 * 3 * 56 * 56 * 4, 2 * 8, 2 * 4 * 8, 2 * 600 * 4 * 8
    vision, projected = 2 * 4 * 17 * 64 * 2, 2 * 68 * 64 * 2
    mask, rows = 2 * 600 * 68 * 2, 2 * 600 * 2
    assert (measured.images, measured.tiles, measured.vision_tokens) == (1, 4, 68)
    assert measured.held == pixels + ids + tiles + given + vision + projected + mask + rows == 539_952
    assert measured.held_per_token == 8 * 4 + 2 * 68 + 2
    assert measured.held_fixed == pixels + ids + tiles + vision + projected
