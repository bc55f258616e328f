"""The llama.cpp and vLLM pre-flights from Python: `estimate_llama_cpp` and `estimate_vllm` answer with the frozen
result the CLI renders, whose JSON document is the CLI's to the byte; a keyword they do not take, or input they
refuse, is one OptionError."""

from __future__ import annotations

import json

import pytest

import paramscope
from paramscope import LlamaCppOptions, OptionError, VllmOptions
from paramscope.cli import main


def _document(document: dict) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def test_llama_cpp_api_is_the_clis_json(capsys):
    """test_llama_cpp_memory's Q4_K_M case: the predicted file at 8,192 tokens on an RTX 4090."""
    from paramscope.render.llama_cpp import llama_cpp_document

    assert main(["memory", "llama-3-8b", "--engine", "llama.cpp", "--dtype", "q4_k_m", "-c", "8192", "--gpu", "4090",
                 "--json"]) == 0
    cli = capsys.readouterr().out
    result = paramscope.estimate_llama_cpp("llama-3-8b", LlamaCppOptions(dtype="q4_k_m", ctx_size=8192, gpu="4090"))
    assert _document(llama_cpp_document(result)) == cli
    gpu = next(d for d in result.plan.devices if d.device == "GPU")
    assert gpu.kv == 32 * 8192 * 1024 * 2 * 2 == 1_073_741_824
    assert result.plan.fit.command == "llama-server -m Meta-Llama-3-8B-Q4_K_M.gguf -ngl 33 -c 8192 -fa off -np 1"
    assert "\n" not in repr(result) and hash(result) == hash(result)


def test_vllm_api_is_the_clis_json(capsys):
    """test_vllm_preflight's Llama-3-8B bf16 case on an H100 at utilization 0.9 and 8,192 tokens."""
    from paramscope.render.vllm import vllm_document

    assert main(["memory", "llama-3-8b", "--engine", "vllm", "--gpu", "h100", "--gpu-memory-utilization", "0.9",
                 "--max-model-len", "8192", "--json"]) == 0
    cli = capsys.readouterr().out
    result = paramscope.estimate_vllm("llama-3-8b", VllmOptions(gpu="h100", gpu_memory_utilization=0.9,
                                                                max_model_len=8192))
    assert _document(vllm_document(result)) == cli
    assert (result.preflight.blocks, result.preflight.kv_tokens) == (27_912, 27_912 * 16)
    assert "\n" not in repr(result) and hash(result) == hash(result)


@pytest.mark.parametrize("call, message", [
    (lambda: paramscope.estimate_vllm("llama-3-8b", gpu="h100"),
     "estimate_vllm() takes gpu in its options: options=VllmOptions(gpu=...)"),
    (lambda: paramscope.estimate_llama_cpp("llama-3-8b", ctx=8192), "estimate_llama_cpp() has no argument 'ctx'"),
    (lambda: paramscope.estimate_vllm("llama-3-8b"), "vLLM's pre-flight needs gpu or budget"),
    (lambda: paramscope.estimate_vllm("llama-3-8b", VllmOptions(gpu="h100", kv_dtype="int8")),
     "kv_dtype int8: vLLM's --kv-cache-dtype takes"),
    (lambda: paramscope.estimate_llama_cpp("llama-3-8b", LlamaCppOptions(gpu="h100", budget=2**30)),
     "give gpu or budget, not both"),
    (lambda: paramscope.estimate_llama_cpp("llama-3-8b", LlamaCppOptions(budget=2**29)),
     "budget's 536,870,912 B is not above reserve 1,073,741,824 B"),
    (lambda: paramscope.estimate_llama_cpp("llama-3-8b"), "llama.cpp's memory needs a .gguf file, or a config with "
                                                          "a llama.cpp mixture dtype"),
])
def test_bad_input_is_one_option_error(call, message):
    with pytest.raises(OptionError) as caught:
        call()
    assert message in str(caught.value) and "\n" not in str(caught.value)
