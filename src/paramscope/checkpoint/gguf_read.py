"""Reading a GGUF file's header (llama.cpp's format): its metadata and its tensor infos, never its tensor data.

A `.gguf` file, a sharded set (`name-00001-of-00003.gguf`, as gguf-split writes it) or a folder holding one of
them is read into a `GGUFCheckpoint`: every tensor with its ggml type, its shape and its exact bytes (ggml's block
sizes, `gguf.GGML_QUANT_SIZES`: elements / block size × type size), the model's metadata, logical parameter counts
(unpacked elements), bits per weight overall, by type and by role, and each tensor's paramscope role
(`blk.N.attn_q.weight` → attention.query, `token_embd.weight` → embeddings.word, ...), which follows the
architecture and the layer's kind where the name alone cannot tell (a Mamba layer's `attn_norm` is its SSM's norm).

The header is parsed here, not by `gguf.GGUFReader`: the reader memory-maps the whole file and builds numpy views
for every field and tensor with no bound on the counts a header claims. This parser follows the same format and
takes its constants and enums from the `gguf` package (magic, value types, ggml types and their block sizes), reads
the file through `safe_io.open_regular` (regular files only), and checks every count and length against the bytes
the file holds, and against fixed bounds, before it reads or allocates anything of that size. Anything wrong with a
file raises CheckpointError naming the file and the problem, in one line.
"""

from __future__ import annotations

import math
import os
import re
import struct
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import CheckpointError, SourceError
from ..errors import short_repr as _q
from ..frozen import FrozenDict, freeze_fields, thaw
from ..roles import OTHER
from ..safe_io import check_inside, open_regular
from .tensors import MAX_TENSORS

# At most this many metadata keys in one file (a real file holds a few dozen).
MAX_KV = 65_536
# Keys longer than this are no real key (the longest llama.cpp writes are under 64 characters).
MAX_KEY_BYTES = 1024
# ggml's tensor names are at most 63 bytes (GGML_MAX_NAME); longer ones are refused with room to spare.
MAX_NAME_BYTES = 256
# Kept metadata values (short strings and arrays) together hold at most about this many bytes; past it every
# further value is summarised, so that 65,536 keys of 4 KB strings cost no GBs.
KEEP_BUDGET_BYTES = 8 * 2**20
# Items walked in arrays of strings or arrays, every key together: a real header walks under a million.
MAX_WALKED_ITEMS = 8_000_000
# Strings longer than this are summarised, not kept (a chat template is a few KB).
KEEP_STRING_BYTES = 4096
# Arrays longer than this are summarised (type and length), not kept; per-layer head counts are far shorter.
KEEP_ARRAY_ITEMS = 1024
# Arrays of strings longer than this are summarised (a vocabulary, its merges); a short list of names is kept.
KEEP_STRING_ITEMS = 64
# At most this many items in one array of strings (each is walked): a vocabulary of 262k tokens and a merge list
# of a few hundred thousand are real; ten million is not.
MAX_ARRAY_STRINGS = 4_000_000
# Nested arrays are not written by llama.cpp; one level of nesting is accepted, no more.
MAX_ARRAY_DEPTH = 2
# ggml tensors have at most 4 dimensions (GGML_MAX_DIMS).
MAX_DIMS = 4
_CHUNK = 1 << 20

SHARD = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")

