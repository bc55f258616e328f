"""llama.cpp's quantisation mixtures as --dtype: each tensor's ggml type by llama_tensor_get_type, and the predicted
file's tensor bytes against GGUF files written here with gguf's GGUFWriter (gguf.quants where it quantises the type,
random blocks of the type's exact size where it does not) and read back by `audit`'s reader.

The expected types below are written out by hand from src/llama-quant.cpp (the commit named in
cost/memory/llama_cpp_mixture.py), not computed by the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest

from paramscope.checkpoint.gguf_read import read_gguf
from paramscope.cost.memory.llama_cpp_mixture import predict_gguf
from paramscope.cost.memory.quantization import weight_format
from paramscope.cost.memory.serving import MemoryOptions

gguf = pytest.importorskip("gguf")

QUANTISABLE_HERE = {"Q4_0", "Q5_0", "Q8_0"}  # the types gguf.quants quantises (the K and IQ types it does not)


def _write(path, tensors):
    """A GGUF file holding `tensors` (name, ggml type name, shape in PyTorch order): gguf.quants' blocks of random
    values where it can, random bytes of the type's exact row size where it cannot."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, kind, shape in tensors:
        qtype = gguf.GGMLQuantizationType[kind]
        values = rng.standard_normal(shape).astype(np.float32)
        if kind == "F32":
            writer.add_tensor(name, values)
        elif kind == "F16":
            writer.add_tensor(name, values.astype(np.float16))
        elif kind in QUANTISABLE_HERE:
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        else:
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            rows = (*shape[:-1], shape[-1] // block * size)
            writer.add_tensor(name, rng.integers(0, 256, rows, dtype=np.uint8), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return read_gguf(path)


def _params(config):
    """The causal LM of `config` built on meta and counted (its head, tied or not, as memory counts it)."""
    import torch
    import transformers

    from paramscope.api import inspect_module

    with torch.device("meta"):
        module = transformers.AutoModelForCausalLM.from_config(config)
    report = inspect_module(module)
    return report, report.params


def _llama(hidden, inter, layers=2, tied=False, **extra):
    import transformers

    return transformers.LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                                    vocab_size=128, tie_word_embeddings=tied, **extra)


def _check(tmp_path, config, mixture, expected):
    """The prediction for `config` in `mixture` names exactly the tensors of `expected` (name → (type, shape)),
    types them so, and its bytes equal those of a file written with them, tensor by tensor and in total."""
    report, params = _params(config)
    predicted = predict_gguf(params, config.to_dict(), mixture, n_layers=report.num_layers)
    assert {t.name: (t.ggml_type, t.shape) for t in predicted.tensors} == expected
    ck = _write(tmp_path / f"{mixture}.gguf", [(n, k, s) for n, (k, s) in expected.items()])
    written = {t.name: t.nbytes for t in ck.tensors}
    assert {t.name: t.nbytes for t in predicted.tensors} == written
    assert predicted.nbytes == ck.nbytes and predicted.elements == ck.elements
    assert {k: (r["tensors"], r["bytes"]) for k, r in predicted.by_type().items()} == \
        {k: (r["tensors"], r["bytes"]) for k, r in ck.by_type().items()}
    assert {k: r["bytes"] for k, r in predicted.by_role().items()} == {k: r["bytes"] for k, r in ck.by_role().items()}
    return predicted


def _layer(i, hidden, inter, kv, types):
    """One Llama block's tensors, `types` giving attn_v's and ffn_down's and the rest's type."""
    v, down, rest = types
    return {f"blk.{i}.attn_norm.weight": ("F32", (hidden,)), f"blk.{i}.ffn_norm.weight": ("F32", (hidden,)),
            f"blk.{i}.attn_q.weight": (rest[0], (hidden, hidden)), f"blk.{i}.attn_k.weight": (rest[0], (kv, hidden)),
            f"blk.{i}.attn_v.weight": (v, (kv, hidden)), f"blk.{i}.attn_output.weight": (rest[0], (hidden, hidden)),
            f"blk.{i}.ffn_gate.weight": (rest[1], (inter, hidden)),
            f"blk.{i}.ffn_up.weight": (rest[1], (inter, hidden)),
            f"blk.{i}.ffn_down.weight": (down, (hidden, inter))}


def test_q4_k_m_two_layer_llama_matches_a_written_file(tmp_path):
    # use_more_bits(i, 2): i < 0 or i >= 1 or (i - 0) % 3 == 2, so layer 1 only: attn_v and ffn_down Q6_K there.
    expected = {"token_embd.weight": ("Q4_K", (128, 256)), "output.weight": ("Q6_K", (128, 256)),
                "output_norm.weight": ("F32", (256,)),
                **_layer(0, 256, 512, 128, ("Q4_K", "Q4_K", ("Q4_K", "Q4_K"))),
                **_layer(1, 256, 512, 128, ("Q6_K", "Q6_K", ("Q4_K", "Q4_K")))}
    predicted = _check(tmp_path, _llama(256, 512), "Q4_K_M", expected)
    assert not predicted.tied_embeddings


def test_rows_no_multiple_of_the_block_fall_back_and_tied_embeddings_take_the_output_type(tmp_path):
    # hidden 288 = 9 × 32: Q4_K's 256-blocks do not fit, Q5_0 does (tensor_type_fallback); the tied token_embd is
    # typed as the output, whose rows fit no Q4_K block: Q8_0. ffn_down's rows of 512 keep the K types.
    expected = {"token_embd.weight": ("Q8_0", (128, 288)), "output_norm.weight": ("F32", (288,)),
                **_layer(0, 288, 512, 144, ("Q5_0", "Q4_K", ("Q5_0", "Q5_0"))),
                **_layer(1, 288, 512, 144, ("Q8_0", "Q6_K", ("Q5_0", "Q5_0")))}
    predicted = _check(tmp_path, _llama(288, 512, tied=True), "Q4_K_M", expected)
    assert predicted.tied_embeddings
    assert any("tied embeddings" in n for n in predicted.notes)


def test_q4_k_s_and_q3_k_m_first_layers_and_q8_0(tmp_path):
    config = _llama(256, 512, layers=2)
    report, params = _params(config)
    types = {m: {t.name: t.ggml_type for t in predict_gguf(params, config.to_dict(), m).tensors}
             for m in ("Q4_K_S", "Q3_K_M", "Q8_0", "Q6_K", "Q5_K_M", "IQ4_XS")}
    # Q4_K_S: attn_v Q5_K for the first 4; ffn_down Q5_K where i < n/8 (none of 2)
    assert (types["Q4_K_S"]["blk.1.attn_v.weight"], types["Q4_K_S"]["blk.0.ffn_down.weight"]) == ("Q5_K", "Q4_K")
    # Q3_K_M: attn_v Q5_K for the first 2; attn_output Q4_K; ffn_down Q4_K (not Falcon); output Q6_K
    assert [types["Q3_K_M"][n] for n in ("blk.1.attn_v.weight", "blk.0.attn_output.weight",
                                         "blk.0.ffn_down.weight", "blk.0.attn_q.weight", "output.weight")] == \
        ["Q5_K", "Q4_K", "Q4_K", "Q3_K", "Q6_K"]
    assert set(types["Q8_0"].values()) == {"Q8_0", "F32"}  # the output stays Q8_0
    assert {k for k in types["Q6_K"].values()} == {"Q6_K", "F32"}
    assert types["Q5_K_M"]["blk.1.ffn_down.weight"] == "Q6_K" and types["Q5_K_M"]["blk.0.attn_q.weight"] == "Q5_K"
    # IQ4_XS: GQA 2 < 4 keeps attn_v; ffn_down of the first n/8 = 0 layers: none promoted; output Q6_K
    assert (types["IQ4_XS"]["blk.0.attn_v.weight"], types["IQ4_XS"]["output.weight"]) == ("IQ4_XS", "Q6_K")
    ck = _write(tmp_path / "q8.gguf", [(t.name, t.ggml_type, t.shape)
                                       for t in predict_gguf(params, config.to_dict(), "Q8_0").tensors])
    assert ck.nbytes == predict_gguf(params, config.to_dict(), "Q8_0").nbytes


def test_eight_experts_file_matches(tmp_path):
    import transformers

    config = transformers.MixtralConfig(hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=128,
                                        num_local_experts=8, num_experts_per_tok=2)
    expected = {"token_embd.weight": ("Q4_K", (128, 256)), "output.weight": ("Q6_K", (128, 256)),
                "output_norm.weight": ("F32", (256,))}
    for i in range(2):
        expected.update({
            f"blk.{i}.attn_norm.weight": ("F32", (256,)), f"blk.{i}.ffn_norm.weight": ("F32", (256,)),
            f"blk.{i}.attn_q.weight": ("Q4_K", (256, 256)),
            f"blk.{i}.attn_k.weight": ("Q8_0", (128, 256)),  # 8 experts: attn_k and attn_v Q8_0
            f"blk.{i}.attn_v.weight": ("Q8_0", (128, 256)),
            f"blk.{i}.attn_output.weight": ("Q5_K", (256, 256)),  # 8 experts, Q4_K_M: Q5_K
            f"blk.{i}.ffn_gate_inp.weight": ("F32", (8, 256)),  # the router: never quantised, F32 from the converter
            f"blk.{i}.ffn_gate_exps.weight": ("Q4_K", (8, 256, 256)),  # gate_up_proj [8, 512, 256], gate half
            f"blk.{i}.ffn_up_exps.weight": ("Q4_K", (8, 256, 256)),
            # experts: the layer read off the name, use_more_bits(i, 2) for layer 1
            f"blk.{i}.ffn_down_exps.weight": ("Q6_K" if i == 1 else "Q4_K", (8, 256, 256)),
        })
    predicted = _check(tmp_path, config, "Q4_K_M", expected)
    gate_up = predicted.param_bytes["model.layers.0.mlp.experts.gate_up_proj"]
    assert gate_up.total == 2 * 8 * 256 * 256 // 256 * 144


def test_llama_3_8b_q4_k_m_full_size():
    """Meta-Llama-3-8B in Q4_K_M: 291 tensors, F32 65 / Q4_K 193 / Q6_K 33, as llama.cpp's loader lists the
    published files; 4,912,898,048 B of tensors, llama.cpp's "4.58 GiB (4.89 BPW)"."""
    from paramscope.api import inspect

    report = inspect("meta-llama/Meta-Llama-3-8B")
    config = _preset_config("meta-llama/Meta-Llama-3-8B")
    predicted = predict_gguf(report.params, config, "Q4_K_M", n_layers=report.num_layers)
    assert {k: r["tensors"] for k, r in predicted.by_type().items()} == {"F32": 65, "Q4_K": 193, "Q6_K": 33}
    assert predicted.nbytes == 4_912_898_048
    assert (round(predicted.nbytes / 2**30, 2), round(predicted.bits_per_weight, 2)) == (4.58, 4.89)
    # Llama 3.1 writes its rope frequency factors too: F32 66 tensors, 256 B more
    config31 = _preset_config("meta-llama/Llama-3.1-8B")
    predicted31 = predict_gguf(inspect("meta-llama/Llama-3.1-8B").params, config31, "Q4_K_M", n_layers=32)
    assert {k: r["tensors"] for k, r in predicted31.by_type().items()} == {"F32": 66, "Q4_K": 193, "Q6_K": 33}
    assert predicted31.nbytes == 4_912_898_048 + 64 * 4


def test_llama_70b_attn_v_takes_q5_k_outside_use_more_bits():
    from paramscope.api import inspect

    config = _preset_config("meta-llama/Llama-3.1-70B")
    predicted = predict_gguf(inspect("meta-llama/Llama-3.1-70B").params, config, "Q4_K_M", n_layers=80)
    attn_v = [t.ggml_type for t in predicted.tensors if t.name.endswith("attn_v.weight")]
    # use_more_bits over 80 layers: 10 first, 10 last, and (i - 10) % 3 == 2 between: 20 → 40 Q6_K
    assert (attn_v.count("Q6_K"), attn_v.count("Q5_K")) == (40, 40)
    # qwen2 of 80 layers is llama.cpp's 70B too (Qwen2.5-72B); Llama-2-13B's 40 layers are not
    qwen = predict_gguf(inspect("Qwen/Qwen2.5-72B").params, _preset_config("Qwen/Qwen2.5-72B"), "Q4_K_M", n_layers=80)
    assert sum(t.ggml_type == "Q5_K" for t in qwen.tensors if t.name.endswith("attn_v.weight")) == 40
    llama2 = predict_gguf(inspect("meta-llama/Llama-2-13b-hf").params, _preset_config("meta-llama/Llama-2-13b-hf"),
                          "Q4_K_M", n_layers=40)
    assert not any(t.ggml_type == "Q5_K" for t in llama2.tensors)


def _preset_config(name):
    import json
    from pathlib import Path

    import paramscope

    path = Path(paramscope.__file__).parent / "presets" / "configs" / (name.replace("/", "--") + ".json")
    return json.loads(path.read_text())


def test_fallbacks_and_the_dtype_names():
    fmt = weight_format("Q4_K_M")
    assert (fmt.key, fmt.mixture, fmt.quant_type) == ("q4_k_m", "Q4_K_M", "q4_k")
    assert weight_format("q4-k-m").mixture == "Q4_K_M" and weight_format("q4_0").mixture == "Q4_0"
    assert weight_format("q4_k").mixture is None  # a type, not a mixture: every matrix Q4_K, as --pure
    # IQ4_XS's 256-blocks fall back to IQ4_NL's 32-blocks; rows of 100 fit neither: F16
    assert weight_format("iq4_xs").tensor_bytes((64, 288)).storage == "iq4_nl (fallback)"
    assert weight_format("iq4_xs").tensor_bytes((64, 100)).storage.startswith("f16")
    for kind in ("iq4_nl", "iq4_xs", "iq3_s", "q4_k", "q6_k"):  # block sizes as gguf's table has them
        from paramscope.cost.memory.quantization import GGUF_TYPES

        assert GGUF_TYPES[kind][:2] == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind.upper()]]


