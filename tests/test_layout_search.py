"""Which layouts fit (issue 28 §5): `memory MODEL --training --gpu NAME --devices N --find-layout`.

The layout list for a preset on a GPU and the fewest devices, exactly; each communication formula written out by
hand from the parameters the sharding rules leave a device; bad input in one line.
"""

from __future__ import annotations

import json

import pytest

from paramscope.cli import main
from paramscope.cost.parallel.search import SearchOptions, divisors, find_layouts


@pytest.fixture(scope="module")
def qwen():
    """qwen2.5-0.5b, 8 devices of 24 GiB, 1,024 tokens, DDP (no sharding): a small search, answered without a build."""
    return find_layouts("qwen2.5-0.5b", SearchOptions(devices=8, gpu="rtx-4090", seq=1024, zero="0"))


def test_qwen_layouts_and_fewest_devices(qwen):
    report, search, _ = qwen
    assert (search.global_batch, search.seq, search.shard) == (8, 1024, "none")
    assert (len(search.fitting), len(search.not_fitting), len(search.skipped)) == (16, 0, 2)
    # tp 4 and tp 8 split qwen2.5-0.5b's 14 heads: refused with the reason
    assert {s.tp for s in search.skipped} == {4, 8}
    assert all("would split attention heads" in s.reason for s in search.skipped)
    seconds = [c.seconds for c in search.fitting]
    assert seconds == sorted(seconds)
    best = search.best
    assert (best.layout.dp, best.layout.tp, best.layout.pp, best.layout.cp) == (4, 2, 1, 1)
    # its replica's 2 sequences as 2 micro-steps of one (gradient accumulation, the pipelines' microbatch): 9,055,217,544
    # B at once
    assert best.layout.sp and best.replica_batch == 2 and best.accumulation == 2 and best.peak == 7_245_235_600
    # the fewest: one device holds the global batch of 8 × 1,024 as 8 micro-steps of one sequence (gradient
    # accumulation; at once it did not, and two in a pipeline were the fewest)
    minimum = search.minimum
    assert minimum.devices == 1 and minimum.layout.accumulation == 8 and minimum.layout.peak == 12_400_201_104
    assert (minimum.layout.layout.dp, minimum.layout.layout.pp, minimum.layout.layout.micro_batches) == (1, 1, 1)
    assert [(t.devices, t.outcome) for t in minimum.tried] == [(1, "fits")] and minimum.floor == 1


