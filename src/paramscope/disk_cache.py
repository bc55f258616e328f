"""The disk cache formulas, templates and cost facts share: where it lives, versioned directories, routes, bounded
reads of entries and atomic writes.

Layout: `<root>/v<format>/<transformers version>/<class>/<key>.json` for each kind of entry (formula_cache.py,
template.py, cost/facts/store.py), and `<root>/v<format>/<transformers version>/routes/<hash>.json` for the class a
request (`route_key`) was answered with. In the user's cache <root> lies under `bound_root()`:
`<cache_root()>/paramscope-<paramscope version>/<kind>`, where `cache_root()` is $PARAMSCOPE_CACHE_DIR, else the
platform cache directory (~/.cache/paramscope on Linux), so an entry is only ever read by the paramscope version and
the transformers version that wrote it; the package ships templates in the same layout, without the paramscope
level. Stores whose key hashes what they were derived from (cost/derived/store.py, plan_store.py) hash `versions()`
into it and repeat it in the entry.

Writing is atomic (temp file + os.replace), so concurrent runs never see a half-written file, and two writers of
the same entry write the same bytes. Reading never trusts the cache: an entry is read only when it is a regular
file (not a symlink) of at most MAX_ENTRY_BYTES of JSON (safe_io.read_json); what the JSON holds is checked by the
kind's own `from_json`, which names what is wrong with a CacheEntryError (`expect`). `read_entries` reads at most
MAX_CACHED_ENTRIES of a class and says why each one it skips was skipped.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from ._version import __version__
from .safe_io import read_json

MAX_ENTRY_BYTES = 4 * 1024 * 1024
MAX_CACHED_ENTRIES = 256  # per class directory


class CacheEntryError(ValueError):
    """A cache entry of the wrong shape or out of bounds: skipped with this note, never used."""


class UnreadableEntry(CacheEntryError):
    """A cache entry that is not a regular file of at most MAX_ENTRY_BYTES of JSON."""


def expect(ok: bool, what: str) -> None:
    """CacheEntryError(`what`) unless `ok`: how `from_json` methods refuse an entry."""
    if not ok:
        raise CacheEntryError(what)


def is_int(value: Any) -> bool:
    """An integer, and not a bool (JSON true is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


# ------------------------------------------------------------------------------------------------- where


def cache_root() -> Path:
    env = os.environ.get("PARAMSCOPE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "paramscope"
    if os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "paramscope" / "Cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "paramscope"


def bound_root() -> Path:
    """The part of the user cache this paramscope version reads and writes (templates, formulas, cost facts and
    routes): entries another paramscope version wrote lie beside it and are never read, since how an entry is
    derived and checked may have changed between versions; they are rebuilt instead."""
    return cache_root() / f"paramscope-{safe_name(__version__)}"


def safe_name(name: str) -> str:
    """`name` as one path component: every character but letters, digits and -_. replaced by _."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "_"


def versioned_directory(root: Path, format: int, version: str) -> Path:
    """Where entries of cache format `format` recorded with transformers `version` live under `root`."""
    return root / f"v{format}" / safe_name(version)


def class_directory(directory: Path, class_name: str) -> Path:
    """A versioned directory's folder for one class's entries."""
    return directory / safe_name(class_name)


def entry_path(directory: Path, class_name: str, key: str) -> Path:
    return class_directory(directory, class_name) / f"{safe_name(key)}.json"


_VERSION_LINE = re.compile(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", re.M)


def installed_transformers_version() -> str | None:
    """The installed transformers version, without importing transformers (nor importlib.metadata: 15 ms)."""
    from importlib.machinery import PathFinder

    try:
        spec = PathFinder.find_spec("transformers")  # searches sys.path; imports nothing
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return None
    try:
        with open(spec.origin, encoding="utf-8") as handle:
            match = _VERSION_LINE.search(handle.read(8192))
    except OSError:
        match = None
    if match:
        return match.group(1)
    from importlib import metadata

    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def package_version(name: str) -> str:
    """An installed distribution's version, or "none" (read once per process: about 15 ms each)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "none"


def versions(*extra: str) -> list[str | None]:
    """What a derived entry depends on besides its own key: the versions of paramscope (with its source's fingerprint,
    `source_version`), torch and transformers (then of each of `extra`, e.g. "peft"). Hashed into the keys of
    cost/derived/store.py and plan_store.py and repeated in their entries, which are read only when it is equal."""
    return [source_version(), package_version("torch"), installed_transformers_version(),
            *(package_version(name) for name in extra)]


@functools.lru_cache(maxsize=None)
def source_version() -> str:
    """paramscope's version and a fingerprint of its source ("0.1.0+src.1a2b3c4d5e6f"): what derived a cached recipe
    or check is the code as much as the version, and a fix to an engine between releases (or in a checkout) must not
    leave a user reading what the old code derived. Hashes every module's path and bytes (about 2 MB, 30 ms, once a
    process, and only where a derived entry is read or written)."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    try:
        for path in sorted(package.rglob("*.py")):
            payload = path.read_bytes()
            digest.update(f"{path.relative_to(package).as_posix()}\0{len(payload)}\0".encode())
            digest.update(payload)
    except OSError:  # a zipped or unreadable install: the version alone, as before
        return __version__
    return f"{__version__}+src.{digest.hexdigest()[:12]}"


def roles_fingerprint() -> str:
    """Changes whenever the role rules change, so that a cached per-role split is never stale."""
    from . import roles

    try:
        payload = Path(roles.__file__).read_bytes()
    except OSError:  # e.g. a zipped install: fall back to the public role table
        payload = json.dumps(roles.ROLES).encode()
    return hashlib.sha256(payload).hexdigest()[:12]


# ------------------------------------------------------------------------------------------------- routes


def route_key(config: dict[str, Any], *, model_class: str | None, task: str | None) -> str | None:
    """How the class was asked for, as a string; None when --class names it (no route needed)."""
    if model_class:
        return None
    model_type = config.get("model_type")
    if task:
        from .build import resolve_task

        return f"{model_type}|task|{resolve_task(task)}"
    architectures = config.get("architectures") or []
    first = architectures[0] if isinstance(architectures, list) and architectures else ""
    return f"{model_type}|default|{first if isinstance(first, str) else ''}"


def route_file(directory: Path, key: str) -> Path:
    """Where a versioned directory keeps the class a request (`route_key`) was answered with."""
    return directory / "routes" / (hashlib.sha256(key.encode()).hexdigest()[:20] + ".json")


CLASS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")  # a route's class: one Python identifier
_OWN_CLASS = "the checkpoint's own class (config architectures[0])"


def route_fits(key: str, class_name: str, reason: str | None) -> bool:
    """Whether a kept route is one the build could have written for request `key` (route_key): its class an
    identifier and, where it keeps the reason, the reason build.choose_class gives for that request and class. So
    a route edited to send `bert|default|BertForMaskedLM` to BertModel is refused, not reported as "the
    checkpoint's own class"."""
    parts = key.split("|", 2)
    if len(parts) != 3 or not CLASS_NAME.match(class_name):
        return False
    _, how, what = parts
    if reason is None:  # formula routes keep no reason
        return True
    if how == "default":
        if not what:
            return reason == "AutoModel fallback (no architectures in the config)"
        if class_name == what:
            return reason == _OWN_CLASS
        return reason in (f"architectures[0] {what!r} is not a transformers class; {class_name} is the native class "
                          "with the same head",
                          f"AutoModel fallback (architectures[0] {what!r} is not a transformers class)")
    if how == "task":
        from .build import TASKS

        return what in TASKS and reason.startswith("--task ") and reason.endswith(f": {TASKS[what][1]}")
    return False


def read_route(directory: Path, key: str | None, fields: tuple[str, ...] = ("class",)) -> dict[str, Any] | None:
    """The route kept for request `key` in `directory`, when it is readable, each of `fields` is a string, it was
    written for `key` and its class and reason are ones the build gives for it (route_fits)."""
    try:
        route = read_entry(route_file(directory, key or ""))
    except CacheEntryError:
        return None
    if not isinstance(route, dict) or not all(isinstance(route.get(name), str) for name in fields):
        return None
    if key is None or route.get("route") != key or not route_fits(key, route["class"], route.get("reason")
                                                                   if "reason" in fields else None):
        return None
    return route


# ------------------------------------------------------------------------------------------- read and write


def atomic_write_json(path: Path, data: Any) -> None:
    """Write `data` to `path` so that readers only ever see the old file or the complete new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, separators=(",", ":"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_entry(path: Path, data: Any, *, route: tuple[Path, dict[str, Any]] | None = None) -> Path | None:
    """Keep `data` at `path` and, when given, the route (its file and its record); the path, or None when the
    cache cannot be written."""
    try:
        atomic_write_json(path, data)
        if route:
            atomic_write_json(*route)
    except OSError:
        return None
    return path


def read_entry(path: Path) -> Any:
    """The JSON in `path`; UnreadableEntry unless it is a regular file (not a symlink) of at most MAX_ENTRY_BYTES
    of JSON. Its type is checked before anything is opened, so a symlink (to /dev/zero, say), a FIFO or a device
    costs one lstat."""
    return read_json(path, MAX_ENTRY_BYTES, error=UnreadableEntry, what="cache entry", follow_symlinks=False)


def read_entries(directory: Path, parse: Callable[[Any], Any]) -> Iterator[tuple[Path, Any, str | None]]:
    """(entry, parse(its JSON), None) for each of the first MAX_CACHED_ENTRIES *.json files of `directory` in
    name order, or (entry, None, why not) for one that is unreadable or that `parse` rejects (CacheEntryError)."""
    try:
        entries = sorted(directory.glob("*.json"))
    except OSError:
        return
    for entry in entries[:MAX_CACHED_ENTRIES]:
        parsed, why_not = None, None
        try:
            parsed = parse(read_entry(entry))
        except UnreadableEntry:
            why_not = f"skipped: not a readable JSON file of at most {MAX_ENTRY_BYTES // 1024 // 1024} MiB"
        except CacheEntryError as err:
            why_not = f"discarded: {err}"
        yield entry, parsed, why_not
