"""memory --engine llama.cpp refuses, in one line and before any work, a budget the reserve leaves nothing of, and
--html (paramscope's page, which renders no llama.cpp plan)."""

from __future__ import annotations

import pytest

from paramscope.cli import main


@pytest.mark.parametrize("argv, line", [
    (["--budget", "200MiB"], "--budget 200MiB (209,715,200 B) is not above --reserve 1GiB (1,073,741,824 B): nothing "
                             "is left on the GPU for llama.cpp's buffers; give a larger budget or a smaller --reserve"),
    (["--gpu", "h100", "--reserve", "80GiB"], "--gpu H100 80GB's 85,899,345,920 B is not above --reserve 80GiB "
                                              "(85,899,345,920 B): nothing is left on the GPU for llama.cpp's "
                                              "buffers; give a larger budget or a smaller --reserve"),
    (["--html", "page.html"], "--html is not available with --engine llama.cpp (no page renders its plan); --json "
                              "gives the whole answer"),
])
def test_refused_in_one_line(argv, line, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["memory", "gpt2", "--engine", "llama.cpp", "--dtype", "q8_0", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"paramscope: error: {line}\n"
    assert not (tmp_path / "page.html").exists()
