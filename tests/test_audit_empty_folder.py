"""audit on a folder that holds no checkpoint (an empty folder named like a GGUF file) says so in one line, rather
than asking for a config."""

from __future__ import annotations

from pathlib import Path

from paramscope.cli import main


def test_an_empty_folder_named_gguf(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "dir.gguf"
    folder.mkdir()
    for argv in ([str(folder)], [str(folder), "--config", "gpt2"]):
        assert main(["audit", *argv]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err == (
            f"paramscope: error: {folder}: no checkpoint found: the folder holds no GGUF file and none of "
            "model.safetensors, model.safetensors.index.json, pytorch_model.bin, pytorch_model.bin.index.json, "
            "*.safetensors, *.safetensors.index.json or *.bin.index.json\n")
