"""Audit a real checkpoint by reading its headers only, then reconcile it with a model.

Two jobs, both pure functions over frozen dataclasses:

* `read_checkpoint(path)` lists every tensor (name, dtype, shape, bytes) of a safetensors file, a
  sharded safetensors checkpoint, or a zip-format PyTorch ``.bin``, without reading tensor data and
  without allocating anything whose size comes from the file before that size has been checked
  against the file itself. A ``.bin`` is a pickle; it is never handed to a normal unpickler. A
  restricted one only knows the handful of globals that rebuild tensors, and those rebuild nothing
  but (dtype, shape) records.
* `reconcile(checkpoint, expected_params, ...)` maps checkpoint keys onto a model's parameter names
  the way transformers 5 does when loading (legacy renames, adding or stripping the base-model
  prefix, tied aliases) and says what would be missing, unused, mismatched, or not a parameter.

Anything wrong with a file raises CheckpointError naming the file and the problem; a path that does
not exist or cannot be opened raises SourceError. Nothing here imports torch.

Limits, on purpose:
* Only transformers' model-independent "legacy" renames are mirrored. Model-specific conversions
  (transformers 5 fuses e.g. per-expert MoE weights while loading) are not, so such checkpoints
  show those tensors as unexpected and the fused parameters as missing.
* Quantised layouts are recognised by name and shape only (bitsandbytes, GPTQ/AWQ, fp8 scales,
  compressed-tensors); counts that live in tensor data (bnb quant_state) are not read.
* The legacy (non-zip) torch.save format is refused: it cannot be read without unpickling it.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import math
import os
import pickle
import re
import struct
import zipfile
from collections import OrderedDict
from functools import cached_property
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from .errors import CheckpointError, SourceError
from .frozen import FrozenDict, freeze, freeze_fields, thaw
from .errors import short_repr as _q
from .safe_io import check_inside, open_regular, read_regular

__all__ = [
    "Audit",
    "Checkpoint",
    "CheckpointTensor",
    "Finding",
    "Mismatch",
    "SAFETENSORS_DTYPE_BITS",
    "read_checkpoint",
    "reconcile",
]

# Bits per element of every dtype the safetensors format defines (safetensors 0.8 knows these 22).
# Sub-byte types (F4, F6_*) are why sizes are computed in bits: a tensor must still fill whole bytes.
SAFETENSORS_DTYPE_BITS: Mapping[str, int] = MappingProxyType({
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
})
# torch can store one dtype safetensors cannot; it only ever appears in .bin files.
_DTYPE_BITS: Mapping[str, int] = {**SAFETENSORS_DTYPE_BITS, "C128": 128}

# The safetensors library refuses headers above this size; so do we, before reading one.
_MAX_HEADER_BYTES = 100_000_000
# The safetensors library re-reads headers of up to this many tensors (a real file holds a few thousand); past it
# our own checks stand alone, so that a legal 100 MB header costs seconds, not a minute.
_LIBRARY_CHECK_MAX_TENSORS = 100_000
# An index.json or a data.pkl this large is not a real checkpoint (a 100k-tensor model needs a few MB).
_MAX_INDEX_BYTES = 64 * 1024 * 1024
_MAX_PICKLE_BYTES = 64 * 1024 * 1024

# In a directory, the first of these that exists is the checkpoint (transformers' own preference).
_DIRECTORY_CANDIDATES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


# ---------------------------------------------------------------------------------------------
# Data model
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointTensor:
    """One tensor as its file describes it. No data is ever read.

    `numel` and `nbytes` are what is stored. For a packed quantised tensor (`role == "packed"`)
    `logical_numel` is how many weight values it holds, or None when the header alone cannot tell;
    for every other tensor it equals `numel`. `role == "quant_aux"` marks scales, zero points and
    quantisation state: stored tensors that are not model parameters.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    numel: int
    nbytes: int
    file: str
    role: str = "tensor"  # tensor | packed | quant_aux
    logical_numel: int | None = None
    packing: str = ""  # "" | bnb-4bit | bnb-8bit | gptq | fp8 | compressed-tensors
    note: str = ""

    def __post_init__(self) -> None:
        if self.role != "packed" and self.logical_numel is None:
            object.__setattr__(self, "logical_numel", self.numel)


@dataclass(frozen=True)
class Checkpoint:
    """Every tensor of a checkpoint (all shards), sorted by name."""

    path: str
    format: str  # safetensors | safetensors-sharded | pytorch-bin | pytorch-bin-sharded
    tensors: tuple[CheckpointTensor, ...]
    metadata: FrozenDict[str, Any] = field(default_factory=FrozenDict, compare=False)

    def __post_init__(self) -> None:
        freeze_fields(self, "metadata")

    @cached_property  # a checkpoint may hold a million tensors; each figure is summed once
    def elements(self) -> int:
        """Stored elements over all tensors (packed tensors count their storage elements)."""
        return sum(t.numel for t in self.tensors)

    @cached_property
    def nbytes(self) -> int:
        """Bytes of tensor data the headers describe (numel x itemsize, summed)."""
        return sum(t.nbytes for t in self.tensors)

    @cached_property
    def by_dtype(self) -> FrozenDict[str, FrozenDict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for t in self.tensors:
            row = out.setdefault(t.dtype, {"tensors": 0, "elements": 0, "bytes": 0})
            row["tensors"] += 1
            row["elements"] += t.numel
            row["bytes"] += t.nbytes
        return freeze({k: out[k] for k in sorted(out)})

    @cached_property
    def files(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for t in self.tensors:
            seen.setdefault(t.file, None)
        return tuple(seen)

    def tensor(self, name: str) -> CheckpointTensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "tensors": len(self.tensors),
            "elements": self.elements,
            "bytes": self.nbytes,
            "by_dtype": thaw(self.by_dtype),
            "files": list(self.files),
            "metadata": thaw(self.metadata),
        }


@dataclass(frozen=True, slots=True)  # slots: a 100 MB header can list a million unexpected tensors
class Finding:
    """A name and why it is listed: a missing parameter, an unused tensor, or a non-parameter."""

    name: str
    reason: str
    shape: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "reason": self.reason}


