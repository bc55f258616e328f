"""A newcomer's papercuts with layouts (issue 28's trial): each refused, pointed or worded at its root."""

from __future__ import annotations

import json

import pytest

from paramscope.cli import main
from paramscope.errors import OptionError


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- --schedule interleaved needs its chunks ----------------------------------------------------------------------

def test_interleaved_without_virtual_stages_is_refused_naming_the_flag(capsys):
    code, out, err = _cli(capsys, "memory", "llama-3-8b", "--training", "--dp", "2", "--pp", "2", "--schedule",
                          "interleaved")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--schedule interleaved needs --virtual-stages V ≥ 2" in err
    assert "torchtitan takes 2" in err  # the usual value, not taken silently


def test_interleaved_with_one_chunk_is_refused_in_the_library_too():
    from paramscope.cost.parallel.layout import ParallelLayout, layout_for

    for make in (lambda: layout_for(dp=2, pp=2, schedule="interleaved"),
                 lambda: layout_for(dp=2, pp=2, schedule="interleaved", virtual_stages=1),
                 lambda: ParallelLayout(pp=2, micro_batches=2, schedule="interleaved").check()):
        with pytest.raises(OptionError, match="schedule interleaved needs virtual_stages V ≥ 2"):
            make()
    assert layout_for(dp=2, pp=2, schedule="interleaved", virtual_stages=2, batch=2).virtual_stages == 2


# --- flops reads --devices N as memory does ----------------------------------------------------------------------

def test_flops_step_seconds_with_devices_alone_is_dp_and_says_so(capsys):
    base = ["flops", "llama-3-8b", "--training", "--seq", "1024", "--step-seconds", "2", "--gpu", "h100"]
    code, text, _ = _cli(capsys, *base, "--devices", "8", "--width", "100")
    assert code == 0
    assert "One device: dp 8 = 8 devices" in text
    assert "note: --devices 8 read as dp 8 (data-parallel replicas), as memory reads it" in text
    code, as_devices, _ = _cli(capsys, *base, "--devices", "8", "--json")
    code_dp, as_dp, _ = _cli(capsys, *base, "--dp", "8", "--json")
    assert code == code_dp == 0
    devices, dp = json.loads(as_devices)["flops"], json.loads(as_dp)["flops"]
    assert devices["device"] == dp["device"] and devices["device"]["layout"]["dp"] == 8
    assert devices["mfu"] == dp["mfu"] == pytest.approx(8 * devices["step"] / (2 * 989.4e12 * 8))
    code, dp_text, _ = _cli(capsys, *base, "--dp", "8", "--width", "100")
    assert "read as dp" not in dp_text  # the layout was given: nothing was read into --devices
