"""The restricted unpickler that reads a zip-format PyTorch checkpoint (.bin) without running it: the state dict's
tensors as (dtype, shape) records, checked against the storages the zip holds.

A .bin is a pickle, and a pickle is a program; it is never handed to a normal unpickler. This one is the
pure-Python pickle VM with every way out closed: `find_class` knows only the handful of globals that rebuild
tensors (anything else is refused, naming the global, before it runs), each of those rebuilds nothing but an inert
record, no record accepts state, and `persistent_load` accepts only torch storages whose size the zip's own
bookkeeping proves. Nothing here imports torch.

A pickle is also a program that may run long or allocate much: the work is bounded before the result is looked at.
data.pkl is at most MAX_PICKLE_BYTES, the VM runs at most MAX_PICKLE_OPS opcodes (a state dict needs 30 per tensor),
none of the opcodes that build sets, byte arrays or out-of-band buffers (a state dict has none, and each costs
hundreds of bytes per byte of pickle) runs, and the zip lists at most MAX_ZIP_ENTRIES files. So a hostile file is
refused within about a second and 300 MB, naming the bound; the cyclic garbage collector is paused while the VM
runs (it rescans every object the pickle made, again and again, for nothing: none of them is garbage).

The bounds are what cap a .bin at about 50,000 tensors, where a safetensors header may list 1,000,000
(tensors.MAX_TENSORS). They cannot be raised far without giving up the refusal's bound: the VM that reads a pickle
without running it costs about a microsecond an opcode, about 35 µs and 2 KB a tensor (torch.save of 60,000 tiny
tensors: 1,800,131 opcodes, 2 s; of 1,000,000: 50 s and 2.1 GB, on a 2-core machine), and a hostile file that looks
like a state dict until its last opcode costs as much as the state dict it imitates. Letting each storage the zip
proves buy a tensor's opcodes keeps a pickle without storages at the bound above, but a file padded with empty
storages (about 120 bytes of zip each) then buys that work: at 2,000,000 opcodes in all, 2.1 s on a loaded machine.
"""

from __future__ import annotations

import io
import math
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping

from ..errors import CheckpointError, SourceError
from ..errors import short_repr as _q
from ..safe_io import gc_paused, short_error
from .tensors import DTYPE_BITS, CheckpointTensor, bounded_prod

# Bounds on a .bin's pickle, each above a real state dict of about 50,000 tensors (about 133 bytes, 30 opcodes and
# one zip entry a tensor) and low enough that a file built to exhaust them is refused within about a second and
# 300 MB (the pure-Python VM runs about a million opcodes a second on a 2-core machine, and no opcode allowed makes
# more than about 150 bytes).
MAX_PICKLE_BYTES = 32 * 1024 * 1024
MAX_PICKLE_OPS = 1_500_000  # a state dict of about 50,000 tensors; transformers' .bin shards hold a few thousand
MAX_ZIP_ENTRIES = 50_000  # one data file per storage, and a handful more
_OPS_PER_TENSOR = 30  # torch.save of 60,000 tensors runs 1,800,131
# Why a .bin holds fewer tensors than a safetensors file may, for the refusals that name those bounds
_WHY_BOUNDED = ("a .bin's pickle is read without running it, by a VM that costs about 35 µs a tensor, and the bound "
                "keeps any .bin within about 2 s and 300 MB; as safetensors a checkpoint audits up to 1,000,000 tensors")

# torch's legacy storage classes: the dtype of the storage a tensor lives in.
_TORCH_STORAGE_DTYPES = {
    "DoubleStorage": "F64",
    "FloatStorage": "F32",
    "HalfStorage": "F16",
    "BFloat16Storage": "BF16",
    "LongStorage": "I64",
    "IntStorage": "I32",
    "ShortStorage": "I16",
    "CharStorage": "I8",
    "ByteStorage": "U8",
    "BoolStorage": "BOOL",
    "ComplexFloatStorage": "C64",
    "ComplexDoubleStorage": "C128",
    # Newer dtypes are saved as raw bytes plus a torch.<dtype> global (_rebuild_tensor_v3).
    "UntypedStorage": "U8",
}
_TORCH_DTYPES = {
    "float64": "F64",
    "double": "F64",
    "float32": "F32",
    "float": "F32",
    "float16": "F16",
    "half": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "long": "I64",
    "int32": "I32",
    "int": "I32",
    "int16": "I16",
    "short": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
    "complex64": "C64",
    "cfloat": "C64",
    "complex128": "C128",
    "cdouble": "C128",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
    # Two 4-bit values per byte; reported as safetensors does: F4 with the last dimension doubled.
    "float4_e2m1fn_x2": "F4_X2",
}


class _Malformed(Exception):
    """Raised inside the unpickler; becomes a CheckpointError naming the file."""


class _Refused(Exception):
    """A global outside the allow-list: the pickle wants to run something."""


class _TooMuchWork(Exception):
    """The pickle runs more opcodes than MAX_PICKLE_OPS."""


class _Inert:
    # The pickle BUILD opcode calls __setstate__ when present, otherwise writes attributes. Every
    # object the pickle can reach through a global refuses, so a file cannot rewrite our objects.
    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise _Malformed("the pickle tries to set state on a tensor-rebuilding object")


class _NamedDtype(_Inert):
    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype: str) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "dtype", dtype)


class _StorageType(_NamedDtype):  # torch.FloatStorage and kin: what a storage record names
    __slots__ = ()


class _Dtype(_NamedDtype):  # torch.float32 and kin: what a v3 tensor record names; never a storage type
    __slots__ = ()


class _Storage(_Inert):
    """A storage the pickle refers to: its data file in the zip, dtype and element count."""

    __slots__ = ("key", "dtype", "numel")

    def __init__(self, key: str, dtype: str, numel: int) -> None:
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "numel", numel)


class _TensorRecord(_Inert):
    __slots__ = ("storage", "dtype", "shape")

    def __init__(self, storage: _Storage, dtype: str, shape: tuple[int, ...]) -> None:
        object.__setattr__(self, "storage", storage)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", shape)


class _Function(_Inert):
    __slots__ = ("qualname", "fn")

    def __init__(self, qualname: str, fn: Any) -> None:
        object.__setattr__(self, "qualname", qualname)
        object.__setattr__(self, "fn", fn)

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def _is_int(value: Any) -> bool:
    # bool is an int subclass; a pickled True must not pass as a size or an offset.
    return isinstance(value, int) and not isinstance(value, bool)


def _int_tuple(value: Any, what: str) -> tuple[int, ...]:
    # torch sizes and strides are int64; anything larger is an attempt at costly arithmetic.
    if not isinstance(value, (tuple, list)) or not all(_is_int(v) and 0 <= v < 2**63 for v in value):
        raise _Malformed(f"{what} must be a tuple of non-negative 64-bit integers")
    return tuple(value)


def _rebuild(storage: Any, offset: Any, size: Any, stride: Any, dtype: str) -> _TensorRecord:
    if not isinstance(storage, _Storage):
        raise _Malformed("a tensor is rebuilt from something that is not a storage")
    if not _is_int(offset) or not 0 <= offset < 2**63:
        raise _Malformed("a tensor has a negative or non-integer storage offset")
    shape = _int_tuple(size, "tensor size")
    strides = _int_tuple(stride, "tensor stride")
    if len(shape) != len(strides):
        raise _Malformed("a tensor's size and stride differ in length")
    # Not bounded by the storage size: a stride-0 (expanded) view legitimately has more elements.
    numel = bounded_prod(shape, 2**63 - 1)
    if numel is None:
        raise _Malformed(f"a tensor of {len(shape)} dimensions has more than 2**63 elements")
    if numel:
        # The last element the view touches must lie inside the storage the zip actually holds.
        # (Storage and view may differ in dtype: _rebuild_tensor_v3 views raw bytes.)
        last = offset + sum((d - 1) * s for d, s in zip(shape, strides))
        if (last + 1) * DTYPE_BITS[dtype] > storage.numel * DTYPE_BITS[storage.dtype]:
            raise _Malformed(f"a tensor reaches past the end of storage {_q(storage.key)}")
    return _TensorRecord(storage, dtype, shape)


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    if not isinstance(storage, _Storage):
        raise _Malformed("a tensor is rebuilt from something that is not a storage")
    return _rebuild(storage, offset, size, stride, storage.dtype)


def _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype, metadata=None):
    if not isinstance(dtype, _Dtype):
        raise _Malformed("_rebuild_tensor_v3 without a torch dtype")
    if dtype.dtype == "F4_X2":
        record = _rebuild(storage, offset, size, stride, "U8")
        if not record.shape:
            raise _Malformed("a float4_e2m1fn_x2 scalar cannot be described as F4")
        return _TensorRecord(record.storage, "F4", record.shape[:-1] + (record.shape[-1] * 2,))
    return _rebuild(storage, offset, size, stride, dtype.dtype)


def _rebuild_parameter(data, requires_grad=False, hooks=None, state=None):
    if not isinstance(data, _TensorRecord):
        raise _Malformed("a Parameter wraps something that is not a tensor")
    return data


def _rebuild_from_type_v2(func, new_type, args, state):
    if not (isinstance(func, _Function) and func.fn in (_rebuild_tensor_v2, _rebuild_tensor_v3)):
        raise _Malformed("_rebuild_from_type_v2 with an unexpected rebuild function")
    if not (isinstance(new_type, _Function) and new_type.qualname in _TENSOR_TYPES):
        raise _Malformed("_rebuild_from_type_v2 with an unexpected tensor type")
    if not isinstance(args, tuple):
        raise _Malformed("_rebuild_from_type_v2 arguments are not a tuple")
    return func(*args)


def _codecs_encode(text, encoding="latin1"):
    # Protocol-2 pickles spell bytes objects as _codecs.encode(str, "latin1").
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Malformed("_codecs.encode used for something other than bytes")
    return text.encode("latin1")


def _not_callable(*_args):
    raise _Malformed("a tensor type marker is called like a function")


_TENSOR_TYPES = ("torch.Tensor", "torch.nn.parameter.Parameter")


def _allowed_globals() -> dict[str, Any]:
    allowed: dict[str, Any] = {
        "torch._utils._rebuild_tensor_v2": _Function("torch._utils._rebuild_tensor_v2", _rebuild_tensor_v2),
        "torch._utils._rebuild_tensor_v3": _Function("torch._utils._rebuild_tensor_v3", _rebuild_tensor_v3),
        "torch._utils._rebuild_parameter": _Function("torch._utils._rebuild_parameter", _rebuild_parameter),
        "torch._utils._rebuild_parameter_with_state": _Function(
            "torch._utils._rebuild_parameter_with_state", _rebuild_parameter
        ),
        "torch._tensor._rebuild_from_type_v2": _Function(
            "torch._tensor._rebuild_from_type_v2", _rebuild_from_type_v2
        ),
        "torch.Size": _Function("torch.Size", tuple),
        "_codecs.encode": _Function("_codecs.encode", _codecs_encode),
        # The built-in class itself: calling it or setting state on it cannot reach our code.
        "collections.OrderedDict": OrderedDict,
    }
    for name in _TENSOR_TYPES:
        allowed[name] = _Function(name, _not_callable)
    for name, dtype in _TORCH_STORAGE_DTYPES.items():
        allowed[f"torch.{name}"] = _StorageType(name, dtype)
    allowed["torch.storage.UntypedStorage"] = allowed["torch.UntypedStorage"]
    for name, dtype in _TORCH_DTYPES.items():
        allowed[f"torch.{name}"] = _Dtype(name, dtype)
    return allowed


_ALLOWED_GLOBALS = _allowed_globals()


def _counted(handler: Any) -> Any:
    """`handler` (one opcode of the pure-Python VM), run only while the pickle's opcode budget lasts."""

    def step(self: "_RestrictedUnpickler") -> None:
        self.budget -= 1
        if self.budget < 0:
            raise _TooMuchWork
        handler(self)

    return step


def _refused_opcode(name: str) -> Any:
    def refuse(self: "_RestrictedUnpickler") -> None:
        raise _Malformed(f"the pickle uses opcode {name}, which no state dict needs")

    return refuse


# Opcodes torch.save never writes, refused before they run: sets and frozensets (200+ bytes for each byte of
# pickle), byte arrays and out-of-band buffers (protocol 5), and the copyreg extension registry.
_REFUSED_OPCODES = ("EMPTY_SET", "ADDITEMS", "FROZENSET", "BYTEARRAY8", "NEXT_BUFFER", "READONLY_BUFFER", "EXT1",
                    "EXT2", "EXT4")
_DISPATCH = {code: _counted(handler)
             for code, handler in pickle._Unpickler.dispatch.items()}  # type: ignore[attr-defined]
for _name in _REFUSED_OPCODES:
    _code = getattr(pickle, _name, None)
    if isinstance(_code, bytes):
        _DISPATCH[_code[0]] = _refused_opcode(_name)


class _RestrictedUnpickler(pickle._Unpickler):  # type: ignore[name-defined]
    """The pure-Python unpickler with every way out of the pickle VM closed, on an opcode budget.

    The pure-Python class is used on purpose: its memo is a dict, so a hostile memo index cannot
    make it allocate (the C unpickler sizes an array by the largest index it sees).
    """

    dispatch = _DISPATCH

    def __init__(
        self, data: bytes, zip_entries: Mapping[str, zipfile.ZipInfo], prefix: str, archive_size: int
    ) -> None:
        super().__init__(io.BytesIO(data))
        self._entries = zip_entries
        self._prefix = prefix
        self._archive_size = archive_size
        self.storages: dict[str, _Storage] = {}
        self.budget = MAX_PICKLE_OPS

    def find_class(self, module: str, name: str) -> Any:
        qualname = f"{module}.{name}"
        try:
            return _ALLOWED_GLOBALS[qualname]
        except KeyError:
            raise _Refused(qualname) from None

    def persistent_load(self, pid: Any) -> _Storage:
        # torch writes ("storage", storage type, key, location, element count) for each storage.
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _Malformed("unrecognised persistent id (only torch storages are supported)")
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, _StorageType):
            raise _Malformed("a storage's type is not a torch storage class")
        if not isinstance(key, str) or not _is_int(numel) or not 0 <= numel < 2**63:
            raise _Malformed("a storage reference has a malformed key or size")
        existing = self.storages.get(key)
        if existing is not None:
            if (existing.dtype, existing.numel) != (storage_type.dtype, numel):
                raise _Malformed(f"storage {_q(key)} is described two different ways")
            return existing
        entry = self._entries.get(f"{self._prefix}data/{key}")
        if entry is None:
            raise _Malformed(f"storage {_q(key)} has no data/ entry in the zip")
        expected = numel * DTYPE_BITS[storage_type.dtype] // 8
        # torch stores storages uncompressed; then the zip's own bookkeeping must place the bytes
        # inside the file, which proves the size without reading the data.
        stored = entry.compress_type == zipfile.ZIP_STORED and entry.compress_size == entry.file_size
        if not stored or entry.header_offset + entry.compress_size > self._archive_size:
            raise _Malformed(f"data/{_q(key)} is compressed or claims more bytes than the archive holds")
        if entry.file_size != expected:
            raise _Malformed(
                f"storage {_q(key)} claims {numel} x {storage_type.dtype} ({expected} bytes) "
                f"but its data entry holds {entry.file_size} bytes"
            )
        storage = _Storage(key, storage_type.dtype, numel)
        self.storages[key] = storage
        return storage


def _check_entry_count(path: Path) -> None:
    """Refuse a zip listing more than MAX_ZIP_ENTRIES files from its end record, before zipfile reads the central
    directory into a ZipInfo (some 500 bytes) per file."""
    try:
        with open(path, "rb") as handle:
            end = zipfile._EndRecData(handle)  # type: ignore[attr-defined]  # stable since Python 2, zip64 aware
    except (OSError, AttributeError, zipfile.BadZipFile):
        return  # unreadable or another Python: zipfile reports it, or reads it, as before
    if end and end[4] > MAX_ZIP_ENTRIES:  # _ECD_ENTRIES_TOTAL
        raise CheckpointError(f"{path}: the zip lists {end[4]:,} files, more than the {MAX_ZIP_ENTRIES:,} paramscope "
                              f"reads (a PyTorch checkpoint holds one per storage, so about as many tensors): "
                              f"{_WHY_BOUNDED}")


