"""The derived engine (cost/derived/): closed forms in B and S from traces of short cuts, held to full-depth traces.

Each model here has more layers than the cuts the derivation traces (4 and 5 for one layer type), so every figure
compared is an extrapolation in depth, batch and length; the reference is the traced engine's MemTracker step of the
whole model, to the byte.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from paramscope.build import build_class_on_meta
from paramscope.cost.derived.derive import choose_depths, contexts, derive_training, layer_types
from paramscope.cost.derived.symbols import NotDerivable, dimension, size, words
from paramscope.cost.traced.step import StepSettings, trace_training
from paramscope.cost.traced.timeline import record_training_step

# tests here ask for the same fake-tensor step more than once (GPT-2's derivation at 2 × 64 in two tests, among
# others): each is traced once (tests/trace_memo.py)
pytestmark = pytest.mark.usefixtures("shared_traces")

SMALL = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=256,
             vocab_size=500, pad_token_id=0, bos_token_id=0, eos_token_id=0)


def _model(name: str):
    import transformers as T

    made = {
        "llama": lambda: (T.LlamaForCausalLM, T.LlamaConfig(**SMALL, num_hidden_layers=7)),
        "qwen3": lambda: (T.Qwen3ForCausalLM, T.Qwen3Config(**SMALL, num_hidden_layers=9)),
        "olmo2": lambda: (T.Olmo2ForCausalLM, T.Olmo2Config(**SMALL, num_hidden_layers=8)),
        "qwen3-moe": lambda: (T.Qwen3MoeForCausalLM, T.Qwen3MoeConfig(
            **SMALL, num_hidden_layers=8, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64)),
        "gpt2": lambda: (T.GPT2LMHeadModel, T.GPT2Config(n_embd=128, n_head=4, n_layer=8, vocab_size=500,
                                                          bos_token_id=0, eos_token_id=0)),
    }[name]
    cls, config = made()
    return build_class_on_meta(cls, config)


def _traced(model, batch, seq, precision):
    step = trace_training(model, StepSettings(batch=batch, seq=seq, precision=precision))
    resident = sum(step.resident.values())
    return step.phases[0].bytes - resident, step.saved_activations, step.phases[1].bytes - resident


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_the_recorded_timeline_replays_memtrackers_peaks(precision):
    model = _model("llama")
    settings = StepSettings(batch=2, seq=48, precision=precision)
    assert record_training_step(model, settings, "model.layers").peaks() == _traced(model, 2, 48, precision)


def _derived_at(model, points) -> list:
    """Derive `model`'s recipes at `points` ((B, S); a regime derived when first reached), and hold forward, end of
    forward and backward to the full-depth trace at each, to the byte; the recipes derived."""
    settings = StepSettings(precision="bf16-mixed")
    recipes = []
    for batch, seq in points:
        recipe = next((r for r in recipes if r.covers(batch, seq)), None)
        if recipe is None:
            recipe = derive_training(model, settings, seq=seq, batch=batch)
            recipes.append(recipe)
            assert "equal to the byte" in recipe.check
        figures = recipe.peaks(batch, seq)
        assert (figures.forward, figures.end_of_forward, figures.backward) == _traced(model, batch, seq,
                                                                                      "bf16-mixed")
    return recipes


@pytest.mark.parametrize("name", ["qwen3", "olmo2", "qwen3-moe", "gpt2"])
def test_derived_peaks_equal_the_full_depth_trace(name):
    recipes = _derived_at(_model(name), [(2, 64), (1, 100), (3, 37)])
    assert [r.batch_range[0] for r in recipes] == [2, 1]  # batch 1 is a regime of its own


def test_sliding_window_regimes_and_what_grows_with_depth_are_derived_exactly():
    import transformers as T

    # transformers' training forward builds a DynamicCache: 8 B per sliding layer before the first layer runs, which
    # grows with the depth outside the layers; each side of the window is a regime of its own
    model = build_class_on_meta(T.MistralForCausalLM, T.MistralConfig(**SMALL, num_hidden_layers=8,
                                                                       sliding_window=48))
    settings = StepSettings(precision="bf16-mixed")
    for batch, seq, regime in [(2, 64, "B ≥ 2; S > sliding_window 48"), (2, 40, "B ≥ 2; S < sliding_window 48"),
                               (1, 48, "B = 1; S = sliding_window 48")]:
        recipe = derive_training(model, settings, seq=seq, batch=batch)
        assert recipe.regime == regime and "read from the first check" in recipe.traced
        figures = recipe.peaks(batch, seq)
        assert (figures.forward, figures.end_of_forward, figures.backward) == _traced(model, batch, seq,
                                                                                      "bf16-mixed")


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_the_recorded_timeline_equals_a_real_cpu_step(precision, checkpointing):
    import torch
    import transformers as T

    config = T.LlamaConfig(**SMALL, num_hidden_layers=3)
    torch.manual_seed(0)
    real = T.LlamaForCausalLM(config)
    settings = StepSettings(batch=2, seq=64, precision=precision, grad_checkpointing=checkpointing)
    fake = record_training_step(build_class_on_meta(T.LlamaForCausalLM, config), settings, "model.layers")
    assert fake.peaks() == record_training_step(real, settings, "model.layers", fake=False).peaks()


@pytest.mark.parametrize("name", ["qwen3", "gpt2"])
def test_checkpointed_steps_are_derived_exactly(name):
    model = _model(name)
    settings = StepSettings(precision="bf16-mixed", grad_checkpointing=True)
    for batch, seq in [(2, 64), (1, 100)]:
        recipe = derive_training(model, settings, seq=seq, batch=batch)
        figures = recipe.peaks(batch, seq)
        step = trace_training(model, StepSettings(batch=batch, seq=seq, precision="bf16-mixed",
                                                  grad_checkpointing=True))
        resident = sum(step.resident.values())
        assert (figures.forward, figures.end_of_forward, figures.backward) == \
            (step.phases[0].bytes - resident, step.saved_activations, step.phases[1].bytes - resident)


def test_fp32_derived_equals_the_trace_outside_the_sampled_lengths():
    model = _model("qwen3")
    recipe = derive_training(model, StepSettings(precision="fp32"), seq=256, batch=2)
    figures = recipe.peaks(4, 9)  # the traces sampled S = 17 and 19, B = 3 and 2
    assert (figures.forward, figures.end_of_forward, figures.backward) == _traced(model, 4, 9, "fp32")


def test_the_moment_is_a_closed_form_that_gives_the_peak():
    model = _model("gpt2")
    recipe = derive_training(model, StepSettings(precision="bf16-mixed"), seq=64, batch=2)
    from paramscope.cost.derived.symbols import evaluate

    for phase, value in (("forward", "forward"), ("end of forward", "end_of_forward"), ("backward", "backward")):
        poly = recipe.moment(5, 80, phase)
        assert evaluate(poly, 5, 80) == getattr(recipe.peaks(5, 80), value)
    assert "B·S" in recipe.words("forward", 5, 80)


def test_a_sliding_window_splits_the_regimes():
    import transformers as T

    from paramscope.cost.derived.derive import regime_of

    config = T.MistralConfig(**SMALL, num_hidden_layers=6, sliding_window=48)
    assert regime_of(config, 40, 4096) == ((2, 47), "S < sliding_window 48")
    # a single query runs attention without its causal mask: a regime of its own (Phi-3's B ≥ 2 recipe declined
    # when its check of what grows with the depth was traced at S = 1)
    assert regime_of(config, 1, 4096) == ((1, 1), "S = 1 (a single query)")
    assert regime_of(config, 48, 4096) == ((48, 48), "S = sliding_window 48")
    assert regime_of(config, 64, 4096) == ((49, 4096), "S > sliding_window 48")


def test_layer_types_and_depths():
    import transformers as T

    config = T.Gemma3TextConfig(**SMALL, num_hidden_layers=14, sliding_window=40)
    model = build_class_on_meta(T.Gemma3ForCausalLM, config)
    types = layer_types(model.model.layers)
    assert types == tuple("type 2" if i % 6 == 5 else "type 1" for i in range(14))
    depth, check, _ = choose_depths(types)
    assert types[depth - 1] == types[-1] and check > depth
    assert set(contexts(types)) <= set(contexts(types[:depth - 1] + types[-1:]))
    uniform = layer_types(_model("qwen3").model.layers)
    assert set(uniform) == {"type 1"} and choose_depths(uniform) == (4, 5, 6)


def test_dimension_forms():
    at1, at2 = (3, 17), (2, 19)
    assert dimension(256, 256, at1, at2) == ((0, 0, 256),)
    assert dimension(17, 19, at1, at2) == ((0, 1, 1),)
    assert dimension(16, 18, at1, at2) == ((0, 0, -1), (0, 1, 1))  # S − 1: shifted labels
    assert dimension(51, 38, at1, at2) == ((1, 1, 1),)  # B·S
    assert dimension(48, 36, at1, at2) == ((1, 0, -1), (1, 1, 1))  # B·(S − 1)
    assert dimension(3, 2, at1, at2) == ((1, 0, 1),)
    with pytest.raises(NotDerivable):
        dimension(1000, 7, at1, at2)
    assert size((3, 17, 8), (2, 19, 8), 3 * 17 * 8 * 2, 2 * 19 * 8 * 2, 2, at1, at2) == ((1, 1, 16),)
    assert words(((1, 1, 16), (0, 2, 4), (0, 0, -8))) == "4·S² + 16·B·S − 8"


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "paramscope", *args], capture_output=True, text=True, timeout=600,
                          env=env)


def test_cli_memory_training_of_an_unseen_class_is_derived_and_equals_trace(tmp_path, monkeypatch, capsys):
    """The derived answer from the CLI in a process of its own; the two traces it is held to from the CLI in this one
    (their figures are the same wherever they run, and a fresh process would import torch twice more)."""
    import os

    from paramscope.cli import main

    config = dict(SMALL, architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_hidden_layers=12,
                  tie_word_embeddings=False)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ, PARAMSCOPE_CACHE_DIR=str(tmp_path / "cache"))
    derived = _cli("memory", str(path), "--training", "--batch", "2", "--seq", "96", "--json", env=env)
    assert derived.returncode == 0, derived.stderr
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    documents = [json.loads(derived.stdout)["memory"]]
    for trace in (["--trace", "full"], ["--trace"]):
        capsys.readouterr()
        assert main(["memory", str(path), "--training", "--batch", "2", "--seq", "96", "--json", *trace]) == 0
        documents.append(json.loads(capsys.readouterr().out)["memory"])
    one, other, third = documents
    assert one["engine"] == "derived" and other["engine"] == third["engine"] == "traced"
    assert (other["traced"]["depth"], third["traced"]["depth"]) == ("full", "extended")
    assert (other["settings"]["trace"], third["settings"]["trace"], one["settings"]["trace"]) == \
        ("full", "extended", None)
    assert one["peak"]["bytes"] == other["peak"]["bytes"] == third["peak"]["bytes"] == third["traced"]["peak"]
    assert any("checked against a trace of 5 layers at B=2, S=96" in note for note in one["notes"])
    bad = _cli("memory", str(path), "--training", "--trace", "deep", env=env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "'deep'" in bad.stderr


def _plan(kind: str, layers: int = 6):  # deeper than the cuts (3, 4 and 5 layers): an extrapolation in depth
    import transformers as T

    from paramscope.api import inspect_module
    from paramscope.plan import PlanOptions, make_plan

    model = build_class_on_meta(T.LlamaForCausalLM, T.LlamaConfig(**SMALL, num_hidden_layers=layers))
    options = {"lora": PlanOptions(lora=8, target=("all-linear",)),
               "dora": PlanOptions(lora=8, dora=True, target=("all-linear",)),
               "qlora": PlanOptions(lora=8, qlora="nf4", target=("all-linear",))}[kind]
    return make_plan(inspect_module(model), model, options)


@pytest.mark.parametrize("kind", ["lora", "qlora"])
def test_peft_plans_are_derived_and_equal_the_full_depth_trace(kind, tmp_path, monkeypatch):
    from paramscope.cost.memory.training import TrainingOptions
    from paramscope.plan import plan_memory

    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path))
    plan = _plan(kind)
    for batch, seq in [(1, 64), (2, 48), (3, 37)]:
        derived = plan_memory(plan, TrainingOptions(batch=batch, seq=seq))
        traced = plan_memory(plan, TrainingOptions(batch=batch, seq=seq, trace=True))
        assert (derived.engine, traced.engine) == ("derived", "traced")
        assert (derived.peak, derived.activations.bytes) == (traced.peak, traced.activations.bytes)


def test_a_dora_plan_is_derived_and_equals_the_full_depth_recording(tmp_path, monkeypatch):
    # DoRA's MemTracker trace is not repeatable (8,003,088 then 8,232,464 B saved for it at 8 layers, run after run:
    # the warm-up step leaves garbage in reference cycles that Python's collector frees when it happens to run); the
    # recorded step, from a clean start, is, and the full-depth recording is the reference here
    from paramscope.cost.derived.derive import layer_stack
    from paramscope.cost.memory.training import TrainingOptions
    from paramscope.plan import plan_memory

    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path))
    plan = _plan("dora")
    path, _ = layer_stack(plan.module)
    frozen = frozenset(n for n, p in plan.module.named_parameters() if not p.requires_grad)
    for batch, seq in [(1, 64), (2, 48), (3, 37)]:
        estimate = plan_memory(plan, TrainingOptions(batch=batch, seq=seq))
        assert estimate.engine == "derived"
        full = record_training_step(plan.module, StepSettings(batch=batch, seq=seq, precision="bf16-mixed",
                                                              frozen=frozen, weights_dtype="float32"), path)
        assert estimate.activations.bytes == full.peaks()[1]
        backward = next(p for p in estimate.training.phases if p.phase == "backward")
        assert backward.variable + backward.gradients == full.peaks()[2]


def test_a_recipe_is_kept_and_read_back_without_a_trace(tmp_path, monkeypatch):
    from paramscope.cost.derived.recipe import recipe_from_json, recipe_to_json

    recipe = derive_training(_model("gpt2"), StepSettings(precision="fp32"), seq=64, batch=2)
    assert recipe_from_json(json.loads(json.dumps(recipe_to_json(recipe)))) == recipe
    from paramscope.disk_cache import CacheEntryError

    data = recipe_to_json(recipe)
    data["first_backward"][0][1] = len(data["sizes"])  # an allocation that does not exist
    with pytest.raises(CacheEntryError):
        recipe_from_json(data)


@pytest.mark.parametrize("batch", [1, 2])
def test_the_largest_context_is_solved_on_the_closed_form_and_a_trace_at_the_answer_agrees(batch):
    """"Largest context" is bisected on the derived closed form; the full-depth traced step at the answer fits the
    budget, and equals the derived peak to the byte, and one token more does not fit, traced too."""
    from paramscope.cost.memory.training import TrainingOptions, estimate_training

    model = _model("qwen3")

    def peak(seq, trace=False, budget=None):
        estimate = estimate_training(model, TrainingOptions(batch=batch, seq=seq, trace=trace, budget=budget))
        assert estimate.engine == ("traced" if trace else "derived")
        return estimate

    probe = peak(300)
    budget = probe.peak + probe.reserve + probe.peak // 20  # 300 tokens fit, and more
    largest = peak(64, budget=budget).budget.largest_context
    assert largest is not None and largest > 300
    at, beyond = peak(largest, trace=True), peak(largest + 1, trace=True)
    assert at.peak == peak(largest).peak
    assert at.peak + at.reserve <= budget < beyond.peak + beyond.reserve


def _deepseek(layers: int) -> dict:
    """DeepSeek-V3 at its own widths (MLA, 256 routed experts, a shared one), 2 dense layers, then MoE layers."""
    from paramscope.sources import resolve

    return dict(resolve("deepseek-v3").config, num_hidden_layers=layers, first_k_dense_replace=2)


@pytest.mark.parametrize("model, options", [
    ("llama", dict(batch=2, seq=96)),  # an analytic recipe exists: the trace still extends
    ("qwen3-moe", dict(batch=1, seq=64, precision="fp32")),
    ("deepseek", dict(batch=1, seq=64)),  # two layer types: dense, then MoE
    ("gpt2", dict(batch=3, seq=40, grad_checkpointing="full")),
])
def test_the_depth_extended_trace_equals_the_full_depth_trace(model, options):
    """`--trace` traces a few layers of each type at the asked point and extends them to the model's depth; `--trace
    full` traces every layer. Every phase is equal to the byte; the extension says how it was checked."""
    from paramscope.cost.memory.training import TrainingOptions, estimate_training

    subject = _deepseek(8) if model == "deepseek" else _model(model)
    extended = estimate_training(subject, TrainingOptions(**options, trace="extended"))
    full = estimate_training(subject, TrainingOptions(**options, trace="full"))
    assert extended.engine == full.engine == "traced"
    assert (extended.settings["trace"], full.settings["trace"]) == ("extended", "full")
    assert extended.peak == full.peak
    # forward and backward equal to the byte; the optimizer step is the analytic moment in the extension (gradients,
    # the step's temporaries and what a MoE layer keeps referenced past the backward: a 4-byte offset per routed
    # expert, memory/expert_offsets.py), where a full trace also measures GPT-2's checkpointed layers' few bytes
    phases = [[(p.phase, p.bytes) for p in e.training.phases[:2]] for e in (extended, full)]
    assert phases[0] == phases[1] and [p[0] for p in phases[0]] == ["forward", "backward"]
    step = [p for p in full.training.phases if p.phase == "optimizer step"][0]
    kept = {"gpt2": 960}.get(model, 0)
    assert step.bytes - extended.training.phases[2].bytes == kept
    note = next(n for n in extended.notes if n.startswith("traced, depth-extended: "))
    assert "equal to the byte" in note and "--trace full traces every layer" in note


def test_a_checkpointed_step_is_derived_with_checkpointing():
    """The derivation traces the step it is asked about: with --grad-checkpointing full each layer keeps only its
    input (a derivation that left the setting out once answered the step without checkpointing)."""
    from paramscope.cost.memory.training import TrainingOptions, estimate_training

    model = _model("qwen3")
    options = TrainingOptions(batch=2, seq=64, grad_checkpointing="full")
    derived = estimate_training(model, options)
    full = estimate_training(model, dataclasses.replace(options, trace="full"))
    plain = estimate_training(model, dataclasses.replace(options, grad_checkpointing="none"))
    assert derived.engine == plain.engine == "derived"
    assert derived.peak == full.peak < plain.peak


@pytest.mark.parametrize("rules", [(("train-last", "2"),), (("freeze", "model.layers.0.*"),),
                                   (("freeze", "model.layers.5.*"),)])
def test_a_plan_that_freezes_some_layers_is_derived_by_layer_trainability(rules):
    """A frozen layer keeps no gradient: trainability is part of a layer's type, so a cut never stands for layers
    that train differently. Derived where the cuts repeat the types, else traced; equal to the full trace."""
    from paramscope.api import inspect_module
    from paramscope.cost.memory.training import TrainingOptions
    from paramscope.plan import PlanOptions, make_plan, plan_memory

    model = _model("qwen3")
    plan = make_plan(inspect_module(model), model, PlanOptions(rules=rules))
    answer = plan_memory(plan, TrainingOptions(batch=2, seq=64))
    full = plan_memory(plan, TrainingOptions(batch=2, seq=64, trace="full"))
    assert [(p.phase, p.bytes) for p in answer.training.phases] == [(p.phase, p.bytes) for p in full.training.phases]
    assert answer.engine == ("traced" if rules[0][0] == "train-last" else "derived")


def _unseen(name: str):
    """Classes of no preset family, each deeper than the cuts its derivation traces (choose_depths: 8 / 10 / 12
    layers for GPT-OSS's alternation, 9 / 10 / 11 for SmolLM3's NoPE layer every fourth, 13 / 14 / 15 for Gemma-3's
    five sliding layers to one global)."""
    import transformers as T

    experts = dict(num_experts_per_tok=2)
    made = {
        "gemma3": lambda: (T.Gemma3ForCausalLM, T.Gemma3TextConfig(**SMALL, num_hidden_layers=16, sliding_window=40)),
        "gpt-oss": lambda: (T.GptOssForCausalLM, T.GptOssConfig(**SMALL, num_hidden_layers=14, sliding_window=40,
                                                                num_local_experts=8, **experts)),
        "smollm3": lambda: (T.SmolLM3ForCausalLM, T.SmolLM3Config(**SMALL, num_hidden_layers=13,
                                                                  no_rope_layer_interval=4)),
        "glm4-moe": lambda: (T.Glm4MoeForCausalLM, T.Glm4MoeConfig(
            **SMALL, num_hidden_layers=8, first_k_dense_replace=1, n_routed_experts=8, moe_intermediate_size=64,
            n_group=1, topk_group=1, **experts)),
        "granite-moe": lambda: (T.GraniteMoeForCausalLM, T.GraniteMoeConfig(
            **{k: v for k, v in SMALL.items() if k != "head_dim"}, num_hidden_layers=8, num_local_experts=8,
            **experts)),
    }[name]
    cls, config = made()
    return build_class_on_meta(cls, config)


@pytest.mark.parametrize("name, points", [
    # a 40-token window: S on each side of it, batch 1 and several; one case per regime derived, each under 40 s
    pytest.param("gemma3", [(1, 100), (1, 57)], id="gemma3-beyond-the-window"),  # five sliding layers to one global
    pytest.param("gemma3", [(3, 37)], id="gemma3-inside-the-window"),
    pytest.param("gpt-oss", [(1, 100), (1, 57)], id="gpt-oss-beyond-the-window"),  # sliding and full alternating,
    pytest.param("gpt-oss", [(3, 37)], id="gpt-oss-inside-the-window"),  # MoE, attention sinks
    pytest.param("smollm3", [(2, 64), (1, 100), (3, 37)], id="smollm3"),  # a NoPE layer every fourth
    pytest.param("glm4-moe", [(2, 64), (1, 100), (3, 37)], id="glm4-moe"),  # a dense first layer, then MoE layers
    # with a shared expert
    pytest.param("granite-moe", [(2, 64), (1, 100), (3, 37)], id="granite-moe"),  # MoE with fused expert weights
])
def test_unseen_architectures_are_derived_equal_to_the_full_depth_trace(name, points):
    """Classes of no preset family, derived at their depth from shorter cuts, equal to the full-depth trace in every
    phase at each point; a recipe derived at one point answers the next point of its regime."""
    recipes = _derived_at(_unseen(name), points)
    assert len(recipes) == len({(b == 1, s < 40 if name in ("gemma3", "gpt-oss") else None) for b, s in points})


def test_a_context_a_short_cut_holds_once_is_checked_where_it_is_held_twice():
    """13-layer EXAONE-4 (three sliding layers to one global): no cut shorter than the model holds the global
    layer's context twice, so the recipe read from a cut holding it once could not tell what that context's layers
    free once from what each frees (its cache tensors, 256·B·S B); its check is the cut that holds it twice, and
    the answer is then the full-depth trace's, derived or traced."""
    import transformers as T

    from paramscope.cost.derived.derive import choose_depths
    from paramscope.cost.memory.training import TrainingOptions, estimate_training

    config = T.Exaone4Config(**SMALL, num_hidden_layers=13, sliding_window=40, sliding_window_pattern=4)
    model = build_class_on_meta(T.Exaone4ForCausalLM, config)
    assert choose_depths(layer_types(model.model.layers))[:2] == (9, 13)
    options = TrainingOptions(batch=2, seq=64)
    answer = estimate_training(model, options)
    full = estimate_training(model, dataclasses.replace(options, trace="full"))
    assert [(p.phase, p.bytes) for p in answer.training.phases[:2]] == \
        [(p.phase, p.bytes) for p in full.training.phases[:2]]
