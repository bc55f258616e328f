"""The traced engine for multi-GPU layouts (issue 28 §3): one rank's step under FSDP2 and DTensor tensor parallel.

- The shards: after the layout is applied, every parameter's local tensor is what its rule says (colwise: out/tp
  rows; rowwise: in/tp columns; vocab-parallel embedding and head: vocab/tp rows; FSDP2: torch.chunk's rows of
  dim 0, stored padded to ceil(dim0 / dp)), read from torch's own DTensors.
- dp 1 × tp 1 measures what trace_training measures, to the byte: the fake process group and the mesh change
  nothing.
- The traced figures of a few layouts of a tiny Llama are pinned, and their invariants checked from the rules.
- Refusals are one line naming the value.
"""

from __future__ import annotations

import math

import pytest

from paramscope.cost.traced.parallel import Layout, check_layout, parallel_copy, trace_parallel_training
from paramscope.cost.traced.step import StepSettings, trace_training
from paramscope.errors import OptionError, UnsupportedError

SETTINGS = StepSettings(batch=2, seq=64)
LLAMA = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=1000)


def _meta(cls_name, config_name, **fields):
    import torch
    import transformers

    config = getattr(transformers, config_name)(**fields)
    with torch.device("meta"):
        return getattr(transformers, cls_name)(config)


@pytest.fixture(scope="module")
def llama():
    return _meta("LlamaForCausalLM", "LlamaConfig", **LLAMA)


@pytest.fixture(scope="module")
def bert():
    return _meta("BertForMaskedLM", "BertConfig", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, vocab_size=1000, max_position_embeddings=128)


@pytest.fixture(scope="module")
def mixtral():
    return _meta("MixtralForCausalLM", "MixtralConfig", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, num_local_experts=4,
                 num_experts_per_tok=2)


@pytest.fixture(scope="module")
def qwen2_moe():
    return _meta("Qwen2MoeForCausalLM", "Qwen2MoeConfig", hidden_size=128, intermediate_size=256,
                 moe_intermediate_size=64, shared_expert_intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, num_experts=6, num_experts_per_tok=2)


def _params(module):
    return dict(module.named_parameters())


def _local(param):
    return getattr(param, "_local_tensor", param)


def _phases(step):
    return [(p.phase, p.bytes, dict(p.by_category)) for p in step.phases]


# --- the shards are what the rules say ----------------------------------------------------------------------------

# (suffix of a parameter's name, the dimension tensor parallel splits); every other parameter is whole
LLAMA_RULES = ((".q_proj.weight", 0), (".k_proj.weight", 0), (".v_proj.weight", 0), (".gate_proj.weight", 0),
               (".up_proj.weight", 0), (".o_proj.weight", 1), (".down_proj.weight", 1),
               ("embed_tokens.weight", 0), ("lm_head.weight", 0))
BERT_RULES = ((".query.weight", 0), (".query.bias", 0), (".key.weight", 0), (".key.bias", 0), (".value.weight", 0),
              (".value.bias", 0), (".intermediate.dense.weight", 0), (".intermediate.dense.bias", 0),
              (".attention.output.dense.weight", 1), ("layer.0.output.dense.weight", 1),
              ("layer.1.output.dense.weight", 1), ("word_embeddings.weight", 0), ("cls.predictions.decoder.weight", 0),
              ("cls.predictions.decoder.bias", 0), ("cls.predictions.bias", 0))


@pytest.fixture(scope="module")
def qwen3():
    return _meta("Qwen3ForCausalLM", "Qwen3Config", **dict(LLAMA, head_dim=32))


# Qwen3's per-head q_norm and k_norm: replicated_with_grad_allreduce in its plan, whole on every rank
@pytest.mark.parametrize("name, rules", [("llama", LLAMA_RULES), ("qwen3", LLAMA_RULES), ("bert", BERT_RULES)])
def test_tensor_parallel_shards_follow_the_rules(name, rules, request):
    from torch.distributed.tensor import DTensor, Replicate, Shard

    module = request.getfixturevalue(name)
    tp = 2
    with parallel_copy(module, SETTINGS, Layout(tp=tp)) as (model, notes, _):
        params = _params(model)
        assert params.keys() == _params(module).keys()
        for key, meta in _params(module).items():
            param = params[key]
            assert isinstance(param, DTensor), key  # sharded, or replicated as DTensor for the one optimizer
            axis = next((axis for suffix, axis in rules if key.endswith(suffix)), None)
            expected = list(meta.shape)
            if axis is None:
                assert param.placements == (Replicate(),), key
            else:
                assert param.placements == (Shard(axis),), key
                expected[axis] //= tp
            assert list(param._local_tensor.shape) == expected, key
    source = {"bert": "Megatron's names (BertConfig has no base_model_tp_plan)",
              "qwen3": "Qwen3Config.base_model_tp_plan", "llama": "LlamaConfig.base_model_tp_plan"}[name]
    assert any(f"from {source}:" in note for note in notes)


