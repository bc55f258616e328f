"""Check before trusting (issue 31 §1): the analytic FLOP count is held against FlopCounterMode on a cut of the real
class once per config; the outcome is kept with the cost facts and decides which engine answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paramscope.cost.engine_check import EngineCheck, check_cut
from paramscope.cost.flops import check as flop_check
from paramscope.cost.flops.check import find_flop_check as find_check
from paramscope.cost.flops.estimate import FlopOptions, estimate_flops
from paramscope.cost.facts.store import facts_key
from paramscope.presets import all_presets
from paramscope.sources import resolve

from test_template import needs_shipped

CONFIGS = Path(__file__).parent / "configs"
BENCH = Path(__file__).parent.parent / "bench" / "configs"


@pytest.fixture
def checks(monkeypatch):
    """Every check made (not read) in the test."""
    made = []
    real = flop_check.check_flops

    def counting(module):
        made.append(type(module).__name__)
        return real(module)

    monkeypatch.setattr(flop_check, "check_flops", counting)
    return made


def _small(name: str, **changes) -> dict:
    config = json.loads((BENCH / name).read_text()) | changes
    return config


@needs_shipped
@pytest.mark.parametrize("preset", [p.name for p in all_presets()])
def test_every_preset_ships_a_check_and_each_agrees(preset):
    """The package holds each preset's check, so `flops` answers every preset analytically without a build."""
    source = resolve(preset)
    from paramscope.template import lookup_template

    found = lookup_template(source.config, model_class=None, task=None, num_labels=None)
    check = find_check(found.template.class_name, facts_key(source.config, model_class=None, task=None,
                                                            num_labels=None))
    assert check is not None, "no shipped FLOP check: run python -m paramscope.template_record"
    assert check.status == "equal", check.words()
    from paramscope.cost.engine_check import find_check as find_any

    generation = find_any("generation", found.template.class_name,
                          facts_key(source.config, model_class=None, task=None, num_labels=None))
    generates = found.template.class_name.endswith(("ForCausalLM", "LMHeadModel"))
    assert (generation is not None and generation.status == "equal") == generates, generation
    assert len(check.points) in (2, 3) and check.points[0][0] == 3 and check.points[1][0] == 2
    assert check.layers < check.of_layers or preset.startswith("albert")


def test_an_unfitted_class_is_checked_once_then_answered_from_the_kept_check(cache, checks):
    """Qwen3 (no preset): the first answer checks on a 2-layer cut and is analytic; the next reads the check."""
    config = _small("Qwen--Qwen3-0.6B.json")
    first = estimate_flops(config, FlopOptions(seq=256, training=True))
    assert checks == ["Qwen3ForCausalLM"]
    assert first.engine == "analytic" and first.check.status == "equal"
    assert (first.check.layers, first.check.of_layers) == (2, 28)
    assert first.check.modes == ("forward", "training step", "checkpointed step")
    assert first.notes[-1].startswith("checked once for this config: the analytic count equals FlopCounterMode's "
                                      "on fake tensors on a 2-of-28-layer cut of Qwen3ForCausalLM at B=3 S=")
    again = estimate_flops(config, FlopOptions(seq=512))
    assert checks == ["Qwen3ForCausalLM"] and again.engine == "analytic" and again.check == first.check
    # the analytic answer the check let through is the whole model's exact count
    traced = estimate_flops(config, FlopOptions(seq=256, training=True, trace=True))
    assert (traced.forward, traced.backward, traced.recompute) == (first.forward, first.backward, first.recompute)
    kept = list(cache.rglob("*.flops-check.json"))
    assert len(kept) == 1 and kept[0].parent.name == "costs" and kept[0].parent.parent.name == "Qwen3ForCausalLM"


