"""Every config field the cost engines read is validated in one line, before torch is imported (issue 30 §3):
top-k within the experts, windows of at least one token, quantisation bits in the format's set and group sizes that
divide the widths they group, dtype names a model is built in, label maps keyed by label ids.

Each bad value is refused by `inspect`, `memory`, `memory --training` and `flops` alike, exit code 2, with one line
naming the field and the value. Where transformers itself builds a value, paramscope accepts it and names it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from paramscope.build import validate_config_dict
from paramscope.cli import main
from paramscope.errors import ConfigError

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
         "max_position_embeddings": 256, "torch_dtype": "bfloat16"}
MIXTRAL = LLAMA | {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": 8,
                   "num_experts_per_tok": 2}
MISTRAL = LLAMA | {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 128}
BERT = {"model_type": "bert", "architectures": ["BertForSequenceClassification"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000,
        "max_position_embeddings": 128}


def quantised(**quant):
    return LLAMA | {"quantization_config": quant}


BAD = {
    "top-k 0": (MIXTRAL | {"num_experts_per_tok": 0},
                "config field 'num_experts_per_tok' must be a whole number of experts from 1 to the 8 of "
                "'num_local_experts', got 0"),
    "top-k above the experts": (MIXTRAL | {"num_experts_per_tok": 9}, "from 1 to the 8 of 'num_local_experts', got 9"),
    "top-k negative": (MIXTRAL | {"num_experts_per_tok": -2}, "got -2"),
    "top-k a billion": (MIXTRAL | {"num_experts_per_tok": 10**9}, "got 1000000000"),
    "top-k fractional": (MIXTRAL | {"num_experts_per_tok": 1.5}, "got 1.5"),
    "top-k read under top_k": (LLAMA | {"num_experts": 4, "top_k": 50},
                               "config field 'top_k' must be a whole number of experts from 1 to the 4 of "
                               "'num_experts', got 50"),
    "window 0": (MISTRAL | {"sliding_window": 0}, "config field 'sliding_window' is 0, a window of no tokens"),
    "window 0 with the flag on": (LLAMA | {"model_type": "qwen2_moe", "architectures": [], "use_sliding_window": True,
                                           "sliding_window": 0, "num_experts": 4, "num_experts_per_tok": 2},
                                  "config field 'sliding_window' is 0"),
    "window negative": (MISTRAL | {"sliding_window": -1},
                        "config field 'sliding_window' must be a positive number of tokens, or null for none; got -1"),
    "window fractional": (MISTRAL | {"sliding_window": 1.5}, "config field 'sliding_window' must be a positive number "
                                                             "of tokens, or null for none; got 1.5"),
    "window text": (MISTRAL | {"sliding_window": "abc"}, "got 'abc'"),
    "chunk 0": (LLAMA | {"attention_chunk_size": 0}, "config field 'attention_chunk_size' is 0, a window of no tokens"),
    "bnb 3 bits": (quantised(quant_method="bitsandbytes", load_in_4bit=True, bits=3),
                   "config field 'quantization_config.bits' is 3, but load_in_4bit stores 4-bit weights"),
    "bnb 4 and 8 bits": (quantised(quant_method="bitsandbytes", load_in_4bit=True, load_in_8bit=True),
                         "'quantization_config.load_in_4bit' and 'quantization_config.load_in_8bit' are both true"),
    "bnb no storage": (quantised(quant_method="bitsandbytes"),
                       "neither load_in_4bit nor load_in_8bit is true"),
    "bnb flag not a bool": (quantised(quant_method="bitsandbytes", load_in_4bit="yes"),
                            "config field 'quantization_config.load_in_4bit' must be true or false, got 'yes'"),
    "bnb quant type": (quantised(quant_method="bitsandbytes", load_in_4bit=True, bnb_4bit_quant_type="nf5"),
                       "config field 'quantization_config.bnb_4bit_quant_type' must be 'nf4' or 'fp4', got 'nf5'"),
    "gptq 99 bits": (quantised(quant_method="gptq", bits=99, group_size=32),
                     "config field 'quantization_config.bits' must be one of 2, 3, 4, 8 for GPTQ, got 99"),
    "gptq 0 bits": (quantised(quant_method="gptq", bits=0, group_size=32), "for GPTQ, got 0"),
    "gptq bits true": (quantised(quant_method="gptq", bits=True, group_size=32), "for GPTQ, got True"),
    "awq 3 bits": (quantised(quant_method="awq", bits=3, group_size=32),
                   "config field 'quantization_config.bits' must be one of 4 for AWQ, got 3"),
    "gptq group 0": (quantised(quant_method="gptq", bits=4, group_size=0),
                     "config field 'quantization_config.group_size' must be a positive group size up to 1,048,576, "
                     "or -1 for one group per row; got 0"),
    "gptq group -7": (quantised(quant_method="gptq", bits=4, group_size=-7),
                      "config field 'quantization_config.group_size' must be a positive group size up to 1,048,576, "
                      "or -1 for one group per row; got -7"),
    "gptq group absurd": (quantised(quant_method="gptq", bits=4, group_size=2**31 - 1),
                          "config field 'quantization_config.group_size' must be a positive group size up to "
                          "1,048,576, or -1 for one group per row; got 2147483647"),
    "gptq group fractional": (quantised(quant_method="gptq", bits=4, group_size=64.0),
                              "config field 'quantization_config.group_size' must be a positive group size up to "
                              "1,048,576, or -1 for one group per row; got 64.0"),
    "gptq group true": (quantised(quant_method="gptq", bits=4, group_size=True),
                        "or -1 for one group per row; got True"),
    "awq group -2": (quantised(quant_method="awq", bits=4, q_group_size=-2),
                     "config field 'quantization_config.q_group_size' must be a positive group size up to 1,048,576, "
                     "or -1 for one group per row; got -2"),
    "fp8 block 0": (quantised(quant_method="fp8", weight_block_size=[0, 128]),
                    "config field 'quantization_config.weight_block_size' must be two positive integers (rows, "
                    "columns) or null, got [0, 128]"),
    "fp8 block text": (quantised(quant_method="fp8", weight_block_size="x"), "or null, got 'x'"),
    "dtype float17": (LLAMA | {"torch_dtype": "float17"},
                      "config field 'torch_dtype' is not a dtype: 'float17' (float32, bfloat16, float16, …)"),
    "dtype float1024": (LLAMA | {"torch_dtype": "float1024"}, "config field 'torch_dtype' is not a dtype: 'float1024'"),
    "dtype a number": (LLAMA | {"torch_dtype": 5}, "config field 'torch_dtype' is not a dtype: 5"),
    "dtype auto": (LLAMA | {"torch_dtype": "auto"},
                   "config field 'torch_dtype' is 'auto', not a dtype a model is built in"),
    "dtype int8": (LLAMA | {"dtype": "int8"}, "config field 'dtype' is 'int8', not a dtype a model is built in"),
    "dtype float8": (LLAMA | {"torch_dtype": "float8_e4m3fn"}, "is 'float8_e4m3fn', not a dtype a model is built in"),
    "id2label a list": (BERT | {"id2label": ["a", "b"]},
                        "config field 'id2label' must be a mapping of labels, got ['a', 'b']"),
    "id2label a string": (BERT | {"id2label": "x"}, "config field 'id2label' must be a mapping of labels, got 'x'"),
    "label2id a list": (BERT | {"label2id": [1]}, "config field 'label2id' must be a mapping of labels, got [1]"),
    "id2label keys": (BERT | {"id2label": {"x": "a", "y": "b"}},
                      "config field 'id2label' must map label ids (integers) to names, got the key 'x'"),
    "id2label an id twice": (BERT | {"id2label": {"0": "a", "00": "b"}},
                             "config field 'id2label' gives label id 0 twice ('0' and '00')"),
    "rope_scaling text": (LLAMA | {"rope_scaling": "abc"},
                          "config field 'rope_scaling' must be a mapping (rope_type, factor, …) or null, got 'abc'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_field_is_refused_before_any_build(case):
    config, message = BAD[case]
    with pytest.raises(ConfigError) as refused:
        validate_config_dict(config)
    assert message in str(refused.value)


@pytest.mark.slow
@pytest.mark.parametrize("command", [["inspect"], ["memory"], ["memory", "--training"], ["flops"]])
@pytest.mark.parametrize("case", sorted(BAD))
def test_every_command_refuses_it_in_one_line_at_once(case, command, tmp_path):
    """Through the CLI, in a fresh process: exit code 2, one line naming the field and the value, and torch never
    imported (so it is quick: well under the seconds transformers' own refusals take)."""
    config, message = BAD[case]
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    code = ("import sys\nfrom paramscope.cli import main\ncode = main(sys.argv[1:])\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(code)\n")
    result = subprocess.run([sys.executable, "-c", code, *command, str(directory)], capture_output=True, text=True,
                            timeout=120, env={"PARAMSCOPE_RECORD_TEMPLATES": "0", "PATH": "/usr/bin:/bin",
                                              "PARAMSCOPE_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert len(lines) == 1 and lines[0].startswith("paramscope: error: ") and message in lines[0], result.stderr


ACCEPTED = {
    "window 0 beside the flag off": (
        LLAMA | {"model_type": "qwen2_moe", "architectures": [], "sliding_window": 0, "use_sliding_window": False,
                 "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                 "shared_expert_intermediate_size": 64},
        "sliding_window=0: no window, as transformers reads it; every layer attends to every token"),
    "num_labels beside fewer labels": (
        BERT | {"id2label": {"0": "a", "1": "b"}, "num_labels": 5},
        "num_labels=5 and id2label's 2 labels disagree: transformers builds 5 labels"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_what_transformers_builds_is_accepted_and_named(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PARAMSCOPE_RECORD_TEMPLATES", "0")
    config, note = ACCEPTED[case]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["inspect", str(path), "--json"]) == 0
    assert any(note in line for line in json.loads(capsys.readouterr().out)["model"]["notes"])
    assert main(["memory", str(path), "--json"]) == 0
    assert any(note in line for line in json.loads(capsys.readouterr().out)["model"]["notes"])


@pytest.mark.parametrize("config", [
    MIXTRAL, MISTRAL, MISTRAL | {"sliding_window": None}, LLAMA | {"attention_chunk_size": 8192},
    LLAMA | {"model_type": "qwen2", "sliding_window": 0},  # use_sliding_window absent: qwen2's default is off
    quantised(quant_method="bitsandbytes", load_in_4bit=True, bnb_4bit_quant_type="nf4", bits=4),
    quantised(quant_method="bitsandbytes", _load_in_8bit=True, load_in_4bit=False),
    quantised(quant_method="gptq", bits=4, group_size=32), quantised(quant_method="gptq", bits=4, group_size=-1),
    # a group that does not divide a width: transformers builds it (the last group is partial; memory names it)
    quantised(quant_method="gptq", bits=4, group_size=7), quantised(quant_method="awq", bits=4, q_group_size=7),
    quantised(quant_method="gptq", bits=4, group_size=1 << 20),
    quantised(quant_method="awq", bits=4, q_group_size=64), quantised(quant_method="fp8", weight_block_size=[128, 128]),
    quantised(quant_method="fp8"), LLAMA | {"torch_dtype": "torch.float16"}, LLAMA | {"torch_dtype": "half"},
    LLAMA | {"torch_dtype": "float64"}, BERT | {"id2label": {"0": "neg", "1": "pos"}, "label2id": {"neg": 0}},
    {"model_type": "llava", "text_config": LLAMA | {"torch_dtype": "bfloat16"},
     "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32}},
])
def test_real_values_pass(config):
    validate_config_dict(config)


def test_memory_refuses_a_float64_checkpoint_in_one_line(tmp_path, capsys, monkeypatch):
    """transformers loads it in float64, but no storage paramscope's memory models is 8 bytes a weight: said, not
    answered as float32 "with no dtype declared"."""
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA | {"torch_dtype": "float64"}))
    assert main(["memory", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        "paramscope: error: the config declares dtype float64, which paramscope's memory does not model; choose a "
        "storage with --dtype (fp32, bf16, fp16, fp8, fp8-block, int8, …)\n")
