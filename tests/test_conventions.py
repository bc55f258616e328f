"""The counts people quote, each under its convention: nanoGPT, transformers' exclude_embeddings, LM head."""

from __future__ import annotations

import copy
import json

import pytest
from torch import nn

import paramscope
from paramscope.build import build_on_meta, choose_class, make_config
from paramscope.presets import find_preset
from paramscope.render.json import render_json
from paramscope.render.text import TextOptions, render_text

from conftest import report_of


def test_gpt2_non_embedding_as_nanogpt_prints_it():
    report = report_of("gpt2")
    c = report.convention("non_embedding_nanogpt")
    # nanoGPT: 124,439,808 − wpe 1024 × 768 = 123,653,376 ("number of parameters: 123.65M")
    assert c.value == 123_653_376
    assert c.label == "non-embedding (nanoGPT)"
    assert "position embeddings" in c.definition


def test_gpt2_exclude_embeddings_as_transformers_computes_it():
    # wte 50257 × 768 and wpe 1024 × 768 are nn.Embedding weights: 124,439,808 − 38,597,376 − 786,432
    assert report_of("gpt2").convention("exclude_embeddings_transformers").value == 85_056_000


def _meta_model(preset: str):
    raw = find_preset(preset).load_config()
    config, _ = make_config(raw)
    return build_on_meta(choose_class(config, raw).name, copy.deepcopy(config))


@pytest.mark.parametrize("preset", ["gpt2", "t5-small", "bart-base", "albert-base-v2", "deberta-v3-base",
                                    "modernbert-base", "llama-3.1-8b", "mixtral-8x7b"])
def test_exclude_embeddings_mirrors_transformers_num_parameters(preset):
    model = _meta_model(preset)
    report = paramscope.inspect(model)
    assert report.convention("exclude_embeddings_transformers").value == model.num_parameters(
        exclude_embeddings=True)
    assert report.total == model.num_parameters()


def test_llama_with_and_without_untied_lm_head():
    report = report_of("llama-3.1-8b")
    with_head = report.convention("with_lm_head")
    without = report.convention("without_lm_head")
    assert with_head.value == 8_030_261_248 == report.total
    # lm_head 128256 × 4096 = 525,336,576
    assert without.value == 8_030_261_248 - 525_336_576 == 7_504_924_672
    assert "untied" in without.definition


def test_tied_head_offers_no_with_without_pair():
    for preset in ("gpt2", "gemma-2b", "bert-base-uncased"):
        report = report_of(preset)
        assert report.convention("with_lm_head") is None and report.convention("without_lm_head") is None


def test_t5_exclude_embeddings_also_drops_the_relative_attention_bias():
    # T5's relative_attention_bias is an nn.Embedding: transformers leaves it out with the shared vocabulary
    report = report_of("t5-small")
    assert report.convention("exclude_embeddings_transformers").value == 60_506_624 - 32128 * 512 - 2 * 32 * 8
    # nanoGPT only removes learned absolute positions, which T5 has none of
    assert report.convention("non_embedding_nanogpt").value == report.total


def test_every_convention_has_label_and_one_line_definition():
    for preset in ("gpt2", "llama-3.1-8b", "deepseek-v3", "albert-base-v2"):
        for c in report_of(preset).conventions:
            assert c.key and c.label and c.definition and "\n" not in c.definition
            assert isinstance(c.value, int) and 0 < c.value <= report_of(preset).total


class _NanoGPT(nn.Module):
    def __init__(self, vocab=64, block=16, d=8, layers=2):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d), wpe=nn.Embedding(block, d),
            h=nn.ModuleList([nn.ModuleDict(dict(
                ln_1=nn.LayerNorm(d), attn=nn.ModuleDict(dict(c_attn=nn.Linear(d, 3 * d), c_proj=nn.Linear(d, d))),
                ln_2=nn.LayerNorm(d), mlp=nn.ModuleDict(dict(c_fc=nn.Linear(d, 4 * d), c_proj=nn.Linear(4 * d, d))),
            )) for _ in range(layers)]),
            ln_f=nn.LayerNorm(d),
        ))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # nanoGPT's weight tying

    def get_num_params(self, non_embedding=True):  # nanoGPT's own definition
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n


def test_nanogpt_definition_matches_nanogpt_itself():
    model = _NanoGPT()
    report = paramscope.inspect(model)
    assert report.unclassified == ()
    assert report.convention("non_embedding_nanogpt").value == model.get_num_params(non_embedding=True)
    assert report.total == model.get_num_params(non_embedding=False)


def test_conventions_in_json_and_text():
    doc = json.loads(render_json(report_of("llama-3.1-8b")))
    assert doc["conventions"]["without_lm_head"]["value"] == 7_504_924_672
    assert set(doc["conventions"]["non_embedding_nanogpt"]) == {"label", "value", "definition"}
    text = render_text(report_of("llama-3.1-8b"), TextOptions(width=160, tree=False))
    assert "Counts by convention" in text
    assert "without LM head" in text and "7,504,924,672" in text