# GGUF tensor names (after `blk.N.`) → paramscope's roles (docs/roles.md). Tried in order, first match wins.
_ROLE_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), r) for p, r in (
    (r"^token_embd\.", "embeddings.word"),
    (r"^token_embd_norm\.", "embeddings.norm"),
    (r"^position_embd\.", "embeddings.position"),
    (r"^token_types\.", "embeddings.token_type"),
    (r"^output_norm\.", "norm.final"),
    (r"^output\.", "head.lm"),
    (r"^attn_qkv\.", "attention.qkv"),
    (r"^attn_q\.", "attention.query"),
    (r"^attn_k\.", "attention.key"),
    (r"^attn_v\.", "attention.value"),
    (r"^attn_output\.", "attention.output"),
    (r"^attn_q_a\.", "attention.q_down"),
    (r"^attn_q_b\.", "attention.q_up"),
    (r"^attn_kv_a_mqa\.", "attention.kv_down"),
    (r"^attn_(kv_b|k_b|v_b)\.", "attention.kv_up"),
    (r"^attn_(q_a|kv_a)_norm\.", "attention.latent_norm"),
    (r"^attn_sinks\.", "attention.sinks"),
    (r"^attn_\w*norm\w*\.", "attention.norm"),
    (r"^post_attention_norm\.", "attention.norm"),  # Gemma 2/3's norm after attention
    (r"^ffn_gate_inp_shexp\.", "moe.shared_experts"),
    (r"^ffn_gate_inp\.", "moe.router"),
    (r"^exp_probs_b\.", "moe.router"),
    (r"^ffn_(gate|up|down|gate_up)_exps\.", "moe.experts"),
    (r"^ffn_(gate|up|down)_shexp\.", "moe.shared_experts"),
    (r"^ffn_gate\.", "mlp.gate"),
    (r"^ffn_up\.", "mlp.up"),
    (r"^ffn_down\.", "mlp.down"),
    (r"^(ffn_norm|ffn_post_norm|post_ffw_norm|ffn_\w*norm\w*)\.", "mlp.norm"),
    (r"^ssm_in\.", "ssm.in_proj"),
    (r"^ssm_conv1d\.", "ssm.conv"),
    (r"^ssm_x\.", "ssm.x_proj"),
    (r"^ssm_dt\.", "ssm.dt_proj"),
    (r"^ssm_(a|d)\b", "ssm.state"),
    (r"^ssm_(dt_|b_|c_)?norm\.", "ssm.norm"),  # Jamba's dt, B and C norms too
    (r"^ssm_out\.", "ssm.output"),
    (r"^shortconv\.", "mixer.conv"),  # LFM2's short convolution: in_proj, conv, out_proj
))
_BLOCK = re.compile(r"^blk\.(\d+)\.")

# What a name alone cannot tell: llama.cpp names a layer's pre-mixer norm `attn_norm` whatever the mixer is, and
# some architectures reuse names for another part. The class's roles (roles.py) follow the layer kind instead:
# Architectures whose one decoder-layer class holds either mixer (transformers' Lfm2DecoderLayer,
# Qwen3NextDecoderLayer, ...: roles.py's _HYBRID_LAYERS): the pre-mixer norm is the mixer's in every layer.
_MIXER_NORM_ARCHS = frozenset({"lfm2", "lfm2moe", "qwen3next", "qwen35", "qwen35moe", "granitehybrid", "nemotron_h",
                               "nemotron_h_moe", "falcon-h1"})
# Architectures whose ssm_* tensors are a Gated DeltaNet linear attention (convert_hf_to_gguf.py maps linear_attn.*
# to SSM names), not a state-space block: role by llama.cpp's name after `blk.N.`.
_LINEAR_ATTENTION_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe"})
_LINEAR_ATTENTION_ROLES: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), r) for p, r in (
    (r"^ssm_(in|ba|alpha|beta)\.", "linear_attention.in_proj"),
    (r"^ssm_conv1d\.", "linear_attention.conv"),
    (r"^ssm_(a\b|dt\.)", "linear_attention.decay"),  # A_log, dt_bias
    (r"^ssm_norm\.", "linear_attention.norm"),
    (r"^ssm_out\.", "linear_attention.output"),
))
# llama.cpp's token_embd_norm that is the model's final norm: LFM2's embedding_norm, applied after the last layer.
_FINAL_EMBEDDING_NORM_ARCHS = frozenset({"lfm2", "lfm2moe"})


