"""The layout search's communication time (cost/parallel/layout_time.py): each kind's bytes over the link its group
crosses on 8-GPU H100 nodes, tp's collectives exposed where its group spans nodes, and the search ranked by
max(compute + exposed tp, NVLink, network)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paramscope.cost.hardware import INTERCONNECTS
from paramscope.cost.parallel.layout import ParallelLayout
from paramscope.cost.parallel.layout_time import NETWORK, NVLINK, comm_time
from paramscope.cost.parallel.search_result import Candidate, CommTerm, LayoutSearch, Minimum

H100 = INTERCONNECTS["H100 80GB"]
NV, NET = 450 * 10**9, 50 * 10**9  # NVLink 4 (900 GB/s both ways) a direction; InfiniBand NDR 400 Gb/s a GPU


def term(kind: str, size: int, what: str = "") -> CommTerm:
    return CommTerm(kind, what, size, "", "")


def parts(layout: ParallelLayout, terms: list[CommTerm], stage: int = 0) -> list[tuple[str, str, int]]:
    return [(t.kind, t.link, t.bytes) for t in comm_time(layout, tuple(terms), stage, H100).terms]


def test_h100_links_are_the_datasheets():
    assert (H100.gpus_per_node, H100.nvlink, H100.network) == (8, NV, NET)


def test_tp_inside_a_node_dp_across_with_one_rank_a_node():
    layout = ParallelLayout(dp=8, shard="fsdp", tp=8, sp=True)
    time = comm_time(layout, (term("dp", 1_000_000_000), term("tp", 900_000_000)), 0, H100)
    assert [(t.kind, t.link, t.bytes) for t in time.terms] == [("dp", NETWORK, 1_000_000_000),
                                                              ("tp", NVLINK, 900_000_000)]
    assert (time.network, time.nvlink) == (1_000_000_000 / NET, 900_000_000 / NV)
    assert time.seconds == time.network and time.serial == time.network + time.nvlink


def test_one_node_is_all_nvlink():
    layout = ParallelLayout(dp=2, shard="fsdp", tp=2, pp=2, micro_batches=4, cp=1)
    assert parts(layout, [term("dp", 300), term("tp", 200), term("pp", 100)], 1) == [
        ("dp", NVLINK, 300), ("tp", NVLINK, 200), ("pp", NVLINK, 100)]


def test_a_group_over_two_nodes_sends_its_hierarchical_share_across():
    # tp 16: 8 ranks a node, (n − g) / (g (n − 1)) = 8 / 120 of the ring's bytes cross, the rest on NVLink
    assert parts(ParallelLayout(tp=16, sp=True), [term("tp", 1_200)]) == [("tp", NETWORK, 80), ("tp", NVLINK, 1_120)]
    # ep's all-to-all: the tokens for the other node's 8 of 15 peers
    layout = ParallelLayout(dp=16, shard="fsdp", ep=16)
    assert parts(layout, [term("ep", 1_500)]) == [("ep", NETWORK, 800), ("ep", NVLINK, 700)]


def test_an_uneven_group_is_taken_at_its_fullest_node():
    # tp 3 over 12 devices: the group 6, 7, 8 has 2 ranks on node 0 and 1 on node 1; g = 2: (3 − 2) / (2 · 2)
    layout = ParallelLayout(dp=4, tp=3)
    assert parts(layout, [term("tp", 1_000)]) == [("tp", NETWORK, 250), ("tp", NVLINK, 750)]


def test_cp_ring_across_nodes_and_the_experts_group():
    # tp 8 · cp 2 · dp 4 (64 devices): cp's ring steps between nodes, every byte; the experts' data-parallel group
    # (every ep-th rank of dp × cp) too
    layout = ParallelLayout(dp=4, shard="fsdp", tp=8, cp=2, ep=2)
    assert parts(layout, [term("cp", 100), term("dp", 90, "FSDP2: … (routed experts)"), term("ep", 60)]) == [
        ("cp", NETWORK, 100), ("dp", NETWORK, 90), ("ep", NETWORK, 60)]


def test_pipeline_sends_by_boundary():
    # tp 4 · pp 4 on 16 devices: stages 0 and 1 on node 0, 2 and 3 on node 1; stage 1 sends forward across, back
    # inside; a tied embedding between stages 0 and 3 crosses
    layout = ParallelLayout(tp=4, pp=4, micro_batches=8)
    assert parts(layout, [term("pp", 600), term("pp", 40, "tied")], 1) == [
        ("pp", NETWORK, 300), ("pp", NVLINK, 300), ("pp", NETWORK, 40)]
    assert parts(layout, [term("pp", 300)], 0) == [("pp", NVLINK, 300)]


def test_hybrid_sharding_splits_at_each_parts_least_share():
    # shard groups of 8 (one node), 4 replicas across: (n−1)/n (2P + G) inside, 2(r−1)/r G/n across
    layout = ParallelLayout(dp=32, shard="hsdp", shard_group=8)
    n, r, g = 8, 4, 8_000
    total = (n - 1) * 3 * g // n + 2 * (r - 1) * (g // n) // r  # P = G = g
    (_, link_in, inside), (_, link_across, across) = parts(layout, [term("dp", total)])
    assert (link_in, link_across) == (NVLINK, NETWORK)
    assert across == total * 2 * (r - 1) // (3 * r * (n - 1) + 2 * (r - 1)) == 2 * (r - 1) * (g // n) // r
    assert inside + across <= total


def _candidate(dp: int, tp: int, seconds: float, dp_bytes: int) -> Candidate:
    layout = ParallelLayout(dp=dp, shard="fsdp", tp=tp, sp=True)
    return Candidate(layout, 8 // dp, 1, "backward", True, 0, 1, 1, 0.0, seconds,
                     (term("dp", dp_bytes), term("tp", 45 * 10**9)), 0, 8 // dp)


def _search(gpu: str, *candidates: Candidate) -> LayoutSearch:
    minimum = Minimum(64, candidates[0], 64, ())
    return LayoutSearch(gpu, 80 << 30, 1 << 30, 989.4e12, "bf16", 64, 64, 2048, "bf16-mixed", "adamw", "none",
                        "fsdp", "1f1b", 1, tuple(candidates), (), (), minimum, 2)


def test_the_search_ranks_by_max_of_compute_and_communication():
    fast_compute = _candidate(8, 8, 0.9, 100 * 10**9)  # 2 s on the network
    slower = _candidate(1, 64, 1.2, 0)  # tp 64: 45 GB over 8 nodes' hierarchy, 7/63 across: 0.1 s, exposed
    search = _search("H100 80GB", fast_compute, slower)
    first, second = search.fitting
    assert first.layout == slower.layout and second.layout == fast_compute.layout
    assert second.comm_time.network == 2.0 and second.step_bound == 2.0 and second.comm_time.exposed == 0
    assert second.no_overlap == 0.9 + 2.0 + 45 * 10**9 / NV
    # tp 64's 5 GB across (56 / 504 of 45 GB) take 0.1 s, its 40 GB inside 0.089 s: the slower is exposed
    assert [(t.kind, t.link, t.bytes, t.exposed) for t in first.comm_time.terms] == [
        ("dp", NVLINK, 0, False), ("tp", NETWORK, 5 * 10**9, True), ("tp", NVLINK, 40 * 10**9, True)]
    assert first.comm_time.exposed == 5 * 10**9 / NET and first.tp_spans_nodes
    assert first.step_bound == 1.2 + 5 * 10**9 / NET and search.minimum.layout == first  # the fewest at N: the first
    # a GPU without link figures: compute alone, as before
    plain = _search("RTX 4090", fast_compute, slower)
    assert [c.step_bound for c in plain.fitting] == [0.9, 1.2] and plain.fitting[0].comm_time is None
    assert replace(plain).fitting == plain.fitting  # timing is idempotent


def test_tp_across_nodes_is_exposed_and_the_rest_overlapped():
    """tp 16 over two nodes: its collective on the critical path, the slower of its two links added to compute;
    tp 8 inside a node, cp's ring and ep's all-to-all across nodes, and dp: overlapped (layout_time.EXPOSURE)."""
    spanning = ParallelLayout(dp=4, shard="fsdp", tp=16, sp=True)  # 64 devices, each tp group on two nodes
    tp = 90 * 10**9
    time = comm_time(spanning, (term("dp", 10**9), term("tp", tp)), 0, H100)
    # 8 of the group's 15 peers on the other node, 8 a node: (16 − 8) / (8 · 15) = 1/15 of the ring's bytes cross
    assert [(t.kind, t.link, t.bytes, t.exposed) for t in time.terms] == [
        ("dp", NETWORK, 10**9, False), ("tp", NETWORK, 6 * 10**9, True), ("tp", NVLINK, 84 * 10**9, True)]
    assert time.tp_spans_nodes and time.exposed == max(84 * 10**9 / NV, 6 * 10**9 / NET) == 84 * 10**9 / NV
    assert (time.nvlink, time.network) == (84 * 10**9 / NV, 7 * 10**9 / NET)  # the links carry tp beside the rest
    row = Candidate(spanning, 16, 1, "backward", True, 0, 1, 1, 0.0, 0.5, (term("dp", 10**9), term("tp", tp)), 0,
                    16).timed(H100)
    # compute 0.5 s + exposed 0.187 s = 0.687 s, above either link (0.187 s, 0.14 s); the no-overlap sum above it
    assert row.step_bound == 0.5 + 84 * 10**9 / NV and row.tp_spans_nodes
    assert row.no_overlap == 0.5 + 84 * 10**9 / NV + 7 * 10**9 / NET > row.step_bound
    inside = ParallelLayout(dp=8, shard="fsdp", tp=8, sp=True)
    time = comm_time(inside, (term("tp", tp),), 0, H100)
    assert (time.exposed, time.tp_spans_nodes, [t.exposed for t in time.terms]) == (0, False, [False])
    ring = ParallelLayout(dp=4, shard="fsdp", tp=8, cp=2, ep=2)  # cp's ring and ep's all-to-all across nodes
    time = comm_time(ring, (term("tp", tp), term("cp", 100), term("ep", 60)), 0, H100)
    assert [(t.kind, t.link, t.exposed) for t in time.terms] == [
        ("tp", NVLINK, False), ("cp", NETWORK, False), ("ep", NETWORK, False)] and time.exposed == 0


def test_the_table_json_and_page_mark_tp_across_nodes():
    """The tp column marks a group across nodes (†, named in the legend), the bound's sentence says where the first
    such layout lands, the first layout's link line adds its exposure to compute; JSON: tp_spans_nodes, the exposed
    seconds and terms; the page: the row's mark."""
    from types import SimpleNamespace

    from paramscope.render.html.layout_search import render_layout_search_html
    from paramscope.render.layout_search import layout_search_parts, layout_search_to_dict
    from paramscope.render._console import to_text

    spanning = _candidate(1, 64, 1.2, 0)
    search = _search("H100 80GB", spanning, _candidate(8, 8, 0.9, 100 * 10**9))
    model = SimpleNamespace(label="a model", class_name="LlamaForCausalLM", engine="live", engine_detail=None,
                            transformers_version=None, source="a model", class_reason="its config")
    report = SimpleNamespace(model=model)
    lines = to_text(layout_search_parts(report, search, 120), 120).splitlines()
    rule = next(i for i, line in enumerate(lines) if line.lstrip().startswith("───"))
    assert lines[rule - 1].split()[:3] == ["#", "dp", "tp"]
    assert [line.split()[:3] for line in lines[rule + 1:rule + 3]] == [["1", "1", "64†"], ["2", "8", "8"]]
    text = " ".join(" ".join(lines).split())
    assert "tp †: tp spans nodes (its collectives exposed, added to compute)" in text
    assert "tp spans nodes in 1 of the 2 layouts that fit (marked †), the first of them #1 (dp 1 · tp 64 · accum 8, " \
           "step ≥ 1.3 s)" in text
    assert "step ≥ max(compute 1.2 s + exposed tp 0.1 s (tp spans nodes: the slower of its two links), NVLink, " \
           "network) = 1.3 s" in text and "tp network 5,000,000,000 B exposed, tp NVLink exposed" in text
    found = layout_search_to_dict(search)
    first, second = found["layouts"]
    assert (first["tp_spans_nodes"], second["tp_spans_nodes"]) == (True, False)
    assert first["comm_time"]["exposed_seconds"] == 0.1 and second["comm_time"]["exposed_seconds"] == 0
    assert [t["exposed"] for t in first["comm_time"]["terms"]] == [False, True, True]
    assert first["step_bound"] == 1.2 + 0.1 and "tp across nodes exposed" in found["exposure_is"]
    page = render_layout_search_html(report, search, fragment=True)
    assert page.count('data-tp-spans-nodes="true"') == 1


