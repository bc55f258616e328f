"""--find-layout --expert-load F: every ep > 1 layout is its busiest rank's (ParallelLayout.expert_load), answered as
`memory --expert-load F` answers it (its peak to the byte) and timed by the busiest rank's FLOPs; what memory refuses
under a load (cp beside ep) gets no derivation key; FSDP2 over more ranks than ep and beside tp a key each; the load is
in the derivation's key. One small cut (the 5-layer Mixtral), 4 devices, one derivation."""

from __future__ import annotations

import json

from paramscope.cost.parallel.layout import layout_for
from paramscope.cost.parallel.layout_derivation import derivation_key, derivation_words
from parallel_steps import small_mixtral

SEQ = 32


def test_the_load_is_in_the_derivation_key_and_refused_layouts_have_none():
    def key(load, **degrees):
        return derivation_key(layout_for(zero="fsdp", batch=4 // degrees["dp"], expert_load=load,
                                         fsdp_mixed_precision="autocast", **degrees), 4, 4)

    loaded, balanced = key(1.5, dp=4, ep=4), key(1, dp=4, ep=4)
    assert loaded != key(2, dp=4, ep=4) and loaded != balanced is not None  # FSDP2's rank is derived, balanced too
    assert derivation_words(loaded) == "ep 4, FSDP2, the busiest rank at 1.5× its share, batch 2 and up"
    # FSDP2 over more ranks than ep (torchtitan's (dp / ep, ep) mesh): each degree a derivation of its own
    assert derivation_words(key(1.5, dp=4, ep=2)) == \
        "ep 2, FSDP2 over 4, the busiest rank at 1.5× its share, batch 2 and up"
    # beside tp under FSDP2 (torchtitan's ExpertTensorParallel on the (dp / ep, ep, tp) mesh): derived too
    assert derivation_words(key(1.5, dp=2, ep=2, tp=2)) == \
        "ep 2, tp 2, FSDP2, the busiest rank at 1.5× its share, batch 2 and up"
    # memory refuses this under a load, so the search spends no derivation and names memory's reason
    assert key(1.5, dp=2, cp=2, ep=2) is None
    # the pipeline replays the busiest (ep, tp) rank's recipe: its own key beside the balanced one
    assert key(1.5, dp=2, ep=2, tp=2, pp=2) != key(1, dp=2, ep=2, tp=2, pp=2)


def test_the_search_answers_each_ep_layout_as_its_busiest_rank(cache, tmp_path, monkeypatch):
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.parallel import layout_derivation
    from paramscope.cost.flops.estimate import FlopOptions, estimate_flops
    from paramscope.cost.parallel.search import SearchOptions, find_layouts

    monkeypatch.setattr(layout_derivation, "MAX_DERIVED", 1)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(small_mixtral().to_dict()))
    _, search, _ = find_layouts(str(path), SearchOptions(devices=4, gpu="h100", global_batch=4, seq=SEQ,
                                                         expert_load=1.5, context_parallel=False))
    answered = {(c.layout.dp, c.layout.tp, c.layout.pp, c.layout.ep): c for c in search.fitting}
    row = answered[(4, 1, 1, 4)]  # FSDP2 over exactly the ep ranks: the busiest rank derived with that routing
    assert row.layout.expert_load == 1.5
    _, estimate, _ = training_answer(str(path), TrainingOptions(batch=1, seq=SEQ, layout=row.layout, fits=False))
    assert row.peak == estimate.training.device.peak == 2_868_312  # under FSDP2's MixedPrecisionPolicy, the default
    # its step time is the busiest rank's: flops --expert-load's FLOPs, above the same layout balanced
    def hardware(layout):
        return estimate_flops(str(path), FlopOptions(batch=1, seq=SEQ, training=True, layout=layout,
                                                     devices=layout.devices)).device.hardware

    assert row.flops == hardware(row.layout) > hardware(layout_for(dp=4, zero="fsdp", ep=4, batch=1))
    # FSDP2 over more ranks than ep and beside tp are derived as memory derives them (tests/test_expert_fsdp.py): a
    # derivation each, beyond this search's cap of one, named so, not refused
    reasons = {(s.dp, s.tp, s.ep): s.reason for s in search.skipped if s.ep > 1}
    assert all(reasons[key].startswith("not derived: the search derives at most 1") for key in ((4, 1, 2), (2, 2, 2)))
    assert any(n.startswith("expert load 1.5 (a convention") for n in search.notes)