def gguf_role(name: str, architecture: str | None = None, kind: str | None = None) -> str:
    """The paramscope role of a GGUF tensor name; `other` when no rule knows it (rope_freqs, a vision tower...).

    `architecture` (llama.cpp's) and `kind` (the layer's: "ssm", "conv" or "attention", `block_kinds`) settle what
    the name alone cannot: a Mamba layer's `attn_norm` is the SSM's norm, an LFM2 layer's the mixer's."""
    short = _BLOCK.sub("", name, count=1)
    if architecture in _LINEAR_ATTENTION_ARCHS:
        for pattern, role in _LINEAR_ATTENTION_ROLES:
            if pattern.search(short):
                return role
        if kind in ("ssm", "ssm2") and short.startswith(("attn_qkv.", "attn_gate.")):
            # Qwen3NextModel.modify_tensors splits a linear layer's in_proj_qkvz into attn_qkv (q‖k‖v) and
            # attn_gate (z): the linear attention's input projection, not an attention's
            return "linear_attention.in_proj"
        if short.startswith("post_attention_norm."):
            return "mlp.norm"  # its post_attention_layernorm is the pre-MLP norm (no Gemma-style post-norm)
    if architecture == "granitehybrid" and short.startswith(("ffn_gate.", "ffn_up.", "ffn_down.")):
        # GraniteMoeModel.modify_tensors writes the class's shared_mlp as a dense FFN when the model has no experts
        # (Granite-4.0-H-Micro): the role follows the class's module, as for the _shexp tensors it writes otherwise
        return "moe.shared_experts"
    for pattern, role in _ROLE_RULES:
        if pattern.search(short):
            break
    else:
        return OTHER
    if short.startswith("attn_norm.") and short != name:
        if architecture in _MIXER_NORM_ARCHS or kind == "conv":
            return "mixer.norm"
        if kind in ("ssm", "ssm2"):
            return "ssm.norm"
    if kind == "ssm2" and short == "ssm_dt.bias":
        return "ssm.state"  # Mamba-2's dt_bias, a per-head step bias (there is no dt projection)
    if role == "embeddings.norm" and architecture in _FINAL_EMBEDDING_NORM_ARCHS:
        return "norm.final"
    return role


def block_kinds(names: Any) -> dict[int, str]:
    """Each block's layer kind from the tensors it holds: "ssm" (a Mamba mixer: ssm_in, ssm_x, ssm_dt.weight...),
    "ssm2" (a Mamba-2 mixer: ssm_* with no ssm_x, its dt a bias alone), "conv" (LFM2's shortconv), else
    "attention". A hybrid file (Jamba, Falcon-H1) holds several kinds, block by block."""
    held: dict[int, set[str]] = {}
    for name in names:
        m = _BLOCK.match(name)
        if m:
            held.setdefault(int(m[1]), set()).add(name[m.end():].partition(".")[0])
    kinds: dict[int, str] = {}
    for block, parts in held.items():
        if "ssm_x" in parts:
            kinds[block] = "ssm"
        elif any(p.startswith("ssm_") for p in parts):
            kinds[block] = "ssm2"
        elif "shortconv" in parts:
            kinds[block] = "conv"
        else:
            kinds[block] = "attention"
    return kinds


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    """One tensor as its GGUF header describes it. `shape` is PyTorch's order (ggml's ne reversed)."""

    name: str
    ggml_type: str  # a gguf.GGMLQuantizationType name: F32, F16, BF16, Q8_0, Q4_K, ...
    shape: tuple[int, ...]
    elements: int  # logical (unpacked) values
    nbytes: int  # exact stored bytes: elements / block size × type size
    role: str
    file: str
    offset: int  # within the file's data section

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.ggml_type, "shape": list(self.shape), "elements": self.elements,
                "bytes": self.nbytes, "role": self.role, "file": self.file}


# The metadata a report shows first, by the key's part after "{architecture}." (or the whole general.* key).
HPARAM_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length",
               "expert_feed_forward_length", "attention.head_count", "attention.head_count_kv",
               "attention.key_length", "attention.value_length", "attention.sliding_window",
               "attention.kv_lora_rank", "attention.q_lora_rank", "rope.dimension_count", "rope.freq_base",
               "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length", "expert_count",
               "expert_used_count", "expert_shared_count", "vocab_size")


def _row() -> dict[str, int]:
    return {"tensors": 0, "elements": 0, "bytes": 0}


def _bpw(row: dict[str, int]) -> float | None:
    return round(row["bytes"] * 8 / row["elements"], 4) if row["elements"] else None


