"""A .bin's pickle is refused within bounded work, the bound named (issue 30 §6): at most MAX_PICKLE_BYTES of
data.pkl, MAX_PICKLE_OPS opcodes, no set-, bytearray- or buffer-building opcode, at most MAX_ZIP_ENTRIES files in the
zip. A file built to exhaust them is refused within 2 s and 300 MB (measured in a fresh process). They cap a .bin at
about 50,000 tensors, where safetensors headers take 1,000,000: each refusal says so, and why."""

from __future__ import annotations

import gc
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from paramscope.checkpoint import read_checkpoint
from paramscope.checkpoint import unpickler
from paramscope.errors import CheckpointError

from test_checkpoint_hostile import tensor_pickle, write_torch_zip

PROTO2 = b"\x80\x02"
WHY = ("a .bin's pickle is read without running it, by a VM that costs about 35 µs a tensor, and the bound keeps any .bin "
       "within about 2 s and 300 MB; as safetensors a checkpoint audits up to 1,000,000 tensors")


def write_pickle(path: Path, pickle_bytes: bytes) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pickle_bytes)
        zf.writestr("archive/version", "3\n")
    return path


def refusal(path: Path) -> str:
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(path)
    message = str(refused.value)
    assert "\n" not in message and str(path) in message
    return message


def test_the_opcode_budget_is_named_when_it_runs_out(tmp_path, monkeypatch):
    monkeypatch.setattr(unpickler, "MAX_PICKLE_OPS", 1_000)
    path = write_pickle(tmp_path / "churn.bin", PROTO2 + b"N0" * 1_000 + b"}.")
    assert refusal(path).endswith("refusing to load: data.pkl runs more than 1,000 pickle opcodes, the most "
                                  "paramscope runs for one file (a state dict needs 30 a tensor: about 33 tensors); "
                                  f"nothing was executed: {WHY}")
    assert gc.isenabled()  # the collector paused for the VM is running again
    ok = write_torch_zip(tmp_path / "ok.bin", tensor_pickle())
    assert [t.name for t in read_checkpoint(ok).tensors] == ["w"]


@pytest.mark.parametrize("opcode, name", [(b"\x8f", "EMPTY_SET"), (b"\x91", "FROZENSET"), (b"\x96", "BYTEARRAY8"),
                                          (b"\x97", "NEXT_BUFFER"), (b"\x82", "EXT1")])
def test_opcodes_no_state_dict_uses_are_refused_before_they_run(tmp_path, opcode, name):
    path = write_pickle(tmp_path / "set.bin", b"\x80\x05](" + opcode * 10 + b"e.")
    assert refusal(path).endswith(f"malformed PyTorch checkpoint: the pickle uses opcode {name}, which no state dict "
                                  "needs")


def test_a_zip_listing_too_many_files_is_refused_from_its_end_record(tmp_path, monkeypatch):
    monkeypatch.setattr(unpickler, "MAX_ZIP_ENTRIES", 10)
    storages = {"0": b"\0" * 24} | {f"x{i}": b"" for i in range(12)}
    path = write_torch_zip(tmp_path / "many.bin", tensor_pickle(), storages)
    assert refusal(path).endswith("the zip lists 15 files, more than the 10 paramscope reads (a PyTorch checkpoint "
                                  f"holds one per storage, so about as many tensors): {WHY}")


