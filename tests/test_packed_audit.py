"""`paramscope audit` of packed quantised checkpoints: compressed-tensors (int4/int8 pack-quantized, fp8 blocks,
NVFP4), gpt-oss's MXFP4 and bitsandbytes LLM.int8, each written here in its library's real layout with safetensors,
reconciled to the class's logical parameters, per role, with exact stored and bookkeeping bytes; and the config's
quantization_config checked against the headers (mismatches named; self-contradicting headers refused in one line).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from paramscope.audit import audit  # noqa: E402
from paramscope.cli import main  # noqa: E402

# A tiny Llama: hidden 128, 4 heads of 32 (2 KV heads), MLP 256, vocabulary 64, untied head.
LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=128, intermediate_size=256,
             num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=64,
             tie_word_embeddings=False, torch_dtype="bfloat16")
LLAMA_PARAMS = 64 * 128 * 2 + 128 * 128 * 2 + 64 * 128 * 2 + 256 * 128 * 3 + 128 * 3  # 164,224
# (module, out, in, role) of each linear layer the schemes quantise
LINEARS = [("self_attn.q_proj", 128, 128, "attention.query"), ("self_attn.k_proj", 64, 128, "attention.key"),
           ("self_attn.v_proj", 64, 128, "attention.value"), ("self_attn.o_proj", 128, 128, "attention.output"),
           ("mlp.gate_proj", 256, 128, "mlp.gate"), ("mlp.up_proj", 256, 128, "mlp.up"),
           ("mlp.down_proj", 128, 256, "mlp.down")]
PLAIN = {"model.embed_tokens.weight": ((64, 128), "embeddings.word"), "lm_head.weight": ((64, 128), "head.lm"),
         "model.layers.0.input_layernorm.weight": ((128,), "attention.norm"),
         "model.layers.0.post_attention_layernorm.weight": ((128,), "mlp.norm"),
         "model.norm.weight": ((128,), "norm.final")}


def ct_config(fmt: str, weights: dict, ignore=("lm_head",), **group) -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, **group}},
            "ignore": list(ignore)}


def write(folder: Path, config: dict, tensors: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def plain(tensors: dict, skip=()) -> dict:
    for name, (shape, _) in PLAIN.items():
        if name not in skip:
            tensors[name] = torch.zeros(shape, dtype=torch.bfloat16)
    return tensors


def roles(result) -> dict:
    return {r.role: (r.tensors, r.parameters, r.stored_bytes, r.scale_bytes, r.zero_bytes, r.index_bytes)
            for r in result.packed.roles}


def plain_roles(skip=()) -> dict:
    return {role: (1, math.prod(shape), 2 * math.prod(shape), 0, 0, 0)
            for name, (shape, role) in PLAIN.items() if name not in skip}


def assert_reconciled(result) -> None:
    """Every parameter of the class loaded, and the unpacked count per role adds up to the class's count."""
    assert result.report.total == LLAMA_PARAMS or result.report.model.class_name != "LlamaForCausalLM"
    assert result.audit.complete and result.audit.unexpected == () and result.audit.mismatched == ()
    assert result.audit.parameters == result.report.total == result.packed.parameters


