"""What each task head adds, with its arithmetic; label-count suggestions never override --num-labels."""

from __future__ import annotations

import json

import pytest

from paramscope.cli import main
from paramscope.heads import LABEL_SUGGESTIONS, classifier_arithmetic, describe_heads, suggest_num_labels

from conftest import report_of


def heads_of(model_class, num_labels=None, task=None, user_num_labels=None):
    return describe_heads(report_of("bert-base-uncased", model_class, None, num_labels), task=task,
                          num_labels=user_num_labels)


def test_sequence_classifier_arithmetic():
    heads = heads_of("BertForSequenceClassification", 2)
    assert [p.line for p in heads.parts] == ["classifier: 768·K + K = 1,538 with K=2"]
    assert heads.total == 1_538 and heads.num_labels == 2
    assert heads.uses_pooler


def test_num_labels_always_wins():
    heads = heads_of("BertForTokenClassification", 9, task="ner", user_num_labels=9)
    assert [p.line for p in heads.parts] == ["classifier: 768·K + K = 6,921 with K=9"]
    assert heads.total == 6_921
    assert heads.suggestion is None and heads.suggestion_note is None
    assert not heads.uses_pooler  # token classification drops the pooler
    # …and the count is the one the README quotes for --task ner --num-labels 9.
    assert report_of("bert-base-uncased", None, "ner", 9).total == 108_898_569


def test_use_case_without_num_labels_gets_a_suggestion_not_a_different_model():
    heads = heads_of("BertForTokenClassification", None, task="ner")
    assert heads.num_labels == 2  # built as the config says: transformers' default of 2 labels
    assert heads.total == 1_538
    assert heads.suggestion == LABEL_SUGGESTIONS["ner"]
    assert heads.suggestion_note == (
        "suggestion for ner: 9 labels (CoNLL-2003: O plus B-/I- for PER, ORG, LOC, MISC); --num-labels 9 gives "
        "classifier 768·K + K = 6,921 with K=9; this head was built with K=2, the config's num_labels "
        "(--num-labels always wins)"
    )


def test_suggestion_matching_the_built_head_says_so_plainly():
    heads = heads_of("BertForSequenceClassification", 2, task="sentiment")
    assert heads.suggestion_note == ("suggestion for sentiment: 2 labels (SST-2 / IMDb: positive, negative); "
                                     "--num-labels 2 gives classifier 768·K + K = 1,538 with K=2")


@pytest.mark.parametrize(("use_case", "k"), [("sentiment", 2), ("topic", 4), ("spam", 2), ("intent", 7),
                                             ("ner", 9), ("pos", 17), ("chunking", 23),
                                             ("sentiment-analysis", 2), ("NER", 9)])
def test_label_suggestions(use_case, k):
    assert suggest_num_labels(use_case).num_labels == k


def test_no_suggestion_for_pipeline_tasks():
    assert suggest_num_labels("text-classification") is None
    assert suggest_num_labels(None) is None


def test_question_answering():
    heads = heads_of("BertForQuestionAnswering")
    assert [p.line for p in heads.parts] == ["qa_outputs: 768·K + K = 1,538 with K=2 (start and end logits)"]


def test_multiple_choice_has_one_score_per_choice():
    heads = heads_of("BertForMultipleChoice")
    assert [p.line for p in heads.parts] == ["classifier: 768·K + K = 769 with K=1 (one score per choice)"]
    assert describe_heads(report_of("bert-base-uncased", "BertForMultipleChoice"), task="topic").suggestion is None


def test_masked_lm_head_parts_and_the_tied_decoder():
    heads = heads_of("BertForMaskedLM")
    assert [(p.module, p.params) for p in heads.parts] == [
        ("cls.predictions.transform.dense", 590_592),
        ("cls.predictions.transform.LayerNorm", 1_536),
        ("cls.predictions.bias", 30_522),
        ("cls.predictions.decoder", 0),
    ]
    assert heads.total == 622_650 == 109_514_298 - (109_482_240 - 590_592)
    decoder = heads.parts[-1]
    assert decoder.tied == (("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),
                            ("cls.predictions.decoder.bias", "cls.predictions.bias"))
    assert decoder.arithmetic.endswith("(tied): adds 0")
    assert heads.parts[0].line == "cls.predictions.transform.dense: 768·768 + 768 = 590,592"
    assert heads.parts[1].line == "cls.predictions.transform.LayerNorm: 768 + 768 = 1,536"


def test_pretraining_adds_the_next_sentence_head():
    heads = heads_of("BertForPreTraining")
    assert heads.total == 622_650 + 1_538
    assert "cls.seq_relationship: 768·K + K = 1,538 with K=2 (is next sentence / is not)" in [p.line for p in
                                                                                            heads.parts]


def test_bare_model_has_no_head():
    heads = heads_of("BertModel")
    assert heads.parts == () and heads.total == 0


def test_gpt2_lm_head_is_tied():
    heads = describe_heads(report_of("gpt2"))
    assert [(p.module, p.params) for p in heads.parts] == [("lm_head", 0)]
    assert heads.parts[0].tied == (("lm_head.weight", "transformer.wte.weight"),)


def test_classifier_arithmetic():
    assert classifier_arithmetic(768, 2) == "768·K + K = 1,538 with K=2"
    assert classifier_arithmetic(1024, 9) == "1024·K + K = 9,225 with K=9"


def test_cli_heads_text_and_json(capsys):
    assert main(["inspect", "bert-base-uncased", "--task", "ner", "--heads", "--no-tree", "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert "What the heads of BertForTokenClassification add: 1,538" in out
    assert "classifier: 768·K + K = 1,538 with K=2" in out
    assert "suggestion for ner: 9 labels" in out
    assert main(["inspect", "bert-base-uncased", "--task", "ner", "--num-labels", "9", "--heads", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["parameters"]["total"] == 108_898_569
    assert doc["heads"]["total"] == 6_921 and doc["heads"]["num_labels"] == 9
    assert doc["heads"]["suggestion"] is None