def test_a_real_state_dict_past_the_opcode_bound_is_refused_naming_it(tmp_path, monkeypatch):
    """torch.save's own pickle, 30 opcodes a tensor: 100 tensors run 3,000-odd, past a bound of 2,000."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(unpickler, "MAX_PICKLE_OPS", 2_000)
    path = tmp_path / "pytorch_model.bin"
    torch.save({f"layer.{i}.weight": torch.zeros(2) for i in range(100)}, path)
    assert refusal(path) == (f"{path}: refusing to load: data.pkl runs more than 2,000 pickle opcodes, the most "
                             "paramscope runs for one file (a state dict needs 30 a tensor: about 66 tensors); nothing "
                             f"was executed: {WHY}")
    torch.save({f"layer.{i}.weight": torch.zeros(2) for i in range(60)}, path)
    assert len(read_checkpoint(path).tensors) == 60


@pytest.mark.slow
def test_a_state_dict_of_49_000_tensors_reads_and_one_of_60_000_is_refused_at_once(tmp_path):
    """The bound as a .bin meets it: torch.save of 49,000 tiny tensors (1,470,131 opcodes, 49,006 zip entries) reads
    exactly; of 60,000, the zip's end record lists 60,006 files and the file is refused before its pickle is read."""
    torch = pytest.importorskip("torch")
    names = [f"model.layers.{i // 10}.block.{i % 10}.weight" for i in range(60_000)]
    path = tmp_path / "pytorch_model.bin"
    torch.save({name: torch.zeros(2, dtype=torch.float16) for name in names[:49_000]}, path)
    checkpoint = read_checkpoint(path)
    assert checkpoint.format == "pytorch-bin" and {t.name for t in checkpoint.tensors} == set(names[:49_000])
    assert {(t.dtype, t.shape, t.nbytes) for t in checkpoint.tensors} == {("F16", (2,), 4)}
    assert checkpoint.nbytes == 196_000
    torch.save({name: torch.zeros(2, dtype=torch.float16) for name in names}, path)
    assert refusal(path) == (f"{path}: the zip lists 60,006 files, more than the 50,000 paramscope reads (a PyTorch "
                             f"checkpoint holds one per storage, so about as many tensors): {WHY}")


def test_a_data_pkl_over_the_byte_bound_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(unpickler, "MAX_PICKLE_BYTES", 1_000)
    path = write_pickle(tmp_path / "big.bin", PROTO2 + b"N0" * 600 + b"}.")
    assert "data.pkl is 1,204 bytes, too large to be a state dict (paramscope reads at most 1,000" in refusal(path)


MEASURE = """
import sys, time
from pathlib import Path
started = time.perf_counter()
from paramscope.checkpoint import read_checkpoint
from paramscope.errors import CheckpointError
try:
    read_checkpoint(Path(sys.argv[1]))
    outcome = "read"
except CheckpointError as err:
    outcome = str(err)
print(time.perf_counter() - started)
# this process's own peak (getrusage's ru_maxrss keeps the forking parent's across exec)
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
print(outcome)
"""


def _hostile(kind: str) -> bytes:
    """data.pkl just under the byte bound, made to cost as much as the VM allows."""
    size = unpickler.MAX_PICKLE_BYTES - 4096
    ops = unpickler.MAX_PICKLE_OPS + 10
    if kind == "empty dicts":
        return PROTO2 + b"](" + b"}" * (size - 8) + b"e."
    if kind == "marks":
        return PROTO2 + b"(" * (size - 4) + b"."
    if kind == "none and pop":
        return PROTO2 + b"N0" * (size // 2 - 4) + b"}."
    if kind == "nested tuples":
        return PROTO2 + b"N" + b"2\x86" * (size // 2 - 4) + b"."
    if kind == "memo":
        return PROTO2 + b"".join(b"Nr" + struct.pack("<I", i * 7919 % 2**32) for i in range(ops)) + b"}."
    if kind == "a string, then dicts":  # the string's bytes and the dicts' both, at their bounds
        text = ("\U0001F600" * ((size - ops - 64) // 4)).encode()
        return PROTO2 + b"X" + struct.pack("<I", len(text)) + text + b"q\x00](" + b"}" * (ops - 10) + b"e."
    if kind == "ordered dicts":
        return PROTO2 + b"ccollections\nOrderedDict\nq\x00](" + b"h\x00)R" * (ops // 3) + b"e."
    raise ValueError(kind)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="peak memory read from /proc (Linux)")
@pytest.mark.parametrize("kind", ["empty dicts", "marks", "none and pop", "nested tuples", "memo",
                                  "a string, then dicts", "ordered dicts"])
def test_a_hostile_pickle_is_refused_within_2_s_and_300_mb(tmp_path, kind):
    path = write_pickle(tmp_path / "hostile.bin", _hostile(kind))
    result = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, timeout=60)
    seconds, kilobytes, outcome = result.stdout.strip().split("\n", 2)
    assert outcome.startswith(str(path)) and outcome != "read", outcome
    assert float(seconds) < 2, (kind, seconds)
    assert int(kilobytes) < 300 * 1024, (kind, kilobytes)
