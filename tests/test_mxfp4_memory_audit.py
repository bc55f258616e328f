"""memory prices an MXFP4 checkpoint as it is stored: the experts' matrices in MXFP4, their biases in BF16
(transformers' Mxfp4HfQuantizer leaves `gate_up_proj_bias`/`down_proj_bias` unquantised), so memory's weights equal
audit's stored and scale bytes on the same file."""

from __future__ import annotations

from pathlib import Path

from paramscope.audit import audit
from paramscope.cost.memory.serving import MemoryOptions
from paramscope.cost.memory.serving_answer import estimate_memory
from test_packed_audit import GPT_OSS, gpt_oss_tensors, write


def test_mxfp4_biases_priced_as_stored(tmp_path: Path) -> None:
    folder = write(tmp_path / "gpt-oss", GPT_OSS, gpt_oss_tensors())
    packed = audit(folder, use_cache=False).packed.roles
    stored, scales = sum(r.stored_bytes for r in packed), sum(r.scale_bytes for r in packed)
    assert (stored, scales) == (71_432, 768)
    weights = estimate_memory(str(folder), MemoryOptions(), use_cache=False).weights
    # 24,576 fp4 values in 12,288 B + 768 one-byte block scales; the 384 bias parameters in BF16 (768 B)
    assert dict((label, b) for label, b, _ in weights.lines) == {"parameters in mxfp4": 12_288 + 768,
                                                                 "parameters in bf16": 29_572 * 2}
    assert (weights.bytes, weights.overhead, weights.quantized) == (stored + scales, 768, 24_576)
    assert ("the experts' biases", 384, "bf16") in weights.kept
