"""A ZeRO layout under a mixed precision names what its states assume: autocast's fp32 weights and gradients, not
DeepSpeed's bf16 weights with an fp32 master (--precision bf16-master prices those)."""

from __future__ import annotations

import json

import pytest

from paramscope.cli import main

CONVENTION = "convention: ZeRO is priced over autocast's fp32 weights and gradients"


@pytest.mark.parametrize("flags, named", [
    (["--dp", "8", "--zero", "2", "--precision", "bf16-mixed"], True),
    (["--devices", "8", "--zero", "1", "--precision", "bf16-mixed"], True),
    (["--dp", "8", "--zero", "2"], False),  # the default under ZeRO is DeepSpeed's bf16 (bf16-master)
    (["--dp", "8"], False),  # plain data parallel: no ZeRO
    (["--dp", "8", "--zero", "2", "--precision", "bf16-master"], False),
])
def test_zero_under_autocast_names_its_convention(capsys, flags, named):
    assert main(["memory", "llama-3-8b", "--training", *flags, "--width", "400"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (CONVENTION in out) is named
    if named:
        assert "(the ZeRO paper's 2 + 2 + 12 B a parameter): --precision bf16-master" in out


@pytest.mark.parametrize("flags", [["--dp", "8", "--zero", "2"], ["--devices", "8", "--zero", "1"]])
def test_zero_defaults_to_deepspeeds_bf16_and_says_so(capsys, flags):
    """No --precision under DeepSpeed's ZeRO 1-3: bf16-master, as HF Trainer's --bf16 with DeepSpeed runs it, named
    with the flag that asks autocast instead; the JSON says the precision was the default."""
    assert main(["memory", "llama-3-8b", "--training", *flags, "--width", "400"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "precision: bf16-master, the default under DeepSpeed's ZeRO 1-3" in out
    assert "--precision bf16-mixed for torch.autocast" in out
    assert main(["memory", "llama-3-8b", "--training", *flags, "--json"]) == 0
    settings = json.loads(capsys.readouterr().out)["memory"]["settings"]
    assert (settings["precision"], settings["precision_defaulted"]) == ("bf16-master", True)
