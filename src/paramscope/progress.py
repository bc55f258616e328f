"""Progress on stderr for long work: a formula's probe builds, a build on meta, a traced step, a hub fetch.

Off unless the CLI turns it on, and then only when stderr is a terminal: pipes, --json, tests and notebooks see
nothing. Core code marks its long steps with `status(...)` and `update(...)`; both cost nothing when off.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterator

_console: Any = None  # a rich Console on stderr once enabled; None: off
_running: Any = None  # the rich Status on screen (one at most: a nested step changes its text)


def enable(console: Any = None) -> bool:
    """Show progress from now on: on `console` (tests), else on stderr when it is a terminal. True when on."""
    global _console
    if console is None:
        if not sys.stderr.isatty():
            return False
        from rich.console import Console

        console = Console(stderr=True)
    _console = console
    return True


def disable() -> None:
    global _console
    _console = None


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
    try:
        yield
    finally:
        _running.stop()
        _running = None


def update(message: str) -> None:
    """New text for the running status (a probe build's number); nothing when none runs."""
    if _running is not None:
        _running.update(message)
