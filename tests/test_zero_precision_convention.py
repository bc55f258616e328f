"""A ZeRO layout under a mixed precision names what its states assume: autocast's fp32 weights and gradients, not
DeepSpeed's bf16 weights with an fp32 master (--precision bf16-master prices those)."""

from __future__ import annotations

import pytest

from paramscope.cli import main

CONVENTION = "convention: ZeRO is priced over autocast's fp32 weights and gradients"


@pytest.mark.parametrize("flags, named", [
    (["--dp", "8", "--zero", "2"], True),
    (["--devices", "8", "--zero", "1"], True),
    (["--dp", "8"], False),  # plain data parallel: no ZeRO
    (["--dp", "8", "--zero", "2", "--precision", "bf16-master"], False),
])
def test_zero_under_autocast_names_its_convention(capsys, flags, named):
    assert main(["memory", "llama-3-8b", "--training", *flags, "--width", "400"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (CONVENTION in out) is named
    if named:
        assert "(the ZeRO paper's 2 + 2 + 12 B a parameter): --precision bf16-master" in out
