"""The traced step counts what the step frees, not what MemTracker's own module hooks hold (traced/tracker_hooks.py).

A two-layer ELECTRA discriminator in bf16-mixed peaks inside its last layer's attention backward; there MemTracker as
torch ships it still holds ElectraSelfOutput's first input gradient (the attention's context, B·S·h in bf16) in
ModTracker's "all" multi-grad hook, waiting for the residual's. The recorder (timeline.py), which hooks no module's
inputs, frees it as the step does, and the trace now agrees with it to the byte.
"""

from __future__ import annotations

from contextlib import contextmanager

from paramscope.build import build_class_on_meta
from paramscope.cost.traced import step as traced_step
from paramscope.cost.traced.step import StepSettings, trace_training
from paramscope.cost.traced.timeline import record_training_step
from paramscope.cost.traced.tracker_hooks import Spared

BATCH, SEQ, HIDDEN = 1, 128, 32


def _electra():
    import transformers

    config = transformers.ElectraConfig(vocab_size=100, hidden_size=HIDDEN, embedding_size=HIDDEN,
                                        num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                                        max_position_embeddings=SEQ)
    return build_class_on_meta(transformers.ElectraForPreTraining, config)


def _backward(step) -> int:
    return step.phases[1].bytes - sum(step.resident.values())


def test_electras_backward_peak_is_the_steps_not_the_trackers(monkeypatch):
    model = _electra()
    settings = StepSettings(batch=BATCH, seq=SEQ, precision="bf16-mixed")
    recorded = record_training_step(model, settings, "electra.encoder.layer").peaks()
    traced = trace_training(model, settings)
    assert recorded[2] == _backward(traced) == 1_355_276
    assert (traced.phases[0].bytes - sum(traced.resident.values()), traced.saved_activations) == recorded[:2]
    note = next(n for n in traced.notes if n.startswith("MemTracker's module hooks"))
    assert "(4 module calls here: ElectraOutput, ElectraSelfOutput)" in note

    @contextmanager
    def as_torch_ships_it():
        yield Spared()

    monkeypatch.setattr(traced_step, "gradients_not_held", as_torch_ships_it)
    held = trace_training(model, settings)
    # the context's gradient, B·S·h bf16 elements, held across the last layer's attention backward
    assert _backward(held) - _backward(traced) == 2 * BATCH * SEQ * HIDDEN == 8_192
    assert not any(n.startswith("MemTracker's module hooks") for n in held.notes)
