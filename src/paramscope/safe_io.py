"""Reading files a user (or a downloaded repo, or the cache) hands us: regular files only, bounded, never outside
their folder, and the one reader of JSON from a file (`read_json`).

A config path, a checkpoint or a cache entry may be a FIFO (opening it blocks forever), a device (/dev/zero never
ends), a symlink out of its folder (/etc/passwd as a shard), or simply huge. Everything here answers those with
one-line errors in constant time and memory, before any byte is read. JSON is read only through `read_json` (a
file) or `parse_json` (bytes a file holds, such as a safetensors header): UTF-8, bounded in size, and in depth,
integer length and duplicate keys where the caller asks; every failure is one error of the caller's class.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from .errors import SourceError, short_repr

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)

def open_regular(path: str | os.PathLike[str], *, error: type[Exception] = SourceError, what: str = "file",
                 follow_symlinks: bool = True) -> BinaryIO:
    """Open `path` for reading only if it is a regular file (a symlink to one too, unless `follow_symlinks` is
    False).

    The type is read with stat (lstat) before anything is opened, so a FIFO, a device or a refused symlink costs
    nothing; O_NONBLOCK makes opening a FIFO swapped in meanwhile return at once instead of waiting for a writer,
    and the open descriptor must be the very file stat saw, so it cannot be swapped between the check and the read.
    """
    try:
        seen = os.stat(path, follow_symlinks=follow_symlinks)
    except FileNotFoundError:
        raise error(f"no such {what}: {path}") from None
    except (OSError, ValueError) as err:
        raise error(f"cannot open {what} {path}: {getattr(err, 'strerror', None) or err}") from None
    _check_regular(path, seen.st_mode, error, what)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(os.fspath(path), flags)
    except FileNotFoundError:
        raise error(f"no such {what}: {path}") from None
    except PermissionError:
        raise error(f"permission denied: cannot open {what} {path}") from None
    except OSError as err:
        raise error(f"cannot open {what} {path}: {err.strerror or err}") from None
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino) or not stat.S_ISREG(opened.st_mode):
        os.close(fd)
        _check_regular(path, opened.st_mode, error, what)
        raise error(f"{path} was replaced while it was opened")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _check_regular(path: str | os.PathLike[str], mode: int, error: type[Exception], what: str) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise error(f"{path} is {kind}, not a regular {what}")


def read_regular(path: str | os.PathLike[str], limit: int, *, error: type[Exception] = SourceError,
                 what: str = "file", follow_symlinks: bool = True) -> bytes:
    """The bytes of regular file `path`, refused before reading when it holds more than `limit` bytes."""
    with open_regular(path, error=error, what=what, follow_symlinks=follow_symlinks) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise error(f"{path} is {size:,} bytes, over the {limit:,}-byte limit for a {what}")
        try:
            raw = f.read(limit + 1)
        except OSError as err:
            raise error(f"cannot read {what} {path}: {err.strerror or err}") from None
    if len(raw) > limit:  # it grew after the size check
        raise error(f"{path} is over the {limit:,}-byte limit for a {what}")
    return raw


def read_json(path: str | os.PathLike[str], limit: int, *, error: type[Exception] = SourceError,
              what: str = "file", follow_symlinks: bool = True, max_depth: int | None = None,
              max_int_digits: int | None = None, unique_keys: bool = False, text_only: bool = False) -> Any:
    """The JSON value in regular file `path` of at most `limit` bytes (read_regular), parsed by `parse_json`."""
    raw = read_regular(path, limit, error=error, what=what, follow_symlinks=follow_symlinks)
    return parse_json(raw, str(path), error=error, what=what, max_depth=max_depth, max_int_digits=max_int_digits,
                      unique_keys=unique_keys, text_only=text_only)


def parse_json(raw: bytes | str, where: str, *, error: type[Exception] = SourceError, what: str = "file",
               max_depth: int | None = None, max_int_digits: int | None = None, unique_keys: bool = False,
               text_only: bool = False, pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """The JSON value `raw` holds (UTF-8), every failure one `error` naming `where` and the problem.

    Bounds, each when asked: `max_depth` levels of nesting (Python's recursion limit always), integer literals of
    at most `max_int_digits` digits (Python refuses past 4,300 in any case), no object naming a key twice
    (`unique_keys`: json keeps the last silently, which in a header would hide a tensor), and no lone surrogate
    escape in a key or string (`text_only`: it cannot be printed). The cyclic collector is paused while parsing:
    a million small dicts would otherwise start it over and over (7.4 s → 3.2 s for a 92 MB header).

    `pairs_hook` replaces `unique_keys`' check for a caller that digests objects as they are parsed (a safetensors
    header's million entries): it must pass every object it does not digest to `reject_duplicates`, and an
    exception of the caller's own class that it raises reaches the caller unchanged.
    """
    if isinstance(raw, bytes):
        raw = decode_utf8(raw, where, error=error, what=what)
    hooks: dict[str, Any] = {}
    if max_int_digits is not None:
        hooks["parse_int"] = _IntLimit(max_int_digits)
    if pairs_hook is not None:
        hooks["object_pairs_hook"] = pairs_hook
    elif unique_keys:
        hooks["object_pairs_hook"] = reject_duplicates
    too_deep = f"{where}: {what} is nested too deeply" + (f" (more than {max_depth} levels)" if max_depth else "")
    try:
        with gc_paused():
            data = json.loads(raw, **hooks)
    except _LongInteger as err:
        raise error(f"{where}: {what} holds an integer of {err.args[0]:,} digits (more than {max_int_digits})"
                    ) from None
    except _DuplicateKey as err:
        raise error(f"{where}: {what} names {short_repr(err.args[0])} twice") from None
    except RecursionError:
        raise error(too_deep) from None
    except json.JSONDecodeError as err:
        raise error(f"malformed JSON in {where}: {what} is not valid JSON ({err.msg} at line {err.lineno} column "
                    f"{err.colno})") from None
    except ValueError as err:  # an over-long integer literal past Python's own limit
        raise error(f"malformed JSON in {where}: {what} is not valid JSON ({short_error(err)})") from None
    if max_depth is not None or text_only:
        _check_depth_and_text(data, where, error, too_deep, max_depth, text_only)
    return data


def decode_utf8(raw: bytes, where: str, *, error: type[Exception] = SourceError, what: str = "file") -> str:
    """`raw` as UTF-8 text (what JSON is), else one `error`. parse_json decodes bytes with it; a caller decodes
    first itself when it must drop the bytes before parsing (a 100 MB header is held once, not twice)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{where}: {what} is not valid UTF-8 (byte {err.start} is not UTF-8)") from None


class _LongInteger(ValueError):
    pass


class _IntLimit:
    """json's parse_int: an integer literal, refused before conversion when it has more than `digits` digits."""

    __slots__ = ("digits",)

    def __init__(self, digits: int):
        self.digits = digits

    def __call__(self, literal: str) -> int:
        digits = len(literal.lstrip("-"))
        if digits > self.digits:
            raise _LongInteger(digits)
        return int(literal)


class _DuplicateKey(Exception):
    pass


def reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook for `unique_keys`: the object as a dict, refused when it names a key twice."""
    out = dict(pairs)
    if len(out) != len(pairs):  # rare: find the key named twice, in Python
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def _check_depth_and_text(data: Any, where: str, error: type[Exception], too_deep: str, max_depth: int | None,
                          text_only: bool) -> None:
    """Depth at most `max_depth`, and (`text_only`) no lone surrogates (\\ud800) in keys or strings."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if max_depth is not None and depth > max_depth:
            raise error(too_deep)
        if isinstance(value, dict):
            for key, item in value.items():
                if text_only:
                    _check_text(key, where, error)
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        elif text_only and isinstance(value, str):
            _check_text(value, where, error)


def _check_text(text: str, where: str, error: type[Exception]) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        shown = text[max(0, err.start - 20):err.start].encode("utf-8", "backslashreplace").decode("ascii", "replace")
        raise error(f"{where}: a string holds a lone surrogate escape "
                    f"(\\u{ord(text[err.start]):04x}, after {shown!r}), which is not Unicode text") from None


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Building a million small dicts triggers the cyclic collector over and over; none of them forms a cycle."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def short_error(err: BaseException) -> str:
    """An exception's text on one line, at most 200 characters (its type's name when it has none)."""
    try:
        text = str(err)
    except Exception:  # broad on purpose: an exception's own __str__ (a C extension's, a pickle's) may raise
        text = ""
    text = " ".join(text.split()) or type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."


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
                 error: type[Exception] = SourceError, what: str = "folder") -> None:
    """Refuse `path` when it (or a symlink on the way) leads out of `folder`, or of the Hugging Face cache repo
    that holds `folder`."""
    root = hf_cache_repo(folder) or Path(folder)
    if not is_within(path, root):
        raise error(f"{path} leads outside the {what} {root} (to {os.path.realpath(path)})")