def test_tied_head_stays_tied_to_the_vocab_parallel_embedding(bert):
    with parallel_copy(bert, SETTINGS, Layout(tp=2)) as (model, _, _):
        assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
        assert model.cls.predictions.decoder.bias is model.cls.predictions.bias


def test_kv_heads_are_replicated_when_tp_exceeds_them(llama):
    # 8 query heads, 2 KV heads of 32: at tp 8 each rank holds one query head and the one KV head it uses
    with parallel_copy(llama, SETTINGS, Layout(tp=8)) as (model, notes, _):
        attention = model.model.layers[0].self_attn
        assert tuple(attention.q_proj.weight._local_tensor.shape) == (32, 256)
        assert tuple(attention.k_proj.weight._local_tensor.shape) == (32, 256)
        assert tuple(attention.v_proj.weight._local_tensor.shape) == (32, 256)
        assert attention.num_key_value_groups == 1
    assert any("each KV head replicated 4×" in note for note in notes)
    step = trace_parallel_training(llama, SETTINGS, tp=8)
    assert step.peak.bytes > 0
    original = llama.model.layers[0].self_attn  # the module traced is left alone
    assert original.k_proj.weight.is_meta and tuple(original.k_proj.weight.shape) == (64, 256)
    assert original.num_key_value_groups == 4


def _chunk_rows(rows, dp, rank):
    """torch.chunk's rows for `rank`, as FSDP2 splits dim 0."""
    size = math.ceil(rows / dp)
    return max(0, min(size, rows - rank * size))


@pytest.mark.parametrize("name, dp, rank", [("llama", 4, 3), ("mixtral", 4, 0), ("qwen2_moe", 4, 3), ("bert", 3, 2)])
def test_fsdp_shards_are_padded_chunks_of_dim_0(name, dp, rank, request):
    from torch.distributed.tensor import DTensor, Shard

    module = request.getfixturevalue(name)
    with parallel_copy(module, SETTINGS, Layout(dp=dp, shard="fsdp", rank=rank)) as (model, _, _):
        params = _params(model)
        for key, meta in _params(module).items():
            param = params[key]
            assert isinstance(param, DTensor) and param.placements == (Shard(0),), key
            rows, rest = meta.shape[0], meta.shape[1:]
            assert list(param._local_tensor.shape) == [_chunk_rows(rows, dp, rank), *rest], key
            padded = math.ceil(rows / dp) * math.prod(rest) * meta.element_size()
            assert param._local_tensor.untyped_storage().nbytes() == padded, key


