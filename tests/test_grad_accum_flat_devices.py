"""--devices N --zero 0-2 beside --grad-accum: the accumulation is counted under the layout --dp N (its held gradients'
share), which is also what --devices N --zero 0-2 alone answers; so it takes that layout instead of a refusal."""

from __future__ import annotations

import json

from paramscope.cli import main


def _peak(capsys, *flags: str) -> int:
    assert main(["memory", "qwen2.5-0.5b", "--training", "--seq", "64", "--batch", "4", "--grad-accum", "4", *flags,
                 "--json"]) == 0
    return json.loads(capsys.readouterr().out)["memory"]["peak"]["bytes"]


def test_devices_with_zero_accumulate_as_their_layout(capsys):
    assert _peak(capsys, "--devices", "4", "--zero", "2") == _peak(capsys, "--dp", "4", "--zero", "2")
