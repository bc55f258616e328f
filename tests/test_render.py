"""Golden terminal output at a fixed width with no colour, the JSON contract, and colour rules.

Regenerate the golden files after an intended change with: PARAMSCOPE_UPDATE_GOLDEN=1 python -m pytest tests/test_render.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import paramscope

from paramscope.cli import main
from paramscope.render.json import report_to_dict
from paramscope.render.text import TextOptions, render_text

from conftest import GOLDEN, report_of

CASES = {
    "bert-base-uncased.BertModel.explain.txt": (("bert-base-uncased", "BertModel"), TextOptions(width=100, explain=True)),
    "bert-base-uncased.BertForMaskedLM.txt": (("bert-base-uncased", "BertForMaskedLM"), TextOptions(width=100, depth=4)),
    "bert-base-uncased.BertForSequenceClassification.w80.txt": (
        ("bert-base-uncased", "BertForSequenceClassification"), TextOptions(width=80, depth=2)),
}


@pytest.mark.parametrize("filename", sorted(CASES))
def test_golden_text(filename):
    (model, model_class), options = CASES[filename]
    report = report_of(model, model_class)
    # the golden files hold no transformers version: CI installs whichever release the range allows
    text = render_text(report, options).replace(f"transformers {report.model.transformers_version}",
                                                "transformers <version>")
    path = GOLDEN / filename
    if os.environ.get("PARAMSCOPE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_text_is_a_pure_function_of_report_and_width(monkeypatch):
    report = report_of("bert-base-uncased", "BertModel")
    expected = render_text(report, TextOptions(width=90))
    assert all(len(line) <= 90 for line in expected.splitlines())
    # nothing but the report and the width: not the terminal's size or colour settings, not the object's identity
    for name, value in (("COLUMNS", "40"), ("LINES", "5"), ("FORCE_COLOR", "1"), ("TERM", "xterm-256color")):
        monkeypatch.setenv(name, value)
    rebuilt = paramscope.inspect("bert-base-uncased", model_class="BertModel", use_cache=False)
    assert rebuilt is not report
    assert render_text(rebuilt, TextOptions(width=90)) == expected
    narrower = render_text(report, TextOptions(width=70))
    assert narrower != expected and all(len(line) <= 70 for line in narrower.splitlines())


def test_collapsed_layers_and_explained_rows():
    text = render_text(report_of("bert-base-uncased", "BertModel"), TextOptions(width=120, explain=True, depth=3))
    assert "0–11: 12 × BertLayer, 7,087,872 each = 85,054,464" in text
    assert "768×768 + 768 = 590,592 per layer × 12 = 7,087,104" in text
    assert "BertEncoder: 12 × BertLayer, 7,087,872 each" in text
    assert "109,482,240" in text and "109.48 M" in text


def test_depth_limits_the_tree():
    shallow = render_text(report_of("bert-base-uncased", "BertModel"), TextOptions(width=100, depth=1))
    assert "embeddings (BertEmbeddings) 23,837,184" in shallow
    assert "word_embeddings" not in shallow


def test_tied_weights_explained_in_plain_words():
    text = render_text(report_of("bert-base-uncased", "BertForMaskedLM"), TextOptions(width=200))
    assert ("cls.predictions.decoder.weight is the same tensor as bert.embeddings.word_embeddings.weight "
            "(30522×768 = 23,440,896); counted once.") in text
    assert "132,985,716 instead of 109,514,298 (+23,471,418)" in text


def test_json_contract(capsys):
    assert main(["inspect", "bert-base-uncased", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 3
    assert doc["model"]["class"] == "BertForMaskedLM"
    assert doc["model"]["model_type"] == "bert"
    assert doc["model"]["source"] == "embedded preset google-bert/bert-base-uncased"
    params = doc["parameters"]
    assert (params["total"], params["trainable"], params["frozen"]) == (109_514_298, 109_514_298, 0)
    assert params["with_tied_duplicates"] == 132_985_716
    assert params["buffers"] == 1_024
    assert {"canonical": "bert.embeddings.word_embeddings.weight", "aliases": ["cls.predictions.decoder.weight"],
            "numel": 23_440_896, "shape": [30522, 768]} in doc["tied"]
    assert sum(doc["breakdown"].values()) == params["total"]
    assert doc["tree"]["params"] == params["total"]
    assert set(doc["tree"]) >= {"name", "type", "params", "children"}
    assert sum(t["numel"] for t in doc["tensors"]) == params["total"]


def test_json_is_the_renderer_of_the_same_report():
    report = report_of("bert-base-uncased", "BertModel")
    doc = report_to_dict(report)
    assert doc["breakdown"] == report.breakdown
    assert doc["parameters"]["total"] == 109_482_240


def test_no_colour_when_piped_or_no_color(monkeypatch, capsys):
    monkeypatch.setenv("NO_COLOR", "1")
    main(["inspect", "bert-base-uncased", "--no-tree", "--width", "100"])
    assert "\x1b[" not in capsys.readouterr().out
    monkeypatch.delenv("NO_COLOR")
    main(["inspect", "bert-base-uncased", "--no-tree", "--width", "100"])  # capsys is not a terminal
    assert "\x1b[" not in capsys.readouterr().out
    colored = render_text(report_of("bert-base-uncased", "BertModel"), TextOptions(width=100, color=True))
    assert "\x1b[" in colored


def test_python_dash_m_and_import_stays_light():
    code = ("import sys, paramscope; "
            "print(sorted(m for m in ('torch', 'transformers', 'rich', 'sympy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    version = subprocess.run([sys.executable, "-m", "paramscope", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("paramscope ")


def test_presets_command(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "google-bert/bert-base-uncased" in out and "bert-base-uncased" in out


def test_a_report_displays_briefly_in_repr_and_fully_in_ipython_and_jupyter():
    report = report_of("bert-base-uncased")
    assert repr(report) == "<Report BertForMaskedLM of google-bert/bert-base-uncased: 109,514,298 parameters>"
    assert repr(report_of("mixtral-8x7b")) == ("<Report MixtralForCausalLM of mistralai/Mixtral-8x7B-v0.1: "
                                               "46,702,792,704 parameters, 12,879,925,248 active>")

    class Printer:  # IPython.lib.pretty's interface, as much as _repr_pretty_ uses
        text_out = ""

        def text(self, value):
            self.text_out += value

    printer = Printer()
    report._repr_pretty_(printer, cycle=False)
    assert printer.text_out == render_text(report, TextOptions(width=110, depth=2))
    assert "132,985,716" in printer.text_out and "Tied weights" in printer.text_out

    html = report._repr_html_()  # the interactive page as a fragment (tests/test_html.py checks it in a browser)
    assert not html.startswith("<!DOCTYPE") and "if(!window.Plotly)" in html
    assert "109,514,298" in html and "Breakdown by role" in html  # the terminal report is in it too
