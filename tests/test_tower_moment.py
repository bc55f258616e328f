"""Issue 31 §3, serving on images (`memory --images K`): the tower's moment of LLaVA, Gemma-3 and Qwen2.5-VL is the
largest bytes live from the real forward's start to its language model's call, which holds beside the tower's run
the integer inputs generate() hands the forward (token ids, attention mask; Gemma-3's token_type_ids, Qwen2.5-VL's
3-D rope positions) and the input embeddings, then merges the image features into a copy of the embeddings. Held
to torch's MemTracker over the real class's forward up to that call, on fake tensors of the same input, exact to the
byte, on small cuts (weights in bf16, the pixel values too, as the model cards cast them)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from paramscope.api import inspect_with_module
from paramscope.cost.memory.serving import MemoryOptions
from paramscope.cost.memory.serving_answer import estimate_memory
from paramscope.cost.towers.media import MediaInput

FAMILIES = Path(__file__).parent / "configs" / "families"
PREFILL_LLAVA, PREFILL_QWEN = 7_067_136, 1_273_632


class _Stop(Exception):
    pass


def _memtracker_until_language_model(module, inputs) -> int:
    """torch's MemTracker over the class's forward up to its language model's call, on fake tensors, the weights
    in bf16, no grad, the inputs (`inputs(constant)`, a dict) made under it: the peak less the weights."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from paramscope.cost.towers.prefill import _MatchingTokens
    from paramscope.cost.towers.trace import KeptConstants
    from paramscope.cost.traced.step import fake_mode, working_copy

    with fake_mode(True) as mode, _MatchingTokens(), KeptConstants(True):
        def constant(value):  # Qwen2.5-VL's grid and windows, whose values its tower reads
            return mode.fake_tensor_converter.from_real_tensor(mode, value, make_constant=True)

        model = working_copy(module, mode, None, weights_dtype="bfloat16")
        model.eval()

        def stop(*_):
            raise _Stop

        model.model.language_model.register_forward_pre_hook(stop)
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker, torch.no_grad():
            given = inputs(constant)
            try:
                model(**given)
            except _Stop:
                pass
            del given
        [peak] = tracker.get_tracker_snapshot("peak").values()
    return peak["Total"] - sum(v for k, v in peak.items() if getattr(k, "value", None) in ("Parameter", "Buffer"))


def _ids(batch: int, seq: int, image: int, tokens: int):
    ids = torch.zeros(batch, seq, dtype=torch.long)
    ids[:, :tokens] = image
    return ids


def _served(module, media: MediaInput, batch: int, text_seq: int):
    """The serving estimate on the built module (no engine check of the prefill: the tower's moment is asked)."""
    served = estimate_memory(module, MemoryOptions(dtype="bf16", batch=batch, seq=text_seq, media=media))
    media = served.settings["media"]
    return served, media, media["tower_moment"] - served.weights.bytes - served.weights.buffer_bytes


