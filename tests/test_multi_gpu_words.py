"""The words of the multi-GPU output (issue 28's newcomer trial): each note and refusal says what it compares or
refuses in the user's words, before any build where the config answers it."""

from __future__ import annotations

from paramscope.cost.memory.training import TrainingOptions, estimate_training
from paramscope.cost.parallel.layout import layout_for

LLAMA = dict(hidden_size=128, intermediate_size=344, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=500, architectures=["LlamaForCausalLM"], model_type="llama",
             tie_word_embeddings=False)


def test_the_grad_accum_check_names_the_first_micro_step():
    """FSDP2's derived rank under --grad-accum: the closed form (the first micro-step's) is compared with the
    derived first micro-step's peak (9,777,188 B), not the answer's (the later micro-step's 11,223,588 B; the note
    said -12.887% 'from the derived peak')."""
    answer = estimate_training(LLAMA, TrainingOptions(batch=4, seq=64, precision="bf16-mixed", fits=False,
                                                      grad_accum=2, layout=layout_for(dp=2, zero="fsdp")))
    assert answer.peak == 11_223_588
    assert ("check: the first micro-step's peak: the closed form gives 9,777,188 B, +0.000% from the derived first "
            "micro-step") in answer.training.device.notes


def test_an_ep_that_does_not_divide_the_experts_is_refused_before_the_build(monkeypatch, capsys):
    """--ep 3 on Mixtral's 8 experts: refused from the config's count, the model never built (it took ~70 s before
    the layout's rules refused it per experts module)."""
    import paramscope.cost.memory.training as training
    from paramscope.cli import main

    def built(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(training, "training_answer", built)
    assert main(["memory", "mixtral-8x7b", "--training", "--dp", "3", "--ep", "3"]) != 0
    assert "--ep 3 does not divide Mixtral's 8 routed experts (num_local_experts)" in capsys.readouterr().err


def test_the_pipeline_refusals_name_the_values_asked():
    """--pp 64 on 32 layers names no virtual stages that were not asked; --virtual-stages 2 without --pp names
    itself and what to give."""
    import pytest

    from paramscope.cost.parallel.pipeline import stages
    from paramscope.errors import OptionError

    with pytest.raises(OptionError) as err:
        stages(layout_for(pp=64), 32)
    assert err.value.spelled(lambda o: "--" + o) == "--pp 64 is more than the model's 32 layers"
    with pytest.raises(OptionError) as err:
        stages(layout_for(pp=32, virtual_stages=2), 32)
    assert "× virtual stages = 64 chunks is more than the model's 32 layers" in str(err.value)
    with pytest.raises(OptionError) as err:
        layout_for(virtual_stages=2)
    assert err.value.spelled(lambda o: "--" + o.replace("_", "-")) == \
        "--virtual-stages 2 interleaves pipeline stages: give --pp 2 or more"


def test_fsdp2_over_one_rank_reads_as_no_sharding_in_the_search_s_words():
    """find_layout's repr and text: FSDP2 over one rank applies no fully_shard (the search's note: it shards
    nothing and runs autocast), not "dp 1 (FSDP2)"."""
    from paramscope.cost.parallel.search_result import layout_words

    alone = layout_for(dp=1, zero="fsdp", tp=8, sp=True)
    assert layout_words(alone, "bf16-mixed") == "dp 1 (one rank: no sharding, torch.autocast) × tp 8 (sequence " \
        "parallel) = 8 devices"
    assert layout_words(alone, "fp32").startswith("dp 1 (one rank: no sharding) × tp 8")
    sharded = layout_for(dp=2, zero="fsdp", tp=4, sp=True)
    assert layout_words(sharded, "bf16-mixed") == sharded.words()


def test_the_training_header_names_the_one_device_tables_under_a_layout():
    """Under a layout the whole-model tables are the one-device step's (autocast's 16-bit weights in a mixed
    precision), then one device's: the header says so, as serving's does, though FSDP2 runs its policy."""
    from paramscope.cost.memory.training import training_answer
    from paramscope.render.memory import render_memory_text

    config = dict(LLAMA, num_hidden_layers=2)
    report, answer, _ = training_answer(config, TrainingOptions(
        batch=2, seq=64, precision="bf16-mixed", fits=False, derive_layout=False,
        layout=layout_for(dp=2, zero="fsdp")), use_cache=False)
    text = " ".join(render_memory_text(report, answer, width=200).split())
    assert ("across GPUs: dp 2 (FSDP2, its MixedPrecisionPolicy) = 2 devices; the model's figures on one device "
            "(bf16-mixed, torch.autocast) first, then one device's under the layout") in text
