"""`--html` writes a regular file, stdout ('-') or /dev/null, and nothing else (issue 30 §5): a FIFO, a device, a
folder, a link to nothing or a name with a control character gets one line and a non-zero exit, before any build.
Every check is a stat: nothing here may block on a FIFO (an alarm stops any test that would)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

import pytest

from paramscope.cli._common import checked_html_path, write_html_page
from paramscope.errors import OptionError

class _Blocked(Exception):
    pass


@pytest.fixture(autouse=True)
def never_blocks():
    """A test that blocks (opening a FIFO for writing waits for a reader) fails after 20 s instead of hanging."""

    def stop(signum, frame):
        raise _Blocked("blocked: --html opened something that waits")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def checked(path: str) -> str | None:
    return checked_html_path(argparse.Namespace(html=path))


def refused(path: str) -> str:
    with pytest.raises(OptionError) as info:
        checked(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith("--html: ")
    return message


def test_a_fifo_is_refused_by_stat(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a short name: a long one is shortened in the message (pytest-xdist's are long)
    os.mkfifo("page.html")
    assert refused("page.html") == "--html: 'page.html' is a FIFO; --html writes a regular file (or '-' for stdout)"


def test_a_link_to_a_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "page.html").symlink_to(tmp_path / "pipe")
    assert "is a FIFO" in refused(str(tmp_path / "page.html"))


def test_a_fifo_swapped_in_after_the_check_fails_at_once(tmp_path, capsys):
    page = tmp_path / "page.html"
    assert checked(str(page)) == str(page)  # nothing there yet: fine
    os.mkfifo(page)  # then a FIFO appears before the page is written: the non-blocking open refuses it
    with pytest.raises(OptionError, match=r"--html: cannot write .*page\.html'"):
        write_html_page("<html></html>", str(page))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("device", ["/dev/full", "/dev/zero"])
def test_a_device_is_refused(device):
    assert refused(device) == (f"--html: '{device}' is a character device; --html writes a regular file "
                               "(or '-' for stdout)")


def test_a_folder_is_refused(tmp_path):
    assert refused(str(tmp_path)) == f"--html: '{tmp_path}' is a folder, not a file"
    assert refused("/tmp") == "--html: '/tmp' is a folder, not a file"


def test_a_socket_is_refused():
    import socket
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ps") as folder, socket.socket(socket.AF_UNIX) as server:
        path = os.path.join(folder, "s")  # short: a socket's path holds at most 107 bytes
        server.bind(path)
        assert "is a socket" in refused(path)


@pytest.mark.parametrize("name", ["a\nb.html", "a\rb.html", "tab\there.html", "bell\x07.html", "del\x7f.html"])
def test_a_name_with_a_control_character_is_refused(tmp_path, name):
    message = refused(str(tmp_path / name))
    assert "holds a control character" in message and "give a plain name" in message
    assert not os.path.lexists(tmp_path / name)


def test_a_link_to_nothing_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "page.html").symlink_to(tmp_path / "missing" / "page.html")
    assert refused("page.html") == (
        "--html: 'page.html' is a symbolic link to nothing; --html writes a regular file (or '-' for stdout)")


def test_a_missing_folder_is_refused(tmp_path):
    path = tmp_path / "no" / "page.html"
    assert refused(str(path)) == f"--html: no such folder for '{path}'"


def test_stdout_is_dash(capsys):
    assert checked("-") == "-"
    write_html_page("<html>page</html>", "-")
    out = capsys.readouterr()
    assert out.out == "<html>page</html>" and out.err == ""


def test_dev_null_takes_the_page_and_says_so(tmp_path, capsys):
    """Chosen: /dev/null (or a link to it) is taken, as `curl -o /dev/null` or `gcc -o /dev/null` take it: the page
    is made and discarded, with one line saying so."""
    assert checked(os.devnull) == os.devnull
    (tmp_path / "null.html").symlink_to(os.devnull)
    assert checked(str(tmp_path / "null.html")) == str(tmp_path / "null.html")
    write_html_page("<html>" + "x" * 2_000_000 + "</html>", os.devnull)
    assert capsys.readouterr().err == "paramscope: the page (2.0 MB) went to /dev/null, which discards it\n"


def test_a_regular_file_is_written_and_replaced(tmp_path, capsys):
    page = tmp_path / "page.html"
    assert checked(str(page)) == str(page)
    write_html_page("<html>new</html>", str(page))
    assert page.read_text() == "<html>new</html>"
    page.write_text("old and longer")
    assert checked(str(page)) == str(page)
    write_html_page("<html>2</html>", str(page))
    assert page.read_text() == "<html>2</html>"
    assert capsys.readouterr().err.startswith(f"paramscope: wrote {page} (0.0 MB;")


CHILD = """
import json, sys
from paramscope.cli import main
codes = [main(args) for args in json.loads(sys.argv[1])]
print(json.dumps([codes, sorted(m for m in ("torch", "transformers") if m in sys.modules)]))
"""


def test_the_cli_refuses_each_before_any_build(tmp_path):
    """One line each, exit 2, and neither torch nor transformers imported: the check comes before the work."""
    fifo = tmp_path / "fifo.html"
    os.mkfifo(fifo)
    targets = [str(fifo), "/dev/full", str(tmp_path), str(tmp_path / "a\nb.html"), str(tmp_path / "no" / "x.html")]
    commands = [[command, "gpt2", "--no-cache", "--html", target]
                for command in ("inspect", "memory", "flops") for target in targets]
    commands.append(["plan", "gpt2", "--lora", "8", "--html", str(fifo)])
    commands.append(["compare", "gpt2", "bert-base-uncased", "--no-cache", "--html", "/dev/full"])
    commands.append(["diff", "gpt2", "bert-base-uncased", "--no-cache", "--html", str(tmp_path)])
    env = dict(os.environ, PARAMSCOPE_CACHE_DIR=str(tmp_path / "cache"), PARAMSCOPE_RECORD_TEMPLATES="0")
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(commands)], capture_output=True, text=True,
                         timeout=120, env=env)
    codes, imported = json.loads(out.stdout)
    assert codes == [2] * len(commands) and imported == []
    lines = out.stderr.splitlines()
    assert len(lines) == len(commands) and all(line.startswith("paramscope: error: --html: ") for line in lines)
    assert sum("is a FIFO" in line for line in lines) == 4, lines
    assert sum("is a character device" in line for line in lines) == 4
    assert sum("is a folder, not a file" in line for line in lines) == 4
    assert sum("control character ('\\n')" in line for line in lines) == 3
    assert not fifo.is_file() and fifo.exists()  # untouched
