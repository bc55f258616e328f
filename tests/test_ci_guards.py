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


def _named(nodeids) -> set[str]:
    """What an entry of tests/slow_tests.txt may be to name one of `nodeids`: the node id, the id without its
    parameters, or a '::' prefix of it (a file, a class: a test of it)."""
    names = set()
    for nodeid in nodeids:
        parts = nodeid.split("::")
        names.update("::".join(parts[:k]) for k in range(1, len(parts)))
        names.update((nodeid, nodeid.split("[")[0]))
    return names


def test_every_slow_entry_names_a_test_that_exists(request):
    """A renamed test would silently leave the fast lane; each entry of tests/slow_tests.txt must still match.

    An entry is held to the node ids this run collected (the whole suite under CI's command: every xdist worker
    collects it all); only entries this run did not collect (a file or -k run) are held to a collection, in a
    process of its own, of just their files, never to a guess."""
    from conftest import _slow_entries

    entries = _slow_entries()
    here = _named(item.nodeid for item in request.session.items)
    missing = [entry for entry in entries if entry not in here]
    if not missing:
        return
    files = sorted({entry.split("::")[0] for entry in missing})
    absent = [f for f in files if not (ROOT / f).is_file()]
    assert not absent, f"tests/slow_tests.txt names files that do not exist: {absent}"
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    collected = _named(line for line in run.stdout.splitlines() if "::" in line)
    for entry in missing:
        assert entry in collected, entry