@pytest.mark.parametrize("gpu", ["A100 80GB", "H200", "B200", "B300"])
def test_every_linked_gpu_has_a_board_of_eight(gpu):
    links = INTERCONNECTS[gpu]
    assert links.gpus_per_node == 8 and links.nvlink > links.network > 0 and links.source


def test_json_and_text_of_a_search_over_two_nodes(capsys):
    """llama-3-8b on 16 H100s (two nodes) at 1,024 tokens: the pipelines of a stage a node keep all but their
    stage-to-stage sends on NVLink, so they lead; every row's step_bound is the larger of its compute and its links."""
    import json

    from paramscope.cli import main

    argv = ["memory", "llama-3-8b", "--training", "--find-layout", "--gpu", "h100", "--devices", "16", "--seq", "1024",
            "--fsdp-mixed-precision", "autocast"]  # the links' placement, under the convention its figures were read
    assert main(argv + ["--json"]) == 0
    found = json.loads(capsys.readouterr().out)["layout_search"]
    assert found["links"] == {"gpus_per_node": 8, "nvlink": "NVLink 4, 900 GB/s both directions",
                              "nvlink_bytes_per_second": NV, "network": "InfiniBand NDR, 400 Gb/s",
                              "network_bytes_per_second": NET,
                              "source": "H100 datasheet (SXM); DGX H100 user guide (8 × ConnectX-7)"}
    rows = found["layouts"]
    assert [row["step_bound"] for row in rows] == sorted(row["step_bound"] for row in rows)
    for row in rows:
        time = row["comm_time"]
        assert row["step_bound"] == max(row["seconds"] + time["exposed_seconds"], time["nvlink_seconds"],
                                        time["network_seconds"])
        assert row["tp_spans_nodes"] == time["tp_spans_nodes"] == (row["tp"] == 16)
        exposed = [t for t in time["terms"] if t["exposed"]]  # tp 16 over the two nodes: its whole collective
        assert [t["kind"] for t in exposed] == (["tp", "tp"] if row["tp"] == 16 else [])
        assert time["exposed_seconds"] == max([t["seconds"] for t in exposed], default=0)
        assert row["no_overlap_seconds"] == row["seconds"] + (time["nvlink_seconds"] + time["network_seconds"])
        assert time["nvlink_bytes"] + time["network_bytes"] <= row["comm_bytes"]
    first = rows[0]
    assert (first["dp"], first["tp"], first["pp"], first["cp"]) == (1, 4, 2, 2)
    assert [(t["kind"], t["link"]) for t in first["comm_time"]["terms"]] == [
        ("dp", "NVLink"), ("tp", "NVLink"), ("pp", "network"), ("cp", "NVLink")]
    assert first["comm_time"]["network_bytes"] == next(t["bytes"] for t in first["comm"] if t["kind"] == "pp")
    assert main(argv + ["--width", "400"]) == 0
    text = capsys.readouterr().out
    assert "max(compute + exposed tp, NVLink, network), the rest perfectly overlapped" in text
    assert "tp across nodes exposed, added to compute" in text
    assert "NVLink 4, 900 GB/s both directions (450 GB/s a direction)" in text and "no overlap" in text


