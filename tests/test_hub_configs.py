"""Real hub config.json files, as they come: quantization_config, auto_map, rope_scaling, torch_dtype,
transformers_version. Counts are logical parameters; the storage format is reported; no backend is needed."""

from __future__ import annotations

import json
import sys

import pytest

import paramscope
from paramscope.presets import find_preset
from paramscope.quant import describe_storage
from paramscope.render.json import render_json
from paramscope.render.text import TextOptions, render_text

from conftest import report_of

QUANT_BACKENDS = ("bitsandbytes", "auto_gptq", "gptqmodel", "awq", "optimum", "fbgemm_gpu", "compressed_tensors")


def _preset(name: str, **overrides) -> dict:
    config = find_preset(name).load_config()
    config.update(overrides)
    return config


def test_deepseek_v3_fp8_block_wise_and_auto_map_native():
    report = report_of("deepseek-v3")
    assert report.model.native is True
    assert report.model.class_name == "DeepseekV3ForCausalLM"
    storage = report.model.storage
    assert storage.quant_method == "fp8" and storage.bits == 8 and storage.dtype == "bfloat16"
    assert storage.description.startswith("fp8 (e4m3) weights, 1 byte each, block-wise scales (128×128 blocks)")
    notes = " ".join(report.model.notes)
    assert "auto_map names remote code" in notes and "no remote code ran" in notes
    assert "quantization_config (fp8) not applied" in notes and "no quantisation backend is needed" in notes
    assert "num_nextn_predict_layers=1" in notes  # the MTP module is in the checkpoint, not in the count
    text = render_text(report, TextOptions(width=200, tree=False))
    assert "storage  fp8 (e4m3) weights, 1 byte each, block-wise scales (128×128 blocks)" in text
    doc = json.loads(render_json(report))
    assert doc["model"]["storage"]["quant_method"] == "fp8"


GPTQ = {"bits": 4, "group_size": 128, "damp_percent": 0.01, "desc_act": False, "sym": True,
        "true_sequential": True, "model_name_or_path": None, "model_file_base_name": "model", "quant_method": "gptq"}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
       "modules_to_not_convert": None}
BNB_4BIT = {"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
            "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16",
            "llm_int8_skip_modules": None, "llm_int8_threshold": 6.0}
BNB_8BIT = {"quant_method": "bitsandbytes", "load_in_8bit": True, "load_in_4bit": False,
            "llm_int8_threshold": 6.0}
MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}
FP8_PER_TENSOR = {"quant_method": "fp8", "activation_scheme": "static"}


@pytest.mark.parametrize("quant, expected", [
    (GPTQ, "GPTQ int4 weights, packed 8 per int32 (0.5 bytes each), group-wise scales and zero points "
           "(groups of 128)"),
    (AWQ, "AWQ int4 weights, packed 8 per int32 (0.5 bytes each), group-wise scales and zero points (groups of 128)"),
    (BNB_4BIT, "bitsandbytes 4-bit NF4 weights (0.5 bytes each), block-wise absmax scales (blocks of 64), "
               "scales quantised again (double quantisation)"),
    (BNB_8BIT, "bitsandbytes 8-bit LLM.int8() weights, 1 byte each, per-row scales (outliers kept in 16-bit)"),
    (MXFP4, "MXFP4 weights (4-bit e2m1, 0.5 bytes each), one shared 8-bit scale per block of 32; kept unquantised: "
            "model.layers.*.self_attn, model.layers.*.mlp.router, model.embed_tokens and 1 more"),
    (FP8_PER_TENSOR, "fp8 weights, 1 byte each, per-tensor scales, static activation scales"),
], ids=["gptq", "awq", "bnb-4bit", "bnb-8bit", "mxfp4", "fp8"])
def test_quantized_configs_count_logical_parameters_without_a_backend(quant, expected):
    plain = report_of("llama-2-7b")
    report = paramscope.inspect(_preset("llama-2-7b", quantization_config=quant, torch_dtype="float16"))
    assert report.parameters.total == plain.parameters.total == 6_738_415_616
    assert report.breakdown == plain.breakdown
    assert report.model.storage.description == expected + "; other tensors float16"
    assert not [m for m in QUANT_BACKENDS if m in sys.modules]


def test_storage_of_an_unquantised_checkpoint_is_its_declared_dtype():
    assert report_of("llama-3.1-8b").model.storage.description == (
        "bfloat16 weights, 2 bytes each (declared dtype; no quantisation)")
    assert describe_storage({"dtype": "float32"}).description.startswith("float32 weights, 4 bytes each")
    assert describe_storage({"model_type": "bert"}) is None


def test_phi3_auto_map_native_class_without_remote_code():
    report = report_of("phi-3-mini")
    assert report.model.native is True and report.model.class_name == "Phi3ForCausalLM"
    assert any("auto_map" in note and "no remote code ran" in note for note in report.model.notes)


def test_remote_class_name_for_a_native_model_type_uses_the_native_class_with_the_same_head():
    config = _preset("llama-3.1-8b", architectures=["MyLlamaForCausalLM"],
                     auto_map={"AutoModelForCausalLM": "modeling_my_llama.MyLlamaForCausalLM"})
    report = paramscope.inspect(config)
    assert report.model.class_name == "LlamaForCausalLM"
    assert "MyLlamaForCausalLM" in report.model.class_reason
    assert report.parameters.total == 8_030_261_248
    assert report.model.native is True


LONGROPE = {"short_factor": [1.0] * 48, "long_factor": [1.5] * 48}


@pytest.mark.parametrize("preset, rope_scaling, total", [
    ("llama-2-7b", {"type": "linear", "factor": 2.0}, 6_738_415_616),
    ("llama-2-7b", {"type": "dynamic", "factor": 2.0}, 6_738_415_616),
    ("llama-2-7b", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}, 6_738_415_616),
    ("phi-3-mini", {"type": "longrope", **LONGROPE}, 3_821_079_552),
    ("phi-3-mini", {"type": "su", **LONGROPE}, 3_821_079_552),  # Phi-3-128k's first configs
], ids=["linear", "dynamic", "yarn", "longrope", "su"])
def test_rope_scaling_variants_do_not_change_the_count(preset, rope_scaling, total):
    extra = {"original_max_position_embeddings": 4096, "max_position_embeddings": 131072} if "phi" in preset else {}
    config = _preset(preset, rope_scaling=rope_scaling, transformers_version="4.40.0.dev0", **extra)
    assert paramscope.inspect(config).parameters.total == total


def test_llama_3_1_rope_scaling_and_deepseek_yarn_build():
    assert report_of("llama-3.1-8b").model.storage.dtype == "bfloat16"  # rope_type llama3 in the preset
    assert report_of("deepseek-v3").parameters.total == 671_026_404_352  # yarn
