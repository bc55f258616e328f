"""Reading a checkpoint's headers: a safetensors file, a sharded checkpoint (*.index.json), a folder, a
zip-format PyTorch .bin (through the restricted unpickler) or a hub repo's safetensors headers, into a `Checkpoint`.

Nothing whose size comes from the file is allocated before that size has been checked against the file itself.
Anything wrong with a file raises CheckpointError naming the file and the problem; a path that does not exist or
cannot be opened raises SourceError. The legacy (non-zip) torch.save format is refused: it cannot be read without
unpickling it.
"""

from __future__ import annotations

import math
import os
import struct
from operator import attrgetter
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, SourceError
from ..errors import short_repr as _q
from ..safe_io import (check_inside, decode_utf8, gc_paused, open_regular, parse_json, read_json, reject_duplicates,
                       short_error)
from .quantisation import classify_quantisation
from .tensors import MAX_TENSORS, SAFETENSORS_DTYPE_BITS, Checkpoint, CheckpointTensor, bounded_prod, make_tensor
from .unpickler import read_torch_zip

# The safetensors library refuses headers above this size; so do we, before reading one.
_MAX_HEADER_BYTES = 100_000_000
# The safetensors library re-reads headers of up to this many tensors (a real file holds a few thousand); past it
# our own checks stand alone, so that a legal 100 MB header costs seconds, not a minute. The shards of one checkpoint
# are re-read while they hold up to _LIBRARY_CHECK_MAX_SHARDED together (every real checkpoint; ten shards of
# 100,000 tensors would cost 2 s more).
_LIBRARY_CHECK_MAX_TENSORS = 100_000
_LIBRARY_CHECK_MAX_SHARDED = 300_000
# An index.json this large is not a real checkpoint's (a 100k-tensor model needs a few MB).
_MAX_INDEX_BYTES = 64 * 1024 * 1024

# In a directory, the first of these that exists is the checkpoint (transformers' own preference).
_DIRECTORY_CANDIDATES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


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
        tensors, storage_bytes = read_torch_zip(p)
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
    _check_count(path, len(tensors))
    with gc_paused():
        tensors.sort(key=attrgetter("name"))
        tensors = classify_quantisation(tensors)
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
    if not any(directory.glob("*.gguf")):  # the folder holds nothing any command reads as a checkpoint
        raise SourceError(f"{directory}: no checkpoint found: the folder holds no GGUF file and none of {wanted}, "
                          "*.safetensors, *.safetensors.index.json or *.bin.index.json")
    raise SourceError(f"{directory}: no checkpoint found (looked for {wanted})")


def _is_zip(path: Path) -> bool:
    with open_regular(path, what="checkpoint file") as f:
        magic = f.read(4)
    return magic in (b"PK\x03\x04", b"PK\x05\x06")


# ---------------------------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------------------------


def _check_count(path: Path, count: int, before: int = 0) -> None:
    if before + count > MAX_TENSORS:
        raise CheckpointError(_too_many(path, before))


def _too_many(path: Path, before: int) -> str:
    shards = f" with the {before:,} of the shards before it" if before else ""
    return (f"{path}: more than {MAX_TENSORS:,} tensors{shards}, the most paramscope audits in one checkpoint "
            "(the largest real checkpoints hold a few hundred thousand)")


class _Entry(tuple):  # type: ignore[type-arg]
    """A header entry checked while the header was parsed: (dtype, dims, numel, nbytes, begin, end).

    Six references instead of a dict and two lists per tensor: a million entries parse in 490 MB, not 840. Where it
    is shown (a message quoting a value that holds one), it reads as the JSON object it was."""

    __slots__ = ()

    def as_json(self) -> dict[str, Any]:
        dtype, dims, _, _, begin, end = self
        return {"dtype": dtype, "shape": list(dims), "data_offsets": [begin, end]}

    def __repr__(self) -> str:
        return repr(self.as_json())


_Sizes = dict[tuple[str, tuple[int, ...]], tuple[int, int, tuple[int, ...]]]  # (dtype, dims) → (numel, bytes, dims)