@dataclass(frozen=True)
class Mismatch:
    name: str  # the model's name
    checkpoint_key: str
    checkpoint_shape: tuple[int, ...]
    model_shape: tuple[int, ...]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "checkpoint_key": self.checkpoint_key,
            "checkpoint_shape": list(self.checkpoint_shape),
            "model_shape": list(self.model_shape),
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Audit:
    """What loading `checkpoint` into the model would do, parameter by parameter."""

    format: str
    matched: tuple[str, ...]  # model names filled from the checkpoint (tied aliases included)
    missing: tuple[Finding, ...]  # model parameters absent from the checkpoint
    unexpected: tuple[Finding, ...]  # checkpoint tensors that map to nothing
    non_parameters: tuple[Finding, ...]  # buffers, quantisation scales/state
    mismatched: tuple[Mismatch, ...]
    renamed: tuple[tuple[str, str], ...]  # (checkpoint key, model name) where the two differ
    parameters: int  # unique parameter elements the checkpoint provides
    elements: int  # every stored element in the checkpoint
    bytes: int
    by_dtype: FrozenDict[str, FrozenDict[str, int]]

    def __post_init__(self) -> None:
        freeze_fields(self, "by_dtype")

    @property
    def complete(self) -> bool:
        """True when every model parameter is loaded from the checkpoint with the right shape."""
        return not self.missing and not self.mismatched

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "parameters": self.parameters,
            "elements": self.elements,
            "bytes": self.bytes,
            "matched_count": len(self.matched),
            "missing": [f.to_dict() for f in self.missing],
            "unexpected": [f.to_dict() for f in self.unexpected],
            "non_parameters": [f.to_dict() for f in self.non_parameters],
            "mismatched": [m.to_dict() for m in self.mismatched],
            "renamed": dict(self.renamed),
            "by_dtype": {k: dict(v) for k, v in self.by_dtype.items()},
        }


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def read_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """List the tensors of a checkpoint file, index, or directory from headers alone."""
    p = Path(os.fspath(path))
    if not p.exists():
        raise SourceError(f"{p}: no such file or directory")
    if p.is_dir():
        return _read_directory(p)
    if p.name.endswith(".index.json"):
        return _read_index(p)
    if _is_zip(p):
        tensors, storage_bytes = _read_torch_zip(p)
        # Tensors can share a storage (tied weights), so the file may hold fewer bytes than they sum to.
        return _finish(p, "pytorch-bin", tensors, {"storage_bytes": storage_bytes})
    if p.suffix in (".bin", ".pt", ".pth", ".ckpt"):
        raise CheckpointError(
            f"{p}: not a zip-format PyTorch checkpoint; the legacy torch.save format is not supported "
            "(it cannot be read without unpickling it), convert to safetensors"
        )
    tensors, metadata = _read_safetensors(p)
    return _finish(p, "safetensors", tensors, {"safetensors_metadata": metadata} if metadata else {})


def _finish(path: Path, fmt: str, tensors: list[CheckpointTensor], metadata: dict[str, Any]) -> Checkpoint:
    tensors = _classify_quantisation(sorted(tensors, key=lambda t: t.name))
    return Checkpoint(path=str(path), format=fmt, tensors=tuple(tensors), metadata=metadata)


def _read_directory(directory: Path) -> Checkpoint:
    for name in _DIRECTORY_CANDIDATES:
        candidate = directory / name
        if candidate.exists():
            check_inside(candidate, directory, error=CheckpointError, what="checkpoint folder")
            return read_checkpoint(candidate)
    # Other names happen (adapter_model.safetensors, diffusion_pytorch_model.safetensors): accept one
    # unambiguous file rather than guess between several.
    for pattern in ("*.safetensors.index.json", "*.safetensors", "*.bin.index.json"):
        found = sorted(directory.glob(pattern))
        if len(found) == 1:
            check_inside(found[0], directory, error=CheckpointError, what="checkpoint folder")
            return read_checkpoint(found[0])
        if len(found) > 1:
            names = ", ".join(f.name for f in found)
            raise SourceError(f"{directory}: several checkpoints ({names}); name the file to audit")
    wanted = ", ".join(_DIRECTORY_CANDIDATES)
    raise SourceError(f"{directory}: no checkpoint found (looked for {wanted})")


def _is_zip(path: Path) -> bool:
    with open_regular(path, what="checkpoint file") as f:
        magic = f.read(4)
    return magic in (b"PK\x03\x04", b"PK\x05\x06")


# ---------------------------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------------------------


