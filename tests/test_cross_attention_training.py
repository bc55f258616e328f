"""Issue 31 §3, training on audio or images for the families that read their tower by cross-attention: Whisper
(`memory --training --audio-seconds T`, 30 s by default) and Llama-3.2-Vision (`--training --images K`). The step is
traced on the real input (mel frames, or tiles with their aspect-ratio and cross-attention masks) on fake tensors;
each answer is held, moment by moment and category by category, to torch's MemTracker over the same step of the
same class on real CPU tensors, and the tower's line to what MemTracker sees its forward leave allocated."""

from __future__ import annotations

import json

from paramscope.cost.towers.media import MediaInput
from paramscope.cost.traced.media_step import step_media
from paramscope.cost.traced.step import StepSettings, trace_training


def _real(model, media, batch: int, seq: int, precision: str = "bf16-mixed"):
    """The same step on real CPU tensors under MemTracker."""
    import torch

    torch.manual_seed(0)
    return trace_training(model, StepSettings(batch=batch, seq=seq, precision=precision,
                                              media=step_media(model, media, batch)), fake=False)


def _moments(phases):
    return [(p.phase, p.bytes) for p in phases]


def test_whisper_trains_on_its_windows_of_mel_frames_as_memtracker_measures(cache):
    """--audio-seconds 5 on a Whisper whose windows are 3 s (max_source_positions 150 → 300 mel frames): two windows,
    each a sequence of its own; every moment equals a real step's, the encoder's line is what its forward leaves,
    and the encoder's sinusoidal positions (requires_grad False in the class) take no gradient."""
    import transformers as T

    from paramscope.cost.memory.training import TrainingOptions, estimate_training

    config = T.WhisperConfig(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                             decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=500,
                             num_mel_bins=80, max_source_positions=150, max_target_positions=64, pad_token_id=0,
                             decoder_start_token_id=1, bos_token_id=1, eos_token_id=2)
    data = config.to_dict() | {"architectures": ["WhisperForConditionalGeneration"]}
    estimate = estimate_training(data, TrainingOptions(seq=16, media=MediaInput(audio_seconds=5), fits=False))
    real = _real(T.WhisperForConditionalGeneration(config), MediaInput(audio_seconds=5), 1, 16)
    assert estimate.engine == "traced" and estimate.training.activation_source == "traced"
    assert _moments(estimate.training.phases) == _moments(real.phases)
    assert [p.arithmetic for p in estimate.training.phases][0].startswith("MemTracker: ")
    assert estimate.activations.bytes == real.saved_activations
    assert estimate.training.towers == (("audio encoder", "model.encoder", dict(real.kept_by_module)["model.encoder"]),)
    assert estimate.training.frozen == ("model.encoder.embed_positions.weight",)
    step = {p.phase: p for p in real.phases}["optimizer step"]
    assert step.by_category["gradients"] == estimate.training.states.gradients.bytes
    assert any("2 windows of 3 s (300 mel frames, padded; the encoder's two convolutions stride them to 150 "
               "positions)" in note for note in estimate.notes)


def test_whisper_small_reads_3000_frames_into_1500_positions_and_defaults_to_30_seconds():
    from paramscope.api import inspect_with_module
    from paramscope.cost.memory.training import TrainingOptions
    from pathlib import Path

    path = Path(__file__).parent / "configs" / "families" / "openai--whisper-small.json"
    config = json.loads(path.read_text()) | {"encoder_layers": 1, "decoder_layers": 1, "num_hidden_layers": 1}
    _, module = inspect_with_module(config)
    media = step_media(module, MediaInput(audio_seconds=30), 2)
    assert (media.sequences, media.frames, media.parts) == (2, 3000, (("audio encoder", "model.encoder"),))
    assert "3,000 mel frames, padded; the encoder's two convolutions stride them to 1,500 positions" in media.words
    assert step_media(module, MediaInput(audio_seconds=30.5), 2).sequences == 4
    TrainingOptions(media=MediaInput(audio_seconds=30)).check()


def _tiny_mllama():
    """Llama-3.2-Vision cut to 2 text layers (the second a cross-attention layer) and 1 + 1 vision layers (local,
    global); 2 tiles of 56 px."""
    from transformers import MllamaConfig

    config = MllamaConfig()
    for name, value in dict(num_hidden_layers=2, cross_attention_layers=[1], hidden_size=64, intermediate_size=128,
                            num_attention_heads=4, num_key_value_heads=2, vocab_size=500, pad_token_id=0).items():
        setattr(config.text_config, name, value)
    for name, value in dict(num_hidden_layers=1, num_global_layers=1, hidden_size=32, intermediate_size=64,
                            attention_heads=2, image_size=56, patch_size=14, max_num_tiles=2,
                            intermediate_layers_indices=[0], vision_output_dim=64,
                            supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]]).items():
        setattr(config.vision_config, name, value)
    return config


def test_llama_3_2_vision_trains_on_its_tiles_as_memtracker_measures(cache, capsys, tmp_path):
    """memory --training --images 1 --batch 2 (JSON): each image as max_num_tiles = 2 tiles; every moment equals a
    real step's, and the vision tower's and projector's lines are what MemTracker sees their forwards leave."""
    from transformers import MllamaForConditionalGeneration

    from paramscope.cli import main

    config = _tiny_mllama()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_dict() | {"architectures": ["MllamaForConditionalGeneration"]}))
    assert main(["memory", str(path), "--training", "--images", "1", "--batch", "2", "--seq", "16", "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    real = _real(MllamaForConditionalGeneration(config), MediaInput(images=1), 2, 16)
    assert memory["engine"] == "traced" and memory["settings"]["seq"] == 16
    assert [(p["phase"], p["bytes"]) for p in memory["phases"]] == _moments(real.phases)
    assert memory["peak"]["bytes"] == real.peak.bytes
    kept = dict(real.kept_by_module)
    assert memory["activations"]["towers"] == [
        {"part": "vision tower", "module": "model.vision_model", "bytes": kept["model.vision_model"]},
        {"part": "projector", "module": "model.multi_modal_projector", "bytes": kept["model.multi_modal_projector"]}]
    assert any("1 image of 2 tiles of 56×56 px (4×4 patches + the class token = 17 vision states a tile)" in note
               and "each image at 2 tiles (max_num_tiles" in note for note in memory["notes"])
    assert main(["memory", str(path), "--training", "--image-tokens", "34"]) == 2
    assert "reads images as tiles by cross-attention: give --images K" in capsys.readouterr().err
