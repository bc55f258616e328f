"""The terminal at any width: compare never breaks or cuts a number; `paramscope MODEL` is `inspect MODEL`."""

from __future__ import annotations

import pytest

from paramscope.cli import build_parser, unknown_command, with_default_command
from paramscope import inspect
from paramscope.compare import compare_reports
from paramscope.explain import exact, human
from paramscope.render.compare import render_compare_text

EIGHT = ["bert-base-uncased", "bert-large-uncased", "distilbert-base-uncased", "roberta-base", "gpt2",
         "meta-llama/Meta-Llama-3-8B", "mixtral-8x7b", "t5-small"]


def compare(names):
    return compare_reports([inspect(name) for name in names], names)


@pytest.fixture(scope="module")
def eight():
    return compare(EIGHT)


@pytest.mark.parametrize("width", [40, 60, 80, 100, 160, 240])
@pytest.mark.parametrize("roles", [False, True])
def test_compare_of_eight_fits_every_width_and_keeps_numbers_whole(eight, width, roles):
    text = render_compare_text(eight, width, roles=roles)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    assert "…" not in text  # nothing cut
    for column in eight.columns:  # each total appears whole, exact or in human units, on one line
        assert exact(column.total) in text or human(column.total) in text


def test_compare_layout_follows_the_width(eight):
    """Side by side when it fits, models as rows, then fewer group columns with a note naming those left out."""
    assert "models as rows" in render_compare_text(eight, 100)
    at80 = render_compare_text(eight, 80)  # a compact table and a note, not 60–90 lines of blocks per model
    assert at80.count("parameters: ") == 0 and len(at80.splitlines()) <= 14
    assert "46,702,792,704" in at80 and "meta-llama/Meta-Llama-3-8B" in at80
    assert "not shown at this width: cross-attention, final norm, heads; every group at\n--width 100" in at80
    two = compare(EIGHT[:2])
    wide = render_compare_text(two, 100)
    lines = wide.splitlines()
    # the exact total, whole, in its column beside the other model's, on the unique-parameters and total rows
    assert [line.split() for line in lines if line.startswith(("parameters (unique)", "total "))] == [
        ["parameters", "(unique)", "109,514,298", "335,174,458"], ["total", "109,514,298", "335,174,458"]]
    assert "bert-large-uncased" in wide.splitlines()[1]  # models side by side


@pytest.mark.parametrize("argv, expected", [
    (["bert-base-uncased"], ["inspect", "bert-base-uncased"]),
    (["--debug", "bert-base-uncased", "--json"], ["--debug", "inspect", "bert-base-uncased", "--json"]),
    (["compare", "a", "b"], ["compare", "a", "b"]),  # a command name always wins
    (["memory", "gpt2"], ["memory", "gpt2"]),
    (["--version"], ["--version"]),
    ([], []),
])
def test_model_without_command_means_inspect(argv, expected):
    assert with_default_command(argv) == expected


@pytest.mark.parametrize("argv, expected", [
    (["bert-base-uncased"], None),  # a model alone is inspect
    (["bert-base-uncased", "--depth", "2"], None),  # an option's value is no second argument
    (["inspect", "gpt2"], None),
    (["inpsect"], None),  # alone, a word is a model (its unknown-model error names the command it resembles)
    (["someorg/somemodel", "--json"], None),
    (["inpsect", "gpt2"], "unknown command 'inpsect'; did you mean 'inspect'?"),
    (["--debug", "flop", "gpt2", "--seq", "8"], "unknown command 'flop'; did you mean 'flops'?"),
    (["explode", "gpt2"], "unknown command 'explode'; the commands are inspect, presets, formula, diff, compare, "
                          "audit, memory, flops, serve, plan (see --help)"),
    (["explode", "--depth", "2", "gpt2"], "unknown command 'explode'; the commands are inspect, presets, formula, "
                                          "diff, compare, audit, memory, flops, serve, plan (see --help)"),
    (["gpt2", "bert-base-uncased"], "inspect takes one model, got 'gpt2' and then 'bert-base-uncased' (several "
                                    "models: `paramscope compare A B …`)"),
])
def test_a_misspelled_command_names_itself(argv, expected):
    assert unknown_command(argv, build_parser()) == expected


def _cli_at(capsys, monkeypatch, columns: int, *argv: str) -> str:
    from paramscope.cli import main

    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(list(argv)) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("columns", [60, 80])
def test_formula_follows_columns(capsys, monkeypatch, columns):
    """formula took COLUMNS for its tables only: the provenance, the cache file's path and the headings ran to 137
    characters at 80."""
    out = _cli_at(capsys, monkeypatch, columns, "formula", "gpt2")
    assert max(len(line) for line in out.splitlines()) <= columns
    assert "file      " in out and out.count(".json") == 1  # the path is kept, broken after a '/'
    for line in out.splitlines():
        if line.startswith("            ") and "/" in line:
            assert line.rstrip().endswith("/") or line.rstrip().endswith(".json")


def test_audit_breaks_a_path_after_a_slash_not_inside_a_name(tmp_path, capsys, monkeypatch):
    import json
    import struct

    from conftest import bert_config

    folder = tmp_path / "some-long-folder-name-for-models" / "google-bert--bert-base-uncased-finetuned-checkpoint"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(bert_config()))
    header = json.dumps({"bert.embeddings.word_embeddings.weight": {"dtype": "F32", "shape": [1],
                                                                    "data_offsets": [0, 4]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    out = _cli_at(capsys, monkeypatch, 80, "audit", str(folder))
    assert max(len(line) for line in out.splitlines()) <= 80
    text = " ".join(line.strip() for line in out.splitlines())
    assert "google-bert--bert-base-uncased-finetuned-checkpoint/" in text  # whole, on one line
    assert "some-long-folder-name-for-models/" in text