def test_communication_formulas_by_hand(qwen):
    """dp 4 × tp 2, DDP: the gradients' ring all-reduce over 4 replicas, 2·3/4 × G, in each of its 2 micro-steps
    (gradient accumulation, no no_sync); tensor parallel's 4 collectives a layer + the embedding's and the head's,
    2·1/2 × b·s·h·2 B each."""
    from paramscope.cost.parallel.rules import placements_for
    from paramscope.cost.parallel.layout import ParallelLayout

    report, search, view = qwen
    best = search.best
    local = sum(p.local_numel for p in placements_for(report, view, ParallelLayout(tp=2)))
    gradients = 4 * local  # fp32 gradients under bf16-mixed
    terms = {t.kind: t for t in best.comm}
    assert terms["dp"].bytes == 2 * (2 * 3 * gradients // 4) == 2 * 1_482_230_016
    layers, hidden = 24, 896
    assert terms["tp"].bytes == (4 * layers + 2) * (2 * 1 * (2 * 1024 * hidden * 2)) // 2 == 359_661_568
    assert best.comm_bytes == terms["dp"].bytes + terms["tp"].bytes
    # context parallel: K and V of the rank's chunk, 3 passes (forward; K, V and their gradients back) × (cp − 1)
    cp = next(c for c in search.fitting if (c.layout.dp, c.layout.tp, c.layout.cp) == (1, 2, 4))
    ring = {t.kind: t for t in cp.comm}["cp"]
    kv_heads, head_dim = 2 // 2, 64
    assert ring.bytes == layers * 3 * 3 * (2 * 8 * 256 * kv_heads * head_dim * 2) == 113_246_208


def test_fsdp_bytes_by_hand():
    """FSDP2 over 8 data-parallel ranks: the parameters all-gathered forward and backward, the gradients
    reduce-scattered: 7/8 × (2P + G), P = G = the parameters in fp32."""
    report, search, _ = find_layouts("qwen2.5-0.5b", SearchOptions(devices=8, gpu="h100", seq=512, context_parallel=False,
                                                                    fsdp_mixed_precision="autocast"))
    dp8 = next(c for c in search.fitting if c.layout.dp == 8)
    params = 4 * sum(p.numel for p in report.params)
    assert dp8.layout.shard == "fsdp" and [t.kind for t in dp8.comm] == ["dp"]
    assert dp8.comm[0].bytes == -(-7 * 3 * params // 8)
    assert all(c.layout.cp == 1 for c in search.fitting + search.not_fitting)


def test_llama_3_70b_on_64_h100():
    """The issue's question: which layouts of 64 H100s train Llama-3-70B (global batch 64 × 2,048, FSDP2 under its
    MixedPrecisionPolicy, the default: torchtitan's). Every layout answered: the policy's closed form prices dp, tp, cp
    and pipelines without tp of the Llama family; a pipeline beside tp replays the policy's FSDP2 tp rank, as memory
    does (the closed form lay under it: dp 2 · tp 8 · pp 4 40,261,027,028 B, memory 41,654,762,708 B; 45,332,118,740
    B since stage 0 holds its vocabulary-parallel embedding's fp32 gradient whole, UNSYNCED; 44,846,597,332 B since a
    later backward is replayed without the FSDP2 rank's own gathers and reduce-scatters, which the stage makes none
    of: unsynced_backward.backward_gathers_apart)."""
    _, search, _ = find_layouts("llama-3-70b", SearchOptions(devices=64, gpu="h100"))
    # under autocast 24 fit (FSDP2 under a pipeline holding its units gathered and its gradients unsynced, as torch's
    # PipelineStage runs it); 32 before that was counted
    # (55: dp 2 · tp 2 · pp 16 fits, its later backward without the rank's gathers and reduce-scatters)
    assert (len(search.fitting), len(search.not_fitting), len(search.skipped)) == (55, 29, 0)
    # memory's answer to the byte (memory llama-3-70b --training --dp 2 --tp 8 --sp --pp 4 --zero fsdp --batch 32
    # --micro-batches 32): the search's closed form was 1,393,735,680 B under it; dp 4 · tp 2 · pp 8 no longer fits
    row = next(c for c in search.fitting if (c.layout.dp, c.layout.tp, c.layout.pp, c.layout.cp) == (2, 8, 4, 1))
    assert row.peak == 44_846_597_332
    assert not any((c.layout.dp, c.layout.tp, c.layout.pp) == (4, 2, 8) for c in search.fitting)
    assert all(c.layout.fsdp_mixed_precision == "policy" for c in search.fitting if c.layout.shard_degree > 1)
    # ranked by max(compute + exposed tp, NVLink, network) on 8-GPU NVLink nodes, a 400 Gb/s NIC a GPU across
    # (layout_time.py); tp inside a node on all of the first 23
    assert [(c.layout.dp, c.layout.tp, c.layout.pp, c.layout.cp, c.accumulation) for c in search.fitting[:5]] == [
        (1, 4, 2, 8, 1), (1, 8, 2, 4, 1), (2, 4, 2, 4, 1), (2, 8, 2, 2, 1), (4, 4, 2, 2, 1)]
    first = search.best  # compute-bound: 0.929 s at the peak
    assert first.step_bound == first.seconds == first.flops / 989.4e12 / (1 - first.bubble)
    assert (first.comm_time.network_bytes, first.comm_time.nvlink_bytes) == (34_004_322_304, 91_286_298_624)
    assert first.comm_time.exposed == 0 and not any(c.tp_spans_nodes for c in search.fitting[:23])
    # tp 16 spans two nodes: its collectives on the critical path (was 5th at 0.946 s, overlapped): 302 GiB of
    # all-gathers and reduce-scatters, 1/15 of it across, the rest on NVLink; the NVLink part the slower
    spanning = search.fitting[23]
    assert (spanning.layout.dp, spanning.layout.tp, spanning.layout.pp, spanning.layout.cp) == (1, 16, 2, 2)
    tp = next(t for t in spanning.comm if t.kind == "tp")
    assert tp.bytes == 64 * 161 * 2 * 15 * 1 * 1024 * 8192 * 2 // 16 == 324_135_813_120
    assert [(t.link, t.bytes) for t in spanning.comm_time.terms if t.exposed] == [
        ("network", 324_135_813_120 // 15), ("NVLink", 324_135_813_120 - 324_135_813_120 // 15)]
    assert spanning.comm_time.exposed == (324_135_813_120 - 21_609_054_208) / 450e9  # 0.672 s
    assert spanning.step_bound == spanning.seconds + spanning.comm_time.exposed  # 0.946 + 0.672 = 1.62 s
    assert [i for i, c in enumerate(search.fitting, 1) if c.tp_spans_nodes] == [24, 25, 27, 28, 31, 35, 36, 41, 42,
                                                                                  47]
    assert first.peak == 68_783_417_252
    accumulating = next(c for c in search.fitting if (c.layout.dp, c.layout.tp, c.accumulation) == (8, 8, 8))
    assert (accumulating.peak, accumulating.peak_phase) == (34_419_233_108, "backward, gradients held")
    assert accumulating.flops == 892_519_973_912_576 and accumulating.bubble == 0
    # FSDP2 gathers (bf16) and reduce-scatters (fp32) in each of the 8 micro-steps, every byte across nodes
    assert [(t.kind, t.bytes) for t in accumulating.comm] == [("dp", 493_940_572_160), ("tp", 151_263_379_456)]
    assert accumulating.step_bound == accumulating.comm_time.network == 493_940_572_160 / 50e9  # 9.88 s
    minimum = search.minimum  # every count from the states' floor up: 16 is the first that fits
    assert (minimum.devices, minimum.floor, minimum.untried) == (16, 14, None)
    layout = minimum.layout.layout
    assert (layout.dp, layout.tp, layout.pp, layout.cp) == (1, 2, 1, 8) and minimum.layout.peak == 82_500_226_388
    assert [(t.devices, t.outcome, t.layouts) for t in minimum.tried] == [
        (14, "none fits", 0), (15, "none fits", 0), (16, "fits", 22)]
    assert (minimum.bounded, search.evaluated) == (9, 106)


def test_every_degree_that_divides(capsys):
    """6 devices: layouts of 3 and 6 (dp, pp; tp 3 and 6 split Llama-3-8B's 32 heads, cp 3 and 6 its 2,048 tokens:
    named); the fewest devices is 3, not a power of two (1: the model states alone exceed an H100)."""
    _, search, _ = find_layouts("llama-3-8b", SearchOptions(devices=6, gpu="h100", fsdp_mixed_precision="autocast"))
    assert sorted((c.layout.dp, c.layout.tp, c.layout.pp, c.layout.cp) for c in search.fitting) == [
        (1, 1, 3, 2), (1, 1, 6, 1), (1, 2, 3, 1), (2, 1, 3, 1), (3, 1, 1, 2), (3, 1, 2, 1), (3, 2, 1, 1), (6, 1, 1, 1)]
    # one node, all on NVLink: dp 1 · tp 2 · pp 3 first (0.144 s compute); dp 3 · tp 2, 2 micro-steps of one, computes
    # in 0.101 s but its FSDP2 traffic, 68.6 GB at 450 GB/s, takes 0.152 s
    assert search.best.peak == 40_290_231_184 and search.not_fitting == ()
    dp3 = next(c for c in search.fitting if (c.layout.dp, c.layout.tp) == (3, 2))
    assert dp3.peak == 43_934_991_348 and dp3.step_bound == dp3.comm_time.nvlink > dp3.seconds
    assert sorted((s.dp, s.tp, s.pp, s.cp) for s in search.skipped) == [
        (1, 1, 1, 6), (1, 1, 2, 3), (1, 2, 1, 3), (1, 6, 1, 1), (2, 1, 1, 3), (2, 3, 1, 1)]
    assert next(s.reason for s in search.skipped if s.tp == 3) == (
        "tp 3 would split attention heads: 32 heads are not a multiple of it")
    minimum = search.minimum
    assert (minimum.devices, minimum.floor, minimum.layout.peak) == (3, 2, 77_905_150_864)
    assert (minimum.layout.layout.pp, minimum.layout.layout.micro_batches) == (3, 6)
    # 2's four under the GPU on their bound (without a pipeline, its first micro-step's, at one sequence)
    assert [(t.devices, t.outcome, t.layouts) for t in minimum.tried] == [(2, "none fits", 4), (3, "fits", 1)]
    assert search.evaluated == 8 + 4 + 1 + 1  # N's; 2's four; 4, which bounds it; 3


def test_the_bound_never_passes_over_a_layout_that_fits(monkeypatch):
    """Every layout's lower bound is at most its evaluated peak, and the fewest devices are the same with the bound
    switched off (every layout of every count evaluated)."""
    from paramscope.cost.parallel.layout_evaluation import LayoutEvaluator

    bounds, peaks = {}, {}
    bound, evaluate = LayoutEvaluator.bound, LayoutEvaluator.evaluate

    def recorded_bound(self, layout, replica):
        bounds[layout] = bound(self, layout, replica)
        return 0  # nothing passed over: every layout evaluated

    def recorded_evaluate(self, layout, replica, **kwargs):
        # N's own layouts are tried in the bound's order (layout_bound.order) and need not ask for the bound itself
        bounds.setdefault(layout, bound(self, layout, replica))
        result = evaluate(self, layout, replica, **kwargs)
        peaks[layout] = result.peak
        return result

    options = SearchOptions(devices=6, gpu="h100", fsdp_mixed_precision="autocast")
    _, pruned, _ = find_layouts("llama-3-8b", options)
    monkeypatch.setattr(LayoutEvaluator, "bound", recorded_bound)
    monkeypatch.setattr(LayoutEvaluator, "evaluate", recorded_evaluate)
    _, search, _ = find_layouts("llama-3-8b", options)
    assert search.minimum.devices == pruned.minimum.devices == 3 and search.minimum.bounded == 0
    checked = [layout for layout in peaks if layout in bounds]  # N's own list is evaluated whole, in bound order
    for layout in checked:
        assert 0 < bounds[layout] <= peaks[layout], (layout.words(), bounds[layout], peaks[layout])
    assert len(checked) == 8 + 4 + 1 + 1  # N's eight; 2's four; 4's first, which fits; 3's one


def test_the_fewest_devices_search_is_bounded(monkeypatch, capsys):
    """Below the first power of two that fits, the search stops after MIN_BUDGET layouts: the power of two is the
    answer, the counts left are named (here a budget of none leaves 3)."""
    from paramscope.cost.parallel import layout_minimum

    monkeypatch.setattr(layout_minimum, "MIN_BUDGET", 0)
    assert main(["memory", "llama-3-8b", "--training", "--find-layout", "--gpu", "h100", "--devices", "6",
                 "--fsdp-mixed-precision", "autocast", "--json"]) == 0
    minimum = json.loads(capsys.readouterr().out)["layout_search"]["minimum"]
    assert (minimum["devices"], minimum["floor"], minimum["untried"], minimum["budget"]) == (4, 2, [3, 3], 0)
    assert main(["memory", "llama-3-8b", "--training", "--find-layout", "--gpu", "h100", "--devices", "6",
                 "--fsdp-mixed-precision", "autocast"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "fewest devices found to fit: 4 (dp 1 · pp 2 · cp 2" in text and "1: the model states alone" in text
    assert "2: none of its 4 layouts tried fits;" in text
    assert "3: not tried (the search below the first power of two" in text


def test_json_and_text(capsys):
    argv = ["memory", "qwen2.5-0.5b", "--training", "--find-layout", "--gpu", "rtx-4090", "--devices", "8",
            "--seq", "1024", "--zero", "0"]
    assert main(argv + ["--json"]) == 0
    found = json.loads(capsys.readouterr().out)["layout_search"]
    assert found["devices"] == 8 and found["global_batch"] == 8 and found["minimum"]["devices"] == 1
    for row in found["layouts"]:
        assert row["fits"] and row["comm_bytes"] == sum(term["bytes"] for term in row["comm"])
        assert row["peak"] + found["reserve"] <= found["memory"]
    assert [row["seconds"] for row in found["layouts"]] == sorted(row["seconds"] for row in found["layouts"])
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "a bound at the GPU's peak, not a prediction" in text and "fewest devices that fit: 1" in text
    assert "layouts evaluated in" in text and found["search_seconds"] >= 0
    # the first row: dp 4 · tp 2 · accum 2 (its degrees a column each: #, dp, tp, pp, cp, accum)
    assert any(line.split()[:6] == ["1", "4", "2", "1", "1", "2"] for line in text.splitlines())
    assert all(row["grad_accum"] == (row["replica_batch"] if row["pp"] == 1 else 1) for row in found["layouts"])


@pytest.mark.parametrize("extra, message", [
    (["--gpu", "h100"], "--find-layout needs --devices N"),
    (["--devices", "8"], "--find-layout needs --gpu NAME"),
    (["--devices", "8", "--budget", "80GiB"], "--find-layout needs --gpu NAME"),
    (["--devices", "8", "--gpu", "h100", "--tp", "2"], "--find-layout searches dp, tp, pp, cp and ep"),
    (["--devices", "8", "--gpu", "h100", "--trace"], "--find-layout does not take --trace"),
    (["--devices", "8", "--gpu", "t4"], "the table has none for T4 in bf16"),
    (["--devices", "8", "--gpu", "h100", "--global-batch", "4", "--batch", "2"], "not both"),
    (["--devices", "0", "--gpu", "h100"], "--devices must be a whole number"),
    (["--devices", "8", "--gpu", "h100", "--zero", "7"], "unknown --zero"),
])
def test_bad_input_in_one_line(extra, message, capsys):
    assert main(["memory", "qwen2.5-0.5b", "--training", "--find-layout", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, message", [
    (["--find-layout", "--gpu", "h100", "--devices", "8"], "give --training"),
    (["--training", "--global-batch", "8"], "--global-batch is for --find-layout"),
])
def test_flags_out_of_place(argv, message, capsys):
    assert main(["memory", "qwen2.5-0.5b", *argv]) == 2
    assert message in capsys.readouterr().err


def test_divisors():
    assert divisors(64) == [1, 2, 4, 8, 16, 32, 64] and divisors(12) == [1, 2, 3, 4, 6, 12] and divisors(1) == [1]
