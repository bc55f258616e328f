"""Published GGUF files against the predicted mixture (issue 29 §2; docs/benchmarks.md, "GGUF files: predicted
tensor bytes against published file sizes"). A file is a 24-byte header, its metadata (key–values: the tokenizer's
vocabulary makes most of it), one info a tensor (name, dims, type, offset), padding to the alignment, then the
tensor data, which the prediction gives exactly. Two files of the same model that differ only in their mixture
carry the same metadata, so their sizes differ by the predicted tensor data alone.
"""

from __future__ import annotations

import pytest

gguf = pytest.importorskip("gguf")

from paramscope.cost.memory.llama_cpp_mixture import predict_gguf  # noqa: E402

# unsloth/Qwen3-14B-GGUF as the Hugging Face API lists it (docs/benchmarks.md names where the figures were read)
QWEN3_14B_Q4_K_M, QWEN3_14B_Q8_0 = 9_001_753_984, 15_698_534_784


def tensor_info_bytes(tensors) -> int:
    """GGUF's tensor infos: each name (u64 length + bytes), n_dims u32, dims u64 each, type u32, offset u64."""
    return sum(8 + len(t.name.encode()) + 4 + 8 * len(t.shape) + 4 + 8 for t in tensors)


def test_the_header_and_tensor_infos_are_the_bytes_a_written_file_spends(tmp_path) -> None:
    from types import SimpleNamespace as T

    import numpy as np

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")  # one key: general.architecture = "llama"
    w.add_tensor("blk.0.attn_q.weight", np.zeros((32, 64), np.float32))
    w.add_tensor("output_norm.weight", np.zeros((64,), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    kv = 8 + len("general.architecture") + 4 + 8 + len("llama")  # key, value type, string
    head = 24 + kv + tensor_info_bytes([T(name="blk.0.attn_q.weight", shape=(32, 64)),
                                       T(name="output_norm.weight", shape=(64,))])
    data = 32 * 64 * 4 + 64 * 4  # both multiples of the 32-byte alignment: no padding between them
    assert (head, path.stat().st_size) == (178, -(-head // 32) * 32 + data) == (178, 8_640)


def test_qwen3_14b_q4_k_m_and_q8_0_differ_by_the_predicted_tensor_bytes() -> None:
    """Qwen3-14B: 443 tensors; Q8_0 is 161 F32 + 282 Q8_0 as llama.cpp's loader lists the published file, and its
    "CPU_Mapped model buffer size = 14965.61 MiB"; the two published files differ by exactly the predicted tensor
    data, leaving the same 5,960,064 B of header and metadata in each."""
    import torch
    import transformers

    from paramscope.api import inspect_module

    config = transformers.Qwen3Config(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40,
                                      num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                                      vocab_size=151936, tie_word_embeddings=False)
    with torch.device("meta"):
        params = inspect_module(transformers.AutoModelForCausalLM.from_config(config)).params
    q4 = predict_gguf(params, config.to_dict(), "Q4_K_M", n_layers=40, imatrix=True)
    q8 = predict_gguf(params, config.to_dict(), "Q8_0", n_layers=40, imatrix=True)
    assert {k: r["tensors"] for k, r in q4.by_type().items()} == {"F32": 161, "Q4_K": 241, "Q6_K": 41}
    assert {k: r["tensors"] for k, r in q8.by_type().items()} == {"F32": 161, "Q8_0": 282}
    assert (q4.nbytes, q8.nbytes) == (8_995_793_920, 15_692_574_720)
    assert (round(q8.nbytes / 2**20, 2), round(q8.nbytes / 2**30, 2), round(q8.bits_per_weight, 2)) == (
        14965.61, 14.61, 8.5)
    assert QWEN3_14B_Q8_0 - QWEN3_14B_Q4_K_M == q8.nbytes - q4.nbytes == 6_696_780_800
    rest = QWEN3_14B_Q4_K_M - q4.nbytes
    assert rest == QWEN3_14B_Q8_0 - q8.nbytes == 5_960_064
    # of which: the 24-byte header and 443 tensor infos; the rest is key–value metadata and ≤ 31 B of padding
    assert tensor_info_bytes(q4.tensors) == tensor_info_bytes(q8.tensors) == 26_130
    assert rest - 24 - 26_130 == 5_933_910
