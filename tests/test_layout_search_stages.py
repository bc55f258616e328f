"""--find-layout on a class without the analytic per-device recipe (GPT-2 here; Mixtral, Qwen2-MoE, DeepSeek-V3 where
their step is derived from traces): its data-parallel × pipeline layouts are answered by the stages replayed from the
one-device derived recipe (estimate.py's _derived_pipeline_device), each with the very peak `memory --dp D --pp P`
gives; its tensor and context parallel layouts are named, not answered, and the summary says that only the answered
layouts were tried. One small cut: 5 layers, one derivation (microbatches of one sequence), kept in the test's cache."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from paramscope.cli import main

SEQ = 64
CONFIG = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 128, "n_head": 4, "n_layer": 5,
          "vocab_size": 500, "bos_token_id": 0, "eos_token_id": 0}
SEARCH = ["--training", "--find-layout", "--gpu", "h100", "--devices", "4", "--global-batch", "8", "--seq", str(SEQ)]
TIGHT = ["--reserve", f"{80 * 1024 - 2}MiB"]  # 2 MiB of the H100 left: no answered layout fits up to 64 devices


def _run(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(the search's JSON, the tight search's JSON and text, the config's path), in a cache of the module's own."""
    root = tmp_path_factory.mktemp("gpt2")
    path = root / "config.json"
    path.write_text(json.dumps(CONFIG))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PARAMSCOPE_CACHE_DIR", str(root / "cache"))
        found = json.loads(_run(["memory", str(path), *SEARCH, "--json"]))["layout_search"]
        tight = json.loads(_run(["memory", str(path), *SEARCH, *TIGHT, "--json"]))["layout_search"]
        text = " ".join(_run(["memory", str(path), *SEARCH, *TIGHT, "--width", "200"]).split())
        yield found, tight, text, path


def test_a_pipeline_layout_found_has_the_peak_memory_gives_it(runs):
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.parallel.layout import layout_for

    found, _, _, path = runs
    rows = {(row["dp"], row["pp"]): row for row in found["layouts"]}
    assert set(rows) == {(4, 1), (2, 2), (1, 4)}  # every data-parallel × pipeline layout of 4 answered (and fits)
    for (dp, pp), row in rows.items():
        if pp == 1:
            continue
        # memory --dp D --pp P --zero fsdp --batch (the replica's): the CLI's layout_for, microbatches of one sequence
        layout = layout_for(dp=dp, zero="fsdp", pp=pp, batch=row["replica_batch"])
        _, estimate, _ = training_answer(str(path), TrainingOptions(batch=row["replica_batch"], seq=SEQ,
                                                                    layout=layout, fits=False))
        device = estimate.training.device
        assert (row["peak"], row["peak_phase"]) == (device.peak, device.peak_figure.phase), row["words"]
        assert row["bubble"] == device.bubble > 0 and row["micro_batches"] == row["replica_batch"]
        assert any(term["kind"] == "pp" for term in row["comm"])
    assert (rows[(2, 2)]["peak"], rows[(1, 4)]["peak"]) == (15_289_496, 19_323_496)
    reasons = sorted({s["reason"].split(",")[0] for s in found["skipped"]})
    assert reasons == ["context parallelism for GPT2LMHeadModel", "tensor parallelism for GPT2LMHeadModel"]
    assert all("derived from traces at each tp degree" in s["reason"] for s in found["skipped"] if s["tp"] > 1)
    assert any("pipelines over them, each stage replayed" in note for note in found["notes"])


def test_the_summary_says_only_the_answered_layouts_were_tried(runs):
    _, tight, text, _ = runs
    assert not tight["layouts"] and len(tight["not_fitting"]) == 3 and len(tight["skipped"]) == 7
    minimum = tight["minimum"]
    assert (minimum["devices"], minimum["limit"], minimum["unanswered"]) == (None, 64, 112)
    assert minimum["unanswered"] == sum(t["unanswered"] for t in minimum["tried"])
    assert "none of the 3 answered layouts of 4 devices fits on H100 80GB; the 7 not answered (below) were not " \
           "tried" in text
    assert "fewest devices that fit among the answered layouts: none up to 64 (" in text
    assert "112 layouts of those counts not answered, so not tried (the reasons below): one of them may fit" in text
