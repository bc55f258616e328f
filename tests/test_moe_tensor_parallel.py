"""Tensor parallelism over transformers' packed MoE experts (traced/moe_parallel.py): Megatron's cut of each expert
(gate and up column-wise on the intermediate dim, down row-wise, partial sums reduced) as a torch ParallelStyle, so
Mixtral and Qwen3-MoE trace under DTensor tensor parallelism on torch's fake process group, and the analytic rules
(parallel/rules.py) hold the same shard of every parameter."""

from __future__ import annotations

import pytest
import torch

from paramscope.cost.traced.moe_parallel import grouped_gate_up


def test_each_rank_holds_its_gate_and_up_rows_and_the_partial_sums_add_up():
    """Real tensors: rank r's Shard(1) of the regrouped packed weight is its gate rows then the same up rows, so the
    class's own chunk(2) splits it, and the ranks' partial outputs through their down columns sum to the expert's
    whole output (what the all-reduce or reduce-scatter completes)."""
    torch.manual_seed(0)
    experts, intermediate, hidden, tp = 3, 8, 5, 4
    gate_up = torch.randn(experts, 2 * intermediate, hidden, dtype=torch.float64)
    down = torch.randn(experts, hidden, intermediate, dtype=torch.float64)
    x = torch.randn(7, hidden, dtype=torch.float64)
    grouped = grouped_gate_up(gate_up, tp)
    part = intermediate // tp
    total = torch.zeros(experts, 7, hidden, dtype=torch.float64)
    for rank in range(tp):
        local = grouped.chunk(tp, dim=1)[rank]
        gate, up = local.chunk(2, dim=1)
        assert torch.equal(gate, gate_up[:, rank * part:(rank + 1) * part])
        assert torch.equal(up, gate_up[:, intermediate + rank * part:intermediate + (rank + 1) * part])
        for e in range(experts):
            g, u = (x @ local[e].T).chunk(2, dim=-1)
            total[e] += (torch.nn.functional.silu(g) * u) @ down[e].chunk(tp, dim=1)[rank].T
    for e in range(experts):
        g, u = (x @ gate_up[e].T).chunk(2, dim=-1)
        assert torch.allclose(total[e], (torch.nn.functional.silu(g) * u) @ down[e].T)


def _config(model_type, arch, **extra):
    config = dict(model_type=model_type, architectures=[arch], hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                  max_position_embeddings=256, tie_word_embeddings=False)
    config.update(extra)
    return config


MIXTRAL = _config("mixtral", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2)
QWEN2_MOE = _config("qwen2_moe", "Qwen2MoeForCausalLM", moe_intermediate_size=32, shared_expert_intermediate_size=64,
                    num_experts=4, num_experts_per_tok=2)
QWEN3_MOE = _config("qwen3_moe", "Qwen3MoeForCausalLM", head_dim=16, moe_intermediate_size=32, num_experts=4,
                    num_experts_per_tok=2)


@pytest.mark.parametrize("config, sp", [(MIXTRAL, False), (MIXTRAL, True), (QWEN3_MOE, True), (QWEN2_MOE, False),
                                        (QWEN2_MOE, True)],
                         ids=["mixtral tp2", "mixtral tp2 sp", "qwen3-moe tp2 sp", "qwen2-moe tp2, shared expert",
                              "qwen2-moe tp2 sp, shared expert"])
def test_traced_shards_equal_the_analytic_placements(config, sp):
    """Every parameter's local shape on the traced rank (rank 0 of tp 2) equals parallel/rules.py's placement, the
    packed experts included ([E, 2I/t, h] and [E, h, I/t], the router whole; Qwen2-MoE's shared expert cut as
    Megatron cuts an MLP, its one-output gate whole), and one step runs under it."""
    from paramscope.api import inspect_with_module
    from paramscope.cost.parallel.rules import placements_for
    from paramscope.cost.parallel.layout import layout_for
    from paramscope.cost.traced.parallel import Layout, parallel_copy
    from paramscope.cost.traced.step import StepSettings, measure_training

    from paramscope.cost.model_view import from_module

    report, module = inspect_with_module(config)
    view = from_module(module)
    placements = {p.name: p for p in placements_for(report, view, layout_for(devices=2, tp=2, sp=sp))}
    settings = StepSettings(batch=1, seq=32, precision="bf16-mixed", optimizer="adamw")
    with parallel_copy(module, settings, Layout(tp=2, sp=sp)) as (model, notes, _):
        local = {name: tuple(getattr(p, "_local_tensor", p).shape) for name, p in model.named_parameters()}
        step = measure_training(model, settings, fake=False)
    assert local == {name: p.local_shape for name, p in placements.items()}
    experts = model.model.layers[0].mlp.experts
    assert [str(p.placements[0]) for p in (experts.gate_up_proj, experts.down_proj)] == ["S(1)", "S(2)"]
    assert placements["model.layers.0.mlp.experts.gate_up_proj"].local_shape[1] == \
        placements["model.layers.0.mlp.experts.gate_up_proj"].shape[1] // 2
    assert placements["model.layers.0.mlp.gate.weight"].tp == "replicated"
    assert any("mlp.experts moe_tp_experts" in note for note in notes), notes
    assert step.resident["parameters"] == sum(p.local_numel for p in placements.values()) * 4


