"""`paramscope memory CKPT` of a compressed-tensors checkpoint: its serving weights priced as the checkpoint stores
them, equal to the byte to what `paramscope audit` reads from the same files (test_packed_audit's layouts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_packed_audit import LINEARS, LLAMA, ct_config, int_packed, nvfp4_tensors, plain, write  # noqa: E402

from paramscope.audit import audit  # noqa: E402
from paramscope.cli import main  # noqa: E402
from paramscope.cost.memory.serving import MemoryOptions  # noqa: E402
from paramscope.cost.memory.serving_answer import estimate_memory  # noqa: E402


def fp8_block_tensors(scale_dtype) -> dict:
    tensors: dict = {}
    for module, out, cols, _ in LINEARS:
        p = f"model.layers.0.{module}."
        tensors[p + "weight"] = torch.zeros(out, cols, dtype=torch.float8_e4m3fn)
        tensors[p + "weight_scale"] = torch.zeros(-(-out // 128), -(-cols // 128), dtype=scale_dtype)
    return plain(tensors)


NVFP4 = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": 16}
FP8_BLOCK = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "block", "block_structure": [128, 128]}
LAYOUTS = {
    # (format, weights, extra group keys, tensors, the weights' stored bytes + bookkeeping, as audit reads them)
    "nvfp4": ("nvfp4-pack-quantized", NVFP4, {"input_activations": {**NVFP4, "dynamic": "local"}}, nvfp4_tensors,
              116_536),
    # compressed-tensors' default: block scales in the model's dtype (bf16); with scale_dtype float32, DeepSeek's fp32
    "fp8-block-bf16": ("float-quantized", FP8_BLOCK, {}, lambda: fp8_block_tensors(torch.bfloat16), 181_012),
    "fp8-block-fp32": ("float-quantized", {**FP8_BLOCK, "scale_dtype": "torch.float32"}, {},
                       lambda: fp8_block_tensors(torch.float32), 181_032),
    "int4-group-asym": ("pack-quantized", {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
                                           "group_size": 128}, {}, lambda: int_packed(4, 128, zero_points=True),
                        110_256),
    "int8-channel": ("pack-quantized", {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}, {},
                     lambda: int_packed(8, None, zero_points=False), 183_152),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_memory_weights_equal_the_audits_stored_bytes(tmp_path: Path, layout: str, capsys) -> None:
    fmt, weights, extra, tensors, expected = LAYOUTS[layout]
    folder = write(tmp_path, {**LLAMA, "quantization_config": ct_config(fmt, weights, **extra)}, tensors())
    packed = audit(folder, use_cache=False).packed
    assert packed.mismatches == ()
    stored = packed.stored_bytes + packed.overhead_bytes
    memory = estimate_memory(str(folder), MemoryOptions(seq=1))
    assert memory.weights.bytes == stored == expected
    assert len(memory.weights.quantized_tensors) == len(LINEARS)  # lm_head ignored, in bf16 as stored
    if layout == "nvfp4":  # the vLLM pre-flight takes these serving weights and the buffers
        assert main(["memory", str(folder), "--gpu", "h100", "--engine", "vllm", "--json"]) == 0
        vllm = json.loads(capsys.readouterr().out)["memory"]["vllm"]
        assert vllm["weights_bytes"] == stored + memory.weights.buffer_bytes == 116_536 + 128


def test_a_scheme_memory_does_not_model_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    config = {**LLAMA, "quantization_config": ct_config("marlin-24", {"num_bits": 4, "type": "int",
                                                                      "strategy": "group", "group_size": 128})}
    folder = write(tmp_path, config, int_packed(4, 128, zero_points=False))
    assert main(["memory", str(folder), "--seq", "1"]) != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "group_0 (format 'marlin-24') is a scheme paramscope's memory does not model" in err