def _small_llava():
    """LLaVA cut: CLIP-L/14 at 336 px cut to 1 layer, a 1-layer language model of width 64."""
    config = json.loads((FAMILIES / "defaults--llava.json").read_text()) | {
        "architectures": ["LlavaForConditionalGeneration"]}
    config["vision_config"] |= {"num_hidden_layers": 1}
    config["text_config"] |= {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128,
                              "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 640}
    return config


def _small_qwen2_5_vl():
    """Qwen2.5-VL cut: its vision tower cut to 1 windowed and 1 full-attention block of width 64; a 1-layer
    language model of width 64, 2 heads of 32, whose 3-D rope sections are [4, 6, 6] (the 7B's [16, 24, 24] halve
    a head of 128, not of 32)."""
    config = json.loads((FAMILIES / "Qwen--Qwen2.5-VL-7B-Instruct.json").read_text())
    config |= {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
               "num_key_value_heads": 1, "vocab_size": 151700}
    for rope in ("rope_scaling", "rope_parameters"):
        if isinstance(config.get(rope), dict) and "mrope_section" in config[rope]:
            config[rope] = config[rope] | {"mrope_section": [4, 6, 6]}
    config["vision_config"] |= {"depth": 2, "fullatt_block_indexes": [1], "hidden_size": 64, "intermediate_size": 128,
                                "num_heads": 2, "out_hidden_size": 64}
    return config


def test_llava_tower_moment_holds_the_token_ids_and_attention_mask():
    """LLaVA (CLIP-L/14 at 336 px cut to 1 layer, a 2-layer language model of width 64), batch 2, one image (576
    tokens) and 64 text tokens a sequence: the tower's run binds, beside the token ids and attention mask (2 × 640 ×
    16 B) and the bf16 embeddings (2 × 640 × 64 × 2 B)."""
    _, module = inspect_with_module(_small_llava())
    served, media, moment = _served(module, MediaInput(images=1), 2, 64)
    assert (media["text_inputs"], media["text_inputs_given"]) == (2 * 640 * 16, ("input_ids", "attention_mask"))
    assert media["embeddings"] == 2 * 640 * 64 * 2
    assert (media["tower_rest"], media["binds"]) == (0, "vision tower")
    assert moment == media["text_inputs"] + media["embeddings"] + media["tower_forward_peak"] == 36_989_952
    assert moment == _memtracker_until_language_model(module, lambda _: {
        "input_ids": _ids(2, 640, module.config.image_token_id, 576),
        "attention_mask": torch.ones(2, 640, dtype=torch.long),
        "pixel_values": torch.zeros(2, 3, 336, 336, dtype=torch.bfloat16)})


def _small_gemma3():
    """Gemma-3 cut: SigLIP at 224 px in patches of 14, one layer of width 32, pooled to 16 tokens; a language model
    of 2 layers (sliding, then sliding: the default pattern's first two) of width 64, a sliding window of 16."""
    from transformers import Gemma3Config

    config = Gemma3Config().to_dict() | {"architectures": ["Gemma3ForConditionalGeneration"]}
    config["text_config"] |= {"num_hidden_layers": 2, "layer_types": config["text_config"]["layer_types"][:2],
                              "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
                              "num_key_value_heads": 1, "head_dim": 32, "sliding_window": 16}
    config["vision_config"] |= {"image_size": 224, "patch_size": 14, "hidden_size": 32, "intermediate_size": 64,
                                "num_hidden_layers": 1, "num_attention_heads": 2, "vision_use_head": False}
    config["mm_tokens_per_image"] = 16
    return config


def _memtracker_whole_forward(module, inputs) -> int:
    """torch's MemTracker over the class's whole forward on fake tensors (generate()'s prefill: its own cache, the
    last token's logits), the weights in bf16, no grad, the inputs made under it: the peak less the weights."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from paramscope.cost.towers.prefill import _MatchingTokens
    from paramscope.cost.towers.trace import KeptConstants
    from paramscope.cost.traced.step import fake_mode, working_copy

    with fake_mode(True) as mode, _MatchingTokens(), KeptConstants(True):
        def constant(value):  # Qwen2.5-VL's grid and windows, whose values its tower reads
            return mode.fake_tensor_converter.from_real_tensor(mode, value, make_constant=True)

        model = working_copy(module, mode, None, weights_dtype="bfloat16")
        model.eval()
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker, torch.no_grad():
            given = inputs(constant)
            out = model(**given, use_cache=True, logits_to_keep=1)
            del out, given
        [peak] = tracker.get_tracker_snapshot("peak").values()
    return peak["Total"] - sum(v for k, v in peak.items() if getattr(k, "value", None) in ("Parameter", "Buffer"))


def test_gemma3_prefill_on_images_holds_its_dense_attention_masks():
    """Gemma-3, batch 2, one image (16 tokens) and 64 text tokens a sequence (S = 80): token_type_ids make the image
    tokens attend both ways, so the forward builds a dense B×1×S×S bool mask for the full and one for the sliding
    layers (2 × 2 × 80 × 80 B) and hands both to the language model, alive to the forward's end. The answer's
    prefill moment, less the weights, is MemTracker's peak over the real class's whole forward, to the byte."""
    _, module = inspect_with_module(_small_gemma3())
    served, media, _ = _served(module, MediaInput(images=1), 2, 64)
    resident = served.weights.bytes + served.weights.buffer_bytes
    assert media["attention_masks"] == 2 * 2 * 80 * 80
    assert (served.peak, served.peak_phase, served.engine) == (media["prefill_moment"], "prefill", "traced")
    assert media["prefill_moment"] - resident == _memtracker_whole_forward(module, lambda _: {
        "input_ids": _ids(2, 80, module.config.image_token_id, 16),
        "attention_mask": torch.ones(2, 80, dtype=torch.long), "token_type_ids": _ids(2, 80, 1, 16),
        "pixel_values": torch.zeros(2, 3, 224, 224, dtype=torch.bfloat16)}) == 1_753_104
    assert any("attention masks over text + image tokens, B×S×S bool each: 2 × 2 × 80 × 80 = 25,600 B" in note
               for note in served.notes)


def test_gemma3_tower_moment_holds_its_token_type_ids():
    """Gemma-3 (SigLIP at 224 px in patches of 14, one layer of width 32, pooled to 16 tokens; a 2-layer language
    model of width 64), batch 2, one image and 24 text tokens a sequence: the token ids, attention mask and
    token_type_ids given (2 × 40 × 24 B) beside the embeddings and the tower's run."""
    _, module = inspect_with_module(_small_gemma3())
    served, media, moment = _served(module, MediaInput(images=1), 2, 24)
    given = ("input_ids", "attention_mask", "token_type_ids")
    assert (media["text_inputs"], media["text_inputs_given"]) == (2 * 40 * 24, given)
    assert media["embeddings"] == 2 * 40 * 64 * 2
    assert moment == media["text_inputs"] + media["embeddings"] + media["tower_forward_peak"] + media["tower_rest"]
    assert moment == _memtracker_until_language_model(module, lambda _: {
        "input_ids": _ids(2, 40, module.config.image_token_id, 16),
        "attention_mask": torch.ones(2, 40, dtype=torch.long), "token_type_ids": _ids(2, 40, 1, 16),
        "pixel_values": torch.zeros(2, 3, 224, 224, dtype=torch.bfloat16)})
    assert moment == 843_648


def test_qwen2_5_vl_tower_moment_holds_its_rope_positions():
    """Qwen2.5-VL (its vision tower cut to 1 windowed and 1 full-attention block of width 64; a 1-layer language
    model of width 64), batch 2, 32 image tokens (an 8×16-patch image) and 8 text tokens a sequence: the token ids,
    attention mask and the 3-D rope positions given (2 × 40 × 40 B), the grid and the tower's layouts as the
    forward takes them, beside the embeddings and the tower's run."""
    from paramscope.cost.towers.shapes import qwen_vision_layout

    _, module = inspect_with_module(_small_qwen2_5_vl())
    served, media, moment = _served(module, MediaInput(image_tokens=32), 2, 8)
    given = ("input_ids", "attention_mask", "position_ids")
    assert (media["text_inputs"], media["text_inputs_given"]) == (2 * 40 * 40, given)
    assert media["embeddings"] == 2 * 40 * 64 * 2
    assert moment == media["text_inputs"] + media["embeddings"] + media["tower_forward_peak"] + media["tower_rest"]
    grid, layouts, width = qwen_vision_layout(module.model.visual, 32, 2)  # real tensors, made constants under fake

    def inputs(constant):
        return {"input_ids": _ids(2, 40, module.config.image_token_id, 32),
                "attention_mask": torch.ones(2, 40, dtype=torch.long),
                "position_ids": torch.zeros(3, 2, 40, dtype=torch.long),
                "pixel_values": torch.zeros(2 * 8 * 16, width, dtype=torch.bfloat16), "image_grid_thw": constant(grid),
                **{name: constant(value) for name, value in layouts.items() if name != "position_ids"}}

    assert moment == _memtracker_until_language_model(module, inputs)
    assert moment == 1_242_308


def test_llava_prefill_on_images_is_measured_through_the_forward():
    """LLaVA cut, batch 2, one image (576 tokens) and 64 text tokens a sequence (S = 640): the answer's prefill
    moment, less the weights, is MemTracker's peak over the real class's whole forward (its own cache, the last
    token's logits), to the byte; the analytic prefill was 2,150,400 B short of it. No dense mask: sdpa runs causal."""
    config = _small_llava()  # a tower of width 32, so that the prefill binds
    config["vision_config"] |= {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}
    _, module = inspect_with_module(config)
    served, media, _ = _served(module, MediaInput(images=1), 2, 64)
    resident = served.weights.bytes + served.weights.buffer_bytes
    assert (served.engine, media["attention_masks"], served.peak_phase) == ("traced", 0, "prefill")
    assert media["prefill_moment"] - resident == _memtracker_whole_forward(module, lambda _: {
        "input_ids": _ids(2, 640, module.config.image_token_id, 576),
        "attention_mask": torch.ones(2, 640, dtype=torch.long),
        "pixel_values": torch.zeros(2, 3, 336, 336, dtype=torch.bfloat16)}) == PREFILL_LLAVA
    assert any("no dense attention mask" in note and "2,150,400 B short of it" in note for note in served.notes)


def test_qwen2_5_vl_prefill_on_images_is_measured_through_the_forward():
    """Qwen2.5-VL cut, batch 2, 32 image tokens and 8 text tokens a sequence (S = 40): the answer's prefill
    moment, less the weights, is MemTracker's peak over the real class's whole forward, to the byte (the analytic
    prefill was 5,088 B short); here the prefill binds."""
    from paramscope.cost.towers.shapes import qwen_vision_layout

    _, module = inspect_with_module(_small_qwen2_5_vl())
    served, media, _ = _served(module, MediaInput(image_tokens=32), 2, 8)
    resident = served.weights.bytes + served.weights.buffer_bytes
    assert (served.engine, served.peak, served.peak_phase) == ("traced", media["prefill_moment"], "prefill")
    grid, layouts, width = qwen_vision_layout(module.model.visual, 32, 2)

    def inputs(constant):
        return {"input_ids": _ids(2, 40, module.config.image_token_id, 32),
                "attention_mask": torch.ones(2, 40, dtype=torch.long),
                "position_ids": torch.zeros(3, 2, 40, dtype=torch.long),
                "pixel_values": torch.zeros(2 * 8 * 16, width, dtype=torch.bfloat16), "image_grid_thw": constant(grid),
                **{name: constant(value) for name, value in layouts.items() if name != "position_ids"}}

    assert media["prefill_moment"] - resident == _memtracker_whole_forward(module, inputs) == PREFILL_QWEN
    assert any("5,088 B short of it" in note for note in served.notes)
