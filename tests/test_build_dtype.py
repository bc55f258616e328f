"""The dtype asked for a build reaches every part of a composite model.

transformers builds a composite model's parts through `_from_config`, each in its own sub-config's dtype: a
Qwen2.5-VL config declaring bfloat16 built its language model in bf16 and its vision tower in fp32 when fp32 was
asked, so `memory --training --trace full` measured a half-bf16 step (issue 31 §4's agreement table, +79%)."""
import collections
import json

from paramscope.api import as_source, build_source

from pathlib import Path

CONFIGS = Path(__file__).parent / "configs"


def _dtypes_by_part(path, dtype):
    _, module = build_source(as_source(str(path)), None, None, None, False, dtype=dtype)
    parts = collections.Counter()
    for name, param in module.named_parameters():
        parts[(name.removeprefix("model.").split(".")[0], str(param.dtype).removeprefix("torch."))] += param.numel()
    return module, dict(parts)


def test_every_part_of_a_composite_model_takes_the_asked_dtype(tmp_path):
    config = json.loads((CONFIGS / "families" / "Qwen--Qwen2.5-VL-7B-Instruct.json").read_text())
    config.update(num_hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    config["vision_config"].update(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                                   fullatt_block_indexes=[0])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert config["torch_dtype"] == "bfloat16"

    module, parts = _dtypes_by_part(path, "float32")
    # by hand: the language model is 256·64 embeddings + 37,120 a layer + a 64 norm;
    # the tower 3·2·14·14·32 patches + 10,592 a block + a 24,800 merger
    assert parts == {("visual", "float32"): 73_024, ("language_model", "float32"): 53_568,
                     ("lm_head", "float32"): 16_384}
    # the config is given back as it was: the checkpoint's dtype is still what it declares
    assert str(module.config.text_config.dtype) == "torch.bfloat16"

    _, parts = _dtypes_by_part(path, "bfloat16")
    assert {dtype for _, dtype in parts} == {"bfloat16"}
