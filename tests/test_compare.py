"""`paramscope compare`: totals, role groups and shares side by side; JSON and CSV."""

from __future__ import annotations

import csv
import io
import json

from paramscope import inspect
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


# --- active parameters of mixtures of experts ---------------------------------------------------------------------

MOE = ["mixtral-8x7b", "llama-3-8b", "deepseek-v3"]  # inspect() answers them from the shipped templates: no build
ACTIVE = {"mixtral-8x7b": 12_879_925_248, "llama-3-8b": 8_030_261_248,  # dense: its total, all of it active
          "deepseek-v3": 37_552_282_624}  # as `inspect` gives them (parameters.active)


def test_moe_active_in_json_and_csv(capsys):
    assert main(["compare", *MOE, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {m["model"]: m["active"] for m in doc["models"]} == ACTIVE
    assert {m["model"]: m["total"] for m in doc["models"]} == {
        "mixtral-8x7b": 46_702_792_704, "llama-3-8b": 8_030_261_248, "deepseek-v3": 671_026_404_352}
    assert main(["compare", *MOE, "--csv"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("model,class,model_type,total,trainable,with_tied_duplicates,buffers,"
                                          "layers,active,group:")
    assert {r["model"]: int(r["active"]) for r in csv.DictReader(io.StringIO(out))} == ACTIVE


def test_moe_active_in_every_text_layout(capsys):
    assert main(["compare", *MOE, "--width", "120"]) == 0  # side by side: a row, shares of each total
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("active per token"))
    assert row.split()[3:] == ["12,879,925,248", "(27.6%)", "8,030,261,248", "37,552,282,624", "(5.6%)"]
    assert "active per token: k of E routed experts; a dense model's is its total" in out
    comparison = compare_reports([inspect(m) for m in MOE], MOE)
    from paramscope.render.compare import render_compare_text

    for width in (80, 40, 20):  # models as rows (the note carries the figures), then blocks
        text = render_compare_text(comparison, width)
        assert max(len(line) for line in text.splitlines()) <= width
        words = text.split()
        assert "12,879,925,248" in words and "37,552,282,624" in words
        assert "dense model's is its total" in " ".join(words)


def test_dense_comparisons_show_no_active_row(capsys):
    assert main(["compare", "gpt2", "llama-3-8b", "--width", "120"]) == 0
    assert "active" not in capsys.readouterr().out


def test_unknown_top_k_is_null_empty_and_said():
    from dataclasses import replace

    from paramscope.compare import Comparison
    from paramscope.render.compare import render_compare_text

    known = compare_reports([inspect(m) for m in MOE[:2]], MOE[:2])
    comparison = Comparison((replace(known.columns[0], active=None), known.columns[1]), known.roles, known.groups)
    assert [m["active"] for m in comparison.to_dict()["models"]] == [None, 8_030_261_248]
    assert [r["active"] for r in csv.DictReader(io.StringIO(comparison.to_csv()))] == ["", "8030261248"]
    text = render_compare_text(comparison, 160)
    assert next(line for line in text.splitlines() if line.startswith("active per token")).split()[3:] == [
        "—", "8,030,261,248"]
    assert "unknown where the config gives no top-k" in text


def test_moe_active_on_the_compare_page():
    import re

    from paramscope.render.html.compare import render_compare_html

    reports = [inspect(m) for m in MOE]
    page = render_compare_html(compare_reports(reports, MOE), reports)
    assert [int(v) for v in re.findall(r'data-active="(\d+)"', page)] == list(ACTIVE.values())
    assert "12,879,925,248</span> (27.6%)" in page and "a dense model's active count is its total" in page
