"""Invariants that hold for every model: the breakdown and the tree both sum exactly to the total."""

from __future__ import annotations

import pytest

from paramscope.count import walk

from conftest import report_of

FOUNDATION_PRESETS = ["bert-base-uncased", "bert-base-cased", "bert-large-uncased", "bert-large-cased",
                      "bert-base-chinese", "bert-base-multilingual-cased", "distilbert-base-uncased",
                      "roberta-base", "roberta-large"]
BERT_CLASSES = ["BertModel", "BertForMaskedLM", "BertForSequenceClassification", "BertForTokenClassification",
                "BertForQuestionAnswering", "BertForPreTraining", "BertForMultipleChoice",
                "BertForNextSentencePrediction"]


def check_invariants(report):
    total = report.parameters.total
    assert sum(report.breakdown.values()) == total
    assert report.tree.params == total
    numel = {p.name: p.numel for p in report.params}
    for node in walk(report.tree):
        own = sum(numel[f"{node.name}.{local}" if node.name else local] for local in node.own)
        assert node.params == own + sum(c.params for c in node.children), node.name
    assert sum(c.params for c in report.components) == total
    assert report.parameters.trainable + report.parameters.frozen == total
    duplicates = sum(g.numel * len(g.aliases) for g in report.tied)
    assert report.parameters.with_tied_duplicates == total + duplicates
    assert sum(p.numel for p in report.params) == total
    assert report.unclassified == tuple(p.name for p in report.params if p.role == "other")


@pytest.mark.parametrize("preset", FOUNDATION_PRESETS)
def test_presets_default_class(preset):
    report = report_of(preset)
    check_invariants(report)
    assert report.unclassified == ()


@pytest.mark.parametrize("model_class", BERT_CLASSES)
def test_bert_heads(model_class):
    report = report_of("bert-base-uncased", model_class)
    check_invariants(report)
    assert report.unclassified == ()


@pytest.mark.parametrize(("task", "expected_class"), [
    ("sentiment", "BertForSequenceClassification"), ("topic", "BertForSequenceClassification"),
    ("spam", "BertForSequenceClassification"), ("intent", "BertForSequenceClassification"),
    ("ner", "BertForTokenClassification"), ("pos", "BertForTokenClassification"),
    ("chunking", "BertForTokenClassification"), ("fill-mask", "BertForMaskedLM"),
    ("question-answering", "BertForQuestionAnswering"), ("feature-extraction", "BertModel"),
    ("text-generation", "BertLMHeadModel"), ("multiple-choice", "BertForMultipleChoice"),
])
def test_tasks_choose_the_right_head(task, expected_class):
    report = report_of("bert-base-uncased", task=task)
    assert report.model.class_name == expected_class
    assert f"--task {task}" in report.model.class_reason
    check_invariants(report)


def test_num_labels_sets_the_head_size():
    report = report_of("bert-base-uncased", task="ner", num_labels=9)
    assert report.breakdown["head.classifier"] == 768 * 9 + 9
    assert report.parameters.total == 108_891_648 + 768 * 9 + 9
