"""Issue 31 §3, images and audio: --image-tokens / --images / --audio-seconds add the vision or audio tower's FLOPs
(and its projector's) in lines of their own, traced on the tower alone, and the language model runs over the text
plus the tokens the projector produces. Each tower's count is held here to the transformer arithmetic written out
by hand (2mnk a matmul, 2·out·in·k a convolution, 4·T²·width for attention's scores and weighted sum), so the
trace is checked by an independent count, on cut towers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paramscope.api import inspect_with_module
from paramscope.cost.towers.families import media_flops
from paramscope.cost.towers.media import MediaInput
from paramscope.errors import OptionError

FAMILIES = Path(__file__).parent / "configs" / "families"


def _layer(tokens: int, width: int, inner: int, mlp_matmuls: int = 2) -> int:
    """One pre-LN vision block: q, k, v, o, the MLP's matmuls, attention over all its tokens."""
    return 4 * 2 * tokens * width * width + mlp_matmuls * 2 * tokens * width * inner + 4 * tokens * tokens * width


def _vision(config: dict, **changes) -> dict:
    config["vision_config"] = config["vision_config"] | changes
    return config


def _small_llava(vision_layers: int) -> dict:
    """LLaVA's CLIP-L/14 at 336 px cut to `vision_layers`, beside a small 2-layer language model."""
    config = _vision(json.loads((FAMILIES / "defaults--llava.json").read_text()), num_hidden_layers=vision_layers)
    config["text_config"] |= {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512,
                              "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1024,
                              "max_position_embeddings": 2048}
    return config