def test_a_class_the_analytic_engine_miscounts_is_traced_and_the_term_named(cache, checks):
    """LFM2's short convolutions are matmuls the analytic engine does not see: the check finds the forward short
    by exactly their FLOPs, and FlopCounterMode counts the whole model instead."""
    config = json.loads((CONFIGS / "families" / "LiquidAI--LFM2-1.2B.json").read_text())
    estimate = estimate_flops(config, FlopOptions(seq=128, training=True))
    assert estimate.engine == "traced" and estimate.check.status == "differs"
    b, s = estimate.check.points[0]
    hidden, kernel = config["hidden_size"], config["conv_L_cache"]
    convolutions = estimate.check.layers - len([i for i in config["full_attn_idxs"] if i < estimate.check.layers])
    assert estimate.check.differs.startswith(f"at B={b}, S={s}, the forward ")
    # a depthwise Conv1d padded by kernel − 1 on both sides: 2 × its S + kernel − 1 outputs × kernel taps a channel
    assert estimate.check.differs.endswith(
        f": other 0 analytic vs {2 * b * (s + kernel - 1) * hidden * kernel * convolutions:,} traced")
    assert any(note.startswith("the analytic count differs from FlopCounterMode's on ") and
               note.endswith(": counted by FlopCounterMode on fake tensors") for note in estimate.notes)
    traced = estimate_flops(config, FlopOptions(seq=128, training=True, trace=True))
    assert (estimate.forward, estimate.backward) == (traced.forward, traced.backward)
    # the next question reads the kept check, and still traces
    again = estimate_flops(config, FlopOptions(seq=64))
    assert checks == ["Lfm2ForCausalLM"] and again.engine == "traced"


def test_a_class_the_trace_cannot_run_is_answered_unchecked_and_says_so(cache):
    """ViT's forward takes pixels, not token ids: the trace cannot run it, and the answer says the analytic count is
    unchecked."""
    config = json.loads((CONFIGS / "families" / "google--vit-base-patch16-224.json").read_text())
    estimate = estimate_flops(config, FlopOptions(seq=64))
    assert estimate.engine == "analytic" and estimate.check.status == "unchecked"
    assert estimate.notes[-1] == (
        "unchecked: the trace cannot run ViTForImageClassification: the traced step feeds token ids; "
        "ViTForImageClassification.forward takes no input_ids; so the analytic count is given without a check")


def test_whisper_is_counted_on_its_audio_by_default(cache):
    """Whisper has no text-only forward: its encoder always reads a 30 s window. With no input named, the count is
    the one of 30 s of audio (FlopCounterMode over the real forward), and says so; the analytic count, which would
    run the encoder over the decoder's length, is not given."""
    from paramscope.cost.towers.media import MediaInput

    config = json.loads((CONFIGS / "families" / "openai--whisper-small.json").read_text())
    config.update(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                  decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128)
    default = estimate_flops(config, FlopOptions(seq=16))
    asked = estimate_flops(config, FlopOptions(seq=16, media=MediaInput(audio_seconds=30.0)))
    assert default.engine == asked.engine == "traced"
    assert default.forward == asked.forward
    assert "Whisper runs on audio and its transcript: 30 s of audio a sequence assumed" in " ".join(default.notes)


def test_an_encoder_decoder_is_cut_in_both_stacks():
    """T5's encoder and decoder are each cut to their first two layers (the first holds the position bias), the
    config's counts with them."""
    from paramscope.api import inspect_with_module
    _, module = inspect_with_module("t5-small")
    cut, layers, total = check_cut(module)
    assert (layers, total) == (4, 12)
    assert len(cut.encoder.block) == len(cut.decoder.block) == 2
    assert (cut.config.num_layers, cut.config.num_decoder_layers) == (2, 2)
    assert len(module.encoder.block) == 6  # the model itself is untouched


@pytest.mark.parametrize("change", [
    {"status": "maybe"}, {"differs": "x"}, {"layers": 99}, {"points": [[0, 17]]}, {"points": []},
    {"modes": ["sideways"]}, {"modes": ["bfloat16"]}, {"quantity": "serving"}, {"quantity": "x"},
    {"class": "BertModel"}, {"differs": "a\x1b[2Jb"}, {"extra": 1},
])
def test_a_malformed_or_foreign_check_is_never_read(cache, change):
    """A kept check is validated field by field and bound to its class, key and versions; anything else is checked
    again."""
    config = _small("Qwen--Qwen3-0.6B.json", num_hidden_layers=3)
    first = estimate_flops(config, FlopOptions(seq=64))
    [path] = cache.rglob("*.flops-check.json")
    entry = json.loads(path.read_text())
    key = entry["key"]
    assert find_check("Qwen3ForCausalLM", key) == first.check
    entry["check"] |= change
    path.write_text(json.dumps(entry))
    assert find_check("Qwen3ForCausalLM", key) is None
    for broken in ({**entry, "versions": ["0"]}, {**entry, "format": 2}, {**entry, "key": "0" * 32}, [1, 2]):
        path.write_text(json.dumps(broken))
        assert find_check("Qwen3ForCausalLM", key) is None