def _read_safetensors(path: Path) -> tuple[list[CheckpointTensor], dict[str, str]]:
    header, data_size = _read_safetensors_header(path)
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    elif not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{path}: __metadata__ must map strings to strings")

    tensors: list[CheckpointTensor] = []
    spans: list[tuple[int, int, str]] = []
    sizes: dict[tuple[str, tuple[int, ...]], tuple[int, int]] = {}  # (dtype, shape) → (numel, bytes), checked once
    with _gc_paused():
        while header:  # popped as parsed: a million-entry header is never held twice
            name, entry = header.popitem()
            tensor, begin, end = _parse_entry(path, name, entry, data_size, sizes)
            tensors.append(tensor)
            spans.append((begin, end, name))
    tensors.reverse()  # back to the header's order

    # The format has no holes and no sharing: sorted by offset, each tensor starts where the
    # previous one ended and the last one ends at the end of the file. The safetensors library
    # refuses anything else, so a file that breaks this would not load.
    spans.sort()
    cursor, previous = 0, None
    for begin, end, name in spans:
        if begin < cursor:
            raise CheckpointError(
                f"{path}: tensor {_q(name)} (bytes {begin}..{end}) overlaps tensor {_q(previous)} (ends at {cursor})"
            )
        if begin > cursor:
            raise CheckpointError(
                f"{path}: {begin - cursor} unaccounted bytes before tensor {_q(name)} "
                f"(offset {begin}, expected {cursor})"
            )
        cursor, previous = end, name
    if cursor != data_size:
        raise CheckpointError(
            f"{path}: tensor data ends at byte {cursor} but the data area holds {data_size} bytes "
            "(trailing bytes after the last tensor)"
        )
    if len(tensors) <= _LIBRARY_CHECK_MAX_TENSORS:
        _cross_check_with_library(path, {t.name for t in tensors})
    return tensors, metadata


def _read_safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """Return the decoded header and the size of the data area that follows it."""
    with open_regular(path, what="checkpoint file") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise CheckpointError(
                f"{path}: not a safetensors file: {size} bytes, shorter than the 8-byte header length"
            )
        (header_len,) = struct.unpack("<Q", f.read(8))
        # Check the claimed length against reality before reading (allocating) that many bytes.
        if header_len > size - 8:
            raise CheckpointError(
                f"{path}: header length field says {header_len} bytes but only {size - 8} bytes follow it "
                "(truncated, or not a safetensors file)"
            )
        if header_len > _MAX_HEADER_BYTES:
            raise CheckpointError(
                f"{path}: header length {header_len} bytes exceeds the {_MAX_HEADER_BYTES}-byte safetensors limit"
            )
        raw = f.read(header_len)
    if len(raw) != header_len:
        raise CheckpointError(f"{path}: file shrank while reading its header")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{path}: header is not valid UTF-8 (byte {err.start})") from None
    del raw  # a header may be 100 MB: hold it once, not twice, while it is parsed
    header = _decode_header(path, text)
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header must be a JSON object, got {_json_type(header)}")
    return header, size - 8 - header_len