def test_two_dimensional_shards_are_fsdp_chunks_of_the_tp_shards(llama):
    from torch.distributed.tensor import Shard

    dp, tp, rank = 2, 2, 3
    with parallel_copy(llama, SETTINGS, Layout(dp=dp, shard="fsdp", tp=tp, rank=rank)) as (model, _, _):
        params = _params(model)
        for key, meta in _params(llama).items():
            param = params[key]
            axis = next((axis for suffix, axis in LLAMA_RULES if key.endswith(suffix)), None)
            shape = list(meta.shape)
            if axis is not None:
                shape[axis] //= tp
                assert param.placements[1] == Shard(axis), key
            assert param.device_mesh.mesh_dim_names == ("dp", "tp")
            # FSDP2 splits dim 0 of the tp shard: Shard(0), or _StridedShard(0) over a tp Shard(0)
            assert getattr(param.placements[0], "dim", None) == 0, key
            assert list(param._local_tensor.shape) == [_chunk_rows(shape[0], dp, rank // tp), *shape[1:]], key


def test_moe_experts_shard_under_fsdp_and_tensor_parallel(mixtral):
    """FSDP2 alone, and FSDP2 over the packed experts' tensor-parallel shards (moe_parallel.py's style): 2-D."""
    step = trace_parallel_training(mixtral, SETTINGS, dp=4, shard="fsdp")
    assert any("fully_shard on each of the 2 FSDPMixtralDecoderLayer of model.layers" in n for n in step.notes)
    step = trace_parallel_training(mixtral, SETTINGS, dp=2, shard="fsdp", tp=2)
    assert any("mlp.experts moe_tp_experts" in n for n in step.notes), step.notes


# --- the measurement ------------------------------------------------------------------------------------------

def test_one_rank_measures_what_trace_training_measures(llama):
    for settings in (SETTINGS, StepSettings(batch=2, seq=64, precision="bf16-mixed", grad_checkpointing=True)):
        alone, parallel = trace_training(llama, settings), trace_parallel_training(llama, settings)
        assert parallel.resident == alone.resident
        assert parallel.end_of_forward == alone.end_of_forward
        assert _phases(parallel) == _phases(alone)
        assert parallel.kept_by_module == alone.kept_by_module
        assert parallel.notes[1:] == alone.notes


# The tiny Llama's traced steps, pinned (torch 2.13, transformers 5.24; fp32, AdamW, batch 2 × 64):
# resident parameters, then each phase's peak bytes
PINNED = {
    "fsdp dp 4": (dict(dp=4, shard="fsdp"), 1_627_392, (16_006_612, 17_948_636, 6_509_780)),
    "tp 2": (dict(tp=2), 3_257_344, (14_418_644, 14_674_652, 14_054_612)),
    "tp 2 sp": (dict(tp=2, sp=True), 3_257_344, (13_827_540, 14_018_012, 14_059_732)),
    "dp 2 × tp 2": (dict(dp=2, shard="fsdp", tp=2), 1_628_672, (11_673_812, 12_416_220, 6_515_924)),
}


@pytest.fixture(scope="module")
def pinned(llama):
    return {key: trace_parallel_training(llama, SETTINGS, **layout) for key, (layout, _, _) in PINNED.items()}


@pytest.mark.parametrize("key", list(PINNED))
def test_pinned_peaks(key, pinned, llama):
    _, parameters, peaks = PINNED[key]
    step = pinned[key]
    assert step.resident["parameters"] == parameters
    assert tuple(p.bytes for p in step.phases) == peaks
    assert [p.phase for p in step.phases] == ["forward", "backward", "optimizer step"]
    # AdamW: two moments per local element and a 4-byte step count per parameter
    count = len(list(llama.parameters()))
    assert step.resident["optimizer states"] == 2 * parameters + 4 * count


def test_tensor_parallel_parameters_are_the_replicated_plus_the_sharded_over_tp(llama, pinned):
    sharded = sum(p.numel() * 4 for key, p in _params(llama).items()
                  if any(key.endswith(suffix) for suffix, _ in LLAMA_RULES))
    replicated = sum(p.numel() * 4 for p in llama.parameters()) - sharded
    for key in ("tp 2", "tp 2 sp"):
        assert pinned[key].resident["parameters"] == replicated + sharded // 2


def test_fsdp_parameters_are_the_padded_shards(llama, pinned):
    padded = sum(math.ceil(p.shape[0] / 4) * math.prod(p.shape[1:]) * 4 for p in llama.parameters())
    assert pinned["fsdp dp 4"].resident["parameters"] == padded
    step = pinned["fsdp dp 4"]
    assert step.phases[2].by_category["gradients"] == padded  # the reduce-scattered gradients, padded alike
    assert step.phases[0].by_category["parameters"] > padded  # a layer's gathered parameters during the forward


def test_sequence_parallel_splits_the_residual_stream(llama, pinned):
    seen = []
    with parallel_copy(llama, SETTINGS, Layout(tp=2, sp=True)) as (model, _, _):
        import torch

        norm = model.model.layers[1].input_layernorm
        handle = norm.register_forward_hook(lambda _m, args, out: seen.append((_local(args[0]).shape, _local(out).shape)))
        with torch.no_grad():
            model(input_ids=torch.zeros((2, 64), dtype=torch.long))
        handle.remove()
    ((given, returned),) = seen
    assert tuple(given) == (2, 32, 256) and tuple(returned) == (2, 32, 256)  # a local half of the sequence
    with_sp, without = pinned["tp 2 sp"], pinned["tp 2"]
    assert with_sp.phases[0].by_category["activations"] < without.phases[0].by_category["activations"]


def test_the_vocab_parallel_embedding_gradient_is_whole_as_the_note_says(llama, pinned):
    """torch's DTensor returns the embedding's gradient Replicate: the note says so, and the trace carries it."""
    import torch
    from torch.distributed.tensor import Replicate

    from paramscope.cost.traced.step import loss_of, training_inputs

    with parallel_copy(llama, SETTINGS, Layout(tp=2)) as (model, _, _):
        loss_of(model(**training_inputs(model, SETTINGS))).backward()
        grad = model.model.embed_tokens.weight.grad
        assert grad.placements == (Replicate(),) and tuple(grad._local_tensor.shape) == (1000, 256)
        del grad
        torch.nn.Module.zero_grad(model)
    assert any("embedding's gradient Replicate: the whole 1000 × 256 gradient" in n for n in pinned["tp 2"].notes)
    # every other gradient is its parameter's shard: gradients exceed parameters by the half the shard leaves out
    step = pinned["tp 2"].phases[2].by_category
    assert step["gradients"] - step["parameters"] == 1000 * 256 * 4 // 2


def test_notes_name_the_plan_and_its_sources(pinned):
    notes = pinned["dp 2 × tp 2"].notes
    assert notes[0].startswith("rank 0 of 4 (dp 2 (FSDP2) × tp 2) on a fake process group")
    assert "tensor parallel over 2 ranks, from LlamaForCausalLM._tp_plan: lm_head colwise_gather_output" in notes
    assert ("tensor parallel over 2 ranks, from transformers' default (init_parallel_plans): model.embed_tokens "
            "embedding_rowwise") in notes
    assert any(n.startswith("tensor parallel over 2 ranks, from LlamaConfig.base_model_tp_plan: "
                            "model.layers.*.self_attn.q_proj colwise") for n in notes)
    assert any(n.startswith("FSDP2 over 2 ranks: fully_shard on each of the 2 FSDPLlamaDecoderLayer") for n in notes)


def test_replication_without_sharding_names_ddp_buckets(llama):
    step = trace_parallel_training(llama, SETTINGS, dp=2)
    alone = trace_training(llama, SETTINGS)
    assert _phases(step) == _phases(alone)
    trainable = sum(p.numel() * 4 for p in llama.parameters())
    assert any(f"gradient buckets, one more copy of the trainable gradients ({trainable:,} B)" in n
               for n in step.notes)


# --- refusals ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(tp=3), "tp 3 does not divide the 8 attention heads of LlamaForCausalLM"),
    (dict(tp=0), "tp must be an integer between 1 and 65,536, got 0"),
    (dict(dp=True), "dp must be an integer between 1 and 65,536, got True"),
    (dict(shard="zero3"), "unknown shard 'zero3'; use one of none, fsdp"),
    (dict(sp=True), "sp splits the sequence over the tensor-parallel ranks: it needs tp > 1, got tp 1"),
    (dict(dp=2, tp=2, rank=4), "rank must be an integer between 0 and 3 (dp × tp - 1), got 4"),
])
def test_layouts_that_do_not_fit_are_refused_in_one_line(llama, kwargs, message):
    with pytest.raises(OptionError) as err:
        trace_parallel_training(llama, SETTINGS, **kwargs)
    assert str(err.value) == message