def test_derived_device_step_equals_the_traced_rank():
    """`memory --training --tp 2 --sp` on a Mixtral cut: the per-device step derived from traces of short cuts with
    the packed experts cut (parallel/estimate.py) equals the whole model's traced rank: forward and backward to the
    byte; the optimizer step within the 544 B the traced step still holds (an h-sized fp32 tensor and the router's
    32 B), the sequence-parallel norms' all-reduced gradients (13 × 128 × 4 B) counted."""
    from paramscope.cost.parallel.layout import layout_for

    from parallel_steps import derived_and_traced

    config = dict(MIXTRAL, hidden_size=128, intermediate_size=256, num_hidden_layers=6, vocab_size=1024)
    estimate, traced = derived_and_traced(config, layout_for(devices=2, tp=2, sp=True), batch=1)
    assert estimate.engine == "derived", estimate.notes
    derived = {p.phase: p.bytes for p in estimate.training.device.phases}
    measured = {p.phase: p.bytes for p in traced.phases}
    assert derived["forward"] == measured["forward"] and derived["backward"] == measured["backward"]
    assert 0 <= measured["optimizer step"] - derived["optimizer step"] <= 608, (derived, measured)


def test_qwen2_moe_under_fsdp2_and_sequence_parallel_derived_equals_the_traced_rank():
    """`memory --training --devices 4 --tp 2 --sp --zero fsdp` on a 5-layer Qwen2-MoE cut: FSDP2 over 2 data-parallel
    ranks on top of tensor parallel (a 2-D mesh, fully_shard on each layer over the DTensor shards), the packed
    experts cut as Megatron cuts them, the shared expert cut as an MLP with its output left Partial and its sigmoid
    gate whole (a Replicate DTensor on the gathered tokens), so the gated sum reduce-scatters once with the experts'
    partial sums (torchtitan's treatment of a shared expert). The derived per-device step equals the traced rank in
    forward, backward and the optimizer step to the byte (there the token ids and each layer's expert offsets the
    traced rank still holds are counted: estimate.held_at_step)."""
    from paramscope.cost.parallel.layout import layout_for

    from parallel_steps import derived_and_traced

    estimate, traced = derived_and_traced(dict(QWEN2_MOE, num_hidden_layers=5),
                                          layout_for(devices=4, tp=2, sp=True, zero="fsdp"), batch=1)
    assert estimate.engine == "derived", estimate.notes
    layout = estimate.training.device.layout
    assert (layout.dp, layout.shard, layout.tp, layout.sp) == (2, "fsdp", 2, True)
    derived = {p.phase: p.bytes for p in estimate.training.device.phases}
    measured = {p.phase: p.bytes for p in traced.phases}
    assert derived["forward"] == measured["forward"] == 2_891_500
    assert derived["backward"] == measured["backward"] == 2_927_204
    assert measured["optimizer step"] == derived["optimizer step"] == 1_269_724
    assert any("shared_expert_gate replicated_dtensor_output" in note for note in traced.notes), traced.notes
    assert any(note.startswith("FSDP2 over 2 ranks") for note in traced.notes), traced.notes


def test_an_expert_width_tp_does_not_divide_is_refused_in_one_line():
    from paramscope.api import inspect_with_module
    from paramscope.cost.traced.parallel import trace_parallel_training
    from paramscope.cost.traced.step import StepSettings
    from paramscope.errors import OptionError

    _, module = inspect_with_module(dict(QWEN3_MOE, moe_intermediate_size=30))
    with pytest.raises(OptionError, match=r"tp 4 does not divide the experts' intermediate size 30 of "
                                          r"model\.layers\.0\.mlp\.experts"):
        trace_parallel_training(module, StepSettings(batch=1, seq=32), tp=4)