def _parse_entry(path: Path, name: str, entry: Any, data_size: int,
                 sizes: dict[tuple[str, tuple[int, ...]], tuple[int, int]]) -> tuple[CheckpointTensor, int, int]:
    # Runs once per tensor of headers up to 100 MB (a million entries): exact type tests, no generator per entry.
    if type(entry) is not dict:
        raise CheckpointError(f"{path}: tensor {_q(name)}: entry must be a JSON object, got {_json_type(entry)}")
    if "dtype" not in entry or "shape" not in entry or "data_offsets" not in entry:
        missing = next(key for key in ("dtype", "shape", "data_offsets") if key not in entry)
        raise CheckpointError(f"{path}: tensor {_q(name)}: entry has no {_q(missing)}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    bits_each = SAFETENSORS_DTYPE_BITS.get(dtype) if type(dtype) is str else None
    if bits_each is None:
        raise CheckpointError(f"{path}: tensor {_q(name)}: unknown dtype {_q(dtype)}")
    if type(shape) is not list or not _all_dims(shape):
        raise CheckpointError(
            f"{path}: tensor {_q(name)}: shape must be a list of non-negative integers, got {_q(shape)}")
    if type(offsets) is not list or len(offsets) != 2 or type(offsets[0]) is not int or type(offsets[1]) is not int:
        raise CheckpointError(f"{path}: tensor {_q(name)}: data_offsets must be [begin, end] integers, got "
                              f"{_q(offsets)}")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise CheckpointError(f"{path}: tensor {_q(name)}: data_offsets [{begin}, {end}] are not 0 <= begin <= end")
    if end > data_size:
        raise CheckpointError(
            f"{path}: tensor {_q(name)}: data_offsets [{begin}, {end}] run past the {data_size}-byte data area "
            "(file truncated?)"
        )
    dims = tuple(shape)
    known = sizes.get((dtype, dims))  # the shape is checked: only ints (no bools) get here
    if known is None:
        # Bound the product: a hostile header can list thousands of huge dimensions.
        numel = math.prod(shape) if len(shape) <= 4 else _bounded_prod(shape, data_size * 8 // bits_each)
        if numel is None or numel * bits_each > data_size * 8:
            raise CheckpointError(
                f"{path}: tensor {_q(name)}: shape {_q(shape)} needs more bytes than the file holds")
        bits = numel * bits_each
        if bits % 8:
            raise CheckpointError(
                f"{path}: tensor {_q(name)}: {numel} x {dtype} does not fill a whole number of bytes")
        known = sizes[(dtype, dims)] = (numel, bits // 8)
    numel, nbytes = known
    if end - begin != nbytes:
        raise CheckpointError(
            f"{path}: tensor {_q(name)}: shape {_q(shape)} of {dtype} needs {nbytes} bytes but data_offsets span "
            f"{end - begin}"
        )
    return CheckpointTensor(name, dtype, dims, numel, nbytes, str(path)), begin, end


def _all_dims(shape: list[Any]) -> bool:
    for d in shape:  # `type(d) is int` also refuses JSON true, a bool
        if type(d) is not int or d < 0:
            return False
    return True


def _decode_header(path: Path, text: str) -> Any:
    """The header's JSON, every object checked for a key named twice, with the collector paused: a million small
    dicts would otherwise start it over and over (7.4 s → 3.2 s of parsing for a 92 MB header)."""
    with _gc_paused():
        return _decode_json(path, text, "header")


@contextlib.contextmanager
def _gc_paused():
    """Building a million small dicts triggers the cyclic collector over and over; none of them forms a cycle."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _cross_check_with_library(path: Path, names: set[str]) -> None:
    """Let the safetensors library parse the header too, after our own checks passed.

    It memory-maps the file and parses the header; no tensor is read. If it disagrees with us,
    transformers (which uses it) would not load the file as we describe it.
    """
    try:
        from safetensors import safe_open
    except ImportError:
        return
    try:
        with safe_open(str(path), framework="numpy") as handle:
            theirs = set(handle.keys())
    except Exception as err:  # the Rust extension raises its own exception types
        raise CheckpointError(f"{path}: the safetensors library rejects this file: {_short(err)}") from None
    if theirs != names:
        raise CheckpointError(f"{path}: the safetensors library reads different tensor names from this header")


# ---------------------------------------------------------------------------------------------
# Headers from the Hub, over HTTP range requests
# ---------------------------------------------------------------------------------------------


def read_hub_checkpoint(repo_id: str, *, revision: str | None = None) -> Checkpoint:
    """The tensors of a hub repo's safetensors checkpoint, from its headers alone.

    huggingface_hub's get_safetensors_metadata fetches each file's 8-byte length and JSON header with HTTP range
    requests (at most 25 MB each); no tensor data is downloaded. Each entry is then checked as a local header is.
    """
    from huggingface_hub import get_safetensors_metadata
    from huggingface_hub.errors import NotASafetensorsRepoError, SafetensorsParsingError

    from .sources import hub_errors

    try:
        with hub_errors(repo_id, revision, "safetensors checkpoint"):
            metadata = get_safetensors_metadata(repo_id, revision=revision)
    except NotASafetensorsRepoError:
        raise SourceError(f"hub id {repo_id} has no model.safetensors or model.safetensors.index.json; "
                          "paramscope audit reads a .bin checkpoint only from local files") from None
    except SafetensorsParsingError as err:
        raise CheckpointError(f"hub id {repo_id}: a safetensors header could not be parsed: {_short(err)}") from None
    return checkpoint_from_hub_metadata(f"hub:{repo_id}", metadata)


def checkpoint_from_hub_metadata(label: str, metadata: Any) -> Checkpoint:
    """A Checkpoint from huggingface_hub's SafetensorsRepoMetadata, every entry checked by `_parse_entry`."""
    tensors: list[CheckpointTensor] = []
    found: dict[str, str] = {}
    for filename, file_metadata in metadata.files_metadata.items():
        where = Path(f"{label}/{filename}")
        entries = {name: {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": list(info.data_offsets)}
                   for name, info in file_metadata.tensors.items()}
        # The remote file's size is not known here; the data area is at least as long as its last tensor.
        data_size = max((entry["data_offsets"][1] for entry in entries.values()
                         if isinstance(entry["data_offsets"][1], int)), default=0)
        sizes: dict[tuple[str, tuple[int, ...]], tuple[int, int]] = {}  # per file: it bounds by data_size
        for name, entry in entries.items():
            if name in found:
                raise CheckpointError(f"{label}: tensor {_q(name)} is stored in two files ({found[name]} and {filename})")
            found[name] = filename
            tensor, _, _ = _parse_entry(where, name, entry, data_size, sizes)
            tensors.append(tensor)
    for name, filename in metadata.weight_map.items():
        if found.get(name) != filename:
            raise CheckpointError(f"{label}: the index puts {_q(name)} in {filename}, but its header does not")
    info: dict[str, Any] = {"read": "safetensors headers from the Hub (HTTP range requests)",
                            "files": list(metadata.files_metadata)}
    if metadata.metadata:
        info["index_metadata"] = dict(metadata.metadata)
    fmt = "safetensors-sharded" if metadata.sharded else "safetensors"
    return _finish(Path(label), fmt, tensors, info)


# ---------------------------------------------------------------------------------------------
# Sharded checkpoints (*.index.json)
# ---------------------------------------------------------------------------------------------


def _read_index(index_path: Path) -> Checkpoint:
    is_bin = index_path.name.endswith(".bin.index.json")
    fmt = "pytorch-bin-sharded" if is_bin else "safetensors-sharded"
    index = _read_json_file(index_path, _MAX_INDEX_BYTES)
    if not isinstance(index, dict):
        raise CheckpointError(f"{index_path}: index must be a JSON object, got {_json_type(index)}")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_path}: no weight_map object mapping tensor names to shard files")
    if not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index_path}: weight_map values must be shard file names")

    shard_names = list(dict.fromkeys(weight_map.values()))
    tensors: list[CheckpointTensor] = []
    found: dict[str, str] = {}
    storage_bytes = 0
    for shard in shard_names:
        shard_path = _shard_path(index_path, shard)
        if is_bin:
            if not _is_zip(shard_path):
                raise CheckpointError(
                    f"{shard_path}: not a zip-format PyTorch checkpoint; legacy format not supported, "
                    "convert to safetensors"
                )
            shard_tensors, shard_bytes = _read_torch_zip(shard_path)
            storage_bytes += shard_bytes
        else:
            shard_tensors, _ = _read_safetensors(shard_path)
        for t in shard_tensors:
            if t.name in found:
                raise CheckpointError(
                    f"{index_path}: tensor {_q(t.name)} is stored in two shards ({found[t.name]} and {shard})"
                )
            found[t.name] = shard
        tensors.extend(shard_tensors)

    for name, shard in weight_map.items():
        if found.get(name) != shard:
            where = f"in {found[name]}" if name in found else "in no shard"
            raise CheckpointError(f"{index_path}: weight_map puts {_q(name)} in {shard} but it is {where}")
    # transformers loads every tensor of every listed shard, indexed or not; keep them, but say so.
    unindexed = sorted(set(found) - set(weight_map))
    metadata: dict[str, Any] = {"shards": shard_names}
    if is_bin:
        metadata["storage_bytes"] = storage_bytes
    if isinstance(index.get("metadata"), dict):
        metadata["index_metadata"] = index["metadata"]
    if unindexed:
        metadata["unindexed_tensors"] = unindexed
    return _finish(index_path, fmt, tensors, metadata)


def _shard_path(index_path: Path, shard: str) -> Path:
    # The index is data from the checkpoint: never let it point outside its own directory.
    parts = Path(shard).parts
    if not shard or Path(shard).is_absolute() or ".." in parts or "\\" in shard:
        raise CheckpointError(f"{index_path}: shard name {_q(shard)} points outside the checkpoint directory")
    shard_path = index_path.parent / shard
    if not shard_path.exists():
        raise CheckpointError(f"{index_path}: shard {_q(shard)} listed in the index does not exist")
    check_inside(shard_path, index_path.parent, error=CheckpointError, what="checkpoint folder")
    return shard_path


def _read_json_file(path: Path, limit: int) -> Any:
    raw = read_regular(path, limit, error=CheckpointError, what="checkpoint index")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{path}: not valid UTF-8 (byte {err.start})") from None
    return _decode_json(path, text, "file")


class _DuplicateKey(Exception):
    pass


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json keeps the last of two equal keys silently; in a header that would hide a tensor entry.
    out = dict(pairs)
    if len(out) != len(pairs):  # rare: find the key named twice, in Python
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def _decode_json(path: Path, text: str, what: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_reject_duplicates)
    except _DuplicateKey as err:
        raise CheckpointError(f"{path}: {what} names {_q(err.args[0])} twice") from None
    except RecursionError:
        raise CheckpointError(f"{path}: {what} JSON is nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, and over-long integer literals
        raise CheckpointError(f"{path}: {what} is not valid JSON: {_short(err)}") from None


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def _short(err: BaseException) -> str:
    try:
        text = str(err)
    except Exception:  # broad on purpose: an exception's own __str__ (a C extension's, a pickle's) may raise
        text = ""
    text = " ".join(text.split()) or type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _bounded_prod(dims: Iterable[int], limit: int) -> int | None:
    """The product of `dims`, or None as soon as it exceeds `limit` (a zero anywhere gives 0)."""
    dims = list(dims)
    if 0 in dims:
        return 0
    product = 1
    for d in dims:
        product *= d
        if product > limit:
            return None
    return product


def _is_int(value: Any) -> bool:
    # bool is an int subclass; JSON true must not pass as a dimension.
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------------------------------------
# PyTorch zip checkpoints (.bin): a restricted unpickler that cannot run code
# ---------------------------------------------------------------------------------------------

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
    numel = _bounded_prod(shape, 2**63 - 1)
    if numel is None:
        raise _Malformed(f"a tensor of {len(shape)} dimensions has more than 2**63 elements")
    if numel:
        # The last element the view touches must lie inside the storage the zip actually holds.
        # (Storage and view may differ in dtype: _rebuild_tensor_v3 views raw bytes.)
        last = offset + sum((d - 1) * s for d, s in zip(shape, strides))
        if (last + 1) * _DTYPE_BITS[dtype] > storage.numel * _DTYPE_BITS[storage.dtype]:
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


class _RestrictedUnpickler(pickle._Unpickler):  # type: ignore[name-defined]
    """The pure-Python unpickler with every way out of the pickle VM closed.

    The pure-Python class is used on purpose: its memo is a dict, so a hostile memo index cannot
    make it allocate (the C unpickler sizes an array by the largest index it sees).
    """

    def __init__(
        self, data: bytes, zip_entries: Mapping[str, zipfile.ZipInfo], prefix: str, archive_size: int
    ) -> None:
        super().__init__(io.BytesIO(data))
        self._entries = zip_entries
        self._prefix = prefix
        self._archive_size = archive_size
        self.storages: dict[str, _Storage] = {}

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
        expected = numel * _DTYPE_BITS[storage_type.dtype] // 8
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


def _read_torch_zip(path: Path) -> tuple[list[CheckpointTensor], int]:
    """The tensors of a zip-format torch.save file, and the bytes of its distinct storages."""
    try:
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
            if entry.file_size > _MAX_PICKLE_BYTES:
                raise CheckpointError(f"{path}: data.pkl is {entry.file_size} bytes, too large to be a state dict")
            with zf.open(entry) as handle:
                # Read at most the limit: a compressed entry may lie about its size.
                raw = handle.read(_MAX_PICKLE_BYTES + 1)
    except CheckpointError:
        raise
    except OSError as err:
        raise SourceError(f"{path}: cannot read: {err.strerror or err}") from None
    except Exception as err:  # zipfile reports damage through many exception types
        raise CheckpointError(f"{path}: damaged zip archive: {_short(err)}") from None
    if len(raw) > _MAX_PICKLE_BYTES:
        raise CheckpointError(f"{path}: data.pkl is larger than {_MAX_PICKLE_BYTES} bytes")

    prefix = entry.filename[: -len("data.pkl")]
    archive_size = path.stat().st_size
    unpickler = _RestrictedUnpickler(raw, {i.filename: i for i in infos}, prefix, archive_size)
    try:
        root = unpickler.load()
    except _Refused as err:
        raise CheckpointError(
            f"{path}: refusing to load: data.pkl calls {err.args[0]}, which is not a tensor-rebuilding "
            "function (loading this file with torch.load could run code); nothing was executed"
        ) from None
    except _Malformed as err:
        raise CheckpointError(f"{path}: malformed PyTorch checkpoint: {err.args[0]}") from None
    except Exception as err:  # any failure of the pickle VM on hostile bytes, MemoryError included
        raise CheckpointError(f"{path}: data.pkl is not a valid pickle: {type(err).__name__}: {_short(err)}") from None

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
                nbytes=numel * _DTYPE_BITS[value.dtype] // 8,
                file=str(path),
            )
        )
    storage_bytes = sum(st.numel * _DTYPE_BITS[st.dtype] // 8 for st in unpickler.storages.values())
    return tensors, storage_bytes


# ---------------------------------------------------------------------------------------------
# Quantised checkpoints: which stored tensors are packed weights and which are not parameters
# ---------------------------------------------------------------------------------------------

# Names that are quantisation bookkeeping whatever sits next to them (fp8, NVFP4, compressed-tensors,
# kv-cache scales): suffix -> (scheme, what it is).
_AUX_SUFFIXES = {
    "weight_scale": ("fp8", "quantisation scale"),
    "weight_scale_inv": ("fp8", "quantisation scale"),
    "weight_scale_2": ("fp8", "quantisation scale"),
    "input_scale": ("fp8", "activation quantisation scale"),
    "output_scale": ("fp8", "activation quantisation scale"),
    "k_scale": ("fp8", "kv-cache quantisation scale"),
    "v_scale": ("fp8", "kv-cache quantisation scale"),
    "weight_zero_point": ("compressed-tensors", "quantisation zero point"),
    "weight_global_scale": ("compressed-tensors", "quantisation scale"),
    "input_global_scale": ("compressed-tensors", "activation quantisation scale"),
    "weight_shape": ("compressed-tensors", "record of a packed weight's shape"),
}
_BNB4_STATE = re.compile(
    r"^(?P<weight>.+\.weight)\.(absmax|quant_map|nested_absmax|nested_quant_map|quant_state\..+)$"
)
_GPTQ_PARTS = ("qzeros", "scales", "g_idx")


def _classify_quantisation(tensors: list[CheckpointTensor]) -> list[CheckpointTensor]:
    """Mark packed weights and their scale/zero/state tensors, from names and shapes alone.

    Recognised: bitsandbytes 4-bit (``X.weight`` U8 with ``X.weight.absmax``/``.quant_state.*``),
    bitsandbytes 8-bit (``X.SCB``), GPTQ/AWQ (``X.qweight`` with ``X.qzeros``/``X.scales``),
    compressed-tensors (``X.weight_packed``) and fp8 scales (``X.weight_scale[_inv]``, ``X.input_scale``).
    """
    by_name = {t.name: t for t in tensors}
    updates: dict[str, dict[str, Any]] = {}

    for t in tensors:
        stem, _, last = t.name.rpartition(".")
        prefix = f"{stem}." if stem else ""
        if last in _AUX_SUFFIXES:
            scheme, what = _AUX_SUFFIXES[last]
            updates[t.name] = {"role": "quant_aux", "packing": scheme, "note": what}
        m = _BNB4_STATE.match(t.name) if ".weight." in t.name else None  # the pattern needs ".weight."
        if m and m["weight"] in by_name:
            updates[t.name] = {"role": "quant_aux", "packing": "bnb-4bit", "note": "bitsandbytes 4-bit state"}
            weight = by_name[m["weight"]]
            if weight.dtype == "U8":
                updates[weight.name] = {
                    "role": "packed",
                    "packing": "bnb-4bit",
                    "logical_numel": None,
                    "note": "bitsandbytes 4-bit, 2 values per byte; the exact count is in quant_state data",
                }
        if last in ("SCB", "weight_format") and f"{prefix}weight" in by_name:
            updates[t.name] = {"role": "quant_aux", "packing": "bnb-8bit", "note": "bitsandbytes 8-bit scale"}
        if last in _GPTQ_PARTS and f"{prefix}qweight" in by_name:
            updates[t.name] = {
                "role": "quant_aux",
                "packing": "gptq",
                "note": "GPTQ/AWQ scale, zero point or group index",
            }
        if last == "qweight":
            updates[t.name] = {
                "role": "packed",
                "packing": "gptq",
                "logical_numel": _gptq_logical(t, by_name.get(f"{prefix}scales"), by_name.get(f"{prefix}qzeros")),
                "note": "GPTQ/AWQ int32-packed weight",
            }
        if last == "weight_packed":
            updates[t.name] = {
                "role": "packed",
                "packing": "compressed-tensors",
                "logical_numel": None,
                "note": "compressed-tensors packed weight; the unpacked shape is in weight_shape data",
            }
    if not updates:
        return tensors
    out = []
    for t in tensors:
        change = updates.get(t.name)
        if change:
            fields = {k: getattr(t, k) for k in ("name", "dtype", "shape", "numel", "nbytes", "file")}
            fields.setdefault("logical_numel", None)
            fields.update(change)
            t = CheckpointTensor(**fields)
        out.append(t)
    return out


def _gptq_logical(
    qweight: CheckpointTensor, scales: CheckpointTensor | None, qzeros: CheckpointTensor | None
) -> int | None:
    # qweight packs 32/bits values per int32 and qzeros packs the same way over `scales`' columns,
    # so scales_cols / qzeros_cols is the pack factor, for GPTQ and AWQ layouts alike.
    if scales is None or qzeros is None or qweight.dtype != "I32":
        return None
    if len(scales.shape) != 2 or len(qzeros.shape) != 2 or qzeros.shape[1] == 0:
        return None
    packed_values = qweight.numel * scales.shape[1]
    if packed_values % qzeros.shape[1]:
        return None
    return packed_values // qzeros.shape[1]


# ---------------------------------------------------------------------------------------------
# Reconciling a checkpoint with a model
# ---------------------------------------------------------------------------------------------

# transformers 5 (conversion_mapping.py, "legacy") renames these keys for every model while loading.
# Patterns are used as transformers compiles them: a literal that ends on a name boundary.
_LEGACY_RENAMES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"LayerNorm.gamma(?!\w)"), "LayerNorm.weight"),
    (re.compile(r"LayerNorm.beta(?!\w)"), "LayerNorm.bias"),
    (re.compile(r".weight_g(?!\w)"), ".parametrizations.weight.original0"),
    (re.compile(r".weight_v(?!\w)"), ".parametrizations.weight.original1"),
    (re.compile(r"^language_model\.model\.model(?!\w)|^model\.language_model\.model(?!\w)"), "model.language_model"),
)

# Buffers older versions saved and current models recreate (transformers drops them silently).
_LEGACY_BUFFER = re.compile(r"(^|\.)(position_ids|rotary_emb\.inv_freq|masked_bias|attn\.bias)$")

_LEGACY_BUFFER_ENDINGS = ("position_ids", "inv_freq", "masked_bias", "attn.bias")  # _LEGACY_BUFFER's, a precheck

# One search that tells whether any rename can fire: most keys need none (reconcile runs once per tensor).
_ANY_LEGACY_RENAME = re.compile("|".join(f"(?:{pattern.pattern})" for pattern, _ in _LEGACY_RENAMES))

_TASK_HEADS = frozenset(("classifier", "score", "qa_outputs", "lm_head", "head", "heads", "seq_relationship"))
# A substring of every component _unexpected_reason looks for ("head" is in lm_head and heads): a precheck.
_HEAD_WORD = re.compile("cls|pooler|head|classifier|score|qa_outputs|seq_relationship")


def reconcile(
    checkpoint: Checkpoint,
    expected_params: Mapping[str, tuple[int, ...]],
    *,
    expected_buffers: Iterable[str] = (),
    tied_aliases: Mapping[str, str] = {},  # noqa: B006 - read-only
    base_model_prefix: str = "",
    model_class: str = "",
) -> Audit:
    """Say what loading `checkpoint` into a model with these parameters would do.

    `expected_params` maps each unique parameter name to its shape; `tied_aliases` maps another name
    under which a tied parameter is reachable to its canonical name; `expected_buffers` names the
    model's buffers. `model_class` is only used in the reasons ("... that BertModel does not have").
    """
    params = {name: tuple(int(d) for d in shape) for name, shape in expected_params.items()}
    aliases = dict(tied_aliases)
    for alias, canonical in aliases.items():
        if canonical not in params:
            raise ValueError(f"tied alias {alias!r} points to {canonical!r}, which is not in expected_params")
    buffers = set(expected_buffers)
    model_keys = set(params) | set(aliases) | buffers
    who = model_class or "the model"

    filled: dict[str, str] = {}  # canonical name -> checkpoint key that provides it
    claimed: dict[str, str] = {}  # model name (alias or canonical) -> checkpoint key
    matched: list[str] = []
    unexpected: list[Finding] = []
    non_parameters: list[Finding] = []
    mismatched: list[Mismatch] = []
    renamed: list[tuple[str, str]] = []
    reasons: dict[str, str] = {}  # one string per distinct reason, not one per tensor (a million, at 100 MB)

    for t in checkpoint.tensors:
        target = _map_key(t.name, model_keys, base_model_prefix)
        if target not in params and target not in aliases and t.role == "packed":
            target = _packed_target(t.name, model_keys, base_model_prefix) or target

        if target in params or target in aliases:
            canonical = aliases.get(target, target)
            model_shape = params[canonical]
            if not _fits(t, model_shape):
                mismatched.append(
                    Mismatch(
                        name=target,
                        checkpoint_key=t.name,
                        checkpoint_shape=t.shape,
                        model_shape=model_shape,
                        reason="shapes differ: loading fails unless ignore_mismatched_sizes=True, "
                        "which re-initialises it",
                    )
                )
                continue
            if target in claimed:
                unexpected.append(
                    Finding(t.name, f"duplicate: {target} is already loaded from {claimed[target]}", t.shape)
                )
                continue
            claimed[target] = t.name
            filled.setdefault(canonical, t.name)
            matched.append(target)
            if target != t.name:
                renamed.append((t.name, target))
        elif target in buffers:
            non_parameters.append(Finding(t.name, "buffer, not a parameter", t.shape))
        elif t.role == "quant_aux":
            non_parameters.append(Finding(t.name, f"{t.note}: not a parameter", t.shape))
        elif target.endswith(_LEGACY_BUFFER_ENDINGS) and _LEGACY_BUFFER.search(target):
            non_parameters.append(
                Finding(t.name, "buffer saved by older versions; the model recreates it, not a parameter", t.shape)
            )
        else:
            reason = _unexpected_reason(target, who)
            unexpected.append(Finding(t.name, reasons.setdefault(reason, reason), t.shape))

    mismatched_names = {aliases.get(m.name, m.name) for m in mismatched}
    missing = [
        Finding(name, _missing_reason(name), shape)
        for name, shape in params.items()
        if name not in filled and name not in mismatched_names
    ]
    return Audit(
        format=checkpoint.format,
        matched=tuple(sorted(matched)),
        missing=tuple(sorted(missing, key=lambda f: f.name)),
        unexpected=tuple(sorted(unexpected, key=lambda f: f.name)),
        non_parameters=tuple(sorted(non_parameters, key=lambda f: f.name)),
        mismatched=tuple(sorted(mismatched, key=lambda m: m.name)),
        renamed=tuple(sorted(renamed)),
        parameters=sum(math.prod(params[name]) for name in filled),
        elements=checkpoint.elements,
        bytes=checkpoint.nbytes,
        by_dtype=checkpoint.by_dtype,
    )


