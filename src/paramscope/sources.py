"""Where a model's config comes from: a preset, a file, a directory, a hub id, or the cache.

Only config.json is ever read. Weights are never downloaded, and nothing here imports torch.
"""

from __future__ import annotations

import contextlib

import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from . import progress
from .errors import SourceError, short_repr
from .presets import close_preset_names, did_you_mean, find_preset
from .safe_io import check_inside, read_json, read_regular

# Bounds on a config file, documented in the README: real configs are a few KB and nest 3–4 levels deep.
MAX_CONFIG_BYTES = 16 * 1024 * 1024
MAX_JSON_DEPTH = 64
MAX_INT_DIGITS = 40  # 2^128 has 39 digits; Python refuses to parse past 4,300, with an error of its own

# A hub repo id: "org/name" (the legacy bare names are covered by presets).
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@dataclass(frozen=True)
class Source:
    """A config and a plain-language account of where it came from."""

    kind: str  # preset | config-file | directory | hub | hub-cache | gguf
    label: str  # what the user typed, or the preset's hub id
    description: str  # e.g. "embedded preset google-bert/bert-base-uncased"
    # the input as read, a plain dict (transformers is given it): not part of == or hash, unlike a result's fields
    config: dict[str, Any] = field(compare=False, repr=False)
    path: str | None = None  # the config.json read, when one was read from disk
    # a GGUF source's header (checkpoint/gguf_read.GGUFCheckpoint): its ggml types price the weights in `memory`
    checkpoint: Any = field(default=None, compare=False, repr=False)


def resolve(spec: str, *, revision: str | None = None) -> Source:
    """Find the config that `spec` names.

    Order: an existing path wins; then an embedded preset; then a hub id (online, else the local cache).
    """
    spec = str(spec).strip()
    if not spec:
        raise SourceError("empty model name: give a preset name, a config.json path, a directory or a hub id")
    path = Path(spec).expanduser()
    try:
        if path.exists():
            return _from_path(path)
    except PermissionError as err:  # a folder on the way without the execute bit (root is never refused)
        raise SourceError(f"permission denied: {err.filename or path} (reading {spec})") from None
    preset = find_preset(spec)
    if preset is not None:
        return Source(
            kind="preset",
            label=preset.name,
            description=f"embedded preset {preset.name}",
            config=_check_object(preset.load_config(), f"preset {preset.name}"),
        )
    if HUB_ID.match(spec) and not spec.endswith(".json"):
        check_hub_id(spec)
        return _from_hub(spec, revision)
    if spec.endswith(".json") or os.sep in spec or spec.startswith("."):
        raise SourceError(f"no such file or directory: {spec}")
    hint = did_you_mean(close_preset_names(spec))
    raise SourceError(
        f"unknown model {short_repr(spec)}: " + (f"{hint} (" if hint else "")
        + "not a file, not an embedded preset (see `paramscope presets`), and not a hub id of the form org/name"
        + (")" if hint else "")
    )


def local_gguf(spec: str) -> Path | None:
    """The GGUF file, shard or folder that `spec` names when it is a local path (as resolve reads it), else None:
    for a caller that reads the header itself (an architecture transformers cannot build)."""
    path = Path(str(spec).strip()).expanduser()
    try:
        return _gguf_checkpoint(path) if str(spec).strip() and path.exists() else None
    except PermissionError:
        return None


def _from_path(path: Path) -> Source:
    gguf = _gguf_checkpoint(path)
    if gguf is not None:
        return _from_gguf(path, gguf)
    if path.is_dir():
        config_path = _config_in_directory(path)
        return Source(
            kind="directory",
            label=str(path),
            description=f"directory {path}",
            config=read_config_file(config_path),
            path=str(config_path),
        )
    return Source(
        kind="config-file",
        label=str(path),
        description=f"config file {path}",
        config=read_config_file(path),
        path=str(path),
    )


def _gguf_checkpoint(path: Path) -> Path | None:
    """The GGUF file, shard or folder `path` holds, when its checkpoint is GGUF: a .gguf file, or a folder (or the
    snapshot a Hugging Face cache folder's refs/main names) with .gguf files and no config.json."""
    from .checkpoint.gguf_read import is_gguf_path

    if not path.is_dir():
        return path if path.name.lower().endswith(".gguf") else None
    if (path / "config.json").exists():
        return None
    ref = path / "refs" / "main"
    if ref.exists() and (path / "snapshots").is_dir():
        snapshot = path / "snapshots" / snapshot_name(ref)
        if snapshot.is_dir() and not (snapshot / "config.json").exists():
            check_inside(snapshot, path, what="cache folder")
            return snapshot if is_gguf_path(snapshot) else None
        return None
    return path if is_gguf_path(path) else None


