"""An answer whose precision was not asked names it as the default and the flag for another: on one device, under
DDP, tp, or ZeRO with an optimizer DeepSpeed's bf16 does not run, that is bf16-mixed (torch.autocast)."""

from __future__ import annotations

import pytest

from paramscope.cli import main

DEFAULT = ("convention: bf16-mixed, the default where neither DeepSpeed's bf16 (ZeRO 1-3) nor FSDP2's "
           "MixedPrecisionPolicy applies (HF Trainer's --bf16); --precision bf16-pure, bf16-master, bf16-main-grad "
           "or fp32 for another")


@pytest.mark.parametrize("flags, named", [
    ([], True),
    (["--dp", "2"], True),
    (["--devices", "2", "--zero", "2", "--optimizer", "adafactor"], True),
    (["--precision", "bf16-mixed"], False),  # asked: taken as asked, nothing to say
    (["--devices", "2", "--zero", "2"], False),  # bf16-master, named by its own note
])
def test_the_default_autocast_is_named_with_the_flag_for_another(capsys, flags, named):
    assert main(["memory", "qwen2.5-0.5b", "--training", "--seq", "64", *flags, "--width", "400"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (DEFAULT in out) is named
