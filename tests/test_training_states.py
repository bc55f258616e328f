"""Model states of a training step (cost/training.py) against torch's MemTracker on a fake-tensor step.

Weights, gradients and optimizer states must agree to the byte (issue 10). The step is the steady one: a first
step allocates the optimizer states, the second is measured.
"""

from __future__ import annotations

import pytest

from paramscope import inspect
from paramscope.cost.memory.states import check_optimizer, check_precision, model_states, per_device, zero_stage
from paramscope.errors import ParamscopeError

FIELDS = dict(hidden_size=256, intermediate_size=700, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=1000)


def _traced(make_optimizer, dtype_name="float32"):
    import torch
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    config = transformers.LlamaConfig(**FIELDS)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype_name))
    try:
        with FakeTensorMode():
            model = transformers.LlamaForCausalLM(config).train()
            optimizer = make_optimizer(torch, list(model.parameters()))
            ids = torch.zeros((1, 16), dtype=torch.long)

            def step():
                model(input_ids=ids, labels=ids).loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            step()
            tracker = MemTracker()
            tracker.track_external(model, optimizer)
            with tracker:
                step()
            current = tracker.get_tracker_snapshot("current")
    finally:
        torch.set_default_dtype(previous)
    return {str(k).rsplit(".", 1)[-1]: v for device in current.values() for k, v in device.items()}


@pytest.fixture(scope="module")
def report():
    import transformers

    return inspect(transformers.LlamaConfig(**FIELDS), model_class="LlamaForCausalLM")


@pytest.mark.parametrize("name, make, dtype, precision", [
    ("adamw", lambda torch, ps: torch.optim.AdamW(ps, fused=True), "float32", "fp32"),  # the Trainer's default
    ("adamw", lambda torch, ps: torch.optim.AdamW(ps), "float32", "fp32"),
    ("adamw", lambda torch, ps: torch.optim.AdamW(ps, fused=True), "bfloat16", "bf16-pure"),
    ("sgd-momentum", lambda torch, ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), "float32", "fp32"),
    ("sgd", lambda torch, ps: torch.optim.SGD(ps, lr=0.1), "float32", "fp32"),
])
def test_optimizer_states_and_weights_equal_memtracker(report, name, make, dtype, precision):
    traced = _traced(make, dtype)
    states = model_states(report.params, precision=precision, optimizer=name)
    assert states.optimizer.bytes == traced["OPT"]
    assert states.weights.bytes == traced["PARAM"]


def test_adamw_fp32_is_two_states_plus_step_counters(report):
    states = model_states(report.params, precision="fp32", optimizer="adamw")
    assert states.optimizer.bytes == 2 * report.total * 4 + 4 * len(report.params)
    assert states.gradients.bytes == report.total * 4
    assert states.master_weights.bytes == 0


def test_frozen_parameters_have_no_gradients_or_states(report):
    trainable = frozenset(p.name for p in report.params if not p.role.startswith("embeddings"))
    states = model_states(report.params, precision="bf16-mixed", optimizer="adamw", trainable=trainable)
    n = sum(p.numel for p in report.params if p.name in trainable)
    assert states.gradients.bytes == 4 * n and states.frozen == report.total - n
    assert states.optimizer.bytes == 8 * n + 4 * len(trainable)


def test_adafactor_and_8bit_states(report):
    adafactor = model_states(report.params, precision="fp32", optimizer="adafactor").optimizer.bytes
    expected = sum((p.shape[0] + p.shape[1]) if len(p.shape) == 2 else p.numel for p in report.params)
    assert adafactor == expected * 4 + 4 * len(report.params)
    eight = model_states(report.params, precision="fp32", optimizer="adamw-8bit").optimizer.bytes
    big = [p for p in report.params if p.numel >= 4096]
    small = sum(p.numel for p in report.params if p.numel < 4096)
    assert eight == sum(2 * (p.numel + -(-p.numel // 256) * 4) for p in big) + 8 * small


def test_zero_stages_shard_what_they_promise(report):
    states = model_states(report.params, precision="bf16-mixed", optimizer="adamw")
    full = per_device(states, devices=8, zero=0)
    assert full == {"weights": states.weights.bytes, "gradients": states.gradients.bytes,
                    "optimizer": states.optimizer.bytes, "master_weights": 0}
    three = per_device(states, devices=8, zero=3)
    assert three["weights"] == -(-states.weights.bytes // 8)
    assert three["optimizer"] == -(-states.optimizer.bytes // 8)
    assert per_device(states, devices=8, zero=1)["gradients"] == states.gradients.bytes
    assert zero_stage("full_shard") == 3 and zero_stage("shard_grad_op") == 2


@pytest.mark.parametrize("check, value", [(check_optimizer, "adagrad"), (check_precision, "fp8"),
                                          (zero_stage, "4")])
def test_unknown_choices_name_the_value(check, value):
    with pytest.raises(ParamscopeError, match=repr(value)):
        check(value)
