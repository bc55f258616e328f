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
    assert "models as rows" in render_compare_text(eight, 100)
    assert render_compare_text(eight, 80).count("parameters: ") == 8  # one block per model
    two = compare(EIGHT[:2])
    wide = render_compare_text(two, 100)
    assert "109,514,298 " in wide or wide.count("109,514,298") >= 1
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
                          "audit, memory, flops, plan (see --help)"),
    (["explode", "--depth", "2", "gpt2"], "unknown command 'explode'; the commands are inspect, presets, formula, "
                                          "diff, compare, audit, memory, flops, plan (see --help)"),
    (["gpt2", "bert-base-uncased"], "inspect takes one model, got 'gpt2' and then 'bert-base-uncased' (several "
                                    "models: `paramscope compare A B …`)"),
])
def test_a_misspelled_command_names_itself(argv, expected):
    assert unknown_command(argv, build_parser()) == expected
