"""Progress on stderr: shown for long work only when turned on (the CLI, with stderr a terminal), never otherwise."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from rich.console import Console

from paramscope import progress
from paramscope.formula import derive_formula


@pytest.fixture
def shown():
    buffer = io.StringIO()
    progress.enable(Console(file=buffer, force_terminal=True, width=200))
    yield buffer
    progress.disable()


def test_formula_derivation_shows_its_probe_builds(shown, tmp_path, monkeypatch):
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path))
    derive_formula("bert-base-uncased", model_class="BertModel", use_cache=False)
    text = shown.getvalue()
    assert "deriving" in text and "probe build" in text


def test_a_build_on_meta_says_what_it_builds(shown):
    from paramscope.api import inspect_with_module

    inspect_with_module("gpt2")
    assert "building GPT2LMHeadModel on the meta device" in shown.getvalue()


def test_a_traced_step_says_so(shown):
    from paramscope.cost.memory.training import TrainingOptions, estimate_training

    estimate_training("bert-base-uncased", TrainingOptions(batch=1, seq=16, trace=True))
    assert "tracing one training step of BertForMaskedLM on fake tensors" in shown.getvalue()


def test_nested_steps_share_one_line_and_nothing_is_left_on_screen(shown):
    with progress.status("outer"):
        with progress.status("inner"):
            progress.update("inner, step 2")
        assert progress._running is not None and progress._running.status == "outer"
    assert progress._running is None


def test_off_by_default_and_in_pipes():
    assert progress._console is None
    with progress.status("nothing"):
        progress.update("still nothing")
    result = subprocess.run([sys.executable, "-m", "paramscope", "inspect", "gpt2", "--no-cache", "--json"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stderr == ""  # stderr is a pipe here: no spinner
