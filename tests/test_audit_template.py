"""Audits answered from a structure template: no torch, the same audit as the meta build's, to the last count.

The template's stand-in modules walk like the built module for what an audit reports beside the reconciliation:
torchinfo 1.8's module-by-module count and transformers' exclude_embeddings.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from paramscope.api import as_source, inspect_source
from paramscope.audit import audit
from paramscope.reconcile_counts import reconcile_counts, torchinfo_count

PRESETS = ["bert-base-uncased", "gpt2", "t5-small", "albert-base-v2", "mixtral-8x7b", "distilbert-base-uncased",
           "roberta-base"]


def _without_engine(document: dict) -> dict:
    document = json.loads(json.dumps(document))
    document["model"].pop("engine", None)
    return document


@pytest.mark.parametrize("name", PRESETS)
def test_stand_in_modules_count_as_the_built_module_does(name):
    templated, stub = inspect_source(as_source(name))
    built, module = inspect_source(as_source(name), use_cache=False)
    assert templated.model.engine == "template" and built.model.engine == "build"
    assert torchinfo_count(stub) == torchinfo_count(module)
    assert reconcile_counts(templated, stub).to_dict() == reconcile_counts(built, module).to_dict()


def test_audit_of_a_real_checkpoint_is_the_same_from_the_template(minilm_dir, tmp_path, monkeypatch):
    from paramscope.sources import resolve
    from paramscope.template_record import record_template

    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path))  # its class, BertModel, ships no template
    record_template(resolve(str(minilm_dir)).config, label="all-MiniLM-L6-v2")
    fast = audit(minilm_dir)
    slow = audit(minilm_dir, use_cache=False)
    assert fast.report.model.engine == "template" and slow.report.model.engine == "build"
    assert _without_engine(fast.to_dict()) == _without_engine(slow.to_dict())
    assert fast.audit.complete and len(fast.audit.matched) == 103  # every tensor but the position_ids buffer


def _header_checkpoint(folder, tensors: int) -> None:
    """BERT's config beside a safetensors header of `tensors` one-element tensors no BERT has: the benchmark's own
    writer (bench/bench_header.py), so that the test and the measured figure are about the same file."""
    from pathlib import Path

    bench = str(Path(__file__).resolve().parents[1] / "bench")
    sys.path.insert(0, bench)
    try:
        from bench_header import write_checkpoint
    finally:
        sys.path.remove(bench)
    write_checkpoint(folder, tensors)


def test_a_large_header_is_audited_without_importing_torch(tmp_path):
    _header_checkpoint(tmp_path, 50_000)
    script = (
        "import json, sys\n"
        "from paramscope.audit import audit\n"
        f"result = audit({str(tmp_path)!r})\n"
        "print(json.dumps([len(result.audit.unexpected), len(result.audit.missing), result.report.model.engine,\n"
        "                  sorted(m for m in ('torch', 'transformers', 'sympy') if m in sys.modules)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    unexpected, missing, engine, imported = json.loads(out.stdout)
    assert (unexpected, missing, engine, imported) == (50_000, 202, "template", [])
    reasons = {f.reason for f in audit(tmp_path, use_cache=False).audit.unexpected}
    assert reasons == {"no parameter of that name in BertForMaskedLM: unused when loaded"}


def test_an_audit_that_built_records_a_template_for_the_next(minilm_dir, tmp_path):
    import os

    env = dict(os.environ, PARAMSCOPE_CACHE_DIR=str(tmp_path), PARAMSCOPE_RECORD_TEMPLATES="wait")
    engines = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-m", "paramscope", "audit", str(minilm_dir), "--json"],
                             capture_output=True, text=True, env=env, timeout=300, check=True)
        engines.append(json.loads(out.stdout)["model"]["engine"]["name"])
    assert engines == ["build", "template"]
