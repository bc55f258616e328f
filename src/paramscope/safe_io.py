"""Reading files a user (or a downloaded repo) hands us: regular files only, bounded, never outside their folder.

A config path, a checkpoint or a cache entry may be a FIFO (opening it blocks forever), a device (/dev/zero never
ends), a symlink out of its folder (/etc/passwd as a shard), or simply huge. Everything here answers those with
one-line errors in constant time and memory, before any byte is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from .errors import ParamscopeError, SourceError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def open_regular(path: str | os.PathLike[str], *, error: type[ParamscopeError] = SourceError,
                 what: str = "file") -> BinaryIO:
    """Open `path` for reading only if it is a regular file (symlinks to regular files are fine).

    O_NONBLOCK makes opening a FIFO return at once instead of waiting for a writer; the type is then checked on
    the open descriptor itself, so the file cannot be swapped between the check and the read.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(os.fspath(path), flags)
    except FileNotFoundError:
        raise error(f"no such {what}: {path}") from None
    except PermissionError:
        raise error(f"permission denied: cannot open {what} {path}") from None
    except OSError as err:
        raise error(f"cannot open {what} {path}: {err.strerror or err}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise error(f"{path} is {kind}, not a regular {what}")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular(path: str | os.PathLike[str], limit: int, *, error: type[ParamscopeError] = SourceError,
                 what: str = "file") -> bytes:
    """The bytes of regular file `path`, refused before reading when it holds more than `limit` bytes."""
    with open_regular(path, error=error, what=what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise error(f"{path} is {size:,} bytes, over the {limit:,}-byte limit for a {what}")
        raw = f.read(limit + 1)
    if len(raw) > limit:  # it grew after the size check
        raise error(f"{path} is over the {limit:,}-byte limit for a {what}")
    return raw


def is_within(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """Whether `path`, with every symlink followed, lies inside `root` (also resolved)."""
    real, base = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    return real == base or base in real.parents


def hf_cache_repo(path: str | os.PathLike[str]) -> Path | None:
    """The `models--org--name` folder that holds `path` when it lies in a Hugging Face cache snapshot.

    Snapshot files are symlinks into the repo's blobs/ folder, so that folder (not the snapshot) is where a
    checkpoint's files may lead.
    """
    parts = Path(os.path.abspath(path)).parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "snapshots" and parts[i - 1].split("--", 1)[0] in ("models", "datasets", "spaces"):
            return Path(*parts[:i])
    return None


def check_inside(path: str | os.PathLike[str], folder: str | os.PathLike[str], *,
                 error: type[ParamscopeError] = SourceError, what: str = "folder") -> None:
    """Refuse `path` when it (or a symlink on the way) leads out of `folder`, or of the Hugging Face cache repo
    that holds `folder`."""
    root = hf_cache_repo(folder) or Path(folder)
    if not is_within(path, root):
        raise error(f"{path} leads outside the {what} {root} (to {os.path.realpath(path)})")
