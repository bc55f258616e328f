"""Bounded work, the bound in the message (issue 30 §6): remote code on the Hub is fetched offline-first, in one line
when the Hub is unreachable; memory and flops build at most 512 layers, and answer those within 30 s. (The pickle
bounds: tests/test_pickle_bounds.py.) The seconds asserted here guard against minutes, measured one process at a time
(docs/benchmarks.md); two pytest workers on two cores roughly double a child's wall time, so each guard is that
bound doubled (LOADED)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from paramscope.build import MAX_COST_LAYERS, MAX_LAYERS
from paramscope.cli import main

# two pytest workers on two cores: a child process's wall time (one bad-input case: 6.7 s alone, 11.7 s in CI)
LOADED = 2

HUB_REMOTE = {"model_type": "toyremote", "architectures": ["ToyModel"], "hidden_size": 8,
              "auto_map": {"AutoConfig": "someorg/somerepo--configuration_toy.ToyConfig",
                           "AutoModel": "someorg/somerepo--modeling_toy.ToyModel"}}


@pytest.fixture
def no_network(monkeypatch):
    """Every name lookup recorded and refused: a test that needs none proves it made none."""
    lookups = []

    def refuse(host, *args, **kwargs):
        lookups.append(host)
        raise socket.gaierror(-2, "Name or service not known (test)")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return lookups


@pytest.mark.slow
@pytest.mark.parametrize("offline", [False, True])
def test_hub_remote_code_is_offline_first_and_one_line(tmp_path, capsys, monkeypatch, no_network, offline):
    """A `repo--module.Class` auto_map reference with --trust-remote-code and the Hub unreachable (HF_HUB_OFFLINE
    unset: one quick connect says so) or HF_HUB_OFFLINE set: only the local cache is read, and a miss is one line at
    once, naming why; huggingface_hub's five retries (about 25 s, each printed) never start."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(HUB_REMOTE))
    started = time.perf_counter()
    assert main(["inspect", str(tmp_path / "model"), "--trust-remote-code"]) == 2
    seconds = time.perf_counter() - started
    captured = capsys.readouterr()
    why = ("HF_HUB_OFFLINE is set" if offline
           else "the Hugging Face Hub cannot be reached (no answer from huggingface.co:443 within 3 s)")
    assert captured.out == "" and captured.err.count("\n") == 1 and "Retrying" not in captured.err
    assert captured.err.startswith("paramscope: error: could not load remote code "
                                   f"someorg/somerepo--configuration_toy.ToyConfig from {tmp_path / 'model'}: {why}, "
                                   "and the code is not in the local cache (")
    assert captured.err.endswith("); nothing ran\n")
    assert no_network == ([] if offline else ["huggingface.co"])  # the one connect, and no request
    assert seconds < 15 * LOADED


def _deep(tmp_path, layers: int, **fields) -> str:
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": layers, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 256,
              "torch_dtype": "bfloat16"} | fields
    directory = tmp_path / f"deep{layers}"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


@pytest.mark.slow
@pytest.mark.parametrize("command", [["memory"], ["memory", "--training"], ["flops"]])
def test_memory_and_flops_state_their_layer_bound_before_any_build(tmp_path, command):
    """Past MAX_COST_LAYERS the cost commands refuse in one line naming the field, the value and both bounds, in a
    fresh process that never imports torch."""
    path = _deep(tmp_path, MAX_LAYERS)
    code = ("import sys\nfrom paramscope.cli import main\ncode = main(sys.argv[1:])\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(code)\n")
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code, *command, path], capture_output=True, text=True, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "PARAMSCOPE_CACHE_DIR": str(tmp_path / "cache"),
                                 "PARAMSCOPE_RECORD_TEMPLATES": "0"})
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr == (f"paramscope: error: config field 'num_hidden_layers' is {MAX_LAYERS:,}, more than the "
                             f"{MAX_COST_LAYERS:,} layers memory and flops build (they run a prefill, traces and sums "
                             f"over every layer, about 25 ms each); inspect takes up to {MAX_LAYERS:,}\n")
    assert time.perf_counter() - started < 10 * LOADED


def test_inspect_still_takes_the_deepest_stack(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PARAMSCOPE_RECORD_TEMPLATES", "0")
    assert main(["inspect", _deep(tmp_path, MAX_LAYERS), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"]["total"] == 38_007_872


@pytest.mark.slow
@pytest.mark.parametrize("command", [["memory"], ["memory", "--training"]])
def test_memory_answers_at_its_layer_bound_within_30_s(tmp_path, command, monkeypatch):
    """GPT-2's blocks are the slowest per layer measured (a Conv1D's init on meta, the cache check's prefill)."""
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": MAX_COST_LAYERS,
              "n_head": 4, "vocab_size": 1000, "n_positions": 256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PARAMSCOPE_RECORD_TEMPLATES", "0")
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "paramscope", *command, str(tmp_path), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["model"]["class"] == "GPT2LMHeadModel"
    assert time.perf_counter() - started < 30 * LOADED