@dataclass(frozen=True)
class GGUFCheckpoint:
    """Every tensor of a GGUF file or sharded set (sorted by name), and its metadata (every shard's, merged)."""

    path: str
    files: tuple[str, ...]
    version: int
    tensors: tuple[GGUFTensor, ...]
    metadata: FrozenDict[str, Any] = field(default_factory=FrozenDict, compare=False)

    def __post_init__(self) -> None:
        freeze_fields(self, "metadata")

    @property
    def format(self) -> str:
        return "gguf-sharded" if len(self.files) > 1 else "gguf"

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    @property
    def elements(self) -> int:
        return sum(t.elements for t in self.tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def bits_per_weight(self) -> float | None:
        return _bpw({"elements": self.elements, "bytes": self.nbytes})

    def hparams(self) -> dict[str, Any]:
        """The model's shape from the metadata: context, width, layers, heads, KV heads, rope, experts."""
        arch = self.architecture
        out: dict[str, Any] = {}
        for key in HPARAM_KEYS:
            value = self.metadata.get(f"{arch}.{key}") if arch else None
            if value is not None:
                out[key] = thaw(value)
        if "vocab_size" not in out:
            tokens = self.metadata.get("tokenizer.ggml.tokens")
            if isinstance(tokens, (dict, FrozenDict)) and "length" in tokens:
                out["vocab_size"] = tokens["length"]
            elif isinstance(tokens, (list, tuple)):
                out["vocab_size"] = len(tokens)
        return out

    def _grouped(self, key: str) -> dict[str, dict[str, Any]]:
        rows: dict[str, dict[str, int]] = {}
        for (group, elements, nbytes), times in Counter(
                (getattr(t, key), t.elements, t.nbytes) for t in self.tensors).items():
            row = rows.setdefault(group, _row())
            row["tensors"] += times
            row["elements"] += elements * times
            row["bytes"] += nbytes * times
        return {k: {**rows[k], "bits_per_weight": _bpw(rows[k])} for k in sorted(rows)}

    def by_type(self) -> dict[str, dict[str, Any]]:
        return self._grouped("ggml_type")

    def by_role(self) -> dict[str, dict[str, Any]]:
        return self._grouped("role")

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "files": list(self.files),
            "version": self.version,
            "architecture": self.architecture,
            "name": self.metadata.get("general.name"),
            "hparams": self.hparams(),
            "tensors": len(self.tensors),
            "elements": self.elements,
            "bytes": self.nbytes,
            "bits_per_weight": self.bits_per_weight,
            "by_type": self.by_type(),
            "by_role": self.by_role(),
            "metadata": thaw(self.metadata),
            "tensor_list": [t.to_dict() for t in self.tensors],
        }


# ---------------------------------------------------------------------------------------------
# finding the files
# ---------------------------------------------------------------------------------------------


