"""Name patterns a cache may hold: globs that paramscope compiles itself and matches with bounded work.

A cache entry never holds a regular expression (a planted one such as `(a*)*b` backtracks for ever). Where a
pattern must be kept (cost facts' names kept in fp32), it is a glob over a closed alphabet: letters, digits, `_`,
`-` and `.` stand for themselves, `?` for any one character and `*` for any run of characters; nothing else (no
classes, no escapes). A glob matches a whole name. Matching splits the glob at its stars and finds each piece, a
fixed-length pattern, leftmost in turn, which is exact for globs and costs at most O(len(glob) × len(name)).

transformers spells `_keep_in_fp32_modules` entries as names whose `*` is a wildcard and whose `.` is, as it
compiles them (`core_model_loading.build_glob_alternation`, matched with `re.search`), any character: `glob_of`
turns one into the glob that matches exactly the names transformers' regex finds.
"""

from __future__ import annotations

import functools
import re
from typing import Callable

GLOB = re.compile(r"^[A-Za-z0-9_.\-?*]{1,256}$")
MAX_GLOBS = 64  # a class keeps a handful in fp32 (21 names at most among transformers' models)
_TRANSFORMERS_NAME = re.compile(r"^[A-Za-z0-9_.*]{1,254}$")


def is_glob(text: object) -> bool:
    return isinstance(text, str) and GLOB.match(text) is not None


def glob_of(name: str) -> str | None:
    """The glob matching exactly the names transformers' dtype plan finds for `name` (its `*` any run, its `.`
    any character, searched anywhere in a name); None when `name` holds a character whose regex meaning a glob
    cannot give (none of transformers' own names does)."""
    if not _TRANSFORMERS_NAME.match(name):
        return None
    return "*" + name.replace(".", "?") + "*"


@functools.lru_cache(maxsize=1024)
def compile_glob(glob: str) -> Callable[[str], bool]:
    """A matcher of whole names for `glob` (ValueError unless is_glob)."""
    if not is_glob(glob):
        raise ValueError(f"not a glob paramscope matches: {glob[:60]!r}")
    pieces = [re.compile("".join("." if ch == "?" else re.escape(ch) for ch in piece))
              for piece in glob.split("*")]
    sizes = [len(piece) for piece in glob.split("*")]
    if len(pieces) == 1:
        only, size = pieces[0], sizes[0]
        return lambda name: len(name) == size and only.match(name) is not None
    first, last, middle = pieces[0], pieces[-1], list(zip(pieces[1:-1], sizes[1:-1]))
    head, tail = sizes[0], sizes[-1]

    def matches(name: str) -> bool:
        end = len(name) - tail
        if end < head or first.match(name) is None or last.match(name, end) is None:
            return False
        position = head
        for piece, size in middle:  # each piece leftmost after the last: exact for globs
            found = piece.search(name, position, end)
            if found is None:
                return False
            position = found.start() + size
        return True

    return matches


def match_any(globs: tuple[str, ...], name: str) -> bool:
    return any(compile_glob(glob)(name) for glob in globs)
