"""Progress on stderr for long work: importing torch and transformers, a formula's probe builds, a build on meta,
a traced step, a hub fetch, reading a checkpoint's headers.

Off unless the CLI turns it on, and then only when stderr is a terminal: pipes, tests and notebooks see nothing,
and stdout (where --json writes) never does. Core code marks its long steps with `status(...)` and `update(...)`;
both cost nothing when off.

The first step of a first build is importing torch and transformers: 5-10 s warm, tens of seconds from a cold disk,
before any of paramscope's own steps begins. Whoever imports them first (the config's class, a cost model, the
remote-code loader), the import is shown as it starts: while progress is on, the first `import` of either runs
inside a status of its own (a wrapper of builtins.__import__, removed by `disable`). An answer from a template
never imports them, and shows nothing.
"""

from __future__ import annotations

import builtins
import sys
from contextlib import contextmanager
from typing import Any, Iterator

_console: Any = None  # a rich Console on stderr once enabled; None: off
_running: Any = None  # the rich Status on screen (one at most: a nested step changes its text)
_import: Any = builtins.__import__  # what `_imported` calls: builtins.__import__ as `enable` found it

# The imports that cost seconds, and what the line says while each runs (the first of a process only).
HEAVY_IMPORTS = {
    "torch": "importing torch (after a reboot, up to a minute)",
    "transformers": "importing transformers and torch (after a reboot, up to a minute)",
}


def enable(console: Any = None) -> bool:
    """Show progress from now on: on `console` (tests), else on stderr when it is a terminal. True when on."""
    global _console
    if console is None:
        if not sys.stderr.isatty():
            return False
        from rich.console import Console

        console = Console(stderr=True)
    _console = console
    _watch_imports()
    return True


def disable() -> None:
    global _console
    _console = None
    if builtins.__import__ is _imported:  # unless someone wrapped it since: then _imported stays, and passes through
        builtins.__import__ = _import


def _watch_imports() -> None:
    global _import
    if builtins.__import__ is not _imported and not all(name in sys.modules for name in HEAVY_IMPORTS):
        _import = builtins.__import__
        builtins.__import__ = _imported


def _imported(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
    """builtins.__import__, with the first import of torch or transformers shown while it runs."""
    original = _import
    if level == 0 and _console is not None:
        top = name.partition(".")[0]
        message = HEAVY_IMPORTS.get(top)
        if message is not None and top not in sys.modules:  # not yet begun: torch imports itself a thousand times
            with status(message):
                return original(name, globals, locals, fromlist, level)
    return original(name, globals, locals, fromlist, level)


@contextmanager
def status(message: str) -> Iterator[None]:
    """A spinner with `message` while the block runs (transient: nothing stays on the screen). Inside another
    status, the message replaces the outer one's for the while."""
    global _running
    if _console is None:
        yield
        return
    if _running is not None:
        previous = _running.status
        _running.update(message)
        try:
            yield
        finally:
            _running.update(previous)
        return
    _running = _console.status(message)
    _running.start()
    _running.update(message)  # drawn now, not at the spinner's first tick: the step may hold the GIL for seconds
    try:
        yield
    finally:
        _running.stop()
        _running = None


def update(message: str) -> None:
    """New text for the running status (a probe build's number); nothing when none runs."""
    if _running is not None:
        _running.update(message)
