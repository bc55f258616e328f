"""The presets of registry_extra.json: each meta build's count, pinned exactly, set against the published figure.

MEASURED holds the unique-parameter count of a meta build of `published.class` (transformers 5.23), by parameter
identity. Each preset's `published` block says what the model's authors or the Hub state, and whether it agrees:

* an exact published figure equal to the count: `parameters == MEASURED`;
* an exact figure of another convention (the Hub's safetensors total counts what the checkpoint file holds):
  `parameters == MEASURED + difference`, and the tests below rebuild `difference` from the config, so the
  explanation in the note is checked, not just asserted;
* only a rounded figure ("124M", "1.5B"): the count must round (or truncate) to it, unless `agrees` is false.

No build here takes more than a fraction of a second (the 405B and 671B ones included, ~0.2-0.6 s on the meta
device), so none is marked slow; the first build of a session pays transformers' import time.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from importlib import resources

import pytest
from conftest import report_of

from paramscope.presets import find_preset

# hub id -> unique parameters of a meta build of published["class"]
MEASURED: dict[str, int] = {
    "openai-community/gpt2": 124_439_808,
    "openai-community/gpt2-medium": 354_823_168,
    "openai-community/gpt2-large": 774_030_080,
    "openai-community/gpt2-xl": 1_557_611_200,
    "distilbert/distilgpt2": 81_912_576,
    "EleutherAI/gpt-j-6b": 6_050_882_784,
    "EleutherAI/gpt-neox-20b": 20_554_567_680,
    "EleutherAI/pythia-70m": 70_426_624,
    "EleutherAI/pythia-160m": 162_322_944,
    "EleutherAI/pythia-410m": 405_334_016,
    "EleutherAI/pythia-1b": 1_011_781_632,
    "EleutherAI/pythia-1.4b": 1_414_647_808,
    "EleutherAI/pythia-2.8b": 2_775_208_960,
    "EleutherAI/pythia-6.9b": 6_857_302_016,
    "EleutherAI/pythia-12b": 11_846_072_320,
    "meta-llama/Llama-2-7b-hf": 6_738_415_616,
    "meta-llama/Llama-2-13b-hf": 13_015_864_320,
    "meta-llama/Llama-2-70b-hf": 68_976_648_192,
    "meta-llama/Meta-Llama-3-8B": 8_030_261_248,
    "meta-llama/Meta-Llama-3-70B": 70_553_706_496,
    "meta-llama/Llama-3.1-8B": 8_030_261_248,
    "meta-llama/Llama-3.1-70B": 70_553_706_496,
    "meta-llama/Llama-3.1-405B": 405_853_388_800,
    "mistralai/Mistral-7B-v0.1": 7_241_732_096,
    "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704,
    "mistralai/Mixtral-8x22B-v0.1": 140_620_634_112,
    "Qwen/Qwen2.5-0.5B": 494_032_768,
    "Qwen/Qwen2.5-1.5B": 1_543_714_304,
    "Qwen/Qwen2.5-3B": 3_085_938_688,
    "Qwen/Qwen2.5-7B": 7_615_616_512,
    "Qwen/Qwen2.5-14B": 14_770_033_664,
    "Qwen/Qwen2.5-32B": 32_763_876_352,
    "Qwen/Qwen2.5-72B": 72_706_203_648,
    "google/gemma-2b": 2_506_172_416,
    "google/gemma-7b": 8_537_680_896,
    "google/gemma-2-2b": 2_614_341_888,
    "google/gemma-2-9b": 9_241_705_984,
    "google/gemma-2-27b": 27_227_128_320,
    "microsoft/Phi-3-mini-4k-instruct": 3_821_079_552,
    "google-t5/t5-small": 60_506_624,
    "google-t5/t5-base": 222_903_552,
    "google-t5/t5-large": 737_668_096,
    "facebook/bart-base": 139_420_416,
    "facebook/bart-large": 406_291_456,
    "albert/albert-base-v2": 11_221_680,
    "google/electra-base-discriminator": 109_483_009,
    "microsoft/deberta-v3-base": 183_831_552,
    "answerdotai/ModernBERT-base": 149_014_272,
    "deepseek-ai/DeepSeek-V3": 671_026_404_352,
    "Qwen/Qwen1.5-MoE-A2.7B": 14_315_784_192,
}

# Names the nine BERT-family presets of registry.json own.
RESERVED = {
    "bert-base-uncased", "bert-base-cased", "bert-large-uncased", "bert-large-cased", "bert-base-chinese",
    "bert-base-multilingual-cased", "distilbert-base-uncased", "bert-base", "bert-large", "distilbert",
    "roberta-base", "roberta-large",
}


def _entries() -> list[dict]:
    text = resources.files("paramscope.presets").joinpath("registry_extra.json").read_text("utf-8")
    return json.loads(text)


ENTRIES = {entry["name"]: entry for entry in _entries()}


def _config(name: str) -> dict:
    return find_preset(name).load_config()


_UNITS = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def rounds_to(count: int, rounded: str) -> bool:
    """True when `count` is within one unit of the last significant digit of `rounded` ("124M", "1.5B", "400M").

    Published sizes are rounded or truncated ("405B" for 405.85B, "1.5B" for 1.56B); both are accepted.
    Trailing zeros of a whole number are not significant: "400M" is 400M ± 100M, "220M" is 220M ± 10M.
    """
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMBT])", rounded)
    assert match, f"not a rounded size: {rounded!r}"
    digits, unit = match.groups()
    if "." in digits:
        step = Decimal(10) ** -len(digits.split(".")[1])
    else:
        step = Decimal(10) ** (len(digits) - len(digits.rstrip("0")))
    return abs(Decimal(count) - Decimal(digits) * _UNITS[unit]) < step * _UNITS[unit]


def test_rounds_to():
    assert rounds_to(124_439_808, "124M")
    assert rounds_to(405_853_388_800, "405B")  # truncated
    assert rounds_to(1_557_611_200, "1.5B")  # truncated
    assert rounds_to(406_291_456, "400M")
    assert not rounds_to(737_668_096, "770M")
    assert not rounds_to(8_537_680_896, "7B")


# ---------------------------------------------------------------------------------------------------------------
# The registry itself (no builds)
# ---------------------------------------------------------------------------------------------------------------


def test_registry_covers_exactly_the_measured_presets():
    assert len(ENTRIES) == len(_entries()), "duplicate preset names"
    assert set(ENTRIES) == set(MEASURED)
    assert len(ENTRIES) >= 40


def test_aliases_are_lowercase_unique_and_clear_of_the_bert_presets():
    aliases = [alias for entry in ENTRIES.values() for alias in entry["aliases"]]
    assert len(aliases) == len(set(aliases))
    assert all(alias == alias.lower() and alias.strip() == alias and alias for alias in aliases)
    assert not RESERVED & set(aliases)
    names = {name.lower() for name in ENTRIES}
    assert not names & set(aliases)


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_every_name_and_alias_finds_the_preset(name):
    entry = ENTRIES[name]
    assert entry["config"] == name.replace("/", "--") + ".json"
    for key in (name, name.upper(), *entry["aliases"]):
        preset = find_preset(key)
        assert preset is not None, key
        assert preset.name == name, key


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_config_is_a_real_hub_config(name):
    config = _config(name)
    assert isinstance(config.get("model_type"), str)
    for key in ("vocab_size",):
        assert isinstance(config[key], int)
    if name == "microsoft/deberta-v3-base":
        assert "architectures" not in config  # the real file has none: the class is given explicitly
    else:
        assert config["architectures"], name


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_published_block_is_consistent(name):
    published = ENTRIES[name]["published"]
    measured = MEASURED[name]
    assert set(published) <= {"parameters", "class", "source", "rounded", "rounded_source", "agrees", "difference", "note"}
    assert published["class"] and published["source"]
    exact = published["parameters"]
    if exact is None:
        assert "rounded" in published, "no exact figure: a rounded one is required"
        assert "difference" not in published
        assert rounds_to(measured, published["rounded"]) is published["agrees"]
    elif published["agrees"]:
        assert exact == measured
        assert "difference" not in published
    else:
        assert exact != measured
        assert measured + published["difference"] == exact
        assert published.get("note"), "a disagreement needs its explanation"
    if exact is not None and "rounded" in published:
        # Where both exist, the authors' rounded figure describes the model the class builds.
        assert rounds_to(measured, published["rounded"])


# ---------------------------------------------------------------------------------------------------------------
# The meta builds, through the public API
# ---------------------------------------------------------------------------------------------------------------


def _build_args(name: str) -> tuple[str, str | None]:
    """The first alias, with --class only where the published class is not architectures[0]."""
    entry = ENTRIES[name]
    config = _config(name)
    cls = entry["published"]["class"]
    default = (config.get("architectures") or [None])[0]
    return entry["aliases"][0], (None if cls == default else cls)


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_meta_count(name):
    alias, model_class = _build_args(name)
    report = report_of(alias, model_class)
    assert report.model.class_name == ENTRIES[name]["published"]["class"]
    assert report.parameters.total == MEASURED[name]


def test_hub_id_and_alias_build_the_same_model():
    assert report_of("meta-llama/Llama-3.1-8B").parameters.total == report_of("llama-3.1-8b").parameters.total


@pytest.mark.parametrize(
    ("name", "other_class", "count"),
    [
        # the other class a figure could have meant
        ("answerdotai/ModernBERT-base", "ModernBertForMaskedLM", 149_655_232),
        ("albert/albert-base-v2", "AlbertModel", 11_683_584),  # the ALBERT paper's "12M" (with pooler)
        ("google/electra-base-discriminator", "ElectraModel", 108_891_648),
        ("facebook/bart-base", "BartForConditionalGeneration", 139_420_416),  # lm_head tied
        ("openai-community/gpt2", "GPT2Model", 124_439_808),  # lm_head tied to wte
    ],
)
def test_alternative_classes(name, other_class, count):
    assert report_of(ENTRIES[name]["aliases"][0], other_class).parameters.total == count


# ---------------------------------------------------------------------------------------------------------------
# The explanations of each disagreement, rebuilt from the config
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["openai-community/gpt2", "openai-community/gpt2-medium", "openai-community/gpt2-large",
     "openai-community/gpt2-xl", "distilbert/distilgpt2"],
)
def test_gpt2_hub_total_counts_one_causal_mask_per_layer(name):
    config = _config(name)
    mask = config["n_positions"] ** 2  # h.N.attn.bias, shape 1x1xn_positions x n_positions
    assert ENTRIES[name]["published"]["difference"] == config["n_layer"] * mask


@pytest.mark.parametrize("name", ["meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-70b-hf"])
def test_llama2_hub_total_counts_rotary_inv_freq(name):
    config = _config(name)
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    assert ENTRIES[name]["published"]["difference"] == config["num_hidden_layers"] * head_dim // 2


def test_gptj_card_counts_mesh_transformer_jax_shards():
    config = _config("EleutherAI/gpt-j-6b")
    d, layers, shards = config["n_embd"], config["n_layer"], 8  # 8-way model parallel (TPU v3-8)
    norms = (layers + 1) * 2 * d  # ln_1 of every layer and ln_f, weight and bias
    mlp_out_bias = layers * d
    replicated = (shards - 1) * (norms + mlp_out_bias)
    embedding_bias = shards * d
    assert replicated + embedding_bias == ENTRIES["EleutherAI/gpt-j-6b"]["published"]["difference"] == 2_498_560


def _deepseek_v3_checkpoint_extras(config: dict) -> dict[str, int]:
    """What the Hub's safetensors total of DeepSeek-V3 holds beyond DeepseekV3ForCausalLM's parameters."""
    h, vocab = config["hidden_size"], config["vocab_size"]
    heads, nope, rope, v = (config[k] for k in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    q_rank, kv_rank = config["q_lora_rank"], config["kv_lora_rank"]
    attention = [(q_rank, h), (heads * (nope + rope), q_rank), (kv_rank + rope, h), (heads * (nope + v), kv_rank), (h, heads * v)]
    inter, moe_inter = config["intermediate_size"], config["moe_intermediate_size"]
    dense_mlp = [(inter, h), (inter, h), (h, inter)]
    expert = [(moe_inter, h), (moe_inter, h), (h, moe_inter)]
    routed, shared = config["n_routed_experts"], config["n_shared_experts"]
    n_dense = config["first_k_dense_replace"]
    n_moe = config["num_hidden_layers"] - n_dense
    n_mtp = config["num_nextn_predict_layers"]

    def numel(mats):
        return sum(o * i for o, i in mats)

    moe_layer = (numel(attention) + q_rank + kv_rank  # projections and the q/kv LoRA norms
                 + (routed + shared) * numel(expert)
                 + routed * h + routed  # router weight and e_score_correction_bias
                 + 2 * h)  # input and post-attention norms
    mtp = n_mtp * (moe_layer + 2 * h * h + 3 * h + 2 * vocab * h)  # + eh_proj, enorm/hnorm/head norm, embed and head copies
    bh, bw = config["quantization_config"]["weight_block_size"]

    def scales(mats):
        return sum(math.ceil(o / bh) * math.ceil(i / bw) for o, i in mats)

    fp8_scales = (n_dense * (scales(attention) + scales(dense_mlp))
                  + (n_moe + n_mtp) * (scales(attention) + (routed + shared) * scales(expert)))
    return {"router_bias": routed * n_moe, "mtp": mtp, "fp8_scales": fp8_scales}


def test_deepseek_v3_hub_total_is_main_model_plus_router_bias_mtp_and_fp8_scales():
    extras = _deepseek_v3_checkpoint_extras(_config("deepseek-ai/DeepSeek-V3"))
    assert extras == {"router_bias": 14_848, "mtp": 13_463_426_304, "fp8_scales": 41_540_496}
    published = ENTRIES["deepseek-ai/DeepSeek-V3"]["published"]
    assert published["difference"] == sum(extras.values())
    assert MEASURED["deepseek-ai/DeepSeek-V3"] + sum(extras.values()) == published["parameters"] == 684_531_386_000


def test_deepseek_v3_router_bias_is_a_buffer_not_a_parameter():
    report = report_of("deepseek-v3", None)
    bias = [b for b in report.buffers if b.name.endswith("e_score_correction_bias")]
    assert len(bias) == 58
    assert report.parameters.total + sum(b.numel for b in bias) == 671_026_419_200


@pytest.mark.parametrize(
    ("name", "paper_non_embedding"),
    [
        ("google/gemma-2b", 1_981_884_416),
        ("google/gemma-7b", 7_751_248_896),
        ("google/gemma-2-2b", 2_024_517_888),
        ("google/gemma-2-9b", 8_324_201_984),
        ("google/gemma-2-27b", 26_047_480_320),
    ],
)
def test_gemma_papers_non_embedding_counts_match_exactly(name, paper_non_embedding):
    config = _config(name)
    assert MEASURED[name] - config["vocab_size"] * config["hidden_size"] == paper_non_embedding


@pytest.mark.parametrize(
    ("name", "card_non_embedding"),
    [
        ("EleutherAI/pythia-70m", 18_915_328),
        ("EleutherAI/pythia-160m", 85_056_000),
        ("EleutherAI/pythia-410m", 302_311_424),
        ("EleutherAI/pythia-1b", 805_736_448),
        ("EleutherAI/pythia-1.4b", 1_208_602_624),
        ("EleutherAI/pythia-2.8b", 2_517_652_480),
        ("EleutherAI/pythia-6.9b", 6_444_163_072),
        ("EleutherAI/pythia-12b", 11_327_027_200),
    ],
)
def test_pythia_cards_non_embedding_counts_match_exactly(name, card_non_embedding):
    config = _config(name)
    assert MEASURED[name] - 2 * config["vocab_size"] * config["hidden_size"] == card_non_embedding


def test_t5_large_paper_figure_disagrees():
    published = ENTRIES["google-t5/t5-large"]["published"]
    assert published["agrees"] is False and published["rounded"] == "770M"
    config = _config("google-t5/t5-large")
    # 770M would need a second vocab x d_model matrix, a convention that does not fit the paper's Small and Base.
    assert rounds_to(MEASURED["google-t5/t5-large"] + config["vocab_size"] * config["d_model"], "770M")
    assert not rounds_to(MEASURED["google-t5/t5-base"] + 32128 * 768, "220M")
