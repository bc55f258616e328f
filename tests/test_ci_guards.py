"""CI cannot silently skip: the allowance tests/conftest.py enforces under PARAMSCOPE_STRICT_SKIPS=1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ALLOWED_SKIPS, unallowed_skips

ROOT = Path(__file__).resolve().parent.parent


def test_a_listed_reason_is_allowed_up_to_its_count_and_nothing_else_is():
    reason = next(iter(ALLOWED_SKIPS))
    allowed = [(f"t::{i}", reason) for i in range(ALLOWED_SKIPS[reason])]
    assert unallowed_skips(allowed) == []
    assert unallowed_skips(allowed + [("t::x", reason)]) == [("t::x", reason)]
    assert unallowed_skips([("t::y", "no chromium on PATH")]) == [("t::y", "no chromium on PATH")]


def test_a_skip_beyond_the_allowance_fails_the_run(tmp_path):
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_one.py").write_text("import pytest\n\ndef test_skips():\n    pytest.skip('no browser')\n")
    env = {**os.environ, "PARAMSCOPE_STRICT_SKIPS": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 1, run.stdout
    assert "1 test(s) skipped beyond" in run.stdout and "test_one.py::test_skips: no browser" in run.stdout
    env["PARAMSCOPE_STRICT_SKIPS"] = "0"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout


def test_ci_installs_from_the_constraints_file_and_runs_strict():
    script = (ROOT / ".ci" / "run").read_text()
    assert "PARAMSCOPE_STRICT_SKIPS=1" in script and "-c .ci/constraints.txt" in script
    pins = dict(line.lower().replace("_", "-").split("==") for line in (ROOT / ".ci" / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    for package in ("torch", "transformers", "peft", "plotly", "pytest", "playwright", "huggingface-hub"):
        assert package in pins, package


def test_every_slow_entry_names_a_test_that_exists():
    """A renamed test would silently leave the fast lane; each entry of tests/slow_tests.txt must still match."""
    from conftest import _slow_entries

    entries = _slow_entries()
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         capture_output=True, text=True, cwd=ROOT)
    collected = [line for line in run.stdout.splitlines() if "::" in line]
    assert len(collected) > 1500
    for entry in entries:
        assert any(nodeid == entry or nodeid.startswith(entry + "::") or nodeid.split("[")[0] == entry
                   for nodeid in collected), entry
