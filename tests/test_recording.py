"""Recording after the answer (cli/_recording.py): the command ends once its answer is printed, and a detached
process records the template and cost facts that the next call answers from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from paramscope.cli import _recording as recording

SMALL_QWEN3 = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2,
               "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
               "intermediate_size": 96, "vocab_size": 128, "max_position_embeddings": 256, "tie_word_embeddings": True}


def _env(cache, **extra):
    env = {k: v for k, v in os.environ.items() if k != recording.RECORD_ENV}
    return env | {"PARAMSCOPE_CACHE_DIR": str(cache)} | extra


def _memory_json(path, env):
    result = subprocess.run([sys.executable, "-m", "paramscope", "memory", str(path), "--seq", "64", "--json"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_command_ends_at_its_answer_and_a_detached_process_records_for_the_next(tmp_path):
    """By default the recording is detached: right after the command returns, its job's lock is held by the
    recorder (which needs seconds to import torch and build); once it is done, the next call answers from the
    template and cost facts, with the same figures."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL_QWEN3))
    cache = tmp_path / "cache"
    env = _env(cache)
    first = _memory_json(path, env)
    assert first["model"]["engine"]["name"] == "build"
    jobs = cache / "jobs"
    assert list(jobs.glob("*.lock")), "the recorder runs after the command returned"
    deadline = time.monotonic() + 240
    while list(jobs.glob("*.lock")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not list(jobs.glob("*")), "the recorder removes its job and lock when done"
    second = _memory_json(path, env)
    assert second["model"]["engine"]["name"] == "template", second["model"]["engine"]
    for document in (first, second):
        document["model"].pop("engine")
    assert first == second


def test_a_second_command_does_not_start_the_same_recording(tmp_path, monkeypatch):
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path))
    directory = recording.jobs_directory()
    directory.mkdir(parents=True)
    lock = directory / "job.lock"
    assert recording.take_lock(lock)
    assert not recording.take_lock(lock)  # held
    old = time.time() - recording.STALE_LOCK_S - 1
    os.utime(lock, (old, old))
    assert recording.take_lock(lock)  # a lock older than that is a recorder that died: taken over


@pytest.mark.parametrize("job, field", [
    ({"version": 2}, "version"),
    ({"version": 1, "source": {"config": []}}, "source.config"),
    ({"version": 1, "source": {"config": {}, "kind": "directory", "label": 7, "description": ""}}, "source"),
    ({"version": 1, "source": {"config": {}, "kind": "d", "label": "l", "description": "", "path": None},
      "model_class": None, "task": None, "build_dtype": None, "num_labels": -1, "facts": False}, "num_labels"),
])
def test_a_bad_job_is_refused_in_one_line_and_removed(tmp_path, capsys, job, field):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    (tmp_path / "job.lock").touch()
    assert recording.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the recording job's {field} is not valid" in err
    assert not path.exists() and not (tmp_path / "job.lock").exists()


def test_a_job_that_is_not_a_regular_file_is_refused(tmp_path, capsys):
    target = tmp_path / "real.json"
    target.write_text("{}")
    link = tmp_path / "job.json"
    link.symlink_to(target)
    assert recording.main([str(link)]) == 2
    assert capsys.readouterr().err.startswith("paramscope: ")
    assert target.exists()  # the link is removed, never what it points to