def is_gguf_path(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a .gguf file or a folder whose checkpoint is GGUF: it holds .gguf files and no safetensors,
    at its top or, as GGUF repos keep large quantisations (`Q4_K_M/…-00001-of-00002.gguf`), one folder down."""
    p = Path(os.fspath(path))
    if p.is_dir():
        if any(p.glob("*.safetensors")) or any(p.glob("*.bin")) or any(p.glob("*.safetensors.index.json")):
            return False
        return any(p.glob("*.gguf")) or any(p.glob("*/*.gguf"))
    return p.name.lower().endswith(".gguf")


# How many models the "several models" line names before it says how many more.
_LISTED = 12


def _models_in(folder: Path) -> dict[str, list[Path]]:
    """The GGUF models a folder holds, at its top and one folder down: a shard set (`x-0000N-of-0000M.gguf`) is one
    model, named by its first shard's path relative to the folder."""
    found = sorted(folder.glob("*.gguf")) + sorted(folder.glob("*/*.gguf"))
    sets: dict[str, list[Path]] = {}
    for f in found:
        m = SHARD.match(f.name)
        key = (f.parent / f"{m['stem']}-00001-of-{m['count']}.gguf" if m else f).relative_to(folder).as_posix()
        sets.setdefault(key, []).append(f)
    return sets


def _several_models(folder: Path, sets: dict[str, list[Path]]) -> str:
    """One line: the models found (a set as its first shard and its count, llama.cpp's mmproj projector files
    named so) and that one of them is to be named."""
    def label(key: str) -> str:
        count = SHARD.match(Path(key).name)
        shards = f" ({int(count['count'])} shards)" if count else ""
        projector = " (a multimodal projector)" if Path(key).name.lower().startswith("mmproj") else ""
        return key + shards + projector

    keys = sorted(sets, key=lambda k: (Path(k).name.lower().startswith("mmproj"), k))
    listed = ", ".join(label(k) for k in keys[:_LISTED]) + (
        f", and {len(keys) - _LISTED} more" if len(keys) > _LISTED else "")
    return (f"{folder}: holds {len(keys)} GGUF checkpoints, not one: {listed}; name the one to read, e.g. "
            f"{folder / keys[0]}")


def gguf_files(path: str | os.PathLike[str]) -> list[Path]:
    """The files of the GGUF checkpoint at `path`: one file, every shard of a set (from any of them), or the one
    file or set a folder holds (at its top or one folder down)."""
    p = Path(os.fspath(path))
    if p.is_dir():
        sets = _models_in(p)
        if not sets:
            raise SourceError(f"{p}: no .gguf file found")
        if len(sets) > 1:
            raise SourceError(_several_models(p, sets))
        first = next(iter(sets.values()))[0]
        check_inside(first, _root(p), error=CheckpointError, what="checkpoint folder")
        return gguf_files(first)
    if not p.exists():
        raise SourceError(f"{p}: no such file or directory")
    m = SHARD.match(p.name)
    if not m:
        return [p]
    count = int(m["count"])
    if not 1 <= int(m["no"]) <= count:
        raise CheckpointError(f"{p}: shard {int(m['no'])} of {count} is no shard of a set")
    files = [p.parent / f"{m['stem']}-{i:05d}-of-{m['count']}.gguf" for i in range(1, count + 1)]
    missing = [f.name for f in files if not f.exists()]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise CheckpointError(f"{p}: {len(missing)} of its {count} shards missing ({', '.join(missing[:3])}{more})")
    for f in files:
        check_inside(f, _root(p.parent), error=CheckpointError, what="GGUF shard set")
    return files


def _root(folder: Path) -> Path:
    """The folder a checkpoint's files must stay inside: a Hugging Face cache snapshot's files link to its repo
    folder's blobs/, so there (for a snapshot or a folder in one) the repo folder; elsewhere the folder itself."""
    for snapshot in (folder, folder.parent):
        repo = snapshot.parent.parent
        if snapshot.parent.name == "snapshots" and (repo / "blobs").is_dir():
            return repo
    return folder


def read_gguf(path: str | os.PathLike[str]) -> GGUFCheckpoint:
    """Read the GGUF checkpoint at `path` (a file, any shard of a set, or a folder) from its headers alone."""
    p = Path(os.fspath(path))
    files = gguf_files(p)
    tensors: list[GGUFTensor] = []
    metadata: dict[str, Any] = {}
    version = 0
    seen: set[str] = set()
    for number, f in enumerate(files, 1):
        header = _read_one(f, before=len(tensors))
        version = max(version, header.version)
        if len(files) > 1:
            count, no = header.metadata.get("split.count"), header.metadata.get("split.no")
            if count is not None and count != len(files):
                raise CheckpointError(f"{f}: its header says split.count = {count}, the set has {len(files)} files")
            if no is not None and no != number - 1:
                raise CheckpointError(f"{f}: its header says split.no = {no}, its name says shard {number}")
        for t in header.tensors:
            if t.name in seen:
                raise CheckpointError(f"{f}: tensor {_q(t.name)} is listed twice in the set")
            seen.add(t.name)
        tensors.extend(header.tensors)
        for key, value in header.metadata.items():
            if key != "split.no":  # each shard's own
                metadata.setdefault(key, value)
    claimed = metadata.get("split.tensors.count")
    if len(files) > 1 and claimed is not None and claimed != len(tensors):
        raise CheckpointError(f"{p}: the shards say split.tensors.count = {claimed}, they list {len(tensors)}")
    arch = metadata.get("general.architecture")
    arch = arch if isinstance(arch, str) else None
    kinds = block_kinds(t.name for t in tensors)
    tensors = [_with_role(t, arch, kinds) for t in tensors]
    tensors.sort(key=lambda t: t.name)
    return GGUFCheckpoint(path=str(p), files=tuple(str(f) for f in files), version=version, tensors=tuple(tensors),
                          metadata=metadata)


def _with_role(t: GGUFTensor, architecture: str | None, kinds: dict[int, str]) -> GGUFTensor:
    """`t` with its role in its architecture and layer kind (the header's pass gave the name's alone)."""
    m = _BLOCK.match(t.name)
    role = gguf_role(t.name, architecture, kinds.get(int(m[1])) if m else None)
    return t if role == t.role else replace(t, role=role)


# ---------------------------------------------------------------------------------------------
# the header
# ---------------------------------------------------------------------------------------------


@dataclass
class _Header:
    version: int
    metadata: dict[str, Any]
    tensors: list[GGUFTensor]


class _Reader:
    """Bounded reads from a regular file: nothing past its end, nothing larger than what is asked and checked."""

    def __init__(self, f: BinaryIO, path: Path, size: int) -> None:
        self.f, self.path, self.size = f, path, size
        self.buf = b""
        self.at = 0  # position in buf
        self.pos = 0  # position in the file of buf[at]
        self.endian = "<"
        self.kept = 0  # bytes of metadata values kept (KEEP_BUDGET_BYTES)
        self.walked = 0  # items of string or nested arrays walked (MAX_WALKED_ITEMS)

    def keep(self, n: int) -> bool:
        """Whether a value of about `n` bytes may still be kept rather than summarised."""
        if self.kept + n > KEEP_BUDGET_BYTES:
            return False
        self.kept += n
        return True

    def fail(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {what} (at byte {self.pos:,} of {self.size:,})")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"truncated GGUF header: {what} needs {n:,} bytes, the file has "
                            f"{max(self.size - self.pos, 0):,} left")

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        if len(self.buf) - self.at < n:
            rest = self.buf[self.at:]
            more = self.f.read(max(n - len(rest), _CHUNK))
            self.buf, self.at = rest + more, 0
            if len(self.buf) < n:
                raise self.fail(f"truncated GGUF file: {what} could not be read")
        out = self.buf[self.at:self.at + n]
        self.at += n
        self.pos += n
        return out

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        left = len(self.buf) - self.at
        if n <= left:
            self.at += n
        else:
            self.f.seek(self.pos + n)
            self.buf, self.at = b"", 0
        self.pos += n

    def skip_strings(self, count: int, what: str) -> None:
        """Skip `count` strings (a vocabulary): the hot loop of a real header, kept on the buffer."""
        u64 = struct.Struct(self.endian + "Q").unpack_from
        size = self.size
        for _ in range(count):
            if len(self.buf) - self.at < 8:
                self.need(8, f"the length of {what}")
                self.buf, self.at = self.buf[self.at:] + self.f.read(_CHUNK), 0
                if len(self.buf) < 8:
                    raise self.fail(f"truncated GGUF file: {what} could not be read")
            n = u64(self.buf, self.at)[0]
            self.at += 8
            self.pos += 8
            if n > size - self.pos:
                raise self.fail(f"{what} claims {n:,} bytes, more than the file holds")
            if n <= len(self.buf) - self.at:
                self.at += n
                self.pos += n
            else:
                self.skip(n, what)

    def unpack(self, fmt: str, size: int, what: str) -> Any:
        return struct.unpack(self.endian + fmt, self.take(size, what))[0]

    def u32(self, what: str) -> int:
        return self.unpack("I", 4, what)

    def u64(self, what: str) -> int:
        return self.unpack("Q", 8, what)

    def string_length(self, what: str, limit: int | None = None) -> int:
        n = self.u64(f"the length of {what}")
        if n > self.size - self.pos:
            raise self.fail(f"{what} claims {n:,} bytes, more than the file holds")
        if limit is not None and n > limit:
            raise self.fail(f"{what} claims {n:,} bytes, more than {limit:,}")
        return n

    def text(self, n: int, what: str) -> str:
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None


def _read_one(path: Path, before: int) -> _Header:
    import gguf  # llama.cpp's own package: its constants and enums, imported only when a GGUF is read

    with open_regular(path, error=CheckpointError, what="GGUF file") as f:
        size = os.fstat(f.fileno()).st_size
        r = _Reader(f, path, size)
        if size < 24:
            raise CheckpointError(f"{path}: not a GGUF file ({size} bytes, shorter than a GGUF header)")
        magic = r.take(4, "the magic")
        if struct.unpack("<I", magic)[0] != gguf.GGUF_MAGIC:
            raise CheckpointError(f"{path}: not a GGUF file (it starts with {_q(magic)}, not b'GGUF')")
        raw_version = r.take(4, "the version")
        version = struct.unpack("<I", raw_version)[0]
        if version & 0xFFFF == 0 and struct.unpack(">I", raw_version)[0] in (2, 3):
            r.endian, version = ">", struct.unpack(">I", raw_version)[0]  # a big-endian file
        if version not in (2, 3):
            raise CheckpointError(f"{path}: GGUF version {version} is not supported (only 2 and 3 are; version 1 "
                                  "is llama.cpp's own legacy, convert the file)")
        n_tensors = r.u64("the tensor count")
        n_kv = r.u64("the metadata count")
        if before + n_tensors > MAX_TENSORS:
            raise CheckpointError(f"{path}: the header claims {n_tensors:,} tensors, more than {MAX_TENSORS:,}, the "
                                  "most paramscope audits in one checkpoint")
        if n_kv > MAX_KV:
            raise CheckpointError(f"{path}: the header claims {n_kv:,} metadata keys, more than {MAX_KV:,}")
        # every tensor info needs at least 8 (name length) + 4 (dims) + 4 (type) + 8 (offset) bytes, a key 12
        if n_tensors * 24 + n_kv * 12 > size - r.pos:
            raise CheckpointError(f"{path}: the header claims {n_tensors:,} tensors and {n_kv:,} metadata keys, more "
                                  f"than its {size:,} bytes can hold")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.text(r.string_length("a metadata key", MAX_KEY_BYTES), "a metadata key")
            if key in metadata:
                raise r.fail(f"metadata key {_q(key)} appears twice")
            metadata[key] = _value(r, gguf, r.u32(f"the type of {_q(key)}"), key, 0)
        alignment = metadata.get(gguf.Keys.General.ALIGNMENT, gguf.GGUF_DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
            raise CheckpointError(f"{path}: general.alignment = {_q(alignment)} is not a power of two")
        infos = []
        sizes = gguf.GGML_QUANT_SIZES
        for i in range(n_tensors):
            name = r.text(r.string_length("a tensor name", MAX_NAME_BYTES), "a tensor name")
            n_dims = r.u32(f"the dimension count of {_q(name)}")
            if n_dims > MAX_DIMS:
                raise r.fail(f"tensor {_q(name)} claims {n_dims:,} dimensions, more than ggml's {MAX_DIMS}")
            ne = [r.u64(f"a dimension of {_q(name)}") for _ in range(n_dims)]
            type_id = r.u32(f"the type of {_q(name)}")
            offset = r.u64(f"the offset of {_q(name)}")
            try:
                qtype = gguf.GGMLQuantizationType(type_id)
                block, type_size = sizes[qtype]
            except (ValueError, KeyError):
                raise r.fail(f"tensor {_q(name)} has ggml type {type_id}, which gguf {_version(gguf)} does not "
                             "know") from None
            elements = math.prod(ne)
            if elements > size * block:  # no type stores a block in under one byte: the file could not hold it
                raise r.fail(f"tensor {_q(name)} claims {elements:,} elements, more than the file could hold")
            if (ne[0] if ne else 1) % block:
                raise r.fail(f"tensor {_q(name)}: its rows of {ne[0] if ne else 1:,} elements are no whole number of "
                             f"{qtype.name} blocks of {block}")
            if offset % alignment:
                raise r.fail(f"tensor {_q(name)}: offset {offset:,} is not a multiple of the alignment {alignment}")
            infos.append((name, qtype.name, tuple(reversed(ne)), elements, elements // block * type_size, offset))
        data_start = -(-r.pos // alignment) * alignment
        data_size = max(size - data_start, 0)
        tensors = []
        end = 0
        for name, qname, shape, elements, nbytes, offset in sorted(infos, key=lambda x: x[5]):
            if offset < end:
                raise CheckpointError(f"{path}: tensor {_q(name)} overlaps the tensor before it in the data")
            end = offset + nbytes
            if end > data_size:
                raise CheckpointError(f"{path}: tensor {_q(name)} ends at byte {data_start + end:,}, past the end of "
                                      f"the file ({size:,} bytes): the file is truncated")
            tensors.append(GGUFTensor(name, qname, shape, elements, nbytes, gguf_role(name), str(path), offset))
        return _Header(version, metadata, tensors)


def _version(gguf: Any) -> str:
    try:
        from importlib.metadata import version

        return version("gguf")
    except Exception:  # noqa: BLE001 - only a message's detail
        return "(unknown version)"


_SCALARS = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4), 6: ("f", 4),
            7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}


def _value(r: _Reader, gguf: Any, type_id: int, key: str, depth: int) -> Any:
    """One metadata value: kept when small, summarised ({"type", "length"}) when long; always bounded."""
    try:
        vtype = gguf.GGUFValueType(type_id)
    except ValueError:
        raise r.fail(f"metadata {_q(key)} has value type {type_id}, which GGUF does not define") from None
    if vtype == gguf.GGUFValueType.STRING:
        n = r.string_length(f"the string {_q(key)}")
        if n > KEEP_STRING_BYTES or not r.keep(n + 64):
            r.skip(n, f"the string {_q(key)}")
            return {"type": "string", "length": n}
        return r.text(n, f"the string {_q(key)}")
    if vtype == gguf.GGUFValueType.ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise r.fail(f"metadata {_q(key)} nests arrays more than {MAX_ARRAY_DEPTH} deep")
        item_id = r.u32(f"the item type of {_q(key)}")
        count = r.u64(f"the length of {_q(key)}")
        try:
            item = gguf.GGUFValueType(item_id)
        except ValueError:
            raise r.fail(f"metadata {_q(key)} is an array of value type {item_id}, which GGUF does not "
                         "define") from None
        if item in (gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY):
            least = 8 if item == gguf.GGUFValueType.STRING else 12
            if count * least > r.size - r.pos:
                raise r.fail(f"metadata {_q(key)} claims {count:,} items, more than the file holds")
            if count > MAX_ARRAY_STRINGS:
                raise r.fail(f"metadata {_q(key)} claims {count:,} items, more than {MAX_ARRAY_STRINGS:,}")
            r.walked += count
            if r.walked > MAX_WALKED_ITEMS:
                raise r.fail(f"metadata arrays hold more than {MAX_WALKED_ITEMS:,} strings and arrays together")
            if count > KEEP_STRING_ITEMS or item == gguf.GGUFValueType.ARRAY:
                if item == gguf.GGUFValueType.STRING:
                    r.skip_strings(count, f"an item of {_q(key)}")
                else:
                    for _ in range(count):
                        _value(r, gguf, item_id, key, depth + 1)
                return {"type": f"array of {item.name.lower()}", "length": count}
            return [_value(r, gguf, item_id, key, depth + 1) for _ in range(count)]
        fmt, size = _SCALARS[int(item)]
        if count * size > r.size - r.pos:
            raise r.fail(f"metadata {_q(key)} claims {count:,} items of {size} bytes, more than the file holds")
        if count > KEEP_ARRAY_ITEMS or not r.keep(count * 32 + 64):
            r.skip(count * size, f"the array {_q(key)}")
            return {"type": f"array of {item.name.lower()}", "length": count}
        raw = r.take(count * size, f"the array {_q(key)}")
        return [_plain(v) for v in struct.unpack(f"{r.endian}{count}{fmt}", raw)]
    fmt, size = _SCALARS[int(vtype)]
    return _plain(r.unpack(fmt, size, f"the value of {_q(key)}"))


def _plain(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)  # JSON has no NaN; keep it as text
    return v
