"""Progress from the first second (issue 27 §10): on a terminal, the first import of torch and transformers is shown as
it starts, before any byte of torch is read; a stderr that is no terminal gets nothing, and stdout never does."""

from __future__ import annotations

import fcntl
import io
import json
import os
import select
import struct
import subprocess
import sys
import termios
import textwrap
import time

import pytest
from rich.console import Console

from paramscope import progress

# Run in a child whose stderr is a pseudo-terminal: a finder first on sys.meta_path writes a marker straight to fd 2
# when torch is looked up, i.e. when its import begins; the CLI then runs as `paramscope` does.
DRIVER = textwrap.dedent("""
    import os, sys

    class Marker:
        def find_spec(self, name, path=None, target=None):
            if name == "torch":
                os.write(2, b"<<torch import begins>>")
            return None

    sys.meta_path.insert(0, Marker())
    from paramscope.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def _run_on_terminal(args: list[str], *, stdout_tty: bool, stderr_tty: bool, tmp_path) -> tuple[int, bytes, bytes]:
    """(exit code, stdout, stderr) of the CLI with each stream a pseudo-terminal or a pipe; never blocks past 300 s."""
    env = dict(os.environ, PARAMSCOPE_CACHE_DIR=str(tmp_path), PARAMSCOPE_RECORD_TEMPLATES="0", COLUMNS="100")
    env.pop("NO_COLOR", None)
    terminals = {}
    streams = {}
    for name, tty in (("stdout", stdout_tty), ("stderr", stderr_tty)):
        if tty:
            master, slave = os.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))  # 40 rows of 100 columns
            terminals[name] = master
            streams[name] = slave
        else:
            streams[name] = subprocess.PIPE
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, *args], stdin=subprocess.DEVNULL, env=env, **streams)
    for name, stream in streams.items():
        if stream is not subprocess.PIPE:
            os.close(stream)
    got = {"stdout": b"", "stderr": b""}
    pipes = {name: getattr(proc, name) for name in got if getattr(proc, name) is not None}
    open_fds = {fd: name for name, fd in terminals.items()} | {pipe.fileno(): name for name, pipe in pipes.items()}
    deadline = time.monotonic() + 300
    try:
        while open_fds and time.monotonic() < deadline:
            ready, _, _ = select.select(list(open_fds), [], [], 1.0)
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # a terminal's master reads EIO once the child has closed it
                    data = b""
                if data:
                    got[open_fds[fd]] += data
                else:
                    del open_fds[fd]
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for fd in terminals.values():
            os.close(fd)
        for pipe in pipes.values():
            pipe.close()
    return code, got["stdout"], got["stderr"]


def test_the_first_import_is_shown_before_torch_is_read_and_stdout_stays_clean(tmp_path):
    code, stdout, stderr = _run_on_terminal(["inspect", "gpt2", "--no-cache", "--json"], stdout_tty=False,
                                            stderr_tty=True, tmp_path=tmp_path)
    assert code == 0, stderr.decode(errors="replace")[-2000:]
    assert json.loads(stdout)["parameters"]["total"] == 124_439_808  # --json: nothing but the document
    text = stderr.decode(errors="replace")
    shown = text.find("importing transformers and torch")
    marker = text.find("<<torch import begins>>")
    assert 0 <= shown < marker, text[:2000]
    assert "building GPT2LMHeadModel on the meta device" in text[marker:]


def test_a_stderr_that_is_no_terminal_gets_nothing_even_when_stdout_is_one(tmp_path):
    code, stdout, stderr = _run_on_terminal(["inspect", "gpt2", "--no-cache", "--no-tree"], stdout_tty=True,
                                            stderr_tty=False, tmp_path=tmp_path)
    assert code == 0
    assert stderr.replace(b"<<torch import begins>>", b"") == b""  # the test's own markers, and nothing else
    assert b"importing" not in stdout and b"building" not in stdout and b"124,439,808" in stdout


@pytest.fixture
def heavy_module(tmp_path, monkeypatch):
    """A module standing for torch: not imported yet, and watched as torch is."""
    name = "paramscope_test_heavy_module"
    (tmp_path / f"{name}.py").write_text("import paramscope_test_heavy_module_part\nVALUE = 1\n")
    (tmp_path / f"{name}_part.py").write_text("PART = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(progress.HEAVY_IMPORTS, name, "importing the heavy module")
    yield name
    for module in (name, f"{name}_part"):
        sys.modules.pop(module, None)


def test_a_heavy_import_is_shown_while_it_runs_and_the_wrapper_goes_with_disable(heavy_module):
    import builtins

    before = builtins.__import__
    buffer = io.StringIO()
    progress.enable(Console(file=buffer, force_terminal=True, width=120))
    try:
        assert builtins.__import__ is not before
        module = __import__(heavy_module)
        assert module.VALUE == 1 and "importing the heavy module" in buffer.getvalue()
        assert progress._running is None  # gone once the import is done
        shown = buffer.getvalue()
        __import__(heavy_module)  # imported already: nothing more
        assert buffer.getvalue() == shown
    finally:
        progress.disable()
    assert builtins.__import__ is before


def test_progress_off_leaves_imports_alone(heavy_module):
    import builtins

    before = builtins.__import__
    assert progress._console is None
    assert progress.enable() is False or not sys.stderr.isatty()  # pytest's stderr is no terminal
    progress.disable()
    assert builtins.__import__ is before
    assert __import__(heavy_module).VALUE == 1
