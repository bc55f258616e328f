"""The traced serving step decodes from the prefill's cache, under whichever name the class takes it."""
import functools
import json
from pathlib import Path

import transformers

from paramscope.api import inspect_with_module
from paramscope.cost.traced.step import StepSettings, trace_inference

CONFIGS = Path(__file__).parent / "configs"


def test_mamba_decodes_from_its_prefills_cache(monkeypatch):
    """Mamba's forward takes only `cache` (transformers 5): a `past_key_values` would fall into **kwargs and each
    decode step would be a fresh one-token prefill; its output names the cache `cache` too."""
    config = json.loads((CONFIGS / "families" / "state-spaces--mamba-130m-hf.json").read_text())
    config["num_hidden_layers"] = 2
    _, module = inspect_with_module(config)
    calls = []
    forward = transformers.MambaForCausalLM.forward

    @functools.wraps(forward)  # the step reads the cache's name off the signature
    def recording(self, *args, **kwargs):
        output = forward(self, *args, **kwargs)
        calls.append((kwargs.get("cache"), output.cache))
        return output

    monkeypatch.setattr(transformers.MambaForCausalLM, "forward", recording)
    traced = trace_inference(module, StepSettings(batch=1, seq=32, decode_steps=1))
    assert [p.phase for p in traced.phases] == ["prefill", "decode"]
    (given, made), (decode_given, _) = calls
    assert given is None and made is not None and decode_given is made