def test_memory_names_the_mixture_and_its_file():
    from paramscope.cost.memory.serving_answer import estimate_memory

    import transformers

    config = transformers.MixtralConfig(hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=128,
                                        num_local_experts=8, num_experts_per_tok=2)
    memory = estimate_memory(config, MemoryOptions(dtype="q4_k_m", seq=16))
    file = memory.settings["gguf_file"]
    assert file["mixture"] == "Q4_K_M" and "llama_tensor_get_type" in file["source"]
    # the config reaches the rules as the memory command holds it (an object): 8 experts, attn_k/attn_v Q8_0
    assert file["arch"] == "llama" and file["by_type"]["Q8_0"]["tensors"] == 4
    listed = {t["name"]: t for t in file["tensor_list"]}
    assert len(listed) == file["tensors"] and sum(t["bytes"] for t in listed.values()) == file["bytes"]
    assert listed["blk.0.attn_v.weight"]["type"] == "Q8_0" and "8 experts" in listed["blk.0.attn_v.weight"]["why"]
    assert memory.weights.bytes == file["bytes"]
    assert memory.weights.by_dtype["q6_k"] == file["by_type"]["Q6_K"]["bytes"]
    assert any("predicted Q4_K_M GGUF file" in n for n in memory.notes)


def test_a_tensor_parallel_slice_holds_its_share_in_whole_blocks():
    from dataclasses import replace

    from paramscope.cost.memory.llama_cpp_mixture import with_prediction
    from paramscope.errors import ParamscopeError

    config = _llama(256, 512)
    report, params = _params(config)
    fmt = with_prediction(weight_format("q4_k_m"), params, config.to_dict(), 2)
    down = next(p for p in params if p.name == "model.layers.1.mlp.down_proj.weight")  # Q6_K, [256, 512]
    assert fmt.stored_bytes(down).total == 256 * 512 // 256 * 210
    row_half = replace(down, shape=(256, 256), numel=256 * 256)  # the input split in two: rows of 256, whole blocks
    assert fmt.stored_bytes(row_half).total == 256 * 256 // 256 * 210
    with pytest.raises(ParamscopeError, match="no whole number of Q6_K blocks"):
        fmt.stored_bytes(replace(down, shape=(256, 128), numel=256 * 128))  # rows of 128: no 256-block fits


