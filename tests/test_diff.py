"""`paramscope diff`: added, removed, reshaped and tied parameters, in exact figures and plain words."""

from __future__ import annotations

import json
import re

import pytest

from paramscope.cli import main
from paramscope.diff import ModelSpec, diff_reports, parse_spec
from paramscope.errors import ModelClassError

from conftest import report_of

MLM_SENTENCE = (
    "the pooler (590,592) is removed; the MLM transform (590,592), its LayerNorm (1,536) and the vocabulary bias "
    "(30,522) are added; the decoder weight (23,440,896) is tied to the word embeddings, so it adds nothing"
)


def bert(model_class, num_labels=None):
    return report_of("bert-base-uncased", model_class, None, num_labels)


def test_bert_model_to_masked_lm_in_plain_words():
    d = diff_reports(bert("BertModel"), bert("BertForMaskedLM"))
    assert d.summary == MLM_SENTENCE
    assert d.delta == 32_058 == 109_514_298 - 109_482_240
    assert d.sentence == MLM_SENTENCE[0].upper() + MLM_SENTENCE[1:] + (
        ". Net change: +32,058 (109,482,240 → 109,514,298).")


def test_bert_model_to_masked_lm_names_are_aligned_across_the_prefix():
    d = diff_reports(bert("BertModel"), bert("BertForMaskedLM"))
    assert {t.name for t in d.removed} == {"pooler.dense.weight", "pooler.dense.bias"}
    assert sum(t.numel for t in d.removed) == 590_592
    assert {t.name: t.numel for t in d.added} == {
        "cls.predictions.bias": 30_522,
        "cls.predictions.transform.dense.weight": 589_824,
        "cls.predictions.transform.dense.bias": 768,
        "cls.predictions.transform.LayerNorm.weight": 768,
        "cls.predictions.transform.LayerNorm.bias": 768,
    }
    assert d.changed == ()
    # embeddings.* ↔ bert.embeddings.*, encoder.* ↔ bert.encoder.*: 5 + 12 × 16 tensors line up.
    assert d.unchanged == 197
    assert {(t.canonical, t.aliases) for t in d.tied_added} == {
        ("bert.embeddings.word_embeddings.weight", ("cls.predictions.decoder.weight",)),
        ("cls.predictions.bias", ("cls.predictions.decoder.bias",)),
    }
    assert d.tied_removed == ()
    assert d.new_ties == (("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight", 23_440_896),)
    assert sum(t.numel for t in d.added) - sum(t.numel for t in d.removed) == d.delta


def test_reverse_direction():
    d = diff_reports(bert("BertForMaskedLM"), bert("BertModel"))
    assert d.delta == -32_058
    assert d.summary == (
        "the MLM transform (590,592), its LayerNorm (1,536) and the vocabulary bias (30,522) are removed; "
        "the pooler (590,592) is added; the decoder weight (23,440,896) was tied to the word embeddings, "
        "so dropping it changes nothing"
    )
    assert len(d.tied_removed) == 2 and d.tied_added == ()


def test_a_new_classifier_head():
    d = diff_reports(bert("BertModel"), bert("BertForSequenceClassification", 2))
    assert d.summary == "the classifier (1,538) is added"
    assert d.delta == 1_538
    assert {t.name for t in d.added} == {"classifier.weight", "classifier.bias"}


def test_label_count_changes_the_classifier_shape():
    d = diff_reports(bert("BertForSequenceClassification", 2), bert("BertForSequenceClassification", 3))
    assert [(c.name, c.from_shape, c.to_shape, c.delta) for c in d.changed] == [
        ("classifier.weight", (2, 768), (3, 768), 768),
        ("classifier.bias", (2,), (3,), 1),
    ]
    assert d.summary == "the classifier (1,538 → 2,307, +769) changes shape"
    assert d.delta == 769


def test_whole_layers_are_named_as_layers():
    d = diff_reports(report_of("gpt2"), report_of("distilgpt2"))
    assert d.summary == "layers 6–11 (6 × GPT2Block, 7,087,872 each = 42,527,232) are removed"
    assert d.delta == -42_527_232
    assert len(d.removed) == 6 * 12


def test_pretraining_to_masked_lm():
    d = diff_reports(bert("BertForPreTraining"), bert("BertForMaskedLM"))
    assert d.summary == "the pooler (590,592) and the next-sentence head (1,538) are removed"
    assert d.delta == -592_130


def test_identical_models():
    d = diff_reports(bert("BertModel"), bert("BertModel"))
    assert d.summary == "no parameter differs"
    assert d.delta == 0 and d.added == d.removed == d.changed == ()