def _from_gguf(given: Path, path: Path) -> Source:
    """The config transformers builds from a GGUF header's metadata (checkpoint/gguf_config.py), its header kept."""
    from .checkpoint.gguf_read import read_gguf

    return gguf_source(read_gguf(path), str(given))


def gguf_source(checkpoint: Any, label: str) -> Source:
    """A GGUF header (checkpoint/gguf_read.GGUFCheckpoint) as a Source: the config transformers builds from its
    metadata, refused in one line where the header's layers are not the blocks its tensors hold."""
    from .checkpoint.gguf_config import gguf_config
    from .checkpoint.gguf_reconcile import block_count_problem

    built = gguf_config(checkpoint)
    problem = block_count_problem(checkpoint, built.config.get("num_hidden_layers"))
    if problem:
        raise SourceError(f"{checkpoint.path}: cannot build a model from this GGUF: {problem}")
    files = f" ({len(checkpoint.files)} shards)" if len(checkpoint.files) > 1 else ""
    return Source(
        kind="gguf",
        label=label,
        description=f"GGUF {checkpoint.files[0]}{files}: {built.class_name}'s config from its header's metadata "
                    f"(architecture {built.architecture}, transformers' GGUF_CONFIG_MAPPING"
                    + "".join(f"; {note}" for note in built.notes) + ")",
        config=built.config,
        path=checkpoint.files[0],
        checkpoint=checkpoint,
    )


def _config_in_directory(directory: Path) -> Path:
    candidate = directory / "config.json"
    if candidate.exists():
        return candidate
    # A Hugging Face cache repo folder (models--org--name): follow refs/main to its snapshot.
    ref = directory / "refs" / "main"
    if ref.exists():
        snapshot = directory / "snapshots" / snapshot_name(ref)
        if (snapshot / "config.json").exists():
            check_inside(snapshot / "config.json", directory, what="cache folder")
            return snapshot / "config.json"
    raise SourceError(f"no config.json in directory {directory}")


_REF = re.compile(r"^[\w.\-]{1,255}$")


def snapshot_name(ref: Path) -> str:
    """The snapshot folder refs/main names: one path component (a commit hash), nothing that climbs out."""
    raw = read_regular(ref, 4096, what="cache ref")
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise SourceError(f"{ref} is not UTF-8 text (a cache ref holds a commit hash)") from None
    if not _REF.match(name) or name in (".", ".."):
        raise SourceError(f"{ref} names {name[:80]!r}, not a snapshot folder (a cache ref holds a commit hash)")
    return name


def read_config_file(path: Path | str) -> dict[str, Any]:
    """A config.json's object: a regular file under MAX_CONFIG_BYTES, UTF-8, bounded JSON, valid Unicode."""
    data = read_json(path, MAX_CONFIG_BYTES, what="config file", max_depth=MAX_JSON_DEPTH,
                     max_int_digits=MAX_INT_DIGITS, text_only=True)
    return _decode_special_floats(_check_object(data, str(path)))


