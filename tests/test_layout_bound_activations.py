"""The layout search's lower bound for a class whose step is derived from traces (layout_bound.py): beside the model
states, the rank's share of what one device's derived forward leaves live (each batch-following allocation at the
rank's S / cp tokens, over tp × ep). It never exceeds the rank's derived peak: on each layout the search derives
here, bound ≤ peak, exact integers, and above the states alone (the bound it replaces).
GPT-2's cut of tests/test_layout_search_stages.py (5 layers, h 128), 2 devices, 2 × 64 tokens: dp 2 (an FSDP2 rank
at batch 1), tp 2 (a tensor-parallel rank with sequence parallel at batch 2), pp 2 (stages replayed: the states
alone); and the small Mixtral cut's ep 2 rank under FSDP2. Each in a cache of its own.
No context parallel layout here: GPT-2's attention dropout refuses cp, and another config is more derivations."""

from __future__ import annotations

import json

import pytest

from parallel_steps import small_mixtral

GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 128, "n_head": 4, "n_layer": 5,
        "vocab_size": 500, "bos_token_id": 0, "eos_token_id": 0}


def _bounds_and_peaks(tmp_path_factory, name: str, config: dict, **options) -> dict:
    """{layout's (dp, tp, pp, cp, ep): (its bound, its first stage's states, its evaluated peak)} for every layout
    the search answered, every derivation allowed, in a cache of its own."""
    from paramscope.cost.parallel import layout_derivation
    from paramscope.cost.parallel.layout_evaluation import LayoutEvaluator
    from paramscope.cost.parallel.search import SearchOptions, find_layouts

    root = tmp_path_factory.mktemp(name)
    path = root / "config.json"
    path.write_text(json.dumps(config))
    found = {}
    evaluate = LayoutEvaluator.evaluate

    def recorded_evaluate(self, layout, replica):
        bound, states = self.bound(layout, replica), self.lower_bound.states_bytes(layout)
        result = evaluate(self, layout, replica)
        if result is not None and hasattr(result, "peak"):
            found[(layout.dp, layout.tp, layout.pp, layout.cp, layout.ep)] = (bound, states, result.peak)
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PARAMSCOPE_CACHE_DIR", str(root / "cache"))
        patch.setattr(layout_derivation, "MAX_DERIVED", 100)
        patch.setattr(LayoutEvaluator, "evaluate", recorded_evaluate)
        find_layouts(str(path), SearchOptions(devices=2, gpu="h100", global_batch=2, fsdp_mixed_precision="autocast",
                                              **options))  # the convention these peaks were pinned in
    return found


def test_gpt2_bound_with_activations_never_exceeds_the_derived_peak(tmp_path_factory):
    found = _bounds_and_peaks(tmp_path_factory, "gpt2", GPT2, seq=64)
    for key, (bound, states, peak) in found.items():
        assert states <= bound <= peak, (key, bound, peak)
    # without a pipeline the bound rises above the states alone: the rank's share of the forward's held activations
    # (bound, the states alone, the peak): without a pipeline the bound rises above the states by the rank's share of
    # the one-device forward's held allocations (dp 2: the batch-1 recipe's, whose sizes follow the tokens alone)
    # tp 2 and one device run their replica's 2 sequences as 2 micro-steps of one (gradient accumulation): bounded at
    # their first micro-step, batch 1, where no derived share is kept beside the states (at 2 at once: 11,998,464 and
    # 22,374,656 B; their peaks 13,976,472 and 25,258,520 B)
    assert found == {(2, 1, 1, 1, 1): (11_187_720, 9_493_760, 15_904_520),
                     (1, 2, 1, 1, 1): (10_575_104, 10_575_104, 14_124_432),
                     (1, 1, 1, 1, 1): (18_987_264, 18_987_264, 25_548_816),
                     # a pipeline's stages: the states alone
                     (1, 1, 2, 1, 1): (12_638_360, 12_638_360, 16_876_184)}


def test_mixtral_expert_rank_share_never_exceeds_the_derived_peak(cache, tmp_path):
    """dp 2 × ep 2 under FSDP2: the experts' rank derived as memory derives it. The small cut's one-device step is the
    analytic engine's, so the search bounds it by the closed form; the derived share is held under the rank's peak
    here directly (over ep: balanced routing gives the rank as many pairs as one device, the division a margin)."""
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.parallel.layout import layout_for
    from paramscope.cost.parallel.layout_evaluation import LayoutEvaluator
    from paramscope.cost.parallel.search import SearchOptions

    path = tmp_path / "config.json"
    path.write_text(json.dumps(small_mixtral().to_dict()))
    layout = layout_for(dp=2, zero="fsdp", ep=2, batch=1, fsdp_mixed_precision="autocast")
    report, estimate, view = training_answer(str(path), TrainingOptions(batch=1, seq=32, layout=layout, fits=False))
    bound = LayoutEvaluator(report, view, SearchOptions(devices=2, gpu="h100", global_batch=2, seq=32,
                                                        fsdp_mixed_precision="autocast"), 32).lower_bound
    states = bound.first_stage(layout)[0]
    share = bound.derived_share(layout, 1)
    peak = estimate.training.device.peak
    assert (states.bytes, states.gradients, share, peak) == (4_701_888, 1_175_424, 601_988, 5_456_560)
    assert 0 < states.bytes - states.gradients + share <= peak