def test_qwen2_5_0_5b_q4_k_m_falls_back_as_the_published_file():
    """Qwen2.5-0.5B's width of 896 fits no 256-block: Q4_K → Q5_0, Q6_K → Q8_0, the tied token_embd Q8_0.
    llama.cpp's loader lists a Q4_K_M of it (ollama/ollama issue #9031) as f32 121, q5_0 132, q8_0 13, q4_K 12,
    q6_K 12."""
    from paramscope.api import inspect

    predicted = predict_gguf(inspect("Qwen/Qwen2.5-0.5B").params, _preset_config("Qwen/Qwen2.5-0.5B"), "Q4_K_M",
                             n_layers=24)
    assert {k: r["tensors"] for k, r in predicted.by_type().items()} == \
        {"F32": 121, "Q5_0": 132, "Q8_0": 13, "Q4_K": 12, "Q6_K": 12}
    assert predicted.tied_embeddings and predicted.nbytes == 391_859_712


def test_mla_kv_b_is_written_as_k_b_and_v_b():
    """DeepSeek-V3: the converter splits kv_b_proj [128·(128 + 128), 512] into attn_k_b [128, 512, 128] (rows of
    qk_nope 128: Q4_K falls back to Q5_0) and attn_v_b [128, 128, 512] (Q4_K); llama.cpp's rules name neither."""
    from paramscope.api import inspect

    report = inspect("deepseek-ai/DeepSeek-V3")
    predicted = predict_gguf(report.params, _preset_config("deepseek-ai/DeepSeek-V3"), "Q4_K_M", n_layers=61,
                             buffers=report.buffers)
    layer0 = {t.name: (t.ggml_type, t.shape, t.nbytes) for t in predicted.tensors
              if t.name in ("blk.0.attn_k_b.weight", "blk.0.attn_v_b.weight")}
    assert layer0 == {"blk.0.attn_k_b.weight": ("Q5_0", (128, 512, 128), 128 * 512 * 128 // 32 * 22),
                      "blk.0.attn_v_b.weight": ("Q4_K", (128, 128, 512), 128 * 128 * 512 // 256 * 144)}
    assert not any(t.name.endswith("attn_kv_b.weight") for t in predicted.tensors)
    # the router's score-correction bias (a buffer) is written too: blk.3-60.exp_probs_b.bias, F32. The whole file:
    # 1,086 tensors, as llama.cpp's loader counts the split-kv_b DeepSeek-V3 GGUFs; the types as it lists a
    # Q4_K_M made before the split (f32 361, q4_K 606, q6_K 58), with attn_k_b's 61 now Q5_0 and attn_v_b's Q4_K.
    assert len(predicted.tensors) == 1086
    assert {k: r["tensors"] for k, r in predicted.by_type().items()} == {"F32": 361, "Q4_K": 606, "Q5_0": 61,
                                                                          "Q6_K": 58}


def test_an_importance_matrix_changes_iq4_xs_and_q4_0_first_ffn_down_layers():
    from paramscope.api import inspect
    from paramscope.errors import ParamscopeError

    params, config = inspect("meta-llama/Meta-Llama-3-8B").params, _preset_config("meta-llama/Meta-Llama-3-8B")

    def counts(mixture, imatrix):
        predicted = predict_gguf(params, config, mixture, n_layers=32, imatrix=imatrix)
        return {k: r["tensors"] for k, r in predicted.by_type().items()}

    # IQ4_XS: attn_v Q5_K (GQA 32/8 = 4); without an importance matrix also ffn_down of layers 0-3 (< 32/8)
    assert counts("IQ4_XS", False) == {"F32": 65, "IQ4_XS": 189, "Q5_K": 36, "Q6_K": 1}
    assert counts("IQ4_XS", True) == {"F32": 65, "IQ4_XS": 193, "Q5_K": 32, "Q6_K": 1}
    # Q4_0 with one: ffn_down of layers 0-3 Q4_1; Q4_K_M reads no importance matrix
    assert counts("Q4_0", True) == {"F32": 65, "Q4_0": 221, "Q4_1": 4, "Q6_K": 1}
    assert counts("Q4_K_M", True) == counts("Q4_K_M", False)
    with pytest.raises(ParamscopeError, match="imatrix"):
        MemoryOptions(dtype="q4_k", imatrix=True).check()  # a single type, not a mixture


@pytest.mark.parametrize("name", ["openai-community/gpt2", "mistralai/Mixtral-8x7B-v0.1", "google/gemma-2-2b",
                                  "google-t5/t5-small", "facebook/bart-base", "microsoft/Phi-3-mini-4k-instruct"])
def test_every_parameter_is_in_exactly_one_uniquely_named_tensor(name):
    """Whatever the architecture (one llama.cpp knows, or BART, which it does not: role names of its encoder and
    decoder would meet), the predicted tensors hold every parameter's values once, under names of their own."""
    from paramscope.api import inspect

    report = inspect(name)
    predicted = predict_gguf(report.params, _preset_config(name), "Q4_K_M", n_layers=report.num_layers or 0,
                             buffers=report.buffers)
    assert len({t.name for t in predicted.tensors}) == len(predicted.tensors)
    assert sum(t.elements for t in predicted.tensors if t.sources) == sum(p.numel for p in report.params)
    assert sum(c.total for c in predicted.param_bytes.values()) == sum(t.nbytes for t in predicted.tensors
                                                                         if t.sources)