def _decode_special_floats(config: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 writes an infinite or NaN field as {"__float__": "Infinity"} (`save_pretrained`); its own reader
    turns it back into a float, so a config it saved (Granite-4.0-H's time_step_limit) reads as it would load."""
    if not _holds_float_tag(config):  # the usual case: no transformers import (answers from templates need none)
        return config
    from transformers import PretrainedConfig

    decode = getattr(PretrainedConfig, "_decode_special_floats", None)
    return decode(config) if decode is not None else config


def _holds_float_tag(value: Any) -> bool:
    if isinstance(value, dict):
        return "__float__" in value or any(_holds_float_tag(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_float_tag(v) for v in value)
    return False


def _check_object(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise SourceError(f"{where} is not a config: expected a JSON object, got {type(data).__name__}")
    return data


def check_hub_id(repo_id: str) -> None:
    """Refuse what huggingface_hub refuses (`org/..`, `org/name--x`, non-ASCII), in one line, before any request."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        why = " ".join(str(err).split()).split(". ")[0]
        raise SourceError(f"{repo_id!r} is not a valid hub id: {why}") from None


HUB_CONNECT_TIMEOUT = 3.0  # seconds: the one connect that decides whether the Hub is asked at all


def hub_online() -> bool:
    """Whether the Hub may be asked: HF_HUB_OFFLINE is not set and it answers a TCP connect."""
    return hub_offline_reason() is None


def hub_offline_reason() -> str | None:
    """Why the Hub is not asked, in words for an error line (None: it may be): HF_HUB_OFFLINE is set, or the
    endpoint did not answer one TCP connect within HUB_CONNECT_TIMEOUT seconds."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return "HF_HUB_OFFLINE is set"
    host, port = _hub_address()
    if not _hub_reachable():
        return (f"the Hugging Face Hub cannot be reached (no answer from {host}:{port} within "
                f"{HUB_CONNECT_TIMEOUT:g} s)")
    return None


@contextlib.contextmanager
def hub_offline(active: bool = True):
    """huggingface_hub in offline mode while it runs (when `active`: the Hub was found unreachable): not one request,
    not even those it makes for itself (its user-agent header fetches a registry from the Hub, 3 s more when the
    Hub does not answer). HF_HUB_OFFLINE set by the user is left as it is."""
    if not active:
        yield
        return
    from huggingface_hub import constants

    previous = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = previous


def _hub_address() -> tuple[str, int]:
    from huggingface_hub import constants

    parsed = urlparse(constants.ENDPOINT)
    return parsed.hostname or "huggingface.co", parsed.port or (443 if parsed.scheme == "https" else 80)


def _hub_reachable(timeout: float = HUB_CONNECT_TIMEOUT) -> bool:
    """One quick TCP connect, so that an offline machine answers from the cache at once.

    Without it, huggingface_hub retries a dead connection for about 25 seconds.
    """
    try:
        with socket.create_connection(_hub_address(), timeout=timeout):
            return True
    except OSError:
        return False


def hub_unanswered() -> str:
    """Why a request the Hub was asked found nothing, in words for an error line: HF_HUB_OFFLINE is set, or the Hub
    answered the quick connect but not huggingface_hub's request within its own bound (HF_HUB_ETAG_TIMEOUT)."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return "HF_HUB_OFFLINE is set"
    return (f"the Hugging Face Hub did not answer ({constants.ENDPOINT}, within huggingface_hub's "
            f"HF_HUB_ETAG_TIMEOUT of {constants.HF_HUB_ETAG_TIMEOUT:g} s)")


@contextlib.contextmanager
def hub_errors(repo_id: str, revision: str | None, what: str = "config.json", offline_because: str | None = None):
    """Turn huggingface_hub's exceptions about `repo_id` into one-line SourceErrors (`what`: the file asked for;
    `offline_because`: hub_offline_reason's words when the Hub was not asked, the bound that applied)."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except LocalEntryNotFoundError:
        why = offline_because or hub_unanswered()
        raise SourceError(
            f"hub id {repo_id}: {why}, and its {what} is not in the local cache ({constants.HF_HUB_CACHE})"
        ) from None
    except GatedRepoError:
        raise SourceError(f"hub id {repo_id} is gated: log in with `hf auth login` and accept its terms") from None
    except RepositoryNotFoundError:
        raise SourceError(f"hub id {repo_id} was not found on the Hub (or is private)") from None
    except RevisionNotFoundError:
        raise SourceError(f"hub id {repo_id} has no revision {revision!r}") from None
    except EntryNotFoundError:
        raise SourceError(f"hub id {repo_id} has no {what}") from None
    except OSError as err:  # requests' connection errors are OSErrors too
        raise SourceError(f"hub id {repo_id}: {err}") from None


def _from_hub(repo_id: str, revision: str | None) -> Source:
    from huggingface_hub import hf_hub_download

    offline_because = hub_offline_reason()  # one quick connect, its bound named if the Hub does not answer it
    online = offline_because is None
    try:
        with hub_errors(repo_id, revision, offline_because=offline_because), \
                progress.status(f"fetching {repo_id}'s config.json"), hub_offline(not online):
            path = hf_hub_download(repo_id, "config.json", revision=revision, local_files_only=not online)
    except SourceError as err:  # a misspelled preset's hub id ("google-bert/bert-base-uncasd") is no hub problem
        hint = did_you_mean(close_preset_names(repo_id))
        if not hint or "revision" in str(err):
            raise
        raise SourceError(f"{err}; {hint} (an embedded preset)") from None
    kind = "hub" if online else "hub-cache"
    where = "the Hub" if online else "the local Hugging Face cache (offline)"
    return Source(
        kind=kind,
        label=repo_id,
        description=f"hub id {repo_id}, config.json from {where}",
        config=read_config_file(path),
        path=str(path),
    )