def test_llava_tower_and_projector_equal_the_arithmetic_cls_dropped():
    """CLIP at 336 px, patches of 14: 576 patches + CLS through 2 layers; the projector reads the 576 patches
    (vision_feature_select_strategy "default" drops CLS) and hands the language model 576 tokens an image."""
    config = _small_llava(2)
    _, module = inspect_with_module(config)
    vision, text = config["vision_config"], config["text_config"]
    h, inner, text_h = vision["hidden_size"], vision["intermediate_size"], text["hidden_size"]
    patches = (336 // 14) ** 2
    media = media_flops(module, MediaInput(images=2), batch=3, seq=16, training=False)
    images = 6
    tower = images * (2 * patches * 3 * 14 * 14 * h + 2 * _layer(patches + 1, h, inner))
    projector = images * (2 * patches * h * text_h + 2 * patches * text_h * text_h)
    assert [(line.part, line.path, line.class_name, line.forward) for line in media.lines] == [
        ("vision tower", "vision_tower", "CLIPVisionModel", tower),
        ("projector", "multi_modal_projector", "LlavaMultiModalProjector", projector)]
    assert (media.tokens, media.per_sequence) == (2 * 576, 2)
    assert (tower, projector) == (194_774_089_728, 2_264_924_160)


def test_gemma3_tower_pools_to_mm_tokens_per_image():
    """SigLIP at 896 px, patches of 14: 64×64 = 4,096 patches, no CLS; the projector average-pools them to 16×16 =
    mm_tokens_per_image 256 and projects those (its one matmul, not an nn.Linear)."""
    from transformers import Gemma3Config

    config = Gemma3Config().to_dict() | {"architectures": ["Gemma3ForConditionalGeneration"]}
    config["text_config"] |= {"num_hidden_layers": 2, "layer_types": config["text_config"]["layer_types"][:2]}
    config = _vision(config, image_size=896, patch_size=14, hidden_size=1152, intermediate_size=4304,
                     num_hidden_layers=2, num_attention_heads=16, vision_use_head=False)
    _, module = inspect_with_module(config)
    h, inner = 1152, 4304
    patches = 64 * 64
    media = media_flops(module, MediaInput(image_tokens=512), batch=1, seq=16, training=False)
    tower = 2 * (2 * patches * 3 * 14 * 14 * h + 2 * _layer(patches, h, inner))
    projector = 2 * (2 * 256 * h * config["text_config"]["hidden_size"])
    assert [line.forward for line in media.lines] == [tower, projector]
    assert (media.tokens, media.per_sequence) == (512, 2)
    with pytest.raises(OptionError, match=r"image_tokens 300 is not a whole number of images: each image is 256 "):
        media_flops(module, MediaInput(image_tokens=300), batch=1, seq=16, training=False)


def test_qwen2_5_vl_windowed_tower_and_merger_equal_the_arithmetic():
    """32 tokens: an 8×16-patch image (as square as 32 merged 2×2 blocks allow), windows of 112 px = 8 patches: two
    windows of 64 patches in the windowed blocks, all 128 patches in the full-attention block; the merger reads
    4 patches' features a token."""
    config = json.loads((FAMILIES / "Qwen--Qwen2.5-VL-7B-Instruct.json").read_text())
    config["num_hidden_layers"] = 2
    config = _vision(config, depth=2, fullatt_block_indexes=[1])
    _, module = inspect_with_module(config)
    vision = config["vision_config"]
    h, inner, out = vision["hidden_size"], vision["intermediate_size"], vision["out_hidden_size"]
    media = media_flops(module, MediaInput(image_tokens=32), batch=1, seq=16, training=False)
    patches = 8 * 16
    embed = 2 * patches * 3 * 2 * 14 * 14 * h  # Conv3d over 2 frames × 14 × 14 pixels × 3 channels
    matmuls = 4 * 2 * patches * h * h + 3 * 2 * patches * h * inner  # qkv, proj; gate, up, down
    attention = 2 * 4 * 64 * 64 * h + 4 * patches * patches * h
    merger = 2 * (patches // 4) * (4 * h) * (4 * h) + 2 * (patches // 4) * (4 * h) * out
    assert [line.forward for line in media.lines] == [embed + 2 * matmuls + attention, merger]
    assert media.tokens == 32
    with pytest.raises(OptionError, match="reads images at any size, so images has no size to count"):
        media_flops(module, MediaInput(images=1), batch=1, seq=16, training=False)


def test_whisper_encoder_on_30_seconds_equals_the_arithmetic():
    """30 s of audio: 3,000 mel frames through the two convolutions (kernel 3, the second of stride 2) and the
    encoder's layers over 1,500 positions; 45 s is two windows."""
    config = json.loads((FAMILIES / "openai--whisper-small.json").read_text()) | {"encoder_layers": 1,
                                                                                  "decoder_layers": 1,
                                                                                  "num_hidden_layers": 1}
    _, module = inspect_with_module(config)
    d, ffn, mels = config["d_model"], config["encoder_ffn_dim"], config["num_mel_bins"]
    window = 2 * 3000 * mels * d * 3 + 2 * 1500 * d * d * 3 + _layer(1500, d, ffn)
    media = media_flops(module, MediaInput(audio_seconds=30), batch=1, seq=8, training=False)
    assert [(line.path, line.forward) for line in media.lines] == [("model.encoder", window)]
    longer = media_flops(module, MediaInput(audio_seconds=45), batch=1, seq=8, training=False)
    assert (longer.per_sequence, longer.lines[0].forward) == (2, 2 * window)
    with pytest.raises(OptionError, match="reads audio: give audio_seconds"):
        media_flops(module, MediaInput(images=1), batch=1, seq=8, training=False)


def test_the_language_model_runs_over_text_and_image_tokens(cache):
    """The step is the language model's count at text + image tokens plus the towers' lines; with --trace the
    analytic count (tower lines included) equals FlopCounterMode's on the language model at 64 + 576 tokens plus
    the same lines, forward and backward. Training adds the towers' backward."""
    from paramscope.cost.flops.estimate import FlopOptions, estimate_flops

    config = _small_llava(2)
    with_image = estimate_flops(config, FlopOptions(seq=64, training=True, trace=True, media=MediaInput(images=1)))
    media = with_image.media
    assert with_image.seq == 640 and with_image.engine == "traced"
    assert "check: the analytic count equals FlopCounterMode's on fake tensors, term for term" in with_image.notes
    lm = {role: flops for role, flops in with_image.by_role.items() if not role.startswith("vision.")}
    assert with_image.forward == sum(lm.values()) + media.forward
    assert with_image.by_role["vision.tower"] == media.lines[0].forward
    assert with_image.backward == 2 * sum(lm.values()) + media.backward  # the language model's: 2 × its forward
    # the projector reads hidden states -2: the last layer runs forward, but no gradient reaches it; the first layer
    # takes 2 × its forward (eager attention), the patch convolution its weight's gradient only (pixels need none)
    vision = config["vision_config"]
    h, inner = vision["hidden_size"], vision["intermediate_size"]
    conv = 2 * 576 * 3 * 14 * 14 * h
    assert media.lines[0].forward == conv + 2 * _layer(577, h, inner)
    assert media.lines[0].backward == conv + 2 * _layer(577, h, inner)
    assert media.lines[1].backward == 2 * media.lines[1].forward
    assert not any(n.startswith("a text input runs the language model only") for n in with_image.notes)


def test_the_cli_takes_the_flags_and_writes_json(cache, capsys):
    from paramscope.cli import main

    path = FAMILIES / "openai--whisper-small.json"
    assert main(["flops", str(path), "--audio-seconds", "30", "--seq", "32", "--json"]) == 0
    flops = json.loads(capsys.readouterr().out)["flops"]
    assert flops["media"]["kind"] == "audio" and flops["engine"] == "traced"
    assert [part["module"] for part in flops["media"]["parts"]] == ["model.encoder"]
    assert flops["by_role"]["audio.tower"] == flops["media"]["forward"]
    assert flops["settings"]["audio_seconds"] == 30
    for bad, words in ((["--images", "0"], "--images must be between 1 and 1,024"),
                       (["--images", "1", "--image-tokens", "5"], "give one of --image-tokens and --images"),
                       (["--audio-seconds", "nan"], "--audio-seconds must be a positive number")):
        assert main(["flops", str(path), *bad]) == 2
        assert words in capsys.readouterr().err
    assert main(["flops", "gpt2", "--images", "1"]) == 2
    assert ("image and audio inputs are counted for Gemma-3, LLaVA, Qwen2.5-VL, Llama-3.2-Vision and Whisper"
            in capsys.readouterr().err)


def test_the_tower_trace_is_kept_and_read_back_without_a_build(cache, monkeypatch):
    """The second ask of the same config and input reads the kept trace (and the language model's cost facts):
    no build, no trace; a tampered entry is never read."""
    from paramscope.cost.towers import families
    from paramscope.cost.towers.cache import find_media
    from paramscope.cost.flops.estimate import FlopOptions, estimate_flops

    config = json.loads((FAMILIES / "openai--whisper-small.json").read_text()) | {
        "encoder_layers": 1, "decoder_layers": 1, "num_hidden_layers": 1}
    first = estimate_flops(config, FlopOptions(seq=16, media=MediaInput(audio_seconds=10)))
    [entry] = cache.rglob("*.towers.json")

    def no_trace(*args, **kwargs):
        raise AssertionError("traced again")

    monkeypatch.setattr(families, "media_flops", no_trace)
    again = estimate_flops(config, FlopOptions(seq=16, media=MediaInput(audio_seconds=10)))
    assert (again.forward, again.by_role) == (first.forward, first.by_role)
    assert again.notes[-1] == "the tower's count is kept from an earlier FlopCounterMode trace of this config and input"
    data = json.loads(entry.read_text())
    for broken in ({"lines": [["vision tower", "x", "X", -1, None]]}, {"kind": "smell"}, {"notes": ["\x1b[2J"]}):
        entry.write_text(json.dumps(data | {"media": data["media"] | broken}))
        assert find_media("WhisperForConditionalGeneration", data["key"]) is None


def test_llama_3_2_vision_reads_its_tiles_by_cross_attention():
    """Llama-3.2-Vision: an image is 4 tiles of 448 px, 32×32 patches + CLS = 1,025 states a tile; the
    vision model, the projector and the language model (whose cross-attention layers now run) from one trace. The
    projector is one nn.Linear from the 5 concatenated hidden states; the language model's cross-attention layer
    projects the 4 × 1,025 states to keys and values (the tower runs each tile padded to 1,032, and drops the pad)."""
    from transformers import MllamaConfig

    config = MllamaConfig().to_dict() | {"architectures": ["MllamaForConditionalGeneration"]}
    config["text_config"] |= {"num_hidden_layers": 2, "cross_attention_layers": [1]}
    config["vision_config"] |= {"num_hidden_layers": 2, "num_global_layers": 1,
                                "intermediate_layers_indices": [0, 0, 1, 1, 1]}
    _, module = inspect_with_module(config)
    media = media_flops(module, MediaInput(images=1), batch=1, seq=16, training=False)
    text = config["text_config"]
    hidden = text["hidden_size"]
    kv = text["num_key_value_heads"] * hidden // text["num_attention_heads"]
    states = 4 * 1025
    assert media.lines[1].forward == 2 * states * 7680 * hidden
    own = dict(media.decoder_by_module)
    assert own["model.language_model.layers.1.cross_attn.k_proj"] == 2 * states * hidden * kv
    assert own["lm_head"] == 2 * 16 * hidden * text["vocab_size"]
    with pytest.raises(OptionError, match=r"each image is 4,100 tokens"):
        media_flops(module, MediaInput(image_tokens=5), batch=1, seq=16, training=False)


def test_training_memory_on_an_image_holds_the_towers_and_their_saved_activations(cache):
    """memory --training --images 1: the towers train (gradients and AdamW state for them), the language model's
    activations are over text + image tokens, and what the towers' forward saves is held through the forward and
    the language model's backward. The forward moment is the text-only one at the same length plus exactly the
    towers' optimizer state and their saved activations."""
    from paramscope.cost.memory.training import TrainingOptions, estimate_training

    config = _small_llava(2)
    image = estimate_training(config, TrainingOptions(seq=64, media=MediaInput(images=1), fits=False))
    text = estimate_training(config, TrainingOptions(seq=640, fits=False))
    held = [p for p in image.report.params if p.name.startswith(("vision_tower.", "multi_modal_projector."))]
    towers = sum(p.numel for p in held)
    assert image.training.states.trainable == image.report.total
    assert image.settings["seq"] == 640
    [saved] = [n for n in image.notes if n.startswith("image input: ")]
    tower_saved = int(saved.split("what their forward saves for backward, ")[1].split(" B")[0].replace(",", ""))
    phases = {p.phase: p.bytes for p in image.training.phases}
    text_phases = {p.phase: p.bytes for p in text.training.phases}
    # AdamW's two fp32 moments and a 4-byte step count a tensor
    assert phases["forward"] == text_phases["forward"] + 2 * 4 * towers + 4 * len(held) + tower_saved
    assert phases["optimizer step"] == text_phases["optimizer step"] + 3 * 4 * towers + 4 * len(held)
    assert image.activations.bytes == text.activations.bytes + tower_saved


def test_what_the_tower_saves_grows_by_a_layer_and_less_for_a_layer_nothing_reads():
    """What the towers' forward saves and still holds at its end: each layer adds the same bytes; LLaVA reading
    hidden states -2 holds less than reading -1 (the last layer's output feeds nothing the backward needs)."""
    measured = {}
    for layers, read in ((1, -1), (2, -1), (3, -1), (2, -2)):
        config = _small_llava(layers) | {"vision_feature_layer": read}
        _, module = inspect_with_module(config)
        media = media_flops(module, MediaInput(images=1), batch=1, seq=16, training=True, precision="fp32")
        measured[layers, read] = media.saved_bytes
    assert measured[2, -1] - measured[1, -1] == measured[3, -1] - measured[2, -1] > 0
    assert measured[1, -1] < measured[2, -2] < measured[2, -1]


def test_a_frozen_tower_takes_no_backward_and_its_projector_no_input_gradient(cache):
    """--freeze 'vision_tower.*' (LLaVA's recipe): the tower runs forward only; the projector's first matmul takes
    its weight's gradient alone (nothing before it trains), its second both."""
    from paramscope.cost.flops.estimate import FlopOptions, estimate_flops

    config = _small_llava(1)
    counted = estimate_flops(config, FlopOptions(seq=32, training=True, freeze=("vision_tower.*",),
                                                 media=MediaInput(images=1), trace=True))
    tower, projector = counted.media.lines
    vision, text = config["vision_config"], config["text_config"]
    first, second = 2 * 576 * vision["hidden_size"] * text["hidden_size"], 2 * 576 * text["hidden_size"] ** 2
    assert projector.forward == first + second
    assert (tower.backward, projector.backward) == (0, first + 2 * second)


def _tower_peak_by_memtracker(module, images: int) -> int:
    """torch's MemTracker on the same fake input: LLaVA's get_image_features on `images` zero images at 336 px, the
    weights and the pixel values in bf16 (as the model cards cast the processor's output), no grad; the peak's bytes
    less the parameters' and buffers'."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from paramscope.cost.traced.step import fake_mode, working_copy

    with fake_mode(True) as mode:
        model = working_copy(module, mode, None, weights_dtype="bfloat16")
        model.eval()
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker, torch.no_grad():
            out = model.get_image_features(torch.zeros(images, 3, 336, 336, dtype=torch.bfloat16),
                                           vision_feature_layer=-2, vision_feature_select_strategy="default")
            del out
        [peak] = tracker.get_tracker_snapshot("peak").values()
    return peak["Total"] - sum(v for k, v in peak.items() if getattr(k, "value", None) in ("Parameter", "Buffer"))


def test_serving_memory_on_an_image_takes_the_larger_of_the_tower_and_the_prefill():
    """memory --images 1 (serving): the KV cache and the prefill over S + 576 image tokens, exactly the text-only
    answer at that length; the tower's moment is the weights, the token ids and attention mask given and the input
    embeddings over S + 576 tokens, and the tower's forward peak, which equals MemTracker's on the same fake input;
    the peak is the larger moment (here the tower's: a small language model beside CLIP-L)."""
    from paramscope.cost.memory.serving import MemoryOptions
    from paramscope.cost.memory.serving_answer import estimate_memory

    config = _small_llava(2) | {"architectures": ["LlavaForConditionalGeneration"]}
    text = config["text_config"]
    _, module = inspect_with_module(config)
    image = estimate_memory(config, MemoryOptions(dtype="bf16", batch=2, seq=64, media=MediaInput(images=1)), False)
    plain = estimate_memory(config, MemoryOptions(dtype="bf16", batch=2, seq=64 + 576), False)
    media = image.settings["media"]
    assert image.settings["seq"] == 640 and (media["text_seq"], media["image_tokens"]) == (64, 576)
    # K and V, a layer, a key/value head: head_dim × 640 tokens × batch 2 × 2 B (bf16)
    kv = 2 * text["num_hidden_layers"] * text["num_key_value_heads"] * text["head_dim"] * 640 * 2 * 2
    assert image.kv_cache.bytes == plain.kv_cache.bytes == kv
    # measured through the real forward's end: the token ids and attention mask given stay live through it too
    assert media["prefill_moment"] == plain.peak + media["image_features_held"] + media["text_inputs"]
    assert media["tower_forward_peak"] == _tower_peak_by_memtracker(module, 2) == 2 * _tower_peak_by_memtracker(
        module, 1)
    embeddings = 2 * 640 * text["hidden_size"] * 2
    resident = image.weights.bytes + image.weights.buffer_bytes
    assert media["text_inputs"] == 2 * 640 * 16 and media["tower_rest"] == 0
    assert media["tower_moment"] == resident + media["text_inputs"] + embeddings + media["tower_forward_peak"]
    assert (image.peak, image.peak_phase) == (media["tower_moment"], "vision tower") and image.peak > plain.peak


def _forward_peak_by_memtracker(module, images: bool) -> int:
    """torch's MemTracker over the whole class's forward (a prefill: the tower, the merge and the language model)
    on fake tensors, the weights in bf16, no grad, the inputs made under it (the pixel values are on the device
    through the prefill): the peak's bytes less the parameters' and buffers'. 2 sequences of 2,048 tokens, the
    first 576 of each the image token (with `images`: an image each, at 336 px, in bf16)."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from paramscope.cost.towers.prefill import _MatchingTokens
    from paramscope.cost.traced.step import fake_mode, working_copy

    with fake_mode(True) as mode, _MatchingTokens():  # the forward's check that image tokens and features match
        model = working_copy(module, mode, "eager", weights_dtype="bfloat16")
        model.eval()
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker, torch.no_grad():
            ids = torch.zeros(2, 2048, dtype=torch.long)
            ids[:, :576] = module.config.image_token_id
            pixels = {"pixel_values": torch.zeros(2, 3, 336, 336, dtype=torch.bfloat16)} if images else {}
            out = model(input_ids=ids, **pixels, use_cache=False)
            del out
        [peak] = tracker.get_tracker_snapshot("peak").values()
    return peak["Total"] - sum(v for k, v in peak.items() if getattr(k, "value", None) in ("Parameter", "Buffer"))


def test_the_prefill_holds_what_the_forward_keeps_of_the_images():
    """memory --images 1 --seq 1472 (serving, batch 2): LLaVA's forward keeps through its language model's prefill
    the pixel values, get_image_features' whole output (the cut tower's last hidden state and hidden_states[-2], the
    embeddings' here, which the projector reads), the projected features and their torch.cat copy, and the
    image-token mask. MemTracker's
    peak over the real class's prefill (the language model's: eager scores over 2,048 tokens) with the images is the
    same forward's without them (the same tokens) plus exactly that."""
    from paramscope.cost.memory.serving import MemoryOptions
    from paramscope.cost.memory.serving_answer import estimate_memory

    config = _small_llava(1) | {"architectures": ["LlavaForConditionalGeneration"]}
    _, module = inspect_with_module(config)
    image = estimate_memory(config, MemoryOptions(dtype="bf16", batch=2, seq=1472, media=MediaInput(images=1)), False)
    plain = estimate_memory(config, MemoryOptions(dtype="bf16", batch=2, seq=1472 + 576), False)
    media = image.settings["media"]
    pixels = 2 * 3 * 336 * 336 * 2
    hidden_states = 2 * (2 * 577 * 1024 * 2)
    projected = 2 * (2 * 576 * config["text_config"]["hidden_size"] * 2)
    mask = 2 * 2048
    assert media["image_features_held"] == pixels + hidden_states + projected + mask == 7_265_280
    # measured through the real forward's end: the token ids and attention mask given stay live through it too
    assert media["prefill_moment"] == plain.peak + media["image_features_held"] + media["text_inputs"]
    with_images, text = _forward_peak_by_memtracker(module, True), _forward_peak_by_memtracker(module, False)
    assert with_images - text == media["image_features_held"]


def _tiny_mllama():
    """Llama-3.2-Vision cut: 5 text layers, 2 of them (1, 3) cross-attention; tiles of 56 px in patches of 14."""
    import torch
    from transformers import MllamaConfig, MllamaForConditionalGeneration

    config = MllamaConfig()
    for name, value in dict(num_hidden_layers=5, cross_attention_layers=[1, 3], hidden_size=64, intermediate_size=128,
                            num_attention_heads=4, num_key_value_heads=2, vocab_size=500, pad_token_id=0).items():
        setattr(config.text_config, name, value)
    for name, value in dict(num_hidden_layers=1, num_global_layers=1, hidden_size=32, intermediate_size=64,
                            attention_heads=2, image_size=56, patch_size=14, max_num_tiles=2,
                            intermediate_layers_indices=[0], vision_output_dim=64).items():
        setattr(config.vision_config, name, value)
    torch.manual_seed(0)
    return config, MllamaForConditionalGeneration(config).eval()


def _cache_bytes(out) -> int:
    import torch

    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    return sum(t.numel() * t.element_size() for layer in cache.layers
               for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if isinstance(t, torch.Tensor))


def test_llama_3_2_vision_cross_attention_layers_cache_the_tiles_not_the_text():
    """A text input skips Llama-3.2-Vision's cross-attention layers (no cache entry): the KV cache is the 3
    self-attention layers' over the text. With an image each cross-attention layer caches K and V of its tiles:
    2 tiles × (16 patches + the class token) = 34 vision tokens (the vision model's padding to a multiple of 8 sliced
    off). Both equal transformers' DynamicCache after a real forward of the cut."""
    import torch

    from paramscope.cost.memory.kv import kv_cache

    config, model = _tiny_mllama()
    ids = torch.full((2, 17), 5)
    with torch.no_grad():
        text = _cache_bytes(model(input_ids=ids, use_cache=True))
        image = _cache_bytes(model(input_ids=ids, pixel_values=torch.zeros(2, 1, 2, 3, 56, 56),
                                   aspect_ratio_ids=torch.ones(2, 1, dtype=torch.long),
                                   aspect_ratio_mask=torch.ones(2, 1, 2, dtype=torch.long),
                                   cross_attention_mask=torch.ones(2, 17, 1, 2, dtype=torch.long), use_cache=True))
    per_token = 2 * 2 * 16 * 4  # K and V × 2 kv heads × head_dim 16 × fp32, a layer
    plain = kv_cache(config, batch=2, seq=17, dtype="float32")
    assert plain.bytes == text == 3 * per_token * 17 * 2
    assert "the 2 cross-attention layers read the image tiles, not the text" in plain.notes[0]
    tiles = kv_cache(config, batch=2, seq=17, dtype="float32", encoder_seq=2 * (4 * 4 + 1))
    assert tiles.bytes == image == 3 * per_token * 17 * 2 + 2 * per_token * 34 * 2
    assert [(g.kind, g.layers, g.tokens) for g in tiles.groups] == [("full attention", 3, 17), ("cross-attention", 2, 34)]


def test_memory_cli_takes_images_for_serving_and_refuses_what_it_does_not_count(cache, capsys, tmp_path):
    from paramscope.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_small_llava(1) | {"architectures": ["LlavaForConditionalGeneration"]}))
    assert main(["memory", str(path), "--images", "1", "--seq", "32", "--dtype", "bf16", "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    media = memory["settings"]["media"]
    assert memory["settings"]["seq"] == 32 + 576 and memory["peak"]["phase"] == media["binds"] == "vision tower"
    assert memory["peak"]["bytes"] == max(media["tower_moment"], media["prefill_moment"])
    assert [part[0] for part in media["parts"]] == ["vision tower", "projector"]
    assert main(["memory", str(path), "--images", "1", "--trace"]) == 2
    assert "an image or audio input's serving memory is counted on one device, without --trace" in capsys.readouterr().err
    assert main(["memory", str(path), "--image-tokens", "100"]) == 2
    assert "--image-tokens 100 is not a whole number of images" in capsys.readouterr().err


def test_whisper_and_llama_3_2_vision_train_on_their_input(cache):
    """A training step on audio or images for the cross-attention families: every matmul's backward is 2 × its
    forward but the first convolution's (the mel frames or pixels take no gradient: its weight's alone) and
    Llama-3.2-Vision's tile mask (no gradient at all), and the language model's backward (the whole trace's less
    the tower's, traced alone) is 2 × its forward."""
    from transformers import MllamaConfig

    from paramscope.cost.flops.estimate import FlopOptions, estimate_flops

    config = json.loads((FAMILIES / "openai--whisper-small.json").read_text()) | {"encoder_layers": 1,
                                                                                  "decoder_layers": 1,
                                                                                  "num_hidden_layers": 1}
    counted = estimate_flops(config, FlopOptions(seq=8, training=True, media=MediaInput(audio_seconds=30)))
    media = counted.media
    [encoder] = media.lines
    conv1 = 2 * 3000 * config["num_mel_bins"] * config["d_model"] * 3
    decoder = dict(media.decoder_by_module)
    assert "(outside any module)" not in decoder  # the whole model's own count is Global's, not a module's
    assert encoder.backward == 2 * encoder.forward - conv1
    assert media.decoder_backward == 2 * sum(decoder.values())
    assert (counted.forward, counted.backward) == (encoder.forward + sum(decoder.values()),
                                                   encoder.backward + media.decoder_backward)
    config = MllamaConfig().to_dict() | {"architectures": ["MllamaForConditionalGeneration"]}
    config["text_config"] |= {"num_hidden_layers": 1, "cross_attention_layers": [0]}
    config["vision_config"] |= {"num_hidden_layers": 1, "num_global_layers": 1,
                                "intermediate_layers_indices": [0, 0, 0, 0, 0]}
    _, module = inspect_with_module(config)
    media = media_flops(module, MediaInput(images=1), batch=1, seq=16, training=True)
    tower, projector = media.lines
    vision = config["vision_config"]
    patches = 4 * (vision["image_size"] // vision["patch_size"]) ** 2  # 4 tiles
    conv = 2 * patches * 3 * vision["patch_size"] ** 2 * vision["hidden_size"]
    mask = 2 * (4 * 1032) ** 2  # the tiles' attention mask, an outer product (a matmul) of 4 × 1,032 padded states
    assert (tower.backward, projector.backward) == (2 * tower.forward - conv - 2 * mask, 2 * projector.forward)
    assert media.decoder_backward == 2 * sum(dict(media.decoder_by_module).values())


def _encoder_peak_by_memtracker(module, windows: int) -> int:
    """torch's MemTracker on Whisper's encoder alone over `windows` zero windows of 3,000 bf16 mel frames."""
    import torch

    from paramscope.cost.traced.step import fake_mode, make_tracker, working_copy

    with fake_mode(True) as mode:
        model = working_copy(module, mode, None, weights_dtype="bfloat16")
        model.eval()
        tracker = make_tracker(model, None)  # MemTracker, told that the frozen positions take no gradient hook
        with tracker, torch.no_grad():
            out = model.model.encoder(input_features=torch.zeros(windows, 80, 3000, dtype=torch.bfloat16))
            del out
        [peak] = tracker.get_tracker_snapshot("peak").values()
    return peak["Total"] - sum(v for k, v in peak.items() if getattr(k, "value", None) in ("Parameter", "Buffer"))


def test_serving_whisper_on_audio_holds_the_encoder_output_and_the_cross_attention_cache():
    """memory --audio-seconds 45 (serving Whisper): two 30 s windows, each a sequence; the encoder's forward peak
    equals MemTracker's on the same fake input, its output (2 × 1,500 × d_model) is held through the prefill beside
    the cache, whose cross-attention K and V hold the 1,500 encoder states a sequence."""
    from paramscope.cost.memory.serving import MemoryOptions
    from paramscope.cost.memory.serving_answer import estimate_memory

    config = json.loads((FAMILIES / "openai--whisper-small.json").read_text()) | {"encoder_layers": 1,
                                                                                  "decoder_layers": 1,
                                                                                  "num_hidden_layers": 1}
    _, module = inspect_with_module(config)
    audio = estimate_memory(config, MemoryOptions(dtype="bf16", seq=32, media=MediaInput(audio_seconds=45)), False)
    media, d = audio.settings["media"], config["d_model"]
    assert audio.settings["batch"] == 2 and media["per_sequence"] == 2
    self_kv = 2 * d * 2 * 32 * 2  # K and V, all heads = d_model, bf16, 32 tokens, 2 sequences; one layer
    cross_kv = 2 * d * 2 * 1500 * 2
    assert audio.kv_cache.bytes == self_kv + cross_kv
    assert media["encoder_output"] == 2 * 1500 * d * 2
    assert media["tower_forward_peak"] == _encoder_peak_by_memtracker(module, 2)
    resident = audio.weights.bytes + audio.weights.buffer_bytes
    assert media["tower_moment"] == resident + media["tower_forward_peak"]
    assert media["prefill_moment"] == resident + audio.kv_cache.bytes + audio.activations.bytes + 2 * 1500 * d * 2
    assert audio.peak == max(media["tower_moment"], media["prefill_moment"])
    assert audio.peak_phase == media["binds"]