def test_the_first_marked_layout_past_the_shown_rows_is_printed_after_an_ellipsis_row():
    """The bound's sentence names the first layout whose tp spans nodes (#12 here); the table prints the first 10
    and, past them, that row after a "…" row, so its † is seen (it was never shown), within 80 columns."""
    from types import SimpleNamespace

    from paramscope.render._console import to_text
    from paramscope.render.layout_search import layout_search_parts

    inside = [_candidate(8, 8, 0.1 * (i + 1), 0) for i in range(11)]
    search = _search("H100 80GB", *inside, _candidate(1, 64, 5.0, 0), _candidate(1, 64, 6.0, 0))
    model = SimpleNamespace(label="a model", class_name="LlamaForCausalLM", engine="live", engine_detail=None,
                            transformers_version=None, source="a model", class_reason="its config")
    lines = to_text(layout_search_parts(SimpleNamespace(model=model), search, 80), 80).splitlines()
    assert max(map(len, lines)) <= 80
    rule = next(i for i, line in enumerate(lines) if line.lstrip().startswith("───"))
    table = lines[rule + 1:lines.index("", rule)]
    rows = [line.split()[:3] for line in table if line.split()[0] in ("…", *map(str, range(1, 14)))]
    assert [row[0] for row in rows] == [*map(str, range(1, 11)), "…", "12"] and rows[-1] == ["12", "1", "64†"]
    text = " ".join(" ".join(lines).split())
    assert "… 2 more that fit; #12 shown as the first whose tp spans nodes (†) (--json lists them all)" in text
    assert "tp spans nodes in 2 of the 13 layouts that fit (marked †), the first of them #12" in text
