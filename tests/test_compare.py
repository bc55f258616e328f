"""`paramscope compare`: totals, role groups and shares side by side; JSON and CSV."""

from __future__ import annotations

import csv
import io
import json

from paramscope.cli import main
from paramscope.compare import compare_reports

from conftest import report_of

MODELS = ["bert-base-uncased", "bert-large-uncased", "distilbert-base-uncased", "roberta-base"]
BASE_TOTALS = {"bert-base-uncased": 109_482_240, "bert-large-uncased": 335_141_888,
               "distilbert-base-uncased": 66_362_880, "roberta-base": 124_645_632}
DEFAULT_TOTALS = {"bert-base-uncased": 109_514_298, "bert-large-uncased": 335_174_458,
                  "distilbert-base-uncased": 66_985_530, "roberta-base": 124_697_433}


def test_compare_reports_totals_groups_and_roles():
    reports = [report_of(m, None, "feature-extraction") for m in MODELS]
    comparison = compare_reports(reports, MODELS)
    assert {c.label: c.total for c in comparison.columns} == BASE_TOTALS
    assert [c.class_name for c in comparison.columns] == ["BertModel", "BertModel", "DistilBertModel",
                                                          "RobertaModel"]
    for column in comparison.columns:
        assert sum(column.groups.values()) == column.total
        assert sum(column.breakdown.values()) == column.total
    base = comparison.columns[0]
    assert base.groups == {"embeddings": 23_837_184, "attention": 28_366_848, "mlp": 56_687_616,
                           "pooler": 590_592}
    assert comparison.groups == ("embeddings", "attention", "mlp", "pooler")
    assert "embeddings.token_type" in comparison.roles  # distilbert lacks it; the union keeps it
    assert comparison.columns[2].breakdown.get("embeddings.token_type") is None
    assert [c.layers for c in comparison.columns] == [12, 24, 6, 12]


def test_cli_text(capsys):
    assert main(["compare", *MODELS, "--task", "feature-extraction", "--width", "160"]) == 0
    out = capsys.readouterr().out
    for total in BASE_TOTALS.values():
        assert f"{total:,}" in out
    assert "23,837,184 (21.8%)" in out  # bert-base embeddings and their share


def test_cli_json(capsys):
    assert main(["compare", *MODELS, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [m["model"] for m in doc["models"]] == MODELS
    assert {m["model"]: m["total"] for m in doc["models"]} == DEFAULT_TOTALS
    bert_base = doc["models"][0]
    assert bert_base["class"] == "BertForMaskedLM"
    assert bert_base["with_tied_duplicates"] == 132_985_716
    assert bert_base["groups"]["head"] == 622_650
    assert sum(bert_base["breakdown"].values()) == 109_514_298


def test_cli_csv_and_per_spec_class(capsys):
    assert main(["compare", "bert-base-uncased:BertModel", "bert-base-uncased:BertForMaskedLM", "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["model"], r["class"], int(r["total"])) for r in rows] == [
        ("bert-base-uncased:BertModel", "BertModel", 109_482_240),
        ("bert-base-uncased:BertForMaskedLM", "BertForMaskedLM", 109_514_298),
    ]
    assert int(rows[0]["group:pooler"]) == 590_592 and int(rows[1]["group:pooler"]) == 0
    assert int(rows[1]["role:head.bias"]) == 30_522
    assert rows[0]["share:pooler"] == f"{590_592 / 109_482_240:.6f}"


def test_cli_needs_two_models(capsys):
    assert main(["compare", "bert-base-uncased"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "paramscope: error: compare needs two or more models, got 1: bert-base-uncased"