def _entry_hook(path: Path, data_size: int, sizes: _Sizes, before: int) -> Any:
    """json's object_pairs_hook for a safetensors header: every object counted (past MAX_TENSORS the parse stops
    at once), and each well-formed tensor entry digested into an `_Entry`. Anything else stays a dict, refused when
    it names a key twice; `_parse_entry` later finds what is wrong with it and says so, as it always has."""
    limit = MAX_TENSORS - before + 2  # the header object itself and __metadata__ are objects too
    count = 0
    dtype_bits = dict(SAFETENSORS_DTYPE_BITS)

    def digest(dtype: Any, shape: Any, offsets: Any) -> _Entry | None:
        if type(dtype) is not str or type(shape) is not list or type(offsets) is not list or len(offsets) != 2:
            return None
        begin, end = offsets
        if type(begin) is not int or type(end) is not int or not 0 <= begin <= end <= data_size:
            return None
        for d in shape:  # `type(d) is int` also refuses JSON true, a bool (equal to 1 as a dict key)
            if type(d) is not int or d < 0:
                return None
        known = sizes.get((dtype, tuple(shape)))
        if known is None:
            bits_each = dtype_bits.get(dtype)
            known = _size(shape, bits_each, data_size) if bits_each else None
            if known is None:
                return None
            sizes[(dtype, known[2])] = known
        if end - begin != known[1]:
            return None
        return _Entry((dtype, known[2], known[0], known[1], begin, end))

    def hook(pairs: list[tuple[str, Any]]) -> Any:
        nonlocal count
        count += 1
        if count > limit:
            raise CheckpointError(_too_many(path, before))
        if len(pairs) == 3:
            (k0, v0), (k1, v1), (k2, v2) = pairs
            if k0 == "dtype" and k1 == "shape" and k2 == "data_offsets":  # the order every writer uses
                return digest(v0, v1, v2) or {k0: v0, k1: v1, k2: v2}
            entry = reject_duplicates(pairs)
            if "dtype" in entry and "shape" in entry and "data_offsets" in entry:
                return digest(entry["dtype"], entry["shape"], entry["data_offsets"]) or entry
            return entry
        return reject_duplicates(pairs)

    return hook