def _apply_legacy_renames(key: str) -> str:
    # Every rule that matches fires, in order, as in transformers' apply_renamings. Each rule's literal holds one of
    # these substrings; testing them first is ten times cheaper than the regex, and most keys need no rename.
    if ("gamma" not in key and "beta" not in key and "weight_" not in key and "language_model" not in key) or (
            not _ANY_LEGACY_RENAME.search(key)):
        return key
    for pattern, replacement in _LEGACY_RENAMES:
        m = pattern.search(key)
        if m:
            key = key.replace(m.group(0), replacement, 1)
    return key


def _fix_prefix(key: str, model_keys: set[str], prefix: str) -> str:
    # Per key, as transformers does: strip the base-model prefix when the model lacks it (a
    # BertModel loading a BertForMaskedLM checkpoint), add it when the model has it (a
    # BertForSequenceClassification loading a BertModel checkpoint).
    if not prefix:
        return key
    dotted = f"{prefix}."
    if key.startswith(dotted) and key[len(dotted) :] in model_keys:
        return key[len(dotted) :]
    if dotted + key in model_keys:
        return dotted + key
    return key


def _map_key(key: str, model_keys: set[str], prefix: str) -> str:
    renamed = _fix_prefix(_apply_legacy_renames(key), model_keys, prefix)
    if renamed not in model_keys and key in model_keys:
        # The rename should not have fired: the key already names a model entry.
        renamed = _fix_prefix(key, model_keys, prefix)
    return renamed


