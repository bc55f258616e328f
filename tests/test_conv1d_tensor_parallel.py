"""Tensor parallelism over GPT-2's Conv1D projections (traced/conv1d_parallel.py): Megatron's cut (c_attn column-
parallel with the fused q | k | v regrouped per rank, mlp.c_fc column-parallel, the c_projs row-parallel) as torch
ParallelStyles, so GPT2LMHeadModel traces under DTensor tensor parallelism on torch's fake process group, the
analytic rules (parallel/rules.py) hold the same shard of every parameter, and the derived per-device step equals
the traced rank."""

from __future__ import annotations

import pytest
import torch

from paramscope.cost.traced.conv1d_parallel import grouped_qkv

GPT2 = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=64, n_layer=6, n_head=4, vocab_size=1024,
            n_positions=128)


def test_each_rank_holds_its_heads_q_k_and_v_and_the_partial_sums_add_up():
    """Real tensors: rank r's Shard(1) of the regrouped fused weight (and Shard(0) of its bias) is its heads' q, then
    the same heads' k and v, so the class's own split(h / t) cuts it; the ranks' attention outputs through their rows
    of c_proj, plus c_proj's bias once, sum to the whole layer's output (what the all-reduce completes)."""
    torch.manual_seed(0)
    hidden, heads, tp, tokens = 8, 4, 2, 5
    head_dim, width = hidden // heads, hidden // tp
    c_attn_w = torch.randn(hidden, 3 * hidden, dtype=torch.float64)
    c_attn_b = torch.randn(3 * hidden, dtype=torch.float64)
    c_proj_w, c_proj_b = torch.randn(hidden, hidden, dtype=torch.float64), torch.randn(hidden, dtype=torch.float64)
    x = torch.randn(tokens, hidden, dtype=torch.float64)

    def attend(q, k, v):
        q, k, v = (t.view(tokens, -1, head_dim).transpose(0, 1) for t in (q, k, v))
        out = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        return out.transpose(0, 1).reshape(tokens, -1)

    whole = attend(*torch.addmm(c_attn_b, x, c_attn_w).split(hidden, dim=1))
    weight, bias = grouped_qkv(c_attn_w, tp), grouped_qkv(c_attn_b, tp)
    total = c_proj_b.clone()
    for rank in range(tp):
        local_w, local_b = weight.chunk(tp, dim=1)[rank], bias.chunk(tp, dim=0)[rank]
        q, k, v = local_w.split(width, dim=1)
        cut = slice(rank * width, (rank + 1) * width)
        assert torch.equal(q, c_attn_w[:, cut]) and torch.equal(v, c_attn_w[:, 2 * hidden:][:, cut])
        assert torch.equal(k, c_attn_w[:, hidden:2 * hidden][:, cut])
        assert torch.equal(local_b.split(width)[1], c_attn_b[hidden:2 * hidden][cut])
        part = attend(*torch.addmm(local_b, x, local_w).split(width, dim=1))
        assert torch.allclose(part, whole[:, cut])
        total = total + part @ c_proj_w.chunk(tp, dim=0)[rank]
    assert torch.allclose(total, whole @ c_proj_w + c_proj_b)


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2 sp"])
def test_traced_shards_equal_the_analytic_placements(sp):
    """Every parameter's local shape on the traced rank (rank 0 of tp 2) equals parallel/rules.py's placement
    (Conv1D weights [in, out]: c_attn and c_fc cut on dim 1 with their biases, the c_projs on dim 0 with their biases
    whole, wte vocab-parallel and tied to the head, wpe whole), the attention's widths are the rank's, and a forward
    gives the whole logits."""
    from paramscope.api import inspect_with_module
    from paramscope.cost.model_view import from_module
    from paramscope.cost.parallel.rules import placements_for
    from paramscope.cost.parallel.layout import layout_for
    from paramscope.cost.traced.parallel import Layout, parallel_copy
    from paramscope.cost.traced.step import StepSettings

    report, module = inspect_with_module(GPT2)
    placements = {p.name: p for p in placements_for(report, from_module(module), layout_for(devices=2, tp=2, sp=sp))}
    settings = StepSettings(batch=1, seq=64, precision="bf16-mixed", optimizer="adamw")
    with parallel_copy(module, settings, Layout(tp=2, sp=sp)) as (model, notes, _):
        local = {name: tuple(getattr(p, "_local_tensor", p).shape) for name, p in model.named_parameters()}
        attn = model.transformer.h[0].attn
        assert [str(p.placements[0]) for p in (attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight,
                                               attn.c_proj.bias)] == ["S(1)", "S(0)", "S(0)", "R"]
        assert (attn.split_size, attn.num_heads) == (32, 2)
        assert model.lm_head.weight is model.transformer.wte.weight
        # a batch of 2 keeps its shape through GPT2Model's view of the final norm's output to the whole sequence
        # (a rank's local half-sequence would refold into half the batch)
        logits = model(input_ids=torch.zeros((2, 16), dtype=torch.long)).logits
        assert tuple(logits.shape) == (2, 16, 1024)
    assert local == {name: p.local_shape for name, p in placements.items()}
    assert local["transformer.h.0.attn.c_attn.weight"] == (64, 96) and local["transformer.wte.weight"] == (512, 64)
    assert placements["transformer.h.0.mlp.c_proj.weight"].tp == "row"
    assert placements["transformer.h.0.mlp.c_proj.bias"].tp == "replicated"
    assert any("attn.c_attn conv1d_colwise_qkv" in note for note in notes), notes


def test_derived_device_step_equals_the_traced_rank():
    """`memory --training --tp 2 --sp` on a 6-layer GPT-2 cut: the per-device step derived from traces of short cuts
    with the layout applied equals the whole model's traced rank: forward and backward (the peak) to the byte, the
    optimizer step within the 512 B (two h-sized fp32 tensors) the traced step still holds; the tied wte's gradient
    is the head's Shard(0), never whole on a rank. (Without --sp the same cut agrees as exactly: 5,148,728 B at the
    backward peak; not repeated here for CI time.)"""
    from paramscope.cost.parallel.layout import layout_for

    from parallel_steps import derived_and_traced

    estimate, traced = derived_and_traced(GPT2, layout_for(devices=2, tp=2, sp=True), batch=1)
    assert estimate.engine == "derived", estimate.notes
    derived = {p.phase: p.bytes for p in estimate.training.device.phases}
    measured = {p.phase: p.bytes for p in traced.phases}
    assert derived["forward"] == measured["forward"] and derived["backward"] == measured["backward"], (derived,
                                                                                                      measured)
    assert estimate.peak == traced.peak.bytes == measured["backward"]
    assert 0 <= measured["optimizer step"] - derived["optimizer step"] <= 2 * 64 * 4, (derived, measured)