def test_check_round_trips_and_words():
    check = EngineCheck("flops", "X", "differs", 2, 8, ((3, 17), (2, 19)), ("forward", "training step"),
                        "at B=3, S=17, …")
    assert EngineCheck.from_json(json.loads(json.dumps(check.to_json()))) == check
    assert check.words() == ("the analytic count differs from FlopCounterMode's on fake tensors on a 2-of-8-layer "
                             "cut of X at B=3 S=17, B=2 S=19 (forward, training step): at B=3, S=17, …")


def test_the_cli_json_names_the_check(capsys):
    from paramscope.cli import main

    assert main(["flops", "llama-3-8b", "--json"]) == 0
    check = json.loads(capsys.readouterr().out)["flops"]["check"]
    assert check["status"] == "equal" and check["class"] == "LlamaForCausalLM"
    assert (check["cut_layers"], check["model_layers"]) == (2, 32)
    assert check["points"][2] == {"batch": 1, "seq": 8192} and check["differs"] is None


def _gemma3_multimodal() -> dict:
    from transformers import Gemma3Config

    config = Gemma3Config().to_dict() | {"architectures": ["Gemma3ForConditionalGeneration"]}
    config["text_config"] |= {"num_hidden_layers": 6, "layer_types": config["text_config"]["layer_types"][:6]}
    return config


@pytest.mark.parametrize("name, towers", [
    ("Qwen--Qwen2.5-VL-7B-Instruct.json", "model.visual"),
    ("defaults--llava.json", "vision_tower, multi_modal_projector"),
    ("gemma-3", "model.vision_tower, model.multi_modal_projector"),
])
def test_a_text_input_counts_the_language_model_only_and_the_check_agrees(cache, name, towers):
    """Issue 31's Gemma-3 (+18% at 2 layers): a text forward runs no vision tower. The analytic engine leaves the
    towers out, names them, and equals FlopCounterMode, which runs the text forward."""
    config = _gemma3_multimodal() if name == "gemma-3" else json.loads((CONFIGS / "families" / name).read_text())
    estimate = estimate_flops(config, FlopOptions(seq=128, training=True))
    assert estimate.engine == "analytic" and estimate.check.status == "equal", estimate.notes
    [note] = [n for n in estimate.notes if n.startswith("a text input runs the language model only: ")]
    assert note.startswith(f"a text input runs the language model only: {towers} (")
    traced = estimate_flops(config, FlopOptions(seq=128, training=True, trace=True))
    assert (estimate.forward, estimate.backward) == (traced.forward, traced.backward)


def test_the_check_names_parts_whose_matmuls_the_trace_never_ran():
    """Where the analytic engine counts a tower the trace never ran, the difference names it."""
    from paramscope.api import inspect_with_module
    from paramscope.cost.flops.check import _idle

    config = json.loads((CONFIGS / "families" / "Qwen--Qwen2.5-VL-7B-Instruct.json").read_text())
    _, module = inspect_with_module(config)
    ran = {path: 1 for path, _ in module.named_modules() if not path.startswith("model.visual")}
    # five matmuls a vision block (qkv, proj, gate, up, down) and the merger's two
    assert _idle(module, ran) == f"model.visual ({config['vision_config']['depth'] * 5 + 2})"


def test_training_a_multimodal_model_on_text_keeps_no_state_for_its_towers(cache):
    """Memory follows the input too: on a text input the vision tower and projector get no gradient, so AdamW keeps
    no state for them; their weights stay resident."""
    from paramscope.cost.memory.training import TrainingOptions, estimate_training

    config = json.loads((CONFIGS / "families" / "defaults--llava.json").read_text())
    config["text_config"]["num_hidden_layers"] = config["vision_config"]["num_hidden_layers"] = 2
    estimate = estimate_training(config, TrainingOptions(seq=64))
    towers = sum(p.numel for p in estimate.report.params if p.name.startswith(("vision_tower.", "multi_modal_projector.")))
    states = estimate.training.states
    assert states.frozen == towers and states.trainable == estimate.report.total - towers
    assert states.gradients.bytes == 4 * states.trainable  # bf16-mixed: fp32 gradients of what trains
    assert any(note.startswith("a text input runs the language model only: vision_tower, multi_modal_projector ("
                               f"{towers:,} parameters) get no gradient") for note in estimate.notes)