def _packed_target(key: str, model_keys: set[str], prefix: str) -> str | None:
    # A GPTQ `X.qweight` or compressed-tensors `X.weight_packed` stands for the model's `X.weight`.
    stem, _, last = key.rpartition(".")
    if last not in ("qweight", "weight_packed"):
        return None
    target = _map_key(f"{stem}.weight" if stem else "weight", model_keys, prefix)
    return target if target in model_keys else None


def _fits(t: CheckpointTensor, model_shape: tuple[int, ...]) -> bool:
    if t.role != "packed":
        return t.shape == model_shape
    wanted = math.prod(model_shape)
    if t.logical_numel is not None:
        return t.logical_numel == wanted
    if t.packing == "bnb-4bit":
        # ceil(n / 2) bytes hold n values.
        return (wanted + 1) // 2 == t.numel
    if t.packing == "compressed-tensors":
        # int32 words holding 4, 8 or 16 values (8-, 4- or 2-bit), last word possibly partial.
        return any(-(-wanted // per_word) == t.numel for per_word in (4, 8, 16))
    return False


def _components(name: str) -> list[str]:
    return name.split(".")


def _unexpected_reason(name: str, who: str) -> str:
    if not _HEAD_WORD.search(name):  # no component can be a head's: the common case, one cheap search
        return f"no parameter of that name in {who}: unused when loaded"
    parts = set(_components(name))
    if "cls" in parts and "predictions" in parts:
        return f"part of the MLM pretraining head that {who} does not have"
    if "cls" in parts and "seq_relationship" in parts:
        return f"part of the next-sentence-prediction pretraining head that {who} does not have"
    if "lm_head" in parts:
        return f"language-modelling head that {who} does not have: unused when loaded"
    if "pooler" in parts:
        return f"pooler that {who} does not have: unused when loaded"
    if not _TASK_HEADS.isdisjoint(parts):
        return f"task head that {who} does not have: unused when loaded"
    return f"no parameter of that name in {who}: unused when loaded"


def _missing_reason(name: str) -> str:
    parts = _components(name)
    if any(p in _TASK_HEADS for p in parts) or ("cls" in parts and "predictions" in parts):
        return "task head not in the checkpoint: newly initialised, must be trained"
    if "pooler" in parts:
        return "pooler not in the checkpoint: newly initialised when loaded"
    return "not in the checkpoint: newly initialised when loaded"
