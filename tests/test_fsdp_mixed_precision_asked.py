"""--fsdp-mixed-precision chooses how FSDP2 runs a mixed precision. Asked where it would change nothing (no FSDP2 in
the layout, or a precision that is not mixed) it is refused in one line naming the value, never ignored; left
unasked, the default is what the framework runs (memory/precision_default.py)."""

from __future__ import annotations

import pytest

from paramscope.cli import main
from paramscope.cost.parallel.layout import layout_for
from paramscope.cost.parallel.search_options import SearchOptions
from paramscope.errors import OptionError


@pytest.mark.parametrize("zero", ["0", "1", "3", "shard_grad_op"])
def test_an_asked_choice_without_fsdp2_is_refused(zero):
    for asked in ("autocast", "policy"):
        with pytest.raises(OptionError, match="it needs zero fsdp or hybrid_shard, got "):
            layout_for(dp=2, zero=zero, fsdp_mixed_precision=asked)
    assert layout_for(dp=2, zero=zero).fsdp_mixed_precision == "autocast"  # unasked: nothing to choose


def test_under_fsdp2_either_is_taken_as_asked():
    assert layout_for(dp=2, zero="fsdp", fsdp_mixed_precision="autocast").fsdp_mixed_precision == "autocast"
    assert layout_for(dp=2, zero="hybrid_shard", fsdp_mixed_precision="policy").fsdp_mixed_precision == "policy"


@pytest.mark.parametrize("argv, words", [
    (["--dp", "2", "--zero", "3", "--fsdp-mixed-precision", "autocast"],
     "--fsdp-mixed-precision chooses how FSDP2 runs a mixed precision: it needs --zero fsdp or hybrid_shard, got "
     "ZeRO-3"),
    (["--dp", "2", "--zero", "fsdp", "--precision", "fp32", "--fsdp-mixed-precision", "autocast"],
     "--fsdp-mixed-precision autocast chooses torch.autocast over the fp32 parameters FSDP2 gathers: it needs a "
     "mixed precision (bf16-mixed, fp16-mixed), got fp32"),
    (["--find-layout", "--gpu", "h100", "--devices", "8", "--zero", "3", "--fsdp-mixed-precision", "autocast"],
     "--fsdp-mixed-precision chooses how FSDP2 runs a mixed precision: the search's layouts need --zero fsdp or "
     "hybrid_shard, got 3"),
    (["--find-layout", "--gpu", "h100", "--devices", "8", "--precision", "fp32", "--fsdp-mixed-precision",
      "autocast"], "--fsdp-mixed-precision autocast chooses torch.autocast over the fp32 parameters FSDP2 gathers"),
])
def test_the_cli_says_why_in_one_line(argv, words, capsys):
    assert main(["memory", "gpt2", "--training", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err


def test_the_search_remembers_whether_it_was_asked():
    assert SearchOptions(devices=8, gpu="h100", fsdp_mixed_precision="autocast").fsdp_mixed_precision_asked
    unasked = SearchOptions(devices=8, gpu="h100", zero="3")
    assert not unasked.fsdp_mixed_precision_asked and unasked.fsdp_mixed_precision == "autocast"
    unasked.check()  # the default under DeepSpeed's ZeRO is no FSDP2 choice at all: accepted