def test_two_different_models_align_their_own_prefixes():
    d = diff_reports(report_of("bert-base-uncased", "BertModel"), report_of("roberta-base", "RobertaModel"))
    assert d.delta == 124_645_632 - 109_482_240 == 15_163_392
    assert {c.name for c in d.changed} == {"embeddings.word_embeddings.weight",
                                           "embeddings.position_embeddings.weight",
                                           "embeddings.token_type_embeddings.weight"}
    assert d.added == d.removed == ()


@pytest.mark.parametrize(("spec", "expected"), [
    ("bert-base-uncased", ModelSpec("bert-base-uncased", "bert-base-uncased")),
    ("bert-base-uncased:BertModel", ModelSpec("bert-base-uncased:BertModel", "bert-base-uncased", "BertModel")),
    ("google-bert/bert-base-uncased:BertForMaskedLM",
     ModelSpec("google-bert/bert-base-uncased:BertForMaskedLM", "google-bert/bert-base-uncased", "BertForMaskedLM")),
    ("bert-base-uncased:fill-mask", ModelSpec("bert-base-uncased:fill-mask", "bert-base-uncased", task="fill-mask")),
    ("bert-base-uncased:ner", ModelSpec("bert-base-uncased:ner", "bert-base-uncased", task="ner")),
])
def test_parse_spec(spec, expected):
    assert parse_spec(spec) == expected


@pytest.mark.parametrize(("spec", "fragment"), [
    ("bert-base-uncased:", "no class after ':'"),
    (":BertModel", "nothing before ':'"),
    ("bert-base-uncased:Bert Model", "'Bert Model' is neither a class name nor a task"),
    ("", "empty model spec"),
])
def test_bad_specs_raise(spec, fragment):
    with pytest.raises(ModelClassError, match=fragment):
        parse_spec(spec)


def test_a_path_with_a_colon_is_a_model(tmp_path, write_config):
    from conftest import bert_config

    directory = tmp_path / "a:b"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(bert_config()))
    assert parse_spec(str(directory)) == ModelSpec(str(directory), str(directory))


# --- the command line -------------------------------------------------------------------------


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_text(capsys):
    code, out, err = run_cli(capsys, "diff", "bert-base-uncased:BertModel", "bert-base-uncased:BertForMaskedLM",
                             "--width", "400")
    assert code == 0, err
    assert MLM_SENTENCE[1:] in out
    assert "Net change: +32,058 (109,482,240 → 109,514,298)." in out
    assert re.search(r"cls\.predictions\.transform\.dense: +768·768 \+ 768 = 590,592", out)  # what the head adds


def test_cli_json(capsys):
    code, out, err = run_cli(capsys, "diff", "bert-base-uncased:BertModel", "bert-base-uncased:BertForMaskedLM",
                             "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert {"a", "b", "added", "removed", "changed", "tied", "delta"} <= set(doc)
    assert doc["a"]["class"] == "BertModel" and doc["a"]["total"] == 109_482_240
    assert doc["b"]["class"] == "BertForMaskedLM" and doc["b"]["total"] == 109_514_298
    assert doc["delta"] == 32_058
    assert sorted(doc["removed"]) == ["pooler.dense.bias", "pooler.dense.weight"]
    assert "cls.predictions.bias" in doc["added"] and len(doc["added"]) == 5
    assert doc["changed"] == []
    assert [g["canonical"] for g in doc["tied"]["added"]] == ["bert.embeddings.word_embeddings.weight",
                                                             "cls.predictions.bias"]
    assert doc["added_params"] - doc["removed_params"] == 32_058


def test_cli_num_labels_applies_to_both(capsys):
    code, out, _ = run_cli(capsys, "diff", "bert-base-uncased:BertModel",
                           "bert-base-uncased:BertForTokenClassification", "--num-labels", "9", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["delta"] == 768 * 9 + 9 - 590_592
    assert sorted(doc["added"]) == ["classifier.bias", "classifier.weight"]


@pytest.mark.parametrize(("spec", "fragment"), [
    ("bert-base-uncased:", "no class after ':'"),
    ("bert-base-uncased:Bert-Model", "neither a class name nor a task"),
    ("bert-base-uncased:NoSuchModel", "unknown class 'NoSuchModel'"),
    ("bert-base-uncased:GPT2Model", "GPT2Model"),
    ("no-such-model:BertModel", "no-such-model"),
])
def test_cli_bad_spec_is_one_line(capsys, spec, fragment):
    code, out, err = run_cli(capsys, "diff", spec, "bert-base-uncased:BertModel")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("paramscope: error: "), err
    assert fragment in lines[0]
