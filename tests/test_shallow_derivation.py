"""A model too shallow for a longer check cut (GPT-2 cut to 4 layers, under tensor parallel, where the allocations
outside the layers grow with the depth): the recipe is read from 3 layers, what grew from the check at the model's
own 4, and a second point at that depth checks it. It was refused ('no longer cut checks them'), so a small model had
no layout but data parallel; where the second point does not hold (a 500-token vocabulary at 64 tokens) the
derivation still declines. The derived rank equals the traced one to the byte."""

from __future__ import annotations

from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.parallel.layout import layout_for
from paramscope.cost.traced.parallel import trace_parallel_training
from paramscope.cost.traced.step import StepSettings

GPT2_4 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 128, "n_head": 4, "n_layer": 4,
          "vocab_size": 50257, "attn_pdrop": 0.0, "n_positions": 1024}


def test_a_four_layer_model_derives_its_tensor_parallel_rank():
    _, estimate, view = training_answer(GPT2_4, TrainingOptions(batch=1, seq=512, precision="bf16-mixed",
                                                                layout=layout_for(tp=2), fits=False), use_cache=False)
    device = estimate.training.device
    assert device.activations_from.startswith("derived")
    notes = " ".join(device.notes)
    assert "checked against a trace of 4 layers" in notes and notes.count("4 layers at") == 2
    step = trace_parallel_training(view.module, StepSettings(batch=1, seq=512, precision="bf16-mixed",
                                                             optimizer="adamw"), tp=2)
    assert [p.bytes for p in device.phases[:2]] == [p.bytes for p in step.phases[:2]]
