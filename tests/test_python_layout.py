"""The Python API reaches the CLI's training layouts: `layout_for` (the layout flags as keywords) into
TrainingOptions / FlopOptions, and `find_layout` for `memory --training --find-layout`; the same figures, to the
byte, as the CLI's JSON; a wrong layout or an FSDP2 `zero` in one OptionError naming the way."""

from __future__ import annotations

import json

import pytest

import paramscope
from paramscope.cli import main
from paramscope.render.layout_search import layout_search_to_dict


def _cli_json(capsys, *argv):
    assert main(list(argv) + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_layout_for_equals_the_cli(capsys):
    # docs/python.md's example: `memory llama-3-8b --training --tp 2 --pp 2 --seq 2048`, one device's peak
    estimate = paramscope.estimate_training("llama-3-8b", paramscope.TrainingOptions(
        seq=2048, layout=paramscope.layout_for(tp=2, pp=2)))
    document = _cli_json(capsys, "memory", "llama-3-8b", "--training", "--tp", "2", "--pp", "2", "--seq", "2048")
    assert estimate.peak == document["memory"]["peak"]["bytes"] == 41_387_557_956
    # --devices 8 --zero fsdp is this layout (cli/memory._layout passes its flags to layout_for as they are); its
    # step is derived from traces (seconds), so the figure is not asserted here
    # (layout_for's FSDP2 takes its MixedPrecisionPolicy where none is asked, as torchtitan and accelerate run it)
    assert paramscope.layout_for(devices=8, zero="fsdp") == paramscope.ParallelLayout(
        dp=8, shard="fsdp", fsdp_mixed_precision="policy")
    paramscope.TrainingOptions(layout=paramscope.layout_for(devices=8, zero="fsdp")).check()


@pytest.mark.parametrize("options", [paramscope.TrainingOptions, paramscope.FlopOptions])
def test_a_layout_that_is_not_one(options):
    with pytest.raises(paramscope.OptionError) as caught:
        options(layout={"tp": 2}).check()
    message = str(caught.value)
    assert message.startswith("layout must be a ParallelLayout, got a dict ({'tp': 2})")
    assert "paramscope.layout_for(" in message and "\n" not in message


@pytest.mark.parametrize("zero", ["fsdp", "hybrid_shard"])
def test_fsdp2_zero_names_the_layout(zero):
    with pytest.raises(paramscope.OptionError, match=rf"zero '{zero}' is FSDP2's per-parameter sharding, a "
                                                     rf"layout's: give layout=paramscope\.layout_for\(devices=N, "
                                                     rf"zero='{zero}'\)"):
        paramscope.TrainingOptions(devices=8, zero=zero).check()
    paramscope.TrainingOptions(devices=8, zero="full_shard").check()  # DeepSpeed's flat ZeRO-3 share, as before


def test_find_layout_equals_the_cli(capsys):
    found = paramscope.find_layout("llama-3-8b", paramscope.SearchOptions(devices=4, gpu="h100", seq=1024))
    document = _cli_json(capsys, "memory", "llama-3-8b", "--training", "--find-layout", "--gpu", "h100",
                         "--devices", "4", "--seq", "1024")["layout_search"]
    mine = json.loads(json.dumps(layout_search_to_dict(found)))
    mine.pop("search_seconds"), document.pop("search_seconds")  # wall time, not a figure
    assert mine == document
    assert found.report.model.label == "meta-llama/Meta-Llama-3-8B"
    assert repr(found).startswith("<LayoutSearch of meta-llama/Meta-Llama-3-8B on 4 × H100 80GB: 10 of 10 "
                                  "layouts fit, best dp 1 (one rank: no sharding, torch.autocast) × tp 4 (sequence "
                                  "parallel) = 4 devices")
    assert found.minimum.devices == 2 and "\n" not in repr(found)
    # Jupyter shows the page the CLI's --html writes, and .to_html(path) saves it
    page = found._repr_html_()
    assert "layouts to train on 4 × H100 80GB" in page and 'id="minimum" data-devices="2"' in page
    with pytest.raises(paramscope.OptionError, match=r"find_layout\(\) takes gpu in its options"):
        paramscope.find_layout("llama-3-8b", paramscope.SearchOptions(devices=4, gpu="h100"), gpu="h100")
