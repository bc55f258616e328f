"""The layout search under FSDP2's MixedPrecisionPolicy beside a pipeline and tensor parallel: each stage replays the
policy's FSDP2 tp rank as memory's do (pipeline_replay.py: every unit of the stage gathered in 16 bits, its gradients
unsharded in fp32 until the step's reduce), so the search's peak is memory's to the byte. The Llama closed form over
bf16-pure's stages (the derivation off) lies under that replay beside tp (tp's layers and the backward's moments are
not its): on llama-3-70b, dp 2 × tp 8 × pp 4 over 64 H100s, 32 microbatches of 2,048 tokens, the search's row was
40,261,027,028 B against memory's 41,654,762,708 B; now 41,654,762,708 (both 45,332,118,740 since stage 0 holds its
vocabulary-parallel embedding's fp32 gradient whole, pipeline_replay.UNSYNCED; 44,846,597,332 since a later backward
is replayed without the FSDP2 rank's own gathers and reduce-scatters, unsynced_backward.backward_gathers_apart)."""

from __future__ import annotations

from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.parallel.layout import layout_for
from paramscope.cost.parallel.layout_evaluation import LayoutEvaluator, policy_derived
from paramscope.cost.parallel.search_options import SearchOptions

SEQ = 64


def _config():
    import transformers as T

    return T.LlamaConfig(num_hidden_layers=4, architectures=["LlamaForCausalLM"], hidden_size=128,
                         intermediate_size=448, num_attention_heads=4, num_key_value_heads=2, vocab_size=512)


def test_the_search_s_policy_pipeline_beside_tp_is_memory_s_replay():
    """dp 2 × tp 2 (sequence parallel) × pp 2, 4 microbatches of 2 × 64: memory replays the policy's tp rank (stage 0
    peaks, 1F1B's steady state, its vocabulary-parallel embedding's fp32 gradient whole: UNSYNCED); the closed form
    with the derivation off is 698,368 B under it on stage 0; the search asks the replay, memory's peak to the
    byte. Stage 0's peak, its later backward inside layer 1's backward, 5,864,140 → 5,642,444 B: there the replayed
    rank held layer 1's 16-bit parameters copied out of its all-gather (taken off as the running gather) and layer
    0's prefetched all-gather output (221,696 B, not taken off), neither of which the stage makes; a later backward
    is replayed without the rank's gathers and reduce-scatters (unsynced_backward.backward_gathers_apart, held to
    the trace on this cut as one stage: tests/test_fsdp_pipeline_stage.py)."""
    config = _config()
    layout = layout_for(dp=2, tp=2, sp=True, pp=2, zero="fsdp", micro_batches=4, batch=8,
                        fsdp_mixed_precision="policy")

    def device(derive):
        _, estimate, _ = training_answer(config, TrainingOptions(batch=8, seq=SEQ, precision="bf16-mixed", fits=False,
                                                                 layout=layout, derive_layout=derive))
        return estimate.training.device

    memory, closed = device(True), device(False)
    assert memory.activations_from.startswith("derived")
    assert [r.peak for r in memory.stages] == [5_642_444, 4_828_124]
    assert [r.peak for r in closed.stages] == [4_944_076, 4_828_140]  # stage 0: 698,368 B under the replay
    report, _, view = training_answer(config, TrainingOptions(batch=1, seq=SEQ, fits=False))
    options = SearchOptions(devices=8, gpu="h100", seq=SEQ, fsdp_mixed_precision="policy")
    evaluator = LayoutEvaluator(report, view, options, SEQ)
    assert policy_derived(layout, evaluator.facts)
    candidate = evaluator.evaluate(layout, 8)
    assert candidate.peak == memory.peak == 5_642_444
    # without tp, or beside cp, the closed form answers (memory's too beside cp): not derived
    assert not policy_derived(layout_for(dp=2, pp=2, zero="fsdp", micro_batches=4, batch=8,
                                         fsdp_mixed_precision="policy"), evaluator.facts)