def int_packed(bits: int, group: int | None, *, zero_points: bool) -> dict:
    """compressed-tensors pack-quantized: weight_packed I32 [out, ⌈in·b/32⌉], weight_scale BF16 [out, groups],
    weight_zero_point I32 [⌈out·b/32⌉, groups] (asymmetric), weight_shape I64 [2]."""
    tensors: dict = {}
    for module, out, cols, _ in LINEARS:
        p = f"model.layers.0.{module}."
        groups = -(-cols // group) if group else 1
        tensors[p + "weight_packed"] = torch.zeros(out, -(-cols * bits // 32), dtype=torch.int32)
        tensors[p + "weight_scale"] = torch.zeros(out, groups, dtype=torch.bfloat16)
        if zero_points:
            tensors[p + "weight_zero_point"] = torch.zeros(-(-out * bits // 32), groups, dtype=torch.int32)
        tensors[p + "weight_shape"] = torch.tensor([out, cols])
    return plain(tensors)


# ---------------------------------------------------------------------------------------------
# each layout reconciled
# ---------------------------------------------------------------------------------------------


def test_compressed_tensors_int4_group_asymmetric(tmp_path: Path) -> None:
    weights = {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 128}
    folder = write(tmp_path, {**LLAMA, "quantization_config": ct_config("pack-quantized", weights)},
                   int_packed(4, 128, zero_points=True))
    result = audit(folder, use_cache=False)
    assert_reconciled(result)
    expected = {role: (1, out * cols, out * cols // 2, out * (cols // 128) * 2, out // 8 * (cols // 128) * 4, 16)
                for _, out, cols, role in LINEARS}
    assert roles(result) == {**expected, **plain_roles()}
    # q: 16,384 values in 8,192 bytes, 256 bytes of scales, 64 of zero points, 16 of weight_shape
    assert roles(result)["attention.query"] == (1, 16_384, 8_192, 256, 64, 16)
    assert result.packed.shape_records == 7
    assert dict(result.packed.schemes) == {"BF16 (unquantised)": 5, "int4 group 128 (pack-quantized)": 7}
    assert result.packed.mismatches == ()
    # the packed weights' unpacked count comes from their weight_shape records
    assert result.checkpoint.tensor("model.layers.0.mlp.down_proj.weight_packed").logical_numel == 128 * 256


def test_compressed_tensors_int8_per_channel(tmp_path: Path) -> None:
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
    folder = write(tmp_path, {**LLAMA, "quantization_config": ct_config("pack-quantized", weights)},
                   int_packed(8, None, zero_points=False))
    result = audit(folder, use_cache=False)
    assert_reconciled(result)
    assert roles(result) == {**{role: (1, out * cols, out * cols, out * 2, 0, 16) for _, out, cols, role in LINEARS},
                             **plain_roles()}
    assert set(result.packed.schemes) == {"BF16 (unquantised)", "int8 per channel (pack-quantized)"}
    assert result.packed.mismatches == ()


def test_fp8_block_scales(tmp_path: Path) -> None:
    # float-quantized, 128×128 blocks: weight F8_E4M3 at the model's shape, weight_scale F32 [⌈out/128⌉, ⌈in/128⌉]
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "block", "block_structure": [128, 128]}
    tensors: dict = {}
    for module, out, cols, _ in LINEARS:
        p = f"model.layers.0.{module}."
        tensors[p + "weight"] = torch.zeros(out, cols, dtype=torch.float8_e4m3fn)
        tensors[p + "weight_scale"] = torch.zeros(-(-out // 128), -(-cols // 128), dtype=torch.float32)
    folder = write(tmp_path, {**LLAMA, "quantization_config": ct_config("float-quantized", weights)}, plain(tensors))
    result = audit(folder, use_cache=False)
    assert_reconciled(result)
    assert roles(result) == {**{role: (1, out * cols, out * cols, 4 * -(-out // 128) * -(-cols // 128), 0, 0)
                                for _, out, cols, role in LINEARS}, **plain_roles()}
    assert roles(result)["mlp.gate"] == (1, 32_768, 32_768, 8, 0, 0)  # 2×1 blocks of 128×128
    assert "float8 block 128×128 (float-quantized)" in result.packed.schemes
    assert result.packed.mismatches == ()


def test_fp8_weight_scale_inv_with_a_config_block_it_contradicts(tmp_path: Path) -> None:
    # quant_method fp8 (transformers' FineGrainedFP8, DeepSeek-V3's layout): weight_scale_inv [⌈out/b⌉, ⌈in/b⌉]; the
    # headers hold 64×64 blocks where the config says 128×128
    tensors: dict = {}
    for module, out, cols, _ in LINEARS:
        p = f"model.layers.0.{module}."
        tensors[p + "weight"] = torch.zeros(out, cols, dtype=torch.float8_e4m3fn)
        tensors[p + "weight_scale_inv"] = torch.zeros(out // 64, cols // 64, dtype=torch.float32)
    config = {**LLAMA, "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                               "weight_block_size": [128, 128]}}
    result = audit(write(tmp_path, config, plain(tensors)), use_cache=False)
    assert_reconciled(result)
    assert roles(result)["mlp.down"] == (1, 32_768, 32_768, 4 * 2 * 4, 0, 0)
    [m] = result.packed.mismatches
    assert (m.field, m.config, len(m.tensors)) == ("block", "[128, 128] (weight_block_size)", 7)
    assert m.headers == "scales for blocks of 64×64"
    assert result.packed.schemes == {"BF16 (unquantised)": 5, "float8 block 64×64 (fp8)": 7}


def nvfp4_tensors() -> dict:
    """The tiny Llama's linears in nvfp4-pack-quantized, the rest plain (test_compressed_tensors_memory too)."""
    tensors: dict = {}
    for module, out, cols, _ in LINEARS:
        p = f"model.layers.0.{module}."
        tensors[p + "weight_packed"] = torch.zeros(out, cols // 2, dtype=torch.uint8)
        tensors[p + "weight_scale"] = torch.zeros(out, cols // 16, dtype=torch.float8_e4m3fn)
        tensors[p + "weight_global_scale"] = torch.zeros(1, dtype=torch.float32)
        tensors[p + "input_global_scale"] = torch.zeros(1, dtype=torch.float32)
    return plain(tensors)


def test_nvfp4(tmp_path: Path) -> None:
    # nvfp4-pack-quantized: weight_packed U8 [out, in/2], weight_scale F8_E4M3 [out, in/16], global scales F32 [1]
    weights = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": 16}
    folder = write(tmp_path, {**LLAMA, "quantization_config": ct_config("nvfp4-pack-quantized", weights,
                                                                          input_activations=dict(weights))},
                   nvfp4_tensors())
    result = audit(folder, use_cache=False)
    assert_reconciled(result)
    assert roles(result) == {**{role: (1, out * cols, out * cols // 2, out * cols // 16 + 8, 0, 0)
                                for _, out, cols, role in LINEARS}, **plain_roles()}
    assert "float4 group 16 (nvfp4-pack-quantized)" in result.packed.schemes
    assert result.packed.mismatches == ()
    # 4 bits a value, 8 bits a 16 values' scale, and two 4-byte global scales: 4.5 bits and a little more
    assert roles(result)["mlp.down"][2:4] == (16_384, 2_056)


GPT_OSS = dict(model_type="gpt_oss", architectures=["GptOssForCausalLM"], hidden_size=64, intermediate_size=64,
               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=128,
               num_local_experts=2, num_experts_per_tok=1, sliding_window=8, layer_types=["sliding_attention"],
               torch_dtype="bfloat16",
               quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": [
                   "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]})


def gpt_oss_tensors(scales_last: int = 2) -> dict:
    """gpt-oss's layout: the experts' gate_up_proj/down_proj as U8 `_blocks` [E, out, in/32, 16] and `_scales`
    [E, out, in/32] (one e8m0 exponent a 32-value block), everything else BF16."""
    e, h, i = 2, 64, 64
    bf = torch.bfloat16
    p = "model.layers.0."
    t = {"model.embed_tokens.weight": torch.zeros(128, h, dtype=bf), "lm_head.weight": torch.zeros(128, h, dtype=bf),
         "model.norm.weight": torch.zeros(h, dtype=bf), p + "input_layernorm.weight": torch.zeros(h, dtype=bf),
         p + "post_attention_layernorm.weight": torch.zeros(h, dtype=bf), p + "self_attn.sinks": torch.zeros(2, dtype=bf),
         p + "mlp.router.weight": torch.zeros(e, h, dtype=bf), p + "mlp.router.bias": torch.zeros(e, dtype=bf),
         p + "mlp.experts.gate_up_proj_bias": torch.zeros(e, 2 * i, dtype=bf),
         p + "mlp.experts.down_proj_bias": torch.zeros(e, h, dtype=bf),
         p + "mlp.experts.gate_up_proj_blocks": torch.zeros(e, 2 * i, h // 32, 16, dtype=torch.uint8),
         p + "mlp.experts.gate_up_proj_scales": torch.zeros(e, 2 * i, h // 32, dtype=torch.uint8),
         p + "mlp.experts.down_proj_blocks": torch.zeros(e, h, i // 32, 16, dtype=torch.uint8),
         p + "mlp.experts.down_proj_scales": torch.zeros(e, h, scales_last, dtype=torch.uint8)}
    for proj, out in (("q_proj", 64), ("k_proj", 32), ("v_proj", 32), ("o_proj", 64)):
        t[p + f"self_attn.{proj}.weight"] = torch.zeros(out, 64, dtype=bf)
        t[p + f"self_attn.{proj}.bias"] = torch.zeros(out, dtype=bf)
    return t


def test_mxfp4_gpt_oss_experts(tmp_path: Path) -> None:
    result = audit(write(tmp_path, GPT_OSS, gpt_oss_tensors()), use_cache=False)
    assert result.report.total == 54_148
    assert_reconciled(result)
    experts = next(r for r in result.packed.roles if r.role == "moe.experts")
    # 2 × 64 × 128 + 2 × 64 × 64 = 24,576 fp4 values in 12,288 bytes, 768 one-byte scales; the biases in BF16
    assert (experts.tensors, experts.parameters) == (4, 24_576 + 2 * 128 + 2 * 64)
    assert (experts.stored_bytes, experts.scale_bytes, experts.zero_bytes) == (12_288 + 2 * 384, 768, 0)
    assert set(experts.schemes) == {"float4 group 32 (mxfp4)", "BF16 (unquantised)"}
    assert result.checkpoint.tensor("model.layers.0.mlp.experts.gate_up_proj_blocks").logical_numel == 16_384
    assert result.packed.mismatches == ()


def test_bitsandbytes_int8(tmp_path: Path) -> None:
    # LLM.int8: weight I8 [out, in], SCB F32 [out] (one absmax a row), weight_format U8 [] (0: row-major)
    tensors: dict = {}
    for module, out, cols, _ in LINEARS:
        p = f"model.layers.0.{module}."
        tensors[p + "weight"] = torch.zeros(out, cols, dtype=torch.int8)
        tensors[p + "SCB"] = torch.zeros(out, dtype=torch.float32)
        tensors[p + "weight_format"] = torch.tensor(0, dtype=torch.uint8)
    config = {**LLAMA, "quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True,
                                               "llm_int8_threshold": 6.0}}
    result = audit(write(tmp_path, config, plain(tensors)), use_cache=False)
    assert_reconciled(result)
    assert roles(result) == {**{role: (1, out * cols, out * cols, 4 * out, 0, 1) for _, out, cols, role in LINEARS},
                             **plain_roles()}
    assert result.packed.mismatches == ()  # the head stays BF16, as transformers keeps it


# ---------------------------------------------------------------------------------------------
# the config against the headers: named mismatches
# ---------------------------------------------------------------------------------------------


def test_config_says_int4_headers_hold_int8(tmp_path: Path) -> None:
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "channel"}
    folder = write(tmp_path, {**LLAMA, "quantization_config": ct_config("pack-quantized", weights)},
                   int_packed(8, None, zero_points=False))
    result = audit(folder, use_cache=False)
    assert_reconciled(result)  # the count still reconciles: the mismatch is the config's, named
    [m] = result.packed.mismatches
    assert (m.field, m.config, m.headers, len(m.tensors)) == (
        "bits", "int4 (group_0.weights.num_bits)", "int8", 7)
    assert m.line.startswith("bits: quantization_config says int4 (group_0.weights.num_bits); the headers hold int8 "
                             "(7 weights: model.layers.0.mlp.down_proj.weight_packed")


def test_scales_for_another_group_size(tmp_path: Path) -> None:
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}
    folder = write(tmp_path, {**LLAMA, "quantization_config": ct_config("pack-quantized", weights)},
                   int_packed(4, 64, zero_points=False))
    rows, down = audit(folder, use_cache=False).packed.mismatches
    assert (rows.field, rows.config, len(rows.tensors)) == ("group_size", "128 (group_0.weights.group_size)", 6)
    assert rows.headers == "2 scales a row of 128 values (int4 group 64 (pack-quantized))"
    assert (down.headers, down.tensors) == ("4 scales a row of 256 values (int4 group 64 (pack-quantized))",
                                            ("model.layers.0.mlp.down_proj.weight_packed",))


def test_ignore_list_against_the_headers(tmp_path: Path) -> None:
    # the config ignores nothing: lm_head (a Linear) should be packed, and is BF16; q_proj is ignored yet packed
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}
    config = {**LLAMA, "quantization_config": ct_config("pack-quantized", weights,
                                                         ignore=["re:.*q_proj$"])}
    mismatches = audit(write(tmp_path, config, int_packed(4, 128, zero_points=False)),
                       use_cache=False).packed.mismatches
    assert [(m.field, m.tensors) for m in mismatches] == [
        ("quantised", ("lm_head.weight",)), ("unquantised", ("model.layers.0.self_attn.q_proj.weight_packed",))]
    assert mismatches[0].config == "group_0 targets it (Linear) and ignore does not name it"
    assert mismatches[1].config == "ignore names its module"


def test_packed_weights_without_a_quantization_config(tmp_path: Path, capsys) -> None:
    folder = write(tmp_path, LLAMA, int_packed(4, 128, zero_points=False))
    assert main(["audit", str(folder), "--no-cache", "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert "Quantised storage by role (parameters unpacked; bytes as stored)" in out
    assert "no quantization_config" in out
    assert ("  mismatch   method: quantization_config says nothing (the config has no quantization_config); the "
            "headers hold int4 group 128 (pack-quantized)") in out
    # without a config, one scale a row of 128 reads as per channel; down_proj's 2 a row of 256, as groups of 128
    assert ("  stored as  int4 per channel (pack-quantized): 6 weights (mlp.gate, mlp.up, attention.output, "
            "attention.query, attention.key, attention.value)\n") in out
    assert "             int4 group 128 (pack-quantized): 1 weight (mlp.down)\n" in out
    assert "headers, and the 7 weight_shape records of compressed-tensors" in out


def test_json_quantization_block(tmp_path: Path, capsys) -> None:
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}
    folder = write(tmp_path, {**LLAMA, "quantization_config": ct_config("pack-quantized", weights)},
                   int_packed(4, 128, zero_points=False))
    assert main(["audit", str(folder), "--no-cache", "--json"]) == 0
    q = json.loads(capsys.readouterr().out)["checkpoint"]["quantization"]
    assert q["parameters"] == LLAMA_PARAMS and q["shape_records_read"] == 7 and q["mismatches"] == []
    assert q["stored_bytes"] == sum(out * cols // 2 for _, out, cols, _ in LINEARS) + 2 * (2 * 8192 + 3 * 128)
    down = next(r for r in q["roles"] if r["role"] == "mlp.down")
    assert down == {"role": "mlp.down", "tensors": 1, "parameters": 32_768, "stored_bytes": 16_384,
                    "scale_bytes": 512, "zero_bytes": 0, "index_bytes": 16, "overhead_bytes": 528,
                    "bits_per_parameter": (16_384 + 528) * 8 / 32_768, "schemes": ["int4 group 128 (pack-quantized)"]}


# ---------------------------------------------------------------------------------------------
# headers that contradict themselves: one line, exit 2
# ---------------------------------------------------------------------------------------------


def _refused(folder: Path, capsys) -> str:
    assert main(["audit", str(folder), "--no-cache"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_packed_shape_against_weight_shape(tmp_path: Path, capsys) -> None:
    tensors = int_packed(4, 128, zero_points=False)
    tensors["model.layers.0.mlp.down_proj.weight_shape"] = torch.tensor([128, 2048])  # 32 words: 1,024 at most
    err = _refused(write(tmp_path, LLAMA, tensors), capsys)
    assert "'model.layers.0.mlp.down_proj.weight_packed': packed shape [128, 32] cannot hold weight_shape " \
           "[128, 2048] at any width of 1 to 8 bits" in err


def test_scales_that_fit_no_group(tmp_path: Path, capsys) -> None:
    tensors = int_packed(4, 128, zero_points=False)
    tensors["model.layers.0.mlp.up_proj.weight_scale"] = torch.zeros(256, 200, dtype=torch.bfloat16)
    err = _refused(write(tmp_path, LLAMA, tensors), capsys)
    assert "'model.layers.0.mlp.up_proj.weight_scale' [256, 200] fits no tensor, channel or group layout of " \
           "[256, 128]" in err


def test_nvfp4_scales_per_32(tmp_path: Path, capsys) -> None:
    tensors = plain({})
    for module, out, cols, _ in LINEARS:
        p = f"model.layers.0.{module}."
        tensors[p + "weight_packed"] = torch.zeros(out, cols // 2, dtype=torch.uint8)
        tensors[p + "weight_scale"] = torch.zeros(out, cols // 32, dtype=torch.float8_e4m3fn)
    err = _refused(write(tmp_path, LLAMA, tensors), capsys)
    assert "nvfp4-pack-quantized keeps one F8_E4M3 scale per 16 values" in err and "gives one per 32" in err


def test_mxfp4_scales_of_another_shape(tmp_path: Path, capsys) -> None:
    err = _refused(write(tmp_path, GPT_OSS, gpt_oss_tensors(scales_last=3)), capsys)
    assert "'model.layers.0.mlp.experts.down_proj_blocks' U8 [2, 64, 2, 16]: MXFP4 scales must be [2, 64, 2], one " \
           "a 32-value block; got [2, 64, 3]" in err


@pytest.mark.parametrize("record", [torch.zeros(5, dtype=torch.int64), torch.zeros(2, dtype=torch.float32),
                                    torch.tensor([128, -1])], ids=["five-dims", "float", "negative"])
def test_hostile_weight_shape_records(tmp_path: Path, capsys, record) -> None:
    tensors = int_packed(4, 128, zero_points=False)
    tensors["model.layers.0.mlp.down_proj.weight_shape"] = record
    err = _refused(write(tmp_path, LLAMA, tensors), capsys)
    assert "model.layers.0.mlp.down_proj.weight_shape" in err and "weight_shape" in err


# ---------------------------------------------------------------------------------------------
# full size, from headers alone: openai/gpt-oss-20b
# ---------------------------------------------------------------------------------------------

GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True, "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880, "max_position_embeddings": 131072,
    "layer_types": ["sliding_attention", "full_attention"] * 12, "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
    "rms_norm_eps": 1e-05, "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "tie_word_embeddings": False, "vocab_size": 201088, "torch_dtype": "bfloat16",
    "quantization_config": GPT_OSS["quantization_config"]}


def gpt_oss_20b_headers():
    """The 459 tensors of gpt-oss-20b's model.safetensors.index.json, with their dtypes and shapes, and no data."""
    from paramscope.checkpoint import Checkpoint
    from paramscope.checkpoint.quantisation import classify_quantisation
    from paramscope.checkpoint.tensors import SAFETENSORS_DTYPE_BITS, CheckpointTensor

    e, h, v = 32, 2880, 201088
    shapes = {"model.embed_tokens.weight": ("BF16", (v, h)), "lm_head.weight": ("BF16", (v, h)),
              "model.norm.weight": ("BF16", (h,))}
    for n in range(24):
        p = f"model.layers.{n}."
        shapes |= {p + "input_layernorm.weight": ("BF16", (h,)), p + "post_attention_layernorm.weight": ("BF16", (h,)),
                   p + "self_attn.sinks": ("BF16", (64,)), p + "mlp.router.weight": ("BF16", (e, h)),
                   p + "mlp.router.bias": ("BF16", (e,)),
                   p + "mlp.experts.gate_up_proj_bias": ("BF16", (e, 2 * h)),
                   p + "mlp.experts.gate_up_proj_blocks": ("U8", (e, 2 * h, 90, 16)),
                   p + "mlp.experts.gate_up_proj_scales": ("U8", (e, 2 * h, 90)),
                   p + "mlp.experts.down_proj_bias": ("BF16", (e, h)),
                   p + "mlp.experts.down_proj_blocks": ("U8", (e, h, 90, 16)),
                   p + "mlp.experts.down_proj_scales": ("U8", (e, h, 90))}
        for proj, out, cols in (("q_proj", 4096, h), ("k_proj", 512, h), ("v_proj", 512, h), ("o_proj", h, 4096)):
            shapes |= {p + f"self_attn.{proj}.weight": ("BF16", (out, cols)), p + f"self_attn.{proj}.bias": ("BF16", (out,))}
    tensors = [CheckpointTensor(name, dtype, shape, math.prod(shape), math.prod(shape) * SAFETENSORS_DTYPE_BITS[dtype] // 8,
                                "model.safetensors") for name, (dtype, shape) in sorted(shapes.items())]
    return Checkpoint("gpt-oss-20b", "safetensors-sharded", tuple(classify_quantisation(tensors)))


def test_gpt_oss_20b_from_its_headers() -> None:
    from paramscope import inspect
    from paramscope.audit import audit_report

    checkpoint = gpt_oss_20b_headers()
    # the index's own figures: 459 tensors, total_size 13,761,264,768 bytes
    assert (len(checkpoint.tensors), checkpoint.nbytes) == (459, 13_761_264_768)
    report = inspect(GPT_OSS_20B, use_cache=False)
    result = audit_report(report, checkpoint, quantization_config=GPT_OSS_20B["quantization_config"])
    assert result.audit.complete and result.audit.unexpected == ()
    assert result.audit.parameters == result.packed.parameters == report.total == 20_914_757_184
    experts = next(r for r in result.packed.roles if r.role == "moe.experts")
    values = 24 * 32 * 2880 * (5760 + 2880)  # 19,110,297,600 fp4 values in 24 × 32 × (5,760 + 2,880) × 90 blocks
    assert (experts.tensors, experts.parameters) == (96, values + 24 * 32 * (5760 + 2880))
    assert (experts.stored_bytes, experts.scale_bytes) == (values // 2 + 24 * 32 * 8640 * 2, values // 32)
    assert experts.scale_bytes == 597_196_800 and experts.bits_per_parameter == pytest.approx(4.2541, abs=5e-5)
    assert result.packed.stored_bytes + result.packed.overhead_bytes == 13_761_264_768
    assert result.packed.mismatches == ()


def test_gptq_against_its_config_and_bnb_skip_list(tmp_path: Path) -> None:
    # GPTQ 4-bit, group 64: qweight I32 [in·4/32, out], qzeros I32 [in/64, out·4/32], scales F16 [in/64, out]; the
    # config says 8 bits and groups of 128
    tensors: dict = {}
    for module, out, cols, _ in LINEARS:
        p = f"model.layers.0.{module}."
        tensors[p + "qweight"] = torch.zeros(cols // 8, out, dtype=torch.int32)
        tensors[p + "qzeros"] = torch.zeros(cols // 64, out // 8, dtype=torch.int32)
        tensors[p + "scales"] = torch.zeros(cols // 64, out, dtype=torch.float16)
        tensors[p + "g_idx"] = torch.zeros(cols, dtype=torch.int32)
    config = {**LLAMA, "quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": 128}}
    result = audit(write(tmp_path / "gptq", config, plain(tensors)), use_cache=False)
    assert_reconciled(result)
    assert roles(result)["mlp.down"] == (1, 32_768, 16_384, 4 * 128 * 2, 4 * 16 * 4, 256 * 4)
    assert [(m.field, m.config, m.headers, len(m.tensors)) for m in result.packed.mismatches] == [
        ("bits", "int8 (bits)", "int4", 7),
        ("group_size", "128 (group_size)", "2 scales a row of 128 values (int4 group 64 (gptq))", 6),
        ("group_size", "128 (group_size)", "4 scales a row of 256 values (int4 group 64 (gptq))", 1)]
    # LLM.int8 with llm_int8_skip_modules naming down_proj, whose weight the headers hold in int8
    tensors = {}
    for module, out, cols, _ in LINEARS:
        p = f"model.layers.0.{module}."
        tensors[p + "weight"] = torch.zeros(out, cols, dtype=torch.int8)
        tensors[p + "SCB"] = torch.zeros(out, dtype=torch.float32)
    config = {**LLAMA, "quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True,
                                               "llm_int8_skip_modules": ["down_proj"]}}
    [m] = audit(write(tmp_path / "bnb", config, plain(tensors)), use_cache=False).packed.mismatches
    assert (m.field, m.config, m.headers, m.tensors) == (
        "unquantised", "llm_int8_skip_modules names its module", "int8 per channel (bitsandbytes 8-bit)",
        ("model.layers.0.mlp.down_proj.weight",))


def test_sharded_records_and_hub_headers(tmp_path: Path) -> None:
    from dataclasses import replace

    from paramscope import inspect
    from paramscope.audit import audit_report
    from paramscope.checkpoint import read_checkpoint
    from paramscope.checkpoint.packed import read_shape_records

    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}
    config = {**LLAMA, "quantization_config": ct_config("pack-quantized", weights)}
    tensors = int_packed(4, 128, zero_points=False)
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    for shard, held in shards.items():
        save_file({n: tensors[n] for n in held}, str(folder / shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: shard for shard, held in shards.items() for n in held}}))
    result = audit(folder, use_cache=False)
    assert_reconciled(result)
    assert result.packed.shape_records == 7 and result.packed.mismatches == ()
    # From the Hub only headers are read: no record, and the unpacked shape is the model's, which the packed
    # shape holds at 4 bits
    hub = replace(read_checkpoint(folder), path="hub:org/model")
    assert read_shape_records(hub) == {}
    from_hub = audit_report(inspect(config, use_cache=False), hub, quantization_config=config["quantization_config"])
    assert from_hub.audit.complete and from_hub.packed.shape_records == 0
    assert roles(from_hub) == roles(result) and from_hub.packed.mismatches == ()


def test_bitsandbytes_nf4(tmp_path: Path) -> None:
    # Params4bit: weight U8 [out·in/2, 1], absmax F32 a 64-value block, quant_map F32 [16], the state's JSON as U8
    tensors: dict = {}
    for module, out, cols, _ in LINEARS:
        p = f"model.layers.0.{module}.weight"
        tensors[p] = torch.zeros(out * cols // 2, 1, dtype=torch.uint8)
        tensors[p + ".absmax"] = torch.zeros(out * cols // 64, dtype=torch.float32)
        tensors[p + ".quant_map"] = torch.zeros(16, dtype=torch.float32)
        tensors[p + ".quant_state.bitsandbytes__nf4"] = torch.zeros(90, dtype=torch.uint8)
    config = {**LLAMA, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True,
                                               "bnb_4bit_quant_type": "nf4"}}
    result = audit(write(tmp_path, config, plain(tensors)), use_cache=False)
    assert_reconciled(result)
    assert roles(result) == {**{role: (1, out * cols, out * cols // 2, out * cols // 16 + 64, 0, 90)
                                for _, out, cols, role in LINEARS}, **plain_roles()}
    assert result.packed.schemes["nf4 group (bitsandbytes 4-bit)"] == 7 and result.packed.mismatches == ()
