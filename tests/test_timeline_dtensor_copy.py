"""The step recorder (traced/timeline.py) lets DTensor desugar an operator into its local ones before it records, as
MemTracker does: a copy that DTensor makes and frees inside one operator (a redistribute's) is then seen. The tied
head beside tensor parallel is where it counts: the vocabulary-parallel embedding's backward returns the tied
weight's gradient whole (Replicate), and adding it to the head's Shard(0) gradient copies its local chunk out first,
beside the sum. Before, the recorder saw the DTensor add as one operator and missed that chunk: the derived rank of a
tied 4-layer Qwen2 cut at dp 2 × tp 2 under FSDP2's policy was 8,101,072 B against the traced 8,614,096 B (one local
16-bit gradient slice, 513,024 B, under; autocast's fp32 slice 1,026,048 B), qwen2.5-0.5b's --dp 4 --tp 2 --sp
--zero fsdp --seq 64 1,630,592,272 B against its closed form's 1,766,726,928 B (now equal)."""

from __future__ import annotations

from paramscope.cost.traced.timeline import allocation_recorder, live_bytes


def test_a_redistribute_copy_inside_a_dtensor_add_is_recorded_as_memtracker_sees_it():
    """Shard(0) + Replicate on 2 ranks of a fake process group: the Replicate's local 32 × 32 bf16 chunk copied
    (2,048 B) beside the sum (2,048 B), the copy freed when the add returns."""
    import torch
    import torch.distributed as dist
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (2,))
        whole = DTensor.from_local(torch.ones(64, 32, dtype=torch.bfloat16), mesh, [Replicate()])
        part = DTensor.from_local(torch.ones(32, 32, dtype=torch.bfloat16), mesh, [Shard(0)])
        recorder = allocation_recorder()
        for tensor in (whole, part):
            recorder.known(tensor)
        with recorder:
            total = part + whole
        tracker = MemTracker()
        tracker.track_external(whole, part)
        with tracker:
            again = part + whole
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    finally:
        dist.destroy_process_group()
    assert [a.nbytes for a in recorder.allocations] == [2048, 2048]
    assert live_bytes(recorder.events, recorder.allocations) == (2048, 4096)  # the sum kept; the copy beside it
    assert peak == 64 * 32 * 2 + 32 * 32 * 2 + 4096  # the two inputs, then the same 4,096 B
    assert total.to_local().shape == again.to_local().shape == (32, 32)


CUT = dict(hidden_size=128, intermediate_size=448, num_attention_heads=4, num_key_value_heads=1,
           tie_word_embeddings=True, num_hidden_layers=4, architectures=["Qwen2ForCausalLM"], vocab_size=4008)


def test_the_tied_head_beside_tp_records_what_memtracker_measures():
    """The tied 4-layer Qwen2 cut, dp 2 × tp 2, 16 tokens, FSDP2's policy: the recorded step (forward peak, live at
    the end of the forward, backward peak, above the step's start) and the traced rank (MemTracker) differ by the
    same bytes (the rank's resident states) at the forward's peak and at the backward's; the backward peak was
    3,897,480 B (513,024 under). Autocast's, measured, not tested (time): (3,905,104, 3,059,024, 7,489,160) against
    the traced 8,108,696 / 11,692,752 B, its backward peak 6,463,112 B before (1,026,048 under)."""
    import transformers as T

    from paramscope.build import build_class_on_meta
    from paramscope.cost.traced.parallel import trace_parallel_training, with_mixed_precision
    from paramscope.cost.traced.step import StepSettings
    from paramscope.cost.traced.timeline import record_training_step

    module = build_class_on_meta(T.Qwen2ForCausalLM, T.Qwen2Config(**CUT))
    settings = StepSettings(batch=1, seq=16, precision="bf16-mixed", optimizer="adamw")
    timeline = record_training_step(module, StepSettings(
        batch=1, seq=16, precision="bf16-mixed", optimizer="adamw",
        layout=with_mixed_precision((2, "fsdp", 2, False), "policy")), "model.layers")
    rank = trace_parallel_training(module, settings, dp=2, shard="fsdp", tp=2, mixed="policy")
    phases = {p.phase: p.bytes for p in rank.phases}
    assert timeline.peaks() == (1_666_640, 1_059_920, 4_410_504)
    assert (phases["forward"], phases["backward"]) == (5_870_232, 8_614_096)
    assert phases["forward"] - 1_666_640 == phases["backward"] - 4_410_504 == 4_203_592
