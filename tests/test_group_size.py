"""GPTQ/AWQ group sizes (issue 30 §3): a config's `group_size` and `--group-size` are checked alike; a size that does
not divide a linear's input is accepted, as transformers builds it (GPTQ's and AWQ's QuantLinear store
⌈in / group⌉ groups of scales and zero points, the last one partial: DeepSeek-V2-Lite's 10,944 in groups of 128),
counted so and named in one note per width. GPT-2's Conv1D weights are stored [in, out]: the quantisers read their
input from the first dimension, and so does the arithmetic."""

from __future__ import annotations

import json

import pytest

from paramscope.cli import main
from paramscope.cost.memory.quantization import partial_group_notes, weight_format
from paramscope.cost.memory.serving import MemoryOptions
from paramscope.errors import OptionError

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 144,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
         "max_position_embeddings": 256, "torch_dtype": "bfloat16"}
GPTQ_32 = {"quant_method": "gptq", "bits": 4, "group_size": 32}
NOTE_144 = ("group size 32 does not divide 144 (mlp.down's input): its last group holds 16, as GPTQ stores it "
            "(⌈144/32⌉ = 5 groups of scales and zero points)")
# mlp.down per layer, in 144, out 64, 4 bits, groups of 32: qweight 18 × 64 int32, qzeros 5 × 8 int32,
# scales 5 × 64 fp16, g_idx 144 int32
DOWN_144 = 2 * (18 * 64 * 4 + 5 * 8 * 4 + 5 * 64 * 2 + 144 * 4)


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PARAMSCOPE_RECORD_TEMPLATES", "0")
    return tmp_path


