"""Hostile and broken checkpoint files: each must raise CheckpointError naming the file, nothing else.

Nothing here may execute code from a file, allocate according to a size a file claims, or escape
with another exception type (MemoryError, RecursionError, ValueError, ...).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import struct
import subprocess
import time
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paramscope.checkpoint import unpickler as checkpoint_unpickler
from paramscope.checkpoint import read_checkpoint
from paramscope.errors import CheckpointError, ParamscopeError

# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

VALID_HEADER = {
    "__metadata__": {"format": "pt"},
    "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
    "b": {"dtype": "F16", "shape": [4], "data_offsets": [24, 32]},
    "c": {"dtype": "I64", "shape": [1], "data_offsets": [32, 40]},
}


def safetensors_bytes(header, data: bytes = b"\0" * 40, header_len: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(raw) if header_len is None else header_len
    return struct.pack("<Q", n) + raw + data


def expect_error(path: Path, match: str | None = None) -> CheckpointError:
    """read_checkpoint must raise CheckpointError, on one line, naming the file."""
    try:
        read_checkpoint(path)
    except CheckpointError as err:
        message = str(err)
        assert str(path) in message, message
        assert "\n" not in message, message
        if match is not None:
            assert re.search(match, message), message
        return err
    except BaseException as err:  # noqa: BLE001 - the point is that nothing else escapes
        pytest.fail(f"{type(err).__name__} escaped instead of CheckpointError: {err}")
    pytest.fail(f"{path} was accepted")


def read_or_checkpoint_error(path: Path) -> None:
    """For fuzzing: either the file reads, or CheckpointError naming it; nothing else."""
    try:
        read_checkpoint(path)
    except CheckpointError as err:
        assert str(path) in str(err)
        assert "\n" not in str(err)
    except BaseException as err:  # noqa: BLE001
        pytest.fail(f"{type(err).__name__} escaped instead of CheckpointError: {err!r}"[:500])


# A tiny hand-assembled pickle vocabulary, so hostile .bin files need no torch.
def g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def s(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def n(value: int) -> bytes:
    if -(2**31) <= value < 2**31:
        return b"J" + struct.pack("<i", value)
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw  # LONG1


def tup(values) -> bytes:
    return b"(" + b"".join(n(v) for v in values) + b"t"


def tensor_pickle(
    key: str = "0",
    numel: int = 6,
    size=(2, 3),
    stride=(3, 1),
    offset: int = 0,
    storage_type: bytes = g("torch", "FloatStorage"),
) -> bytes:
    storage = b"(" + s("storage") + storage_type + s(key) + s("cpu") + n(numel) + b"tQ"  # BINPERSID
    rebuild = (
        g("torch._utils", "_rebuild_tensor_v2")
        + b"("
        + storage
        + n(offset)
        + tup(size)
        + tup(stride)
        + b"\x89"  # requires_grad=False
        + g("collections", "OrderedDict")
        + b")R"  # backward hooks: OrderedDict()
        + b"tR"
    )
    return b"\x80\x02}(" + s("w") + rebuild + b"u."


def write_torch_zip(
    path: Path, pickle_bytes: bytes, storages: dict[str, bytes] | None = None, compress: int = zipfile.ZIP_STORED
) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", pickle_bytes)
        for key, data in (storages if storages is not None else {"0": b"\0" * 24}).items():
            zf.writestr(zipfile.ZipInfo(f"archive/data/{key}"), data, compress_type=compress)
        zf.writestr("archive/version", "3\n")
    return path


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# ---------------------------------------------------------------------------------------------
# safetensors: header length
# ---------------------------------------------------------------------------------------------


def test_the_hand_built_file_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "ok.safetensors"
    path.write_bytes(safetensors_bytes(VALID_HEADER))
    assert read_checkpoint(path).nbytes == 40


def test_every_truncation_of_a_valid_safetensors_file(tmp_path: Path) -> None:
    full = safetensors_bytes(VALID_HEADER)
    path = tmp_path / "cut.safetensors"
    for length in range(len(full)):
        path.write_bytes(full[:length])
        expect_error(path)


@pytest.mark.parametrize("header_len", [2**62, 2**64 - 1, 10**6])
def test_header_length_beyond_the_file(tmp_path: Path, header_len: int) -> None:
    path = tmp_path / "long.safetensors"
    path.write_bytes(safetensors_bytes(VALID_HEADER, header_len=header_len))
    expect_error(path, rf"header length field says {header_len} bytes but only \d+ bytes follow")


def test_header_length_one_past_the_end(tmp_path: Path) -> None:
    raw = json.dumps(VALID_HEADER).encode()
    path = tmp_path / "long.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw) + 41) + raw + b"\0" * 40)
    expect_error(path, "header length field")


def test_header_length_over_the_cap_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "huge.safetensors"
    with path.open("wb") as f:
        f.write(struct.pack("<Q", 100_000_001))
        f.truncate(100_000_100)  # sparse: costs no disk and is never read
    expect_error(path, "exceeds the 100000000-byte safetensors limit")


def test_file_shorter_than_the_length_field(tmp_path: Path) -> None:
    path = tmp_path / "tiny.safetensors"
    path.write_bytes(b"\x01\x02\x03")
    expect_error(path, "shorter than the 8-byte header length")


# ---------------------------------------------------------------------------------------------
# safetensors: header content
# ---------------------------------------------------------------------------------------------


def entry(dtype="F32", shape=(2, 3), offsets=(0, 24)) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


BAD_HEADERS = {
    "not json": (b"this is not json", "header is not valid JSON"),
    "not utf-8": (b'{"\xff\xfe": 1}', "header is not valid UTF-8"),
    "json array": (b"[1, 2, 3]", "header must be a JSON object, got an array"),
    "json string": (b'"hello"', "header must be a JSON object, got a string"),
    "json number": (b"42", "header must be a JSON object, got a number"),
    "json null": (b"null", "header must be a JSON object, got null"),
    "empty header": (b"", "header is not valid JSON"),
    "deep nesting": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply|not valid JSON"),
    "huge integer literal": (
        b'{"a": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}',
        "not valid JSON",
    ),
    "duplicate key": (
        b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
        b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
        "names 'a' twice",
    ),
    "entry not an object": ({"a": [1, 2]}, "tensor 'a': entry must be a JSON object"),
    "no dtype": ({"a": {"shape": [1], "data_offsets": [0, 4]}}, "entry has no 'dtype'"),
    "no shape": ({"a": {"dtype": "F32", "data_offsets": [0, 4]}}, "entry has no 'shape'"),
    "no offsets": ({"a": {"dtype": "F32", "shape": [1]}}, "entry has no 'data_offsets'"),
    "unknown dtype": ({"a": entry(dtype="F128")}, "unknown dtype 'F128'"),
    "dtype not a string": ({"a": entry(dtype=4)}, "unknown dtype 4"),
    "lowercase dtype": ({"a": entry(dtype="f32")}, "unknown dtype 'f32'"),
    "negative dimension": ({"a": entry(shape=(-2, -3))}, "shape must be a list of non-negative integers"),
    "float dimension": ({"a": entry(shape=(2.0, 3))}, "shape must be a list of non-negative integers"),
    "bool dimension": ({"a": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, "shape must be a list"),
    "string dimension": ({"a": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}}, "shape must be a list"),
    "shape not a list": ({"a": {"dtype": "F32", "shape": 6, "data_offsets": [0, 24]}}, "shape must be a list"),
    "huge dimension": ({"a": entry(shape=(10**4000, 10**4000))}, "needs more bytes than the file holds"),
    "offsets wrong length": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}, "data_offsets must be"),
    "offsets not ints": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4.0]}}, "data_offsets must be"),
    "offsets bools": ({"a": {"dtype": "BOOL", "shape": [1], "data_offsets": [False, True]}}, "data_offsets must be"),
    "begin after end": ({"a": entry(offsets=(24, 0))}, r"are not 0 <= begin <= end"),
    "negative begin": ({"a": entry(offsets=(-24, 0))}, r"are not 0 <= begin <= end"),
    "end out of range": ({"a": entry(shape=(20,), offsets=(0, 80))}, "run past the 40-byte data area"),
    "begin out of range": ({"a": entry(shape=(0,), offsets=(2**70, 2**70))}, "run past the 40-byte data area"),
    "span too small": ({"a": entry(shape=(2, 3), offsets=(0, 20))}, r"needs 24 bytes but data_offsets span 20"),
    "span too large": ({"a": entry(shape=(2, 3), offsets=(0, 40))}, r"needs 24 bytes but data_offsets span 40"),
    "sub-byte misaligned": ({"a": entry(dtype="F4", shape=(3,), offsets=(0, 2))}, "whole number of bytes"),
    "overlap": (
        {"a": entry(shape=(6,), offsets=(0, 24)), "b": entry(shape=(6,), offsets=(16, 40))},
        "overlaps tensor 'a'",
    ),
    "identical offsets": (
        {"a": entry(shape=(10,), offsets=(0, 40)), "b": entry(shape=(10,), offsets=(0, 40))},
        "overlaps tensor",
    ),
    "gap": ({"a": entry(shape=(2,), offsets=(0, 8)), "b": entry(shape=(2,), offsets=(32, 40))}, "unaccounted bytes"),
    "trailing bytes": ({"a": entry(shape=(2,), offsets=(0, 8))}, "trailing bytes after the last tensor"),
    "metadata not strings": (
        {"__metadata__": {"x": 1}, "a": entry(shape=(10,), offsets=(0, 40))},
        "__metadata__ must map",
    ),
    "metadata a list": ({"__metadata__": ["x"], "a": entry(shape=(10,), offsets=(0, 40))}, "__metadata__ must map"),
}


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_bad_header(tmp_path: Path, case: str) -> None:
    header, match = BAD_HEADERS[case]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(safetensors_bytes(header))
    expect_error(path, match)


def test_very_long_tensor_names_do_not_flood_the_message(tmp_path: Path) -> None:
    name = "x" * 1_000_000
    path = tmp_path / "name.safetensors"
    path.write_bytes(safetensors_bytes({name: entry(dtype="F99")}))
    err = expect_error(path, "unknown dtype")
    assert len(str(err)) < 400


def test_many_dimensions_do_not_cost_time(tmp_path: Path) -> None:
    path = tmp_path / "dims.safetensors"
    path.write_bytes(safetensors_bytes({"a": {"dtype": "F32", "shape": [2**60] * 200_000, "data_offsets": [0, 40]}}))
    start = time.monotonic()
    expect_error(path, "needs more bytes than the file holds")
    assert time.monotonic() - start < 10


def test_a_directory_named_like_a_file_is_not_read_as_one(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").mkdir()
    with pytest.raises(ParamscopeError):
        read_checkpoint(tmp_path / "model.safetensors")


# ---------------------------------------------------------------------------------------------
# index files
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, match",
    [
        (b"not json", "not valid JSON"),
        (b"[]", "index must be a JSON object"),
        (b"{}", "no weight_map"),
        (b'{"weight_map": []}', "no weight_map"),
        (b'{"weight_map": {"a": 3}}', "weight_map values must be shard file names"),
        (b'\xff{"weight_map": {}}', "not valid UTF-8"),
    ],
)
def test_bad_index(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / "model.safetensors.index.json"
    path.write_bytes(content)
    expect_error(path, match)


def test_index_pointing_at_a_hostile_shard(tmp_path: Path) -> None:
    (tmp_path / "shard.safetensors").write_bytes(safetensors_bytes(VALID_HEADER, header_len=2**62))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "shard.safetensors"}}))
    # The message names the shard that is broken, not the index that led to it.
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(tmp_path / "model.safetensors.index.json")
    assert str(info.value).startswith(f"{tmp_path / 'shard.safetensors'}: header length field says")


# ---------------------------------------------------------------------------------------------
# PyTorch .bin: code execution attempts
# ---------------------------------------------------------------------------------------------


class _System:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Eval:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').close()",))


class _Popen:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (subprocess.Popen, (["touch", str(self.marker)],))


@pytest.mark.parametrize(
    "payload_class, protocol, offender",
    [
        (_System, 2, r"(posix|os|nt)\.system"),
        (_System, 4, r"(posix|os|nt)\.system"),
        (_Eval, 2, r"(__builtin__|builtins)\.eval"),  # protocol 2 spells it the Python 2 way
        (_Popen, 5, r"subprocess\.Popen"),
    ],
)
def test_pickle_that_runs_code_is_refused_and_never_runs(
    tmp_path: Path, payload_class, protocol: int, offender: str
) -> None:
    marker = tmp_path / "PWNED"
    payload = pickle.dumps({"w": payload_class(marker)}, protocol=protocol)
    path = write_torch_zip(tmp_path / "evil.bin", payload, storages={})
    expect_error(path, rf"refusing to load: data\.pkl calls {offender}.*nothing was executed")
    time.sleep(0.05)
    assert not marker.exists()


def test_protocol_0_inst_opcode_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    payload = f"(S'touch {marker}'\nios\nsystem\n.".encode()
    path = write_torch_zip(tmp_path / "inst.bin", payload, storages={})
    expect_error(path, r"calls os\.system")
    assert not marker.exists()


def test_a_refused_global_hidden_after_valid_tensors(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    evil = pickle.dumps(_System(marker), protocol=2)[2:-1]  # the object's opcodes, without PROTO/STOP
    payload = tensor_pickle()[:-2] + s("x") + evil + b"s."  # ...u then SETITEM x=evil
    path = write_torch_zip(tmp_path / "late.bin", payload)
    expect_error(path, "refusing to load")
    assert not marker.exists()


def test_setting_state_on_an_allowed_function_is_refused(tmp_path: Path) -> None:
    # BUILD on the whitelisted rebuild function, trying to overwrite its attributes.
    payload = b"\x80\x02" + g("torch._utils", "_rebuild_tensor_v2") + b"}(" + s("fn") + n(1) + b"ub."
    expect_error(write_torch_zip(tmp_path / "build.bin", payload, storages={}), "set state")
    function = checkpoint_unpickler._ALLOWED_GLOBALS["torch._utils._rebuild_tensor_v2"]
    assert function.fn is checkpoint_unpickler._rebuild_tensor_v2


def test_setting_attributes_on_ordereddict_is_refused(tmp_path: Path) -> None:
    # BUILD with slot state on the OrderedDict class itself: setattr(OrderedDict, "x", 1).
    payload = b"\x80\x02" + g("collections", "OrderedDict") + b"N}(" + s("pwned") + n(1) + b"u\x86b."
    expect_error(write_torch_zip(tmp_path / "od.bin", payload, storages={}))
    assert not hasattr(OrderedDict, "pwned")


def test_huge_memo_index_allocates_nothing(tmp_path: Path) -> None:
    # The C unpickler would size an array to 2**32 entries; the pure-Python one uses a dict.
    payload = b"\x80\x02}r\xff\xff\xff\xff."  # EMPTY_DICT, LONG_BINPUT 4294967295, STOP
    ckpt = read_checkpoint(write_torch_zip(tmp_path / "memo.bin", payload, storages={}))
    assert ckpt.tensors == ()


def test_huge_bytes_length_allocates_nothing(tmp_path: Path) -> None:
    payload = b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b"abc."  # BINBYTES8 claiming 2**62 bytes
    expect_error(write_torch_zip(tmp_path / "bytes.bin", payload, storages={}), "not a valid pickle")


# ---------------------------------------------------------------------------------------------
# PyTorch .bin: malformed tensors and archives
# ---------------------------------------------------------------------------------------------


def test_hand_built_tensor_pickle_is_valid(tmp_path: Path) -> None:
    ckpt = read_checkpoint(write_torch_zip(tmp_path / "ok.bin", tensor_pickle()))
    assert [(t.name, t.dtype, t.shape, t.nbytes) for t in ckpt.tensors] == [("w", "F32", (2, 3), 24)]


@pytest.mark.parametrize(
    "kwargs, storages, match",
    [
        ({}, {"0": b"\0" * 20}, r"claims 6 x F32 \(24 bytes\) but its data entry holds 20 bytes"),
        ({}, {}, "has no data/ entry"),
        ({"size": (3, 3)}, None, "reaches past the end of storage"),
        ({"offset": 1}, None, "reaches past the end of storage"),
        ({"stride": (1, 3), "size": (3, 3)}, None, "reaches past the end of storage"),
        ({"stride": (3, -1)}, None, "stride must be a tuple of non-negative"),
        ({"size": (2, -3)}, None, "size must be a tuple of non-negative"),
        ({"size": (2**62, 2**62), "stride": (0, 0)}, None, "more than 2\\*\\*63 elements"),
        ({"size": (2**64,), "stride": (1,)}, None, "size must be a tuple of non-negative 64-bit"),
        ({"size": (2, 3, 4), "stride": (3, 1)}, None, "size and stride differ in length"),
        ({"offset": -1}, None, "negative or non-integer storage offset"),
        ({"numel": -6}, None, "malformed key or size"),
        ({"storage_type": g("torch._utils", "_rebuild_tensor_v2")}, None, "not a torch storage class"),
        ({"storage_type": g("torch", "QInt8Storage")}, None, r"calls torch\.QInt8Storage"),
    ],
)
def test_malformed_tensor_records(tmp_path: Path, kwargs, storages, match: str) -> None:
    path = write_torch_zip(tmp_path / "bad.bin", tensor_pickle(**kwargs), storages)
    expect_error(path, match)


def test_compressed_storage_is_refused(tmp_path: Path) -> None:
    path = write_torch_zip(tmp_path / "deflated.bin", tensor_pickle(), compress=zipfile.ZIP_DEFLATED)
    expect_error(path, "compressed or claims more bytes than the archive holds")


def test_expanded_stride_zero_view_is_fine(tmp_path: Path) -> None:
    path = write_torch_zip(tmp_path / "expand.bin", tensor_pickle(numel=1, size=(1000,), stride=(0,)), {"0": b"\0" * 4})
    assert read_checkpoint(path).tensor("w").numel == 1000


@pytest.mark.parametrize(
    "payload, match",
    [
        (b"\x80\x02]q\x00.", "holds list, not a state dict"),
        (b"\x80\x02}(" + s("w") + n(3) + b"u.", "entry 'w' is a int, not a tensor"),
        (b"\x80\x02}(" + n(3) + n(3) + b"u.", "key 3 is not a string"),
        (b"\x80\x02}(" + s("w") + n(2**40) + b"u.", "not a tensor"),
        (b"\x80\x02(" + s("storage") + b"tQ.", "unrecognised persistent id"),
        (b"\x80\x02" + s("x") + b"Q.", "unrecognised persistent id"),
        (b"\x80\x02}", "not a valid pickle"),
        (b"", "not a valid pickle"),
        (
            b"\x80\x02" + g("torch._tensor", "_rebuild_from_type_v2") + b"(" + n(1) + n(2) + n(3) + n(4) + b"tR.",
            "unexpected rebuild function",
        ),
        (b"\x80\x02" + g("_codecs", "encode") + b"(" + s("x") + s("rot13") + b"tR.", "other than bytes"),
        (b"\x80\x02" + g("torch", "Tensor") + b")R.", "called like a function"),
        (b"\x80\x02" + g("torch._utils", "_rebuild_parameter") + b"(" + n(1) + b"\x89}tR.", "not a tensor"),
    ],
)
def test_malformed_pickles(tmp_path: Path, payload: bytes, match: str) -> None:
    expect_error(write_torch_zip(tmp_path / "bad.bin", payload, storages={}), match)


def test_zip_without_data_pkl(tmp_path: Path) -> None:
    path = tmp_path / "nopkl.bin"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/other", b"x")
    expect_error(path, "no data.pkl")


def test_zip_with_two_data_pkl(tmp_path: Path) -> None:
    path = tmp_path / "two.bin"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("a/data.pkl", b"\x80\x02}.")
        zf.writestr("b/data.pkl", b"\x80\x02}.")
    expect_error(path, "more than one data.pkl")


def test_zip_bomb_data_pkl_is_not_inflated(tmp_path: Path) -> None:
    path = tmp_path / "bomb.bin"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("archive/data.pkl", "w", force_zip64=True) as out:
            chunk = b"\0" * (1 << 20)
            for _ in range(65):
                out.write(chunk)
    assert path.stat().st_size < 1 << 20
    expect_error(path, "too large to be a state dict")


def test_every_truncation_of_a_torch_save_file(tmp_path: Path) -> None:
    import torch
    source = tmp_path / "full.bin"
    torch.save({"w": torch.zeros(2, 3), "b": torch.zeros(3, dtype=torch.float16)}, source)
    full = source.read_bytes()
    assert len(read_checkpoint(source).tensors) == 2
    path = tmp_path / "cut.bin"
    for length in range(len(full)):
        path.write_bytes(full[:length])
        expect_error(path)


def test_legacy_non_zip_pickle_is_never_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    path = tmp_path / "legacy.bin"
    path.write_bytes(pickle.dumps(_System(marker), protocol=2))
    expect_error(path, "legacy")
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# fuzzing
# ---------------------------------------------------------------------------------------------

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(data=st.binary(max_size=600), suffix=st.sampled_from([".safetensors", ".bin", ".pt", "", ".weights"]))
def test_random_bytes(fuzz_dir: Path, data: bytes, suffix: str) -> None:
    path = fuzz_dir / f"random{suffix}"
    path.write_bytes(data)
    read_or_checkpoint_error(path)


@FUZZ
@given(header=st.binary(max_size=400), data=st.binary(max_size=64))
def test_random_header_bytes_with_a_consistent_length(fuzz_dir: Path, header: bytes, data: bytes) -> None:
    path = fuzz_dir / "header.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    read_or_checkpoint_error(path)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
ENTRY = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["F32", "F16", "BF16", "I64", "U8", "F4", "F6_E2M3", "BOOL", "Q8", ""]) | JSON,
        "shape": st.lists(st.integers(min_value=-2, max_value=6), max_size=3) | JSON,
        "data_offsets": st.lists(st.integers(min_value=-4, max_value=70), min_size=2, max_size=2) | JSON,
    }
)


@FUZZ
@given(
    header=st.dictionaries(st.text(max_size=6), ENTRY | JSON, max_size=5),
    data_size=st.integers(min_value=0, max_value=64),
)
def test_structured_header_fuzz(fuzz_dir: Path, header: dict, data_size: int) -> None:
    path = fuzz_dir / "structured.safetensors"
    path.write_bytes(safetensors_bytes(header, b"\0" * data_size))
    read_or_checkpoint_error(path)


@FUZZ
@given(data=st.data())
def test_mutated_valid_safetensors(fuzz_dir: Path, data) -> None:
    raw = bytearray(safetensors_bytes(VALID_HEADER))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        raw[data.draw(st.integers(min_value=0, max_value=len(raw) - 1))] = data.draw(st.integers(0, 255))
    path = fuzz_dir / "mutated.safetensors"
    path.write_bytes(bytes(raw))
    read_or_checkpoint_error(path)


@pytest.fixture(scope="module")
def torch_pickle() -> bytes:
    import torch
    buffer = io.BytesIO()
    state = {
        "w": torch.zeros(2, 3),
        "h": torch.zeros(4, dtype=torch.float16),
        "p": torch.nn.Parameter(torch.zeros(2)),
        "f8": torch.zeros(3, dtype=torch.float8_e5m2),
    }
    torch.save(state, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as zf:
        name = next(n for n in zf.namelist() if n.endswith("/data.pkl"))
        return zf.read(name)


@FUZZ
@given(data=st.data())
def test_mutated_torch_pickle(fuzz_dir: Path, torch_pickle: bytes, data) -> None:
    raw = bytearray(torch_pickle)
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        raw[data.draw(st.integers(min_value=0, max_value=len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(min_value=0, max_value=len(raw)))
    storages = {"0": b"\0" * 24, "1": b"\0" * 8, "2": b"\0" * 8, "3": b"\0" * 3}
    path = write_torch_zip(fuzz_dir / "mutated.bin", bytes(raw[:cut]) + bytes(raw[cut:]), storages)
    read_or_checkpoint_error(path)


@FUZZ
@given(payload=st.binary(max_size=300))
def test_random_pickle_bytes(fuzz_dir: Path, payload: bytes) -> None:
    path = write_torch_zip(fuzz_dir / "random_pickle.bin", payload, {"0": b"\0" * 24})
    read_or_checkpoint_error(path)