def test_widths_and_sequences_that_tp_does_not_divide_are_refused():
    import torch.distributed as dist

    odd_mlp = _meta("LlamaForCausalLM", "LlamaConfig", **dict(LLAMA, intermediate_size=500))
    with pytest.raises(OptionError, match=r"^tp 8 does not divide the intermediate size 500 of LlamaForCausalLM$"):
        trace_parallel_training(odd_mlp, SETTINGS, tp=8)
    three_kv = _meta("LlamaForCausalLM", "LlamaConfig", **dict(LLAMA, num_attention_heads=6, num_key_value_heads=3,
                                                               hidden_size=192))
    with pytest.raises(OptionError, match=r"^tp 2 does not divide the 3 KV heads of LlamaForCausalLM, nor do"):
        trace_parallel_training(three_kv, SETTINGS, tp=2)
    llama = _meta("LlamaForCausalLM", "LlamaConfig", **LLAMA)
    with pytest.raises(OptionError, match=r"^sequence parallel .*: tp 2 does not divide seq 63$"):
        trace_parallel_training(llama, StepSettings(batch=2, seq=63), tp=2, sp=True)
    assert not dist.is_initialized()  # every refusal leaves no process group behind


def test_what_is_not_traced_is_refused(llama):
    import torch.distributed as dist

    with pytest.raises(UnsupportedError, match="frozen parameters under FSDP2 are not traced"):
        trace_parallel_training(llama, StepSettings(batch=2, seq=64, frozen=frozenset({"lm_head.weight"})), dp=2,
                                shard="fsdp")
    assert not dist.is_initialized()


def test_a_process_group_already_running_is_left_alone(llama):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        with pytest.raises(UnsupportedError, match="a torch process group is already initialised"):
            trace_parallel_training(llama, SETTINGS, dp=2, shard="fsdp")
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


def test_check_layout_keeps_the_layout():
    assert check_layout(2, "fsdp", 4, True, 7) == Layout(2, "fsdp", 4, True, 7)
    assert Layout(2, "fsdp", 4, True, 7).world == 8