def _size(shape: list[int], bits_each: int, data_size: int) -> tuple[int, int, tuple[int, ...]] | None:
    """(numel, bytes, dims) of a checked shape, or None when the file cannot hold it or it fills no whole byte."""
    # Bound the product: a hostile header can list thousands of huge dimensions.
    numel = math.prod(shape) if len(shape) <= 4 else bounded_prod(shape, data_size * 8 // bits_each)
    if numel is None or numel * bits_each > data_size * 8 or numel * bits_each % 8:
        return None
    return numel, numel * bits_each // 8, tuple(shape)


def _read_safetensors(path: Path, before: int = 0) -> tuple[list[CheckpointTensor], dict[str, str]]:
    """The tensors of one safetensors file; `before` tensors were read from the checkpoint's other shards."""
    sizes: _Sizes = {}  # each (dtype, shape) checked once per file, and its dims tuple shared
    header, data_size = _read_header(path, lambda data_size: _entry_hook(path, data_size, sizes, before))
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    elif not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{path}: __metadata__ must map strings to strings")
    _check_count(path, len(header), before)

    tensors: list[CheckpointTensor] = []
    # Each tensor's byte span as one integer, begin << 64 | end (offsets are below 2**64): sorted as fast as ints,
    # and a name is looked up only for a message.
    spans: list[int] = []
    file = str(path)  # one string for every tensor of the file
    with gc_paused():
        while header:  # popped as parsed: a million-entry header is never held twice
            name, entry = header.popitem()
            if type(entry) is _Entry:
                dtype, dims, numel, nbytes, begin, end = entry
                tensors.append(make_tensor(name, dtype, dims, numel, nbytes, file))
            else:
                tensor, begin, end = _parse_entry(path, name, entry, data_size, sizes, file)
                tensors.append(tensor)
            spans.append(begin << 64 | end)
    tensors.reverse()  # back to the header's order
    spans.reverse()

    # The format has no holes and no sharing: sorted by offset, each tensor starts where the
    # previous one ended and the last one ends at the end of the file. The safetensors library
    # refuses anything else, so a file that breaks this would not load.
    header_spans = spans.copy()  # the same ints, in the tensors' order: for a message's names
    spans.sort()
    cursor, previous = 0, -1
    mask = (1 << 64) - 1
    for index, span in enumerate(spans):
        begin, end = span >> 64, span & mask
        if begin != cursor:
            name = _name_at(tensors, header_spans, spans, index)
            if begin < cursor:
                other = _name_at(tensors, header_spans, spans, previous)
                raise CheckpointError(f"{path}: tensor {_q(name)} (bytes {begin}..{end}) overlaps tensor "
                                      f"{_q(other)} (ends at {cursor})")
            raise CheckpointError(
                f"{path}: {begin - cursor} unaccounted bytes before tensor {_q(name)} "
                f"(offset {begin}, expected {cursor})"
            )
        cursor, previous = end, index
    if cursor != data_size:
        raise CheckpointError(
            f"{path}: tensor data ends at byte {cursor} but the data area holds {data_size} bytes "
            "(trailing bytes after the last tensor)"
        )
    if len(tensors) <= _LIBRARY_CHECK_MAX_TENSORS and before + len(tensors) <= _LIBRARY_CHECK_MAX_SHARDED:
        _cross_check_with_library(path, {t.name for t in tensors})
    return tensors, metadata


def _name_at(tensors: list[CheckpointTensor], header_spans: list[int], spans: list[int], index: int) -> str:
    """For a message, on the way to an error: the name of the tensor at position `index` of the sorted `spans`,
    where sorting (begin, end, name) triples puts equal spans in the order of their names."""
    span = spans[index]
    rank = 0
    while index - rank > 0 and spans[index - rank - 1] == span:
        rank += 1
    return sorted(t.name for t, s in zip(tensors, header_spans) if s == span)[rank]


def read_safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """Return the decoded header and the size of the data area that follows it."""
    return _read_header(path)


def _read_header(path: Path, hook_for: Any = None) -> tuple[dict[str, Any], int]:
    """The decoded header and the size of its data area; `hook_for(data_size)` gives parse_json a pairs_hook."""
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
    text = decode_utf8(raw, str(path), error=CheckpointError, what="header")
    del raw  # a header may be 100 MB: hold it once, not twice, while it is parsed
    data_size = size - 8 - header_len
    header = parse_json(text, str(path), error=CheckpointError, what="header", unique_keys=True,
                        pairs_hook=hook_for(data_size) if hook_for else None)
    if type(header) is _Entry:  # the whole header reads as one tensor's entry: it is read as the object it is
        header = header.as_json()
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header must be a JSON object, got {_json_type(header)}")
    return header, data_size


def _parse_entry(path: Path, name: str, entry: Any, data_size: int,
                 sizes: _Sizes, file: str | None = None) -> tuple[CheckpointTensor, int, int]:
    # Runs once per tensor of a hub header, and for a local file's entries that its parse did not digest (an
    # `_Entry`): exact type tests, no generator per entry.
    if type(entry) is _Entry:
        dtype, dims, numel, nbytes, begin, end = entry
        return make_tensor(name, dtype, dims, numel, nbytes, file or str(path)), begin, end
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
        numel = math.prod(shape) if len(shape) <= 4 else bounded_prod(shape, data_size * 8 // bits_each)
        if numel is None or numel * bits_each > data_size * 8:
            raise CheckpointError(
                f"{path}: tensor {_q(name)}: shape {_q(shape)} needs more bytes than the file holds")
        bits = numel * bits_each
        if bits % 8:
            raise CheckpointError(
                f"{path}: tensor {_q(name)}: {numel} x {dtype} does not fill a whole number of bytes")
        known = sizes[(dtype, dims)] = (numel, bits // 8, dims)
    numel, nbytes, dims = known
    if end - begin != nbytes:
        raise CheckpointError(
            f"{path}: tensor {_q(name)}: shape {_q(shape)} of {dtype} needs {nbytes} bytes but data_offsets span "
            f"{end - begin}"
        )
    return CheckpointTensor(name, dtype, dims, numel, nbytes, file or str(path)), begin, end


def _all_dims(shape: list[Any]) -> bool:
    for d in shape:  # `type(d) is int` also refuses JSON true, a bool
        if type(d) is not int or d < 0:
            return False
    return True


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
        raise CheckpointError(f"{path}: the safetensors library rejects this file: {short_error(err)}") from None
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

    from ..sources import hub_errors

    try:
        with hub_errors(repo_id, revision, "safetensors checkpoint"):
            metadata = get_safetensors_metadata(repo_id, revision=revision)
    except NotASafetensorsRepoError:
        raise SourceError(f"hub id {repo_id} has no model.safetensors or model.safetensors.index.json; "
                          "paramscope audit reads a .bin checkpoint only from local files") from None
    except SafetensorsParsingError as err:
        raise CheckpointError(f"hub id {repo_id}: a safetensors header could not be parsed: "
                              f"{short_error(err)}") from None
    return checkpoint_from_hub_metadata(f"hub:{repo_id}", metadata)


def checkpoint_from_hub_metadata(label: str, metadata: Any) -> Checkpoint:
    """A Checkpoint from huggingface_hub's SafetensorsRepoMetadata, every entry checked by `_parse_entry`."""
    tensors: list[CheckpointTensor] = []
    found: dict[str, str] = {}
    for filename, file_metadata in metadata.files_metadata.items():
        where = Path(f"{label}/{filename}")
        _check_count(where, len(file_metadata.tensors), len(tensors))
        entries = {name: {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": list(info.data_offsets)}
                   for name, info in file_metadata.tensors.items()}
        # The remote file's size is not known here; the data area is at least as long as its last tensor.
        data_size = max((entry["data_offsets"][1] for entry in entries.values()
                         if isinstance(entry["data_offsets"][1], int)), default=0)
        sizes: _Sizes = {}  # per file: it bounds by data_size
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
    index = read_json(index_path, _MAX_INDEX_BYTES, error=CheckpointError, what="checkpoint index",
                      unique_keys=True)
    if not isinstance(index, dict):
        raise CheckpointError(f"{index_path}: index must be a JSON object, got {_json_type(index)}")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_path}: no weight_map object mapping tensor names to shard files")
    if not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index_path}: weight_map values must be shard file names")
    _check_count(index_path, len(weight_map))  # before any shard is read

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
            shard_tensors, shard_bytes = read_torch_zip(shard_path)
            _check_count(shard_path, len(shard_tensors), len(tensors))
            storage_bytes += shard_bytes
        else:
            shard_tensors, _ = _read_safetensors(shard_path, len(tensors))
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
    unindexed = sorted(name for name in found if name not in weight_map)
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


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )
