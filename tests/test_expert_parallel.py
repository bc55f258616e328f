"""Expert parallelism traced (traced/expert_parallel.py): transformers' packed experts split over the ep ranks as
torchtitan's ExpertParallel splits them (Shard(0), two all-to-alls), one rank's step measured on torch's fake process
group under balanced routing, against the analytic `--ep` figure (parallel/estimate.py with parallel/experts.py)."""

from __future__ import annotations

import pytest
import torch

from test_moe_tensor_parallel import MIXTRAL


def test_balanced_dispatch_on_one_rank_is_transformers_grouped_forward():
    """Real tensors on a one-rank gloo group: the dispatching forward (sort, all-to-all, expert-major permute,
    grouped projections, unpermute, all-to-all back, routing weights) gives transformers' own grouped forward's
    output and gradients, on a routing that is balanced (each expert 3 of the 12 token-expert pairs)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import MixtralConfig
    from transformers.integrations.moe import grouped_mm_experts_forward
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    from paramscope.cost.traced.expert_parallel import expert_parallel_style

    torch.manual_seed(0)
    config = MixtralConfig(hidden_size=8, intermediate_size=4, num_local_experts=4, num_experts_per_tok=2)
    reference = MixtralExperts(config)
    for param in reference.parameters():
        torch.nn.init.normal_(param)
    hidden = torch.randn(6, 8)
    index = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2], [0, 2], [1, 3]])
    weights = torch.rand(6, 2)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        sharded = expert_parallel_style()._apply(MixtralExperts(config), mesh)
        for key in ("gate_up_proj", "down_proj"):
            getattr(sharded, key).to_local().data.copy_(getattr(reference, key).data)
        x1, x2 = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
        out = sharded(x1, index, weights)
        expected = grouped_mm_experts_forward(reference, x2, index, weights)
        assert torch.allclose(out, expected, atol=1e-5)
        out.square().sum().backward()
        expected.square().sum().backward()
        assert torch.allclose(x1.grad, x2.grad, atol=1e-4)
        assert torch.allclose(sharded.gate_up_proj.grad.to_local(), reference.gate_up_proj.grad, atol=1e-4)
    finally:
        dist.destroy_process_group()


def test_the_analytic_ep_figure_equals_the_traced_rank():
    """`memory --training --devices 2 --ep 2` on a 3-layer Mixtral cut at 1 × 64 tokens: rank 0 holds 2 of the 4
    experts of each layer (Shard(0)), everything else whole; the analytic figure (one device's step, the rank's
    model states, and the permute indices the dispatch keeps, 3 layers × 8 B × 128 pairs) is the traced rank's less
    488 B in the forward and backward, named, not modelled: the traced rank holds 8 B a token through the step beyond
    one device's, as the traced tensor-parallel rank does (the size of the [B, T] int64 token ids, which both wrap as
    DTensors), and its grouped projections keep an int32 offset per local expert a layer, E/ep of them against one
    device's E: 8·B·T − 4·(E − E/ep)·layers, here 512 − 24 (the same form on every cut measured: 2 and 3 layers, 32
    and 64 tokens, top-1, batch 2, 8 experts). At the optimizer step both are counted (estimate.held_at_step: the
    rank's own offsets and the ids, in place of one device's offsets): equal."""
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.parallel.layout import layout_for
    from paramscope.cost.traced.parallel import trace_parallel_training
    from paramscope.cost.traced.step import StepSettings

    layout = layout_for(devices=2, ep=2)
    report, estimate, view = training_answer(dict(MIXTRAL, num_hidden_layers=3),
                                             TrainingOptions(batch=1, seq=64, precision="bf16-mixed", layout=layout),
                                             use_cache=False)
    traced = trace_parallel_training(view.module, StepSettings(batch=1, seq=64, precision="bf16-mixed"), dp=2, ep=2)
    device = estimate.training.device
    assert [(b.name, b.bytes) for b in device.comm] == [("expert parallel's permute index", 3 * 8 * 64 * 2)]
    assert traced.resident["parameters"] == device.weights == 1_004_288
    analytic = {p.phase: p.bytes for p in device.phases}
    measured = {p.phase: p.bytes for p in traced.phases}
    assert {phase: measured[phase] - analytic[phase] for phase in measured} == \
        {"forward": 488, "backward": 488, "optimizer step": 0}, (analytic, measured)
    assert any("balanced routing" in note and "Shard(0) (2 of the 4 experts a rank)" in note
               for note in traced.notes), traced.notes


def test_expert_parallel_under_fsdp2_traced_beside_the_closed_form():
    """`--devices 2 --ep 2 --zero fsdp --trace` on the 3-layer Mixtral cut at 1 × 64: the experts split over the ep
    ranks, then FSDP2 as torchtitan composes the two (each layer's experts a unit of their own over the dp / ep = 1
    ranks holding the same experts, then each layer over the dp ranks, then the root). The rank's model states are
    the analytic ones to the byte; its moments are below the closed form's (one device's moments, the rank's states,
    FSDP2's gathered root and layer units and the permute index added at each): by 234,784 B in the forward (5.1%),
    138,776 B at the backward peak (2.9%); equal at the step (the rank's own E / ep expert offsets held there, not
    one device's E: it was 24 B above). On the same cut without expert parallelism the closed
    form is below the traced FSDP2 rank instead (its named gap: the root's unsharded gradients in the backward), so
    the closed form's FSDP2 timing, not expert parallelism, is what differs; not isolated further."""
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.parallel.layout import layout_for

    layout = layout_for(devices=2, ep=2, zero="fsdp", fsdp_mixed_precision="autocast")  # the closed form beside
    _, estimate, _ = training_answer(dict(MIXTRAL, num_hidden_layers=3), TrainingOptions(
        batch=1, seq=64, precision="bf16-mixed", layout=layout, trace=True), use_cache=False)
    device = estimate.training.device
    traced = device.traced
    assert traced.resident["parameters"] == device.weights == 797_056
    assert traced.resident["optimizer states"] == device.optimizer
    analytic = {p.phase: p.bytes for p in device.phases}
    measured = {p.phase: p.bytes for p in traced.phases}
    assert measured == {"forward": 4_604_248, "backward": 4_724_312, "optimizer step": 3_188_432}
    assert {phase: analytic[phase] - measured[phase] for phase in measured} == \
        {"forward": 234_784, "backward": 138_776, "optimizer step": 0}
    assert any("a unit of their own first, over the 1 rank holding the same experts" in n for n in traced.notes)
    assert any(n.startswith("check: rank 0's step traced") and "+2.937%" in n for n in device.notes), device.notes


@pytest.mark.parametrize("layout, why", [
    (dict(dp=2, ep=1, tp=2), None),
    (dict(dp=4, ep=2), "ep 2, dp 4"),
    (dict(dp=2, ep=2, shard="fsdp"), None),
    (dict(dp=2, ep=2, tp=2), None),  # each rank's experts also cut over tp (torchtitan's ExpertTensorParallel)
    (dict(dp=2, ep=2, tp=2, shard="fsdp"), None),  # torchtitan's (dp / ep, ep, tp) mesh (tests/test_expert_fsdp.py)
    (dict(dp=6, ep=4, shard="fsdp"), "ep 4, dp 6"),
])
def test_a_layout_the_expert_parallel_trace_does_not_take_is_refused_in_one_line(layout, why):
    from paramscope.cost.traced.parallel import check_layout
    from paramscope.errors import UnsupportedError

    args = dict(dp=1, shard="none", tp=1, sp=False, rank=0, ep=1) | layout
    if why is None:
        assert check_layout(**args).ep == args["ep"]
        return
    with pytest.raises(UnsupportedError, match=why):
        check_layout(**args)


def test_a_second_trace_with_another_top_k_gets_its_own_shapes():
    """DTensor's sharding-propagation caches key an op by its tensors' specs, not by topk's k: a trace after one of a
    top-1 router took [T, 1] for the top-2 router's scores and failed in its backward; each parallel trace now starts
    with the caches cleared."""
    from paramscope.api import inspect_with_module
    from paramscope.cost.traced.parallel import trace_parallel_training
    from paramscope.cost.traced.step import StepSettings

    settings = StepSettings(batch=1, seq=16, precision="bf16-mixed")
    saved = []
    for top_k in (1, 2):
        _, module = inspect_with_module(dict(MIXTRAL, num_hidden_layers=1, num_experts_per_tok=top_k))
        saved.append(trace_parallel_training(module, settings, dp=2, ep=2).saved_activations)
    assert saved[0] < saved[1]