def read_torch_zip(path: Path) -> tuple[list[CheckpointTensor], int]:
    """The tensors of a zip-format torch.save file, and the bytes of its distinct storages."""
    try:
        _check_entry_count(path)
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            pickles = [i for i in infos if i.filename.endswith("data.pkl") and i.filename.count("/") <= 1]
            pickles = [i for i in pickles if i.filename.rsplit("/", 1)[-1] == "data.pkl"]
            if len(pickles) != 1:
                raise CheckpointError(
                    f"{path}: a zip file but not a PyTorch checkpoint "
                    f"({'no' if not pickles else 'more than one'} data.pkl)"
                )
            entry = pickles[0]
            if entry.file_size > MAX_PICKLE_BYTES:
                raise CheckpointError(f"{path}: data.pkl is {entry.file_size:,} bytes, too large to be a state dict "
                                      f"(paramscope reads at most {MAX_PICKLE_BYTES:,}; a state dict needs about 133 "
                                      "a tensor)")
            with zf.open(entry) as handle:
                # Read at most the limit: a compressed entry may lie about its size.
                raw = handle.read(MAX_PICKLE_BYTES + 1)
    except CheckpointError:
        raise
    except OSError as err:
        raise SourceError(f"{path}: cannot read: {err.strerror or err}") from None
    except Exception as err:  # zipfile reports damage through many exception types
        raise CheckpointError(f"{path}: damaged zip archive: {short_error(err)}") from None
    if len(raw) > MAX_PICKLE_BYTES:
        raise CheckpointError(f"{path}: data.pkl is larger than {MAX_PICKLE_BYTES:,} bytes, too large to be a state "
                              "dict (its entry claimed less)")

    prefix = entry.filename[: -len("data.pkl")]
    archive_size = path.stat().st_size
    unpickler = _RestrictedUnpickler(raw, {i.filename: i for i in infos}, prefix, archive_size)
    try:
        with gc_paused():  # every object the VM makes stays reachable until it returns: nothing to collect
            root = unpickler.load()
    except _TooMuchWork:
        raise CheckpointError(
            f"{path}: refusing to load: data.pkl runs more than {MAX_PICKLE_OPS:,} pickle opcodes, the most "
            f"paramscope runs for one file (a state dict needs {_OPS_PER_TENSOR} a tensor: about "
            f"{MAX_PICKLE_OPS // _OPS_PER_TENSOR:,} tensors); nothing was executed: {_WHY_BOUNDED}"
        ) from None
    except _Refused as err:
        raise CheckpointError(
            f"{path}: refusing to load: data.pkl calls {err.args[0]}, which is not a tensor-rebuilding "
            "function (loading this file with torch.load could run code); nothing was executed"
        ) from None
    except _Malformed as err:
        raise CheckpointError(f"{path}: malformed PyTorch checkpoint: {err.args[0]}") from None
    except Exception as err:  # any failure of the pickle VM on hostile bytes, MemoryError included
        raise CheckpointError(f"{path}: data.pkl is not a valid pickle: {type(err).__name__}: "
                              f"{short_error(err)}") from None

    if not isinstance(root, dict):
        raise CheckpointError(f"{path}: the pickle holds {type(root).__name__}, not a state dict")
    tensors: list[CheckpointTensor] = []
    for name, value in root.items():
        if not isinstance(name, str):
            raise CheckpointError(f"{path}: state dict key {_q(name)} is not a string")
        if not isinstance(value, _TensorRecord):
            # Training scripts sometimes save epoch counters etc. alongside; transformers would
            # reject those, and there is no tensor to describe.
            raise CheckpointError(f"{path}: state dict entry {_q(name)} is a {type(value).__name__}, not a tensor")
        numel = math.prod(value.shape)
        tensors.append(
            CheckpointTensor(
                name=name,
                dtype=value.dtype,
                shape=value.shape,
                numel=numel,
                nbytes=numel * DTYPE_BITS[value.dtype] // 8,
                file=str(path),
            )
        )
    storage_bytes = sum(st.numel * DTYPE_BITS[st.dtype] // 8 for st in unpickler.storages.values())
    return tensors, storage_bytes