def _memory(capsys, *args) -> dict:
    assert main(["memory", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["memory"]


def test_deepseek_v2_lite_down_projection_has_86_groups_the_last_of_64():
    fmt = weight_format("gptq-int4", group_size=128)
    down = fmt.tensor_bytes((2048, 10944))  # out = hidden 2,048, in = intermediate 10,944
    assert down.data == 1368 * 2048 * 4  # qweight [10,944·4/32, 2,048] int32
    assert down.overhead == 86 * 256 * 4 + 86 * 2048 * 2 + 10944 * 4 == 484_096  # qzeros, scales, g_idx
    assert partial_group_notes(fmt, [("mlp.down", (2048, 10944)), ("mlp.up", (10944, 2048))]) == (
        "group size 128 does not divide 10,944 (mlp.down's input): its last group holds 64, as GPTQ stores it "
        "(⌈10,944/128⌉ = 86 groups of scales and zero points)",)
    awq = weight_format("awq-int4", group_size=128).tensor_bytes((2048, 10944))
    assert awq.overhead == 86 * 256 * 4 + 86 * 2048 * 2


def test_notes_group_roles_by_width_and_say_when_a_group_is_wider_than_the_input():
    fmt = weight_format("awq-int4", group_size=100)
    assert partial_group_notes(fmt, [("attention.qkv", (2304, 768)), ("mlp.up", (3072, 768)),
                                     ("mlp.up", (3072, 768)), ("mlp.down", (768, 3072)),
                                     ("attention.output", (768, 50))]) == (
        "group size 100 is wider than 50 (attention.output's input): one group per row, holding 50, as AWQ stores it",
        "group size 100 does not divide 768 (the inputs of attention.qkv and mlp.up): its last group holds 68, as AWQ "
        "stores it (⌈768/100⌉ = 8 groups of scales and zero points)",
        "group size 100 does not divide 3,072 (mlp.down's input): its last group holds 72, as AWQ stores it "
        "(⌈3,072/100⌉ = 31 groups of scales and zero points)")
    # sizes that divide, per channel, and other formats say nothing
    assert partial_group_notes(weight_format("gptq-int4", group_size=64), [("mlp.down", (64, 128))]) == ()
    assert partial_group_notes(weight_format("gptq-int4", group_size=-1), [("mlp.down", (64, 100))]) == ()
    assert partial_group_notes(weight_format("q4_0"), [("mlp.down", (64, 100))]) == ()


@pytest.mark.parametrize("value, shown", [(0, "0"), (-7, "-7"), (-2, "-2"), ((1 << 20) + 1, "1048577")])
def test_the_option_is_refused_as_the_config_field_is(value, shown):
    with pytest.raises(OptionError) as refused:
        MemoryOptions(dtype="gptq-int4", group_size=value).check()
    assert str(refused.value) == (f"group_size must be a positive group size up to 1,048,576, or -1 for one group "
                                  f"per row; got {shown}")


@pytest.mark.parametrize("dtype", [None, "nf4", "bf16", "q4_k"])
def test_the_option_is_refused_where_it_would_change_nothing(dtype):
    with pytest.raises(OptionError) as refused:
        MemoryOptions(dtype=dtype, group_size=64).check()
    assert str(refused.value) == ("group_size is for a dtype of gptq-int2, gptq-int3, gptq-int4, gptq-int8 or "
                                  "awq-int4; a checkpoint's own group size is its quantization_config's")


@pytest.mark.parametrize("args, line", [
    (("--dtype", "gptq-int4", "--group-size", "0"),
     "--group-size must be a positive group size up to 1,048,576, or -1 for one group per row; got 0"),
    (("--dtype", "awq-int4", "--group-size", "-7"),
     "--group-size must be a positive group size up to 1,048,576, or -1 for one group per row; got -7"),
    (("--dtype", "gptq-int4", "--group-size", "2000000"),
     "--group-size must be a positive group size up to 1,048,576, or -1 for one group per row; got 2000000"),
    (("--group-size", "64",),
     "--group-size is for a --dtype of gptq-int2, gptq-int3, gptq-int4, gptq-int8 or awq-int4; a checkpoint's own "
     "group size is its quantization_config's"),
])
def test_cli_refusals_are_one_exact_line(args, line, isolated, capsys):
    assert main(["memory", "gpt2", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"paramscope: error: {line}\n"


def test_a_config_group_that_does_not_divide_is_counted_and_named(isolated, capsys):
    """Refused before as "does not divide"; transformers builds it, so memory answers and says so."""
    path = isolated / "config.json"
    path.write_text(json.dumps(LLAMA | {"quantization_config": GPTQ_32}))
    memory = _memory(capsys, str(path))
    assert memory["settings"]["group_size"] == 32
    assert memory["weights"]["by_role"]["mlp.down"] == DOWN_144 == 11_968
    assert memory["notes"][0] == NOTE_144
    assert sum(note.startswith("group size") for note in memory["notes"]) == 1  # 64 is divided: no note for it


def test_the_option_gives_the_same_answer_and_note_as_the_config(isolated, capsys):
    declared = isolated / "declared"
    declared.mkdir()
    (declared / "config.json").write_text(json.dumps(LLAMA | {"quantization_config": GPTQ_32}))
    chosen = isolated / "chosen"
    chosen.mkdir()
    (chosen / "config.json").write_text(json.dumps(LLAMA))
    by_config = _memory(capsys, str(declared))
    by_option = _memory(capsys, str(chosen), "--dtype", "gptq-int4", "--group-size", "32")
    for key in ("bytes", "overhead_bytes", "by_role", "by_dtype", "quantized_parameters"):
        assert by_option["weights"][key] == by_config["weights"][key], key
    assert by_option["notes"][0] == by_config["notes"][0] == NOTE_144


def test_gpt2_conv1d_weights_are_grouped_and_scaled_along_their_first_dimension(isolated, capsys):
    """transformers' GPTQ and bitsandbytes layers take in_features = weight.shape[0] for Conv1D ([in, out]): g_idx
    holds one entry per input, LLM.int8's SCB one scale per output."""
    gptq = _memory(capsys, "gpt2", "--dtype", "gptq-int4")["weights"]["by_role"]
    # c_attn: in 768, out 2,304 (6 groups of 128); the MLP's c_proj: in 3,072, out 768 (24 groups); biases fp32
    assert gptq["attention.qkv"] == 12 * (96 * 2304 * 4 + 6 * 288 * 4 + 6 * 2304 * 2 + 768 * 4 + 2304 * 4)
    assert gptq["mlp.down"] == 12 * (384 * 768 * 4 + 24 * 96 * 4 + 24 * 768 * 2 + 3072 * 4 + 768 * 4)
    int8 = _memory(capsys, "gpt2", "--dtype", "int8")["weights"]["by_role"]
    assert int8["attention.qkv"] == 12 * (768 * 2304 + 2304 * 4 + 2304 * 4) == 21_454_848
    assert int8["mlp.down"] == 12 * (3072 * 768 + 768 * 4 + 768 * 4)
    notes = _memory(capsys, "gpt2", "--dtype", "gptq-int4", "--group-size", "100")["notes"]
    assert notes[:2] == [
        "group size 100 does not divide 768 (the inputs of attention.qkv, attention.output and mlp.up): its last "
        "group holds 68, as GPTQ stores it (⌈768/100⌉ = 8 groups of scales and zero points)",
        "group size 100 does not divide 3,072 (mlp.down's input): its last group holds 72, as GPTQ stores it "
        "(⌈3,072/100⌉ = 31 groups of scales and zero points)"]
